"""The one memory rule of a placement: what is live on each device, and when.

Liveness rule (shared by the simulator, the placers and the reports)
--------------------------------------------------------------------
Per device, in a schedule:

* an operator's output (``mem``) is allocated when the operator starts and freed once its
  last consumer *on that device* has finished and every copy of it has been sent;
* a copy received from another device (``out_bytes``) is allocated when the transfer starts
  and lives until its last consumer on the receiving device has finished;
* a view (``alias``) owns no storage: it keeps its base (or the received copy of its base)
  alive until the view's own consumers have finished;
* persistent outputs - parameters, buffers, parameter gradients, optimizer updates and state -
  are never freed;
* an output nobody reads (the loss) lives to the end of the step.

At one instant frees happen before allocations (memory released at ``t`` can be reused at
``t``); a buffer that lives for no time at all still counts at its instant.
:func:`schedule_peak` applies the rule to a simulated schedule (the simulator's peak);
:class:`LiveBudget` is the rule as a placer can keep it while it builds a placement.

Why a placer's budget is an upper bound of the rule
---------------------------------------------------
A placer decides an operator before the operator's consumers are placed, so it cannot know
which consumer will be the last one *on this device*.  :class:`LiveBudget` therefore frees an
output (and all its received copies) only when *all* its consumers have been placed, in the
placer's own order (a topological order: its own schedule for m-ETF / m-SCT, the CPD-TOPO
cluster order for Celeritas, the m-TOPO order).  Along that order this holds every buffer at
least as long as the rule does, so its peak is at least the rule's peak of a device that runs
its operators in that order (tested).  The simulator may order a device's operators
differently (each placement runs in its placer's own order, METIS's in CPD-TOPO), so its peak
can differ either way.  The one memory verdict is the simulator's: ``oom`` is true exactly
when a device's simulated liveness peak exceeds its capacity.  A placer's budget only guides
it; what it placed beyond the budget is listed as best effort, and a placement whose peaks fit
is reported as fitting.
"""

from __future__ import annotations

import numpy as np

__all__ = ["buffer_intervals", "live_peak", "schedule_peak", "LiveBudget"]


def buffer_intervals(pg, placement, start, finish, transfers):
    """Every buffer of a schedule as ``(device, bytes, alloc_time, free_time)`` arrays.

    ``transfers`` are ``(node, src_dev, dst_dev, start, end, bytes)`` tuples (the simulator's);
    a persistent or unread buffer is freed at ``+inf``.
    """
    n, nd = pg.n, pg.ndev
    dev = np.asarray(placement, dtype=np.int64)
    start = np.asarray(start, dtype=np.float64)
    finish = np.asarray(finish, dtype=np.float64)
    src, dst = pg.src, pg.dst
    inf = np.inf
    # the last finish of a reader of u on device d, per (u, d); -inf when none
    last = np.full(n * nd, -inf)
    np.maximum.at(last, src * nd + dev[dst], finish[dst])
    read = np.zeros(n * nd, dtype=bool)
    read[src * nd + dev[dst]] = True
    own = np.arange(n) * nd + dev
    free_own = last[own].copy()
    nread = np.bincount(src, minlength=n)
    tr = (np.asarray(transfers, dtype=np.float64)[:, :5] if len(transfers)
          else np.zeros((0, 5)))
    tu = tr[:, 0].astype(np.int64)
    te = tr[:, 2].astype(np.int64)
    if len(tr):                                    # the sender's copy until it has gone out
        np.maximum.at(free_own, tu, tr[:, 4])
    # received copies: one per (node, device) transfer
    rkey = tu * nd + te
    free_rcv = last[rkey].copy() if len(tr) else np.zeros(0)
    # views keep their base (or the received copy of it) alive: children before parents
    views = _views_children_first(pg)
    if views:
        alias = pg.alias.tolist()
        devl = dev.tolist()
        fo = free_own.tolist()
        fr = free_rcv.tolist()
        rpos = None
        pers = pg.persistent
        for v in views:
            b = alias[v]
            fv = fo[v] if nread[v] and not pers[v] else inf   # unread: holds its base
            if devl[b] == devl[v]:
                if fv > fo[b]:
                    fo[b] = fv
            else:
                if rpos is None:
                    rpos = {k: i for i, k in enumerate(rkey.tolist())}
                i = rpos.get(b * nd + devl[v])
                if i is not None and fv > fr[i]:
                    fr[i] = fv
        free_own = np.asarray(fo)
        free_rcv = np.asarray(fr)
    unread = nread == 0
    free_own[unread | pg.persistent] = inf
    d = np.concatenate([dev, te])
    nb = np.concatenate([pg.mem, pg.out_bytes[tu]])
    t0 = np.concatenate([start, tr[:, 3]])
    t1 = np.concatenate([np.maximum(free_own, start), np.maximum(free_rcv, tr[:, 3])])
    return d, nb, t0, t1


def _views_children_first(pg) -> list:
    """View nodes, each after the views that alias it (reverse topological order; cached)."""
    vs = pg.meta.get("_views")
    if vs is None:
        views = np.nonzero(pg.alias >= 0)[0]
        pos = np.empty(pg.n, dtype=np.int64)
        pos[pg.topo] = np.arange(pg.n)
        vs = views[np.argsort(-pos[views])].tolist() if len(views) else []
        pg.meta["_views"] = vs
    return vs


def live_peak(nd: int, device, nbytes, alloc, free) -> np.ndarray:
    """Per-device maximum of the live bytes of ``(device, bytes, alloc, free)`` buffers.

    At one instant frees come first, then allocations, then the frees of buffers that live
    for no time (so those still count at their instant)."""
    device = np.asarray(device, dtype=np.int64)
    nbytes = np.asarray(nbytes, dtype=np.float64)
    keep = nbytes > 0
    device, nbytes = device[keep], nbytes[keep]
    alloc = np.asarray(alloc, dtype=np.float64)[keep]
    free = np.asarray(free, dtype=np.float64)[keep]
    peak = np.zeros(nd)
    if not len(nbytes):
        return peak
    zero = free <= alloc
    kind = np.concatenate([np.ones(len(alloc)), np.where(zero, 2.0, 0.0)])
    dv = np.concatenate([device, device])
    tm = np.concatenate([alloc, np.where(zero, alloc, free)])
    delta = np.concatenate([nbytes, -nbytes])
    finite = np.isfinite(tm)
    dv, tm, kind, delta = dv[finite], tm[finite], kind[finite], delta[finite]
    order = np.lexsort((kind, tm, dv))
    dv, delta = dv[order], delta[order]
    run = np.cumsum(delta)
    cuts = np.flatnonzero(np.diff(dv)) + 1
    base = np.concatenate([[0.0], run[cuts - 1]])          # running total before each device
    starts = np.concatenate([[0], cuts])
    ends = np.concatenate([cuts, [len(dv)]])
    for b, s, e in zip(base.tolist(), starts.tolist(), ends.tolist()):
        peak[dv[s]] = max(0.0, float(run[s:e].max()) - b)
    return peak


def schedule_peak(pg, placement, start, finish, transfers) -> np.ndarray:
    """The rule's peak per device of a schedule (the simulator's ``peak_memory``)."""
    return live_peak(pg.ndev, *buffer_intervals(pg, placement, start, finish, transfers))


class LiveBudget:
    """The liveness rule as a placer keeps it while placing operators in a topological order.

    ``place(v, d)`` allocates ``v``'s output on ``d`` and a copy of every input that ``d`` does
    not hold yet, then frees each input whose consumers have all been placed (with all its
    copies; a view's input when the view itself is freed).  Persistent outputs stay.  A
    co-location group is admitted by its persistent memory: when its first member is placed,
    the persistent bytes of the whole group are reserved on that device (``need`` counts
    them), so later members' parameters, gradients and updates never overflow.  ``peak`` is
    the budget's maximum per device; see the module docstring for why it bounds the rule.
    """

    def __init__(self, pg):
        self.pg = pg
        n, nd = pg.n, pg.ndev
        self.cap = np.asarray(pg.capacity, dtype=np.float64)
        self.cur = np.zeros(nd)
        self.peak = np.zeros(nd)
        self.dev = np.full(n, -1, dtype=np.int64)
        self.left = [len(s) for s in pg.succ]          # consumers not yet placed
        self.held: list = [None] * n                   # devices holding a copy (not own)
        grp = pg.group
        ng = int(grp.max()) + 1 if (grp >= 0).any() else 0
        pm = np.where(pg.persistent, pg.mem, 0.0)
        sel = grp >= 0
        self.gpers = np.bincount(grp[sel], weights=pm[sel], minlength=ng)
        self.gdev = np.full(ng, -1, dtype=np.int64)

    def group_device(self, v) -> int:
        """Device of ``v``'s co-location group (-1: no group, or not placed yet)."""
        g = self.pg.group[v]
        return int(self.gdev[g]) if g >= 0 else -1

    def own(self, v) -> float:
        """Bytes ``v``'s own output adds (its group's persistent bytes when it starts one)."""
        pg = self.pg
        g = pg.group[v]
        if g < 0:
            return float(pg.mem[v])
        if self.gdev[g] < 0:
            return float(self.gpers[g]) + (0.0 if pg.persistent[v] else float(pg.mem[v]))
        return 0.0 if pg.persistent[v] else float(pg.mem[v])

    def received(self, v, d) -> float:
        """Bytes of the inputs of ``v`` that ``d`` would have to receive."""
        pg, dev = self.pg, self.dev
        tot = 0.0
        for p in pg.pred[v]:
            dp = dev[p]
            if dp >= 0 and dp != d and not (self.held[p] and d in self.held[p]):
                tot += pg.out_bytes[p]
        return tot

    def need(self, v, d) -> float:
        return self.own(v) + self.received(v, d)

    def fits(self, v, d) -> bool:
        return self.cur[d] + self.need(v, d) <= self.cap[d] * (1 + 1e-12)

    def room(self) -> np.ndarray:
        return self.cap - self.cur

    def place(self, v, d) -> bool:
        """Commit ``v`` to ``d``; False when that took ``d`` over its capacity."""
        pg = self.pg
        add = self.need(v, d)
        for p in pg.pred[v]:
            dp = self.dev[p]
            if dp >= 0 and dp != d:
                if self.held[p] is None:
                    self.held[p] = {d}
                else:
                    self.held[p].add(d)
        g = pg.group[v]
        if g >= 0 and self.gdev[g] < 0:
            self.gdev[g] = d
        self.dev[v] = d
        self.cur[d] += add
        ok = self.cur[d] <= self.cap[d] * (1 + 1e-12)
        if self.cur[d] > self.peak[d]:
            self.peak[d] = self.cur[d]
        alias = pg.alias
        for p in pg.pred[v]:
            if alias[v] == p:
                continue
            self._consumed(p)
        return ok

    def _consumed(self, p):
        left = self.left[p] - 1
        self.left[p] = left
        if left == 0:
            self._free(p)

    def _free(self, p):
        pg = self.pg
        if not pg.persistent[p]:
            self.cur[self.dev[p]] -= pg.mem[p]
        if self.held[p]:
            for e in self.held[p]:
                self.cur[e] -= pg.out_bytes[p]
            self.held[p] = None
        if pg.alias[p] >= 0:
            self._consumed(int(pg.alias[p]))

"""Baseline placers on the original (unfused) graph, with the same estimates and simulator.

Baechi's placers (Jeon et al., SoCC 2020) as the paper describes and its code implements them:

* ``m_topo`` - m-TOPO: the Kahn/BFS topological order; device 0 is filled up to Baechi's own
  cap, ``total memory / D + the largest operator's memory`` (a co-location group is admitted
  by its persistent memory and then placed whole), then device 1, and so on.
* ``m_etf`` - m-ETF: event-driven list scheduling.  At each instant every idle device takes,
  among the ready operators (all inputs finished) it may hold, the one with the earliest
  schedulable time ``max(ready on this device, device free, now)`` - ties by topological
  order, then by the lower device - if that time has come.  Each device has *one* channel
  for what it sends and receives: a copy starts when the sender's channel is free, is
  received when the receiver's is, and holds each for the transfer's time; a tensor is sent
  once per receiving device.  An operator whose estimated time is 0 takes 1 us in this
  schedule (and in the SCT LP), as in Baechi's placement graph.
* ``m_sct`` - m-SCT: m-ETF plus the *favourite child* of the small-communication-time LP
  relaxation (Hanen & Munier; solved with HiGHS through ``scipy.optimize.linprog``): an edge
  whose ``x`` is below the threshold 0.1 makes the child the parent's favourite.  A device whose
  last operator's favourite child could start there earliest *waits* for it, unless an
  *urgent* operator (one whose latest schedulable time over all devices has come) is due:
  a preference, not a forced co-location.  As in Baechi, a co-location group is placed when
  its first member runs, so a favourite child whose group already has a device is placed and
  not waited for: the device takes its earliest schedulable operator instead.
* ``metis`` - k-way METIS (``pymetis``) on the undirected graph, vertex weight = memory,
  edge weight = bytes, minimising the cut under METIS's balance constraint.
* ``single`` - everything on device 0.

Schedule: every placer but METIS returns its own ``order`` (its event order for m-ETF / m-SCT,
the topological order it walked for m-TOPO and single); the simulator runs the placement in
that order (:func:`~.result.simulated_plan`), and METIS, which has none, in CPD-TOPO.

Memory: every placer keeps :class:`~.memory.LiveBudget` - the liveness rule along its own
order (its schedule for m-ETF / m-SCT, the topological order for m-TOPO and single): an
output is charged from its operator until all its consumers are placed, a received copy
likewise, persistent memory (parameters, gradients, updates) for good, a co-location group
admitted by its persistent memory.  An operator that fits nowhere (or only where a pin or its
group forbids) is placed by the best-effort rule and listed in ``best_effort``; whether the
placement is out of memory is the simulator's verdict (its liveness peak over a device's
capacity), for METIS, which has no budget, as for every other placer.
"""

from __future__ import annotations

import heapq
import math

import numpy as np

from explorer.engine.placement.memory import LiveBudget
from explorer.engine.placement.order import m_topo as _m_topo_order

__all__ = ["m_topo", "m_etf", "m_sct", "metis", "single", "BASELINES", "sct_favourites",
           "SCT_THRESHOLD"]

#: Baechi's rounding threshold of the SCT relaxation: ``x < 0.1`` marks a favourite child
SCT_THRESHOLD = 0.1

#: the least duration (s) an operator takes in m-ETF's and m-SCT's own schedule and in the SCT
#: LP: Baechi's placement graph gives an operator whose measured duration is <= 0 one
#: microsecond ("each operator should have compute cost > 0"), and its event loop relies on it
MIN_OP_TIME_S = 1e-6


def baechi_times(w):
    """Compute times as Baechi's placers see them: a time <= 0 becomes 1 us.

    Views, reshapes and parameter nodes cost 0 s in the estimates.  With zero durations an
    event-driven list scheduler runs whole chains of them at one instant, in an order that
    depends on how ties fall; Baechi never sees a zero duration, and a device that runs one
    is busy for a microsecond.  Only the placers' own schedules use this; the simulator that
    judges the placement keeps the estimates as they are."""
    w = np.asarray(w, dtype=np.float64)
    return np.where(w <= 0, MIN_OP_TIME_S, w)


def _pins(pg, pins):
    return np.full(pg.n, -1, dtype=np.int64) if pins is None else np.asarray(pins)


def _least_used(live) -> int:
    return int(np.argmin(live.cur / live.cap))


def _place_forced(live, v, d, best_effort):
    if not live.place(v, d):
        best_effort.append(v)


def single(pg, pins=None, **_):
    """All operators on device 0 (pins still honoured, and groups follow pinned leaders)."""
    p = _pins(pg, pins)
    live = LiveBudget(pg)
    best = []
    for x in pg.topo.tolist():
        gd = live.group_device(x)
        d = int(p[x]) if p[x] >= 0 else (gd if gd >= 0 else 0)
        _place_forced(live, x, d, best)
    return live.dev.copy(), {"best_effort": best, "budget_peak": live.peak.tolist(),
                             "order": pg.topo.copy(), "schedule": "topological order"}


def m_topo(pg, pins=None, **_):
    """Baechi m-TOPO: BFS topological order; each device filled to ``total / D + max op``
    (Baechi's cap, whole-step sums as Baechi counts them), then the next; the device's
    capacity is kept by the liveness budget."""
    pin = _pins(pg, pins)
    nd = pg.ndev
    order = _m_topo_order(pg.n, pg.succ, pg.pred)
    cap = pg.mem.sum() / nd + (pg.mem.max() if pg.n else 0.0)
    grp = pg.group
    ng = int(grp.max()) + 1 if (grp >= 0).any() else 0
    sel = grp >= 0
    gsum = np.bincount(grp[sel], weights=pg.mem[sel], minlength=ng)
    gpers = np.bincount(grp[sel], weights=np.where(pg.persistent, pg.mem, 0.0)[sel],
                        minlength=ng)
    share = np.zeros(nd)            # what Baechi's cap counts: placed memory, whole step
    live = LiveBudget(pg)
    best = []
    cur = 0
    for v in order:
        g = int(grp[v])
        forced = int(pin[v]) if pin[v] >= 0 else live.group_device(v)
        if forced >= 0:
            d = forced
            if g < 0 or live.gdev[g] >= 0:
                share[d] += pg.mem[v] if g < 0 else 0.0
            else:
                share[d] += gsum[g]
            _place_forced(live, v, d, best)
            continue
        admit = gpers[g] if g >= 0 else pg.mem[v]
        while cur < nd - 1 and share[cur] + admit > cap:
            cur += 1
        d = cur
        if not live.fits(v, d):
            fits = [x for x in range(nd) if live.fits(v, x)]
            d = fits[0] if fits else _least_used(live)
        share[d] += gsum[g] if g >= 0 else pg.mem[v]
        _place_forced(live, v, d, best)
    return live.dev.copy(), {"best_effort": best, "budget_peak": live.peak.tolist(),
                             "topo_cap": float(cap), "order": np.asarray(order),
                             "schedule": "BFS topological order"}


def _etf(pg, pins, favourite=None):
    """Event-driven ETF (m-ETF), or SCT with ``favourite`` (parent -> child), under the
    liveness budget.  Returns ``(device per node, info)``."""
    n, nd = pg.n, pg.ndev
    pin = _pins(pg, pins)
    K, B = pg.k, pg.b
    ob = pg.out_bytes
    w = baechi_times(pg.w)
    topo = np.empty(n, dtype=np.int64)
    topo[_m_topo_order(n, pg.succ, pg.pred)] = np.arange(n)
    live = LiveBudget(pg)
    dev = live.dev
    fin = np.zeros(n)
    start = np.zeros(n)
    avail = np.zeros(nd)
    chan = np.zeros(nd)                      # when each device's one channel (sends and
    #                                          receives alike) is free
    copy_at: dict = {}                       # (node, device) -> arrival of its copy there
    last_op = [-1] * nd
    waiting = [len(p) for p in pg.pred]
    ready: list = [v for v in range(n) if waiting[v] == 0]
    done: list = []                          # (finish, node): successors become ready
    best = []
    placed = 0
    inf = math.inf
    ar = np.arange(nd)

    grp = pg.group
    version = 0                    # bumped when a transfer or a group's device is committed
    cache: dict = {}                         # node -> (version, ready per device, need)

    def row(v):
        """(ready time per device - a dry run on the channels -, bytes v needs per device)."""
        c = cache.get(v)
        if c is not None and c[0] == version:
            return c[1], c[2]
        r = np.zeros(nd)
        need = np.full(nd, live.own(v))
        for p in pg.pred[v]:
            dp = int(dev[p])
            held = live.held[p]
            for d in range(nd):
                if d == dp:
                    t_ = fin[p]
                else:
                    t_ = copy_at.get((p, d))
                    if t_ is None:              # the send starts, then the receive
                        # (the transfer's time as one number, added once: ties between
                        # devices are exact and must not hang on rounding)
                        t_ = max(fin[p], chan[dp], chan[d]) + (K[dp, d] * ob[p] + B[dp, d])
                    if not (held and d in held):
                        need[d] += ob[p]
                if t_ > r[d]:
                    r[d] = t_
        cache[v] = (version, r, need)
        return r, need

    def table(R):
        """Schedulable time of each ready op on each device (inf: not allowed / no room)."""
        rts = np.empty((len(R), nd))
        need = np.empty((len(R), nd))
        for i, v in enumerate(R):
            rts[i], need[i] = row(v)
        Ra = np.asarray(R)
        g = grp[Ra]
        f = np.where(g >= 0, live.gdev[np.maximum(g, 0)] if len(live.gdev) else -1, -1)
        f = np.where(pin[Ra] >= 0, pin[Ra], f)
        ok = live.cur[None, :] + need <= live.cap[None, :] * (1 + 1e-12)
        ok &= (f < 0)[:, None] | (ar[None, :] == f[:, None])
        # a group's leader is admitted by the group's persistent bytes (in ``need``)
        return np.where(ok, np.maximum(rts, avail[None, :]), inf)

    def commit(v, d):
        nonlocal placed, version
        for p in pg.pred[v]:
            dp = int(dev[p])
            if dp != d and (p, d) not in copy_at:
                cost = K[dp, d] * ob[p] + B[dp, d]
                ss = max(fin[p], chan[dp])           # the sender's channel, then
                e = max(ss, chan[d]) + cost          # the receiver's
                chan[dp] = ss + cost
                chan[d] = e
                copy_at[(p, d)] = e
                version += 1
        rt = max([fin[p] if dev[p] == d else copy_at[(p, d)] for p in pg.pred[v]],
                 default=0.0)
        s = max(rt, avail[d])
        start[v] = s
        fin[v] = s + w[v, d]
        avail[d] = fin[v]
        if grp[v] >= 0 and live.gdev[grp[v]] < 0:
            version += 1                            # the group's members now cost less
        if not live.place(v, d):
            best.append(v)
        last_op[d] = v
        ready.remove(v)
        heapq.heappush(done, (fin[v], v))
        placed += 1

    t = 0.0
    while placed < n:
        # as Baechi's devices advance: an idle device is free from now, not from when its
        # last operator ended - every op schedulable in the past is schedulable *now*, and
        # ties between them go by topological order
        np.maximum(avail, t, out=avail)
        while done and done[0][0] <= t:
            _, v = heapq.heappop(done)
            for s_ in pg.succ[v]:
                waiting[s_] -= 1
                if waiting[s_] == 0:
                    ready.append(s_)
        ts = None
        while ready:
            R = list(ready)
            ts = table(R)
            rk = topo[R]
            choice = None                           # (ts, topo, node, device)
            for d in range(nd):
                if avail[d] > t:
                    continue
                col = ts[:, d]
                if not np.isfinite(col).any():
                    continue
                pick = None
                fc = favourite.get(last_op[d], -1) if favourite is not None and \
                    last_op[d] >= 0 else -1
                # Baechi places a co-location group when its first member runs: a favourite
                # child whose group already has a device counts as placed, not waited for
                if fc >= 0 and dev[fc] < 0 and fc in ready and not (
                        grp[fc] >= 0 and live.gdev[grp[fc]] >= 0):
                    i = R.index(fc)
                    if np.isfinite(ts[i, d]) and ts[i, d] == ts[i].min():
                        # awake: wait for the favourite child unless an urgent op is due
                        urg = np.where(np.isfinite(col), np.where(np.isfinite(ts), ts, -inf)
                                       .max(axis=1), inf)
                        j = int(np.lexsort((rk, urg))[0])
                        if urg[j] <= t:
                            pick = (ts[j, d], rk[j], R[j], d)
                        elif ts[i, d] <= t:
                            pick = (ts[i, d], rk[i], fc, d)
                        else:
                            continue
                if pick is None:
                    j = int(np.lexsort((rk, col))[0])
                    if col[j] <= t:
                        pick = (col[j], rk[j], R[j], d)
                if pick is not None and (choice is None or pick[:2] < choice[:2]):
                    choice = pick
            if choice is None:
                break
            commit(choice[2], choice[3])
            ts = None
        if placed >= n:
            break
        # the next instant anything can happen: an op finishes or a schedulable time comes
        nxt = [x for x in avail.tolist() if x > t]
        if done:
            nxt.append(done[0][0])
        if ready:
            if ts is None:
                ts = table(list(ready))
            later = ts[np.isfinite(ts) & (ts > t)]
            if len(later):
                nxt.append(float(later.min()))
        if nxt:
            t = min(nxt)
            continue
        # nothing can ever run: a ready op fits nowhere - best effort on the least used device
        v = min(ready, key=lambda x: topo[x])
        f = int(pin[v]) if pin[v] >= 0 else live.group_device(v)
        d = f if f >= 0 else _least_used(live)
        avail[d] = max(avail[d], t)
        commit(v, d)
        if not best or best[-1] != v:
            best.append(v)
    # its schedule: the operators by their start in the placer's own event simulation
    return dev.copy(), {"best_effort": best, "budget_peak": live.peak.tolist(),
                        "etf_makespan_s": float(fin.max()) if n else 0.0,
                        "order": np.lexsort((topo, start)),
                        "schedule": ("SCT" if favourite is not None else "ETF")
                        + " event order"}


def m_etf(pg, pins=None, **_):
    """Baechi m-ETF: event-driven earliest-schedulable-time list scheduling under memory."""
    return _etf(pg, pins)


def sct_favourites(pg, threshold: float = SCT_THRESHOLD, time_limit: float = 60.0,
                   x=None) -> dict:
    """Favourite child of each node from the SCT LP relaxation (Hanen & Munier).

    Variables: edge ``x_e ∈ [0, 1]`` (1 = communication paid), start ``s_v``, makespan ``W``.
    Minimise ``W`` s.t. ``s_u + w_u + c_e x_e <= s_v``, ``Σ_out x >= outdeg − 1``,
    ``Σ_in x >= indeg − 1``, ``s_v + w_v <= W``.  An edge ``u -> v`` with ``x < threshold``
    (Baechi rounds with 0.1) makes ``v`` the favourite child of ``u``; going through the edges
    in order, a later favourite replaces an earlier one of the same parent, and a child keeps
    only its last parent (the earlier parent loses its favourite), as Baechi assigns them.
    ``x`` gives the relaxation's values instead of solving it (tests).
    Returns ``{parent: child}``.
    """
    from scipy.optimize import linprog
    from scipy.sparse import coo_matrix
    n, m = pg.n, pg.n_edges
    if m == 0:
        return {}
    if x is not None:
        return _favourites(pg, np.asarray(x, dtype=np.float64), threshold)
    w = baechi_times(pg.w_ref())
    c = pg.edge_comm()
    nv = m + n + 1                               # [x_e..., s_v..., W]
    rows, cols, vals, rhs = [], [], [], []
    r = 0
    e_idx = np.arange(m)
    # s_u - s_v + c_e x_e <= -w_u
    rows += [np.arange(m)] * 3
    cols += [m + pg.src, m + pg.dst, e_idx]
    vals += [np.ones(m), -np.ones(m), c]
    rhs.append(-w[pg.src])
    r = m
    # -Σ_out x <= 1 - outdeg ; -Σ_in x <= 1 - indeg
    outdeg = np.bincount(pg.src, minlength=n)
    indeg = np.bincount(pg.dst, minlength=n)
    rows.append(r + pg.src)
    cols.append(e_idx)
    vals.append(-np.ones(m))
    rhs.append(1.0 - outdeg)
    r += n
    rows.append(r + pg.dst)
    cols.append(e_idx)
    vals.append(-np.ones(m))
    rhs.append(1.0 - indeg)
    r += n
    # s_v - W <= -w_v
    rows += [r + np.arange(n), r + np.arange(n)]
    cols += [m + np.arange(n), np.full(n, nv - 1)]
    vals += [np.ones(n), -np.ones(n)]
    rhs.append(-w)
    r += n
    A = coo_matrix((np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))),
                   shape=(r, nv)).tocsr()
    b = np.concatenate(rhs)
    cost = np.zeros(nv)
    cost[-1] = 1.0
    bounds = [(0, 1)] * m + [(0, None)] * (n + 1)
    res = linprog(cost, A_ub=A, b_ub=b, bounds=bounds, method="highs",
                  options={"time_limit": time_limit})
    if res.x is None:
        return {}
    return _favourites(pg, res.x[:m], threshold)


def _favourites(pg, x, threshold) -> dict:
    fav: dict = {}
    parent: dict = {}
    for e in np.nonzero(x < threshold)[0].tolist():
        u, v = int(pg.src[e]), int(pg.dst[e])
        fav[u] = v
        old = parent.get(v)
        if old is not None and old != u and fav.get(old) == v:
            del fav[old]
        parent[v] = u
    return fav


def m_sct(pg, pins=None, threshold: float = SCT_THRESHOLD, **_):
    """Baechi m-SCT: m-ETF where a device prefers its last operator's favourite child."""
    fav = sct_favourites(pg, threshold=threshold)
    dev, info = _etf(pg, pins, favourite=fav)
    info["favourite_children"] = len(fav)
    return dev, info


def metis(pg, pins=None, seed: int = 0, **_):
    """k-way METIS partition (pymetis): vertex weight = memory (MB), edge weight = bytes (KB).

    Pins are applied after partitioning (METIS has no fixed vertices in pymetis); the parts
    are then relabelled so that as many pinned nodes as possible already sit on their device.
    """
    import pymetis
    n, nd = pg.n, pg.ndev
    if nd == 1:
        return single(pg, pins)
    u = np.concatenate([pg.src, pg.dst])
    v = np.concatenate([pg.dst, pg.src])
    wt = np.concatenate([pg.out_bytes[pg.src], pg.out_bytes[pg.src]])
    order = np.lexsort((v, u))
    u, v, wt = u[order], v[order], wt[order]
    xadj = np.concatenate([[0], np.cumsum(np.bincount(u, minlength=n))]).astype(np.int64)
    ew = np.clip(np.round(wt / 1e3), 1, 2 ** 30).astype(np.int64)
    vw = np.clip(np.round(pg.mem / 1e6), 1, 2 ** 30).astype(np.int64)
    opts = pymetis.Options(seed=seed)
    adj = pymetis.CSRAdjacency(xadj.tolist(), v.tolist()) if hasattr(
        pymetis, "CSRAdjacency") else None
    if adj is not None:
        _, parts = pymetis.part_graph(nd, adj, vweights=vw.tolist(), eweights=ew.tolist(),
                                      options=opts)
    else:
        _, parts = pymetis.part_graph(nd, xadj=xadj.tolist(), adjncy=v.tolist(),
                                      vweights=vw.tolist(), eweights=ew.tolist(), options=opts)
    dev = np.asarray(parts, dtype=np.int64)
    pin = _pins(pg, pins)
    if (pin >= 0).any():
        from scipy.optimize import linear_sum_assignment
        score = np.zeros((nd, nd))
        for x in np.nonzero(pin >= 0)[0].tolist():
            score[dev[x], pin[x]] += 1
        rows, cols = linear_sum_assignment(-score)
        relabel = np.empty(nd, dtype=np.int64)
        relabel[rows] = cols
        dev = relabel[dev]
        dev = np.where(pin >= 0, pin, dev)
    live = LiveBudget(pg)
    for x in pg.topo.tolist():               # co-location: follow the group's first node
        gd = live.group_device(x)
        if pin[x] < 0 and gd >= 0:
            dev[x] = gd
        live.place(x, int(dev[x]))
    # METIS has no memory rule and no schedule of its own: its OOM is judged by the simulator
    # only, and it runs in the simulator's CPD-TOPO order (the critical path first)
    return dev, {"budget_peak": live.peak.tolist(), "schedule": "CPD-TOPO (METIS has none)"}


BASELINES = {"m-topo": m_topo, "m-etf": m_etf, "m-sct": m_sct, "metis": metis,
             "single": single}

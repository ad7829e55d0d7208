"""Baseline placers on the original (unfused) graph, with the same estimates and simulator.

* ``m_topo`` - Baechi's m-TOPO: m-TOPO order, each device filled up to an even share of the
  total memory (``total / D``, never above its capacity), then the next.
* ``m_etf`` - Baechi's m-ETF: list scheduling; among the ready operators and the devices with
  room for them, the pair with the earliest start time is placed next (ties: larger blevel).
* ``m_sct`` - Baechi's m-SCT: m-ETF plus the *favourite child* of Hanen-Munier's small
  communication time LP relaxation (solved with HiGHS through ``scipy.optimize.linprog``):
  an operator whose incoming edge has ``x < 0.5`` joins its parent's device when it fits.
* ``metis`` - k-way METIS (``pymetis``) on the undirected graph, vertex weight = memory,
  edge weight = bytes, minimising the cut under METIS's balance constraint.
* ``single`` - everything on device 0.

Every placer honours pins (node -> device) and counts received tensors in a device's memory
like Celeritas, falling back to the least used device (best effort) when nothing fits.
"""

from __future__ import annotations

import math

import numpy as np

from .order import _graph_levels, m_topo as _m_topo_order

__all__ = ["m_topo", "m_etf", "m_sct", "metis", "single", "BASELINES"]


class _Mem:
    """Per-device memory use with received-tensor accounting and co-location groups (the
    group's first placed node reserves the whole group; later members follow it)."""

    def __init__(self, pg):
        self.pg = pg
        self.used = np.zeros(pg.ndev)
        self.recv: set = set()
        self.best_effort: list = []
        grp = pg.group
        ng = int(grp.max()) + 1 if (grp >= 0).any() else 0
        self.gtotal = np.bincount(grp[grp >= 0], weights=pg.mem[grp >= 0], minlength=ng)
        self.gdev = np.full(ng, -1, dtype=np.int64)

    def forced(self, v) -> int:
        """Device v must go to because its group is placed (-1: free)."""
        g = self.pg.group[v]
        return int(self.gdev[g]) if g >= 0 else -1

    def own(self, v) -> float:
        g = self.pg.group[v]
        if g < 0:
            return self.pg.mem[v]
        return 0.0 if self.gdev[g] >= 0 else self.gtotal[g]

    def need(self, v, d, dev) -> float:
        m = self.own(v)
        ob = self.pg.out_bytes
        for p in self.pg.pred[v]:
            if dev[p] != d and (p, d) not in self.recv:
                m += ob[p]
        return m

    def fits(self, v, d, dev) -> bool:
        return self.used[d] + self.need(v, d, dev) <= self.pg.capacity[d]

    def commit(self, v, d, dev):
        self.used[d] += self.need(v, d, dev)
        for p in self.pg.pred[v]:
            if dev[p] != d:
                self.recv.add((p, d))
        g = self.pg.group[v]
        if g >= 0 and self.gdev[g] < 0:
            self.gdev[g] = d

    def least_used(self) -> int:
        return int(np.argmin(self.used / self.pg.capacity))


def _pins(pg, pins):
    return np.full(pg.n, -1, dtype=np.int64) if pins is None else np.asarray(pins)


def single(pg, pins=None, **_):
    """All operators on device 0 (pins still honoured, and groups follow pinned leaders)."""
    p = _pins(pg, pins)
    dev = np.full(pg.n, -1, dtype=np.int64)
    mem = _Mem(pg)
    for x in pg.topo.tolist():
        d = int(p[x]) if p[x] >= 0 else (mem.forced(x) if mem.forced(x) >= 0 else 0)
        mem.commit(x, d, dev)
        dev[x] = d
    return dev, {"used": mem.used.tolist()}


def m_topo(pg, pins=None, **_):
    """Baechi m-TOPO: BFS topological order, devices filled to an even memory share."""
    pin = _pins(pg, pins)
    nd = pg.ndev
    order = _m_topo_order(pg.n, pg.succ, pg.pred)
    share = np.minimum(pg.capacity, pg.mem.sum() / nd * 1.0 + 1.0)
    mem = _Mem(pg)
    dev = np.full(pg.n, -1, dtype=np.int64)
    cur = 0
    for v in order:
        if pin[v] >= 0 or mem.forced(v) >= 0:
            d = int(pin[v]) if pin[v] >= 0 else mem.forced(v)
            if not mem.fits(v, d, dev):
                mem.best_effort.append(v)
        else:
            while cur < nd - 1 and mem.used[cur] + mem.need(v, cur, dev) > share[cur]:
                cur += 1
            d = cur
            if not mem.fits(v, d, dev):
                fits = [x for x in range(nd) if mem.fits(v, x, dev)]
                d = fits[0] if fits else mem.least_used()
                if not fits:
                    mem.best_effort.append(v)
        mem.commit(v, d, dev)
        dev[v] = d
    return dev, {"best_effort": mem.best_effort, "used": mem.used.tolist()}


def _etf(pg, pins, favourite=None):
    """ETF list scheduling with memory (and favourite-child restriction for m-SCT)."""
    n, nd = pg.n, pg.ndev
    pin = _pins(pg, pins)
    K, B = pg.k, pg.b
    ob = pg.out_bytes
    _, bl = _graph_levels(pg)
    mem = _Mem(pg)
    group = pg.group
    dev = np.full(n, -1, dtype=np.int64)
    fin = np.zeros(n)
    avail = np.zeros(nd)
    arrival = np.zeros((n, nd))
    allowed = np.ones((n, nd), dtype=bool)
    waiting = np.array([len(p) for p in pg.pred])
    ready = [v for v in range(n) if waiting[v] == 0]
    for v in ready:
        if pin[v] >= 0:
            allowed[v] = False
            allowed[v, pin[v]] = True
    inf = math.inf
    placed = 0
    while ready:
        r = np.asarray(ready)
        est = np.maximum(arrival[r], avail[None, :])
        forced = np.where(group[r] >= 0, mem.gdev[np.maximum(group[r], 0)], -1) \
            if len(mem.gdev) else np.full(len(r), -1)
        forced = np.where(pin[r] >= 0, pin[r], forced)
        allow = np.where((forced >= 0)[:, None], np.arange(nd)[None, :] == forced[:, None],
                         allowed[r])
        est = np.where(allow, est, inf)
        # memory: (ignores copies already received) need per device; forced nodes must go
        room = pg.capacity - mem.used
        own = np.array([mem.own(x) for x in r.tolist()])
        est = np.where((own[:, None] <= room[None, :]) | (forced >= 0)[:, None], est, inf)
        flat = est.min(axis=1)
        if np.isinf(flat).all():
            # nothing fits anywhere (or only on a disallowed device): best effort on the
            # most urgent ready node
            i = int(np.argmax(bl[r]))
            v = int(r[i])
            d = int(forced[i]) if forced[i] >= 0 else mem.least_used()
            mem.best_effort.append(v)
        else:
            best = flat.min()
            cand = np.nonzero(flat <= best * (1 + 1e-12) + 1e-15)[0]
            i = int(cand[np.argmax(bl[r[cand]])])
            v = int(r[i])
            d = int(np.argmin(est[i]))
            if not mem.fits(v, d, dev) and forced[i] < 0:
                fits = [x for x in range(nd) if allow[i, x] and mem.fits(v, x, dev)]
                if fits:
                    d = min(fits, key=lambda x: max(arrival[v, x], avail[x]))
                else:
                    mem.best_effort.append(v)
        start = max(arrival[v, d], avail[d])
        fin[v] = start + pg.w[v, d]
        avail[d] = fin[v]
        mem.commit(v, d, dev)
        dev[v] = d
        ready.remove(v)
        placed += 1
        for s in pg.succ[v]:
            waiting[s] -= 1
            if waiting[s] == 0:
                ps = pg.pred[s]
                dp = dev[ps]
                arr = fin[ps][:, None] + K[dp] * ob[ps][:, None] + B[dp]
                arrival[s] = arr.max(axis=0)
                if pin[s] >= 0:
                    allowed[s] = False
                    allowed[s, pin[s]] = True
                elif favourite is not None:
                    par = favourite.get(s)
                    if par is not None and mem.fits(s, dev[par], dev):
                        allowed[s] = False
                        allowed[s, dev[par]] = True
                ready.append(s)
    return dev, {"best_effort": mem.best_effort, "used": mem.used.tolist(),
                 "etf_makespan_s": float(fin.max()) if n else 0.0}


def m_etf(pg, pins=None, **_):
    """Baechi m-ETF: earliest-start-time list scheduling under memory limits."""
    return _etf(pg, pins)


def sct_favourites(pg, time_limit: float = 60.0) -> dict:
    """Favourite parent of each node from the SCT LP relaxation (Hanen & Munier).

    Variables: edge ``x_e ∈ [0, 1]`` (1 = communication paid), start ``s_v``, makespan ``W``.
    Minimise ``W`` s.t. ``s_u + w_u + c_e x_e <= s_v``, ``Σ_out x >= outdeg − 1``,
    ``Σ_in x >= indeg − 1``, ``s_v + w_v <= W``.  An edge with ``x < 0.5`` marks ``v`` as
    the favourite child of ``u``.  Returns ``{child: parent}``.
    """
    from scipy.optimize import linprog
    from scipy.sparse import coo_matrix
    n, m = pg.n, pg.n_edges
    if m == 0:
        return {}
    w = pg.w_ref()
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
    x = res.x[:m]
    fav: dict = {}
    best: dict = {}
    for e in np.nonzero(x < 0.5)[0].tolist():
        u, v = int(pg.src[e]), int(pg.dst[e])
        if v not in best or x[e] < best[v]:
            best[v] = x[e]
            fav[v] = u
    return fav


def m_sct(pg, pins=None, **_):
    """Baechi m-SCT: m-ETF with favourite children from the SCT LP relaxation."""
    fav = sct_favourites(pg)
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
    mem = _Mem(pg)
    for x in pg.topo.tolist():               # co-location: follow the group's first node
        if pin[x] < 0 and mem.forced(x) >= 0:
            dev[x] = mem.forced(x)
        mem.commit(x, dev[x], dev)
    # METIS has no memory rule of its own: its OOM is judged by the simulator only
    return dev, {"used": mem.used.tolist(),
                 "over_budget": bool((mem.used > pg.capacity).any())}


BASELINES = {"m-topo": m_topo, "m-etf": m_etf, "m-sct": m_sct, "metis": metis,
             "single": single}

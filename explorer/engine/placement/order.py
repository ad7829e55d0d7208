"""Topological orders of the placement graph (Celeritas Sections 4.2.2 and 5.1.3).

* ``m_topo`` - Baechi's m-TOPO: BFS-like, 0-indegree nodes join the *tail* of the queue.
* ``dfs_topo`` - DFS-TOPO: a node's children that reach indegree 0 join the *head*.
* ``cpd_topo`` - CPD-TOPO (Algorithm 1, ``CPD_Topo``): DFS-TOPO whose initial queue is sorted
  by decreasing ``cpath = tlevel + blevel`` (equations 2-3) and whose children are pushed to
  the head in increasing ``cpath`` order, so the child on the critical path comes next.

Each returns ``order`` (node ids in sequence); ``position[order[i]] = i``.
"""

from __future__ import annotations

from collections import deque

import numpy as np

__all__ = ["tlevel_blevel", "m_topo", "dfs_topo", "cpd_topo", "positions", "placed_blevel",
           "placed_order"]


def tlevel_blevel(n: int, succ, pred, topo, w, c_edge: dict | None = None, c_of=None):
    """Equations 2 and 3.

    ``tlevel(v) = max_{p in pred(v)} tlevel(p) + w_p + c_{p,v}`` (0 for sources);
    ``blevel(v) = w_v + max_{s in succ(v)} blevel(s) + c_{v,s}`` (``w_v`` for sinks).
    ``c_of(u, v)`` gives an edge's communication time (default: ``c_edge[(u, v)]``).
    """
    w = np.asarray(w, dtype=np.float64).tolist()
    cf = c_of if c_of is not None else (lambda u, v: c_edge[(u, v)])
    tl = [0.0] * n
    for v in topo:
        best = 0.0
        for p in pred[v]:
            x = tl[p] + w[p] + cf(p, v)
            if x > best:
                best = x
        tl[v] = best
    bl = [0.0] * n
    for v in reversed(topo):
        best = 0.0
        for s in succ[v]:
            x = bl[s] + cf(v, s)
            if x > best:
                best = x
        bl[v] = best + w[v]
    return np.asarray(tl), np.asarray(bl)


def _graph_levels(pg, w=None):
    """tlevel, blevel of a :class:`PlacementGraph` with the mean-link c (vectorised c)."""
    ob = pg.out_bytes.tolist()
    km, bm = pg.k_mean, pg.b_mean
    cvec = [km * b + bm for b in ob]      # c_{u,v} depends only on u (its output's size)
    return tlevel_blevel(pg.n, pg.succ, pg.pred, pg.topo.tolist(),
                         pg.w_ref() if w is None else w, c_of=lambda u, v: cvec[u])


def m_topo(n: int, succ, pred) -> list:
    """Baechi's m-TOPO order: FIFO queue of 0-indegree nodes (BFS-like)."""
    indeg = [len(p) for p in pred]
    q = deque(v for v in range(n) if indeg[v] == 0)
    out = []
    while q:
        v = q.popleft()
        out.append(v)
        for u in succ[v]:
            indeg[u] -= 1
            if indeg[u] == 0:
                q.append(u)
    return out


def dfs_topo(n: int, succ, pred) -> list:
    """DFS-TOPO: children reaching indegree 0 are put at the head of the queue."""
    indeg = [len(p) for p in pred]
    q = deque(v for v in range(n) if indeg[v] == 0)
    out = []
    while q:
        v = q.popleft()
        out.append(v)
        for u in reversed(succ[v]):   # first child ends up at the head
            indeg[u] -= 1
            if indeg[u] == 0:
                q.appendleft(u)
    return out


#: cpath values closer than this fraction of the largest are the same path length
CPATH_RTOL = 1e-9


def _tie_equal(cp: np.ndarray) -> np.ndarray:
    """``cpath`` with rounding noise removed: every node on a critical path has the same
    ``tlevel + blevel`` in exact arithmetic, but the two sums add the same terms in different
    orders, so in floats they differ in the last bits - and that noise, not the graph,
    would pick the next node (on an LSTM grid it decided which of ~3,000 equally critical
    nodes came first).  Values are snapped to multiples of ``CPATH_RTOL`` x the largest, so
    equal paths tie and ties keep the graph order, as in DFS-TOPO."""
    if cp.size == 0:
        return cp
    scale = float(np.abs(cp).max()) * CPATH_RTOL
    return np.round(cp / scale) if scale > 0 else cp


def cpd_topo(n: int, succ, pred, cpath) -> list:
    """CPD-TOPO, Algorithm 1 lines 8-23.

    The queue starts with the 0-indegree nodes by decreasing ``cpath``; after dequeuing a node
    its children are visited by increasing ``cpath`` and each that reaches indegree 0 is
    appended to the head - the child with the largest ``cpath`` is dequeued next.  Equal
    ``cpath`` (within :data:`CPATH_RTOL`) keeps the graph order among the children.
    """
    cp = _tie_equal(np.asarray(cpath, dtype=np.float64))
    indeg = [len(p) for p in pred]
    srcs = [v for v in range(n) if indeg[v] == 0]
    srcs.sort(key=lambda v: (-cp[v], v))
    q = deque(srcs)
    out = []
    cpl = cp.tolist()
    while q:
        v = q.popleft()
        out.append(v)
        ch = succ[v]
        if len(ch) > 1:
            ch = sorted(ch, key=lambda u: (cpl[u], -u))
        for u in ch:
            indeg[u] -= 1
            if indeg[u] == 0:
                q.appendleft(u)
    return out


def positions(order) -> np.ndarray:
    """Inverse permutation: ``position[v]`` = index of ``v`` in ``order``."""
    pos = np.empty(len(order), dtype=np.int64)
    pos[np.asarray(order, dtype=np.int64)] = np.arange(len(order))
    return pos


def graph_order(pg, kind: str = "cpd") -> tuple:
    """``(order, tlevel, blevel)`` of a :class:`PlacementGraph` for ``kind`` in
    ``cpd | dfs | m-topo``."""
    tl, bl = _graph_levels(pg)
    if kind == "cpd":
        order = cpd_topo(pg.n, pg.succ, pg.pred, tl + bl)
    elif kind == "dfs":
        order = dfs_topo(pg.n, pg.succ, pg.pred)
    elif kind in ("m-topo", "bfs"):
        order = m_topo(pg.n, pg.succ, pg.pred)
    else:
        raise ValueError(f"unknown order {kind!r}: choose cpd, dfs or m-topo")
    return order, tl, bl


def placed_blevel(pg, placement) -> np.ndarray:
    """``blevel`` (equation 3) of a *placed* graph: each operator's time on its device, and an
    edge costs its link's ``k·bytes + b`` only between two devices (0 on one device) - the
    upward rank of list scheduling (HEFT) once the placement is known."""
    dev = np.asarray(placement, dtype=np.int64)
    n = pg.n
    w = pg.w[np.arange(n), dev] if pg.w.ndim == 2 else np.asarray(pg.w, dtype=np.float64)
    a, b = dev[pg.src], dev[pg.dst]
    c = pg.k[a, b] * pg.out_bytes[pg.src] + pg.b[a, b]
    csr = pg.meta.get("_succ_edges")
    if csr is None:
        srt = np.argsort(pg.src, kind="stable")
        ptr = np.searchsorted(pg.src[srt], np.arange(n + 1))
        csr = (ptr.tolist(), srt, pg.dst[srt].tolist())
        pg.meta["_succ_edges"] = csr
    ptr, srt, dst = csr
    cl = c[srt].tolist()
    wl = np.asarray(w, dtype=np.float64).tolist()
    bl = [0.0] * n
    for v in reversed(pg.topo.tolist()):
        best = 0.0
        for e in range(ptr[v], ptr[v + 1]):
            x = bl[dst[e]] + cl[e]
            if x > best:
                best = x
        bl[v] = best + wl[v]
    return np.asarray(bl)


def placed_order(pg, placement, base=None) -> np.ndarray:
    """The operators by decreasing :func:`placed_blevel` (equal within
    :data:`CPATH_RTOL` tie, then ``base`` decides: default CPD-TOPO): a device that runs its
    ready operators in this order starts first the one with the longest path to the end of
    the step *through this placement*, counting only the transfers the placement makes."""
    bl = _tie_equal(placed_blevel(pg, placement))
    if base is None:
        base, _, _ = graph_order(pg, "cpd")
    pos = positions(base)
    return np.lexsort((pos, -bl))

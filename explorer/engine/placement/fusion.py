"""Optimal Operation Fusion (Celeritas Section 5.1, Algorithm 1).

Nodes are laid out in CPD-TOPO order ``v_1 … v_n``; *breakpoints* cut the sequence into
clusters of adjacent nodes, which by Lemma 2 keeps the coarse graph acyclic (every edge goes
forward in the order, so it goes from a cluster to the same or a later one).  The breakpoints
minimise the total inter-cluster communication with the dynamic program of equations 4-6:

* ``cost(v_i, v_j) = Σ_{i ≤ k < j ≤ m ≤ n} c_{k,m}`` - communication leaving ``[v_i, v_j)``;
* eq. 5: ``cost(v_i, v_j) = cost(v_i, v_{j-1}) + Σ_{m ≥ j} c_{j-1,m} − Σ_{i ≤ s < j-1} c_{s,j-1}``;
* eq. 6: ``S(v_j) = min_{j-R ≤ i < j, Σ_{[i,j)} Memory ≤ M} S(v_i) + cost(v_i, v_j)``,
  ``P(v_j)`` the minimising ``i``; following ``P`` back from ``v_n`` yields the breakpoints.

The window of ``cost(·, v_j)`` values is a numpy vector updated in place by eq. 5, so one step
costs ``O(R)`` vector work and ``O(indegree)`` Python work.  Pinned nodes constrain the DP: a
cluster may not hold nodes pinned to two different devices.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

__all__ = ["Coarse", "optimal_breakpoints", "fuse", "coarsen"]


@dataclass
class Coarse:
    """The coarse-grain graph: one node per cluster.

    ``members[c]`` are the original node ids of cluster ``c`` (in CPD-TOPO order), ``cid`` maps
    every original node to its cluster, ``w`` (clusters × devices) and ``mem`` sum the members,
    ``edges[(a, b)] = (bytes, tensors)`` counts the distinct tensors ``a`` sends to ``b``.
    """

    members: list
    cid: np.ndarray
    w: np.ndarray
    mem: np.ndarray
    edges: dict
    succ: list = field(default_factory=list)
    pred: list = field(default_factory=list)
    pin: np.ndarray | None = None

    def __post_init__(self):
        nc = len(self.members)
        if self.w.shape[0] != nc or self.mem.shape != (nc,):
            raise ValueError(f"{nc} clusters but w has {self.w.shape[0]} rows and mem "
                             f"{self.mem.shape}")
        if not self.succ:
            self.succ = [[] for _ in range(nc)]
            self.pred = [[] for _ in range(nc)]
            for a, b in self.edges:
                if a >= b:
                    raise ValueError(f"coarse edge {a}->{b} goes backwards: the clusters are "
                                     f"not contiguous in a topological order")
                self.succ[a].append(b)
                self.pred[b].append(a)
        if self.pin is None:
            self.pin = np.full(nc, -1, dtype=np.int64)

    @property
    def n(self) -> int:
        return len(self.members)

    def comm(self, a: int, b: int, k: float, lat: float) -> float:
        """``c_{a,b} = k·bytes + b`` for the tensors cluster ``a`` sends to ``b``."""
        nb, _ = self.edges[(a, b)]
        return k * nb + lat

    def ccr(self, k: float, lat: float) -> float:
        """Equation 1 on the coarse graph."""
        ws = float(self.w.mean(axis=1).sum())
        cs = sum(k * nb + lat for nb, _ in self.edges.values())
        return cs / ws if ws > 0 else float("inf")

    def to_networkx(self):
        import networkx as nx
        g = nx.DiGraph()
        g.add_nodes_from(range(self.n))
        g.add_edges_from(self.edges)
        return g


def _pin_low(seq_pin: np.ndarray) -> np.ndarray:
    """``low[j]`` = smallest ``i`` such that the nodes at positions ``[i, j)`` are pinned to at
    most one device (``seq_pin`` is -1 for free nodes)."""
    n = len(seq_pin)
    low = np.zeros(n + 1, dtype=np.int64)
    last_pos, last_dev, conflict = -1, -1, -1
    for p in range(n):
        d = int(seq_pin[p])
        if d >= 0:
            if last_dev >= 0 and d != last_dev:
                conflict = last_pos
            elif last_dev >= 0 and d == last_dev:
                pass
            last_pos, last_dev = p, d
        low[p + 1] = conflict + 1
    return low


def optimal_breakpoints(order, succ_pos, in_pos, out_total, mem_seq, R: int, M: float,
                        seq_pin=None):
    """``Optimal_BP`` of Algorithm 1 on a sequence of ``n`` nodes.

    Parameters
    ----------
    order : sequence
        Node ids in CPD-TOPO order (only its length is used here).
    succ_pos : unused placeholder kept for symmetry with ``in_pos``.
    in_pos : list of (ndarray, ndarray)
        For the node at position ``j``: positions ``s < j`` of its predecessors and ``c_{s,j}``.
    out_total : ndarray
        ``Σ_m c_{j,m}`` for the node at position ``j`` (all its successors come later).
    mem_seq : ndarray
        ``Memory[v_j]`` in sequence order.
    R : int
        Exploration range (cluster length at most R nodes).
    M : float
        Memory cap of one cluster (a single larger node still forms its own cluster).
    seq_pin : ndarray, optional
        Device each position is pinned to, -1 if free.

    Returns
    -------
    breakpoints : list of int
        Sorted cluster start positions (the first is 0).
    S_n : float
        Total inter-cluster communication of the optimum (``S(v_n)``).
    """
    n = len(order)
    if R < 1:
        raise ValueError(f"exploration range R must be >= 1, got {R}")
    if not M > 0:
        raise ValueError(f"memory cap M must be > 0, got {M}")
    S = np.zeros(n + 1)
    P = np.zeros(n + 1, dtype=np.int64)
    C = np.zeros(n + 1)                   # C[i] = cost(v_i, v_{j+1}) for i in the window
    pm = np.concatenate([[0.0], np.cumsum(mem_seq, dtype=np.float64)])
    low_pin = _pin_low(np.asarray(seq_pin)) if seq_pin is not None else None
    for j in range(n):
        a = j + 1 - R if j + 1 > R else 0
        C[j] = 0.0
        C[a:j + 1] += out_total[j]                         # eq. 5, second term
        ps, cs = in_pos[j]
        if len(ps):                                        # eq. 5, third term
            for s, c in zip(ps.tolist(), cs.tolist()):
                if s >= a:
                    C[a:s + 1] -= c
        lo = a
        mlo = int(np.searchsorted(pm, pm[j + 1] - M, side="left"))
        if mlo > lo:
            lo = mlo
        if low_pin is not None and low_pin[j + 1] > lo:
            lo = int(low_pin[j + 1])
        if lo > j:
            lo = j                                          # a node alone is always allowed
        cand = S[lo:j + 1] + C[lo:j + 1]
        k = int(np.argmin(cand))
        S[j + 1] = cand[k]
        P[j + 1] = lo + k
    bps = []
    k = n
    while k > 0:
        k = int(P[k])
        bps.append(k)
    return sorted(bps), float(S[n])


def coarsen(pg, clusters_of: np.ndarray, members: list, pins: np.ndarray | None = None) -> Coarse:
    """The coarse graph for a cluster id per node (clusters numbered in sequence order)."""
    cid = np.asarray(clusters_of, dtype=np.int64)
    nc = len(members)
    w = np.zeros((nc, pg.ndev))
    np.add.at(w, cid, pg.w)
    mem = np.bincount(cid, weights=pg.mem, minlength=nc).astype(np.float64)
    cu, cv = cid[pg.src], cid[pg.dst]
    cross = cu != cv
    edges: dict = {}
    if cross.any():
        # a tensor (its producer u) counts once per receiving cluster
        u = pg.src[cross]
        b = cv[cross]
        key = np.unique(u * nc + b)
        uu, bb = key // nc, key % nc
        aa = cid[uu]
        pair = aa * nc + bb
        upair, inv = np.unique(pair, return_inverse=True)
        nbytes = np.bincount(inv, weights=pg.out_bytes[uu])
        cnt = np.bincount(inv)
        for p, nb, c in zip(upair.tolist(), nbytes.tolist(), cnt.tolist()):
            edges[(p // nc, p % nc)] = (nb, c)
    cpin = np.full(nc, -1, dtype=np.int64)
    if pins is not None:
        for v in np.nonzero(pins >= 0)[0].tolist():
            cpin[cid[v]] = pins[v]
    return Coarse(members, cid, w, mem, edges, pin=cpin)


def fuse(pg, order, R: int = 200, M: float | None = None, pins: np.ndarray | None = None):
    """Algorithm 1: breakpoints over ``order`` (CPD-TOPO) and the coarse graph.

    ``M`` defaults to 0.25 of the smallest device capacity (the paper's ``M = 0.25*``).
    Returns ``(coarse, breakpoints, S_n)``.
    """
    n = pg.n
    order = np.asarray(order, dtype=np.int64)
    if M is None:
        M = 0.25 * float(pg.capacity.min())
    pos = np.empty(n, dtype=np.int64)
    pos[order] = np.arange(n)
    c = pg.edge_comm()
    sp, dp = pos[pg.src], pos[pg.dst]
    if np.any(sp >= dp):
        raise ValueError("the order given to fusion is not topological")
    out_total = np.bincount(sp, weights=c, minlength=n)
    # in-edges grouped by destination position
    by = np.argsort(dp, kind="stable")
    dps, sps, cs = dp[by], sp[by], c[by]
    bounds = np.searchsorted(dps, np.arange(n + 1))
    in_pos = [(sps[bounds[j]:bounds[j + 1]], cs[bounds[j]:bounds[j + 1]]) for j in range(n)]
    seq_pin = pins[order] if pins is not None else None
    bps, s_n = optimal_breakpoints(order, None, in_pos, out_total, pg.mem[order], R, M, seq_pin)
    edges = bps + [n]
    members = [order[edges[i]:edges[i + 1]] for i in range(len(bps))]
    cid = np.empty(n, dtype=np.int64)
    for k, m in enumerate(members):
        cid[m] = k
    return coarsen(pg, cid, members, pins), bps, s_n

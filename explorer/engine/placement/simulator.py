"""One discrete-event simulator for every placement: step time and per-device peak memory.

All placers (Celeritas, Order-Place, m-TOPO, m-ETF, m-SCT, METIS, single device) are judged
here, the same way - as the paper judges them all by running them.

Execution model
---------------
* Each device runs one operator at a time.  When it is idle it starts, among its operators
  whose inputs are all present, the one with the highest priority (largest ``blevel``: the
  critical-path-first rule of list schedulers; ties by graph order).  Dispatch does not use
  the placer's own schedule, so no method is favoured by its own model.
* A tensor needed on another device is sent once per receiving device when its producer
  finishes, taking ``k·bytes + b`` on that link.  **Contention**: each device has one send and
  one receive port (full duplex); a transfer holds the sender's send port and the receiver's
  receive port for its whole duration, and transfers are served first come, first served
  (the paper's transfer "tasks on the devices which need to send or receive", Section 6.1).
  ``contention="none"`` lets transfers overlap freely.
* **Memory**: an operator's output (``mem``; views share storage) is allocated when it starts
  and freed when its last reader on that device has finished and every copy of it has been
  sent; a received copy (``out_bytes``) is allocated when the transfer starts and freed after
  its last reader there.  Persistent outputs (parameters, updated parameters) are never freed.
  The maximum of the running total is the device's peak.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

import numpy as np

__all__ = ["SimResult", "simulate"]


@dataclass
class SimResult:
    """Makespan, per-device peak memory and the schedule (op and transfer intervals)."""

    makespan: float
    peak_memory: np.ndarray
    start: np.ndarray
    finish: np.ndarray
    placement: np.ndarray
    transfers: list = field(default_factory=list)   # (node, src_dev, dst_dev, start, end, bytes)
    busy: np.ndarray | None = None
    comm_bytes: float = 0.0

    def __post_init__(self):
        if self.makespan < 0 or not np.isfinite(self.makespan):
            raise ValueError(f"makespan {self.makespan} must be finite and >= 0")

    def oom(self, capacity) -> bool:
        return bool(np.any(self.peak_memory > np.asarray(capacity) * (1 + 1e-9)))

    def gantt(self, names=None, limit: int | None = None) -> dict:
        """Per-device intervals for a Gantt chart: ``{"ops": [...], "transfers": [...]}``."""
        order = np.argsort(self.start, kind="stable")
        if limit is not None:
            order = order[:limit]
        ops = [{"op": names[v] if names else int(v), "device": int(self.placement[v]),
                "start": float(self.start[v]), "end": float(self.finish[v])} for v in order]
        tr = [{"tensor_of": names[u] if names else int(u), "src": int(a), "dst": int(b),
               "start": float(s), "end": float(e), "bytes": float(nb)}
              for u, a, b, s, e, nb in self.transfers[:limit]]
        return {"ops": ops, "transfers": tr}


def simulate(pg, placement, priority=None, contention: str = "ports") -> SimResult:
    """Simulate one training step of ``pg`` under ``placement`` (node -> device).

    Parameters
    ----------
    pg : PlacementGraph
    placement : array of int, shape (n,)
    priority : array, optional
        Larger runs first among ready operators of a device; default ``blevel``.
    contention : {"ports", "none"}
    """
    n, nd = pg.n, pg.ndev
    dev = np.asarray(placement, dtype=np.int64)
    if dev.shape != (n,):
        raise ValueError(f"placement has shape {dev.shape}, expected ({n},)")
    if n and (dev.min() < 0 or dev.max() >= nd):
        raise ValueError(f"placement uses device {int(dev.max())} but there are {nd} devices")
    if contention not in ("ports", "none"):
        raise ValueError(f"contention must be 'ports' or 'none', got {contention!r}")
    if priority is None:
        from .order import _graph_levels
        _, priority = _graph_levels(pg)
    prio = np.asarray(priority, dtype=np.float64)
    # rank: smaller = earlier (heap key), ties by node id
    rank = np.empty(n, dtype=np.int64)
    rank[np.lexsort((np.arange(n), -prio))] = np.arange(n)
    rank = rank.tolist()
    devl = dev.tolist()
    w = pg.w[np.arange(n), dev].tolist()
    memv = pg.mem.tolist()
    ob = pg.out_bytes.tolist()
    pers = pg.persistent.tolist()
    alias = pg.alias.tolist()
    succ, pred = pg.succ, pg.pred
    K, B = pg.k, pg.b

    # readers of each node's output per device (one count per (node, device) pair: flat
    # index node * nd + device), and the remote devices needing it
    cnt = np.bincount(pg.src * nd + dev[pg.dst], minlength=n * nd).reshape(n, nd)
    own = (np.arange(n), dev)
    local = cnt[own].copy()
    cnt[own] = 0
    ru, rdv = np.nonzero(cnt)                          # sorted by node, then device
    nrem = np.bincount(ru, minlength=n)
    cnt[own] = local + nrem                            # remote copies release the original
    uses = cnt.ravel().tolist()
    remote: list = [None] * n
    if len(ru):
        cuts = np.flatnonzero(np.diff(ru)) + 1
        for u_, ds_ in zip(ru[np.r_[0, cuts]].tolist(), np.split(rdv, cuts)):
            remote[u_] = ds_.tolist()
    waiting = [len(p) for p in pred]
    cur = [0.0] * nd
    peak = [0.0] * nd
    start = np.zeros(n)
    finish = np.zeros(n)
    ready: list = [[] for _ in range(nd)]
    idle = [True] * nd
    send_free = [0.0] * nd
    recv_free = [0.0] * nd
    transfers: list = []
    events: list = []          # (time, seq, kind, a, b); kind 0 = finish op, 1 = arrival
    seq = 0
    busy = [0.0] * nd
    comm_bytes = 0.0

    def alloc(d, nb):
        cur[d] += nb
        if cur[d] > peak[d]:
            peak[d] = cur[d]

    def release(u, d):
        """One reader/transfer of u's buffer on device d is done."""
        key = u * nd + d
        left = uses[key] - 1
        uses[key] = left
        if left > 0:
            return
        if d == devl[u]:
            if pers[u]:
                return
            cur[d] -= memv[u]
            if alias[u] >= 0:          # a view's storage is its base's (or the received copy's)
                release(alias[u], d)
        else:
            cur[d] -= ob[u]

    def try_start(d, t):
        nonlocal seq
        if not idle[d] or not ready[d]:
            return
        _, v = heapq.heappop(ready[d])
        idle[d] = False
        start[v] = t
        f = t + w[v]
        finish[v] = f
        busy[d] += w[v]
        c = cur[d] + memv[v]
        cur[d] = c
        if c > peak[d]:
            peak[d] = c
        seq += 1
        heapq.heappush(events, (f, seq, 0, v, d))

    for v in range(n):
        if waiting[v] == 0:
            heapq.heappush(ready[devl[v]], (rank[v], v))
    for d in range(nd):
        try_start(d, 0.0)

    ports = contention == "ports"
    while events:
        t, _, kind, a, d = heapq.heappop(events)
        if kind == 0:
            v = a
            idle[d] = True
            # inputs of v are released (a view keeps its base alive through its own buffer)
            for p in pred[v]:
                if alias[v] == p:
                    continue
                release(p, d)
            if alias[v] >= 0 and uses[v * nd + d] == 0:
                release(alias[v], d)
            for s in succ[v]:
                if devl[s] == d:
                    waiting[s] -= 1
                    if waiting[s] == 0:
                        heapq.heappush(ready[d], (rank[s], s))
            if remote[v]:
                nb = ob[v]
                for e in remote[v]:
                    dur = K[d, e] * nb + B[d, e]
                    st = t
                    if ports:
                        if send_free[d] > st:
                            st = send_free[d]
                        if recv_free[e] > st:
                            st = recv_free[e]
                        send_free[d] = recv_free[e] = st + dur
                    alloc(e, nb)
                    comm_bytes += nb
                    transfers.append((v, d, e, st, st + dur, nb))
                    seq += 1
                    heapq.heappush(events, (st + dur, seq, 1, v, e))
            try_start(d, t)
        else:
            u, e = a, d
            release(u, devl[u])              # the sender's copy has gone out
            for s in succ[u]:
                if devl[s] == e:
                    waiting[s] -= 1
                    if waiting[s] == 0:
                        heapq.heappush(ready[e], (rank[s], s))
            try_start(e, t)
    if any(x > 0 for x in waiting):
        raise ValueError("simulation stalled: the graph or placement is inconsistent")
    makespan = float(max(finish.max() if n else 0.0,
                         max((tr[4] for tr in transfers), default=0.0)))
    return SimResult(makespan, np.asarray(peak), start, finish, dev, transfers,
                     np.asarray(busy), comm_bytes)

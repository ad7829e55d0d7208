"""Placing the coarse graph (Celeritas Section 5.2): Order-Place and Adjusting Placement.

* **Order-Place** - clusters in CPD-TOPO order on one device until its memory is full, then the
  next device (Section 6.2.2); best effort when every device is full.
* **Adjusting Placement** (Algorithm 2) - clusters in CPD-TOPO order; for each device the
  earliest start time ``EST = max(pre_t, d_ava)`` (equation 7) where ``pre_t`` waits for every
  predecessor's finish plus ``c_{p,i}`` when it sits on another device, and ``d_ava`` is the
  start of the first idle slot of the device, after ``pre_t``, long enough for the cluster
  (insertion into idle slots); a device whose free memory is below the cluster's gets
  ``EST = ∞``.  The cluster stays on the previous cluster's device ``d_k`` unless
  ``EST(d_k) − EST(d_1) > back_cost = max_{s in succ} c_{i,s}`` (equations 8-9), where ``d_1``
  has the smallest EST; when every device is full, the one using the least memory is taken
  (best effort).

Co-location (Section 6.1, as Baechi): when the first node of a co-location group is placed on
``d`` the whole group goes to ``d``.  A cluster's members whose group is already placed are
*bound* and follow their group; the placer decides the device of the *free* members only, and
reserves the whole memory of every group it starts.  A cluster whose members end up on several
devices (in the backward pass every member is bound, to the devices of its forward ops) is
scheduled as *runs* - maximal stretches of consecutive members on one device, in CPD-TOPO
order - each waiting for all its predecessors, those in earlier runs of the same cluster
included, so the placer's own schedule (``Fin_t``, hence every later EST) is feasible.

Memory (both placers): the liveness rule as a placer can keep it (:class:`~.memory.LiveBudget`)
along the CPD-TOPO order: an output is charged from its operator until all its consumers are
placed, a tensor received from another device likewise (Section 6.1 models transfers as
nodes on the receiving device), persistent memory for good, and a co-location group is
admitted by its persistent memory.  A cluster is admitted on a device when the live bytes
there plus everything its free members allocate (no frees counted inside the cluster) fit;
bound members that take their group's device over its capacity make the cluster best effort.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field

import numpy as np

from explorer.engine.placement.memory import LiveBudget
from explorer.engine.placement.order import cpd_topo, tlevel_blevel

__all__ = ["CoarsePlacement", "coarse_order", "order_place", "adjusting_placement"]


@dataclass
class CoarsePlacement:
    """A device per cluster (of its free members) and per operator, the placer's own schedule
    and what best effort was needed for."""

    device: np.ndarray
    node_device: np.ndarray
    start: np.ndarray
    finish: np.ndarray
    order: list
    best_effort: list = field(default_factory=list)     # clusters placed over a memory limit
    used: np.ndarray | None = None                      # peak of the live budget per device
    moves: int = 0                                      # clusters moved off d_k by eq. 9
    log: list = field(default_factory=list)             # per cluster: d_k, EST, choice
    node_start: np.ndarray | None = None                # start of each operator's run
    node_finish: np.ndarray | None = None               # end of it (Fin_t of the operator)
    node_run: np.ndarray | None = None                  # run (block scheduled at once) id

    def __post_init__(self):
        if self.device.shape != self.start.shape:
            raise ValueError(f"{self.device.shape} devices vs {self.start.shape} start times")
        if (self.node_device < 0).any():
            raise ValueError(f"{int((self.node_device < 0).sum())} operators left unplaced")


class _Timeline:
    """Busy intervals of one device, sorted; finds the first idle slot (insertion)."""

    __slots__ = ("starts", "ends")

    def __init__(self):
        self.starts: list = []
        self.ends: list = []

    def slot(self, t: float, dur: float) -> float:
        """Earliest ``s >= t`` with ``[s, s + dur)`` free."""
        i = bisect.bisect_right(self.ends, t)
        while i < len(self.starts):
            if t + dur <= self.starts[i]:
                return t
            if self.ends[i] > t:
                t = self.ends[i]
            i += 1
        return t

    def add(self, s: float, e: float):
        if e <= s:
            return
        i = bisect.bisect_left(self.starts, s)
        self.starts.insert(i, s)
        self.ends.insert(i, e)


def coarse_order(co, k: float, lat: float) -> list:
    """CPD-TOPO of the coarse graph (Algorithm 2, line 3)."""
    topo = list(range(co.n))           # clusters are numbered in a topological order
    c = {e: k * nb + lat for e, (nb, _) in co.edges.items()}
    tl, bl = tlevel_blevel(co.n, co.succ, co.pred, topo, co.w.mean(axis=1), c_edge=c)
    return cpd_topo(co.n, co.succ, co.pred, tl + bl)


class _State:
    """Node-level bookkeeping shared by Order-Place and Adjusting Placement."""

    def __init__(self, co, pg):
        self.co, self.pg = co, pg
        n, nd = pg.n, pg.ndev
        self.node_dev = np.full(n, -1, dtype=np.int64)
        self.fin = np.zeros(n)
        self.start = np.zeros(n)
        self.run = np.full(n, -1, dtype=np.int64)
        self.nrun = 0
        self.live = LiveBudget(pg)
        self.used = self.live.cur                 # live bytes per device (the budget)
        self.gdev = self.live.gdev
        self.tls = [_Timeline() for _ in range(nd)]
        self.over: set = set()                    # clusters whose bound members overflowed
        self.pins = None

    def split(self, v, pinned: bool):
        """(free members, {device: bound members}) of cluster v."""
        m = self.co.members[v]
        g = self.pg.group[m]
        if pinned or len(self.gdev) == 0:
            return m, {}
        gd = np.where(g >= 0, self.gdev[np.maximum(g, 0)], -1)
        bound = gd >= 0
        parts: dict = {}
        for b in np.unique(gd[bound]).tolist():
            parts[b] = m[gd == b]
        return m[~bound], parts

    def ext_preds(self, members):
        """Predecessors of ``members`` outside that set (in this cluster or earlier ones)."""
        pg = self.pg
        inside = set(members.tolist())
        ps = {p for x in inside for p in pg.pred[x] if p not in inside}
        return np.fromiter(ps, dtype=np.int64, count=len(ps))

    def pre_t(self, ext) -> np.ndarray:
        """pre_t per device for a part whose outside predecessors are ``ext`` (eq. 7).

        Only already scheduled predecessors count (a bound member of the same cluster that
        is scheduled after the decision is waited for when the part is committed)."""
        pg = self.pg
        if len(ext):
            ext = ext[self.node_dev[ext] >= 0]
        if len(ext) == 0:
            return np.zeros(pg.ndev)
        dp = self.node_dev[ext]
        arr = self.fin[ext][:, None] + pg.k[dp] * pg.out_bytes[ext][:, None] + pg.b[dp]
        return arr.max(axis=0)

    def need(self, free, ext, ext_dev) -> np.ndarray:
        """Bytes the free part allocates on each device with no frees inside it: its
        members' outputs (the persistent bytes of every group it starts, once) plus the
        tensors it receives there (``ext_dev``: the device of each outside predecessor -
        placed, or bound to its group's device)."""
        pg, live = self.pg, self.live
        g = pg.group[free]
        pers = pg.persistent[free]
        own = float(pg.mem[free][(g < 0) | ~pers].sum())
        led = np.unique(g[g >= 0])
        led = led[self.gdev[led] < 0] if len(led) else led
        own += float(live.gpers[led].sum()) if len(led) else 0.0
        out = np.full(pg.ndev, own)
        for p, x in zip(ext.tolist(), ext_dev.tolist()):
            held = live.held[p]
            for d in range(pg.ndev):
                if x != d and not (held and d in held):
                    out[d] += pg.out_bytes[p]
        return out

    def commit_part(self, members, d, start, dur, ext, free: bool, cluster: int = -1):
        self.node_dev[members] = d
        self.fin[members] = start + dur
        self.start[members] = start
        self.run[members] = self.nrun
        self.nrun += 1
        self.tls[d].add(start, start + dur)
        for x in members.tolist():
            if not self.live.place(x, d):
                self.over.add(cluster)

    def commit_runs(self, v, dev_of: dict, free_set: set):
        """Schedule cluster v's members, all of whose devices are now known, as runs of
        consecutive members (CPD-TOPO order) on one device: each run starts in the first
        idle slot after its predecessors' data - including those of earlier runs of the same
        cluster on other devices - has arrived.  Returns the start of the first free run."""
        m = self.co.members[v].tolist()
        first_free = None
        i = 0
        while i < len(m):
            d = dev_of[m[i]]
            fr = m[i] in free_set
            j = i + 1
            while j < len(m) and dev_of[m[j]] == d and (m[j] in free_set) == fr:
                j += 1
            run = np.asarray(m[i:j], dtype=np.int64)
            ext = self.ext_preds(run)
            dur = float(self.pg.w[run, d].sum())
            s = self.tls[d].slot(float(self.pre_t(ext)[d]), dur)
            self.commit_part(run, d, s, dur, ext, free=fr, cluster=int(v))
            if fr and first_free is None:
                first_free = s
            i = j
        return first_free

    def prepare(self, v, free, parts):
        """``(dev_of, ext, ext_dev)`` for cluster v: the known device of every bound member,
        the free part's outside predecessors and their (placed or bound) devices."""
        dev_of = {}
        for b, mb in parts.items():
            for x in mb.tolist():
                dev_of[x] = b
        ext = self.ext_preds(free) if len(free) else np.zeros(0, dtype=np.int64)
        ext_dev = np.array([self.node_dev[p] if self.node_dev[p] >= 0 else dev_of.get(p, -1)
                            for p in ext.tolist()], dtype=np.int64)
        return dev_of, ext, ext_dev


def _least_used(used, capacity):
    """Best effort: the device with the lowest memory usage (relative to its capacity)."""
    return int(np.argmin(np.asarray(used) / np.asarray(capacity)))


def _finish(co, st, order, best_effort, moves, log) -> CoarsePlacement:
    best_effort = sorted(set(best_effort) | (st.over - {-1}))
    dev = np.zeros(co.n, dtype=np.int64)
    start, finish = np.zeros(co.n), np.zeros(co.n)
    for v in range(co.n):
        m = co.members[v]
        ds = st.node_dev[m]
        dev[v] = int(np.bincount(ds, weights=st.pg.w[m, 0] + 1e-12).argmax())
        finish[v] = float(st.fin[m].max()) if len(m) else 0.0
        start[v] = finish[v] - float(co.w[v, dev[v]])
    return CoarsePlacement(dev, st.node_dev.copy(), start, finish, list(order), best_effort,
                           st.live.peak.copy(), moves, log, st.start.copy(), st.fin.copy(),
                           st.run.copy())


def order_place(co, pg, order=None) -> CoarsePlacement:
    """Order-Place: fill device 0 in CPD-TOPO order up to its memory limit, then device 1, ...

    Pinned clusters go to their device regardless; bound members follow their group.
    """
    nd = pg.ndev
    cap = pg.capacity
    order = coarse_order(co, pg.k_mean, pg.b_mean) if order is None else order
    st = _State(co, pg)
    best_effort = []
    cur = 0
    for v in order:
        pinned = co.pin[v] >= 0
        free, parts = st.split(v, pinned)
        dev_of, ext, ext_dev = st.prepare(v, free, parts)
        if len(free) == 0:
            st.commit_runs(v, dev_of, set())
            continue
        need = st.need(free, ext, ext_dev)
        if pinned:
            d = int(co.pin[v])
            if st.used[d] + need[d] > cap[d]:
                best_effort.append(int(v))
        else:
            while cur < nd and st.used[cur] + need[cur] > cap[cur]:
                cur += 1
            if cur < nd:
                d = cur
            else:
                fits = [x for x in range(nd) if st.used[x] + need[x] <= cap[x]]
                d = fits[0] if fits else _least_used(st.used, cap)
                if not fits:
                    best_effort.append(int(v))
        for x in free.tolist():
            dev_of[x] = d
        st.commit_runs(v, dev_of, set(free.tolist()))
    return _finish(co, st, order, best_effort, 0, [])


def adjusting_placement(co, pg, order=None) -> CoarsePlacement:
    """Algorithm 2 on the coarse graph ``co`` (devices, links and capacity from ``pg``)."""
    nd = pg.ndev
    cap = pg.capacity
    km, bm = pg.k_mean, pg.b_mean
    order = coarse_order(co, km, bm) if order is None else order
    st = _State(co, pg)
    best_effort = []
    moves = 0
    prev = 0
    inf = math.inf
    log = []
    for v in order:
        pinned = co.pin[v] >= 0
        free, parts = st.split(v, pinned)
        dev_of, ext, ext_dev = st.prepare(v, free, parts)
        if len(free) == 0:                      # every member follows its group
            st.commit_runs(v, dev_of, set())
            continue
        need = st.need(free, ext, ext_dev)
        pre = st.pre_t(ext)
        wf = pg.w[free].sum(axis=0)
        back_cost = max((km * co.edges[(v, s)][0] + bm for s in co.succ[v]), default=0.0)
        est = [inf] * nd
        for d in range(nd):
            if cap[d] - st.used[d] < need[d]:
                continue
            est[d] = st.tls[d].slot(float(pre[d]), float(wf[d]))   # max(pre_t, d_ava)
        be = False
        if pinned:
            d = int(co.pin[v])
            be = est[d] == inf
        else:
            dk = prev
            d1 = min(range(nd), key=lambda x: (est[x], x))
            if est[d1] < inf and (est[dk] == inf or est[dk] - est[d1] > back_cost):
                d = d1
                moves += d1 != dk
            elif est[dk] < inf:
                d = dk
            else:                                           # all devices out of memory
                d = _least_used(st.used, cap)
                be = True
        if be:
            best_effort.append(int(v))
        log.append({"cluster": int(v), "d_k": int(prev), "device": int(d),
                    "est": [x if x < inf else None for x in est], "back_cost": back_cost,
                    "best_effort": be, "bound_ops": int(sum(len(x) for x in parts.values())),
                    "need": float(need[d]), "free_bytes": (cap - st.used).tolist()})
        for x in free.tolist():
            dev_of[x] = d
        st.commit_runs(v, dev_of, set(free.tolist()))
        prev = d
    return _finish(co, st, order, best_effort, moves, log)

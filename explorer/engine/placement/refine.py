"""Simulated refinement of a cluster placement: move whole placement decisions between devices
while the shared simulator says the step gets faster.

Not in the Celeritas paper.  Adjusting Placement (Algorithm 2) decides each cluster once,
from an estimate of start times in which a cluster runs as one block: it cannot see that the
second LSTM layer on another device could start after the first time step of the first layer
(a layer pipeline), nor what its choice does to the backward pass that co-location ties to
it.  This step revisits those decisions with the simulator every method is judged by.

Three phases share one budget of ``max_evals`` simulations:

1. **Cluster moves** - the *units* are the decisions Adjusting Placement made: a fused
   cluster's free operators together with every co-location group they lead (the backward
   operators and updates that follow them).  A pass tries each unit on every other device,
   the least busy while the unit runs in the current schedule first (:class:`DeviceBusy`):
   with a budget smaller than a pass (29 simulations for 187 clusters on a 33,651-node
   graph) the first tries are the likely ones.
2. **Split moves** (optional ``split_units``) - the same moves with the units of a finer
   fusion (a smaller window ``R``), each tried on the ``split_tries`` least busy devices
   only (one by default: a finer fusion has many units), so a cluster that holds a whole
   block of parallel branches can give one branch to another device.  Fusion minimises the
   cut, so coarse clusters keep parallel branches together (Inception-v3's blocks); the
   first phase moves whole blocks and stops at a local optimum that this phase leaves, a
   level down as in multilevel partitioning (METIS's uncoarsening).
3. **Boundary moves** - the finest units co-location allows (a group, or an operator in
   none) that have an edge to another device are tried on that device, the pairs with the
   most bytes across the cut first (the Kernighan-Lin / Fiduccia-Mattheyses idea of moving
   boundary vertices, judged here by the simulator instead of the cut).

A move is kept when

    (memory overflow = Σ_d max(0, use_d − capacity_d),  simulated step time)

decreases lexicographically, so a placement within its limits never leaves them and one
over them is repaired first.  ``use_d`` is, by default, the device's simulated peak - the
liveness rule of :mod:`.memory` that ``oom`` is judged by - or with ``memory="budget"`` the
stricter whole-step sum (:func:`budget_per_device`: every output for the whole step plus
received tensors; a move that breaks it is refused before simulating).  Passes repeat until no move helps or the budget is spent.
Units holding a pinned operator never move.

Example
-------
>>> import networkx as nx, numpy as np
>>> from explorer.engine.core.devices import preset
>>> from explorer.engine.placement.placement_graph import from_networkx
>>> g = nx.DiGraph([("a", "b"), ("a", "c")])
>>> nx.set_node_attributes(g, {"a": 0.01, "b": 1.0, "c": 1.0}, "time")
>>> pg = from_networkx(g, preset("v100-pcie-4", 2))
>>> res = refine(pg, np.zeros(3, dtype=int), [np.array([0]), np.array([1]), np.array([2])])
>>> bool(res.after < res.before), bool(res.placement[1] != res.placement[2])
(True, True)
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from explorer.engine.placement.simulator import dispatch_priority, simulate

__all__ = ["Refinement", "placement_units", "refine", "default_evals", "budget_per_device"]


@dataclass
class Refinement:
    """Refined placement and what the search did (``moves``: accepted moves in order)."""

    placement: np.ndarray
    before: float
    after: float
    evals: int
    passes: int
    seconds: float
    moves: list = field(default_factory=list)
    exhausted: bool = False            # stopped by the budget, not at a local optimum
    overflow: float = 0.0              # bytes over capacity at the end (by ``memory``'s rule)

    def __post_init__(self):
        if self.evals < 0:
            raise ValueError(f"evals={self.evals} must be >= 0")


def default_evals(n: int) -> int:
    """Simulation budget for an ``n``-operator graph: about 10^6 simulated operators, at most
    200 (200 simulations for Inception-v3's 2,514 nodes, 142 for NMT's 7,016, 29 for
    33,651).  NMT needs ~150 to find its layer pipeline; Inception-v3's cluster moves stop
    at a local optimum after about 40 and its split moves gain most in the next 100."""
    return int(min(200, max(10, 1_000_000 // max(n, 1))))


def budget_per_device(pg, placement) -> np.ndarray:
    """The whole-step memory sum of a placement: every operator's memory on its device for the
    whole step plus each tensor received from another device (once per device) - an upper
    bound of any schedule's liveness peak (``refine(memory="budget")``)."""
    dev = np.asarray(placement, dtype=np.int64)
    b = np.bincount(dev, weights=pg.mem, minlength=pg.ndev).astype(np.float64)
    s, t = pg.src, pg.dst
    x = dev[s] != dev[t]
    key = np.unique(s[x] * pg.ndev + dev[t[x]])
    b += np.bincount(key % pg.ndev, weights=pg.out_bytes[key // pg.ndev], minlength=pg.ndev)
    return b


def placement_units(pg, co) -> list:
    """The nodes each cluster's decision places: its own operators, minus those bound to a
    group an earlier cluster leads, plus every member of the groups it leads."""
    order = np.concatenate(co.members) if co.n else np.zeros(0, dtype=np.int64)
    owner = np.asarray(co.cid, dtype=np.int64).copy()
    grp = pg.group
    if (grp >= 0).any():
        ng = int(grp.max()) + 1
        lead = np.full(ng, -1, dtype=np.int64)
        g_ord = grp[order]
        has = g_ord >= 0
        # the first member of each group in cluster order decides its device
        first_pos = np.full(ng, len(order), dtype=np.int64)
        np.minimum.at(first_pos, g_ord[has], np.nonzero(has)[0])
        ok = first_pos < len(order)
        lead[ok] = co.cid[order[first_pos[ok]]]
        ing = grp >= 0
        owner[ing] = lead[grp[ing]]
    srt = np.argsort(owner, kind="stable")
    bounds = np.searchsorted(owner[srt], np.arange(co.n + 1))
    return [srt[bounds[c]:bounds[c + 1]] for c in range(co.n)]


def group_units(pg) -> list:
    """The finest units that keep co-location whole: each group, and each operator in none."""
    g = pg.group.copy()
    solo = g < 0
    g[solo] = (int(g.max()) + 1 if (~solo).any() else 0) + np.arange(int(solo.sum()))
    srt = np.argsort(g, kind="stable")
    gs = g[srt]
    bounds = np.append(np.searchsorted(gs, np.unique(gs)), len(gs))
    return [srt[bounds[i]:bounds[i + 1]] for i in range(len(bounds) - 1)]


class _Search:
    """The current placement, its score and the evaluation budget shared by both phases."""

    def __init__(self, pg, dev, priority, contention, memory, max_evals):
        self.pg, self.dev, self.priority = pg, dev, priority
        self.contention, self.memory, self.max_evals = contention, memory, max_evals
        self.evals, self.moves, self.exhausted = 0, [], False
        self.sim = None                        # the simulation of the current placement
        self.best = self.score()
        self.sim = self._last

    def score(self):
        pg = self.pg
        s = simulate(pg, self.dev, priority=self.priority, contention=self.contention)
        self._last = s
        use = s.peak_memory if self.memory == "simulated" else budget_per_device(pg, self.dev)
        over = float(np.maximum(use - pg.capacity * (1 + 1e-9), 0.0).sum())
        return (over, float(s.makespan))

    def over_budget(self) -> float:
        use = budget_per_device(self.pg, self.dev)
        return float(np.maximum(use - self.pg.capacity * (1 + 1e-9), 0.0).sum())

    def try_move(self, u, d, phase: str) -> bool:
        """Move unit ``u`` to device ``d`` if that scores better; False when it does not (or
        the budget is spent - ``exhausted``)."""
        cur = int(self.dev[u[0]])
        was = self.dev[u].copy()         # a finer unit may straddle devices: restore each
        if self.evals >= self.max_evals:
            self.exhausted = True
            return False
        self.dev[u] = d
        # the budget is cheap to check: a move that breaks it is refused without simulating
        if self.memory == "budget" and self.best[0] == 0.0 and self.over_budget() > 0.0:
            self.dev[u] = was
            return False
        sc = self.score()
        self.evals += 1
        if sc < self.best and (sc[0] < self.best[0] or sc[1] < self.best[1] - 1e-12):
            self.moves.append({"phase": phase, "first_op": int(u[0]), "ops": int(len(u)),
                               "from": cur, "to": int(d), "step_s": sc[1],
                               "overflow_bytes": sc[0]})
            self.best = sc
            self.sim = self._last
            return True
        self.dev[u] = was
        return False


class DeviceBusy:
    """Each device's cumulative busy time in a simulated schedule (piecewise linear: a device
    runs one operator at a time), to ask how busy a device is while given operators run."""

    def __init__(self, sim, ndev: int):
        self.sim, self.ndev = sim, ndev
        self.per = []
        for d in range(ndev):
            on = np.flatnonzero(sim.placement == d)
            o = on[np.argsort(sim.start[on], kind="stable")]
            st, du = sim.start[o], sim.finish[o] - sim.start[o]
            self.per.append((st, du, np.concatenate([[0.0], np.cumsum(du)])))

    def _cum(self, d, t):
        st, du, before = self.per[d]
        if len(st) == 0:
            return np.zeros_like(t)
        i = np.searchsorted(st, t, side="right")                # operators started by t
        j = np.maximum(i - 1, 0)
        return before[j] + np.where(i > 0, np.clip(t - st[j], 0.0, du[j]), 0.0)

    def overlap(self, nodes) -> np.ndarray:
        """Per device, the sum over ``nodes`` of its busy time within ``[start_v, finish_v)``."""
        s, f = self.sim.start[nodes], self.sim.finish[nodes]
        return np.array([float((self._cum(d, f) - self._cum(d, s)).sum())
                         for d in range(self.ndev)])


def busy_overlap(sim, ndev: int, nodes) -> np.ndarray:
    """:meth:`DeviceBusy.overlap` of ``nodes`` in ``sim``."""
    return DeviceBusy(sim, ndev).overlap(nodes)


def _idle_first_pass(st, movable, tries: int, phase: str = "split") -> bool:
    """Units, each tried on the ``tries`` other devices that are least busy while it runs in
    the current schedule (where a branch could overlap the rest of its block)."""
    improved = False
    db = None
    for u in movable:
        cur = int(st.dev[u[0]])
        if db is None or db.sim is not st.sim:                  # after an accepted move
            db = DeviceBusy(st.sim, st.pg.ndev)
        busy = db.overlap(u)
        busy[cur] = np.inf
        for d in np.argsort(busy, kind="stable")[:tries].tolist():
            if d == cur:
                continue
            if st.try_move(u, d, phase):
                improved = True
                break
            if st.exhausted:
                return improved
    return improved


def _movable(units, pinned) -> list:
    """The non-empty units holding no pinned operator."""
    out = [np.asarray(u, dtype=np.int64) for u in units if len(u)]
    return [u for u in out if not pinned[u].any()]


def _boundary_pass(st, fine, fine_of, free) -> bool:
    """Move co-location groups (or lone operators) that touch another device's operator to
    that device, the unit/device pairs with the most bytes across the cut first."""
    pg, dev = st.pg, st.dev
    cut = dev[pg.src] != dev[pg.dst]
    if not cut.any():
        return False
    s, t, nb = pg.src[cut], pg.dst[cut], pg.out_bytes[pg.src[cut]]
    key = np.concatenate([fine_of[s] * pg.ndev + dev[t], fine_of[t] * pg.ndev + dev[s]])
    uk, inv = np.unique(key, return_inverse=True)
    weight = np.bincount(inv, weights=np.concatenate([nb, nb]))
    improved = False
    for k in uk[np.argsort(-weight, kind="stable")].tolist():
        ui, d = divmod(k, pg.ndev)
        u = fine[ui]
        if not free[ui] or int(dev[u[0]]) == d:
            continue
        improved |= st.try_move(u, d, "boundary")
        if st.exhausted:
            break
    return improved


def refine(pg, placement, units, pins=None, max_evals: int | None = None, priority=None,
           contention: str = "ports", max_passes: int = 10, memory: str = "simulated",
           boundary: bool = True, split_units=None, split_tries: int = 1) -> Refinement:
    """Local search over unit moves, then split moves, then boundary moves (see the module
    docstring).

    Parameters
    ----------
    pg : PlacementGraph
    placement : array of int, shape (n,)
        Starting device per operator (not modified).
    units : list of int arrays
        Node sets that move together in the first phase (:func:`placement_units`).
    pins : array of int, optional
        Device per node, -1 = free; a unit with a pinned node stays.
    max_evals : int, optional
        Simulation budget of both phases; default :func:`default_evals`.
    priority : array, optional
        The simulator's dispatch priority (default its own, computed once here).
    memory : {"simulated", "budget"}
        What must stay within capacity: each device's simulated (liveness) peak, the rule
        ``oom`` is judged by, or the stricter whole-step sum (:func:`budget_per_device`).
    boundary : bool
        Run the third phase (co-location groups across the cut).
    split_units : list of int arrays, or a function returning it, optional
        Units of the second phase (:func:`placement_units` of a finer fusion); a function is
        called only when the phase runs (the budget may be spent before); none: skipped.
    """
    t0 = time.perf_counter()
    dev = np.array(placement, dtype=np.int64, copy=True)
    if dev.shape != (pg.n,):
        raise ValueError(f"placement has shape {dev.shape}, expected ({pg.n},)")
    if max_evals is None:
        max_evals = default_evals(pg.n)
    if max_evals < 0 or max_passes < 0:
        raise ValueError(f"max_evals={max_evals} and max_passes={max_passes} must be >= 0")
    if memory not in ("simulated", "budget"):
        raise ValueError(f"memory must be 'simulated' or 'budget', got {memory!r}")
    if priority is None:
        priority = dispatch_priority(pg)
    pinned = (np.asarray(pins) >= 0) if pins is not None else np.zeros(pg.n, dtype=bool)
    movable = _movable(units, pinned)
    st = _Search(pg, dev, priority, contention, memory, max_evals)
    before = st.best[1]
    passes = 0
    while passes < max_passes and not st.exhausted:
        passes += 1
        if not _idle_first_pass(st, movable, pg.ndev, "cluster"):
            break
    if split_units is not None and not st.exhausted:
        finer = _movable(split_units() if callable(split_units) else split_units, pinned)
        for _ in range(max_passes):
            if st.exhausted or not _idle_first_pass(st, finer, split_tries):
                break
            passes += 1
    if boundary and not st.exhausted and pg.n:
        fine = group_units(pg)
        fine_of = np.empty(pg.n, dtype=np.int64)
        for k, u in enumerate(fine):
            fine_of[u] = k
        free = np.array([not pinned[u].any() for u in fine], dtype=bool)
        for _ in range(max_passes):
            if st.exhausted or not _boundary_pass(st, fine, fine_of, free):
                break
            passes += 1
    return Refinement(st.dev, before, st.best[1], st.evals, passes, time.perf_counter() - t0,
                      st.moves, st.exhausted, st.best[0])

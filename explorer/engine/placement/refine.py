"""Simulated refinement of a cluster placement: move whole placement decisions between devices
while the shared simulator says the step gets faster.

Not in the Celeritas paper.  Adjusting Placement (Algorithm 2) decides each cluster once,
from an estimate of start times in which a cluster runs as one block: it cannot see that the
second LSTM layer on another device could start after the first time step of the first layer
(a layer pipeline), nor what its choice does to the backward pass that co-location ties to
it.  This step revisits those decisions with the simulator every method is judged by.

*Units* are the decisions Adjusting Placement made: a fused cluster's free operators together
with every co-location group they lead (the backward operators and updates that follow them).
A pass tries each unit on every other device and keeps a move when the simulated step

    (memory overflow = Σ_d max(0, peak_d − capacity_d),  step time)

decreases lexicographically - so a placement without simulated OOM never gains one, and one
with OOM is first repaired.  Passes repeat until no move helps or the evaluation budget
(``max_evals`` simulations) is spent.  Units holding a pinned operator never move.

Example
-------
>>> import networkx as nx, numpy as np
>>> from explorer.engine.devices import preset
>>> from explorer.engine.placement.graph import from_networkx
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

from .simulator import simulate

__all__ = ["Refinement", "placement_units", "refine", "default_evals"]


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

    def __post_init__(self):
        if self.evals < 0:
            raise ValueError(f"evals={self.evals} must be >= 0")


def default_evals(n: int) -> int:
    """Simulation budget for an ``n``-operator graph: about 8·10^5 simulated operators
    (a few seconds here; 318 evaluations for Inception-v3, 23 for a 33,652-op graph)."""
    return int(min(400, max(10, 800_000 // max(n, 1))))


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


def _score(pg, placement, priority, contention):
    s = simulate(pg, placement, priority=priority, contention=contention)
    over = float(np.maximum(s.peak_memory - pg.capacity, 0.0).sum())
    return (over, float(s.makespan))


def refine(pg, placement, units, pins=None, max_evals: int | None = None, priority=None,
           contention: str = "ports", max_passes: int = 10) -> Refinement:
    """First-improvement local search over unit moves (see the module docstring).

    Parameters
    ----------
    pg : PlacementGraph
    placement : array of int, shape (n,)
        Starting device per operator (not modified).
    units : list of int arrays
        Node sets that move together (:func:`placement_units`).
    pins : array of int, optional
        Device per node, -1 = free; a unit with a pinned node stays.
    max_evals : int, optional
        Simulation budget; default :func:`default_evals`.
    priority : array, optional
        The simulator's dispatch priority (default blevel, computed once here).
    """
    t0 = time.perf_counter()
    dev = np.array(placement, dtype=np.int64, copy=True)
    if dev.shape != (pg.n,):
        raise ValueError(f"placement has shape {dev.shape}, expected ({pg.n},)")
    if max_evals is None:
        max_evals = default_evals(pg.n)
    if max_evals < 0 or max_passes < 0:
        raise ValueError(f"max_evals={max_evals} and max_passes={max_passes} must be >= 0")
    if priority is None:
        from .order import _graph_levels
        _, priority = _graph_levels(pg)
    movable = [np.asarray(u, dtype=np.int64) for u in units if len(u)]
    if pins is not None:
        movable = [u for u in movable if not (np.asarray(pins)[u] >= 0).any()]
    best = _score(pg, dev, priority, contention)
    before = best[1]
    evals, passes, moves = 0, 0, []
    exhausted = False
    while passes < max_passes and not exhausted:
        passes += 1
        improved = False
        for u in movable:
            cur = int(dev[u[0]])
            for d in range(pg.ndev):
                if d == cur:
                    continue
                if evals >= max_evals:
                    exhausted = True
                    break
                dev[u] = d
                sc = _score(pg, dev, priority, contention)
                evals += 1
                if sc < best and (sc[0] < best[0] or sc[1] < best[1] - 1e-12):
                    moves.append({"first_op": int(u[0]), "ops": int(len(u)), "from": cur,
                                  "to": d, "step_s": sc[1], "overflow_bytes": sc[0]})
                    best, cur, improved = sc, d, True
                else:
                    dev[u] = cur
            if exhausted:
                break
        if not improved:
            break
    return Refinement(dev, before, best[1], evals, passes, time.perf_counter() - t0, moves,
                      exhausted)

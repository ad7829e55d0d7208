"""What every placer produces: :class:`PlacementPlan` (placement, simulated cost, trace, JSON),
and :func:`placement_result`, which wraps it in the methods' one :class:`Result`."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import numpy as np

from explorer.engine.core.plandoc import dumps
from explorer.engine.placement.simulator import SimResult, simulate

__all__ = ["PlacementPlan", "simulated_plan", "placement_result", "order_priority"]


@dataclass
class PlacementPlan:
    """A device per operator and how the one simulator judges it.

    ``oom`` - the one memory verdict - is true when the simulated liveness peak of a device, in
    the placement's schedule, is above its capacity.  A placer's own memory budget is a
    heuristic that guides it: ``best_effort`` lists what it placed beyond that budget, which
    is reported but is not out of memory when the simulated peaks fit.  ``clusters`` (Celeritas / Order-Place) lists each fused cluster's
    operators and device; ``trace`` holds the steps the UI replays (orders, breakpoints,
    per-cluster EST decisions).
    """

    algo: str
    names: list
    placement: np.ndarray
    sim: SimResult
    capacity: np.ndarray
    search_time_s: float
    best_effort: list = field(default_factory=list)
    clusters: list = field(default_factory=list)
    stats: dict = field(default_factory=dict)
    trace: list = field(default_factory=list)
    model: str | None = None
    batch: int | None = None
    preset: str = ""                   # the device graph's name

    def __post_init__(self):
        self.placement = np.asarray(self.placement, dtype=np.int64)
        if self.placement.shape != (len(self.names),):
            raise ValueError(f"placement has {self.placement.shape} entries for "
                             f"{len(self.names)} operators")
        if self.search_time_s < 0:
            raise ValueError(f"search_time_s={self.search_time_s} must be >= 0")

    @property
    def predicted_step_time_s(self) -> float:
        return float(self.sim.makespan)

    @property
    def peak_memory_bytes(self) -> list:
        return [float(x) for x in self.sim.peak_memory]

    @property
    def oom(self) -> bool:
        return bool(self.sim.oom(self.capacity))

    def schedule_order(self) -> list:
        """The operators by their start in the simulated schedule (ties in graph order): a
        topological order (an operator starts after its inputs' producers finished) that
        the runtime's device programs follow, so each device runs its operators - and sends
        their outputs - in the order the prediction assumed."""
        order = np.lexsort((np.arange(len(self.names)), self.sim.start))
        return [self.names[i] for i in order.tolist()]

    def device_of(self, name: str) -> int:
        return int(self.placement[self.names.index(name)])

    #: an operator-level plan: its document carries the operator graph's digest
    operator_level = True

    def document_fields(self, capture) -> dict:
        """Fields a sealed document adds to :meth:`to_dict`: none beyond the digest."""
        return {}

    def layouts(self, problem, n: int) -> dict:
        """Each operator's output whole on its device, keyed by tensor id."""
        from explorer.engine.core.geometry import TensorLayout
        og = problem.opgraph()
        where = dict(zip(self.names, self.placement.tolist()))
        return {op.output: TensorLayout.whole_on(og.tensors[op.output].shape, where[op.name], n)
                for op in og.ops.values() if op.name in where}

    def to_dict(self, schedule: bool = False) -> dict:
        """JSON document (CLI ``--json``): every operator's device, clusters, time, memory."""
        doc = {
            "algo": self.algo, "model": self.model, "batch": self.batch,
            "devices": len(self.capacity), "preset": self.preset, "ops": len(self.names),
            "clusters": [{"id": i, "device": int(c["device"]), "ops": list(c["ops"]),
                          "time_s": float(c.get("time_s", 0.0)),
                          "memory_bytes": float(c.get("memory_bytes", 0.0))}
                         for i, c in enumerate(self.clusters)],
            "predicted_step_time_s": self.predicted_step_time_s,
            "search_time_s": float(self.search_time_s),
            "peak_memory_bytes": self.peak_memory_bytes,
            "capacity_bytes": [float(x) for x in self.capacity],
            "oom": self.oom,
            "best_effort": [str(x) for x in self.best_effort],
            "comm_bytes": float(self.sim.comm_bytes),
            "busy_s": [float(b) for b in (self.sim.busy if self.sim.busy is not None else [])],
            "placement": {nm: int(d) for nm, d in zip(self.names, self.placement.tolist())},
            "order": self.schedule_order(),
            "stats": json.loads(dumps(self.stats)),
        }
        if schedule:
            doc["schedule"] = self.sim.gantt(self.names)
            doc["trace"] = json.loads(dumps(self.trace))
        return doc


def order_priority(n: int, order) -> np.ndarray:
    """The simulator's dispatch priority (larger first) that follows ``order`` (node ids,
    first runs first)."""
    order = np.asarray(order, dtype=np.int64)
    if sorted(order.tolist()) != list(range(n)):
        raise ValueError(f"a schedule order must list each of the {n} operators once")
    pr = np.empty(n)
    pr[order] = -np.arange(n, dtype=np.float64)
    return pr


def simulated_plan(algo, pg, placement, search_time_s, best_effort=(), clusters=(), stats=None,
                   trace=None, contention: str = "ports", order=None,
                   schedule: str = "CPD-TOPO") -> PlacementPlan:
    """Simulate ``placement`` in its placer's own schedule and wrap it in a
    :class:`PlacementPlan`: each device runs its ready operators in ``order`` (node ids; the
    placer's own schedule, named ``schedule``), or in CPD-TOPO when the placer has none.  The
    step in the common CPD-TOPO order is kept beside it (``stats["common_order_step_s"]``) for
    reference."""
    stats = dict(stats or {})
    stats["schedule"] = schedule
    if order is None:
        sim = simulate(pg, placement, contention=contention)
    else:
        sim = simulate(pg, placement, priority=order_priority(pg.n, order),
                       contention=contention)
        stats["common_order_step_s"] = float(
            simulate(pg, placement, contention=contention).makespan)
    return PlacementPlan(algo, list(pg.names), placement, sim, pg.capacity.copy(),
                           float(search_time_s), list(best_effort), list(clusters),
                           stats, list(trace or []), pg.meta.get("model"),
                           pg.meta.get("batch"), getattr(pg.devices, "name", ""))


def placement_result(plan: PlacementPlan, problem, pins=()):
    """The :class:`~explorer.engine.search.result.Result` of a placement method."""
    from explorer.engine.search.result import Result
    dg = problem.devices
    info = {"stats": json.loads(dumps(plan.stats)), "clusters": len(plan.clusters),
            "best_effort": [str(x) for x in plan.best_effort],
            "capacity_bytes": [float(x) for x in plan.capacity], "oom": plan.oom}
    return Result(plan.algo, "placement", problem.model or plan.model,
                  problem.batch or plan.batch, dict(problem.model_args or {}),
                  getattr(dg, "name", ""), int(len(plan.capacity)),
                  plan.predicted_step_time_s, plan.predicted_step_time_s, plan.search_time_s,
                  plan.peak_memory_bytes, float(plan.sim.comm_bytes), not plan.oom, plan,
                  [p.text() for p in (pins or ())], list(plan.trace), info,
                  capture=problem.opgraph if problem.model else None)

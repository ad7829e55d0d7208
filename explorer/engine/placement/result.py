"""What every placer returns: :class:`PlacementResult` (placement, simulated cost, trace, JSON)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import numpy as np

from ..plandoc import dumps
from .simulator import SimResult, simulate

__all__ = ["PlacementResult", "finish", "SCHEMA"]

SCHEMA = "plan-explorer/placement@1"


@dataclass
class PlacementResult:
    """A device per operator and how the one simulator judges it.

    ``oom`` is true when a memory limit is exceeded: the placer needed its best-effort rule
    (``best_effort`` lists what it placed over a limit) or the simulated peak of a device is
    above its capacity.  ``clusters`` (Celeritas / Order-Place) lists each fused cluster's
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
    devices: str = ""

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
        return bool(self.best_effort) or self.sim.oom(self.capacity)

    def device_of(self, name: str) -> int:
        return int(self.placement[self.names.index(name)])

    def to_dict(self, schedule: bool = False) -> dict:
        """JSON document (CLI ``--json``): every operator's device, clusters, time, memory."""
        doc = {
            "schema": SCHEMA, "algo": self.algo, "model": self.model, "batch": self.batch,
            "devices": self.devices, "ops": len(self.names),
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
            "placement": {nm: int(d) for nm, d in zip(self.names, self.placement.tolist())},
            "stats": json.loads(dumps(self.stats)),
        }
        if schedule:
            doc["schedule"] = self.sim.gantt(self.names)
            doc["trace"] = json.loads(dumps(self.trace))
        return doc


def finish(algo, pg, placement, search_time_s, best_effort=(), clusters=(), stats=None,
           trace=None, contention: str = "ports") -> PlacementResult:
    """Simulate ``placement`` and wrap it in a :class:`PlacementResult`."""
    sim = simulate(pg, placement, contention=contention)
    return PlacementResult(algo, list(pg.names), placement, sim, pg.capacity.copy(),
                           float(search_time_s), list(best_effort), list(clusters),
                           dict(stats or {}), list(trace or []), pg.meta.get("model"),
                           pg.meta.get("batch"), getattr(pg.devices, "name", ""))

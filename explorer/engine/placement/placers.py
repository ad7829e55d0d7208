"""The placement baselines: Baechi's m-TOPO, m-ETF and m-SCT, METIS and one device.

One public entry point, :func:`search`; the placers themselves are in
:mod:`explorer.engine.placement.heuristics`.  Every placer gets the same
:class:`~explorer.engine.placement.placement_graph.PlacementGraph` (same Standard Evaluation) and is
judged by the same simulator as Celeritas.
"""

from __future__ import annotations

import time

from explorer.engine.placement.heuristics import BASELINES
from explorer.engine.placement.result import PlacementPlan, placement_result, simulated_plan
from explorer.engine.placement.celeritas import pin_map, resolve_pins
from explorer.engine.search.options import PlacementOptions, make
from explorer.engine.search.result import Result

__all__ = ["search", "place"]


def search(problem, pins=None, options: PlacementOptions | None = None) -> Result:
    """Place the problem's operator graph with the placer ``options.algo``."""
    options = make(PlacementOptions, options)
    pg = problem.placement_graph(options.memory_per_device)
    plan = place(pg, options.algo, pin_map(pins), options.contention)
    return placement_result(plan, problem, pins)


def place(pg, algo: str, pins: dict | None = None, contention: str = "ports") -> PlacementPlan:
    """Run placer ``algo`` (m-topo, m-etf, m-sct, metis, single) on ``pg``."""
    if algo not in BASELINES:
        raise ValueError(f"unknown placer {algo!r}: choose one of {', '.join(BASELINES)}")
    t0 = time.perf_counter()
    pin = resolve_pins(pg, pins)
    dev, info = BASELINES[algo](pg, pin if (pin >= 0).any() else None)
    elapsed = time.perf_counter() - t0
    stats = {"nodes_before": pg.n, "edges_before": pg.n_edges, "ccr_before": pg.ccr(),
             **{k: v for k, v in info.items() if k not in ("best_effort", "order", "schedule")}}
    best = [pg.names[v] if isinstance(v, (int,)) or hasattr(v, "__index__") else str(v)
            for v in info.get("best_effort", [])]
    return simulated_plan(algo, pg, dev, elapsed, best, (), stats,
                          [{"step": algo, "info": stats}], contention, order=info.get("order"),
                          schedule=info.get("schedule", "CPD-TOPO"))

"""Entry points for the placement baselines and a dispatcher over every placement algorithm.

``run(algo, graph, devices, options)`` accepts ``celeritas | order-place | m-topo | m-etf |
m-sct | metis | single``; every method gets the same :class:`PlacementGraph` (same Standard
Evaluation) and is judged by the same simulator.
"""

from __future__ import annotations

import time

from ..placement.baselines import BASELINES
from ..placement.result import PlacementResult, finish
from . import celeritas

__all__ = ["PLACEMENT_ALGORITHMS", "search", "run"]

PLACEMENT_ALGORITHMS = {
    "celeritas": "Celeritas: CPD-TOPO, optimal operation fusion, Adjusting Placement, then "
                 "simulated refinement of the cluster decisions",
    "celeritas-paper": "Celeritas as published: Adjusting Placement of the fused clusters, "
                       "no simulated refinement",
    "order-place": "fused clusters in CPD-TOPO order, one device filled after another",
    "m-topo": "Baechi m-TOPO: BFS topological order, even memory share per device",
    "m-etf": "Baechi m-ETF: earliest-start-time list scheduling under memory limits",
    "m-sct": "Baechi m-SCT: m-ETF with LP favourite children (small communication time)",
    "metis": "METIS k-way partition (pymetis) balancing memory, minimising bytes cut",
    "single": "every operator on device 0",
}


def search(graph, devices, options: dict | None = None) -> PlacementResult:
    """Run baseline ``options['algo']`` (one of m-topo, m-etf, m-sct, metis, single)."""
    opts = dict(options or {})
    algo = opts.get("algo", "m-topo")
    if algo not in BASELINES:
        raise ValueError(f"unknown baseline {algo!r}: choose one of {', '.join(BASELINES)}")
    pg = celeritas.placement_graph(graph, devices, opts)
    t0 = time.perf_counter()
    pin = celeritas.resolve_pins(pg, opts.get("pins"))
    dev, info = BASELINES[algo](pg, pin if (pin >= 0).any() else None)
    elapsed = time.perf_counter() - t0
    stats = {"nodes_before": pg.n, "edges_before": pg.n_edges, "ccr_before": pg.ccr(),
             **{k: v for k, v in info.items() if k != "best_effort"}}
    best = [pg.names[v] if isinstance(v, (int,)) or hasattr(v, "__index__") else str(v)
            for v in info.get("best_effort", [])]
    return finish(algo, pg, dev, elapsed, best, (), stats,
                  [{"step": algo, "info": stats}], opts.get("contention", "ports"))


def run(algo: str, graph, devices, options: dict | None = None) -> PlacementResult:
    """Dispatch by name over :data:`PLACEMENT_ALGORITHMS`."""
    opts = dict(options or {}, algo=algo)
    if algo in ("celeritas", "celeritas-paper", "order-place"):
        return celeritas.search(graph, devices, opts)
    if algo in BASELINES:
        return search(graph, devices, opts)
    raise ValueError(f"unknown placement algorithm {algo!r}: choose one of "
                     f"{', '.join(PLACEMENT_ALGORITHMS)}")

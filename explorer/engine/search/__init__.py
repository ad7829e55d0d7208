"""Search algorithms: one module per algorithm, one entry point each.

``run(algo, graph, devices, cost_model, pins, options)`` dispatches by name.
"""

from __future__ import annotations

from . import baselines, exhaustive, optcnn
from .result import SearchResult

ALGORITHMS = {
    "optcnn": "layer-wise parallelism: node/edge elimination (Jia et al., ICML 2018)",
    "data": "data parallelism: every layer split on the sample dimension",
    "model": "model parallelism: every layer's channels split over all devices",
    "owt": "one weird trick: data-parallel convolutions, model-parallel dense layers",
    "exhaustive": "depth-first search over all strategies (small graphs; verification)",
}


def run(algo: str, graph, devices, cost_model, pins=None, options=None) -> SearchResult:
    if algo == "optcnn":
        return optcnn.search(graph, devices, cost_model, pins, options)
    if algo in baselines.STRATEGIES:
        return baselines.search(graph, devices, cost_model, pins,
                                dict(options or {}, strategy=algo))
    if algo == "exhaustive":
        return exhaustive.search(graph, devices, cost_model, pins, options)
    raise ValueError(f"unknown algorithm {algo!r}: choose one of {', '.join(ALGORITHMS)}")


__all__ = ["ALGORITHMS", "SearchResult", "run"]

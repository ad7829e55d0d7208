"""What methods work on, built once per request: the layer graph, the layer-wise cost model,
the joint forward+backward operator graph, the placers' graph, and the
:class:`~explorer.engine.search.Problem` that hands them to a method.

Captures also persist across processes (:mod:`explorer.engine.core.capture_cache`), so a
second ``explorer search`` of a model neither traces it again nor imports torch.
"""

from __future__ import annotations

from explorer.engine.core import capture_cache
from explorer.engine.core.devices import DeviceGraph
from explorer.engine.core.layergraph import LayerGraph
from explorer.engine.layerwise.costmodel import CostModel
from explorer.engine.search.request import Request
from explorer.service.cache import Cache, captured

__all__ = ["parse_model_args", "graph_for", "devices_for", "cost_model_for", "opgraph_for",
           "placement_graph_for", "memory_bytes", "problem_for", "summary", "forget_preset"]

GRAPHS = Cache("layer graphs")
COST_MODELS = Cache("cost models")
OPGRAPHS = Cache("operator graphs")
PLACEMENT_GRAPHS = Cache("placement graphs")


def parse_model_args(text: str) -> dict:
    """``"depth=101, width=8"`` -> ``{"depth": "101", "width": "8"}`` (builders coerce)."""
    out = {}
    for part in (text or "").replace(";", ",").split(","):
        part = part.strip()
        if not part:
            continue
        k, eq, v = part.partition("=")
        if not eq or not k.strip():
            raise ValueError(f"model argument {part!r}: write KEY=VALUE, e.g. depth=101")
        out[k.strip()] = v.strip()
    return out



def graph_for(req: Request) -> LayerGraph:
    """The request's layer graph (cached here and in the capture cache)."""
    return GRAPHS.get(req.graph_key(), captured(
        lambda: capture_cache.layer_graph(req.model, req.batch, dict(req.model_args))))


def devices_for(req: Request) -> DeviceGraph:
    """The request's device graph."""
    return req.device_graph()


def cost_model_for(req: Request) -> CostModel:
    """The layer-wise cost model of the request's layer graph on its devices."""
    def make():
        return CostModel(graph_for(req), devices_for(req), compute=req.cost, sync=req.sync,
                         degrees=req.degrees, dtype=req.dtype)
    return COST_MODELS.get(req.cost_key(), make)


def opgraph_for(req: Request):
    """The joint forward+backward operator graph of the request's model (cached here and in
    the capture cache; traced by one thread at a time)."""
    return OPGRAPHS.get(req.graph_key(), captured(
        lambda: capture_cache.op_graph(req.model, req.batch, dict(req.model_args))))


def memory_bytes(memory_gib) -> float | None:
    """A per-device memory limit in GiB (``None`` or ``""``: the devices' own) in bytes."""
    if memory_gib in (None, ""):
        return None
    m = float(memory_gib)
    if not m > 0:
        raise ValueError(f"memory per device must be > 0 GiB, got {memory_gib}")
    return m * 2 ** 30


def _placement_graph(req: Request, cap: float | None):
    from explorer.engine.core.precision import at_precision
    from explorer.engine.placement.estimate import from_opgraph, measured_times

    def make():
        og, dev = opgraph_for(req), devices_for(req)
        times = measured_times(og, dev, dtype=req.dtype) if req.cost == "measured" else None
        return from_opgraph(at_precision(og, req.dtype), dev, cap, times=times,
                            dtype=req.dtype)
    return PLACEMENT_GRAPHS.get(req.graph_key() + req.device_key() + (cap, req.cost, req.dtype),
                                make)


def placement_graph_for(req: Request, memory_gib=None):
    """The placers' input graph (Standard Evaluation of the operator graph), cached."""
    return _placement_graph(req, memory_bytes(memory_gib))


def problem_for(req: Request):
    """The request as a method's :class:`~explorer.engine.search.Problem`, whose captures
    come from these caches (each built once)."""
    from explorer.engine.search import Problem
    return Problem(req, devices_for(req), builders={
        "layer_graph": lambda: graph_for(req),
        "cost_model": lambda: cost_model_for(req),
        "opgraph": lambda: opgraph_for(req),
        "placement_graph": lambda cap: _placement_graph(req, cap)})


def summary(req: Request) -> dict:
    """Layers, parameters, FLOPs and activation memory of the request's model."""
    g = graph_for(req)
    s = g.summary()
    s["source"] = g.source
    return s


def forget_preset(name: str) -> None:
    """Drop what depends on preset ``name``'s rates (after ``explorer calibrate`` changed
    ``local``'s): its cost models and placers' graphs."""
    COST_MODELS.drop(lambda key: name not in key)
    PLACEMENT_GRAPHS.drop(lambda key: name not in key)

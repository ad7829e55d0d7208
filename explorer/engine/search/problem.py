"""What a method is asked to solve: a model, a device graph and the cost settings.

Every method takes a :class:`Problem` and asks it for the capture its family works on — the
layer graph and cost model (layer-wise), the joint forward+backward operator graph (Tofu), or
the placers' graph (placement).  Captures are built on first use, through the capture cache
(:mod:`explorer.engine.core.capture_cache`: a model traced once, in any process, is read
back); a caller that keeps them in memory (the application service) passes its own builders,
and tests pass prebuilt graphs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from explorer.engine.search.request import Request

__all__ = ["Problem", "Request"]


@dataclass
class Problem:
    """A :class:`~explorer.engine.search.request.Request` (model, batch, model arguments, cost
    settings) on ``devices``, a DeviceGraph (by default the request's own,
    :meth:`Request.device_graph`; when given, the request's device count follows it).

    ``layer_graph_``/``cost_model_``/``opgraph_``/``placement_graphs`` may be given prebuilt;
    ``builders`` may map ``"layer_graph"``, ``"cost_model"``, ``"opgraph"`` and
    ``"placement_graph"`` (called with the memory cap in bytes or ``None``) to functions that
    build (and cache) them."""

    request: Request
    devices: object = None
    layer_graph_: object = None
    cost_model_: object = None
    opgraph_: object = None
    placement_graphs: dict = field(default_factory=dict)
    builders: dict = field(default_factory=dict)

    def __post_init__(self):
        if not isinstance(self.request, Request):
            raise TypeError(f"a problem holds a Request, got {type(self.request).__name__}")
        if self.devices is None:
            self.devices = self.request.device_graph()
        elif self.devices.n != self.request.devices:
            self.request = self.request.replace(devices=self.devices.n)

    # the request's fields, read through (one place holds and validates them)
    model = property(lambda self: self.request.model)
    batch = property(lambda self: self.request.batch)
    model_args = property(lambda self: self.request.model_args)
    cost = property(lambda self: self.request.cost)
    sync = property(lambda self: self.request.sync)
    degrees = property(lambda self: self.request.degrees)
    dtype = property(lambda self: self.request.dtype)

    @classmethod
    def of(cls, graph, devices, cost_model=None) -> "Problem":
        """A problem around a prebuilt capture (layer graph, operator graph or placer graph)."""
        from explorer.engine.placement.placement_graph import PlacementGraph
        if isinstance(graph, PlacementGraph):       # a placer graph cannot be traced again
            return cls(Request(None, devices=devices.n), devices, placement_graphs={None: graph})
        req = Request(getattr(graph, "spec", None) or getattr(graph, "model", None),
                      getattr(graph, "batch", None),
                      dict(getattr(graph, "model_args", {}) or {}), devices=devices.n)
        if hasattr(graph, "tensors") and hasattr(graph, "ops"):
            return cls(req, devices, opgraph_=graph)
        return cls(req, devices, layer_graph_=graph, cost_model_=cost_model)

    def _build(self, what: str, default: Callable, *args):
        fn = self.builders.get(what)
        return fn(*args) if fn is not None else default(*args)

    def layer_graph(self):
        """The layer graph (OptCNN's layers), captured on first use."""
        if self.layer_graph_ is None:
            def build():                 # torch is imported only when nothing is cached
                from explorer.engine.core.capture_cache import layer_graph
                return layer_graph(self._spec(), self.batch, dict(self.model_args))
            self.layer_graph_ = self._build("layer_graph", build)
        return self.layer_graph_

    def cost_model(self):
        """The layer-wise cost model of the layer graph on the devices."""
        if self.cost_model_ is None:
            from explorer.engine.layerwise.costmodel import CostModel
            self.cost_model_ = self._build(
                "cost_model", lambda: CostModel(self.layer_graph(), self.devices,
                                                compute=self.cost, sync=self.sync,
                                                degrees=self.degrees, dtype=self.dtype))
        return self.cost_model_

    def opgraph(self):
        """The joint forward+backward operator graph (Tofu and the placers), its tensors
        sized in the request's precision
        (:func:`~explorer.engine.core.precision.at_precision`: bf16 activations 2 bytes)."""
        if self.opgraph_ is None:
            def build():
                from explorer.engine.core.capture_cache import op_graph
                return op_graph(self._spec(), self.batch, dict(self.model_args))
            self.opgraph_ = self._build("opgraph", build)
        if getattr(self.opgraph_, "precision", "fp32") != self.dtype and self.dtype == "bf16":
            from explorer.engine.core.precision import at_precision
            self.opgraph_ = at_precision(self.opgraph_, self.dtype)
        return self.opgraph_

    def placement_graph(self, memory_per_device: float | None = None):
        """The placers' graph (Standard Evaluation), with ``memory_per_device`` bytes per
        device when given (else the devices' own capacity)."""
        if memory_per_device in self.placement_graphs:
            return self.placement_graphs[memory_per_device]
        if None in self.placement_graphs:                 # a prebuilt placer graph
            out = self.placement_graphs[None].with_capacity(memory_per_device)
        else:
            from explorer.engine.placement.estimate import from_opgraph, measured_times

            def make(cap):
                og = self.opgraph()
                times = (measured_times(og, self.devices, dtype=self.dtype)
                         if self.cost == "measured" else None)
                return from_opgraph(og, self.devices, cap, times=times, dtype=self.dtype)
            out = self._build("placement_graph", make, memory_per_device)
        self.placement_graphs[memory_per_device] = out
        return out

    def _spec(self) -> str:
        if not self.model:
            raise ValueError("the problem names no model and holds no captured graph")
        return self.model

"""What a method is asked to solve: a model, a device graph and the cost settings.

Every method takes a :class:`Problem` and asks it for the capture its family works on — the
layer graph and cost model (layer-wise), the joint forward+backward operator graph (Tofu), or
the placers' graph (placement).  Captures are built on first use; a caller that caches them
(the application service) passes its own builders, and tests pass prebuilt graphs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

__all__ = ["Problem", "check_settings"]


def check_settings(batch=None, cost: str = "analytic", sync: str = "ps") -> int | None:
    """The settings a request and a problem share, validated in one place: ``batch`` (``None``
    or an integer ≥ 1, returned as ``int``), ``cost`` and ``sync``.  ``ValueError`` with the
    value given."""
    if batch is not None:
        try:
            batch = int(batch)
        except (TypeError, ValueError):
            raise ValueError(f"batch must be an integer ≥ 1, got {batch!r}") from None
        if batch < 1:
            raise ValueError(f"batch must be ≥ 1, got {batch}")
    if cost not in ("analytic", "measured"):
        raise ValueError(f"cost must be analytic or measured, got {cost!r}")
    if sync not in ("ps", "ring"):
        raise ValueError(f"sync must be ps or ring, got {sync!r}")
    return batch


@dataclass
class Problem:
    """A model (``model`` spec, ``batch``, ``model_args``) on ``devices`` (a DeviceGraph).

    ``cost`` ("analytic" | "measured"), ``sync`` ("ps" | "ring") and ``degrees`` (the degrees a
    layer's dimensions may take, :func:`~explorer.engine.core.geometry.degree_values`) configure
    the layer-wise cost model; ``cost="measured"`` also gives the placers each operator's time
    measured on this machine (``local`` preset, after ``explorer calibrate``).
    ``layer_graph``/``cost_model``/``opgraph``/``placement_graphs`` may be given prebuilt;
    ``builders`` may map ``"layer_graph"``, ``"cost_model"``, ``"opgraph"`` and
    ``"placement_graph"`` (called with the memory cap in bytes or ``None``) to functions that
    build (and cache) them."""

    devices: object
    model: str | None = None
    batch: int | None = None
    model_args: dict = field(default_factory=dict)
    cost: str = "analytic"
    sync: str = "ps"
    layer_graph_: object = None
    cost_model_: object = None
    opgraph_: object = None
    placement_graphs: dict = field(default_factory=dict)
    builders: dict = field(default_factory=dict)
    degrees: str = "auto"

    def __post_init__(self):
        if self.devices is None:
            raise ValueError("a problem needs a device graph")
        self.batch = check_settings(self.batch, self.cost, self.sync)
        if self.model is None:       # a prebuilt capture names its model (a placer graph
            g = self.layer_graph_ or self.opgraph_       # alone does not: it cannot be re-traced)
            if g is not None:
                self.model = getattr(g, "spec", None) or getattr(g, "model", None)
                if self.batch is None:
                    self.batch = getattr(g, "batch", None)

    @classmethod
    def of(cls, graph, devices, cost_model=None) -> "Problem":
        """A problem around a prebuilt capture (layer graph, operator graph or placer graph)."""
        from explorer.engine.placement.placement_graph import PlacementGraph
        if isinstance(graph, PlacementGraph):
            return cls(devices, placement_graphs={None: graph})
        if hasattr(graph, "tensors") and hasattr(graph, "ops"):
            return cls(devices, opgraph_=graph,
                       model_args=dict(getattr(graph, "model_args", {}) or {}))
        return cls(devices, layer_graph_=graph, cost_model_=cost_model,
                   model_args=dict(getattr(graph, "model_args", {}) or {}))

    def _build(self, what: str, default: Callable, *args):
        fn = self.builders.get(what)
        return fn(*args) if fn is not None else default(*args)

    def layer_graph(self):
        """The layer graph (OptCNN's layers), captured on first use."""
        if self.layer_graph_ is None:
            def build():                 # torch is imported only when nothing is cached
                from explorer.engine.core.importer import import_spec
                return import_spec(self._spec(), self.batch, dict(self.model_args))
            self.layer_graph_ = self._build("layer_graph", build)
        return self.layer_graph_

    def cost_model(self):
        """The layer-wise cost model of the layer graph on the devices."""
        if self.cost_model_ is None:
            from explorer.engine.layerwise.costmodel import CostModel
            self.cost_model_ = self._build(
                "cost_model", lambda: CostModel(self.layer_graph(), self.devices,
                                                compute=self.cost, sync=self.sync,
                                                degrees=self.degrees))
        return self.cost_model_

    def opgraph(self):
        """The joint forward+backward operator graph (Tofu and the placers)."""
        if self.opgraph_ is None:
            def build():
                from explorer.engine.core.opgraph import build_opgraph
                return build_opgraph(self._spec(), self.batch, dict(self.model_args))
            self.opgraph_ = self._build("opgraph", build)
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
                times = measured_times(og, self.devices) if self.cost == "measured" else None
                return from_opgraph(og, self.devices, cap, times=times)
            out = self._build("placement_graph", make, memory_per_device)
        self.placement_graphs[memory_per_device] = out
        return out

    def _spec(self) -> str:
        if not self.model:
            raise ValueError("the problem names no model and holds no captured graph")
        return self.model

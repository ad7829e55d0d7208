"""What a user asks for: one model on one set of devices, with one method and cost settings.

The only request type of the project: the command line and the app build a :class:`Request`,
the service caches by it, a :class:`~explorer.engine.search.problem.Problem` holds one, and a
plan document carries it (``to_dict``) so the plan can be rebuilt.  Like torchtitan's
``ParallelDims`` it is validated once, in ``__post_init__``, and a bad field is a
``ValueError`` that names the value given.

>>> Request("mlp", batch=8, devices=2).device_graph().name
'p100-nvlink-4'
>>> Request("mlp", batch=0)
Traceback (most recent call last):
ValueError: batch must be ≥ 1, got 0
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace

from explorer.engine.core import geometry as G
from explorer.engine.core import precision as P
from explorer.errors import ExplorerError

__all__ = ["Request", "COSTS", "SYNCS"]

COSTS = ("analytic", "measured")
SYNCS = ("ps", "ring")


@dataclass
class Request:
    """A model (``model`` spec, ``batch``, ``model_args``) on ``devices`` devices of the
    ``preset`` (or of ``cluster``, an uploaded cluster description, with ``preset="custom"``),
    searched with method ``algo``.

    ``cost`` ("analytic" | "measured"), ``sync`` ("ps" | "ring") and ``degrees`` (the degrees a
    layer's dimensions may take, :func:`~explorer.engine.core.geometry.degree_values`)
    configure the layer-wise cost model; ``cost="measured"`` also gives the placers each
    operator's time measured on this machine.  ``dtype`` is the step's precision (``fp32``,
    ``tf32`` or ``bf16``: autocast with float32 master weights,
    :mod:`explorer.engine.core.precision`); every family's costs and memory follow it.  ``model`` is ``None`` only for a problem built
    around a capture that cannot be traced again (:meth:`Problem.of`)."""

    model: str | None = "vgg16"
    batch: int | None = None
    model_args: dict = field(default_factory=dict)
    preset: str = "p100-nvlink-4"
    devices: int = 4
    algo: str = "optcnn"
    cost: str = "analytic"
    sync: str = "ps"
    cluster: dict | None = None       # uploaded cluster JSON (when preset == "custom")
    degrees: str = "auto"             # layer-wise degrees (see geometry.degree_values)
    dtype: str = "fp32"               # the step's precision: fp32 | tf32 | bf16 (autocast)

    def __post_init__(self):
        if self.batch is not None:
            try:
                batch = int(self.batch)
            except (TypeError, ValueError):
                raise ValueError(f"batch must be an integer ≥ 1, got {self.batch!r}") from None
            if batch < 1:
                raise ValueError(f"batch must be ≥ 1, got {batch}")
            self.batch = batch
        if self.cost not in COSTS:
            raise ValueError(f"cost must be analytic or measured, got {self.cost!r}")
        if self.sync not in SYNCS:
            raise ValueError(f"sync must be ps or ring, got {self.sync!r}")
        self.dtype = P.check(self.dtype)                      # ValueError naming the value
        try:
            self.devices = int(self.devices)
        except (TypeError, ValueError):
            raise ValueError(f"devices must be an integer ≥ 1, got {self.devices!r}") from None
        if self.devices < 1:
            raise ValueError(f"devices must be ≥ 1, got {self.devices}")
        if self.model is not None:
            self.model = str(self.model).strip()
            if not self.model:
                raise ValueError("choose a model: an example or path/to/file.py:function")
        self.model_args = dict(self.model_args or {})
        if not isinstance(self.degrees, str):                 # a list from a plan or the app
            self.degrees = ",".join(str(d) for d in self.degrees)
        G.degree_values(self.degrees, self.devices)          # ValueError with the numbers

    @classmethod
    def from_dict(cls, d: dict | None) -> "Request":
        """The request of a dict (its unknown keys ignored: plan documents carry more)."""
        d = dict(d or {})
        return cls(**{k: d[k] for k in cls.__dataclass_fields__ if k in d})

    def to_dict(self) -> dict:
        return asdict(self)

    def replace(self, **changes) -> "Request":
        """A copy with ``changes``, validated again."""
        return replace(self, **changes)

    def graph_key(self) -> tuple:
        """What a capture of the model depends on."""
        return (self.model, self.batch, tuple(sorted(self.model_args.items())))

    def device_key(self) -> tuple:
        """What the device graph depends on."""
        return (self.preset, self.devices, json.dumps(self.cluster, sort_keys=True))

    def cost_key(self) -> tuple:
        """What the layer-wise cost model depends on."""
        return self.graph_key() + self.device_key() + (self.cost, self.sync, self.degrees,
                                                       self.dtype)

    def device_graph(self):
        """The :class:`~explorer.engine.core.devices.DeviceGraph` of ``devices`` devices of
        the preset, or of the uploaded cluster for ``preset="custom"``."""
        from explorer.engine.core.devices import from_dict, preset
        if self.preset == "custom":
            if not self.cluster:
                raise ExplorerError("upload a cluster JSON file for the custom preset")
            return from_dict(self.cluster, "custom", "the uploaded cluster").subset(self.devices)
        return preset(self.preset, self.devices)

"""The one result type every method returns: :class:`Result`.

Whatever the family — layer-wise configurations (OptCNN and its baselines), tensor tilings
(Tofu and its baselines) or device placements (Celeritas and its baselines) — a method returns
a :class:`Result` with the same common fields, the family's own plan object in ``plan`` and a
JSON document from :meth:`Result.to_dict` (sealed for a file by :meth:`Result.document`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from explorer.engine.core.plandoc import VERSION, dumps, schema_of, seal

__all__ = ["Result", "FAMILIES"]

#: method families and the plan kind each produces
FAMILIES = {"layerwise": "layerwise", "tofu": "tofu", "placement": "placement"}


@dataclass
class Result:
    """What a method found and what it predicts.

    Common fields: ``algo``, ``family``, ``model``, ``batch``, ``model_args``, ``dtype``
    (the precision, ``fp32`` when absent from a document), ``preset``
    (device graph name), ``devices`` (count), ``objective_s`` (the method's own objective:
    equation 1 for layer-wise methods, Tofu's communication time, the simulated step for
    placements), ``predicted_step_time_s``, ``search_time_s``, ``memory_per_device_bytes``,
    ``comm_bytes`` (bytes communicated per step), ``fits_memory``, ``pins`` (as written),
    ``trace`` (the steps the app replays) and ``info``.  ``plan`` is the family's plan object
    (:class:`~explorer.engine.layerwise.plan.Plan`, :class:`~explorer.engine.tofu.search.TofuPlan`,
    :class:`~explorer.engine.placement.result.PlacementPlan`); ``tables`` and ``choice`` are
    the layer-wise cost tables and chosen candidate per layer (``--dump-costs``)."""

    algo: str
    family: str
    model: str | None
    batch: int | None
    model_args: dict
    preset: str
    devices: int
    objective_s: float
    predicted_step_time_s: float
    search_time_s: float
    memory_per_device_bytes: list
    comm_bytes: float
    fits_memory: bool
    plan: object
    pins: list = field(default_factory=list)
    trace: list = field(default_factory=list)
    info: dict = field(default_factory=dict)
    tables: object = None              # layer-wise: the CostTables (``--dump-costs``)
    choice: dict | None = None
    #: the graph the plan was made on, or a function returning it (built when first saved)
    capture: object = field(default=None, repr=False)
    #: the step's precision the costs assume and the runtime runs: fp32 | tf32 | bf16
    #: (:mod:`explorer.engine.core.precision`; set by :func:`explorer.engine.search.run`)
    dtype: str = "fp32"

    def __post_init__(self):
        if self.family not in FAMILIES:
            raise ValueError(f"unknown family {self.family!r}: one of {', '.join(FAMILIES)}")
        if self.search_time_s < 0:
            raise ValueError(f"search_time_s={self.search_time_s} must be ≥ 0")

    @property
    def kind(self) -> str:
        """The plan kind (document schema) this result saves as."""
        return FAMILIES[self.family]

    def to_dict(self, trace: bool = False, **body) -> dict:
        """The plan document: the family's body (``plan.to_dict(**body)``) with the common
        fields on top, ``schema`` and ``version``; ``trace`` adds the replayable steps."""
        doc = dict(self.plan.to_dict(**body))
        doc.update({
            "schema": schema_of(self.kind), "version": VERSION, "algo": self.algo,
            "family": self.family, "model": self.model, "batch": self.batch,
            "model_args": dict(self.model_args or {}), "preset": self.preset,
            "devices": int(self.devices), "objective_s": float(self.objective_s),
            "predicted_step_time_s": float(self.predicted_step_time_s),
            "search_time_s": float(self.search_time_s),
            "memory_per_device_bytes": [float(x) for x in self.memory_per_device_bytes],
            "comm_bytes": float(self.comm_bytes), "fits_memory": bool(self.fits_memory),
            "pins": list(self.pins), "info": json.loads(dumps(self.info)),
            "dtype": self.dtype})
        if trace:
            doc["trace"] = json.loads(dumps(self.trace))
        return doc

    def document(self) -> dict:
        """:meth:`to_dict` sealed for a file (checksum over everything): everything needed to
        execute the plan without searching again.  Operator-level plans add the digest of the
        operator graph they were made on (``opgraph_digest``: a model that now gives another
        graph is refused before launch); a Tofu plan adds its execution ``layout`` - every
        tensor's box per worker, every operator's output box, input regions and reduction."""
        doc = self.to_dict()
        if getattr(self.plan, "operator_level", False):
            if self.capture is None:
                raise ValueError(f"this {self.algo} result was made on a prebuilt placer "
                                 f"graph without its operator graph: it cannot be saved to run")
            from explorer.engine.core.opgraph import opgraph_digest
            if callable(self.capture):
                self.capture = self.capture()
            doc["opgraph_digest"] = opgraph_digest(self.capture)
        doc.update(self.plan.document_fields(self.capture))
        return seal(doc, self.kind)

    def layouts(self, problem) -> dict:
        """How every tensor of the plan lives on the devices, in the one vocabulary of
        :class:`~explorer.engine.core.geometry.TensorLayout` (the box each device holds):

        * layer-wise: each layer's output under its configuration (keyed by layer name);
        * Tofu: every partitioned tensor's tile per worker (keyed by tensor id);
        * placement: each operator's output whole on its device (keyed by tensor id).

        ``problem`` supplies the capture the plan was made on."""
        return self.plan.layouts(problem, int(self.devices))

    def summary(self) -> dict:
        """The common fields of a comparison row (``peak_bytes``: the largest device's)."""
        return {"algo": self.algo, "family": self.family, "objective_s": self.objective_s,
                "predicted_step_time_s": self.predicted_step_time_s,
                "search_time_s": self.search_time_s, "comm_bytes": self.comm_bytes,
                "peak_bytes": max(self.memory_per_device_bytes, default=0.0),
                "fits_memory": self.fits_memory}

"""The one result type every method returns: :class:`Result`.

Whatever the family — layer-wise configurations (OptCNN and its baselines), tensor tilings
(Tofu and its baselines) or device placements (Celeritas and its baselines) — a method returns
a :class:`Result` with the same common fields, the family's own plan object in ``plan`` and a
JSON document from :meth:`Result.to_dict` (sealed for a file by :meth:`Result.document`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import numpy as np

from ..costmodel import CostTables
from ..plan import LayerAssignment, Plan, layer_content_key, memory_per_device
from ..plandoc import VERSION, dumps, schema_of, seal

__all__ = ["Result", "FAMILIES", "layerwise_result"]

#: method families and the plan kind each produces
FAMILIES = {"layerwise": "layerwise", "tofu": "tofu", "placement": "placement"}


@dataclass
class Result:
    """What a method found and what it predicts.

    Common fields: ``algo``, ``family``, ``model``, ``batch``, ``model_args``, ``preset``
    (device graph name), ``devices`` (count), ``objective_s`` (the method's own objective:
    equation 1 for layer-wise methods, Tofu's communication time, the simulated step for
    placements), ``predicted_step_time_s``, ``search_time_s``, ``memory_per_device_bytes``,
    ``comm_bytes`` (bytes communicated per step), ``fits_memory``, ``pins`` (as written),
    ``trace`` (the steps the app replays) and ``info``.  ``plan`` is the family's plan object
    (:class:`~explorer.engine.plan.Plan`, :class:`~explorer.engine.search.tofu.TofuPlan`,
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
    tables: CostTables | None = None
    choice: dict | None = None
    #: the graph the plan was made on, or a function returning it (built when first saved)
    capture: object = field(default=None, repr=False)

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
            "pins": list(self.pins), "info": json.loads(dumps(self.info))})
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
        if self.family in ("tofu", "placement"):
            if self.capture is None:
                raise ValueError(f"this {self.algo} result was made on a prebuilt placer "
                                 f"graph without its operator graph: it cannot be saved to run")
            from ..opgraph import opgraph_digest
            if callable(self.capture):
                self.capture = self.capture()
            doc["opgraph_digest"] = opgraph_digest(self.capture)
        if self.family == "tofu":
            from ..geometry import ExecutionLayout
            from .tofu import execution_plan
            g = self.capture
            plan = execution_plan(self.plan, g)
            doc["layout"] = ExecutionLayout.from_plan(
                plan, {t: g.tensors[t].shape for t in plan["held"]}).to_json()
        return seal(doc, self.kind)

    def layouts(self, problem) -> dict:
        """How every tensor of the plan lives on the devices, in the one vocabulary of
        :class:`~explorer.engine.geometry.TensorLayout` (the box each device holds):

        * layer-wise: each layer's output under its configuration (keyed by layer name);
        * Tofu: every partitioned tensor's tile per worker (keyed by tensor id);
        * placement: each operator's output whole on its device (keyed by tensor id).

        ``problem`` supplies the capture the plan was made on."""
        from ..geometry import TensorLayout
        n = int(self.devices)
        if self.family == "layerwise":
            g = problem.layer_graph()
            return {la.name: TensorLayout.from_config(g.layer(la.name), la.config, n)
                    for la in self.plan.layers}
        og = problem.opgraph()
        if self.family == "tofu":
            held = self.plan.state.held
            return {t: TensorLayout.from_boxes(og.tensors[t].shape, held[t])
                    for t in self.plan.tilings}
        where = dict(zip(self.plan.names, self.plan.placement.tolist()))
        out = {}
        for op in og.ops.values():
            if op.name in where:
                out[op.output] = TensorLayout.whole_on(og.tensors[op.output].shape,
                                                       where[op.name], n)
        return out

    def summary(self) -> dict:
        """The common fields of a comparison row (``peak_bytes``: the largest device's)."""
        return {"algo": self.algo, "family": self.family, "objective_s": self.objective_s,
                "predicted_step_time_s": self.predicted_step_time_s,
                "search_time_s": self.search_time_s, "comm_bytes": self.comm_bytes,
                "peak_bytes": max(self.memory_per_device_bytes, default=0.0),
                "fits_memory": self.fits_memory}


def layerwise_result(algo, graph, devices, cost_model, tables: CostTables, choice: dict, trace,
                     info, elapsed_s: float, pins=None) -> Result:
    """A layer-wise :class:`Result`: the :class:`Plan` for ``choice`` (objective,
    breakdown, memory, bytes moved)."""
    bd = tables.breakdown(choice)
    layers = []
    for n in tables.names:
        i = choice[n]
        layers.append(LayerAssignment(n, graph.layer(n).op, tables.candidates[n][i],
                                      float(tables.t_compute[n][i]), float(tables.t_sync[n][i]),
                                      float(tables.memory[n][i]), tables.reduce_time(n, i)))
    mem = memory_per_device(graph, tables, choice, devices.n, cost_model.dtype_bytes)
    xfer_bytes = sum(float(nb[choice[e.src], choice[e.dst]])
                     for (e, _), nb in zip(tables.edges, tables.bytes_xfer))
    sync_bytes = _sync_bytes(graph, tables, choice, cost_model)
    reduce_bytes = sum(float(nb[choice[n]]) for n, nb in tables.bytes_reduce.items())
    info = dict(info)
    info.update({"compute_cost": cost_model.compute, "sync": cost_model.sync,
                 "degrees": list(getattr(cost_model, "degrees", ())),
                 "estimate": dict(tables.estimate),
                 "tables_time_s": tables.build_time_s,
                 "profile_time_s": getattr(cost_model, "profile_time_s", 0.0),
                 "layers": len(tables.names), "edges": len(tables.edges),
                 "candidates_per_layer": {
                     "max": max(len(c) for c in tables.candidates.values()),
                     "mean": float(np.mean([len(c) for c in tables.candidates.values()]))},
                 "transfer_bytes": xfer_bytes, "sync_bytes": sync_bytes,
                 "reduce_bytes": reduce_bytes,
                 "fits_memory": bool(all(mem[d] <= devices.devices[d].memory
                                         for d in range(devices.n)))})
    edges = [{"src": e.src, "dst": e.dst, "index": e.index,
              "t_xfer_s": float(m[choice[e.src], choice[e.dst]]),
              "bytes": float(nb[choice[e.src], choice[e.dst]])}
             for (e, m), nb in zip(tables.edges, tables.bytes_xfer)]
    objective = tables.objective(choice)
    # profiling a new device is reported apart (info.profile_time_s), not as search time
    search_s = max(elapsed_s - info["profile_time_s"], 0.0)
    plan = Plan(graph.model, getattr(graph, "spec", graph.model), graph.batch, algo, devices.name,
                devices.n, layers, objective, objective, search_s, bd,
                xfer_bytes + sync_bytes + reduce_bytes, mem.tolist(), dict(getattr(graph, "model_args", {})),
                [p.text() for p in (pins or [])], info, edges)
    from ..graph import graph_digest
    plan.graph_digest = graph_digest(graph)
    return Result(algo, "layerwise", plan.model, plan.batch, plan.model_args, devices.name,
                  devices.n, objective, objective, search_s, mem.tolist(), plan.comm_bytes,
                  info["fits_memory"], plan, plan.pins, list(trace), info, tables, dict(choice))


def _sync_bytes(graph, tables, choice, cost_model) -> float:
    """Bytes moved by parameter synchronisation (both directions) under ``choice``."""
    from .. import geometry as G
    total = 0.0
    seen: dict = {}         # repeated blocks under the same configuration: computed once
    for n in tables.names:
        cfg = tables.candidates[n][choice[n]]
        key = (layer_content_key(graph.layer(n)), cfg)
        if key not in seen:
            _, _, groups = G.shard_summary(graph.layer(n), cfg)
            seen[key] = sum(2.0 * (len(members) - 1) * elems * cost_model.dtype_bytes
                            for elems, members in groups if len(members) > 1)
        total += seen[key]
    return total

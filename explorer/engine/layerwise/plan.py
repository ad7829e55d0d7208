"""The :class:`Plan`: a configuration and device set per layer, with its predicted costs.

Plans round-trip through JSON (the command line's ``--json`` output and ``explorer run``'s
input), so a plan found today can be re-costed, compared or executed later.  A plan carries
``graph_digest``, a hash of the layer graph it was searched on (layer names, ops, shapes,
parameter shapes, edges): the runtime refuses a plan whose model, batch or model arguments now
give another graph (an edited plan file, a changed model file) before starting any worker.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import numpy as np

from explorer.engine.core import geometry as G
from explorer.engine.core.plandoc import VERSION, dumps, schema_of

SCHEMA = schema_of("layerwise")


@dataclass
class LayerAssignment:
    name: str
    op: str
    config: G.Config
    t_compute_s: float = 0.0
    t_sync_s: float = 0.0
    memory_bytes: float = 0.0
    t_reduce_s: float = 0.0      # reduce-scatter of a row-parallel (k) configuration
    #: memory-saving choices (:mod:`.memory`): recompute the output during backward; the
    #: ZeRO stage (0-3) sharding optimizer state, gradients, parameters over the replicas
    recompute: bool = False
    zero: int = 0
    #: the pipeline stage the layer runs in (0 without a pipeline)
    stage: int = 0

    def to_dict(self) -> dict:
        d = {"name": self.name, "op": self.op, "config": self.config.as_dict(),
             "config_label": self.config.label(), "devices": list(self.config.devices),
             "t_compute_s": self.t_compute_s, "t_sync_s": self.t_sync_s,
             "t_reduce_s": self.t_reduce_s, "memory_bytes": self.memory_bytes}
        # only where used, so that plain plans' documents are unchanged
        if self.recompute:
            d["recompute"] = True
        if self.zero:
            d["zero"] = int(self.zero)
        if self.stage:
            d["stage"] = int(self.stage)
        return d


@dataclass
class Plan:
    """A parallelization strategy S (one configuration per layer) and what it is predicted to
    cost.  ``objective_s`` is the algorithm's own objective (equation 1 for optcnn and its
    baselines), ``predicted_step_time_s`` the cost model's per-step time."""

    model: str
    spec: str
    batch: int
    algo: str
    preset: str
    n_devices: int
    layers: list
    objective_s: float
    predicted_step_time_s: float
    search_time_s: float
    breakdown: dict = field(default_factory=dict)
    comm_bytes: float = 0.0
    memory_per_device_bytes: list = field(default_factory=list)
    model_args: dict = field(default_factory=dict)
    pins: list = field(default_factory=list)
    info: dict = field(default_factory=dict)
    edges: list = field(default_factory=list)   # [{src, dst, index, t_xfer_s, bytes}]
    #: :func:`~explorer.engine.core.layergraph.graph_digest` of the graph searched (set by the search;
    #: ``None`` or ``""``: unknown - a plan built by hand or from an older version)
    graph_digest: str | None = None
    #: the step's precision (:mod:`explorer.engine.core.precision`): fp32 | tf32 | bf16
    dtype: str = "fp32"
    #: bytes per device by category (:data:`.memory.CATEGORIES` and ``transient``), and the
    #: optimizer they assume (``{"optimizer": ..., "params": [...], ...}``); empty: unknown
    memory_by_category: dict = field(default_factory=dict)
    #: pipeline stages (``stages``, ``micro_batches``, ``schedule``, ``devices_per_stage``,
    #: ``bubble_fraction``, per-stage times and memory); ``None`` without a pipeline
    pipeline: dict | None = None

    def __post_init__(self):
        from explorer.engine.core.precision import check
        self.dtype = check(self.dtype)
        if self.n_devices < 1:
            raise ValueError(f"a plan needs ≥ 1 device, got {self.n_devices}")
        for la in self.layers:
            bad = [d for d in la.config.devices if not 0 <= d < self.n_devices]
            if bad:
                raise ValueError(f"layer {la.name}: devices {bad} outside 0..{self.n_devices - 1}")

    def config_of(self, name: str) -> G.Config:
        for la in self.layers:
            if la.name == name:
                return la.config
        raise KeyError(f"plan has no layer {name!r}")

    def assignment(self) -> dict:
        return {la.name: la.config for la in self.layers}

    def objective_lines(self) -> list | None:
        """What a memory-aware plan's objective is, as lines of text (``explorer search``
        prints them in place of equation 1's sum), or ``None`` for a plan of equation 1
        alone.  A constrained plan says it is the fastest step time found under the memory
        limit, split into per-micro-batch and once-per-step time, with the Lagrangian's
        lower bound; a pipelined plan adds the pipeline's formula, its stages,
        micro-batches, schedule and bubble, and per stage its layers, devices, times and
        memory by category on its fullest device."""
        mem = self.info.get("memory") or {}
        pipe = self.pipeline
        layout = bool(mem.get("layout"))          # a baseline's fixed layout, not a search
        if not mem.get("constrained") and not pipe and not layout:
            return None
        b = self.breakdown
        limit = mem.get("limit_bytes")
        under = (f"under {limit / 2**30:.2f} GiB per device" if limit else "under the "
                 "devices' memory")
        what = "pipelined step time" if pipe else "step time"
        if layout:
            out = [f"objective: {what} of the {self.algo} layout, memory checked {under}: "
                   f"{self.objective_s * 1e3:.3f} ms"]
        else:
            out = [f"objective: fastest {what} found {under} (memory-constrained search, "
                   f"{self.algo}): {self.objective_s * 1e3:.3f} ms"]
        if pipe:
            S, M = pipe["stages"], pipe["micro_batches"]
            out.append(f"  = Σ stage times + ({M} − 1) × slowest stage + slowest once-per-step "
                       f"time: (M + S − 1)·t for balanced stages")
        else:
            out.append(f"  = per micro-batch {b.get('per_microbatch_s', 0.0) * 1e3:.3f} "
                       f"(compute, transfers, recomputation, ZeRO-2/3 collectives) + once per "
                       f"step {b.get('once_per_step_s', 0.0) * 1e3:.3f} ms (synchronisation, "
                       f"ZeRO-1 collectives, update)")
        lb = mem.get("lower_bound_s")
        if lb is not None:
            gap = mem.get("gap")
            out.append(f"  lower bound {lb * 1e3:.3f} ms (Lagrangian, {mem.get('lambdas', 0)} "
                       f"multipliers)" + (f"; gap {gap * 100:.1f} %" if gap is not None else ""))
        elif mem.get("constrained") is False and not layout:
            out.append("  equation 1's optimum: it fits, so no memory saving was needed")
        if pipe:
            out.append(f"pipeline: {S} stages × {pipe['devices_per_stage']} devices, {M} "
                       f"micro-batches of {pipe['micro_batch']} (schedule {pipe['schedule']}), "
                       f"bubble {pipe['bubble_fraction'] * 100:.1f} % = (S − 1)/(M + S − 1)")
            cats = self.memory_by_category or {}
            G_ = pipe["devices_per_stage"]
            kinds = [k for k in ("params", "grads", "optimizer", "activations", "transient")
                     if k in cats]
            for s, (first, last, count) in enumerate(pipe.get("stage_layers", [])):
                devs = range(s * G_, (s + 1) * G_)
                tot = [sum(cats[k][d] for k in kinds) for d in devs]
                d = devs[max(range(len(tot)), key=tot.__getitem__)] if tot else s * G_
                t_mb = pipe["stage_time_per_microbatch_s"][s]
                t_once = pipe["stage_time_once_s"][s]
                bnd = pipe.get("stage_boundary_s", [0.0] * S)[s]
                flight = pipe.get("in_flight", [M] * S)[s]
                by = ", ".join(f"{k} {cats[k][d] / 2**30:.2f}" for k in kinds)
                out.append(f"  stage {s}: {count} layers {first} … {last} on devices "
                           f"{s * G_}-{(s + 1) * G_ - 1}; {t_mb * 1e3:.3f} ms per micro-batch"
                           + (f" (boundary {bnd * 1e3:.3f})" if bnd else "")
                           + f", {t_once * 1e3:.3f} ms once per step; {flight:g} micro-batches "
                           f"in flight; memory on device {d} (GiB): {by}")
        return out

    #: a layer-level plan: its document needs no operator graph
    operator_level = False

    def document_fields(self, capture) -> dict:
        """Fields a sealed document adds to :meth:`to_dict`: none (the graph digest is in it)."""
        return {}

    def layouts(self, problem, n: int) -> dict:
        """Each layer's output under its configuration, as a
        :class:`~explorer.engine.core.geometry.TensorLayout` keyed by layer name."""
        g = problem.layer_graph()
        return {la.name: G.TensorLayout.from_config(g.layer(la.name), la.config, n)
                for la in self.layers}

    def to_dict(self) -> dict:
        return {
            "schema": SCHEMA, "version": VERSION, "model": self.model, "spec": self.spec, "batch": self.batch,
            "model_args": self.model_args, "algo": self.algo, "preset": self.preset,
            "devices": self.n_devices, "objective_s": self.objective_s,
            "predicted_step_time_s": self.predicted_step_time_s,
            "search_time_s": self.search_time_s, "breakdown": self.breakdown,
            "comm_bytes": self.comm_bytes,
            "memory_per_device_bytes": list(self.memory_per_device_bytes),
            "pins": list(self.pins), "info": self.info,
            "layers": [la.to_dict() for la in self.layers],
            "edges": list(self.edges),
            "graph_digest": self.digest(), "dtype": self.dtype,
            **({"memory_by_category": self.memory_by_category}
               if self.memory_by_category else {}),
            **({"pipeline": self.pipeline} if self.pipeline else {}),
        }

    def unsupported(self) -> str | None:
        """Why the runtime cannot execute this plan (one line), or ``None``
        (:func:`unsupported`)."""
        return unsupported(self.to_dict())

    def digest(self) -> str:
        """The digest of the graph the plan was searched on (``""``: unknown, e.g. a plan
        built by hand; the searches set it from the graph they used)."""
        return self.graph_digest or ""

    def to_json(self, indent=2) -> str:
        return dumps(self.to_dict(), indent=indent)

    @classmethod
    def from_dict(cls, d: dict) -> "Plan":
        from explorer.engine.core.plandoc import kind_of
        if kind_of(d) != "layerwise":
            raise ValueError(f"not a plan file: schema {d.get('schema')!r}, expected "
                             f"{SCHEMA!r} (a layer-wise plan)")
        try:
            layers = []
            for la in d["layers"]:
                cfg = G.Config(tuple(la["config"].items()), tuple(la["devices"]))
                layers.append(LayerAssignment(la["name"], la["op"], cfg, la.get("t_compute_s", 0.0),
                                              la.get("t_sync_s", 0.0), la.get("memory_bytes", 0.0),
                                              la.get("t_reduce_s", 0.0),
                                              bool(la.get("recompute", False)),
                                              int(la.get("zero", 0)), int(la.get("stage", 0))))
            return cls(d["model"], d.get("spec", d["model"]), int(d["batch"]), d["algo"],
                       d["preset"], int(d["devices"]), layers, float(d["objective_s"]),
                       float(d["predicted_step_time_s"]), float(d["search_time_s"]),
                       d.get("breakdown", {}), float(d.get("comm_bytes", 0.0)),
                       list(d.get("memory_per_device_bytes", [])), d.get("model_args", {}),
                       list(d.get("pins", [])), d.get("info", {}), list(d.get("edges", [])),
                       str(d.get("graph_digest") or ""), d.get("dtype") or "fp32",
                       dict(d.get("memory_by_category") or {}), d.get("pipeline") or None)
        except (KeyError, TypeError) as exc:
            raise ValueError(f"malformed plan: missing or bad field {exc}") from exc

    @classmethod
    def from_json(cls, text: str) -> "Plan":
        return cls.from_dict(json.loads(text))


def unsupported(doc: dict) -> str | None:
    """One line saying why the runtime cannot execute a layer-wise plan document, or
    ``None``.  Pipeline stages run (:mod:`explorer.engine.runtime.executor`, issue 28) when
    the document's pipeline is consistent: ``S`` stages of ``G`` devices covering the plan's
    devices (so no more stages than workers), ``M`` micro-batches dividing the batch, a known
    schedule, and each layer's devices inside its stage's group.  Recomputation and ZeRO
    sharding run too."""
    pipe = doc.get("pipeline") or {}
    if not pipe:
        return None
    try:
        S = int(pipe.get("stages", 1))
        M = int(pipe.get("micro_batches", 1))
        N = int(doc.get("devices", 0))
        B = int(doc.get("batch", 0))
        G_ = int(pipe.get("devices_per_stage", N // max(S, 1) if S > 0 else 0))
    except (TypeError, ValueError) as exc:
        return f"the plan's pipeline is malformed: {exc}"
    if S < 1 or M < 1:
        return f"the plan's pipeline needs ≥ 1 stage and ≥ 1 micro-batch, got {S} x {M}"
    if S > N:
        return f"the plan has {S} pipeline stages but {N} devices: more stages than workers"
    if G_ < 1 or S * G_ != N:
        return (f"the plan's {S} pipeline stages x {G_} devices per stage do not cover its {N} "
                f"devices")
    if B % M:
        return f"{M} micro-batches do not divide the batch {B}"
    if int(pipe.get("micro_batch", B // M)) != B // M:
        return (f"the plan's micro-batch {pipe.get('micro_batch')} is not the batch {B} over "
                f"{M} micro-batches")
    if pipe.get("schedule", "gpipe") not in PIPELINE_SCHEDULES:
        return (f"pipeline schedule {pipe.get('schedule')!r}: the runtime executes "
                f"{' or '.join(PIPELINE_SCHEDULES)}")
    for la in doc.get("layers") or []:
        s = int(la.get("stage", 0) or 0)
        devs = list(la.get("devices") or [])
        if not 0 <= s < S:
            return f"layer {la.get('name')} is in stage {s}, the plan has {S} stages"
        off = [d for d in devs if not s * G_ <= int(d) < (s + 1) * G_]
        if off:
            return (f"layer {la.get('name')} of stage {s} runs on devices {off} outside its "
                    f"stage's group {s * G_}-{(s + 1) * G_ - 1}")
    return None


#: the pipeline schedules the runtime executes (both in GPipe's order, the same bubble)
PIPELINE_SCHEDULES = ("gpipe", "1f1b")


def memory_per_device(graph, tables, choice, n_devices: int, dtype_bytes: int = 4,
                      param_bytes: int = 4, copy_bytes: int = 0) -> np.ndarray:
    """Bytes each device holds during a step: weights, gradients and momentum of its shards
    (``param_bytes`` each, plus ``copy_bytes`` for bf16's working copy), its activations and
    their gradients, and the input regions it fetches (a row-parallel device: also its
    partial tile and the gathered gradient of it), at ``dtype_bytes`` an element, as the
    cost model counts."""
    mem = np.zeros(n_devices)
    seen: dict = {}         # repeated blocks under the same configuration: computed once
    for n in tables.names:
        layer = graph.layer(n)
        cfg = tables.candidates[n][choice[n]]
        key = (layer_content_key(layer), cfg)
        per = seen.get(key)
        if per is None:
            boxes, pel, _ = G.shard_summary(layer, cfg)
            tiles, red = G.compute_boxes(layer, cfg)
            vol = G.volume(boxes).astype(float)
            in_el = sum(G.volume(G.input_regions(layer, j, tiles, red)).astype(float)
                        for j in range(len(layer.in_shapes))) if layer.in_shapes else 0.0
            partial = 0.0 if red is None else G.volume(tiles).astype(float)
            per = seen[key] = ((3 * param_bytes + copy_bytes) * pel +
                               (2 * vol + in_el + 2 * partial) * dtype_bytes)
        np.add.at(mem, np.asarray(cfg.devices), per)
    return mem


def param_role(name: str) -> str:
    """What :func:`~explorer.engine.core.geometry.regions.param_shards` reads of a parameter's
    name: ``weight`` exactly, or its prefix (``weight…``, ``bias…``, ``operand…``).  A folded
    norm's weight is keyed by its qualified name (``layers.3.input_layernorm.weight``), so the
    role, not the name, is what repeated blocks share."""
    if name == "weight":
        return "weight"
    for prefix in ("weight", "bias", "operand"):
        if name.startswith(prefix):
            return prefix + "*"
    return "-"


def layer_content_key(layer) -> tuple:
    """What a layer's boxes, shards and regions under a configuration depend on (layers of
    repeated blocks share it: parameters by role and shape, not by their block's name)."""
    return (layer.op, layer.out_shape, layer.axes, tuple(map(tuple, layer.in_shapes)),
            repr(sorted(layer.attrs.items())), params_key(layer))


def params_key(layer) -> tuple:
    """A layer's parameters as the geometry and the costs see them: role and shape each, in
    order (:func:`param_role`)."""
    return tuple((param_role(k), tuple(v)) for k, v in layer.params.items())

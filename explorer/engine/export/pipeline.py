"""A pipelined layer-wise plan as ``torch.distributed.pipelining`` stages and schedule.

The plan's ``pipeline`` entry (``stages``, ``micro_batches``, ``schedule``,
``devices_per_stage``) and each layer's ``stage`` become: the model traced by ``torch.fx`` and
cut into one ``GraphModule`` per stage at the plan's stage boundaries
(:func:`~explorer.engine.export.runner.split_stages`: a cut may fall anywhere in the graph,
not only where a module begins), each run as a ``PipelineStage`` on the ranks of its group,
under ``ScheduleGPipe`` or ``Schedule1F1B`` over the plan's micro-batches.  The ranks form a
(stages x dp x tp) mesh: stage ``s`` on ranks ``s*G .. s*G+G-1``, as the search puts it.

Inside a stage, the group of ``G`` devices is ``dp`` data-parallel replicas (each its
share of every micro-batch, gradients averaged) of ``tp`` ranks, on which a linear or
embedding split on ``c``/``k`` by ``tp`` takes ``ColwiseParallel`` / ``RowwiseParallel``
(whole tensors between modules; the rest is replicated on the tp ranks); the ``(dp, tp)``
computing the most layers as planned is chosen.  A recomputed layer computes under
``torch.utils.checkpoint`` in its stage module, a ZeRO-2/3 layer's module under
``fully_shard`` over its stage's dp replicas.  Any other split inside a stage, a layer on
part of its group, ZeRO-1 and ZeRO without replicas are listed.

Where the pipeline itself cannot be built - ``torch.fx`` cannot trace the model into nodes
named as its layers, a stage boundary carries a value that is not a tensor, the batch has no
sample dimension to cut into micro-batches - :func:`pipe_plan` says why and the caller exports
the layers without the pipeline, saying so (``PIPELINE_NOT_AS_PLANNED``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from explorer.engine.export.layouts import Deviation, fx_nodes, module_kinds


@dataclass
class PipePlan:
    """What a pipelined program runs: ``stage_of`` (fx node -> stage) of every layer, the
    layers it ``recompute``s, the schedule it runs (``gpipe`` / ``1f1b``), ``group`` ranks
    per stage and whether they split each micro-batch (``split``) or each compute all of it,
    the layers' ``deviations`` and the pipeline-level ``notes`` ``(plan, exported, reason)``."""

    stages: int
    micro_batches: int
    schedule: str
    group: int
    split: bool
    batch_dim: int
    stage_of: dict = field(default_factory=dict)
    deviations: list = field(default_factory=list)
    notes: list = field(default_factory=list)
    layers: int = 0
    #: the layers computed under torch.utils.checkpoint (the plan's recomputation)
    recompute: list = field(default_factory=list)
    #: each stage's group as dp replicas x tp ranks, and module path -> "colwise" /
    #: "rowwise" (ColwiseParallel / RowwiseParallel on the stage's tp ranks)
    dp: int = 1
    tp: int = 1
    styles: dict = field(default_factory=dict)
    #: module path -> ZeRO stage (2, 3) of the modules fully_shard shards over the dp replicas
    fsdp: dict = field(default_factory=dict)

    def program_dict(self) -> dict:
        """The ``PIPELINE`` dict the program's body reads."""
        return {"stages": self.stages, "micro_batches": self.micro_batches,
                "schedule": self.schedule, "group": self.group, "dp": self.dp, "tp": self.tp,
                "split": self.split, "recompute": list(self.recompute),
                "styles": dict(sorted(self.styles.items())),
                "fsdp": dict(sorted(self.fsdp.items())), "stage_of": dict(self.stage_of)}


def _label(deg: dict) -> str:
    return " ".join(f"{k}{v}" for k, v in deg.items()) or "1"


def describe(pipe: dict) -> str:
    """The plan's pipeline in words: "4 stages x 1 device, 8 micro-batches, 1f1b"."""
    g = int(pipe.get("devices_per_stage") or 1)
    return (f"{pipe['stages']} stages x {g} device{'s' if g > 1 else ''}, "
            f"{pipe['micro_batches']} micro-batches, {pipe['schedule']}")


def _crossings_ok(model, x, stage_of: dict, S: int) -> str:
    """Why the traced model cannot be cut at the plan's stages ("" when it can): every value
    a stage boundary carries must be a tensor (``PipelineStage`` sends tensors)."""
    import torch.fx
    from torch.fx.passes.shape_prop import ShapeProp, TensorMetadata

    from explorer.engine.core import capture
    from explorer.engine.export.runner import split_stages
    try:
        with capture.TRACE_LOCK:
            gm = torch.fx.symbolic_trace(model)
        ShapeProp(gm).propagate(x)
        _mods, received = split_stages(gm, stage_of, S)
    except Exception as exc:                       # noqa: BLE001 - any trace/cut error
        return f"the traced model cannot be cut at the plan's stages ({exc})"
    nodes = {nd.name: nd for nd in gm.graph.nodes}
    for s, names in enumerate(received):
        bad = [n for n in names
               if not isinstance(nodes[n].meta.get("tensor_meta"), TensorMetadata)]
        if bad:
            return (f"stage {s} would receive {', '.join(bad[:3])}, which "
                    f"{'is' if len(bad) == 1 else 'are'} not a tensor, and a PipelineStage "
                    f"sends tensors only")
    return ""


def _shared_modules(model) -> set:
    """Paths of the modules holding a parameter another module holds too (tied weights):
    a parallel style would distribute the shared tensor twice."""
    owners: dict = {}
    for path, mod in model.named_modules():
        for p in mod.parameters(recurse=False):
            owners.setdefault(id(p), []).append(path)
    return {m for paths in owners.values() if len(paths) > 1 for m in paths}


def _zero_form(pp: PipePlan, la, module, zero: int, planned: bool, owned: set,
               shared: set) -> str:
    """Why a layer's ZeRO stage is not applied ("" when it is: ``fully_shard`` of its
    module over its stage's dp replicas, ``pp.fsdp``)."""
    if not zero or not la.params:
        return ""                     # nothing to shard: as planned
    if zero == 1:
        return ("ZeRO-1 shards only the optimizer's state, which fully_shard has no mode for, "
                "and the program's SGD keeps none")
    if pp.dp == 1:
        return f"ZeRO-{zero}: its stage has no data-parallel replicas to shard over here"
    if module not in owned or module in shared:
        return (f"ZeRO-{zero}: its parameters are not one module's own, and fully_shard "
                f"shards a module's parameters")
    if module in pp.styles:
        return (f"ZeRO-{zero}: it is also tensor parallel, and fully_shard over the replicas "
                f"of a sharded parameter is not expressed here")
    if not planned:
        return f"ZeRO-{zero}: its configuration is not computed as planned"
    pp.fsdp[module] = 3 if zero >= 3 else 2
    return ""


def _owned(layers, model) -> set:
    """Module paths that one layer calls, and whose parameters that layer reads only."""
    modules = dict(model.named_modules())
    calls: dict = {}
    for la in layers:
        if la.op != "input" and la.module:
            calls[la.module] = calls.get(la.module, 0) + 1
    return {la.module for la in layers if la.module in modules and calls.get(la.module) == 1
            and la.params and set(la.params) <= {k for k, _ in
                                                 modules[la.module].named_parameters()}}


def _in_stage(pp: PipePlan, layers, configs: dict, kinds: dict, shared: set, b: int,
              savings: dict, owned: set) -> None:
    """Each layer's form inside its stage on ``pp``'s (dp, tp) group: the samples split over
    the dp replicas (when the micro-batch of ``b`` splits), replicated over the tp ranks,
    and a linear or embedding split on ``c``/``k`` by tp as ``ColwiseParallel`` /
    ``RowwiseParallel`` on the stage's tp ranks; what differs from the plan is listed."""
    G, dp, tp = pp.group, pp.dp, pp.tp
    pp.split = dp > 1 and b % dp == 0
    for la in layers:
        want, devices = configs[la.name]
        s = pp.stage_of[la.name]
        group = list(range(s * G, (s + 1) * G))
        gave = {"n": dp} if pp.split and "n" in la.axes else {}
        module, letters, why = kinds.get(la.name, (None, {}, ""))
        if tp > 1 and module and module not in shared:
            for letter, style in letters.items():
                if style in ("colwise", "rowwise") and want == dict(gave, **{letter: tp}):
                    gave = dict(gave, **{letter: tp})
                    pp.styles[module] = style
                    break
        rc, zero = savings.get(la.name, (False, 0))
        mine = sorted(int(d) for d in devices)
        planned = _label(want) + f" on {mine}"
        if not gave:
            exported = f"whole on each of {group}"
        else:
            exported = f"{_label(gave)} on {group}" + (
                f", replicated on its {tp} tp ranks" if tp > 1 and module not in pp.styles
                else "")
        reasons = []
        if mine != group:
            reasons.append(f"the program runs stage {s} on every device of its group {group}")
        if mine == group and want != gave:
            other = sorted(set(want) - {"n"})
            if not other:
                reasons.append(f"the samples are split over the stage's {dp} data-parallel "
                               f"replica{'s' if dp > 1 else ''}"
                               + ("" if pp.split or dp == 1 else ", each computing the whole "
                                  "micro-batch") + (f", replicated on {tp} tp ranks"
                                                    if tp > 1 else ""))
            elif tp == 1:
                reasons.append(f"the stage groups run as {dp} data-parallel replicas (the form "
                               f"that computes the most layers as planned), with no "
                               f"tensor-parallel ranks to split {'/'.join(other)} over")
            elif module in shared:
                reasons.append(f"its module {module} shares its parameters with another "
                               f"module, which a parallel style would distribute twice")
            else:
                reasons.append(why or f"inside a pipeline stage the program applies "
                                      f"ColwiseParallel/RowwiseParallel on the tp ranks only "
                                      f"(split {'/'.join(other)} by {tp}), not "
                                      f"{_label(want)}")
        why_zero = _zero_form(pp, la, module, int(zero), not reasons, owned, shared)
        if why_zero:
            reasons.append(why_zero)
        if reasons:
            pp.deviations.append(Deviation(
                la.name, planned + (" recomputed" if rc else "") + (f" ZeRO-{zero}" if zero
                                                                    else ""),
                exported + (", recomputed" if rc else ""), "; ".join(reasons)))
        if rc:
            pp.recompute.append(la.name)


def pipe_plan(graph, configs: dict, stages: dict, pipe: dict, n: int, model, x,
              savings: dict | None = None) -> tuple[PipePlan | None, str]:
    """``(plan, "")`` for a pipelined plan the program can run with
    ``torch.distributed.pipelining``, or ``(None, reason)`` when it cannot (module
    docstring).  ``configs``: layer -> ({letter: degree > 1}, devices); ``stages``: layer ->
    its stage; ``pipe``: the plan's ``pipeline`` entry; ``model``/``x`` on the meta device."""
    S, M = int(pipe["stages"]), int(pipe["micro_batches"])
    G = n // S
    layers = graph.layers()
    nodes = fx_nodes(model)
    if nodes is None or any(la.name not in nodes for la in layers):
        return None, ("torch.fx cannot trace the model into nodes named as its layers, and "
                      "the program cuts the stages from that trace")
    inputs = [la for la in layers if la.op == "input"]
    if len(inputs) != 1 or "n" not in inputs[0].axes:
        return None, ("the model does not have one input with a sample dimension to cut into "
                      "micro-batches")
    batch_dim = inputs[0].axis_of("n")
    B = inputs[0].size("n")
    if S * G != n or B % M:
        return None, f"{S} stages of {G} devices and {M} micro-batches do not fit {n} devices " \
                     f"and batch {B}"
    whole = [o for o in (graph.outputs or []) if "n" not in graph.layer(o).axes]
    if whole:
        return None, (f"output {whole[0]} has no sample dimension: each micro-batch's loss "
                      f"would not be its share of the batch's")
    stage_of = {la.name: int(stages.get(la.name, 0)) for la in layers}
    why = _crossings_ok(model, x, stage_of, S)
    if why:
        return None, why
    b = B // M
    schedule = str(pipe.get("schedule") or "gpipe")
    if schedule not in ("gpipe", "1f1b"):
        return None, f"schedule {schedule!r} is neither gpipe nor 1f1b"
    kinds = module_kinds(graph, model) if G > 1 else {}
    owned = _owned(layers, model)
    shared = _shared_modules(model) if G > 1 else set()
    best = None
    for tp in (t for t in range(1, G + 1) if G % t == 0):
        pp = PipePlan(S, M, schedule, G, False, batch_dim, stage_of, layers=len(layers),
                      dp=G // tp, tp=tp)
        _in_stage(pp, layers, configs, kinds, shared, b, savings or {}, owned)
        if best is None or len(pp.deviations) < len(best.deviations):
            best = pp
    pp = best
    if schedule == "1f1b" and M < S:
        pp.schedule = "gpipe"
        pp.notes.append((f"schedule 1f1b, {M} micro-batches on {S} stages", "ScheduleGPipe",
                         "torch's Schedule1F1B needs at least as many micro-batches as stages; "
                         "with fewer, 1F1B's warm-up runs every forward first, GPipe's order"))
    if pp.dp > 1 and not pp.split and any("n" in configs[la.name][0] for la in layers):
        pp.notes.append((f"micro-batches of {b} split over the {pp.dp} replicas of each stage",
                         f"each replica computes every micro-batch whole",
                         f"a micro-batch of {b} samples does not split into {pp.dp} equal "
                         f"shares"))
    return pp, ""

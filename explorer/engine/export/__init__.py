"""Export a layer-wise plan as a PyTorch program that applies it with PyTorch's own parallel APIs.

:func:`export_torch` turns a sealed layer-wise plan document into the text of one
self-contained Python file (standard library and torch only; ``transformers`` for ``hf:``
models) that users run with ``torchrun --standalone --nproc_per_node N FILE.py --steps K
[--check]``.  The file builds the model (a built-in example's source is inlined, a
``file.py:function`` is imported from its absolute path) and applies the plan layer by layer:
each layer's configuration as DTensor placements on one prime-factor mesh, a layer on a
subset of the devices on a mesh of its own ranks (:mod:`explorer.engine.export.layouts`).
A model ``torch.fx`` cannot trace falls back to one ``DeviceMesh`` ("dp", "tp") with
PyTorch's parallel styles:

=====================================  ================================================
a layer's configuration (plan)          in the exported file
=====================================  ================================================
``nn.Linear`` split on ``c``            ``ColwiseParallel`` on mesh["tp"]
``nn.Linear`` split on ``k``            ``RowwiseParallel`` (a reduction split)
``nn.Embedding`` split on ``c``         ``ColwiseParallel``
norm / ``nn.Linear`` split on ``l``     ``SequenceParallel`` (sequence dim = the ``l`` axis)
the sample dimension ``n``              ``fully_shard`` (FSDP2) over mesh["dp"], the batch
                                        split over "dp"
=====================================  ================================================

A column-parallel linear whose consumers are all row-parallel linears hands them its shard
(the Megatron pairing, no communication between them); every other module output is whole
(replicated on the tp ranks).  A layer the mesh and these styles cannot compute as the plan
says - a convolution or pooling split on ``h``/``w`` (DTensor computes it without halos,
wrongly and without an error), a layer on a subset of the devices, a split no style
implements, degrees other than the mesh's - is computed in the data-parallel form PyTorch
computes correctly, and listed with its reason in a comment block at the top of the file and
on the first rank's output when it runs: never silently changed.

A plan's memory savings follow the layers (:func:`.layouts.zero_form`): a recomputed layer
runs under ``torch.utils.checkpoint``; a ZeRO-3 (ZeRO-2) layer computing on whole parameters
is put under ``fully_shard`` resharding after forward (keeping the gathered weights until the
backward pass); ZeRO-1 and the cases ``fully_shard`` cannot express are listed.

A pipelined plan (more than one stage) runs its stages, micro-batches and schedule with
``torch.distributed.pipelining`` (:mod:`explorer.engine.export.pipeline`); what it cannot
follow of the pipeline is listed in ``PIPELINE_NOT_AS_PLANNED`` and said by :func:`summary`.

The export reads the plan and the model's layer graph; it never searches.
"""

from __future__ import annotations

import importlib
import inspect
import os
import re
import sys
import textwrap
from dataclasses import dataclass, field
from types import SimpleNamespace

from explorer.errors import PlanFileError
from explorer.engine.core import plandoc
from explorer.engine.export.layouts import Deviation, module_kinds
from explorer.engine.export.runner import body as program_body

__all__ = ["TARGETS", "Deviation", "MeshPlan", "export_torch", "mesh_plan",
           "pipeline_not_as_planned", "program"]

#: what ``explorer export --to`` accepts
TARGETS = ("torch",)
LR = 0.01          # the runtime's SGD learning rate
SEED = 0           # the runtime's seed for weights and input



#: the imports of a program that applies per-layer meshes or a pipeline
_IMPORTS = ("from __future__ import annotations\n\n"
            "import argparse\nimport contextlib\nimport copy\nimport os\nimport sys\n\n"
            "import torch\nimport torch.distributed as dist\n"
            "from torch.distributed.device_mesh import DeviceMesh, init_device_mesh\n"
            "from torch.distributed.fsdp import fully_shard\n"
            "from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, "
            "distribute_tensor\n"
            "from torch.distributed.tensor.parallel import (PrepareModuleOutput, "
            "SequenceParallel,\n"
            "                                               parallelize_module)\n"
            "from torch.utils.checkpoint import checkpoint\n")


def _usage(plan, n: int) -> str:
    """The end of a program's docstring: how to run it, its precision, what --check does."""
    return (f"    torchrun --standalone --nproc_per_node {n} {_filename(plan)} --steps K "
            f"[--check]\n\n"
            f"Precision: {_dtype(plan)}.  "
            f"--check also runs the same steps on one process (float64 and float32) and exits "
            f"1 when\nthe loss or the parameter updates differ.  Standard library and torch "
            f"only"
            f"{' (and transformers)' if plan.spec.startswith('hf:') else ''}.\n"
            f'"""\n')

@dataclass
class MeshPlan:
    """What the exported program does: mesh shape, module styles, and the layers it cannot
    compute as planned.  ``styles`` maps a module path to ``(style, argument)`` with style
    ``colwise`` (argument: ``"shard"`` = hand the shard to row-parallel consumers, ``"gather"``
    = whole output), ``rowwise`` (argument: ``"shard"`` / ``"replicate"`` input) or
    ``sequence`` (argument: the sequence dimension)."""

    dp: int
    tp: int
    styles: dict = field(default_factory=dict)
    deviations: list = field(default_factory=list)
    batch_dim: int = 0
    #: (plan, exported, reason) where the plan's pipeline is not followed
    pipeline_notes: list = field(default_factory=list)


def _label(deg: dict) -> str:
    return " ".join(f"{k}{v}" for k, v in deg.items()) or "1"


def _reason(layer, want: dict, devices: tuple, n: int, dp: int, tp: int, why: str) -> str:
    spatial = [k for k in ("h", "w") if want.get(k, 1) > 1]
    if sorted(devices) != list(range(n)):
        return (f"it runs on devices {list(devices)} of {n}: SPMD APIs run every module on "
                f"every rank, so subsets and mixed device blocks cannot be expressed")
    if spatial and layer.op != "input":
        return (f"a {layer.op} split on {'/'.join(spatial)}: DTensor computes it without the "
                f"halo its neighbours hold - wrongly and without an error")
    if why:
        return why
    return (f"its degrees ({_label(want)}) are not the mesh's (dp={dp}, tp={tp}); one mesh "
            f"serves the whole model")


def _mesh_plan_for(graph, configs: dict, kinds: dict, n: int, dp: int, tp: int) -> MeshPlan:
    mp = MeshPlan(dp, tp)
    base = {"n": dp} if dp > 1 else {}
    for la in graph.layers():
        want, devices = configs[la.name]
        module, letters, why = kinds[la.name]
        eff = dict(base)
        if tp > 1 and sorted(devices) == list(range(n)):
            for letter, style in letters.items():
                cand = dict(base, **{letter: tp})
                if want == cand:
                    eff = cand
                    arg = la.axis_of("l") if style == "sequence" else None
                    mp.styles[module] = (style, arg)
                    break
        if want != eff or sorted(devices) != list(range(n)):
            exported = ("whole on every rank" if not eff else _label(eff) + (
                f", whole on the {tp} tp ranks" if tp > 1 and len(eff) == 1 else ""))
            mp.deviations.append(Deviation(la.name, _label(want) + (
                f" on {list(devices)}" if sorted(devices) != list(range(n)) else ""),
                exported, _reason(la, want, devices, n, dp, tp, why)))
    _pair(graph, kinds, mp)
    return mp


def _pair(graph, kinds: dict, mp: MeshPlan) -> None:
    """Decide which column-parallel outputs stay sharded: those whose every consumer is a
    row-parallel linear reading them directly (no view on the edge), and whose row-parallel
    consumers read only such shards.  Everything else is gathered / read whole."""
    style = {la.name: mp.styles.get(kinds[la.name][0], (None,))[0] if kinds[la.name][1] else None
             for la in graph.layers()}
    outputs = set(graph.outputs or [])
    col = {nm for nm, s in style.items() if s == "colwise"}
    row = {nm for nm, s in style.items() if s == "rowwise"}
    shard = {c for c in col if c not in outputs and graph.out_edges(c)
             and all(e.dst in row and not e.transforms for e in graph.out_edges(c))}
    while True:
        fed = {r for r in row if graph.in_edges(r)
               and all(e.src in shard and not e.transforms for e in graph.in_edges(r))}
        keep = {c for c in shard if all(e.dst in fed for e in graph.out_edges(c))}
        if keep == shard:
            break
        shard = keep
    for nm in col:
        mp.styles[kinds[nm][0]] = ("colwise", "shard" if nm in shard else "gather")
    for nm in row:
        mp.styles[kinds[nm][0]] = ("rowwise", "shard" if nm in fed else "replicate")


def mesh_plan(graph, configs: dict, n: int, model) -> MeshPlan:
    """The (dp, tp) mesh and styles that compute the most layers as planned (ties: the smaller
    tp).  ``configs``: layer -> ({letter: degree > 1}, devices).  ``model``: the module (on the
    meta device is enough) whose submodules the layers name."""
    kinds = module_kinds(graph, model)
    layers = graph.layers()
    inputs = [la for la in layers if la.op == "input"]
    batch_ok = all("n" in la.axes for la in layers) and len(inputs) == 1
    best = None
    for tp in (t for t in range(1, n + 1) if n % t == 0):
        dp = n // tp
        if dp > 1 and not (batch_ok and inputs[0].size("n") % dp == 0):
            continue
        mp = _mesh_plan_for(graph, configs, kinds, n, dp, tp)
        if best is None or len(mp.deviations) < len(best.deviations):
            best = mp
    best.batch_dim = inputs[0].axis_of("n") if inputs and "n" in inputs[0].axes else 0
    return best


# --------------------------------------------------------------------------------------------
# the document
# --------------------------------------------------------------------------------------------


def _refuse(kind: str) -> PlanFileError:
    what = {"tofu": "a Tofu plan (operator partitioning)",
            "placement": "a device placement"}.get(kind, f"a {kind} plan")
    return PlanFileError(f"this is {what}: `explorer export --to torch` exports layer-wise plans "
                         f"(optcnn, data, model, owt, exhaustive and the other layer-wise "
                         f"methods), whose layers map onto PyTorch's parallel styles")


def export_torch(doc: dict, verify: bool = True) -> tuple[str, str]:
    """``(file name, Python source)`` of the program applying the layer-wise plan ``doc``.

    Raises :class:`~explorer.errors.PlanFileError` for a document that is not a plan, not
    layer-wise, or that does not fit its model (as ``explorer run`` would refuse it)."""
    kind = plandoc.open_document(doc, verify=verify)
    if kind != "layerwise":
        raise _refuse(kind)
    from explorer.engine.runtime.launcher import validate
    plan, _warns = validate(doc, check_local=False)
    configs = {la.name: ({k: int(v) for k, v in la.config.degrees if int(v) > 1},
                         tuple(la.config.devices)) for la in plan.layers}
    savings = {la.name: (bool(la.recompute), int(la.zero)) for la in plan.layers
               if la.recompute or la.zero}
    pipe = getattr(plan, "pipeline", None) or None
    stages = {la.name: int(la.stage) for la in plan.layers} if pipe else None
    return program(plan.spec, plan.batch, plan.model_args, plan.n_devices, configs,
                   model=plan.model, algo=plan.algo, dtype=plan.dtype, savings=savings,
                   stages=stages, pipeline=pipe)


def _read_list(text: str, name: str) -> list:
    import ast
    for line in text.splitlines():
        if line.startswith(f"{name} = "):
            return [tuple(x) for x in ast.literal_eval(line[len(name) + 3:])]
    return []


def not_as_planned(text: str) -> list:
    """``[(layer, plan, exported, reason)]`` of the layers an exported program computes in
    another form than its plan (read back from the program's ``NOT_AS_PLANNED``), so that
    whoever exports can say so."""
    return _read_list(text, "NOT_AS_PLANNED")


def pipeline_not_as_planned(text: str) -> list:
    """``[(plan, exported, reason)]`` of what an exported program does otherwise than the
    plan's pipeline (its stages, micro-batches or schedule), from ``PIPELINE_NOT_AS_PLANNED``."""
    return _read_list(text, "PIPELINE_NOT_AS_PLANNED")


def summary(text: str, layers: int) -> str:
    """One line on how much of a plan of ``layers`` layers the program ``text`` follows:
    "N of M layers as planned", and for a pipelined plan whether its pipeline is (before
    any ";", the part ``explorer export`` prints)."""
    off, pipe = not_as_planned(text), pipeline_not_as_planned(text)
    head = f"{layers - len(off)} of {layers} layers as planned"
    runs = re.search(r"^# \d+ of \d+ layers as planned, in the plan's pipeline \((.*)\)\.$",
                     text, re.M)
    if pipe:
        head += ", the plan's pipeline not: " + "; ".join(f"{p[0]} -> {p[1]}" for p in pipe)
    elif runs:
        head += f", in the plan's pipeline ({runs.group(1)})"
    if not off:
        return head
    return (f"{head}; {len(off)} not "
            f"({', '.join(d[0] for d in off[:3])}{' …' if len(off) > 3 else ''}): the file's "
            f"header lists each with the form it is computed in instead and why")


def deviation_lines(text: str) -> list:
    """One line per layer the program ``text`` computes in another form than its plan, and
    one per departure from the plan's pipeline."""
    return ([f"  the pipeline: plan {planned} -> {exported}: {reason}"
             for planned, exported, reason in pipeline_not_as_planned(text)]
            + [f"  {layer}: plan {planned} -> {exported}: {reason}"
               for layer, planned, exported, reason in not_as_planned(text)])


def program(spec: str, batch: int, model_args: dict, n: int, configs: dict, *,
            model: str | None = None, algo: str = "custom",
            dtype: str = "fp32", layouts: bool = True,
            savings: dict | None = None, stages: dict | None = None,
            pipeline: dict | None = None) -> tuple[str, str]:
    """``(file name, text)`` of the program for per-layer ``configs`` (layer -> ({letter:
    degree > 1}, devices)) of model ``spec`` on ``n`` processes, computing in precision
    ``dtype`` (bf16: every forward pass under autocast, float32 master weights);
    :func:`export_torch` after its checks (tests call it with configurations no search
    makes yet).  ``savings``: layer -> (recompute, ZeRO stage) of the layers that save
    memory: ``torch.utils.checkpoint`` and ``fully_shard`` in the per-layer layouts.
    ``pipeline``: the plan's ``pipeline`` entry, ``stages``: layer -> its stage; with more
    than one stage the program runs the plan's pipeline (:mod:`.pipeline`), or says why not."""
    from explorer.engine.core.capture_cache import layer_graph
    from explorer.engine.core.importer import load_model
    graph = layer_graph(spec, batch, model_args)       # the search's capture, when cached
    module, x = load_model(spec, batch, model_args, meta=True)
    info = SimpleNamespace(spec=spec, model=model or spec, batch=int(batch), algo=algo,
                           model_args=dict(model_args or {}), n_devices=int(n),
                           dtype=dtype)
    notes = []
    if pipeline and int(pipeline.get("stages") or 1) > 1:
        from explorer.engine.export.pipeline import describe, pipe_plan
        pp, why = pipe_plan(graph, configs, stages or {}, pipeline, n, module, x, savings)
        if pp is not None:
            return _filename(info), _render_pipeline(info, pp, pipeline, module, x)
        notes.append((describe(pipeline), "one sequential step on the whole batch, each "
                      "layer on its stage's devices, no micro-batches and no schedule", why))
    from explorer.engine.export.layouts import plan_layouts
    mp = plan_layouts(graph, configs, n, module, savings) if layouts else None
    if mp is None:                     # torch.fx cannot trace it: one (dp, tp) mesh
        mp = mesh_plan(graph, configs, n, module)
        _savings_on_mesh(mp, configs, savings or {})
    mp.pipeline_notes = notes
    return _filename(info), render(info, mp, module, x)


def _savings_on_mesh(mp: MeshPlan, configs: dict, savings: dict) -> None:
    """The (dp, tp) program of a model ``torch.fx`` cannot trace applies no per-layer
    saving: a recomputed layer, and a ZeRO layer other than what its ``fully_shard`` of the
    whole model over dp does (ZeRO-3 of a layer split on the samples only), are listed."""
    listed = {d.layer for d in mp.deviations}
    for name, (rc, zero) in savings.items():
        want = configs[name][0]
        why = []
        if rc:
            why.append("recomputation wraps one traced layer in torch.utils.checkpoint, and "
                       "torch.fx cannot trace this model")
        if zero and not (zero >= 3 and mp.dp > 1 and set(want) == {"n"}):
            why.append(f"ZeRO-{zero}: the program's only sharding is fully_shard of the whole "
                       f"model over dp (ZeRO-3 of the sample-split layers)")
        if why and name not in listed:
            lbl = _label(want)
            mp.deviations.append(Deviation(
                name, lbl + (" recomputed" if rc else "") + (f" ZeRO-{zero}" if zero else ""),
                lbl + " as the (dp, tp) mesh computes it", "; ".join(why)))


def _filename(plan) -> str:
    model = re.sub(r"[^A-Za-z0-9_]+", "_", str(plan.model)).strip("_") or "model"
    algo = re.sub(r"[^A-Za-z0-9_]+", "_", str(plan.algo))
    return f"{model}_{algo}_{plan.n_devices}dev.py"


# --------------------------------------------------------------------------------------------
# the program text
# --------------------------------------------------------------------------------------------


def _module_sources(mod, seen: list) -> list:
    """Source texts of ``mod`` and, first, the modules it imports relatively (inlined)."""
    src = inspect.getsource(mod)
    out = []
    for m in re.finditer(r"^from (\.+\w*(?:\.\w+)*) import .*$", src, re.M):
        dep = importlib.import_module(m.group(1), mod.__package__)
        if dep.__name__ not in seen:
            seen.append(dep.__name__)
            out += _module_sources(dep, seen)
    src = re.sub(r"^from \.+\w*(?:\.\w+)* import .*$", "", src, flags=re.M)
    src = re.sub(r"^from __future__ import .*$", "", src, flags=re.M)
    return out + [f"# ---- inlined from {mod.__name__.replace('.', '/')}.py ----\n{src.strip()}\n"]


def _typed_args(name: str, args: dict) -> dict:
    from example_models import _coerce, model_params
    params = model_params(name)
    return {k: _coerce(name, k, v, params[k]) for k, v in args.items()}


def _model_code(plan, model, x) -> str:
    """The code defining ``build_model() -> (module, input)`` for the plan's model spec."""
    spec, args = plan.spec, dict(plan.model_args or {})
    ex = importlib.import_module("example_models")
    if spec in ex.MODELS:
        builder = ex.MODELS[spec].builder
        mod = sys.modules[builder.__module__]
        srcs = "\n\n".join(_module_sources(mod, [mod.__name__]))
        return (f"{srcs}\n\nMODEL_ARGS = {_typed_args(spec, args)!r}\n\n\n"
                f"def build_model():\n"
                f"    \"\"\"The {spec} example and its input (batch {plan.batch}).\"\"\"\n"
                f"    return {builder.__name__}({plan.batch}, **MODEL_ARGS)\n")
    if spec.startswith("hf:"):
        cfg = model.config.to_dict()
        cfg = {k: v for k, v in cfg.items() if not k.startswith("_") and k != "transformers_version"}
        cls = type(model)
        shape, dtype = list(x.shape), str(x.dtype).replace("torch.", "")
        make_x = (f"torch.randint(0, config.vocab_size, {shape}, dtype=torch.{dtype})"
                  if not x.is_floating_point() else f"torch.randn({shape}, dtype=torch.{dtype})")
        return (f"import transformers\n\nHF_CONFIG = {cfg!r}\n\n\n"
                f"def build_model():\n"
                f"    \"\"\"{spec} built from its configuration (no weights downloaded) and an "
                f"input of shape {shape}.\"\"\"\n"
                f"    config = transformers.{type(model.config).__name__}(**HF_CONFIG)\n"
                f"    model = transformers.{cls.__name__}(config)\n"
                f"    return model, {make_x}\n")
    path, _, func = spec.rpartition(":")
    path = os.path.abspath(path)
    return (f"import importlib.util\n\nMODEL_FILE = {path!r}\nMODEL_ARGS = {args!r}\n\n\n"
            f"def build_model():\n"
            f"    \"\"\"{func}() from {os.path.basename(path)}, its input resized to batch "
            f"{plan.batch}.\"\"\"\n"
            f"    spec = importlib.util.spec_from_file_location('user_model', MODEL_FILE)\n"
            f"    mod = importlib.util.module_from_spec(spec)\n"
            f"    spec.loader.exec_module(mod)\n"
            f"    model, x = mod.{func}(**MODEL_ARGS)\n"
            f"    if x.shape[0] != {plan.batch}:\n"
            f"        x = x[torch.arange({plan.batch}) % x.shape[0]].clone()\n"
            f"    return model, x\n")


def _style_code(style: str, arg) -> str:
    if style == "colwise":
        return ("ColwiseParallel()" if arg == "shard"
                else "ColwiseParallel(output_layouts=Replicate())")
    if style == "rowwise":
        return ("RowwiseParallel()" if arg == "shard"
                else "RowwiseParallel(input_layouts=Replicate())")
    raise ValueError(style)


def _comment_block(mp: MeshPlan) -> str:
    if not mp.deviations:
        return "# Every layer is computed as the plan gives it.\n"
    w = max(len(d.layer) for d in mp.deviations)
    lines = ["# NOT AS PLANNED: layers PyTorch's parallel APIs cannot compute as the plan gives "
             "them;", "# each is computed in the form shown, which PyTorch computes correctly:"]
    for d in mp.deviations:
        lines.append(f"#   {d.layer:{w}s}  plan: {d.planned}  ->  exported: {d.exported}")
        lines += textwrap.wrap(f"because {d.reason}", 96, initial_indent=f"#   {'':{w}s}  ",
                               subsequent_indent=f"#   {'':{w}s}    ")
    return "\n".join(lines) + "\n"


def _pipeline_block(notes: list) -> str:
    """The header's lines on what the program does otherwise than the plan's pipeline."""
    lines = []
    for planned, exported, reason in notes:
        lines.append(f"# NOT AS PLANNED: the pipeline: plan {planned}  ->  exported: {exported}")
        lines += textwrap.wrap(f"because {reason}", 96, initial_indent="#   ",
                               subsequent_indent="#     ")
    return "\n".join(lines) + "\n" if lines else ""


def _dtype(plan) -> str:
    from explorer.engine.core.precision import check
    return check(getattr(plan, "dtype", None))


def _tol(plan) -> float:
    from explorer.engine.core.precision import tolerance
    return tolerance(_dtype(plan))


def render(plan, mp, model, x) -> str:
    """The program's text (see the module docstring)."""
    from explorer.engine.export.layouts import LayoutPlan
    if isinstance(mp, LayoutPlan):
        return _render_layouts(plan, mp, model, x)
    n = plan.n_devices
    tp_lines = [f"            {m!r}: {_style_code(s, a)}," for m, (s, a) in sorted(mp.styles.items())
                if s in ("colwise", "rowwise")]
    seq = {m: a for m, (s, a) in sorted(mp.styles.items()) if s == "sequence"}
    head = (f'"""{plan.model}: the {plan.algo} plan for {n} devices (batch {plan.batch}'
            f'{", arguments " + str(plan.model_args) if plan.model_args else ""}), '
            f'exported by Plan Explorer.\n\n'
            f"Applies the plan with PyTorch's parallel APIs on a DeviceMesh (dp={mp.dp}, "
            f"tp={mp.tp}) and trains K SGD steps:\n\n"
            + _usage(plan, n))
    notes = [(d.layer, d.planned, d.exported, d.reason) for d in mp.deviations]
    parts = [
        head,
        _pipeline_block(mp.pipeline_notes) + _comment_block(mp),
        "from __future__ import annotations\n\n"
        "import argparse\nimport contextlib\nimport copy\nimport os\nimport sys\n\n"
        "import torch\nimport torch.distributed as dist\n"
        "from torch.distributed.device_mesh import DeviceMesh, init_device_mesh\n"
        "from torch.distributed.fsdp import fully_shard\n"
        "from torch.distributed.tensor import DTensor, Replicate, Shard\n"
        "from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleOutput,\n"
        "                                               RowwiseParallel, SequenceParallel,\n"
        "                                               parallelize_module)\n"
        "from torch.utils.checkpoint import checkpoint\n",
        f"DEVICES = {n}\nMESH = ({mp.dp}, {mp.tp})          # (dp, tp)\n"
        f"BATCH_DIM = {mp.batch_dim}          # the input's sample dimension, split over dp\n"
        f"LR = {LR!r}\nSEED = {SEED}\n"
        f"TOL = {_tol(plan)!r}            # as Plan Explorer's reference check in {_dtype(plan)}\n"
        f"ROUNDING_FACTOR = {10.0 if _dtype(plan) == 'fp32' else 2.0}\nUPDATE_FLOOR = 1e-3\n"
        f"DTYPE = {_dtype(plan)!r}          # the plan's precision (bf16: autocast, fp32 "
        f"master weights)\n"
        f"#: (layer, plan, exported, reason) of every layer not computed as planned\n"
        f"NOT_AS_PLANNED = {notes!r}\n"
        f"#: (plan, exported, reason) where the plan's pipeline is not followed\n"
        f"PIPELINE_NOT_AS_PLANNED = {mp.pipeline_notes!r}\n"
        f"LAYER_MESH = None       # no per-layer layouts: the (dp, tp) mesh above\n"
        f"LAYOUTS = {{}}\nPIPELINE = {{}}          # no pipeline run\n",
        _model_code(plan, model, x),
        "def parallelize(model, mesh):\n"
        "    \"\"\"The plan: tensor-parallel styles on mesh['tp'], then FSDP2 on mesh['dp'].\"\"\"\n"
        "    tp, dp = mesh['tp'], mesh['dp']\n"
        "    if tp.size() > 1:\n"
        "        parallelize_module(model, tp, {\n"
        + ("\n".join(tp_lines) + "\n" if tp_lines else "")
        + "        })\n"
        "        for name, dim in {" + "".join(f"\n            {m!r}: {d}," for m, d in seq.items())
        + ("\n        " if seq else "") + "}.items():   # module -> its sequence dimension\n"
        "            sequence_parallel(model.get_submodule(name), tp, dim)\n"
        "    if dp.size() > 1:\n"
        "        fully_shard(model, mesh=dp)\n"
        "    return model\n",
        program_body(),
    ]
    return "\n\n".join(p.strip("\n") + "\n" for p in parts)



def _render_layouts(plan, lp, model, x) -> str:
    """The program of a per-layer layout plan (:mod:`explorer.engine.export.layouts`)."""
    import pprint
    n = plan.n_devices
    mesh = " x ".join(str(s) for s in lp.mesh)
    done = lp.layers - len(lp.deviations)
    subs = sorted({tuple(sp["ranks"]) for sp in lp.specs.values() if sp.get("ranks")},
                  key=lambda r: (len(r), r))
    head = (f'"""{plan.model}: the {plan.algo} plan for {n} devices (batch {plan.batch}'
            f'{", arguments " + str(plan.model_args) if plan.model_args else ""}), '
            f'exported by Plan Explorer.\n\n'
            f"Applies the plan layer by layer with DTensor on one DeviceMesh ({mesh}): each "
            f"layer's\nconfiguration is a placement per mesh dimension (Shard / Replicate / "
            f"Partial), its inputs are\nredistributed to it, and it computes on its shards.  "
            + (f"Layers on a subset of the devices\ncompute on a DeviceMesh of those ranks "
               f"({', '.join(str(list(r)) for r in subs)}).  " if subs else "")
            + f"{done} of {lp.layers} layers as planned.\n\n"
            + _usage(plan, n))
    notes = [(d.layer, d.planned, d.exported, d.reason) for d in lp.deviations]
    block = (f"# {done} of {lp.layers} layers as planned.\n"
             + _pipeline_block(lp.pipeline_notes)
             + (_comment_block(lp) if lp.deviations else ""))
    parts = [
        head,
        block,
        _IMPORTS,
        f"DEVICES = {n}\nMESH = (1, {n})          # unused: the layers' own mesh below\n"
        f"BATCH_DIM = 0\n"
        f"LR = {LR!r}\nSEED = {SEED}\n"
        f"TOL = {_tol(plan)!r}            # as Plan Explorer's reference check in {_dtype(plan)}\n"
        f"ROUNDING_FACTOR = {10.0 if _dtype(plan) == 'fp32' else 2.0}\nUPDATE_FLOOR = 1e-3\n"
        f"DTYPE = {_dtype(plan)!r}          # the plan's precision (bf16: autocast, fp32 "
        f"master weights)\n"
        f"#: (layer, plan, exported, reason) of every layer not computed as planned\n"
        f"NOT_AS_PLANNED = {notes!r}\n"
        f"#: (plan, exported, reason) where the plan's pipeline is not followed\n"
        f"PIPELINE_NOT_AS_PLANNED = {lp.pipeline_notes!r}\n"
        f"PIPELINE = {{}}          # no pipeline run\n"
        f"#: the mesh: the device count's prime factors; one placement per mesh dimension\n"
        f"LAYER_MESH = {tuple(lp.mesh)!r}\n"
        f"#: fx node -> mode, output shape, placements of its output (and, for a module layer,\n"
        f"#: of its input and parameters): R = Replicate, P = Partial, S<d> = Shard(d)\n"
        f"LAYOUTS = {pprint.pformat(lp.specs, width=96, compact=True)}\n",
        _model_code(plan, model, x),
        "def parallelize(model, mesh):\n"
        "    \"\"\"Unused: the layers' placements apply through parallelize_layers.\"\"\"\n"
        "    return model\n",
        program_body(),
    ]
    return "\n\n".join(p.strip("\n") + "\n" for p in parts)


def _render_pipeline(plan, pp, pipe: dict, model, x) -> str:
    """The program of a pipelined plan (:mod:`explorer.engine.export.pipeline`)."""
    import pprint

    from explorer.engine.export.pipeline import describe
    n = plan.n_devices
    done = pp.layers - len(pp.deviations)
    S, G = pp.stages, pp.group
    groups = ", ".join(str(list(range(s * G, (s + 1) * G))) for s in range(S))
    kind = "Schedule1F1B" if pp.schedule == "1f1b" else "ScheduleGPipe"
    head = (f'"""{plan.model}: the {plan.algo} plan for {n} devices (batch {plan.batch}'
            f'{", arguments " + str(plan.model_args) if plan.model_args else ""}), '
            f'exported by Plan Explorer.\n\n'
            f"Runs the plan's pipeline ({describe(pipe)}) with torch.distributed.pipelining: "
            f"the model\ntraced by torch.fx and cut at the plan's stage boundaries, stage s a "
            f"PipelineStage on the ranks\n{groups}, {kind} over {pp.micro_batches} "
            f"micro-batches of the batch"
            + (f"; a stage's {G} ranks are {pp.dp} data-parallel replica(s) of {pp.tp} "
               f"tensor-parallel rank(s)" if G > 1 else "")
            + f".  {done} of {pp.layers} layers as planned.\n\n"
            + _usage(plan, n))
    notes = [(d.layer, d.planned, d.exported, d.reason) for d in pp.deviations]
    block = (f"# {done} of {pp.layers} layers as planned, in the plan's pipeline "
             f"({S} stages, {pp.micro_batches} micro-batches, {pp.schedule}).\n"
             + _pipeline_block(pp.notes)
             + (_comment_block(pp) if pp.deviations else ""))
    parts = [
        head,
        block,
        _IMPORTS,
        f"DEVICES = {n}\nMESH = (1, {n})          # unused: the pipeline's (pp, dp) mesh below\n"
        f"BATCH_DIM = {pp.batch_dim}          # the input's sample dimension: the "
        f"micro-batches cut it\n"
        f"LR = {LR!r}\nSEED = {SEED}\n"
        f"TOL = {_tol(plan)!r}            # as Plan Explorer's reference check in {_dtype(plan)}\n"
        f"ROUNDING_FACTOR = {10.0 if _dtype(plan) == 'fp32' else 2.0}\nUPDATE_FLOOR = 1e-3\n"
        f"DTYPE = {_dtype(plan)!r}          # the plan's precision (bf16: autocast, fp32 "
        f"master weights)\n"
        f"#: (layer, plan, exported, reason) of every layer not computed as planned\n"
        f"NOT_AS_PLANNED = {notes!r}\n"
        f"#: (plan, exported, reason) where the plan's pipeline is not followed\n"
        f"PIPELINE_NOT_AS_PLANNED = {pp.notes!r}\n"
        f"LAYER_MESH = None\nLAYOUTS = {{}}\n"
        f"#: the pipeline: stages, micro-batches, the schedule run, ranks per stage (group),\n"
        f"#: whether they split each micro-batch (split), and every layer's fx node -> stage\n"
        f"PIPELINE = "
        f"{pprint.pformat(pp.program_dict(), width=96, compact=True, sort_dicts=False)}\n",
        _model_code(plan, model, x),
        "def parallelize(model, mesh):\n"
        "    \"\"\"Unused: the pipeline's stages apply through Pipelined.\"\"\"\n"
        "    return model\n",
        program_body(),
    ]
    return "\n\n".join(p.strip("\n") + "\n" for p in parts)

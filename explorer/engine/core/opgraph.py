"""The joint forward + backward (+ SGD update) operator graph of a model.

Tofu partitions and Celeritas places *fine-grained operators* of a training step, not layers.
This module traces one training step of the model loaded in train mode by
:mod:`explorer.engine.core.capture` - the loss of :func:`~explorer.engine.core.capture.loss_of`
(``Σ mean(o²)`` over every floating-point output leaf, or the model file's ``loss(output)``),
gradients of every parameter, ``p ← p − lr·dp`` - with ``make_fx`` over fake tensors, so even WResNet-152-10 at batch 8 or a
10-layer 8K LSTM costs no memory.  Every aten node becomes an :class:`Op`; multi-output aten
ops (``convolution_backward``, ``native_batch_norm``, ``split``...) become one ``Op`` per
output that is used.  Each op records

* ``fwd`` - the forward op a backward op belongs to (autograd's sequence number, linked with
  the same hooks AOTAutograd uses), which coarsening groups on (Tofu Section 5.1);
* ``module`` and ``call`` - the innermost ``nn.Module`` that ran it and which call of that
  module it was (an unrolled RNN calls the same cell once per time step);
* shapes, FLOPs and bytes.

Every trainable parameter must be read by some operator (checked on every build, naming the
ones that are not), and a data-dependent op (``nonzero``, ``.item()``...) is refused naming
the user's line (:meth:`OpGraph.where` gives any operator's line).

Example::

    >>> g = build_opgraph("mlp", batch=8, model_args={"layers": 2, "hidden": 16})
    >>> g.counts()["ops"] > 10, g.phase_counts()["backward"] > 0
    (True, True)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import networkx as nx

from explorer.errors import UnsupportedModel

__all__ = ["Tensor", "Op", "OpGraph", "TorchValue", "build_opgraph", "trace_step",
           "opgraph_digest", "user_line", "runnable", "with_step"]

#: aten ops that only re-label memory and carry no data dependence worth an operator
DROPPED = {"detach", "alias", "lift_fresh_copy", "_assert_tensor_metadata", "sym_size",
         "sym_numel", "sym_stride"}
#: aten ops that create a tensor from nothing (shape-only inputs)
_SOURCES = {"ones_like", "zeros_like", "full_like", "empty_like", "full", "zeros", "ones",
            "empty", "scalar_tensor", "new_zeros", "new_ones", "new_empty", "new_full",
            "arange", "empty_strided", "rand_like", "randn_like", "bernoulli"}


@dataclass
class Tensor:
    """One tensor of the step: ``kind`` is input | param | activation | grad | update | const."""

    id: str
    shape: tuple
    itemsize: int = 4
    kind: str = "activation"
    producer: str | None = None
    grad_of: str | None = None        # for gradients: the forward tensor they are the gradient of
    dtype: str = "float32"

    @property
    def numel(self) -> int:
        return math.prod(self.shape) if self.shape else 1

    @property
    def bytes(self) -> int:
        return self.numel * self.itemsize


@dataclass(frozen=True)
class TorchValue:
    """A torch dtype, device, layout or memory format in an operator's arguments, by name
    (``TorchValue("dtype", "float32")``), so an :class:`OpGraph` is plain data that is stored
    and read back without importing torch; :meth:`value` is the torch object again."""

    kind: str                         # dtype | device | layout | memory_format
    name: str                         # "float32", "cpu", "strided", "preserve_format"

    @classmethod
    def of(cls, v) -> "TorchValue | None":
        """The name of torch object ``v``, or ``None`` when it is not one of the four kinds."""
        import torch
        for kind, typ in (("dtype", torch.dtype), ("device", torch.device),
                          ("layout", torch.layout), ("memory_format", torch.memory_format)):
            if isinstance(v, typ):
                return cls(kind, str(v).removeprefix("torch."))
        return None

    def value(self):
        """The torch object this names."""
        import torch
        return torch.device(self.name) if self.kind == "device" else getattr(torch, self.name)

    def __repr__(self) -> str:
        return f"torch.device({self.name!r})" if self.kind == "device" else f"torch.{self.name}"


@dataclass
class Op:
    """One operator: an aten call (or one output of a multi-output aten call)."""

    name: str
    target: str                       # aten name without overload, e.g. "convolution_backward"
    inputs: list                      # tensor ids (only tensor arguments, in argument order)
    output: str                       # tensor id
    phase: str = "forward"            # forward | backward | update | source
    fwd: str | None = None            # the forward op this (backward) op belongs to
    module: str = ""
    call: int = 0
    index: int = 0                    # output index of a multi-output aten call
    args: tuple = ()                  # the aten call's arguments (fx Nodes replaced by tensor
    #                                   ids, lists plain, torch enums as TorchValue)
    kwargs: dict = field(default_factory=dict)
    flops: float = 0.0
    node: str = ""                    # the aten call (fx node) this op is an output of
    where: str = ""                   # the line of model code that made it (user_line)

    def to_dict(self) -> dict:
        return {"name": self.name, "target": self.target, "inputs": list(self.inputs),
                "output": self.output, "phase": self.phase, "fwd": self.fwd,
                "module": self.module, "call": self.call, "flops": self.flops}


class OpGraph:
    """Operators and tensors of one training step, in execution (topological) order."""

    def __init__(self, model: str, batch: int):
        self.model, self.batch = model, batch
        self.ops: dict = {}               # name -> Op (insertion = execution order)
        self.tensors: dict = {}           # id -> Tensor
        self.params: dict = {}            # parameter name -> tensor id
        self.param_grads: dict = {}       # parameter tensor id -> gradient tensor id
        self.inputs: list = []
        self.loss: str | None = None
        self.gm = None                    # the traced fx GraphModule (set by build_from_module;
        #                                   None for a graph read from the capture cache)
        self.param_names: list = []
        self.buffer_names: list = []
        self.model_args: dict = {}        # the builder's keyword arguments (build_opgraph)

    # -- queries ------------------------------------------------------------------------------
    def consumers(self) -> dict:
        out: dict = {t: [] for t in self.tensors}
        for op in self.ops.values():
            for t in op.inputs:
                out[t].append(op.name)
        return out

    def counts(self) -> dict:
        return {"ops": len(self.ops), "tensors": len(self.tensors),
                "params": len(self.params), "parameters": self.parameters,
                "param_bytes": sum(self.tensors[t].bytes for t in self.params.values())}

    @property
    def parameters(self) -> int:
        """Elements of the trainable parameters some operator reads (each once)."""
        read = {t for op in self.ops.values() for t in op.inputs}
        return sum(self.tensors[t].numel for t in self.params.values() if t in read)

    def where(self, op_name: str) -> str | None:
        """``file:line: code`` of the user's source that made operator ``op_name``."""
        op = self.ops.get(op_name)
        if op is None:
            return None
        if self.gm is None:               # read from the capture cache: the line recorded
            return op.where or None
        from explorer.engine.core.capture import node_line
        node = next((n for n in self.gm.graph.nodes if n.name == op.node), None)
        return node_line(node)

    def phase_counts(self) -> dict:
        out: dict = {}
        for op in self.ops.values():
            out[op.phase] = out.get(op.phase, 0) + 1
        return out

    def to_networkx(self) -> nx.DiGraph:
        """Operators as nodes (``target``, ``phase``, ``flops``, ``out_bytes``), an edge per
        tensor read with its ``bytes`` (several tensors between two ops add up)."""
        g = nx.DiGraph()
        for op in self.ops.values():
            g.add_node(op.name, target=op.target, phase=op.phase, flops=op.flops,
                       module=op.module, out_bytes=self.tensors[op.output].bytes,
                       out_shape=list(self.tensors[op.output].shape))
        for op in self.ops.values():
            for t in dict.fromkeys(op.inputs):
                src = self.tensors[t].producer
                if src is None or src == op.name:
                    continue
                b = self.tensors[t].bytes
                if g.has_edge(src, op.name):
                    g[src][op.name]["bytes"] += b
                else:
                    g.add_edge(src, op.name, bytes=b, tensor=t)
        return g


# ------------------------------------------------------------------------------------------------
# Tracing
# ------------------------------------------------------------------------------------------------


_STACKS: dict = {}


def fresh_trace_state() -> None:
    """``make_fx`` keeps node metadata in module globals of ``torch.fx.traceback``: two
    threads tracing at once, or a process forked while another thread traces, would attach
    stale ``seq_nr``s (the wrong forward op for backward ops).  Reset them before a trace."""
    import sys
    fxtb = sys.modules.get("torch.fx.traceback")
    if fxtb is not None:
        for name, value in (("current_meta", {}), ("current_replay_node", None),
                            ("should_preserve_node_meta", False),
                            ("_should_preserve_node_meta", False)):
            if hasattr(fxtb, name):
                setattr(fxtb, name, value)


def _after_fork_in_child():
    fresh_trace_state()


if hasattr(__import__("os"), "register_at_fork"):
    __import__("os").register_at_fork(after_in_child=_after_fork_in_child)


def one_attention_kernel():
    """Context: ``scaled_dot_product_attention`` takes its math path (``bmm``, softmax,
    ``bmm``) whatever the device.  Left to choose, it decomposes on the meta device (where a
    search traces) but becomes one fused kernel on the CPU (where a worker traces, e.g.
    ``_scaled_dot_product_flash_attention_for_cpu``), so the plan's graph and the worker's
    would be two programs; with one backend they are one by construction."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    return sdpa_kernel([SDPBackend.MATH])


def stack_of(handles) -> list:
    return _STACKS.get(id(handles), [])


def _module_annotations(model):
    """Forward hooks that annotate every traced node with the innermost module's path and
    its call count (``fx_traceback.annotate`` puts them into ``node.meta['custom']``)."""
    import torch.fx.traceback as fxtb
    calls: dict = {}
    stacks: list = []
    handles = []

    def pre(path):
        def hook(mod, args):
            n = calls.get(path, 0)
            calls[path] = n + 1
            cm = fxtb.annotate({"module": path, "call": n})
            cm.__enter__()
            stacks.append(cm)
        return hook

    def post(mod, args, out):
        if stacks:
            stacks.pop().__exit__(None, None, None)

    _STACKS[id(handles)] = stacks
    for path, mod in model.named_modules():
        if not path:
            continue
        handles.append(mod.register_forward_pre_hook(pre(path)))
        handles.append(mod.register_forward_hook(post))
    return handles


def trace_step(model, x, lr: float = 0.01, loss_fn=None, name: str = "model"):
    """``make_fx`` graph of one SGD training step over fake tensors (``loss_fn``: the model
    file's ``loss(output)``, default ``Σ mean(o²)`` over the float output leaves).

    Returns ``(graph_module, param_names, buffer_names)``; placeholders are the parameters,
    the buffers, then ``x``.
    Backward nodes carry ``meta['seq_nr']`` of the forward node they differentiate.
    """
    import torch
    import torch.fx.traceback as fxtb
    from torch.fx.experimental.proxy_tensor import make_fx
    from torch._functorch._aot_autograd.logging_utils import setup_stacktrace_preservation_hooks
    from explorer.errors import ExplorerError
    from explorer.engine.core.capture import (
        DataDependent,
        data_dependent_error,
        data_dependent_message,
        op_in,
        check_data_dependent,
        quiet_libraries,
        loss_of,
        user_line,
    )

    names = [n for n, p in model.named_parameters() if p.requires_grad]
    if not names:
        raise UnsupportedModel("the model has no trainable parameters: nothing to partition")
    bnames = [n for n, _ in model.named_buffers()]

    def step(params, buffers, x):
        out = torch.func.functional_call(
            model, {**dict(zip(names, params)), **dict(zip(bnames, buffers))}, (x,))
        loss = loss_of(out, loss_fn)
        if loss.grad_fn is None:
            raise UnsupportedModel("the loss does not depend on any trainable parameter: "
                                   "nothing to train")
        setup_stacktrace_preservation_hooks([loss.grad_fn])
        grads = torch.autograd.grad(loss, params, allow_unused=True)
        new = [p - lr * g if g is not None else p for p, g in zip(params, grads)]
        return loss, grads, new

    params = [p.detach().requires_grad_(True) for n, p in model.named_parameters()
              if p.requires_grad]
    from explorer.engine.core import capture as _capture_module
    lock = _capture_module.TRACE_LOCK          # the one lock every trace holds
    lock.acquire()
    fresh_trace_state()
    handles = _module_annotations(model)
    model.train()
    try:
        with fxtb.preserve_node_meta(), one_attention_kernel(), quiet_libraries():
            gm = make_fx(step, tracing_mode="fake", record_stack_traces=True)(
                params, [b.detach() for _, b in model.named_buffers()], x)
        check_data_dependent(gm, name)
    except ExplorerError:
        raise
    except Exception as e:  # noqa: BLE001 - any tracing failure is the model's
        where = user_line(e)
        if data_dependent_error(e):
            raise DataDependent(data_dependent_message(name, op_in(where), where)) from None
        first = str(e).splitlines()[0] if str(e) else ""
        if "value per channel" in first:
            hint = ("batch norm needs more than one value per channel to train: use a larger "
                    "--batch or input size")
        elif "grouped_mm" in f"{first} {where}":
            hint = ("its experts are one grouped matmul over token groups whose sizes the "
                    "router decides at run time, which no method can plan for; the built-in "
                    "`moe` example routes with a fixed capacity per expert instead")
        else:
            hint = ("In-place ops on inputs are a usual cause; rewrite that part of forward() "
                    "or pick another model")
        raise UnsupportedModel(
            f"could not trace a training step of the model with make_fx: "
            f"{type(e).__name__}: {first}{f' at {where}' if where else ''}. {hint}.") from None
    finally:
        for h in handles:
            h.remove()
        while stack_of(handles):          # annotations a failed trace left open: closing
            try:                          # them must not replace the error being raised
                stack_of(handles).pop().__exit__(None, None, None)
            except Exception:  # noqa: BLE001 - fx's meta was reset by the failure
                pass
        _STACKS.pop(id(handles), None)
        lock.release()
    return gm, names, bnames


def _shape(v):
    return tuple(int(s) for s in v.shape) if hasattr(v, "shape") else None


def _dt(v) -> str:
    return str(getattr(v, "dtype", "torch.float32")).replace("torch.", "")


def _itemsize(v) -> int:
    try:
        return v.dtype.itemsize
    except AttributeError:
        return 4


def aten_name(node) -> str:
    t = node.target
    name = getattr(t, "__name__", str(t))
    if hasattr(t, "_schema"):
        name = t._schema.name.split("::")[-1]
    return name


#: frames of these packages are library internals, not the line of model code to blame
_INTERNAL = ("torch", "transformers", "explorer", "functorch", "contextlib")


def user_line(stack_trace: str | None) -> str:
    """``file.py:LINE: code`` of the last frame of ``stack_trace`` (an fx node's
    ``meta["stack_trace"]``) outside library internals - the model's own line; the last
    frame of any library when the op comes from one (e.g. a Hugging Face model file)."""
    import re
    frames = re.findall(r'File "([^"]+)", line (\d+), in [^\n]*\n\s*([^\n]*)', stack_trace or "")
    if not frames:
        return ""

    def internal(path):
        parts = path.replace("\\", "/").split("/")
        return any(p in _INTERNAL for p in parts[:-1]) or "site-packages" in parts
    own = [f for f in frames if not internal(f[0])]
    lib = [f for f in frames if "/torch/" not in f[0].replace("\\", "/")]
    path, line, code = (own or lib or frames)[-1]
    return f"{path}:{line}: {code.strip()}"


def build_from_module(model, x, name: str = "model", lr: float = 0.01,
                      loss_fn=None) -> OpGraph:
    """Trace ``model`` on example input ``x`` (its first dimension = global batch); checks
    that every trainable parameter reaches the graph."""
    import operator

    import torch
    from explorer.engine.core.flops import op_flops

    gm, pnames, bnames = trace_step(model, x, lr, loss_fn, name)
    g = OpGraph(name, int(x.shape[0]) if x.dim() else 1)
    g.gm = gm                         # the traced step: its aten calls run on real tensors too
    g.param_names, g.buffer_names = pnames, bnames
    nodes = list(gm.graph.nodes)
    placeholders = [n for n in nodes if n.op == "placeholder"]
    tid: dict = {}                    # (fx node name, output index) -> tensor id
    fwd_by_seq: dict = {}             # seq_nr -> first forward op name
    alias_of: dict = {}               # dropped (detach...) node -> the node it aliases

    for i, n in enumerate(placeholders):
        v = n.meta.get("val")
        if i < len(pnames):
            t = Tensor(f"param:{pnames[i]}", _shape(v), _itemsize(v), "param", dtype=_dt(v))
            g.params[pnames[i]] = t.id
        elif i < len(pnames) + len(bnames):
            t = Tensor(f"buffer:{bnames[i - len(pnames)]}", _shape(v), _itemsize(v), "buffer",
                       dtype=_dt(v))
        else:
            t = Tensor(f"input:{n.name}", _shape(v), _itemsize(v), "input", dtype=_dt(v))
            g.inputs.append(t.id)
        g.tensors[t.id] = t
        tid[(n.name, 0)] = t.id

    def resolve(a, idx=0):
        while a.name in alias_of:
            a = alias_of[a.name]
        return tid.get((a.name, idx))

    def tensor_args(args):
        out = []
        for a in args:
            if isinstance(a, torch.fx.Node):
                t = resolve(a)
                if t is not None:
                    out.append(t)
            elif isinstance(a, (list, tuple)):
                out.extend(tensor_args(a))
        return out

    def plain(a):
        """Arguments as plain data: tensor ids, numbers, lists and tuples, TorchValue."""
        if isinstance(a, torch.fx.Node):
            return resolve(a)
        if isinstance(a, (list, tuple)):          # fx's immutable_list becomes a list
            return (tuple if isinstance(a, tuple) else list)(plain(x) for x in a)
        return TorchValue.of(a) or a

    getitems: dict = {}
    for n in nodes:
        if n.op == "call_function" and n.target is operator.getitem:
            getitems.setdefault(n.args[0].name, []).append(n)

    for n in nodes:
        if n.op != "call_function" or n.target is operator.getitem:
            continue
        tname = aten_name(n)
        if tname in DROPPED and n.args and isinstance(n.args[0], torch.fx.Node):
            alias_of[n.name] = n.args[0]
            continue
        meta = n.meta
        custom = meta.get("custom") or {}
        seq = meta.get("seq_nr", -1)
        in_grad = bool(meta.get("autograd_backward") or meta.get("in_grad_fn"))
        v = meta.get("val")
        outs = []                     # (index, fx name for tid, val)
        if isinstance(v, (tuple, list)):
            for gi in getitems.get(n.name, []):
                outs.append((gi.args[1], gi.name, v[gi.args[1]]))
        elif v is not None and hasattr(v, "shape"):
            outs.append((0, n.name, v))
        if not outs:
            continue
        ins = tensor_args(n.args) + tensor_args(list(n.kwargs.values()))
        if tname in _SOURCES:
            phase = "source"
        elif in_grad:
            phase = "backward"
        else:
            phase = "forward"
        for idx, fxname, val in outs:
            if val is None or not hasattr(val, "shape"):
                continue
            opname = fxname
            t = Tensor(f"{fxname}", _shape(val), _itemsize(val),
                       "const" if phase == "source" else
                       ("grad" if phase == "backward" else "activation"), opname,
                       dtype=_dt(val))
            g.tensors[t.id] = t
            tid[(fxname, 0)] = t.id
            if fxname != n.name:
                tid[(n.name, idx)] = t.id
            fwd = None
            if phase == "forward" and seq >= 0:
                fwd_by_seq.setdefault(seq, opname)
            elif phase == "backward":
                fwd = fwd_by_seq.get(seq)
            op = Op(opname, tname, list(dict.fromkeys(ins)), t.id, phase, fwd,
                    str(custom.get("module", "")), int(custom.get("call", 0)), int(idx),
                    plain(tuple(n.args)), {k: plain(a) for k, a in n.kwargs.items()},
                    node=n.name)
            op.where = user_line(meta.get("stack_trace")) or (
                g.ops[fwd].where if fwd in g.ops else "")
            g.ops[opname] = op
    # the output: loss, grads, updated params
    out_node = nodes[-1]
    flat = list(out_node.args[0])
    npar = len(pnames)
    loss, grads, new = flat[0], flat[1:1 + npar], flat[1 + npar:1 + 2 * npar]
    g.loss = resolve(loss) if isinstance(loss, torch.fx.Node) else None
    for pn, gr, nw in zip(pnames, grads, new):
        pt = g.params[pn]
        if isinstance(gr, torch.fx.Node) and resolve(gr) is not None:
            gt = resolve(gr)
            g.param_grads[pt] = gt
            g.tensors[gt].grad_of = pt
        if isinstance(nw, torch.fx.Node) and resolve(nw) is not None:
            ut = resolve(nw)
            g.tensors[ut].kind = "update"
    _mark_update_ops(g)
    _link_grads(g)
    for op in g.ops.values():
        op.flops = op_flops(op, g)
    _check_parameters(g, model, name)
    return g


def _check_parameters(g: OpGraph, model, name: str) -> None:
    """The invariant: the operators read every trainable parameter (count equal to the
    model's), else one line naming the ones no operator reads."""
    from explorer.engine.core.capture import parameter_count
    want = parameter_count(model, trainable_only=True)
    if g.parameters == want:
        return
    read = {t for op in g.ops.values() for t in op.inputs}
    missing = [pn for pn, t in g.params.items() if t not in read]
    raise UnsupportedModel(
        f"{name}: the operator graph reads {g.parameters} of the model's {want} trainable "
        f"parameters; {', '.join(missing[:4]) or '?'}{' ...' if len(missing) > 4 else ''} "
        f"reach no operator (forward() never uses them)")


def _mark_update_ops(g: OpGraph) -> None:
    """Ops downstream of a parameter gradient are the optimizer's ("update" phase): in a
    training step gradients feed nothing else."""
    cons = g.consumers()
    frontier = list(g.param_grads.values())
    seen: set = set()
    while frontier:
        t = frontier.pop()
        for o in cons.get(t, []):
            if o in seen:
                continue
            seen.add(o)
            g.ops[o].phase = "update"
            g.tensors[g.ops[o].output].kind = "update"
            frontier.append(g.ops[o].output)


def _link_grads(g: OpGraph) -> None:
    """``grad_of`` for activation gradients: a backward op's output whose shape matches one
    input of its forward op (by output index for multi-output backward ops)."""
    for op in g.ops.values():
        if op.phase != "backward" or op.fwd is None:
            continue
        t = g.tensors[op.output]
        if t.grad_of is not None:
            continue
        f = g.ops[op.fwd]
        cands = [i for i in f.inputs if g.tensors[i].shape == t.shape
                 and g.tensors[i].kind in ("activation", "input", "param")]
        if len(cands) == 1:
            t.grad_of = cands[0]
        elif len(cands) > 1 and op.index < len(f.inputs) and f.inputs[op.index] in cands:
            t.grad_of = f.inputs[op.index]


def build_opgraph(spec: str, batch: int | None = None, model_args: dict | None = None,
                  lr: float = 0.01) -> OpGraph:
    """Load example / ``file.py:function`` ``spec`` on the meta device (train mode, the one
    loader of :mod:`explorer.engine.core.capture`) and trace its step with its loss."""
    from explorer.engine.core.capture import load, loss_function
    model, x = load(spec, batch, model_args, meta=True)
    g = build_from_module(model, x, spec, lr, loss_function(spec))
    g.model_args = dict(model_args or {})
    return g


def with_step(g: OpGraph) -> OpGraph:
    """``g`` when it carries its traced step (``g.gm``), else the same model traced again: a
    graph read back from the capture cache holds no GraphModule.  A retrace that gives
    another graph (the model's code changed since) is refused."""
    if getattr(g, "gm", None) is not None:
        return g
    fresh = build_opgraph(g.model, g.batch, dict(g.model_args or {}))
    if opgraph_digest(fresh) != opgraph_digest(g):
        from explorer.errors import InfeasiblePlan
        raise InfeasiblePlan(f"{g.model}'s trace now differs from its cached operator graph "
                             f"(model code changed?): run `explorer cache clear`")
    return fresh


def opgraph_digest(g: OpGraph) -> str:
    """Hash of what an operator-level plan depends on (16 hex digits): every operator's name,
    aten target, output index, inputs and output, and every tensor's id and shape.

    A saved Tofu partition or device placement records it, so a plan whose model, batch or
    model arguments now give another graph is refused before any worker starts; the workers
    check their own trace against it too.  Dtypes are left out on purpose: the runtime traces
    the model in float64, the search on float32 fake tensors."""
    import hashlib
    import json
    doc = {"ops": [[o.name, o.target, o.index, list(o.inputs), o.output]
                   for o in g.ops.values()],
           "tensors": [[t.id, list(t.shape or ())] for t in g.tensors.values()]}
    return hashlib.sha256(json.dumps(doc, separators=(",", ":")).encode()).hexdigest()[:16]


def runnable(gm, device: str = "cpu"):
    """A copy of a traced step (:func:`build_opgraph` traces on the meta device) whose
    tensor-creating calls name ``device`` instead of ``meta``, so the very graph a plan was
    made on runs on real tensors (the placement runtime, per-operator profiling)."""
    import torch
    graph = torch.fx.Graph()
    graph.output(graph.graph_copy(gm.graph, {}))
    graph._codegen = gm.graph._codegen        # the step's calling convention (pytree)
    real = torch.device(device)

    def fix(v):
        if isinstance(v, torch.device) and v.type == "meta":
            return real
        if isinstance(v, (list, tuple)):
            return type(v)(fix(x) for x in v)
        return v
    for n in graph.nodes:
        if n.op == "call_function":
            n.args = fix(n.args)
            n.kwargs = {k: fix(v) for k, v in n.kwargs.items()}
    return torch.fx.GraphModule(gm, graph)

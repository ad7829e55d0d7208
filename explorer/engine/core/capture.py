"""One capture of a model, shared by search, profiling and run.

Every path that looks at a model - the layer importer (search, costs, profiling), the operator
graph (Tofu, Celeritas), the layer-wise executor and the reference check - loads it with
:func:`load` and traces it with :func:`capture` (or, for the operator graph, ``make_fx`` over
the same loaded model), always in **train mode**: a model whose ``forward`` depends on
``self.training`` (BERT's train-only ``contiguous`` after attention, dropout) gives the
same graph to the search and to the workers.

Numerics (the rule the runtime and its reference check share):

* the layer-wise executor and :func:`~explorer.engine.runtime.reference.reference_step`
  compute the train-mode graph under :func:`deterministic` with ``running_stats=True``:
  dropout (functional, module or attention's ``dropout_p``) is the identity and BatchNorm
  normalises with its running statistics (which do not update) - a sample-split plan would
  otherwise need an all-reduce of batch statistics the cost model does not know about, and
  random masks cannot match across processes;
* the operator-level executor and its reference (:func:`~explorer.engine.runtime.reference.
  traced_step`) run the traced step under :func:`deterministic` with ``running_stats=False``:
  dropout is the identity, BatchNorm keeps batch statistics (Tofu describes that reduction).

Loss (:func:`loss_of`): ``Σ mean(o²)`` over every floating-point leaf of the output (a tensor,
tuple, list, dict or Hugging Face ``ModelOutput``), unless the model file defines a
module-level ``loss(output)``, which is then used instead (:func:`loss_function`).

Errors name the user's source line (:func:`user_line`): a data-dependent op (``nonzero``,
``masked_select``, ``unique``, ``.item()``, boolean-mask indexing) is refused in one line
naming the op and ``file:line: code`` of the model.
"""

from __future__ import annotations

import contextlib
import functools
import io
import logging
import operator
import os
import re
import sys
import sysconfig
import threading
from pathlib import Path

import torch
import torch.fx
import torch.nn as nn
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_leaves

from explorer.errors import UnsupportedModel

__all__ = ["load", "capture", "deterministic", "float_leaves", "loss_of", "loss_function",
           "DETERMINISTIC_ATEN", "parameter_count", "user_line", "DataDependent", "DATA_DEPENDENT",
           "check_data_dependent"]


#: torch.fx, torch.export and make_fx keep tracing state in module globals: two threads tracing
#: at once (the app serves callbacks in threads) can abort the process.  Every trace in this
#: project holds this lock (:func:`capture` and :func:`explorer.engine.core.opgraph`'s step
#: trace); re-entrant, so a trace may call another.  A forked child gets a fresh one.
TRACE_LOCK = threading.RLock()


def _fresh_trace_lock() -> None:
    global TRACE_LOCK
    TRACE_LOCK = threading.RLock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_fresh_trace_lock)


class DataDependent(UnsupportedModel):
    """The model computes a shape (or control flow) from tensor values: no plan can be made."""


#: ops whose output shape (or a Python value) depends on tensor values
DATA_DEPENDENT = {"nonzero", "argwhere", "masked_select", "unique", "unique_consecutive",
                  "_unique", "_unique2", "unique_dim", "item", "_local_scalar_dense", "tolist",
                  "bincount", "histc", "masked_scatter", "nonzero_numpy"}


# --------------------------------------------------------------------------------------------
# Loading and tracing
# --------------------------------------------------------------------------------------------


def load(spec: str, batch: int | None = None, model_args: dict | None = None,
         meta: bool = True):
    """``(model, example_input)`` of ``spec`` in train mode (see the module note)."""
    from explorer.engine.core.models import load_model
    model, x = load_model(spec, batch, model_args, meta=meta)
    model.train()
    return model, x


@functools.cache
def _shape_prop_class():
    """``ShapeProp`` that gives a batch norm's output on meta tensors its input's shape
    directly: torch's meta kernel for it is a Python decomposition, about a second of
    Inception-v3's first capture (imported on first use, as torch.fx's passes are)."""
    from torch.fx.node import map_aggregate
    from torch.fx.passes.shape_prop import ShapeProp

    shaped = tuple(getattr(nn, n) for n in _SHAPED_MODULES)
    funcs = {f for m in (torch, F) for f in (getattr(m, n, None) for n in _SHAPED_FUNCTIONS)
             if f is not None}

    def on_meta(args):
        return bool(args) and isinstance(args[0], torch.Tensor) and \
            args[0].device.type == "meta"

    pool_funcs = {getattr(F, f"{kind}_pool{k}d"): (kind, k) for kind in ("max", "avg")
                  for k in (1, 2, 3)}

    def graded(out, args, mod=None):
        """``out`` requiring grad as the computed output would (an input or a parameter
        does, grad mode on): ShapeProp records it."""
        if out is not None and torch.is_grad_enabled() and out.is_floating_point() and (
                any(isinstance(a, torch.Tensor) and a.requires_grad
                    for a in tree_leaves(args))
                or (mod is not None and any(p.requires_grad for p in mod.parameters()))):
            out.requires_grad_(True)
        return out

    class Prop(ShapeProp):
        def call_module(self, target, args, kwargs):
            mod = self.fetch_attr(target)
            out = None
            if not on_meta(args) or kwargs:
                pass
            elif isinstance(mod, nn.modules.batchnorm._BatchNorm) or type(mod) in shaped:
                out = _empty_like(args[0])       # (exact types: a subclass may differ)
            elif type(mod) is nn.Linear and args[0].dim() >= 1 and \
                    args[0].shape[-1] == mod.in_features and args[0].dtype == mod.weight.dtype:
                out = torch.empty((*args[0].shape[:-1], mod.out_features),
                                  dtype=args[0].dtype, device="meta")
            elif type(mod) in (nn.Conv1d, nn.Conv2d, nn.Conv3d):
                out = _meta_conv(args[0], mod)
            elif type(mod) in _POOLS:
                out = _meta_pool(args[0], _POOLS[type(mod)], mod.kernel_size, mod.stride,
                                 mod.padding, getattr(mod, "dilation", 1), mod.ceil_mode,
                                 getattr(mod, "return_indices", False))
            elif type(mod) in (nn.AdaptiveAvgPool1d, nn.AdaptiveAvgPool2d,
                               nn.AdaptiveAvgPool3d):
                n = {nn.AdaptiveAvgPool1d: 1, nn.AdaptiveAvgPool2d: 2}.get(type(mod), 3)
                out = _meta_adaptive(args[0], mod.output_size, n)
            if out is not None:
                return graded(out, args, mod)
            return super().call_module(target, args, kwargs)

        def call_function(self, target, args, kwargs):
            out = None
            if target in funcs and on_meta(args):
                out = _empty_like(args[0])
            elif target is torch.cat:
                out = _meta_cat(*args, **kwargs)
            elif target in (operator.add, torch.add, operator.mul, torch.mul) and not kwargs \
                    and len(args) == 2:
                out = _meta_same(*args)
            elif target in pool_funcs and on_meta(args):
                out = _pool_call(*pool_funcs[target], args, kwargs)
            if out is not None:
                return graded(out, args)
            return super().call_function(target, args, kwargs)

        def call_method(self, target, args, kwargs):
            if target in _SHAPED_FUNCTIONS and on_meta(args):
                return graded(_empty_like(args[0]), args)
            return super().call_method(target, args, kwargs)

        def run_node(self, n):
            """``ShapeProp.run_node`` without fake tensors, which imports torch's symbolic
            shapes (sympy, 0.5 s of a first trace) for them on every call: the same
            ``tensor_meta`` and ``type`` on the node, the same error."""
            if self.fake_mode is not None:
                return super().run_node(n)
            try:
                result = torch.fx.Interpreter.run_node(self, n)
            except Exception as e:
                raise RuntimeError(f"ShapeProp error for: node={n.format_node()} with "
                                   f"meta={n.meta}") from e
            found = []

            def tensor_meta(obj):
                if isinstance(obj, torch.Tensor):
                    found.append(True)
                    return _tensor_metadata(obj)
                return obj
            meta = map_aggregate(result, tensor_meta)
            if found:
                n.meta["tensor_meta"] = meta
            n.meta["type"] = type(result)
            return result
    return Prop


def _tensor_metadata(t: torch.Tensor):
    """torch.fx's ``TensorMetadata`` of ``t``, as ``ShapeProp`` records it, with the memory
    format from the tensor's own (C++) contiguity flags: torch's Python helper for it calls
    ``torch._check``, whose first call imports sympy (0.5 s of a first trace).  Plain dense
    tensors only; others go through torch's own function."""
    from torch.fx.passes.shape_prop import TensorMetadata, _extract_tensor_metadata
    if t.is_quantized or t.layout != torch.strided:
        return _extract_tensor_metadata(t)
    fmt = None
    for query in (torch.contiguous_format, torch.channels_last, torch.channels_last_3d):
        if (query is torch.channels_last and t.dim() != 4) or \
                (query is torch.channels_last_3d and t.dim() != 5):
            continue
        if t.is_contiguous(memory_format=query):
            fmt = query
            break
    return TensorMetadata(t.shape, t.dtype, t.requires_grad, t.stride(), fmt, False, {})


def _empty_like(x: torch.Tensor) -> torch.Tensor:
    """``torch.empty_like(x)`` on meta: for a contiguous ``x`` by ``torch.empty``, since
    ``empty_like``'s meta kernel is a Python reference (see :data:`_SHAPED_MODULES`)."""
    if x.is_contiguous():
        return torch.empty(x.shape, dtype=x.dtype, device=x.device)
    return torch.empty_like(x)


def _meta_same(a, b):
    """``a + b`` / ``a * b`` of two meta tensors of one shape and dtype (a residual sum), or
    ``None`` (broadcasting, type promotion, scalars: torch's own rules)."""
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and \
            a.device.type == b.device.type == "meta" and a.shape == b.shape and \
            a.dtype == b.dtype and a.is_contiguous() and b.is_contiguous():
        return torch.empty(a.shape, dtype=a.dtype, device="meta")
    return None


def _meta_conv(x, conv):
    """A convolution's output on a meta tensor (``[N,] C, *spatial`` in, the usual output
    size per spatial axis), or ``None`` when unsure."""
    k = len(conv.kernel_size)
    if x.dim() not in (k + 1, k + 2) or x.shape[-k - 1] != conv.in_channels or \
            x.dtype != conv.weight.dtype:
        return None
    pad = conv.padding
    if isinstance(pad, str):
        if pad == "same":
            size = list(x.shape[-k:])
        elif pad == "valid":
            pad = (0,) * k
        else:
            return None
    if not isinstance(pad, str):
        size = [(n + 2 * p - d * (kk - 1) - 1) // s + 1 for n, p, d, kk, s in
                zip(x.shape[-k:], pad, conv.dilation, conv.kernel_size, conv.stride)]
    if any(n < 1 for n in size):
        return None
    return torch.empty((*x.shape[:-k - 1], conv.out_channels, *size), dtype=x.dtype,
                       device="meta")


#: pooling modules -> spatial dimensions
_POOLS = {nn.MaxPool1d: 1, nn.MaxPool2d: 2, nn.MaxPool3d: 3,
          nn.AvgPool1d: 1, nn.AvgPool2d: 2, nn.AvgPool3d: 3}


def _pool_call(kind: str, k: int, args, kwargs):
    """``F.max_poolKd`` / ``F.avg_poolKd`` (``kind``) on a meta tensor, by their signatures
    (see :func:`_meta_pool`)."""
    names = (("input", "kernel_size", "stride", "padding", "dilation", "ceil_mode",
              "return_indices") if kind == "max" else
             ("input", "kernel_size", "stride", "padding", "ceil_mode", "count_include_pad",
              "divisor_override"))
    if len(args) > len(names) or set(kwargs) - set(names):
        return None
    got = {**dict(zip(names, args)), **kwargs}
    if "kernel_size" not in got:
        return None
    return _meta_pool(got["input"], k, got["kernel_size"], got.get("stride"),
                      got.get("padding", 0), got.get("dilation", 1),
                      bool(got.get("ceil_mode", False)), bool(got.get("return_indices", False)))


def _meta_pool(x, k: int, kernel, stride, padding, dilation, ceil_mode: bool,
               indices: bool):
    """A ``k``-d pool's output on a meta tensor, as torch computes its size (``ceil_mode``
    included), or ``None`` when unsure (indices asked for, odd arguments)."""
    def tup(v, default=None):
        if v is None or (isinstance(v, (tuple, list)) and len(v) == 0):
            v = default
        if isinstance(v, int):
            return (v,) * k
        return tuple(v) if isinstance(v, (tuple, list)) and len(v) == k and \
            all(isinstance(i, int) for i in v) else None
    kernel = tup(kernel)
    stride, padding, dilation = tup(stride, kernel), tup(padding), tup(dilation)
    if indices or None in (kernel, stride, padding, dilation) or x.dim() not in (k + 1, k + 2):
        return None
    size = []
    for n, kk, s, p, d in zip(x.shape[-k:], kernel, stride, padding, dilation):
        num = n + 2 * p - d * (kk - 1) - 1 + (s - 1 if ceil_mode else 0)
        out = num // s + 1
        if ceil_mode and (out - 1) * s >= n + p:
            out -= 1
        if out < 1 or p > kk // 2:
            return None
        size.append(out)
    return torch.empty((*x.shape[:-k], *size), dtype=x.dtype, device="meta")


def _meta_cat(tensors, dim=0, *, out=None):
    """``torch.cat`` of meta tensors of one dtype and rank, or ``None`` (torch's meta kernel
    for it is a Python reference, see :data:`_SHAPED_MODULES`)."""
    ts = list(tensors) if isinstance(tensors, (list, tuple)) else []
    if out is not None or not ts or not all(isinstance(t, torch.Tensor) and
                                            t.device.type == "meta" for t in ts):
        return None
    first = ts[0]
    if any(t.dtype != first.dtype or t.dim() != first.dim() for t in ts) or first.dim() == 0:
        return None
    d = dim % first.dim()
    shape = list(first.shape)
    if any(list(t.shape[:d]) + list(t.shape[d + 1:]) != shape[:d] + shape[d + 1:]
           for t in ts):
        return None
    shape[d] = sum(t.shape[d] for t in ts)
    return torch.empty(shape, dtype=first.dtype, device="meta")


def _meta_adaptive(x, size, k: int):
    """An ``k``-d adaptive average pool's output on a meta tensor: the leading dimensions
    kept, the last ``k`` set to ``size`` (``None``: the input's), or ``None`` when unsure."""
    size = tuple(size) if isinstance(size, (tuple, list)) else (size,) * k
    if len(size) != k or x.dim() < k + 1:
        return None
    lead, tail = list(x.shape[:-k]), list(x.shape[-k:])
    shape = lead + [t if s is None else int(s) for s, t in zip(size, tail)]
    return torch.empty(shape, dtype=x.dtype, device="meta")


#: modules and functions whose output has their first input's shape and dtype, and whose meta
#: kernel is one of torch's Python references: the first such call imports ``torch._dynamo``
#: (0.6 s; the references are wrapped in ``torch._disable_dynamo``), so on meta tensors their
#: output is made directly
_SHAPED_MODULES = ("ReLU", "ReLU6", "GELU", "SiLU", "Sigmoid", "Tanh", "Hardtanh",
                   "Hardswish", "Dropout", "Dropout2d")
_SHAPED_FUNCTIONS = ("relu", "relu_", "relu6", "gelu", "silu", "sigmoid", "tanh",
                     "hardtanh", "hardswish", "dropout")


def _shape_prop(gm, x):
    """Shapes on every node (``ShapeProp``; fake tensors for a real input).  On failure the
    exception gets ``.node``, the node it failed on; ShapeProp's own traceback print is
    swallowed (the caller turns the failure into one line)."""
    fake = None
    if x.device.type != "meta":
        from torch._subclasses.fake_tensor import FakeTensorMode
        fake = FakeTensorMode(allow_non_fake_inputs=True)
    sp = _shape_prop_class()(gm, fake_mode=fake)
    current = []
    run_node = sp.run_node

    def tracked(n):
        current[:] = [n]
        return run_node(n)
    sp.run_node = tracked
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            sp.propagate(x)
    except Exception as exc:  # noqa: BLE001 - re-raised, naming the node
        exc.node = current[0] if current else None
        raise


def _fx_trace(model: nn.Module, name: str, stack_traces: bool = True) -> torch.fx.GraphModule:
    """``torch.fx.symbolic_trace`` recording each node's source lines (``stack_trace``) unless
    ``stack_traces`` is false (the first recording in a process costs about a second)."""
    tracer = torch.fx.Tracer()
    tracer.record_stack_traces = stack_traces
    graph = tracer.trace(model)
    return torch.fx.GraphModule(tracer.root, graph, type(model).__name__)


def capture(model: nn.Module, x: torch.Tensor, name: str = "model", stack_traces: bool = True):
    """Trace ``model`` (put in train mode) on ``x``: ``(GraphModule, source)`` with shapes
    on every node.

    Tries ``torch.fx`` symbolic tracing first; data-dependent Python control flow and other
    trace errors fall back to ``torch.export.export``.  A data-dependent op raises
    :class:`DataDependent` naming it and the user's line; when both tracers fail,
    :class:`UnsupportedModel` quotes both reasons.  ``stack_traces=False`` leaves the fx
    nodes without source lines (faster; errors then name no line: the importer traces again
    with them to report one).
    """
    with TRACE_LOCK:
        return _capture(model, x, name, stack_traces)


def _capture(model, x, name, stack_traces):
    model.train()
    try:
        gm = _fx_trace(model, name, stack_traces)
    except Exception as fx_exc:  # noqa: BLE001
        return _export(model, x, name, fx_exc)
    check_data_dependent(gm, name)
    try:
        _shape_prop(gm, x)
    except Exception as exc:  # noqa: BLE001
        node = getattr(exc, "node", None)
        if node is not None and node.op == "call_function" and _is_getitem(node) and \
                data_dependent_error(exc):
            raise DataDependent(data_dependent_message(name, "boolean-mask indexing", node_line(node)))
        return _export(model, x, name, exc)
    return gm, "fx"


def _is_getitem(node) -> bool:
    import operator
    return node.target is operator.getitem


def _register_outputs(model, x) -> bool:
    """Register with pytree every ``dict`` subclass in the model's output that it does not
    know (a ``ModelOutput``-like ``OrderedDict`` subclass), so ``torch.export`` can return
    it; ``True`` if any was registered.  The forward runs on fake (or meta) tensors."""
    from torch.utils import _pytree as pytree
    try:
        if x.device.type == "meta":
            out = model(x)
        else:
            from torch._subclasses.fake_tensor import FakeTensorMode
            with FakeTensorMode(allow_non_fake_inputs=True):
                out = model(x)
    except Exception:  # noqa: BLE001 - the export error will be reported instead
        return False
    found = False
    todo = [out]
    while todo:
        o = todo.pop()
        if isinstance(o, dict):
            cls = type(o)
            if cls not in pytree.SUPPORTED_NODES:
                pytree.register_pytree_node(
                    cls, lambda d: (list(d.values()), list(d.keys())),
                    lambda vals, keys, cls=cls: cls(zip(keys, vals)),
                    serialized_type_name=f"{cls.__module__}.{cls.__qualname__}")
                found = True
            todo.extend(o.values())
        elif isinstance(o, (list, tuple)):
            todo.extend(o)
    return found


#: ``1``: let torch's and Transformers' own log lines through while tracing (``--verbose``)
VERBOSE_ENV = "EXPLORER_VERBOSE"


@contextlib.contextmanager
def quiet_libraries(stderr: bool = False):
    """Silence torch's and Transformers' loggers while tracing, their errors too (fake
    tensors log every operator they cannot run as an ERROR with its traceback, before the
    exception we report): a model that cannot be traced is reported in our one line, not
    after dozens of their warnings and graph dumps (``$EXPLORER_VERBOSE=1``, ``explorer
    --verbose``: keep them).  ``stderr``:
    also swallow what is printed there (``torch.export`` prints the graph it failed on)."""
    if os.environ.get(VERBOSE_ENV, "") not in ("", "0"):
        yield
        return
    if stderr:
        with contextlib.redirect_stderr(io.StringIO()), quiet_libraries():
            yield
        return
    names = [n for n in list(logging.Logger.manager.loggerDict)
             if n.split(".")[0] in ("torch", "transformers")] + ["torch", "transformers"]
    saved = {}
    for n in names:
        lg = logging.getLogger(n)
        saved[n] = lg.level
        if lg.level < logging.CRITICAL:
            lg.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        for n, level in saved.items():
            logging.getLogger(n).setLevel(level)


def _export(model, x, name, fx_exc):
    try:
        try:
            with quiet_libraries(stderr=True):
                ep = torch.export.export(model, (x,))
        except Exception as first:  # noqa: BLE001
            if "pytree" not in str(first) or not _register_outputs(model, x):
                raise
            with quiet_libraries(stderr=True):
                ep = torch.export.export(model, (x,))
    except Exception as ex_exc:  # noqa: BLE001
        where = user_line(ex_exc)
        if data_dependent_error(ex_exc):          # a data-dependent op, or a branch on values
            raise DataDependent(data_dependent_message(name, op_in(where), where)) from None
        raise UnsupportedModel(
            f"{name}: torch.fx could not trace the model ({type(fx_exc).__name__}: "
            f"{_first(fx_exc)}) and torch.export failed too ({type(ex_exc).__name__}: "
            f"{_first(ex_exc)}){_at(where)}. Make forward() traceable: avoid "
            f"Python control flow on tensor values") from None
    gm = ep.module()
    check_data_dependent(gm, name)
    return gm, "export"


def _first(exc) -> str:
    s = str(exc).strip()
    return s.splitlines()[0] if s else ""


def _at(where) -> str:
    return f" at {where}" if where else ""


def data_dependent_error(exc) -> bool:
    """Does ``exc`` (or its cause) come from a value-dependent shape or branch?"""
    seen = 0
    while exc is not None and seen < 8:
        name = type(exc).__name__
        text = str(exc)
        if "DataDependent" in name or "data-dependent" in text or "data dependent" in text \
                or "nonzero" in text or "Unbacked" in name or "unbacked" in text:
            return True
        exc = exc.__cause__ or exc.__context__
        seen += 1
    return False


def op_in(where: str | None) -> str | None:
    """The data-dependent op named in a source line, if any."""
    if not where:
        return None
    for op in sorted(DATA_DEPENDENT, key=len, reverse=True):
        if re.search(rf"\b{op}\s*\(", where):
            return op
    if re.search(r"\[[^\]]*(>|<|==|!=|mask)[^\]]*\]", where):
        return "boolean-mask indexing"
    return None


def data_dependent_message(name, op, where) -> str:
    """One line: the data-dependent op (``None``: a branch or Python value taken from a
    tensor) and the user's line."""
    if op is None:
        return (f"{name}: data-dependent control flow{_at(where)}: a Python branch or value "
                f"depends on tensor values, which no method can plan for; compute both "
                f"branches with torch.where or use fixed shapes instead")
    return (f"{name}: data-dependent op {op!r}{_at(where)}: its result's shape depends on "
            f"tensor values, which no method can plan for; compute it with fixed shapes "
            f"(e.g. masks multiplied in, torch.where) instead")


def check_data_dependent(gm, name: str = "model") -> None:
    """Raise :class:`DataDependent` for the first data-dependent op of a traced graph."""
    free_unbacked_symbols = None     # imported only for traces with values (sympy: 0.5 s)
    for node in gm.graph.nodes:
        if node.op not in ("call_function", "call_method"):
            continue
        op = target_name(node, gm)
        if op in DATA_DEPENDENT:
            raise DataDependent(data_dependent_message(name, op, node_line(node)))
        val = node.meta.get("val")
        if val is not None and free_unbacked_symbols is None:
            from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols
        if val is not None and free_unbacked_symbols(val):    # a size only values decide
            if op in ("index", "getitem", "index_put", "index_put_"):
                op = "boolean-mask indexing"
            raise DataDependent(data_dependent_message(name, op, node_line(node)))


# --------------------------------------------------------------------------------------------
# Deterministic numerics
# --------------------------------------------------------------------------------------------

_DROPOUT = {"dropout", "dropout_", "dropout1d", "dropout2d", "dropout3d", "alpha_dropout",
            "alpha_dropout_", "feature_dropout", "feature_dropout_", "feature_alpha_dropout",
            "feature_alpha_dropout_", "dropout.default", "feature_dropout.default",
            "alpha_dropout.default"}


class deterministic(TorchFunctionMode):
    """Context: dropout is the identity (``native_dropout`` gives an all-ones mask, its
    backward no scale; a dropout traced as ``bernoulli_(p)`` then ``div_(p)`` gets the mask
    ``p``); with ``running_stats`` BatchNorm uses its running statistics and does
    not update them.  See the module note for who uses which."""

    def __init__(self, running_stats: bool = True):
        super().__init__()
        self.running_stats = running_stats

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        name = getattr(func, "__name__", "")
        if name in _DROPOUT:
            return args[0] if args else kwargs["input"]
        if name == "native_dropout.default":
            x = args[0]
            return x.clone(), torch.ones_like(x, dtype=torch.bool)
        if name == "native_dropout_backward.default":
            return args[0] * args[1]
        if name.startswith(("bernoulli_.", "bernoulli.p")) and args:
            # dropout traced as bernoulli_ + div_ (p kept): the mask's expected value, so
            # the dropout is the identity here too
            p = args[1] if len(args) > 1 else kwargs.get("p", 0.5)
            if isinstance(p, (int, float)):
                if name.startswith("bernoulli_."):
                    return args[0].fill_(p)
                return torch.full_like(args[0], p)
        if func is F.scaled_dot_product_attention:
            if len(args) > 4:
                args = args[:4] + (0.0,) + tuple(args[5:])
            kwargs["dropout_p"] = 0.0
        elif self.running_stats and func is F.batch_norm:
            a = list(args) + [None] * (8 - len(args))
            names = ("input", "running_mean", "running_var", "weight", "bias", "training",
                     "momentum", "eps")
            got = dict(zip(names, a))
            got.update(kwargs)
            if got["running_mean"] is not None and got["running_var"] is not None:
                got["training"] = False
                got["eps"] = 1e-5 if got["eps"] is None else got["eps"]
                got["momentum"] = 0.1 if got["momentum"] is None else got["momentum"]
            return func(**got)
        return func(*args, **kwargs)


def _dropout_identity(x, p=0.5, train=None):
    """``aten.native_dropout`` in the deterministic numerics: the input and an all-ones mask."""
    return x.clone(), torch.ones_like(x, dtype=torch.bool)


def _dropout_identity_backward(grad, mask, scale=1.0):
    """``aten.native_dropout_backward`` in the deterministic numerics (no scale)."""
    return grad * mask


def _bernoulli_expected(x, p=None, *args, **kwargs):
    """``aten.bernoulli`` / ``bernoulli_`` in the deterministic numerics: the mask's expected
    value (``p``, or the input's probabilities), as :class:`deterministic` gives it - a dropout
    traced as ``bernoulli_(p)`` then ``div_(p)`` is the identity."""
    p = kwargs.get("p", p)
    if p is None:                                 # bernoulli(probabilities)
        return x.clone()
    if not isinstance(p, (int, float)):
        raise UnsupportedModel("bernoulli with a tensor of probabilities draws random numbers "
                               "the deterministic numerics cannot replace")
    return torch.full_like(x, float(p))


def _bernoulli_expected_(x, p=0.5, *args, **kwargs):
    """In-place :func:`_bernoulli_expected`."""
    return x.copy_(_bernoulli_expected(x, kwargs.get("p", p)))


#: aten call -> its replacement in the deterministic numerics, for code that runs a traced
#: step's aten calls directly (no :class:`deterministic` mode and its cost per call): the
#: placement runtime's compiled programs and the per-operator profile
DETERMINISTIC_ATEN = {"native_dropout": _dropout_identity,
                      "native_dropout_backward": _dropout_identity_backward,
                      "bernoulli": _bernoulli_expected,
                      "bernoulli_": _bernoulli_expected_}


# --------------------------------------------------------------------------------------------
# Outputs and the loss
# --------------------------------------------------------------------------------------------


def float_leaves(out) -> list:
    """Every floating-point tensor of an output (tensor, tuple, list, dict, ``ModelOutput``)."""
    if isinstance(out, dict) and not type(out).__module__.startswith("builtins"):
        out = dict(out)             # an OrderedDict subclass pytree may not know: its items
    return [t for t in tree_leaves(out) if torch.is_tensor(t) and t.is_floating_point()]


def loss_of(out, loss_fn=None):
    """The training loss of a model output: ``loss_fn(out)`` when given, else ``Σ mean(o²)``
    over :func:`float_leaves`.  Raises :class:`UnsupportedModel` when there is nothing to
    train on."""
    if loss_fn is not None:
        loss = loss_fn(out)
        if not torch.is_tensor(loss) or loss.numel() != 1:
            raise UnsupportedModel(f"the model file's loss(output) must return a one-element "
                                   f"tensor, got {type(loss).__name__}"
                                   + (f" of shape {tuple(loss.shape)}"
                                      if torch.is_tensor(loss) else ""))
        return loss.reshape(())
    leaves = float_leaves(out)
    if not leaves:
        raise UnsupportedModel(f"the model's output ({type(out).__name__}) holds no "
                               f"floating-point tensor: there is no loss to train")
    loss = leaves[0].pow(2).mean()
    for o in leaves[1:]:
        loss = loss + o.pow(2).mean()
    return loss


def loss_function(spec: str):
    """The module-level ``loss(output)`` of a ``file.py:function`` model, or ``None``."""
    if not isinstance(spec, str) or ":" not in spec:
        return None
    path, _, func = spec.rpartition(":")
    p = Path(path)
    if not p.is_file():
        return None
    name = f"_explorer_user_{abs(hash(str(p.resolve())))}"
    mod = sys.modules.get(name)
    if mod is None:
        from explorer.engine.core.models import load_function
        load_function(path, func)
        mod = sys.modules.get(name)
    fn = getattr(mod, "loss", None)
    return fn if callable(fn) and func != "loss" else None


def parameter_count(model: nn.Module, trainable_only: bool = False) -> int:
    """``sum(p.numel() for p in model.parameters())`` (tied weights once)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable_only)


# --------------------------------------------------------------------------------------------
# The user's line
# --------------------------------------------------------------------------------------------

_FRAME = re.compile(r'File "([^"]+)", line (\d+), in [^\n]*\n\s*([^\n]*)')


@functools.cache
def _library_dirs() -> tuple:
    dirs = [Path(torch.__file__).resolve().parent, Path(__file__).resolve().parents[2]]
    for key in ("stdlib", "platstdlib"):
        with contextlib.suppress(KeyError, TypeError):
            dirs.append(Path(sysconfig.get_paths()[key]).resolve())
    return tuple(str(d) + "/" for d in dirs)


def _is_user(filename: str) -> bool:
    if filename.startswith("<"):
        return False
    try:
        f = str(Path(filename).resolve())
    except OSError:
        f = filename
    lib = _library_dirs()
    if any(f.startswith(d) for d in lib):
        return "site-packages" in f and not f.startswith(lib[0]) and not f.startswith(lib[1])
    return True


def _frames_of(obj) -> list:
    """``[(file, line, code)]`` from an fx node's stack trace or an exception (its
    traceback, its message's ``File "...", line N`` quotes, its causes)."""
    import traceback
    out = []
    if isinstance(obj, torch.fx.Node):
        text = obj.meta.get("stack_trace") or ""
        return [(f, int(n), c.strip()) for f, n, c in _FRAME.findall(text)]
    seen = 0
    exc = obj
    while isinstance(exc, BaseException) and seen < 8:
        out += [(f.filename, f.lineno, (f.line or "").strip())
                for f in traceback.extract_tb(exc.__traceback__)]
        out += [(f, int(n), c.strip()) for f, n, c in _FRAME.findall(str(exc))]
        exc = exc.__cause__ or exc.__context__
        seen += 1
    return out


def user_line(obj) -> str | None:
    """``file:line: code`` of the innermost frame of the user's code (not torch, not the
    explorer, not the standard library) in a node's stack trace or an exception."""
    frames = [fr for fr in _frames_of(obj) if _is_user(fr[0])]
    if not frames:
        return None
    f, n, code = frames[-1]
    return f"{f}:{n}: {code}" if code else f"{f}:{n}"


def node_line(node) -> str | None:
    """:func:`user_line` of an fx node (``None`` when it has no recorded stack)."""
    return user_line(node) if isinstance(node, torch.fx.Node) else None


@functools.cache
def _function_names():
    """Callables of torch, torch.nn.functional, operator and Tensor -> their names (built
    once per process: a traced call's target is looked up here)."""
    names = {}
    for mod in (torch, F, operator, torch.Tensor):
        for k in dir(mod):
            try:
                v = getattr(mod, k)
            except Exception:  # noqa: BLE001
                continue
            if callable(v):
                try:
                    names.setdefault(v, k.strip("_") if mod is operator else k)
                except TypeError:
                    pass
    return names


def target_name(node, gm) -> str:
    t = node.target
    if node.op == "call_method":
        return t
    if isinstance(t, torch._ops.OpOverload):
        return t._schema.name.split("::")[1]
    if isinstance(t, torch._ops.OpOverloadPacket):
        return t._qualified_op_name.split("::")[1]
    try:
        name = _function_names().get(t)
    except TypeError:
        name = None
    return name or getattr(t, "__name__", str(t))

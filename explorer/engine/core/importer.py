"""Import a PyTorch model into a :class:`LayerGraph`.

A model is named either by a built-in example (``vgg16``) or as ``path/to/file.py:function``
where ``function()`` returns ``(torch.nn.Module, example_input)``; the input's first dimension
is the global batch.  Models are built on the ``meta`` device when possible, so importing even
a 1-billion-parameter network allocates nothing.

Capture is :mod:`explorer.engine.core.capture`'s, in train mode (the same graph the runtime
executes): ``torch.fx`` symbolic tracing with shape propagation, falling back to
``torch.export`` when fx cannot follow the model.  A trainable parameter read as an activation
(a class token) becomes a ``param`` layer that owns it, and so does a constant (a buffer, position
ids) that an op with a trainable parameter reads (an embedding indexed by position ids); every
import checks that the layers own every parameter (:func:`import_model`).
Element-wise activations, BatchNorm and dropout fold into the layer producing their input (the
paper's layers are "conv + BN + ReLU") when nothing else reads that layer's output (a value read
twice, like the projection in a written-out tanh GELU, gets an ``eltwise`` layer per op); view
ops (flatten, view, transpose, select, slice, split/chunk/unbind) fold onto the consuming edge as
transforms so geometry can map regions through them.  Other values computed without the model
input (causal masks, rotary ``cos``/``sin`` tables, from buffers, ``arange``, ``triu``,
``full_like``) are constants, never layers: the element-wise ops, attention and ``baddbmm``
that read them record it, and the runtime evaluates them once and cuts each device's box out.
Transformer ops: ``addmm``/``x @ W`` with a parameter (Hugging Face ``Conv1D``) is a ``linear``
layer with ``attrs["weight_t"]``; ``nn.MultiheadAttention`` an ``mha`` layer; RMSNorm a ``norm``
(module/functional) or its written-out ``reduce`` + ``eltwise`` layers.  Anything else that has
no rule raises :class:`UnsupportedModel` naming the op, the node and the user's line.
"""

from __future__ import annotations

import json
import math
import operator
from dataclasses import dataclass
from pathlib import Path

import networkx as nx
import torch
import torch.fx
import torch.nn as nn
import torch.nn.functional as F

from explorer.errors import UnsupportedModel
from explorer.engine.core.capture import (  # noqa: F401 - re-exported for the importer's users
    capture,
    node_line,
    parameter_count,
    target_name,
)
from explorer.engine.core.models import load_function, load_model, resize_batch  # noqa: F401
from explorer.engine.core.layergraph import Edge, Layer, LayerGraph, graph_digest

# --------------------------------------------------------------------------------------------
# Values flowing through the traced graph
# --------------------------------------------------------------------------------------------


@dataclass
class _Val:
    """A traced value: a (view of a) layer output, a parameter, a tuple, or a constant."""
    kind: str                       # "tensor" | "param" | "tuple" | "const"
    layer: str | None = None        # producing layer (tensor / tuple)
    transforms: tuple = ()          # consumer -> producer view ops
    shape: tuple = ()
    param: str | None = None        # qualified parameter name
    items: tuple = ()               # for tuples: _Val per item
    value: object = None            # for constants


_ACTIVATIONS = {
    "relu", "relu_", "relu6", "gelu", "sigmoid", "sigmoid_", "tanh", "tanh_", "silu",
    "silu_", "leaky_relu", "leaky_relu_", "elu", "elu_", "hardswish", "hardtanh", "hardtanh_",
    "mish", "softplus", "hardsigmoid", "exp", "log", "sqrt", "rsqrt", "neg", "abs", "erf",
}
IDENTITY_OPS = {"dropout", "dropout_", "feature_dropout", "alpha_dropout", "identity",
             "contiguous", "clone", "detach", "to", "type_as", "float", "alias",
             "lift_fresh_copy", "_assert_tensor_metadata", "_to_copy"}
#: Element-wise ops whose other operands may be tensors, constants or parameters (masks,
#: rotary tables): op name -> the ``fn`` recorded on an ``eltwise`` layer.
_MIXED = {"where": "where", "masked_fill": "masked_fill", "masked_fill_": "masked_fill",
          "lt": "lt", "le": "le", "gt": "gt", "ge": "ge", "eq": "eq", "ne": "ne",
          "clamp": "clamp", "clamp_min": "clamp", "clamp_max": "clamp"}
#: Ops that read only the shape, dtype or device of their tensor argument: their result is a
#: constant the runtime recomputes (e.g. ``torch.full_like(scores, -inf)``).
_LIKE = {"zeros_like", "ones_like", "full_like", "empty_like", "new_zeros", "new_ones",
         "new_full", "new_empty", "new_tensor"}
_BINARY = {"add": "add", "add_": "add", "iadd": "add", "sub": "sub", "sub_": "sub",
           "mul": "mul", "mul_": "mul", "imul": "mul", "truediv": "div", "div": "div",
           "div_": "div", "rsub": "sub", "pow": "pow", "maximum": "max", "minimum": "min"}
_VIEWS = {"view", "reshape", "flatten", "unflatten", "transpose", "permute", "t",
          "unsqueeze", "squeeze", "_unsafe_view", "expand_as_view"}
#: Ops that repeat a tensor's elements without computing (grouped-query attention's key/value
#: heads): edge transforms, an ``expand`` between reshapes (see :meth:`_Importer.view_op`).
_REPEATS = {"expand", "expand_as", "broadcast_to", "repeat_interleave", "repeat"}
_MODULE_OPS = {
    nn.Conv1d: "conv", nn.Conv2d: "conv", nn.Conv3d: "conv",
    nn.Linear: "linear", nn.MaxPool1d: "maxpool", nn.MaxPool2d: "maxpool",
    nn.AvgPool1d: "avgpool", nn.AvgPool2d: "avgpool", nn.AdaptiveAvgPool2d: "adaptive",
    nn.AdaptiveAvgPool1d: "adaptive", nn.AdaptiveMaxPool2d: "adaptive",
    nn.AdaptiveMaxPool1d: "adaptive",
    nn.BatchNorm1d: "batchnorm", nn.BatchNorm2d: "batchnorm", nn.BatchNorm3d: "batchnorm",
    nn.LayerNorm: "layernorm", nn.Embedding: "embedding", nn.LSTMCell: "lstm_cell",
    nn.RMSNorm: "layernorm",
    nn.Softmax: "softmax", nn.LogSoftmax: "softmax", nn.Flatten: "flatten",
    nn.Dropout: "dropout", nn.Dropout2d: "dropout", nn.Identity: "identity",
    nn.Upsample: "upsample",
}
_ACT_MODULES = (nn.ReLU, nn.ReLU6, nn.GELU, nn.Sigmoid, nn.Tanh, nn.SiLU, nn.LeakyReLU,
                nn.ELU, nn.Hardswish, nn.Hardtanh, nn.Mish, nn.Softplus, nn.Hardsigmoid)


def _default_axes(rank: int) -> tuple:
    return {0: (), 1: ("n",), 2: ("n", "c"), 3: ("n", "l", "c"), 4: ("n", "c", "h", "w"),
            5: ("n", "c", "-", "h", "w")}.get(rank, ("n",) + ("-",) * (rank - 1))


def _tup(v, n):
    if isinstance(v, (list, tuple)):
        v = tuple(int(x) for x in v)
        return v if len(v) == n else v * n if len(v) == 1 else v
    return (int(v),) * n


# --------------------------------------------------------------------------------------------
# The importer
# --------------------------------------------------------------------------------------------


def _arg_nodes(a) -> list:
    """The fx nodes inside a (nested) argument: lists, tuples, dicts."""
    if isinstance(a, torch.fx.Node):
        return [a]
    if isinstance(a, (list, tuple)):
        return [n for x in a for n in _arg_nodes(x)]
    if isinstance(a, dict):
        return [n for x in a.values() for n in _arg_nodes(x)]
    return []


def _node_dtype(node):
    tm = node.meta.get("tensor_meta")
    if tm is not None and hasattr(tm, "dtype"):
        return tm.dtype
    v = node.meta.get("val")
    return v.dtype if isinstance(v, torch.Tensor) else None


class _Importer:
    def __init__(self, gm: torch.fx.GraphModule, name: str, batch: int, source: str):
        self.gm = gm
        self.graph = LayerGraph(name, batch, source)
        self.vals: dict = {}
        self.mods = dict(gm.named_modules())
        self.params = dict(gm.named_parameters())
        self.trainable = set(self.params)           # parameters (not buffers)
        self.params.update(dict(gm.named_buffers()))
        self.outputs: list = []
        self.trainable = {k for k, _ in gm.named_parameters(remove_duplicate=False)}
        self.layer_nodes: dict = {}     # layer -> fx nodes whose value is (a view of) its output
        self.sources: dict = {}                     # parameter/buffer -> its "param" node

    # -- helpers ---------------------------------------------------------------------------
    def shape_of(self, node):
        if "tensor_meta" in node.meta and hasattr(node.meta["tensor_meta"], "shape"):
            return tuple(int(s) for s in node.meta["tensor_meta"].shape)
        v = node.meta.get("val")
        if isinstance(v, torch.Tensor):
            return tuple(int(s) for s in v.shape)
        return None

    def unsupported(self, node, what):
        raise UnsupportedModel(
            f"unsupported op {what!r} at node {node.name!r}"
            + (f" (module {node.target})" if node.op == "call_module" else "")
            + (f" ({where})" if (where := node_line(node)) else "")
            + ": the layer-wise engine has no geometry rule for it; rewrite that part of the "
              "model with supported ops (conv, linear, pooling, norms, element-wise, concat, "
              "attention, embedding, LSTMCell) or open an issue")

    def val(self, a):
        if isinstance(a, torch.fx.Node):
            return self.vals[a]
        if isinstance(a, (list, tuple)):
            return _Val("tuple", items=tuple(self.val(x) for x in a))
        return _Val("const", value=a)

    def _flatten_vals(self, a):
        if isinstance(a, torch.fx.Node):
            v = self.vals.get(a)
            if v is None:
                return []
            return [v] + [x for it in v.items for x in ([it] if it.kind != "tuple" else [])]
        if isinstance(a, (list, tuple)):
            return [x for it in a for x in self._flatten_vals(it)]
        if isinstance(a, dict):
            return [x for it in a.values() for x in self._flatten_vals(it)]
        return []

    def tensor_args(self, args):
        return [v for v in (self.val(a) for a in args) if v.kind == "tensor"]

    def module_path(self, node):
        if node.op == "call_module":
            return str(node.target)
        st = node.meta.get("nn_module_stack")
        if st:
            path = list(st.values())[-1]
            path = path[0] if isinstance(path, tuple) else path
            return str(path).replace("L['self'].", "").replace("L__self___", "")
        return ""

    def axes_like(self, v: _Val, shape):
        if v is not None and v.kind == "tensor" and not v.transforms:
            lay = self.graph.layer(v.layer)
            if lay.out_shape == tuple(shape):
                return lay.axes
        return _default_axes(len(shape))

    def new_layer(self, node, op, shape, axes, inputs, params=None, attrs=None, flops=0.0):
        lay = Layer(node.name, op, shape, axes,
                    in_shapes=tuple(tuple(v.shape) for v in inputs),
                    params=params or {}, attrs=attrs or {}, flops=float(flops),
                    module=self.module_path(node))
        lay.qualnames = self.qualify(node, lay.params)
        self.graph.add_layer(lay)
        for i, v in enumerate(inputs):
            if v.kind != "tensor":
                raise UnsupportedModel(f"node {node.name!r}: input {i} is not a tensor")
            self.graph.add_edge(Edge(v.layer, node.name, i, tuple(v.transforms)))
        self.vals[node] = _Val("tensor", layer=node.name, shape=tuple(shape))
        return lay

    def fold(self, node, src: _Val, flops_per_elem=1.0, params=None, check=True):
        """Element-wise op: the node's value is its input's value; cost goes to the producer.

        With ``check`` (ops that change the value), folding must leave every other reader of
        the producer's output unaffected (:meth:`_fold_ok`); otherwise, and when a parameter
        or constant operand broadcasts against a view (not the producer's own output), the op
        becomes an ``eltwise`` layer of its own.
        """
        if src.kind != "tensor":
            self.vals[node] = _Val("const")
            return
        if check and (not self._fold_ok(node, src)
                      or (src.transforms and (params or self._const_operands(node)))
                      or tuple(self.shape_of(node) or src.shape) != tuple(src.shape)):
            fn = _BINARY.get(target_name(node, self.gm), target_name(node, self.gm)) \
                if node.op != "call_module" else type(self.mods[node.target]).__name__.lower()
            return self.eltwise(node, [src], fn, params)
        lay = self.graph.layer(src.layer)
        lay.flops += flops_per_elem * math.prod(src.shape)
        lay.folded.append(node.name)
        if params and not src.transforms:
            for k, shp in params.items():
                lay.params[k] = shp
                if k in self.trainable and lay.qualnames is not None:
                    lay.qualnames[k] = k
        self.vals[node] = src

    def _fold_ok(self, node, src: _Val) -> bool:
        """Whether ``node`` may be folded into ``src``'s producing layer: that layer is not a
        model input, nothing reads its output yet (no out-edge), and every other user of the
        fx values standing for it is a view/fold of that same chain or a shape query.  A value
        read twice (``gelu_new``: ``x*0.5``, ``x**3``, ``x + ...``) must not be folded."""
        lay = self.graph.layer(src.layer)
        if lay.op == "input" or self.graph.g.out_degree(src.layer):
            return False
        for v in self.layer_nodes.get(src.layer, ()):
            for u in v.users:
                if u is node:
                    continue
                uv = self.vals.get(u)
                if uv is None or not (uv.kind == "const"
                                      or (uv.kind == "tensor" and uv.layer == src.layer)):
                    return False
        return True

    def _const_operands(self, node) -> list:
        """The fx nodes among ``node``'s arguments that are constant tensors (computed from
        buffers and shapes only: masks, rotary tables); parameters are not among them."""
        out = []
        for a in list(node.args) + list(node.kwargs.values()):
            for x in (a if isinstance(a, (list, tuple)) else [a]):
                if isinstance(x, torch.fx.Node):
                    v = self.vals.get(x)
                    if v is not None and v.kind == "const" and isinstance(v.value, torch.fx.Node):
                        if v.param:
                            where = node_line(x) or node_line(node)
                            raise UnsupportedModel(
                                f"parameters do not reach the layer graph: {v.param}; node "
                                f"{node.name!r} reads it through {x.name!r}, computed without "
                                f"the model input" + (f" ({where})" if where else "")
                                + ": the layer-wise engine cannot train it there")
                        out.append(x)
                    elif v is not None and v.kind == "param" and v.param not in self.trainable:
                        out.append(x)
        return out

    def const(self, node, vals) -> None:
        """A value computed without the model input: a constant tensor (masks, positions,
        rotary tables: ``value`` is the node, which the runtime evaluates from the buffers) or
        a non-tensor (shapes, scalars).  ``param`` names a trainable parameter it reads."""
        shape = self.shape_of(node)
        if shape is None:
            self.vals[node] = _Val("const")
            return
        dep = None
        for v in vals:
            for x in ([v] if v.kind != "tuple" else v.items):
                if x.kind == "param" and x.param in self.trainable:
                    dep = x.param
                elif x.kind == "const" and x.param:
                    dep = x.param
        self.vals[node] = _Val("const", shape=shape, value=node, param=dep)

    def view(self, node, src: _Val, t):
        shape = self.shape_of(node)
        self.vals[node] = _Val("tensor", layer=src.layer, shape=shape,
                               transforms=(t,) + tuple(src.transforms))

    def qualify(self, node, params) -> dict:
        """Layer parameter key -> qualified model parameter name (parameters only, not
        buffers): the key itself, the module's own parameter, or the node's ``get_attr``
        arguments in order."""
        out, todo = {}, []
        for k in params:
            if k in self.params:
                out[k] = k
            elif node.op == "call_module" and f"{node.target}.{k}" in self.params:
                out[k] = f"{node.target}.{k}"
            else:
                todo.append(k)
        if todo:
            attrs = [str(a.target) for a in _arg_nodes(list(node.args) + list(node.kwargs.values()))
                     if a.op == "get_attr" and str(a.target) not in out.values()]
            out.update(zip(todo, attrs))
        return {k: q for k, q in out.items() if q in self.trainable}

    def as_tensor(self, arg, v: _Val) -> _Val:
        """A parameter or buffer read as an activation (a class token, position ids): the
        value of its ``param`` source layer (made once per tensor)."""
        if (v.kind == "const" and v.shape and isinstance(v.value, torch.fx.Node)
                and isinstance(arg, torch.fx.Node) and 0 not in v.shape):
            key = f"const:{v.value.name}"
            if key not in self.sources:
                lay = Layer(v.value.name, "param", tuple(v.shape), _default_axes(len(v.shape)),
                            attrs={"tensor": None, "const": v.value.name},
                            module=self.module_path(v.value))
                lay.qualnames = {}
                self.graph.add_layer(lay)
                self.sources[key] = _Val("tensor", layer=v.value.name, shape=tuple(v.shape))
            return self.sources[key]
        if v.kind != "param" or not isinstance(arg, torch.fx.Node):
            return v
        if v.param not in self.sources:
            self.param_source(arg, v, v.shape)
        return self.sources[v.param]

    def param_source(self, node, v: _Val, shape) -> _Val:
        """A ``param`` layer at ``node`` whose output is parameter/buffer ``v`` broadcast to
        ``shape``: it owns the parameter (costs, sync and memory count it; the runtime
        slices it and back-propagates into it)."""
        shape = tuple(int(s) for s in shape)
        params = {v.param: tuple(v.shape)} if v.param in self.trainable else {}
        lay = Layer(node.name, "param", shape, _default_axes(len(shape)), params=params,
                    attrs={"tensor": v.param}, module=self.module_path(node))
        lay.qualnames = {v.param: v.param} if params else {}
        self.graph.add_layer(lay)
        out = _Val("tensor", layer=node.name, shape=shape)
        if node.op != "get_attr":
            self.vals[node] = out
        if shape == tuple(v.shape):
            self.sources.setdefault(v.param, out)
        return out

    def output_layers(self, node) -> list:
        """Layers holding the model's floating-point outputs (tensors, tuples, dicts)."""
        outs = set()
        for a in _arg_nodes(node.args[0]):
            v = self.vals.get(a)
            dt = _node_dtype(a)
            if v is None or (dt is not None and not dt.is_floating_point):
                continue
            for x in self._flatten_vals(a):
                if x.kind in ("tensor", "tuple") and x.layer:
                    outs.add(x.layer)
        if not outs:
            raise UnsupportedModel(f"{self.graph.model}: the model's output holds no "
                                   f"floating-point tensor: there is no loss to train")
        return sorted(outs)

    # -- main loop -------------------------------------------------------------------------
    def run(self) -> LayerGraph:
        for node in self.gm.graph.nodes:
            if node.op == "placeholder":
                shape = self.shape_of(node)
                if shape is None:
                    self.vals[node] = _Val("const")
                    continue
                axes = _default_axes(len(shape))
                if len(shape) == 2 and not node.meta.get("tensor_meta", node.meta.get(
                        "val")).dtype.is_floating_point:
                    axes = ("n", "l")
                self.graph.add_layer(Layer(node.name, "input", shape, axes, module="input"))
                self.vals[node] = _Val("tensor", layer=node.name, shape=shape)
            elif node.op == "get_attr":
                shape = self.shape_of(node)
                if shape is None:
                    obj = self.params.get(node.target)
                    shape = tuple(obj.shape) if isinstance(obj, torch.Tensor) else ()
                self.vals[node] = _Val("param", param=str(node.target), shape=shape)
            elif node.op == "output":
                self.outputs = self.output_layers(node)
            elif node.op == "call_module":
                self.call_module(node)
            else:
                self.call(node, target_name(node, self.gm))
            v = self.vals.get(node)
            if v is not None and v.kind == "tensor":
                self.layer_nodes.setdefault(v.layer, []).append(node)
        if len(self.graph) == 0:
            raise UnsupportedModel("the model has no tensor input")
        return self.graph

    def call_module(self, node):
        mod = self.mods[node.target]
        args = node.args
        x = self.val(args[0]) if args else None
        if isinstance(mod, nn.modules.conv._ConvTransposeNd):
            return self.conv_transpose_module(node, x, mod)
        if isinstance(mod, nn.MultiheadAttention):
            return self.mha(node, mod)
        if x is not None and (x.kind == "param" or (x.kind == "const" and x.shape)):
            x = self.as_tensor(args[0], x)      # a module applied to a buffer/constant
        for cls, kind in _MODULE_OPS.items():
            if type(mod) is cls or (isinstance(mod, cls) and kind in ("conv", "linear")):
                break
        else:
            if isinstance(mod, _ACT_MODULES):
                return self.fold(node, x)
            if type(mod).__name__ == "_guards_fn" or node.target.startswith("_guards"):
                self.vals[node] = _Val("const")
                return
            return self.unsupported(node, type(mod).__name__)
        p = {k: tuple(v.shape) for k, v in mod.named_parameters(recurse=False)}
        if kind == "conv":
            nsp = mod.weight.dim() - 2
            pad = mod.padding
            if isinstance(pad, str):
                pad = tuple((k - 1) // 2 for k in mod.kernel_size) if pad == "same" else (0,) * nsp
            return self.conv(node, x, p, tuple(mod.kernel_size), tuple(mod.stride), tuple(pad),
                             tuple(mod.dilation), mod.groups)
        if kind == "linear":
            return self.linear(node, x, p)
        if kind in ("maxpool", "avgpool"):
            nsp = len(x.shape) - 2
            k = _tup(mod.kernel_size, nsp)
            s = _tup(mod.stride if mod.stride is not None else mod.kernel_size, nsp)
            d = _tup(getattr(mod, "dilation", 1), nsp)
            return self.pool(node, x, k, s, _tup(mod.padding, nsp), d,
                             "max" if kind == "maxpool" else "avg",
                             bool(getattr(mod, "ceil_mode", False)),
                             bool(getattr(mod, "count_include_pad", True)))
        if kind == "adaptive":
            return self.adaptive(node, x, "max" if "Max" in type(mod).__name__ else "avg")
        if kind == "batchnorm":
            return self.fold(node, x, 4.0, {f"{node.target}.{k}": v for k, v in p.items()},
                             check=False)
        if kind == "layernorm":
            return self.norm(node, x, len(mod.normalized_shape), p)
        if kind == "embedding":
            return self.embedding(node, x, p)
        if kind == "lstm_cell":
            hc = self.val(args[1]) if len(args) > 1 and args[1] is not None else None
            return self.lstm_cell(node, x, hc, p)
        if kind == "softmax":
            return self.softmax(node, x, mod.dim)
        if kind == "flatten":
            return self.flatten(node, x)
        if kind == "upsample":
            return self.upsample(node, x, mod.mode)
        return self.fold(node, x, 0.0, check=False)  # dropout / identity

    def call(self, node, name):
        args, kw = node.args, node.kwargs
        vals = [self.val(a) for a in args]
        tens = [v for v in vals if v.kind == "tensor"]
        params = [v for v in vals if v.kind == "param"]
        if name in ("getattr", "size", "dim", "sym_size", "numel"):
            self.vals[node] = _Val("const")
            return
        if name == "getitem":
            if vals[0].kind == "const" or (vals[0].kind == "param"
                                           and vals[0].param not in self.trainable):
                return self.const(node, vals)   # an item or slice of a constant / buffer
            return self.getitem(node, self.as_tensor(args[0], vals[0]), args[1])
        if name in ("cat", "concat", "concatenate") and vals and vals[0].kind == "tuple":
            dim = kw.get("dim", args[1] if len(args) > 1 else 0)
            raw = list(vals[0].items)
            trained = [v for v in raw if v.kind == "param" and v.param in self.trainable]
            if not trained and not any(v.kind == "tensor" for v in raw):
                return self.const(node, raw)    # a constant made of constants (rotary tables)
            items = [self.as_tensor(a, v) if v in trained else v for a, v in zip(args[0], raw)]
            tensors = [v for v in items if v.kind == "tensor"]
            if len(tensors) == 1 < len(items) and all(
                    v.kind == "tensor" or (v.kind == "const" and v.shape and 0 in v.shape)
                    for v in items):
                self.vals[node] = tensors[0]    # concat with empty tensors (an empty KV cache)
                return
            items = [self.as_tensor(a, v) if v.kind != "tensor" else v
                     for a, v in zip(args[0], items)]
            return self.concat(node, [v for v in items if v.kind == "tensor"], dim)
        if name == "stack" and vals and vals[0].kind == "tuple":
            # stack = concat of the inputs unsqueezed at dim (a reshape on each edge)
            dim = kw.get("dim", args[1] if len(args) > 1 else 0)
            items = [self.as_tensor(a, v) for a, v in zip(args[0], vals[0].items)]
            items = [v for v in items if v.kind == "tensor"]
            if not items:
                return self.const(node, list(vals[0].items))
            dim = dim % (len(items[0].shape) + 1)
            unsq = [_Val("tensor", layer=v.layer, shape=v.shape[:dim] + (1,) + v.shape[dim:],
                         transforms=(("reshape", tuple(v.shape), v.shape[:dim] + (1,)
                                      + v.shape[dim:]),) + tuple(v.transforms)) for v in items]
            return self.concat(node, unsq, dim)
        if (name in ("expand", "expand_as", "broadcast_to") and vals and vals[0].kind == "param"
                and vals[0].param in self.trainable):
            return self.param_source(node, vals[0], self.shape_of(node))
        if not tens and vals and vals[0].kind == "param" and vals[0].param in self.trainable and (
                name in _VIEWS or name in IDENTITY_OPS or name in ("select", "slice")):
            # a view of a trainable parameter (pos_embedding[:, :L]): of its "param" layer
            vals = [self.as_tensor(args[0], vals[0])] + vals[1:]
            tens, params = [vals[0]], [v for v in vals[1:] if v.kind == "param"]
        if not tens and any(v.kind == "param" and v.param in self.trainable for v in vals):
            # an op of a trainable parameter on constants (an embedding indexed by position
            # ids): the constants become "param" layers so the op is a layer that owns it
            vals = [self.as_tensor(a, v) if (v.kind == "const" and v.shape) or (
                        v.kind == "param" and v.param not in self.trainable) else v
                    for a, v in zip(args, vals)]
            tens = [v for v in vals if v.kind == "tensor"]
            params = [v for v in vals if v.kind == "param"]
        if not tens or name in _LIKE:
            # shape arithmetic, constants, ops on buffers only (e.g. num_batches_tracked += 1)
            return self.const(node, vals + [self.val(a) for a in kw.values()])
        x = tens[0]
        if name in IDENTITY_OPS:
            return self.fold(node, x, 0.0, check=False)
        if name in _ACTIVATIONS or name in ("softmax_fused",):
            return self.fold(node, x)
        if name in _BINARY or name in _MIXED:
            fn = _BINARY.get(name) or _MIXED[name]
            self._const_operands(node)          # refuses constants computed from parameters
            params = [v for v in params if v.param in self.trainable]
            if len(tens) >= 2:
                return self.eltwise(node, tens, fn, {v.param: v.shape for v in params})
            if params:  # tensor (op) parameter: a bias-like operand folds into the producer
                return self.fold(node, x, 1.0, {params[0].param: params[0].shape})
            return self.fold(node, x)
        if name in ("conv_transpose1d", "conv_transpose2d", "conv_transpose3d"):
            return self.conv_transpose_call(node, x, args, kw, name)
        if name == "matmul" and len(tens) == 1 and len(params) == 1 and \
                len(params[0].shape) == 3 and params[0].param in self.trainable:
            return self.experts(node, args, x, params[0])
        if name in ("addmm", "mm", "matmul") and len(tens) == 1 and params:
            return self.linear_t(node, name, args, kw, x)
        if name == "baddbmm":
            return self.baddbmm(node, args, kw)
        if name in ("split", "split_with_sizes", "chunk", "unbind", "unsafe_split"):
            return self.split(node, x, name, args, kw)
        if name in ("conv1d", "conv2d", "conv3d", "convolution"):
            w = self._param_arg(node, args, kw, 1, "weight")
            b = self._param_arg(node, args, kw, 2, "bias")
            nsp = len(w.shape) - 2
            get = lambda i, k, d: kw.get(k, args[i] if len(args) > i else d)  # noqa: E731
            if name == "convolution" and get(6, "transposed", False):
                return self.conv_transpose_call(node, x, args, kw, name)
            pad = get(4, "padding", 0)
            if isinstance(pad, str):
                pad = tuple((k - 1) // 2 for k in w.shape[2:]) if pad == "same" else 0
            grp = get(8 if name == "convolution" else 6, "groups", 1)
            p = {"weight": w.shape}
            if b is not None:
                p["bias"] = b.shape
            return self.conv(node, x, p, tuple(w.shape[2:]), _tup(get(3, "stride", 1), nsp),
                             _tup(pad, nsp), _tup(get(5, "dilation", 1), nsp), int(grp))
        if name == "linear":
            w = self._param_arg(node, args, kw, 1, "weight")
            b = self._param_arg(node, args, kw, 2, "bias")
            p = {"weight": w.shape}
            if b is not None:
                p["bias"] = b.shape
            return self.linear(node, x, p)
        if name in ("max_pool1d", "max_pool2d", "avg_pool1d", "avg_pool2d",
                    "max_pool2d_with_indices"):
            nsp = len(x.shape) - 2
            get = lambda i, k, d: kw.get(k, args[i] if len(args) > i else d)  # noqa: E731
            k = _tup(get(1, "kernel_size", 1), nsp)
            s = get(2, "stride", None)
            s = k if s in (None, [], ()) else _tup(s, nsp)
            is_max = name.startswith("max")
            d = _tup(get(4, "dilation", 1), nsp) if is_max else (1,) * nsp
            # max: (input, kernel, stride, padding, dilation, ceil_mode, ...);
            # avg: (input, kernel, stride, padding, ceil_mode, count_include_pad, ...)
            ceil = bool(get(5 if is_max else 4, "ceil_mode", False))
            incl = True if is_max else bool(get(5, "count_include_pad", True))
            return self.pool(node, x, k, s, _tup(get(3, "padding", 0), nsp), d,
                             "max" if is_max else "avg", ceil, incl)
        if name in ("adaptive_avg_pool2d", "adaptive_avg_pool1d", "adaptive_max_pool2d",
                    "adaptive_max_pool1d", "_adaptive_avg_pool2d"):
            return self.adaptive(node, x, "max" if "max" in name else "avg")
        if name in ("batch_norm", "_native_batch_norm_legit_functional",
                    "_native_batch_norm_legit_no_training", "instance_norm"):
            return self.fold(node, x, 4.0, self._norm_affine(node, args, kw), check=False)
        if name in ("layer_norm", "rms_norm"):
            nshape = kw.get("normalized_shape", args[1] if len(args) > 1 else None)
            p = {v.param: v.shape for v in params}
            return self.norm(node, x, len(nshape) if nshape else 1, p)
        if name in ("softmax", "log_softmax", "_softmax", "_log_softmax"):
            dim = kw.get("dim", args[1] if len(args) > 1 else -1)
            return self.softmax(node, x, dim)
        if name == "cumsum":
            dim = kw.get("dim", args[1] if len(args) > 1 else None)
            return self.cumsum(node, x, dim)
        if name in ("mean", "sum", "amax"):
            dim = kw.get("dim", args[1] if len(args) > 1 else None)
            keep = kw.get("keepdim", args[2] if len(args) > 2 else False)
            return self.reduce(node, x, dim, keep)
        if name in ("interpolate", "upsample", "upsample_nearest2d", "upsample_bilinear2d",
                    "upsample_nearest1d", "upsample_linear1d"):
            mode = kw.get("mode", args[3] if name == "interpolate" and len(args) > 3 else None)
            mode = mode or ("bilinear" if "linear" in name else "nearest")
            return self.upsample(node, x, mode)
        if name in ("scaled_dot_product_attention",):
            return self.sdpa(node, tens[:4], args, kw)
        if name in ("matmul", "bmm", "mm"):
            if len(tens) < 2:
                return self.unsupported(node, f"{name} with a parameter operand")
            return self.matmul(node, tens[:2])
        if name == "embedding":
            # F.embedding(input, weight) vs aten.embedding(weight, indices)
            p = {"weight": params[0].shape} if params else {}
            return self.embedding(node, x, p)
        if name == "lstm_cell":
            hc = vals[1] if len(vals) > 1 and vals[1].kind == "tuple" else None
            p = {f"p{i}": v.shape for i, v in enumerate(params)}
            names = ["weight_ih", "weight_hh", "bias_ih", "bias_hh"]
            p = {names[i]: v.shape for i, v in enumerate(params)}
            return self.lstm_cell(node, x, hc, p)
        if name in _VIEWS or name in _REPEATS:
            if vals[0].kind != "tensor":
                return self.unsupported(node, f"{name} of a constant onto an activation's shape")
            return self.view_op(node, x, name, args, kw)
        if name in ("select", "slice"):
            return self.index_op(node, x, name, args)
        return self.unsupported(node, name)

    def _norm_affine(self, node, args, kw) -> dict:
        """The learnable ``weight``/``bias`` of a batch/instance norm call (not its running
        statistics, which are buffers): ``F.batch_norm``/``F.instance_norm`` take
        ``(input, running_mean, running_var, weight, bias, ...)``, ``torch.batch_norm`` and the
        aten ops ``(input, weight, bias, running_mean, running_var, ...)``."""
        if node.target in (F.batch_norm, F.instance_norm):
            names = ("input", "running_mean", "running_var", "weight", "bias")
        else:
            names = ("input", "weight", "bias", "running_mean", "running_var")
        got = dict(zip(names, args))
        got.update({k: v for k, v in kw.items() if k in names})
        out = {}
        for key in ("weight", "bias"):
            a = got.get(key)
            v = None if a is None else self.val(a)
            if v is not None and v.kind == "param":
                out[v.param] = v.shape
        return out

    def _param_arg(self, node, args, kw, i, key):
        a = kw.get(key, args[i] if len(args) > i else None)
        if a is None:
            return None
        v = self.val(a)
        if v.kind != "param":
            self.unsupported(node, f"{node.target} with a computed (non-parameter) {key}")
        return v

    # -- op builders -----------------------------------------------------------------------
    def conv(self, node, x, p, k, s, pad, dil, groups):
        shape = self.shape_of(node)
        nsp = len(k)
        axes = ("n", "c") + {1: ("l",), 2: ("h", "w"), 3: ("-", "h", "w")}[nsp]
        cin = x.shape[1]
        fl = 2.0 * math.prod(shape) * (cin // groups) * math.prod(k)
        self.new_layer(node, "conv", shape, axes, [x], p,
                       {"kernel": k, "stride": s, "padding": pad, "dilation": dil,
                        "groups": groups}, fl)

    def conv_transpose(self, node, x, p, k, s, pad, dil, groups):
        """A transposed convolution (weight ``[Cin, Cout/groups, k...]``) as its own layer op.

        ``output_padding`` is read off the traced output shape (what it adds beyond
        ``(i−1)·s − 2p + d·(k−1) + 1``), so ``ConvTranspose(x, output_size=...)`` is covered
        too.  FLOPs: every input element meets ``Cout/groups · prod(k)`` weights.
        """
        shape = self.shape_of(node)
        nsp = len(k)
        if nsp not in (1, 2, 3) or len(x.shape) != nsp + 2:
            return self.unsupported(node, f"conv_transpose on a rank-{len(x.shape)} input")
        axes = ("n", "c") + {1: ("l",), 2: ("h", "w"), 3: ("-", "h", "w")}[nsp]
        opad = tuple(int(shape[2 + i]) - ((x.shape[2 + i] - 1) * s[i] - 2 * pad[i]
                                          + dil[i] * (k[i] - 1) + 1) for i in range(nsp))
        if any(o < 0 or o >= max(s[i], dil[i]) for i, o in enumerate(opad)):
            return self.unsupported(node, f"conv_transpose with output padding {opad}")
        fl = 2.0 * math.prod(x.shape) * (shape[1] // groups) * math.prod(k)
        self.new_layer(node, "conv_transpose", shape, axes, [x], p,
                       {"kernel": k, "stride": s, "padding": pad, "output_padding": opad,
                        "dilation": dil, "groups": groups}, fl)

    def conv_transpose_module(self, node, x, mod):
        p = {k: tuple(v.shape) for k, v in mod.named_parameters(recurse=False)}
        return self.conv_transpose(node, x, p, tuple(mod.kernel_size), tuple(mod.stride),
                                   tuple(mod.padding), tuple(mod.dilation), int(mod.groups))

    def conv_transpose_call(self, node, x, args, kw, name):
        """``F.conv_transpose{1,2,3}d`` / ``aten.conv_transpose*`` take ``(input, weight, bias,
        stride, padding, output_padding, groups, dilation)``; ``aten.convolution`` takes
        ``(input, weight, bias, stride, padding, dilation, transposed, output_padding,
        groups)``."""
        w = self._param_arg(node, args, kw, 1, "weight")
        b = self._param_arg(node, args, kw, 2, "bias")
        nsp = len(w.shape) - 2
        get = lambda i, k, d: kw.get(k, args[i] if len(args) > i else d)  # noqa: E731
        if name == "convolution":
            dil, grp = get(5, "dilation", 1), get(8, "groups", 1)
        else:
            dil, grp = get(7, "dilation", 1), get(6, "groups", 1)
        p = {"weight": w.shape}
        if b is not None:
            p["bias"] = b.shape
        return self.conv_transpose(node, x, p, tuple(w.shape[2:]), _tup(get(3, "stride", 1), nsp),
                                   _tup(get(4, "padding", 0), nsp), _tup(dil, nsp), int(grp))

    def linear(self, node, x, p):
        shape = self.shape_of(node)
        axes = _default_axes(len(shape))
        if len(shape) == 3:
            axes = ("n", "l", "c")
        self.new_layer(node, "linear", shape, axes, [x], p, {},
                       2.0 * math.prod(shape) * x.shape[-1])

    def pool(self, node, x, k, s, pad, dil, kind, ceil_mode=False, count_include_pad=True):
        """``kind`` ``"max"``/``"avg"``; ``ceil_mode`` (an extra, partial window at the end)
        and, for average pooling, ``count_include_pad`` (whether padding counts in the
        divisor) are recorded so costs and the runtime see the same op."""
        shape = self.shape_of(node)
        axes = ("n", "c") + (("l",) if len(k) == 1 else ("h", "w"))
        attrs = {"kernel": k, "stride": s, "padding": pad, "dilation": dil, "kind": kind,
                 "ceil_mode": bool(ceil_mode)}
        if kind == "avg":
            attrs["count_include_pad"] = bool(count_include_pad)
        self.new_layer(node, "pool", shape, axes, [x], {}, attrs,
                       math.prod(shape) * math.prod(k))

    def adaptive(self, node, x, kind="avg"):
        shape = self.shape_of(node)
        axes = ("n", "c") + (("l",) if len(shape) == 3 else ("h", "w"))
        self.new_layer(node, "adaptive_pool", shape, axes, [x], {}, {"kind": kind},
                       math.prod(x.shape))

    def upsample(self, node, x, mode):
        shape = self.shape_of(node)
        if mode not in ("nearest", "bilinear", "linear"):
            return self.unsupported(node, f"interpolate(mode={mode!r})")
        axes = ("n", "c") + (("l",) if len(shape) == 3 else ("h", "w"))
        self.new_layer(node, "upsample", shape, axes, [x], {}, {"mode": mode},
                       math.prod(shape) * (1 if mode == "nearest" else 4))

    def norm(self, node, x, nnorm, p):
        shape = self.shape_of(node)
        axes = list(self.axes_like(x, shape))
        full = tuple(range(len(shape) - nnorm, len(shape)))
        for ax in full:
            axes[ax] = "-"
        self.new_layer(node, "norm", shape, tuple(axes), [x], p, {"full_axes": full},
                       5.0 * math.prod(shape))

    def softmax(self, node, x, dim):
        shape = self.shape_of(node)
        dim = dim % len(shape)
        axes = list(self.axes_like(x, shape))
        axes[dim] = "-"
        self.new_layer(node, "softmax", shape, tuple(axes), [x], {}, {"full_axes": (dim,)},
                       5.0 * math.prod(shape))

    def cumsum(self, node, x, dim):
        """``cumsum`` along ``dim``: a scan, so that axis is whole on every device (like a
        softmax's); the others follow the output box."""
        shape = self.shape_of(node)
        dim = dim % len(shape)
        axes = list(self.axes_like(x, shape))
        axes[dim] = "-"
        self.new_layer(node, "cumsum", shape, tuple(axes), [x], {}, {"full_axes": (dim,)},
                       float(math.prod(shape)))

    def experts(self, node, args, x, w):
        """``x [n, E, C, in] @ W [E, in, out]``: one matmul per expert (mixture-of-experts
        layers, each expert's tokens gathered into ``C`` capacity slots), an ``experts`` layer
        whose expert axis ``e`` splits the weight's experts (expert parallelism) and whose
        ``c`` splits each expert's output features."""
        shape = self.shape_of(node)
        if (len(x.shape) != 4 or len(shape) != 4 or args[0] is not node.args[0]
                or not isinstance(args[1], torch.fx.Node) or x.shape[1] != w.shape[0]
                or x.shape[-1] != w.shape[1]):
            return self.unsupported(node, f"matmul of a {list(x.shape)} activation by a "
                                          f"{list(w.shape)} parameter (an experts layer takes "
                                          f"x [n, experts, capacity, in] @ W [experts, in, out])")
        self.new_layer(node, "experts", shape, ("n", "e", "-", "c"), [x], {w.param: w.shape},
                       {}, 2.0 * math.prod(shape) * x.shape[-1])

    def reduce(self, node, x, dim, keep):
        shape = self.shape_of(node)
        if dim is None:
            return self.unsupported(node, "reduction over all dimensions")
        dims = (dim,) if isinstance(dim, int) else tuple(dim)
        dims = tuple(d % len(x.shape) for d in dims)
        in_axes = self.axes_like(x, x.shape)
        axes = tuple(("-" if i in dims else a) for i, a in enumerate(in_axes)
                     if keep or i not in dims)
        self.new_layer(node, "reduce", shape, axes, [x], {}, {"dims": dims, "keepdim": bool(keep)},
                       math.prod(x.shape))

    def eltwise(self, node, tens, fn, params=None):
        shape = self.shape_of(node)
        base = next((v for v in tens if tuple(v.shape) == tuple(shape)), tens[0])
        axes = self.axes_like(base, shape)
        self.new_layer(node, "eltwise", shape, axes, tens, dict(params or {}), {"fn": fn},
                       math.prod(shape) * max(len(tens) - 1, 1))

    def concat(self, node, tens, dim):
        shape = self.shape_of(node)
        dim = dim % len(shape)
        offs, o = [], 0
        for v in tens:
            offs.append(o)
            o += v.shape[dim]
        axes = self.axes_like(tens[0], tens[0].shape)
        self.new_layer(node, "concat", shape, axes, tens, {}, {"dim": dim, "offsets": tuple(offs)},
                       0.0)

    def sdpa(self, node, tens, args=(), kw=None):
        """``scaled_dot_product_attention``: q, k, v (and a mask computed from the input, as a
        fourth input); a constant mask (``attrs["mask"] == "const"``) and ``is_causal`` are
        applied by the runtime to each device's query rows."""
        shape = self.shape_of(node)
        if len(shape) != 4:
            return self.unsupported(node, f"scaled_dot_product_attention on rank {len(shape)}")
        got = dict(zip(("query", "key", "value", "attn_mask", "dropout_p", "is_causal",
                        "scale", "enable_gqa"), args))
        got.update(kw or {})
        tens = list(tens)
        if got.get("enable_gqa") and len(tens) >= 3:
            # grouped-query attention inside the op: query head h reads key/value head
            # h // (heads / kv_heads), i.e. keys and values repeat_interleave'd on the heads
            for i in (1, 2):
                kv = tens[i]
                if len(kv.shape) == 4 and kv.shape[1] != shape[1] and shape[1] % kv.shape[1] == 0:
                    rep = shape[1] // kv.shape[1]
                    tens[i] = _Val("tensor", layer=kv.layer,
                                   shape=(kv.shape[0], shape[1]) + tuple(kv.shape[2:]),
                                   transforms=_interleave(tuple(kv.shape), rep, 1)
                                   + tuple(kv.transforms))
        if len(tens) < 3 or any(tuple(v.shape[:2]) != tuple(shape[:2]) for v in tens[1:3]):
            return self.unsupported(node, "scaled_dot_product_attention with grouped or "
                                          "broadcast keys/values")
        mask = got.get("attn_mask")
        mv = self.val(mask) if isinstance(mask, torch.fx.Node) else None
        kind = None if mv is None else ("tensor" if mv.kind == "tensor" else "const")
        if kind == "const":
            self._const_operands(node)
        n, h, lq, d = shape
        lk = tens[1].shape[2]
        self.new_layer(node, "sdpa", shape, ("n", "c", "l", "-"), tens[:4 if kind == "tensor"
                                                                       else 3], {},
                       {k: v for k, v in (("mask", kind), ("causal", bool(got.get(
                           "is_causal", False)))) if v},
                       4.0 * n * h * lq * lk * d + 5.0 * n * h * lq * lk)

    def linear_t(self, node, name, args, kw, x):
        """``addmm(bias, x, W)`` (Hugging Face ``Conv1D``), ``x @ W``, ``mm(x, W)``: a linear
        layer whose weight is stored transposed, ``[in, out]`` (``attrs["weight_t"]``); its
        shards are column ranges.  Views around it fold onto the edges as usual."""
        vals = [self.val(a) for a in args]
        if name == "addmm":
            if kw.get("beta", 1) != 1 or kw.get("alpha", 1) != 1:
                return self.unsupported(node, "addmm with beta or alpha")
            b, xv, w = (vals + [None] * 3)[:3]
        else:
            b, (xv, w) = None, (vals + [None] * 2)[:2]
        if (xv is None or xv.kind != "tensor" or w is None or w.kind != "param"
                or len(w.shape) != 2 or (b is not None and b.kind != "param")):
            return self.unsupported(node, f"{name} with a parameter operand other than "
                                          f"(bias, input, weight[in, out])")
        p = {}
        for key, v in (("bias", b), ("weight", w)) if name == "addmm" else (("weight", w),):
            p[key] = v.shape
        shape = self.shape_of(node)
        axes = ("n", "l", "c") if len(shape) == 3 else _default_axes(len(shape))
        self.new_layer(node, "linear", shape, axes, [xv], p, {"weight_t": True},
                       2.0 * math.prod(shape) * xv.shape[-1])

    def baddbmm(self, node, args, kw):
        """``baddbmm(input, b1, b2, beta, alpha)``: a batched matmul layer whose addend
        ``input`` is a third input (from the model input) or a constant (``attrs["addend"]``)."""
        got = dict(zip(("input", "batch1", "batch2", "beta", "alpha"), args))
        got.update(kw)
        vals = {k: self.val(got[k]) for k in ("input", "batch1", "batch2")}
        if vals["batch1"].kind != "tensor" or vals["batch2"].kind != "tensor":
            return self.unsupported(node, "baddbmm with a parameter or constant factor")
        ins = [vals["batch1"], vals["batch2"]]
        addend = vals["input"].kind
        if addend == "tensor":
            ins.append(vals["input"])
        elif addend == "param" and vals["input"].param in self.trainable:
            return self.unsupported(node, "baddbmm with a parameter addend")
        else:
            self._const_operands(node)
            addend = "const"
        shape = self.shape_of(node)
        self.new_layer(node, "matmul", shape, _default_axes(len(shape)), ins, {},
                       {"addend": addend}, 2.0 * math.prod(shape) * ins[0].shape[-1])

    def split(self, node, x, name, args, kw):
        """``split``/``chunk``/``unbind`` of a tensor (a fused qkv projection): a tuple of
        views, each a ``slice`` (``select`` for unbind) of the producer on the split axis."""
        meta = node.meta.get("tensor_meta", node.meta.get("val"))
        if not isinstance(meta, (list, tuple)) or not meta:
            return self.unsupported(node, f"{name} without shapes")
        shapes = [tuple(int(v) for v in m.shape) for m in meta]
        dim = kw.get("dim", args[2] if len(args) > 2 and name != "unbind" else
                     (args[1] if name == "unbind" and len(args) > 1 else 0))
        dim = dim % len(x.shape)
        items, off = [], 0
        for i, shp in enumerate(shapes):
            t = ("select", dim, i) if name == "unbind" else ("slice", dim, off)
            items.append(_Val("tensor", layer=x.layer, shape=shp,
                              transforms=(t,) + tuple(x.transforms)))
            off += 1 if name == "unbind" else shp[dim]
        self.vals[node] = _Val("tuple", layer=x.layer, items=tuple(items))

    def mha(self, node, mod):
        """``nn.MultiheadAttention`` (an fx leaf): one ``mha`` layer with its in/out
        projections.  The output ``(n, l, e)`` (``(l, n, e)`` unless ``batch_first``) splits on
        the samples and on the query positions (keys/values then need the whole sequence)."""
        names = ("query", "key", "value", "key_padding_mask", "need_weights", "attn_mask",
                 "average_attn_weights", "is_causal")
        got = dict(zip(names, node.args))
        got.update(node.kwargs)
        ins = [self.val(got.get(k)) for k in names[:3]]
        if any(v.kind != "tensor" for v in ins):
            return self.unsupported(node, "MultiheadAttention with a non-activation query, "
                                          "key or value")
        if got.get("key_padding_mask") is not None:
            return self.unsupported(node, "MultiheadAttention with key_padding_mask")
        if mod.bias_k is not None or mod.add_zero_attn:
            return self.unsupported(node, "MultiheadAttention with add_bias_kv/add_zero_attn")
        mask = got.get("attn_mask")
        if isinstance(mask, torch.fx.Node):
            mv = self.val(mask)
            if mv.kind == "tensor":
                return self.unsupported(node, "MultiheadAttention with a mask computed from "
                                              "the input")
            self._const_operands(node)
        weights = [u for u in node.users if u.target is operator.getitem and u.args[1] == 1
                   and u.users]
        if weights:
            return self.unsupported(node, "MultiheadAttention attention weights (output 1)")
        meta = node.meta.get("tensor_meta", node.meta.get("val"))
        shape = tuple(int(v) for v in meta[0].shape)
        if len(shape) != 3:
            return self.unsupported(node, "unbatched MultiheadAttention")
        bf = bool(mod.batch_first)
        n, l, e = (shape[0], shape[1], shape[2]) if bf else (shape[1], shape[0], shape[2])
        s_len = ins[1].shape[1 if bf else 0]
        p = {k: tuple(v.shape) for k, v in mod.named_parameters()}
        fl = (2.0 * n * e * (l * e + 2 * s_len * e) + 4.0 * n * l * s_len * e
              + 2.0 * n * l * e * e)
        lay = Layer(node.name, "mha", shape, ("n", "l", "-") if bf else ("l", "n", "-"),
                    in_shapes=tuple(tuple(v.shape) for v in ins), params=p,
                    attrs={"batch_first": bf, "heads": int(mod.num_heads),
                           "mask": "const" if isinstance(mask, torch.fx.Node) else None,
                           "causal": bool(got.get("is_causal", False))},
                    flops=fl, module=self.module_path(node))
        self.graph.add_layer(lay)
        for i, v in enumerate(ins):
            self.graph.add_edge(Edge(v.layer, node.name, i, tuple(v.transforms)))
        out = _Val("tensor", layer=node.name, shape=shape)
        self.vals[node] = _Val("tuple", layer=node.name, items=(out, _Val("const")))

    def matmul(self, node, tens):
        shape = self.shape_of(node)
        k = tens[0].shape[-1]
        self.new_layer(node, "matmul", shape, _default_axes(len(shape)), tens, {}, {},
                       2.0 * math.prod(shape) * k)

    def embedding(self, node, x, p):
        shape = self.shape_of(node)
        axes = ("n", "l", "c") if len(shape) == 3 else ("n", "c")
        self.new_layer(node, "embedding", shape, axes, [x], p, {}, float(math.prod(shape)))

    def lstm_cell(self, node, x, hc, p):
        hidden = None
        for k, v in p.items():
            if k.startswith("weight_hh"):
                hidden = v[1]
        if hidden is None:
            return self.unsupported(node, "LSTMCell without weight_hh")
        n = x.shape[0]
        ins = [x]
        if hc is not None and hc.kind == "tuple":
            ins += [v for v in hc.items if v.kind == "tensor"]
        fl = 2.0 * n * 4 * hidden * (x.shape[1] + hidden) + 10.0 * n * hidden
        lay = Layer(node.name, "lstm_cell", (n, hidden), ("n", "c"),
                    in_shapes=tuple(tuple(v.shape) for v in ins), params=p,
                    attrs={"has_state": len(ins) == 3}, flops=fl, module=self.module_path(node))
        lay.qualnames = self.qualify(node, p)
        self.graph.add_layer(lay)
        for i, v in enumerate(ins):
            self.graph.add_edge(Edge(v.layer, node.name, i, tuple(v.transforms)))
        items = tuple(_Val("tensor", layer=node.name, shape=(n, hidden), transforms=(("item", i),))
                      for i in range(2))
        self.vals[node] = _Val("tuple", layer=node.name, items=items)

    def getitem(self, node, src, idx):
        if src.kind == "tuple":
            if isinstance(idx, int) and idx < len(src.items):
                self.vals[node] = src.items[idx]
                return
            self.vals[node] = _Val("const")
            return
        if src.kind != "tensor":
            self.vals[node] = _Val("const")
            return
        # tensor indexing: x[:, t] / x[:, a:b] / x[..., :n] / x[:, None]
        idx = idx if isinstance(idx, tuple) else (idx,)
        out_shape = self.shape_of(node)
        real = sum(1 for it in idx if it is not None and it is not Ellipsis)
        items = []
        for it in idx:
            items += [slice(None)] * (len(src.shape) - real) if it is Ellipsis else [it]
        dim = 0                     # axis in the tensor indexed so far
        sdim = 0                    # axis of the source
        od = 0                      # axis of the result
        cur = list(src.shape)
        trans = list(src.transforms)
        for it in items:
            if it is None:
                new = cur[:dim] + [1] + cur[dim:]
                trans.insert(0, ("reshape", tuple(cur), tuple(new)))
                cur, dim, od = new, dim + 1, od + 1
            elif isinstance(it, slice) and it == slice(None):
                dim, sdim, od = dim + 1, sdim + 1, od + 1
            elif isinstance(it, int):
                trans.insert(0, ("select", dim, it % src.shape[sdim]))
                cur.pop(dim)
                sdim += 1
            elif isinstance(it, slice) and it.step in (None, 1) and (
                    not isinstance(it.start, torch.fx.Node) or it.stop is None):
                size = src.shape[sdim]
                if isinstance(it.start, torch.fx.Node):     # x[..., n // 2:]
                    start = size - out_shape[od]
                else:
                    start = min(max((it.start or 0) + (size if (it.start or 0) < 0 else 0), 0),
                                size)
                trans.insert(0, ("slice", dim, start))
                cur[dim] = out_shape[od]
                dim, sdim, od = dim + 1, sdim + 1, od + 1
            else:
                return self.unsupported(node, f"indexing with {it!r}")
        self.vals[node] = _Val("tensor", layer=src.layer, shape=out_shape, transforms=tuple(trans))

    def index_op(self, node, x, name, args):
        out_shape = self.shape_of(node)
        dim = args[1] % len(x.shape)
        if name == "select":
            t = ("select", dim, args[2] % x.shape[dim])
        else:
            start = args[2] if len(args) > 2 and args[2] is not None else 0
            step = args[4] if len(args) > 4 else 1
            if step != 1:
                return self.unsupported(node, "strided slice")
            t = ("slice", dim, max(0, start) if start >= 0 else start % x.shape[dim])
        self.vals[node] = _Val("tensor", layer=x.layer, shape=out_shape,
                               transforms=(t,) + tuple(x.transforms))

    def flatten(self, node, x):
        self.view(node, x, ("reshape", tuple(x.shape), self.shape_of(node)))

    def view_op(self, node, x, name, args, kw):
        out = self.shape_of(node)
        src = tuple(x.shape)
        if name in ("transpose",):
            d0, d1 = args[1] % len(src), args[2] % len(src)
            perm = list(range(len(src)))
            perm[d0], perm[d1] = perm[d1], perm[d0]
            return self.view(node, x, ("permute", tuple(perm)))
        if name == "t":
            return self.view(node, x, ("permute", (1, 0)))
        if name == "permute":
            perm = args[1:] if not isinstance(args[1], (list, tuple)) else args[1]
            return self.view(node, x, ("permute", tuple(p % len(src) for p in perm)))
        if name in _REPEATS:
            if tuple(out) == src:
                return self.fold(node, x, 0.0, check=False)
            if name == "repeat_interleave":
                reps = kw.get("repeats", args[1] if len(args) > 1 else None)
                dim = kw.get("dim", args[2] if len(args) > 2 else None)
                if not isinstance(reps, int):
                    return self.unsupported(node, "repeat_interleave with a tensor of repeats")
                ts = _interleave(src, reps, dim)
            elif name == "repeat":
                ts = _tile(src, tuple(out))
            else:
                ts = (("expand", src, tuple(out)),)
            self.vals[node] = _Val("tensor", layer=x.layer, shape=tuple(out),
                                   transforms=ts + tuple(x.transforms))
            return
        if math.prod(out) != math.prod(src):
            return self.unsupported(node, f"{name} changing element count")
        return self.view(node, x, ("reshape", src, tuple(out)))


def _interleave(src: tuple, reps: int, dim) -> tuple:
    """``repeat_interleave(x, reps, dim)`` as edge transforms (consumer side first): a new
    axis of 1 after ``dim``, expanded to ``reps``, merged into ``dim`` (``dim=None`` flattens
    first), so element ``i`` of the result reads element ``i // reps`` of ``x``."""
    out = []
    if dim is None:
        out.append(("reshape", tuple(src), (math.prod(src),)))
        src, dim = (math.prod(src),), 0
    dim = dim % len(src)
    one = src[:dim + 1] + (1,) + src[dim + 1:]
    rep = src[:dim + 1] + (reps,) + src[dim + 1:]
    res = src[:dim] + (src[dim] * reps,) + src[dim + 1:]
    out += [("reshape", tuple(src), one), ("expand", one, rep), ("reshape", rep, res)]
    return tuple(reversed(out))


def _tile(src: tuple, res: tuple) -> tuple:
    """``x.repeat(*sizes)`` (the result ``res``) as edge transforms (consumer side first):
    leading axes of 1 for the new ones, an axis of 1 before each, expanded to its repeat
    count and merged with it."""
    full = (1,) * (len(res) - len(src)) + tuple(src)
    reps = tuple(r // s for r, s in zip(res, full))
    one = tuple(v for s in full for v in (1, s))
    rep = tuple(v for r, s in zip(reps, full) for v in (r, s))
    return (("reshape", rep, tuple(res)), ("expand", one, rep), ("reshape", tuple(src), one))


def import_model(model: nn.Module, x: torch.Tensor, name: str = "model",
                 captured: tuple | None = None) -> LayerGraph:
    """Build the :class:`LayerGraph` of ``model`` applied to ``x`` (batch = ``x.shape[0]``),
    from :func:`~explorer.engine.core.capture.capture` (or the ``(gm, source)`` it gave).

    Checks the invariant: the graph's parameter count equals the model's (each parameter
    once); a parameter that does not reach the graph fails the import, naming it.

    Without ``captured`` the model is traced without source lines (recording them is the
    slowest part of a first trace); only a model the import refuses is traced again with
    them, so the error names the user's line."""
    if captured is None:
        try:
            return _import(model, x, name, capture(model, x, name, stack_traces=False))
        except UnsupportedModel:
            captured = capture(model, x, name)
    return _import(model, x, name, captured)


def _import(model: nn.Module, x: torch.Tensor, name: str, captured: tuple) -> LayerGraph:
    gm, source = captured
    imp = _Importer(gm, name, int(x.shape[0]), source)
    g = imp.run()
    _prune(g, imp.outputs)
    g.outputs = [o for o in imp.outputs if o in g]
    _check_parameters(g, model, gm, name)
    for la in g.layers():
        # a leading axis of 1 on a batch > 1 is not the sample axis (position ids and their
        # embedding, a parameter): such a layer is shared by every sample, not split
        if la.op != "input" and la.axes and la.axes[0] == "n" and la.out_shape[0] == 1 \
                and g.batch > 1:
            la.axes = ("-",) + tuple(la.axes[1:])
    return g


def _check_parameters(g: LayerGraph, model: nn.Module, gm, name: str) -> None:
    """The invariant: the layers own every parameter of ``model`` that affects its output
    (``g.parameters`` + ``g.unused_parameters`` = the model's count, each parameter once).
    Parameters forward() never uses, or uses only in dead code (an auxiliary head whose
    output is discarded), get no gradient in training: they are listed in
    ``g.unused_parameters``.  Any other parameter missing fails the import, naming it and
    the line that reads it."""
    want = parameter_count(model)
    got = g.parameters
    if got == want:
        return
    reached = {q for la in g.layers() for q in (la.qualnames or {}).values()}
    out = next(n for n in gm.graph.nodes if n.op == "output")
    live = {out}
    todo = [out]
    while todo:
        for a in todo.pop().all_input_nodes:
            if a not in live:
                live.add(a)
                todo.append(a)
    missing = []
    for n, p in model.named_parameters():
        if n in reached:
            continue
        uses = [u for u in gm.graph.nodes
                if (u.op == "get_attr" and str(u.target) == n)
                or (u.op == "call_module" and n.startswith(f"{u.target}."))]
        if any(u in live for u in uses):
            missing.append((n, p.numel(), next(u for u in uses if u in live)))
        else:
            g.unused_parameters[n] = p.numel()
    if not missing and got + sum(g.unused_parameters.values()) == want:
        return
    if not missing:
        raise UnsupportedModel(f"{name}: the layer graph counts {got} parameters, the model "
                               f"has {want}")
    first = missing[0][2]
    user = first if first.op == "call_module" else next(iter(first.users), first)
    line = node_line(user)
    names = ", ".join(n for n, _, _ in missing[:4]) + (" ..." if len(missing) > 4 else "")
    raise UnsupportedModel(
        f"{name}: {len(missing)} parameter(s) ({sum(k for _, k, _ in missing)} elements) do "
        f"not reach the layer graph: {names}; read by node {user.name!r}"
        f"{f' at {line}' if line else ''}. The graph has {got} of the model's {want} "
        f"parameters: a rule for that use is missing")


def _prune(g: LayerGraph, outputs):
    """Dead-code elimination: keep the layers the model's outputs depend on (and inputs)."""
    keep = set(outputs) if outputs else {g.names()[-1]}
    for o in list(keep):
        keep |= nx.ancestors(g.g, o)
    for n in list(g.g.nodes):
        if n not in keep and g.layer(n).op != "input":
            g.g.remove_node(n)
    g._order = None


def import_spec(spec: str, batch: int | None = None, model_args: dict | None = None
                ) -> LayerGraph:
    """``load_model`` + ``import_model`` (on the meta device)."""
    model, x = load_model(spec, batch, model_args, meta=True)
    name = spec if ":" not in spec else Path(spec.rpartition(":")[0]).stem + ":" + spec.rpartition(":")[2]
    g = import_model(model, x, name)
    g.spec = spec
    g.model_args = dict(model_args or {})
    return g


_DIGESTS: dict = {}


def digest_for(spec: str, batch: int, model_args: dict | None = None) -> str | None:
    """:func:`~explorer.engine.core.layergraph.graph_digest` of ``import_spec(spec, batch, model_args)`` (cached per process),
    or ``None`` when the model cannot be imported."""
    key = (spec, int(batch), json.dumps(model_args or {}, sort_keys=True, default=str))
    if key not in _DIGESTS:
        try:
            _DIGESTS[key] = graph_digest(import_spec(spec, batch, dict(model_args or {})))
        except Exception:  # noqa: BLE001 - any failure of the user's model: digest unknown
            return None
    return _DIGESTS[key]

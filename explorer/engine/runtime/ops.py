"""Exact local computation of one layer's output box from the input regions geometry gives.

For every layer op of :mod:`explorer.engine.geometry` there is a rule that, given the regions
of the op's inputs a device fetched (boxes from :func:`geometry.input_regions`), its weight
shards (boxes from :func:`geometry.param_shards`) and its output box, computes exactly that
box of the single-device result:

* ``conv`` / ``pool``: windows read a halo; the zero (conv, average pool with
  ``count_include_pad``) or ``-inf`` (max pool) padding is added only where the region touches
  the true tensor border, so the op yields exactly the owned rows; the weight shard holds the
  output-channel rows (grouped convolutions: the groups the rows belong to).
* ``adaptive_pool``: separable averaging (or max) matrices over the region when h/w is split.
* ``linear`` (weight rows), ``embedding`` (table columns), ``concat`` (input slices placed),
  ``eltwise`` (broadcasting), ``norm``/``softmax``/``reduce``/``sdpa``/``matmul`` (the
  reduced axes are whole in the region) call the model's own function on the regions.
* ``upsample``: nearest-neighbour index arithmetic when h/w is split.

Then the layer's *folded* fx nodes run on the local result in model order: activations call
the model's own function/module, dropout is the identity (eval semantics), BatchNorm uses its
running statistics (eval-mode normalisation) sliced to the box's channel range, and
bias-like parameter operands use the device's parameter shard.

Ops or options without a rule raise ``NotImplementedError`` naming the layer and the op.
"""

from __future__ import annotations

import operator

import numpy as np
import torch
import torch.fx
import torch.nn as nn
import torch.nn.functional as F

from .. import geometry as G
from ..geometry.regions import _broadcast_region
from ..importer import _IDENTITY, _target_name

_BN = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)
_PASS_MODULES = (nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout,
                 nn.FeatureAlphaDropout, nn.Identity)


class LayerContext:
    """What computing one layer needs besides tensors: the layer, its fx nodes and the model.

    ``param_of(qualified_name)`` returns this device's shard (a leaf with ``requires_grad``)
    for parameters the layer owns, else the model's tensor (buffers, constants).
    ``shard_box[qualified_name]`` is the shard's box in the parameter's logical shape.
    """

    def __init__(self, layer, node, folded_nodes, gm, tensors, shards, shard_boxes):
        self.layer = layer
        self.node = node
        self.folded = folded_nodes
        self.gm = gm
        self.tensors = tensors          # qualified name -> model tensor (params and buffers)
        self.shards = shards            # qualified name -> local shard tensor
        self.shard_boxes = shard_boxes  # qualified name -> [pnd, 2] box

    @property
    def where(self) -> str:
        return f"layer {self.layer.name} ({self.layer.op})"

    def param(self, qual: str) -> torch.Tensor:
        if qual in self.shards:
            return self.shards[qual]
        if qual in self.tensors:
            return self.tensors[qual]
        raise KeyError(f"{self.where}: no parameter or buffer {qual!r} in the model")

    def module(self):
        return self.gm.get_submodule(self.node.target) if self.node.op == "call_module" else None


# --------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------


def _is_tensor_node(a) -> bool:
    if not isinstance(a, torch.fx.Node) or a.op == "get_attr":
        return False
    tm = a.meta.get("tensor_meta")
    if tm is not None and hasattr(tm, "shape"):
        return True
    v = a.meta.get("val")
    return isinstance(v, torch.Tensor)


def _window_pads(ctx, out_box, in_box, in_shape, k, s, p, d):
    """:func:`geometry.window_pads`, naming the layer when its region is not the window's."""
    try:
        return G.window_pads(out_box, in_box, in_shape, k, s, p, d)
    except ValueError as exc:
        raise RuntimeError(f"{ctx.where}: {exc}") from None


def _pad(x, pads, value=0.0):
    """``pads`` per spatial axis (before, after) -> F.pad (last axis first)."""
    flat = []
    for b, a in reversed(pads):
        flat += [int(b), int(a)]
    if not any(flat):
        return x
    return F.pad(x, flat, value=value)


def _split_pads(pads):
    """Symmetric part (the op's own padding argument) and the asymmetric rest (F.pad)."""
    common = tuple(min(b, a) for b, a in pads)
    rest = [(b - c, a - c) for (b, a), c in zip(pads, common)]
    return common, rest


# --------------------------------------------------------------------------------------------
# op rules: (ctx, inputs, in_boxes, out_box) -> output tensor of the box's shape
# --------------------------------------------------------------------------------------------

_CONV = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}


def _conv(ctx, ins, in_boxes, out_box):
    lay = ctx.layer
    a = lay.attrs
    x = ins[0]
    k, s, p = tuple(a["kernel"]), tuple(a["stride"]), tuple(a["padding"])
    nsp = len(k)
    d = tuple(a.get("dilation", (1,) * nsp))
    groups = int(a.get("groups", 1))
    if ctx.node.op == "call_module":
        mod = ctx.module()
        if getattr(mod, "padding_mode", "zeros") != "zeros":
            raise NotImplementedError(f"{ctx.where}: padding_mode={mod.padding_mode!r} is not "
                                      f"supported by the runtime (zeros only)")
        if isinstance(mod, nn.modules.conv._ConvTransposeNd):
            raise NotImplementedError(f"{ctx.where}: transposed convolution")
    in_shape = lay.in_shapes[0]
    w = ctx.param(ctx.weight_name)
    b = ctx.param(ctx.bias_name) if ctx.bias_name else None
    conv = _CONV[nsp]
    if G.full_spatial(out_box, in_boxes[0], lay.out_shape, in_shape):
        pad_arg, rest = p, None
    else:
        pads = _window_pads(ctx, out_box, in_boxes[0], in_shape, k, s, p, d)
        pad_arg, rest = _split_pads(pads)
    if rest is not None:
        x = _pad(x, rest, 0.0)
    if groups == 1:
        return conv(x, w, b, s, pad_arg, d, 1)
    cout, cin = lay.out_shape[1], in_shape[1]
    og, ig = cout // groups, cin // groups
    c0, c1 = int(out_box[1, 0]), int(out_box[1, 1])
    g0, g1 = c0 // og, (c1 - 1) // og + 1
    if c0 % og == 0 and c1 % og == 0:
        return conv(x, w, b, s, pad_arg, d, g1 - g0)
    outs = []          # output rows that cut through groups: one convolution per group
    for g in range(g0, g1):
        r0, r1 = max(c0, g * og), min(c1, (g + 1) * og)
        xs = x[:, (g - g0) * ig:(g - g0 + 1) * ig]
        outs.append(conv(xs, w[r0 - c0:r1 - c0], None if b is None else b[r0 - c0:r1 - c0],
                         s, pad_arg, d, 1))
    return torch.cat(outs, 1)


def _pool_options(ctx) -> dict:
    node = ctx.node
    if node.op == "call_module":
        m = ctx.module()
        return {"ceil_mode": bool(getattr(m, "ceil_mode", False)),
                "count_include_pad": bool(getattr(m, "count_include_pad", True)),
                "divisor_override": getattr(m, "divisor_override", None),
                "return_indices": bool(getattr(m, "return_indices", False))}
    name = _target_name(node, ctx.gm)
    if "max" in name:
        order = ["input", "kernel_size", "stride", "padding", "dilation", "ceil_mode",
                 "return_indices"]
    else:
        order = ["input", "kernel_size", "stride", "padding", "ceil_mode", "count_include_pad",
                 "divisor_override"]
    opts = dict(zip(order, node.args))
    opts.update(node.kwargs)
    return {"ceil_mode": bool(opts.get("ceil_mode", False)),
            "count_include_pad": bool(opts.get("count_include_pad", True)),
            "divisor_override": opts.get("divisor_override"),
            "return_indices": bool(opts.get("return_indices", False))}


_MAXPOOL = {1: F.max_pool1d, 2: F.max_pool2d, 3: F.max_pool3d}
_AVGPOOL = {1: F.avg_pool1d, 2: F.avg_pool2d, 3: F.avg_pool3d}


def _pool(ctx, ins, in_boxes, out_box):
    lay = ctx.layer
    a = lay.attrs
    x = ins[0]
    k, s, p = tuple(a["kernel"]), tuple(a["stride"]), tuple(a["padding"])
    nsp = len(k)
    d = tuple(a.get("dilation", (1,) * nsp))
    kind = a.get("kind", "max")
    o = ctx.pool_opts
    if o["return_indices"]:
        raise NotImplementedError(f"{ctx.where}: max pooling with return_indices")
    if G.full_spatial(out_box, in_boxes[0], lay.out_shape, lay.in_shapes[0]):
        if kind == "max":
            return _MAXPOOL[nsp](x, k, s, p, d, o["ceil_mode"])
        return _AVGPOOL[nsp](x, k, s, p, o["ceil_mode"], o["count_include_pad"],
                             o["divisor_override"])
    if o["ceil_mode"]:
        raise NotImplementedError(f"{ctx.where}: pooling with ceil_mode=True on a height/width "
                                  f"split")
    if kind != "max" and (not o["count_include_pad"] or o["divisor_override"]):
        raise NotImplementedError(f"{ctx.where}: average pooling with count_include_pad=False "
                                  f"or divisor_override on a height/width split")
    pads = _window_pads(ctx, out_box, in_boxes[0], lay.in_shapes[0], k, s, p, d)
    if kind == "max":
        x = _pad(x, pads, float("-inf"))
        return _MAXPOOL[nsp](x, k, s, 0, d)
    common, rest = _split_pads(pads)
    x = _pad(x, rest, 0.0)
    return _AVGPOOL[nsp](x, k, s, common, False, True)


def _adaptive_kind(ctx) -> str:
    if ctx.node.op == "call_module":
        return "max" if "Max" in type(ctx.module()).__name__ else "avg"
    return "max" if "max" in _target_name(ctx.node, ctx.gm) else "avg"


_ADAPT = {("avg", 1): F.adaptive_avg_pool1d, ("avg", 2): F.adaptive_avg_pool2d,
          ("avg", 3): F.adaptive_avg_pool3d, ("max", 1): F.adaptive_max_pool1d,
          ("max", 2): F.adaptive_max_pool2d, ("max", 3): F.adaptive_max_pool3d}


def _adaptive_pool(ctx, ins, in_boxes, out_box):
    lay = ctx.layer
    x = ins[0]
    kind = ctx.adaptive_kind
    out_shape, in_shape = lay.out_shape, lay.in_shapes[0]
    nsp = len(out_shape) - 2
    if G.full_spatial(out_box, in_boxes[0], out_shape, in_shape):
        return _ADAPT[(kind, nsp)](x, tuple(out_shape[2:]))
    for ax in range(2, len(out_shape)):
        lo, hi = int(out_box[ax, 0]), int(out_box[ax, 1])
        r0 = int(in_boxes[0][ax, 0])
        size, osz = in_shape[ax], out_shape[ax]
        if kind == "avg":
            m = torch.zeros(hi - lo, x.shape[ax], dtype=x.dtype, device=x.device)
            for o in range(lo, hi):
                st, en = (int(v) for v in G.adaptive_window(o, o + 1, size, osz))
                m[o - lo, st - r0:en - r0] = 1.0 / (en - st)
            x = torch.movedim(torch.tensordot(x, m, dims=([ax], [1])), -1, ax)
        else:
            parts = []
            for o in range(lo, hi):
                st, en = (int(v) for v in G.adaptive_window(o, o + 1, size, osz))
                parts.append(x.narrow(ax, st - r0, en - st).amax(dim=ax, keepdim=True))
            x = torch.cat(parts, ax)
    return x


def _upsample(ctx, ins, in_boxes, out_box):
    lay = ctx.layer
    x = ins[0]
    if G.full_spatial(out_box, in_boxes[0], lay.out_shape, lay.in_shapes[0]):
        return _call_node(ctx, [x])
    if lay.attrs.get("mode") != "nearest":
        raise NotImplementedError(f"{ctx.where}: {lay.attrs.get('mode')} upsampling on a "
                                  f"height/width split")
    for ax in range(2, len(lay.out_shape)):
        lo, hi = int(out_box[ax, 0]), int(out_box[ax, 1])
        size, osz = lay.in_shapes[0][ax], lay.out_shape[ax]
        idx = torch.tensor([(o * size) // osz - int(in_boxes[0][ax, 0]) for o in range(lo, hi)],
                           dtype=torch.long, device=x.device)
        x = x.index_select(ax, idx)
    return x


def _linear(ctx, ins, in_boxes, out_box):
    w = ctx.param(ctx.weight_name)
    b = ctx.param(ctx.bias_name) if ctx.bias_name else None
    return F.linear(ins[0], w, b)


def _embedding(ctx, ins, in_boxes, out_box):
    w = ctx.param(ctx.weight_name)
    kw = {}
    if ctx.node.op == "call_module":
        m = ctx.module()
        if m.max_norm is not None:
            raise NotImplementedError(f"{ctx.where}: embedding with max_norm")
        kw = {"padding_idx": m.padding_idx, "scale_grad_by_freq": m.scale_grad_by_freq,
              "sparse": False}
    return F.embedding(ins[0], w, **kw)


def _concat(ctx, ins, in_boxes, out_box):
    dim = ctx.layer.attrs["dim"]
    parts = [t for t in ins if t is not None]
    if len(parts) == 1:
        return parts[0] * 1.0 if parts[0].is_floating_point() else parts[0]
    return torch.cat(parts, dim)


def _param(ctx, ins, in_boxes, out_box):
    """A parameter/buffer read as an activation: the part of it (this device's shard, or the
    buffer) the output box reads, broadcast to the box (its gradient sums back into it)."""
    qual = ctx.layer.attrs["tensor"]
    if qual in ctx.shards or qual in ctx.tensors:
        t = ctx.param(qual)
    else:                               # a constant the tracer made (fx's _tensor_constant0)
        t = operator.attrgetter(qual)(ctx.gm)
    full = tuple(ctx.tensors[qual].shape) if qual in ctx.tensors else tuple(t.shape)
    need = _broadcast_region(out_box, full)
    have = ctx.shard_boxes.get(qual)
    have = np.array([(0, s) for s in full]) if have is None else have
    t = t[tuple(slice(int(n0 - h0), int(n1 - h0)) for (n0, n1), (h0, _) in zip(need, have))]
    return t.expand(tuple(int(b - a) for a, b in out_box))


def _generic(ctx, ins, in_boxes, out_box):
    return _call_node(ctx, ins)


def _lstm(ctx, ins, in_boxes, out_box):
    raise NotImplementedError(f"{ctx.where}: the runtime has no rule for lstm_cell yet")


RULES = {"param": _param, "conv": _conv, "pool": _pool, "adaptive_pool": _adaptive_pool, "upsample": _upsample,
         "linear": _linear, "embedding": _embedding, "concat": _concat, "eltwise": _generic,
         "norm": _generic, "softmax": _generic, "reduce": _generic, "sdpa": _generic,
         "matmul": _generic, "lstm_cell": _lstm}


def _call_node(ctx, ins):
    """Call the layer's own fx target with its tensor arguments replaced by ``ins``
    (the argument template is built on the first call)."""
    fn = getattr(ctx, "_call", None)
    if fn is None:
        fn = ctx._call = _compile_call(ctx, len(ins))
    return fn(ins)


def _compile_call(ctx, n_ins):
    node = ctx.node
    slots = []            # (kind, position, value): "in" k-th input / "param" getter

    def sub(a, path, top):
        if isinstance(a, torch.fx.Node):
            if a.op == "get_attr":
                slots.append((path, "param", str(a.target)))
                return None
            if _is_tensor_node(a) and top:
                k = sum(1 for s_ in slots if s_[1] == "in")
                if k >= n_ins:
                    raise NotImplementedError(
                        f"{ctx.where}: node {node.name} has more tensor arguments than the "
                        f"layer's {n_ins} inputs")
                slots.append((path, "in", k))
                return None
            raise NotImplementedError(f"{ctx.where}: argument {a.name} of node {node.name} is "
                                      f"computed at run time (not a tensor input)")
        if isinstance(a, (list, tuple)) and any(isinstance(x, torch.fx.Node) for x in a):
            if any(isinstance(x, torch.fx.Node) and x.op != "get_attr" for x in a):
                raise NotImplementedError(f"{ctx.where}: node {node.name} takes a list of "
                                          f"tensors")
            return type(a)(ctx.param(str(x.target)) if isinstance(x, torch.fx.Node) else x
                           for x in a)
        return a

    args = [sub(a, ("a", i), True) for i, a in enumerate(node.args)]
    kwargs = {k: sub(v, ("k", k), False) for k, v in node.kwargs.items()}
    if node.op == "call_module":
        mod = ctx.module()
        if isinstance(mod, nn.LayerNorm):
            w = ctx.param(f"{node.target}.weight") if mod.weight is not None else None
            b = ctx.param(f"{node.target}.bias") if mod.bias is not None else None
            shape, eps = mod.normalized_shape, mod.eps
            return lambda ins: F.layer_norm(ins[0], shape, w, b, eps)
        if any(True for _ in mod.parameters(recurse=False)):
            raise NotImplementedError(f"{ctx.where}: module {type(mod).__name__} with "
                                      f"parameters has no runtime rule")
        target = mod
    elif node.op == "call_method":
        meth = node.target

        def target(first, *rest, **kw):
            return getattr(first, meth)(*rest, **kw)
    else:
        target = node.target

    def fn(ins):
        a, k = list(args), dict(kwargs)
        for (where, i), kind, v in slots:
            val = ins[v] if kind == "in" else ctx.param(v)
            if where == "a":
                a[i] = val
            else:
                k[i] = val
        return target(*a, **k)
    return fn


# --------------------------------------------------------------------------------------------
# folded nodes
# --------------------------------------------------------------------------------------------


def _broadcast_slice(ctx, qual, t, out_box, nd):
    """``fn() -> tensor``: the part of parameter ``qual`` (tensor ``t``, this device's shard
    if it has one) that broadcasts against the output box."""
    full_shape = tuple(ctx.tensors[qual].shape) if qual in ctx.tensors else tuple(t.shape)
    if len(full_shape) > nd:
        raise NotImplementedError(f"{ctx.where}: parameter {qual} {full_shape} broadcasts to "
                                  f"a larger rank than the output")
    need = []
    off = nd - len(full_shape)
    for ax, size in enumerate(full_shape):
        if size == 1:
            need.append((0, 1))
        else:
            need.append((int(out_box[off + ax, 0]), int(out_box[off + ax, 1])))
    if qual in ctx.shard_boxes:
        have = ctx.shard_boxes[qual]
        if len(have) != len(need):
            raise NotImplementedError(f"{ctx.where}: parameter {qual} has a reshaped shard")
    else:
        have = np.array([(0, s) for s in full_shape])
    idx = []
    whole = True
    for ax, ((n0, n1), (h0, h1)) in enumerate(zip(need, have)):
        if n0 < h0 or n1 > h1:
            raise RuntimeError(f"{ctx.where}: parameter {qual} shard {have.tolist()} does not "
                               f"cover the part {need} the output box needs")
        idx.append(slice(int(n0 - h0), int(n1 - h0)))
        whole = whole and n0 == h0 and n1 - h0 == t.shape[ax]
    return _param_view(ctx, qual, t, None if whole else tuple(idx))


def compile_folded(ctx, out_box, nd: int) -> list:
    """The layer's folded fx nodes as a list of ``fn(y) -> y`` for the output box ``out_box``
    (every lookup, slice and decision made once)."""
    chain_names = {ctx.layer.name}
    fns = []
    for node in ctx.folded:
        fn = _compile_one(ctx, node, out_box, nd, chain_names)
        if fn is not None:
            fns.append(fn)
        chain_names.add(node.name)
    return fns


def _param_view(ctx, qual, t, idx):
    """``fn() -> tensor``: ``t[idx]`` taken at call time (shards are updated in place)."""
    if idx is None:
        return lambda: t
    return lambda: t[idx]


def _bn_fn(ctx, out_box, rm, rv, w, b, eps, quals):
    c0, c1 = int(out_box[1, 0]), int(out_box[1, 1])
    if rm is None or rv is None:
        raise NotImplementedError(f"{ctx.where}: BatchNorm without running statistics "
                                  f"(track_running_stats=False) normalises with batch statistics")
    rm, rv = rm[c0:c1].detach(), rv[c0:c1].detach()
    wf = None if w is None else _channel_slice(ctx, quals[0], w, c0, c1)
    bf = None if b is None else _channel_slice(ctx, quals[1], b, c0, c1)
    eps = float(eps)

    def fn(y):
        return F.batch_norm(y, rm, rv, None if wf is None else wf(),
                            None if bf is None else bf(), False, 0.0, eps)
    return fn


def _channel_slice(ctx, qual, t, c0, c1):
    if qual in ctx.shard_boxes:
        h0, h1 = (int(v) for v in ctx.shard_boxes[qual][0])
    else:
        h0, h1 = 0, t.shape[0]
    if c0 < h0 or c1 > h1:
        raise RuntimeError(f"{ctx.where}: BatchNorm parameter {qual} shard [{h0}, {h1}) does "
                           f"not cover channels [{c0}, {c1})")
    idx = None if (c0 - h0 == 0 and c1 - h0 == t.shape[0]) else slice(c0 - h0, c1 - h0)
    return _param_view(ctx, qual, t, idx)


def _compile_one(ctx, node, out_box, nd, chain_names):
    if node.op == "call_module":
        mod = ctx.gm.get_submodule(node.target)
        if isinstance(mod, _PASS_MODULES):
            return None
        if isinstance(mod, _BN):
            t = str(node.target)
            w = ctx.param(f"{t}.weight") if mod.weight is not None else None
            b = ctx.param(f"{t}.bias") if mod.bias is not None else None
            return _bn_fn(ctx, out_box, mod.running_mean, mod.running_var, w, b, mod.eps,
                          (f"{t}.weight", f"{t}.bias"))
        if any(True for _ in mod.parameters(recurse=False)):
            raise NotImplementedError(f"{ctx.where}: folded module {node.target} "
                                      f"({type(mod).__name__}) has parameters and no rule")
        return mod
    name = _target_name(node, ctx.gm)
    if name in _IDENTITY or "dropout" in name or name == "expand":
        return None
    if name in ("batch_norm",):
        names = ["input", "running_mean", "running_var", "weight", "bias", "training",
                 "momentum", "eps"]
        got = dict(zip(names, node.args))
        got.update(node.kwargs)

        def t(key):
            v = got.get(key)
            return ctx.param(str(v.target)) if isinstance(v, torch.fx.Node) else v

        def q(key):
            v = got.get(key)
            return str(v.target) if isinstance(v, torch.fx.Node) else ""
        return _bn_fn(ctx, out_box, t("running_mean"), t("running_var"), t("weight"),
                      t("bias"), got.get("eps", 1e-5), (q("weight"), q("bias")))
    flowing = [a for a in node.args if _is_tensor_node(a)]
    if len(flowing) != 1:
        picked = [a for a in flowing if a.name in chain_names]
        if len(picked) != 1:
            raise NotImplementedError(f"{ctx.where}: folded node {node.name} ({name}) has "
                                      f"{len(flowing)} tensor arguments")
        flowing = picked
    src = flowing[0]
    dynamic = []          # positions (in args / kwargs) filled at call time

    def sub(a, path):
        if isinstance(a, torch.fx.Node):
            if a is src:
                dynamic.append((path, None))
                return None
            if a.op == "get_attr":
                qual = str(a.target)
                view = _broadcast_slice(ctx, qual, ctx.param(qual), out_box, nd)
                dynamic.append((path, view))
                return None
            raise NotImplementedError(f"{ctx.where}: folded node {node.name} ({name}) reads "
                                      f"{a.name}, computed at run time")
        if isinstance(a, (list, tuple)) and any(isinstance(x, torch.fx.Node) for x in a):
            raise NotImplementedError(f"{ctx.where}: folded node {node.name} ({name}) takes a "
                                      f"list of tensors")
        return a

    args = [sub(a, ("a", i)) for i, a in enumerate(node.args)]
    kwargs = {k: sub(v, ("k", k)) for k, v in node.kwargs.items()}
    if "inplace" in kwargs:
        kwargs["inplace"] = False
    if node.op == "call_method":
        meth = node.target
        if meth.endswith("_") and not meth.endswith("__"):
            meth = meth[:-1]          # out-of-place variant: keeps autograd simple

        def target(first, *rest, **kw):
            return getattr(first, meth)(*rest, **kw)
    else:
        target = node.target

    def fn(y):
        a, k = list(args), dict(kwargs)
        for (where, i), getter in dynamic:
            v = y if getter is None else getter()
            if where == "a":
                a[i] = v
            else:
                k[i] = v
        return target(*a, **k)
    return fn


def compute(ctx, ins, in_boxes, out_box) -> torch.Tensor:
    """The layer's output box: the op's rule, then the folded nodes.

    The first call checks the result's shape against the box and compiles the folded nodes;
    later calls (the same box) only run them.
    """
    rule = RULES.get(ctx.layer.op)
    if rule is None:
        raise NotImplementedError(f"{ctx.where}: the runtime has no rule for op "
                                  f"{ctx.layer.op!r}")
    y = rule(ctx, ins, in_boxes, out_box)
    fold = getattr(ctx, "_fold", None)
    if fold is None:
        want = tuple(int(v) for v in out_box[:, 1] - out_box[:, 0])
        if tuple(y.shape) != want:
            raise RuntimeError(f"{ctx.where}: local result has shape {tuple(y.shape)}, the "
                               f"owned box {out_box.tolist()} has {want}")
        fold = ctx._fold = compile_folded(ctx, out_box, y.dim())
    for fn in fold:
        y = fn(y)
    return y

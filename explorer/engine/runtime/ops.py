"""Exact local computation of one layer's output box from the input regions geometry gives.

For every layer op of :mod:`explorer.engine.core.geometry` there is a rule that, given the regions
of the op's inputs a device fetched (boxes from :func:`geometry.input_regions`), its weight
shards (boxes from :func:`geometry.param_shards`) and its output box, computes exactly that
box of the single-device result:

* ``conv`` / ``pool``: windows read a halo; the zero (conv, average pool with
  ``count_include_pad``) or ``-inf`` (max pool) padding is added only where the region touches
  the true tensor border, so the op yields exactly the owned rows; the weight shard holds the
  output-channel rows (grouped convolutions: the groups the rows belong to).
* ``conv_transpose``: the transposed convolution of the input region without padding, its
  rows cropped to the owned box (zero rows where no input reaches it), then the bias.
* ``adaptive_pool``: separable averaging (or max) matrices over the region when h/w is split.
* ``linear`` (weight rows), ``embedding`` (table columns), ``concat`` (input slices placed),
  ``eltwise`` (broadcasting), ``norm``/``softmax``/``reduce``/``cumsum``/``sdpa``/``matmul`` (the
  reduced or scanned axes are whole in the region) and ``experts`` (the device's experts' and
  output columns' weight shard) call the model's own function on the regions.
* ``upsample``: nearest-neighbour index arithmetic when h/w is split.
* ``sdpa``: a constant mask cut to the box's query rows; ``is_causal`` on split rows becomes an
  explicit mask offset by the first row.  ``mha``: ``F.multi_head_attention_forward`` with the
  device's weights on its samples and query positions.  ``linear`` with ``weight_t``:
  ``x @ W[:, cols] + b[cols]``; ``matmul`` from ``baddbmm`` adds its addend's box.

Constant operands (masks, rotary tables: nodes that do not read the model input) are evaluated
once from the model's buffers (:func:`const_value`) and sliced to the part that broadcasts
against the output box.

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

from explorer.engine.core import geometry as G
from explorer.engine.core.geometry.regions import broadcast_region
from explorer.engine.core.importer import IDENTITY_OPS, target_name

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
        try:                  # a tensor constant of the traced graph (fx ``_tensor_constant0``)
            return _fetch(self.gm, qual)
        except AttributeError:
            pass
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


_CONVT = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}


def _conv_transpose(ctx, ins, in_boxes, out_box):
    """Transposed convolution of the fetched input region, cropped to the owned box.

    Run without padding on the region, the local result's row ``t`` is the output row
    ``start·s − p + t``; :func:`geometry.transpose_crop` gives the rows to cut off and the
    zero rows to add (box rows no input of the region reaches), then the bias is added.  A
    box no input row reaches at all (the region is empty) is the bias alone.  Grouped
    weights arrive in the logical shape ``[g, Cin/g, Cout/g, k...]`` of
    :func:`geometry.param_shards`; a box cutting through groups runs one convolution each.
    """
    lay = ctx.layer
    a = lay.attrs
    k, s, p = tuple(a["kernel"]), tuple(a["stride"]), tuple(a["padding"])
    nsp = len(k)
    d = tuple(a.get("dilation", (1,) * nsp))
    opad = tuple(a.get("output_padding", (0,) * nsp))
    groups = int(a.get("groups", 1))
    in_shape, out_shape = lay.in_shapes[0], lay.out_shape
    w = ctx.param(ctx.weight_name)
    b = ctx.param(ctx.bias_name) if ctx.bias_name else None
    c0, c1 = int(out_box[1, 0]), int(out_box[1, 1])
    box_shape = tuple(int(v) for v in out_box[:, 1] - out_box[:, 0])
    wbox = ctx.shard_boxes.get(ctx.weight_name)
    og = out_shape[1] // groups
    ig = in_shape[1] // groups
    if groups > 1 and w.dim() == nsp + 2:          # the whole tensor, not a logical shard
        w = w.reshape((groups, ig, og) + k)
        wbox = None
    if wbox is None:
        wbox = np.array([(0, n) for n in w.shape])
    x = ins[0]
    if x is None:                                  # no input row reaches the box
        y = torch.zeros(box_shape, dtype=w.dtype, device=w.device)
    else:
        if G.full_spatial(out_box, in_boxes[0], out_shape, in_shape):
            pads = None
        else:
            try:
                pads = G.transpose_crop(out_box, in_boxes[0], in_shape, k, s, p, d)
            except ValueError as exc:
                raise RuntimeError(f"{ctx.where}: {exc}") from None

        def run(xs, ws, g):
            if pads is None:
                return _CONVT[nsp](xs, ws, None, s, p, opad, g, d)
            return _pad(_CONVT[nsp](xs, ws, None, s, 0, 0, g, d), pads)
        if groups == 1:
            j0 = int(wbox[1, 0])
            y = run(x, w[:, c0 - j0:c1 - j0], 1)
        else:
            gb, jb = int(wbox[0, 0]), int(wbox[2, 0])
            g0, g1 = c0 // og, (c1 - 1) // og + 1
            if c0 % og == 0 and c1 % og == 0:      # whole groups (all columns): one call
                y = run(x, w[g0 - gb:g1 - gb].reshape(((g1 - g0) * ig, og) + k), g1 - g0)
            else:
                outs = []
                for grp in range(g0, g1):
                    r0, r1 = max(c0, grp * og) - grp * og, min(c1, (grp + 1) * og) - grp * og
                    xs = x[:, (grp - g0) * ig:(grp - g0 + 1) * ig]
                    outs.append(run(xs, w[grp - gb, :, r0 - jb:r1 - jb], 1))
                y = torch.cat(outs, 1)
    if b is not None:
        bb = b if b.shape[0] == c1 - c0 else b[c0:c1]
        y = y + bb.reshape((1, -1) + (1,) * nsp)
    return y


def pool_options(ctx) -> dict:
    node = ctx.node
    if node.op == "call_module":
        m = ctx.module()
        return {"ceil_mode": bool(getattr(m, "ceil_mode", False)),
                "count_include_pad": bool(getattr(m, "count_include_pad", True)),
                "divisor_override": getattr(m, "divisor_override", None),
                "return_indices": bool(getattr(m, "return_indices", False))}
    name = target_name(node, ctx.gm)
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


def adaptive_kind(ctx) -> str:
    if ctx.node.op == "call_module":
        return "max" if "Max" in type(ctx.module()).__name__ else "avg"
    return "max" if "max" in target_name(ctx.node, ctx.gm) else "avg"


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
    if ctx.layer.attrs.get("weight_t"):      # addmm(b, x, W) / x @ W: W is [in, out]
        y = torch.matmul(ins[0], w)
        return y if b is None else y + b
    return F.linear(ins[0], w, b)


def _box_slice(t, box, skip=()):
    """``t[...]`` restricted to the part that broadcasts against the output box ``box``
    (axes aligned right; size-1 axes and the output axes in ``skip`` are kept whole)."""
    off = box.shape[0] - t.dim()
    idx = tuple(slice(None) if (size == 1 or off + ax in skip or off + ax < 0)
                else slice(int(box[off + ax, 0]), int(box[off + ax, 1]))
                for ax, size in enumerate(t.shape))
    return t[idx]


def _sdpa(ctx, ins, in_boxes, out_box):
    """Attention for this device's (sample, head, query-row) box.  ``is_causal`` becomes an
    explicit mask offset by the first query row when the rows are split (torch aligns the
    causal triangle to the first row it is given); a constant mask is cut to the box's rows."""
    lay, node = ctx.layer, ctx.node
    got = dict(zip(("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale",
                    "enable_gqa"), node.args))
    got.update(node.kwargs)
    q, k, v = ins[:3]
    kind = lay.attrs.get("mask")
    mask = None
    if kind == "tensor":
        mask = ins[3]
    elif kind == "const":
        mask = _box_slice(const_value(ctx, got["attn_mask"]), out_box, skip=(3,))
    causal = bool(got.get("is_causal", False))
    l0, l1 = int(out_box[2, 0]), int(out_box[2, 1])
    if causal and (l0, l1) != (0, lay.out_shape[2]):
        i = torch.arange(l0, l1, device=q.device)[:, None]
        mask, causal = torch.arange(k.shape[2], device=q.device)[None, :] <= i, False
    kw = {"scale": got["scale"]} if got.get("scale") is not None else {}
    if got.get("enable_gqa"):
        kw["enable_gqa"] = True
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask,
                                          dropout_p=float(got.get("dropout_p", 0.0)),
                                          is_causal=causal, **kw)


def _mha(ctx, ins, in_boxes, out_box):
    """``nn.MultiheadAttention`` on this device's samples and query positions, with the
    device's (replicated) projection weights and a constant mask cut to its rows."""
    lay, node, mod = ctx.layer, ctx.node, ctx.module()
    t = str(node.target)
    got = dict(zip(("query", "key", "value", "key_padding_mask", "need_weights", "attn_mask",
                    "average_attn_weights", "is_causal"), node.args))
    got.update(node.kwargs)
    bf = lay.attrs["batch_first"]
    q, k, v = (x.transpose(0, 1) for x in ins) if bf else ins

    def p(name):
        return ctx.param(f"{t}.{name}") if f"{t}.{name}" in ctx.tensors else None
    mask = None
    if lay.attrs.get("mask") == "const":
        mask = const_value(ctx, got["attn_mask"])
        n_ax, l_ax = (0, 1) if bf else (1, 0)
        rows = slice(int(out_box[l_ax, 0]), int(out_box[l_ax, 1]))
        if mask.dim() == 2:
            mask = mask[rows]
        else:                    # [N·heads, L, S]: this device's samples' heads
            h = mod.num_heads
            mask = mask[int(out_box[n_ax, 0]) * h:int(out_box[n_ax, 1]) * h, rows]
    sep = not mod._qkv_same_embed_dim
    y, _ = F.multi_head_attention_forward(
        q, k, v, mod.embed_dim, mod.num_heads, p("in_proj_weight"), p("in_proj_bias"),
        None, None, False, mod.dropout, p("out_proj.weight"), p("out_proj.bias"),
        training=mod.training, need_weights=False, attn_mask=mask,
        use_separate_proj_weight=sep, q_proj_weight=p("q_proj_weight"),
        k_proj_weight=p("k_proj_weight"), v_proj_weight=p("v_proj_weight"), is_causal=False)
    return y.transpose(0, 1) if bf else y


def _matmul(ctx, ins, in_boxes, out_box):
    """``matmul``/``bmm`` call the model's op; ``baddbmm`` adds its (box of the) addend."""
    addend = ctx.layer.attrs.get("addend")
    if addend is None:
        return _call_node(ctx, ins)
    got = dict(zip(("input", "batch1", "batch2", "beta", "alpha"), ctx.node.args))
    got.update(ctx.node.kwargs)
    if addend == "tensor":
        inp = ins[2]
    elif isinstance(got.get("input"), torch.fx.Node):
        inp = _box_slice(const_value(ctx, got["input"]), out_box)
    else:
        inp = torch.as_tensor(got.get("input", 0.0), dtype=ins[0].dtype, device=ins[0].device)
    return torch.baddbmm(inp, ins[0], ins[1], beta=got.get("beta", 1), alpha=got.get("alpha", 1))


def _embedding(ctx, ins, in_boxes, out_box):
    w = ctx.param(ctx.weight_name)
    kw = {}
    if isinstance(ctx.node.target, torch._ops.OpOverload):   # aten: (weight, ids, padding_idx)
        pad = dict(zip(("weight", "indices", "padding_idx"), ctx.node.args)).get(
            "padding_idx", ctx.node.kwargs.get("padding_idx", -1))
        kw = {"padding_idx": None if pad is None or pad < 0 else int(pad)}
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
    if qual is None:                    # a constant computed from buffers (position ids)
        node = next(n for n in ctx.gm.graph.nodes if n.name == ctx.layer.attrs["const"])
        t = const_value(ctx, node)
        return _box_slice(t, out_box).expand(tuple(int(b - a) for a, b in out_box))
    if qual in ctx.shards or qual in ctx.tensors:
        t = ctx.param(qual)
    else:                               # a constant the tracer made (fx's _tensor_constant0)
        t = operator.attrgetter(qual)(ctx.gm)
    full = tuple(ctx.tensors[qual].shape) if qual in ctx.tensors else tuple(t.shape)
    need = broadcast_region(out_box, full)
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
         "norm": _generic, "softmax": _generic, "reduce": _generic, "sdpa": _sdpa,
         "matmul": _matmul, "lstm_cell": _lstm, "mha": _mha, "cumsum": _generic,
         "experts": _generic}
RULES["conv_transpose"] = _conv_transpose


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
            if a.op == "get_attr" and (str(a.target) in ctx.shards
                                       or ctx.layer.op != "eltwise"):
                slots.append((path, "param", str(a.target)))
                return None
            if is_const(ctx, a):
                val = const_value(ctx, a)
                if not isinstance(val, torch.Tensor):
                    return val
                if ctx.layer.op != "eltwise":
                    raise NotImplementedError(f"{ctx.where}: constant operand {a.name} of "
                                              f"node {node.name} (only element-wise layers "
                                              f"take constant tensors)")
                return _box_slice(val, ctx.out_box)
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
        if isinstance(mod, nn.RMSNorm):
            w = ctx.param(f"{node.target}.weight") if mod.weight is not None else None
            shape, eps = mod.normalized_shape, mod.eps
            return lambda ins: F.rms_norm(ins[0], shape, w, eps)
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
# constant operands (masks, positions, rotary tables)
# --------------------------------------------------------------------------------------------

#: Ops that read only the shape, dtype or device of a tensor argument.
_META_READS = {"getattr", "size", "sym_size", "dim", "numel", "zeros_like", "ones_like",
               "full_like", "empty_like", "new_zeros", "new_ones", "new_full", "new_empty",
               "new_tensor", "_assert_tensor_metadata"}


def _consts(gm) -> dict:
    c = gm.__dict__.get("_explorer_consts")
    if c is None:
        c = gm.__dict__["_explorer_consts"] = {}
    return c


def is_const(ctx, node) -> bool:
    """Whether ``node``'s value is computed without the model input (from buffers, shapes
    and constants only); such a tensor is evaluated once by :func:`const_value`."""
    memo = _consts(ctx.gm).setdefault("_is_const", {})
    todo = [node]
    while todo:                                  # iterative post-order (long chains)
        n = todo[-1]
        if n in memo:
            todo.pop()
            continue
        if n.op == "placeholder":
            memo[n] = False
            todo.pop()
            continue
        if n.op == "get_attr":              # a buffer or constant; a trainable parameter
            v = _fetch(ctx.gm, str(n.target))   # makes a layer (the importer's rule)
            memo[n] = not (isinstance(v, torch.Tensor) and v.requires_grad)
            todo.pop()
            continue
        if n.op == "call_module" and any(
                p.requires_grad for p in ctx.gm.get_submodule(n.target).parameters()):
            memo[n] = False                     # e.g. an embedding applied to position ids
            todo.pop()
            continue
        meta_only = target_name(n, ctx.gm) in _META_READS
        deps = [a for a in n.all_input_nodes if not meta_only]
        pending = [a for a in deps if a not in memo]
        if pending:
            todo.extend(pending)
            continue
        memo[n] = all(memo[a] for a in deps)
        todo.pop()
    return memo[node]


def _fetch(gm, target: str):
    obj = gm
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


def const_value(ctx, node):
    """The value of a constant node, evaluated (once per model) from the model's buffers.

    Tensor arguments of shape/dtype/device queries (``x.size()``, ``torch.full_like(x,
    v)``) are stand-ins of the traced shape on the model's device.  A constant computed from a
    trainable parameter is refused: its gradient would be lost.
    """
    cache = _consts(ctx.gm)
    if node in cache:
        return cache[node]
    dev = next((t.device for t in ctx.tensors.values()), torch.device("cpu"))

    def ev(n, meta_only):
        if n in cache:
            return cache[n]
        if meta_only and not is_const(ctx, n):
            m = n.meta.get("val", n.meta.get("tensor_meta"))
            if m is None or not hasattr(m, "shape"):
                raise NotImplementedError(f"{ctx.where}: constant {node.name} reads the shape "
                                          f"of {n.name}, which has none recorded")
            return torch.empty(tuple(int(v) for v in m.shape), dtype=m.dtype, device=dev)
        if n.op == "placeholder":
            raise NotImplementedError(f"{ctx.where}: {node.name} is not a constant: it reads "
                                      f"the model input")
        if n.op == "get_attr":
            v = _fetch(ctx.gm, str(n.target))
            if isinstance(v, torch.Tensor) and v.requires_grad:
                raise NotImplementedError(f"{ctx.where}: constant {node.name} is computed "
                                          f"from parameter {n.target}")
            cache[n] = v
            return v
        name = target_name(n, ctx.gm)
        mo = name in _META_READS
        args = torch.fx.node.map_arg(n.args, lambda a: ev(a, mo))
        kwargs = torch.fx.node.map_arg(n.kwargs, lambda a: ev(a, mo))
        with torch.no_grad():
            if n.op == "call_method":
                v = getattr(args[0], n.target)(*args[1:], **kwargs)
            elif n.op == "call_module":
                v = ctx.gm.get_submodule(n.target)(*args, **kwargs)
            elif name == "getattr" and args[1] == "device":
                v = dev
            else:
                v = n.target(*args, **kwargs)
        cache[n] = v
        return v
    return ev(node, False)


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
    name = target_name(node, ctx.gm)
    if name in IDENTITY_OPS or "dropout" in name or name == "expand":
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
            if is_const(ctx, a):              # a mask / rotary table: its box, once
                val = const_value(ctx, a)
                return _box_slice(val, out_box) if isinstance(val, torch.Tensor) else val
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
    ctx.out_box = out_box
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


# --------------------------------------------------------------------------------------------
# row-parallel (k) layers: partial sum of the group's tile, then bias and folded nodes
# --------------------------------------------------------------------------------------------


def compute_partial(ctx, ins, in_boxes, tile_box) -> torch.Tensor:
    """A row-parallel device's partial sum of its group's whole tile ``tile_box``: the matrix
    product over its slice of the reduction features (inputs and weight columns are that
    slice), without the bias, which :func:`finish` adds once after the reduce-scatter."""
    op = ctx.layer.op
    if op == "linear" and ctx.layer.attrs.get("weight_t"):   # W stored [in, out]
        y = torch.matmul(ins[0], ctx.param(ctx.weight_name))
    elif op == "linear":
        y = F.linear(ins[0], ctx.param(ctx.weight_name))
    elif op == "matmul":
        y = _call_node(ctx, ins)
    else:
        raise NotImplementedError(f"{ctx.where}: no row-parallel (k) rule for op {op!r}")
    want = G.box_shape(tile_box)
    if tuple(y.shape) != want:
        raise RuntimeError(f"{ctx.where}: partial tile has shape {tuple(y.shape)}, the tile "
                           f"{tile_box.tolist()} has {want}")
    return y


def finish(ctx, z, out_box) -> torch.Tensor:
    """The owned box of a row-parallel layer from its reduced part ``z``: the bias (this
    device's shard: the box's channel range), then the layer's folded nodes."""
    if ctx.layer.op == "linear" and ctx.bias_name:
        z = z + ctx.param(ctx.bias_name)
    fold = getattr(ctx, "_fold", None)
    if fold is None:
        fold = ctx._fold = compile_folded(ctx, out_box, z.dim())
    for fn in fold:
        z = fn(z)
    return z

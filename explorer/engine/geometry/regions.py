"""Input regions and parameter shards of a layer's output boxes.

:func:`input_regions` answers, for one layer op, which region of each input a device needs to
compute its output box: halos for convolution and pooling windows (:mod:`.windows`), full rows
for matrix products, per-input slices for concat.  :func:`param_shards` gives the part of each
weight it needs, :func:`shard_summary` the replica groups the weight gradients synchronise in.
"""

from __future__ import annotations

import numpy as np

from ..graph import Layer
from .boxes import full_box, volume
from .config import Config, output_boxes
from .windows import adaptive_window, window

# --------------------------------------------------------------------------------------------
# Input regions per op
# --------------------------------------------------------------------------------------------


def _broadcast_region(out_box, in_shape):
    """Region of a broadcast operand (aligned right; size-1 axes read index 0)."""
    nd_in = len(in_shape)
    reg = out_box[..., out_box.shape[-2] - nd_in:, :].copy()
    for ax, size in enumerate(in_shape):
        if size == 1:
            reg[..., ax, 0], reg[..., ax, 1] = 0, 1
    return reg


def input_regions(layer: Layer, index: int, boxes: np.ndarray) -> np.ndarray:
    """Region of input ``index`` (in the op's own input coordinates) that each output box needs.

    ``boxes`` is ``[..., out_ndim, 2]``; returns ``[..., in_ndim, 2]``.  Boxes with no extent
    may map to empty regions (concat inputs a device does not read).
    """
    op, a = layer.op, layer.attrs
    if op == "input":
        raise ValueError(f"input layer {layer.name} has no inputs")
    if not 0 <= index < len(layer.in_shapes):
        raise ValueError(f"layer {layer.name} ({op}) has {len(layer.in_shapes)} inputs, "
                         f"asked for input {index}")
    shp = tuple(layer.in_shapes[index])
    lead = boxes.shape[:-2]
    reg = full_box(shp, lead)
    if op in ("conv", "pool", "adaptive_pool"):
        reg[..., 0, :] = boxes[..., 0, :]
        if op == "conv":
            g = a.get("groups", 1)
            if g > 1:  # grouped/depthwise: output channel range -> its groups' input channels
                cout, cin = layer.out_shape[1], shp[1]
                og, ig = cout // g, cin // g
                reg[..., 1, 0] = (boxes[..., 1, 0] // og) * ig
                reg[..., 1, 1] = ((boxes[..., 1, 1] - 1) // og + 1) * ig
        else:
            reg[..., 1, :] = boxes[..., 1, :]
        nsp = len(shp) - 2
        for i in range(nsp):
            ax = 2 + i
            lo, hi = boxes[..., ax, 0], boxes[..., ax, 1]
            if op == "adaptive_pool":
                r0, r1 = adaptive_window(lo, hi, shp[ax], layer.out_shape[ax])
            else:
                r0, r1 = window(lo, hi, shp[ax], a["kernel"][i], a["stride"][i],
                                a["padding"][i], a.get("dilation", (1,) * nsp)[i])
            reg[..., ax, 0], reg[..., ax, 1] = r0, r1
    elif op == "upsample":
        # output row o reads input row floor(o·Hi/Ho) (nearest); (bi)linear also the next one
        reg[..., 0, :] = boxes[..., 0, :]
        reg[..., 1, :] = boxes[..., 1, :]
        for ax in range(2, len(shp)):
            hi_, ho = shp[ax], layer.out_shape[ax]
            lo = (boxes[..., ax, 0] * hi_) // ho
            top = ((boxes[..., ax, 1] - 1) * hi_) // ho + 1
            if a.get("mode") != "nearest":
                lo, top = np.maximum(lo - 1, 0), np.minimum(top + 1, hi_)
            reg[..., ax, 0], reg[..., ax, 1] = lo, np.maximum(top, lo)
    elif op == "linear":
        reg[..., :-1, :] = boxes[..., :-1, :]
    elif op == "matmul":
        # a[..., M, K] @ b[..., K, N]: a needs (batch, M rows, all K); b needs (batch, all K, N cols)
        nd = len(shp)
        bat = boxes[..., : boxes.shape[-2] - 2, :]
        if nd > 2:
            reg[..., : nd - 2, :] = _broadcast_region(bat, shp[: nd - 2])
        if index == 0:
            reg[..., nd - 2, :] = boxes[..., -2, :]
        else:
            reg[..., nd - 1, :] = boxes[..., -1, :]
    elif op == "sdpa":
        # q,k,v [N, H, L, D]: q needs its own query rows; k and v every key row of its heads.
        reg[..., 0, :] = boxes[..., 0, :]
        reg[..., 1, :] = boxes[..., 1, :]
        if index == 0:
            reg[..., 2, :] = boxes[..., 2, :]
    elif op == "eltwise":
        reg = _broadcast_region(boxes, shp)
    elif op == "concat":
        dim = a["dim"]
        off = a["offsets"][index]
        reg[...] = boxes
        lo = np.clip(boxes[..., dim, 0] - off, 0, shp[dim])
        hi = np.clip(boxes[..., dim, 1] - off, 0, shp[dim])
        reg[..., dim, 0], reg[..., dim, 1] = lo, np.maximum(hi, lo)
    elif op in ("norm", "softmax"):
        reg[...] = boxes
        for ax in a["full_axes"]:
            reg[..., ax, 0], reg[..., ax, 1] = 0, shp[ax]
    elif op == "reduce":
        dims, keep = a["dims"], a["keepdim"]
        j = 0
        for ax in range(len(shp)):
            if ax in dims:
                reg[..., ax, :] = (0, shp[ax])
                if keep:
                    j += 1
            else:
                reg[..., ax, :] = boxes[..., j, :]
                j += 1
    elif op == "embedding":
        reg[...] = boxes[..., : len(shp), :]
    elif op == "lstm_cell":
        reg[..., 0, :] = boxes[..., 0, :]
        if index == 2:  # cell state: only this device's hidden units
            reg[..., 1, :] = boxes[..., 1, :]
    elif op == "input":
        raise ValueError(f"input layer {layer.name} has no inputs")
    else:
        raise ValueError(f"no geometry rule for op {op!r} (layer {layer.name})")
    return reg


# --------------------------------------------------------------------------------------------
# Parameter shards
# --------------------------------------------------------------------------------------------


def param_shards(layer: Layer, boxes: np.ndarray) -> dict:
    """For each parameter: ``(logical_shape, [k, pnd, 2] boxes)`` each device needs.

    Weight rows follow the output-channel range (conv, linear, folded BatchNorm, LSTM gate
    blocks), embedding tables their column range; other dimensions (sample, height, width,
    length) replicate the shard.
    """
    out = {}
    c_ax = layer.axes.index("c") if "c" in layer.axes else None
    for name, shape in layer.params.items():
        shape = tuple(shape)
        op = layer.op
        if op == "lstm_cell" and name.startswith(("weight", "bias")):
            hidden = layer.out_shape[1]
            logical = (4, hidden) + shape[1:]
            reg = full_box(logical, boxes.shape[:-2])
            reg[..., 1, :] = boxes[..., 1, :]
            out[name] = (logical, reg)
            continue
        reg = full_box(shape, boxes.shape[:-2])
        if op == "embedding" and name == "weight":
            reg[..., 1, :] = boxes[..., 2, :]
        elif op in ("eltwise", "param") or name.startswith("operand"):
            reg = _broadcast_region(boxes, shape)
        elif op == "norm":
            pass  # normalised axes are never split: affine weights replicate
        elif c_ax is not None and shape and shape[0] == layer.out_shape[c_ax]:
            reg[..., 0, :] = boxes[..., c_ax, :]
        out[name] = (shape, reg)
    return out


def shard_summary(layer: Layer, cfg: Config):
    """Per device: (output box, parameter elements it holds); and the replica groups.

    Returns ``(boxes, param_elems[k], groups)`` where ``groups`` is a list of
    ``(param elements of the shard, [device positions holding it])`` over all parameters.
    """
    boxes = output_boxes(layer, cfg)
    shards = param_shards(layer, boxes)
    elems = np.zeros(cfg.total, dtype=np.int64)
    groups = []
    for _, (_, reg) in shards.items():
        vol = volume(reg)
        elems += vol
        keyed: dict = {}
        for k, row in enumerate(reg.reshape(cfg.total, -1).tolist()):
            keyed.setdefault(tuple(row), []).append(k)
        for members in keyed.values():
            groups.append((int(vol[members[0]]), members))
    return boxes, elems, groups

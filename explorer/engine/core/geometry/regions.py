"""Input regions and parameter shards of a layer's output boxes.

:func:`input_regions` answers, for one layer op, which region of each input a device needs to
compute its output box: halos for convolution and pooling windows (:mod:`.windows`; the rows
whose taps reach the box for a transposed convolution), full rows for matrix products, every
key position for attention (``sdpa``, ``mha``: the query rows follow the box), per-input slices
for concat, the whole scanned axis for ``cumsum``.  :func:`param_shards` gives the part of
each weight it needs (column ranges for a ``linear`` whose weight is stored ``[in, out]``; an
``experts`` layer's experts and output columns),
:func:`shard_summary` the replica groups the weight gradients synchronise in.
"""

from __future__ import annotations

import numpy as np

from explorer.engine.core.layergraph import Layer
from explorer.engine.core.geometry.boxes import full_box, volume
from explorer.engine.core.geometry.config import Config, compute_boxes, output_boxes
from explorer.engine.core.geometry.windows import adaptive_window, transpose_window, window

# --------------------------------------------------------------------------------------------
# Input regions per op
# --------------------------------------------------------------------------------------------


def broadcast_region(out_box, in_shape):
    """Region of a broadcast operand (aligned right; size-1 axes read index 0)."""
    nd_in = len(in_shape)
    reg = out_box[..., out_box.shape[-2] - nd_in:, :].copy()
    for ax, size in enumerate(in_shape):
        if size == 1:
            reg[..., ax, 0], reg[..., ax, 1] = 0, 1
    return reg


def input_regions(layer: Layer, index: int, boxes: np.ndarray,
                  reduce: np.ndarray | None = None) -> np.ndarray:
    """Region of input ``index`` (in the op's own input coordinates) that each output box needs.

    ``boxes`` is ``[..., out_ndim, 2]``; returns ``[..., in_ndim, 2]``.  Boxes with no extent
    may map to empty regions (concat inputs a device does not read).  ``reduce``
    (``[..., 2]``, matrix products only) limits the reduction features a box sums over: the
    ``k`` slice of a row-parallel device (:func:`.config.compute_boxes`, whose tiles are then
    the ``boxes``); ``None`` is all of them.
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
    elif op == "conv_transpose":
        # output rows receive from the input rows whose strided, dilated taps land on them;
        # channels as for a grouped convolution (an output channel reads its group's inputs)
        reg[..., 0, :] = boxes[..., 0, :]
        g = a.get("groups", 1)
        if g > 1:
            og, ig = layer.out_shape[1] // g, shp[1] // g
            reg[..., 1, 0] = (boxes[..., 1, 0] // og) * ig
            reg[..., 1, 1] = ((boxes[..., 1, 1] - 1) // og + 1) * ig
        nsp = len(shp) - 2
        for i in range(nsp):
            ax = 2 + i
            reg[..., ax, 0], reg[..., ax, 1] = transpose_window(
                boxes[..., ax, 0], boxes[..., ax, 1], shp[ax], a["kernel"][i], a["stride"][i],
                a["padding"][i], a.get("dilation", (1,) * nsp)[i])
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
    elif op in ("linear", "experts"):
        # experts: x [n, E, C, in] -> [n, E, C, out]: the box's samples, experts and slots,
        # every input feature
        reg[..., :-1, :] = boxes[..., :-1, :]
        if reduce is not None:
            reg[..., -1, :] = reduce
    elif op == "matmul" and index == 2:
        reg = broadcast_region(boxes, shp)   # baddbmm's addend: its box of the output
    elif op == "matmul":
        # a[..., M, K] @ b[..., K, N]: a needs (batch, M rows, all K); b needs (batch, all K, N cols)
        nd = len(shp)
        bat = boxes[..., : boxes.shape[-2] - 2, :]
        if nd > 2:
            reg[..., : nd - 2, :] = broadcast_region(bat, shp[: nd - 2])
        if index == 0:
            reg[..., nd - 2, :] = boxes[..., -2, :]
            if reduce is not None:
                reg[..., nd - 1, :] = reduce
        else:
            reg[..., nd - 1, :] = boxes[..., -1, :]
            if reduce is not None:
                reg[..., nd - 2, :] = reduce
    elif op == "sdpa" and index == 3:
        # a mask [.., Lq, Lk] computed from the input: the box's query rows, every key
        reg = broadcast_region(boxes, shp)
        reg[..., -1, 0], reg[..., -1, 1] = 0, shp[-1]
    elif op == "mha":
        # (n, l, e) or (l, n, e): the query needs the box's samples and positions, keys and
        # values every position of those samples; the embedding is always whole.
        n_ax, l_ax = (0, 1) if a.get("batch_first") else (1, 0)
        reg[..., n_ax, :] = boxes[..., n_ax, :]
        if index == 0:
            reg[..., l_ax, :] = boxes[..., l_ax, :]
    elif op == "sdpa":
        # q,k,v [N, H, L, D]: q needs its own query rows; k and v every key row of its heads.
        reg[..., 0, :] = boxes[..., 0, :]
        reg[..., 1, :] = boxes[..., 1, :]
        if index == 0:
            reg[..., 2, :] = boxes[..., 2, :]
    elif op == "eltwise":
        reg = broadcast_region(boxes, shp)
    elif op == "concat":
        dim = a["dim"]
        off = a["offsets"][index]
        reg[...] = boxes
        lo = np.clip(boxes[..., dim, 0] - off, 0, shp[dim])
        hi = np.clip(boxes[..., dim, 1] - off, 0, shp[dim])
        reg[..., dim, 0], reg[..., dim, 1] = lo, np.maximum(hi, lo)
    elif op in ("norm", "softmax", "cumsum"):
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


def param_shards(layer: Layer, boxes: np.ndarray, reduce: np.ndarray | None = None) -> dict:
    """For each parameter: ``(logical_shape, [k, pnd, 2] boxes)`` each device needs.

    Weight rows follow the output-channel range (conv, linear, folded BatchNorm, LSTM gate
    blocks), embedding tables their column range; other dimensions (sample, height, width,
    length) replicate the shard.  A row-parallel linear (``reduce`` given, ``boxes`` its
    tiles) holds the weight columns of its feature slice; its bias (added once, after the
    reduce-scatter, to the owned box) follows the channel range and so is replicated over the
    group, whose members' bias gradients sum like any replica group's.
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
        if op == "conv_transpose" and name == "weight":
            out[name] = _transposed_weight_shards(layer, shape, boxes)
            continue
        reg = full_box(shape, boxes.shape[:-2])
        if op == "embedding" and name == "weight":
            reg[..., 1, :] = boxes[..., 2, :]
        elif op == "linear" and layer.attrs.get("weight_t") and name == "weight":
            reg[..., 1, :] = boxes[..., c_ax, :]     # weight [in, out]: output columns
            if reduce is not None:
                reg[..., 0, :] = reduce              # row-parallel: its input-feature rows
        elif op == "experts":
            # W [E, in, out]: the box's experts (e) and output features (c), every input row
            reg[..., 0, :] = boxes[..., 1, :]
            reg[..., 2, :] = boxes[..., 3, :]
        elif op in ("eltwise", "param") or name.startswith("operand"):
            reg = broadcast_region(boxes, shape)
        elif op == "norm":
            pass  # normalised axes are never split: affine weights replicate
        elif c_ax is not None and shape and shape[0] == layer.out_shape[c_ax]:
            reg[..., 0, :] = boxes[..., c_ax, :]
            if reduce is not None and op == "linear" and len(shape) == 2 and \
                    shape[1] == layer.in_shapes[0][-1]:
                reg[..., 1, :] = reduce
        out[name] = (shape, reg)
    return out


def _transposed_weight_shards(layer: Layer, shape, boxes):
    """``(logical shape, boxes)`` of a transposed convolution's weight ``[Cin, Cout/g, k...]``.

    Ungrouped: the output-channel range on dim 1.  Grouped: the weight in its logical shape
    ``[g, Cin/g, Cout/g, k...]``; a channel range inside one group holds that group's columns,
    one made of whole groups those groups.  A range cutting through groups on both sides of a
    group boundary is no box of that shape: it holds the whole groups it touches, and every
    device touching those groups the same hull (the tiles connected through shared groups),
    so shards are equal or disjoint and the hull's holders sum its gradient as replicas.
    """
    g = int(layer.attrs.get("groups", 1))
    lead = boxes.shape[:-2]
    if g == 1:
        reg = full_box(shape, lead)
        reg[..., 1, :] = boxes[..., 1, :]
        return shape, reg
    og, ig = int(shape[1]), int(shape[0]) // g
    logical = (g, ig, og) + tuple(shape[2:])
    c0, c1 = boxes[..., 1, 0], boxes[..., 1, 1]
    empty = c1 <= c0
    g0, g1 = c0 // og, (c1 - 1) // og + 1
    single = (g1 - g0 == 1) & ~empty
    cuts = ~single & ~empty & ((c0 % og != 0) | (c1 % og != 0))
    lo, hi = np.where(empty, 0, g0), np.where(empty, 0, g1)
    j0, j1 = np.where(single, c0 - g0 * og, 0), np.where(single, c1 - g0 * og, og)
    if lead and cuts.any():
        # hulls of the cutting tiles, merged while they share a group (per configuration)
        s0, s1 = np.where(cuts, g0, 0), np.where(cuts, g1, 0)
        pair = cuts[..., :, None] & cuts[..., None, :]
        for _ in range(boxes.shape[-3]):
            meet = (pair & (s0[..., :, None] < s1[..., None, :])
                    & (s0[..., None, :] < s1[..., :, None]))
            n0 = np.where(meet, s0[..., None, :], np.iinfo(np.int64).max).min(-1)
            n1 = np.where(meet, s1[..., None, :], 0).max(-1)
            n0, n1 = np.where(cuts, n0, s0), np.where(cuts, n1, s1)
            if np.array_equal(n0, s0) and np.array_equal(n1, s1):
                break
            s0, s1 = n0, n1
        touch = (cuts[..., None, :] & (s0[..., None, :] < g1[..., :, None])
                 & (g0[..., :, None] < s1[..., None, :]) & ~empty[..., :, None])
        hit = touch.any(-1)
        lo = np.where(hit, np.where(touch, s0[..., None, :], np.iinfo(np.int64).max).min(-1), lo)
        hi = np.where(hit, np.where(touch, s1[..., None, :], 0).max(-1), hi)
        j0, j1 = np.where(hit, 0, j0), np.where(hit, og, j1)
    elif cuts.any():
        j0, j1 = np.where(cuts, 0, j0), np.where(cuts, og, j1)
    reg = full_box(logical, lead)
    reg[..., 0, 0], reg[..., 0, 1] = lo, hi
    reg[..., 2, 0], reg[..., 2, 1] = np.where(empty, 0, j0), np.where(empty, 0, j1)
    return logical, reg


def shard_summary(layer: Layer, cfg: Config):
    """Per device: (output box, parameter elements it holds); and the replica groups.

    Returns ``(boxes, param_elems[k], groups)`` where ``groups`` is a list of
    ``(param elements of the shard, [device positions holding it])`` over all parameters.
    """
    boxes = output_boxes(layer, cfg)
    tiles, reduce = compute_boxes(layer, cfg)
    shards = param_shards(layer, tiles, reduce)
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

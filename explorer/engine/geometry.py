"""Tiling geometry: the one place that knows which part of which tensor each device touches.

For a layer and a :class:`Config` (degrees per dimension letter + the devices used) this module
answers three questions, and nothing else in the code base answers them:

* :func:`output_boxes` – the box of the output tensor each device owns (equal, balanced splits);
* :func:`input_regions` / :func:`edge_regions` – the region of each input (and, through the
  edge's folded view ops, of the producer's output) a device needs to compute its box: halos for
  convolution and pooling windows, full rows for matrix products, per-input slices for concat;
* :func:`param_shards` – the part of each weight a device needs.

A *box* is an integer array ``[..., ndim, 2]`` of half-open ``(start, stop)`` ranges; every
function is vectorised over the leading axes so the cost model can ask for thousands of boxes
in one call.  The cost model (t_X, t_S, memory), the views and the runtime all use these.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np

from .graph import Layer, LayerGraph, Edge

# --------------------------------------------------------------------------------------------
# Configurations
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Config:
    """A parallelization configuration (paper Section 4) with the devices that run it.

    ``degrees`` lists ``(letter, degree)`` in the layer's axis order; the product of the
    degrees equals the number of ``devices``.  Device ``devices[k]`` owns tile ``k`` of the
    row-major tile grid (last letter fastest).

    >>> Config((("n", 2), ("c", 1), ("h", 2), ("w", 1)), (0, 1, 2, 3)).label()
    'n2 h2'
    """

    degrees: tuple
    devices: tuple

    def __post_init__(self):
        degs = tuple((str(k), int(v)) for k, v in self.degrees)
        object.__setattr__(self, "degrees", degs)
        object.__setattr__(self, "devices", tuple(int(d) for d in self.devices))
        for k, v in degs:
            if v < 1:
                raise ValueError(f"degree {k}={v} must be a positive integer")
        total = math.prod(v for _, v in degs)
        if total != len(self.devices):
            parts = " × ".join(f"{k}={v}" for k, v in degs if v > 1) or "1"
            raise ValueError(
                f"degrees {parts} = {total} need {total} devices, got {len(self.devices)} "
                f"({list(self.devices)})")
        if len(set(self.devices)) != len(self.devices):
            raise ValueError(f"devices {list(self.devices)} repeat a device")

    @property
    def total(self) -> int:
        return len(self.devices)

    def deg(self, letter: str) -> int:
        for k, v in self.degrees:
            if k == letter:
                return v
        return 1

    def as_dict(self) -> dict:
        return {k: v for k, v in self.degrees}

    def label(self) -> str:
        s = " ".join(f"{k}{v}" for k, v in self.degrees if v > 1)
        return s or "1"

    def key(self) -> str:
        """Text form used in pins and plan JSON: ``n=2,c=1,h=2,w=1@0,1,2,3``."""
        return ",".join(f"{k}={v}" for k, v in self.degrees) + "@" + ",".join(
            map(str, self.devices))


def parse_config(text: str) -> tuple[dict, tuple | None]:
    """Parse a pin's right-hand side: ``n=2,c=2`` and/or ``@0,1,2,3`` (devices).

    Returns ``(degrees, devices)``; either may be empty/None.

    >>> parse_config("n=2,h=2@0,1,2,3")
    ({'n': 2, 'h': 2}, (0, 1, 2, 3))
    >>> parse_config("@2,3")
    ({}, (2, 3))
    """
    text = text.strip().strip("{}").replace(" ", "")
    degs_txt, _, dev_txt = text.partition("@")
    degrees: dict = {}
    if degs_txt:
        for part in degs_txt.split(","):
            k, eq, v = part.partition("=")
            if not eq or k not in ("n", "c", "h", "w", "l"):
                raise ValueError(
                    f"cannot read {part!r} in configuration {text!r}: write degrees as "
                    f"n=2,c=1,h=2,w=1 (letters n,c,h,w,l) and devices after @, e.g. @0,1")
            try:
                degrees[k] = int(v)
            except ValueError:
                raise ValueError(f"degree {k}={v!r} in {text!r} is not an integer") from None
            if degrees[k] < 1:
                raise ValueError(f"degree {k}={degrees[k]} in {text!r} must be ≥ 1")
    devices = None
    if dev_txt:
        try:
            devices = tuple(int(d) for d in dev_txt.split(","))
        except ValueError:
            raise ValueError(f"devices {dev_txt!r} in {text!r} must be integers like @0,1") from None
    return degrees, devices


def _divisors(n: int) -> list:
    return [d for d in range(1, n + 1) if n % d == 0]


def enumerate_configs(layer: Layer, n_devices: int, devices: tuple | None = None,
                      max_total: int | None = None) -> list:
    """Every configuration of ``layer`` whose degrees multiply to a divisor of ``n_devices``.

    Degrees are divisors of the device count (so device blocks tile the machine evenly), no
    larger than the dimension they split; the sample dimension must divide the batch exactly
    (every device then trains on the same number of samples).  A configuration of total degree
    k runs on the first k devices of ``devices`` (default ``0..n_devices-1``; presets order
    devices so that the first k share a node).  Layers without parallelizable dimensions get the
    single configuration on device 0.
    """
    if n_devices < 1:
        raise ValueError(f"need at least 1 device, got {n_devices}")
    order = tuple(range(n_devices)) if devices is None else tuple(devices)
    cap = n_devices if max_total is None else max_total
    per_dim = []
    for letter in layer.dims:
        size = layer.size(letter)
        opts = []
        for d in _divisors(n_devices):
            if d > size or d > cap:
                continue
            if letter == "n" and size % d:
                continue
            opts.append(d)
        per_dim.append(opts)
    out = []
    for combo in itertools.product(*per_dim):
        total = math.prod(combo)
        if total > cap or n_devices % total:
            continue
        if devices is not None and total != len(order):
            continue
        out.append(Config(tuple(zip(layer.dims, combo)), order[:total]))
    out.sort(key=lambda c: (c.total, [-v for _, v in c.degrees]))
    return out


# --------------------------------------------------------------------------------------------
# Output ownership
# --------------------------------------------------------------------------------------------


def split_range(size: int, degree: int, index):
    """Balanced split of ``range(size)`` into ``degree`` parts; part ``index`` (vectorised)."""
    index = np.asarray(index)
    return index * size // degree, (index + 1) * size // degree


def tile_indices(cfg: Config) -> np.ndarray:
    """``[k, len(degrees)]`` tile multi-index of each device position (row-major)."""
    shape = [v for _, v in cfg.degrees]
    if not shape:
        return np.zeros((1, 0), dtype=np.int64)
    return np.stack(np.unravel_index(np.arange(cfg.total), shape), axis=1).astype(np.int64)


def output_boxes(layer: Layer, cfg: Config) -> np.ndarray:
    """``[k, ndim, 2]``: the output box owned by ``cfg.devices[k]``.

    Every element of the output is owned by exactly one device of the configuration.
    """
    nd = len(layer.out_shape)
    boxes = np.zeros((cfg.total, nd, 2), dtype=np.int64)
    boxes[:, :, 1] = np.asarray(layer.out_shape, dtype=np.int64)
    tiles = tile_indices(cfg)
    for j, (letter, deg) in enumerate(cfg.degrees):
        if deg == 1:
            continue
        ax = layer.axis_of(letter)
        lo, hi = split_range(layer.out_shape[ax], deg, tiles[:, j])
        boxes[:, ax, 0], boxes[:, ax, 1] = lo, hi
    return boxes


def stacked_output_boxes(layer: Layer, cfgs: list):
    """Output boxes of many configurations at once: ``([C, Dmax, nd, 2], used [C, Dmax])``.

    Row ``k`` of configuration ``i`` is the tile of ``cfgs[i].devices[k]`` (same tiling as
    :func:`output_boxes`); rows past a configuration's device count are empty and unused.
    """
    C = len(cfgs)
    Dm = max(c.total for c in cfgs)
    nd = len(layer.out_shape)
    boxes = np.zeros((C, Dm, nd, 2), dtype=np.int64)
    boxes[..., 1] = np.asarray(layer.out_shape, dtype=np.int64)
    total = np.array([c.total for c in cfgs])
    used = np.arange(Dm)[None, :] < total[:, None]
    rem = np.broadcast_to(np.arange(Dm)[None, :], (C, Dm)).copy()
    for letter in reversed(layer.dims):          # row-major: last letter varies fastest
        deg = np.array([c.deg(letter) for c in cfgs])[:, None]
        idx = rem % deg
        rem //= deg
        ax = layer.axis_of(letter)
        size = layer.out_shape[ax]
        boxes[:, :, ax, 0] = idx * size // deg
        boxes[:, :, ax, 1] = (idx + 1) * size // deg
    boxes[~used] = 0
    return boxes, used


def volume(boxes: np.ndarray) -> np.ndarray:
    """Number of elements in each box (``[...]``); empty boxes count 0."""
    ext = np.maximum(boxes[..., 1] - boxes[..., 0], 0)
    return np.prod(ext, axis=-1)


def overlap(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Volume of the intersection of (broadcast) boxes ``a`` and ``b``, as float64."""
    out = None
    for ax in range(a.shape[-2]):
        lo = np.maximum(a[..., ax, 0], b[..., ax, 0])
        hi = np.minimum(a[..., ax, 1], b[..., ax, 1])
        ext = np.maximum(hi - lo, 0).astype(np.float64)
        out = ext if out is None else out * ext
    return out


def intersect(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Elementwise (broadcast) intersection of boxes; empty results have start ≥ stop."""
    lo = np.maximum(a[..., 0], b[..., 0])
    hi = np.minimum(a[..., 1], b[..., 1])
    return np.stack([lo, np.maximum(hi, lo)], axis=-1)


def full_box(shape, lead=()) -> np.ndarray:
    box = np.zeros(tuple(lead) + (len(shape), 2), dtype=np.int64)
    box[..., 1] = np.asarray(shape, dtype=np.int64)
    return box


# --------------------------------------------------------------------------------------------
# Input regions per op
# --------------------------------------------------------------------------------------------


def _window(lo, hi, size, k, s, p, d):
    """Input rows a sliding window (kernel k, stride s, padding p, dilation d) reads."""
    a = lo * s - p
    b = (hi - 1) * s - p + d * (k - 1) + 1
    return np.clip(a, 0, size), np.clip(b, 0, size)


def _adaptive(lo, hi, size, out):
    return (lo * size) // out, -((-hi * size) // out)


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
                r0, r1 = _adaptive(lo, hi, shp[ax], layer.out_shape[ax])
            else:
                r0, r1 = _window(lo, hi, shp[ax], a["kernel"][i], a["stride"][i],
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
# View transforms folded onto edges (consumer coordinates -> producer coordinates)
# --------------------------------------------------------------------------------------------


def _reshape_groups(src, dst):
    """Pair up axes of ``src`` and ``dst`` shapes into groups with equal element counts."""
    groups, i, j = [], 0, 0
    while i < len(src) or j < len(dst):
        gi, gj = [], []
        pi = pj = 1
        if i < len(src):
            gi.append(i); pi *= src[i]; i += 1
        if j < len(dst):
            gj.append(j); pj *= dst[j]; j += 1
        while pi != pj:
            if pi < pj and i < len(src):
                gi.append(i); pi *= src[i]; i += 1
            elif j < len(dst):
                gj.append(j); pj *= dst[j]; j += 1
            else:
                gi.extend(range(i, len(src))); i = len(src)
                break
        # absorb trailing size-1 axes into this group
        while i < len(src) and src[i] == 1 and (j >= len(dst) or dst[j] != 1):
            gi.append(i); i += 1
        while j < len(dst) and dst[j] == 1 and (i >= len(src) or src[i] != 1):
            gj.append(j); j += 1
        groups.append((gi, gj))
    return groups


def _reshape_to_src(boxes, src, dst):
    """Bounding box on ``src`` of the elements a box on the reshaped ``dst`` view covers."""
    lead = boxes.shape[:-2]
    out = full_box(src, lead)
    for gi, gj in _reshape_groups(tuple(src), tuple(dst)):
        if not gi:
            continue
        dsz = [dst[j] for j in gj]
        # flat [lo, hi) inside the group, row-major over dst axes (superset if not contiguous)
        lo = np.zeros(lead, dtype=np.int64)
        last = np.zeros(lead, dtype=np.int64)
        for j, size in zip(gj, dsz):
            lo = lo * size + boxes[..., j, 0]
            last = last * size + (boxes[..., j, 1] - 1)
        hi = last + 1
        empty = np.zeros(lead, dtype=bool)
        for j in gj:
            empty |= boxes[..., j, 1] <= boxes[..., j, 0]
        full = np.zeros(lead, dtype=bool)  # once a range spans >1 value, inner axes are full
        for n_ax, ax in enumerate(gi):
            inner = math.prod(src[k] for k in gi[n_ax + 1:])
            a0 = lo // inner
            a1 = (hi - 1) // inner + 1
            s0 = np.where(full, 0, a0)
            s1 = np.where(full, src[ax], a1)
            out[..., ax, 0], out[..., ax, 1] = s0, s1
            single = (a1 - a0) == 1
            lo = np.where(single, lo - a0 * inner, lo)
            hi = np.where(single, hi - a0 * inner, hi)
            full = full | ~single
        for ax in gi:
            out[..., ax, 1] = np.where(empty, out[..., ax, 0], out[..., ax, 1])
    return out


def apply_transforms(boxes: np.ndarray, transforms) -> np.ndarray:
    """Map boxes on the consumer's view of a tensor back onto the producer's tensor."""
    for t in transforms:
        kind = t[0]
        if kind == "item":
            continue
        if kind == "reshape":
            _, src, dst = t
            boxes = _reshape_to_src(boxes, tuple(src), tuple(dst))
        elif kind == "permute":
            perm = t[1]  # dst axis i is src axis perm[i]
            out = np.empty_like(boxes)
            for i, p in enumerate(perm):
                out[..., p, :] = boxes[..., i, :]
            boxes = out
        elif kind == "select":
            _, dim, idx = t
            ins = np.zeros(boxes.shape[:-2] + (1, 2), dtype=np.int64)
            ins[..., 0, 0], ins[..., 0, 1] = idx, idx + 1
            boxes = np.concatenate([boxes[..., :dim, :], ins, boxes[..., dim:, :]], axis=-2)
        elif kind == "slice":
            _, dim, start = t[:3]
            boxes = boxes.copy()
            boxes[..., dim, :] += start
        else:
            raise ValueError(f"unknown edge transform {kind!r}")
    return boxes


def edge_regions(graph: LayerGraph, edge: Edge, boxes: np.ndarray) -> np.ndarray:
    """Region of the producer's output that each consumer output box needs through ``edge``."""
    reg = input_regions(graph.layer(edge.dst), edge.index, boxes)
    return apply_transforms(reg, edge.transforms)


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
        elif op == "eltwise" or name.startswith("operand"):
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

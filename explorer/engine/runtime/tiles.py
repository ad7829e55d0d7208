"""Aten calls on tiles: one operator of an operator-level plan computed on local shapes.

A worker of a Tofu plan holds each tensor only inside its box and assembles, for each operator,
the input regions the plan gives it (:mod:`.opexec`).  :func:`compute` runs the aten call on
those region tiles so that its result is exactly the worker's output box:

* element-wise ops, normalisations over unsplit axes, matrix products (row / column blocks;
  a split reduction axis gives partial sums the executor combines), sums and ``amax``, ``t``
  / ``transpose`` / ``permute`` run unchanged on the tiles (``GENERIC``);
* convolutions and max pooling run on a tile with its halo, padded only at the tensor's true
  border (:func:`explorer.engine.core.geometry.window_pads`), their backward ops likewise; a
  convolution whose kernel window's reduction is split runs the worker's taps ``[j0, j1)``
  as a convolution of their own (padding ``p − d·j0``); max pooling's indices are
  translated to the whole tensor's positions;
* a transposed convolution runs on the input rows whose taps reach the box
  (:func:`~explorer.engine.core.geometry.transpose_window`) without padding, cut to the box
  (:func:`~explorer.engine.core.geometry.transpose_crop`); its input gradient is a convolution
  of the output gradient, its filter gradient a convolution's with the roles swapped;
* ``tril`` / ``triu`` of a tile at rows ``r0``, columns ``c0`` move the diagonal by
  ``r0 − c0``; ``slice_backward`` places the gradient rows that land in the box;
* views (``view``, ``reshape``, ``expand``, ``select``, ``slice``, ``split``, ``unbind``,
  ``cat``) and tensor factories take the local box's shape (a view whose box's preimage is
  not a box gathers it from the region); ``mean`` divides its local sum by the whole
  tensor's count.

Anything else raises :class:`Fallback` and the executor computes that operator on full-size
zero-padded buffers (correct, but not tile-local: the run reports which targets did, with the
reason; ``benchmarks/tofu_fallbacks.py`` surveys the example models).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from explorer.engine.core.geometry import transpose_crop, window_pads

#: aten targets whose result at an index depends only on the inputs at the regions the plan
#: gives (no position-dependent argument): run unchanged on the tiles
GENERIC = {
    "abs", "neg", "relu", "relu_", "gelu", "gelu_backward", "silu", "silu_", "silu_backward",
    "sigmoid", "sigmoid_", "sigmoid_backward", "tanh", "tanh_", "tanh_backward", "exp", "log",
    "sqrt", "rsqrt", "pow", "mul", "mul_", "div", "div_", "add", "add_", "sub", "sub_", "rsub",
    "threshold_backward", "where", "clamp", "clamp_min", "clamp_max", "hardtanh",
    "hardtanh_backward", "hardtanh_", "leaky_relu", "leaky_relu_backward", "elu",
    "elu_backward", "erf", "sin", "cos", "reciprocal", "square", "maximum", "minimum", "eq",
    "ne", "gt", "lt", "ge", "le", "logical_not", "masked_fill", "_to_copy", "clone", "copy",
    "copy_", "fill", "fill_", "ones_like", "zeros_like", "full_like", "empty_like",
    "_log_softmax", "_softmax", "_safe_softmax", "_log_softmax_backward_data",
    "_softmax_backward_data", "t",
    "transpose", "permute", "unsqueeze", "squeeze", "mm", "bmm", "addmm", "baddbmm",
    "matmul", "sum", "amax", "amin", "native_layer_norm", "native_layer_norm_backward",
    "native_batch_norm", "native_batch_norm_backward", "hardswish", "hardswish_backward",
    "hardsigmoid", "hardsigmoid_backward", "mish", "softplus", "softplus_backward",
    "detach", "alias", "bernoulli_", "bernoulli"}
#: of those, the ones whose result may cover the first input's whole region and is then cut
#: to the output box (a normalisation reads whole rows / channels for its statistics)
CROP = {"native_layer_norm", "native_layer_norm_backward", "native_batch_norm",
        "native_batch_norm_backward", "_softmax", "_safe_softmax", "_log_softmax",
        "_softmax_backward_data", "_log_softmax_backward_data"}
#: of those, the ones that take ``None`` for an input the description does not read (the
#: running statistics of a batch norm in training, its weight for the weight's gradient; a
#: layer norm's weight and bias for its mean and rstd, its bias for the input's gradient)
NONE_OK = {"native_batch_norm", "native_batch_norm_backward", "native_layer_norm",
           "native_layer_norm_backward"}
#: tensor factories whose first size argument becomes the local box's shape
_FACTORIES = {"zeros": 0, "ones": 0, "empty": 0, "full": 0, "new_zeros": 1, "new_ones": 1,
              "new_empty": 1, "new_full": 1}


class Fallback(Exception):
    """This operator cannot run on its tiles (the executor computes it on full buffers)."""


def extents(box) -> tuple:
    return tuple(int(b - a) for a, b in np.asarray(box))


def compute(target, fn, args, kwargs, index, tile_of, out_box, out_shape):
    """The output tile ``out_box`` of aten ``fn`` (``target`` its name) whose tensor arguments
    in ``args`` / ``kwargs`` are region tiles; ``tile_of(tensor)`` gives ``(box, shape)`` of a
    tile (its region and the whole tensor's shape); ``index`` the output's index of a
    multi-output op.  Raises :class:`Fallback` when the op has no tile rule or its tiles do
    not fit one."""
    rule = _RULES.get(target)
    if rule is None:
        if target not in GENERIC:
            raise Fallback(f"no tile rule for aten.{target}")
        rule = _generic
    want = extents(out_box) if out_shape else ()
    res = rule(target, fn, args, kwargs, index, tile_of, out_box, out_shape)
    if tuple(res.shape) != want and not (want == (1,) and res.dim() == 0):
        raise Fallback(f"aten.{target} on tiles gives {list(res.shape)}, the box is "
                       f"{list(want)}")
    return res


def _pick(res, index):
    return res[index] if isinstance(res, (tuple, list)) else res


def _generic(target, fn, args, kwargs, index, tile_of, out_box, out_shape):
    if any(a is None for a in args[:1]):
        raise Fallback(f"aten.{target}: an input the description does not read")
    res = _pick(fn(*args, **kwargs), index)
    want = extents(out_box) if out_shape else ()
    if target in CROP and tuple(res.shape) != want and torch.is_tensor(args[0]):
        box, _ = tile_of(args[0])
        if box is not None and res.dim() == len(out_box) and \
                tuple(res.shape) == extents(box):
            res = res[tuple(slice(int(a - o), int(b - o))
                            for (a, b), o in zip(out_box, box[:, 0]))]
    return res


def _bn(target, fn, args, kwargs, index, tile_of, out_box, out_shape):
    """A batch norm's saved mean over a part of the batch (a plan that splits the reduction
    and sums the parts) is the part's sum over the whole tensor's count, as ``mean``'s; its
    other outputs read whole channels and run unchanged on the tiles."""
    x = args[0]
    if index == 1 and torch.is_tensor(x):
        _, shape = tile_of(x)
        if shape is not None:
            dims = [0] + list(range(2, x.dim()))
            return x.sum(dims) / max(int(np.prod([shape[d] for d in dims])), 1)
    return _generic(target, fn, args, kwargs, index, tile_of, out_box, out_shape)


def _bn_backward(target, fn, args, kwargs, index, tile_of, out_box, out_shape):
    """A batch norm's bias gradient is a sum of the output gradient (all its description
    reads); its other gradients run unchanged on the tiles."""
    if index == 2 and args[0] is not None:
        return args[0].sum([0] + list(range(2, args[0].dim())))
    if args[0] is None or args[1] is None or (index == 0 and args[2] is None):
        raise Fallback(f"aten.{target}: an input the description does not read")
    return _generic(target, fn, args, kwargs, index, tile_of, out_box, out_shape)


def _ln_backward(target, fn, args, kwargs, index, tile_of, out_box, out_shape):
    """A layer norm's bias gradient is the output gradient summed over the leading axes (all
    its description reads); its other gradients run unchanged on the tiles."""
    go = args[0]
    if index == 2 and go is not None:
        return go.sum(list(range(go.dim() - len(args[2]))))
    if go is None or args[1] is None or args[3] is None or args[4] is None:
        raise Fallback(f"aten.{target}: an input the description does not read")
    if index == 1:
        # the weight's gradient, Σ over the leading axes of go · (x − mean) · rstd, is
        # element-wise along the normalised axes: a column block of it (the plan may split
        # them, aten wants whole rows) is this sum on the tiles
        x, mean, rstd = args[1], args[3], args[4]
        return (go * ((x - mean) * rstd)).sum(list(range(go.dim() - len(args[2]))))
    # aten wants the weight and bias whenever it computes all three gradients: the bias is read
    # by none of them, the weight only by the input's (whose description gives it)
    args = list(args)
    shape = tuple(args[1].shape[args[1].dim() - len(args[2]):])
    if args[5] is None:
        if index == 0:
            raise Fallback(f"aten.{target}: the input's gradient without the weight")
        args[5] = torch.ones(shape, dtype=args[1].dtype, device=args[1].device)
    if args[6] is None:
        args[6] = torch.zeros(shape, dtype=args[1].dtype, device=args[1].device)
    return _generic(target, fn, args, kwargs, index, tile_of, out_box, out_shape)


def _view(target, fn, args, kwargs, index, tile_of, out_box, out_shape):
    """A view's box: the input region reshaped when it is exactly the box's preimage;
    otherwise (the preimage of a box is not always a box - rows ``[0, 5)`` of a ``(5, 2, 16)``
    tensor viewed as ``(10, 16)`` are its rows ``(0, 0)`` to ``(2, 0)``, the region their hull)
    the box's elements gathered from the region by their positions in the whole tensors."""
    x = args[0]
    want = extents(out_box) if out_shape else ()
    if x.numel() == int(np.prod(want)):
        return x.reshape(want)
    box, shape = tile_of(x)
    if box is None or not out_shape or x.dim() == 0:
        raise Fallback(f"aten.{target}: the input region is not the output box's preimage")
    box = np.asarray(box)
    idx = np.ix_(*[np.arange(int(a), int(b)) for a, b in np.asarray(out_box)])
    flat = np.ravel_multi_index(np.broadcast_arrays(*idx), tuple(out_shape))
    pos = np.unravel_index(flat, tuple(shape))
    local = [p_ - int(box[a, 0]) for a, p_ in enumerate(pos)]
    if any(((lc < 0) | (lc >= x.shape[a])).any() for a, lc in enumerate(local)):
        raise Fallback(f"aten.{target}: the input region misses part of the output box's "
                       f"preimage")
    at = torch.from_numpy(np.ravel_multi_index(local, tuple(x.shape)).reshape(-1)).to(x.device)
    return x.reshape(-1)[at].reshape(want)


def _expand(target, fn, args, kwargs, index, tile_of, out_box, out_shape):
    return args[0].expand(extents(out_box) if out_shape else ())


def _mean(target, fn, args, kwargs, index, tile_of, out_box, out_shape):
    x = args[0]
    _, shape = tile_of(x)
    dims = args[1] if len(args) > 1 else kwargs.get("dim")
    keep = args[2] if len(args) > 2 else kwargs.get("keepdim", False)
    if dims is None or (isinstance(dims, (list, tuple)) and not dims):
        return x.sum() / max(int(np.prod(shape)), 1)
    dims = [d % len(shape) for d in (dims if isinstance(dims, (list, tuple)) else [dims])]
    count = int(np.prod([shape[d] for d in dims]))
    return x.sum(dims, keepdim=bool(keep)) / max(count, 1)


def _select(target, fn, args, kwargs, index, tile_of, out_box, out_shape):
    x, dim = args[0], int(args[1])
    box, shape = tile_of(x)
    dim %= len(shape)
    i = int(args[2]) % shape[dim]
    if box is None or (int(box[dim, 0]), int(box[dim, 1])) != (i, i + 1):
        raise Fallback("aten.select: the region is not the selected index")
    return x.select(dim, 0)


def _slice(target, fn, args, kwargs, index, tile_of, out_box, out_shape):
    x = args[0]
    dim = int(args[1]) if len(args) > 1 else 0
    step = int(args[4]) if len(args) > 4 else 1
    box, shape = tile_of(x)
    dim %= len(shape)
    start = args[2] if len(args) > 2 and args[2] is not None else 0
    start = min(max(start + shape[dim] if start < 0 else start, 0), shape[dim])
    lo = start + int(out_box[dim, 0]) * step
    if box is None or int(box[dim, 0]) != lo:
        raise Fallback("aten.slice: the region does not start at the slice's first element")
    return x.narrow(dim, 0, x.shape[dim])[(slice(None),) * dim + (slice(None, None, step),)]


def _split(target, fn, args, kwargs, index, tile_of, out_box, out_shape):
    x = args[0]
    dim = int(args[2]) if len(args) > 2 else int(kwargs.get("dim", 0))
    box, shape = tile_of(x)
    dim %= len(shape)
    sizes = args[1]
    if isinstance(sizes, int):
        starts = [sizes * i for i in range(-(-shape[dim] // sizes))]
    else:
        starts = list(np.cumsum([0] + list(sizes))[:-1])
    if box is None or int(box[dim, 0]) != starts[index] + int(out_box[dim, 0]):
        raise Fallback(f"aten.{target}: the region is not the piece's")
    return x


def _unbind(target, fn, args, kwargs, index, tile_of, out_box, out_shape):
    x = args[0]
    dim = int(args[1]) if len(args) > 1 else 0
    box, shape = tile_of(x)
    dim %= len(shape)
    if box is None or (int(box[dim, 0]), int(box[dim, 1])) != (index, index + 1):
        raise Fallback("aten.unbind: the region is not the piece's")
    return x.select(dim, 0)


def _cat(target, fn, args, kwargs, index, tile_of, out_box, out_shape):
    dim = int(args[1]) if len(args) > 1 else int(kwargs.get("dim", 0))
    parts = [t for t in args[0] if t is not None and t.numel() > 0]
    if not parts:
        raise Fallback("aten.cat: no input region")
    return torch.cat(parts, dim % parts[0].dim())


def _factory(target, fn, args, kwargs, index, tile_of, out_box, out_shape):
    pos = _FACTORIES[target]
    args = list(args)
    args[pos] = list(extents(out_box)) if out_shape else []
    return fn(*args, **kwargs)


def _conv_args(args, n, first=3):
    """Stride, padding and dilation (one per spatial axis) from ``args[first:first + 3]``."""
    stride, padding, dilation = (list(args[i]) for i in (first, first + 1, first + 2))
    stride = stride * n if len(stride) == 1 else stride
    padding = padding * n if len(padding) == 1 else padding
    dilation = dilation * n if len(dilation) == 1 else dilation
    return stride, padding, dilation


def _pad(x, pads, value=0.0):
    flat = []
    for b, a in reversed(pads):
        flat += [int(b), int(a)]
    return F.pad(x, flat, value=value) if any(flat) else x


def _local_groups(groups: int, cin: int, cin_local: int) -> int:
    """The groups of a grouped convolution's tile: its input channels must be whole groups
    (a depthwise convolution split by channel: one group per channel of the tile)."""
    groups = int(groups)
    if groups == 1:
        return 1
    per = cin // groups
    if per <= 0 or cin_local % per or cin_local == 0:
        raise Fallback("aten.convolution: the tile's channels split a group")
    return cin_local // per


def _taps(w, tile_of, p, d):
    """The kernel taps ``[j0, j0 + k)`` a weight tile holds (a plan may split a convolution's
    reduction over the kernel window): its local kernel ``k`` and the padding ``p − d·j0``
    that makes the taps a convolution of their own (output row ``y`` reads input row
    ``y·s − p + d·(j0 + j')``)."""
    box, _ = tile_of(w)
    k = list(w.shape[2:])
    if box is None:
        return k, list(p)
    return k, [p[i] - d[i] * int(box[2 + i, 0]) for i in range(len(k))]


def _conv_rows(x, w, b, tile_of, out_box, s, p, d, groups):
    """Output box ``out_box`` of a convolution of ``x`` (a region tile: the box's window) by
    ``w`` (the whole kernel, or the taps of a split reduction: :func:`_taps`): padded only at
    the tensor's true border (:func:`window_pads`)."""
    xbox, xshape = tile_of(x)
    groups = _local_groups(groups, xshape[1], x.shape[1])
    n = len(xshape) - 2
    k, p = _taps(w, tile_of, p, d)
    try:
        pads = window_pads(out_box, xbox, xshape, k, s, p, d)
    except ValueError as exc:
        raise Fallback(str(exc)) from None
    common = [min(a, c) for a, c in pads]
    rest = [(a - m, c - m) for (a, c), m in zip(pads, common)]
    return torch.ops.aten.convolution(_pad(x, rest), w, b, s, common, d, False, [0] * n,
                                      groups)


def _conv_filter_grad(go, x, tile_of, w_box, s, p, d, groups):
    """A convolution's filter gradient (its box ``w_box``: whole, or a range of kernel taps)
    from the output-gradient tile ``go`` and the input region ``x`` its rows read through
    those taps: a partial sum over ``go``'s batch and rows."""
    gbox, _ = tile_of(go)
    xbox, xshape = tile_of(x)
    n = len(xshape) - 2
    kernel = list(extents(w_box)[2:])
    p = [p[i] - d[i] * int(w_box[2 + i, 0]) for i in range(n)]
    try:
        pads = window_pads(gbox, xbox, xshape, list(kernel), s, p, d)
    except ValueError as exc:
        raise Fallback(str(exc)) from None
    xp = _pad(x, pads)
    groups = _local_groups(groups, xshape[1], x.shape[1])
    wl = xp.new_zeros(()).expand(go.shape[1], xp.shape[1] // groups, *kernel)
    return torch.ops.aten.convolution_backward(
        go, xp, wl, None, s, [0] * n, d, False, [0] * n, groups, [False, True, False])[1]


def _convolution(target, fn, args, kwargs, index, tile_of, out_box, out_shape):
    x, w, b = args[0], args[1], args[2]
    if w is None or (x is None and not args[6]):
        raise Fallback("aten.convolution: an input not read")
    n = len(out_shape) - 2
    s, p, d = _conv_args(args, n)
    if args[6]:
        return _conv_transpose(x, w, b, tile_of, out_box, out_shape, s, p, d, int(args[8]))
    return _conv_rows(x, w, b, tile_of, out_box, s, p, d, args[8])


def _conv_transpose(x, w, b, tile_of, out_box, out_shape, s, p, d, groups):
    """Output box of a transposed convolution (weight ``[Cin, Cout/g, k...]``) from the input
    region its taps reach (:func:`~explorer.engine.core.geometry.transpose_window`): run without
    padding on the region, the local result's row ``t`` is output row ``start·s − p + t``;
    :func:`~explorer.engine.core.geometry.transpose_crop` cuts the rows outside the box and adds
    the box's rows no input of the region reaches (the output padding's tail, the rows
    between strided taps); then the bias.  An empty region: the bias alone."""
    n = len(out_shape) - 2
    want = extents(out_box)
    if x is None or x.numel() == 0:
        y = w.new_zeros(want)
    else:
        xbox, xshape = tile_of(x)
        _, wshape = tile_of(w)
        if xbox is None or wshape is None:
            raise Fallback("aten.convolution: a transposed input without its region")
        if tuple(w.shape[2:]) != tuple(wshape[2:]):
            raise Fallback("aten.convolution: a transposed convolution's kernel taps split")
        cout = int(out_box[1, 1] - out_box[1, 0])
        g = _local_groups(groups, xshape[1], x.shape[1])
        if w.shape[1] * g != cout:
            raise Fallback("aten.convolution: the weight tile's columns are not the box's "
                           "output channels")
        try:
            pads = transpose_crop(out_box, xbox, xshape, list(wshape[2:]), s, p, d)
        except ValueError as exc:
            raise Fallback(str(exc)) from None
        y = _pad(torch.ops.aten.convolution(x, w, None, s, [0] * n, d, True, [0] * n, g),
                 pads)
    if b is not None:
        y = y + b.reshape((1, -1) + (1,) * n)
    return y


def _convolution_backward(target, fn, args, kwargs, index, tile_of, out_box, out_shape):
    go, x, w = args[0], args[1], args[2]
    if go is None:
        raise Fallback("aten.convolution_backward: the output gradient not read")
    gbox, gshape = tile_of(go)
    n = len(gshape) - 2
    s, p, d = _conv_args(args, n, 4)
    if index == 2:                                   # bias: sum over all but the channels
        return go.sum([0] + list(range(2, go.dim())))
    if args[7]:
        # transposed: the input gradient is the convolution of go by the same weight, the
        # filter gradient a convolution's with the roles of x and go swapped
        if index == 0:
            if w is None:
                raise Fallback("aten.convolution_backward: the input gradient without w")
            return _conv_rows(go, w, None, tile_of, out_box, s, p, d, args[9])
        if x is None:
            raise Fallback("aten.convolution_backward: the weight gradient without x")
        return _conv_filter_grad(x, go, tile_of, out_box, s, p, d, args[9])
    if index == 1:                                   # weight: as the forward on go's window
        if x is None:
            raise Fallback("aten.convolution_backward: the weight gradient without x")
        return _conv_filter_grad(go, x, tile_of, out_box, s, p, d, args[9])
    if w is None:
        raise Fallback("aten.convolution_backward: the input gradient without the weight")
    # input: the gradient of a local convolution over the window go's rows read (through
    # the weight tile's taps), cut to the output box (rows of the box outside the window get
    # nothing from these outputs)
    k, p = _taps(w, tile_of, p, d)
    start = [int(gbox[2 + i, 0]) * s[i] - p[i] for i in range(n)]
    length = [(int(gbox[2 + i, 1] - gbox[2 + i, 0]) - 1) * s[i] + d[i] * (k[i] - 1) + 1
              for i in range(n)]
    if any(L <= 0 for L in length) or go.numel() == 0:   # no output row reaches the box
        return go.new_zeros(extents(out_box))
    groups = _local_groups(args[9], out_shape[1], int(out_box[1, 1] - out_box[1, 0]))
    xl = go.new_zeros(()).expand(go.shape[0], w.shape[1] * groups, *length)
    gw = torch.ops.aten.convolution_backward(
        go, xl, w, None, s, [0] * n, d, False, [0] * n, groups, [True, False, False])[0]
    out = go.new_zeros(extents(out_box))
    src, dst = [slice(None), slice(None)], [slice(None), slice(None)]
    for i in range(n):
        lo = max(int(out_box[2 + i, 0]), start[i])
        hi = min(int(out_box[2 + i, 1]), start[i] + length[i])
        if hi <= lo:
            return out
        src.append(slice(lo - start[i], hi - start[i]))
        dst.append(slice(lo - int(out_box[2 + i, 0]), hi - int(out_box[2 + i, 0])))
    if gw.shape[:2] != out.shape[:2]:
        raise Fallback("aten.convolution_backward: batch or channel regions differ")
    out[tuple(dst)] = gw[tuple(src)]
    return out


def _pool_args(args):
    k = list(args[1])
    k = k * 2 if len(k) == 1 else k
    s = list(args[2]) if len(args) > 2 and args[2] else k
    s = s * 2 if len(s) == 1 else s
    p = list(args[3]) if len(args) > 3 else [0]
    p = p * 2 if len(p) == 1 else p
    d = list(args[4]) if len(args) > 4 else [1]
    d = d * 2 if len(d) == 1 else d
    ceil = bool(args[5]) if len(args) > 5 else False
    return k, s, p, d, ceil


def _max_pool(target, fn, args, kwargs, index, tile_of, out_box, out_shape):
    x = args[0]
    k, s, p, d, ceil = _pool_args(args)
    xbox, xshape = tile_of(x)
    if ceil or len(xshape) != 4 or kwargs:
        raise Fallback("aten.max_pool2d_with_indices: ceil mode or not 2-d")
    try:
        pads = window_pads(out_box, xbox, xshape, k, s, p, d)
    except ValueError as exc:
        raise Fallback(str(exc)) from None
    xp = _pad(x, pads, float("-inf"))
    val, idx = torch.ops.aten.max_pool2d_with_indices(xp, k, s, [0, 0], d, False)
    if index == 0:
        return val
    wp = xp.shape[3]
    h0 = int(xbox[2, 0]) - pads[0][0]
    w0 = int(xbox[3, 0]) - pads[1][0]
    return (idx // wp + h0) * xshape[3] + (idx % wp + w0)


def _max_pool_backward(target, fn, args, kwargs, index, tile_of, out_box, out_shape):
    go, idx = args[0], args[7]
    if go is None or idx is None or len(out_shape) != 4:
        raise Fallback("aten.max_pool2d_with_indices_backward: inputs not read or not 2-d")
    gbox, _ = tile_of(go)
    if (gbox[:2] != out_box[:2]).any():
        raise Fallback("aten.max_pool2d_with_indices_backward: batch or channel regions differ")
    n, c, hb, wb = extents(out_box)
    h = idx // out_shape[3] - int(out_box[2, 0])
    w = idx % out_shape[3] - int(out_box[3, 0])
    ok = (h >= 0) & (h < hb) & (w >= 0) & (w < wb)
    flat = torch.where(ok, h * wb + w, torch.zeros_like(h)).reshape(n, c, -1)
    vals = torch.where(ok, go, torch.zeros_like(go)).reshape(n, c, -1)
    out = go.new_zeros((n, c, hb * wb))
    out.scatter_add_(2, flat, vals)
    return out.reshape(n, c, hb, wb)


def _window_grad(go, gbox, out_box, k, s, p, d, grad_of):
    """The input gradient of a window op for the input rows ``out_box`` from the output
    gradient rows ``gbox`` (all that reach them): ``grad_of(go, window_shape)`` is the
    gradient over the window those rows read (no padding), cut to the box."""
    n = len(k)
    start = [int(gbox[2 + i, 0]) * s[i] - p[i] for i in range(n)]
    length = [(int(gbox[2 + i, 1] - gbox[2 + i, 0]) - 1) * s[i] + d[i] * (k[i] - 1) + 1
              for i in range(n)]
    out = go.new_zeros(extents(out_box))
    if any(L <= 0 for L in length) or go.numel() == 0:
        return out
    gw = grad_of(go, length)
    src, dst = [slice(None), slice(None)], [slice(None), slice(None)]
    for i in range(n):
        lo = max(int(out_box[2 + i, 0]), start[i])
        hi = min(int(out_box[2 + i, 1]), start[i] + length[i])
        if hi <= lo:
            return out
        src.append(slice(lo - start[i], hi - start[i]))
        dst.append(slice(lo - int(out_box[2 + i, 0]), hi - int(out_box[2 + i, 0])))
    if gw.shape[:2] != out.shape[:2]:
        raise Fallback("window gradient: batch or channel regions differ")
    out[tuple(dst)] = gw[tuple(src)]
    return out


def _avg_pool_args(args):
    """Kernel, stride, padding, ceil mode, count_include_pad, divisor of ``avg_pool2d``."""
    k = list(args[1])
    k = k * 2 if len(k) == 1 else k
    s = list(args[2]) if len(args) > 2 and args[2] else k
    s = s * 2 if len(s) == 1 else s
    p = list(args[3]) if len(args) > 3 else [0]
    p = p * 2 if len(p) == 1 else p
    ceil = bool(args[4]) if len(args) > 4 else False
    cip = bool(args[5]) if len(args) > 5 else True
    div = args[6] if len(args) > 6 else None
    return k, s, p, ceil, cip, div


def _avg_pool(target, fn, args, kwargs, index, tile_of, out_box, out_shape):
    x = args[0]
    k, s, p, ceil, cip, div = _avg_pool_args(args)
    xbox, xshape = tile_of(x)
    if ceil or kwargs or len(xshape) != 4 or (any(p) and not cip):
        raise Fallback("aten.avg_pool2d: ceil mode, padding left out of the count, or not 2-d")
    try:
        pads = window_pads(out_box, xbox, xshape, k, s, p, [1, 1])
    except ValueError as exc:
        raise Fallback(str(exc)) from None
    return torch.ops.aten.avg_pool2d(_pad(x, pads), k, s, [0, 0], False, True, div)


def _avg_pool_backward(target, fn, args, kwargs, index, tile_of, out_box, out_shape):
    go = args[0]
    k, s, p, ceil, cip, div = _avg_pool_args((args[1],) + tuple(args[2:]))
    if go is None or ceil or kwargs or len(out_shape) != 4 or (any(p) and not cip):
        raise Fallback("aten.avg_pool2d_backward: ceil mode, padding left out of the count, "
                       "or not 2-d")
    gbox, _ = tile_of(go)

    def grad_of(g, length):
        xl = g.new_zeros(()).expand(g.shape[0], g.shape[1], *length)
        return torch.ops.aten.avg_pool2d_backward(g, xl, k, s, [0, 0], False, True, div)
    return _window_grad(go, gbox, out_box, k, s, p, [1, 1], grad_of)


def _adaptive_pool(target, fn, args, kwargs, index, tile_of, out_box, out_shape):
    """Adaptive average pooling of tiles that hold whole images (batch / channel blocks)."""
    x = args[0]
    box, shape = tile_of(x)
    if x is None or box is None or any(int(box[a, 0]) != 0 or int(box[a, 1]) != shape[a]
                                       for a in range(2, len(shape))) or \
            any(int(out_box[a, 0]) != 0 or int(out_box[a, 1]) != out_shape[a]
                for a in range(2, len(out_shape))):
        raise Fallback(f"aten.{target}: the image is split")
    return fn(*args, **kwargs)


def _adaptive_pool_backward(target, fn, args, kwargs, index, tile_of, out_box, out_shape):
    go = args[0]
    box, shape = tile_of(go)
    if go is None or box is None or any(int(box[a, 0]) != 0 or int(box[a, 1]) != shape[a]
                                        for a in range(2, len(shape))) or \
            any(int(out_box[a, 0]) != 0 or int(out_box[a, 1]) != out_shape[a]
                for a in range(2, len(out_shape))):
        raise Fallback(f"aten.{target}: the image is split")
    like = go.new_zeros(()).expand(extents(out_box))       # only its shape is read
    return fn(go, like)


def _nearest_axes(box, shape, out_box, out_shape):
    """Spatial axes of a nearest upsampling with a whole ratio ``r = O / I`` (output ``o``
    reads input ``o // r``), the tile's batch and channel extents those of ``out_box``."""
    if box is None or any(int(box[a, 0]) != int(out_box[a, 0]) or
                          int(box[a, 1]) != int(out_box[a, 1]) for a in (0, 1)):
        raise Fallback("nearest upsampling: the batch / channel blocks differ")
    ratios = []
    for a in range(2, len(shape)):
        if out_shape[a] % shape[a]:
            raise Fallback("nearest upsampling by a fractional ratio")
        ratios.append(out_shape[a] // shape[a])
    return ratios


def _upsample_nearest(target, fn, args, kwargs, index, tile_of, out_box, out_shape):
    """Nearest upsampling of a tile: each output position repeats input ``o // r``."""
    x = args[0]
    box, shape = tile_of(x)
    ratios = _nearest_axes(box, shape, out_box, out_shape)
    for a, r in enumerate(ratios, start=2):
        o = torch.arange(int(out_box[a, 0]), int(out_box[a, 1]), device=x.device)
        x = x.index_select(a, o // r - int(box[a, 0]))
    return x


def _upsample_nearest_backward(target, fn, args, kwargs, index, tile_of, out_box, out_shape):
    """Its gradient on a tile of ``dy``: each input position sums the ``r`` outputs that
    repeat it (the region is exactly those outputs)."""
    dy = args[0]
    box, shape = tile_of(dy)
    ratios = _nearest_axes(box, out_shape, out_box, shape)
    for a, r in enumerate(ratios, start=2):
        o = torch.arange(int(box[a, 0]), int(box[a, 1]), device=dy.device)
        dst = o // r - int(out_box[a, 0])
        n = int(out_box[a, 1] - out_box[a, 0])
        if dst.numel() and (int(dst.min()) < 0 or int(dst.max()) >= n):
            raise Fallback(f"aten.{target}: the region is not the box's outputs")
        size = list(dy.shape)
        size[a] = n
        dy = dy.new_zeros(size).index_add_(a, dst, dy)
    return dy


def _embedding(target, fn, args, kwargs, index, tile_of, out_box, out_shape):
    w, idx = args[0], args[1]
    wbox, wshape = tile_of(w)
    if w is None or idx is None or wbox is None or \
            (int(wbox[0, 0]), int(wbox[0, 1])) != (0, wshape[0]):
        raise Fallback("aten.embedding: the weight's rows are split")
    return fn(*args, **kwargs)


def _embedding_backward(target, fn, args, kwargs, index, tile_of, out_box, out_shape):
    """Rows ``[v0, v1)`` of an embedding's weight gradient: the output-gradient rows of the
    indices in that range, summed."""
    go, idx = args[0], args[1]
    pad = args[3] if len(args) > 3 else -1
    if go is None or idx is None or (len(args) > 4 and args[4]) or kwargs:
        raise Fallback("aten.embedding_dense_backward: scaled by frequency or inputs not read")
    v0, v1 = int(out_box[0, 0]), int(out_box[0, 1])
    sel = (idx >= v0) & (idx < v1) & (idx != pad)
    out = go.new_zeros(extents(out_box))
    out.index_add_(0, (idx[sel] - v0).reshape(-1), go[sel].reshape(-1, go.shape[-1]))
    return out


def _select_backward(target, fn, args, kwargs, index, tile_of, out_box, out_shape):
    grad, dim, i = args[0], int(args[2]), int(args[3])
    dim %= len(out_shape)
    i %= out_shape[dim]
    out = grad.new_zeros(extents(out_box))
    if int(out_box[dim, 0]) <= i < int(out_box[dim, 1]):
        out.select(dim, i - int(out_box[dim, 0])).copy_(grad)
    return out


def _region_at_box(target, x, tile_of, out_box):
    """The element-wise input region ``x`` cut to ``out_box`` (it covers the box), and the
    box's global offsets."""
    box, _ = tile_of(x)
    if box is None:
        raise Fallback(f"aten.{target}: an input without a region")
    box = np.asarray(box)
    if box.shape != np.shape(out_box) or (box[:, 0] > out_box[:, 0]).any() or \
            (box[:, 1] < out_box[:, 1]).any():
        raise Fallback(f"aten.{target}: the region does not cover the box")
    return x[tuple(slice(int(a - o), int(b - o))
                   for (a, b), o in zip(out_box, box[:, 0]))]


def _triangle(target, fn, args, kwargs, index, tile_of, out_box, out_shape):
    """``tril`` / ``triu`` of the tile at rows ``r0`` and columns ``c0`` (its last two axes)
    is the op on the tile with the diagonal moved by ``r0 - c0``: element ``(i, j)`` is kept
    when ``j - i ≤ diagonal`` (tril), and locally ``j - i = j' - i' + c0 - r0``."""
    x = args[0]
    if x is None or len(out_shape) < 2:
        raise Fallback(f"aten.{target}: an input not read, or fewer than two axes")
    diag = int(args[1]) if len(args) > 1 else int(kwargs.get("diagonal", 0))
    x = _region_at_box(target, x, tile_of, out_box)
    r0, c0 = int(out_box[-2, 0]), int(out_box[-1, 0])
    return fn(x, diag + r0 - c0)


def _slice_backward(target, fn, args, kwargs, index, tile_of, out_box, out_shape):
    """Rows ``[o0, o1)`` (along ``dim``) of ``slice_backward``: zeros, with the gradient rows
    ``k`` of the region whose position ``start + k·step`` falls in the box.  The other axes
    are the box's (an element-wise region)."""
    grad = args[0]
    dim = int(args[2]) % len(out_shape)
    size = int(out_shape[dim])
    start, step = args[3], int(args[5])
    start = 0 if start is None else int(start)
    start = min(max(start + size if start < 0 else start, 0), size)
    gbox, _ = tile_of(grad)
    if grad is None or gbox is None:
        raise Fallback("aten.slice_backward: the gradient without its region")
    gbox = np.asarray(gbox)
    others = [a for a in range(len(out_shape)) if a != dim]
    if any((int(gbox[a, 0]), int(gbox[a, 1])) != (int(out_box[a, 0]), int(out_box[a, 1]))
           for a in others):
        raise Fallback("aten.slice_backward: the region's other axes are not the box's")
    o0, o1 = int(out_box[dim, 0]), int(out_box[dim, 1])
    n = int(tile_of(grad)[1][dim])
    k_lo = min(max(-(-(o0 - start) // step), 0), n)         # the rows that land in the box
    k_hi = min(max(-(-(o1 - start) // step), 0), n)
    if k_lo < k_hi and (int(gbox[dim, 0]) > k_lo or int(gbox[dim, 1]) < k_hi):
        raise Fallback("aten.slice_backward: the region misses rows that land in the box")
    k = torch.arange(int(gbox[dim, 0]), int(gbox[dim, 1]), device=grad.device)
    pos = start + k * step
    ok = (pos >= o0) & (pos < o1)
    out = grad.new_zeros(extents(out_box))
    out.index_copy_(dim, pos[ok] - o0, grad.index_select(dim, torch.nonzero(ok).flatten()))
    return out


def _stack(target, fn, args, kwargs, index, tile_of, out_box, out_shape):
    dim = int(args[1]) if len(args) > 1 else int(kwargs.get("dim", 0))
    parts = [t for t in args[0] if t is not None]
    if not parts:
        raise Fallback("aten.stack: no input region")
    return torch.stack(parts, dim % (parts[0].dim() + 1))


_RULES = {"_adaptive_avg_pool2d": _adaptive_pool, "adaptive_avg_pool2d": _adaptive_pool,
          "_adaptive_avg_pool2d_backward": _adaptive_pool_backward,
          "native_batch_norm": _bn, "native_batch_norm_backward": _bn_backward,
          "native_layer_norm_backward": _ln_backward,
          "upsample_nearest2d": _upsample_nearest,
          "upsample_nearest2d_backward": _upsample_nearest_backward,
          "avg_pool2d": _avg_pool,
          "avg_pool2d_backward": _avg_pool_backward, "embedding": _embedding,
          "embedding_dense_backward": _embedding_backward,
          "select_backward": _select_backward, "slice_backward": _slice_backward,
          "tril": _triangle, "triu": _triangle, "stack": _stack, "view": _view,
          "_unsafe_view": _view, "reshape": _view, "expand": _expand,
          "mean": _mean, "select": _select, "slice": _slice, "split": _split,
          "unsafe_split": _split, "split_with_sizes": _split, "unbind": _unbind,
          "cat": _cat, "convolution": _convolution,
          "convolution_backward": _convolution_backward,
          "max_pool2d_with_indices": _max_pool,
          "max_pool2d_with_indices_backward": _max_pool_backward,
          **{f: _factory for f in _FACTORIES}}

"""Box arithmetic over numpy arrays.

A *box* is an integer array ``[..., ndim, 2]`` of half-open ``(start, stop)`` ranges, one per
axis; a box with ``stop <= start`` on any axis holds nothing.  Every function here is
vectorised over the leading axes (broadcasting like numpy) so the cost model and the Tofu
search can ask about thousands of boxes in one call; the runtime uses the single-box helpers
(:func:`common`, :func:`to_slices`, :func:`box_shape`) to address tensors.
"""

from __future__ import annotations

import numpy as np


def split_range(size: int, degree: int, index):
    """Balanced split of ``range(size)`` into ``degree`` parts; part ``index`` (vectorised).

    >>> split_range(7, 2, [0, 1])
    (array([0, 3]), array([3, 7]))
    """
    index = np.asarray(index)
    return index * size // degree, (index + 1) * size // degree


def full_box(shape, lead=()) -> np.ndarray:
    """The box covering all of a tensor of ``shape``, repeated over ``lead`` leading axes."""
    one = np.zeros((len(shape), 2), dtype=np.int64)
    one[:, 1] = shape
    box = np.empty(tuple(lead) + one.shape, dtype=np.int64)
    box[...] = one                     # one contiguous pass (no zeroing, no strided write)
    return box


def extents(boxes: np.ndarray) -> np.ndarray:
    """``[..., ndim]``: the length of each box along each axis (0 for an empty range)."""
    boxes = np.asarray(boxes)
    return np.maximum(boxes[..., 1] - boxes[..., 0], 0)


def box_shape(box) -> tuple:
    """The shape of the tensor one box ``[ndim, 2]`` holds, as Python ints."""
    return tuple(int(v) for v in extents(box))


def volume(boxes: np.ndarray) -> np.ndarray:
    """Number of elements in each box (``[...]``); empty boxes count 0."""
    ext = extents(boxes)
    if ext.shape[-1] == 0:
        return np.ones(ext.shape[:-1], dtype=ext.dtype)
    out = ext[..., 0].copy()           # column by column: numpy's reduce over a short last
    for ax in range(1, ext.shape[-1]):  # axis is several times slower on large arrays
        out *= ext[..., ax]
    return out


def is_empty(boxes: np.ndarray) -> np.ndarray:
    """``[...]`` bool: the box holds no element (some axis has ``stop <= start``)."""
    boxes = np.asarray(boxes)
    return (boxes[..., 1] <= boxes[..., 0]).any(axis=-1)


def intersect(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Elementwise (broadcast) intersection of boxes; empty results have start ≥ stop."""
    lo = np.maximum(a[..., 0], b[..., 0])
    hi = np.minimum(a[..., 1], b[..., 1])
    return np.stack([lo, np.maximum(hi, lo)], axis=-1)


def overlap(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Volume of the intersection of (broadcast) boxes ``a`` and ``b``, as float64 (large
    products of extents do not overflow); boxes of 0-d tensors (no axes) hold one element.

    >>> overlap(np.array([[0, 4], [0, 4]]), np.array([[2, 6], [1, 3]])).item()
    4.0
    """
    if a.size + b.size <= 4096:         # few boxes (Tofu's groups): one numpy pass
        lo = np.maximum(a[..., 0], b[..., 0])
        hi = np.minimum(a[..., 1], b[..., 1])
        return np.maximum(hi - lo, 0).astype(np.float64).prod(axis=-1)
    out = None                          # large broadcasts (cost tables): axis by axis is
    for ax in range(a.shape[-2]):       # cheaper than one [..., ndim] temporary
        lo = np.maximum(a[..., ax, 0], b[..., ax, 0])
        hi = np.minimum(a[..., ax, 1], b[..., ax, 1])
        ext = np.maximum(hi - lo, 0).astype(np.float64)
        out = ext if out is None else out * ext
    if out is None:
        return np.ones(np.broadcast_shapes(a.shape[:-2], b.shape[:-2]))
    return out


def inside(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``[...]`` bool: box ``a`` lies within box ``b`` on every axis (broadcast)."""
    a, b = np.asarray(a), np.asarray(b)
    return ((a[..., 0] >= b[..., 0]) & (a[..., 1] <= b[..., 1])).all(axis=-1)


def common(a: np.ndarray, b: np.ndarray):
    """The box two single boxes ``[ndim, 2]`` share, or ``None`` when they share nothing."""
    box = intersect(np.asarray(a), np.asarray(b))
    return None if bool(is_empty(box)) else box


def to_slices(box, origin=None) -> tuple:
    """Index of one box ``[ndim, 2]`` into a tensor: absolute, or relative to the start of
    ``origin`` (the box the tensor itself holds)."""
    if origin is None:
        return tuple(slice(int(a), int(b)) for a, b in box)
    return tuple(slice(int(a - o), int(b - o)) for (a, b), o in zip(box, np.asarray(origin)[:, 0]))


def split(boxes: np.ndarray, axis, k: int) -> np.ndarray:
    """Split each box of ``[G, ndim, 2]`` along ``axis`` into ``k`` balanced parts:
    ``[G*k, ndim, 2]``, group-major (parts of box 0 first).

    ``axis`` ``None`` or negative replicates: each box is repeated ``k`` times (Tofu's "not
    split at this step").

    >>> split(np.array([[[0, 5], [0, 2]]]), 0, 2).tolist()
    [[[0, 2], [0, 2]], [[2, 5], [0, 2]]]
    """
    G = boxes.shape[0]
    out = np.repeat(boxes, k, axis=0)
    if axis is None or axis < 0:
        return out
    lo, hi = boxes[:, axis, 0], boxes[:, axis, 1]
    i = np.tile(np.arange(k), G)
    lo_r, ext_r = np.repeat(lo, k), np.repeat(hi - lo, k)
    out[:, axis, 0] = lo_r + i * ext_r // k
    out[:, axis, 1] = lo_r + (i + 1) * ext_r // k
    return out

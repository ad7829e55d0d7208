"""Sliding-window arithmetic of convolution and pooling.

Output rows ``[lo, hi)`` of a window op (kernel ``k``, stride ``s``, padding ``p``, dilation
``d``) read input rows ``[lo·s − p, (hi−1)·s − p + d·(k−1) + 1)``; rows outside ``[0, size)``
are the op's zero (or −inf) padding.  :func:`window` gives the rows a device must hold,
:func:`window_pads` the padding its local computation must add so that running the op on
just those rows yields exactly its output rows - padding appears only at the tensor's true
border, never between devices.  Adaptive pooling windows are :func:`adaptive_window`; a
transposed convolution's rows are :func:`transpose_window` (input row ``i`` feeds output rows
``i·s − p + j·d``) and :func:`transpose_crop` fits its local result to the owned rows.
"""

from __future__ import annotations

import numpy as np


def window(lo, hi, size, kernel, stride, padding, dilation=1, clip: bool = True):
    """Input rows ``(start, stop)`` output rows ``[lo, hi)`` read (vectorised); clipped to
    ``[0, size)`` unless ``clip`` is false (then negative starts / stops past ``size`` are the
    padding the window covers)."""
    a = np.asarray(lo) * stride - padding
    b = (np.asarray(hi) - 1) * stride - padding + dilation * (kernel - 1) + 1
    if not clip:
        return a, b
    return np.clip(a, 0, size), np.clip(b, 0, size)


def adaptive_window(lo, hi, size, out):
    """Input rows ``(start, stop)`` adaptive pooling from ``size`` to ``out`` rows reads for
    output rows ``[lo, hi)``: ``[floor(lo·size/out), ceil(hi·size/out))`` (vectorised)."""
    lo, hi = np.asarray(lo), np.asarray(hi)
    return (lo * size) // out, -((-hi * size) // out)


def window_pads(out_box, in_box, in_shape, kernel, stride, padding, dilation) -> list:
    """Per spatial axis ``(pad_before, pad_after)`` so that the window op run on the input
    region ``in_box`` (with no padding of its own) yields exactly ``out_box``.

    ``out_box`` / ``in_box`` are single boxes ``[ndim, 2]`` of ``[N, C, *spatial]`` tensors;
    ``kernel``, ``stride``, ``padding``, ``dilation`` have one entry per spatial axis.  Raises
    ``ValueError`` when ``in_box`` is not the region :func:`window` gives (the caller's
    geometry and its computation disagree).
    """
    pads = []
    for i in range(len(kernel)):
        ax = 2 + i
        lo, hi = int(out_box[ax, 0]), int(out_box[ax, 1])
        start, end = window(lo, hi, in_shape[ax], kernel[i], stride[i], padding[i],
                            dilation[i], clip=False)
        start, end = int(start), int(end)
        r0, r1 = int(in_box[ax, 0]), int(in_box[ax, 1])
        if r0 != max(start, 0) or r1 != min(end, in_shape[ax]):
            raise ValueError(
                f"input region {np.asarray(in_box).tolist()} on axis {ax} is [{r0}, {r1}), the "
                f"window of outputs [{lo}, {hi}) reads [{start}, {end}) (geometry and runtime "
                f"disagree)")
        pads.append((r0 - start, end - r1))
    return pads


def full_spatial(out_box, in_box, out_shape, in_shape) -> bool:
    """Both boxes cover every spatial axis (2 onwards) of their tensors: the op can run with
    its own padding argument, no window arithmetic needed."""
    for ax in range(2, len(out_shape)):
        if (out_box[ax, 0] != 0 or out_box[ax, 1] != out_shape[ax] or in_box[ax, 0] != 0
                or in_box[ax, 1] != in_shape[ax]):
            return False
    return True


# --------------------------------------------------------------------------------------------
# transposed convolution
# --------------------------------------------------------------------------------------------


def transpose_window(lo, hi, size, kernel, stride, padding, dilation=1):
    """Input rows ``(start, stop)`` a transposed convolution reads for output rows ``[lo, hi)``
    (vectorised).

    Input row ``i`` and kernel tap ``j`` add into output row ``i·s − p + j·d``.  Per tap the
    rows reaching ``[lo, hi)`` are ``ceil((lo+p−j·d)/s) ≤ i ≤ floor((hi−1+p−j·d)/s)``, clipped
    to ``[0, size)``; the region is the hull of the taps' non-empty ranges, so both of its end
    rows really contribute.  Output rows no input reaches (between strided rows, the
    ``output_padding`` tail) give an empty region ``(0, 0)``.
    """
    lo, hi = np.asarray(lo, dtype=np.int64), np.asarray(hi, dtype=np.int64)
    big = np.iinfo(np.int64).max
    start = np.full(np.broadcast(lo, hi).shape, big, dtype=np.int64)
    stop = np.zeros_like(start)
    for j in range(kernel):
        a = np.maximum(-((-(lo + padding - j * dilation)) // stride), 0)
        b = np.minimum((hi - 1 + padding - j * dilation) // stride + 1, size)
        ok = (a < b) & (hi > lo)
        start = np.where(ok, np.minimum(start, a), start)
        stop = np.where(ok, np.maximum(stop, b), stop)
    empty = start == big
    return np.where(empty, 0, start), np.where(empty, 0, stop)


def transpose_crop(out_box, in_box, in_shape, kernel, stride, padding, dilation) -> list:
    """Per spatial axis ``(pad_before, pad_after)`` turning the transposed convolution of the
    input region ``in_box`` (no padding, no output padding of its own) into exactly
    ``out_box``: negative values crop rows the region produces outside the box, positive
    ones add the zero rows of the box no input of the region reaches.

    The local result's row ``t`` is the output row ``start·s − p + t``.  Raises ``ValueError``
    when ``in_box`` is not the region :func:`transpose_window` gives.
    """
    pads = []
    for i in range(len(kernel)):
        ax = 2 + i
        lo, hi = int(out_box[ax, 0]), int(out_box[ax, 1])
        start, stop = (int(v) for v in transpose_window(lo, hi, in_shape[ax], kernel[i],
                                                         stride[i], padding[i], dilation[i]))
        r0, r1 = int(in_box[ax, 0]), int(in_box[ax, 1])
        if (r0, r1) != (start, stop):
            raise ValueError(
                f"input region {np.asarray(in_box).tolist()} on axis {ax} is [{r0}, {r1}), the "
                f"transposed convolution of outputs [{lo}, {hi}) reads [{start}, {stop}) "
                f"(geometry and runtime disagree)")
        base = r0 * stride[i] - padding[i]
        length = (r1 - r0 - 1) * stride[i] + dilation[i] * (kernel[i] - 1) + 1
        pads.append((base - lo, hi - (base + length)))
    return pads

"""Sliding-window arithmetic of convolution and pooling.

Output rows ``[lo, hi)`` of a window op (kernel ``k``, stride ``s``, padding ``p``, dilation
``d``) read input rows ``[lo·s − p, (hi−1)·s − p + d·(k−1) + 1)``; rows outside ``[0, size)``
are the op's zero (or −inf) padding.  :func:`window` gives the rows a device must hold,
:func:`window_pads` the padding its local computation must add so that running the op on
just those rows yields exactly its output rows - padding appears only at the tensor's true
border, never between devices.  Adaptive pooling windows are :func:`adaptive_window`.
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

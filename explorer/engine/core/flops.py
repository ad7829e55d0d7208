"""Floating-point operations of one aten operator of an :class:`~.opgraph.OpGraph`.

Matrix products and convolutions (forward and both backward outputs) count 2 FLOPs per
multiply-add; everything else counts one per element of its largest operand - memory-bound
ops are timed by bytes anyway.
"""

from __future__ import annotations

import math

__all__ = ["op_flops"]


def _numel(shape) -> int:
    return math.prod(shape) if shape else 1


def _arg(op, i):
    """Positional argument ``i`` of the op's aten call (``None`` when not given)."""
    args = getattr(op, "args", ()) or ()
    return args[i] if len(args) > i else None


def op_flops(op, g) -> float:
    """FLOPs of ``op`` in graph ``g`` (shapes from ``g.tensors``)."""
    shp = [g.tensors[t].shape for t in op.inputs]
    out = g.tensors[op.output].shape
    t = op.target
    if t in ("mm", "addmm", "bmm", "baddbmm", "matmul"):
        a, b = (shp[-2], shp[-1]) if len(shp) >= 2 else (shp[0], shp[0])
        k = a[-1] if a else 1
        return 2.0 * _numel(out) * k
    if t == "convolution":
        x, w = shp[0], shp[1]
        if _arg(op, 6):               # transposed: each input element meets w[1:] weights
            return 2.0 * _numel(x) * _numel(w[1:])
        return 2.0 * _numel(out) * _numel(w[1:])
    if t == "convolution_backward":
        dy, x, w = shp[0], shp[1], shp[2]
        # a transposed convolution's multiply-adds are counted per input element
        per = _numel(x) if _arg(op, 7) else _numel(dy)
        if op.index == 0:             # data gradient: a transposed convolution
            return 2.0 * per * _numel(w[1:])
        if op.index == 1:             # filter gradient
            return 2.0 * per * _numel(w[1:])
        return float(_numel(dy))
    if t in ("_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_efficient_attention",
             "scaled_dot_product_attention"):
        q = shp[0]
        kv = shp[1] if len(shp) > 1 else shp[0]
        if op.index == 1:              # the log-sum-exp: one exp-sum per score
            return float(_numel(out) * kv[-2])
        return 4.0 * _numel(q) * kv[-2]
    if t == "_scaled_dot_product_flash_attention_for_cpu_backward":
        # dq recomputes the scores, dP = dO·vᵀ and dS·k (3 products); dk and dv one each
        q, k = g.tensors[op.args[1]].shape, g.tensors[op.args[2]].shape
        return (6.0 if op.index == 0 else 2.0) * _numel(q) * k[-2]
    biggest = max([_numel(s) for s in shp] + [_numel(out)])
    return float(biggest)

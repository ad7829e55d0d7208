"""Partition-n-reduce strategy discovery (Tofu, EuroSys 2019, Sections 3.1 and 4.2).

A *basic strategy* runs the same operator on k workers with smaller inputs.  Tofu finds them
by interval analysis of the operator's TDL description:

* case 1 - partition an **output** coordinate: worker i computes the i-th equal slice of the
  output; the analysis gives the input region it reads (a slice, a slice plus halo, or the whole
  tensor = replicated).  The output is the concatenation of the workers' slices.
* case 2 - partition a **reduction** variable: worker i computes the whole output but reduces
  only over its slice of the variable; the outputs are then combined element-wise with the
  reducer ("output reduction", Figure 2(b)).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from explorer.engine.tofu.tdl.intervals import Bound, bind
from explorer.engine.tofu.tdl.op import Op

__all__ = ["Strategy", "strategies", "classify"]


def _split(size: int, k: int):
    i = np.arange(k, dtype=np.int64)
    return i * size // k, (i + 1) * size // k


def classify(regions: np.ndarray, shape) -> dict:
    """Layout of one input across workers from its per-worker regions ``[k, nd, 2]``.

    Returns ``{"layout": "replicated" | "partitioned" | "shared", "axes": [split axes],
    "halo": {axis: max overlap of neighbouring workers}}``: *replicated* - every worker needs
    the whole tensor; *partitioned* - workers need different parts (along ``axes``, ``halo`` > 0
    means neighbouring regions overlap, e.g. a convolution window); *shared* - every worker
    needs the same proper part.
    """
    regions = np.asarray(regions)
    full = np.zeros_like(regions[0])
    full[:, 1] = shape
    if (regions == full).all():
        return {"layout": "replicated", "axes": [], "halo": {}}
    axes = [a for a in range(regions.shape[1]) if not (regions[:, a] == regions[0, a]).all()]
    if not axes:
        return {"layout": "shared", "axes": [], "halo": {}}
    halo = {}
    for a in axes:
        rs = sorted((int(s), int(e)) for s, e in regions[:, a] if e > s)
        ov = max((max(0, min(e0, e1) - s1) for (s0, e0), (s1, e1) in zip(rs, rs[1:])), default=0)
        if ov:
            halo[a] = ov
    return {"layout": "partitioned", "axes": axes, "halo": halo}


@dataclass
class Strategy:
    """One basic partition-n-reduce strategy of an operator for ``k`` workers.

    ``kind`` is "split" (partition output coordinate ``dim`` = output axis ``axis``) or
    "reduce" (partition reduction variable ``dim``; outputs combined with ``reducer``).
    ``out_boxes[i]`` is worker i's output box (the whole output for "reduce");
    ``regions[input][i]`` the half-open box of ``input`` worker i reads; ``layouts[input]`` its
    :func:`classify` summary; ``symbolic[input][i]`` the paper's symbolic intervals
    (inclusive ``(lo, hi)`` per axis, unclipped).
    """

    op: str
    kind: str
    dim: str
    axis: int | None
    k: int
    reducer: str | None
    out_boxes: np.ndarray
    regions: dict
    layouts: dict
    symbolic: dict = field(repr=False, default_factory=dict)
    note: str = ""

    @property
    def output_reduction(self) -> bool:
        return self.reducer is not None

    @property
    def name(self) -> str:
        return f"{self.kind} {self.dim}"

    def describe(self) -> str:
        head = (f"{self.op}: split output {self.dim} (axis {self.axis}) {self.k} ways"
                if self.kind == "split" else
                f"{self.op}: split reduction {self.dim} {self.k} ways, then {self.reducer} "
                f"the partial outputs")
        parts = []
        for name, lay in self.layouts.items():
            if lay["layout"] == "partitioned":
                axs = ", ".join(f"axis {a}" + (f" (halo {lay['halo'][a]})" if a in lay["halo"]
                                               else "") for a in lay["axes"])
                parts.append(f"{name} partitioned on {axs}")
            else:
                parts.append(f"{name} {lay['layout']}")
        return head + ": " + "; ".join(parts) + (f" [{self.note}]" if self.note else "")


def _sym_regions(bound: Bound, dim: str, k: int) -> dict:
    out = {n: [] for n in bound.inputs}
    for i in range(k):
        for n, axes in bound.symbolic((dim, i, k)).items():
            out[n].append(axes)
    return out


def strategies(op, shapes, k: int = 2, symbolic: bool = True, runnable: bool = False,
               **attrs) -> list:
    """Every basic strategy of ``op`` at input ``shapes`` for ``k`` workers (Section 4.2).

    ``op`` is an :class:`Op` or a library name (``attrs`` then parameterise it).  One strategy
    per output coordinate of size ≥ k (case 1) and per partitionable reduction variable of
    extent ≥ k (case 2, flagged by ``reducer``); ``runnable=True`` keeps only the reductions
    the operator computes partially on zero-padded input regions (``Bound.reducible``).
    """
    if isinstance(op, str):
        from explorer.engine.tofu.tdl.library import describe
        op = describe(op, **attrs)
    bound = op.bind(shapes) if isinstance(op, Op) else bind(op, shapes)
    out_shape = bound.out_shape
    nd = len(out_shape)
    res = []
    for ax, v in enumerate(bound.out_vars):
        size = out_shape[ax]
        if size < k or size < 2:
            continue
        boxes = np.zeros((k, nd, 2), dtype=np.int64)
        boxes[..., 1] = out_shape
        boxes[:, ax, 0], boxes[:, ax, 1] = _split(size, k)
        regs = bound.regions(boxes)
        res.append(Strategy(
            op.name, "split", v.name, ax, k, None, boxes, regs,
            {n: classify(r, bound.shapes[n]) for n, r in regs.items()},
            _sym_regions(bound, v.name, k) if symbolic else {}))
    reducible = bound.reducible(runnable)
    for v in bound.red_vars:
        if v not in reducible:
            continue
        ext = bound.extent[v]
        if ext < k or ext < 2:
            continue
        lo, hi = _split(ext, k)
        boxes = np.zeros((k, nd, 2), dtype=np.int64)
        boxes[..., 1] = out_shape
        regs = bound.regions(boxes, red={v: (lo, hi - 1)})
        note = ""
        if reducible[v] == "sum" and _has_outside_terms(bound, v):
            note = "terms outside the reduction (e.g. a bias) are added by one worker"
        res.append(Strategy(
            op.name, "reduce", v.name, None, k, reducible[v], boxes, regs,
            {n: classify(r, bound.shapes[n]) for n, r in regs.items()},
            _sym_regions(bound, v.name, k) if symbolic else {}, note))
    return res


def _has_outside_terms(bound: Bound, v) -> bool:
    """Whether the output adds terms that do not contain ``v``'s reduction (e.g. + bias)."""
    from explorer.engine.tofu.tdl.lang import Bin, Reduce

    def contains(node):
        if isinstance(node, Reduce) and v in node.vars:
            return True
        kids = (node.body,) if isinstance(node, Reduce) else node.children()
        return any(contains(c) for c in kids)

    def go(node):
        if isinstance(node, Bin) and node.op in ("+", "-"):
            ca, cb = contains(node.a), contains(node.b)
            if ca != cb:
                return True
            return (ca and go(node.a)) or (cb and go(node.b))
        if isinstance(node, Bin) and node.op in ("*", "/"):
            return go(node.a) if contains(node.a) else go(node.b)
        if isinstance(node, Reduce):
            return go(node.body)
        return False
    return go(bound.body)

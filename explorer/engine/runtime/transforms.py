"""Edge view ops applied *forward*: from a region of the producer's tensor to the consumer's view.

An :class:`~explorer.engine.core.layergraph.Edge` lists its view ops (``reshape``, ``permute``,
``select``, ``slice``, ``expand``, ``item``) from the consumer side back to the producer, and
:func:`explorer.engine.core.geometry.apply_transforms` maps a box the consumer needs back onto the
producer's output.  The runtime holds a *region* of the producer's output (the box geometry
asked for) and must turn it into exactly the box of the consumer's input the op reads.

:func:`plan_edge` records the box at every stage of that chain (consumer side first, the way
geometry walks it) and precomputes, for reshapes, the gather index that picks the consumer's
elements out of the producer region; :func:`forward` then replays the chain from the producer
side with differentiable tensor ops (``permute``, ``select``, ``index_select`` / ``reshape``),
so gradients flow back to the region tensor by autograd.

Any reshape is handled exactly, whatever the region (flatten after a pool split on n or c,
view/transpose of attention heads, ...): when the region's elements are already in the
consumer's row-major order the step is a plain ``reshape``, otherwise a gather.  An ``expand``
(grouped-query attention's repeated key/value heads) is ``Tensor.expand`` of the region to the
consumer's box: the producer sends each key/value head once, and autograd sums the repeated
heads' gradients into it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from explorer.engine.core import geometry as G


@dataclass
class Step:
    """One view op replayed forward: ``kind`` and what it needs at run time."""

    kind: str                 # "permute" | "select" | "reshape" | "gather" | "expand" | "none"
    arg: object = None        # permutation / axis / target extents / (index tensor, extents)


def chain(layer, index: int, box: np.ndarray, transforms, reduce=None) -> list:
    """Boxes at each stage: ``[consumer input region, ..., producer region]``.

    ``box`` is one output box ``[nd, 2]`` of the consumer layer (a row-parallel layer: the
    tile it computes, with ``reduce`` its feature range); the last element equals
    :func:`geometry.edge_regions` for it.
    """
    q = G.input_regions(layer, index, box[None],
                        None if reduce is None else np.asarray(reduce)[None])[0]
    out = [q]
    for t in transforms:
        q = G.apply_transforms(q[None], (t,))[0]
        out.append(q)
    return out


def _reshape_step(src_box, dst_box, src_shape, dst_shape, where: str) -> Step:
    """Gather index (into the flattened region tensor) of every element of ``dst_box``."""
    dst_ext = G.box_shape(dst_box)
    src_ext = G.box_shape(src_box)
    n = math.prod(dst_ext)
    if n == 0:
        return Step("reshape", dst_ext)
    grids = np.meshgrid(*[np.arange(lo, hi, dtype=np.int64) for lo, hi in dst_box],
                        indexing="ij")
    flat = np.ravel_multi_index([g.ravel() for g in grids], dst_shape)
    src_idx = np.unravel_index(flat, src_shape)
    rel = []
    for ax, (lo, hi) in enumerate(src_box):
        r = src_idx[ax] - lo
        if (r < 0).any() or (r >= hi - lo).any():
            raise RuntimeError(
                f"{where}: reshape {tuple(src_shape)} -> {tuple(dst_shape)}: the producer region "
                f"{src_box.tolist()} does not contain every element of the consumer box "
                f"{dst_box.tolist()} (geometry and runtime disagree)")
        rel.append(r)
    pos = np.ravel_multi_index(rel, src_ext)
    if pos.size == math.prod(src_ext) and np.array_equal(pos, np.arange(pos.size)):
        return Step("reshape", dst_ext)
    return Step("gather", (torch.from_numpy(pos.astype(np.int64)), dst_ext))


def plan_edge(layer, index: int, box: np.ndarray, transforms, where: str = "",
              reduce=None) -> tuple:
    """``(boxes, steps)``: the chain of boxes and the forward steps (producer side first)."""
    boxes = chain(layer, index, box, transforms, reduce)
    steps = []
    # transforms[k] maps boxes[k] (consumer side) -> boxes[k+1] (producer side); replay k = m-1..0
    for k in range(len(transforms) - 1, -1, -1):
        t = transforms[k]
        kind = t[0]
        src_box, dst_box = boxes[k + 1], boxes[k]
        if kind == "item":
            steps.append(Step("none"))
        elif kind == "permute":
            perm = tuple(int(p) for p in t[1])
            steps.append(Step("permute", perm))
        elif kind == "select":
            steps.append(Step("select", int(t[1])))
        elif kind == "slice":
            steps.append(Step("none"))
        elif kind == "expand":
            steps.append(Step("expand", G.box_shape(dst_box)))
        elif kind == "reshape":
            _, src_shape, dst_shape = t
            steps.append(_reshape_step(src_box, dst_box, tuple(src_shape), tuple(dst_shape),
                                       where))
        else:
            raise NotImplementedError(f"{where}: edge transform {kind!r} is not supported by "
                                      f"the runtime")
    return boxes, steps


def forward(region: torch.Tensor, steps) -> torch.Tensor:
    """Apply the precomputed steps to the producer region tensor (differentiable)."""
    x = region
    for s in steps:
        if s.kind == "none":
            continue
        if s.kind == "permute":
            x = x.permute(s.arg)
        elif s.kind == "select":
            x = x.select(s.arg, 0)
        elif s.kind == "reshape":
            x = x.reshape(s.arg)
        elif s.kind == "expand":
            x = x.expand(s.arg)
        elif s.kind == "gather":
            idx, ext = s.arg
            if idx.device != x.device:
                idx = idx.to(x.device)
                s.arg = (idx, ext)
            x = x.reshape(-1).index_select(0, idx).view(ext)
    return x


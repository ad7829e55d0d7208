"""View transforms folded onto edges: consumer coordinates -> producer coordinates.

An edge of the layer graph may carry the view ops (reshape, permute, select, slice, expand)
between the producer's output and the consumer's input.  ``expand`` (broadcast of size-1
axes, new leading axes) is how grouped-query attention repeats key/value heads: Llama's
``repeat_kv`` (``[:, :, None].expand(...).reshape(...)``) and ``repeat_interleave`` (the
importer writes it as that reshape, expand, reshape), so a box on the repeated heads maps
back to the key/value heads of its group.  :func:`apply_transforms` maps a box on the
consumer's view back to the bounding box of the producer elements it covers, and
:func:`edge_regions` composes that with the consumer's :func:`.regions.input_regions`.
"""

from __future__ import annotations

import math

import numpy as np

from explorer.engine.core.layergraph import Edge, LayerGraph
from explorer.engine.core.geometry.boxes import full_box
from explorer.engine.core.geometry.regions import input_regions


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


def _expand_to_src(boxes, src, dst):
    """Box on ``src`` that a box on ``expand(src, dst)`` reads: a broadcast axis (size 1 in
    ``src``) maps to its one element (or none, for an empty box), an axis ``dst`` adds in
    front is dropped (an empty range there empties the box), the others map to themselves."""
    lead = len(dst) - len(src)
    out = boxes[..., lead:, :].copy()
    if lead and len(src):
        empty = (boxes[..., :lead, 1] <= boxes[..., :lead, 0]).any(axis=-1)
        out[..., 0, 1] = np.where(empty, out[..., 0, 0], out[..., 0, 1])
    for ax, (s, d) in enumerate(zip(src, dst[lead:])):
        if s == 1 and d != 1:
            nonempty = out[..., ax, 1] > out[..., ax, 0]
            out[..., ax, 0] = 0
            out[..., ax, 1] = nonempty.astype(np.int64)
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
        elif kind == "expand":
            _, src, dst = t
            boxes = _expand_to_src(boxes, tuple(src), tuple(dst))
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


def edge_regions(graph: LayerGraph, edge: Edge, boxes: np.ndarray,
                 reduce: np.ndarray | None = None) -> np.ndarray:
    """Region of the producer's output that each consumer output box needs through ``edge``
    (``reduce``: a row-parallel consumer's feature slices, ``boxes`` then its tiles; see
    :func:`.regions.input_regions`)."""
    reg = input_regions(graph.layer(edge.dst), edge.index, boxes, reduce)
    return apply_transforms(reg, edge.transforms)

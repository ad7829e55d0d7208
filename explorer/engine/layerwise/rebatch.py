"""A captured layer graph at another batch size, without capturing again (issue 28).

The pipeline search costs every stage at the micro-batch's size ``b = B / M``.  Capturing the
model again at each ``b`` costs seconds per size (and imports torch); yet a layer graph at
batch ``b`` differs from the one at ``B`` only where the batch runs: one axis of each tensor
that carries it scaled by ``b / B``, the same axis in the shapes of the view transforms on
the edges, and the FLOPs of every layer that reads or writes it (each op's FLOPs are a
product over its tensors' axes, linear in the sample count).

:func:`rebatch` follows the batch from the model's inputs: an input's sample axis (letter
``n``, size ``B``), through each edge's view transforms (reshape, expand, permute, select,
slice, tuple item) to the axis of the consumer's input that carries it, and through each
layer to its output's sample axis (a reduction over that axis ends it).  Whatever it cannot
follow exactly — a view that splits the batch axis, a slice or select or concatenation along
it, a broadcast that creates it, an op or attribute it does not know, a size that does not
scale to a whole number — makes it return ``None``, and the caller captures at ``b`` instead
(:func:`graph_at`).  The tests compare rebatched graphs with real captures of the example
models.
"""

from __future__ import annotations

import copy
import dataclasses
import math

from explorer.engine.core.layergraph import Edge, LayerGraph

__all__ = ["rebatch", "graph_at"]

#: ops whose output keeps its input's samples on the output's ``n`` axis, one sample in
#: gives one sample out (attributes with no batch-sized value)
_PER_SAMPLE = {"eltwise", "linear", "embedding", "sdpa", "softmax", "norm", "layernorm",
               "conv", "conv2d", "conv1d", "conv3d", "conv_transpose", "pool", "maxpool", "avgpool",
               "adaptive_pool", "matmul", "bmm", "dropout", "activation", "mha", "lstm_cell",
               "concat", "pad", "upsample", "interpolate", "reduce", "gelu", "relu", "cumsum", "experts"}
#: attribute keys known to hold no batch-dependent number (``dim``/``dims``: checked below)
_SAFE_ATTRS = {"fn", "causal", "weight_t", "dims", "keepdim", "dim", "offsets", "kernel",
               "stride", "padding", "dilation", "groups", "ceil_mode", "eps", "mode",
               "scale", "bias", "transposed", "output_padding", "count_include_pad",
               "batch_first", "heads", "num_heads", "affine", "tensor", "scale_factor",
               "align_corners", "approximate", "negative_slope", "value", "p", "exponent",
               "kind", "has_state", "full_axes"}


class _Stop(Exception):
    """The batch cannot be followed here (the message says why; the caller captures)."""


def _scale(size: int, b: int, B: int) -> int:
    if (size * b) % B:
        raise _Stop(f"size {size} does not scale by {b}/{B}")
    return size * b // B


def _follow_edge(edge: Edge, p: int | None, b: int, B: int):
    """``(transforms, axis)``: the edge's transforms at batch ``b`` and the axis of the
    consumer's view that carries the batch, starting from the producer's batch axis ``p``."""
    if p is None:
        if any(t[0] == "expand" for t in edge.transforms):
            raise _Stop(f"edge {edge.src} -> {edge.dst} broadcasts a batch-free tensor")
        return edge.transforms, None
    out = []
    for t in reversed(edge.transforms):          # producer side first
        kind = t[0]
        if kind == "item":
            out.append(t)
        elif kind == "permute":
            perm = tuple(t[1])
            p = perm.index(p)
            out.append(t)
        elif kind == "select":
            _, dim, _idx = t
            if dim == p:
                raise _Stop(f"edge {edge.src} -> {edge.dst} selects along the batch")
            p = p - 1 if dim < p else p
            out.append(t)
        elif kind == "slice":
            if t[1] == p:
                raise _Stop(f"edge {edge.src} -> {edge.dst} slices the batch")
            out.append(t)
        elif kind == "expand":
            _, src, dst = t
            src, dst = list(src), list(dst)
            q = p + len(dst) - len(src)
            if src[p] != dst[q]:
                raise _Stop(f"edge {edge.src} -> {edge.dst} broadcasts the batch axis")
            src[p] = dst[q] = _scale(src[p], b, B)
            out.append(("expand", tuple(src), tuple(dst)))
            p = q
        elif kind == "reshape":
            _, src, dst = t
            src, dst = list(src), list(dst)
            s = src[p]
            before = math.prod(src[:p])
            q = None
            for k in range(len(dst)):
                if math.prod(dst[:k]) == before and dst[k] != 1 and \
                        (dst[k] == s or any(math.prod(src[p:p + m]) == dst[k]
                                            for m in range(2, len(src) - p + 1))):
                    q = k
                    break
            if q is None:
                raise _Stop(f"edge {edge.src} -> {edge.dst}: a reshape splits the batch axis")
            src[p] = _scale(src[p], b, B)
            dst[q] = _scale(dst[q], b, B)
            out.append(("reshape", tuple(src), tuple(dst)))
            p = q
        else:
            raise _Stop(f"edge transform {kind!r}")
    return tuple(reversed(out)), p


def _out_axis(layer, in_axes: list) -> int | None:
    """The batch axis of ``layer``'s output, given the batch axis of each input (``None``:
    that input carries no batch)."""
    carried = [(j, p) for j, p in enumerate(in_axes) if p is not None]
    if not carried:
        return None
    if layer.op not in _PER_SAMPLE:
        raise _Stop(f"op {layer.op!r}")
    bad = set(layer.attrs) - _SAFE_ATTRS
    if layer.attrs.get("mask") is None:
        bad.discard("mask")
    if bad:
        raise _Stop(f"layer {layer.name}: attributes {sorted(bad)}")
    j, p = carried[0]
    size = layer.in_shapes[j][p]
    if layer.op == "reduce":
        dims = [d % len(layer.in_shapes[j]) for d in layer.attrs.get("dims", ())]
        if not dims or p in dims:
            return None                          # the batch is reduced away
        return p if layer.attrs.get("keepdim") else p - sum(d < p for d in dims)
    if "n" not in layer.axes:
        raise _Stop(f"layer {layer.name} reads the batch but has no sample axis")
    q = layer.axes.index("n")
    if layer.out_shape[q] != size:
        raise _Stop(f"layer {layer.name}: sample axis {layer.out_shape[q]} != input {size}")
    if layer.op == "concat":
        dim = layer.attrs.get("dim", 0) % len(layer.out_shape)
        if dim == q:
            raise _Stop(f"layer {layer.name} concatenates along the batch")
    if "dim" in layer.attrs and layer.op in ("softmax",) and \
            layer.attrs["dim"] % len(layer.out_shape) == q:
        raise _Stop(f"layer {layer.name} normalises over the batch")
    if q in layer.attrs.get("full_axes", ()):
        raise _Stop(f"layer {layer.name} ({layer.op}) needs the whole batch axis")
    return q


def _broadcast_to_batch(layer, B: int) -> bool:
    """Whether a ``param`` layer broadcasts its tensor over the batch (a class token
    ``[1, 1, C]`` read as ``[B, 1, C]``): its sample axis has size ``B`` where the tensor has
    1.  A size-``B`` axis it cannot judge stops the rebatch."""
    shapes = list(layer.params.values())
    if "n" in layer.axes and len(shapes) == 1:
        q = layer.axes.index("n")
        t = (1,) * (len(layer.out_shape) - len(shapes[0])) + tuple(shapes[0])
        if len(t) == len(layer.out_shape):
            if t[q] == 1 and layer.out_shape[q] == B:
                return True
            if t[q] == layer.out_shape[q]:
                return False
    if B in layer.out_shape:
        raise _Stop(f"parameter layer {layer.name} may be broadcast to the batch")
    return False


def _flops(f: float, b: int, B: int) -> float:
    x = f * b
    return float(x // B) if float(x).is_integer() and x % B == 0 else x / B


def rebatch(graph: LayerGraph, b: int) -> LayerGraph | None:
    """``graph`` (captured at batch ``graph.batch``) at batch ``b``, or ``None`` where the
    batch cannot be followed exactly (module docstring)."""
    B = graph.batch
    if b == B:
        return graph
    if b <= 0:
        return None
    try:
        return _rebatch(graph, int(b), B)
    except _Stop:
        return None


def _rebatch(graph: LayerGraph, b: int, B: int) -> LayerGraph:
    axis: dict = {}
    layers: dict = {}
    edges: dict = {}
    ins: dict = {}
    for _, _, key, d in graph.g.edges(keys=True, data=True):
        ins.setdefault(d["edge"].dst, []).append((key, d["edge"]))
    for n in graph.names():
        layer = graph.layer(n)
        if layer.op in ("input", "param"):
            if layer.op == "param" and not _broadcast_to_batch(layer, B):
                axis[n] = None
                layers[n] = layer
                continue
            if "n" not in layer.axes:
                raise _Stop(f"input {n} has no sample axis")
            q = layer.axes.index("n")
            if layer.out_shape[q] != B:
                raise _Stop(f"input {n}: sample axis {layer.out_shape[q]} != batch {B}")
            shape = list(layer.out_shape)
            shape[q] = b
            axis[n] = q
            layers[n] = dataclasses.replace(layer, out_shape=tuple(shape),
                                            flops=_flops(layer.flops, b, B))
            continue
        in_axes = [None] * len(layer.in_shapes)
        in_shapes = [list(s) for s in layer.in_shapes]
        for key, e in ins.get(n, []):
            tr, p = _follow_edge(e, axis[e.src], b, B)
            edges[(e.src, n, key)] = dataclasses.replace(e, transforms=tr)
            if e.index >= len(in_shapes):
                raise _Stop(f"edge into input {e.index} of {n}")
            if p is not None:
                if in_axes[e.index] not in (None, p):
                    raise _Stop(f"layer {n}: input {e.index} reached twice")
                in_axes[e.index] = p
        for j, p in enumerate(in_axes):
            if p is not None:
                in_shapes[j][p] = _scale(in_shapes[j][p], b, B)
        q = _out_axis(layer, in_axes)
        shape = list(layer.out_shape)
        if q is not None:
            shape[q] = _scale(shape[q], b, B)
        axis[n] = q
        moved = q is not None or any(p is not None for p in in_axes)
        layers[n] = dataclasses.replace(
            layer, out_shape=tuple(shape), in_shapes=tuple(tuple(s) for s in in_shapes),
            flops=_flops(layer.flops, b, B) if moved else layer.flops)
    out = copy.copy(graph)
    out.batch = b
    g = graph.g.copy()
    for n in g.nodes:
        g.nodes[n]["layer"] = layers[n]
    for u, v, key, d in g.edges(keys=True, data=True):
        if (u, v, key) in edges:
            d["edge"] = edges[(u, v, key)]
    out.g = g
    return out


def graph_at(problem, b: int):
    """``(layer graph at batch b, how)``: the problem's graph rebatched (``how`` =
    ``"rebatched"``), or captured at ``b`` through the capture cache (``"captured"``) when
    :func:`rebatch` cannot follow the batch or there is no model to capture."""
    from explorer.errors import InfeasiblePlan
    graph = problem.layer_graph()
    if b == graph.batch:
        return graph, "full batch"
    g = rebatch(graph, b)
    if g is not None:
        return g, "rebatched"
    if not problem.model:
        raise InfeasiblePlan("micro-batches need the model itself (a prebuilt graph cannot "
                             "be captured at another batch)")
    from explorer.engine.core.capture_cache import layer_graph
    return layer_graph(problem.model, b, dict(problem.model_args)), "captured"

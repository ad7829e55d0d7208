"""TDL as the oracle of :mod:`explorer.engine.core.geometry`: the same region questions answered by
interval analysis of operator descriptions.

:func:`from_layer` builds the TDL description of a :class:`~explorer.engine.core.layergraph.Layer` (its
activation inputs first, in ``layer.in_shapes`` order, then its parameters) and
:func:`input_region` / :func:`input_regions` answer region questions by the interval analysis
of Tofu Section 4.2, with geometry's box conventions (integer arrays ``[..., ndim, 2]`` of
half-open ``(start, stop)``, vectorised over leading axes).  :func:`transform_regions` does the
same for the view ops folded onto edges.

Geometry's closed-form rules are the engine (about ten times faster and what the runtime's
local computations are written against; numbers in the geometry package docstring and
``benchmarks/geometry.py``); this module is independent evidence that they are right, used by
the tests and the benchmark to cross-check every layer of the example models.  Nothing on the
engine's search or runtime path imports it.

Folded element-wise followers of a layer (activations) do not change regions and are left out;
folded parameters (BatchNorm scale/shift, a positional-embedding add) are element-wise
operands: a 1-D parameter as long as the channel axis is indexed by the channel, others
broadcast from the right (so BatchNorm is the per-channel affine geometry assumes, not its
training-mode statistics).
"""

from __future__ import annotations

import weakref

import numpy as np

from explorer.engine.tofu.tdl import library as L
from explorer.engine.tofu.tdl.intervals import Bound, bind
from explorer.engine.tofu.tdl.lang import TDLError
from explorer.engine.tofu.tdl.op import Op

__all__ = ["from_layer", "input_region", "input_regions", "param_regions", "layer_bound",
           "transform_regions", "transform_op"]


# --------------------------------------------------------------------------------------------
# Region queries on a description
# --------------------------------------------------------------------------------------------

_BOUND_CACHE: "weakref.WeakKeyDictionary[Op, dict]" = weakref.WeakKeyDictionary()


def _bound(desc: Op, shapes) -> Bound:
    shapes = desc.norm_shapes(shapes)
    key = tuple(shapes[n] for n in desc.inputs)
    per = _BOUND_CACHE.setdefault(desc, {})
    if key not in per:
        per[key] = bind(desc, shapes)
    return per[key]


def input_region(op_desc: Op, shapes, out_box) -> list:
    """Regions of every input (in ``op_desc.inputs`` order) that ``out_box`` needs.

    ``out_box`` is ``[..., out_ndim, 2]`` half-open (or a list of ``(start, stop)``); each
    result is ``[..., in_ndim, 2]``, clipped to the input; an input read nowhere by the box
    (a concat input outside it) gets an empty range on the concatenated axis.
    """
    b = _bound(op_desc, shapes)
    regs = b.regions(np.asarray(out_box, dtype=np.int64))
    return [regs[n] for n in op_desc.inputs]


# --------------------------------------------------------------------------------------------
# Layers -> descriptions
# --------------------------------------------------------------------------------------------


def _with_folded(base: Op, extras: list, out_shape, c_axis) -> Op:
    """``base`` followed by element-wise parameter operands ``extras`` [(name, shape)]:
    ``·w`` for names ending in "weight", ``+ p`` otherwise."""
    if not extras:
        return base
    nb = len(base.inputs)
    nd = len(out_shape)

    def index(idx, shape):
        if c_axis is not None and len(shape) == 1 and shape[0] == out_shape[c_axis]:
            return (idx[c_axis],)  # per-channel (geometry.param_shards' rule)
        if len(shape) > nd or any(s not in (1, out_shape[nd - len(shape) + a])
                                  for a, s in enumerate(shape)):
            raise TDLError(f"folded parameter of shape {shape} does not broadcast to the "
                           f"output {out_shape}")
        return L.bcast_index(idx, shape)

    def fn(*refs):
        inner = base.fn(*refs[:nb])

        def out(*idx):
            v = inner(*idx)
            for (name, shape), ref in zip(extras, refs[nb:]):
                e = ref[index(idx, shape)]
                v = v * e if name.endswith("weight") else v + e
            return v
        return out
    return Op(base.name, fn, out_shape=base._out_shape and (
        lambda *shapes: base._out_shape(*shapes[:nb])),
        inputs=base.inputs + tuple(n for n, _ in extras), out_names=base.out_names,
        attrs={**base.attrs, "folded": tuple(n for n, _ in extras)}, doc=base.doc)


def from_layer(layer) -> tuple:
    """``(desc, shapes)``: the TDL description of ``layer`` and ``{input name: shape}``.

    Inputs are the layer's tensor inputs (``layer.in_shapes`` order) followed by its
    parameters; ``desc.attrs["params"]`` maps description input names to ``layer.params``
    names (LSTM weights use the logical ``[4, hidden, ...]`` view of
    :func:`explorer.engine.core.geometry.param_shards`).  Raises ``KeyError`` naming an op kind
    without a description, ``ValueError`` for input layers (they read nothing).
    """
    op, a = layer.op, dict(layer.attrs)
    ins = [tuple(int(v) for v in s) for s in layer.in_shapes]
    params = {k: tuple(int(v) for v in s) for k, s in layer.params.items()}
    out = tuple(layer.out_shape)
    c_axis = layer.axes.index("c") if "c" in layer.axes else None
    if op == "input":
        raise ValueError(f"input layer {layer.name} has no inputs")
    used: dict = {}  # desc input name -> layer param name

    def take(desc_name, pname):
        used[desc_name] = pname
        return params[pname]

    if op == "conv":
        nsp = len(a["kernel"])
        has_b = "bias" in params
        base = L.conv(nsp=nsp, stride=a["stride"], padding=a["padding"],
                      dilation=a.get("dilation", 1), groups=a.get("groups", 1), bias=has_b)
        act = {"data": ins[0]}
        pv = {"weight": take("weight", "weight")}
        if has_b:
            pv["bias"] = take("bias", "bias")
    elif op == "conv_transpose":
        # a transposed convolution is a convolution's data gradient: same weight layout
        # [Cin, Cout/groups, k...]; the output size (output padding included) is given
        nsp = len(a["kernel"])
        base = L.conv_backward_data(nsp=nsp, stride=a["stride"], padding=a["padding"],
                                    dilation=a.get("dilation", 1), groups=a.get("groups", 1),
                                    in_size=out[2:])
        act = {"dout": ins[0]}
        pv = {"weight": take("weight", "weight")}
    elif op == "pool":
        nsp = len(a["kernel"])
        f = L.max_pool if a.get("kind", "max") == "max" else L.avg_pool
        base = f(nsp=nsp, kernel=a["kernel"], stride=a["stride"], padding=a["padding"],
                 dilation=a.get("dilation", 1))
        act, pv = {"data": ins[0]}, {}
    elif op == "adaptive_pool":
        base = L.adaptive_pool(out_size=out[2:])
        act, pv = {"data": ins[0]}, {}
    elif op == "upsample":
        base = L.upsample(out_size=out[2:], mode=a.get("mode", "nearest"))
        act, pv = {"data": ins[0]}, {}
    elif op == "linear":
        has_b = "bias" in params
        base = L.linear(bias=has_b)
        act = {"x": ins[0]}
        pv = {"weight": take("weight", "weight")}
        if has_b:
            pv["bias"] = take("bias", "bias")
    elif op == "matmul":
        if any(len(s) < 2 for s in ins[:2]):
            raise TDLError(f"layer {layer.name}: matmul with a 1-D operand has no description")
        base = L.batch_matmul()
        act, pv = {"A": ins[0], "B": ins[1]}, {}
    elif op == "sdpa":
        base = L.sdpa()
        act, pv = dict(zip(("q", "k", "v"), ins[:3])), {}
    elif op == "eltwise":
        base = L.binary(fn=a.get("fn", "add"), n_inputs=len(ins))
        act, pv = {f"x{j}": s for j, s in enumerate(ins)}, {}
    elif op == "concat":
        base = L.concat(dim=a["dim"], n_inputs=len(ins))
        act, pv = {f"x{j}": s for j, s in enumerate(ins)}, {}
    elif op == "norm":
        full = tuple(a["full_axes"])
        nnorm = len(full)
        if full != tuple(range(len(out) - nnorm, len(out))):
            raise TDLError(f"layer {layer.name}: normalised axes {full} are not trailing")
        pn = list(params)
        wname = "weight" if "weight" in params else (pn[0] if pn else None)
        bname = "bias" if "bias" in params else (pn[1] if len(pn) > 1 else None)
        base = L.layer_norm(nnorm=nnorm, weight=wname is not None, bias=bname is not None)
        act, pv = {"x": ins[0]}, {}
        if wname is not None:
            pv["weight"] = take("weight", wname)
        if bname is not None:
            pv["bias"] = take("bias", bname)
    elif op == "softmax":
        base = L.softmax(dim=a["full_axes"][0])
        act, pv = {"x": ins[0]}, {}
    elif op == "reduce":
        base = L.reduce(dims=a["dims"], keepdim=a["keepdim"], kind=a.get("kind", "sum"))
        act, pv = {"x": ins[0]}, {}
    elif op == "embedding":
        base = L.embedding()
        act = {"ids": ins[0]}
        if "weight" in params:
            pv = {"weight": take("weight", "weight")}
        else:  # table not a parameter: rows unknown, columns = output channels
            pv = {"weight": (1, out[-1])}
    elif op == "lstm_cell":
        has_state = bool(a.get("has_state", len(ins) == 3))
        hidden = out[1]
        names4 = ["weight_ih", "weight_hh", "bias_ih", "bias_hh"]
        has_b = "bias_ih" in params and "bias_hh" in params
        base = L.lstm_cell(has_state=has_state, bias=has_b)
        act = {"x": ins[0]}
        if has_state:
            act.update(h=ins[1], c=ins[2])
        pv = {}
        for n in names4[: 4 if has_b else 2]:
            shp = take(n, n)
            pv[n] = (4, hidden) + shp[1:]
    else:
        raise KeyError(f"no TDL description for layer op {op!r} (layer {layer.name})")
    if len(act) != len(ins):
        raise TDLError(f"layer {layer.name} ({op}) has {len(ins)} inputs, the description "
                       f"takes {len(act)}")
    extras = [(k, s) for k, s in params.items() if k not in used.values()]
    desc = _with_folded(base, extras, out, c_axis)
    for k, _ in extras:
        used[k] = k
    shapes = {**act, **pv, **{k: s for k, s in extras}}
    if tuple(shapes) != desc.inputs:
        raise TDLError(f"layer {layer.name}: inputs {tuple(shapes)} vs description "
                       f"{desc.inputs}")
    desc.attrs["params"] = dict(used)
    desc.attrs["layer"] = layer.name
    return desc, shapes


def _layer_key(layer):
    return (layer.op, tuple(layer.out_shape), tuple(map(tuple, layer.in_shapes)),
            tuple((k, tuple(v)) for k, v in layer.params.items()),
            repr(sorted(layer.attrs.items())), tuple(layer.axes))


_LAYER_CACHE: dict = {}


def layer_bound(layer) -> Bound:
    """The bound description of ``layer`` (cached by op, shapes, params and attrs); checks
    that the description's output shape is the layer's."""
    key = _layer_key(layer)
    b = _LAYER_CACHE.get(key)
    if b is None:
        desc, shapes = from_layer(layer)
        b = bind(desc, shapes)
        if tuple(b.out_shape) != tuple(layer.out_shape):
            raise TDLError(f"layer {layer.name} ({layer.op}): the TDL description gives output "
                           f"shape {b.out_shape}, the layer has {tuple(layer.out_shape)}")
        if len(_LAYER_CACHE) > 4096:
            _LAYER_CACHE.clear()
        _LAYER_CACHE[key] = b
    return b


def input_regions(layer, index: int, boxes) -> np.ndarray:
    """Drop-in for :func:`explorer.engine.core.geometry.input_regions`: region of input ``index``
    (in the op's own input coordinates) each output box ``[..., out_ndim, 2]`` needs."""
    if layer.op == "input":
        raise ValueError(f"input layer {layer.name} has no inputs")
    if not 0 <= index < len(layer.in_shapes):
        raise ValueError(f"layer {layer.name} ({layer.op}) has {len(layer.in_shapes)} inputs, "
                         f"asked for input {index}")
    b = layer_bound(layer)
    regs = b.regions(np.asarray(boxes, dtype=np.int64))
    return regs[b.inputs[index]]


def param_regions(layer, boxes) -> dict:
    """``{param name: (shape, [..., pnd, 2])}``: the part of each parameter the output boxes
    need, like :func:`explorer.engine.core.geometry.param_shards`."""
    b = layer_bound(layer)
    regs = b.regions(np.asarray(boxes, dtype=np.int64))
    out = {}
    for dname, pname in b.op.attrs.get("params", {}).items():
        out[pname] = (b.shapes[dname], regs[dname])
    return out


# --------------------------------------------------------------------------------------------
# Edge view transforms (consumer coordinates -> producer coordinates)
# --------------------------------------------------------------------------------------------


def transform_op(t, src_shape, dst_shape=None) -> Op:
    """TDL description of one edge view transform applied to a tensor of ``src_shape``
    (``("reshape", src, dst)``, ``("permute", perm)``, ``("select", dim, idx)``,
    ``("slice", dim, start)``; ``dst_shape`` fixes a slice's length)."""
    kind = t[0]
    if kind == "reshape":
        return L.reshape(shape=t[2])
    if kind == "permute":
        return L.permute(perm=t[1])
    if kind == "select":
        return L.select(dim=t[1], index=t[2])
    if kind == "slice":
        dim, start = t[1], t[2]
        stop = start + dst_shape[dim] if dst_shape is not None else None
        return L.slice_(dim=dim, start=start, stop=stop)
    raise KeyError(f"no TDL description for edge transform {kind!r}")


def transform_regions(transforms, boxes, producer_shape, consumer_shape=None) -> np.ndarray:
    """Map boxes on the consumer's view back onto the producer's tensor through ``transforms``
    (listed consumer side first, as on :class:`~explorer.engine.core.layergraph.Edge`), by analysing
    each view op's description - the TDL counterpart of ``geometry.apply_transforms``."""
    ts = [t for t in transforms if t[0] != "item"]
    shapes, ops = [], []
    cur = tuple(producer_shape)
    for j, t in enumerate(reversed(ts)):        # producer -> consumer
        last = j == len(ts) - 1
        op = transform_op(t, cur, consumer_shape if last else None)
        b = _bound(op, [cur])
        shapes.append(cur)
        ops.append(op)
        cur = b.out_shape
    boxes = np.asarray(boxes, dtype=np.int64)
    for op, shp in zip(reversed(ops), reversed(shapes)):   # consumer -> producer
        boxes = input_region(op, [shp], boxes)[0]
    return boxes

"""aten operators of an :class:`~explorer.engine.opgraph.OpGraph` -> TDL descriptions.

Each traced op (one output of an aten call) is described once by a library description and
the tensors bound to its inputs.  Backward ops are described like any other operator
(``convolution_backward`` output 0 is the transposed convolution, output 1 the filter
gradient, output 2 a channel sum).  An op without a description raises
:class:`UnsupportedOp` naming the aten operator and the node, never silently skipped.

Example::

    >>> from explorer.engine.opgraph import build_opgraph
    >>> g = build_opgraph("lenet5", batch=4)
    >>> d = describe_op(g.ops["convolution"], g)
    >>> d.op.name, [t for _, t in d.bindings]
    ('conv2d', ['input:x_1', 'param:conv1.weight', 'param:conv1.bias'])
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .lang import Concat, Opaque, Op, TDLError, reduce_over
from .library import _bcast_index, _stats, _tup, describe, register

__all__ = ["UnsupportedOp", "Described", "describe_op", "bound_of", "ELEMENTWISE_FNS"]


class UnsupportedOp(TDLError):
    """An aten operator that has no TDL description (named in the message)."""


@dataclass
class Described:
    """A bound description: the TDL ``op`` and ``bindings`` = [(input name, tensor id)]."""

    op: Op
    bindings: list
    shapes: dict
    elementwise_hint: bool = False
    bound: object = None               # the description bound at these shapes (cached)
    sig: tuple = ()


_BOUND_CACHE: dict = {}


def bound_of(desc: Op, shapes: dict):
    """``desc.bind(shapes)``, cached by (name, attributes, shapes): repeated blocks of a
    network share one analysis.  Returns ``(bound, signature)``."""
    key = (desc.name, repr(sorted(desc.attrs.items())), tuple(sorted(shapes.items())))
    b = _BOUND_CACHE.get(key)
    if b is None:
        if len(_BOUND_CACHE) > 50000:
            _BOUND_CACHE.clear()
        b = _BOUND_CACHE[key] = desc.bind(shapes)
    return b, key


#: aten element-wise functions (in-place variants end with "_")
ELEMENTWISE_FNS = {
    "relu", "sigmoid", "tanh", "gelu", "silu", "exp", "log", "neg", "sqrt", "rsqrt", "abs",
    "reciprocal", "hardtanh", "leaky_relu", "elu", "sin", "cos", "erf", "clamp", "clamp_min",
    "clamp_max", "sign", "square", "add", "sub", "mul", "div", "pow", "maximum", "minimum",
    "where", "eq", "ne", "gt", "lt", "ge", "le", "logical_not", "masked_fill", "rsub",
    "sigmoid_backward", "tanh_backward", "gelu_backward", "silu_backward",
    "hardtanh_backward", "leaky_relu_backward", "threshold_backward", "native_dropout_backward",
    "_to_copy", "clone", "copy", "contiguous", "native_dropout", "fill", "lerp", "addcmul",
    "addcdiv", "bernoulli",
}
_IDENTITY = {"_to_copy", "clone", "copy", "contiguous", "alias"}
_VIEWS = {"view", "_unsafe_view", "reshape", "squeeze", "unsqueeze", "flatten",
          "_reshape_alias", "view_as"}


# --------------------------------------------------------------------------------------------
# Descriptions the joint graph needs beyond the layer library
# --------------------------------------------------------------------------------------------


@register("expand", "broadcast_to")
def expand(shape=None):
    """``out[*i] = x[bcast(i)]``: broadcast ``x`` to ``shape`` (size-1 axes read index 0)."""
    if shape is None:
        raise TDLError("expand needs the target shape")
    dst = tuple(int(s) for s in shape)
    return Op("expand", lambda x: lambda *i: x[_bcast_index(i, x.shape)],
              out_shape=lambda x: dst, attrs={"shape": dst})


@register("addmm")
def addmm():
    """``C[i, j] = bias[bcast(i, j)] + Σ_k A[i, k] · B[k, j]`` (``nn.Linear``'s forward)."""
    return Op("addmm", lambda bias, a, b: lambda i, j: bias[_bcast_index((i, j), bias.shape)]
              + reduce_over("sum", ("k",), lambda k: a[i, k] * b[k, j]),
              inputs=("bias", "a", "b"), out_shape=lambda bias, a, b: (a[0], b[1]))


@register("batch_norm_backward_data")
def batch_norm_backward_data():
    """``dx[n, c, *x] = f(dy[n, c, *x], x[n, c, *x], Σ dy[:, c], Σ dy·x[:, c], w[c], mean[c],
    invstd[c])``: element-wise plus two per-channel reductions over samples and positions."""
    def fn(dy, x, weight, mean, invstd):
        def out(*idx):
            nd = len(idx)
            axes = [0] + list(range(2, nd))
            names_ = ("m",) + tuple("r" + str(a) for a in range(2, nd))
            s1, _ = _stats(dy, idx, axes, names_)
            c = idx[1]
            s2 = reduce_over("sum", tuple(n + "x" for n in names_), lambda *rs: dy[
                (rs[0], c) + tuple(rs[1:])] * x[(rs[0], c) + tuple(rs[1:])])
            return Opaque("bn_dx", dy[idx], x[idx], s1, s2, weight[c], mean[c], invstd[c])
        return out
    return Op("batch_norm_backward_data", fn, out_shape=lambda dy, x, w, m, s: dy)


@register("batch_norm_backward_weight")
def batch_norm_backward_weight():
    """``dγ[c] = Σ_{n, *x} dy[n, c, *x] · (x[n, c, *x] − mean[c]) · invstd[c]``."""
    def fn(dy, x, mean, invstd):
        def out(c):
            nd = dy.ndim
            names_ = ("n",) + tuple(f"r{a}" for a in range(2, nd))
            return reduce_over("sum", names_, lambda *rs: dy[(rs[0], c) + tuple(rs[1:])] * (
                x[(rs[0], c) + tuple(rs[1:])] - mean[c]) * invstd[c])
        return out
    return Op("batch_norm_backward_weight", fn, out_shape=lambda dy, x, m, s: (dy[1],))


@register("layer_norm_backward_data")
def layer_norm_backward_data(nnorm: int = 1):
    """``dx[*b, *f] = g(dy[*b, *f], x[*b, *f], Σ_f dy·w, Σ_f dy·w·x, mean[*b], rstd[*b])``."""
    def fn(dy, x, mean, rstd, weight):
        def out(*idx):
            nd = len(idx)
            axes = list(range(nd - nnorm, nd))
            s1, s2 = _stats(dy, idx, axes, tuple(f"r{a}" for a in axes))
            s3, _ = _stats(x, idx, axes, tuple(f"q{a}" for a in axes))
            lead = idx[:nd - nnorm] + (0,) * nnorm
            return Opaque("ln_dx", dy[idx], x[idx], weight[idx[nd - nnorm:]], s1, s2, s3,
                          mean[lead], rstd[lead])
        return out
    return Op("layer_norm_backward_data", fn, out_shape=lambda dy, x, m, r, w: dy,
              attrs={"nnorm": nnorm})


@register("avg_pool_backward")
def avg_pool_backward(nsp: int = 2, kernel=2, stride=None, padding=0, in_size=None):
    """``dx[n, c, *y] = Σ_{dy} dout[n, c, (y + p − dy) / s] / Πk`` (every window containing y)."""
    k = _tup(kernel, nsp)
    s = _tup(stride if stride else kernel, nsp)
    p = _tup(padding, nsp)
    wn = tuple(f"d{a}" for a in range(nsp))

    def fn(dout, x):
        def out(n, c, *ys):
            def inner(*dys):
                os_ = tuple((y + p[i] - dy) / s[i] for i, (y, dy) in enumerate(zip(ys, dys)))
                return dout[(n, c) + os_] / math.prod(k)
            return reduce_over("sum", wn, inner, dict(zip(wn, k)))
        return out
    return Op(f"avg_pool{nsp}d_backward", fn, out_shape=lambda dout, x: x,
              attrs={"kernel": k, "stride": s, "padding": p})


@register("max_pool_backward_indices")
def max_pool_backward_indices(nsp: int = 2, kernel=2, stride=None, padding=0, dilation=1):
    """aten's max-pool backward: ``dx[n, c, *y] = Σ_{dy} dout[n, c, o] · (indices[n, c, o] ==
    y)`` with ``o = (y + p − dy·d) / s`` - the saved arg-max indices replace re-reading x."""
    k = _tup(kernel, nsp)
    s = _tup(stride if stride else kernel, nsp)
    p, d = _tup(padding, nsp), _tup(dilation, nsp)
    wn = tuple(f"d{a}" for a in range(nsp))

    def fn(dout, x, indices):
        def out(n, c, *ys):
            def inner(*dys):
                os_ = tuple((y + p[i] - dy * d[i]) / s[i] for i, (y, dy) in
                            enumerate(zip(ys, dys)))
                return dout[(n, c) + os_] * Opaque("is_argmax", indices[(n, c) + os_],
                                                   x[(n, c) + tuple(ys)])
            return reduce_over("sum", wn, inner, dict(zip(wn, k)))
        return out
    return Op(f"max_pool{nsp}d_backward", fn, out_shape=lambda dout, x, i: x,
              attrs={"kernel": k, "stride": s, "padding": p, "dilation": d})


@register("stack")
def stack(dim: int = 0, n_inputs: int = 2):
    """``out[.., i, ..] = x_i[.., ..]``: concatenation along a new axis ``dim`` (pieces of 1)."""
    ins = tuple(f"x{j}" for j in range(n_inputs))

    def out_shape(*shapes):
        s0 = tuple(shapes[0])
        return s0[:dim] + (len(shapes),) + s0[dim:]

    def fn(*ts):
        def out(*idx):
            rest = idx[:dim] + idx[dim + 1:]
            return Concat(idx[dim], [(1, (lambda t: lambda loc: t[rest])(t)) for t in ts])
        return out
    return Op("stack", fn, inputs=ins, out_shape=out_shape, attrs={"dim": dim})


@register("slice_backward", "select_backward")
def slice_backward(dim: int = 0, start: int = 0, stop: int = 1, size: int = 1,
                   select: bool = False):
    """``dx[.., i, ..] = dy[.., i − start, ..]`` for start ≤ i < stop, else 0: the gradient
    of a slice (or of a select, where dy lacks the axis) placed into zeros."""
    def fn(dy):
        def out(*idx):
            rest = idx[:dim] + idx[dim + 1:]
            pieces = []
            if start > 0:
                pieces.append((start, lambda loc: 0))
            pieces.append((stop - start, (lambda loc: dy[rest]) if select else
                           (lambda loc: dy[idx[:dim] + (loc,) + idx[dim + 1:]])))
            if stop < size:
                pieces.append((size - stop, lambda loc: 0))
            return Concat(idx[dim], pieces)
        return out

    def out_shape(dy):
        dy = tuple(dy)
        return dy[:dim] + (size,) + (dy[dim:] if select else dy[dim + 1:])
    return Op("slice_backward", fn, out_shape=out_shape,
              attrs={"dim": dim, "start": start, "stop": stop, "size": size})


@register("adaptive_avg_pool_backward")
def adaptive_avg_pool_backward():
    """``dx[n, c, *y] = dout[n, c, ⌊y·O/S⌋] / bin size`` (each input element is in one bin
    when S is a multiple of O, as for global pooling)."""
    def fn(dout, x):
        def out(n, c, *ys):
            pos = tuple((y * dout.shape[2 + i]) // x.shape[2 + i] if dout.shape[2 + i] > 1
                        else 0 * y for i, y in enumerate(ys))
            return Opaque("scale", dout[(n, c) + pos])
        return out
    return Op("adaptive_avg_pool_backward", fn, out_shape=lambda dout, x: x)


@register("reduce_leading")
def reduce_leading(nkeep: int = 1):
    """``out[*f] = Σ_{*b} a[*b, *f] · b[*b, *f]`` - a parameter gradient of LayerNorm
    (``dγ = Σ dy·x̂``) summed over the leading (batch-like) axes."""
    def fn(a, b):
        def out(*f):
            nb = a.ndim - nkeep
            return reduce_over("sum", tuple(f"b{i}" for i in range(nb)),
                               lambda *bs: a[bs + f] * b[bs + f])
        return out
    return Op("reduce_leading", fn, out_shape=lambda a, b: tuple(a[len(a) - nkeep:]),
              attrs={"nkeep": nkeep})


# --------------------------------------------------------------------------------------------
# The mapping
# --------------------------------------------------------------------------------------------


def _is_tensor_arg(a, g) -> bool:
    return isinstance(a, str) and a in g.tensors


def _norm(d, nd):
    return d % nd if nd else 0


def describe_op(op, g) -> Described | None:
    """The TDL description of ``op`` (``None`` for ops that create a tensor from nothing)."""
    t = op.target
    base = t[:-1] if t.endswith("_") and not t.startswith("_") else t
    shp = {tid: g.tensors[tid].shape for tid in op.inputs}
    out_shape = g.tensors[op.output].shape
    a = op.args
    ten = [x for x in a if _is_tensor_arg(x, g)]

    def bind(desc, names_tids):
        shapes = {n: tuple(shp[tid]) for n, tid in names_tids}
        b, sig = bound_of(desc, shapes)
        d = Described(desc, list(names_tids), shapes, bound=b, sig=sig)
        got = b.out_shape
        if tuple(got) != tuple(out_shape):
            raise UnsupportedOp(
                f"op {op.name} (aten.{t} output {op.index}): the TDL description "
                f"{desc.name} gives shape {tuple(got)}, the traced op has {tuple(out_shape)}")
        return d

    def ins(desc, tids):
        return bind(desc, list(zip(desc.inputs, tids)))

    if op.phase == "source" or not op.inputs:
        return None
    if not out_shape and all(not shp[x] for x in op.inputs):
        return None                    # scalar bookkeeping (e.g. num_batches_tracked += 1)

    if base in _IDENTITY or (base in _VIEWS and tuple(shp[op.inputs[0]]) == tuple(out_shape)):
        return ins(describe("identity"), [op.inputs[0]])
    if base in _VIEWS:
        return ins(describe("reshape", shape=out_shape), [op.inputs[0]])
    if base == "expand":
        return ins(describe("expand", shape=out_shape), [op.inputs[0]])
    if base in ("t", "transpose", "permute", "numpy_T"):
        nd = len(shp[op.inputs[0]])
        if base == "permute":
            perm = tuple(_norm(int(p), nd) for p in a[1])
        else:
            d0, d1 = ((0, 1) if base in ("t", "numpy_T") or len(a) < 3 else
                      (_norm(int(a[1]), nd), _norm(int(a[2]), nd)))
            perm = list(range(nd))
            perm[d0], perm[d1] = perm[d1], perm[d0]
        return ins(describe("permute", perm=tuple(perm)), [op.inputs[0]])
    if base in ("mm", "matmul"):
        return ins(describe("matmul"), ten[:2])
    if base == "bmm":
        return ins(describe("batch_matmul"), ten[:2])
    if base == "addmm":
        return ins(describe("addmm"), ten[:3])
    if base == "convolution":
        x, w = a[0], a[1]
        b = a[2] if _is_tensor_arg(a[2], g) else None
        if a[6]:
            raise UnsupportedOp(f"op {op.name}: transposed convolution (aten.convolution "
                                f"transposed=True) has no TDL description yet")
        nsp = len(shp[x]) - 2
        desc = describe("conv", nsp=nsp, stride=tuple(a[3]), padding=tuple(a[4]),
                        dilation=tuple(a[5]), groups=int(a[8]), bias=b is not None)
        return ins(desc, [x, w] + ([b] if b else []))
    if base == "convolution_backward":
        dy, x, w = a[0], a[1], a[2]
        nsp = len(shp[x]) - 2
        kw = dict(nsp=nsp, stride=tuple(a[4]), padding=tuple(a[5]), dilation=tuple(a[6]),
                  groups=int(a[9]))
        if op.index == 0:
            return ins(describe("conv_backward_data", in_size=tuple(shp[x][2:]), **kw), [dy, w])
        if op.index == 1:
            return ins(describe("conv_backward_filter", kernel=tuple(shp[w][2:]), **kw), [x, dy])
        return ins(describe("reduce", dims=(0,) + tuple(range(2, 2 + nsp)), kind="sum"), [dy])
    if base in ("native_batch_norm", "_native_batch_norm_legit_functional",
                "_native_batch_norm_legit", "_native_batch_norm_legit_no_training"):
        x = a[0]
        nd = len(shp[x])
        if op.index == 0:
            if not (_is_tensor_arg(a[1], g) and _is_tensor_arg(a[2], g)):
                raise UnsupportedOp(f"op {op.name}: batch norm without affine weight/bias")
            return ins(describe("batch_norm"), [x, a[1], a[2]])
        # saved mean / invstd and the new running statistics: per-channel reductions of x
        return ins(describe("reduce", dims=(0,) + tuple(range(2, nd)), kind="mean"), [x])
    if base == "native_batch_norm_backward":
        dy, x, w = a[0], a[1], a[2]
        mean, invstd = a[5], a[6]
        nd = len(shp[x])
        if op.index == 0:
            return ins(describe("batch_norm_backward_data"), [dy, x, w, mean, invstd])
        if op.index == 1:
            return ins(describe("batch_norm_backward_weight"), [dy, x, mean, invstd])
        return ins(describe("reduce", dims=(0,) + tuple(range(2, nd)), kind="sum"), [dy])
    if base == "native_layer_norm":
        x = a[0]
        nnorm = len(a[1])
        if op.index == 0:
            w = a[2] if _is_tensor_arg(a[2], g) else None
            b = a[3] if _is_tensor_arg(a[3], g) else None
            return ins(describe("layer_norm", nnorm=nnorm, weight=w is not None,
                                bias=b is not None), [x] + [t_ for t_ in (w, b) if t_])
        nd = len(shp[x])
        return ins(describe("reduce", dims=tuple(range(nd - nnorm, nd)), keepdim=True,
                            kind="mean"), [x])
    if base == "native_layer_norm_backward":
        dy, x = a[0], a[1]
        nnorm = len(a[2])
        mean, rstd, w = a[3], a[4], a[5]
        nd = len(shp[x])
        if op.index == 0:
            return ins(describe("layer_norm_backward_data", nnorm=nnorm), [dy, x, mean, rstd, w])
        if op.index == 1:
            return ins(describe("reduce_leading", nkeep=nnorm), [dy, x])
        return ins(describe("reduce", dims=tuple(range(nd - nnorm)), kind="sum"), [dy])
    if base in ("max_pool2d_with_indices", "max_pool2d", "max_pool1d_with_indices",
                "max_pool3d_with_indices"):
        x = a[0]
        nsp = len(shp[x]) - 2
        k = tuple(a[1])
        st = tuple(a[2]) if len(a) > 2 and a[2] else k
        pad = tuple(a[3]) if len(a) > 3 else 0
        dil = tuple(a[4]) if len(a) > 4 else 1
        return ins(describe("max_pool", nsp=nsp, kernel=k, stride=st, padding=pad,
                            dilation=dil), [x])
    if base in ("max_pool2d_with_indices_backward", "max_pool3d_with_indices_backward"):
        dy, x = a[0], a[1]
        nsp = len(shp[x]) - 2
        k = tuple(a[2])
        st = tuple(a[3]) if a[3] else k
        return ins(describe("max_pool_backward_indices", nsp=nsp, kernel=k, stride=st,
                            padding=tuple(a[4]), dilation=tuple(a[5])), [dy, x, a[7]])
    if base in ("avg_pool2d", "avg_pool1d", "avg_pool3d"):
        x = a[0]
        nsp = len(shp[x]) - 2
        k = tuple(a[1])
        st = tuple(a[2]) if len(a) > 2 and a[2] else k
        pad = tuple(a[3]) if len(a) > 3 else 0
        return ins(describe("avg_pool", nsp=nsp, kernel=k, stride=st, padding=pad), [x])
    if base in ("avg_pool2d_backward", "avg_pool3d_backward"):
        dy, x = a[0], a[1]
        nsp = len(shp[x]) - 2
        k = tuple(a[2])
        st = tuple(a[3]) if a[3] else k
        return ins(describe("avg_pool_backward", nsp=nsp, kernel=k, stride=st,
                            padding=tuple(a[4])), [dy, x])
    if base in ("_adaptive_avg_pool2d", "adaptive_avg_pool2d", "_adaptive_avg_pool3d"):
        return ins(describe("adaptive_pool", out_size=tuple(out_shape[2:]), kind="avg"), [a[0]])
    if base in ("_adaptive_avg_pool2d_backward", "_adaptive_avg_pool3d_backward"):
        return ins(describe("adaptive_avg_pool_backward"), [a[0], a[1]])
    if base in ("sum", "mean", "amax", "amin", "prod"):
        x = a[0]
        nd = len(shp[x])
        dims = tuple(a[1]) if len(a) > 1 and isinstance(a[1], (list, tuple)) and a[1] else \
            tuple(range(nd))
        keep = bool(a[2]) if len(a) > 2 and isinstance(a[2], bool) else \
            bool(op.kwargs.get("keepdim", False))
        return ins(describe("reduce", dims=dims, keepdim=keep, kind=base), [x])
    if base in ("cat", "concat"):
        tids = [x for x in a[0] if _is_tensor_arg(x, g)]
        nd = len(out_shape)
        dim = _norm(int(a[1]) if len(a) > 1 else 0, nd)
        return ins(describe("concat", dim=dim, n_inputs=len(tids)), tids)
    if base in ("select_backward", "slice_backward"):
        sizes = tuple(int(v) for v in a[1])
        nd = len(sizes)
        dim = _norm(int(a[2]), nd)
        if base == "select_backward":
            idx = int(a[3]) % sizes[dim]
            desc = describe("slice_backward", dim=dim, start=idx, stop=idx + 1,
                            size=sizes[dim], select=True)
        else:
            st_, en_ = int(a[3]), min(int(a[4]), sizes[dim])
            if len(a) > 5 and int(a[5]) != 1:
                raise UnsupportedOp(f"op {op.name}: strided slice_backward (step {a[5]})")
            desc = describe("slice_backward", dim=dim, start=st_, stop=en_, size=sizes[dim])
        return ins(desc, [a[0]])
    if base == "stack":
        tids = [x for x in a[0] if _is_tensor_arg(x, g)]
        nd = len(out_shape)
        dim = _norm(int(a[1]) if len(a) > 1 else 0, nd)
        return ins(describe("stack", dim=dim, n_inputs=len(tids)), tids)
    if base in ("split", "unsafe_split", "split_with_sizes", "unsafe_split_with_sizes",
                "chunk", "unsafe_chunk"):
        x = a[0]
        nd = len(shp[x])
        dim = _norm(int(a[2]) if len(a) > 2 else 0, nd)
        size = shp[x][dim]
        if isinstance(a[1], (list, tuple)):
            sizes = [int(s) for s in a[1]]
        elif base in ("chunk", "unsafe_chunk"):
            step = -(-size // int(a[1]))
            sizes = [min(step, size - i) for i in range(0, size, step)]
        else:
            step = int(a[1])
            sizes = [min(step, size - i) for i in range(0, size, step)]
        start = sum(sizes[:op.index])
        return ins(describe("slice", dim=dim, start=start, stop=start + sizes[op.index]), [x])
    if base == "slice":
        x = a[0]
        nd = len(shp[x])
        dim = _norm(int(a[1]) if len(a) > 1 else 0, nd)
        size = shp[x][dim]
        start = int(a[2]) if len(a) > 2 and a[2] is not None else 0
        stop = int(a[3]) if len(a) > 3 and a[3] is not None else size
        if len(a) > 4 and int(a[4]) != 1:
            raise UnsupportedOp(f"op {op.name}: strided slice (step {a[4]})")
        start, stop = max(0, start + size if start < 0 else start), min(size, stop + size
                                                                         if stop < 0 else stop)
        return ins(describe("slice", dim=dim, start=start, stop=stop), [x])
    if base in ("select", "unbind"):
        x = a[0]
        nd = len(shp[x])
        dim = _norm(int(a[1]) if len(a) > 1 else 0, nd)
        idx = int(a[2]) if base == "select" else op.index
        return ins(describe("select", dim=dim, index=idx % shp[x][dim]), [x])
    if base in ("_softmax", "_safe_softmax", "softmax", "_log_softmax", "log_softmax"):
        nd = len(shp[a[0]])
        return ins(describe("softmax", dim=_norm(int(a[1]), nd)), [a[0]])
    if base in ("_softmax_backward_data", "_log_softmax_backward_data"):
        nd = len(shp[a[0]])
        return ins(describe("softmax_backward", dim=_norm(int(a[2]), nd)), [a[0], a[1]])
    if base == "embedding":
        return ins(describe("embedding"), [a[1], a[0]])
    if base == "embedding_dense_backward":
        return ins(describe("embedding_backward", num_embeddings=int(a[2])), [a[0], a[1]])
    if base == "threshold_backward":
        return ins(describe("relu_backward"), [a[0], a[1]])
    if base in ELEMENTWISE_FNS:
        if len(ten) == 1:
            d = ins(describe("unary", fn=base), ten)
        else:
            d = ins(describe("binary", fn=base, n_inputs=len(ten)), ten)
        d.elementwise_hint = True
        return d
    raise UnsupportedOp(
        f"op {op.name}: aten.{t} (output {op.index}, shape {tuple(out_shape)}) has no TDL "
        f"description; add one to explorer/engine/tdl/aten.py")

"""aten operators of an :class:`~explorer.engine.core.opgraph.OpGraph` -> TDL descriptions.

Each traced op (one output of an aten call) is described once by a library description and
the tensors bound to its inputs.  Backward ops are described like any other operator
(``convolution_backward`` output 0 is the transposed convolution, output 1 the filter
gradient, output 2 a channel sum).  An op without a description raises
:class:`UnsupportedOp` naming the aten operator and the node, never silently skipped.

Example::

    >>> from explorer.engine.core.opgraph import build_opgraph
    >>> g = build_opgraph("lenet5", batch=4)
    >>> d = describe_op(g.ops["convolution"], g)
    >>> d.op.name, [t for _, t in d.bindings]
    ('conv2d', ['input:x_1', 'param:conv1.weight', 'param:conv1.bias'])
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from explorer.errors import UnsupportedModel
from explorer.engine.tofu.tdl.lang import Concat, Opaque, TDLError, reduce_over
from explorer.engine.tofu.tdl.op import Op
from explorer.engine.tofu.tdl.library import (
    bcast_index,
    bcast_shape,
    stats_axes,
    as_tuple,
    describe,
    register,
)

__all__ = ["UnsupportedOp", "Described", "describe_op", "bound_of", "ELEMENTWISE_FNS"]


class UnsupportedOp(TDLError, UnsupportedModel):
    """An aten operator that has no TDL description: the message names it and the line of
    model code that made it (one line; the CLI exits with 2)."""


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
    key = (desc.name, desc.inputs, repr(sorted(desc.attrs.items())),
           tuple(sorted(shapes.items())))
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
    "addcdiv", "bernoulli", "tril", "triu", "logical_and", "logical_or", "bitwise_not",
    "isinf", "isnan", "softplus", "softplus_backward", "hardswish", "hardswish_backward",
    "hardsigmoid", "hardsigmoid_backward", "elu_backward", "log1p", "expm1", "bitwise_and",
    "bitwise_or", "bitwise_xor", "logical_xor", "remainder", "fmod", "floor", "ceil", "round",
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
    return Op("expand", lambda x: lambda *i: x[bcast_index(i, x.shape)],
              out_shape=lambda x: dst, attrs={"shape": dst})


@register("addmm")
def addmm():
    """``C[i, j] = bias[bcast(i, j)] + Σ_k A[i, k] · B[k, j]`` (``nn.Linear``'s forward)."""
    return Op("addmm", lambda bias, a, b: lambda i, j: bias[bcast_index((i, j), bias.shape)]
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
            s1, _ = stats_axes(dy, idx, axes, names_)
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
def layer_norm_backward_data(nnorm: int = 1, weight: bool = True):
    """``dx[*b, *f] = g(dy[*b, *f], x[*b, *f], w[*f], Σ_f w·dy, Σ_f w·dy·x, mean[*b],
    rstd[*b])``: the two sums read the whole weight, whatever part of f is computed."""
    has_w = weight

    def fn(dy, x, mean, rstd, *w):
        wt = w[0] if has_w else None

        def out(*idx):
            nd = len(idx)
            axes = list(range(nd - nnorm, nd))

            def at(t, rs):
                full = list(idx)
                for a, r in zip(axes, rs):
                    full[a] = r
                return t[tuple(full)]

            def wdy(rs):
                return at(dy, rs) * wt[tuple(rs)] if wt is not None else at(dy, rs)
            nm = tuple(f"r{a}" for a in axes)
            s1 = reduce_over("sum", nm, lambda *rs: wdy(rs))
            s2 = reduce_over("sum", tuple(f"q{a}" for a in axes),
                             lambda *rs: wdy(rs) * at(x, rs))
            lead = idx[:nd - nnorm] + (0,) * nnorm
            own = dy[idx] * wt[idx[nd - nnorm:]] if wt is not None else dy[idx]
            return Opaque("ln_dx", own, x[idx], s1, s2, mean[lead], rstd[lead])
        return out
    ins = ("dy", "x", "mean", "rstd") + (("weight",) if has_w else ())
    return Op("layer_norm_backward_data", fn, inputs=ins, out_shape=lambda dy, *r: dy,
              attrs={"nnorm": nnorm, "weight": has_w})


@register("layer_norm_backward_weight")
def layer_norm_backward_weight(nnorm: int = 1):
    """``dγ[*f] = Σ_{*b} dy[*b, *f] · (x[*b, *f] − mean[*b]) · rstd[*b]``."""
    def fn(dy, x, mean, rstd):
        def out(*f):
            nb = dy.ndim - nnorm

            def term(*bs):
                lead = bs + (0,) * nnorm
                return dy[bs + f] * Opaque("xhat", x[bs + f], mean[lead], rstd[lead])
            return reduce_over("sum", tuple(f"b{i}" for i in range(nb)), term)
        return out
    return Op("layer_norm_backward_weight", fn,
              out_shape=lambda dy, x, m, r: tuple(dy[len(dy) - nnorm:]), attrs={"nnorm": nnorm})


@register("norm_stat")
def norm_stat(dims=(-1,), keepdim: bool = False, stat: str = "rstd", running: bool = False):
    """A normalisation's saved statistic other than the mean (``rstd``, a new running mean or
    variance): ``out[kept] = stat(Σ_dims x, Σ_dims x² [, running[kept]])`` - it reads what
    the mean reads but is not a sum of partial results (no output reduction)."""
    dims_ = tuple(dims)

    def out_shape(x, *r):
        ds = {d % len(x) for d in dims_}
        return tuple((1 if a in ds else n) for a, n in enumerate(x) if keepdim or a not in ds)

    def fn(x, *r):
        ds = sorted({d % x.ndim for d in dims_})

        def out(*idx):
            full, it = [], iter(idx)
            for a in range(x.ndim):
                if a in ds:
                    full.append(None)
                    if keepdim:
                        next(it)
                else:
                    full.append(next(it))
            s1, s2 = stats_axes(x, [0 if f is None else f for f in full], ds,
                            tuple(f"r{a}" for a in ds))
            args = [s1, s2] + ([r[0][idx]] if running else [])
            return Opaque(stat, *args)
        return out
    ins = ("x",) + (("running",) if running else ())
    return Op(stat, fn, inputs=ins, out_shape=out_shape,
              attrs={"dims": dims_, "keepdim": keepdim, "running": running})


@register("max_pool_indices")
def max_pool_indices(nsp: int = 2, kernel=2, stride=None, padding=0, dilation=1):
    """Max pooling's saved arg-max: ``out[n, c, *x] = argmax_{dx} data[n, c, x·s − p + dx·d]``
    - the window of the max pool, but an index, not a max of partial results."""
    base = describe("max_pool", nsp=nsp, kernel=kernel, stride=stride, padding=padding,
                    dilation=dilation)

    def fn(data):
        inner = base.fn(data)
        return lambda n, c, *xs: Opaque("argmax", inner(n, c, *xs))
    return Op(f"max_pool{nsp}d_indices", fn, out_shape=base._out_shape,
              out_names=base.out_names, attrs=dict(base.attrs))


@register("avg_pool_backward")
def avg_pool_backward(nsp: int = 2, kernel=2, stride=None, padding=0, in_size=None):
    """``dx[n, c, *y] = Σ_{dy} dout[n, c, (y + p − dy) / s] / Πk`` (every window containing y)."""
    k = as_tuple(kernel, nsp)
    s = as_tuple(stride if stride else kernel, nsp)
    p = as_tuple(padding, nsp)
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
    k = as_tuple(kernel, nsp)
    s = as_tuple(stride if stride else kernel, nsp)
    p, d = as_tuple(padding, nsp), as_tuple(dilation, nsp)
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
    """``dx[n, c, *y] = Σ_o dout[n, c, *o] / |bin o|`` over the output bins that contain ``y``:
    bin ``o`` spans ``⌊o·S/O⌋ ≤ y < ⌈(o + 1)·S/O⌉``, so ``⌊y·O/S⌋ ≤ o ≤ ⌈(y + 1)·O/S⌉ − 1``
    (one bin when S is a multiple of O; several when bins overlap or O > S, as AlexNet's
    6×6 pool of a small image)."""
    def fn(dout, x):
        nsp = len(x.shape) - 2
        names = tuple("o" + s for s in ("z", "y", "x")[3 - nsp:])
        S, O = x.shape[2:], dout.shape[2:]

        def out(n, c, *ys):
            ext = {w: ((y * o) // s, ((y + 1) * o + s - 1) // s - 1)
                   for w, y, s, o in zip(names, ys, S, O)}
            return reduce_over("sum", names, lambda *os_: dout[(n, c) + os_]
                               * Opaque("inverse_bin_size", *os_), ext)
        return out
    return Op("adaptive_avg_pool_backward", fn, out_shape=lambda dout, x: x)


@register("upsample_nearest_backward")
def upsample_nearest_backward(in_size=(1, 1)):
    """``dx[n, c, *i] = Σ dy[n, c, *o]`` over the outputs nearest upsampling copied from ``i``:
    ``⌊o·I/O⌋ = i``, i.e. ``⌈i·O/I⌉ ≤ o ≤ ⌈(i + 1)·O/I⌉ − 1`` on each spatial axis."""
    isz = tuple(int(v) for v in in_size)
    nsp = len(isz)
    names = tuple("o" + s for s in ("z", "y", "x")[3 - nsp:])

    def fn(dy):
        osz = dy.shape[2:]

        def out(n, c, *idx):
            ext = {w: ((i * O + I - 1) // I, ((i + 1) * O + I - 1) // I - 1)
                   for w, i, I, O in zip(names, idx, isz, osz)}
            return reduce_over("sum", names, lambda *os_: dy[(n, c) + os_], ext)
        return out
    return Op("upsample_nearest_backward", fn,
              out_shape=lambda dy: tuple(dy[:2]) + isz, attrs={"in_size": isz})


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
# Indexing, scans and attention kernels of today's models (transformers, U-Nets, MobileNets)
# --------------------------------------------------------------------------------------------


def _with(idx, dim, v):
    """``idx`` with coordinate ``dim`` replaced by ``v``."""
    return tuple(idx[:dim]) + (v,) + tuple(idx[dim + 1:])


@register("gather")
def gather(dim: int = 0):
    """``out[*i] = x[i with i_dim → index[*i]]``: along ``dim`` the row is data-dependent."""
    def fn(x, index):
        return lambda *i: x[_with(i, dim % x.ndim, Opaque("index", index[i]))]
    return Op("gather", fn, out_shape=lambda x, index: index, attrs={"dim": dim})


@register("scatter_add", "scatter")
def scatter_add(dim: int = 0, accumulate: bool = True, has_src: bool = True):
    """``out[*j] = self[*j] + Σ_r src[j with j_dim → r] · (index[j with j_dim → r] == j_dim)``
    (r over index's axis ``dim``).  ``accumulate=False`` (``scatter``): the matching value
    replaces self's - the same reads, but not a sum of partial results."""
    def fn(self_, index, *src):
        d = dim % self_.ndim
        ext = {"r": index.shape[d]}

        def out(*j):
            def term(r):
                hit = Opaque("eq", index[_with(j, d, r)], j[d])
                return src[0][_with(j, d, r)] * hit if has_src else hit
            s = reduce_over("sum", ("r",), term, ext)
            return self_[j] + s if accumulate else Opaque("put", self_[j], s)
        return out
    ins = ("self", "index") + (("src",) if has_src else ())
    return Op("scatter_add" if accumulate else "scatter", fn, inputs=ins,
              out_shape=lambda self_, *r: self_,
              attrs={"dim": dim, "accumulate": accumulate, "has_src": has_src})


@register("index_select")
def index_select(dim: int = 0):
    """``out[.., i, ..] = x[.., index[i], ..]`` (``index`` 1-D): a gather along ``dim``."""
    def fn(x, index):
        d = dim % x.ndim
        return lambda *i: x[_with(i, d, Opaque("index", index[
            (i[d],) if index.ndim else ()]))]
    return Op("index_select", fn, attrs={"dim": dim},
              out_shape=lambda x, index: _with(x, dim % len(x), math.prod(index)))


@register("index_add")
def index_add(dim: int = 0):
    """``out[.., j, ..] = self[.., j, ..] + Σ_r source[.., r, ..] · (index[r] == j)`` (the
    gradient of ``index_select``)."""
    def fn(self_, index, source):
        d = dim % self_.ndim

        def out(*j):
            return self_[j] + reduce_over("sum", ("r",), lambda r: source[_with(j, d, r)]
                                          * Opaque("eq", index[r], j[d]), {"r": index.shape[0]})
        return out
    return Op("index_add", fn, out_shape=lambda self_, i, s: self_, attrs={"dim": dim})


def _advanced_layout(xnd: int, positions: tuple, bnd: int) -> list:
    """Output axes of ``x[indices]`` (NumPy advanced indexing): ``("x", axis)`` or ``("b", j)``
    for the broadcast index axes - in place of the indexed axes when these are adjacent,
    else first."""
    rest = [("x", a) for a in range(xnd) if a not in positions]
    b = [("b", j) for j in range(bnd)]
    if list(positions) == list(range(positions[0], positions[0] + len(positions))):
        p0 = positions[0]
        return [("x", a) for a in range(p0)] + b + [("x", a) for a in range(
            positions[-1] + 1, xnd)]
    return b + rest


@register("index", "_unsafe_index")
def index(positions=(0,)):
    """``out = x[..., idx_0, ..., idx_1, ...]`` with integer index tensors at ``positions``:
    each indexed axis of x reads the (broadcast) index value - any row."""
    positions = tuple(int(p) for p in positions)
    ins = ("x",) + tuple(f"i{k}" for k in range(len(positions)))

    def layout(xs, ishapes):
        bshape = bcast_shape(*ishapes)
        return bshape, _advanced_layout(len(xs), positions, len(bshape))

    def out_shape(x, *ishapes):
        bshape, lay = layout(x, ishapes)
        return tuple(x[a] if kind == "x" else bshape[a] for kind, a in lay)

    def fn(x, *its):
        bshape, lay = layout(x.shape, [t.shape for t in its])

        def out(*o):
            b = tuple(o[k] for k, (kind, _) in enumerate(lay) if kind == "b")
            src = [None] * x.ndim
            for k, (kind, a) in enumerate(lay):
                if kind == "x":
                    src[a] = o[k]
            for p, t in zip(positions, its):
                src[p] = Opaque("index", t[bcast_index(b, t.shape)])
            return x[tuple(src)]
        return out
    return Op("index", fn, inputs=ins, out_shape=out_shape, attrs={"positions": positions})


@register("index_put")
def index_put(positions=(0,), accumulate: bool = False):
    """``out[*j] = self[*j] (+) Σ_b values[bcast(b, j)] · Π_k (idx_k[b] == j_{pos_k})`` over
    the broadcast index shape b; without ``accumulate`` the matching value replaces self's
    (same reads, but not a sum of partial results)."""
    positions = tuple(int(p) for p in positions)
    ins = ("self",) + tuple(f"i{k}" for k in range(len(positions))) + ("values",)

    def fn(self_, *rest):
        its, values = rest[:-1], rest[-1]
        bshape = bcast_shape(*(t.shape for t in its))
        lay = _advanced_layout(self_.ndim, positions, len(bshape))
        bn = tuple(f"b{j}" for j in range(len(bshape)))

        def out(*j):
            def term(*b):
                res = tuple(j[a] if kind == "x" else b[a] for kind, a in lay)
                v = values[bcast_index(res, values.shape)]
                for p, t in zip(positions, its):
                    v = v * Opaque("eq", t[bcast_index(b, t.shape)], j[p])
                return v
            s = reduce_over("sum", bn, term, dict(zip(bn, bshape)))
            return self_[j] + s if accumulate else Opaque("put", self_[j], s)
        return out
    return Op("index_put", fn, inputs=ins, out_shape=lambda self_, *r: self_,
              attrs={"positions": positions, "accumulate": accumulate})


@register("cumsum")
def cumsum(dim: int = 0):
    """``out[.., i, ..] = Σ_{r ≤ i} x[.., r, ..]``: a prefix sum, its range ending at the
    output coordinate (``[0, i]``) - worker i reads every earlier row."""
    def fn(x):
        d = dim % x.ndim
        return lambda *i: reduce_over("sum", ("r",), lambda r: x[_with(i, d, r)],
                                      {"r": (0, i[d])})
    return Op("cumsum", fn, out_shape=lambda x: x, attrs={"dim": dim})


@register("flip")
def flip(dims=(0,)):
    """``out[.., i, ..] = x[.., S − 1 − i, ..]`` on each flipped axis."""
    dims_ = tuple(int(d) for d in dims)

    def fn(x):
        ds = {d % x.ndim for d in dims_}
        return lambda *i: x[tuple(x.shape[a] - 1 - v if a in ds else v
                                  for a, v in enumerate(i))]
    return Op("flip", fn, out_shape=lambda x: x, attrs={"dims": dims_})


@register("slice_scatter", "select_scatter")
def slice_scatter(dim: int = 0, start: int = 0, stop: int = 1, select: bool = False):
    """``out[.., i, ..] = src[.., i − start, ..]`` for start ≤ i < stop, else ``self``: a
    piecewise copy (``select``: src lacks the axis)."""
    def fn(self_, src):
        d = dim % self_.ndim
        size = self_.shape[d]

        def out(*i):
            rest = i[:d] + i[d + 1:]
            pieces = [(start, lambda loc: self_[_with(i, d, loc)]),
                      (stop - start, (lambda loc: src[rest]) if select else
                       (lambda loc: src[_with(i, d, loc)])),
                      (size - stop, lambda loc: self_[_with(i, d, loc + stop)])]
            return Concat(i[d], [p for p in pieces if p[0] > 0])
        return out
    return Op("slice_scatter", fn, out_shape=lambda self_, src: self_,
              attrs={"dim": dim, "start": start, "stop": stop, "select": select})


@register("baddbmm")
def baddbmm():
    """``out[b, i, j] = self[bcast(b, i, j)] + Σ_k b1[b, i, k] · b2[b, k, j]``."""
    def fn(self_, b1, b2):
        return lambda b, i, j: self_[bcast_index((b, i, j), self_.shape)] + reduce_over(
            "sum", ("k",), lambda k: b1[b, i, k] * b2[b, k, j])
    return Op("baddbmm", fn, out_shape=lambda s, b1, b2: (b1[0], b1[1], b2[2]))


@register("conv_transpose")
def conv_transpose(nsp: int = 2, stride=1, padding=0, dilation=1, groups: int = 1,
                   out_size=None, bias: bool = False):
    """Transposed convolution, PyTorch layout ``weight[ci, co/groups, *k]``: ``out[n, co, *y]
    = Σ_{ci, *dy} x[n, ci, (y + p − dy·d) / s] · weight[ci, co', *dy] (+ bias[co])`` - the
    data gradient of the convolution it transposes (exact division by the stride);
    ``out_size`` (spatial) carries ``output_padding``."""
    base = describe("conv_backward_data", nsp=nsp, stride=stride, padding=padding,
                    dilation=dilation, groups=groups, in_size=out_size)

    def fn(x, weight, *b):
        inner = base.fn(x, weight)
        if not bias:
            return inner
        return lambda n, c, *ys: inner(n, c, *ys) + b[0][c]
    ins = ("x", "weight") + (("bias",) if bias else ())
    return Op(f"conv_transpose{nsp}d", fn, inputs=ins,
              out_shape=lambda x, w, *b: base._out_shape(x, w), out_names=base.out_names,
              attrs={**base.attrs, "bias": bias})


def _attention_parts(q, k, causal, mask):
    """The score of query l and key j (``Σ_e q·k`` plus the mask), the key range of query l
    (``j ≤ l`` when causal: PyTorch's top-left aligned mask) and the group size of
    grouped-query attention (query head h reads key/value head ``h // G``)."""
    G = max(1, q.shape[1] // k.shape[1])

    def kv_head(h):
        return h // G if G > 1 else h

    def score(n, h, l, j):
        s = reduce_over("sum", ("e",), lambda e: q[n, h, l, e] * k[n, kv_head(h), j, e])
        if mask is not None:
            s = s + mask[bcast_index((n, h, l, j), mask.shape)]
        return s

    def keys(l):
        return (0, l) if causal else k.shape[2]
    return G, kv_head, score, keys


@register("flash_attention")
def flash_attention(causal: bool = False, mask: bool = False, part: str = "out"):
    """PyTorch's fused attention kernel (``_scaled_dot_product_flash_attention_for_cpu``):
    ``out[n, h, l, d] = Σ_j exp(s_lj) / Σ_j' exp(s_lj') · v[n, h/G, j, d]``, output 1 the
    log-sum-exp ``lse[n, h, l] = log Σ_j exp(s_lj)``; causal masks keep ``j ≤ l``."""
    def fn(q, k, v, *m):
        G, kvh, score, keys = _attention_parts(q, k, causal, m[0] if mask else None)

        def den(n, h, l):
            return reduce_over("sum", ("j2",), lambda j2: Opaque("exp", score(n, h, l, j2)),
                               {"j2": keys(l)})
        if part == "lse":
            return lambda n, h, l: Opaque("log", den(n, h, l))
        return lambda n, h, l, d: reduce_over(
            "sum", ("j",), lambda j: Opaque("exp", score(n, h, l, j)) / den(n, h, l)
            * v[n, kvh(h), j, d], {"j": keys(l)})
    ins = ("q", "k", "v") + (("mask",) if mask else ())

    def out_shape(q, k, v, *m):
        return tuple(q[:3]) if part == "lse" else tuple(q[:3]) + (v[3],)
    return Op("flash_attention" + ("_lse" if part == "lse" else ""), fn, inputs=ins,
              out_shape=out_shape, attrs={"causal": causal, "mask": mask, "part": part})


@register("flash_attention_backward")
def flash_attention_backward(causal: bool = False, mask: bool = False, part: str = "dq"):
    """The fused attention kernel's gradients, with ``P = exp(s − lse)``, ``dP = dO·vᵀ``,
    ``D = Σ_d dO·O`` and ``dS = P·(dP − D)``: ``dq[l] = Σ_j dS_lj·k[j]``, ``dk[j] = Σ_{g, l}
    dS_lj·q[l]`` and ``dv[j] = Σ_{g, l} P_lj·dO[l]`` over the G query heads of a key/value
    head and the queries that see key j (``l ≥ j`` when causal)."""
    def fn(do, q, k, v, o, lse, *m):
        G, kvh, score, keys = _attention_parts(q, k, causal, m[0] if mask else None)
        L = q.shape[2]

        def p(n, h, l, j):
            return Opaque("p", score(n, h, l, j), lse[n, h, l])

        def ds(n, h, l, j):
            dp = reduce_over("sum", ("dd",), lambda dd: do[n, h, l, dd] * v[n, kvh(h), j, dd])
            dsum = reduce_over("sum", ("dd2",), lambda dd: do[n, h, l, dd] * o[n, h, l, dd])
            return Opaque("ds", p(n, h, l, j), dp, dsum)
        if part == "dq":
            return lambda n, h, l, e: reduce_over(
                "sum", ("j",), lambda j: ds(n, h, l, j) * k[n, kvh(h), j, e], {"j": keys(l)})

        def over_queries(hk, j, body):
            ext = {"l": (j, L - 1) if causal else L}
            if G == 1:
                return reduce_over("sum", ("l",), lambda l: body(hk, l), ext)
            ext["g"] = G
            return reduce_over("sum", ("g", "l"), lambda g, l: body(hk * G + g, l), ext)
        if part == "dk":
            return lambda n, hk, j, e: over_queries(
                hk, j, lambda h, l: ds(n, h, l, j) * q[n, h, l, e])
        return lambda n, hk, j, d: over_queries(hk, j, lambda h, l: p(n, h, l, j) * do[n, h, l, d])
    ins = ("do", "q", "k", "v", "o", "lse") + (("mask",) if mask else ())

    def out_shape(do, q, k, v, o, lse, *m):
        return {"dq": q, "dk": k, "dv": v}[part]
    return Op("flash_attention_" + part, fn, inputs=ins, out_shape=out_shape,
              attrs={"causal": causal, "mask": mask, "part": part})


# --------------------------------------------------------------------------------------------
# The mapping
# --------------------------------------------------------------------------------------------


def _is_tensor_arg(a, g) -> bool:
    return isinstance(a, str) and a in g.tensors


def _norm(d, nd):
    return d % nd if nd else 0


def _shared_inputs(desc: Op, names_tids: list):
    """One input per tensor: an op reading one tensor through several arguments
    (``cat([x, x])`` in rotary embeddings) gets a description whose repeated arguments are
    one input, so its region covers every read (the plan fetches a tensor once per op)."""
    tids = [tid for _, tid in names_tids]
    uniq = list(dict.fromkeys(tids))
    if len(uniq) == len(tids):
        return desc, names_tids
    pos = [uniq.index(tid) for tid in tids]
    names_ = [names_tids[tids.index(tid)][0] for tid in uniq]
    shape_fn = desc._out_shape
    return Op(desc.name, lambda *refs: desc.fn(*(refs[p] for p in pos)), inputs=names_,
              out_shape=(lambda *sh: shape_fn(*(sh[p] for p in pos))) if shape_fn else None,
              out_names=desc.out_names, attrs={**desc.attrs, "shared": tuple(pos)}), \
        list(zip(names_, uniq))


def _int_indices(op, g, tids):
    """Advanced indexing with boolean masks has a data-dependent shape: refuse it by name."""
    for t in tids:
        if not str(g.tensors[t].dtype).startswith(("int", "uint")):
            raise UnsupportedOp(f"op {op.name}: aten.{op.target} with a {g.tensors[t].dtype} "
                                f"index (a mask) has no TDL description")


def describe_op(op, g) -> Described | None:
    """The TDL description of ``op`` (``None`` for ops that create a tensor from nothing).

    Raises :class:`UnsupportedOp` naming the aten operator and the line of model code that
    made it (``op.where``) when there is no description or it does not fit the traced op."""
    try:
        return _describe(op, g)
    except (TDLError, KeyError) as e:
        msg = str(e.args[0]) if isinstance(e, KeyError) and e.args else str(e)
        if not isinstance(e, UnsupportedOp):
            msg = f"op {op.name} (aten.{op.target}): {msg}"
        where = getattr(op, "where", "")
        if where and "made by" not in msg:
            msg = msg.replace("; add one to", f" (made by {where}); add one to") \
                if "; add one to" in msg else f"{msg} (made by {where})"
        raise UnsupportedOp(" ".join(msg.split())) from None


def _nearest_scales(op, in_size, out_size, scales) -> None:
    """Nearest upsampling reads ``⌊o / scale⌋`` when a scale factor is given, ``⌊o·I/O⌋``
    otherwise: the two agree (and the description holds) when each scale is ``O / I``."""
    flat = [v for s in scales for v in (s if isinstance(s, (list, tuple)) else [s])]
    if len(flat) == 1 and len(in_size) > 1:
        flat = flat * len(in_size)
    for s, i, o in zip(flat, in_size, out_size):
        if s is not None and float(s) * i != o:
            raise UnsupportedOp(f"op {op.name}: aten.{op.target} with scale factor {s} for "
                                f"{i} -> {o} elements (not {o}/{i}) has no TDL description")


def _describe(op, g) -> Described | None:
    t = op.target
    base = t[:-1] if t.endswith("_") and not t.startswith("_") else t
    shp = {tid: g.tensors[tid].shape for tid in op.inputs}
    out_shape = g.tensors[op.output].shape
    a = op.args
    ten = [x for x in a if _is_tensor_arg(x, g)]

    def bind(desc, names_tids):
        desc, names_tids = _shared_inputs(desc, names_tids)
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
    if base == "baddbmm":
        return ins(describe("baddbmm"), ten[:3])
    if base == "convolution":
        x, w = a[0], a[1]
        b = a[2] if _is_tensor_arg(a[2], g) else None
        nsp = len(shp[x]) - 2
        if a[6]:
            desc = describe("conv_transpose", nsp=nsp, stride=tuple(a[3]), padding=tuple(a[4]),
                            dilation=tuple(a[5]), groups=int(a[8]), bias=b is not None,
                            out_size=tuple(out_shape[2:]))
            return ins(desc, [x, w] + ([b] if b else []))
        desc = describe("conv", nsp=nsp, stride=tuple(a[3]), padding=tuple(a[4]),
                        dilation=tuple(a[5]), groups=int(a[8]), bias=b is not None)
        return ins(desc, [x, w] + ([b] if b else []))
    if base == "convolution_backward":
        dy, x, w = a[0], a[1], a[2]
        nsp = len(shp[x]) - 2
        kw = dict(nsp=nsp, stride=tuple(a[4]), padding=tuple(a[5]), dilation=tuple(a[6]),
                  groups=int(a[9]))
        if a[7] and op.index == 0:    # transposed: the input gradient is a convolution
            return ins(describe("conv", **kw), [dy, w])
        if a[7] and op.index == 1:    # filter gradient, the roles of x and dy swapped
            return ins(describe("conv_backward_filter", kernel=tuple(shp[w][2:]), **kw), [dy, x])
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
        dims = (0,) + tuple(range(2, nd))
        if op.index == 1:             # the saved mean: a per-channel mean of x
            return ins(describe("reduce", dims=dims, kind="mean"), [x])
        if op.index == 2:             # the saved inverse deviation
            return ins(describe("norm_stat", dims=dims, stat="invstd"), [x])
        # the new running mean / variance (functional variant): old value and batch statistics
        run_ = a[3] if op.index == 3 else a[4]
        return ins(describe("norm_stat", dims=dims, stat="running", running=True), [x, run_])
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
        dims = tuple(range(nd - nnorm, nd))
        if op.index == 1:
            return ins(describe("reduce", dims=dims, keepdim=True, kind="mean"), [x])
        return ins(describe("norm_stat", dims=dims, keepdim=True, stat="rstd"), [x])
    if base == "native_layer_norm_backward":
        dy, x = a[0], a[1]
        nnorm = len(a[2])
        mean, rstd, w = a[3], a[4], a[5]
        nd = len(shp[x])
        if op.index == 0:
            has_w = _is_tensor_arg(w, g)
            return ins(describe("layer_norm_backward_data", nnorm=nnorm, weight=has_w),
                       [dy, x, mean, rstd] + ([w] if has_w else []))
        if op.index == 1:
            return ins(describe("layer_norm_backward_weight", nnorm=nnorm), [dy, x, mean, rstd])
        return ins(describe("reduce", dims=tuple(range(nd - nnorm)), kind="sum"), [dy])
    if base in ("max_pool2d_with_indices", "max_pool2d", "max_pool1d_with_indices",
                "max_pool3d_with_indices"):
        x = a[0]
        nsp = len(shp[x]) - 2
        k = tuple(a[1])
        st = tuple(a[2]) if len(a) > 2 and a[2] else k
        pad = tuple(a[3]) if len(a) > 3 else 0
        dil = tuple(a[4]) if len(a) > 4 else 1
        return ins(describe("max_pool_indices" if op.index == 1 else "max_pool", nsp=nsp,
                            kernel=k, stride=st, padding=pad, dilation=dil), [x])
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
        # legacy empty operands (shape (0,), e.g. an empty cache) add nothing: not read
        tids = [x for x in a[0] if _is_tensor_arg(x, g) and not (
            len(out_shape) > 1 and tuple(shp[x]) == (0,))]
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
    if base == "gather":
        return ins(describe("gather", dim=int(a[1])), [a[0], a[2]])
    if base in ("scatter_add", "scatter"):
        has_src = _is_tensor_arg(a[3], g) if len(a) > 3 else False
        if op.kwargs.get("reduce") or (len(a) > 4 and a[4] is not None):
            raise UnsupportedOp(f"op {op.name}: aten.{t} with reduce= has no TDL description")
        desc = describe("scatter_add", dim=int(a[1]), accumulate=base == "scatter_add",
                        has_src=has_src)
        return ins(desc, [a[0], a[2]] + ([a[3]] if has_src else []))
    if base == "index_select":
        return ins(describe("index_select", dim=int(a[1])), [a[0], a[2]])
    if base == "index_add":
        return ins(describe("index_add", dim=int(a[1])), [a[0], a[2], a[3]])
    if base in ("index", "_unsafe_index"):
        pos = tuple(i for i, x in enumerate(a[1]) if x is not None)
        _int_indices(op, g, [a[1][i] for i in pos])
        return ins(describe("index", positions=pos), [a[0]] + [a[1][i] for i in pos])
    if base in ("index_put", "_unsafe_index_put", "_index_put_impl"):
        pos = tuple(i for i, x in enumerate(a[1]) if x is not None)
        _int_indices(op, g, [a[1][i] for i in pos])
        acc = bool(a[3]) if len(a) > 3 else bool(op.kwargs.get("accumulate", False))
        return ins(describe("index_put", positions=pos, accumulate=acc),
                   [a[0]] + [a[1][i] for i in pos] + [a[2]])
    if base == "cumsum":
        return ins(describe("cumsum", dim=int(a[1])), [a[0]])
    if base == "flip":
        return ins(describe("flip", dims=tuple(a[1])), [a[0]])
    if base in ("slice_scatter", "select_scatter"):
        x = a[0]
        nd = len(shp[x])
        dim = _norm(int(a[2]) if len(a) > 2 else 0, nd)
        size = shp[x][dim]
        if base == "select_scatter":
            i = int(a[3]) % size
            return ins(describe("slice_scatter", dim=dim, start=i, stop=i + 1, select=True),
                       [x, a[1]])
        st_ = int(a[3]) if len(a) > 3 and a[3] is not None else 0
        en_ = int(a[4]) if len(a) > 4 and a[4] is not None else size
        if len(a) > 5 and int(a[5]) != 1:
            raise UnsupportedOp(f"op {op.name}: strided slice_scatter (step {a[5]})")
        st_ = min(max(0, st_ + size if st_ < 0 else st_), size)
        en_ = min(max(st_, en_ + size if en_ < 0 else en_), size)
        return ins(describe("slice_scatter", dim=dim, start=st_, stop=en_), [x, a[1]])
    if base == "_scaled_dot_product_flash_attention_for_cpu":
        mask = op.kwargs.get("attn_mask")
        mask = mask if _is_tensor_arg(mask, g) else None
        causal = bool(a[4]) if len(a) > 4 else bool(op.kwargs.get("is_causal", False))
        desc = describe("flash_attention", causal=causal, mask=mask is not None,
                        part="lse" if op.index == 1 else "out")
        return ins(desc, list(a[:3]) + ([mask] if mask else []))
    if base == "_scaled_dot_product_flash_attention_for_cpu_backward":
        mask = op.kwargs.get("attn_mask")
        mask = mask if _is_tensor_arg(mask, g) else None
        causal = bool(a[7]) if len(a) > 7 else bool(op.kwargs.get("is_causal", False))
        desc = describe("flash_attention_backward", causal=causal, mask=mask is not None,
                        part=("dq", "dk", "dv")[op.index])
        return ins(desc, list(a[:6]) + ([mask] if mask else []))
    if base in ("upsample_nearest1d", "upsample_nearest2d", "upsample_nearest3d"):
        _nearest_scales(op, shp[a[0]][2:], out_shape[2:], a[2:])
        return ins(describe("upsample", out_size=tuple(out_shape[2:])), [a[0]])
    if base in ("upsample_nearest1d_backward", "upsample_nearest2d_backward",
                "upsample_nearest3d_backward"):
        isz = tuple(int(v) for v in a[2])[2:]
        _nearest_scales(op, isz, tuple(int(v) for v in a[1]), a[3:])
        return ins(describe("upsample_nearest_backward", in_size=isz), [a[0]])
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
        f"description; add one to explorer/engine/tofu/tdl/aten.py")

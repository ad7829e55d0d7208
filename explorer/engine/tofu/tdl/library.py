"""TDL descriptions of the operators our example models produce (Tofu Section 4.1).

Each entry is a factory ``f(**attrs) -> Op``; :func:`describe` looks one up by name and raises
``KeyError`` naming an operator that has no description (never silently skipped).  Layouts
follow PyTorch (NCHW activations, ``weight[out, in, *kernel]`` for convolutions, ``weight[out,
in]`` for linear).  The paper's own examples (Figures 1-3 and Section 4.2) are here too:
``conv1d`` (with ``filters[ci, co, dx]``), ``shift_two``, ``batch_cholesky`` and 2-D ``matmul``.

Padding is an index offset (``x * stride - padding + dx * dilation``): reads outside the input
are zeros and are clipped away by the analysis.  Strided-convolution gradients use exact
division ``(y + p - dx * d) / s`` (only the terms where s divides exist).
"""

from __future__ import annotations

import math

from explorer.engine.tofu.tdl.lang import Concat, Ix, Opaque, TDLError, reduce_over
from explorer.engine.tofu.tdl.op import Op

__all__ = ["describe", "names", "register"]

_REGISTRY: dict = {}


def register(*names_):
    """Decorator: register an ``Op`` factory under one or more operator names."""
    def deco(f):
        for n in names_:
            _REGISTRY[n] = f
        return f
    return deco


def alias(name: str, factory, **fixed):
    """Register ``name`` as ``factory`` with some attributes fixed (e.g. ``mul`` = binary
    with ``fn="mul"``); attributes passed to :func:`describe` still win."""
    _REGISTRY[name] = lambda **attrs: factory(**{**fixed, **attrs})


def names() -> list:
    """Every operator name with a description."""
    return sorted(_REGISTRY)


def describe(name: str, **attrs) -> Op:
    """The TDL description of operator ``name`` built with ``attrs``.

    Raises ``KeyError`` naming the operator when it has no description.
    """
    try:
        f = _REGISTRY[name]
    except KeyError:
        raise KeyError(f"no TDL description for operator {name!r} "
                       f"({len(_REGISTRY)} operators are described; see tdl.names())") from None
    return f(**attrs)


def as_tuple(v, n):
    if isinstance(v, (tuple, list)):
        if len(v) != n:
            raise TDLError(f"expected {n} values, got {tuple(v)}")
        return tuple(int(x) for x in v)
    return (int(v),) * n


_SP_NAMES = {1: ("x",), 2: ("y", "x"), 3: ("z", "y", "x")}


def _win_names(nsp):
    return tuple("d" + s for s in _SP_NAMES[nsp])


def _window_out(size, k, s, p, d):
    return (size + 2 * p - d * (k - 1) - 1) // s + 1


# --------------------------------------------------------------------------------------------
# The paper's examples
# --------------------------------------------------------------------------------------------


@register("conv1d")
def conv1d():
    """Figure 3: ``output[b, co, x] = Σ_{ci, dx} data[b, ci, x + dx] · filters[ci, co, dx]``."""
    return Op("conv1d", lambda data, filters: lambda b, co, x:
              reduce_over("sum", ("ci", "dx"),
                          lambda ci, dx: data[b, ci, x + dx] * filters[ci, co, dx]))


@register("shift_two")
def shift_two():
    """Section 4.2: ``B[i] = A[i + 2]``."""
    return Op("shift_two", lambda A: lambda i: A[i + 2])


@register("batch_cholesky")
def batch_cholesky():
    """Figure 3: an opaque per-matrix Cholesky, partitionable only along the batch."""
    chol = Opaque("cholesky")
    return Op("batch_cholesky", lambda batch_mat: lambda b, i, j:
              chol(batch_mat[b, :, :])[i, j],
              out_shape=lambda m: m)


@register("matmul", "mm")
def matmul():
    """``C[i, j] = Σ_k A[i, k] · B[k, j]``."""
    return Op("matmul", lambda A, B: lambda i, j:
              reduce_over("sum", ("k",), lambda k: A[i, k] * B[k, j]))


@register("matmul_backward_a")
def matmul_backward_a():
    """``dA[i, k] = Σ_j dC[i, j] · B[k, j]`` (dA = dC Bᵀ)."""
    return Op("matmul_backward_a", lambda dC, B: lambda i, k:
              reduce_over("sum", ("j",), lambda j: dC[i, j] * B[k, j]))


@register("matmul_backward_b")
def matmul_backward_b():
    """``dB[k, j] = Σ_i A[i, k] · dC[i, j]`` (dB = Aᵀ dC)."""
    return Op("matmul_backward_b", lambda A, dC: lambda k, j:
              reduce_over("sum", ("i",), lambda i: A[i, k] * dC[i, j]))


# --------------------------------------------------------------------------------------------
# Matrix products
# --------------------------------------------------------------------------------------------


def bcast_shape(*shapes):
    nd = max(len(s) for s in shapes)
    out = []
    for a in range(nd):
        sizes = {s[a - nd + len(s)] for s in shapes if a - nd + len(s) >= 0}
        sizes.discard(1)
        if len(sizes) > 1:
            raise TDLError(f"shapes {list(shapes)} do not broadcast")
        out.append(sizes.pop() if sizes else 1)
    return tuple(out)


def bcast_index(idx, shape):
    """Right-aligned broadcast: the operand's index for output coordinates ``idx``."""
    off = len(idx) - len(shape)
    return tuple(0 if s == 1 else idx[off + a] for a, s in enumerate(shape))


@register("batch_matmul", "bmm")
def batch_matmul():
    """``C[*b, m, n] = Σ_k A[*b, m, k] · B[*b, k, n]`` with broadcast batch axes (rank ≥ 2)."""
    def out_shape(a, b):
        if len(a) < 2 or len(b) < 2:
            raise TDLError("batch_matmul needs operands of rank ≥ 2")
        return bcast_shape(a[:-2], b[:-2]) + (a[-2], b[-1])

    def fn(A, B):
        def out(*idx):
            bat, m, n = idx[:-2], idx[-2], idx[-1]
            return reduce_over("sum", ("k",), lambda k:
                               A[bcast_index(bat, A.shape[:-2]) + (m, k)]
                               * B[bcast_index(bat, B.shape[:-2]) + (k, n)])
        return out
    return Op("batch_matmul", fn, out_shape=out_shape)


@register("linear")
def linear(bias: bool = True):
    """``y[*b, o] = Σ_i x[*b, i] · weight[o, i] + bias[o]``."""
    def fn(x, weight, bias=None):
        def out(*idx):
            r = reduce_over("sum", ("i",), lambda i: x[idx[:-1] + (i,)] * weight[idx[-1], i])
            return r + bias[idx[-1]] if bias is not None else r
        return out
    ins = ("x", "weight", "bias") if bias else ("x", "weight")
    return Op("linear", fn, inputs=ins, out_shape=lambda x, w, *b: tuple(x[:-1]) + (w[0],),
              attrs={"bias": bias})


@register("linear_backward_data")
def linear_backward_data():
    """``dx[*b, i] = Σ_o dy[*b, o] · weight[o, i]``."""
    return Op("linear_backward_data", lambda dy, weight: lambda *idx:
              reduce_over("sum", ("o",), lambda o: dy[idx[:-1] + (o,)] * weight[o, idx[-1]]),
              out_shape=lambda dy, w: tuple(dy[:-1]) + (w[1],))


@register("linear_backward_weight")
def linear_backward_weight():
    """``dW[o, i] = Σ_b dy[b, o] · x[b, i]`` (2-D activations)."""
    return Op("linear_backward_weight", lambda dy, x: lambda o, i:
              reduce_over("sum", ("b",), lambda b: dy[b, o] * x[b, i]))


@register("linear_backward_bias")
def linear_backward_bias():
    """``db[o] = Σ_b dy[b, o]``."""
    return Op("linear_backward_bias", lambda dy: lambda o:
              reduce_over("sum", ("b",), lambda b: dy[b, o]))


# --------------------------------------------------------------------------------------------
# Convolution and its gradients
# --------------------------------------------------------------------------------------------


def _conv_attrs(nsp, stride, padding, dilation):
    return as_tuple(stride, nsp), as_tuple(padding, nsp), as_tuple(dilation, nsp)


def _group_channel(co, ci, groups, cout, cin):
    """Input channel read by output channel ``co`` at in-group channel ``ci``."""
    if groups == 1:
        return ci
    if cout % groups or cin % groups:
        raise TDLError(f"groups={groups} must divide channels in={cin} and out={cout}")
    return (co // (cout // groups)) * (cin // groups) + ci


@register("conv")
def conv(nsp: int = 2, stride=1, padding=0, dilation=1, groups: int = 1, bias: bool = False):
    """N-d convolution, PyTorch layout: ``out[n, co, *x] = Σ_{ci, *dx} data[n, g(co)+ci,
    x·s - p + dx·d] · weight[co, ci, *dx] (+ bias[co])`` with ``g(co)`` the group's first
    input channel."""
    s, p, d = _conv_attrs(nsp, stride, padding, dilation)
    groups = int(groups)

    def out_shape(data, weight, *b):
        return (data[0], weight[0]) + tuple(
            _window_out(data[2 + i], weight[2 + i], s[i], p[i], d[i]) for i in range(nsp))

    def fn(data, weight, bias=None):
        cout, cin = weight.shape[0], data.shape[1]

        def out(n, co, *xs):
            def inner(ci, *dxs):
                ch = _group_channel(co, ci, groups, cout, cin)
                pos = tuple(x * s[i] - p[i] + dx * d[i] for i, (x, dx) in enumerate(zip(xs, dxs)))
                return data[(n, ch) + pos] * weight[(co, ci) + dxs]
            r = reduce_over("sum", ("ci",) + _win_names(nsp), inner)
            return r + bias[co] if bias is not None else r
        return out
    ins = ("data", "weight", "bias") if bias else ("data", "weight")
    return Op(f"conv{nsp}d", fn, inputs=ins, out_shape=out_shape,
              out_names=("n", "co") + _SP_NAMES[nsp],
              attrs={"stride": s, "padding": p, "dilation": d, "groups": groups, "bias": bias})


@register("conv2d")
def conv2d(**attrs):
    """2-D convolution (see :func:`conv`)."""
    return conv(nsp=2, **attrs)


@register("conv3d")
def conv3d(**attrs):
    return conv(nsp=3, **attrs)


@register("conv_backward_data", "conv2d_backward_data")
def conv_backward_data(nsp: int = 2, stride=1, padding=0, dilation=1, groups: int = 1,
                       in_size=None):
    """Data gradient: ``dx[n, ci, *y] = Σ_{co, *dy} dout[n, co, (y + p - dy·d) / s] ·
    weight[co, ci', *dy]`` - the transposed convolution, with exact division by the stride.
    ``in_size`` (spatial sizes of x) is needed because strided convolutions lose it."""
    s, p, d = _conv_attrs(nsp, stride, padding, dilation)
    groups = int(groups)

    def out_shape(dout, weight):
        if in_size is None:
            sz = tuple((dout[2 + i] - 1) * s[i] - 2 * p[i] + d[i] * (weight[2 + i] - 1) + 1
                       for i in range(nsp))
        else:
            sz = as_tuple(in_size, nsp)
        return (dout[0], weight[1] * groups) + sz

    def fn(dout, weight):
        cout = weight.shape[0]
        og, ig = cout // groups, weight.shape[1]

        def out(n, c, *ys):
            if groups == 1:
                names_, wci = ("co",), c
            else:
                names_, wci = ("cg",), c % ig

            def inner(cc, *dys):
                co = cc if groups == 1 else (c // ig) * og + cc
                pos = tuple((y + p[i] - dy * d[i]) / s[i] for i, (y, dy) in enumerate(zip(ys, dys)))
                return dout[(n, co) + pos] * weight[(co, wci) + dys]
            ext = {} if groups == 1 else {"cg": og}
            ext.update({w: weight.shape[2 + i] for i, w in enumerate(_win_names(nsp))})
            return reduce_over("sum", names_ + _win_names(nsp), inner, ext)
        return out
    return Op(f"conv{nsp}d_backward_data", fn, out_shape=out_shape,
              out_names=("n", "ci") + _SP_NAMES[nsp],
              attrs={"stride": s, "padding": p, "dilation": d, "groups": groups,
                     "in_size": None if in_size is None else as_tuple(in_size, nsp)})


@register("conv_backward_filter", "conv2d_backward_filter")
def conv_backward_filter(nsp: int = 2, stride=1, padding=0, dilation=1, groups: int = 1,
                         kernel=None):
    """Filter gradient: ``dW[co, ci, *dy] = Σ_{n, *y} dout[n, co, *y] · x[n, g(co)+ci,
    y·s - p + dy·d]``.  ``kernel`` gives the filter size (else inferred from the shapes)."""
    s, p, d = _conv_attrs(nsp, stride, padding, dilation)
    groups = int(groups)

    def out_shape(x, dout):
        if kernel is not None:
            ks = as_tuple(kernel, nsp)
        else:  # largest kernel consistent with the sizes
            ks = tuple((x[2 + i] + 2 * p[i] - (dout[2 + i] - 1) * s[i] - 1) // d[i] + 1
                       for i in range(nsp))
        return (dout[1], x[1] // groups) + ks

    def fn(x, dout):
        cout, cin = dout.shape[1], x.shape[1]

        def out(co, ci, *dys):
            def inner(n, *ys):
                ch = _group_channel(co, ci, groups, cout, cin)
                pos = tuple(y * s[i] - p[i] + dy * d[i] for i, (y, dy) in enumerate(zip(ys, dys)))
                return dout[(n, co) + ys] * x[(n, ch) + pos]
            return reduce_over("sum", ("n",) + _SP_NAMES[nsp], inner)
        return out
    return Op(f"conv{nsp}d_backward_filter", fn, out_shape=out_shape,
              out_names=("co", "ci") + _win_names(nsp),
              attrs={"stride": s, "padding": p, "dilation": d, "groups": groups,
                     "kernel": None if kernel is None else as_tuple(kernel, nsp)})


# --------------------------------------------------------------------------------------------
# Pooling
# --------------------------------------------------------------------------------------------


def _pool(kind, nsp, kernel, stride, padding, dilation):
    k = as_tuple(kernel, nsp)
    s = as_tuple(stride if stride is not None else kernel, nsp)
    p, d = as_tuple(padding, nsp), as_tuple(dilation, nsp)

    def out_shape(data):
        return tuple(data[:2]) + tuple(_window_out(data[2 + i], k[i], s[i], p[i], d[i])
                                       for i in range(nsp))

    def fn(data):
        def out(n, c, *xs):
            def inner(*dxs):
                return data[(n, c) + tuple(x * s[i] - p[i] + dx * d[i]
                                           for i, (x, dx) in enumerate(zip(xs, dxs)))]
            r = reduce_over("max" if kind == "max" else "sum", _win_names(nsp), inner,
                            dict(zip(_win_names(nsp), k)))
            return r if kind == "max" else r / math.prod(k)
        return out
    return Op(f"{kind}_pool{nsp}d", fn, out_shape=out_shape,
              out_names=("n", "c") + _SP_NAMES[nsp],
              attrs={"kernel": k, "stride": s, "padding": p, "dilation": d})


@register("max_pool", "max_pool2d")
def max_pool(nsp: int = 2, kernel=2, stride=None, padding=0, dilation=1):
    """``out[n, c, *x] = Max_{dx < k} data[n, c, x·s - p + dx·d]``."""
    return _pool("max", nsp, kernel, stride, padding, dilation)


@register("avg_pool", "avg_pool2d")
def avg_pool(nsp: int = 2, kernel=2, stride=None, padding=0, dilation=1):
    """``out[n, c, *x] = Σ_{dx < k} data[n, c, x·s - p + dx·d] / Πk``."""
    return _pool("avg", nsp, kernel, stride, padding, dilation)


@register("max_pool_backward", "max_pool2d_backward")
def max_pool_backward(nsp: int = 2, kernel=2, stride=None, padding=0, dilation=1):
    """``dx[n, c, *y] = Σ_{dy} dout[n, c, o] · argmax_is(y, window of o in x)`` with
    ``o = (y + p - dy·d) / s``: the gradient flows to the window's arg-max, so the input is read
    over the windows of every output o the element belongs to."""
    k = as_tuple(kernel, nsp)
    s = as_tuple(stride if stride is not None else kernel, nsp)
    p, d = as_tuple(padding, nsp), as_tuple(dilation, nsp)
    wn = _win_names(nsp)
    en = tuple("e" + c for c in _SP_NAMES[nsp])

    def fn(dout, x):
        def out(n, c, *ys):
            def inner(*dys):
                os_ = tuple((y + p[i] - dy * d[i]) / s[i] for i, (y, dy) in enumerate(zip(ys, dys)))
                win = reduce_over("max", en, lambda *es: x[(n, c) + tuple(
                    o * s[i] - p[i] + e * d[i] for i, (o, e) in enumerate(zip(os_, es)))],
                    dict(zip(en, k)))
                return dout[(n, c) + os_] * Opaque("is_argmax", x[(n, c) + ys], win)
            return reduce_over("sum", wn, inner, dict(zip(wn, k)))
        return out
    return Op(f"max_pool{nsp}d_backward", fn, out_shape=lambda dout, x: x,
              out_names=("n", "c") + _SP_NAMES[nsp],
              attrs={"kernel": k, "stride": s, "padding": p, "dilation": d})


@register("adaptive_pool", "adaptive_avg_pool")
def adaptive_pool(out_size=(1, 1), kind: str = "avg"):
    """``out[n, c, *x] = avg/max of data[n, c, ⌊x·S/O⌋ : ⌈(x+1)·S/O⌉]``: a reduction whose
    range depends on the output coordinate (inclusive bounds as index expressions)."""
    osz = tuple(int(v) for v in out_size)
    nsp = len(osz)

    def fn(data):
        sizes = data.shape[2:]

        def out(n, c, *xs):
            ext = {}
            for i, (x, w) in enumerate(zip(xs, _win_names(nsp))):
                S, O = sizes[i], osz[i]
                ext[w] = ((x * S) // O, ((x + 1) * S + O - 1) // O - 1)
            r = reduce_over("max" if kind == "max" else "sum", _win_names(nsp),
                            lambda *rs: data[(n, c) + rs], ext)
            return r if kind == "max" else Opaque("mean_of_window", r)
        return out
    return Op("adaptive_pool", fn, out_shape=lambda data: tuple(data[:2]) + osz,
              out_names=("n", "c") + _SP_NAMES[nsp], attrs={"out_size": osz, "kind": kind})


@register("upsample", "interpolate")
def upsample(out_size=None, mode: str = "nearest"):
    """Nearest: ``out[n, c, o] = data[n, c, ⌊o·I/O⌋]``; (bi)linear (align_corners=False):
    ``data[n, c, i0 + t]`` for t ∈ {0, 1}, ``i0 = ⌊((2o + 1)·I - O) / 2O⌋`` (clamped)."""
    if out_size is None:
        raise TDLError("upsample needs out_size (the output's spatial sizes)")
    osz = tuple(int(v) for v in out_size)
    nsp = len(osz)
    if mode not in ("nearest", "bilinear", "linear"):
        raise TDLError(f"upsample mode {mode!r} has no description")

    def fn(data):
        sizes = data.shape[2:]

        def out(n, c, *os_):
            if mode == "nearest":
                return data[(n, c) + tuple((o * sizes[i]) // osz[i] for i, o in enumerate(os_))]
            tn = tuple("t" + s for s in _SP_NAMES[nsp])
            return reduce_over("sum", tn, lambda *ts: data[(n, c) + tuple(
                ((2 * o + 1) * sizes[i] - osz[i]) // (2 * osz[i]) + t
                for i, (o, t) in enumerate(zip(os_, ts)))] * Opaque("lerp_weight", *ts),
                dict.fromkeys(tn, 2))
        return out
    return Op("upsample", fn, out_shape=lambda data: tuple(data[:2]) + osz,
              out_names=("n", "c") + _SP_NAMES[nsp], attrs={"out_size": osz, "mode": mode})


# --------------------------------------------------------------------------------------------
# Element-wise ops
# --------------------------------------------------------------------------------------------

_ARITH = {"add": "+", "sub": "-", "mul": "*", "div": "/", "truediv": "/", "pow": "**"}


@register("unary")
def unary(fn: str = "relu"):
    """``out[*i] = fn(x[*i])``."""
    return Op(fn, lambda x: lambda *i: Opaque(fn, x[i]), out_shape=lambda x: x)


@register("binary", "eltwise")
def binary(fn: str = "add", n_inputs: int = 2):
    """``out[*i] = a[bcast(i)] (fn) b[bcast(i)] (fn) ...`` with right-aligned broadcasting
    (size-1 operand axes read index 0)."""
    ins = tuple(f"x{j}" for j in range(n_inputs))

    def f(*ts):
        def out(*i):
            vals = [t[bcast_index(i, t.shape)] for t in ts]
            acc = vals[0]
            for v in vals[1:]:
                acc = _apply(fn, acc, v)
            return acc
        return out
    return Op(fn, f, inputs=ins, out_shape=lambda *shapes: bcast_shape(*shapes),
              attrs={"fn": fn})


def _apply(fn, a, b):
    op = _ARITH.get(fn)
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    if op == "/":
        return a / b
    if op == "**":
        return a ** b
    return Opaque(fn, a, b)


@register("relu_backward", "threshold_backward")
def relu_backward():
    """``dx[*i] = dy[*i] · (x[*i] > 0)``."""
    return Op("relu_backward", lambda dy, x: lambda *i: dy[i] * Opaque("positive", x[i]),
              out_shape=lambda dy, x: dy)


# --------------------------------------------------------------------------------------------
# Normalisation, softmax, reductions
# --------------------------------------------------------------------------------------------


def stats_axes(x, idx, axes, names_):
    """Mean and mean-of-squares of ``x`` over ``axes`` (other coordinates from ``idx``)."""
    def at(rs):
        full = list(idx)
        for a, r in zip(axes, rs):
            full[a] = r
        return x[tuple(full)]
    s1 = reduce_over("sum", names_, lambda *rs: at(rs))
    s2 = reduce_over("sum", names_, lambda *rs: at(rs) * at(rs))
    return s1, s2


@register("batch_norm")
def batch_norm(training: bool = True):
    """Training-mode BatchNorm over NC*: ``out[n, c, *x] = normalize(x[n, c, *x], Σ_{n,*x}
    x, Σ x²) · weight[c] + bias[c]`` - the statistics read every sample and position of the
    channel.  ``training=False`` uses running statistics (element-wise per channel)."""
    def fn(x, weight, bias):
        def out(*idx):
            nd = len(idx)
            axes = [0] + list(range(2, nd))
            if training:
                names_ = ("m",) + tuple("r" + str(a) for a in range(2, nd))
                s1, s2 = stats_axes(x, idx, axes, names_)
                v = Opaque("normalize", x[idx], s1, s2)
            else:
                v = Opaque("normalize_running", x[idx])
            return v * weight[idx[1]] + bias[idx[1]]
        return out
    return Op("batch_norm", fn, out_shape=lambda x, w, b: x, attrs={"training": training})


@register("layer_norm", "rms_norm")
def layer_norm(nnorm: int = 1, weight: bool = True, bias: bool = True):
    """LayerNorm over the last ``nnorm`` axes: statistics are reductions over them;
    ``weight``/``bias`` (optional) have the normalised shape."""
    has_w, has_b = weight, bias
    def fn(x, weight=None, bias=None):
        def out(*idx):
            nd = len(idx)
            axes = list(range(nd - nnorm, nd))
            s1, s2 = stats_axes(x, idx, axes, tuple(f"r{a}" for a in axes))
            v = Opaque("normalize", x[idx], s1, s2)
            if weight is not None:
                v = v * weight[idx[nd - nnorm:]]
            if bias is not None:
                v = v + bias[idx[nd - nnorm:]]
            return v
        return out
    ins = ("x",) + (("weight",) if has_w else ()) + (("bias",) if has_b else ())

    def fn2(x, *p):
        return fn(x, p[0] if has_w else None, p[-1] if has_b else None)
    return Op("layer_norm", fn2, inputs=ins, out_shape=lambda x, *p: x,
              attrs={"nnorm": nnorm, "weight": has_w, "bias": has_b})


@register("softmax")
def softmax(dim: int = -1):
    """``out[.., i, ..] = exp(x[.., i, ..]) / Σ_j exp(x[.., j, ..])`` along ``dim``."""
    def fn(x):
        def out(*idx):
            a = dim % len(idx)
            den = reduce_over("sum", ("j",), lambda j: Opaque(
                "exp", x[idx[:a] + (j,) + idx[a + 1:]]))
            return Opaque("exp", x[idx]) / den
        return out
    return Op("softmax", fn, out_shape=lambda x: x, attrs={"dim": dim})


@register("softmax_backward")
def softmax_backward(dim: int = -1):
    """``dx[.., i, ..] = y[.., i, ..] · (dy[.., i, ..] - Σ_j dy[.., j, ..] · y[.., j, ..])``."""
    def fn(dy, y):
        def out(*idx):
            a = dim % len(idx)

            def at(t, j):
                return t[idx[:a] + (j,) + idx[a + 1:]]
            dot = reduce_over("sum", ("j",), lambda j: at(dy, j) * at(y, j))
            return y[idx] * (dy[idx] - dot)
        return out
    return Op("softmax_backward", fn, out_shape=lambda dy, y: dy, attrs={"dim": dim})


@register("reduce")
def reduce(dims=(-1,), keepdim: bool = False, kind: str = "sum"):
    """``out[kept] = Σ/Max/... over dims of x``; ``mean`` is a sum scaled by a constant."""
    dims_ = (dims,) if isinstance(dims, int) else tuple(dims)
    red = {"sum": "sum", "mean": "sum", "amax": "max", "max": "max", "amin": "min",
           "min": "min", "prod": "prod"}[kind]

    def norm(nd):
        return sorted({d % nd for d in dims_})

    def out_shape(x):
        ds = norm(len(x))
        return tuple((1 if a in ds else s) for a, s in enumerate(x) if keepdim or a not in ds)

    def fn(x):
        ds = norm(x.ndim)

        def out(*idx):
            def inner(*rs):
                full, j, r = [], 0, iter(rs)
                for a in range(x.ndim):
                    if a in ds:
                        full.append(next(r))
                        j += 1 if keepdim else 0
                    else:
                        full.append(idx[j])
                        j += 1
                return x[tuple(full)]
            v = reduce_over(red, tuple(f"r{a}" for a in ds), inner)
            return v / math.prod(x.shape[a] for a in ds) if kind == "mean" else v
        return out
    return Op(kind, fn, out_shape=out_shape, attrs={"dims": dims_, "keepdim": keepdim})


# --------------------------------------------------------------------------------------------
# Embedding, attention, LSTM
# --------------------------------------------------------------------------------------------


@register("embedding")
def embedding():
    """Gather: ``out[*b, c] = weight[ids[*b], c]`` - the row is data-dependent (any row)."""
    return Op("embedding", lambda ids, weight: lambda *idx:
              weight[Opaque("index", ids[idx[:-1]]), idx[-1]],
              out_shape=lambda ids, w: tuple(ids) + (w[1],))


@register("embedding_backward")
def embedding_backward(num_embeddings: int = None):
    """Scatter-add: ``dW[v, c] = Σ_{*b} dy[*b, c] · (ids[*b] == v)``."""
    if num_embeddings is None:
        raise TDLError("embedding_backward needs num_embeddings")
    def fn(dy, ids):
        def out(v, c):
            nb = ids.ndim
            return reduce_over("sum", tuple(f"b{a}" for a in range(nb)), lambda *bs:
                               dy[bs + (c,)] * Opaque("eq", ids[bs], v))
        return out
    return Op("embedding_backward", fn, out_shape=lambda dy, ids: (num_embeddings, dy[-1]),
              attrs={"num_embeddings": int(num_embeddings)})


@register("sdpa", "scaled_dot_product_attention")
def sdpa():
    """``out[n, h, l, d] = Σ_j softmax_j(Σ_e q[n,h,l,e]·k[n,h,j,e]) · v[n,h,j,d]``."""
    def fn(q, k, v):
        def out(n, h, l, d):
            def score(j):
                return reduce_over("sum", ("e",), lambda e: q[n, h, l, e] * k[n, h, j, e])
            den = reduce_over("sum", ("j2",), lambda j2: Opaque("exp", score(j2)))
            return reduce_over("sum", ("j",), lambda j: Opaque("exp", score(j)) / den
                               * v[n, h, j, d])
        return out
    return Op("sdpa", fn, out_shape=lambda q, k, v: tuple(q[:-1]) + (v[-1],))


@register("lstm_cell")
def lstm_cell(has_state: bool = True, bias: bool = True):
    """One LSTM step, weights viewed as ``[4 gates, hidden, in]``: gate g of unit u is
    ``Σ_k x[n,k]·W_ih[g,u,k] + Σ_k h[n,k]·W_hh[g,u,k] + b[g,u]``; ``c' = σ(f)·c + σ(i)·tanh(g)``,
    output ``h' = σ(o)·tanh(c')`` (same box for ``c'``).  Without a state (first step) the
    state is PyTorch's zero ``h0``/``c0`` - ``W_hh`` is still read, as the kernel does."""
    def fn(x, *rest):
        if has_state:
            h, c, w_ih, w_hh = rest[:4]
            bs = rest[4:]
        else:
            w_ih, w_hh = rest[:2]
            bs = rest[2:]
            h = c = None

        def out(n, u):
            def gate(g):
                v = reduce_over("sum", (f"k{g}",), lambda kk: x[n, kk] * w_ih[g, u, kk])
                # without a state input PyTorch runs the same kernel on a zero state h0
                v = v + reduce_over("sum", (f"m{g}",), lambda m: (
                    h[n, m] if h is not None else Opaque("h0", n, m)) * w_hh[g, u, m])
                for b in bs:
                    v = v + b[g, u]
                return v
            i_, f_, g_, o_ = (gate(g) for g in range(4))
            cprev = c[n, u] if c is not None else 0
            c2 = Opaque("sigmoid", f_) * cprev + Opaque("sigmoid", i_) * Opaque("tanh", g_)
            return Opaque("sigmoid", o_) * Opaque("tanh", c2)
        return out
    ins = ("x",) + (("h", "c") if has_state else ()) + ("weight_ih", "weight_hh") + (
        ("bias_ih", "bias_hh") if bias else ())
    return Op("lstm_cell", fn, inputs=ins,
              out_shape=lambda x, *r: (x[0], r[2 if has_state else 0][1]),
              attrs={"has_state": has_state, "bias": bias})


# --------------------------------------------------------------------------------------------
# Concatenation and views
# --------------------------------------------------------------------------------------------


@register("concat", "cat")
def concat(dim: int = 0, n_inputs: int = 2):
    """Piecewise: ``out[.., i, ..] = x_j[.., i - off_j, ..]`` for ``off_j ≤ i < off_j + size_j``."""
    ins = tuple(f"x{j}" for j in range(n_inputs))

    def out_shape(*shapes):
        a = dim % len(shapes[0])
        return tuple(shapes[0][:a]) + (sum(s[a] for s in shapes),) + tuple(shapes[0][a + 1:])

    def fn(*ts):
        def out(*idx):
            a = dim % len(idx)
            return Concat(idx[a], [(t.shape[a], (lambda t: lambda loc: t[
                idx[:a] + (loc,) + idx[a + 1:]])(t)) for t in ts])
        return out
    return Op("concat", fn, inputs=ins, out_shape=out_shape, attrs={"dim": dim})


@register("permute", "transpose")
def permute(perm=(1, 0)):
    """``out[i_0, .., i_n] = x[j]`` with ``j[perm[a]] = i_a`` (output axis a is input axis
    perm[a], as ``torch.permute``)."""
    perm = tuple(int(p) for p in perm)

    def fn(x):
        def out(*idx):
            src = [None] * len(perm)
            for a, p in enumerate(perm):
                src[p] = idx[a]
            return x[tuple(src)]
        return out
    return Op("permute", fn, out_shape=lambda x: tuple(x[p] for p in perm),
              attrs={"perm": perm})


def _reshape_groups(src, dst):
    """Axis groups of a reshape: maximal runs of src and dst axes with equal element counts
    (size-1 axes belong to no group: their index is 0)."""
    def bounds(shape):
        out, p = [], 1
        for s in shape:
            p *= s
            out.append(p)
        return out
    bs, bd = bounds(src), bounds(dst)
    cuts = sorted(set(bs) & set(bd))
    groups = []
    lo = 1
    for c in cuts:
        gi = [a for a, s in enumerate(src) if s > 1 and lo < bs[a] <= c]
        gj = [a for a, s in enumerate(dst) if s > 1 and lo < bd[a] <= c]
        if gi or gj:
            groups.append((gi, gj))
        lo = c
    return groups


@register("reshape", "view", "flatten")
def reshape(shape=None):
    """Row-major reshape to ``shape``: inside each group of axes with equal element counts,
    ``flat = Σ_b i_b · stride_b`` over output axes and input axis a reads
    ``(flat // stride_a) % size_a``."""
    if shape is None:
        raise TDLError("reshape needs the target shape")
    dst = tuple(int(s) for s in shape)

    def fn(x):
        src = x.shape
        if math.prod(src) != math.prod(dst):
            raise TDLError(f"cannot reshape {src} to {dst}")
        groups = _reshape_groups(src, dst)

        def out(*idx):
            sidx = [Ix((), 0)] * len(src)
            for gi, gj in groups:
                flat, st = Ix((), 0), 1
                for b in reversed(gj):
                    flat = flat + idx[b] * st
                    st *= dst[b]
                st = 1
                for n_, a in enumerate(reversed(gi)):
                    e = flat // st if st > 1 else flat
                    sidx[a] = e if n_ == len(gi) - 1 else e % src[a]
                    st *= src[a]
            return x[tuple(sidx)]
        return out
    return Op("reshape", fn, out_shape=lambda x: dst, attrs={"shape": dst})


@register("select")
def select(dim: int = 0, index: int = 0):
    """``out[.., ..] = x[.., index, ..]`` (the axis ``dim`` removed)."""
    def fn(x):
        def out(*idx):
            a = dim % x.ndim
            return x[idx[:a] + (index,) + idx[a:]]
        return out
    return Op("select", fn, out_shape=lambda x: tuple(
        s for a, s in enumerate(x) if a != dim % len(x)), attrs={"dim": dim, "index": index})


@register("slice", "narrow")
def slice_(dim: int = 0, start: int = 0, stop: int | None = None):
    """``out[.., i, ..] = x[.., start + i, ..]`` for ``0 ≤ i < stop - start``."""
    def out_shape(x):
        a = dim % len(x)
        e = x[a] if stop is None else min(stop, x[a])
        return tuple(x[:a]) + (max(e - start, 0),) + tuple(x[a + 1:])

    def fn(x):
        def out(*idx):
            a = dim % x.ndim
            return x[idx[:a] + (idx[a] + start,) + idx[a + 1:]]
        return out
    return Op("slice", fn, out_shape=out_shape, attrs={"dim": dim, "start": start, "stop": stop})


for _fn in ("relu", "gelu", "tanh", "sigmoid", "exp", "log", "neg", "identity", "dropout",
            "silu", "sqrt", "hardtanh", "leaky_relu"):
    alias(_fn, unary, fn=_fn)
for _fn in ("add", "sub", "mul", "div", "pow", "maximum", "minimum"):
    alias(_fn, binary, fn=_fn)
for _fn in ("sum", "mean", "amax", "amin", "prod"):
    alias(_fn, reduce, kind=_fn)
alias("adaptive_max_pool", adaptive_pool, kind="max")
alias("max_pool1d", max_pool, nsp=1)
alias("avg_pool1d", avg_pool, nsp=1)
alias("conv1d_torch", conv, nsp=1)
alias("log_softmax", softmax)
del _fn

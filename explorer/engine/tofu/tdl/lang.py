"""The Tensor Description Language (TDL) of Tofu (Wang et al., EuroSys 2019, Section 4.1).

A tensor is a lambda from output coordinates (*index variables*) to a value.  An operator is
described once, e.g. the paper's Figure 3::

    conv1d = Op("conv1d", lambda data, filters: lambda b, co, x:
                Sum(lambda ci, dx: data[b, ci, x + dx] * filters[ci, co, dx]))

Calling the lambdas on symbolic index variables builds an expression tree (operator
overloading); every tensor access ``T[e1, e2, ...]`` is recorded.  Index expressions are affine
in the index variables with integer coefficients (``x * 2 + dx``, ``i - 1``); ``//`` and ``%``
by a positive constant and ``/`` (exact division: only the terms where it divides exist, as in
strided-convolution gradients) are allowed as atoms.  The product of two index expressions is
rejected, as in the paper ("Product or comparison between two intervals are not supported").

Values combine with ``+ - * / **`` and :func:`Opaque` functions (``Opaque("relu", x[i, j])``),
whose arguments' accesses still count.  Reductions :func:`Sum`, :func:`Max`, :func:`Min`,
:func:`Prod` take an inner lambda; each reduction variable ranges over the dimension it indexes
directly (``filters[ci, co, dx]`` gives ``dx`` the extent of ``filters``' axis 2) unless an
extent is passed (``Max(lambda dx: data[x * 2 + dx], dx=3)``).  A tensor indexed by a *value*
(``weight[ids[n], c]``, a gather) may be read anywhere along that axis.  :func:`Concat` is the
piecewise special form for concatenation.

This module only builds trees; :mod:`.intervals` analyses them.
"""

from __future__ import annotations

import inspect
import itertools
import numbers
import types

__all__ = ["TDLError", "Ix", "Var", "Sum", "Max", "Min", "Prod", "Opaque", "Concat",
           "reduce_over", "FULL"]


class TDLError(ValueError):
    """A description that TDL cannot express or analyse (e.g. a non-affine index)."""


_ids = itertools.count()


# --------------------------------------------------------------------------------------------
# Index expressions
# --------------------------------------------------------------------------------------------


class Var:
    """An index variable: ``kind`` is "out" (output coordinate), "red" (reduction variable) or
    "piece" (a concatenation piece's local coordinate).  Compared by identity."""

    __slots__ = ("name", "kind", "uid")

    def __init__(self, name: str, kind: str):
        self.name, self.kind, self.uid = str(name), kind, next(_ids)

    def __repr__(self):
        return self.name


class Atom:
    """Non-affine atom of an index expression: ``op(ix, k)`` with a positive constant k."""

    __slots__ = ("op", "ix", "k", "uid")

    def __init__(self, op: str, ix: "Ix", k: int):
        self.op, self.ix, self.k, self.uid = op, ix, int(k), next(_ids)

    def __repr__(self):
        sym = {"floordiv": "//", "mod": "%", "exactdiv": "/"}[self.op]
        return f"({self.ix}){sym}{self.k}"


def _is_int(v) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


class Ix:
    """Affine index expression ``Σ coef·atom + const`` (atoms: :class:`Var` or floor/mod/exact
    division of an index expression by a constant)."""

    __slots__ = ("terms", "const")
    __array_priority__ = 1000  # keep numpy scalars from swallowing the expression

    def __init__(self, terms=(), const: int = 0):
        merged: dict = {}
        for atom, c in terms:
            merged[atom] = merged.get(atom, 0) + int(c)
        self.terms = tuple((a, c) for a, c in merged.items() if c != 0)
        self.const = int(const)

    @staticmethod
    def var(v: Var) -> "Ix":
        return Ix(((v, 1),), 0)

    @property
    def is_const(self) -> bool:
        return not self.terms

    def bare_var(self):
        """The :class:`Var` if this expression is exactly one variable, else None."""
        if self.const == 0 and len(self.terms) == 1:
            a, c = self.terms[0]
            if c == 1 and isinstance(a, Var):
                return a
        return None

    def vars(self) -> set:
        out = set()
        for a, _ in self.terms:
            if isinstance(a, Var):
                out.add(a)
            else:
                out |= a.ix.vars()
        return out

    # arithmetic ------------------------------------------------------------------------------
    @staticmethod
    def _coerce(o):
        if isinstance(o, Ix):
            return o
        if _is_int(o):
            return Ix((), int(o))
        return None

    def __add__(self, o):
        o2 = Ix._coerce(o)
        if o2 is None:
            return NotImplemented
        return Ix(self.terms + o2.terms, self.const + o2.const)

    __radd__ = __add__

    def __neg__(self):
        return Ix(((a, -c) for a, c in self.terms), -self.const)

    def __sub__(self, o):
        o2 = Ix._coerce(o)
        if o2 is None:
            return NotImplemented
        return self + (-o2)

    def __rsub__(self, o):
        o2 = Ix._coerce(o)
        if o2 is None:
            return NotImplemented
        return o2 + (-self)

    def __mul__(self, o):
        o2 = Ix._coerce(o)
        if o2 is None:
            return NotImplemented
        if o2.is_const:
            k = o2.const
            return Ix(((a, c * k) for a, c in self.terms), self.const * k)
        if self.is_const:
            return o2 * self.const
        raise TDLError(f"index expression ({self}) * ({o2}) is not affine: TDL's symbolic "
                       f"intervals support only affine index arithmetic (Tofu Fig. 4)")

    __rmul__ = __mul__

    def _div(self, op, k):
        if not _is_int(k) or k <= 0:
            raise TDLError(f"index expression ({self}) {op} {k!r}: divide only by a positive "
                           f"integer constant")
        k = int(k)
        if k == 1:
            return Ix((), 0) if op == "mod" else self
        if self.is_const:
            c = self.const
            if op == "floordiv":
                return Ix((), c // k)
            if op == "mod":
                return Ix((), c % k)
            if c % k:
                raise TDLError(f"exact division {c}/{k} has no integer result")
            return Ix((), c // k)
        return Ix(((Atom(op, self, k), 1),), 0)

    def __floordiv__(self, k):
        return self._div("floordiv", k)

    def __mod__(self, k):
        return self._div("mod", k)

    def __truediv__(self, k):
        """Exact division (strided-gradient indices): terms where k does not divide vanish."""
        return self._div("exactdiv", k)

    def __repr__(self):
        parts = []
        for a, c in self.terms:
            t = repr(a) if c == 1 else f"-{a!r}" if c == -1 else f"{c}*{a!r}"
            parts.append(t)
        if self.const or not parts:
            parts.append(str(self.const))
        s = " + ".join(parts)
        return s.replace("+ -", "- ")



class _Full:
    """``T[i, :]``: the whole axis (paper Fig. 3's ``batch_mat[b, :, :]``)."""

    def __repr__(self):
        return ":"


FULL = _Full()


# --------------------------------------------------------------------------------------------
# Values
# --------------------------------------------------------------------------------------------


def const_value(o):
    if isinstance(o, Value):
        return o
    if isinstance(o, Ix):
        return IxVal(o)
    if isinstance(o, numbers.Number):
        return Const(o)
    raise TDLError(f"cannot use {o!r} ({type(o).__name__}) in a TDL expression")


class Value:
    """A TDL value expression (tensor element, arithmetic, reduction, opaque call)."""

    __array_priority__ = 1000

    def children(self):
        return ()

    def _bin(self, op, o, rev=False):
        try:
            o = const_value(o)
        except TDLError:
            return NotImplemented
        return Bin(op, o, self) if rev else Bin(op, self, o)

    def __add__(self, o): return self._bin("+", o)
    def __radd__(self, o): return self._bin("+", o, True)
    def __sub__(self, o): return self._bin("-", o)
    def __rsub__(self, o): return self._bin("-", o, True)
    def __mul__(self, o): return self._bin("*", o)
    def __rmul__(self, o): return self._bin("*", o, True)
    def __truediv__(self, o): return self._bin("/", o)
    def __rtruediv__(self, o): return self._bin("/", o, True)
    def __pow__(self, o): return self._bin("**", o)
    def __rpow__(self, o): return self._bin("**", o, True)
    def __neg__(self): return Call("neg", (self,))

    def __getitem__(self, idx):
        """``Cholesky(batch_mat[b, :, :])[i, j]`` (paper Fig. 3): element of an opaque result."""
        idx = idx if isinstance(idx, tuple) else (idx,)
        return Call("getitem", (self,) + tuple(const_value(i) for i in idx))


class Const(Value):
    def __init__(self, v):
        self.v = v

    def __repr__(self):
        return repr(self.v)


class IxVal(Value):
    """An index expression used as a value (``Opaque("eq", ids[n], v)``): reads nothing."""

    def __init__(self, ix: Ix):
        self.ix = ix

    def __repr__(self):
        return f"({self.ix})"


class Access(Value):
    """``tensor[i1, ..., in]``: each index an :class:`Ix`, :data:`FULL`, or a data value."""

    def __init__(self, tensor: str, idx: tuple):
        self.tensor, self.idx = tensor, idx

    def children(self):
        return tuple(i for i in self.idx if isinstance(i, Value))

    def __repr__(self):
        return f"{self.tensor}[{', '.join(map(repr, self.idx))}]"


class Bin(Value):
    def __init__(self, op, a, b):
        self.op, self.a, self.b = op, a, b

    def children(self):
        return (self.a, self.b)

    def __repr__(self):
        return f"({self.a!r} {self.op} {self.b!r})"


class Call(Value):
    """Opaque function application (Section 4.1): arguments' accesses count, nothing else."""

    def __init__(self, fn: str, args: tuple):
        self.fn, self.args = fn, tuple(args)

    def children(self):
        return self.args

    def __repr__(self):
        return f"{self.fn}({', '.join(map(repr, self.args))})"


class Reduce(Value):
    """``Sum/Max/Min/Prod(lambda r1, ..: body)`` over reduction variables ``vars``.

    ``extents[i]`` is None (infer from the axis ``vars[i]`` indexes), an int ``E`` (range
    ``[0, E-1]``) or an inclusive ``(lo, hi)`` pair of index expressions over outer variables
    (adaptive pooling windows).
    """

    def __init__(self, kind: str, vars_: tuple, extents: tuple, body: Value):
        self.kind, self.vars, self.extents, self.body = kind, vars_, extents, body

    def children(self):
        return (self.body,)

    def __repr__(self):
        return f"{self.kind.capitalize()}[{', '.join(v.name for v in self.vars)}]({self.body!r})"


class Piecewise(Value):
    """Concatenation along one coordinate: ``pieces`` of ``(start, size, local Var, body)``;
    piece j covers ``start ≤ at < start + size`` and sees ``local = at - start``."""

    def __init__(self, at: Ix, pieces: tuple):
        self.at, self.pieces = at, pieces

    def children(self):
        return tuple(p[3] for p in self.pieces)

    def __repr__(self):
        return "Concat(" + ", ".join(f"[{s}:{s + n}] {b!r}" for s, n, _, b in self.pieces) + ")"


def _index(i):
    if isinstance(i, Ix) or i is FULL:
        return i
    if _is_int(i):
        return Ix((), int(i))
    if isinstance(i, slice):
        if i == slice(None):
            return FULL
        raise TDLError(f"only ':' slices are supported in TDL accesses, got {i!r}")
    if isinstance(i, Value):
        return i  # data-dependent index (gather)
    raise TDLError(f"cannot index a tensor with {i!r} ({type(i).__name__})")


class TensorRef:
    """An operator input inside a description: ``data[b, ci, x + dx]`` records an access.

    ``shape`` is the concrete shape the description is being bound at (descriptions may use it,
    e.g. for group sizes); ``ndim`` its rank.
    """

    def __init__(self, name: str, shape: tuple):
        self.name, self.shape = name, tuple(int(s) for s in shape)
        self.ndim = len(self.shape)

    def __getitem__(self, idx):
        idx = idx if isinstance(idx, tuple) else (idx,)
        return Access(self.name, tuple(_index(i) for i in idx))

    def __repr__(self):
        return self.name


# --------------------------------------------------------------------------------------------
# Reductions, opaque functions, concatenation
# --------------------------------------------------------------------------------------------


def param_names(fn):
    """The parameter names of ``fn`` (a description's index lambda), or None when it takes
    ``*args`` / ``**kwargs`` or has no signature.  Plain functions are read from their code
    object: ``inspect.signature`` costs a millisecond here, once per operator described."""
    code = getattr(fn, "__code__", None)
    if isinstance(fn, types.FunctionType) and "__wrapped__" not in fn.__dict__ and code:
        if code.co_flags & (inspect.CO_VARARGS | inspect.CO_VARKEYWORDS):
            return None
        return list(code.co_varnames[:code.co_argcount + code.co_kwonlyargcount])
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return None
    names = []
    for p in sig.parameters.values():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            return None
        names.append(p.name)
    return names


def reduce_over(kind: str, names, fn, extents: dict | None = None) -> Reduce:
    """Reduction ``kind`` ("sum", "max", "min", "prod") over fresh variables ``names``;
    ``fn(*vars)`` gives the body.  Used by :func:`Sum` & co. and by rank-generic descriptions."""
    if kind not in ("sum", "max", "min", "prod"):
        raise TDLError(f"unknown reducer {kind!r}: TDL has Sum, Max, Min, Prod")
    extents = dict(extents or {})
    vs = tuple(Var(n, "red") for n in names)
    unknown = set(extents) - set(names)
    if unknown:
        raise TDLError(f"extents given for {sorted(unknown)} which are not reduction variables "
                       f"{list(names)}")
    ext = []
    for n in names:
        e = extents.get(n)
        if e is not None and not _is_int(e):
            lo, hi = e
            e = (Ix._coerce(lo), Ix._coerce(hi))
            if e[0] is None or e[1] is None:
                raise TDLError(f"extent of {n} must be an int or an inclusive (lo, hi) pair of "
                               f"index expressions, got {extents[n]!r}")
        elif e is not None and e < 1:
            raise TDLError(f"extent of {n} must be ≥ 1, got {e}")
        ext.append(e)
    body = const_value(fn(*(Ix.var(v) for v in vs)))
    return Reduce(kind, vs, tuple(ext), body)


def _reducer(kind):
    def red(fn, **extents):
        names = param_names(fn)
        if not names:
            raise TDLError(f"{kind.capitalize()} needs a lambda with named reduction variables, "
                           f"e.g. {kind.capitalize()}(lambda ci, dx: ...)")
        return reduce_over(kind, names, fn, extents)
    red.__name__ = kind.capitalize()
    red.__doc__ = (f"``{kind.capitalize()}(lambda r1, r2: body, **extents)``: {kind} of body "
                   f"over the reduction variables (Tofu Section 4.1 built-in reducer).")
    return red


Sum = _reducer("sum")
Max = _reducer("max")
Min = _reducer("min")
Prod = _reducer("prod")


class _OpaqueFn:
    def __init__(self, name):
        self.name = name

    def __call__(self, *args):
        return Call(self.name, tuple(const_value(a) for a in args))

    def __repr__(self):
        return f"Opaque({self.name!r})"


def Opaque(name: str, *args):
    """Opaque function (Section 4.1): ``Opaque("relu", x[i, j])`` is a value whose arguments'
    accesses count; ``Opaque("cholesky")`` without arguments returns the function itself."""
    if not args:
        return _OpaqueFn(name)
    return Call(name, tuple(const_value(a) for a in args))


def Concat(at, pieces) -> Piecewise:
    """Concatenation along coordinate ``at``: ``pieces`` is ``[(size, fn), ...]`` laid out from
    0; ``fn(local)`` gives the piece's value at ``local = at - start``."""
    at = Ix._coerce(at)
    if at is None:
        raise TDLError("Concat's coordinate must be an index expression")
    out, start = [], 0
    for size, fn in pieces:
        if not _is_int(size) or size < 0:
            raise TDLError(f"Concat piece size must be a non-negative int, got {size!r}")
        v = Var(f"{at}'{len(out)}", "piece")
        out.append((start, int(size), v, const_value(fn(Ix.var(v)))))
        start += int(size)
    return Piecewise(at, tuple(out))


# --------------------------------------------------------------------------------------------
# Operators
# --------------------------------------------------------------------------------------------

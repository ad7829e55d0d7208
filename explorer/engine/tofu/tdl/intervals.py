"""Symbolic interval analysis of TDL descriptions (Tofu, EuroSys 2019, Section 4.2).

Each index variable gets an interval ``[lo, hi]`` (inclusive); intervals flow through the
affine index expressions with the rules of the paper's Figure 4 (``I ± k``, ``I × k``, ``I / k``,
``I ± I'``; a negative factor swaps the ends).  Every tensor access then yields the region of
that tensor the computation reads; the region of an input is the bounding box of all its
accesses, clipped to the tensor (reads outside it are zero padding).

The same rules run in two domains:

* **numeric** (numpy int64 arrays, vectorised over many boxes at once): output variables range
  over a box, reduction variables over their extent (or a worker's slice of it).  This is what
  strategy discovery and the engine's geometry use; it is exact integer arithmetic with floor /
  ceiling at the non-affine atoms.
* **symbolic** (:class:`Sym`: affine forms over size symbols, the paper's equation 1): output
  coordinate ``x`` of size ``X`` split k ways gives worker i ``[i/k·X, (i+1)/k·X - 1]``;
  the analysis reports e.g. that conv1d's worker 0 reads ``data[..., 0 : X/2 + DX - 2]``.
  Symbolic regions are not clipped (the symbols carry no sizes).
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np

from explorer.engine.tofu.tdl.lang import (
    Access,
    Bin,
    Call,
    Ix,
    Piecewise,
    Reduce,
    TDLError,
    TensorRef,
    Value,
    Var,
    Atom,
    param_names,
    const_value,
)

__all__ = ["Sym", "Bound", "bind"]


# --------------------------------------------------------------------------------------------
# Symbolic affine forms (paper equation 1)
# --------------------------------------------------------------------------------------------


class Sym:
    """``Σ c_s·s + c`` over size symbols ``s`` with rational coefficients (paper eq. 1)."""

    __slots__ = ("terms", "const")

    def __init__(self, terms=None, const=0):
        self.terms = {k: Fraction(v) for k, v in (terms or {}).items() if v != 0}
        self.const = Fraction(const)

    @staticmethod
    def sym(name: str) -> "Sym":
        return Sym({name: 1})

    @staticmethod
    def _c(o):
        return o if isinstance(o, Sym) else Sym(None, o)

    def __add__(self, o):
        o = Sym._c(o)
        t = dict(self.terms)
        for k, v in o.terms.items():
            t[k] = t.get(k, 0) + v
        return Sym(t, self.const + o.const)

    __radd__ = __add__

    def __neg__(self):
        return Sym({k: -v for k, v in self.terms.items()}, -self.const)

    def __sub__(self, o):
        return self + (-Sym._c(o))

    def __rsub__(self, o):
        return Sym._c(o) - self

    def __mul__(self, k):
        if isinstance(k, Sym):
            if k.terms and self.terms:
                raise TDLError("product of two symbolic intervals is not affine (Tofu Fig. 4)")
            return self * k.const if not k.terms else k * self.const
        return Sym({s: v * k for s, v in self.terms.items()}, self.const * k)

    __rmul__ = __mul__

    def __truediv__(self, k):
        return self * Fraction(1, int(k))

    @property
    def is_const(self):
        return not self.terms

    def eval(self, sizes: dict) -> Fraction:
        """Value with the symbols replaced by ``sizes[symbol]``."""
        return sum((v * sizes[k] for k, v in self.terms.items()), Fraction(0)) + self.const

    def __eq__(self, o):
        o = Sym._c(o)
        return self.terms == o.terms and self.const == o.const

    def __hash__(self):
        return hash((tuple(sorted(self.terms.items())), self.const))

    def __str__(self):
        parts = []
        for s, v in self.terms.items():
            num, den = abs(v.numerator), v.denominator
            t = (f"{num}{s}" if num != 1 else s) + (f"/{den}" if den != 1 else "")
            parts.append(("- " if v < 0 else "+ ") + t)
        c = self.const
        if c or not parts:
            cs = str(abs(c.numerator)) + (f"/{c.denominator}" if c.denominator != 1 else "")
            parts.append(("- " if c < 0 else "+ ") + cs)
        s = " ".join(parts)
        return s[2:] if s.startswith("+ ") else "-" + s[2:]

    __repr__ = __str__


def _sym_min(a: Sym, b: Sym):
    d = a - b
    if d.is_const:
        return a if d.const <= 0 else b
    return None


def _sym_max(a: Sym, b: Sym):
    d = a - b
    if d.is_const:
        return a if d.const >= 0 else b
    return None


# --------------------------------------------------------------------------------------------
# Interval rules (generic over numpy arrays and Sym)
# --------------------------------------------------------------------------------------------


def _iv(ix: Ix, env: dict):
    """Interval ``(lo, hi)`` of an index expression given variable intervals ``env``."""
    lo = hi = ix.const
    for atom, c in ix.terms:
        if isinstance(atom, Var):
            try:
                a_lo, a_hi = env[atom]
            except KeyError:
                raise TDLError(f"index variable {atom.name} used outside its scope") from None
        else:
            a_lo, a_hi = _atom_iv(atom, env)
        if c > 0:
            lo, hi = lo + a_lo * c, hi + a_hi * c
        else:
            lo, hi = lo + a_hi * c, hi + a_lo * c
    return lo, hi


def _atom_iv(atom: Atom, env: dict):
    lo, hi = _iv(atom.ix, env)
    k = atom.k
    if isinstance(lo, Sym) or isinstance(hi, Sym):
        lo, hi = Sym._c(lo), Sym._c(hi)
        if atom.op == "mod":
            if lo.is_const and hi.is_const:
                return _atom_num("mod", lo.const, hi.const, k)
            return Sym(None, 0), Sym(None, k - 1)
        return lo / k, hi / k  # paper Fig. 4: I / k
    return _atom_num(atom.op, lo, hi, k)


def _atom_num(op, lo, hi, k):
    if op == "floordiv":
        return lo // k, hi // k
    if op == "exactdiv":  # values of e/k that are integers: [ceil(lo/k), floor(hi/k)]
        return -((-lo) // k), hi // k
    same = (lo // k) == (hi // k)
    if isinstance(same, (bool, np.bool_)):
        return (lo % k, hi % k) if same else (0, k - 1)
    return np.where(same, lo % k, 0), np.where(same, hi % k, k - 1)


# --------------------------------------------------------------------------------------------
# Binding a description at concrete shapes
# --------------------------------------------------------------------------------------------


def _walk_nodes(node, fn, scope=()):
    """Pre-order traversal calling ``fn(node, scope)``; scope = enclosing Reduce/Piecewise."""
    fn(node, scope)
    if isinstance(node, Reduce):
        _walk_nodes(node.body, fn, scope + (node,))
    elif isinstance(node, Piecewise):
        for p in node.pieces:
            _walk_nodes(p[3], fn, scope + (node,))
    else:
        for c in node.children():
            _walk_nodes(c, fn, scope)


class Bound:
    """A description bound at concrete input shapes: tree, variables, extents, output shape.

    ``regions(boxes)`` is the numeric analysis; ``symbolic(...)`` the symbolic one.
    """

    def __init__(self, op, shapes: dict, out_vars, body: Value, out_shape):
        self.op, self.shapes, self.out_vars, self.body = op, shapes, tuple(out_vars), body
        self.reduces: list = []
        self.accesses: list = []          # (Access, scope)
        self.pieces: list = []
        _walk_nodes(body, self._collect)
        self.red_vars = [v for r in self.reduces for v in r.vars]
        self._uniquify()
        self._check_accesses()
        self.extent: dict = {}
        self._infer_extents()
        self.out_shape = tuple(out_shape) if out_shape is not None else self._infer_out_shape()
        if len(self.out_shape) != len(self.out_vars):
            raise TDLError(f"operator {op.name}: output lambda has {len(self.out_vars)} "
                           f"coordinates but the output shape is {self.out_shape}")

    # construction --------------------------------------------------------------------------
    def _collect(self, node, scope):
        if isinstance(node, Reduce):
            self.reduces.append(node)
        elif isinstance(node, Access):
            self.accesses.append((node, scope))
        elif isinstance(node, Piecewise):
            self.pieces.append(node)

    def _uniquify(self):
        seen: set = set()
        for v in list(self.out_vars) + self.red_vars:
            base, n = v.name, 2
            while v.name in seen:
                v.name = f"{base}{n}"
                n += 1
            seen.add(v.name)

    def _check_accesses(self):
        for acc, _ in self.accesses:
            if acc.tensor not in self.shapes:
                raise TDLError(f"operator {self.op.name}: access to unknown tensor "
                               f"{acc.tensor!r}")
            nd = len(self.shapes[acc.tensor])
            if len(acc.idx) != nd:
                raise TDLError(f"operator {self.op.name}: {acc!r} uses {len(acc.idx)} indices "
                               f"on a rank-{nd} tensor {acc.tensor}{list(self.shapes[acc.tensor])}")

    def _infer_extents(self):
        cand: dict = {}
        self.inferred: set = set()
        for acc, _ in self.accesses:
            for ax, i in enumerate(acc.idx):
                if isinstance(i, Ix):
                    v = i.bare_var()
                    if v is not None and v.kind == "red":
                        cand.setdefault(v, set()).add((self.shapes[acc.tensor][ax], acc.tensor, ax))
        for r in self.reduces:
            for v, e in zip(r.vars, r.extents):
                if e is not None:
                    self.extent[v] = e
                    continue
                sizes = {s for s, _, _ in cand.get(v, ())}
                if not sizes:
                    raise TDLError(
                        f"operator {self.op.name}: cannot infer the extent of reduction "
                        f"variable {v.name} (it never indexes a tensor axis by itself); pass "
                        f"it, e.g. {r.kind.capitalize()}(..., {v.name}=3)")
                if len(sizes) > 1:
                    where = ", ".join(f"{t}.shape[{a}]={s}" for s, t, a in sorted(cand[v]))
                    raise TDLError(f"operator {self.op.name}: reduction variable {v.name} "
                                   f"indexes axes of different sizes ({where})")
                self.extent[v] = sizes.pop()
                self.inferred.add(v)

    def _infer_out_shape(self):
        out = []
        for v in self.out_vars:
            best = None
            for acc, _ in self.accesses:
                for ax, i in enumerate(acc.idx):
                    if not isinstance(i, Ix):
                        continue
                    coef = dict(i.terms)
                    a = coef.pop(v, 0)
                    if a <= 0 or not all(isinstance(x, Var) and x.kind == "red" and
                                         isinstance(self.extent.get(x), int) for x in coef):
                        continue
                    top = i.const + sum(max(0, c * (self.extent[x] - 1)) for x, c in coef.items())
                    size = (self.shapes[acc.tensor][ax] - 1 - top) // a + 1
                    best = size if best is None else min(best, size)
            if best is None:
                raise TDLError(f"operator {self.op.name}: cannot infer the size of output "
                               f"coordinate {v.name}; give the Op an out_shape")
            out.append(max(int(best), 0))
        return tuple(out)

    # properties ----------------------------------------------------------------------------
    @property
    def inputs(self):
        return self.op.inputs

    def var(self, name: str) -> Var:
        for v in list(self.out_vars) + self.red_vars:
            if v.name == name:
                return v
        raise KeyError(f"operator {self.op.name} has no index variable {name!r} "
                       f"(has {[v.name for v in list(self.out_vars) + self.red_vars]})")

    def reducible(self, runnable: bool = False) -> dict:
        """Reduction variables whose partitioning gives partition-n-**reduce** (Section 4.2,
        case 2): ``{Var: reducer}``.  The reduction must be reachable from the output through
        operations that distribute over it - nested reductions of the same kind, and for Sum
        ``+``/``-`` (other terms added by one worker, e.g. a bias), ``*`` and division by a
        factor; not through opaque functions (softmax's denominator, normalisation).

        ``runnable=True`` keeps only the reductions the operator itself computes partially
        when each worker runs it on its input regions, zero elsewhere (what Tofu runs and our
        runtime does): a Max, or a Sum every term of which is a multiple of a *killing*
        tensor - one read only with the variable itself on some axis, so its region there is
        exactly the worker's slice and the terms of other slices read its zeros (matmul's
        ``A[i, k]``, a convolution's ``weight[co, ci, dx]``).  A window sum such as average
        pooling's ``x[2y + dy]`` has none: every worker would add whole windows."""
        out: dict = {}
        killers = self._killers() if runnable else None

        def go(node, kind):
            if isinstance(node, Reduce):
                if kind is None or node.kind == kind:
                    for v in node.vars:
                        if not isinstance(self.extent.get(v), int):
                            continue
                        if killers is not None and not (
                                node.kind == "max" or node.kind == "sum" and
                                _killed(node.body, killers.get(v, ()))):
                            continue
                        out[v] = node.kind
                    go(node.body, node.kind)
            elif isinstance(node, Bin) and kind in (None, "sum"):
                if node.op in ("+", "-", "*"):
                    go(node.a, kind)
                    go(node.b, kind)
                elif node.op == "/":
                    go(node.a, kind)
            elif isinstance(node, Bin) and kind == "prod" and node.op == "*":
                go(node.a, kind)
                go(node.b, kind)
            elif isinstance(node, Call) and node.fn == "neg" and kind in (None, "sum"):
                go(node.args[0], kind)
        go(self.body, None)
        return out

    def _killers(self) -> dict:
        """``{reduction Var: {tensor}}``: tensors every access of which reads the variable
        itself on one common axis (their region on that axis is exactly its range)."""
        axes: dict = {}                   # (tensor, var) -> axes where every access has it bare
        for acc, _ in self.accesses:
            bare = {}
            for ax, i in enumerate(acc.idx):
                v = i.bare_var() if isinstance(i, Ix) else None
                if v is not None and v.kind == "red":
                    bare.setdefault(v, set()).add(ax)
            for v in set(self.red_vars) | set(bare):
                key = (acc.tensor, v)
                axes[key] = axes.get(key, bare.get(v, set())) & bare.get(v, set())
        out: dict = {}
        for (t, v), ax in axes.items():
            if ax:
                out.setdefault(v, set()).add(t)
        return out

    def is_elementwise(self) -> bool:
        """No reductions and every access reads exactly the output element (up to
        broadcasting): the test graph coarsening uses to merge element-wise chains (Sec 5.1)."""
        if self.reduces or self.pieces:
            return False
        ov = set(self.out_vars)
        nout = len(self.out_vars)
        for acc, _ in self.accesses:
            nd = len(acc.idx)
            for ax, i in enumerate(acc.idx):
                if not isinstance(i, Ix):
                    return False
                v = i.bare_var()
                j = nout - nd + ax
                if v is not None and v in ov and j >= 0 and self.out_vars[j] is v:
                    continue
                if i.is_const and i.const == 0 and self.shapes[acc.tensor][ax] == 1:
                    continue
                return False
        return True

    def axis_labels(self, tensor: str) -> list:
        """Per axis of ``tensor``: the index expressions it is read with (for reports)."""
        labels = [[] for _ in self.shapes[tensor]]
        for acc, _ in self.accesses:
            if acc.tensor == tensor:
                for ax, i in enumerate(acc.idx):
                    t = repr(i) if not isinstance(i, Value) else "data"
                    if t not in labels[ax]:
                        labels[ax].append(t)
        return [" | ".join(x) if x else "-" for x in labels]

    # numeric analysis ------------------------------------------------------------------------
    def regions(self, boxes, red: dict | None = None) -> dict:
        """Region of every input each output box needs: ``{input: [..., nd_in, 2]}``.

        ``boxes`` is ``[..., nd_out, 2]`` half-open; ``red`` maps reduction variables (Var or
        name) to inclusive ``(lo, hi)`` arrays (broadcast against the boxes' leading axes) to
        restrict them - a worker's share of a partitioned reduction.
        """
        boxes = np.asarray(boxes, dtype=np.int64)
        if boxes.shape[-2:] != (len(self.out_vars), 2):
            raise TDLError(f"operator {self.op.name}: boxes of shape {boxes.shape} for a "
                           f"rank-{len(self.out_vars)} output")
        lead = boxes.shape[:-2]
        env = {v: (boxes[..., a, 0], boxes[..., a, 1] - 1) for a, v in enumerate(self.out_vars)}
        over = {}
        for k, (lo, hi) in (red or {}).items():
            v = self.var(k) if isinstance(k, str) else k
            over[v] = (np.asarray(lo, dtype=np.int64), np.asarray(hi, dtype=np.int64))
        found: dict = {n: [] for n in self.inputs}
        self._walk(self.body, env, True, over, found)
        out = {}
        for name in self.inputs:
            shp = self.shapes[name]
            nd = len(shp)
            accs = found[name]
            if not accs or nd == 0:  # input never read (empty region), or a scalar
                out[name] = np.zeros(lead + (nd, 2), dtype=np.int64)
                continue
            size = np.asarray(shp, dtype=np.int64)
            # [access, *lead, axis] bounds, filled in place (broadcast on assignment: no
            # broadcast_to / stack per access - this runs for every operator of every plan)
            los = np.empty((len(accs),) + lead + (nd,), dtype=np.int64)
            his = np.empty_like(los)
            valid = np.empty((len(accs),) + lead + (1,), dtype=bool)
            for i, (r, ok) in enumerate(accs):
                for ax, (lo, hi) in enumerate(r):
                    los[i, ..., ax] = lo
                    his[i, ..., ax] = hi
                valid[i, ..., 0] = ok
            start = np.clip(los, 0, size)
            stop = np.maximum(np.clip(his + 1, 0, size), start)
            reg = np.empty(lead + (nd, 2), dtype=np.int64)
            if len(accs) == 1:           # one access: its clipped box (even where invalid)
                reg[..., 0] = start[0]
                reg[..., 1] = stop[0]
                out[name] = reg
                continue
            big = np.iinfo(np.int64).max
            s_u = np.where(valid, start, big).min(0)
            e_u = np.where(valid, stop, -1).max(0)
            anyv = valid.any(0)
            reg[..., 0] = np.where(anyv, s_u, start[0])
            reg[..., 1] = np.where(anyv, e_u, stop[0])
            out[name] = reg
        return out

    def _walk(self, node, env, valid, over, found):
        if isinstance(node, Access):
            shp = self.shapes[node.tensor]
            reg = []
            for ax, i in enumerate(node.idx):
                if isinstance(i, Ix):
                    reg.append(_iv(i, env))
                else:
                    if isinstance(i, Value):
                        self._walk(i, env, valid, over, found)
                    reg.append((0, shp[ax] - 1))
            found[node.tensor].append((reg, valid))
        elif isinstance(node, Reduce):
            env2 = dict(env)
            for v in node.vars:
                env2[v] = over[v] if v in over else self._extent_iv(v, env)
            self._walk(node.body, env2, valid, over, found)
        elif isinstance(node, Piecewise):
            lo, hi = _iv(node.at, env)
            for start, size, v, body in node.pieces:
                l2 = np.clip(lo - start, 0, size)
                h2 = np.clip(hi - start, -1, size - 1)
                env2 = dict(env)
                env2[v] = (l2, h2)
                self._walk(body, env2, valid & (h2 >= l2), over, found)
        else:
            for c in node.children():
                self._walk(c, env, valid, over, found)

    def _extent_iv(self, v, env):
        e = self.extent[v]
        if isinstance(e, int):
            return 0, e - 1
        return _iv(e[0], env)[0], _iv(e[1], env)[1]

    # symbolic analysis -------------------------------------------------------------------------
    def symbolic(self, split: tuple | None = None) -> dict:
        """Symbolic regions (paper eq. 1 / Fig. 4): ``{input: [(lo, hi) per axis]}`` of
        :class:`Sym` (inclusive, unclipped).

        ``split = (var name, i, k)`` gives variable ``var`` (an output coordinate or a reduction
        variable) worker i's share ``[i/k·V, (i+1)/k·V - 1]`` of its range ``V``.  Output
        coordinate ``x`` has size symbol ``X``; a reduction variable whose extent comes from a
        tensor axis has symbol ``DX`` etc. (upper-cased name).  An axis read through several
        accesses whose bounds differ by non-constants lists the alternatives.
        """
        env = {}
        for v in self.out_vars:
            env[v] = (Sym(None, 0), Sym.sym(v.name.upper()) - 1)
        over = {}
        if split is not None:
            name, i, k = split
            v = self.var(name)
            if v.kind == "out":
                size = Sym.sym(v.name.upper())
            else:
                e = self.extent[v]
                if v in self.inferred:
                    size = Sym.sym(v.name.upper())
                elif isinstance(e, int):
                    size = Sym(None, e)
                else:
                    raise TDLError(f"cannot split reduction variable {name} with a window "
                                   f"extent depending on output coordinates")
            part = (size * Fraction(i, k), size * Fraction(i + 1, k) - 1)
            if v.kind == "out":
                env[v] = part
            else:
                over[v] = part
        found: dict = {n: [] for n in self.inputs}
        self._walk_sym(self.body, env, over, found)
        out = {}
        for name in self.inputs:
            axes = []
            for ax in range(len(self.shapes[name])):
                los, his = [], []
                for reg in found[name]:
                    lo, hi = reg[ax]
                    _merge(los, lo, _sym_min)
                    _merge(his, hi, _sym_max)
                axes.append((los[0] if len(los) == 1 else tuple(los),
                             his[0] if len(his) == 1 else tuple(his)))
            out[name] = axes
        return out

    def _walk_sym(self, node, env, over, found):
        if isinstance(node, Access):
            shp = self.shapes[node.tensor]
            reg = []
            for ax, i in enumerate(node.idx):
                if isinstance(i, Ix):
                    lo, hi = _iv(i, env)
                    reg.append((Sym._c(lo), Sym._c(hi)))
                else:
                    if isinstance(i, Value):
                        self._walk_sym(i, env, over, found)
                    reg.append((Sym(None, 0), Sym(None, shp[ax] - 1)))
            found[node.tensor].append(reg)
        elif isinstance(node, Reduce):
            env2 = dict(env)
            for v, e in zip(node.vars, node.extents):
                if v in over:
                    env2[v] = over[v]
                elif e is None:
                    env2[v] = (Sym(None, 0), Sym.sym(v.name.upper()) - 1)
                elif isinstance(e, int):
                    env2[v] = (Sym(None, 0), Sym(None, e - 1))
                else:
                    env2[v] = (Sym._c(_iv(e[0], env)[0]), Sym._c(_iv(e[1], env)[1]))
            self._walk_sym(node.body, env2, over, found)
        elif isinstance(node, Piecewise):
            lo, hi = _iv(node.at, env)
            for start, size, v, body in node.pieces:
                env2 = dict(env)
                env2[v] = (Sym._c(lo) - start, Sym._c(hi) - start)
                self._walk_sym(body, env2, over, found)
        else:
            for c in node.children():
                self._walk_sym(c, env, over, found)


def _killed(node, killers) -> bool:
    """Whether ``node`` is zero wherever one of the ``killers`` tensors reads a zero: it is
    such a read times anything (numerator of a quotient, every term of a sum, every piece)."""
    if isinstance(node, Access):
        return node.tensor in killers
    if isinstance(node, Bin):
        if node.op == "*":
            return _killed(node.a, killers) or _killed(node.b, killers)
        if node.op == "/":
            return _killed(node.a, killers)
        if node.op in ("+", "-"):
            return _killed(node.a, killers) and _killed(node.b, killers)
        return False
    if isinstance(node, Call) and node.fn == "neg":
        return _killed(node.args[0], killers)
    if isinstance(node, Reduce) and node.kind == "sum":
        return _killed(node.body, killers)
    if isinstance(node, Piecewise):
        return all(_killed(p[3], killers) for p in node.pieces)
    return False


def _merge(lst, x, pick):
    """Keep ``lst`` the set of incomparable bounds; ``pick(a, b)`` returns the extreme or
    None when a and b differ by a non-constant."""
    for j, y in enumerate(lst):
        m = pick(x, y)
        if m is not None:
            lst[j] = m
            return
    lst.append(x)


def bind(op, shapes) -> Bound:
    """Evaluate ``op``'s lambdas on symbolic index variables at concrete input ``shapes``."""
    shapes = op.norm_shapes(shapes)
    refs = [TensorRef(n, shapes[n]) for n in op.inputs]
    outer = op.fn(*refs)
    if not callable(outer):
        raise TDLError(f"operator {op.name}: the description must return the output lambda")
    out_shape = None
    if op._out_shape is not None:
        out_shape = tuple(int(s) for s in op._out_shape(*(shapes[n] for n in op.inputs)))
    names = param_names(outer)
    if names is None:
        if op.out_names is not None:
            names = list(op.out_names)
        elif out_shape is not None:
            names = [f"i{a}" for a in range(len(out_shape))]
        else:
            raise TDLError(f"operator {op.name}: an output lambda taking *idx needs out_shape "
                           f"or out_names")
    vs = [Var(n, "out") for n in names]
    body = const_value(outer(*(Ix.var(v) for v in vs)))
    return Bound(op, shapes, vs, body, out_shape)

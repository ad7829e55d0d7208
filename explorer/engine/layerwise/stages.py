"""Memory-constrained layer-wise search and its pipeline stages (issue 28).

**The problem.**  Choose for every layer a candidate configuration ``c`` and a memory option
``o = (recompute, ZeRO stage)`` (:mod:`.memory`) minimising the step time, such that every
device's memory fits.  Without a pipeline the step time is equation 1 with the options' times.

**Per-device peak is a max, not a sum.**  A device's memory is the sum over the layers it
runs; the constraint is on the largest device.  The search constrains the additive bound
``U = Σ_layers max_{d ∈ devices(c_l)} mem_l(c_l, o_l, d)`` instead (sound: ``U`` ≥ every
device's sum).  Configurations run on the first devices of their group (candidates of k
devices use devices 0..k−1, :mod:`.costmodel`), so device 0 holds a share of every layer and
``U`` equals its memory when splits are even; the exact per-device memory of the plan found
is computed afterwards (:func:`~.memory.plan_memory`) and reported.

**Lagrangian relaxation** (exact only where the duality gap closes).  For a multiplier
``λ ≥ 0`` (seconds per byte), each layer's unary cost becomes ``min_o t(c, o) + λ·U_l(c, o)``
— the option is a node-local choice, so it folds into the unary and the edge tables are
untouched — and the existing elimination (equations 2/3) finds the exact minimiser of
``time + λ·U``.  ``λ = 0`` is the paper's search; if its plan fits it is returned.  Otherwise
a very large ``λ`` gives the least-memory plan of the relaxation.  When it fits, the first
``λ`` tried is the price that plan pays per byte saved and ×4 steps bracket the smallest
fitting ``λ``; when it does not (transients are outside the relaxation), ``λ`` rises ×4 from
a small price until a plan fits or the plan is the least-memory one.  A geometric bisection
then narrows the bracket to a factor 1.25 (``BISECT_RATIO``); the fastest fitting plan seen
is returned, after a greedy pass (:func:`improve`).
Every ``λ`` gives a lower bound of the constrained optimum, ``L(λ) − λ·cap`` (weak duality);
the best is reported as ``info.memory.lower_bound_s`` with the gap to the plan.  Gap 0
certifies the plan optimal for the constrained problem; otherwise it is a heuristic within
that gap.  Transients (a recomputed layer's output, ZeRO-3's gathered weights, alive while one
layer's backward runs) are a max over layers: they are added to the check of each plan
found, not to the relaxed objective.

**Repeated blocks.**  The graph is cut at *single-tensor cuts* (layers whose output is the
only tensor crossing the gap after them, in graph order: a Transformer's residual stream
between blocks) into segments.  Each segment with a series-parallel inside is reduced by node
and edge eliminations (equations 2, 3) to one table ``[c_a, c_b]`` over its two cut layers,
keeping every interior layer's argmin for every pair; a segment whose inside is series-parallel
once one layer is fixed (a mixture-of-experts block) is reduced exactly once per candidate of
that layer (:func:`_conditioned`); identical segments (repeated blocks:
same layers, options and tables, compared by content) are reduced once.  The chain is then
solved by min-plus vector–matrix products — the same optimum as :func:`.optcnn.solve` (the
tests check it).  Graphs that do not decompose so fall back to :func:`.optcnn.solve` on the
relaxed tables (exact, slower at hundreds of layers).

**Pipeline stages** (GPipe, Huang et al. 2019; 1F1B, Narayanan et al. 2019; the two-level
search of Alpa, Zheng et al. 2022).  ``S`` stages on groups of ``G = N / S`` consecutive
devices, ``M`` micro-batches of ``B / M`` samples.  Stage boundaries are the cut layers.  A
stage's cost for a contiguous range of segments is the elimination search above on that
range, on a group of ``G`` devices at the micro-batch's size (its first layers read the
incoming tensor in any layout: the re-layout is part of the stage-boundary transfer).  The
outer dynamic program over cut positions chooses the split minimising the slowest stage
(Alpa's outer DP with equal device groups), subject to each stage's memory.  With per
micro-batch stage times ``t_s`` (forward, backward, transfers) and once-per-step times
``u_s`` (synchronisation, update):

    T = Σ_s t_s + (M − 1) · max_s t_s + max_s u_s

which is ``(M + S − 1) · t`` for balanced stages: the bubble is ``(S − 1) / (M + S − 1)`` of
the step.  Inside a stage the per-micro-batch terms weigh ``M + S − 1`` and the once-per-step
terms 1.  A stage boundary sends the cut tensor of one micro-batch forward and its gradient
back, each device of the group sending ``1/G`` of it to its peer in the next group:
``2 · (bytes / G / b + α)``, part of the sending stage's ``t_s``.  Memory per stage: static
bytes plus the activations of the micro-batches in flight, ``M`` under GPipe and
``min(S − s, M)`` under 1F1B (stage ``s`` from 0); inside the search every stage is held to
stage 0's count, ``min(S, M)`` (exact for stage 0, conservative for the others), and the
plan's memory is reported with each stage's own count.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np

from explorer.errors import InfeasiblePlan
from explorer.engine.layerwise import optcnn
from explorer.engine.layerwise.costmodel import CostTables
from explorer.engine.layerwise.memory import MemorySettings, options_of

__all__ = ["Chain", "Evaluation", "evaluate", "lagrangian", "repeated_chain", "stage_counts"]

#: bisection steps on λ once a fitting plan is bracketed
BISECT_STEPS = 8
#: the bisection stops when the bracket [lo, hi] of λ is this narrow (hi / lo)
BISECT_RATIO = 1.25
#: ×4 steps of λ tried to bracket the smallest fitting λ
MAX_DOUBLINGS = 20
#: the price (in units of the plain plan's seconds per byte) at which only memory counts
LAMBDA_TOP = 1e7


# --------------------------------------------------------------------------------------------
# the chain of segments between single-tensor cuts
# --------------------------------------------------------------------------------------------

@dataclass
class Segment:
    """Layers strictly between cut layers ``a`` and ``b`` and the edges among ``a``, them
    and ``b`` (indices into ``tables.edges``)."""

    a: str
    b: str
    interior: list
    edges: list


@dataclass
class Chain:
    """The cut layers ``cuts`` (the first layer, every single-tensor cut, the last layer) and
    the ``segments`` between consecutive cuts."""

    cuts: list
    segments: list

    @classmethod
    def of(cls, tables) -> "Chain":
        """The chain of a :class:`CostTables` (or of a layer graph: its names and edges),
        kept on the object (a search asks for it a few times per stage group and
        micro-batch size; layers and edges are not changed once a search reads them)."""
        memo = getattr(tables, "_chain_memo", None)
        size = (len(tables.names) if isinstance(tables, CostTables) else
                len(tables.names()), len(tables.edges) if isinstance(tables, CostTables)
                else len(tables.edges()))
        if memo is not None and memo[0] == size:
            return memo[1]
        out = cls._of(tables)
        try:
            tables._chain_memo = (size, out)
        except AttributeError:                 # an object that takes no attribute
            pass
        return out

    @classmethod
    def _of(cls, tables) -> "Chain":
        if not isinstance(tables, CostTables):
            graph = tables
            tables = CostTables(list(graph.names()), {}, {}, {}, {},
                                [(e, None) for e in graph.edges()])
        names = list(tables.names)
        pos = {n: i for i, n in enumerate(names)}
        L = len(names)
        viol = np.zeros(L + 1, dtype=np.int64)
        for e, _ in tables.edges:
            i, j = pos[e.src], pos[e.dst]
            if j <= i:
                raise InfeasiblePlan(f"edge {e.src} -> {e.dst} goes against graph order")
            viol[i + 1] += 1             # crosses gaps i+1 .. j-1 without starting there
            viol[j] -= 1
        viol = np.cumsum(viol)[:L]
        cut_pos = [0] + [g for g in range(1, L - 1) if viol[g] == 0] + [L - 1]
        cut_pos = sorted(set(cut_pos))
        cuts = [names[p] for p in cut_pos]
        segs = []
        by_seg: dict = {}
        for k in range(1, len(cut_pos)):
            by_seg[k] = []
        seg_of = np.zeros(L, dtype=np.int64)
        for k in range(1, len(cut_pos)):
            seg_of[cut_pos[k - 1] + 1: cut_pos[k] + 1] = k
        for idx, (e, _) in enumerate(tables.edges):
            by_seg[int(seg_of[pos[e.dst]])].append(idx)
        for k in range(1, len(cut_pos)):
            segs.append(Segment(cuts[k - 1], cuts[k],
                                names[cut_pos[k - 1] + 1: cut_pos[k]], by_seg[k]))
        return cls(cuts, segs)


def _edge_keys(tables: CostTables) -> list:
    """A content key per edge table (repeated blocks' tables compare equal)."""
    keys, seen = [], {}
    for _, m in tables.edges:
        k = seen.get(id(m))
        if k is None:
            a = np.ascontiguousarray(m)
            k = seen[id(m)] = (a.shape, hash(a.tobytes()))
        keys.append(k)
    return keys


@dataclass
class _Reduced:
    """A segment reduced to ``[c_a, c_b]``: the relaxed cost and, at its argmin, the sums
    of per-micro-batch time ``A``, once-per-step time ``B``, static bytes ``Ms``, activation
    bytes ``Ma`` of the interior and its edges; ``choice[k]`` ``[Ca, Cb]`` the candidate of
    the segment's ``k``-th interior layer (by position: identical segments share one
    reduction)."""

    L: np.ndarray
    A: np.ndarray
    B: np.ndarray
    Ms: np.ndarray
    Ma: np.ndarray
    choice: dict


def _reduce(seg: Segment, tables: CostTables, unary: dict, weight: float, parts: dict):
    """A segment reduced to ``[c_a, c_b]`` (:class:`_Reduced`), or ``None`` when its inside
    is not series-parallel even with one layer fixed (:func:`_conditioned`)."""
    edges: dict = {}
    for idx in seg.edges:
        e, m = tables.edges[idx]
        edges[idx] = (e.src, e.dst, weight * np.asarray(m, dtype=np.float64))
    a, b = seg.a, seg.b
    st = _SP(a, b, seg.interior, edges, dict(unary))
    if st.alive:
        got = _conditioned(st)
        if got is None:
            return None
        L, choice = got
    else:
        L = st.closed()
        if L is None:
            return None
        Ca, Cb = L.shape
        choice = {a: np.broadcast_to(np.arange(Ca)[:, None], (Ca, Cb)),
                  b: np.broadcast_to(np.arange(Cb)[None, :], (Ca, Cb))}
    st.replay(choice)
    Ca, Cb = L.shape
    A = np.zeros((Ca, Cb))
    B, Ms, Ma = A.copy(), A.copy(), A.copy()
    for n in seg.interior:
        tm, to, st, ac = parts[n]
        ch = choice[n]
        A += tm[ch]
        B += to[ch]
        Ms += st[ch]
        Ma += ac[ch]
    for idx in seg.edges:
        e, m = tables.edges[idx]
        A += np.asarray(m)[choice[e.src], choice[e.dst]]
    return _Reduced(L, A, B, Ms, Ma, [choice[n] for n in seg.interior])


class _SP:
    """Series-parallel reduction of the layers ``interior`` between ``a`` and ``b``
    (equations 2, 3, and leaves), run as far as it goes: ``alive`` the layers left (none
    when the inside is series-parallel), ``edges``/``unary``/``extra`` what remains (the
    terminals' vectors in ``extra``), ``undo`` the eliminations to replay.  ``edges`` maps a
    key to ``(src, dst, table)`` (weighted; the caller's dict is left unchanged)."""

    def __init__(self, a, b, interior, edges: dict, unary: dict, extra0: dict | None = None):
        self.a, self.b = a, b
        self.unary = unary
        edges = self.edges = dict(edges)
        extra = self.extra = {a: np.zeros(len(unary[a])) if extra0 is None else extra0[a].copy(),
                              b: np.zeros(len(unary[b])) if extra0 is None else extra0[b].copy()}
        alive = set(interior)
        order = {n: i for i, n in enumerate(interior)}
        undo = self.undo = []
        nxt = max(edges, default=0) + 1
        ins: dict = {}
        outs: dict = {}
        for k, (u, v, _) in edges.items():
            outs.setdefault(u, set()).add(k)
            ins.setdefault(v, set()).add(k)

        def drop(k):
            u, v, m = edges.pop(k)
            outs[u].discard(k)
            ins[v].discard(k)
            return u, v, m

        def add(u, v, m):
            nonlocal nxt
            edges[nxt] = (u, v, m)
            outs.setdefault(u, set()).add(nxt)
            ins.setdefault(v, set()).add(nxt)
            nxt += 1

        def merge(u):
            """Equation 3 on ``u``'s out-edges: parallel edges sum."""
            seen: dict = {}
            for k in sorted(outs.get(u, ())):
                v = edges[k][1]
                if v in seen:
                    _, _, m1 = drop(seen[v])
                    _, _, m2 = drop(k)
                    add(u, v, m1 + m2)
                    seen[v] = nxt - 1
                else:
                    seen[v] = k

        for n in [a] + interior:
            merge(n)
        queue = sorted(alive, key=order.get)
        while queue:
            progressed = False
            for j in sorted(alive, key=order.get):
                i_s, o_s = ins.get(j, set()), outs.get(j, set())
                uj = unary[j]
                if len(i_s) == 1 and len(o_s) == 1:
                    (k1,), (k2,) = tuple(i_s), tuple(o_s)
                    i, _, ma = drop(k1)
                    _, k, mb = drop(k2)
                    m, arg = optcnn.min_plus(ma + uj[None, :], mb)          # equation 2
                    add(i, k, m)
                    merge(i)
                    undo.append(("node", j, i, k, arg))
                elif len(i_s) == 1 and not o_s:             # a leaf: its best per source
                    i, _, ma = drop(next(iter(i_s)))
                    t = ma + uj[None, :]
                    arg = t.argmin(axis=1)
                    _add_unary(extra, unary, i, t[np.arange(len(arg)), arg])
                    undo.append(("out", j, i, arg))
                elif len(o_s) == 1 and not i_s:
                    _, k, mb = drop(next(iter(o_s)))
                    t = mb + uj[:, None]
                    arg = t.argmin(axis=0)
                    _add_unary(extra, unary, k, t[arg, np.arange(len(arg))])
                    undo.append(("in", j, k, arg))
                elif not i_s and not o_s:
                    undo.append(("free", j, int(uj.argmin())))
                    extra[a] = extra[a] + float(uj.min())
                else:
                    continue
                alive.discard(j)
                progressed = True
            if not progressed:
                break
            queue = list(alive)
        self.alive = sorted(alive, key=order.get)

    def closed(self):
        """``L [Ca, Cb]`` when only edges between the terminals are left, else ``None``."""
        a, b = self.a, self.b
        L = self.extra[a][:, None] + self.extra[b][None, :]
        for u, v, m in self.edges.values():
            if (u, v) != (a, b):
                return None
            L = L + m
        return L

    def replay(self, choice: dict) -> None:
        """Undo the eliminations: every eliminated layer's ``[Ca, Cb]`` choice from those of
        the layers it was eliminated onto (``choice`` holds the terminals and the layers
        left alive)."""
        shape = choice[self.a].shape
        for rec in reversed(self.undo):
            kind, j = rec[0], rec[1]
            if kind == "node":
                _, _, i, k, arg = rec
                choice[j] = arg[choice[i], choice[k]]
            elif kind in ("out", "in"):
                choice[j] = rec[3][choice[rec[2]]]
            else:
                choice[j] = np.full(shape, rec[2])


def _conditioned(st: _SP):
    """The layers a series-parallel reduction left (``st.alive``: a mixture-of-experts
    layer's routing mask is read by its dispatch and by its combine), reduced exactly by
    fixing one of them: for each of its candidates ``c`` its edges become unary costs of its
    neighbours, the rest is reduced again, and each pair ``(c_a, c_b)`` keeps the ``c`` of
    least cost.  The layer fixed is the one with the fewest candidates whose removal leaves
    the rest series-parallel; ``(L, choice)`` of the terminals and the layers left, or
    ``None`` when no single layer does."""
    a, b = st.a, st.b
    one = {n: np.zeros(1) for n in [a, b] + st.alive}
    flat = {k: (u, v, np.zeros((1, 1))) for k, (u, v, _) in st.edges.items()}
    x = None
    for y in sorted(st.alive, key=lambda n: len(st.unary[n])):
        rest = [n for n in st.alive if n != y]
        sub_e, sub_u, extra, _ = _fix(y, 0, a, b, flat, one)
        sub = _SP(a, b, rest, sub_e, sub_u, extra)
        if not sub.alive and sub.closed() is not None:
            x = y
            break
    if x is None:
        return None
    rest = [n for n in st.alive if n != x]
    Ca, Cb = len(st.unary[a]), len(st.unary[b])
    base = {a: np.broadcast_to(np.arange(Ca)[:, None], (Ca, Cb)),
            b: np.broadcast_to(np.arange(Cb)[None, :], (Ca, Cb))}
    extra0 = st.extra
    bestL = pick = choice = None
    for c in range(len(st.unary[x])):
        sub_e, sub_u, extra, const = _fix(x, c, a, b, st.edges, st.unary)
        extra = {t: extra[t] + extra0[t] for t in (a, b)}
        sub = _SP(a, b, rest, sub_e, sub_u, extra)
        L = sub.closed() + const
        ch = dict(base)
        sub.replay(ch)
        if bestL is None:
            bestL, pick = L, np.zeros(L.shape, dtype=np.int64)
            choice = {n: np.array(ch[n], copy=True) for n in rest}
            continue
        better = L < bestL
        if better.any():
            bestL = np.where(better, L, bestL)
            pick[better] = c
            for n in rest:
                choice[n][better] = np.asarray(ch[n])[better]
    choice.update(base)
    choice[x] = pick
    return bestL, choice


def _fix(x, c, a, b, edges: dict, unary: dict):
    """Layer ``x`` fixed to candidate ``c``: the other edges, the unary costs with ``x``'s
    edges added to its neighbours (to the terminals' vectors for ``a``, ``b``), and
    ``x``'s own cost."""
    sub_u = dict(unary)
    extra = {a: np.zeros(len(unary[a])), b: np.zeros(len(unary[b]))}
    sub_e = {}
    for k, (u, v, m) in edges.items():
        if u == x:
            n, vec = v, m[c, :]
        elif v == x:
            n, vec = u, m[:, c]
        else:
            sub_e[k] = (u, v, m)
            continue
        if n in extra:
            extra[n] = extra[n] + vec
        else:
            sub_u[n] = sub_u[n] + vec
    return sub_e, sub_u, extra, float(unary[x][c])


def _add_unary(extra, unary, n, vec):
    """Add a leaf's best cost to layer ``n``: a terminal's extra vector, or an interior
    layer's unary (a copy: the caller's unary is shared)."""
    if n in extra:
        extra[n] = extra[n] + vec
    else:
        unary[n] = unary[n] + vec


def repeated_chain(tables: CostTables, chain: Chain | None = None) -> bool:
    """Whether ``tables``' graph is a chain of series-parallel segments most of which repeat
    (a Transformer's blocks): the case where the chain search (:class:`Evaluator`) beats
    Algorithm 1 by reducing each distinct segment once.  Checked on the structure alone
    (each segment reduced with one zero-cost candidate per layer); segments compared by
    their wiring, candidate counts and edge tables' content (repeated blocks' tables are
    equal)."""
    chain = chain or Chain.of(tables)
    ekeys = _edge_keys(tables)
    if len(chain.segments) < 4:
        return False
    one = np.zeros(1)
    fake = CostTables(tables.names, {}, {}, {}, {}, [(e, np.zeros((1, 1)))
                                                     for e, _ in tables.edges])
    unary = {n: one for n in tables.names}
    parts = {n: (one, one, one, one) for n in tables.names}
    shapes = set()
    for seg in chain.segments:
        names = [seg.a] + seg.interior + [seg.b]
        pos = {n: k for k, n in enumerate(names)}
        shape = (tuple((pos[tables.edges[i][0].src], pos[tables.edges[i][0].dst],
                        tables.edges[i][0].index, ekeys[i]) for i in seg.edges),
                 tuple(len(tables.candidates[n]) for n in names))
        if shape in shapes:
            continue
        shapes.add(shape)
        if _reduce(seg, fake, dict(unary), 1.0, parts) is None:
            return False
    return len(shapes) * 2 <= len(chain.segments)


# --------------------------------------------------------------------------------------------
# one evaluation: a plan for a multiplier λ
# --------------------------------------------------------------------------------------------

@dataclass
class Evaluation:
    """A plan found for one λ: per layer ``choice`` (candidate) and ``option``; ``stages``
    the layer names of each stage; per stage per-micro-batch time ``t_mb``, once
    per step ``t_once``, surrogate memory ``memory`` (with its own in-flight count), and
    ``transient``; ``time_s`` the step time; ``relaxed`` the relaxed objective (no pipeline:
    its minimum, for the lower bound); ``floor_s`` (at ``λ = 0`` only) a lower bound of the
    step time of every plan of these stage and micro-batch counts, memory aside
    (:meth:`Evaluator.floor`)."""

    lam: float
    choice: dict
    option: dict
    stages: list
    t_mb: list
    t_once: list
    memory: list
    transient: list
    time_s: float
    relaxed: float
    fits: bool = False
    boundary_s: list = field(default_factory=list)
    floor_s: float | None = None

    @property
    def peak(self) -> float:
        return max(m + t for m, t in zip(self.memory, self.transient))


class Evaluator:
    """Plans of one cost model (a stage's device group at one micro-batch size) for any λ:
    ``S`` stages, ``M`` micro-batches, a schedule, a memory cap per device."""

    def __init__(self, cost_model, tables: CostTables, settings: MemorySettings, cap: float,
                 stages: int = 1, micro_batches: int = 1, schedule: str = "1f1b",
                 boundary_bw: float | None = None, boundary_lat: float = 0.0,
                 masks: dict | None = None, option_mask=None, opts_cache: dict | None = None):
        self.cm, self.tables, self.settings, self.cap = cost_model, tables, settings, cap
        self.S, self.M, self.schedule = int(stages), int(micro_batches), schedule
        self.opts = options_of(cost_model, tables, settings, opts_cache)
        self.chain = Chain.of(tables)
        self.edge_keys = _edge_keys(tables)
        self.masks = masks or {}          # layer -> allowed candidate indices (baselines)
        self.option_mask = option_mask    # [O] allowed options (baselines)
        self.seg_keys = [self._segment_key(seg) for seg in self.chain.segments]
        self.weight = float(self.M + self.S - 1)
        self.kbar = float(self.M if schedule == "gpipe" else min(self.S, self.M))
        G_ = cost_model.devices.n
        self.boundary = []
        for x in self.chain.cuts:
            lay = cost_model.graph.layer(x)
            nbytes = float(math.prod(lay.out_shape)) * cost_model.dtype_bytes
            self.boundary.append(0.0 if boundary_bw is None else
                                 2.0 * (nbytes / G_ / boundary_bw + boundary_lat))
        if self.S > len(self.chain.segments):
            raise InfeasiblePlan(f"{self.S} pipeline stages need {self.S} segments between "
                                 f"single-tensor cuts; the graph has "
                                 f"{len(self.chain.segments)}")

    def _segment_key(self, seg) -> tuple:
        """What a segment's reduction depends on: its layers' options (shared by content,
        :func:`~.memory.options_of`), its edges' tables by content and wiring (positions in
        the segment), and the candidate and option masks of its layers (baselines), by
        content.  Identical blocks get equal keys."""
        names = [seg.a] + seg.interior + [seg.b]
        pos = {n: k for k, n in enumerate(names)}
        wiring = []
        for i in seg.edges:
            e, _ = self.tables.edges[i]
            wiring.append((pos[e.src], pos[e.dst], e.index, self.edge_keys[i]))
        key = (tuple(id(self.opts[n]) for n in names), tuple(wiring))
        if any(n in self.masks for n in names):
            key = key + (tuple(repr(self.masks.get(n)) for n in names),)
        om = self.option_mask
        if isinstance(om, dict) and any(n in om for n in names):
            key = key + (tuple(None if om.get(n) is None else np.asarray(om[n]).tobytes()
                               for n in names),)
        return key

    def inflight(self, s: int) -> float:
        return float(self.M if self.schedule == "gpipe" else min(self.S - s, self.M))

    def _parts(self, lam: float):
        """Per layer at multiplier ``lam``: the relaxed unary cost ``[C]``, the option each
        candidate takes, and its parts (per-micro-batch time, once-per-step time, static and
        activation bytes).  Layers sharing options, option mask and candidate mask share one
        computation (repeated blocks)."""
        unary, parts, option = {}, {}, {}
        memo: dict = {}
        for n in self.tables.names:
            lo = self.opts[n]
            om = self.option_mask
            if isinstance(om, dict):
                om = om.get(n)
            mk = self.masks.get(n)
            key = (id(lo), None if om is None else np.asarray(om).tobytes(),
                   None if mk is None else tuple(np.atleast_1d(mk).tolist()))
            hit = memo.get(key)
            if hit is None:
                cost, o = lo.pick(lam, self.weight, self.kbar, om)
                if mk is not None:
                    keep = np.full(len(cost), np.inf)
                    keep[mk] = 0.0
                    cost = cost + keep
                ix = np.arange(len(o))
                hit = memo[key] = (cost, o, (lo.t_mb[ix, o], lo.t_once[ix, o],
                                             lo.static[ix, o], lo.act[ix, o]))
            unary[n], option[n], parts[n] = hit
        return unary, parts, option

    def evaluate(self, lam: float) -> Evaluation:
        unary, parts, option = self._parts(lam)
        chain = self.chain
        reduced, cache = [], {}
        keys = self.seg_keys
        if isinstance(self.option_mask, dict):        # per-layer option masks set since
            keys = [self._segment_key(seg) for seg in chain.segments]
        for seg, key in zip(chain.segments, keys):
            r = cache.get(key)
            if r is None:
                r = _reduce(seg, self.tables, dict(unary), self.weight, parts)
                if r is None:
                    if self.S > 1:
                        raise InfeasiblePlan(
                            f"the pipeline search needs a chain of series-parallel blocks; "
                            f"the layers between {seg.a} and {seg.b} are not")
                    return self._whole(lam, unary, parts, option)
                cache[key] = r
            reduced.append(r)
        return self._chain(lam, unary, parts, option, reduced)

    # -- the chain ---------------------------------------------------------------------------
    def _start(self, i: int, unary, parts, reduced):
        """The vector at cut ``i+1`` of a stage starting after cut ``i`` (``i = -1``: the
        first stage, which holds cut 0) with its tracked sums and argmins."""
        x0, x1 = self.chain.cuts[max(i, 0)], self.chain.cuts[i + 1 if i >= 0 else 1]
        r = reduced[max(i, 0)]
        if i < 0:
            tm, to, st, ac = parts[x0]
            lag = unary[x0][:, None] + r.L
            arg = lag.argmin(axis=0)
            cols = np.arange(lag.shape[1])
            q = [tm[arg] + r.A[arg, cols], to[arg] + r.B[arg, cols],
                 st[arg] + r.Ms[arg, cols], ac[arg] + r.Ma[arg, cols]]
            v = lag[arg, cols]
        else:
            arg = r.L.argmin(axis=0)
            cols = np.arange(r.L.shape[1])
            v = r.L[arg, cols]
            q = [r.A[arg, cols], r.B[arg, cols], r.Ms[arg, cols], r.Ma[arg, cols]]
        tm, to, st, ac = parts[x1]
        v = v + unary[x1]
        q = [q[0] + tm, q[1] + to, q[2] + st, q[3] + ac]
        return v, q, arg

    def _step(self, k, v, q, unary, parts, reduced):
        """Extend a stage over segment ``k`` (from cut ``k`` to cut ``k+1``)."""
        r = reduced[k]
        lag = v[:, None] + r.L
        arg = lag.argmin(axis=0)
        cols = np.arange(lag.shape[1])
        x = self.chain.cuts[k + 1]
        tm, to, st, ac = parts[x]
        v2 = lag[arg, cols] + unary[x]
        q2 = [q[0][arg] + r.A[arg, cols] + tm, q[1][arg] + r.B[arg, cols] + to,
              q[2][arg] + r.Ms[arg, cols] + st, q[3][arg] + r.Ma[arg, cols] + ac]
        return v2, q2, arg

    def _chain(self, lam, unary, parts, option, reduced) -> Evaluation:
        K = len(self.chain.segments)          # cuts 0..K
        S = self.S
        best_v, best_q = self._ranges(K, S > 1, unary, parts, reduced)
        # the outer DP over cut positions: S stages, each a range (i, j] of cuts, minimising
        # the slowest stage's weighted time, each stage's memory within the cap
        W = self.weight
        INF = math.inf

        def stage_cost(i, j, s):
            A, B, Ms, Ma = (float(x) for x in best_q[:, i + 1, j])
            A = A + (self.boundary[j] if j < K else 0.0)
            mem = Ms + self.inflight(s) * Ma
            return W * A + B, A, B, mem

        if S == 1:
            plan_ranges = [(-1, K)]
        else:
            back = self._outer_dp(best_q, K, S, W, True)
            if back is None:
                # nothing fits: the split minimising the slowest stage regardless of memory
                # (so that raising λ has a plan to judge)
                back = self._outer_dp(best_q, K, S, W, False)
            plan_ranges, j = [], K
            for s in range(S, 0, -1):
                i = int(back[s][j])
                plan_ranges.append((i, j))
                j = i
            plan_ranges.reverse()
        choice, opt_of = {}, {}
        t_mb, t_once, mem, trans, bnd, stage_layers = [], [], [], [], [], []
        relaxed = 0.0
        for s, (i, j) in enumerate(plan_ranges):
            ch = self._backtrack(i, j, unary, parts, reduced)
            stage_layers.append(ch)
            choice.update(ch)
            _, A, B, m = stage_cost(i, j, s)
            relaxed += float(best_v[i + 1, j])
            t_mb.append(A)
            t_once.append(B)
            mem.append(m)
            bnd.append(self.boundary[j] if j < K else 0.0)
            trans.append(max((float(self.opts[n].trans[ch[n], option[n][ch[n]]])
                              for n in ch), default=0.0))
        for n in choice:
            opt_of[n] = int(option[n][choice[n]])
        T = sum(t_mb) + (self.M - 1) * max(t_mb) + max(t_once)
        pos = {n: k for k, n in enumerate(self.tables.names)}
        stages = [sorted(ch, key=pos.get) for ch in stage_layers]
        ev = Evaluation(lam, choice, opt_of, stages, t_mb, t_once, mem, trans, T, relaxed,
                        boundary_s=bnd)
        ev.fits = ev.peak <= self.cap
        if lam == 0.0 and not self.masks and self.option_mask is None:
            ev.floor_s = self.floor(best_v, K, S)
        return ev

    def floor(self, best_v, K: int, S: int) -> float:
        """A lower bound of the step time of every plan of ``S`` stages (any split, any
        configurations and options, memory aside), from the ranges' least relaxed costs at
        ``λ = 0`` (``best_v[i + 1, j]``: the least ``W·t + u`` of a stage over cuts
        ``(i, j]``, transfers inside it included, exactly):

            T = Σ_s t_s + (M − 1)·max_s t_s + max_s u_s  ≥  (1/S) · Σ_s (W·t_s + u_s)
              ≥ (1/S) · min_(splits into S) Σ_s (best_v[stage] + W·boundary)

        (a maximum is at least the mean).  Unlike :func:`.pipeline.step_bound` it counts
        the transfers between a stage's layers and the consistency of their layouts, so a
        configuration whose bound from the layers alone was loose is settled by one
        evaluation at ``λ = 0`` instead of the search over ``λ``.  With one stage it is the
        optimum itself."""
        W = self.weight
        bnd = np.array([self.boundary[j] if j < K else 0.0 for j in range(K + 1)])
        C = np.where(np.isnan(best_v), np.inf, best_v + W * bnd[None, :])
        f = C[0].copy()                             # the first stage: cuts 0 .. j
        f[0] = np.inf
        for _ in range(2, S + 1):                   # a later stage after cut i: row i + 1
            f = np.min(f[1:K, None] + C[2:], axis=0)
        return float(f[K]) / S

    def _outer_dp(self, best_q, K: int, S: int, W: float, memory: bool):
        """Alpa's outer DP over cut positions, vectorised over the stage ends: ``f_s[j]`` the
        least slowest-stage cost of ``s`` stages covering cuts ``0..j``, each stage ``(i, j]``
        costing ``W·(A + boundary) + B`` and (with ``memory``) holding ``Ms + inflight·Ma``
        within the cap.  ``back[s][j]`` the chosen ``i`` (the first of equal minima), or
        ``None`` when no split of ``S`` stages qualifies."""
        INF = math.inf
        A, Bm, Ms, Ma = best_q                       # row i + 1 for a stage after cut i
        bnd = np.array([self.boundary[j] if j < K else 0.0 for j in range(K + 1)])
        C = W * (A + bnd[None, :]) + Bm
        C = np.where(np.isnan(C), INF, C)
        f = np.where((Ms[0] + self.inflight(0) * Ma[0] <= self.cap) | (not memory), C[0], INF)
        f[0] = INF
        back = {1: np.full(K + 1, -1)}
        for s in range(2, S + 1):
            mem = Ms[2:] + self.inflight(s - 1) * Ma[2:]            # rows i = 1 .. K-1
            V = np.maximum(f[1:K, None], C[2:])
            if memory:
                V = np.where(mem <= self.cap, V, INF)
            arg = V.argmin(axis=0)
            f = V[arg, np.arange(K + 1)]
            back[s] = arg + 1
        if not np.isfinite(f[K]):
            return None
        return back

    def _ranges(self, K, every_start, unary, parts, reduced) -> dict:
        """``(relaxed cost [K+1, K+1], [A, B, Ms, Ma] [4, K+1, K+1])`` of the best stage over
        cuts ``(i, j]`` at ``[i + 1, j]`` (NaN elsewhere) for the first stage (``i = -1``) and,
        with ``every_start``, every later start ``i ≥ 1``, each ended at every cut ``j``: all
        open stages are extended together, one min-plus step per segment (the same sums and
        ties as one stage at a time)."""
        best_v = np.full((K + 1, K + 1), np.nan)
        best_q = np.full((4, K + 1, K + 1), np.nan)
        if self._compiled_ranges(K, reduced):
            return self._ranges_compiled(K, every_start, unary, parts, reduced, best_v, best_q)
        v, q, _ = self._start(-1, unary, parts, reduced)
        starts = [-1]
        V, Q = v[None, :], [x[None, :] for x in q]
        j = 1
        while True:
            c = V.argmin(axis=1)
            rows = np.arange(len(starts))
            vals = V[rows, c]
            at = np.asarray(starts) + 1
            best_v[at, j] = vals
            for m, x in enumerate(Q):
                best_q[m, at, j] = x[rows, c]
            if j == K:
                break
            r = reduced[j]
            lag = V[:, :, None] + r.L[None, :, :]
            arg = lag.argmin(axis=1)                                  # [n, Cb]
            cols = np.arange(lag.shape[2])[None, :]
            x = self.chain.cuts[j + 1]
            tm, to, st, ac = parts[x]
            V = np.take_along_axis(lag, arg[:, None, :], axis=1)[:, 0, :] + unary[x]
            Q = [np.take_along_axis(Q[0], arg, axis=1) + r.A[arg, cols] + tm,
                 np.take_along_axis(Q[1], arg, axis=1) + r.B[arg, cols] + to,
                 np.take_along_axis(Q[2], arg, axis=1) + r.Ms[arg, cols] + st,
                 np.take_along_axis(Q[3], arg, axis=1) + r.Ma[arg, cols] + ac]
            if every_start:
                v, q, _ = self._start(j, unary, parts, reduced)
                starts.append(j)
                V = np.vstack([V, v[None, :]])
                Q = [np.vstack([a, b[None, :]]) for a, b in zip(Q, q)]
            j += 1
        return best_v, best_q

    #: above this much work (stage starts × segments × candidates²) the stage ranges run in
    #: the compiled kernel (:func:`.xkernel.ranges_kernel`; loading numba costs about a
    #: second, so small chains keep the numpy path)
    JIT_RANGES = 2_000_000

    def _compiled_ranges(self, K: int, reduced) -> bool:
        """Whether the stage ranges run compiled: large chains, and every chain once a
        search has loaded the kernel (the numbers are the same either way)."""
        if K < 2:
            return False
        from explorer.engine.layerwise import xkernel
        if xkernel.ranges_loaded():
            return True
        cmax = max(max(r.L.shape) for r in reduced)
        return K * K * cmax * cmax // 2 >= self.JIT_RANGES

    def _ranges_compiled(self, K, every_start, unary, parts, reduced, best_v, best_q):
        """:meth:`_ranges` in the compiled kernel: the segments' reductions and the cuts'
        parts padded into arrays (identical numbers; the kernel's docstring)."""
        from explorer.engine.layerwise.xkernel import ranges_kernel, shift_agreement
        cuts = self.chain.cuts
        nc = np.array([len(unary[x]) for x in cuts], dtype=np.int64)
        cmax = int(nc.max())
        uniq: dict = {}                       # identical segments share one reduction
        seg = np.array([uniq.setdefault(id(r), len(uniq)) for r in reduced], dtype=np.int64)
        n = len(uniq)
        L = np.full((n, cmax, cmax), np.inf)
        A, B, Ms, Ma = (np.zeros((n, cmax, cmax)) for _ in range(4))
        done = set()
        for k, r in enumerate(reduced):
            u = int(seg[k])
            if u in done:
                continue
            done.add(u)
            ca, cb = r.L.shape
            L[u, :ca, :cb], A[u, :ca, :cb], B[u, :ca, :cb] = r.L, r.A, r.B
            Ms[u, :ca, :cb], Ma[u, :ca, :cb] = r.Ms, r.Ma
        P = np.zeros((K + 1, 4, cmax))
        U = np.full((K + 1, cmax), np.inf)
        for k, x in enumerate(cuts):
            P[k, :, :nc[k]] = parts[x]
            U[k, :nc[k]] = unary[x]
        v, q, _ = self._start(-1, unary, parts, reduced)
        SV = np.full(cmax, np.inf)
        SQ = np.zeros((4, cmax))
        SV[:len(v)] = v
        SQ[:, :len(v)] = q
        ranges_kernel()(K, bool(every_start), nc, seg, L, A, B, Ms, Ma, P, U, SV, SQ,
                        best_v, best_q, *shift_agreement(seg, U, P, nc))
        return best_v, best_q

    def _backtrack(self, i, j, unary, parts, reduced) -> dict:
        """Each layer's candidate in the stage covering cuts ``(i, j]`` (``i = -1``: from
        cut 0)."""
        v, q, arg0 = self._start(i, unary, parts, reduced)
        args = []
        k = (i + 1) if i >= 0 else 1
        while k < j:
            v, q, arg = self._step(k, v, q, unary, parts, reduced)
            args.append(arg)
            k += 1
        cuts = self.chain.cuts
        cfg = {cuts[j]: int(v.argmin())}
        k = j
        for arg in reversed(args):
            cfg[cuts[k - 1]] = int(arg[cfg[cuts[k]]])
            k -= 1
        first = (i + 1) if i >= 0 else 1
        prev = int(arg0[cfg[cuts[first]]])
        if i < 0:
            cfg[cuts[0]] = prev
        out = dict(cfg)
        for kk in range(first - 1, j):
            seg = self.chain.segments[kk]
            ca = cfg[seg.a] if seg.a in cfg else prev
            cb = cfg[seg.b]
            for n, arr in zip(seg.interior, reduced[kk].choice):
                out[n] = int(arr[ca, cb])
        return out

    def _whole(self, lam, unary, parts, option) -> Evaluation:
        """No chain of series-parallel segments: the elimination of :mod:`.optcnn` on the
        relaxed tables (one stage)."""
        t = self.tables
        zeros = {n: np.zeros(len(unary[n])) for n in t.names}
        relaxed_tables = CostTables(t.names, t.candidates, unary, zeros, t.memory,
                                    [(e, self.weight * np.asarray(m)) for e, m in t.edges])
        choice, _, _ = optcnn.solve(relaxed_tables)
        A = sum(float(parts[n][0][choice[n]]) for n in t.names) + \
            sum(float(m[choice[e.src], choice[e.dst]]) for e, m in t.edges)
        B = sum(float(parts[n][1][choice[n]]) for n in t.names)
        Ms = sum(float(parts[n][2][choice[n]]) for n in t.names)
        Ma = sum(float(parts[n][3][choice[n]]) for n in t.names)
        opt_of = {n: int(option[n][choice[n]]) for n in t.names}
        tr = max((float(self.opts[n].trans[choice[n], opt_of[n]]) for n in t.names),
                 default=0.0)
        relaxed = relaxed_tables.objective(choice)
        mem = Ms + self.inflight(0) * Ma
        T = self.M * A + B
        ev = Evaluation(lam, choice, opt_of, [list(t.names)], [A], [B],
                        [mem], [tr], T, relaxed)
        ev.fits = ev.peak <= self.cap
        return ev


def _scan(ev, unit: float, top: Evaluation, cap: float, exact: bool):
    """``(lo, hi)``: the first price of the ladder ``unit·10⁻³·4^k`` (below
    ``unit·LAMBDA_TOP``) whose plan fits (``hi``; ``None`` when none does) and the one before
    it (``lo``; ``0.0`` when the first fits), scanned upwards.

    Whether a price fits is not monotone (a larger price can gather more ZeRO-3 weights, a
    transient outside the relaxation), but with ``exact`` (one stage: each price's plan
    minimises ``time + λ·memory``) the relaxed memory is: it never grows with the price.  So
    a price whose plan holds more than ``cap`` before any transient rules out every price
    below it, and the scan starts at the first price whose relaxed memory fits, found by
    halving the ladder - the same ``(lo, hi)`` as a scan from the bottom, in about half
    the evaluations (8 → 5 on a Llama-3-8B on 512 devices).  When even the least-memory
    plan's relaxed memory is over ``cap`` nothing fits, and the scan from the bottom runs as
    it always did (the smallest footprint it meets is what the search reports)."""
    grid, lam = [], unit * 1e-3
    while lam < unit * LAMBDA_TOP:
        grid.append(lam)
        lam *= 4.0
    n, start, lo = len(grid), 0, 0.0
    seen = {}
    if exact and n > 4 and max(top.memory) <= cap:   # else no price's plan fits
        a, b = -1, n                         # relaxed memory over cap at a, within at b
        while b - a > 1:
            m = (a + b) // 2
            e = seen[m] = ev(grid[m])
            if max(e.memory) > cap:
                a = m
            else:
                b = m
        start = a + 1
        if a >= 0:
            lo = grid[a]
    for k in range(start, n):
        e = seen.get(k) or ev(grid[k])
        if e.fits:
            return lo, grid[k]
        lo = grid[k]
        if e.memory == top.memory and e.transient == top.transient:
            break                          # already the least-memory plan: nothing fits
    return lo, None


def top_price(e0: Evaluation) -> float:
    """The multiplier of the Lagrangian's least-memory plan, after ``e0`` (``λ = 0``)."""
    return max(e0.time_s, 1e-9) / max(e0.peak, 1.0) * LAMBDA_TOP


def lagrangian(evaluator: Evaluator, plain: Evaluation | None = None,
               top: Evaluation | None = None):
    """The fastest fitting plan over λ (module docstring): ``(best, smallest, info)`` where
    ``best`` is the fastest fitting :class:`Evaluation` (``None`` when none fits),
    ``smallest`` the one of least peak memory seen, and ``info`` the λ steps, the lower bound
    and the gap.  ``plain`` and ``top`` are its first two evaluations (``λ = 0`` and
    :func:`top_price`) when already made (the same search either way)."""
    cap = evaluator.cap
    seen = []
    made_top = top

    def ev(lam):
        e = evaluator.evaluate(lam)
        seen.append(e)
        return e

    e0 = plain if plain is not None else ev(0.0)
    if plain is not None:
        seen.append(plain)
    best = e0 if e0.fits else None
    if best is None:
        # λ prices a byte in seconds.  At a price far above any plan's time per byte the
        # plan is the least-memory one.  When it fits, the first price tried is the average
        # it pays per byte saved, then ×4 steps bracket the smallest fitting λ and a
        # geometric bisection narrows it.
        unit = max(e0.time_s, 1e-9) / max(e0.peak, 1.0)
        if made_top is not None:
            top = made_top
            seen.append(top)
        else:
            top = ev(top_price(e0))
        lo, hi = 0.0, None
        if top.fits:
            hi = unit * LAMBDA_TOP
        else:
            # transients (a max, outside the relaxation) can make the least-memory plan of
            # the relaxation miss the cap where a plan between does not: scan upwards
            lo, hi = _scan(ev, unit, top, cap, evaluator.S == 1)
        if hi is not None and (top.fits or lo == 0.0):
            saved = max(e0.peak - top.peak, 1.0)
            lam = min(max((top.time_s - e0.time_s) / saved, unit * 1e-4), hi / 4.0)
            for _ in range(MAX_DOUBLINGS):
                e = ev(lam)
                if e.fits:
                    hi = lam
                    if lam / 4.0 <= lo or lam / 4.0 < unit * 1e-6:
                        break
                    lam /= 4.0
                else:
                    lo = lam
                    if lam * 4.0 >= hi:
                        break
                    lam *= 4.0
                if lo > 0 and hi / lo <= 4.0:
                    break
        if hi is not None:
            for _ in range(BISECT_STEPS):
                if lo > 0 and hi / lo <= BISECT_RATIO:
                    break
                mid = math.sqrt(hi * lo) if lo > 0 else hi / 4.0
                e = ev(mid)
                if e.fits:
                    hi = mid
                else:
                    lo = mid
        fits = [e for e in seen if e.fits]
        best = min(fits, key=lambda e: e.time_s) if fits else None
        if best is not None:
            best = improve(evaluator, best)
    smallest = min(seen, key=lambda e: e.peak)
    lb = None
    if evaluator.S == 1:
        lb = max(e.relaxed - e.lam * cap for e in seen)
    info = {"lambdas": len(seen), "lambda": best.lam if best else None,
            "lower_bound_s": lb,
            "gap": (None if best is None or lb is None else
                    max(0.0, (best.time_s - lb) / max(best.time_s, 1e-30)))}
    return best, smallest, info


def improve(evaluator: Evaluator, ev: Evaluation, passes: int = 20) -> Evaluation:
    """Greedy improvement of a fitting one-stage plan: move one layer at a time to the
    (candidate, option) that lowers the step time most while the plan still fits (the
    memory bound plus the largest transient, conservatively the current one); repeated
    until no move helps.  Closes part of the Lagrangian's duality gap; a heuristic."""
    if evaluator.S != 1 or evaluator.M != 1 or not ev.fits or evaluator.masks or \
            evaluator.option_mask is not None:
        return ev
    t = evaluator.tables
    opts = evaluator.opts
    nbrs: dict = {n: [] for n in t.names}
    for e, m in t.edges:
        m = np.asarray(m)
        nbrs[e.dst].append((e.src, m.T, True))
        nbrs[e.src].append((e.dst, m, True))
    ch, op = dict(ev.choice), dict(ev.option)
    total = {n: opts[n].t_mb + opts[n].t_once for n in t.names}
    mm = {n: opts[n].static + opts[n].act for n in t.names}
    if evaluator.masks or evaluator.option_mask is not None:
        return ev
    mem = sum(float(mm[n][ch[n], op[n]]) for n in t.names)
    tr = max(float(opts[n].trans[ch[n], op[n]]) for n in t.names)
    cap = evaluator.cap
    for _ in range(passes):
        moved = False
        for n in t.names:
            edge = np.zeros(total[n].shape[0])
            for w, m, _ in nbrs[n]:
                edge = edge + m[:, ch[w]]
            cost = total[n] + edge[:, None]
            cur = float(cost[ch[n], op[n]])
            dm = mm[n] - mm[n][ch[n], op[n]]
            ok = (mem + dm + np.maximum(tr, opts[n].trans) <= cap) & np.isfinite(cost)
            cand = np.where(ok, cost, np.inf)
            c, o = np.unravel_index(int(cand.argmin()), cand.shape)
            if cand[c, o] < cur - 1e-12 * max(abs(cur), 1e-30):
                mem += float(dm[c, o])
                tr = max(tr, float(opts[n].trans[c, o]))
                ch[n], op[n] = int(c), int(o)
                moved = True
        if not moved:
            break
    A = sum(float(opts[n].t_mb[ch[n], op[n]]) for n in t.names) + \
        sum(float(np.asarray(m)[ch[e.src], ch[e.dst]]) for e, m in t.edges)
    B = sum(float(opts[n].t_once[ch[n], op[n]]) for n in t.names)
    if A + B >= ev.time_s:
        return ev
    Ms = sum(float(opts[n].static[ch[n], op[n]]) for n in t.names)
    Ma = sum(float(opts[n].act[ch[n], op[n]]) for n in t.names)
    trn = max(float(opts[n].trans[ch[n], op[n]]) for n in t.names)
    out = Evaluation(ev.lam, ch, op, ev.stages, [A], [B], [Ms + Ma], [trn], A + B, ev.relaxed,
                     boundary_s=ev.boundary_s)
    out.fits = out.peak <= cap
    return out if out.fits else ev


def stage_counts(n_devices: int, segments: int, batch: int) -> list:
    """Stage counts the pipeline search tries: powers of two dividing the devices, at most
    the segments between cuts and the batch."""
    out, s = [], 1
    while s <= n_devices and s <= segments and s <= batch:
        if n_devices % s == 0:
            out.append(s)
        s *= 2
    return out


def evaluate(evaluator: Evaluator, lam: float) -> Evaluation:
    """One λ's plan (for tests and the views)."""
    return evaluator.evaluate(lam)


def now() -> float:
    return time.perf_counter()

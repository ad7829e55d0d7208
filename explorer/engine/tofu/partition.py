"""Tofu's recursive partitioning (EuroSys 2019, Section 5.2-5.3): at each step every worker group
is split k_i ways, each tensor class choosing an axis and each template a strategy, minimising
the step's communication by exact variable elimination; steps matched to link levels; the
baselines (AllRow-Greedy, Spartan, EqualChop, ICML'18) under the same accounting.  The cost
accounting is in :mod:`explorer.engine.tofu.search`'s docstring."""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass

import numpy as np

from explorer.errors import InfeasiblePlan
from explorer.engine.core.geometry import (
    device_of,
    overlap,
    split as split_boxes,
    volume,
)
from explorer.engine.search.options import TofuOptions, make
from explorer.engine.tofu.coarsen import REPLICATE, Coarse, OpInfo, coarsen, factorize
from explorer.engine.tofu.plan import StepTrace, TofuPlan

@dataclass
class _State:
    """Per level: every tensor's held box and every op's output box / reduction ranges."""

    held: dict                         # tensor id -> [G, nd, 2]
    out: dict                          # op name -> [G, nd, 2]
    red: dict                          # op name -> {var name: [G, 2] half-open}
    G: int = 1


_STRAT_CACHE: dict = {}


def _strategies(oi: OpInfo, st: _State, k: int, reduction: bool) -> list:
    """Strategies at this step: ("split", axis) / ("reduce", var) / ("replicate", None)."""
    key = (oi.sig, k, reduction, st.out[oi.name][0].tobytes(),
           tuple(sorted((v, r[0].tobytes()) for v, r in st.red[oi.name].items())))
    hit = _STRAT_CACHE.get(key)
    if hit is None:
        if len(_STRAT_CACHE) > 100000:
            _STRAT_CACHE.clear()
        hit = _STRAT_CACHE[key] = _strategies_uncached(oi, st, k, reduction)
    return hit


def _strategies_uncached(oi: OpInfo, st: _State, k: int, reduction: bool) -> list:
    b = oi.bound
    box = st.out[oi.name][0]
    res = [("split", a) for a in range(box.shape[0]) if box[a, 1] - box[a, 0] >= k]
    red_ok = reduction or not res
    if red_ok:
        rr = st.red[oi.name]
        for v in b.reducible(runnable=True):
            if v.name in rr:
                ext = rr[v.name][0, 1] - rr[v.name][0, 0]
            else:
                ext = b.extent.get(v)
                if not isinstance(ext, (int, np.integer)):
                    continue
            if ext >= k:
                res.append(("reduce", v.name))
    if not res:
        res.append(("replicate", None))
    return res


def _child(oi: OpInfo, st: _State, s, k: int):
    """Children's output boxes and reduction ranges under strategy ``s``."""
    kind, what = s
    out = st.out[oi.name]
    red = {v: np.repeat(r, k, axis=0) for v, r in st.red[oi.name].items()}
    if kind == "split":
        cout = split_boxes(out, what, k)
    else:
        cout = np.repeat(out, k, axis=0)
    if kind == "reduce":
        r = st.red[oi.name].get(what)
        if r is None:
            ext = oi.bound.extent[oi.bound.var(what)]
            r = np.tile(np.array([[0, ext]], dtype=np.int64), (out.shape[0], 1))
        rb = split_boxes(r[:, None, :], 0, k)[:, 0, :]
        red[what] = rb
    return cout, red


_COST_CACHE: dict = {}


def _op_vectors(oi: OpInfo, st: _State, k: int, choices: dict, cls: dict, tensors: dict,
                strategies: list) -> np.ndarray:
    """Cost (elements·itemsize) of every strategy × slot × class choice.

    Slots are the op's inputs then its output; returns ``[S, slots, max_choices]`` (padded with
    +inf) - the factor of this op is ``min_s Σ_slot cost[s, slot, choice(class(slot))]``.
    """
    slots = [t for _, t in oi.inputs] + [oi.output]
    key = (oi.sig, k, st.out[oi.name].tobytes(),
           tuple(sorted((v, r.tobytes()) for v, r in st.red[oi.name].items())),
           tuple((st.held[t].tobytes(), tuple(choices[cls[t]])) for t in slots),
           tuple(strategies))
    hit = _COST_CACHE.get(key)
    if hit is not None:
        return hit
    nmax = max(len(choices[cls[t]]) for t in slots)
    S = len(strategies)
    cost = np.full((S, len(slots), nmax), np.inf)
    # children's output boxes and reduction ranges of every strategy, stacked: [S, K, ...]
    kids = [_child(oi, st, s, k) for s in strategies]
    couts = np.stack([c for c, _ in kids])
    K = couts.shape[1]
    if oi.inputs:
        red_vars = sorted({v for _, r in kids for v in r})
        red_incl = {}
        for v in red_vars:
            full = None
            lo = np.empty((S, K), dtype=np.int64)
            hi = np.empty((S, K), dtype=np.int64)
            for si, (_, r) in enumerate(kids):
                if v in r:
                    lo[si], hi[si] = r[v][:, 0], r[v][:, 1] - 1
                else:
                    if full is None:
                        full = oi.bound.extent[oi.bound.var(v)]
                    lo[si], hi[si] = 0, full - 1
            red_incl[v] = (lo, hi)
        regs = oi.bound.regions(couts, red=red_incl)
    for j, (n, t) in enumerate(oi.inputs):
        need = regs[n]                                    # [S, K, nd, 2]
        nv = volume(need)
        isz = tensors[t].itemsize
        for ci, ax in enumerate(choices[cls[t]]):
            h = split_boxes(st.held[t], ax, k)           # [K, nd, 2]
            cost[:, j, ci] = (nv - overlap(need, h[None])).sum(-1) * isz
    t = oi.output
    isz = tensors[t].itemsize
    rep = np.array([s[0] == "replicate" for s in strategies])
    for ci, ax in enumerate(choices[cls[t]]):
        h = split_boxes(st.held[t], ax, k)
        own = overlap(couts, h[None])                  # [S, K]
        m = overlap(h[None, :, None], couts[:, None, :]).sum(-1)   # [S, K]
        m = np.where(rep[:, None], volume(h)[None], m)
        cost[:, len(slots) - 1, ci] = (m - own).sum(-1) * isz
    if len(_COST_CACHE) > 200000:
        _COST_CACHE.clear()
    _COST_CACHE[key] = cost
    return cost


class Factor:
    __slots__ = ("vars", "table")

    def __init__(self, vars_, table):
        self.vars, self.table = tuple(vars_), table


def _template_factor(names, co: Coarse, st, k, choices, tensors, reduction, dom):
    """min over the template's shared strategy of the summed cost of its instances."""
    first = co.ops[names[0]]
    strategies = _strategies(first, st, k, reduction)
    vars_: list = []
    for o in names:
        oi = co.ops[o]
        for _, t in oi.inputs + [(None, oi.output)]:
            c = co.cls[t]
            if c not in vars_:
                vars_.append(c)
    shape = [len(dom[v]) for v in vars_]
    total = np.zeros([len(strategies)] + shape)
    pos = {v: i for i, v in enumerate(vars_)}
    for o in names:
        oi = co.ops[o]
        strat = strategies if co.ops[o].sig == first.sig else _strategies(oi, st, k, reduction)
        if len(strat) != len(strategies):
            strat = strategies
        vec = _op_vectors(oi, st, k, choices, co.cls, tensors, strat)
        for j, t in enumerate([t for _, t in oi.inputs] + [oi.output]):
            c = co.cls[t]
            v = vec[:, j, :len(dom[c])]
            idx = [slice(None)] + [None] * len(vars_)
            idx[1 + pos[c]] = slice(None)
            total = total + v[tuple(idx)]
    best = total.min(0)
    arg = total.argmin(0)
    return Factor(vars_, best), strategies, arg, vars_


def eliminate(factors: list, dom: dict, max_entries: int):
    """Exact min-sum variable elimination; returns (optimum, assignment {var: choice idx})."""
    by_var: dict = {}
    alive = {}
    for i, f in enumerate(factors):
        alive[i] = f
        for v in f.vars:
            by_var.setdefault(v, set()).add(i)
    const = 0.0
    nid = len(factors)
    trace = []                         # (var, kept vars, argmin table)
    remaining = set(by_var)
    import heapq

    def score(v):
        nb = set()
        for i in by_var[v]:
            nb.update(alive[i].vars)
        return math.prod(len(dom[u]) for u in nb), nb
    heap = [(score(v)[0], str(v), v) for v in remaining]
    heapq.heapify(heap)
    while remaining:
        sc, _, v = heapq.heappop(heap)
        if v not in remaining:
            continue
        cur, nb = score(v)
        if cur != sc:
            heapq.heappush(heap, (cur, str(v), v))
            continue
        if cur > max_entries:
            raise InfeasiblePlan(
                f"the coarsened graph is too wide for the DP: eliminating a tensor class "
                f"needs a table of {cur:,} entries (limit {max_entries:,})")
        keep = [u for u in nb if u != v]
        axes = keep + [v]
        shape = [len(dom[u]) for u in axes]
        acc = np.zeros(shape)
        for i in list(by_var[v]):
            f = alive.pop(i)
            perm = [axes.index(u) for u in f.vars]
            t = f.table
            order = np.argsort(perm)
            t = np.transpose(t, order) if t.ndim > 1 else t
            sorted_axes = sorted(perm)
            idx = [None] * len(axes)
            for a in sorted_axes:
                idx[a] = slice(None)
            acc = acc + t[tuple(idx)]
            for u in f.vars:
                by_var[u].discard(i)
        arg = acc.argmin(-1)
        new = acc.min(-1)
        trace.append((v, keep, arg))
        remaining.discard(v)
        if keep:
            alive[nid] = Factor(keep, new)
            for u in keep:
                by_var[u].add(nid)
                heapq.heappush(heap, (score(u)[0], str(u), u))
            nid += 1
        else:
            const += float(new)
    for f in alive.values():           # factors without variables
        const += float(f.table)
    assign: dict = {}
    for v, keep, arg in reversed(trace):
        assign[v] = int(arg[tuple(assign[u] for u in keep)]) if keep else int(arg)
    return const, assign


def _domains(co: Coarse, st: _State, k: int, g, live: set) -> dict:
    """Each class's choices at this step: axes whose held extent is ≥ k (else replicate)."""
    choices = {}
    for c, members in co.class_members.items():
        if not any(t in live for t in members):
            continue
        t = members[0]
        box = st.held[t][0]
        axes = [a for a in range(box.shape[0]) if box[a, 1] - box[a, 0] >= k]
        for t2 in members[1:]:
            b2 = st.held[t2][0]
            axes = [a for a in axes if a < b2.shape[0] and b2[a, 1] - b2[a, 0] >= k]
        choices[c] = axes or [REPLICATE]
    return choices



def _initial_state(g, co: Coarse) -> _State:
    held = {t: np.array([[[0, s] for s in ten.shape]], dtype=np.int64).reshape(1, -1, 2)
            for t, ten in g.tensors.items()}
    out = {o: held[oi.output].copy() for o, oi in co.ops.items()}
    red = {o: {} for o in co.ops}
    return _State(held, out, red, 1)


def _level_bandwidth(devices, n: int, stride: int) -> float:
    if devices is None or n < 2 or stride >= n:
        return float("inf")
    try:
        return float(devices.bandwidth(0, stride))
    except Exception:  # noqa: BLE001 - custom graphs without that pair
        return float("inf")


def _multi_level(devices, workers: int) -> bool:
    """Whether the first ``workers`` devices are joined by links of more than one bandwidth."""
    if devices is None or workers < 2:
        return False
    bw = devices.bw[:workers, :workers]
    off = bw[~np.eye(workers, dtype=bool)]
    return bool(off.size) and not np.allclose(off, off[0], rtol=1e-9, atol=0.0)


_PAIR_CACHE: dict = {}


def _pair_bytes(oi: OpInfo, st: _State, k: int, s, axis_of: dict, tensors: dict) -> np.ndarray:
    """``[G, k, k]`` bytes child j of each group receives from its sibling j' at this step
    under strategy ``s``: the parts of its input regions a sibling holds, and the sibling's
    (partial) outputs that fall in the box it holds."""
    slots = [t for _, t in oi.inputs] + [oi.output]
    key = (oi.sig, k, s, st.out[oi.name].tobytes(),
           tuple(sorted((v, r.tobytes()) for v, r in st.red[oi.name].items())),
           tuple((st.held[t].tobytes(), axis_of.get(t, REPLICATE)) for t in slots))
    hit = _PAIR_CACHE.get(key)
    if hit is not None:
        return hit
    G = st.out[oi.name].shape[0]
    cout, red = _child(oi, st, s, k)
    out = np.zeros((G, k, k))
    if oi.inputs:
        regs = oi.bound.regions(cout, red={v: (r[:, 0], r[:, 1] - 1) for v, r in red.items()})
        for n, t in oi.inputs:
            ax = axis_of.get(t, REPLICATE)
            if ax == REPLICATE or st.held[t].shape[0] != G:
                continue               # every sibling holds the same part: nothing to fetch
            h = split_boxes(st.held[t], ax, k).reshape(G, 1, k, *st.held[t].shape[1:])
            need = regs[n].reshape(G, k, 1, *regs[n].shape[1:])
            out += overlap(need, h) * tensors[t].itemsize
    t = oi.output
    ax = axis_of.get(t, REPLICATE)
    if s[0] != "replicate" and st.held[t].shape[0] == G:
        h = split_boxes(st.held[t], ax, k).reshape(G, k, 1, *st.held[t].shape[1:])
        c = cout.reshape(G, 1, k, *cout.shape[1:])
        out += overlap(h, c) * tensors[t].itemsize
    out[:, np.arange(k), np.arange(k)] = 0.0
    if len(_PAIR_CACHE) > 100000:
        _PAIR_CACHE.clear()
    _PAIR_CACHE[key] = out
    return out


def _pair_inv(factors, dev, inv, i) -> np.ndarray:
    """``[G, k, k]``: mean 1/bandwidth from sender child j' to receiver child j at step ``i``
    over the device pairs with the same offset inside both (devices ``dev`` per worker)."""
    K = len(dev)
    G = math.prod(factors[:i])
    k = factors[i]
    w = np.arange(K).reshape(G, k, K // (G * k))       # [group, child, offset]
    recv = dev[w][:, :, None, :]
    send = dev[w][:, None, :, :]
    return inv[send, recv].mean(-1)


def _orders(m: int) -> list:
    """The orders :func:`level_order` tries."""
    return [list(p) for p in itertools.permutations(range(m))] if m <= 7 else [list(range(m))]


def _pairs_matter(factors, bw) -> list:
    """Per step: whether its sibling pairs see different bandwidths under some order (only
    then are the bytes per pair needed; otherwise δ_i crosses one kind of link)."""
    if len(factors) > 7:               # level_order sorts by bytes: every order possible
        return [True] * len(factors)
    inv = 1.0 / np.asarray(bw, dtype=np.float64)
    out = [False] * len(factors)
    for order in _orders(len(factors)):
        dev = device_of(factors, order)
        for i, k in enumerate(factors):
            p = _pair_inv(factors, dev, inv, i)[:, ~np.eye(k, dtype=bool)]
            out[i] |= not np.allclose(p, p.flat[0], rtol=1e-9, atol=0.0)
    return out


def step_seconds(factors, order, deltas, pair_bytes, bw) -> np.ndarray:
    """Seconds on the links of every step when the steps' digits number the devices in
    ``order``: δ_i spread over sibling pairs in proportion to ``pair_bytes[i]`` (``[G, k,
    k]``, receiver × sender; ``None`` when every pair sees one bandwidth), each pair at the
    mean of 1/bandwidth over the device pairs that carry it (the same offset inside both
    sibling groups)."""
    dev = device_of(factors, order)
    inv = 1.0 / np.asarray(bw, dtype=np.float64)
    out = np.zeros(len(factors))
    for i, k in enumerate(factors):
        pair_inv = _pair_inv(factors, dev, inv, i)
        off = ~np.eye(k, dtype=bool)
        b = np.zeros(1) if pair_bytes[i] is None else np.asarray(pair_bytes[i], dtype=np.float64)
        tot = b.sum()
        if tot > 0:
            out[i] = deltas[i] * float((b * pair_inv).sum()) / tot
        else:
            out[i] = deltas[i] * float(pair_inv[:, off].mean())
    return out


def level_order(factors, deltas, pair_bytes, bw) -> list:
    """The order of the steps' digits in device numbers (most significant first) with the
    least total time on the links; ties keep the recursion's own order.  Every order is
    tried (``m!`` for ``m`` steps; beyond 7 steps the steps moving the fewest bytes take the
    most significant digits, Theorem 4's order)."""
    m = len(factors)
    ident = list(range(m))
    if m > 7:
        return sorted(ident, key=lambda i: (deltas[i], i))
    best, best_t = ident, float(step_seconds(factors, ident, deltas, pair_bytes, bw).sum())
    for perm in _orders(m):
        t = float(step_seconds(factors, perm, deltas, pair_bytes, bw).sum())
        if t < best_t * (1 - 1e-12):
            best, best_t = perm, t
    return best


def _permute_workers(st: _State, dev: np.ndarray) -> _State:
    """The state with worker w's boxes at index ``dev[w]`` (per-device numbering)."""
    def perm(a):
        if a.shape[0] != len(dev):
            return a
        out = np.empty_like(a)
        out[dev] = a
        return out
    return _State({t: perm(h) for t, h in st.held.items()},
                  {o: perm(b) for o, b in st.out.items()},
                  {o: {v: perm(r) for v, r in rr.items()} for o, rr in st.red.items()}, st.G)


def _greedy_allrow(choices: dict) -> dict:
    return {c: (0 if 0 in ax else 0) for c, ax in choices.items()}


def _greedy_spartan(factors, dom, co, g, live) -> dict:
    """Largest tensor class first: pick the choice with the least cost of the factors it is
    in, other undecided classes taken at their best."""
    size = {}
    for c, members in co.class_members.items():
        if c in dom:
            size[c] = sum(g.tensors[t].bytes for t in members)
    by_var: dict = {}
    for f in factors:
        for v in f.vars:
            by_var.setdefault(v, []).append(f)
    fixed: dict = {}
    for c in sorted(size, key=lambda c: -size[c]):
        best, bi = None, 0
        for ci in range(len(dom[c])):
            tot = 0.0
            for f in by_var.get(c, []):
                t = f.table
                idx = []
                for v in f.vars:
                    if v == c:
                        idx.append(ci)
                    elif v in fixed:
                        idx.append(fixed[v])
                    else:
                        idx.append(slice(None))
                sub = t[tuple(idx)]
                tot += float(np.min(sub)) if np.ndim(sub) else float(sub)
            if best is None or tot < best:
                best, bi = tot, ci
        fixed[c] = bi
    return fixed


def _peak_live_bytes(g, st: _State, live: set, G: int) -> np.ndarray:
    """Per worker, the peak over the step of the bytes of its shares of the live tensors: a
    tensor lives from its producer to its last consumer (parameters and their updates for the
    whole step) - what a memory planner that frees promptly needs.  A view shares its base
    tensor's memory and keeps it alive until the view's own last consumer (a weight
    gradient read through ``t`` by the update at the end of the step holds the ``mm`` result
    it views until then: the tile-local runtime measures exactly that)."""
    order = {o: i for i, o in enumerate(g.ops)}
    n = len(order) + 2
    delta = np.zeros((n, G))
    last: dict = {}
    for o, op in g.ops.items():
        for t in op.inputs:
            last[t] = order[o]
    views = {"t", "view", "_unsafe_view", "transpose", "permute", "expand", "select", "slice",
             "unsqueeze", "squeeze", "alias", "split", "unsafe_split", "unbind", "narrow",
             "reshape", "as_strided"}

    def is_view(t):
        p = g.tensors[t].producer
        return p in g.ops and g.ops[p].target in views and bool(g.ops[p].inputs)
    for t in g.tensors:                  # a view's last read keeps its base alive
        if t in last and is_view(t):
            base, seen = t, 0
            while is_view(base) and seen < 64:
                base, seen = g.ops[g.tensors[base].producer].inputs[0], seen + 1
            last[base] = max(last.get(base, -1), last[t])
    for t in live:
        ten = g.tensors[t]
        if is_view(t):
            continue                   # a view shares its base tensor's memory
        persistent = ten.kind in ("param", "update", "buffer", "input")
        start = 0 if ten.producer is None else order.get(ten.producer, 0)
        end = n - 1 if persistent else last.get(t, start) + 1
        b = volume(st.held[t]) * ten.itemsize
        if b.shape[0] != G:
            b = np.broadcast_to(b[:1], (G,))
        delta[start] += b
        delta[end] -= b
    return np.cumsum(delta, axis=0).max(axis=0)



def compute_seconds(g, xplan: dict, devices, dtype: str = "fp32") -> np.ndarray:
    """Per worker, the roofline seconds of the operator shards it computes under ``xplan``
    (:func:`execution_plan`): an operator's FLOPs and bytes scaled by the share of its output
    box the worker computes, divided among the workers of a split reduction computing the
    same box (:func:`explorer.engine.core.roofline.analytic_times`; ``local`` devices take their
    calibrated FLOP/s; ``dtype``: the devices' rate in that precision, bytes as ``g`` sizes
    them).  Operators the plan leaves out run whole on every worker."""
    from explorer.engine.core.roofline import analytic_times
    K = int(xplan["workers"])
    names = list(g.ops)
    share = np.ones((len(names), K))
    for i, o in enumerate(names):
        info = xplan["ops"].get(o)
        if info is None:
            continue
        out = np.asarray(info["out"])
        full = max(float(np.prod(g.tensors[g.ops[o].output].shape or (1,))), 1.0)
        vol = volume(out).astype(float) / full
        if info.get("reducer"):
            keys = [out[w].tobytes() for w in range(K)]
            vol = vol / np.array([keys.count(k) for k in keys])
        share[i] = vol
    flops = np.array([g.ops[o].flops for o in names], dtype=float)
    nbytes = np.array([sum(g.tensors[t].bytes for t in g.ops[o].inputs) +
                       g.tensors[g.ops[o].output].bytes for o in names], dtype=float)
    targets = [g.ops[o].target for o in names]
    sub = devices.subset(K) if devices.n > K else devices
    t = np.zeros(K)
    for w in range(K):
        tw = analytic_times(flops * share[:, w], nbytes * share[:, w], targets, sub, dtype)
        t[w] = float(tw[:, min(w, tw.shape[1] - 1)].sum())
    return t


def pin_steps(grid, shape, factors) -> list:
    """The axis a tensor is split along at each recursion step (−1: not split) so that its
    tiles form ``grid`` (tiles per axis) after steps of ``factors``; ``InfeasiblePlan`` when
    the grid cannot be made from those factors.

    >>> pin_steps((2, 2), (8, 8), [2, 2]), pin_steps((4, 1), (8, 8), [2, 2])
    ([0, 1], [0, 0])
    """
    grid = [int(x) for x in grid]
    if len(grid) != len(shape):
        raise InfeasiblePlan(f"grid {'x'.join(map(str, grid))} has {len(grid)} axes; the "
                             f"tensor has {len(shape)} ({list(shape)})")
    for a, (gs, n) in enumerate(zip(grid, shape)):
        if gs > n:
            raise InfeasiblePlan(f"grid {'x'.join(map(str, grid))}: axis {a} has only {n} "
                                 f"elements")
    left, out = list(grid), []
    for k in factors:
        a = next((a for a in range(len(left)) if left[a] > 1 and left[a] % k == 0), REPLICATE)
        if a != REPLICATE:
            left[a] //= k
        out.append(a)
    if any(x != 1 for x in left):
        raise InfeasiblePlan(f"grid {'x'.join(map(str, grid))} cannot be made by the "
                             f"recursion's steps {' x '.join(map(str, factors)) or '(none)'}: "
                             f"tiles per axis must multiply out of those factors")
    return out


def _pinned_classes(g, co, pins, factors) -> dict:
    """Pins as ``{class: [axis per step]}`` (a tensor pins its whole partition class)."""
    out: dict = {}
    for p in pins or ():
        if p.grid is None:
            raise InfeasiblePlan(f"pin {p.text()}: Tofu takes a tensor's tiling "
                                 f"(TENSOR=grid=2x1), not degrees or devices")
        if p.target not in g.tensors or p.target not in co.cls:
            some = ", ".join(list(g.tensors)[:4])
            raise InfeasiblePlan(f"pin {p.text()}: no tensor {p.target!r} in the operator "
                                 f"graph (e.g. {some}; `explorer search MODEL --algo tofu "
                                 f"--json` lists them)")
        steps = pin_steps(p.grid, g.tensors[p.target].shape, factors)
        c = co.cls[p.target]
        if c in out and out[c] != steps:
            raise InfeasiblePlan(f"pin {p.text()}: {p.target} shares its partition with "
                                 f"another pinned tensor that has a different tiling")
        out[c] = steps
    return out


def partition(g, workers: int, devices=None, pins=None,
              options: TofuOptions | dict | None = None, progress=None) -> TofuPlan:
    """Partition the operator graph ``g`` over ``workers`` (Tofu or a Section 7.3 baseline).

    Parameters
    ----------
    g : OpGraph from :func:`explorer.engine.core.opgraph.build_opgraph`.
    workers : number of workers k (≥ 1).
    devices : optional DeviceGraph - gives each step's link bandwidth for ``objective_s``.
    pins : :class:`~explorer.engine.core.pins.Pin` with ``grid`` - a tensor's tiling.
    options : :class:`TofuOptions` or a dict of its fields.
    """
    t0 = time.perf_counter()
    options = make(TofuOptions, options)
    if workers < 1:
        raise ValueError(f"workers must be ≥ 1, got {workers}")
    if devices is not None and devices.n < workers:
        raise ValueError(f"{workers} workers exceed the {devices.n} devices of "
                         f"{devices.name}")
    algo = options.algo
    co = coarsen(g, options.coalesce)
    live = {t for oi in co.ops.values() for _, t in oi.inputs} | \
        {oi.output for oi in co.ops.values()}
    factors = [workers] if algo in ("equalchop", "spartan") else factorize(workers)
    if workers == 1:
        factors = []
    reduction = algo != "icml18"
    pinned = _pinned_classes(g, co, pins, factors)
    st = _initial_state(g, co)
    steps = []
    strategies_out: dict = {o: [] for o in co.ops}
    tiling_steps: dict = {t: [] for t in live}
    op_bytes: dict = {o: 0.0 for o in co.ops}
    prev_total = 0.0
    G = 1
    multi = _multi_level(devices, workers)
    pair_bytes: list = []              # per step [G, k, k] (receiver, sender) when multi-level
    matter = _pairs_matter(factors, devices.bw[:workers, :workers]) if multi else []
    for step_i, k in enumerate(factors):
        ts = time.perf_counter()
        choices = _domains(co, st, k, g, live)
        for c, axes in pinned.items():
            want = axes[step_i]
            if c in choices and want not in choices[c] and want != REPLICATE:
                raise InfeasiblePlan(f"a pinned tiling splits axis {want} at step "
                                     f"{step_i + 1} (x{k}), but its tensor's part is too "
                                     f"small there: choose another grid")
            if c in choices:
                choices[c] = [want]
        dom = {c: list(range(len(ax))) for c, ax in choices.items()}
        fac, meta = [], []
        for tid, names in co.templates.items():
            f, strat, arg, vars_ = _template_factor(names, co, st, k, choices, g.tensors,
                                                    reduction, dom)
            fac.append(f)
            meta.append((tid, names, strat, arg, vars_))
        if algo == "allrow-greedy":
            assign = _greedy_allrow(choices)
        elif algo == "spartan":
            assign = _greedy_spartan(fac, dom, co, g, live)
        else:
            _, assign = eliminate(fac, dom, options.max_factor)
        for c in dom:
            assign.setdefault(c, 0)
        # the templates' strategies at the chosen classes, and the new state
        total = 0.0
        new_out, new_red = {}, {}
        step_strats, step_bytes = {}, {}   # this step's cut per op, and its level bytes
        for (tid, names, strat, arg, vars_), f in zip(meta, fac):
            idx = tuple(assign[v] for v in vars_)
            si = int(arg[idx]) if vars_ else int(arg)
            total += float(f.table[idx]) if vars_ else float(f.table)
            s = strat[si]
            for o in names:
                oi = co.ops[o]
                cout, red = _child(oi, st, s, k)
                new_out[o], new_red[o] = cout, red
                label = f"{s[0]} {s[1]}" if s[1] is not None else s[0]
                strategies_out[o].append(label)
                step_strats[o] = label
                vec = _op_vectors(oi, st, k, choices, co.cls, g.tensors,
                                  strat if oi.sig == co.ops[names[0]].sig else
                                  _strategies(oi, st, k, reduction))
                slots = [t for _, t in oi.inputs] + [oi.output]
                b_o = float(sum(vec[min(si, len(vec) - 1), j, assign[co.cls[t]]]
                                for j, t in enumerate(slots)))
                op_bytes[o] += b_o
                step_bytes[o] = b_o
        new_held = {}
        axis_of = {}
        for t, h in st.held.items():
            c = co.cls[t]
            ax = choices[c][assign[c]] if c in choices else REPLICATE
            axis_of[t] = int(ax)
            new_held[t] = split_boxes(h, ax, k)
            if t in tiling_steps:
                tiling_steps[t].append(int(ax))
        if multi and not matter[step_i]:
            pair_bytes.append(None)    # one kind of link between siblings under every order
        elif multi:
            pb = np.zeros((G, k, k))
            for (tid, names, strat, arg, vars_) in meta:
                idx = tuple(assign[v] for v in vars_)
                s = strat[int(arg[idx]) if vars_ else int(arg)]
                for o in names:
                    pb += _pair_bytes(co.ops[o], st, k, s, axis_of, g.tensors)
            pair_bytes.append(pb)
        bw = _level_bandwidth(devices, workers, workers // (G * k))
        delta = total - prev_total
        steps.append(StepTrace(k, G, delta, total, bw, delta / bw if bw != float("inf") else 0.0,
                               {c: int(choices[c][assign[c]]) for c in choices},
                               step_strats, time.perf_counter() - ts, step_bytes))
        prev_total = total
        G *= k
        st = _State(new_held, new_out, new_red, G)
        if progress:
            progress(step_i + 1, len(factors))
    # which step splits along which link level: the order with the least time on the links
    order = list(range(len(factors)))
    if multi and len(factors) > 1:
        order = level_order(factors, [s_.delta_bytes for s_ in steps], pair_bytes,
                            devices.bw[:workers, :workers])
    if multi:
        secs = step_seconds(factors, order, [s_.delta_bytes for s_ in steps], pair_bytes,
                            devices.bw[:workers, :workers])
        for s_, sec in zip(steps, secs):
            s_.seconds = float(sec)
            s_.bandwidth = s_.delta_bytes / sec if sec > 0 else float("inf")
    if order != list(range(len(factors))):
        st = _permute_workers(st, device_of(factors, order))
    # per-tensor tilings and memory
    tilings = {}
    for t in live:
        grid = [1] * len(g.tensors[t].shape)
        for ax, k in zip(tiling_steps[t], factors):
            if ax >= 0:
                grid[ax] *= k
        tilings[t] = {"shape": list(g.tensors[t].shape), "grid": grid, "steps": tiling_steps[t],
                      "class": str(co.cls[t]), "kind": g.tensors[t].kind}
    mem = _peak_live_bytes(g, st, live, max(G, 1))
    # communication buffers: the largest per-worker fetch of any op at the last level
    peak_fetch = np.zeros(max(G, 1))
    if factors:
        seen: dict = {}
        for o, oi in co.ops.items():
            key = (oi.sig, st.out[o].tobytes(),
                   tuple(sorted((v, r.tobytes()) for v, r in st.red[o].items())),
                   tuple(st.held[t].tobytes() for _, t in oi.inputs))
            f = seen.get(key)
            if f is None:
                regs = oi.bound.regions(st.out[o], red={v: (r[:, 0], r[:, 1] - 1)
                                                        for v, r in st.red[o].items()})
                f = np.zeros(G)
                for n, t in oi.inputs:
                    f += (volume(regs[n]) - overlap(regs[n], st.held[t])) * \
                        g.tensors[t].itemsize
                seen[key] = f
            peak_fetch = np.maximum(peak_fetch, f)
    comm = float(prev_total)
    obj = float(sum(s.seconds for s in steps))
    return TofuPlan(algo, g.model, workers, factors, steps, comm, obj,
                      [int(x) for x in mem + peak_fetch], time.perf_counter() - t0,
                      dict(co.counts), tilings, strategies_out, op_bytes,
                      devices.name if devices is not None else "", st, co, order)


def clear_caches() -> None:
    """Forget the memoised strategies, costs and pair bytes (benchmarks time cold searches)."""
    _STRAT_CACHE.clear()
    _COST_CACHE.clear()
    _PAIR_CACHE.clear()

"""Tofu: coarsening and recursive partitioning of the forward+backward graph (EuroSys 2019, §5).

Every tensor of a training step is partitioned across all workers to cut per-worker memory;
the objective is the total communication.  Pipeline:

1. **Describe** every operator of the joint graph (:mod:`explorer.engine.tofu.tdl.aten`); interval
   analysis of the description gives its partition-n-reduce strategies (split an output
   coordinate, or split a reduction variable and sum the partial outputs).
2. **Coarsen** (Section 5.1): tensors that must share a partition are *coalesced* into one
   class (input and output of element-wise ops, the same tensor across unrolled time steps of
   a module, a weight with its update); a forward op and its backward ops form an operator
   group, a tensor class and its gradient's class a tensor group.  Ops of different time steps
   of one module are merged into one *template* that must use one strategy.
3. **Recursive partitioning** (Section 5.2): factor k = k_1·k_2·… (k_i ≥ k_i+1); step i splits
   every worker group of the previous step into k_i, choosing for every tensor class one axis
   (the same choice for all groups, "apply the partition result to G1") and for every template
   one strategy, minimising the communication of the step with a dynamic program.  The DP is
   exact variable elimination over the tensor classes with each template's cost as a factor;
   on the coarsened chain of an MLP or CNN it is the chain DP of Jia et al. (ICML 2018).

**Cost accounting.**  At level i each worker group w holds box H_w of every tensor and
computes box O_w of every op output (whole partial outputs for a split reduction) from input
regions N_w (interval analysis).  The level's communication is

    F_i = Σ_ops Σ_inputs Σ_w |N_w \\ H_w|  +  Σ_ops Σ_w (Σ_w' |O_w' ∩ H_w| − |O_w ∩ H_w|)

(elements fetched, plus partial or misplaced outputs sent to their holders) times the element
size.  Data fetched by a group at level i is split among its children for free (Tofu's "extra
input tensors"), so step i adds δ_i = F_i − F_(i−1) bytes and F_m is the plan's total: the
same number a flat evaluation of the final tiling gives, so all algorithms are comparable.
δ_i crosses the links between sibling groups of level i (bandwidth from the device graph);
``objective_s`` = Σ_i δ_i / bandwidth_i.

**Link levels** (§5.3: recursion suits hierarchical interconnects).  On a device graph with
one bandwidth (``k80-pcie-8``, ``local``) every step's bytes cross the same links.  On one with
several (``p100-cluster``: NVLink inside a node, InfiniBand between) the bytes each pair of
sibling groups exchanges are counted (:func:`_pair_bytes`), δ_i is spread over the sibling
pairs in that proportion, and a pair costs the mean of 1/bandwidth over the device pairs that
carry it.  Which step splits along which link level is free: worker digits can be given to
device digits in any order, so every order of the steps is evaluated (:func:`level_order`) and
the one with the least time on the links is kept - the step moving the most bytes lands on the
fastest links.  Baselines use the same link model and the same matching; a one-step baseline
(EqualChop, Spartan) has nothing to match and pays for its pairs across the slow links.

Baselines (Section 7.3) under the same accounting: ``allrow-greedy`` (every tensor split on
its first axis at every step, each op its best strategy), ``spartan`` (one k-way step, largest
tensor first, greedy), ``equalchop`` (the DP with one k-way step: each tensor chopped along one
axis), ``icml18`` (the recursive DP without output reduction).

Example::

    >>> from explorer.engine.core.opgraph import build_opgraph
    >>> plan = partition(build_opgraph("mlp", 64), workers=4)
    >>> plan.comm_bytes, plan.coarse["ops_before"], plan.coarse["ops_after"]
    (6986408.0, 84, 26)
"""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass, field

import numpy as np
from networkx.utils import UnionFind

from explorer.errors import InfeasiblePlan
from explorer.engine.core.geometry import (
    device_of,
    overlap,
    split as split_boxes,
    tile_owners,
    volume,
)
from explorer.engine.tofu.tdl.aten import UnsupportedOp, describe_op
from explorer.engine.search.options import TofuOptions, make
from explorer.engine.search.result import Result

__all__ = ["TofuOptions", "TofuPlan", "coarsen", "partition", "search", "factorize", "pin_steps",
           "level_order", "step_seconds"]

REPLICATE = -1                         # a class choice: not split at this step


def factorize(k: int) -> list:
    """``k = k_1·k_2·…`` with prime factors, largest first (Tofu: k_i ≥ k_i+1)."""
    if k < 1:
        raise ValueError(f"workers must be ≥ 1, got {k}")
    out, n, p = [], k, 2
    while n > 1:
        while n % p == 0:
            out.append(p)
            n //= p
        p += 1
    return sorted(out, reverse=True)


# ------------------------------------------------------------------------------------------------
# Coarsening
# ------------------------------------------------------------------------------------------------


def _classes(uf: UnionFind, items) -> dict:
    """Each item's set in ``uf``, named by its first member in ``items`` order (so names do
    not depend on the order of the unions)."""
    rep: dict = {}
    for x in items:
        rep.setdefault(uf[x], x)
    return {x: rep[uf[x]] for x in items}


@dataclass
class _OpInfo:
    name: str
    desc: object                       # Described
    bound: object                      # intervals.Bound (shared by identical signatures)
    sig: tuple
    inputs: list                       # [(input name, tensor id)]
    output: str
    template: str = ""


@dataclass
class Coarse:
    """The coarsened graph: classes, groups, templates and the counts Tofu reports."""

    ops: dict                          # op name -> _OpInfo (described ops only)
    cls: dict                          # tensor id -> class id
    class_members: dict                # class id -> [tensor ids]
    tensor_group: dict                 # class id -> tensor group id
    op_group: dict                     # op name -> op group id
    templates: dict                    # template id -> [op names]
    free_ops: list                     # sources / scalar bookkeeping (no description needed)
    counts: dict = field(default_factory=dict)


def coarsen(g, coalesce: bool = True) -> Coarse:
    """Describe every op and coarsen the graph (Tofu Section 5.1).

    Raises :class:`UnsupportedOp` naming the first op without a description.
    """
    ops: dict = {}
    free = []
    for op in g.ops.values():
        try:
            d = describe_op(op, g)
        except UnsupportedOp as exc:       # name the user's line that made the op
            where = g.where(op.name) if hasattr(g, "where") else None
            raise UnsupportedOp(f"{exc} (from {where})" if where else str(exc)) from None
        if d is None:
            free.append(op.name)
            continue
        ops[op.name] = _OpInfo(op.name, d, d.bound, d.sig, d.bindings, op.output)
    uf = UnionFind(g.tensors)
    ew: set = set()
    if coalesce:
        for name, oi in ops.items():
            if oi.desc.elementwise_hint or oi.bound.is_elementwise():
                ew.add(name)
                oshape = g.tensors[oi.output].shape
                for _, t in oi.inputs:
                    if g.tensors[t].shape == oshape:
                        uf.union(oi.output, t)
    # templates: one per op, merged across calls of a module (unrolled time steps)
    # unrolled time steps: a module *with weights* called several times (weight sharing is
    # what makes them time steps; a reused ReLU module is not a recurrence)
    calls: dict = {}
    owners = {pn.rsplit(".", 1)[0] for pn in g.params}
    for op in g.ops.values():
        if op.phase == "forward" and op.module in owners:
            calls[op.module] = max(calls.get(op.module, 0), op.call + 1)
    key_of: dict = {}
    occ: dict = {}
    templates: dict = {}
    for op in g.ops.values():
        if op.name not in ops:
            continue
        anchor = g.ops[op.fwd] if op.fwd and op.fwd in g.ops else op
        if coalesce and anchor.module and calls.get(anchor.module, 0) > 1 and \
                op.phase in ("forward", "backward"):
            base = (anchor.module, anchor.call, op.phase, op.target,
                    g.tensors[op.output].shape, op.index)
            n = occ.get(base, 0)
            occ[base] = n + 1
            key = (anchor.module, op.phase, op.target, g.tensors[op.output].shape, op.index, n)
        elif coalesce and op.target in ("select", "slice", "unbind", "narrow"):
            # x[:, t] for every time step t: one template reading x (an unrolled loop's input)
            key = ("index", op.target, tuple(op.inputs), g.tensors[op.output].shape)
        else:
            key = ("op", op.name)
        tid = key_of.setdefault(key, f"T{len(key_of)}")
        ops[op.name].template = tid
        templates.setdefault(tid, []).append(op.name)
    if coalesce:                       # time steps of one template share their output class
        for names in templates.values():
            for o in names[1:]:
                if g.tensors[ops[o].output].shape == g.tensors[ops[names[0]].output].shape:
                    uf.union(ops[names[0]].output, ops[o].output)
    cls = _classes(uf, g.tensors)
    members: dict = {}
    for t, c in cls.items():
        members.setdefault(c, []).append(t)
    # tensor groups: a class with its gradient's class
    ug = UnionFind(members)
    for t, ten in g.tensors.items():
        if ten.grad_of is not None and ten.grad_of in cls:
            ug.union(cls[ten.grad_of], cls[t])
    tgroup = _classes(ug, members)
    # op groups: forward op + its backward ops; element-wise chains; time steps
    uo = UnionFind(ops)
    first_of_call: dict = {}
    for o in ops:
        f = g.ops[o].fwd
        op = g.ops[o]
        if op.phase == "backward" and op.target in ("add", "add_") and op.inputs and all(
                g.tensors[t].producer in g.ops and g.ops[g.tensors[t].producer].phase ==
                "backward" for t in op.inputs):
            # summing a tensor's gradient contributions belongs with the gradient (§5.1),
            # not with whatever forward op autograd's sequence number points at
            p = g.tensors[op.inputs[0]].producer
            if p in ops:
                uo.union(p, o)
        elif f and f in ops:
            uo.union(f, o)
        node = g.ops[o].node
        if node:                       # outputs of one aten call (e.g. batch norm's stats)
            uo.union(first_of_call.setdefault(node, o), o)
    for names in templates.values():
        for o in names[1:]:
            uo.union(names[0], o)
    cell_first: dict = {}              # an RNN cell's ops, all time steps: one group (§5.1)
    for o in ops:
        anchor = g.ops[o].fwd if g.ops[o].fwd in g.ops else o
        m = g.ops[anchor].module
        if m in calls and calls[m] > 1:
            uo.union(cell_first.setdefault(m, o), o)
    if coalesce:
        prod = {oi.output: n for n, oi in ops.items()}
        readers: dict = {}
        for n, oi in ops.items():
            for _, t in oi.inputs:
                if g.ops[n].phase == g.ops[prod[t]].phase if t in prod else False:
                    readers.setdefault(t, set()).add(n)
        for n in ew:                  # consecutive forward (or optimizer) element-wise ops;
            for _, t in ops[n].inputs:   # backward ones follow their forward op's group
                p = prod.get(t)
                # only along a chain: merging across a fork (a residual's identity branch)
                # would put both ends of the fork in one group and make the graph cyclic
                if p is not None and p in ew and g.ops[p].phase == g.ops[n].phase and \
                        g.ops[n].phase in ("forward", "update") and len(readers.get(t, ())) == 1:
                    uo.union(p, n)
    ogroup = _classes(uo, ops)
    c = Coarse(ops, cls, members, tgroup, ogroup, templates, free)
    live = {t for oi in ops.values() for _, t in oi.inputs} | {oi.output for oi in ops.values()}
    c.counts = {
        "ops_before": len(g.ops), "tensors_before": len(g.tensors),
        "ops_after": len(set(ogroup.values())),
        "tensors_after": len({tgroup[cls[t]] for t in live}),
        "classes": len({cls[t] for t in live}), "templates": len(templates),
    }
    c.counts["linear"] = _is_linear(g, c)
    return c


def _is_linear(g, c: Coarse) -> bool:
    """Whether the coarsened op-group graph (activations only) is linear in Tofu's sense:
    homeomorphic to a chain, fork-joins allowed - checked by series-parallel reduction."""
    import networkx as nx
    # the forward graph that depends on the model input (Figure 5(c) is isomorphic to it)
    dep = set(g.inputs)
    for op in g.ops.values():
        if op.phase == "forward" and any(t in dep for t in op.inputs):
            dep.add(op.output)
    prod = {oi.output: c.op_group[n] for n, oi in c.ops.items()
            if g.ops[n].phase == "forward"}
    G = nx.MultiDiGraph()
    for n, oi in c.ops.items():
        if g.ops[n].phase != "forward" or oi.output not in dep:
            continue
        a = c.op_group[n]
        G.add_node(a)
        for _, t in oi.inputs:
            p = prod.get(t)
            if t in dep and p is not None and p != a:
                G.add_edge(p, a)
    if G.number_of_nodes() <= 2:
        return True
    D = nx.DiGraph(G)
    if not nx.is_directed_acyclic_graph(D):
        return False
    srcs = [v for v in D if D.in_degree(v) == 0]
    sinks = [v for v in D if D.out_degree(v) == 0]
    D.add_node("_s")
    D.add_node("_t")
    for v in srcs:
        D.add_edge("_s", v)
    for v in sinks:
        D.add_edge(v, "_t")
    changed = True
    while changed and D.number_of_nodes() > 2:
        changed = False
        for v in list(D.nodes):
            if v in ("_s", "_t"):
                continue
            if D.in_degree(v) == 1 and D.out_degree(v) == 1:
                (u,), (w,) = list(D.predecessors(v)), list(D.successors(v))
                D.remove_node(v)
                if u != w:
                    D.add_edge(u, w)   # parallel edges collapse in a DiGraph
                changed = True
    return D.number_of_nodes() == 2


# ------------------------------------------------------------------------------------------------
# One step of the recursion
# ------------------------------------------------------------------------------------------------


@dataclass
class _State:
    """Per level: every tensor's held box and every op's output box / reduction ranges."""

    held: dict                         # tensor id -> [G, nd, 2]
    out: dict                          # op name -> [G, nd, 2]
    red: dict                          # op name -> {var name: [G, 2] half-open}
    G: int = 1


_STRAT_CACHE: dict = {}


def _strategies(oi: _OpInfo, st: _State, k: int, reduction: bool) -> list:
    """Strategies at this step: ("split", axis) / ("reduce", var) / ("replicate", None)."""
    key = (oi.sig, k, reduction, st.out[oi.name][0].tobytes(),
           tuple(sorted((v, r[0].tobytes()) for v, r in st.red[oi.name].items())))
    hit = _STRAT_CACHE.get(key)
    if hit is None:
        if len(_STRAT_CACHE) > 100000:
            _STRAT_CACHE.clear()
        hit = _STRAT_CACHE[key] = _strategies_uncached(oi, st, k, reduction)
    return hit


def _strategies_uncached(oi: _OpInfo, st: _State, k: int, reduction: bool) -> list:
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


def _child(oi: _OpInfo, st: _State, s, k: int):
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


def _op_vectors(oi: _OpInfo, st: _State, k: int, choices: dict, cls: dict, tensors: dict,
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


class _Factor:
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
    return _Factor(vars_, best), strategies, arg, vars_


def _eliminate(factors: list, dom: dict, max_entries: int):
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
            alive[nid] = _Factor(keep, new)
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


@dataclass
class StepTrace:
    """One recursion step: k_i, the bytes it adds, the choices made."""

    k: int
    groups: int
    delta_bytes: float
    total_bytes: float
    bandwidth: float
    seconds: float
    classes: dict                      # class id -> axis (or -1)
    strategies: dict                   # op name -> "split 0" / "reduce ci" / "replicate"
    search_time_s: float = 0.0

    def to_dict(self) -> dict:
        return {"k": self.k, "groups": self.groups, "delta_bytes": self.delta_bytes,
                "total_bytes": self.total_bytes, "bandwidth_Bps": self.bandwidth,
                "seconds": self.seconds, "search_time_s": self.search_time_s}


@dataclass
class TofuPlan:
    """A Tofu plan: per-tensor tilings, per-op strategies per step, communication, memory."""

    algo: str
    model: str
    workers: int
    factors: list
    steps: list
    comm_bytes: float
    objective_s: float
    peak_memory_bytes: list
    search_time_s: float
    coarse: dict
    tilings: dict                      # tensor id -> {"grid": [...], "steps": [axis...]}
    strategies: dict                   # op name -> ["split 0", ...] per step
    op_bytes: dict                     # op name -> bytes it moves (all steps)
    preset: str = ""                   # the device graph's name
    state: object = field(default=None, repr=False)     # final _State (per-device boxes)
    coarse_graph: object = field(default=None, repr=False)
    levels: list = field(default_factory=list)  # steps, most significant device digit first
    compute_s: list | None = None      # per worker, predicted compute seconds of its shards

    #: an operator-level plan: its document carries the operator graph's digest
    operator_level = True

    def document_fields(self, g) -> dict:
        """The execution ``layout`` a sealed document adds: every tensor's box per worker,
        every operator's output box, input regions and reduction."""
        from explorer.engine.core.geometry import ExecutionLayout
        plan = execution_plan(self, g)
        return {"layout": ExecutionLayout.from_plan(
            plan, {t: g.tensors[t].shape for t in plan["held"]}).to_json()}

    def layouts(self, problem, n: int) -> dict:
        """Every partitioned tensor's tile per worker, keyed by tensor id."""
        from explorer.engine.core.geometry import TensorLayout
        og = problem.opgraph()
        held = self.state.held
        return {t: TensorLayout.from_boxes(og.tensors[t].shape, held[t]) for t in self.tilings}

    def to_dict(self, tensors: bool = True) -> dict:
        d = {"model": self.model, "algo": self.algo,
             "devices": self.workers, "preset": self.preset, "factors": self.factors,
             "levels": list(self.levels or range(len(self.factors))),
             "objective_s": self.objective_s, "comm_bytes": self.comm_bytes,
             "peak_memory_bytes": self.peak_memory_bytes,
             "search_time_s": self.search_time_s, "coarsening": self.coarse,
             "predicted_compute_s": self.compute_s,
             "steps": [s.to_dict() for s in self.steps]}
        if tensors:
            d["tensors"] = [{"name": t, **v} for t, v in self.tilings.items()]
            d["ops"] = [{"name": o, "strategies": s, "bytes": self.op_bytes.get(o, 0.0)}
                        for o, s in self.strategies.items()]
        return d


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


def _pair_bytes(oi: _OpInfo, st: _State, k: int, s, axis_of: dict, tensors: dict) -> np.ndarray:
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


def search(problem, pins=None, options: TofuOptions | None = None, progress=None) -> Result:
    """Tofu (or a Section 7.3 baseline, ``options.algo``) on the problem's operator graph,
    over all of its devices; ``pins`` fix tensors' tilings (``TENSOR=grid=2x1``)."""
    options = make(TofuOptions, options)
    g, devices = problem.opgraph(), problem.devices
    plan = partition(g, devices.n, devices, pins, options, progress)
    plan.compute_s = [float(x) for x in compute_seconds(g, execution_plan(plan, g), devices)]
    step_s = plan.objective_s + max(plan.compute_s, default=0.0)
    cap = [float(d.memory) for d in devices.devices[:devices.n]]
    fits = all(m <= c for m, c in zip(plan.peak_memory_bytes, cap))
    info = {"factors": list(plan.factors), "coarsening": dict(plan.coarse),
            "capacity_bytes": cap, "links_digest": devices.links_digest()}
    return Result(options.algo, "tofu", problem.model or g.model, g.batch,
                  dict(problem.model_args or getattr(g, "model_args", {}) or {}),
                  devices.name, devices.n, plan.objective_s, step_s,
                  plan.search_time_s, [float(x) for x in plan.peak_memory_bytes],
                  plan.comm_bytes, fits, plan, [p.text() for p in (pins or [])],
                  [st.to_dict() for st in plan.steps], info, capture=g)


def compute_seconds(g, xplan: dict, devices) -> np.ndarray:
    """Per worker, the roofline seconds of the operator shards it computes under ``xplan``
    (:func:`execution_plan`): an operator's FLOPs and bytes scaled by the share of its output
    box the worker computes, divided among the workers of a split reduction computing the
    same box (:func:`explorer.engine.core.roofline.analytic_times`; ``local`` devices take their
    calibrated FLOP/s).  Operators the plan leaves out run whole on every worker."""
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
        tw = analytic_times(flops * share[:, w], nbytes * share[:, w], targets, sub)
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
            _, assign = _eliminate(fac, dom, options.max_factor)
        for c in dom:
            assign.setdefault(c, 0)
        # the templates' strategies at the chosen classes, and the new state
        total = 0.0
        new_out, new_red = {}, {}
        for (tid, names, strat, arg, vars_), f in zip(meta, fac):
            idx = tuple(assign[v] for v in vars_)
            si = int(arg[idx]) if vars_ else int(arg)
            total += float(f.table[idx]) if vars_ else float(f.table)
            s = strat[si]
            for o in names:
                oi = co.ops[o]
                cout, red = _child(oi, st, s, k)
                new_out[o], new_red[o] = cout, red
                strategies_out[o].append(f"{s[0]} {s[1]}" if s[1] is not None else s[0])
                vec = _op_vectors(oi, st, k, choices, co.cls, g.tensors,
                                  strat if oi.sig == co.ops[names[0]].sig else
                                  _strategies(oi, st, k, reduction))
                slots = [t for _, t in oi.inputs] + [oi.output]
                op_bytes[o] += float(sum(vec[min(si, len(vec) - 1), j, assign[co.cls[t]]]
                                         for j, t in enumerate(slots)))
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
                               {}, time.perf_counter() - ts))
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


def execution_plan(res: TofuPlan, g) -> dict:
    """What every worker holds and computes under ``res`` (for the runtime).

    Returns ``{"held": {tensor: [K, nd, 2]}, "ops": {op: {"out": [K, nd, 2], "needs":
    {tensor: [K, nd, 2]}, "reducer": "sum" | "max" | None, "zero": {tensor: [K] bool}}}}``:
    ``zero[t][w]`` marks inputs that worker w must not add (terms outside a partitioned sum,
    e.g. a bias, are added by the first worker of the reduction only).
    """
    st, co = res.state, res.coarse_graph
    K = max(1, math.prod(res.factors))
    held = {t: st.held[t] for t in res.tilings}
    ops = {}
    for o, oi in co.ops.items():
        red = st.red[o]
        regs = oi.bound.regions(st.out[o], red={v: (r[:, 0], r[:, 1] - 1)
                                                for v, r in red.items()})
        reducible = {v.name: kind for v, kind in oi.bound.reducible().items()}
        split = [v for v, r in red.items()
                 if (r[:, 1] - r[:, 0] < oi.bound.extent[oi.bound.var(v)]).any()]
        reducer = None
        for v in split:
            reducer = reducible.get(v, "sum")
        zero = {}
        if reducer == "sum":
            first = np.ones(K, dtype=bool)
            for v in split:
                first &= red[v][:, 0] == 0
            inside = set()
            for acc, scope in oi.bound.accesses:
                if any(v.name in split for r in scope for v in getattr(r, "vars", ())):
                    inside.add(acc.tensor)
            for n, t in oi.inputs:
                if n not in inside:
                    zero[t] = ~first
        ops[o] = {"out": st.out[o], "needs": {t: regs[n] for n, t in oi.inputs},
                  "reducer": reducer, "zero": zero}
    return {"held": held, "ops": ops, "workers": K}


# ------------------------------------------------------------------------------------------------
# Pictures: who owns which tile (Figure 11)
# ------------------------------------------------------------------------------------------------


def strip(res: TofuPlan, g, upto: int | None = None, limit: int = 400) -> list:
    """Figure 11: for every forward op that reads a weight, in execution order, its weight
    (top row) and its activation input (bottom row) with tile owners; consecutive blocks that
    are tiled identically are folded into one with a count ("×N")."""
    views = {"t", "transpose", "permute", "view", "_unsafe_view", "reshape", "expand"}

    def param_of(t):
        # a weight read through a transpose/view (nn.Linear reads t(W)) counts as the weight
        for _ in range(4):
            ten = g.tensors[t]
            if ten.kind == "param":
                return t
            p = g.ops.get(ten.producer) if ten.producer else None
            if p is None or p.target not in views or not p.inputs:
                return None
            t = p.inputs[0]
        return None

    blocks = []
    for op in g.ops.values():
        if op.phase != "forward":
            continue
        w = [param_of(t) for t in op.inputs]
        w = [t for t in w if t is not None and len(g.tensors[t].shape) >= 2]
        a = [t for t in op.inputs if g.tensors[t].kind in ("activation", "input")
             and param_of(t) is None and len(g.tensors[t].shape) >= 2]
        if not w or not a or w[0] not in res.tilings or a[0] not in res.tilings:
            continue
        wt, at = res.tilings[w[0]], res.tilings[a[0]]
        blk = {"op": op.name, "module": op.module, "target": op.target,
               "weight": {"name": w[0], "shape": wt["shape"],
                          "owners": tile_owners(wt["steps"], res.factors, upto=upto,
                                               order=res.levels or None)},
               "activation": {"name": a[0], "shape": at["shape"],
                              "owners": tile_owners(at["steps"], res.factors, upto=upto,
                                                   order=res.levels or None)},
               "count": 1}
        key = (json_key(blk["weight"]), json_key(blk["activation"]), op.target)
        if blocks and blocks[-1]["_key"] == key:
            blocks[-1]["count"] += 1
            blocks[-1]["last"] = op.module or op.name
            continue
        blk["_key"] = key
        blocks.append(blk)
        if len(blocks) >= limit:
            break
    for b in blocks:
        b.pop("_key", None)
    return blocks


def json_key(t: dict) -> tuple:
    return (tuple(t["shape"]), tuple(tuple(r) for r in t["owners"]))

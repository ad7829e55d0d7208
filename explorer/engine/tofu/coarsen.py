"""Tofu's coarsening (EuroSys 2019, Section 5.1): tensors that must share a partition coalesced
into classes, forward and backward ops grouped, ops of unrolled time steps merged into one
template; and the factorisation of the worker count into recursion steps."""

from __future__ import annotations

from dataclasses import dataclass, field

from networkx.utils import UnionFind

from explorer.engine.tofu.tdl.aten import UnsupportedOp, describe_op


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
class OpInfo:
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

    ops: dict                          # op name -> OpInfo (described ops only)
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
        ops[op.name] = OpInfo(op.name, d, d.bound, d.sig, d.bindings, op.output)
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



"""Layer-wise parallelism search: node and edge elimination (Jia et al., ICML 2018, Alg. 1).

1. Repeatedly apply a **node elimination** (a layer ``l_j`` with one in-edge ``e1 = (l_i, l_j)``
   and one out-edge ``e2 = (l_j, l_k)`` is replaced by an edge ``e'`` whose table is equation 2,
   ``t_X(e', c_i, c_k) = min_cj t_C(l_j,c_j) + t_S(l_j,c_j) + t_X(e1,c_i,c_j) + t_X(e2,c_j,c_k)``)
   and an **edge elimination** (two edges with the same ends merge, equation 3, by summing)
   until neither applies.
2. Solve the final graph exactly.  The paper enumerates it (every CNN it tried ends with K = 2
   nodes); graphs with skip connections that do not nest (unrolled RNN state edges, dense
   blocks) leave larger residual graphs.  Those are first shrunk by removing dominated
   candidates, then solved by min-plus variable elimination along a min-degree order — exact,
   with cost ``O(K · C^(w+1))`` for elimination width ``w`` instead of ``C^K`` — or, when the
   width makes that too large (DenseNet blocks), by an exact mixed-integer program (HiGHS).
3. Undo the eliminations in reverse, giving each eliminated layer the ``c_j`` that attained the
   minimum of equation 2 for its neighbours' configurations (Theorem 1).

Every step is kept in the trace for the UI to replay.
"""

from __future__ import annotations

import heapq
import math
import time

import numpy as np

from explorer.errors import InfeasiblePlan
from explorer.engine.layerwise.costmodel import CostTables
from explorer.engine.search.options import OptCNNOptions
from explorer.engine.layerwise.result import layerwise_result
from explorer.engine.search.result import Result

#: Largest product of residual domains solved by plain enumeration (the paper's line 14).
ENUMERATION_LIMIT = 200_000
#: Largest factor (entries) variable elimination builds; wider residual graphs go to the MILP.
VE_LIMIT = 4_000_000
#: Seconds the MILP may take before the search gives up (it then says so; never a guess).
MILP_TIME_LIMIT_S = 600.0
#: Elements of the temporary one block of :func:`_min_plus` builds (fits in cache).
MIN_PLUS_BLOCK = 1 << 16
#: Sums (rows × middle × columns) from which :func:`_min_plus` first drops the middle
#: candidates a row cannot use (below it the bounds cost about what they save)
MIN_PLUS_PRUNE = 1 << 22
#: Reference candidates of that bound, and its margin (relative to the tables' magnitude)
MIN_PLUS_REFS = 8
#: Sums from which :func:`_min_plus` runs compiled (:mod:`..xkernel`; finite tables):
#: loading numba costs about a second, so only the large products of 256 devices and more
MIN_PLUS_JIT = 1 << 26
#: ... and from which once the kernels are loaded (:func:`.xkernel.preload`, as ``explorer
#: search`` does from 64 devices while the model is traced): Inception-v3 at 64 devices then
#: eliminates in 0.33 s instead of 0.56 s
MIN_PLUS_JIT_LOADED = 1 << 22
MIN_PLUS_MARGIN = 1e-9


def search(problem, pins=None, options: OptCNNOptions | None = None) -> Result:
    """Find the plan minimising equation 1 (exactly) for the problem's layer graph.

    Returns a :class:`Result` whose ``trace`` lists node eliminations, edge eliminations,
    the final-graph solve and the undo steps, and whose ``info`` reports the residual graph.
    """
    graph, cost_model = problem.layer_graph(), problem.cost_model()
    devices = cost_model.devices
    t0 = time.perf_counter()
    tables = cost_model.tables(pins)
    choice, trace, info = solve(tables)
    return layerwise_result("optcnn", graph, devices, cost_model, tables, choice, trace, info,
                            time.perf_counter() - t0, pins)


def solve(tables: CostTables):
    """Algorithm 1 over precomputed tables: ``(choice, trace, info)``.

    ``choice`` maps each layer name to the index of its optimal candidate.
    """
    names = list(tables.names)
    order = {n: i for i, n in enumerate(names)}
    # DP state: unary cost vector per remaining node, shape [C_node]; one [C_src, C_dst]
    # t_X matrix per remaining (possibly merged) edge.
    unary = {n: tables.node_cost(n).astype(np.float64) for n in names}
    edges: dict = {}
    ins: dict = {n: set() for n in names}
    outs: dict = {n: set() for n in names}
    eid = 0
    for e, m in tables.edges:
        edges[eid] = (e.src, e.dst, np.asarray(m, dtype=np.float64), f"{e.src}->{e.dst}#{e.index}")
        outs[e.src].add(eid)
        ins[e.dst].add(eid)
        eid += 1
    alive = set(names)
    trace: list = []
    undo: list = []
    # the layers whose edges changed since they were last found not eliminable, in graph
    # order (one heap per kind of elimination): each step takes the first eliminable layer
    # in graph order, as a scan of every layer would, without rescanning the graph
    node_heap = [(order[n], n) for n in names]
    edge_heap = list(node_heap)
    queued = {"node": set(names), "edge": set(names)}

    def touch(*ns):
        """Layers whose in- or out-edges changed: eliminable again, perhaps."""
        for n in ns:
            if n in alive:
                for kind, heap in (("node", node_heap), ("edge", edge_heap)):
                    if n not in queued[kind]:
                        queued[kind].add(n)
                        heapq.heappush(heap, (order[n], n))

    def pending(kind, heap):
        """The queued layers in graph order (each leaves the queue as it is looked at)."""
        while heap:
            _, n = heapq.heappop(heap)
            queued[kind].discard(n)
            if n in alive:
                yield n

    labels: dict = {}

    def label(n, c):
        key = (n, int(c))
        if key not in labels:
            labels[key] = tables.candidates[n][key[1]].label()
        return labels[key]

    def node_terms(j, c):
        """t_C, t_S, t_R of layer j's candidate c (seconds)."""
        return {"t_compute_s": float(tables.t_compute[j][c]),
                "t_sync_s": float(tables.t_sync[j][c]), "t_reduce_s": tables.reduce_time(j, c)}

    def eq2(i, j, k, a, b, ci, cj, ck):
        """Equation 2's terms for (c_i, c_j, c_k): what the trace carries for the views."""
        return dict(node_terms(j, cj), c_i=label(i, ci), c_j=label(j, cj), c_k=label(k, ck),
                    t_in_s=float(a[ci, cj]), t_out_s=float(b[cj, ck]),
                    total_s=float(a[ci, cj] + unary[j][cj] + b[cj, ck]),
                    candidates=[len(unary[i]), len(unary[j]), len(unary[k])])

    def new_edge(u, v, m, label):
        nonlocal eid
        edges[eid] = (u, v, m, label)
        outs[u].add(eid)
        ins[v].add(eid)
        eid += 1
        touch(u, v)
        return eid - 1

    def drop_edge(k):
        u, v, _, _ = edges.pop(k)
        outs[u].discard(k)
        ins[v].discard(k)
        touch(u, v)

    def node_elimination():
        for j in pending("node", node_heap):
            if len(ins[j]) == 1 and len(outs[j]) == 1:
                (k1,), (k2,) = tuple(ins[j]), tuple(outs[j])
                i, _, a, la = edges[k1]
                _, k, b, lb = edges[k2]
                if i == k:
                    continue
                m, arg = _min_plus(a + unary[j][None, :], b)      # equation 2
                drop_edge(k1)
                drop_edge(k2)
                alive.discard(j)
                ne = new_edge(i, k, m, f"{i}->{k}")
                undo.append(("node", j, i, k, compact_index(arg, len(unary[j])), a, b))
                # the numbers of the new edge's cheapest entry (the views write equation 2)
                ci, ck = np.unravel_index(int(m.argmin()), m.shape)
                trace.append({"step": len(trace), "kind": "node", "node": j, "src": i, "dst": k,
                              "removed": [la, lb], "added": edges[ne][3],
                              "remaining_nodes": len(alive), "remaining_edges": len(edges),
                              "eq2": eq2(i, j, k, a, b, ci, int(arg[ci, ck]), ck)})
                return True
        return False

    def edge_elimination():
        for u in pending("edge", edge_heap):
            seen: dict = {}
            for k in sorted(outs[u]):
                v = edges[k][1]
                if v in seen:
                    k1 = seen[v]
                    m1, m2 = edges[k1][2], edges[k][2]
                    m = m1 + m2                               # equation 3
                    l1, l2 = edges[k1][3], edges[k][3]
                    ci, cj = np.unravel_index(int(m.argmin()), m.shape)
                    drop_edge(k1)
                    drop_edge(k)
                    ne = new_edge(u, v, m, f"{u}=>{v}")
                    undo.append(("edge", u, v))
                    trace.append({"step": len(trace), "kind": "edge", "src": u, "dst": v,
                                  "removed": [l1, l2], "added": edges[ne][3],
                                  "remaining_nodes": len(alive),
                                  "remaining_edges": len(edges),
                                  "eq3": {"c_i": label(u, ci), "c_j": label(v, cj),
                                          "t_1_s": float(m1[ci, cj]),
                                          "t_2_s": float(m2[ci, cj]),
                                          "total_s": float(m[ci, cj])}})
                    return True
                seen[v] = k
        return False

    while True:
        changed = node_elimination()
        changed = edge_elimination() or changed
        if not changed:
            break

    residual = sorted(alive, key=order.get)
    res_edges = [(u, v, m) for (u, v, m, _) in edges.values()]
    sizes = [len(unary[n]) for n in residual]
    space = math.prod(sizes) if sizes else 1
    if space <= ENUMERATION_LIMIT:
        method, width = "enumeration", len(residual)
        assign = _enumerate(residual, unary, res_edges)
    else:
        # drop candidates another candidate of the same layer beats whatever its neighbours
        # choose (exact), then solve over the smaller domains and map indices back
        keep = _prune_dominated(residual, unary, res_edges)
        sub_unary = {n: unary[n][keep[n]] for n in residual}
        sub_edges = [(u, v, m[np.ix_(keep[u], keep[v])]) for u, v, m in res_edges]
        order, width, biggest = _elimination_order(residual, sub_unary, sub_edges)
        if biggest <= VE_LIMIT:
            method = "variable-elimination"
            sub = _variable_elimination(residual, sub_unary, sub_edges, order)
        else:
            # too wide for dynamic programming (dense connections): exact MILP instead
            method = "milp"
            sub = _milp(residual, sub_unary, sub_edges)
        assign = {n: int(keep[n][sub[n]]) for n in residual}
        pruned = sum(len(unary[n]) - len(keep[n]) for n in residual)
    if method == "enumeration":
        pruned = 0
    trace.append({"step": len(trace), "kind": "final", "nodes": residual,
                  "edges": [f"{u}->{v}" for u, v, _ in res_edges], "method": method,
                  "assignment": {n: int(assign[n]) for n in residual},
                  # equation 1 over the final graph: its nodes' costs plus its edges' (which
                  # carry every eliminated layer's) - the whole plan's objective
                  "eq1": {"nodes_s": float(sum(unary[n][assign[n]] for n in residual)),
                          "edges_s": float(sum(m[assign[u], assign[v]]
                                               for u, v, m in res_edges))}})

    choice = dict(assign)
    for rec in reversed(undo):
        if rec[0] == "node":
            _, j, i, k, arg, a, b = rec
            choice[j] = int(arg[choice[i], choice[k]])
            trace.append({"step": len(trace), "kind": "undo", "node": j, "src": i, "dst": k,
                          "choice": choice[j],
                          "eq2": eq2(i, j, k, a, b, choice[i], choice[j], choice[k])})
    info = {"residual_nodes": len(residual), "residual_edges": len(res_edges),
            "residual_method": method, "elimination_width": width,
            "dominated_candidates_pruned": pruned,
            "node_eliminations": sum(1 for r in undo if r[0] == "node"),
            "edge_eliminations": sum(1 for r in undo if r[0] == "edge"),
            "max_candidates": max(len(v) for v in unary.values()) if unary else 0}
    return choice, trace, info


def _min_plus(a: np.ndarray, b: np.ndarray):
    """``(m, arg)`` with ``m[i, k] = min_j a[i, j] + b[j, k]`` and the first ``j`` attaining it.

    The sums are laid out ``[i, k, j]`` (``j`` contiguous, so ``argmin`` runs along memory)
    in blocks of rows of at most :data:`MIN_PLUS_BLOCK` elements: in cache, memory ``O(C²)``
    at any candidate count, and the same sums (so the same numbers and ties) as a plain
    ``argmin`` over ``j``; the minimum is then gathered, not reduced a second time.  Large
    products first drop the ``j`` that cannot attain a row's minimum
    (:func:`_useful_middle`), which changes no sum and no tie; the largest then run compiled
    (:data:`MIN_PLUS_JIT`), the same sums in the same order per row, each row's minima kept
    as it finds them.
    """
    ci, ck = a.shape[0], b.shape[1]
    arg = np.empty((ci, ck), dtype=np.int64)
    keep = _useful_middle(a, b) if ci * a.shape[1] * ck >= MIN_PLUS_PRUNE else None
    if keep is None:
        bT = np.ascontiguousarray(b.T)
        step = max(1, MIN_PLUS_BLOCK // max(1, a.shape[1] * ck))
        for s in range(0, ci, step):
            tot = a[s:s + step, None, :] + bT[None, :, :]
            tot.argmin(axis=2, out=arg[s:s + step])
    elif _jit(ci * a.shape[1] * ck):
        # compiled, rows in parallel, over each row's own useful columns (the same sums)
        from explorer.engine.layerwise.xkernel import min_plus_kernel, split
        keep = keep[0]
        ptr = np.zeros(ci + 1, dtype=np.int64)
        np.cumsum(keep.sum(axis=1), out=ptr[1:])
        cols = np.nonzero(keep)[1].astype(np.int64)        # row-major: ascending per row
        run, a_c, b_c = min_plus_kernel(), np.ascontiguousarray(a), np.ascontiguousarray(b)
        m = np.empty((ci, ck))
        split(lambda lo, hi: run(a_c, b_c, ptr, cols, arg, m, lo, hi), ci,
              weight=np.diff(ptr))
        return m, arg
    else:
        bT = np.ascontiguousarray(b.T)
        keep, rows_all = keep
        s = 0
        while s < ci:               # blocks of rows whose useful columns, together, fit
            cols = keep[rows_all[s]].copy()
            e = s + 1
            while e < ci:
                more = cols | keep[rows_all[e]]
                if (e - s + 1) * int(more.sum()) * ck > MIN_PLUS_BLOCK:
                    break
                cols, e = more, e + 1
            rows, cols = rows_all[s:e], np.flatnonzero(cols)     # ascending: same ties
            tot = a[np.ix_(rows, cols)][:, None, :] + bT[:, cols][None]
            arg[rows] = cols[tot.argmin(axis=2)]
            s = e
    # the minimum is the sum at its argument: the same two operands added once more
    m = np.take_along_axis(a, arg, axis=1) + np.take_along_axis(b, arg, axis=0)
    return m, arg


def _jit(sums: int) -> bool:
    """Whether a product of ``sums`` sums runs compiled (:data:`MIN_PLUS_JIT`)."""
    if sums >= MIN_PLUS_JIT:
        return True
    if sums < MIN_PLUS_JIT_LOADED:
        return False
    from explorer.engine.layerwise.xkernel import min_plus_loaded
    return min_plus_loaded()


def compact_index(arg: np.ndarray, n: int) -> np.ndarray:
    """``arg`` (indices below ``n``) in the smallest signed integer type that holds them: the
    undo records keep one ``[C_i, C_k]`` table per node elimination until the end (int64
    tables were about 0.6 GiB of Inception-v3's search at 1,024 devices; int16 a quarter)."""
    for t in (np.int16, np.int32):
        if n <= np.iinfo(t).max + 1:
            return arg.astype(t)
    return arg


def _useful_middle(a: np.ndarray, b: np.ndarray):
    """``(keep [ci, cj], row order)`` for :func:`_min_plus`: ``keep[i, j]`` is False only when
    ``j`` cannot attain any minimum of row ``i``; ``None`` when the tables are not finite.

    For a reference ``t``: if ``a[i, j] − a[i, t] > max_k (b[t, k] − b[j, k])`` then
    ``a[i, j] + b[j, k] > a[i, t] + b[t, k]`` for every ``k``, so ``j`` never attains row
    ``i``'s minimum (the margin of :data:`MIN_PLUS_MARGIN` times the tables' magnitude is far
    above the rounding of these sums, so the floating-point sums compare the same way).  The
    references are the most frequent row-wise best ``j`` of ``a[i, j] + mean_k b[j, k]``;
    rows sharing one are kept together so their blocks share columns.  ``O(T · C²)`` for
    ``T`` references against the ``C³`` it saves a part of.
    """
    if not (np.isfinite(a).all() and np.isfinite(b).all()):
        return None
    guess = (a + b.mean(axis=1)[None, :]).argmin(axis=1)
    vals, cnt = np.unique(guess, return_counts=True)
    refs = vals[np.argsort(-cnt, kind="stable")[:MIN_PLUS_REFS]]
    margin = MIN_PLUS_MARGIN * (float(np.abs(a).max()) + float(np.abs(b).max()))
    keep = np.ones(a.shape, dtype=bool)
    if _jit(a.shape[0] * a.shape[1] * b.shape[1]):
        # the same test compiled, fused and on two threads (a dozen passes over [ci, cj])
        from explorer.engine.layerwise.xkernel import split, useful_kernel
        run, a_c, b_c = useful_kernel(), np.ascontiguousarray(a), np.ascontiguousarray(b)
        r = np.ascontiguousarray(refs, dtype=np.int64)
        split(lambda lo, hi: run(a_c, b_c, r, margin, keep, lo, hi), a.shape[0])
    else:
        for t in refs:
            gain = (b[t][None, :] - b).max(axis=1)             # [cj]: max_k b[t,k] − b[j,k]
            keep &= (a - a[:, t:t + 1]) <= gain[None, :] + margin
    return keep, np.lexsort((np.arange(len(guess)), guess))


def _enumerate(nodes, unary, edges):
    """Exhaustive enumeration of the final graph (Algorithm 1, line 14), vectorised."""
    if not nodes:
        return {}
    pos = {n: i for i, n in enumerate(nodes)}
    shape = [len(unary[n]) for n in nodes]
    total = np.zeros(shape)
    for n in nodes:
        sh = [1] * len(nodes)
        sh[pos[n]] = -1
        total = total + unary[n].reshape(sh)
    for u, v, m in edges:
        sh = [1] * len(nodes)
        if pos[u] < pos[v]:
            sh[pos[u]], sh[pos[v]] = m.shape
            total = total + m.reshape(sh)
        else:
            sh[pos[v]], sh[pos[u]] = m.shape[1], m.shape[0]
            total = total + m.T.reshape(sh)
    idx = np.unravel_index(int(total.argmin()), total.shape)
    return {n: int(idx[pos[n]]) for n in nodes}


def _prune_dominated(nodes, unary, edges) -> dict:
    """Candidate indices to keep per node after removing dominated candidates (exact).

    Candidate ``a`` of node ``v`` is dominated by ``b`` when switching ``a`` to ``b`` can never
    cost more, whatever the neighbours choose:
    ``u(b) − u(a) + Σ_edges max_w (M[b, w] − M[a, w]) ≤ 0``.  Removing it keeps an optimum (ties
    keep the lower index).  Repeated until nothing changes, since a neighbour's removals can
    expose new dominations.
    """
    keep = {n: np.arange(len(unary[n])) for n in nodes}
    inc: dict = {n: [] for n in nodes}
    for u, v, m in edges:
        inc[u].append((v, m))
        inc[v].append((u, m.T))
    changed = True
    while changed:
        changed = False
        for n in nodes:
            idx = keep[n]
            if len(idx) < 2:
                continue
            # D[a, b]: worst-case change of switching a -> b, shape [C, C]
            D = unary[n][idx][None, :] - unary[n][idx][:, None]
            for w, m in inc[n]:
                mm = m[np.ix_(idx, keep[w])]
                D = D + (mm[None, :, :] - mm[:, None, :]).max(axis=2)
            alive = np.ones(len(idx), dtype=bool)
            for i in range(len(idx)):
                # dominated by a still-alive other candidate (strictly, or tied and earlier)
                dom = alive & ((D[i] < 0) | ((D[i] <= 0) & (np.arange(len(idx)) < i)))
                dom[i] = False
                if dom.any():
                    alive[i] = False
            if not alive.all():
                keep[n] = idx[alive]
                changed = True
    return keep


def _elimination_order(nodes, unary, edges):
    """Greedy min-degree order (ties: smallest factor) for variable elimination.

    Returns ``(order, width, largest factor entries)`` without building any factor, so the
    caller can choose a method before paying for it.
    """
    dom = {n: len(unary[n]) for n in nodes}
    nbrs = {n: set() for n in nodes}
    for u, v, _ in edges:
        nbrs[u].add(v)
        nbrs[v].add(u)
    rank = {n: i for i, n in enumerate(nodes)}
    remaining = set(nodes)
    order, width, biggest = [], 0, 1
    while remaining:
        v = min(remaining, key=lambda x: (len(nbrs[x]), math.prod(dom[y] for y in nbrs[x]),
                                          rank[x]))
        width = max(width, len(nbrs[v]))
        biggest = max(biggest, dom[v] * math.prod(dom[y] for y in nbrs[v]))
        order.append(v)
        remaining.discard(v)
        for a in nbrs[v]:
            nbrs[a] |= nbrs[v] - {a}
            nbrs[a].discard(v)
        del nbrs[v]
    return order, width, biggest


def _variable_elimination(nodes, unary, edges, order):
    """Exact min-sum over the residual graph by bucket elimination along ``order``.

    Each factor is ``(scope tuple, ndarray)``; eliminating ``v`` adds every factor that
    mentions ``v`` over the union of their scopes and minimises ``v`` out, remembering the
    argmin table for the backward pass.
    """
    factors = [((n,), unary[n]) for n in nodes]
    for u, v, m in edges:
        factors.append(((u, v), m))
    dom = {n: len(unary[n]) for n in nodes}
    rank = {n: i for i, n in enumerate(nodes)}
    stack = []
    for v in order:
        mine = [f for f in factors if v in f[0]]
        factors = [f for f in factors if v not in f[0]]
        scope = sorted({x for s, _ in mine for x in s} - {v}, key=rank.get)
        full = [v] + scope
        # DP table over (v, scope...): shape [C_v, C_s1, C_s2, ...]
        acc = np.zeros([dom[x] for x in full])
        for s, arr in mine:
            perm = sorted(range(len(s)), key=lambda i: full.index(s[i]))
            a = np.transpose(arr, perm)
            sh = [1] * len(full)
            for i in perm:
                sh[full.index(s[i])] = dom[s[i]]
            acc = acc + a.reshape(sh)
        arg = acc.argmin(axis=0)
        factors.append((tuple(scope), acc.min(axis=0)))
        stack.append((v, scope, arg))
    assign = {}
    for v, scope, arg in reversed(stack):
        assign[v] = int(arg[tuple(assign[s] for s in scope)]) if scope else int(arg)
    return assign


def _milp(nodes, unary, edges):
    """Exact min-sum by mixed-integer programming (HiGHS via ``scipy.optimize.milp``).

    Variables: one-hot ``x[v, a]`` per layer (integer) and edge marginals ``y[e, a, b] ≥ 0``
    with ``Σ_b y[e, a, b] = x[u, a]`` and ``Σ_a y[e, a, b] = x[v, b]`` — the local-polytope
    formulation, whose LP relaxation is tight on trees and, in practice, on these cost tables
    (HiGHS closes DenseNet blocks at the root node).  Solved to a zero optimality gap; costs are
    scaled to microseconds for numerical range.
    """
    import scipy.sparse as sp
    from scipy.optimize import Bounds, LinearConstraint, milp

    scale = 1e6
    off, k = {}, 0
    for n in nodes:
        off[n] = k
        k += len(unary[n])
    n_x = k
    cost = [unary[n] * scale for n in nodes]
    rows, cols, vals = [], [], []
    r = len(nodes)
    for i, n in enumerate(nodes):                   # Σ_a x[v, a] = 1
        C = len(unary[n])
        rows.append(np.full(C, i))
        cols.append(off[n] + np.arange(C))
        vals.append(np.ones(C))
    for u, v, m in edges:
        Cu, Cv = m.shape
        idx = (k + np.arange(Cu * Cv)).reshape(Cu, Cv)
        k += Cu * Cv
        cost.append(m.ravel() * scale)
        # Σ_b y[a, b] − x[u, a] = 0  (rows r .. r+Cu-1)
        rows += [np.repeat(r + np.arange(Cu), Cv), r + np.arange(Cu)]
        cols += [idx.ravel(), off[u] + np.arange(Cu)]
        vals += [np.ones(Cu * Cv), -np.ones(Cu)]
        r += Cu
        # Σ_a y[a, b] − x[v, b] = 0  (rows r .. r+Cv-1)
        rows += [np.tile(r + np.arange(Cv), Cu), r + np.arange(Cv)]
        cols += [idx.ravel(), off[v] + np.arange(Cv)]
        vals += [np.ones(Cu * Cv), -np.ones(Cv)]
        r += Cv
    A = sp.csr_matrix((np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))),
                      shape=(r, k))
    rhs = np.zeros(r)
    rhs[: len(nodes)] = 1.0
    integrality = np.zeros(k)
    integrality[:n_x] = 1
    res = milp(np.concatenate(cost), constraints=LinearConstraint(A, rhs, rhs),
               integrality=integrality, bounds=Bounds(0, 1),
               options={"mip_rel_gap": 0.0, "time_limit": MILP_TIME_LIMIT_S})
    if res.status != 0 or res.x is None:
        raise InfeasiblePlan(
            f"the residual graph ({len(nodes)} layers, {len(edges)} edges) is too densely "
            f"connected for dynamic programming and the exact MILP did not finish "
            f"({res.message}); pin some layers or use fewer devices")
    return {n: int(np.argmax(res.x[off[n]: off[n] + len(unary[n])])) for n in nodes}


def min_plus(a: np.ndarray, b: np.ndarray):
    """``(m, arg)``: the min-plus product of equation 2 (``m[i, k] = min_j a[i, j] + b[j, k]``,
    ``arg`` the first ``j`` attaining it), for the searches built on this one
    (:mod:`.stages`)."""
    return _min_plus(a, b)

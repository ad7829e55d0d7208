"""The papers' small worked examples, computed by the engine for the Learn page.

Each function takes the engine's own objects (cost tables, an elimination trace, a TDL
description, a placement graph) and returns plain dicts with the numbers a figure of the
papers shows - nothing here is a stored result:

* :func:`elimination_steps` - OptCNN Figures 5-6: replays Algorithm 1's node and edge
  eliminations from a search trace and evaluates equation 2 (node) and equation 3 (edge) at
  the configurations the optimal plan chose for the neighbours (Theorem 1);
* :func:`dense_layer` - OptCNN Section 3 / Figure 2: one fully-connected layer under data
  parallelism (``n = k``) and under channel (model) parallelism (``c = k``): time and the bytes
  each moves (gradient synchronisation against input transfers);
* :func:`conv1d_strategies` - Tofu Figures 1-3: the partition-n-reduce strategies the interval
  analysis discovers for ``conv1d`` and the input region each worker reads;
* :func:`topo_orders` - Celeritas Figure 3: M-TOPO against DFS-TOPO on a DAG of parallel
  chains (edges cut when the order is split over devices) and Optimal Operation Fusion's
  clusters over the CPD-TOPO order;
* :func:`tofu_recursion` - Tofu Section 5.2 / Figure 6: a plan's recursion replayed step by
  step (the worker groups halved, the cut each step chose, the bytes it added);
* :func:`celeritas_pipeline` - Celeritas Figure 2: Standard Evaluation, CPD-TOPO, Optimal
  Operation Fusion and Adjusting Placement with each stage's numbers on a placed model.
"""

from __future__ import annotations

import numpy as np

from explorer.engine.core import geometry as G
from explorer.engine.layerwise.costmodel import CostTables

__all__ = ["elimination_steps", "dense_layer", "conv1d_strategies", "topo_orders",
           "tofu_recursion", "celeritas_pipeline"]


# -- OptCNN Figures 5-6: equations 2 and 3 in numbers -----------------------------------------

def elimination_steps(tables: CostTables, trace: list, choice: dict) -> dict:
    """Replay the node and edge eliminations of ``trace`` (``search.optcnn.solve``) on
    ``tables`` and evaluate each step at the optimal ``choice``.

    A node step (equation 2) lists, for every candidate ``c_j`` of the eliminated layer,
    ``t_C + t_S (+ t_R) + t_X(e1, c_i, c_j) + t_X(e2, c_j, c_k)`` with ``c_i``, ``c_k`` the
    neighbours' chosen configurations, and the minimum (the new edge's entry).  An edge step
    (equation 3) gives ``t_X(e1) + t_X(e2) = t_X(e')`` at the chosen ``(c_i, c_j)``.
    ``check_s``: equation 1 on the residual graph at ``choice`` (Theorem 1 says it equals
    the plan's objective, ``objective_s``).
    """
    names = list(tables.names)
    unary = {n: tables.node_cost(n).astype(np.float64) for n in names}
    label = {n: [c.label() for c in tables.candidates[n]] for n in names}
    edges: dict = {}          # id -> [src, dst, matrix]; ids grow like the search's
    for i, (e, m) in enumerate(tables.edges):
        edges[i] = [e.src, e.dst, np.asarray(m, dtype=np.float64)]
    nxt = len(edges)
    alive = set(names)
    steps = []

    def between(u, v):
        return [k for k in sorted(edges) if edges[k][0] == u and edges[k][1] == v]

    for rec in trace:
        kind = rec.get("kind")
        if kind == "node":
            i, j, k = rec["src"], rec["node"], rec["dst"]
            (k1,), (k2,) = between(i, j), between(j, k)
            a, b = edges.pop(k1)[2], edges.pop(k2)[2]
            tot = a[:, :, None] + unary[j][None, :, None] + b[None, :, :]
            ci, ck = choice[i], choice[k]
            col = tot[ci, :, ck]
            best = int(col.argmin())
            tc, ts = tables.t_compute[j], tables.t_sync[j]
            rows = [{"config": label[j][cj], "t_compute_s": float(tc[cj]),
                     "t_sync_s": float(ts[cj]), "t_reduce_s": tables.reduce_time(j, cj),
                     "t_x_in_s": float(a[ci, cj]), "t_x_out_s": float(b[cj, ck]),
                     "total_s": float(col[cj])} for cj in range(len(col))]
            steps.append({"step": rec["step"], "kind": "node", "node": j, "src": i, "dst": k,
                          "c_i": label[i][ci], "c_k": label[k][ck], "rows": rows,
                          "best": best, "chosen": label[j][choice[j]],
                          "value_s": float(col[best]),
                          "remaining_nodes": rec.get("remaining_nodes")})
            edges[nxt] = [i, k, tot.min(axis=1)]
            nxt += 1
            alive.discard(j)
        elif kind == "edge":
            u, v = rec["src"], rec["dst"]
            k1, k2 = between(u, v)[:2]
            a, b = edges.pop(k1)[2], edges.pop(k2)[2]
            ci, cj = choice[u], choice[v]
            steps.append({"step": rec["step"], "kind": "edge", "src": u, "dst": v,
                          "c_i": label[u][ci], "c_j": label[v][cj],
                          "t_x1_s": float(a[ci, cj]), "t_x2_s": float(b[ci, cj]),
                          "value_s": float(a[ci, cj] + b[ci, cj]),
                          "remaining_nodes": rec.get("remaining_nodes")})
            edges[nxt] = [u, v, a + b]
            nxt += 1
    residual = [n for n in names if n in alive]
    check = sum(float(unary[n][choice[n]]) for n in residual)
    check += sum(float(m[choice[u], choice[v]]) for u, v, m in edges.values())
    return {"steps": steps, "residual": residual,
            "residual_edges": [[u, v] for u, v, _ in edges.values()],
            "check_s": check, "objective_s": tables.objective(choice),
            "layers": len(names)}


# -- OptCNN Section 3 / Figure 2: one dense layer, data against channel parallelism -----------

def _index_of(cands, config: dict, k: int):
    for i, c in enumerate(cands):
        degrees = {a: d for a, d in c.as_dict().items() if d > 1}
        if degrees == config and c.devices == tuple(range(k)):
            return i
    return None


def dense_layer(graph, tables: CostTables, layer: str, k: int, dtype_bytes: int = 4) -> dict:
    """Layer ``layer`` (a ``linear``) on devices ``0..k-1`` under data parallelism (``n=k``)
    and channel parallelism (``c=k``), its producer kept data-parallel (as in Figure 2):
    per strategy ``t_C``, ``t_S``, ``t_X`` of the input and the bytes moved by gradient
    synchronisation (both directions) and by the input transfer."""
    lay = graph.layer(layer)
    if lay.op != "linear":
        raise ValueError(f"layer {layer!r} is a {lay.op}, not a fully-connected layer")
    cands = tables.candidates[layer]
    ins = [(e, m, nb) for (e, m), nb in zip(tables.edges, tables.bytes_xfer) if e.dst == layer]
    out = {"layer": layer, "devices": k, "in_shape": list(lay.in_shapes[0]),
           "out_shape": list(lay.out_shape),
           "params": int(sum(np.prod(s) for s in lay.params.values())),
           "strategies": []}
    for name, cfg in (("data parallelism", {"n": k}), ("channel (model) parallelism", {"c": k})):
        i = _index_of(cands, cfg, k)
        if i is None:
            raise ValueError(f"{layer} has no candidate {cfg} on {k} devices "
                             f"(its output {tuple(lay.out_shape)} cannot be split {k} ways)")
        sync = 0.0
        for elems, members in G.shard_summary(lay, cands[i])[2]:
            if len(members) > 1:
                sync += 2.0 * (len(members) - 1) * elems * dtype_bytes
        t_x = xfer = 0.0
        for e, m, nb in ins:
            src = _index_of(tables.candidates[e.src], {"n": k}, k)
            if src is None:
                src = 0
            t_x += float(m[src, i])
            xfer += float(nb[src, i])
        out["strategies"].append({
            "strategy": name, "config": cands[i].label(),
            "t_compute_s": float(tables.t_compute[layer][i]),
            "t_sync_s": float(tables.t_sync[layer][i]), "t_xfer_s": t_x,
            "sync_bytes": sync, "xfer_bytes": xfer, "total_bytes": sync + xfer})
    d, c = out["strategies"]
    out["reduction"] = d["total_bytes"] / c["total_bytes"] if c["total_bytes"] else None
    return out


# -- Tofu Figures 1-3: conv1d's strategies ----------------------------------------------------

def conv1d_strategies(batch: int, ci: int, co: int, length: int, window: int, k: int) -> dict:
    """Tofu's ``conv1d`` (Figure 3: ``output[b, co, x] = Σ_{ci, dx} data[b, ci, x + dx] ·
    filters[ci, co, dx]``) at these sizes, and every basic strategy for ``k`` workers the
    interval analysis finds: what each worker computes and the input regions it reads."""
    from explorer.engine.tofu.tdl.library import describe
    from explorer.engine.tofu.tdl.strategies import strategies
    for name, v in (("batch", batch), ("ci", ci), ("co", co), ("length", length),
                    ("window", window), ("workers", k)):
        if int(v) < 1:
            raise ValueError(f"{name} must be ≥ 1, got {v}")
    if window > length:
        raise ValueError(f"the window ({window}) is longer than the data ({length})")
    shapes = {"data": (batch, ci, length), "filters": (ci, co, window)}
    op = describe("conv1d")
    found = strategies(op, shapes, k=k)
    out_shape = [batch, co, length - window + 1]
    rows = []
    for s in found:
        reads = {}
        for inp, regs in s.regions.items():
            r = np.asarray(regs)
            vol = np.prod(np.maximum(r[..., 1] - r[..., 0], 0), axis=-1)
            reads[inp] = {"regions": r.tolist(), "elements": vol.tolist(),
                          "layout": s.layouts[inp]["layout"],
                          "halo": {str(a): int(h) for a, h in s.layouts[inp]["halo"].items()},
                          "symbolic": [[list(map(str, ax)) for ax in w]
                                       for w in s.symbolic.get(inp, [])]}
        rows.append({"kind": s.kind, "dim": s.dim, "axis": s.axis, "reducer": s.reducer,
                     "out_boxes": np.asarray(s.out_boxes).tolist(), "reads": reads,
                     "text": s.describe()})
    return {"shapes": {"data": list(shapes["data"]), "filters": list(shapes["filters"]),
                       "output": out_shape}, "workers": k, "strategies": rows,
            "tdl": "output[b, co, x] = Σ_{ci, dx} data[b, ci, x + dx] · filters[ci, co, dx]"}


# -- Celeritas Figure 3: M-TOPO against DFS-TOPO, and fusion ----------------------------------

def topo_orders(chains: int, length: int, devices: int, op_bytes: float = 1e6) -> dict:
    """A DAG of ``chains`` independent chains of ``length`` operators (Figure 3's shape: many
    0-indegree nodes), each order split into ``devices`` equal consecutive parts (a node goes
    to the device of its part, as a sequential placer fills devices).  Per order: the node
    order, device per node and the edges cut; and the clusters Optimal Operation Fusion
    (Algorithm 1) makes over the CPD-TOPO order when a cluster may hold ``length`` nodes'
    memory."""
    import networkx as nx

    from explorer.engine.core.devices import preset
    from explorer.engine.placement.fusion import fuse
    from explorer.engine.placement.placement_graph import from_networkx
    from explorer.engine.placement.order import graph_order

    if chains < 1 or length < 1 or devices < 1:
        raise ValueError(f"chains, length and devices must be ≥ 1, got {chains}, {length}, "
                         f"{devices}")
    if chains * length > 400:
        raise ValueError(f"{chains}×{length} operators is too many to draw: at most 400")
    g = nx.DiGraph()
    names = [f"{chr(65 + c % 26)}{c // 26 or ''}{i}" for c in range(chains)
             for i in range(length)]
    for n in names:
        g.add_node(n, time=1e-3, mem=1.0, out_bytes=op_bytes)
    for c in range(chains):
        for i in range(length - 1):
            g.add_edge(names[c * length + i], names[c * length + i + 1])
    dev = preset("v100-pcie-4", 4) if devices <= 4 else preset("p100-cluster", devices)
    dev = dev.subset(devices)
    pg = from_networkx(g, dev, capacity=[float(len(names))] * devices)
    n = pg.n
    per = -(-n // devices)
    result = {"names": list(pg.names), "src": pg.src.tolist(), "dst": pg.dst.tolist(),
              "devices": devices, "orders": {}}
    for kind, key in (("M-TOPO", "m-topo"), ("DFS-TOPO", "dfs"), ("CPD-TOPO", "cpd")):
        order = graph_order(pg, key)[0]
        where = np.empty(n, dtype=np.int64)
        where[np.asarray(order)] = np.arange(n) // per
        cut = int(np.count_nonzero(where[pg.src] != where[pg.dst]))
        result["orders"][kind] = {"order": [int(v) for v in order],
                                  "device": where.tolist(), "cut_edges": cut,
                                  "cut_bytes": float(cut * op_bytes)}
    cpd = result["orders"]["CPD-TOPO"]["order"]
    coarse, bps, s_n = fuse(pg, cpd, R=max(length, 2), M=float(length))
    result["fusion"] = {"clusters": [[int(v) for v in m] for m in coarse.members],
                        "breakpoints": [int(b) for b in bps], "cut_comm": float(s_n)}
    return result


# -- Tofu Section 5.2 / Figure 6: the recursion, step by step --------------------------------

def _span(ws) -> str:
    """Worker or device numbers as ranges (``[0, 1, 2, 5]`` -> ``"0–2, 5"``)."""
    ws = sorted(int(w) for w in ws)
    out, i = [], 0
    while i < len(ws):
        j = i
        while j + 1 < len(ws) and ws[j + 1] == ws[j] + 1:
            j += 1
        out.append(str(ws[i]) if i == j else f"{ws[i]}–{ws[j]}")
        i = j + 1
    return ", ".join(out)


def tofu_recursion(plan, graph, top: int = 3) -> dict:
    """Replay a Tofu plan's recursive partitioning (Section 5.2) from the steps its search
    recorded (:class:`~explorer.engine.tofu.plan.StepTrace`).

    Step i splits every one of the G worker groups of the previous step k_i ways with one
    choice for all groups (Tofu applies the partition of the first group to all of them):
    per step, how many tensors it splits along each axis (or replicates), how many operators
    take each kind of strategy (split an output axis, reduce a summed variable, replicate),
    the axis of each of the ``top`` largest weights and its grid so far (a matrix cut by row,
    then by column, is a 2×2 grid: Figure 6), the ``top`` operators adding the most bytes,
    and the bytes δ_i the step adds - the plan's
    communication is their sum.  ``tree`` lists the worker groups (a node per group per
    step, its parent the group it was cut from) with the devices they hold; ``graph`` is the
    operator graph the plan was made on (tensor kinds)."""
    from explorer.engine.core.geometry import device_of

    factors = [int(k) for k in plan.factors]
    workers = int(plan.workers)
    dev = device_of(factors, list(plan.levels or range(len(factors)))) if factors else \
        np.zeros(1, dtype=np.int64)
    steps, tree = [], [{"id": "all", "parent": "", "step": 0, "workers": workers,
                        "devices": _span(dev.tolist()), "bytes": 0.0}]
    weights = sorted((t for t in plan.tilings if graph.tensors[t].kind == "param"),
                     key=lambda t: (-graph.tensors[t].bytes, t))[:top]
    grids = {t: [1] * len(graph.tensors[t].shape) for t in weights}
    prev_ops: dict = {}
    size = workers
    for i, (s, k) in enumerate(zip(plan.steps, factors)):
        groups = int(s.groups)
        child = size // k
        tensors: dict = {}
        for t, tiling in plan.tilings.items():
            ax = tiling["steps"][i] if i < len(tiling["steps"]) else -1
            kind = "weights" if graph.tensors[t].kind in ("param", "update") else "data"
            key = "replicated" if ax < 0 else f"axis {ax}"
            tensors.setdefault(kind, {}).setdefault(key, 0)
            tensors[kind][key] += 1
        ops: dict = {}
        for label in s.strategies.values():
            kind = label.split(" ", 1)[0]
            ops[kind] = ops.get(kind, 0) + 1
        largest = []
        for t in weights:
            ax = plan.tilings[t]["steps"][i]
            if ax >= 0:
                grids[t][ax] *= k
            largest.append({"tensor": t, "shape": list(graph.tensors[t].shape), "axis": ax,
                            "grid": list(grids[t])})
        added = {o: b - prev_ops.get(o, 0.0) for o, b in s.op_bytes.items()}
        movers = sorted((o for o in added if added[o] > 0), key=lambda o: (-added[o], o))
        steps.append({"step": i + 1, "k": k, "groups_before": groups,
                      "groups_after": groups * k, "group_workers": child,
                      "delta_bytes": float(s.delta_bytes), "total_bytes": float(s.total_bytes),
                      "bytes_per_group": float(s.delta_bytes) / groups,
                      "seconds": float(s.seconds), "bandwidth_Bps": float(s.bandwidth),
                      "tensors": {kind: dict(sorted(v.items())) for kind, v in
                                  sorted(tensors.items())},
                      "ops": dict(sorted(ops.items())), "largest": largest,
                      "top": [{"op": o, "strategy": s.strategies.get(o, ""),
                               "bytes": float(added[o])} for o in movers[:top]]})
        for g in range(groups * k):
            ws = dev[g * child:(g + 1) * child].tolist()
            tree.append({"id": f"s{i + 1}g{g}", "parent": "all" if i == 0 else
                         f"s{i}g{g // k}", "step": i + 1, "workers": child,
                         "devices": _span(ws), "bytes": float(s.delta_bytes) / groups})
        prev_ops = dict(s.op_bytes)
        size = child
    return {"algo": plan.algo, "model": plan.model, "workers": workers, "factors": factors,
            "total_bytes": float(plan.comm_bytes), "objective_s": float(plan.objective_s),
            "coarsening": dict(plan.coarse), "steps": steps, "tree": tree}


# -- Celeritas Figure 2: the pipeline in numbers ----------------------------------------------

def celeritas_pipeline(pg, plan, refined=None) -> dict:
    """The four stages of Celeritas (Figure 2) with their numbers on one placed graph.

    ``pg`` is the :class:`~explorer.engine.placement.placement_graph.PlacementGraph` the
    placer saw (Standard Evaluation's output: every operator's time, memory and output
    size), ``plan`` the :class:`~explorer.engine.placement.result.PlacementPlan` of Celeritas
    as published (``celeritas-paper``: its ``stats`` hold the fusion's and the placer's
    numbers), ``refined`` optionally our Celeritas' plan (the same stages, then a simulated
    refinement - ours, not the paper's - whose moves and step are a fifth stage).  Stages: Standard
    Evaluation (operators, edges, the one-device time, CCR), CPD-TOPO (the order's critical
    path: the longest chain of operator times and transfers), Optimal Operation Fusion
    (clusters, the coarse graph's edges and CCR, the communication left between clusters)
    and Adjusting Placement (devices, clusters moved off their predecessor's device, the
    placer's own estimate and the simulated step)."""
    from explorer.engine.placement.order import graph_order

    st = dict(plan.stats)
    _, tl, bl = graph_order(pg, "cpd")
    one_device = float(pg.w[:, 0].sum())
    used = sorted({int(d) for d in np.asarray(plan.placement).tolist()})
    placed_s = float(plan.predicted_step_time_s)
    stages = [
        {"stage": "Standard Evaluation", "nodes": int(pg.n), "edges": int(pg.n_edges),
         "time_s": one_device, "ccr": float(pg.ccr()),
         "memory_bytes": float(pg.total_memory()), "seconds": None},
        {"stage": "CPD-TOPO", "nodes": int(pg.n), "edges": int(pg.n_edges),
         "critical_path_s": float((tl + bl).max()) if pg.n else 0.0,
         "seconds": float(st.get("order_s", 0.0))},
        {"stage": "Optimal Operation Fusion", "nodes": int(st.get("nodes_after", 0)),
         "edges": int(st.get("edges_after", 0)), "ccr": float(st.get("ccr_after", 0.0)),
         "R": int(st.get("R", 0)), "M_bytes": float(st.get("M_bytes", 0.0)),
         "cut_comm_s": float(st.get("cut_comm_s", 0.0)),
         "largest_cluster": max((len(c["ops"]) for c in plan.clusters), default=0),
         "seconds": float(st.get("fusion_s", 0.0))},
        {"stage": "Adjusting Placement", "nodes": len(used), "devices": int(pg.ndev),
         "moves": int(st.get("moves", 0)),
         "placer_step_s": float(st.get("placer_makespan_s", 0.0)),
         "step_s": placed_s, "seconds": float(st.get("place_s", 0.0))},
    ]
    last = plan
    if refined is not None and refined.stats.get("refine"):
        rs = refined.stats
        stages.append({"stage": "refinement",
                       "nodes": len({int(d) for d in np.asarray(refined.placement).tolist()}),
                       "devices": int(pg.ndev), "moves": int(rs.get("refine_moves", 0)),
                       "step_s": float(refined.predicted_step_time_s),
                       "seconds": float(rs.get("refine_s", 0.0))})
        last = refined
    return {"algo": last.algo, "model": plan.model, "devices": int(pg.ndev),
            "stages": stages, "step_s": float(last.predicted_step_time_s),
            "one_device_s": one_device, "oom": bool(last.oom),
            "search_time_s": float(last.search_time_s)}

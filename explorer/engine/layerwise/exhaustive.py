"""Exhaustive depth-first search over all strategies (OptCNN's verification baseline, Table 3).

Assigns layers in topological order, accumulating equation 1 for the edges whose both ends are
assigned, and prunes a branch once its partial cost reaches the best complete plan (all costs
are non-negative, so this stays exact).  Exponential: for small graphs and for checking the
elimination search.
"""

from __future__ import annotations

import math
import time

import numpy as np

from explorer.errors import InfeasiblePlan
from explorer.engine.layerwise.costmodel import CostTables
from explorer.engine.search.options import ExhaustiveOptions
from explorer.engine.layerwise.result import layerwise_result
from explorer.engine.search.result import Result

#: Refuse search spaces larger than this (number of complete strategies).
MAX_SPACE = 10 ** 9


def search(problem, pins=None, options: ExhaustiveOptions | None = None) -> Result:
    """The optimal plan by depth-first enumeration (slow; small graphs only)."""
    options = options or ExhaustiveOptions()
    graph, cost_model = problem.layer_graph(), problem.cost_model()
    devices = cost_model.devices
    t0 = time.perf_counter()
    tables = cost_model.tables(pins)
    choice, visited = solve(tables, options.max_space)
    from explorer.engine.layerwise.memory import CATEGORIES, plan_memory
    settings = options.settings()
    cap = min(d.memory for d in devices.devices)
    if options.memory_limit_gib is not None:
        cap = min(cap, options.memory_limit_gib * 2 ** 30)
    mem = plan_memory(cost_model, tables, choice, {n: 0 for n in tables.names}, settings,
                      devices.n)
    if float(np.max(np.sum([mem[k] for k in CATEGORIES], axis=0))) <= cap and \
            options.saving == "when-needed":
        return layerwise_result("exhaustive", graph, devices, cost_model, tables, choice, [],
                                {"visited": visited}, time.perf_counter() - t0, pins)
    from explorer.engine.layerwise import stages
    from explorer.engine.layerwise.result import memory_result
    ev = stages.Evaluator(cost_model, tables, settings, cap)
    found = solve_constrained(ev, options.max_space)
    info = {"visited": found[2], "memory": {"limit_bytes": cap, "constrained": True,
                                           "optimizer": settings.optimizer}}
    if found[0] is None:
        raise InfeasiblePlan(f"no plan fits {cap / 2**30:.3g} GiB per device (exhaustive)")
    e = stages.Evaluation(0.0, found[0], found[1], [list(tables.names)], [found[3]], [0.0],
                          [found[4]], [found[5]], found[3], found[3], True)
    return memory_result("exhaustive", problem, cost_model, tables, e, settings, ev, info,
                         time.perf_counter() - t0, pins)


def solve_constrained(evaluator, max_space: int = MAX_SPACE):
    """``(choice, option, visited, time, memory, transient)``: the fastest plan over every
    layer's candidates × memory options whose additive memory bound plus its largest
    transient fits ``evaluator.cap`` (the problem :mod:`.stages` relaxes), by depth-first
    search with time and memory bounds; ``(None, ...)`` when none fits.  Exact."""
    tables, opts, cap = evaluator.tables, evaluator.opts, evaluator.cap
    names = list(tables.names)
    space = math.prod(opts[n].t_mb.size for n in names)
    if space > max_space:
        raise InfeasiblePlan(
            f"exhaustive search would enumerate {space:.3g} strategies with memory options "
            f"(limit {max_space:.3g}); use a smaller graph")
    pos = {n: i for i, n in enumerate(names)}
    back: list = [[] for _ in names]
    for e, m in tables.edges:
        i, j = pos[e.src], pos[e.dst]
        back[max(i, j)].append((min(i, j), np.asarray(m), i < j))
    t = [(opts[n].t_mb + opts[n].t_once) for n in names]            # [C, O]
    mm = [(opts[n].static + opts[n].act) for n in names]
    tr = [opts[n].trans for n in names]
    tsuf = np.zeros(len(names) + 1)
    msuf = np.zeros(len(names) + 1)
    for i in range(len(names) - 1, -1, -1):
        tsuf[i] = tsuf[i + 1] + float(t[i].min())
        msuf[i] = msuf[i + 1] + float(mm[i].min())
    best = [math.inf, None]
    cur_c, cur_o = [0] * len(names), [0] * len(names)
    visited = [0]

    def dfs(i, acc_t, acc_m, acc_tr):
        if acc_t + tsuf[i] >= best[0] or acc_m + msuf[i] + acc_tr > cap:
            return
        if i == len(names):
            best[0], best[1] = acc_t, (list(cur_c), list(cur_o), acc_m, acc_tr)
            return
        edge = np.zeros(t[i].shape[0])
        for j, m, forward in back[i]:
            edge = edge + (m[cur_c[j], :] if forward else m[:, cur_c[j]])
        tot = t[i] + edge[:, None]
        for flat in np.argsort(tot, axis=None, kind="stable"):
            c, o = np.unravel_index(int(flat), tot.shape)
            if not np.isfinite(tot[c, o]):
                continue
            visited[0] += 1
            cur_c[i], cur_o[i] = int(c), int(o)
            dfs(i + 1, acc_t + float(tot[c, o]), acc_m + float(mm[i][c, o]),
                max(acc_tr, float(tr[i][c, o])))

    dfs(0, 0.0, 0.0, 0.0)
    if best[1] is None:
        return None, None, visited[0], math.inf, math.inf, 0.0
    cs, os_, m, trn = best[1]
    return ({n: cs[pos[n]] for n in names}, {n: os_[pos[n]] for n in names}, visited[0],
            best[0], m, trn)


def solve(tables: CostTables, max_space: int = MAX_SPACE):
    """``(choice, nodes_visited)`` minimising equation 1 by DFS with bound pruning."""
    names = list(tables.names)
    space = math.prod(len(tables.candidates[n]) for n in names)
    if space > max_space:
        raise InfeasiblePlan(
            f"exhaustive search would enumerate {space:.3g} strategies (limit {max_space:.3g}); "
            f"use --algo optcnn, which is exact and fast, or a smaller graph")
    pos = {n: i for i, n in enumerate(names)}
    # edges charged when their later endpoint (in topological order) is assigned
    back: list = [[] for _ in names]
    for e, m in tables.edges:
        i, j = pos[e.src], pos[e.dst]
        if i < j:
            back[j].append((i, np.asarray(m), True))
        else:
            back[i].append((j, np.asarray(m), False))
    unary = [tables.node_cost(n) for n in names]
    # admissible lower bound on the cost of the unassigned suffix: node minima
    suffix = np.zeros(len(names) + 1)
    for i in range(len(names) - 1, -1, -1):
        suffix[i] = suffix[i + 1] + float(unary[i].min())
    best = [math.inf, None]
    cur = [0] * len(names)
    visited = [0]

    def dfs(i, acc):
        if acc + suffix[i] >= best[0]:
            return
        if i == len(names):
            best[0], best[1] = acc, list(cur)
            return
        costs = unary[i].copy()
        for j, m, forward in back[i]:
            costs = costs + (m[cur[j], :] if forward else m[:, cur[j]])
        for c in np.argsort(costs, kind="stable"):
            visited[0] += 1
            cur[i] = int(c)
            dfs(i + 1, acc + float(costs[c]))

    dfs(0, 0.0)
    return {n: best[1][pos[n]] for n in names}, visited[0]

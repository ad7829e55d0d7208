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
    return layerwise_result("exhaustive", graph, devices, cost_model, tables, choice, [],
                            {"visited": visited}, time.perf_counter() - t0, pins)


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

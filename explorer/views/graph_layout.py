"""Positions and module-hierarchy grouping for drawing a layer graph.

Positions are computed here, on the server, with a layered DAG layout (rank = longest path
from an input, order inside a rank by the barycentre of predecessors), so the browser only
places nodes (dash-cytoscape's ``preset`` layout): in-browser ``dagre`` takes ~29 s at 3,000
nodes, preset positions ~2 s.

Large graphs are shown collapsed: layers are grouped by the module that owns them (Inception
modules, ResNet blocks, Transformer blocks), a group opens on demand, and groups that are
still too big (an LSTM's layer unrolled over 200 steps) are cut into consecutive chunks.
"""

from __future__ import annotations

import math
from collections import defaultdict

import networkx as nx

#: Graphs with more layers than this open collapsed.
COLLAPSE_THRESHOLD = 100
#: A collapsed group never holds more layers than this (bigger ones are chunked).
MAX_GROUP = 40


def layered_positions(nodes: list, edges: list, x_gap: float = 90.0,
                      y_gap: float = 70.0, pull_sources: bool = False) -> dict:
    """``{node: (x, y)}`` for a DAG drawn left to right (rank along x).

    ``pull_sources`` puts a node without inputs (a parameter, an input tensor) one rank
    before its first reader instead of at rank 0, so operator graphs with many parameters
    do not stack them all in the first column.

    >>> pos = layered_positions(["a", "b", "c"], [("a", "b"), ("a", "c")])
    >>> pos["a"][0] < pos["b"][0] == pos["c"][0]
    True
    """
    g = nx.DiGraph()
    g.add_nodes_from(nodes)
    g.add_edges_from((u, v) for u, v in edges if u != v)
    # rank = longest path from an input = the node's topological generation
    rank = {n: r for r, gen in enumerate(nx.topological_generations(g)) for n in gen}
    if pull_sources:
        for n in rank:
            succ = list(g.successors(n))
            if not any(True for _ in g.predecessors(n)) and succ:
                rank[n] = max(min(rank[s] for s in succ) - 1, 0)
        used = {r: i for i, r in enumerate(sorted(set(rank.values())))}
        rank = {n: used[r] for n, r in rank.items()}
    layers: dict = defaultdict(list)
    for n in nodes:
        layers[rank[n]].append(n)
    pos: dict = {}
    order_index = {n: i for i, n in enumerate(nodes)}
    for r in sorted(layers):
        row = layers[r]

        def bary(n):
            ys = [pos[p][1] for p in g.predecessors(n) if p in pos]
            return (sum(ys) / len(ys) if ys else 0.0, order_index[n])
        row.sort(key=bary)
        k = len(row)
        for i, n in enumerate(row):
            pos[n] = (r * x_gap, (i - (k - 1) / 2) * y_gap)
    return _wrap(pos, rank, layers, x_gap, y_gap)


def _wrap(pos, rank, layers, x_gap, y_gap, aspect=2.2):
    """Fold a long, thin drawing into rows (back and forth) so it fills a wide panel.

    A 23-layer chain drawn in one line is unreadable once fitted to the screen; folded into a
    few rows of ranks it keeps the left-to-right reading order and readable labels.
    """
    n_ranks = len(layers)
    height = max(len(v) for v in layers.values()) * y_gap
    width = n_ranks * x_gap
    rows = max(1, round(math.sqrt(width / (aspect * (height + y_gap)))))
    if rows == 1:
        return pos
    per_row = math.ceil(n_ranks / rows)
    band = height + 1.5 * y_gap
    out = {}
    for n, (x, y) in pos.items():
        r = rank[n]
        row, col = divmod(r, per_row)
        if row % 2:                       # boustrophedon: odd rows run right to left
            col = per_row - 1 - col
        out[n] = (col * x_gap, row * band + y)
    return out


def nested_positions(nodes: list, edges: list, boxes: dict, x_gap: float = 90.0,
                     y_gap: float = 70.0, pad: float = 40.0) -> dict:
    """``{node: (x, y)}`` for a DAG some of whose units are opened groups drawn as boxes.

    ``nodes`` and ``edges`` are the top-level units (an opened group is one unit, its id in
    ``boxes``); ``boxes[gid]`` is ``(members, member edges)``.  Each group is laid out on its
    own (:func:`layered_positions`), then the top level is laid out with every unit as big as
    its box (``pad`` around the members, for the box's border and title), so no box covers
    another unit or another box.  Members get their group's place plus their own offset;
    the group ids themselves get no position.  Without boxes this is
    :func:`layered_positions`.

    >>> pos = nested_positions(["a", "g", "d"], [("a", "g"), ("g", "d")],
    ...                        {"g": (["b", "c"], [("b", "c")])})
    >>> pos["a"][0] < pos["b"][0] < pos["c"][0] < pos["d"][0]
    True
    """
    inner, size = {}, {}
    for gid, (members, medges) in boxes.items():
        p = layered_positions(list(members), list(medges), x_gap, y_gap)
        xs, ys = [x for x, _ in p.values()], [y for _, y in p.values()]
        cx, cy = (min(xs) + max(xs)) / 2, (min(ys) + max(ys)) / 2
        inner[gid] = {m: (x - cx, y - cy) for m, (x, y) in p.items()}
        size[gid] = (max(xs) - min(xs) + 2 * pad, max(ys) - min(ys) + 2 * pad)
    g = nx.DiGraph()
    g.add_nodes_from(nodes)
    g.add_edges_from((u, v) for u, v in edges if u != v)
    rank = {n: r for r, gen in enumerate(nx.topological_generations(g)) for n in gen}
    layers: dict = defaultdict(list)
    for n in nodes:
        layers[rank[n]].append(n)
    order_index = {n: i for i, n in enumerate(nodes)}
    col_w = {r: max(size.get(n, (0.0, 0.0))[0] for n in row) for r, row in layers.items()}
    col_h: dict = {}
    local: dict = {}                            # y within its column, centred on 0
    for r in sorted(layers):
        row = layers[r]

        def bary(n):
            ys = [local[p] for p in g.predecessors(n) if p in local]
            return (sum(ys) / len(ys) if ys else 0.0, order_index[n])
        row.sort(key=bary)
        hs = [size.get(n, (0.0, 0.0))[1] for n in row]
        total = sum(hs) + (len(row) - 1) * y_gap
        y = -total / 2
        for n, h in zip(row, hs):
            local[n] = y + h / 2
            y += h + y_gap
        col_h[r] = total
    # fold the ranks into rows, as layered_positions does, with each row as tall as its
    # tallest column and each column as wide as its widest unit
    ranks = sorted(layers)
    width = sum(col_w[r] + x_gap for r in ranks)
    height = max(col_h.values()) + y_gap
    rows = max(1, round(math.sqrt(width / (2.2 * height))))
    per_row = math.ceil(len(ranks) / rows)
    out, top = {}, 0.0
    for start in range(0, len(ranks), per_row):
        chunk = ranks[start:start + per_row]
        if (start // per_row) % 2:              # boustrophedon: odd rows run right to left
            chunk = chunk[::-1]
        band = max(col_h[r] for r in chunk)
        x = 0.0
        for r in chunk:
            cx = x + col_w[r] / 2
            for n in layers[r]:
                y = top + band / 2 + local[n]
                if n in inner:
                    for m, (dx, dy) in inner[n].items():
                        out[m] = (cx + dx, y + dy)
                else:
                    out[n] = (cx, y)
            x += col_w[r] + x_gap
        top += band + 1.5 * y_gap
    return out


def choose_depth(modules: dict, min_units: int = 10, max_depth: int = 6) -> int:
    """The shallowest module depth that splits the graph into at least ``min_units`` groups."""
    for d in range(1, max_depth + 1):
        units = {group_key(m, d) for m in modules.values()}
        if len(units) >= min_units:
            return d
    return max_depth


def group_key(module: str, depth: int) -> str:
    parts = [p for p in (module or "").split(".") if p]
    return ".".join(parts[:depth]) if parts else ""


def units(order: list, modules: dict, expanded: set, depth: int | None = None,
          collapse: bool = True) -> tuple:
    """Map every layer to the unit drawn for it.

    Returns ``(unit_of, groups)``: ``unit_of[layer]`` is the layer itself when shown
    individually, else a group id ``"group:<module path>[#chunk]"``; ``groups[group id]`` lists
    its layers in order.  Layers of an expanded group are shown individually and keep their
    group as ``parent`` (see :func:`parents`).
    """
    if not collapse:
        return {n: n for n in order}, {}
    depth = depth or choose_depth(modules)
    members: dict = defaultdict(list)
    for n in order:
        members[group_key(modules.get(n, ""), depth) or n].append(n)
    unit_of, groups = {}, {}
    for key, lays in members.items():
        chunks = [lays[i:i + MAX_GROUP] for i in range(0, len(lays), MAX_GROUP)]
        for ci, chunk in enumerate(chunks):
            gid = f"group:{key}" + (f"#{ci + 1}" if len(chunks) > 1 else "")
            if len(chunk) == 1 or gid in expanded:
                for n in chunk:
                    unit_of[n] = n
                if len(chunk) > 1:
                    groups[gid] = chunk
            else:
                for n in chunk:
                    unit_of[n] = gid
                groups[gid] = chunk
    return unit_of, groups


def collapsed_edges(edges: list, unit_of: dict) -> dict:
    """Aggregate layer edges into unit edges: ``{(u, v): [layer edges]}`` (no self loops)."""
    out: dict = defaultdict(list)
    for e in edges:
        u, v = unit_of[e[0]], unit_of[e[1]]
        if u != v:
            out[(u, v)].append(e)
    return out

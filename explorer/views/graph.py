"""Graph panel: the computation graph (dash-cytoscape, preset positions from the server),
node details with the candidate table, pins, and the plan summary.

Nodes are coloured by their configuration, edges sized by their transfer cost; graphs with
more than ``layout.COLLAPSE_THRESHOLD`` layers open collapsed by module and expand on click.
The elimination stepper (``steps.py``) drives highlight classes through ``STORE_STEP``.
"""

from __future__ import annotations

import math
from functools import lru_cache

import dash
import dash_cytoscape as cyto
from dash import Input, Output, State, dcc, html, no_update

from explorer import service as session
from explorer.errors import ExplorerError
from explorer.views import fmt, ids
from explorer.views import glossary as G
from explorer.views import tables as T
from explorer.views import graph_layout as L
from explorer.views import palette as P
from explorer.views import state
from explorer.views.controls import context, export_controls, register_export

#: a collapsed group's pie has at most this many slices (the rest share a grey one)
PIE_SLICES = 6


STYLESHEET = [
    {"selector": "node", "style": {
        "label": "data(label)", "font-size": 9, "text-valign": "bottom", "text-halign": "center",
        "text-margin-y": 3, "width": 18, "height": 18, "text-wrap": "ellipsis",
        "text-max-width": "84px", "background-color": "data(color)",
        "border-width": 1, "border-color": "#333", "color": "#222"}},
    {"selector": "node[kind = 'group']", "style": {
        "shape": "round-rectangle", "width": 34, "height": 22, "border-width": 2,
        "border-style": "double", "font-weight": "bold", "pie-size": "100%",
        **{f"pie-{i}-background-{k}": f"data(pie{i}{k[0]})"
           for i in range(1, PIE_SLICES + 1) for k in ("color", "size")}}},
    {"selector": "node[kind = 'parent']", "style": {
        "background-color": "#f4f6fa", "background-opacity": 0.6, "border-color": "#99a",
        "border-style": "dashed", "label": "data(label)", "text-valign": "top",
        "text-halign": "center", "font-size": 11, "color": "#556"}},
    {"selector": "node[op = 'input']", "style": {"shape": "diamond"}},
    {"selector": "edge", "style": {
        "width": "data(width)", "line-color": "#9aa", "curve-style": "bezier",
        "target-arrow-shape": "triangle", "target-arrow-color": "#9aa", "arrow-scale": 0.7}},
    {"selector": ".selected", "style": {"border-width": 4, "border-color": "#000"}},
    {"selector": ".gone", "style": {"opacity": 0.15}},
    {"selector": ".current", "style": {"border-width": 6, "border-color": P.STEP_COLORS["current"],
                                       "width": 28, "height": 28, "opacity": 1,
                                       "underlay-color": P.STEP_COLORS["current"],
                                       "underlay-opacity": 0.25, "underlay-padding": 6}},
    {"selector": ".nbr", "style": {"border-width": 5, "border-color": P.STEP_COLORS["nbr"],
                                   "border-style": "dashed", "opacity": 1}},
    {"selector": ".residual", "style": {"border-width": 5,
                                        "border-color": P.STEP_COLORS["residual"],
                                        "border-style": "double", "opacity": 1}},
    {"selector": ".assigned", "style": {"border-width": 5,
                                        "border-color": P.STEP_COLORS["assigned"],
                                        "opacity": 1}},
    {"selector": ".pinned", "style": {"shape": "star", "width": 26, "height": 26,
                                      "border-width": 2, "border-color": "#111"}},
    {"selector": "edge.hot", "style": {"line-color": P.STEP_COLORS["current"],
                                       "target-arrow-color": P.STEP_COLORS["current"],
                                       "width": 5}},
    {"selector": "edge.gone", "style": {"opacity": 0.08}},
    {"selector": "edge.virtual", "style": {"line-color": P.STEP_COLORS["nbr"],
                                           "line-style": "dashed",
                                           "target-arrow-color": P.STEP_COLORS["nbr"],
                                           "width": 3,
                                           "curve-style": "unbundled-bezier",
                                           "control-point-distances": [40]}},
]


def layout():
    return html.Div(className="panel graph-panel", children=[
        html.Div(className="panel-head", children=[
            html.H3("Computation graph"),
            html.Button("Expand all", id=ids.EXPAND_ALL, className="small"),
            html.Button("Collapse all", id=ids.COLLAPSE_ALL, className="small"),
            html.Span(id=ids.GRAPH_INFO, className="muted"),
        ]),
        cyto.Cytoscape(id=ids.GRAPH, layout={"name": "preset", "fit": True, "padding": 20},
                       style={"width": "100%", "height": "520px"}, stylesheet=STYLESHEET,
                       elements=[], minZoom=0.05, maxZoom=3, wheelSensitivity=0.2),
        html.Div(id=ids.GRAPH_LEGEND, className="legend"),
    ])


#: the candidate table's columns: the plan's choice, the costs of equation 1 that depend on
#: this layer's configuration alone, and why (its cost against the chosen row's, after the
#: total and wrapped, so it is read whole without scrolling the table)
CANDIDATE_COLUMNS = [
    ("chosen", ""), ("config", "config"), ("devices", "devices"), ("memory_mib", "MiB"),
    ("total_ms", "total ms"), ("why", "why"),
    ("t_compute_ms", "t_C ms"), ("t_sync_ms", "t_S ms"),
    ("t_reduce_ms", "t_R ms"), ("t_xin_ms", "t_X in ms"), ("t_xout_ms", "t_X out ms")]
#: the candidate table's widths: narrow numbers, so the wrapped "why" fits the panel beside
#: the choice, the memory and the total (the time terms follow, to scroll to)
CANDIDATE_WIDTHS = {"chosen": 30, "config": 66, "devices": 74, "memory_mib": 58,
                    "total_ms": 80, "why": 180, "t_compute_ms": 74, "t_sync_ms": 74,
                    "t_reduce_ms": 74, "t_xin_ms": 84, "t_xout_ms": 90}
CANDIDATE_TIPS = dict(
    G.header_tips({"t_compute_ms": "t_C", "t_sync_ms": "t_S", "t_reduce_ms": "t_R",
                   "t_xin_ms": "t_X", "t_xout_ms": "t_X"}),
    config="the configuration: degrees of parallelism per dimension (n sample, c channel, "
           "h height, w width, l length, k reduction); unlisted dimensions are not split",
    devices="the devices the configuration runs on",
    total_ms="t_C + t_S + t_R + t_X in + t_X out: this layer's share of equation 1 given its "
             "neighbours' chosen configurations",
    memory_mib="peak memory on one device for this layer (MiB)",
    why="why (given the neighbours' choices): this configuration's cost against the chosen "
        "one's, and the term that makes most of the difference")


def device_ranges(devices: str) -> str:
    """``"0,1,2,3,8"`` -> ``"0–3,8"``: a device list that fits a narrow column.

    >>> device_ranges("0,1,2,3,8,9")
    '0–3,8–9'
    """
    ds = [int(d) for d in str(devices or "").split(",") if d.strip().lstrip("-").isdigit()]
    if not ds:
        return devices or ""
    out, start, prev = [], ds[0], ds[0]
    for d in ds[1:] + [None]:
        if d is not None and d == prev + 1:
            prev = d
            continue
        out.append(str(start) if start == prev else f"{start}–{prev}")
        if d is not None:
            start = prev = d
    return ",".join(out)


def why_lines(rows: list) -> list:
    """Each candidate row with a "why" line: the chosen row says it is the cheapest given its
    neighbours; another says how much more it costs and which term makes most of the
    difference (compute, sync, reduce-scatter, transfer in or out)."""
    chosen = next((r for r in rows if r.get("chosen") and r.get("total_ms") is not None), None)
    parts = (("t_compute_ms", "compute t_C"), ("t_sync_ms", "sync t_S"),
             ("t_reduce_ms", "reduce-scatter t_R"), ("t_xin_ms", "transfer in t_X"),
             ("t_xout_ms", "transfer out t_X"))
    out = []
    for r in rows:
        r = dict(r, devices=device_ranges(r.get("devices", "")))
        if chosen is None or r.get("total_ms") is None:
            r["why"] = ""
        elif r is chosen or r.get("chosen"):
            r["why"] = (f"chosen: {r['t_compute_ms']:g} + {r['t_sync_ms']:g} + "
                        f"{r['t_reduce_ms']:g} + {r['t_xin_ms']:g} in + {r['t_xout_ms']:g} out "
                        f"= {r['total_ms']:g} ms")
        else:
            diff = r["total_ms"] - chosen["total_ms"]
            worst = max(parts, key=lambda p: (r[p[0]] or 0) - (chosen[p[0]] or 0))
            d = (r[worst[0]] or 0) - (chosen[worst[0]] or 0)
            r["why"] = (f"{diff:+.4g} ms vs chosen; {worst[1]} {d:+.4g} ms" if diff > 0 else
                        f"{diff:+.4g} ms vs chosen (the search weighs the whole graph)")
        out.append(r)
    return out


def details_layout():
    return html.Div(className="panel details-panel", children=[
        html.H3("Layer"),
        html.Div(id=ids.DETAILS, className="details",
                 children=html.P("Click a layer in the graph.", className="muted")),
        T.grid(ids.CANDIDATE_TABLE, CANDIDATE_COLUMNS, height=280, row_style=T.CHOSEN_ROW,
               widths=CANDIDATE_WIDTHS, column_size=None, tooltips=CANDIDATE_TIPS,
               wrap=("why",)),             # the whole "why", never cut at the column's end
        html.Div(className="row", children=T.csv_button(ids.CANDIDATE_CSV_BUTTON,
                                                         ids.CANDIDATE_CSV)),
        html.Div(className="pin-controls", children=[
            html.H4("Pin this layer"),
            dcc.Dropdown(id=ids.PIN_CONFIG, placeholder="configuration (degrees)",
                         clearable=True),
            dcc.Input(id=ids.PIN_DEVICES, placeholder="devices, e.g. 0,1 (optional)",
                      type="text", debounce=False),
            html.Div(className="buttons", children=[
                html.Button("Pin & re-run", id=ids.PIN_BUTTON, className="primary"),
                html.Button("Unpin", id=ids.UNPIN_BUTTON),
                html.Button("Re-run", id=ids.RERUN_BUTTON),
                html.Button("Clear pins", id=ids.CLEAR_PINS),
            ]),
            html.Div(id=ids.PIN_ERROR, className="error"),
            html.Div(id=ids.PIN_LIST, className="pins"),
        ]),
    ])


#: the plan's per-layer table (and its CSV)
PLAN_COLUMNS = [("name", "layer"), ("op", "op"), ("config_label", "configuration"),
                ("devices", "devices"), ("t_compute_ms", "t_C ms"), ("t_sync_ms", "t_S ms"),
                ("t_reduce_ms", "t_R ms"), ("t_xin_ms", "t_X in ms"), ("memory", "memory")]
PLAN_TIPS = G.header_tips({"t_compute_ms": "t_C", "t_sync_ms": "t_S", "t_reduce_ms": "t_R",
                           "t_xin_ms": "t_X"})


def plan_layout():
    return html.Div(className="panel plan-panel", children=[
        context("plan"),
        html.Div(id=ids.PLAN_SUMMARY),
        html.Div(id=ids.PLAN_CHANGES),
        html.Div(className="row", children=export_controls(
            ids.PLAN_EXPORT_BUTTON, ids.PLAN_EXPORT, ids.PLAN_EXPORT_ERROR)
            + T.csv_button(ids.PLAN_CSV_BUTTON, ids.PLAN_CSV, "Download plan table (CSV)")),
        html.Div(id=ids.PLAN_EXPORT_PREVIEW, className="export-preview"),
        T.grid(ids.PLAN_TABLE, PLAN_COLUMNS, height=320, tooltips=PLAN_TIPS,
               widths={"devices": 90}),
    ])


def plan_rows(plan: dict | None) -> list:
    """One row per layer of a layer-wise plan: its configuration, devices, costs (ms; the
    transfer into it summed over its in-edges) and memory."""
    if not plan or "error" in plan or not plan.get("layers"):
        return []
    xin: dict = {}
    for e in plan.get("edges", []):
        xin[e["dst"]] = xin.get(e["dst"], 0.0) + e["t_xfer_s"]
    return [{"name": la["name"], "op": la.get("op", ""), "config_label": la["config_label"],
             "devices": device_ranges(",".join(map(str, la["devices"]))),
             "t_compute_ms": round(la.get("t_compute_s", 0.0) * 1e3, 4),
             "t_sync_ms": round(la.get("t_sync_s", 0.0) * 1e3, 4),
             "t_reduce_ms": round(la.get("t_reduce_s", 0.0) * 1e3, 4),
             "t_xin_ms": round(xin.get(la["name"], 0.0) * 1e3, 4),
             "memory": fmt.bytes_(la.get("memory_bytes"))} for la in plan["layers"]]


# --------------------------------------------------------------------------------------------
# elements
# --------------------------------------------------------------------------------------------


def config_colors(plan: dict) -> dict:
    """A colour per configuration label of ``plan`` (:func:`palette.config_colors`)."""
    return P.config_colors(la["config_label"] for la in plan.get("layers", []))


@lru_cache(maxsize=32)
def _positions(graph_key, visible: tuple, unit_edges: tuple):
    return L.layered_positions(list(visible), list(unit_edges))


@lru_cache(maxsize=32)
def _nested(graph_key, tops: tuple, top_edges: tuple, boxes: tuple):
    return L.nested_positions(list(tops), list(top_edges),
                              {gid: (list(m), list(e)) for gid, m, e in boxes})


def unit_positions(req_key, order, edges, unit_of, parent_of) -> dict:
    """Positions of the drawn units: a layered layout of the units, where each opened group
    (``parent_of``: member -> group) is laid out as one box of its own size
    (:func:`graph_layout.nested_positions`), so opened groups never cover each other."""
    visible = list(dict.fromkeys(unit_of[n] for n in order))
    if not parent_of:
        uedges = L.collapsed_edges(edges, unit_of)
        return _positions(req_key, tuple(visible), tuple(uedges))
    top_of = {n: parent_of.get(n, unit_of[n]) for n in order}
    tops = tuple(dict.fromkeys(top_of[n] for n in order))
    top_edges = tuple(L.collapsed_edges(edges, top_of))
    members: dict = {}
    for n in order:
        if n in parent_of:
            members.setdefault(parent_of[n], []).append(n)
    boxes = tuple((gid, tuple(ms), tuple((a, b) for a, b in edges
                                         if parent_of.get(a) == gid and parent_of.get(b) == gid))
                  for gid, ms in sorted(members.items()))
    try:
        return _nested(req_key, tops, top_edges, boxes)
    except Exception:  # noqa: BLE001 - a group that is not convex makes a cycle: flat layout
        uedges = L.collapsed_edges(edges, unit_of)
        return _positions(req_key, tuple(visible), tuple(uedges))


def step_classes(trace: list, step: int | None) -> tuple:
    """Per-layer highlight classes and hot edges for trace step ``step``."""
    if step is None or not trace:
        return {}, set()
    step = max(0, min(step, len(trace) - 1))
    cls: dict = {}
    hot: set = set()
    gone = set()
    for s in trace[:step]:
        if s["kind"] == "node":
            gone.add(s["node"])
        elif s["kind"] == "undo":
            gone.discard(s["node"])
    for n in gone:
        cls[n] = "gone"
    cur = trace[step]
    if cur["kind"] == "node":
        cls[cur["node"]] = "current"
        cls[cur["src"]] = "nbr"
        cls[cur["dst"]] = "nbr"
        hot |= {(cur["src"], cur["node"]), (cur["node"], cur["dst"])}
    elif cur["kind"] == "edge":
        cls[cur["src"]] = "nbr"
        cls[cur["dst"]] = "nbr"
        hot.add((cur["src"], cur["dst"]))
    elif cur["kind"] == "final":
        for n in cur["nodes"]:
            cls[n] = "residual"
    elif cur["kind"] == "undo":
        cls[cur["node"]] = "assigned"
    return cls, hot


def config_mix(labels) -> list:
    """``[(configuration, layers)]`` of a group's members, most common first."""
    counts: dict = {}
    for lab in labels:
        counts[lab] = counts.get(lab, 0) + 1
    return sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))


def mix_text(labels) -> str:
    """A collapsed group's configuration mix as text, most common first.

    >>> mix_text(["n2", "n4", "n2", "n2"])
    '3×n2, 1×n4'
    """
    return ", ".join(f"{k}×{lab}" for lab, k in config_mix(labels))


def pie_data(labels, colors: dict) -> dict:
    """The node data of a collapsed group's pie (``pie1c``/``pie1s`` … one slice per
    configuration of its members, sized by how many layers have it, in the configuration's
    colour), so a group's single colour never hides a mix of configurations."""
    mix = config_mix(labels)
    total = sum(k for _, k in mix) or 1
    head, rest = mix[:PIE_SLICES - 1], mix[PIE_SLICES - 1:]
    if len(rest) == 1:
        head, rest = mix, []
    slices = [(colors.get(lab, P.UNKNOWN), k) for lab, k in head]
    if rest:
        slices.append((P.UNKNOWN, sum(k for _, k in rest)))
    out = {}
    for i in range(PIE_SLICES):
        c, k = slices[i] if i < len(slices) else (P.UNKNOWN, 0)
        out[f"pie{i + 1}c"] = c
        out[f"pie{i + 1}s"] = round(100.0 * k / total, 3)
    return out


def clear_boxes(pos: dict, parent_of: dict, pad: float = 30.0) -> dict:
    """Positions where no node sits inside an opened group's box unless it belongs to the
    group: the box is drawn around its members, so an outsider within it would look like one
    of them.  Outsiders inside a box move below it (the layout keeps its columns).

    >>> p = clear_boxes({"a": (0, 0), "b": (100, 0), "m": (50, 0)}, {"a": "g", "b": "g"})
    >>> p["m"][1] > 0
    True
    """
    out = dict(pos)
    boxes: dict = {}
    for node, gid in parent_of.items():
        if node in out:
            boxes.setdefault(gid, []).append(out[node])
    for gid, pts in boxes.items():
        x0, x1 = min(x for x, _ in pts) - pad, max(x for x, _ in pts) + pad
        y0, y1 = min(y for _, y in pts) - pad, max(y for _, y in pts) + pad
        for node, (x, y) in list(out.items()):
            if parent_of.get(node) != gid and x0 <= x <= x1 and y0 <= y <= y1:
                out[node] = (x, y1 + pad)
    return out


def pinned_layers(plan: dict | None) -> set:
    """The layers the plan's pins name (``LAYER=…`` pins)."""
    return {p.split("=", 1)[0].strip() for p in (plan or {}).get("pins") or []
            if isinstance(p, str) and "=" in p}


def _prefix(names: list, gid: str = "") -> str:
    """What a group's layer names share: its module path as layer names spell it
    (``group:Mixed_5b`` -> ``mixed_5b_``) when most members start with it, else their
    common prefix cut back to a ``_`` or ``.`` boundary."""
    import os
    module = gid[6:].split("#")[0].lower().replace(".", "_")
    if module and sum(n.lower().startswith(module + "_") for n in names) * 2 > len(names):
        return module + "_"
    pre = os.path.commonprefix(list(names)) if len(names) > 1 else ""
    cut = max(pre.rfind("_"), pre.rfind("."))
    return pre[:cut + 1] if cut >= 0 else ""


def short_label(name: str, prefix: str) -> str:
    """A member's label inside its opened group: its name without the group's common prefix
    (the group's box shows the prefix), so labels are not cut to one identical stem.

    >>> short_label("mixed_5b_branch3x3dbl_2", "mixed_5b_")
    'branch3x3dbl_2'
    """
    if prefix and name.lower().startswith(prefix.lower()) and len(name) > len(prefix):
        return name[len(prefix):]
    return name


def build_elements(req: session.Request, plan: dict, expanded: list, step=None,
                   selected=None) -> tuple:
    """``(elements, info)`` for the cytoscape graph of ``req``'s model under ``plan``."""
    g = session.graph_for(req)
    order = g.names()
    modules = {n: g.layer(n).module for n in order}
    edges = [(e.src, e.dst) for e in g.edges()]
    collapse = len(order) > L.COLLAPSE_THRESHOLD
    unit_of, groups = L.units(order, modules, set(expanded or []), collapse=collapse)
    visible = list(dict.fromkeys(unit_of[n] for n in order))
    uedges = L.collapsed_edges(edges, unit_of)
    assign = {la["name"]: la for la in plan.get("layers", [])} if plan else {}
    colors = config_colors(plan) if plan else {}
    xcost = {}
    for e in (plan or {}).get("edges", []):
        xcost[(e["src"], e["dst"])] = xcost.get((e["src"], e["dst"]), 0.0) + e["t_xfer_s"]
    trace = (session.trace_of(plan) or []) if step is not None else []
    cls, hot = step_classes(trace, step)
    pinned = pinned_layers(plan)
    parent_of = {}
    for gid, members in groups.items():
        if all(unit_of[m] == m for m in members):
            for m in members:
                parent_of[m] = gid
    pos = unit_positions(req.graph_key(), order, edges, unit_of, parent_of)
    els = []
    for gid in sorted(set(parent_of.values())):
        # classes always given: cytoscape keeps an element's classes when an update leaves
        # them out, so an opened group would keep the ring it had as a collapsed group
        els.append({"data": {"id": gid, "label": gid[6:] + "  (click to collapse)",
                             "kind": "parent", "color": "#eee"}, "classes": ""})
    prefix = {gid: _prefix(groups[gid], gid) for gid in set(parent_of.values())}
    pos = clear_boxes(pos, parent_of)
    for u in visible:
        x, y = pos[u]
        if u.startswith("group:"):
            members = groups[u]
            labels = [assign[m]["config_label"] for m in members if m in assign]
            common = max(set(labels), key=labels.count) if labels else ""
            mixed = len(set(labels)) > 1
            data = {"id": u, "label": f"{u[6:]} ({len(members)})", "kind": "group",
                    "op": "group", "config": common + (" …" if mixed else ""),
                    "color": colors.get(common, P.UNKNOWN), "members": len(members),
                    "mix": mix_text(labels), **pie_data(labels, colors)}
            c = {cls.get(m) for m in members} - {None}
            klass = next((k for k in ("current", "nbr", "residual", "assigned") if k in c),
                         "gone" if c == {"gone"} and all(cls.get(m) == "gone" for m in members)
                         else "")
        else:
            la = assign.get(u)
            lay = g.layer(u)
            data = {"id": u, "label": short_label(u, prefix.get(parent_of.get(u), "")),
                    "name": u, "kind": "layer", "op": lay.op,
                    "config": la["config_label"] if la else "",
                    "color": colors.get(la["config_label"], P.UNKNOWN) if la else P.UNKNOWN}
            if u in parent_of:
                data["parent"] = parent_of[u]
            klass = cls.get(u, "")
        if u in pinned or (u.startswith("group:") and pinned & set(groups[u])):
            klass = (klass + " pinned").strip()
        if selected and (u == selected or (u.startswith("group:") and selected in groups[u])):
            klass = (klass + " selected").strip()
        els.append({"data": data, "position": {"x": x, "y": y}, "classes": klass})
    tmax = max(xcost.values(), default=0.0)
    for (u, v), lst in uedges.items():
        t = sum(xcost.get(e, 0.0) for e in set(lst))
        width = 1.0 + (7.0 * math.sqrt(t / tmax) if tmax > 0 else 0.0)
        hit = any(e in hot for e in lst)
        gone = any(cls.get(a) == "gone" or cls.get(b) == "gone" for a, b in lst) and not hit
        els.append({"data": {"id": f"{u}->{v}", "source": u, "target": v, "width": width,
                             "t_ms": round(t * 1e3, 4), "n": len(lst)},
                    "classes": "hot" if hit else ("gone" if gone else "")})
    # the edge the current elimination creates (equation 2's e', or equation 3's merged edge)
    if step is not None and trace:
        cur = trace[max(0, min(step, len(trace) - 1))]
        if cur["kind"] in ("node", "edge"):
            a, b = unit_of.get(cur["src"]), unit_of.get(cur["dst"])
            if a and b and a != b:
                els.append({"data": {"id": f"virtual:{a}->{b}", "source": a, "target": b,
                                     "width": 3, "t_ms": 0, "n": 0}, "classes": "virtual"})
    info = {"layers": len(order), "shown": len(visible), "collapsed": collapse,
            "groups": sorted(g_ for g_ in groups if g_ not in parent_of.values()),
            "colors": colors}
    return els, info


def legend(colors: dict, plan: dict):
    counts: dict = {}
    for la in plan.get("layers", []):
        counts[la["config_label"]] = counts.get(la["config_label"], 0) + 1
    items = [html.Span(className="legend-item", children=[
        html.Span(className="swatch", style={"backgroundColor": c}),
        f"{lab} ({counts.get(lab, 0)})"]) for lab, c in colors.items()]
    pins = pinned_layers(plan)
    mark = [html.Span(className="legend-item", children=["★ pinned layer"])] if pins else []
    return [html.Span(["colour = configuration (degrees per dimension: ", G.term("n"), " ",
                       G.term("c"), " ", G.term("h"), " ", G.term("w"), " ", G.term("l"), " ",
                       G.term("k"), "); a collapsed group's pie = its layers' configurations; "
                       "edge width = transfer time (", G.term("t_X"), "); "],
                      className="muted")] + items + mark


# --------------------------------------------------------------------------------------------
# callbacks
# --------------------------------------------------------------------------------------------


def graph_view(plan, expanded, step, selected, req_doc):
    """(elements, info line, legend) of the graph under ``plan``."""
    if not plan or "error" in plan or not plan.get("layers"):
        return [], "", ""
    try:
        req = state.request(plan.get("request") or req_doc)
        els, info = build_elements(req, plan, expanded or [], step, selected)
    except (ExplorerError, ValueError) as exc:
        return [], f"cannot draw the graph: {exc}", ""
    text = f"{plan.get('model')}: {info['layers']} layers"
    if info["collapsed"]:
        text += f", shown as {info['shown']} nodes (click a group to open it)"
    return els, text, legend(info["colors"], plan)


def tap_result(trig, node, expanded, plan, req_doc):
    """(selected layer, expanded groups) after a tap, Expand all or Collapse all."""
    expanded = list(expanded or [])
    if trig == ids.EXPAND_ALL:
        if not plan or "error" in plan:
            return no_update, no_update
        try:
            g = session.graph_for(state.request(plan.get("request") or req_doc))
        except (ExplorerError, ValueError):
            return no_update, no_update
        order = g.names()
        _, groups = L.units(order, {n: g.layer(n).module for n in order}, set())
        return no_update, sorted(groups)
    if trig == ids.COLLAPSE_ALL:
        return no_update, []
    if not node:
        return no_update, no_update
    kind = node.get("kind")
    if kind == "group":
        return no_update, sorted(set(expanded) | {node["id"]})
    if kind == "parent":
        return no_update, [e for e in expanded if e != node["id"]]
    return node["id"], no_update


def details_view(selected, plan, req_doc):
    """details, candidate rows and pin options of the selected layer."""
    if not selected or not plan or "error" in plan:
        return html.P("Click a layer in the graph.", className="muted"), [], [], None
    try:
        req = state.request(plan.get("request") or req_doc)
        info = session.layer_info(req, selected)
        rows = session.candidates(req, selected, plan)
    except (ExplorerError, ValueError) as exc:
        return html.P(str(exc), className="muted"), [], [], None
    except KeyError:
        return html.P(f"{selected} is not a layer of this model.", className="muted"), [], [], \
            None
    chosen = next((la for la in plan["layers"] if la["name"] == selected), None)
    flops = info["flops"]
    items = [
        html.Div([html.B(selected), f"  {info['op']}", html.Span(f"  ({info['module']})",
                                                                 className="muted")]),
        html.Div([f"output {info['out_shape']}  dims ",
                  *_dims(info["axes"])]),
        html.Div("inputs " + ", ".join(f"{s}" for s in info["in_shapes"]) if info["in_shapes"]
                 else "model input"),
        html.Div("params " + (", ".join(f"{k} {v}" for k, v in info["params"].items())
                              or "none")),
        html.Div(f"forward {fmt.flops(flops)}" + (
            f"; folded: {', '.join(info['folded'])}" if info["folded"] else "")),
    ]
    if chosen:
        items.append(html.Div(["plan: ", html.B(G.explain(chosen["config_label"])),
                               f" on devices {chosen['devices']}"], className="chosen"))
    options = [{"label": r["degrees"].replace(",", " "), "value": r["degrees"]}
               for r in rows if r["degrees"]]
    seen, uniq = set(), []
    for o in options:
        if o["value"] not in seen:
            seen.add(o["value"])
            uniq.append(o)
    value = chosen and ",".join(f"{k}={v}" for k, v in chosen["config"].items())
    return items, why_lines(rows), uniq, value if value in seen else None


def chosen_scroll(rows: list):
    """AG Grid ``scrollTo`` that brings the chosen row into view (``no_update`` without one)."""
    i = next((k for k, r in enumerate(rows or []) if r.get("chosen")), None)
    return no_update if i is None else {"rowIndex": i, "rowPosition": "middle"}


def _dims(axes) -> list:
    """A layer's dimension letters, each with its glossary tooltip."""
    out = []
    for i, a in enumerate(axes or []):
        out.append(G.term(str(a)))
        if i < len(axes) - 1:
            out.append(" ")
    return out or ["–"]


def summary_view(plan, pins):
    """plan summary, changes against the previous plan, pin list."""
    pin_items = [html.Span(p, className="pin") for p in (pins or [])]
    pin_view = [html.Span("pins: ", className="muted")] + pin_items if pin_items else ""
    if not plan:
        return "", "", pin_view
    if "error" in plan:
        return html.Div(plan["error"], className="error"), "", pin_view
    b = plan["breakdown"]
    pipe = plan.get("pipeline")
    if pipe:
        # a pipelined plan's step is not equation 1's sum: the stages overlap
        head = [html.Span(f"predicted step ({pipe['schedule']} pipeline) ", className="muted"),
                html.B(f"{plan['objective_s'] * 1e3:.3f} ms", id="objective-value"),
                html.Span(f"  = Σ stages' time per micro-batch + ({pipe['micro_batches']} − 1)"
                          f" × the slowest stage + once per step; bubble "
                          f"{pipe['bubble_fraction'] * 100:.0f} %", className="muted")]
        d, mb = int(pipe["devices_per_stage"]), int(pipe["micro_batch"])
        shape = (f"{pipe['stages']} stages of {d} device{'s' if d != 1 else ''}, "
                 f"{pipe['micro_batches']} micro-batches of {mb} sample{'s' if mb != 1 else ''}")
    else:
        head = [html.Span(G.explain("objective t_O (equation 1) "), className="muted"),
                html.B(f"{plan['objective_s'] * 1e3:.3f} ms", id="objective-value"),
                html.Span(G.explain(
                    f"  = compute Σ t_C {b['compute_s'] * 1e3:.3f} + transfer Σ t_X "
                    f"{b['transfer_s'] * 1e3:.3f} + sync Σ t_S {b['sync_s'] * 1e3:.3f}"
                    + (f" + reduce-scatter Σ t_R {b['reduce_s'] * 1e3:.3f}"
                       if b.get("reduce_s") else "") + " ms"),
                    className="muted")]
        shape = (f"final graph {plan['info'].get('residual_nodes', '–')} nodes "
                 f"({plan['info'].get('residual_method', '–')})")
    summary = html.Div(className="plan-summary", children=[
        html.Div(head),
        html.Div(f"{plan['model']} · batch {plan['batch']} · {plan['devices']} devices "
                 f"({plan['preset']}) · {plan['algo']} · search "
                 f"{plan['search_time_s'] * 1e3:.0f} ms · {shape} · communication "
                 f"{fmt.bytes_(plan['comm_bytes'])}/step · peak memory "
                 f"{fmt.bytes_(max(plan['memory_per_device_bytes'] or [0]))}/device"),
    ])
    prev = plan.get("previous")
    changes = ""
    if prev:
        delta = plan["objective_s"] - prev["objective_s"]
        rows = prev.get("changes", [])
        changes = html.Div(className="changes", children=[
            html.Div([f"previous plan {prev['objective_s'] * 1e3:.3f} ms → now "
                      f"{plan['objective_s'] * 1e3:.3f} ms ",
                      html.B(f"({'+' if delta >= 0 else ''}{delta * 1e3:.3f} ms)",
                             id="objective-delta")]),
            html.Div(f"{len(rows)} layer(s) changed" + (": " if rows else "")),
            html.Ul([html.Li(f"{r['layer']}: {r['before']} → {r['after']}")
                     for r in rows[:40]], id="changed-layers"),
        ])
    return summary, changes, pin_view


def register(app: dash.Dash) -> None:
    """The panel's callbacks on ``app``."""
    register_export(app, ids.PLAN_EXPORT_BUTTON, ids.PLAN_EXPORT, ids.STORE_PLAN,
                    ids.PLAN_EXPORT_ERROR, ids.PLAN_EXPORT_PREVIEW)

    @app.callback(Output(ids.GRAPH, "elements"), Output(ids.GRAPH_INFO, "children"),
                  Output(ids.GRAPH_LEGEND, "children"),
                  Input(ids.STORE_PLAN, "data"), Input(ids.STORE_EXPANDED, "data"),
                  Input(ids.STORE_STEP, "data"), Input(ids.STORE_SELECTED, "data"),
                  State(ids.STORE_REQUEST, "data"))
    def draw_graph(plan, expanded, step, selected, req_doc):
        return graph_view(plan, expanded, step, selected, req_doc)

    @app.callback(Output(ids.STORE_SELECTED, "data"),
                  Output(ids.STORE_EXPANDED, "data"),
                  Input(ids.GRAPH, "tapNodeData"), Input(ids.EXPAND_ALL, "n_clicks"),
                  Input(ids.COLLAPSE_ALL, "n_clicks"),
                  State(ids.STORE_EXPANDED, "data"), State(ids.STORE_PLAN, "data"),
                  State(ids.STORE_REQUEST, "data"), prevent_initial_call=True)
    def on_tap(node, _expand, _collapse, expanded, plan, req_doc):
        return tap_result(dash.ctx.triggered_id, node, expanded, plan, req_doc)

    @app.callback(Output(ids.DETAILS, "children"), Output(ids.CANDIDATE_TABLE, "rowData"),
                  Output(ids.PIN_CONFIG, "options"), Output(ids.PIN_CONFIG, "value"),
                  Input(ids.STORE_SELECTED, "data"), Input(ids.STORE_PLAN, "data"),
                  State(ids.STORE_REQUEST, "data"))
    def show_details(selected, plan, req_doc):
        return details_view(selected, plan, req_doc)

    # the chosen row scrolled into view once the grid holds the new rows
    @app.callback(Output(ids.CANDIDATE_TABLE, "scrollTo"),
                  Input(ids.CANDIDATE_TABLE, "rowData"))
    def scroll_chosen(rows):
        return chosen_scroll(rows)

    T.register_csv(app, ids.CANDIDATE_CSV_BUTTON, ids.CANDIDATE_CSV, ids.CANDIDATE_TABLE,
                   CANDIDATE_COLUMNS, "candidates", ids.STORE_PLAN)

    @app.callback(Output(ids.PLAN_TABLE, "rowData"), Input(ids.STORE_PLAN, "data"),
                  Input(ids.TABS, "value"))
    def show_plan_rows(plan, tab):
        # built while the Plan tab is shown (opening it builds the rows of the current plan)
        return plan_rows(plan) if tab == "plan" else no_update

    T.register_csv(app, ids.PLAN_CSV_BUTTON, ids.PLAN_CSV, ids.PLAN_TABLE, PLAN_COLUMNS,
                   "layers", ids.STORE_PLAN)

    @app.callback(Output(ids.PLAN_SUMMARY, "children"), Output(ids.PLAN_CHANGES, "children"),
                  Output(ids.PIN_LIST, "children"),
                  Input(ids.STORE_PLAN, "data"), Input(ids.STORE_REQUEST, "data"))
    def show_summary(plan, req_doc):
        return summary_view(plan, state.pins_of(req_doc))

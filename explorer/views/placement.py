"""Placement page: Celeritas device placement of the forward+backward operator graph.

Places the current request's operator graph (model, batch, model args, preset, devices) with
Celeritas or one of its baselines as a background job, then shows

* the fused graph: one node per Celeritas cluster, coloured by device (baselines, which place
  operators and not clusters, are drawn over Celeritas' clusters, a pie where a cluster's
  operators landed on several devices); a click expands that cluster into its operators, one
  cluster at a time, with positions computed on the server;
* the predicted schedule of the one simulator: a Gantt chart with a compute row and a receive
  row (transfers, coloured by sender) per device;
* peak memory per device against its capacity;
* every method on the same graph and simulator (the paper's Tables 3 and 4);
* pin-to-device: pin the selected cluster or operator, re-run; an impossible pin shows the
  engine's error and keeps the previous placement.

All numbers come from :mod:`explorer.service` (``placement``, ``placement_structure``,
``placement_compare``); nothing here places anything.  The figures are pure functions in
:mod:`explorer.views.figures.placement`.
"""

from __future__ import annotations

import math
from functools import lru_cache

import dash
import dash_cytoscape as cyto
import numpy as np
import plotly.graph_objects as go
from dash import ALL, Input, Output, State, ctx, dcc, html, no_update

from explorer import service as session
from explorer.errors import ExplorerError
from explorer.views import fmt, ids
from explorer.views import graph_layout as L
from explorer.views import tables as T
from explorer.views import palette as P
from explorer.views import state
from explorer.views.controls import (
    context,
    download_controls,
    job_controls,
    register_download,
    register_local_run,
    running,
)
from explorer.views.figures import placement as F
from explorer.views.run import history_table

MAX_PIE = 16


device_color = P.device_color


STYLESHEET = [
    {"selector": "node", "style": {
        "label": "data(label)", "font-size": 9, "text-valign": "bottom", "text-halign": "center",
        "text-margin-y": 3, "width": "data(size)", "height": "data(size)",
        "text-wrap": "ellipsis", "text-max-width": "90px", "background-color": "data(color)",
        "border-width": 1, "border-color": "#333", "color": "#222"}},
    {"selector": "node[kind = 'cluster']", "style": {
        "shape": "round-rectangle", "font-size": 10, "font-weight": "bold"}},
    {"selector": "node[kind = 'op']", "style": {"shape": "ellipse", "font-size": 8}},
    {"selector": "node.member", "style": {"border-width": 2, "border-color": "#111",
                                          "border-style": "dotted"}},
    {"selector": "node.mixed", "style": dict(
        {"pie-size": "100%", "background-color": "#fff"},
        **{f"pie-{i + 1}-background-color": device_color(i) for i in range(MAX_PIE)},
        **{f"pie-{i + 1}-background-size": f"data(p{i})" for i in range(MAX_PIE)})},
    {"selector": "node.pinned", "style": {"border-width": 4, "border-color": "#b91c1c",
                                          "border-style": "double"}},
    {"selector": "node.selected", "style": {"border-width": 5, "border-color": "#000",
                                            "border-style": "solid"}},
    {"selector": "edge", "style": {
        "width": "data(width)", "line-color": "#aab", "curve-style": "bezier",
        "target-arrow-shape": "triangle", "target-arrow-color": "#aab", "arrow-scale": 0.7}},
    {"selector": "edge.xdev", "style": {"line-color": "#d62728", "target-arrow-color": "#d62728",
                                        "line-style": "dashed"}},
]


#: the tab's introduction, in plain words (the method names are in the method list)
PLACEMENT_INTRO = (
    "Placement puts each operation of one training step (forward and backward) on one "
    "device, so a model too big for one device runs on several, one after the other. "
    "Celeritas (Xu et al.) first puts the operations in an order that keeps connected work "
    "together, then merges neighbouring operations that are cheaper to keep on one device "
    "into clusters, then gives each cluster the device where it can start earliest without "
    "running out of memory. 'celeritas' afterwards tries moving each cluster with the "
    "simulator (not in the paper; 'celeritas-paper' stops before). Other methods from the "
    "literature are judged by the same simulator.")
COMPARE_COLUMNS = [("algo", "method"), ("step_s", "predicted step s"), ("vs", "× Celeritas"),
                   ("search_s", "placement time s"), ("peak", "peak memory"),
                   ("capacity", "capacity"), ("oom", "OOM"), ("clusters", "clusters"),
                   ("moved", "moved per step"), ("note", "description")]
COMPARE_ROW_STYLE = {"styleConditions": [
    {"condition": "params.data && params.data.best === '1'",
     "style": {"backgroundColor": "#e3f1e3", "fontWeight": "bold"}},
    {"condition": "params.data && params.data.oom === 'yes'", "style": {"color": "#b91c1c"}}]}


def panel_method(req: dict | None, shown: dict | None = None) -> str:
    """The panel's method: the shown placement's, else the request's when it is a placement
    method, else Celeritas."""
    if shown and state.family(shown.get("algo")) == "placement":
        return shown["algo"]
    return state.tab_method("placement", req)


def method_of(req_doc: dict | None, algo: str | None) -> str:
    """The method Place and the pins run: the panel's (``algo``), else the request's."""
    return algo if state.family(algo) == "placement" else state.tab_method("placement", req_doc)


def layout(req: dict | None = None, shown: dict | None = None, pins: list | None = None):
    """The panel; its method dropdown shows the shown placement's method (``shown``), else
    ``req``'s when it is a placement method; ``pins`` are the shown placement's pin rows."""
    return html.Div(className="panel placement-panel", children=[
        context("placement"),
        dcc.Store(id=ids.STORE_PLACE_PINS, data=list(pins or [])),
        dcc.Store(id=ids.STORE_PLACE_SELECTED, data=None),
        dcc.Store(id=ids.STORE_PLACE_EXPANDED, data=None),
        html.P(PLACEMENT_INTRO, className="muted placement-intro"),
        html.Div(className="row", children=[
            html.Label(["Method", dcc.Dropdown(
                id=ids.PLACE_ALGO, value=panel_method(req, shown), clearable=False,
                style={"width": "300px"}, options=state.family_options("placement"))]),
            html.Label(["Memory per device (GiB)", dcc.Input(
                id=ids.PLACE_MEMORY, type="number", placeholder="device memory",
                debounce=True, style={"width": "130px"})]),
            *job_controls("Place", ids.PLACE_BUTTON, ids.PLACE_CANCEL, ids.PLACE_PROGRESS,
                          ids.PLACE_STATUS),
            *job_controls("Compare all", ids.PLACE_COMPARE_BUTTON, ids.PLACE_COMPARE_CANCEL,
                          ids.PLACE_COMPARE_PROGRESS, ids.PLACE_COMPARE_STATUS,
                          "Cancel compare", primary=False),
            *download_controls(ids.PLACE_DOWNLOAD_BUTTON, ids.PLACE_DOWNLOAD, "placement"),
        ]),
        html.Div(id=ids.PLACE_ERROR, className="error"),
        html.Div(id=ids.PLACE_SUMMARY),
        html.Div(className="placement-main", children=[
            html.Div(className="placement-graph", children=[
                html.Div(className="panel-head", children=[
                    html.H4("Fused graph (colour = device)"),
                    html.Button("Collapse", id=ids.PLACE_COLLAPSE, className="small"),
                    html.Span(id=ids.PLACE_GRAPH_INFO, className="muted"),
                ]),
                cyto.Cytoscape(id=ids.PLACE_GRAPH,
                               layout={"name": "preset", "fit": True, "padding": 20},
                               style={"width": "100%", "height": "440px"},
                               stylesheet=STYLESHEET, elements=[], minZoom=0.05, maxZoom=3,
                               wheelSensitivity=0.2),
                html.Div(id=ids.PLACE_LEGEND, className="legend"),
            ]),
            html.Div(className="placement-side", children=[
                html.H4("Selection"),
                html.Div(id=ids.PLACE_DETAILS, className="details",
                         children=html.P("Click a cluster to expand it into its operators.",
                                         className="muted")),
                html.Div(className="placement-pin", children=[
                    html.Label(["Device", dcc.Input(id=ids.PLACE_PIN_DEVICE, type="number",
                                                    placeholder="e.g. 1",
                                                    style={"width": "80px"})]),
                    html.Button("Pin & re-run", id=ids.PLACE_PIN_BUTTON, className="primary"),
                    html.Button("Clear pins", id=ids.PLACE_CLEAR_PINS),
                ]),
                html.Div(id=ids.PLACE_PIN_ERROR, className="error"),
                html.Div(id=ids.PLACE_PIN_LIST, className="pins"),
            ]),
        ]),
        html.Div(className="placement-figures", children=[
            dcc.Graph(id=ids.PLACE_GANTT, figure=F.gantt_figure(None), style={"height": "360px"}),
            dcc.Graph(id=ids.PLACE_MEMORY_FIG, figure=F.memory_figure(None),
                      style={"height": "300px"}),
        ]),
        html.H4("Run the placement on this machine"),
        html.P("Each device of the placement becomes a gloo worker process here running its "
               "operators as one compiled fx program; tensors go once to each device that "
               "reads them, and the loss and every updated parameter are compared with one "
               "device.", className="muted"),
        dcc.Store(id=ids.STORE_PLACE_RUN, data=None),
        html.Div(className="row", children=[
            html.Label(["Measured steps", dcc.Input(id=ids.PLACE_RUN_STEPS, type="number",
                                                    min=1, value=3, style={"width": "70px"})]),
            *job_controls("Run on local workers", ids.PLACE_RUN_BUTTON, ids.PLACE_RUN_CANCEL,
                          ids.PLACE_RUN_PROGRESS, ids.PLACE_RUN_STATUS, "Cancel run"),
        ]),
        html.Div(id=ids.PLACE_RUN_ERROR, className="error"),
        html.Div(id=ids.PLACE_RUN_RESULT),
        html.Div(className="run-figures", children=[
            dcc.Graph(id=ids.PLACE_RUN_FIG, figure=F.run_figure(None), style={"height": "280px"}),
            dcc.Graph(id=ids.PLACE_RUN_SERIES, figure=F.run_series(None),
                      style={"height": "280px"}),
        ]),
        html.H5("Runs of this placement"),
        history_table(ids.PLACE_RUN_HISTORY),
        html.H4("All methods on the same graph and simulator (Celeritas Tables 3 and 4)"),
        T.grid(ids.PLACE_COMPARE_TABLE, COMPARE_COLUMNS, wrap=("note",),
               widths={"algo": 150}, row_style=COMPARE_ROW_STYLE),
        html.Div(className="row", children=T.csv_button(ids.PLACE_CSV_BUTTON, ids.PLACE_CSV)),
        dcc.Graph(id=ids.PLACE_COMPARE_FIG, figure=F.compare_figure([]),
                  style={"height": "300px"}),
    ])


# --------------------------------------------------------------------------------------------
# engine calls (session only)
# --------------------------------------------------------------------------------------------


def _memory(memory):
    return None if memory in (None, "") else float(memory)


def do_place(req_doc: dict, algo: str, memory, pins: list, progress=lambda v: None) -> dict:
    """The placement doc of the current request (raises ExplorerError / ValueError)."""
    req = state.request(req_doc)
    progress(10)
    session.opgraph_for(req)
    progress(50)
    session.placement_graph_for(req, _memory(memory))
    progress(60)
    return session.placement(req, algo or "celeritas", _memory(memory), pins or [])


def pin_for(selected: dict | None, doc: dict | None, device) -> dict:
    """The UI pin for the selected cluster or operator of ``doc`` (ValueError if none)."""
    if not doc:
        raise ValueError("place the model first, then select a cluster or an operator")
    if not selected:
        raise ValueError("select a cluster or an operator in the graph first")
    if device in (None, ""):
        raise ValueError("choose a device index to pin to")
    d = int(device)
    if selected["kind"] == "cluster":
        k = int(selected["id"])
        if not 0 <= k < len(doc["clusters"]):
            raise ValueError(f"cluster {k} is not in the current placement")
        ops = list(doc["clusters"][k]["ops"])
        return {"target": f"cluster {k} ({ops[0]} …, {len(ops)} ops)", "ops": ops, "device": d}
    return {"target": selected["name"], "ops": [selected["name"]], "device": d}


def apply_pins(action, pins: list, selected, device, req_doc, algo, memory, doc,
               unpin_index: int | None = None) -> tuple:
    """Pin / unpin / clear, then re-run: ``(pins, doc, error)``.  On any error the pins and
    the placement are ``no_update`` and ``error`` holds the engine's message."""
    pins = list(pins or [])
    try:
        shown = (doc or {}).get("request")
        if action in ("pin", "unpin") and shown and not state.same_target(shown, req_doc):
            raise ValueError(f"the shown placement is of {state.describe(shown, doc['algo'])}; "
                             f"the form says {state.describe(req_doc, algo)}: press Place "
                             f"first, then pin")
        if action == "pin":
            p = pin_for(selected, doc, device)
            new = [q for q in pins if q["ops"] != p["ops"]] + [p]
        elif action == "unpin":
            new = [q for i, q in enumerate(pins) if i != unpin_index]
        elif action == "clear":
            new = []
        else:
            return no_update, no_update, ""
        fresh = do_place(req_doc, algo, memory, new)
    except (ExplorerError, ValueError) as exc:
        what = ""
        if action == "pin" and selected and device not in (None, ""):
            label = (f"cluster {selected.get('id')}" if selected.get("kind") == "cluster"
                     else selected.get("name"))
            what = f"cannot pin {label} to device {device}: "
        return no_update, no_update, what + str(exc)
    return new, fresh, ""


def honoured(pin: dict, doc: dict | None) -> bool | None:
    """Whether every operator of ``pin`` sits on its device in ``doc`` (None: not placed)."""
    if not doc:
        return None
    where = doc.get("placement", {})
    return all(where.get(op) == pin["device"] for op in pin["ops"])


# --------------------------------------------------------------------------------------------
# graph elements
# --------------------------------------------------------------------------------------------


def prepare(structure: dict) -> dict:
    """Numpy views of :func:`session.placement_structure` used to draw the graph."""
    s = dict(structure)
    s["index"] = {nm: i for i, nm in enumerate(s["names"])}
    s["src_a"] = np.asarray(s["src"], dtype=np.int64)
    s["dst_a"] = np.asarray(s["dst"], dtype=np.int64)
    s["bytes_a"] = np.asarray(s["out_bytes"], dtype=np.float64)
    return s


@lru_cache(maxsize=16)
def _structure(req_json: str, memory):
    import json
    req = state.request(json.loads(req_json))
    return prepare(session.placement_structure(req, memory))


def structure_for(doc: dict) -> dict:
    import json
    return _structure(json.dumps(doc["request"], sort_keys=True), _memory(doc.get("memory_gib")))


@lru_cache(maxsize=32)
def _positions(nodes: tuple, edges: tuple) -> dict:
    return L.layered_positions(list(nodes), list(edges), pull_sources=True)


def _cluster_of(doc: dict, s: dict) -> np.ndarray:
    cl = np.full(len(s["names"]), -1, dtype=np.int64)
    idx = s["index"]
    for k, c in enumerate(doc["clusters"]):
        cl[[idx[o] for o in c["ops"] if o in idx]] = k
    return cl


def build_elements(doc: dict, structure: dict, expanded=None, selected=None,
                   pins=None) -> tuple:
    """``(elements, info)``: clusters of ``doc`` (one of them, ``expanded``, as its
    operators) with preset positions, coloured by device; edges sized by bytes, dashed red
    where they cross devices."""
    s = structure if "index" in structure else prepare(structure)
    names = s["names"]
    ndev = len(doc["capacity_bytes"])
    clusters = doc["clusters"]
    where = doc["placement"]
    cl = _cluster_of(doc, s)
    exp = expanded if expanded is not None and 0 <= int(expanded) < len(clusters) else None
    pinned = {op for p in (pins or []) for op in p["ops"]}
    # unit of every operator: its cluster node, or itself inside the expanded cluster
    unit = np.array([f"cluster:{k}" for k in cl.tolist()], dtype=object)
    members = np.flatnonzero(cl == exp) if exp is not None else np.array([], dtype=np.int64)
    for v in members.tolist():
        unit[v] = f"op:{names[v]}"
    ok = (cl[s["src_a"]] >= 0) & (cl[s["dst_a"]] >= 0)
    us, ud = unit[s["src_a"][ok]], unit[s["dst_a"][ok]]
    eb = s["bytes_a"][s["src_a"][ok]]
    agg: dict = {}
    for a, b, nb in zip(us.tolist(), ud.tolist(), eb.tolist()):
        if a != b:
            agg[(a, b)] = agg.get((a, b), 0.0) + nb
    visible = [f"cluster:{k}" for k in range(len(clusters)) if k != exp]
    if exp is not None:
        at = [f"cluster:{k}" for k in range(exp)]
        visible = at + [f"op:{names[v]}" for v in members.tolist()] + visible[len(at):]
    pos = _positions(tuple(visible), tuple(sorted(agg)))
    times = [c.get("time_s", 0.0) for c in clusters]
    tmax = max(times, default=0.0) or 1.0
    sel_id = None
    if selected:
        sel_id = (f"cluster:{selected['id']}" if selected.get("kind") == "cluster"
                  else f"op:{selected.get('name')}")
    els = []
    for u in visible:
        x, y = pos[u]
        klass = []
        if u.startswith("cluster:"):
            k = int(u.split(":", 1)[1])
            c = clusters[k]
            shares = c.get("shares") or [0] * ndev
            data = {"id": u, "kind": "cluster", "cluster": k, "device": c["device"],
                    "label": f"C{k} ({len(c['ops'])})", "n_ops": len(c["ops"]),
                    "color": device_color(c["device"]),
                    "size": round(22 + 38 * math.sqrt(max(times[k], 0.0) / tmax), 1)}
            if sum(1 for x_ in shares if x_) > 1:
                tot = float(sum(shares))
                klass.append("mixed")
                for i in range(MAX_PIE):
                    data[f"p{i}"] = (100.0 * shares[i] / tot) if i < len(shares) else 0.0
            if pinned and pinned.issuperset(c["ops"]):
                klass.append("pinned")
        else:
            nm = u[3:]
            d = where.get(nm, 0)
            data = {"id": u, "kind": "op", "name": nm, "cluster": exp, "device": d,
                    "label": nm, "color": device_color(d), "size": 14}
            klass.append("member")
            if nm in pinned:
                klass.append("pinned")
        if u == sel_id:
            klass.append("selected")
        els.append({"data": data, "position": {"x": x, "y": y}, "classes": " ".join(klass)})
    bmax = max(agg.values(), default=0.0) or 1.0
    dev_of = {e["data"]["id"]: e["data"]["device"] for e in els}
    for (a, b), nb in agg.items():
        cross = dev_of.get(a) != dev_of.get(b)
        els.append({"data": {"id": f"{a}->{b}", "source": a, "target": b,
                             "width": round(1 + 4 * math.sqrt(nb / bmax), 2),
                             "mb": round(nb / 2 ** 20, 3)},
                    "classes": "xdev" if cross else ""})
    info = {"clusters": len(clusters), "ops": len(names), "shown": len(visible),
            "expanded": exp, "edges": len(agg)}
    return els, info


def legend(ndev: int):
    return [html.Span([html.Span(className="swatch", style={"background": device_color(d)}),
                       f"device {d}"], className="legend-item") for d in range(ndev)]


# --------------------------------------------------------------------------------------------
# views (tables and text; the figures are drawn by explorer.views.figures.placement)
# --------------------------------------------------------------------------------------------


def compare_rows(rows: list) -> list:
    """Table rows: seconds, memory and bytes moved (in their units), OOM, and step time
    relative to Celeritas."""
    ref = next((r["step_time_s"] for r in rows if r["algo"] == "celeritas"
                and "error" not in r), None)
    ok = [r["step_time_s"] for r in rows if "error" not in r and not r["oom"]]
    best = min(ok) if ok else None
    out = []
    for r in rows:
        if "error" in r:
            out.append({"algo": r["algo"], "note": r["error"], "oom": "", "best": "0"})
            continue
        out.append({"algo": r["algo"], "step_s": round(r["step_time_s"], 4),
                    "vs": round(r["step_time_s"] / ref, 3) if ref else None,
                    "search_s": round(r["search_time_s"], 4),
                    "peak": fmt.bytes_(r["peak_bytes"]),
                    "capacity": fmt.bytes_(r["capacity_bytes"]),
                    "oom": "yes" if r["oom"] else "no", "clusters": r["clusters"] or None,
                    "moved": fmt.bytes_(r["comm_bytes"]), "note": r["description"],
                    "best": "1" if best is not None and not r["oom"]
                    and r["step_time_s"] <= best * (1 + 1e-9) else "0"})
    return out


def memory_note(doc: dict) -> str:
    """The memory verdict, consistent with the memory chart: OOM when the simulated peak of a
    device is over its capacity (the one verdict); otherwise, when the placer went beyond its
    own budget (``best_effort``), a note that the simulated peaks still fit."""
    over = [d for d, (p, c) in enumerate(zip(doc["peak_memory_bytes"], doc["capacity_bytes"]))
            if p > c * (1 + 1e-9)]
    if over:
        return (f" OOM: the simulated peak exceeds the capacity of device"
                f"{'s' if len(over) > 1 else ''} {', '.join(map(str, over))}")
    n = len(doc.get("best_effort") or [])
    if not n:
        return ""
    return (f" fits: {n} operation{'s' if n != 1 else ''} placed beyond the placer's own "
            f"memory budget (a heuristic), but the simulated peaks below fit")


def summary_view(doc: dict):
    peak = max(doc["peak_memory_bytes"], default=0.0)
    cap = min(doc["capacity_bytes"], default=0.0)
    st = doc.get("stats", {})
    fused = (f"{st['nodes_before']} operators fused into {st['nodes_after']} clusters "
             f"(CCR {st['ccr_before']:.2f} → {st['ccr_after']:.2f})"
             if "nodes_after" in st else
             f"{doc['ops']} operators (drawn over Celeritas' {len(doc['clusters'])} clusters)")
    if st.get("refine"):
        fused += (f"; simulated refinement {fmt.seconds(st['step_before_refine_s'])} → "
                  f"{fmt.seconds(doc['predicted_step_time_s'])} ({st['refine_moves']} moves, "
                  f"{st['refine_evals']} simulations"
                  + (", budget spent" if st.get("refine_exhausted") else "") + ")")
    pins = session.placement_pin_rows(doc)
    kept = sum(1 for p in pins if honoured(p, doc))
    return html.Div([
        html.Div([html.B(f"{doc['algo']}: "),
                  f"predicted step {fmt.seconds(doc['predicted_step_time_s'])}, placed in "
                  f"{fmt.seconds(doc['search_time_s'])}, peak {fmt.of(peak, cap)} per "
                  f"device ({fmt.percent(peak, cap)}), {fmt.bytes_(doc['comm_bytes'])} moved",
                  html.Span(memory_note(doc), className="error")], id="place-headline"),
        html.Div(f"{doc['model']} batch {doc['batch']} on {len(doc['capacity_bytes'])}× "
                 f"{doc.get('preset') or doc['devices']}; {fused}"
                 + (f"; pins honoured: {kept}/{len(pins)}" if pins else ""),
                 className="muted", id="place-subline"),
    ])


def pin_items(pins: list, doc: dict | None):
    out = []
    for i, p in enumerate(pins or []):
        ok = honoured(p, doc)
        mark = "" if ok is None else (" ✔ honoured" if ok else " ✘ not honoured")
        out.append(html.Div(className="pin-item", children=[
            html.Span(f"{p['target']} → device {p['device']}{mark}"),
            html.Button("Unpin", id={"type": ids.PLACE_UNPIN, "index": i}, className="small"),
        ]))
    return out


def details_view(selected: dict | None, doc: dict | None, structure: dict | None):
    if not selected or not doc:
        return html.P("Click a cluster to expand it into its operators; click an operator to "
                      "select it.", className="muted")
    if selected["kind"] == "cluster":
        k = int(selected["id"])
        if not 0 <= k < len(doc["clusters"]):
            return html.P("That cluster is not in the current placement.", className="muted")
        c = doc["clusters"][k]
        shares = ", ".join(f"dev {d}: {n}" for d, n in enumerate(c.get("shares", [])) if n)
        return html.Div([
            html.B(f"cluster {k}"), f": {len(c['ops'])} operators on device {c['device']} "
            f"({shares}); compute {fmt.seconds(c['time_s'])}, memory "
            f"{fmt.bytes_(c['memory_bytes'])}",
            html.Div(", ".join(c["ops"][:12]) + (" …" if len(c["ops"]) > 12 else ""),
                     className="muted"),
        ])
    nm = selected["name"]
    d = doc["placement"].get(nm)
    extra = ""
    if structure is not None and nm in structure["index"]:
        i = structure["index"][nm]
        extra = (f" {structure['target'][i]} ({structure['phase'][i]}), "
                 f"{fmt.seconds(structure['time_s'][i])}, "
                 f"{fmt.bytes_(structure['memory_bytes'][i])};")
    return html.Div([html.B(nm), f":{extra} device {d}, cluster {selected.get('cluster')}"])


def do_run(doc: dict | None, steps, progress=lambda v: None) -> dict:
    """Execute the shown placement on local workers (raises ExplorerError / ValueError)."""
    if not doc:
        raise ExplorerError("place the model first, then run the placement")
    state.request(doc.get("request"))            # a model file only where the server allows
    res = session.run_placement(doc, steps=int(steps or 3), progress=progress)
    res["placement_id"] = placement_id(doc)
    return res


def run_view(res: dict | None, doc: dict | None):
    """Reference check, bytes and step time of the last run - if it ran the shown placement."""
    if not res or not doc or res.get("placement_id") != placement_id(doc):
        return html.P("Run the shown placement to check it against one device and to compare "
                      "measured with predicted times.", className="muted")
    ok = res["reference_ok"]
    pred, meas = res.get("predicted_step_time_s"), res["measured_step_time_s"]
    return html.Div([
        html.Div(html.B(f"reference check: {'passed' if ok else 'FAILED'} (max relative "
                        f"error {res['max_rel_error']:.1e}, {res.get('dtype', 'float64')})",
                        className="" if ok else "error"), id="place-run-reference"),
        html.Div(f"communication: predicted {res['predicted_comm_bytes'] / 1e6:.3f} MB, "
                 f"measured {res['measured_comm_bytes'] / 1e6:.3f} MB per step",
                 id="place-run-bytes"),
        html.Div(f"step time: predicted {pred * 1e3:.2f} ms (simulator, "
                 f"{doc.get('preset') or doc['devices']}), "
                 f"measured {meas * 1e3:.2f} ms on {res['workers']} local workers (median of "
                 f"{res.get('steps', 1)})" if pred else
                 f"step time: measured {meas * 1e3:.2f} ms", id="place-run-times"),
        html.Div("Each worker runs its device's operators as one compiled program; the "
                 "prediction is comparable when the placement was searched for the local "
                 "preset with measured costs (explorer search --preset local --cost measured).",
                 className="muted"),
    ])


def _shown(res: dict | None, doc: dict | None) -> bool:
    """Whether ``res`` is a run of the shown placement ``doc``."""
    return bool(res and doc and res.get("placement_id") == placement_id(doc))


def run_figure(res: dict | None, doc: dict | None) -> go.Figure:
    """Per device predicted busy vs measured compute - if ``res`` ran the shown placement."""
    return F.run_figure(res if _shown(res, doc) else None)


def placement_id(doc: dict) -> str:
    """Identifies a placement (model, request and every operator's device)."""
    import hashlib
    import json
    key = json.dumps([doc.get("request"), doc.get("algo"), doc.get("placement")],
                     sort_keys=True)
    return hashlib.sha1(key.encode()).hexdigest()[:16]


# --------------------------------------------------------------------------------------------
# callbacks
# --------------------------------------------------------------------------------------------


def run_series(res: dict | None, doc: dict | None) -> go.Figure:
    """The measured step times - if ``res`` ran the shown placement."""
    return F.run_series(res if _shown(res, doc) else None)


def history(doc: dict | None) -> list:
    """Stored runs of the shown placement (never breaks the panel)."""
    try:
        return session.placement_runs(doc) if doc else []
    except Exception:  # noqa: BLE001 - history is a convenience
        return []


def graph_view(doc: dict | None, expanded, selected, pins) -> tuple:
    """Elements, info line, legend and details of the fused graph of ``doc``."""
    if not doc:
        return [], "", [], details_view(None, None, None)
    try:
        s = structure_for(doc)
        els, info = build_elements(doc, s, expanded, selected, pins)
    except (ExplorerError, ValueError, KeyError) as exc:
        return [], f"cannot draw the graph: {exc}", [], details_view(None, None, None)
    text = (f"{info['clusters']} clusters, {info['ops']} operators"
            + (f"; cluster {info['expanded']} expanded ({info['shown']} nodes)"
               if info["expanded"] is not None else "; click a cluster to expand it")
            + (f" · clusters from {doc['clusters_from']}"
               if doc.get("clusters_from", doc["algo"]) != doc["algo"] else ""))
    return (els, text, legend(len(doc["capacity_bytes"])),
            details_view(selected, doc, s))


def placement_view(doc: dict | None, pins) -> tuple:
    """Summary, Gantt chart, memory figure and pin list of the shown placement."""
    if not doc:
        return (html.P("Place the current model to see its operators on the devices.",
                       className="muted"), F.gantt_figure(None), F.memory_figure(None),
                pin_items(pins, None))
    return summary_view(doc), F.gantt_figure(doc), F.memory_figure(doc), pin_items(pins, doc)


def select_after(trig, tap, expanded) -> tuple:
    """``(selected, expanded)`` after a tap on the graph, a collapse or a new placement."""
    if trig == ids.STORE_PLACEMENT:
        return None, None                        # cluster numbers change with every run
    if trig == ids.PLACE_COLLAPSE:
        return no_update, None
    if not tap:
        return no_update, no_update
    if tap.get("kind") == "cluster":
        return {"kind": "cluster", "id": tap["cluster"]}, tap["cluster"]
    return {"kind": "op", "name": tap["name"], "cluster": tap.get("cluster")}, expanded


def compare_all(req_doc, memory, pins, progress=lambda pct, text: None) -> tuple:
    """Table rows, figure and status of every method on the request (never raises)."""
    try:
        req = state.request(req_doc)
        progress(5, "building the operator graph…")
        session.placement_graph_for(req, _memory(memory))
        rows = session.placement_compare(
            req, _memory(memory), pins or [],
            progress=lambda i, n, a: progress(int(10 + 90 * i / max(n, 1)),
                                              f"placing with {a}…" if a else ""))
    except (ExplorerError, ValueError) as exc:
        return no_update, no_update, f"error: {exc}"
    return compare_rows(rows), F.compare_figure(rows), f"{len(rows)} methods compared"


# --------------------------------------------------------------------------------------------
# callbacks
# --------------------------------------------------------------------------------------------


def register(app: dash.Dash) -> None:
    """The panel's callbacks on ``app``."""
    T.register_csv(app, ids.PLACE_CSV_BUTTON, ids.PLACE_CSV, ids.PLACE_COMPARE_TABLE,
                   COMPARE_COLUMNS, "placement-methods", ids.STORE_PLACEMENT)

    register_download(app, ids.PLACE_DOWNLOAD_BUTTON, ids.PLACE_DOWNLOAD, ids.STORE_PLACEMENT,
                      ids.PLACE_ERROR)

    register_local_run(
        app, button_id=ids.PLACE_RUN_BUTTON, cancel_id=ids.PLACE_RUN_CANCEL,
        progress_id=ids.PLACE_RUN_PROGRESS, status_id=ids.PLACE_RUN_STATUS,
        error_id=ids.PLACE_RUN_ERROR, store_id=ids.STORE_PLACE_RUN,
        states=[(ids.STORE_PLACEMENT, "data"), (ids.PLACE_RUN_STEPS, "value")],
        job=do_run, done=lambda res, *_: f"done: {res['workers']} workers")

    @app.callback(
        Output(ids.PLACE_RUN_RESULT, "children"), Output(ids.PLACE_RUN_FIG, "figure"),
        Output(ids.PLACE_RUN_SERIES, "figure"), Output(ids.PLACE_RUN_HISTORY, "rowData"),
        Input(ids.STORE_PLACE_RUN, "data"), Input(ids.STORE_PLACEMENT, "data"),
    )
    def show_run(res, doc):
        return run_view(res, doc), run_figure(res, doc), run_series(res, doc), history(doc)

    @app.callback(
        Output(ids.STORE_PLACEMENT, "data"), Output(ids.PLACE_ERROR, "children"),
        Output(ids.PLACE_STATUS, "children"),
        Output(ids.PLACE_PIN_ERROR, "children", allow_duplicate=True),
        Input(ids.PLACE_BUTTON, "n_clicks"),
        State(ids.STORE_REQUEST, "data"), State(ids.PLACE_ALGO, "value"),
        State(ids.PLACE_MEMORY, "value"), State(ids.STORE_PLACE_PINS, "data"),
        background=True, interval=250,
        progress=[Output(ids.PLACE_PROGRESS, "value")],
        running=running(ids.PLACE_BUTTON, ids.PLACE_CANCEL, ids.PLACE_PROGRESS,
                        ids.PLACE_STATUS, "building the operator graph and placing…"),
        cancel=[Input(ids.PLACE_CANCEL, "n_clicks")],
        prevent_initial_call=True,
    )
    def place(set_progress, _n, req_doc, algo, memory, pins):
        set_progress(["0"])
        try:
            doc = do_place(req_doc, method_of(req_doc, algo), memory,
                           pins or [], lambda v: set_progress([str(v)]))
        except (ExplorerError, ValueError) as exc:
            return no_update, str(exc), "", ""
        set_progress(["100"])
        return doc, "", f"done: {doc['algo']} on {len(doc['capacity_bytes'])} devices", ""

    @app.callback(Output(ids.PLACE_ALGO, "value", allow_duplicate=True),
                  Input(ids.STORE_PLACEMENT, "data"), State(ids.PLACE_ALGO, "value"),
                  prevent_initial_call=True)
    def follow_shown(doc, algo):
        # the panel's method is the shown placement's (a Search or a loaded plan may bring
        # another one)
        # (set even when unchanged: the form's request follows it, so the URL reopens it)
        if not doc or state.family(doc.get("algo")) != "placement":
            raise dash.exceptions.PreventUpdate
        return doc["algo"]

    @app.callback(
        Output(ids.STORE_PLACE_PINS, "data"),
        Output(ids.STORE_PLACEMENT, "data", allow_duplicate=True),
        Output(ids.PLACE_PIN_ERROR, "children"),
        Output(ids.PLACE_ERROR, "children", allow_duplicate=True),
        Input(ids.PLACE_PIN_BUTTON, "n_clicks"), Input(ids.PLACE_CLEAR_PINS, "n_clicks"),
        Input({"type": ids.PLACE_UNPIN, "index": ALL}, "n_clicks"),
        State(ids.STORE_PLACE_PINS, "data"), State(ids.STORE_PLACE_SELECTED, "data"),
        State(ids.PLACE_PIN_DEVICE, "value"), State(ids.STORE_REQUEST, "data"),
        State(ids.PLACE_ALGO, "value"), State(ids.PLACE_MEMORY, "value"),
        State(ids.STORE_PLACEMENT, "data"),
        prevent_initial_call=True,
    )
    def pin(_p, _c, _u, pins, selected, device, req_doc, algo, memory, doc):
        trig = ctx.triggered_id
        if isinstance(trig, dict):
            if not ctx.triggered or not ctx.triggered[0].get("value"):
                return no_update, no_update, no_update, no_update   # unpin buttons re-rendered
            action, index = "unpin", int(trig["index"])
        else:
            action = {ids.PLACE_PIN_BUTTON: "pin", ids.PLACE_CLEAR_PINS: "clear"}.get(trig)
            index = None
        # pins re-run the form's request (the one app state)
        return (*apply_pins(action, pins, selected, device, req_doc,
                            method_of(req_doc, algo), memory, doc, index),
                "")

    @app.callback(
        Output(ids.STORE_PLACE_SELECTED, "data"), Output(ids.STORE_PLACE_EXPANDED, "data"),
        Input(ids.PLACE_GRAPH, "tapNodeData"), Input(ids.PLACE_COLLAPSE, "n_clicks"),
        Input(ids.STORE_PLACEMENT, "data"), State(ids.STORE_PLACE_EXPANDED, "data"),
        prevent_initial_call=True,
    )
    def select(tap, _collapse, _doc, expanded):
        return select_after(ctx.triggered_id, tap, expanded)

    @app.callback(
        Output(ids.PLACE_GRAPH, "elements"), Output(ids.PLACE_GRAPH_INFO, "children"),
        Output(ids.PLACE_LEGEND, "children"), Output(ids.PLACE_DETAILS, "children"),
        Input(ids.STORE_PLACEMENT, "data"), Input(ids.STORE_PLACE_EXPANDED, "data"),
        Input(ids.STORE_PLACE_SELECTED, "data"), State(ids.STORE_PLACE_PINS, "data"),
    )
    def show_graph(doc, expanded, selected, pins):
        return graph_view(doc, expanded, selected, pins)

    @app.callback(
        Output(ids.PLACE_SUMMARY, "children"), Output(ids.PLACE_GANTT, "figure"),
        Output(ids.PLACE_MEMORY_FIG, "figure"), Output(ids.PLACE_PIN_LIST, "children"),
        Input(ids.STORE_PLACEMENT, "data"), Input(ids.STORE_PLACE_PINS, "data"),
    )
    def show(doc, pins):
        return placement_view(doc, pins)

    @app.callback(
        Output(ids.PLACE_COMPARE_TABLE, "rowData"), Output(ids.PLACE_COMPARE_FIG, "figure"),
        Output(ids.PLACE_COMPARE_STATUS, "children"),
        Input(ids.PLACE_COMPARE_BUTTON, "n_clicks"),
        State(ids.STORE_REQUEST, "data"), State(ids.PLACE_MEMORY, "value"),
        State(ids.STORE_PLACE_PINS, "data"),
        background=True, interval=300,
        progress=[Output(ids.PLACE_COMPARE_PROGRESS, "value"),
                  Output(ids.PLACE_COMPARE_STATUS, "children")],
        running=running(ids.PLACE_COMPARE_BUTTON, ids.PLACE_COMPARE_CANCEL,
                        ids.PLACE_COMPARE_PROGRESS),
        cancel=[Input(ids.PLACE_COMPARE_CANCEL, "n_clicks")],
        prevent_initial_call=True,
    )
    def compare(set_progress, _n, req_doc, memory, pins):
        return compare_all(req_doc, memory, pins,
                           progress=lambda pct, text: set_progress([str(pct), text]))

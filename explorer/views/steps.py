"""Elimination steps panel: replay OptCNN's search trace on the graph (paper Figures 5 and 6).

The slider walks through every node elimination (the eliminated layer ringed and shaded, its
two neighbours dashed, the merged edge highlighted), every edge elimination, the final graph
and its enumeration (double ring), then the undo order that assigns the eliminated layers.
A legend names the highlight colours (dark colours no configuration uses), and the equation
the step applies is written out with its numbers: equation 2 for a node elimination and its
undo, equation 3 for an edge elimination, equation 1 for the final graph.  The slider counts
steps from 1, as the text does.  The graph panel draws the highlight from ``STORE_STEP`` (a
0-based trace index), which holds a step only while this tab is shown: the faded elimination
view never stays on the graph under another tab; a step inside a collapsed module group opens
that group (``STORE_EXPANDED``).  The trace stays on the server (2 MB for 2,000 layers): the
plan holds its ``trace_ref`` and each step shown is fetched (:func:`explorer.service.trace_of`).
"""

from __future__ import annotations

import dash
from dash import Input, Output, State, dcc, html, no_update

from explorer import service as session
from explorer.errors import ExplorerError
from explorer.views import fmt, ids
from explorer.views import glossary as G
from explorer.views import graph_layout as L
from explorer.views import palette as P
from explorer.views import state
from explorer.views.controls import context

#: the legend of the step highlights: (class, swatch style, meaning)
LEGEND = (("current", "solid", "the layer being eliminated (or assigned)"),
          ("nbr", "dashed", "its neighbours: the new edge joins them"),
          ("residual", "double", "the final graph, solved by enumeration"),
          ("assigned", "solid", "undo: the layer just given its configuration"))


def legend():
    """What each step colour means (the fill stays the configuration's colour)."""
    items = [html.Span(className="legend-item", children=[
        html.Span(className="swatch step-swatch",
                  style={"borderColor": P.STEP_COLORS[k], "borderStyle": style,
                         "borderWidth": "3px", "backgroundColor": "#fff"}), text])
        for k, style, text in LEGEND]
    return [html.Span("ring colour = role in this step; fill = configuration; faded = "
                      "eliminated. ", className="muted")] + items


def layout():
    return html.Div(className="panel steps-panel", children=[
        context("steps"),
        html.Div(className="row", children=[
            html.Button("◀ Prev", id=ids.STEP_PREV),
            html.Button("Next ▶", id=ids.STEP_NEXT),
            html.Div(dcc.Slider(id=ids.STEP_SLIDER, min=1, max=1, step=1, value=None,
                                marks=None, tooltip={"placement": "top"}),
                     className="grow step-slider"),
        ]),
        html.Div(id=ids.STEP_LEGEND, className="legend", children=legend()),
        html.Div(id=ids.STEP_TEXT, className="step-text",
                 children="Run the optcnn search to see its elimination steps."),
        html.Div(id=ids.STEP_EQUATIONS, className="step-equations"),
    ])


def describe(step: dict, total: int) -> str:
    """One sentence for a trace step."""
    i = step["step"] + 1
    if step["kind"] == "node":
        return (f"Step {i}/{total} · node elimination: {step['node']} has one in-edge (from "
                f"{step['src']}) and one out-edge (to {step['dst']}); it is removed and the "
                f"edge {step['src']} → {step['dst']} gets t_X(e', c_i, c_k) = min over its "
                f"configurations (equation 2). {step['remaining_nodes']} nodes left.")
    if step["kind"] == "edge":
        return (f"Step {i}/{total} · edge elimination: two edges {step['src']} → "
                f"{step['dst']} merge into one whose t_X is their sum (equation 3). "
                f"{step['remaining_edges']} edges left.")
    if step["kind"] == "final":
        return (f"Step {i}/{total} · final graph: {len(step['nodes'])} nodes "
                f"({', '.join(step['nodes'][:8])}{' …' if len(step['nodes']) > 8 else ''}) "
                f"solved exactly by {step['method']}.")
    if step["kind"] == "undo":
        return (f"Step {i}/{total} · undo: {step['node']} gets the configuration that "
                f"minimised equation 2 for the configurations now chosen for {step['src']} and "
                f"{step['dst']} (Theorem 1).")
    return f"Step {i}/{total}"


def _ms(s) -> str:
    return fmt.seconds(s)


def equations(step: dict | None, plan: dict | None = None) -> list:
    """The equation the step applies, written out with its numbers (lines of text; letters,
    symbols and equation names carry their glossary tooltips)."""
    if not step:
        return []
    lines = []
    if step["kind"] in ("node", "undo") and step.get("eq2"):
        q = step["eq2"]
        j, i, k = step["node"], step["src"], step["dst"]
        red = f" + t_R {_ms(q['t_reduce_s'])}" if q.get("t_reduce_s") else ""
        if step["kind"] == "node":
            ni, nj, nk = q.get("candidates", ["?"] * 3)
            lines.append(f"equation 2: t_X(e', c_i, c_k) = min over c_j of [t_X(e1, c_i, c_j) "
                         f"+ t_C(j, c_j) + t_S(j, c_j) + t_X(e2, c_j, c_k)] — for each of the "
                         f"{ni} × {nk} pairs (c_i, c_k), the best of {nj} configurations of "
                         f"{j}.")
            lines.append(f"its cheapest entry: c_i = {q['c_i']} ({i}), c_k = {q['c_k']} ({k}) "
                         f"with c_j = {q['c_j']} ({j}):")
        else:
            lines.append(f"equation 2 for the chosen c_i = {q['c_i']} ({i}) and c_k = "
                         f"{q['c_k']} ({k}): {j} takes c_j = {q['c_j']} (Theorem 1).")
        lines.append(f"t_X(e1) {_ms(q['t_in_s'])} + t_C {_ms(q['t_compute_s'])} + t_S "
                     f"{_ms(q['t_sync_s'])}{red} + t_X(e2) {_ms(q['t_out_s'])} = "
                     f"{_ms(q['total_s'])}")
    elif step["kind"] == "edge" and step.get("eq3"):
        q = step["eq3"]
        lines.append(f"equation 3: t_X(e', c_i, c_j) = t_X(e1, c_i, c_j) + t_X(e2, c_i, c_j), "
                     f"entry by entry.")
        lines.append(f"its cheapest entry, c_i = {q['c_i']} ({step['src']}), c_j = {q['c_j']} "
                     f"({step['dst']}): {_ms(q['t_1_s'])} + {_ms(q['t_2_s'])} = "
                     f"{_ms(q['total_s'])}")
    elif step["kind"] == "final" and step.get("eq1"):
        q = step["eq1"]
        lines.append("equation 1: t_O = Σ over layers [t_C + t_S] + Σ over edges t_X; on the "
                     "final graph every edge carries the layers eliminated into it.")
        lines.append(f"final graph: layers {_ms(q['nodes_s'])} + edges {_ms(q['edges_s'])} = "
                     f"{_ms(q['nodes_s'] + q['edges_s'])}"
                     + (f" = the plan's objective {_ms(plan['objective_s'])}"
                        if plan and plan.get("objective_s") is not None else ""))
    return [html.Div(G.explain(line), className="equation") for line in lines]


#: the step text when a plan's trace kept on the server is gone (a server restart)
GONE = "This plan's elimination trace is no longer on the server: press Search to replay it."


def reset_view(plan) -> tuple:
    """``(slider max, slider value, text, equations)`` for a new plan: the trace's length and
    its steps of each kind (the steps themselves stay on the server until shown)."""
    total = session.trace_length(plan)
    if not total:
        msg = ("This plan has no elimination trace (only the optcnn search has one)."
               if plan and "error" not in plan else "Run the optcnn search to see its steps.")
        return 1, None, msg, []
    n = session.trace_counts(plan)
    return total, None, (
        f"{total} steps: {n.get('node', 0)} node eliminations, {n.get('edge', 0)} edge "
        f"eliminations, the final graph, {n.get('undo', 0)} undo steps. "
        f"Press Next ▶ or drag the slider."), []


def shown_step(value, tab, plan) -> tuple:
    """``(STORE_STEP, step text, equations)``: the slider's step (1-based, as the text counts)
    as a 0-based trace index while the Steps tab is shown, else no step (the graph drops the
    highlight; the text stays for when the tab comes back)."""
    if value is None or tab != "steps" or not session.trace_length(plan):
        return None, no_update, no_update
    trace = session.trace_of(plan)
    if not trace:
        return None, GONE, []
    index = max(0, min(int(value) - 1, len(trace) - 1))
    return (index, G.explain(describe(trace[index], len(trace))),
            equations(trace[index], plan))


def groups_to_open(step, plan, req_doc, expanded) -> list | None:
    """The expanded groups with every layer the step highlights shown on its own (``None``
    when nothing needs opening): a step inside a collapsed module group opens the group."""
    trace = session.trace_of(plan) if step is not None else None
    if step is None or not trace:
        return None
    cur = trace[max(0, min(int(step), len(trace) - 1))]
    names = [cur[k] for k in ("node", "src", "dst") if isinstance(cur.get(k), str)]
    try:
        g = session.graph_for(state.request((plan or {}).get("request") or req_doc))
    except (ExplorerError, ValueError):
        return None
    order = g.names()
    if len(order) <= L.COLLAPSE_THRESHOLD:
        return None
    unit_of, _ = L.units(order, {n: g.layer(n).module for n in order}, set(expanded or []))
    closed = sorted({unit_of[n] for n in names if n in unit_of and unit_of[n] != n})
    if not closed:
        return None
    return sorted(set(expanded or []) | set(closed))


def register(app: dash.Dash) -> None:
    """The panel's callbacks on ``app``."""

    @app.callback(Output(ids.STEP_SLIDER, "max"), Output(ids.STEP_SLIDER, "value"),
                  Output(ids.STEP_TEXT, "children"), Output(ids.STEP_EQUATIONS, "children"),
                  Input(ids.STORE_PLAN, "data"))
    def reset(plan):
        return reset_view(plan)

    @app.callback(Output(ids.STEP_SLIDER, "value", allow_duplicate=True),
                  Input(ids.STEP_PREV, "n_clicks"), Input(ids.STEP_NEXT, "n_clicks"),
                  State(ids.STEP_SLIDER, "value"), State(ids.STEP_SLIDER, "max"),
                  prevent_initial_call=True)
    def nudge(_p, _n, value, top):
        if dash.ctx.triggered_id == ids.STEP_NEXT:
            return 1 if value is None else min(value + 1, top or 1)
        return 1 if value is None else max(value - 1, 1)

    @app.callback(Output(ids.STORE_STEP, "data", allow_duplicate=True),
                  Output(ids.STEP_TEXT, "children", allow_duplicate=True),
                  Output(ids.STEP_EQUATIONS, "children", allow_duplicate=True),
                  Input(ids.STEP_SLIDER, "value"), Input(ids.TABS, "value"),
                  State(ids.STORE_PLAN, "data"),
                  prevent_initial_call=True)
    def show(value, tab, plan):
        return shown_step(value, tab, plan)

    @app.callback(Output(ids.STORE_EXPANDED, "data", allow_duplicate=True),
                  Input(ids.STORE_STEP, "data"), State(ids.STORE_PLAN, "data"),
                  State(ids.STORE_REQUEST, "data"), State(ids.STORE_EXPANDED, "data"),
                  prevent_initial_call=True)
    def open_groups(step, plan, req_doc, expanded):
        got = groups_to_open(step, plan, req_doc, expanded)
        return no_update if got is None else got

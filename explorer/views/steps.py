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


def dock(plan: dict | None = None, step: int | None = None):
    """The stepper - Prev, Next, the step box, the slider and the step's sentence - docked
    over the graph it highlights, so both fit one window (shown while the Steps tab is).
    It opens on ``plan``'s trace at ``step`` (1-based; a URL's ``step=``)."""
    top, _, text, _ = reset_view(plan) if plan else (1, None, None, None)
    return html.Div(id=ids.STEP_DOCK, className="panel step-dock", hidden=True, children=[
        html.Div(className="row", children=[
            html.Button("◀ Prev", id=ids.STEP_PREV),
            html.Button("Next ▶", id=ids.STEP_NEXT),
            html.Label(["step ", dcc.Input(id=ids.STEP_INPUT, type="number", min=1, step=1,
                                           debounce=True, placeholder="#", value=step,
                                           style={"width": "72px"})],
                       title="type a step number and press Enter"),
            html.Div(dcc.Slider(id=ids.STEP_SLIDER, min=1, max=top, step=1, value=step,
                                marks=None, tooltip={"placement": "bottom"},
                                allow_direct_input=False),    # the step box is the input
                     className="grow step-slider"),
        ]),
        html.Div(id=ids.STEP_TEXT, className="step-text",
                 children=text or "Run the optcnn search to see its elimination steps."),
    ])


def layout():
    """The tab: what it operates on, the legend of the rings, the step's equations (the
    stepper itself is :func:`dock`, over the graph)."""
    return html.Div(className="panel steps-panel", children=[
        context("steps"),
        html.P("The stepper is over the graph, above.", className="muted"),
        html.Div(id=ids.STEP_LEGEND, className="legend", children=legend()),
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
    need = groups_needed(step, plan, req_doc, expanded)
    return None if not need else sorted(set(expanded or []) | need)


def groups_needed(step, plan, req_doc, expanded) -> set:
    """The collapsed module groups that hold a layer step ``step`` highlights (the layer, its
    neighbours): they must open for the rings to show on the layers themselves."""
    trace = session.trace_of(plan) if step is not None else None
    if step is None or not trace:
        return set()
    cur = trace[max(0, min(int(step), len(trace) - 1))]
    names = [cur[k] for k in ("node", "src", "dst") if isinstance(cur.get(k), str)]
    try:
        g = session.graph_for(state.request((plan or {}).get("request") or req_doc))
    except (ExplorerError, ValueError):
        return set()
    order = g.names()
    if len(order) <= L.COLLAPSE_THRESHOLD:
        return set()
    unit_of, _ = L.units(order, {n: g.layer(n).module for n in order}, set(expanded or []))
    return {unit_of[n] for n in names if n in unit_of and unit_of[n] != n}


def step_groups(step, plan, req_doc, expanded, opened) -> tuple:
    """``(expanded groups, groups the stepper holds open)`` for step ``step``: the groups the
    former step opened close again (those the user opened stay), and the current step's
    layers are shown on their own - so opened groups never pile up as the steps go on.
    ``step`` ``None`` (the tab left) closes what the stepper opened."""
    mine = set(opened or [])
    user = [e for e in (expanded or []) if e not in mine]
    need = groups_needed(step, plan, req_doc, user)
    return sorted(set(user) | need), sorted(need)


def step_control(trigger, typed, value, top) -> tuple:
    """``(slider value, step box value)`` after Prev, Next, a number typed in the step box
    (Enter) or the slider moved: both show the same 1-based step, kept within 1..``top``."""
    top = max(1, int(top or 1))
    if trigger == ids.STEP_INPUT:
        if typed in (None, ""):
            return no_update, no_update
        v = max(1, min(int(typed), top))
        return v, (v if v != typed else no_update)
    if trigger == ids.STEP_SLIDER:
        return no_update, value
    if trigger == ids.STEP_NEXT:
        v = 1 if value is None else min(int(value) + 1, top)
    else:
        v = 1 if value is None else max(int(value) - 1, 1)
    return v, v


#: shows the stepper over the graph and scrolls it into view when the Steps tab opens
_SCROLL_TO_DOCK = """
function(hidden) {
    if (hidden === false) {
        setTimeout(function () {
            const e = document.getElementById('%s');
            if (e) { e.scrollIntoView({block: 'start', behavior: 'instant'}); }
        }, 50);
    }
    return '';
}
""" % ids.STEP_DOCK


def register(app: dash.Dash) -> None:
    """The panel's callbacks on ``app``."""

    @app.callback(Output(ids.STEP_SLIDER, "max"), Output(ids.STEP_SLIDER, "value"),
                  Output(ids.STEP_TEXT, "children"), Output(ids.STEP_EQUATIONS, "children"),
                  Input(ids.STORE_PLAN, "data"), prevent_initial_call=True)
    def reset(plan):
        # a new plan (the page opens with its own trace's length and the URL's step)
        return reset_view(plan)

    @app.callback(Output(ids.STEP_SLIDER, "value", allow_duplicate=True),
                  Output(ids.STEP_INPUT, "value"),
                  Input(ids.STEP_PREV, "n_clicks"), Input(ids.STEP_NEXT, "n_clicks"),
                  Input(ids.STEP_INPUT, "value"), Input(ids.STEP_SLIDER, "value"),
                  State(ids.STEP_SLIDER, "max"),
                  prevent_initial_call=True)
    def nudge(_p, _n, typed, value, top):
        return step_control(dash.ctx.triggered_id, typed, value, top)

    @app.callback(Output(ids.STEP_DOCK, "hidden"), Input(ids.TABS, "value"))
    def dock_shown(tab):
        return tab != "steps"

    app.clientside_callback(_SCROLL_TO_DOCK, Output(ids.STEP_SCROLL, "children"),
                            Input(ids.STEP_DOCK, "hidden"), prevent_initial_call=True)

    @app.callback(Output(ids.STORE_STEP, "data", allow_duplicate=True),
                  Output(ids.STEP_TEXT, "children", allow_duplicate=True),
                  Output(ids.STEP_EQUATIONS, "children", allow_duplicate=True),
                  Input(ids.STEP_SLIDER, "value"), Input(ids.TABS, "value"),
                  State(ids.STORE_PLAN, "data"), State(ids.STORE_STEP, "data"),
                  prevent_initial_call="initial_duplicate")
    def show(value, tab, plan, current):
        # also on opening: a URL with tab=steps&step=N shows that step; the same step is not
        # set again (every callback reading it - the graph's drawing - would run again)
        step, text, eqs = shown_step(value, tab, plan)
        return (no_update if step == current else step), text, eqs

    @app.callback(Output(ids.STORE_EXPANDED, "data", allow_duplicate=True),
                  Output(ids.STORE_STEP_OPENED, "data"),
                  Input(ids.STORE_STEP, "data"), State(ids.STORE_PLAN, "data"),
                  State(ids.STORE_REQUEST, "data"), State(ids.STORE_EXPANDED, "data"),
                  State(ids.STORE_STEP_OPENED, "data"),
                  prevent_initial_call=True)
    def open_groups(step, plan, req_doc, expanded, opened):
        if step is None and not opened:
            raise dash.exceptions.PreventUpdate
        new, mine = step_groups(step, plan, req_doc, expanded, opened)
        return (no_update if new == sorted(expanded or []) else new), mine

"""Elimination steps panel: replay OptCNN's search trace on the graph (paper Figures 5 and 6).

The slider walks through every node elimination (the eliminated layer in red, its two
neighbours in orange, the merged edge highlighted), every edge elimination, the final graph
and its enumeration (green), then the undo order that assigns the eliminated layers (blue).
The graph panel draws the highlight from ``STORE_STEP``, which holds a step only while this
tab is shown: the faded elimination view never stays on the graph under another tab.
"""

from __future__ import annotations

import dash
from dash import Input, Output, State, dcc, html, no_update

from . import ids
from .controls import context


def layout():
    return html.Div(className="panel steps-panel", children=[
        context("steps"),
        html.Div(className="row", children=[
            html.Button("◀ Prev", id=ids.STEP_PREV),
            html.Button("Next ▶", id=ids.STEP_NEXT),
            html.Div(dcc.Slider(id=ids.STEP_SLIDER, min=0, max=0, step=1, value=None,
                                marks=None, tooltip={"placement": "bottom"}),
                     className="grow"),
        ]),
        html.Div(id=ids.STEP_TEXT, className="step-text",
                 children="Run the optcnn search to see its elimination steps."),
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


def shown_step(value, tab, plan) -> tuple:
    """``(STORE_STEP, step text)``: the slider's step while the Steps tab is shown, else no
    step (the graph drops the highlight; the text stays for when the tab comes back)."""
    trace = (plan or {}).get("trace") or []
    if value is None or not trace or tab != "steps":
        return None, no_update
    value = max(0, min(int(value), len(trace) - 1))
    return value, describe(trace[value], len(trace))


def register(app: dash.Dash) -> None:
    """The panel's callbacks on ``app``."""

    @app.callback(Output(ids.STEP_SLIDER, "max"), Output(ids.STEP_SLIDER, "value"),
                  Output(ids.STEP_TEXT, "children"),
                  Input(ids.STORE_PLAN, "data"))
    def reset(plan):
        trace = (plan or {}).get("trace") or []
        if not trace:
            msg = ("This plan has no elimination trace (only the optcnn search has one)."
                   if plan and "error" not in plan else "Run the optcnn search to see its steps.")
            return 0, None, msg
        return len(trace) - 1, None, (
            f"{len(trace)} steps: {sum(s['kind'] == 'node' for s in trace)} node eliminations, "
            f"{sum(s['kind'] == 'edge' for s in trace)} edge eliminations, the final graph, "
            f"{sum(s['kind'] == 'undo' for s in trace)} undo steps. "
            f"Press Next ▶ or drag the slider.")

    @app.callback(Output(ids.STEP_SLIDER, "value", allow_duplicate=True),
                  Input(ids.STEP_PREV, "n_clicks"), Input(ids.STEP_NEXT, "n_clicks"),
                  State(ids.STEP_SLIDER, "value"), State(ids.STEP_SLIDER, "max"),
                  prevent_initial_call=True)
    def nudge(_p, _n, value, top):
        if dash.ctx.triggered_id == ids.STEP_NEXT:
            return 0 if value is None else min((value or 0) + 1, top or 0)
        return 0 if value is None else max(value - 1, 0)

    @app.callback(Output(ids.STORE_STEP, "data", allow_duplicate=True),
                  Output(ids.STEP_TEXT, "children", allow_duplicate=True),
                  Input(ids.STEP_SLIDER, "value"), Input(ids.TABS, "value"),
                  State(ids.STORE_PLAN, "data"),
                  prevent_initial_call=True)
    def show(value, tab, plan):
        return shown_step(value, tab, plan)

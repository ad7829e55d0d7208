"""The layer-wise page (``/``): the form, the graph and the tabs Plan, Elimination steps,
Tiling, Compare and Run, opened on the request in its URL.

``/?model=NAME&devices=N&preset=P&algo=A&batch=B&arg=K=V&pin=...`` (``arg`` and ``pin``
repeatable) opens exactly that request: the form shows it and its layer-wise search has
already run (the request's method when layer-wise, else optcnn).  Every tab's one line saying
what it operates on is filled here too.
"""

from __future__ import annotations

import dash
from dash import Input, Output, State, dcc, html, no_update

from explorer import service as session
from explorer.views import (
    compare,
    graph,
    ids,
    pages,
    run,
    search_form as form,
    state,
    steps,
    tiling,
)

PATH = pages.PATHS["layerwise"]
FAMILY = "layerwise"
TABS = ("plan", "steps", "tiling", "compare", "run")


def layout(**query):
    """The page for the query parameters ``query`` (Dash pages passes them as keywords)."""
    doc, errors = pages.open_request(query)
    plan, error = pages.first_result(doc, FAMILY)
    if error:
        errors.append(error)
    summary = form.safe_summary(doc) if plan and "error" not in plan else ""
    view = opened_view(query, plan)
    return html.Div(className="page layerwise-page", children=[
        *pages.stores(FAMILY, doc),
        dcc.Store(id=ids.STORE_SEEN, data={k: doc.get(k)
                                           for k in ("model", "batch", "model_args")}),
        dcc.Store(id=ids.STORE_PLAN, data=plan),
        dcc.Store(id=ids.STORE_SELECTED, data=view["layer"]),
        dcc.Store(id=ids.STORE_VIEW, data=view),
        dcc.Store(id=ids.STORE_EXPANDED, data=[]),
        dcc.Store(id=ids.STORE_STEP, data=None),
        dcc.Store(id=ids.STORE_STEP_OPENED, data=[]),
        html.Div(id=ids.STEP_SCROLL, hidden=True),
        dcc.Store(id=ids.STORE_RUN, data=None),
        form.layout(doc, "\n".join(errors), summary),
        pages.elsewhere(doc, FAMILY),
        pages.stale_banner(FAMILY),
        html.Div(id=ids.RESULTS + FAMILY, className="results", children=[
        steps.dock(plan, view["step"]),
        html.Div(className="main", children=[
            html.Div(className="left", children=[graph.layout()]),
            html.Div(className="right", children=[graph.details_layout()]),
        ]),
        dcc.Tabs(id=ids.TABS, value=view["tab"], className="tabs", children=[
            dcc.Tab(label="Plan", value="plan", children=[graph.plan_layout()]),
            dcc.Tab(label="Elimination steps", value="steps", children=[steps.layout()]),
            dcc.Tab(label="Tiling", value="tiling", children=[tiling.layout()]),
            dcc.Tab(label="Compare", value="compare", children=[compare.layout()]),
            dcc.Tab(label="Run", value="run", children=[run.layout()]),
        ]),
        ]),
    ])


def opened_view(query: dict, plan: dict | None) -> dict:
    """The view the page opens on from its URL (``tab``, ``layer``, ``step``): a layer that is
    not the plan's and a step past its trace are left out."""
    view = state.view_from_query(query)
    names = {la["name"] for la in (plan or {}).get("layers") or []}
    if view["layer"] not in names:
        view["layer"] = None
    if view["step"] is not None and (view["tab"] != "steps"
                                     or view["step"] > session.trace_length(plan)):
        view["step"] = None
    return view


def view_of(tab, layer, step) -> dict:
    """The view the URL keeps for the page's controls."""
    return {"tab": tab, "layer": layer, "step": step if tab == "steps" else None}


def context_lines(tabs, doc, plan) -> list:
    """The "operates on" line of each tab in ``tabs`` (all show the layer-wise ``plan``)."""
    return [state.context_line(tab, doc, plan) for tab in tabs]


def adopt_loaded(loaded: dict | None, doc: dict | None):
    """The plan the Plans page loaded, when it is a layer-wise plan of this page's request
    (same model, devices and pins); ``no_update`` otherwise."""
    if not loaded or loaded.get("kind") != "layerwise" or not doc:
        return no_update
    req = loaded.get("request") or {}
    if not (state.same_target(req, doc) and state.pins_of(req) == state.pins_of(doc)):
        return no_update
    return loaded["doc"]


def register(app: dash.Dash) -> None:
    """Register the page with Dash pages (``/``) and its page-wide callbacks on ``app``."""
    dash.register_page("explorer.views.layerwise_page", path=PATH, name=pages.NAMES[FAMILY],
                       title="Plan Explorer", layout=layout, order=0)

    pages.register_stale(app, FAMILY, ids.STORE_PLAN)

    @app.callback(Output(ids.STORE_VIEW, "data"), Input(ids.TABS, "value"),
                  Input(ids.STORE_SELECTED, "data"), Input(ids.STEP_SLIDER, "value"),
                  prevent_initial_call=True)
    def _view(tab, layer, step):
        # what the address keeps beside the request, so a reload shows the same view
        return view_of(tab, layer, step)

    @app.callback([Output(ids.CONTEXT + tab, "children") for tab in TABS],
                  Input(ids.STORE_REQUEST, "data"), Input(ids.STORE_PLAN, "data"))
    def _context(doc, plan):
        return context_lines(TABS, doc, plan)

    @app.callback(Output(ids.STORE_PLAN, "data", allow_duplicate=True),
                  Output(ids.STORE_STEP, "data", allow_duplicate=True),
                  Output(ids.PIN_ERROR, "children", allow_duplicate=True),
                  Input(ids.STORE_FOUND, "data"), prevent_initial_call=True)
    def _show_found(found):
        # what Search or a pin found (a refused pin: only its message, the plan stays)
        if not found or found.get("family") != FAMILY:
            raise dash.exceptions.PreventUpdate
        if found.get("doc") is None:
            return no_update, no_update, found.get("pin_error", "")
        return found["doc"], None, found.get("pin_error", "")

    @app.callback(Output(ids.STORE_PLAN, "data", allow_duplicate=True),
                  Input(ids.STORE_LOADED, "data"), State(ids.STORE_REQUEST, "data"),
                  prevent_initial_call="initial_duplicate")
    def _show_loaded(loaded, doc):
        return adopt_loaded(loaded, doc)


__all__ = ["layout", "opened_view", "view_of", "context_lines", "adopt_loaded", "register"]

"""The Tofu page (``/tofu``): the form and Tofu's partition of its request
(:mod:`explorer.views.tofu`: the recursion steps, Figure 11's tiles, Figure 10's comparison,
running the plan on local workers).

``/tofu?model=...&devices=...&algo=icml18`` opens that request with its partition already
made when its method is a Tofu method; with a method of another family the page waits for
**Partition** (with the panel's method).
"""

from __future__ import annotations

import dash
from dash import Input, Output, State, dcc, html, no_update

from explorer.views import ids, pages, state, tofu
from explorer.views import search_form as form

PATH = pages.PATHS["tofu"]
FAMILY = "tofu"


def layout(**query):
    """The page for the query parameters ``query``."""
    doc, errors = pages.open_request(query)
    shown, error = pages.first_result(doc, FAMILY)
    if error:
        errors.append(error)
    return html.Div(className="page tofu-page", children=[
        *pages.stores(FAMILY, doc),
        dcc.Store(id=ids.STORE_TOFU, data=shown),
        form.layout(doc, "\n".join(errors), form.safe_summary(doc)),
        pages.stale_banner(FAMILY),
        html.Div(id=ids.RESULTS + FAMILY, className="results",
                 children=[tofu.layout(doc, shown)]),
    ])


def adopt_loaded(loaded: dict | None, doc: dict | None):
    """The Tofu plan the Plans page loaded, when it answers this page's request."""
    if not loaded or loaded.get("kind") != FAMILY or not doc:
        return no_update
    req = loaded.get("request") or {}
    if not (state.same_target(req, doc) and req.get("algo") == doc.get("algo")):
        return no_update
    return loaded["doc"]


def register(app: dash.Dash) -> None:
    """Register the page (``/tofu``) and its page-wide callbacks on ``app``."""
    dash.register_page("explorer.views.tofu_page", path=PATH, name=pages.NAMES[FAMILY],
                       title="Plan Explorer · Tofu", layout=layout, order=1)

    pages.register_stale(app, FAMILY, ids.STORE_TOFU, ids.TOFU_ALGO)

    @app.callback(Output(ids.CONTEXT + "tofu", "children"),
                  Input(ids.STORE_REQUEST, "data"), Input(ids.STORE_TOFU, "data"),
                  Input(ids.TOFU_ALGO, "value"))
    def _context(doc, shown, algo):
        return state.context_line("tofu", doc, shown, algo)

    @app.callback(Output(ids.STORE_TOFU, "data", allow_duplicate=True),
                  Input(ids.STORE_FOUND, "data"), prevent_initial_call=True)
    def _show_found(found):
        if not found or found.get("family") != FAMILY:
            raise dash.exceptions.PreventUpdate
        return found["doc"]

    @app.callback(Output(ids.STORE_TOFU, "data", allow_duplicate=True),
                  Input(ids.STORE_LOADED, "data"), State(ids.STORE_REQUEST, "data"),
                  prevent_initial_call="initial_duplicate")
    def _show_loaded(loaded, doc):
        return adopt_loaded(loaded, doc)

    @app.callback(Output(ids.TOFU_ERROR, "children", allow_duplicate=True),
                  Output(ids.TOFU_RUN_ERROR, "children", allow_duplicate=True),
                  Input(ids.STORE_REQUEST, "data"), State(ids.STORE_TOFU, "data"),
                  prevent_initial_call=True)
    def _reset(doc, shown):
        # another model than the shown partition's: its errors no longer apply
        if shown and state.same_graph(doc, (shown or {}).get("request")):
            raise dash.exceptions.PreventUpdate
        return "", ""


__all__ = ["layout", "adopt_loaded", "register"]

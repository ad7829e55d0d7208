"""The placement page (``/placement``): the form and a device placement of its request
(:mod:`explorer.views.placement`: the fused graph, the Gantt chart, memory per device,
*Compare all*, pins, running the placement on local workers).

``/placement?model=...&devices=...&algo=metis`` opens that request with its placement already
made when its method is a placement method; with a method of another family the page waits
for **Place** (with the panel's method).
"""

from __future__ import annotations

import dash
from dash import Input, Output, State, dcc, html, no_update

from explorer import service as session
from explorer.views import ids, pages, placement, state
from explorer.views import search_form as form

PATH = pages.PATHS["placement"]
FAMILY = "placement"


def layout(**query):
    """The page for the query parameters ``query``."""
    doc, errors = pages.open_request(query)
    shown, error = pages.first_result(doc, FAMILY)
    if error:
        errors.append(error)
    return html.Div(className="page placement-page", children=[
        *pages.stores(FAMILY, doc),
        dcc.Store(id=ids.STORE_PLACEMENT, data=shown),
        form.layout(doc, "\n".join(errors), form.safe_summary(doc)),
        pages.stale_banner(FAMILY),
        html.Div(id=ids.RESULTS + FAMILY, className="results",
                 children=[placement.layout(doc, shown)]),
    ])


def adopt_loaded(loaded: dict | None, doc: dict | None):
    """``(placement, pin rows)`` the Plans page loaded, when it answers this page's request
    (``no_update`` twice otherwise)."""
    if not loaded or loaded.get("kind") != FAMILY or not doc:
        return no_update, no_update
    req = loaded.get("request") or {}
    if not (state.same_target(req, doc) and req.get("algo") == doc.get("algo")):
        return no_update, no_update
    return loaded["doc"], session.placement_pin_rows(loaded["doc"])


def register(app: dash.Dash) -> None:
    """Register the page (``/placement``) and its page-wide callbacks on ``app``."""
    dash.register_page("explorer.views.placement_page", path=PATH, name=pages.NAMES[FAMILY],
                       title="Plan Explorer · placement", layout=layout, order=2)

    pages.register_stale(app, FAMILY, ids.STORE_PLACEMENT, ids.PLACE_ALGO)

    @app.callback(Output(ids.CONTEXT + "placement", "children"),
                  Input(ids.STORE_REQUEST, "data"), Input(ids.STORE_PLACEMENT, "data"),
                  Input(ids.PLACE_ALGO, "value"))
    def _context(doc, shown, algo):
        return state.context_line("placement", doc, shown, algo)

    @app.callback(Output(ids.STORE_PLACEMENT, "data", allow_duplicate=True),
                  Output(ids.STORE_PLACE_PINS, "data", allow_duplicate=True),
                  Input(ids.STORE_FOUND, "data"), prevent_initial_call=True)
    def _show_found(found):
        if not found or found.get("family") != FAMILY:
            raise dash.exceptions.PreventUpdate
        return found["doc"], []

    @app.callback(Output(ids.STORE_PLACEMENT, "data", allow_duplicate=True),
                  Output(ids.STORE_PLACE_PINS, "data", allow_duplicate=True),
                  Input(ids.STORE_LOADED, "data"), State(ids.STORE_REQUEST, "data"),
                  prevent_initial_call="initial_duplicate")
    def _show_loaded(loaded, doc):
        return adopt_loaded(loaded, doc)

    @app.callback(Output(ids.PLACE_ERROR, "children", allow_duplicate=True),
                  Output(ids.PLACE_PIN_ERROR, "children", allow_duplicate=True),
                  Output(ids.PLACE_RUN_ERROR, "children", allow_duplicate=True),
                  Output(ids.STORE_PLACE_SELECTED, "data", allow_duplicate=True),
                  Output(ids.STORE_PLACE_EXPANDED, "data", allow_duplicate=True),
                  Output(ids.STORE_PLACE_PINS, "data", allow_duplicate=True),
                  Input(ids.STORE_REQUEST, "data"), State(ids.STORE_PLACEMENT, "data"),
                  prevent_initial_call=True)
    def _reset(doc, shown):
        # another model than the shown placement's: its selection, pins and errors go
        if shown and state.same_graph(doc, (shown or {}).get("request")):
            raise dash.exceptions.PreventUpdate
        return "", "", "", None, None, []


__all__ = ["layout", "adopt_loaded", "register"]

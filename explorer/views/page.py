"""The main page (``/``): the form, the graph and the tabs, opened on the request in its URL.

``/?model=NAME&devices=N&preset=P&algo=A&batch=B&arg=K=V&pin=...`` (``arg`` and ``pin``
repeatable) opens exactly that request: the form shows it and its method has already run.
Dash pages calls :func:`layout` with the query parameters; the page then mirrors the request
store back into the address bar (``history.replaceState``, which neither reloads nor re-routes
the page), so a reload or a shared link keeps the state.  Every tab's one line saying what it
operates on is filled here too.
"""

from __future__ import annotations

import dash
from dash import Input, Output, dcc, html

from explorer import service as session
from explorer.errors import ExplorerError
from explorer.views import (
    compare,
    graph,
    ids,
    search_form as model,
    placement,
    plans,
    run,
    state,
    steps,
    tiling,
    tofu,
)

PATH = "/"
TABS = ("plan", "steps", "tiling", "compare", "run", "tofu", "placement", "plans")
CONFIG_KEY = "EXPLORER_DEFAULT_REQUEST"   # in the Flask server's config: the page's default


def default_request() -> dict:
    """The request the page opens on without a query: the serving app's own default (the
    app's default request outside a request, e.g. in tests)."""
    try:
        import flask
        doc = flask.current_app.config.get(CONFIG_KEY)
    except (ImportError, RuntimeError):
        doc = None
    if doc is None:
        doc = state.request_doc(state.DEFAULT_REQUEST)
    return dict(doc)


def first_results(doc: dict) -> dict:
    """Run the request's method once for the page: ``{"plan", "tofu", "placement", "tab",
    "error"}``.  The layer-wise plan is searched in any case (the graph shows it; with the
    request's method when it is layer-wise, else optcnn); a Tofu or placement method also
    runs and its tab opens.  Errors become the plan's ``error`` and the form's message."""
    out = {"plan": None, "tofu": None, "placement": None, "tab": "plan", "error": ""}
    try:
        req = state.request(doc)
    except (ExplorerError, ValueError) as exc:
        out.update(plan={"error": str(exc)}, error=str(exc))
        return out
    fam = state.family(req.algo)
    out["plan"] = model.layerwise_plan(doc)
    if "error" in out["plan"] and doc.get("pins"):
        # a bad pin in the URL must not blank a valid model: show it unpinned, say why
        unpinned = model.layerwise_plan(dict(doc, pins=[]))
        if "error" not in unpinned:
            out["error"] = (f"URL: pins {', '.join(map(str, doc['pins']))} ignored: "
                            f"{out['plan']['error']}")
            out["plan"] = unpinned
            doc["pins"] = []
    if "error" in out["plan"]:
        out["error"] = out["plan"]["error"]
    try:
        if fam == "tofu":
            out.update(tofu=session.tofu(req, req.algo), tab="tofu")
        elif fam == "placement":
            out.update(placement=session.placement(req, req.algo), tab="placement")
    except Exception as exc:  # noqa: BLE001 - shown in the form, the page still opens
        out["error"] = str(exc)
    return out


def layout(**query):
    """The page for the query parameters ``query`` (Dash pages passes them as keywords)."""
    doc, errors = state.from_query(query, default_request())
    first = first_results(doc)
    if first["error"]:
        errors.append(first["error"])
    plan = first["plan"]
    summary = model.safe_summary(doc) if plan and "error" not in plan else ""
    return html.Div(className="page", children=[
        dcc.Store(id=ids.STORE_REQUEST, data=doc),
        dcc.Store(id=ids.STORE_SEEN, data={k: doc.get(k)
                                           for k in ("model", "batch", "model_args")}),
        dcc.Store(id=ids.STORE_PLAN, data=plan),
        dcc.Store(id=ids.STORE_SELECTED, data=None),
        dcc.Store(id=ids.STORE_EXPANDED, data=[]),
        dcc.Store(id=ids.STORE_STEP, data=None),
        dcc.Store(id=ids.STORE_RUN, data=None),
        dcc.Store(id=ids.STORE_TOFU, data=first["tofu"]),
        dcc.Store(id=ids.STORE_PLACEMENT, data=first["placement"]),
        dcc.Store(id=ids.URL_QUERY, data=state.query_string(doc)),
        html.Div(id=ids.URL_SYNC, hidden=True),
        model.layout(doc, "\n".join(errors), summary),
        html.Div(className="main", children=[
            html.Div(className="left", children=[graph.layout()]),
            html.Div(className="right", children=[graph.details_layout()]),
        ]),
        dcc.Tabs(id=ids.TABS, value=first["tab"], className="tabs", children=[
            dcc.Tab(label="Plan", value="plan", children=[graph.plan_layout()]),
            dcc.Tab(label="Elimination steps", value="steps", children=[steps.layout()]),
            dcc.Tab(label="Tiling", value="tiling", children=[tiling.layout()]),
            dcc.Tab(label="Compare", value="compare", children=[compare.layout()]),
            dcc.Tab(label="Run", value="run", children=[run.layout()]),
            dcc.Tab(label="Tofu", value="tofu", children=[tofu.layout(doc)]),
            dcc.Tab(label="Placement", value="placement", children=[placement.layout(doc)]),
            dcc.Tab(label="Plans", value="plans", children=[plans.layout()]),
        ]),
    ])


def context_lines(tabs: list, doc, plan, tofu_doc, placement_doc, tofu_algo, place_algo):
    """The "operates on" line of each tab in ``tabs``."""
    shown = {"layerwise": plan, "tofu": tofu_doc, "placement": placement_doc}
    algo = {"tofu": tofu_algo, "placement": place_algo}
    out = []
    for tab in tabs:
        fam = state.TAB_FAMILY.get(tab)
        out.append(state.context_line(tab, doc, shown.get(fam), algo.get(tab)))
    return out


#: writes the request's query string into the address bar without reloading or re-routing
#: the page (``replaceState`` fires no event the pages router listens to)
_URL_WRITER = """
function(query) {
    if (typeof query === 'string' && window.location.search !== query) {
        window.history.replaceState(window.history.state, '', window.location.pathname + query);
    }
    return '';
}
"""


def register(app: dash.Dash) -> None:
    """Register the page with Dash pages (``/``) and its page-wide callbacks on ``app``."""
    app.server.config.setdefault(CONFIG_KEY, None)
    dash.register_page("explorer.views.page", path=PATH, name="Explorer",
                       title="Plan Explorer", layout=layout, order=0)

    @app.callback(
        [Output(ids.CONTEXT + tab, "children") for tab in TABS],
        Input(ids.STORE_REQUEST, "data"), Input(ids.STORE_PLAN, "data"),
        Input(ids.STORE_TOFU, "data"), Input(ids.STORE_PLACEMENT, "data"),
        Input(ids.TOFU_ALGO, "value"), Input(ids.PLACE_ALGO, "value"),
    )
    def _context(doc, plan, tofu_doc, placement_doc, tofu_algo, place_algo):
        return context_lines(TABS, doc, plan, tofu_doc, placement_doc, tofu_algo, place_algo)

    @app.callback(Output(ids.URL_QUERY, "data"), Input(ids.STORE_REQUEST, "data"),
                  prevent_initial_call=True)
    def _query(doc):
        return state.query_string(doc)

    app.clientside_callback(_URL_WRITER, Output(ids.URL_SYNC, "children"),
                            Input(ids.URL_QUERY, "data"))


__all__ = ["layout", "first_results", "context_lines", "default_request", "register"]

"""What the app's pages share: which page shows which family, the request a page opens on
(its URL's query), the stores every family page holds, and its first result.

The app has one page per method family - layer-wise (``/``), Tofu (``/tofu``), placement
(``/placement``) - and the Plans page (``/plans``), beside Learn (``/learn``).  Each page's
layout is a function of its URL's query (``?model=...&devices=...&preset=...&algo=...&batch=...
&arg=K=V&pin=...``, :mod:`.state`), so a reload or a shared link opens exactly that state; the
header's links carry the current request to the other pages (:mod:`explorer.app`).

A page holds its own working copy of the request (``ids.STORE_REQUEST``: the form writes it,
its callbacks read it) and mirrors it into the shell's ``ids.SHARED_REQUEST``.  A request
whose method belongs to another family keeps it (the form shows it, the URL carries it): the
layer-wise page searches it with optcnn and says where that method's result is shown
(:func:`elsewhere`); the Tofu and placement pages wait for their own method.
"""

from __future__ import annotations

from dash import dcc, html

from explorer import service as session
from explorer.errors import ExplorerError
from explorer.views import ids, state

CONFIG_KEY = "EXPLORER_DEFAULT_REQUEST"   # in the Flask server's config: the pages' default

#: the path of each page that shows a request (the family pages and Plans)
PATHS = state.PAGE_PATHS
#: the header's label of each page
NAMES = {"layerwise": "Layer-wise", "tofu": "Tofu", "placement": "Placement",
         "plans": "Plans", "learn": "Learn"}


def default_request() -> dict:
    """The request a page opens on without a query: the serving app's own default (the
    app's default request outside a request, e.g. in tests)."""
    try:
        import flask
        doc = flask.current_app.config.get(CONFIG_KEY)
    except (ImportError, RuntimeError):
        doc = None
    if doc is None:
        doc = state.request_doc(state.DEFAULT_REQUEST)
    return dict(doc)


def open_request(query: dict) -> tuple[dict, list]:
    """``(request dict, errors)`` for a page's query parameters (Dash pages passes them as
    keywords; a bad parameter keeps the default's value and adds one line)."""
    return state.from_query(query, default_request())


url = state.page_url


def elsewhere(doc: dict, family: str):
    """A line for a page whose request's method belongs to another family: where that
    method's result is shown, with a link to it (``None`` when the method is the page's)."""
    fam = state.family((doc or {}).get("algo"))
    if fam in (None, family) or fam not in PATHS:
        return None
    return html.Div(className="muted family-hint", id=ids.FAMILY_HINT, children=[
        f"{doc['algo']} is a {state.FAMILY_LABELS[fam]} method: this page shows "
        f"{state.DEFAULT_METHOD[family]} on the same request; ",
        html.A(f"open the {NAMES[fam]} page", href=url(fam, doc)), "."])


def stores(family: str, doc: dict) -> list:
    """The stores every page that shows a request holds: which page it is, its request, what
    the form's Search found on it, and the address its callbacks open (the shell opens it)."""
    return [dcc.Store(id=ids.PAGE_FAMILY, data=family),
            dcc.Store(id=ids.STORE_REQUEST, data=doc),
            dcc.Store(id=ids.STORE_FOUND, data=None),
            dcc.Store(id=ids.NAVIGATE, data=None),
            dcc.Store(id=ids.SAVED + family, data=None)]


def stale_banner(family: str):
    """The banner over a page's results that says they answer another request than the form
    (filled by :func:`register_stale`; hidden while they match)."""
    return html.Div(id=ids.STALE + family, className="stale-banner", hidden=True, role="alert")


def stale_view(tab: str, doc: dict | None, shown: dict | None, tab_algo: str | None = None):
    """``(banner text, banner hidden, results class)`` for :func:`stale_banner`: the results
    are dimmed while they answer another request than the form."""
    note = state.stale_note(tab, doc, shown, tab_algo)
    return note, not note, "results stale" if note else "results"


def register_stale(app, family: str, shown_store: str, tab_algo_id: str | None = None) -> None:
    """The callback of ``family``'s page that shows or hides its stale banner as the form
    (``ids.STORE_REQUEST``) or the shown result (``shown_store``) changes."""
    from dash import Input, Output
    inputs = [Input(ids.STORE_REQUEST, "data"), Input(shown_store, "data")]
    if tab_algo_id:
        inputs.append(Input(tab_algo_id, "value"))
    tab = "plan" if family == "layerwise" else family

    @app.callback(Output(ids.STALE + family, "children"), Output(ids.STALE + family, "hidden"),
                  Output(ids.RESULTS + family, "className"), *inputs)
    def _stale(doc, shown, tab_algo=None):
        return stale_view(tab, doc, shown, tab_algo)


def first_result(doc: dict, family: str) -> tuple[dict | None, str]:
    """``(result, error)`` a family page opens with: the layer-wise page always searches (with
    the request's method when layer-wise, else optcnn); the Tofu and placement pages run the
    request's method when it is theirs, and show nothing yet otherwise.  A bad pin in the URL
    keeps the model on screen, unpinned, with one line naming the pin (``doc``'s pins are
    dropped)."""
    try:
        req = state.request(doc)
    except (ExplorerError, ValueError) as exc:
        return ({"error": str(exc)} if family == "layerwise" else None), str(exc)
    if family == "layerwise":
        from explorer.views.search_form import layerwise_plan
        plan = layerwise_plan(doc)
        if "error" in plan and doc.get("pins"):
            unpinned = layerwise_plan(dict(doc, pins=[]))
            if "error" not in unpinned:
                err = (f"URL: pins {', '.join(map(str, doc['pins']))} ignored: "
                       f"{plan['error']}")
                doc["pins"] = []
                return unpinned, err
        return plan, plan.get("error", "")
    if state.family(req.algo) != family:
        return None, ""
    try:
        if family == "tofu":
            return session.tofu(req, req.algo), ""
        return session.placement(req, req.algo), ""
    except Exception as exc:  # noqa: BLE001 - shown in the form, the page still opens
        return None, str(exc)


__all__ = ["CONFIG_KEY", "PATHS", "NAMES", "default_request", "open_request", "url",
           "elsewhere", "stores", "stale_banner", "stale_view", "register_stale",
           "first_result"]

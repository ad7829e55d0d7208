"""The Dash app: the shell (header, page navigation, the stores every page shares), the
background-callback manager, and serving it.

The app uses Dash pages, one module per page: the layer-wise page (``/``,
:mod:`explorer.views.layerwise_page`: the form, the graph and the tabs Plan, Elimination
steps, Tiling, Compare, Run), the Tofu page (``/tofu``), the placement page (``/placement``),
the Plans page (``/plans``) and Learn (``/learn``).  Each opens on the request in its URL
(:mod:`explorer.views.pages`).  The shell holds what the pages share: the request of the page
shown last (the header's links carry it to the other pages, and the address bar follows it),
a plan the Plans page loaded (handed to its family's page), and the opener of the address a
page's callback writes (``ids.NAVIGATE``: Search with another family's method, loading a
plan).  Each panel lives in ``explorer/views/<panel>.py`` with its layout,
its pure figure-building functions and a ``register(app)`` that adds its callbacks to one app
(no global callback registry, so tests and benchmarks can build several apps in one process).
``explorer serve`` opens it on VGG-16 on the 4×P100 NVLink preset with its optimal plan.
"""

from __future__ import annotations

import errno
import ipaddress
import os
import socket
import sys
import tempfile

import dash
from dash import Dash, dcc, html

from explorer import service as session
from explorer.views import state

DEFAULT_REQUEST = state.DEFAULT_REQUEST


def background_manager():
    """``CeleryManager`` when ``REDIS_URL`` is set, else a ``DiskcacheManager``."""
    redis_url = os.environ.get("REDIS_URL")
    if redis_url:
        try:
            from celery import Celery
        except ImportError:
            raise SystemExit("REDIS_URL is set but celery is not installed: "
                             "pip install 'celery[redis]', or unset REDIS_URL to use the "
                             "disk cache") from None
        celery_app = Celery(__name__, broker=redis_url, backend=redis_url)
        return dash.CeleryManager(celery_app)
    import diskcache

    from explorer.engine.core.storage import home
    try:
        path = str(home() / "dash-cache")
    except OSError:
        path = os.path.join(tempfile.gettempdir(), "plan-explorer-dash-cache")
    return dash.DiskcacheManager(diskcache.Cache(path))


def initial_state(request: session.Request | None):
    """The request dict and the layer-wise plan the default page opens with (the plan is
    ``{"error": ...}`` when it cannot be found)."""
    from explorer.views import pages
    doc = state.request_doc(request or DEFAULT_REQUEST)
    return doc, pages.first_result(doc, "layerwise")[0]


#: the header's pages, in order: (key, path); the request-carrying ones get its query
HEADER_PAGES = (("layerwise", "/"), ("tofu", "/tofu"), ("placement", "/placement"),
                ("plans", "/plans"), ("learn", "/learn"))


def nav_hrefs(doc: dict | None) -> list:
    """The header links' addresses for request ``doc``: every page that shows a request
    opens on it (Learn has its own scenarios)."""
    query = state.query_string(doc)
    return [path if key == "learn" else path + query for key, path in HEADER_PAGES]


def shell():
    """The app's layout around the pages: the header and the stores the pages share.  The
    header's links, and the pages callbacks open, load their page from its address (the
    address bar follows the request by ``replaceState``, which the pages router does not see,
    so routing inside the app could start from a stale address)."""
    from explorer.views import ids, pages
    return html.Div(className="app", children=[
        dcc.Store(id=ids.SHARED_REQUEST, data=None),
        dcc.Store(id=ids.STORE_LOADED, data=None, storage_type="session"),
        dcc.Store(id=ids.URL_QUERY, data=None),
        html.Div(id=ids.URL_SYNC, hidden=True),
        html.Div(id=ids.NAVIGATE_SYNC, hidden=True),
        html.Header(className="header", children=[
            html.H1("Plan Explorer"),
            html.Span("parallelization plans: inspect, pin, re-run, execute",
                      className="subtitle"),
            html.Nav(className="pages", children=[
                html.A(pages.NAMES[key], href=path, id=ids.NAV_LINK + key,
                       className="page-link")
                for key, path in HEADER_PAGES]),
        ]),
        dash.page_container,
    ])


#: writes the request's query string into the address bar without reloading or re-routing
#: the page (``replaceState`` fires no event the pages router listens to)
#: opens the address a callback wrote (a page load: the new page opens on its URL's request)
_OPENER = """
function(href) {
    if (typeof href === 'string' && href) { window.location.assign(href); }
    return '';
}
"""

_URL_WRITER = """
function(query) {
    if (typeof query === 'string' && query && window.location.search !== query) {
        window.history.replaceState(window.history.state, '', window.location.pathname + query);
    }
    return '';
}
"""


def register_shell(app: Dash) -> None:
    """The shell's callbacks: a page's request becomes the shared one; the header's links and
    the address bar follow it."""
    from dash import Input, Output

    from explorer.views import ids

    @app.callback(Output(ids.SHARED_REQUEST, "data"),
                  Input(ids.STORE_REQUEST, "data", allow_optional=True))
    def _share(doc):
        if not doc:
            raise dash.exceptions.PreventUpdate
        return doc

    @app.callback([Output(ids.NAV_LINK + key, "href") for key, _ in HEADER_PAGES],
                  Input(ids.SHARED_REQUEST, "data"))
    def _links(doc):
        if not doc:
            raise dash.exceptions.PreventUpdate
        return nav_hrefs(doc)

    @app.callback(Output(ids.URL_QUERY, "data"), Input(ids.SHARED_REQUEST, "data"),
                  Input(ids.STORE_VIEW, "data", allow_optional=True))
    def _query(doc, view):
        # the request, and the view of the page that keeps one (tab, layer, step)
        if not doc:
            raise dash.exceptions.PreventUpdate
        return state.query_string(doc, view)

    app.clientside_callback(_URL_WRITER, Output(ids.URL_SYNC, "children"),
                            Input(ids.URL_QUERY, "data"))
    app.clientside_callback(_OPENER, Output(ids.NAVIGATE_SYNC, "children"),
                            Input(ids.NAVIGATE, "data", allow_optional=True))


def create_app(request: session.Request | None = None, allow_model_files: bool = False) -> Dash:
    """Build the app: its pages open on ``request`` (default VGG-16 on 4×P100 NVLink) unless
    their URL says otherwise; ``allow_model_files`` lets the pages load ``path.py:function``
    models, which runs their code on this machine (a process-wide setting, see
    :mod:`explorer.views.state`)."""
    from explorer.views import (
        compare,
        families,
        graph,
        layerwise_page,
        learn,
        pages,
        placement,
        placement_page,
        plans,
        plans_page,
        ranking,
        run,
        search_form,
        steps,
        tiling,
        tofu,
        tofu_page,
    )

    state.allow_model_files(allow_model_files)
    app = Dash(__name__, title="Plan Explorer", use_pages=True, pages_folder="",
               suppress_callback_exceptions=True,
               background_callback_manager=background_manager(),
               assets_folder=os.path.join(os.path.dirname(os.path.dirname(__file__)), "assets"))
    app.server.config[pages.CONFIG_KEY] = state.request_doc(request or DEFAULT_REQUEST)
    for view in (layerwise_page, tofu_page, placement_page, plans_page, search_form, graph,
                 steps, tiling, compare, families, ranking, run, tofu, placement, plans, learn):
        view.register(app)
    register_shell(app)
    app.layout = shell()
    return app


# -- serving ----------------------------------------------------------------------------------

LOOPBACK_NAMES = ("localhost",)


def is_loopback(host: str) -> bool:
    """Whether ``host`` only accepts connections from this machine (127.0.0.0/8, ::1,
    localhost)."""
    h = (host or "").strip().strip("[]").lower()
    if h in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(h).is_loopback
    except ValueError:
        return False


def check_address(host: str, port) -> str | None:
    """A one-line error for a host or port the server cannot bind (``None`` when fine)."""
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        return f"error: port {port} is out of range: choose a port from 1 to 65535"
    if not (host or "").strip():
        return "error: give an address to bind with --host, e.g. 127.0.0.1"
    try:
        socket.getaddrinfo(host.strip("[]"), port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        why = getattr(exc, "strerror", None) or str(exc)
        return f"error: cannot serve on host {host!r}: {why}"
    return None


def exposure_warning(host: str, allow_model_files: bool = False) -> str | None:
    """The warning printed when the server listens beyond this machine."""
    if is_loopback(host):
        return None
    text = (f"warning: serving on {host}, not only on this machine: anyone who can reach this "
            f"address can use Plan Explorer here - search, place, and run plans on this "
            f"machine's processors; there is no login")
    if allow_model_files:
        text += (" - and, with --allow-model-files, make it import and run any path.py:"
                 "function model file this server can read")
    return text + ". Use --host 127.0.0.1 to keep it to this machine."


def port_free(host: str, port: int) -> bool:
    """Whether ``port`` on ``host`` can be bound (in use or forbidden: ``False``)."""
    for family, kind, proto, _, addr in socket.getaddrinfo(host.strip("[]"), port,
                                                           type=socket.SOCK_STREAM):
        with socket.socket(family, kind, proto) as s:
            try:
                s.bind(addr)
            except OSError as exc:
                if exc.errno in (errno.EADDRINUSE, errno.EACCES):
                    return False
                raise
        return True
    return True


def serve(host: str = "127.0.0.1", port: int = 8050, debug: bool = False,
          request: session.Request | None = None, allow_model_files: bool = False) -> int:
    """Start the app.  A bad host or port, a port in use, or ``debug`` beyond this machine
    (the debugger runs code for whoever reaches it) is a one-line error and exit status 2;
    a host other than loopback prints a warning first."""
    err = check_address(host, port)
    if err is None and debug and not is_loopback(host):
        err = (f"error: --debug on {host} would let anyone who reaches it run code through "
               f"the debugger: use --host 127.0.0.1 with --debug")
    if err is None:
        try:
            if not port_free(host, port):
                err = (f"error: port {port} on {host} is already in use: stop the other "
                       f"server or choose another with --port")
        except OSError as exc:
            err = f"error: cannot serve on {host}:{port}: {exc.strerror or exc}"
    if err:
        print(err, file=sys.stderr)
        return 2
    warning = exposure_warning(host, allow_model_files)
    if warning:
        print(warning, file=sys.stderr, flush=True)
    app = create_app(request, allow_model_files=allow_model_files)
    shown = f"[{host}]" if ":" in host else host
    print(f"Plan Explorer on http://{shown}:{port}/  (Ctrl+C stops it)"
          + ("; model files allowed" if allow_model_files else ""), flush=True)
    app.run(host=host, port=port, debug=debug)
    return 0

"""The Dash app: the shell (header, page navigation), the background-callback manager, and
serving it.

The app uses Dash pages: the main page (``/``, :mod:`explorer.views.page`) holds the form,
the graph and the tabs, and opens on the request in its URL; more pages register the same
way.  Each panel lives in ``explorer/views/<panel>.py`` with its layout, its pure
figure-building functions and a ``register(app)`` that adds its callbacks to one app (no
global callback registry, so tests and benchmarks can build several apps in one process).
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
    from explorer.views import page
    doc = state.request_doc(request or DEFAULT_REQUEST)
    return doc, page.first_results(doc)["plan"]


def create_app(request: session.Request | None = None, allow_model_files: bool = False) -> Dash:
    """Build the app: the page opens on ``request`` (default VGG-16 on 4×P100 NVLink) unless
    its URL says otherwise; ``allow_model_files`` lets the page load ``path.py:function``
    models, which runs their code on this machine (a process-wide setting, see
    :mod:`explorer.views.state`)."""
    from explorer.views import (
        compare,
        graph,
        learn,
        search_form as model,
        page,
        placement,
        plans,
        run,
        steps,
        tiling,
        tofu,
    )

    state.allow_model_files(allow_model_files)
    app = Dash(__name__, title="Plan Explorer", use_pages=True, pages_folder="",
               suppress_callback_exceptions=True,
               background_callback_manager=background_manager(),
               assets_folder=os.path.join(os.path.dirname(os.path.dirname(__file__)), "assets"))
    app.server.config[page.CONFIG_KEY] = state.request_doc(request or DEFAULT_REQUEST)
    for view in (page, model, graph, steps, tiling, compare, run, tofu, placement, plans, learn):
        view.register(app)
    app.layout = html.Div(className="app", children=[
        html.Header(className="header", children=[
            html.H1("Plan Explorer"),
            html.Span("parallelization plans: inspect, pin, re-run, execute",
                      className="subtitle"),
            html.Nav(className="pages", children=[
                dcc.Link(p["name"], href=p["relative_path"], className="page-link")
                for p in dash.page_registry.values()]),
        ]),
        dash.page_container,
    ])
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

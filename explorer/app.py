"""The Dash app: shared stores, the background-callback manager, and the page of panels.

Each panel lives in ``explorer/views/<panel>.py`` with its layout and its callbacks side by
side; this module only assembles them and owns the ``dcc.Store`` components they share.
``explorer serve`` opens it on VGG-16 on the 4×P100 NVLink preset with its optimal plan.
"""

from __future__ import annotations

import errno
import os
import socket
import sys
import tempfile

import dash
from dash import Dash, dcc, html

from . import service as session
from .views import ids

DEFAULT_REQUEST = session.Request(model="vgg16", preset="p100-nvlink-4", devices=4,
                                  algo="optcnn")


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

    from .engine.storage import home
    try:
        path = str(home() / "dash-cache")
    except OSError:
        path = os.path.join(tempfile.gettempdir(), "plan-explorer-dash-cache")
    return dash.DiskcacheManager(diskcache.Cache(path))


def initial_state(request: session.Request | None):
    """The request and its plan the page opens with (``None`` plan if it cannot be found)."""
    req = request or DEFAULT_REQUEST
    try:
        plan = session.search(req, [])
    except Exception as exc:  # noqa: BLE001 - the page still opens and shows the error
        plan = {"error": str(exc)}
    return req.to_dict(), plan


_CALLBACKS = None


def _register_views():
    """Import the panels (their ``@dash.callback``s land in Dash's global registry) and hand
    every new app its own copy: Dash moves the global callbacks into the first app that
    starts, and tests and benchmarks create several apps in one process."""
    from dash import _callback as registry

    from .views import compare, graph, model, plans, run, steps, tiling, tofu  # noqa: F401
    from .views import placement  # noqa: F401
    global _CALLBACKS
    if _CALLBACKS is None:
        _CALLBACKS = (list(registry.GLOBAL_CALLBACK_LIST), dict(registry.GLOBAL_CALLBACK_MAP),
                      list(registry.GLOBAL_INLINE_SCRIPTS))
    registry.GLOBAL_CALLBACK_LIST[:] = list(_CALLBACKS[0])
    registry.GLOBAL_CALLBACK_MAP.clear()
    registry.GLOBAL_CALLBACK_MAP.update(_CALLBACKS[1])
    registry.GLOBAL_INLINE_SCRIPTS[:] = list(_CALLBACKS[2])


def create_app(request: session.Request | None = None) -> Dash:
    """Build the app (its panels' callbacks are registered when their modules import)."""
    from .views import compare, graph, model, plans, run, steps, tiling, tofu
    from .views import placement

    _register_views()

    req_doc, plan = initial_state(request)
    app = Dash(__name__, title="Plan Explorer", suppress_callback_exceptions=True,
               background_callback_manager=background_manager(),
               assets_folder=os.path.join(os.path.dirname(os.path.dirname(__file__)), "assets"))
    app.layout = html.Div(className="app", children=[
        dcc.Store(id=ids.STORE_REQUEST, data=req_doc),
        dcc.Store(id=ids.STORE_PLAN, data=plan),
        dcc.Store(id=ids.STORE_PINS, data=plan.get("pins", []) if plan else []),
        dcc.Store(id=ids.STORE_SELECTED, data=None),
        dcc.Store(id=ids.STORE_EXPANDED, data=[]),
        dcc.Store(id=ids.STORE_STEP, data=None),
        dcc.Store(id=ids.STORE_RUN, data=None),
        dcc.Store(id=ids.STORE_TOFU, data=None),
        dcc.Store(id=ids.STORE_PLACEMENT, data=None),
        html.Header(className="header", children=[
            html.H1("Plan Explorer"),
            html.Span("layer-wise parallelization plans: inspect, pin, re-run",
                      className="subtitle"),
        ]),
        model.layout(req_doc),
        html.Div(className="main", children=[
            html.Div(className="left", children=[graph.layout()]),
            html.Div(className="right", children=[graph.details_layout()]),
        ]),
        dcc.Tabs(id=ids.TABS, value="plan", className="tabs", children=[
            dcc.Tab(label="Plan", value="plan", children=[graph.plan_layout()]),
            dcc.Tab(label="Elimination steps", value="steps", children=[steps.layout()]),
            dcc.Tab(label="Tiling", value="tiling", children=[tiling.layout()]),
            dcc.Tab(label="Compare", value="compare", children=[compare.layout()]),
            dcc.Tab(label="Run", value="run", children=[run.layout()]),
            dcc.Tab(label="Tofu", value="tofu", children=[tofu.layout()]),
            dcc.Tab(label="Placement", value="placement", children=[placement.layout()]),
            dcc.Tab(label="Plans", value="plans", children=[plans.layout()]),
        ]),
    ])
    return app


def port_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError as exc:
            if exc.errno in (errno.EADDRINUSE, errno.EACCES):
                return False
            raise
    return True


def serve(host: str = "127.0.0.1", port: int = 8050, debug: bool = False,
          request: session.Request | None = None) -> int:
    """Start the app; a port already in use is a one-line error, not a traceback."""
    if not port_free(host, port):
        print(f"error: port {port} on {host} is already in use: stop the other server or "
              f"choose another with --port", file=sys.stderr)
        return 2
    app = create_app(request)
    print(f"Plan Explorer on http://{host}:{port}/  (Ctrl+C stops it)", flush=True)
    app.run(host=host, port=port, debug=debug)
    return 0

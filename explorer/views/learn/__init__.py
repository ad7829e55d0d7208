"""The Learn page (``/learn``): the figures of OptCNN, Tofu and Celeritas as live scenarios.

One tab per scenario (``optcnn``, ``tofu``, ``celeritas`` modules, one per paper); a tab's
content is built only when it is opened (``?s=KEY`` opens one directly), so the page's first
render computes nothing, and each scenario computes its figure through the service in its own
callbacks (captures and searches are cached there).  A short guided tour opens on the first
visit (remembered in the browser's local storage) and again from the "Tour" button.
"""

from __future__ import annotations

import dash
from dash import Input, Output, State, ctx, dcc, html

from explorer.views import ids
from explorer.views.learn import celeritas, optcnn, tofu

PATH = "/learn"
MODULES = (optcnn, tofu, celeritas)
#: scenario key -> tab label, in page order
SCENARIOS = {m.K + k: label for m in MODULES for k, label in m.SCENARIOS.items()}
LAYOUTS = {k: f for m in MODULES for k, f in m.LAYOUTS.items()}
DEFAULT = "optcnn-dims"

TOUR = [
    ("Welcome to Learn", "Each tab is one figure or table of the three papers - OptCNN "
     "(layer-wise parallelism), Tofu (tensor partitioning) and Celeritas (device placement) - "
     "recomputed now by this app's engine."),
    ("Change the controls", "Devices, batch, bandwidth, sizes: every change re-runs the real "
     "cost model, geometry, search or analysis and redraws the figure."),
    ("Ours beside the paper's", "The right column quotes what the paper reports; the numbers "
     "under our figure are computed live. They differ where our machine model or scaled-down "
     "model differs - the shapes should match."),
    ("Open it in the explorer", "The link under each scenario opens the same model, devices "
     "and method on the main page, where you can pin layers, compare methods and run plans."),
]


def layout(s: str | None = None, **_query):
    """The page; ``s`` (query parameter) chooses the scenario shown first."""
    first = s if s in SCENARIOS else DEFAULT
    return html.Div(className="page learn-page", children=[
        dcc.Store(id=ids.STORE_LEARN_TOUR, storage_type="local"),
        dcc.Store(id=ids.STORE_LEARN_STEP, data=None),
        html.Div(id=ids.LEARN_URL_SYNC, hidden=True),
        html.Div(className="learn-head", children=[
            html.P("The papers' figures, computed live by our engine: change a control and the "
                   "figure is recomputed; the paper's numbers stand beside ours.",
                   className="learn-intro"),
            html.Button("Tour", id=ids.LEARN_TOUR_OPEN, className="learn-tour-button",
                        n_clicks=0),
        ]),
        dcc.Tabs(id=ids.LEARN_TABS, value=first, className="learn-tabs", children=[
            dcc.Tab(label=label, value=key, className="learn-tab")
            for key, label in SCENARIOS.items()]),
        html.Div(id=ids.LEARN_BODY, className="learn-content", children=LAYOUTS[first]()),
        html.Div(id=ids.LEARN_TOUR, className="learn-tour", hidden=True, children=[
            html.Div(className="learn-tour-card", role="dialog", children=[
                html.Div(id=ids.LEARN_TOUR_STEP),
                html.Div(className="learn-tour-buttons", children=[
                    html.Button("Back", id=ids.LEARN_TOUR_BACK, n_clicks=0),
                    html.Button("Next", id=ids.LEARN_TOUR_NEXT, n_clicks=0),
                    html.Button("Close", id=ids.LEARN_TOUR_CLOSE, n_clicks=0,
                                className="learn-tour-close"),
                ]),
            ]),
        ]),
    ])


#: the shown scenario goes into the address (``?s=KEY``) without reloading, so a reload or
#: a shared link opens the same tab
_URL_WRITER = """
function(key) {
    if (typeof key === 'string' && key) {
        const q = '?s=' + encodeURIComponent(key);
        if (window.location.search !== q) {
            window.history.replaceState(window.history.state, '', window.location.pathname + q);
        }
    }
    return '';
}
"""


def tour_step(step) -> tuple:
    """``(hidden, content)`` of the tour overlay for step index ``step`` (``None``: closed)."""
    if step is None:
        return True, []
    i = max(0, min(int(step), len(TOUR) - 1))
    title, text = TOUR[i]
    return False, [html.H3(title), html.P(text),
                   html.Small(f"{i + 1} / {len(TOUR)}", className="learn-tour-count")]


def register(app: dash.Dash) -> None:
    """Register the page (``/learn``) and its callbacks, and every scenario's."""
    dash.register_page("explorer.views.learn", path=PATH, name="Learn",
                       title="Plan Explorer – Learn", layout=layout, order=1)
    for m in MODULES:
        m.register(app)

    app.clientside_callback(_URL_WRITER, Output(ids.LEARN_URL_SYNC, "children"),
                            Input(ids.LEARN_TABS, "value"), prevent_initial_call=True)

    @app.callback(Output(ids.LEARN_BODY, "children"), Input(ids.LEARN_TABS, "value"),
                  prevent_initial_call=True)
    def _scenario(key):
        if key not in LAYOUTS:
            raise dash.exceptions.PreventUpdate
        return LAYOUTS[key]()

    @app.callback(Output(ids.STORE_LEARN_STEP, "data"), Output(ids.STORE_LEARN_TOUR, "data"),
                  Input(ids.STORE_LEARN_TOUR, "modified_timestamp"),
                  Input(ids.LEARN_TOUR_OPEN, "n_clicks"), Input(ids.LEARN_TOUR_NEXT, "n_clicks"),
                  Input(ids.LEARN_TOUR_BACK, "n_clicks"), Input(ids.LEARN_TOUR_CLOSE, "n_clicks"),
                  State(ids.STORE_LEARN_TOUR, "data"), State(ids.STORE_LEARN_STEP, "data"))
    def _tour(_ts, _open, _next, _back, _close, seen, step):
        trigger = ctx.triggered_id
        if trigger == ids.LEARN_TOUR_OPEN:
            return 0, dash.no_update
        if trigger == ids.LEARN_TOUR_CLOSE:
            return None, {"seen": True}
        if trigger == ids.LEARN_TOUR_NEXT and step is not None:
            if step + 1 >= len(TOUR):
                return None, {"seen": True}
            return step + 1, dash.no_update
        if trigger == ids.LEARN_TOUR_BACK and step is not None:
            return max(step - 1, 0), dash.no_update
        if trigger in (None, ids.STORE_LEARN_TOUR) and step is None:
            # first visit: the store is empty in this browser
            return (0 if not (seen or {}).get("seen") else None), dash.no_update
        raise dash.exceptions.PreventUpdate

    @app.callback(Output(ids.LEARN_TOUR, "hidden"), Output(ids.LEARN_TOUR_STEP, "children"),
                  Input(ids.STORE_LEARN_STEP, "data"))
    def _tour_view(step):
        return tour_step(step)


__all__ = ["layout", "register", "tour_step", "SCENARIOS", "PATH"]

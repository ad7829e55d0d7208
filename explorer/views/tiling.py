"""Tiling panel: how one layer's tensors are tiled across devices, and all layers side by side.

The figures (:func:`~explorer.views.figures.tiling.tiling_figure`, one layer's tiles, and
:func:`~explorer.views.figures.tiling.strip_figure`, every layer in plan order) are drawn by
:mod:`explorer.views.figures.tiling` from plain dicts.  The callbacks here only pick the
layer/device, call :mod:`explorer.service`, and hand the dicts to those functions;
:func:`register` wires them to an app while the undecorated functions (:func:`choose_layer`,
:func:`device_choice`, :func:`render_figure`, :func:`render_strip`) stay importable for tests.
"""

from __future__ import annotations

import dash
from dash import Input, Output, State, dcc, html

from explorer.views import ids
from explorer.views import state
from explorer.views.controls import context
from explorer.views.figures import tiling as F
from explorer.views.figures.tiling import plan_message, plan_ok

# --------------------------------------------------------------------------------------------
# Plan helpers (pure)
# --------------------------------------------------------------------------------------------


def default_layer(plan) -> str | None:
    """First conv layer partitioned along h or w, else the first non-input layer."""
    if not plan_ok(plan):
        return None
    layers = plan["layers"]
    for la in layers:
        cfg = la.get("config", {})
        if la.get("op") == "conv" and (cfg.get("h", 1) > 1 or cfg.get("w", 1) > 1):
            return la["name"]
    for la in layers:
        if la.get("op") != "input":
            return la["name"]
    return layers[0]["name"]


def layer_entry(plan, name):
    if not plan_ok(plan):
        return None
    for la in plan["layers"]:
        if la["name"] == name:
            return la
    return None


def layer_options(plan) -> list:
    if not plan_ok(plan):
        return []
    return [{"label": f"{la['name']}  ·  {la.get('op', '?')}  ·  {la.get('config_label', '')}",
             "value": la["name"]} for la in plan["layers"]]


# --------------------------------------------------------------------------------------------
# Layout and callbacks
# --------------------------------------------------------------------------------------------

_HELP = ("Each tile of a tensor is coloured by the device that owns it (OptCNN Section 4). "
         "Grey cells with coloured chips are held by several devices: split along axes shown "
         "in another grid, or a replicated weight shard (×r). Dashed rectangles on an input "
         "are the region a device needs to compute its output tile; the part reaching over a "
         "neighbour's tile is the halo it must receive. Pick a device to highlight it.")


def layout():
    """The tiling panel: layer and device pickers, the layer figure, the strip of all layers."""
    return html.Div(className="panel tiling-panel", children=[
        context("tiling"),
        html.Div(className="row tiling-controls", children=[
            html.Label(className="grow", children=[
                "Layer", dcc.Dropdown(id=ids.TILING_LAYER, options=[], value=None,
                                      clearable=False, placeholder="layer")]),
            html.Label(className="tiling-device-label", children=[
                "Device", dcc.Dropdown(id=ids.TILING_DEVICE,
                                       options=[{"label": "all devices", "value": "all"}],
                                       value="all", clearable=False)]),
        ]),
        html.P(_HELP, className="muted tiling-help"),
        dcc.Loading(type="dot", children=html.Div(
            id=ids.TILING_FIGURE, className="tiling-figure",
            children=message("No plan yet: run a search."))),
        dcc.Graph(id=ids.TILING_STRIP, className="tiling-strip",
                  figure=F.message_figure("No plan yet."),
                  config={"displayModeBar": False, "scrollZoom": False}),
    ])


def message(text: str):
    return html.Div(text, className="tiling-message muted")


def choose_layer(plan, selected, click, current, trigger=None):
    """``(options, value)`` of the layer dropdown.

    A click on the strip wins, then a new selection in the graph (``STORE_SELECTED``), then —
    when only the plan changed — the layer already shown; anything stale falls back to
    :func:`default_layer`.
    """
    if not plan_ok(plan):
        return [], None
    names = {la["name"] for la in plan["layers"]}
    options = layer_options(plan)
    clicked = None
    if click and click.get("points"):
        clicked = click["points"][0].get("customdata")
    if trigger == ids.TILING_STRIP and clicked in names:
        return options, clicked
    if trigger == ids.STORE_SELECTED and selected in names:
        return options, selected
    if trigger is not None and current in names:
        return options, current
    if selected in names:
        return options, selected
    return options, default_layer(plan)


def device_choice(plan, layer, current):
    """``(options, value)`` of the device dropdown: ``all`` and the layer's devices."""
    opts = [{"label": "all devices", "value": "all"}]
    la = layer_entry(plan, layer)
    if la is None:
        return opts, "all"
    devs = [int(d) for d in la.get("devices", [])]
    opts += [{"label": f"device {d}", "value": d} for d in devs]
    try:
        cur = int(current) if current not in (None, "all", "") else "all"
    except (TypeError, ValueError):
        cur = "all"
    return opts, cur if cur == "all" or cur in devs else "all"


def _request_of(plan, request):
    doc = plan.get("request") if isinstance(plan, dict) and plan.get("request") else request
    return state.request(doc)


def layer_geometry(plan, request, layer):
    """``(geom, producers)`` for ``layer`` under its planned configuration, from session."""
    from explorer import service as session
    req = _request_of(plan, request)
    la = layer_entry(plan, layer)
    geom = session.tiles(req, la["name"], la["config"], la["devices"])
    producers = {}
    for inp in geom["inputs"]:
        src = inp["src"]
        pl = layer_entry(plan, src)
        if pl is None or src in producers:
            continue
        pg = session.tiles(req, src, pl["config"], pl["devices"])
        producers[src] = {"boxes": pg["boxes"], "devices": pg["devices"],
                          "config_label": pl.get("config_label", "")}
    return geom, producers


def render_figure(plan, request, layer, device):
    """The children of ``TILING_FIGURE``: the layer's tiling graph, or a message."""
    msg = plan_message(plan)
    if msg:
        return message(msg)
    if layer_entry(plan, layer) is None:
        layer = default_layer(plan)
    try:
        geom, producers = layer_geometry(plan, request, layer)
    except Exception as exc:  # noqa: BLE001 - a plan from another model: explain, don't crash
        return message(f"Cannot draw {layer}: {exc}")
    fig = F.tiling_figure(geom, device, producers)
    return dcc.Graph(figure=fig, className="tiling-graph",
                     config={"displayModeBar": False, "scrollZoom": False})


def render_strip(plan, layer, tab="tiling"):
    """The strip of every layer's tiling, drawn while the Tiling tab is shown (opening it
    draws the current plan's; 0.2 s on a 2,000-layer plan)."""
    if tab != "tiling":
        return dash.no_update
    return F.strip_figure(plan, layer)


def _cb_layer(plan, selected, click, current):
    try:
        trigger = dash.ctx.triggered_id
    except Exception:  # noqa: BLE001 - called directly (tests), outside a Dash request
        trigger = None
    return choose_layer(plan, selected, click, current, trigger)


def _cb_device(layer, plan, current):
    return device_choice(plan, layer, current)


def _cb_figure(layer, device, plan, tab, request):
    # drawn while the Tiling tab is shown, as the strip (opening it draws the current plan's):
    # on a page load it was the last of the callbacks, 0.3 s, for a tab nobody had opened
    if tab != "tiling":
        return dash.no_update
    return render_figure(plan, request, layer, device)


def _cb_strip(plan, layer, tab="tiling"):
    return render_strip(plan, layer, tab)


def register(app: dash.Dash) -> None:
    """The panel's callbacks on ``app`` (the functions stay importable for tests)."""
    app.callback(Output(ids.TILING_LAYER, "options"), Output(ids.TILING_LAYER, "value"),
                 Input(ids.STORE_PLAN, "data"), Input(ids.STORE_SELECTED, "data"),
                 Input(ids.TILING_STRIP, "clickData"), State(ids.TILING_LAYER, "value"))(
        _cb_layer)
    app.callback(Output(ids.TILING_DEVICE, "options"), Output(ids.TILING_DEVICE, "value"),
                 Input(ids.TILING_LAYER, "value"), State(ids.STORE_PLAN, "data"),
                 State(ids.TILING_DEVICE, "value"))(_cb_device)
    app.callback(Output(ids.TILING_FIGURE, "children"),
                 Input(ids.TILING_LAYER, "value"), Input(ids.TILING_DEVICE, "value"),
                 Input(ids.STORE_PLAN, "data"), Input(ids.TABS, "value"),
                 State(ids.STORE_REQUEST, "data"))(_cb_figure)
    app.callback(Output(ids.TILING_STRIP, "figure"), Input(ids.STORE_PLAN, "data"),
                 Input(ids.TILING_LAYER, "value"), Input(ids.TABS, "value"))(_cb_strip)


__all__ = ["layout", "default_layer", "layer_entry", "layer_options", "choose_layer",
           "device_choice", "render_figure", "render_strip", "layer_geometry"]

"""Compare panel: data / model / OWT / layer-wise plans side by side (OptCNN Section 6), under
the section that compares every family (:mod:`explorer.views.families`, its own bar first) and
the ranking check that runs the plans here (:mod:`explorer.views.ranking`).

The three figures (step time, bytes per step, scaling) are drawn by
:mod:`explorer.views.figures.compare`; this module fetches their data from the service.

The callback runs on the button, when the tab is opened and when the current plan changes while
it is open (``dcc.Tabs`` mounts only the shown tab, and Dash runs no callback whose outputs are
off the page, so nothing is computed for a hidden panel).  ``session.scaling`` (one search per
strategy and device count) is cached per request here; it does not depend on pins, so re-running
a pinned search only recomputes the bar charts (``session.compare`` reuses the cost tables).
"""

from __future__ import annotations

import json
import time
from collections import OrderedDict

import dash
import plotly.graph_objects as go
from dash import Input, Output, State, dcc, html

from explorer import service as session
from explorer.errors import ExplorerError
from explorer.views import families, ids, ranking
from explorer.views import state
from explorer.views.controls import context
from explorer.views.figures import compare as F


_SCALING: OrderedDict = OrderedDict()
_SCALING_SIZE = 16


def _key(req: session.Request) -> str:
    return json.dumps(req.to_dict(), sort_keys=True, default=str)


def cached_scaling(req: session.Request) -> dict:
    """``session.scaling(req)``, remembered per request (it does not depend on pins)."""
    k = _key(req)
    if k in _SCALING:
        _SCALING.move_to_end(k)
        return _SCALING[k]
    res = session.scaling(req)
    _SCALING[k] = res
    while len(_SCALING) > _SCALING_SIZE:
        _SCALING.popitem(last=False)
    return res


def request_for(plan: dict | None, request: dict | None) -> session.Request:
    """The request to compare: the current plan's own request when it has one (what the other
    panels show), else the request store."""
    if plan and "error" not in plan and plan.get("request"):
        return state.request(plan["request"])
    return state.request(request)


def compare_key(req: session.Request, pins: list | None) -> str:
    """Identity of a comparison (request and pins), kept in the time figure's ``layout.meta``
    so a plan update that changes neither (e.g. the same plan loaded from the history) does not
    recompute what is already shown."""
    return _key(req) + "|" + json.dumps(list(pins or []))


def scaling_view(req: session.Request) -> go.Figure:
    """The scaling figure of ``req`` (every method at 1, 2, 4, … devices), tagged with its
    request in ``layout.meta`` so it is not recomputed for the same request."""
    try:
        fig = F.scaling_figure(cached_scaling(req), session.comparison("layerwise"))
    except (ExplorerError, ValueError, KeyError) as exc:
        fig = F.message_figure(f"scaling unavailable: {exc}")
    fig.update_layout(meta={"scaling_key": _key(req)})
    return fig


def run_compare(req: session.Request, pins: list | None, with_scaling: bool = True) -> dict:
    """Figures and status for one request: ``{"time", "bytes", "scaling", "status",
    "results"}``.  Without ``with_scaling`` the scaling figure is the cached one, or ``None``
    when it still has to be computed (the page draws it in a second step, so the bars do not
    wait for a search at every device count)."""
    t0 = time.perf_counter()
    results = session.compare(req, list(pins or []))
    order = session.comparison("layerwise")
    t1 = time.perf_counter()
    status = [f"{req.model}, batch {_batch(results, req)}, {req.devices} × {req.preset}"
              + (f", {len(pins)} pin(s)" if pins else "")]
    cached = _key(req) in _SCALING
    sfig = scaling_view(req) if with_scaling or cached else None
    t2 = time.perf_counter()
    best = _best(results)
    if best:
        status.append(f"fastest: {F.label(best, ' ')}")
    bad = [a for a, r in results.items() if "error" in r]
    if bad:
        status.append("infeasible: " + ", ".join(bad))
    status.append(f"compare {t1 - t0:.2f} s, scaling "
                  + ("(cached)" if cached else f"{t2 - t1:.2f} s" if sfig is not None
                     else "next"))
    tfig = F.time_figure(results, order)
    tfig.update_layout(meta={"compare_key": compare_key(req, pins)})
    return {"time": tfig, "bytes": F.bytes_figure(results, order), "scaling": sfig,
            "status": " · ".join(status), "results": results}


#: the status's words while the scaling figure is still being computed
SCALING_NEXT = "scaling next"


def status_after_scaling(status, seconds: float):
    """The status once the scaling figure is drawn: "scaling next" becomes the seconds it
    took, so the line never says a figure is coming that is already shown (``no_update``
    when the status does not say it)."""
    if not isinstance(status, str) or SCALING_NEXT not in status:
        return dash.no_update
    return status.replace(SCALING_NEXT, f"scaling {seconds:.2f} s")


def shown_key(figure) -> str | None:
    """The comparison key a figure was drawn for (None for placeholders)."""
    meta = ((figure or {}).get("layout") or {}).get("meta")
    return meta.get("compare_key") if isinstance(meta, dict) else None


def _batch(results, req):
    for r in results.values():
        if "batch" in r:
            return r["batch"]
    return req.batch if req.batch is not None else "default"


def _best(results: dict):
    ok = {a: r["predicted_step_time_s"] for a, r in results.items() if "error" not in r}
    return min(ok, key=ok.get) if ok else None


def layout():
    blank = F.message_figure("press “Compare strategies” or open this tab after a search")
    return html.Div(className="panel compare", children=[
        context("compare"),
        families.layout(),
        ranking.layout(),
        html.Div(className="compare-bar", children=[
            html.Span("Layer-wise strategies", className="families-title"),
            html.Button("Compare strategies", id=ids.COMPARE_BUTTON, n_clicks=0,
                        className="button"),
            html.Span(id=ids.COMPARE_STATUS, className="status compare-status"),
        ]),
        dcc.Loading(type="dot", children=html.Div(className="compare-grid", children=[
            dcc.Graph(id=ids.COMPARE_TIME, figure=blank, className="compare-graph"),
            dcc.Graph(id=ids.COMPARE_BYTES, figure=blank, className="compare-graph"),
            dcc.Graph(id=ids.COMPARE_SCALING, figure=blank, className="compare-graph"),
        ])),
    ])


def register(app: dash.Dash) -> None:
    """The panel's callbacks on ``app``."""

    @app.callback(
        Output(ids.COMPARE_TIME, "figure"),
        Output(ids.COMPARE_BYTES, "figure"),
        Output(ids.COMPARE_SCALING, "figure"),
        Output(ids.COMPARE_STATUS, "children"),
        Input(ids.COMPARE_BUTTON, "n_clicks"),
        Input(ids.STORE_PLAN, "data"),
        Input(ids.TABS, "value"),
        State(ids.STORE_REQUEST, "data"),
        State(ids.COMPARE_TIME, "figure"),
        running=[(Output(ids.COMPARE_BUTTON, "disabled"), True, False)],
    )
    def _on_compare(_clicks, plan, tab, request, shown):
        # plan changes and tab switches count only while the tab is shown and when they change
        # what is compared; the button always recomputes
        by_button = dash.ctx.triggered_id == ids.COMPARE_BUTTON
        if not by_button and tab != "compare":
            raise dash.exceptions.PreventUpdate
        try:
            req = request_for(plan, request)
            pins = state.pins_of(request) if state.same_target(req.to_dict(), request) \
                else list((plan or {}).get("pins") or [])
            if not by_button and shown_key(shown) == compare_key(req, pins):
                raise dash.exceptions.PreventUpdate
            out = run_compare(req, pins, with_scaling=False)
        except dash.exceptions.PreventUpdate:
            raise
        except Exception as exc:  # noqa: BLE001 - shown to the user instead of a dead panel
            msg = f"cannot compare: {exc}"
            return dash.no_update, dash.no_update, dash.no_update, msg
        scaling = out["scaling"] or F.message_figure(
            "scaling: searching every method at 1, 2, 4, … devices…")
        return out["time"], out["bytes"], scaling, out["status"]

    @app.callback(
        Output(ids.COMPARE_SCALING, "figure", allow_duplicate=True),
        Output(ids.COMPARE_STATUS, "children", allow_duplicate=True),
        Input(ids.COMPARE_TIME, "figure"),
        State(ids.STORE_PLAN, "data"), State(ids.STORE_REQUEST, "data"),
        State(ids.COMPARE_SCALING, "figure"), State(ids.COMPARE_STATUS, "children"),
        prevent_initial_call=True,
    )
    def _on_scaling(time_fig, plan, request, shown, status):
        # second step: the bars are drawn; the scaling figure follows for the same request
        if not shown_key(time_fig):
            raise dash.exceptions.PreventUpdate
        try:
            req = request_for(plan, request)
        except Exception:  # noqa: BLE001 - the bars' callback already said why
            raise dash.exceptions.PreventUpdate from None
        if ((shown or {}).get("layout") or {}).get("meta", {}).get("scaling_key") == _key(req):
            raise dash.exceptions.PreventUpdate
        t0 = time.perf_counter()
        fig = scaling_view(req)
        return fig, status_after_scaling(status, time.perf_counter() - t0)


__all__ = ["layout", "run_compare", "status_after_scaling", "compare_key", "shown_key",
           "cached_scaling", "request_for"]

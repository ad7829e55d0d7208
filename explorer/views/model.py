"""Model and devices panel: what to search, and the one background callback that runs searches.

Searching (the Search button) and re-running after a pin change (Pin, Unpin, Re-run, Clear
pins in the details panel) go through :func:`run_search`, a Dash background callback with a
progress bar and a cancel button, so the page stays usable while a big search runs.  A search
that fails (unknown model, impossible pin, untraceable model) shows the engine's message next
to the control that caused it, and the previous plan stays.
"""

from __future__ import annotations

import base64
import json

import dash
from dash import Input, Output, State, dcc, html, no_update

from .. import service as session
from ..engine.devices import list_presets
from ..errors import ExplorerError
from . import ids
from .controls import job_controls


def _examples():
    import example_models as ex
    return [{"label": f"{k} — {m.description.split(',')[0]}", "value": k}
            for k, m in ex.MODELS.items()]


def layout(req: dict):
    presets = [{"label": p["name"], "value": p["name"]} for p in list_presets()]
    presets.append({"label": "custom (upload cluster JSON)", "value": "custom"})
    args = ", ".join(f"{k}={v}" for k, v in (req.get("model_args") or {}).items())
    is_file = ":" in req.get("model", "")
    return html.Div(className="panel model-panel", children=[
        html.Div(className="row", children=[
            html.Label(["Model", dcc.Dropdown(id=ids.MODEL_DROPDOWN, options=_examples(),
                                              value=None if is_file else req["model"],
                                              clearable=False)], className="grow"),
            html.Label(["or file.py:function", dcc.Input(
                id=ids.MODEL_FILE, type="text", value=req["model"] if is_file else "",
                placeholder="path/to/model.py:build", debounce=True)]),
            html.Label(["Batch", dcc.Input(id=ids.BATCH_INPUT, type="number", min=1,
                                           value=req.get("batch"), placeholder="default")]),
            html.Label(["Model args", dcc.Input(id=ids.MODEL_ARGS, type="text", value=args,
                                                placeholder="depth=101, width=8")]),
        ]),
        html.Div(className="row", children=[
            html.Label(["Devices", dcc.Dropdown(id=ids.PRESET_DROPDOWN, options=presets,
                                                value=req["preset"], clearable=False)],
                       className="grow"),
            dcc.Upload(id=ids.CLUSTER_UPLOAD, children=html.Span("cluster JSON…"),
                       className="upload"),
            html.Label(["Count", dcc.Input(id=ids.DEVICES_INPUT, type="number", min=1,
                                           value=req["devices"])]),
            html.Label(["Algorithm", dcc.Dropdown(
                id=ids.ALGO_DROPDOWN, value=req["algo"], clearable=False,
                options=[{"label": f"{k}", "value": k, "title": v}
                         for k, v in session.methods("layerwise").items()])]),
            *job_controls("Search", ids.SEARCH_BUTTON, ids.CANCEL_BUTTON, ids.SEARCH_PROGRESS,
                          ids.SEARCH_STATUS),
        ]),
        html.Div(id=ids.REQUEST_ERROR, className="error"),
        html.Div(id=ids.MODEL_SUMMARY, className="muted"),
    ])


def request_from_controls(model, model_file, batch, args, preset, devices, algo, cluster):
    """A :class:`session.Request` from the panel's controls (raises ``ValueError``)."""
    spec = (model_file or "").strip() or model
    cluster_doc = None
    if preset == "custom":
        if not cluster:
            raise ValueError("upload a cluster JSON file for the custom preset")
        try:
            cluster_doc = json.loads(base64.b64decode(cluster.split(",", 1)[1]))
        except (ValueError, IndexError) as exc:
            raise ValueError(f"the uploaded cluster file is not JSON: {exc}") from None
    if devices in (None, ""):
        raise ValueError("give the number of devices")
    return session.Request(model=spec, batch=batch or None,
                           model_args=session.parse_model_args(args), preset=preset,
                           devices=int(devices), algo=algo, cluster=cluster_doc)


def pin_text(layer: str, config: str | None, devices: str | None) -> str:
    devs = (devices or "").replace(" ", "").strip(",")
    if not config and not devs:
        raise ValueError("choose a configuration and/or type devices to pin")
    return f"{layer}={config or ''}" + (f"@{devs}" if devs else "")


def summary_text(req: session.Request) -> str:
    s = session.summary(req)
    return (f"{s['model']}: {s['layers']} layers, {s['edges']} edges, "
            f"{s['parameters'] / 1e6:.2f} M parameters, {s['flops_forward'] / 1e9:.2f} GFLOP "
            f"forward at batch {s['batch']}, activations {s['activation_bytes'] / 2 ** 20:.0f} "
            f"MiB (captured with {s['source']})")


def do_search(trigger, controls: dict, pins, selected, pin_config, pin_devices, plan, req_doc,
              progress=lambda v: None):
    """The search logic behind :func:`run_search` as a plain function (tests call it).

    Returns a dict of outputs: plan, request, pins, status, pin_error, request_error,
    summary.  On failure the plan is ``no_update`` and the error goes to the control's slot.
    """
    out = {"plan": no_update, "request": no_update, "pins": no_update, "status": "",
           "pin_error": "", "request_error": "", "summary": no_update}
    pins = list(pins or [])
    if trigger == ids.SEARCH_BUTTON:
        try:
            req = request_from_controls(**controls)
        except (ValueError, ExplorerError) as exc:
            out["request_error"] = str(exc)
            return out
        old = session.Request.from_dict(req_doc) if req_doc else None
        if old is None or old.graph_key() != req.graph_key() or old.devices != req.devices:
            pins = []
        err_slot = "request_error"
    else:
        req = session.Request.from_dict((plan or {}).get("request") or req_doc)
        err_slot = "pin_error"
        if trigger in (ids.PIN_BUTTON, ids.UNPIN_BUTTON) and not selected:
            out["pin_error"] = "select a layer in the graph first"
            return out
        if trigger == ids.PIN_BUTTON:
            try:
                new = pin_text(selected, pin_config, pin_devices)
            except ValueError as exc:
                out["pin_error"] = str(exc)
                return out
            pins = [p for p in pins if p.split("=", 1)[0] != selected] + [new]
        elif trigger == ids.UNPIN_BUTTON:
            pins = [p for p in pins if p.split("=", 1)[0] != selected]
        elif trigger == ids.CLEAR_PINS:
            pins = []
    try:
        progress(10)
        session.graph_for(req)
        progress(40)
        session.cost_model_for(req)
        progress(60)
        new_plan = session.search(req, pins)
        progress(100)
    except (ExplorerError, ValueError, KeyError) as exc:
        out[err_slot] = str(exc)
        return out
    if plan and "error" not in plan and plan.get("model") == new_plan["model"] \
            and plan.get("devices") == new_plan["devices"]:
        new_plan["previous"] = {"objective_s": plan["objective_s"],
                                "changes": session.plan_changes(plan, new_plan),
                                "pins": plan.get("pins", [])}
    out.update(plan=new_plan, request=req.to_dict(), pins=pins,
               status=f"{new_plan['algo']}: {new_plan['objective_s'] * 1e3:.3f} ms/step, "
                      f"found in {new_plan['search_time_s'] * 1e3:.0f} ms",
               summary=summary_text(req))
    return out


@dash.callback(
    Output(ids.STORE_PLAN, "data"), Output(ids.STORE_REQUEST, "data"),
    Output(ids.STORE_PINS, "data"), Output(ids.SEARCH_STATUS, "children"),
    Output(ids.PIN_ERROR, "children"), Output(ids.REQUEST_ERROR, "children"),
    Output(ids.MODEL_SUMMARY, "children"), Output(ids.STORE_STEP, "data"),
    Input(ids.SEARCH_BUTTON, "n_clicks"), Input(ids.PIN_BUTTON, "n_clicks"),
    Input(ids.UNPIN_BUTTON, "n_clicks"), Input(ids.RERUN_BUTTON, "n_clicks"),
    Input(ids.CLEAR_PINS, "n_clicks"),
    State(ids.MODEL_DROPDOWN, "value"), State(ids.MODEL_FILE, "value"),
    State(ids.BATCH_INPUT, "value"), State(ids.MODEL_ARGS, "value"),
    State(ids.PRESET_DROPDOWN, "value"), State(ids.DEVICES_INPUT, "value"),
    State(ids.ALGO_DROPDOWN, "value"), State(ids.CLUSTER_UPLOAD, "contents"),
    State(ids.STORE_PINS, "data"), State(ids.STORE_SELECTED, "data"),
    State(ids.PIN_CONFIG, "value"), State(ids.PIN_DEVICES, "value"),
    State(ids.STORE_PLAN, "data"), State(ids.STORE_REQUEST, "data"),
    background=True, interval=150,
    progress=[Output(ids.SEARCH_PROGRESS, "value")],
    running=[(Output(ids.SEARCH_BUTTON, "disabled"), True, False),
             (Output(ids.CANCEL_BUTTON, "disabled"), False, True),
             (Output(ids.SEARCH_STATUS, "children"), "searching…", "")],
    cancel=[Input(ids.CANCEL_BUTTON, "n_clicks")],
    prevent_initial_call=True,
)
def run_search(set_progress, _s, _p, _u, _r, _c, model, model_file, batch, args, preset,
               devices, algo, cluster, pins, selected, pin_config, pin_devices, plan, req_doc):
    controls = dict(model=model, model_file=model_file, batch=batch, args=args, preset=preset,
                    devices=devices, algo=algo, cluster=cluster)
    out = do_search(dash.ctx.triggered_id, controls, pins, selected, pin_config, pin_devices,
                    plan, req_doc, progress=lambda v: set_progress([str(v)]))
    step = None if out["plan"] is not no_update else no_update
    return (out["plan"], out["request"], out["pins"], out["status"], out["pin_error"],
            out["request_error"], out["summary"], step)


@dash.callback(Output(ids.MODEL_SUMMARY, "children", allow_duplicate=True),
               Input(ids.STORE_REQUEST, "data"), prevent_initial_call="initial_duplicate")
def initial_summary(req_doc):
    if not req_doc:
        return ""
    try:
        return summary_text(session.Request.from_dict(req_doc))
    except (ExplorerError, ValueError) as exc:
        return str(exc)

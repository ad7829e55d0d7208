"""Model and devices panel: the form that IS the app's request, and the Search job.

The form writes the request store (:mod:`.state`) as it changes, so every tab operates on
what the form says.  One method list covers the three families: Search runs the form's
method - a layer-wise search (Plan tab), a Tofu partition (Tofu tab) or a device placement
(Placement tab) - as a Dash background callback with a progress bar and a cancel button.
Pin, Unpin, Re-run and Clear pins re-run the layer-wise search of the form's request.  A
failure (unknown model, impossible pin, untraceable model, a model file on a server that does
not allow them) shows the message next to the control that caused it; the previous result
stays.  Changing the model clears the selection, the errors and the step highlight.
"""

from __future__ import annotations

import base64
import json

import dash
from dash import Input, Output, State, dcc, html, no_update

from explorer import service as session
from explorer.engine.core.devices import list_presets
from explorer.errors import ExplorerError
from explorer.views import controls as C
from explorer.views import fmt, ids, state


def first_clause(text: str) -> str:
    """``text`` up to its first comma or colon outside parentheses (a model's short name).

    >>> first_clause("LSTM seq2seq (NMT-style, Wu et al. 2016): stacked LSTMCells")
    'LSTM seq2seq (NMT-style, Wu et al. 2016)'
    """
    depth = 0
    for i, ch in enumerate(text):
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if ch in ",:" and depth <= 0:
            return text[:i].strip()
    return text.strip()


def _examples():
    import example_models as ex
    return [{"label": f"{k} — {first_clause(m.description)}", "value": k}
            for k, m in ex.MODELS.items()]


def args_placeholder(model: str | None) -> str:
    """The model-args box's hint: the chosen example's own arguments with their defaults
    (``"none for this model"`` when it takes none; a file's builder is not inspected)."""
    import example_models as ex
    if not model or model not in ex.MODELS:
        return "key=value, ... (the builder's keyword arguments)"
    params = ex.model_params(model)
    if not params:
        return "none for this model"
    return ", ".join(f"{k}={v}" for k, v in list(params.items())[:4]) + \
        (", …" if len(params) > 4 else "")


def layout(req: dict, error: str = "", summary: str = ""):
    """The form, filled from request dict ``req``; ``error`` and ``summary`` under it."""
    presets = [{"label": p["name"], "value": p["name"]} for p in list_presets()]
    presets.append({"label": "custom (upload cluster JSON)", "value": "custom"})
    v = state.form_values(req)
    files = state.model_files_allowed()
    return html.Div(className="panel model-panel", children=[
        html.Div(className="row", children=[
            html.Label(["Model", dcc.Dropdown(id=ids.MODEL_DROPDOWN, options=_examples(),
                                              value=v["model"], clearable=False)],
                       className="grow"),
            html.Label(["or file.py:function", dcc.Input(
                id=ids.MODEL_FILE, type="text", value=v["model_file"], debounce=True,
                placeholder="path/to/model.py:build" if files else "off on this server")],
                title=("a model file runs its code on the server" if files else
                       "start the server with --allow-model-files to load model files")),
            html.Label(["Batch", dcc.Input(id=ids.BATCH_INPUT, type="number", min=1,
                                           value=v["batch"], placeholder="default")]),
            html.Label(["Model args", dcc.Input(id=ids.MODEL_ARGS, type="text", value=v["args"],
                                                placeholder=args_placeholder(v["model"]))]),
        ]),
        html.Div(className="row", children=[
            html.Label(["Devices", dcc.Dropdown(id=ids.PRESET_DROPDOWN, options=presets,
                                                value=v["preset"], clearable=False)],
                       className="grow"),
            dcc.Upload(id=ids.CLUSTER_UPLOAD, children=html.Span("cluster JSON…"),
                       className="upload"),
            html.Label(["Count", dcc.Input(id=ids.DEVICES_INPUT, type="number", min=1,
                                           value=v["devices"])]),
            html.Label(["Method", dcc.Dropdown(
                id=ids.ALGO_DROPDOWN, value=v["algo"], clearable=False,
                options=state.method_options(), style={"minWidth": "240px"})]),
            *C.job_controls("Search", ids.SEARCH_BUTTON, ids.CANCEL_BUTTON, ids.SEARCH_PROGRESS,
                            ids.SEARCH_STATUS),
        ]),
        html.Div(error, id=ids.REQUEST_ERROR, className="error"),
        html.Div(summary, id=ids.MODEL_SUMMARY, className="muted"),
    ])


def request_from_controls(model, model_file, batch, args, preset, devices, algo, cluster):
    """A :class:`session.Request` from the panel's controls (raises ``ValueError`` or
    :class:`ExplorerError`, e.g. for a model file the server does not allow)."""
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
    state.check_model(spec)
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
            f"{s['parameters'] / 1e6:.3g} M parameters, {fmt.flops(s['flops_forward'])} "
            f"forward at batch {s['batch']}, activations {fmt.bytes_(s['activation_bytes'])} "
            f"(captured with {s['source']})")


def safe_summary(req_doc: dict | None) -> str:
    """:func:`summary_text` of a request dict, or why there is none (never raises)."""
    if not req_doc:
        return ""
    try:
        return summary_text(state.request(req_doc))
    except Exception as exc:  # noqa: BLE001 - the summary is informative only
        return str(exc)


def sync_request(trigger, controls: dict, tofu_algo, place_algo, req_doc) -> dict:
    """The form changed: the new request store dict and what the form shows.

    Returns ``{"request", "error", "algo", "tofu_algo", "place_algo"}`` (``no_update`` where
    nothing changes).  A tab's own method dropdown writes the request's method; the request's
    method, when of a tab's family, is shown in that tab's dropdown.  Pins stay while the
    graph and the devices stay."""
    out = {"request": no_update, "error": "", "algo": no_update, "tofu_algo": no_update,
           "place_algo": no_update}
    algo = controls.get("algo")
    if trigger == ids.TOFU_ALGO and tofu_algo:
        algo = tofu_algo
    elif trigger == ids.PLACE_ALGO and place_algo:
        algo = place_algo
    if algo != controls.get("algo"):
        out["algo"] = algo
    fam = state.family(algo)
    if fam == "tofu" and algo != tofu_algo:
        out["tofu_algo"] = algo
    if fam == "placement" and algo != place_algo:
        out["place_algo"] = algo
    try:
        req = request_from_controls(**dict(controls, algo=algo))
    except (ValueError, ExplorerError) as exc:
        out["error"] = str(exc)
        return out
    if req_doc:                         # the form has no controls for the cost settings
        req.cost = req_doc.get("cost", req.cost)
        req.sync = req_doc.get("sync", req.sync)
    new = req.to_dict()
    pins = state.pins_of(req_doc) if state.same_target(req_doc, new) else []
    new = state.request_doc(req, pins)
    if new != req_doc:
        out["request"] = new
    return out


def reset_on_change(req_doc, seen) -> dict | None:
    """What a new model clears (selection, expanded groups, step highlight, every error,
    placement pins and selection); ``None`` when the model did not change."""
    if not req_doc or state.same_graph(req_doc, seen):
        return None
    return {"seen": {k: req_doc.get(k) for k in ("model", "batch", "model_args")},
            "selected": None, "expanded": [], "step": None, "slider": None, "error": "",
            "place_selected": None, "place_expanded": None, "place_pins": []}


def layerwise_plan(req_doc: dict) -> dict:
    """The layer-wise plan the graph shows for a request whose method may be of another
    family (its own method when layer-wise, else optcnn): ``{"error": ...}`` when there is
    none, so the graph never shows another model than the form."""
    try:
        req = state.request(req_doc)
        req.algo = state.tab_method("plan", req_doc)
        return session.search(req, state.pins_of(req_doc), keep_trace=True)
    except Exception as exc:  # noqa: BLE001 - shown in the Plan tab instead of a plan
        return {"error": str(exc)}


def _layerwise_request(req_doc, plan) -> session.Request:
    """The form's request for a layer-wise re-run: its method if it is layer-wise, else the
    shown plan's (or optcnn)."""
    req = state.request(req_doc)
    if state.family(req.algo) != "layerwise":
        algo = (plan or {}).get("algo")
        req.algo = algo if state.family(algo) == "layerwise" else state.DEFAULT_METHOD[
            "layerwise"]
    return req


def do_search(trigger, controls: dict, pins, selected, pin_config, pin_devices, plan, req_doc,
              progress=lambda v: None, memory=None, graph: bool = True):
    """The logic behind :func:`register`'s search callback as a plain function (tests call
    it).  ``pins`` ``None`` means the request's own; ``graph`` also searches the layer-wise
    plan of a Tofu or placement request when ``plan`` shows another model (the graph of a
    page that shows both).

    Returns a dict of outputs: plan, tofu, placement, place_pins, tab, request, pins, status,
    pin_error, request_error.  On failure the results are ``no_update`` and the
    error goes to the control's slot."""
    out = {"plan": no_update, "tofu": no_update, "placement": no_update,
           "place_pins": no_update, "tab": no_update, "request": no_update, "pins": no_update,
           "status": "", "pin_error": "", "request_error": ""}
    pins = list(state.pins_of(req_doc) if pins is None else pins)
    if trigger == ids.SEARCH_BUTTON:
        try:
            req = request_from_controls(**controls)
        except (ValueError, ExplorerError) as exc:
            out["request_error"] = str(exc)
            return out
        if not state.same_target(req_doc, req.to_dict()):
            pins = []
        err_slot = "request_error"
    else:
        err_slot = "pin_error"
        try:
            req = _layerwise_request(req_doc, plan)
        except (ValueError, ExplorerError) as exc:
            out["pin_error"] = str(exc)
            return out
        if trigger in (ids.PIN_BUTTON, ids.UNPIN_BUTTON):
            if not selected:
                out["pin_error"] = "select a layer in the graph first"
                return out
            shown = (plan or {}).get("request")
            if shown and not state.same_graph(shown, req.to_dict()):
                out["pin_error"] = (f"the graph shows a plan of {shown.get('model')}, the form "
                                    f"says {req.model}: press Search first, then pin")
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
    fam = state.family(req.algo)
    try:
        progress(5)
        if fam == "tofu":
            session.opgraph_for(req)
            progress(50)
            doc = session.tofu(req, req.algo)
            out.update(tofu=doc, tab="tofu",
                       status=f"{doc['algo']}: {fmt.bytes_(doc['comm_bytes'])} communicated "
                              f"per step, k = {' × '.join(map(str, doc['factors'])) or '1'}")
        elif fam == "placement":
            session.opgraph_for(req)
            progress(40)
            session.placement_graph_for(req, _memory(memory))
            progress(60)
            doc = session.placement(req, req.algo, _memory(memory), [])
            out.update(placement=doc, place_pins=[], tab="placement",
                       status=f"{doc['algo']}: predicted step "
                              f"{fmt.seconds(doc['predicted_step_time_s'])}")
        else:
            session.graph_for(req)
            progress(40)
            session.cost_model_for(req)
            progress(60)
            new_plan = session.search(req, pins, keep_trace=True)
            if plan and "error" not in plan and plan.get("model") == new_plan["model"] \
                    and plan.get("devices") == new_plan["devices"]:
                new_plan["previous"] = {"objective_s": plan["objective_s"],
                                        "changes": session.plan_changes(plan, new_plan),
                                        "pins": plan.get("pins", [])}
            out.update(plan=new_plan,
                       status=f"{new_plan['algo']}: {new_plan['objective_s'] * 1e3:.3f} ms/step, "
                              f"found in {new_plan['search_time_s'] * 1e3:.0f} ms")
        if graph and fam != "layerwise" and not state.same_target((plan or {}).get("request"),
                                                        req.to_dict()):
            progress(90)                     # the graph shows the same model as the form
            out["plan"] = layerwise_plan(state.request_doc(req, pins))
        progress(100)
    except (ExplorerError, ValueError, KeyError) as exc:
        out[err_slot] = str(exc.args[0]) if isinstance(exc, KeyError) and exc.args else str(exc)
        return out
    if trigger != ids.SEARCH_BUTTON:
        doc = state.request_doc(req, pins)
        doc["algo"] = (req_doc or {}).get("algo", req.algo)   # a re-run keeps the form's method
    else:
        doc = state.request_doc(req, pins)
    out.update(request=doc, pins=pins)
    return out


def _memory(memory):
    return None if memory in (None, "") else float(memory)


FORM = [(ids.MODEL_DROPDOWN, "model"), (ids.MODEL_FILE, "model_file"), (ids.BATCH_INPUT, "batch"),
        (ids.MODEL_ARGS, "args"), (ids.PRESET_DROPDOWN, "preset"),
        (ids.DEVICES_INPUT, "devices"), (ids.ALGO_DROPDOWN, "algo")]


def form_outputs() -> list:
    """Outputs that fill the form (for callbacks that load a request: plans, uploads)."""
    return [Output(cid, "value", allow_duplicate=True) for cid, _ in FORM]


def form_update(req_doc: dict) -> list:
    """Values for :func:`form_outputs` from a request dict."""
    v = state.form_values(req_doc)
    return [v[key] for _, key in FORM]


def found(out: dict, page: str | None) -> tuple:
    """``(found, href)`` for a :func:`do_search` result on the page of family ``page``: the
    result for the page's ``ids.STORE_FOUND`` (``{"family", "doc", "pin_error"}``) when the
    method is the page's family, else the address of the method's family page on the new
    request (``no_update`` where nothing changes)."""
    if out["request"] is no_update:             # failed: the message is in its slot
        if out["pin_error"]:
            return {"family": "layerwise", "doc": None, "pin_error": out["pin_error"]}, \
                no_update
        return no_update, no_update
    fam = state.family(out["request"].get("algo"))
    if out["plan"] is not no_update and out["tab"] is no_update:
        fam = "layerwise"              # a layer-wise search, or a pin re-ran one
    if fam != page:
        return no_update, state.page_url(fam, out["request"])
    doc = {"layerwise": out["plan"], "tofu": out["tofu"], "placement": out["placement"]}[fam]
    return {"family": fam, "doc": doc, "pin_error": ""}, no_update


def register(app: dash.Dash) -> None:
    """The panel's callbacks on ``app``."""
    app.callback(Output(ids.MODEL_ARGS, "placeholder"),
                 Input(ids.MODEL_DROPDOWN, "value"))(args_placeholder)
    _register(app)


def _optional(kind, cid, prop):
    return kind(cid, prop, allow_optional=True)


def _register(app: dash.Dash) -> None:
    """The panel's callbacks on ``app``: Search (and the layer-wise page's pins, which re-run
    the same search), the form writing the request, the summary line."""

    @app.callback(
        Output(ids.STORE_FOUND, "data"), Output(ids.STORE_REQUEST, "data"),
        Output(ids.SEARCH_STATUS, "children"), Output(ids.REQUEST_ERROR, "children"),
        Output(ids.NAVIGATE, "data"),
        Input(ids.SEARCH_BUTTON, "n_clicks"),
        State(ids.MODEL_DROPDOWN, "value"), State(ids.MODEL_FILE, "value"),
        State(ids.BATCH_INPUT, "value"), State(ids.MODEL_ARGS, "value"),
        State(ids.PRESET_DROPDOWN, "value"), State(ids.DEVICES_INPUT, "value"),
        State(ids.ALGO_DROPDOWN, "value"), State(ids.CLUSTER_UPLOAD, "contents"),
        _optional(State, ids.STORE_PLAN, "data"), State(ids.STORE_REQUEST, "data"),
        _optional(State, ids.PLACE_MEMORY, "value"), State(ids.PAGE_FAMILY, "data"),
        background=True, interval=150,
        progress=[Output(ids.SEARCH_PROGRESS, "value")],
        running=C.running(ids.SEARCH_BUTTON, ids.CANCEL_BUTTON, ids.SEARCH_PROGRESS,
                          ids.SEARCH_STATUS, "searching…"),
        cancel=[Input(ids.CANCEL_BUTTON, "n_clicks")],
        prevent_initial_call=True,
    )
    def run_search(set_progress, _n, model, model_file, batch, args, preset, devices, algo,
                   cluster, plan, req_doc, memory, page):
        # Search, on every family page: the form's method; its result is shown here when the
        # method is this page's family, else its family's page opens on the new request.
        if not _n:
            raise dash.exceptions.PreventUpdate
        controls = dict(model=model, model_file=model_file, batch=batch, args=args,
                        preset=preset, devices=devices, algo=algo, cluster=cluster)
        set_progress(["0"])
        out = do_search(ids.SEARCH_BUTTON, controls, None, None, None, None, plan, req_doc,
                        progress=lambda v: set_progress([str(v)]), memory=memory, graph=False)
        shown, href = found(out, page)
        return shown, out["request"], out["status"], out["request_error"], href

    @app.callback(
        Output(ids.STORE_FOUND, "data", allow_duplicate=True),
        Output(ids.STORE_REQUEST, "data", allow_duplicate=True),
        Output(ids.SEARCH_STATUS, "children", allow_duplicate=True),
        Input(ids.PIN_BUTTON, "n_clicks"), Input(ids.UNPIN_BUTTON, "n_clicks"),
        Input(ids.RERUN_BUTTON, "n_clicks"), Input(ids.CLEAR_PINS, "n_clicks"),
        State(ids.STORE_SELECTED, "data"), State(ids.PIN_CONFIG, "value"),
        State(ids.PIN_DEVICES, "value"), State(ids.STORE_PLAN, "data"),
        State(ids.STORE_REQUEST, "data"),
        background=True, interval=150,
        running=C.running(ids.SEARCH_BUTTON, ids.CANCEL_BUTTON, ids.SEARCH_PROGRESS,
                          ids.SEARCH_STATUS, "re-running the search…"),
        cancel=[Input(ids.CANCEL_BUTTON, "n_clicks")],
        prevent_initial_call=True,
    )
    def run_pins(_p, _u, _r, _c, selected, pin_config, pin_devices, plan, req_doc):
        # Pin, Unpin, Re-run, Clear pins (the layer-wise page): the layer-wise search again
        out = do_search(dash.ctx.triggered_id, {}, None, selected, pin_config, pin_devices,
                        plan, req_doc)
        shown, _ = found(out, "layerwise")
        return shown, out["request"], out["status"]

    @app.callback(
        Output(ids.STORE_REQUEST, "data", allow_duplicate=True),
        Output(ids.REQUEST_ERROR, "children", allow_duplicate=True),
        Output(ids.ALGO_DROPDOWN, "value"),
        Input(ids.MODEL_DROPDOWN, "value"), Input(ids.MODEL_FILE, "value"),
        Input(ids.BATCH_INPUT, "value"), Input(ids.MODEL_ARGS, "value"),
        Input(ids.PRESET_DROPDOWN, "value"), Input(ids.DEVICES_INPUT, "value"),
        Input(ids.ALGO_DROPDOWN, "value"), Input(ids.CLUSTER_UPLOAD, "contents"),
        _optional(Input, ids.TOFU_ALGO, "value"), _optional(Input, ids.PLACE_ALGO, "value"),
        State(ids.STORE_REQUEST, "data"),
        prevent_initial_call=True,
    )
    def on_form(model, model_file, batch, args, preset, devices, algo, cluster, tofu_algo,
                place_algo, req_doc):
        # the panels' own method lists (on the Tofu and placement pages) write the request
        # and the form's method; the panels follow the result they show
        controls = dict(model=model, model_file=model_file, batch=batch, args=args,
                        preset=preset, devices=devices, algo=algo, cluster=cluster)
        out = sync_request(dash.ctx.triggered_id, controls, tofu_algo, place_algo, req_doc)
        return out["request"], out["error"], out["algo"]

    @app.callback(
        Output(ids.STORE_SEEN, "data"),
        Output(ids.STORE_SELECTED, "data", allow_duplicate=True),
        Output(ids.STORE_EXPANDED, "data", allow_duplicate=True),
        Output(ids.STORE_STEP, "data", allow_duplicate=True),
        Output(ids.STEP_SLIDER, "value", allow_duplicate=True),
        Output(ids.PIN_ERROR, "children", allow_duplicate=True),
        Output(ids.RUN_ERROR, "children", allow_duplicate=True),
        Input(ids.STORE_REQUEST, "data"), State(ids.STORE_SEEN, "data"),
        prevent_initial_call=True,
    )
    def on_request(req_doc, seen):
        # the layer-wise page: a new model clears its selection, highlight and errors (the
        # Tofu and placement pages reset their own)
        r = reset_on_change(req_doc, seen)
        if r is None:
            raise dash.exceptions.PreventUpdate
        e = r["error"]
        return r["seen"], r["selected"], r["expanded"], r["step"], r["slider"], e, e

    @app.callback(
        Output(ids.MODEL_SUMMARY, "children"),
        _optional(Input, ids.STORE_PLAN, "data"), _optional(Input, ids.STORE_TOFU, "data"),
        _optional(Input, ids.STORE_PLACEMENT, "data"),
        prevent_initial_call=True,
    )
    def on_result(plan, tofu, placement):
        doc = {ids.STORE_PLAN: plan, ids.STORE_TOFU: tofu,
               ids.STORE_PLACEMENT: placement}.get(dash.ctx.triggered_id)
        if not doc or "error" in doc or not doc.get("request"):
            raise dash.exceptions.PreventUpdate
        return safe_summary(doc["request"])

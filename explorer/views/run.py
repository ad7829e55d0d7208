"""Run panel: execute the current plan on this machine's devices and overlay measured against
predicted times (per layer, and the step-time series with the predicted line).

The run is a Dash background job (progress bar, cancel); workers are torch.distributed
processes (gloo on CPU, NCCL on GPUs) started by :mod:`explorer.engine.runtime`, which also
checks the result against a single-device run of the same model.  The two figures are drawn by
:mod:`explorer.views.figures.run`.
"""

from __future__ import annotations

import dash
import plotly.graph_objects as go
from dash import Input, Output, State, dcc, html, no_update

from explorer import service as session
from explorer.errors import ExplorerError
from explorer.views import ids
from explorer.views import tables as T
from explorer.views import state
from explorer.views.controls import context, job_controls, register_local_run, running
from explorer.views.figures import run as F


#: what the page says once Cancel stopped a calibration (the shown plan and costs stay)
CANCELLED = ("calibration cancelled: its worker processes were stopped; the plan and the "
             "costs shown are unchanged")

#: the figures stay hidden until there is a run to draw (no empty axes)
HIDDEN = {"display": "none"}


def layout():
    return html.Div(className="panel run-panel", children=[
        context("run"),
        html.Div(id=ids.RUN_COST_MODEL, className="cost-model"),
        html.Div(className="row calibrate-row", children=[
            *job_controls("Calibrate this machine & search with measured costs",
                          ids.CALIB_BUTTON, ids.CALIB_CANCEL, ids.CALIB_PROGRESS,
                          ids.CALIB_STATUS, "Cancel calibration", primary=False),
        ]),
        html.Div(id=ids.CALIB_ERROR, className="error"),
        html.Div(className="row", children=[
            html.Label(["Measured steps", dcc.Input(id=ids.RUN_STEPS, type="number", min=1,
                                                    value=20)]),
            html.Label(["Warm-up steps", dcc.Input(id=ids.RUN_WARMUP, type="number", min=0,
                                                   value=5)]),
            *job_controls("Run on local devices", ids.RUN_BUTTON, ids.RUN_CANCEL,
                          ids.RUN_PROGRESS, ids.RUN_STATUS),
        ]),
        html.Div(id=ids.RUN_ERROR, className="error"),
        html.Div(id=ids.RUN_RESULT),
        html.Div(id=ids.RUN_FIGURES, className="run-figures", style=HIDDEN, children=[
            dcc.Graph(id=ids.RUN_LAYERS, figure=go.Figure(), style={"height": "380px"}),
            dcc.Graph(id=ids.RUN_SERIES, figure=go.Figure(), style={"height": "300px"}),
        ]),
        html.H4("Runs of this plan"),
        history_table(ids.RUN_HISTORY),
    ])


HISTORY_COLUMNS = [("id", "run"), ("time", "time"), ("devices", "devices"),
                   ("predicted_ms", "predicted ms"), ("measured_ms", "measured ms"),
                   ("error", "error"), ("reference", "reference")]


def history_table(table_id: str):
    """The table of stored runs (one row per run, newest first) - layer-wise plans and
    placements alike."""
    return T.grid(table_id, HISTORY_COLUMNS, height=230, widths={"time": 160})


def ui_text(text: str) -> str:
    """A runtime message in the app's words: the command-line flags it may name become the
    controls that do the same here."""
    import re
    text = re.sub(r"search with --preset local", "choose the 'local' devices preset (or "
                  "Calibrate below) and search again", text)
    text = re.sub(r"--preset local", "the 'local' devices preset", text)
    text = re.sub(r"--cost measured", "measured costs (Calibrate)", text)
    return re.sub(r"`?explorer [a-z]+[^`]*`?", "the Calibrate button", text) \
        if "explorer calibrate" in text else text


def cost_model_line(plan: dict | None):
    """Which cost model made the shown plan's predictions (roofline or measured, calibrated
    or not)."""
    if not plan or "error" in plan:
        return ""
    info = session.cost_model_info(plan)
    return html.Div([html.Span("predictions from: ", className="muted"),
                     html.B(info["text"], id="cost-model-text")])


def result_view(res: dict):
    ok = res.get("reference_ok")
    ref = ("reference check: " + ("passed" if ok else "FAILED") +
           (f" (max relative error {res.get('reference', {}).get('max_rel_error', 0):.2e})"
            if isinstance(res.get("reference"), dict) else "")) if ok is not None else ""
    err = res.get("rel_error")
    return html.Div([
        html.Div([html.B(ref, id="run-reference")]),
        html.Div(f"predicted {res['predicted_step_time_s'] * 1e3:.2f} ms/step, measured "
                 f"{res['measured_step_time_s'] * 1e3:.2f} ms/step (median of "
                 f"{len(res.get('step_times_s', []))} steps)"
                 + (f", error {err * 100:+.1f} %" if err is not None else ""),
                 id="run-times"),
        html.Ul([html.Li(ui_text(w), className="muted") for w in res.get("warnings", [])]),
    ])


def history_rows(plan: dict) -> list:
    return session.runs(plan, 50)


def do_run(plan: dict, steps, warmup, progress=lambda v: None) -> dict:
    """Launch ``plan`` and return the run result (raises ExplorerError with a message)."""
    import warnings

    if not plan or "error" in plan:
        raise ExplorerError("search a plan first")
    state.check_model(plan.get("spec") or plan.get("model"))  # model files where allowed only
    doc = {k: v for k, v in plan.items()
           if k not in ("trace", "trace_ref", "previous", "history_id")}
    total = (int(steps or 0) + int(warmup or 0)) or 1

    def prog(_i, done, _total):
        # the workers start first (the bar is indeterminate until then), then each step
        progress(10 + int(88 * done / max(_total or total, 1)))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        res = session.run_plan(doc, steps=int(steps or 20), warmup=int(warmup or 0),
                               progress=prog, verify=False)
    res.setdefault("warnings", [])
    res["warnings"] = sorted(set(res["warnings"]) | {str(w.message) for w in caught})
    return res


def run_panel(res, plan) -> tuple:
    """Result, per-layer figure and step series for the shown plan."""
    if not res or (plan and res.get("model") != plan.get("model")):
        return (html.P("Run the current plan to compare measured with predicted times.",
                       className="muted"), go.Figure(), go.Figure(), HIDDEN)
    return result_view(res), F.layers_figure(res), F.series_figure(res), {}


def run_history(plan, tab):
    """The stored runs of the shown plan, looked up only while the Run tab is shown (the
    lookup hashes the whole plan: a second on a 2,000-layer one); ``no_update`` elsewhere."""
    if tab != "run":
        return no_update
    try:
        return history_rows({k: v for k, v in (plan or {}).items()
                             if k not in ("trace", "trace_ref", "previous", "history_id")}) \
            if plan and "error" not in plan else []
    except Exception:  # noqa: BLE001 - history is a convenience, never break the panel
        return []


def do_calibrate(req_doc: dict, progress=lambda pct, msg: None) -> dict:
    """Calibrate this machine for the request's model and search it on ``local`` with the
    measured costs (:func:`explorer.service.calibrate_local`): the plan dict."""
    req = state.request(req_doc)
    state.check_model(req.model)
    plan = session.calibrate_local(req, quick=True, progress=progress)["plan"]
    if plan.get("trace") is not None:            # the page fetches its steps from the server
        plan["trace_ref"] = session.keep_trace_steps(plan.pop("trace"))
    return plan


def register(app: dash.Dash) -> None:
    """The panel's callbacks on ``app``."""

    register_local_run(
        app, button_id=ids.RUN_BUTTON, cancel_id=ids.RUN_CANCEL, progress_id=ids.RUN_PROGRESS,
        status_id=ids.RUN_STATUS, error_id=ids.RUN_ERROR, store_id=ids.STORE_RUN,
        states=[(ids.STORE_PLAN, "data"), (ids.RUN_STEPS, "value"), (ids.RUN_WARMUP, "value")],
        job=do_run, done=lambda res, *_: f"done: {res['devices']} workers",
        start_progress=None, interval=250)   # indeterminate (moving) while workers start

    @app.callback(Output(ids.RUN_RESULT, "children"), Output(ids.RUN_LAYERS, "figure"),
                  Output(ids.RUN_SERIES, "figure"), Output(ids.RUN_FIGURES, "style"),
                  Input(ids.STORE_RUN, "data"), Input(ids.STORE_PLAN, "data"))
    def show_run(res, plan):
        return run_panel(res, plan)

    @app.callback(Output(ids.RUN_HISTORY, "rowData"), Input(ids.TABS, "value"),
                  Input(ids.STORE_RUN, "data"), Input(ids.STORE_PLAN, "data"),
                  prevent_initial_call=True)     # the page never opens on the Run tab
    def show_history(tab, _res, plan):
        return run_history(plan, tab)

    @app.callback(Output(ids.RUN_COST_MODEL, "children"), Input(ids.STORE_PLAN, "data"))
    def show_cost_model(plan):
        return cost_model_line(plan)

    from explorer.views import search_form as M

    @app.callback(
        Output(ids.STORE_PLAN, "data", allow_duplicate=True),
        Output(ids.STORE_REQUEST, "data", allow_duplicate=True),
        *M.form_outputs(),
        Output(ids.CALIB_ERROR, "children"),
        Input(ids.CALIB_BUTTON, "n_clicks"),
        State(ids.STORE_REQUEST, "data"),
        background=True, interval=300,
        progress=[Output(ids.CALIB_PROGRESS, "value"), Output(ids.CALIB_STATUS, "children")],
        running=running(ids.CALIB_BUTTON, ids.CALIB_CANCEL, ids.CALIB_PROGRESS),
        cancel=[Input(ids.CALIB_CANCEL, "n_clicks")],
        prevent_initial_call=True,
    )
    def calibrate(set_progress, _n, req_doc):
        set_progress([None, "measuring this machine…"])
        nothing = [no_update] * (2 + len(M.FORM))
        try:
            plan = do_calibrate(req_doc, lambda pct, msg: set_progress([str(pct), msg]))
        except (ExplorerError, ValueError) as exc:
            return *nothing, str(exc)
        except Exception as exc:  # noqa: BLE001 - a failed measurement is one line, not a trace
            return *nothing, f"calibration failed: {type(exc).__name__}: {exc}"
        request = state.request_doc(session.Request.from_dict(plan["request"]))
        return plan, request, *M.form_update(request), ""

    @app.callback(Output(ids.CALIB_STATUS, "children", allow_duplicate=True),
                  Output(ids.CALIB_ERROR, "children", allow_duplicate=True),
                  Input(ids.CALIB_CANCEL, "n_clicks"), prevent_initial_call=True)
    def calibration_cancelled(_n):
        # Dash stops the job's process and every process it started (the workers)
        return CANCELLED, ""


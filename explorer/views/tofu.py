"""Tofu page: every tensor of the training step partitioned over all workers.

Partitions the current model's forward+backward operator graph with Tofu (or one of the
paper's Section 7.3 baselines) as a background job, then shows

* the coarsening counts and the plan's communication and per-worker memory;
* the recursion steps one by one - a slider re-draws the tilings after step s, and a table
  gives each step's k_i, the bytes it adds and the link it crosses;
* Figure 11: every weighted operator's weight (top) and activation input (bottom) as grids of
  tiles coloured by worker, repeated identically tiled blocks folded "×N";
* Figure 10: the algorithms' communication side by side (:mod:`explorer.views.figures.tofu`);
* **Run on local workers**: the shown plan executed as a background job through the service
  (optionally under a per-worker memory limit), then measured against predicted memory per
  worker and step time, the reference check, and the runs of this plan so far.
"""

from __future__ import annotations

from html import escape

import dash
import plotly.graph_objects as go
from dash import Input, Output, State, dcc, html, no_update

from explorer import service as session
from explorer.errors import ExplorerError
from explorer.views import fmt, ids
from explorer.views import tables as T
from explorer.views import palette as P
from explorer.views import state
from explorer.views.controls import (
    context,
    download_controls,
    job_controls,
    register_download,
    register_local_run,
    running,
)
from explorer.views.figures import PARTITION_FIRST, RUN_FIRST, empty_figure
from explorer.views.figures import tofu as F
from explorer.views.run import history_table


STEP_COLUMNS = [("step", "step"), ("split", "groups → workers"), ("delta", "adds"),
                ("total", "total"), ("link", "link GB/s"), ("ms", "ms"),
                ("search_s", "search s")]


def panel_method(req: dict | None, shown: dict | None = None) -> str:
    """The panel's method: the shown partition's, else the request's when it is a Tofu
    method, else Tofu's default."""
    if shown and state.family(shown.get("algo")) == "tofu":
        return shown["algo"]
    return state.tab_method("tofu", req)


def layout(req: dict | None = None, shown: dict | None = None):
    """The panel; its method dropdown shows the shown partition's method (``shown``), else
    ``req``'s when it is a Tofu method."""
    return html.Div(className="panel tofu-panel", children=[
        context("tofu"),
        html.P("Tofu (Wang et al., EuroSys 2019) partitions every tensor of the training step "
               "- forward, backward and the SGD update - over all workers to cut per-worker "
               "memory, minimising total communication by a DP applied recursively "
               "(k = k1·k2·…).", className="muted"),
        html.Div(className="row", children=[
            html.Label(["Method", dcc.Dropdown(
                id=ids.TOFU_ALGO, value=panel_method(req, shown), clearable=False,
                style={"width": "260px"}, options=state.family_options("tofu"))]),
            *job_controls("Partition", ids.TOFU_BUTTON, ids.TOFU_CANCEL, ids.TOFU_PROGRESS,
                          ids.TOFU_STATUS),
            html.Button("Compare algorithms", id=ids.TOFU_COMPARE_BUTTON),
            *download_controls(ids.TOFU_DOWNLOAD_BUTTON, ids.TOFU_DOWNLOAD, "Tofu plan"),
        ]),
        html.Div(id=ids.TOFU_ERROR, className="error"),
        # right under its button: the comparison, not 2,000 px down under the tiles
        dcc.Loading(dcc.Graph(id=ids.TOFU_COMPARE, figure=go.Figure(),
                              style={"height": "340px", "display": "none"})),
        html.Div(id=ids.TOFU_SUMMARY),
        html.Div(className="row tofu-step-row", children=[   # clear of the summary above
            html.Label("After recursion step"),
            html.Div(dcc.Slider(id=ids.TOFU_STEP, min=0, max=1, step=1, value=1,
                                marks={0: "0", 1: "1"}), style={"width": "320px"}),
        ]),
        T.grid(ids.TOFU_STEPS, STEP_COLUMNS),
        html.Div(className="row", children=T.csv_button(ids.TOFU_CSV_BUTTON, ids.TOFU_CSV)),
        html.Div(id=ids.TOFU_STRIP, className="tofu-strip"),
        html.H4("Run the plan"),
        dcc.Store(id=ids.STORE_TOFU_RUN, data=None),
        html.Div(className="row", children=[
            html.Label(["Memory per worker (GiB, optional)",
                        dcc.Input(id=ids.TOFU_RUN_MEMORY, type="number", min=0,
                                  placeholder="no limit", style={"width": "110px"})]),
            *job_controls("Run on local workers", ids.TOFU_RUN_BUTTON, ids.TOFU_RUN_CANCEL,
                          ids.TOFU_RUN_PROGRESS, ids.TOFU_RUN_STATUS, "Cancel run"),
        ]),
        html.Div(id=ids.TOFU_RUN_ERROR, className="error"),
        html.Div(id=ids.TOFU_RUN_RESULT),
        html.Div(className="run-figures", children=[
            dcc.Graph(id=ids.TOFU_RUN_MEMORY_FIG, figure=F.run_memory_figure(None, shown),
                      style={"height": "300px"}),
            dcc.Graph(id=ids.TOFU_RUN_TIME_FIG,
                      figure=empty_figure(RUN_FIRST if shown else PARTITION_FIRST, "Step time"),
                      style={"height": "300px"}),
        ]),
        html.H4("Runs of this plan"),
        history_table(ids.TOFU_RUN_HISTORY),
    ])


def tensor_grid(t: dict, label: str, px: int = 54) -> str:
    """One tensor as a grid of tiles coloured by owning worker (rows: axis 0, cols: axis 1),
    as HTML (see :func:`strip_view`)."""
    owners = t["owners"]
    rows, cols = len(owners), len(owners[0]) if owners else 1
    cells = "".join(
        f'<div class="tofu-tile" title="worker {w}" style="background:{P.device_color(w)};'
        f'color:{P.ink(P.device_color(w))}">{w}</div>' for row in owners for w in row)
    return (f'<div class="tofu-tensor" title="{escape(t["name"])} {tuple(t["shape"])}">'
            f'<div class="tofu-grid" style="grid-template-columns:repeat({cols}, 1fr);'
            f'grid-template-rows:repeat({rows}, 1fr);width:{px}px;height:{px}px">{cells}</div>'
            f'<div class="tofu-label">{escape(label)}</div></div>')


def strip_view(blocks: list):
    """Figure 11: weights on one row, activations on the other, "×N" for repeated blocks.

    The tiles (about a thousand on GPT-2) are one HTML string in one component, not a Dash
    component each: the page's renderer spent 2.5 s on 1,200 components per step shown."""
    cols = []
    for b in blocks:
        name = b["module"] or b["op"]
        if b.get("count", 1) > 1:
            name = f"{name} … {b.get('last', '')}"
        count = f"×{b['count']}" if b.get("count", 1) > 1 else ""
        cols.append(
            f'<div class="tofu-block" title="{escape(b["target"])} {escape(name)}">'
            + tensor_grid(b["weight"], "W " + "×".join(map(str, b["weight"]["shape"][:2])))
            + tensor_grid(b["activation"],
                          "x " + "×".join(map(str, b["activation"]["shape"][:2])))
            + f'<div class="tofu-name">{escape(count + " " + name[-22:])}</div></div>')
    return html.Div([
        html.Div("Top: weights (rows: output channels / rows, columns: input channels); "
                 "bottom: activations (rows: batch, columns: channels). Colour = worker.",
                 className="muted"),
        dcc.Markdown(f'<div class="tofu-blocks">{"".join(cols)}</div>',
                     dangerously_allow_html=True, className="tofu-strip-html"),
    ])


def summary_view(doc: dict):
    c = doc["coarsening"]
    peak = max(doc["peak_memory_bytes"]) if doc["peak_memory_bytes"] else 0
    return html.Div([
        html.Div([html.B(f"{doc['algo']}: "), f"{fmt.bytes_(doc['comm_bytes'])} communicated "
                  f"per step ({fmt.seconds(doc['objective_s'])} on the links), peak "
                  f"{fmt.bytes_(peak)} per worker, k = "
                  f"{' × '.join(map(str, doc['factors'])) or '1'}, searched in "
                  f"{doc['search_time_s']:.2f} s"], id="tofu-headline"),
        html.Div(f"coarsening: {c['ops_before']} operators, {c['tensors_before']} tensors → "
                 f"{c['ops_after']} operator groups, {c['tensors_after']} tensor groups "
                 f"({c['classes']} partition classes, {c['templates']} strategy templates; "
                 f"{'linear' if c['linear'] else 'not linear'})", className="muted"),
    ])


def step_rows(doc: dict) -> list:
    rows = []
    w = 1
    for i, s in enumerate(doc["steps"]):
        rows.append({"step": i + 1, "split": f"{s['groups']} → {s['groups'] * s['k']}",
                     "delta": fmt.bytes_(s["delta_bytes"]),
                     "total": fmt.bytes_(s["total_bytes"]),
                     "link": (round(s["bandwidth_Bps"] / 1e9, 1)
                              if s["bandwidth_Bps"] != float("inf") else "–"),
                     "ms": round(s["seconds"] * 1e3, 2), "search_s": round(s["search_time_s"], 3)})
        w *= s["k"]
    return rows


def do_partition(req_doc: dict, algo: str, progress=lambda v: None) -> dict:
    """Partition the request's model with ``algo`` (raises ExplorerError / ValueError)."""
    req = state.request(req_doc)
    progress(10)
    session.opgraph_for(req)
    progress(50)
    return session.tofu(req, algo)


def strip_for(doc: dict | None, step):
    """The Figure 11 strip of the shown partition after ``step`` recursion steps (a message
    instead when its model cannot be partitioned here)."""
    if not doc:
        return ""
    try:
        req = state.request(doc["request"])
        blocks = session.tofu_strip(req, doc["algo"], upto=step)
    except (ExplorerError, ValueError, KeyError) as exc:
        return html.Div(str(exc), className="error")
    return strip_view(blocks)


def show_view(doc: dict | None) -> tuple:
    """Summary, step rows and the step slider (max, marks, value) for the shown partition."""
    if not doc:
        return (html.P("Partition the current model to see its tensors tiled over the workers.",
                       className="muted"), [], 1, {0: "0", 1: "1"}, 1)
    m = len(doc["steps"])
    return (summary_view(doc), step_rows(doc), max(m, 1),
            {i: str(i) for i in range(m + 1)}, m)


def tofu_id(doc: dict | None) -> str:
    """Identifies the shown Tofu plan (request, algorithm and pins: the search is
    deterministic)."""
    import hashlib
    import json
    doc = doc or {}
    key = json.dumps([doc.get("request"), doc.get("algo"), doc.get("pins") or []],
                     sort_keys=True, default=str)
    return hashlib.sha1(key.encode()).hexdigest()[:16]


def _shown(res: dict | None, doc: dict | None) -> bool:
    return bool(res and doc and res.get("tofu_id") == tofu_id(doc))


def do_run(doc: dict | None, memory_gib=None, progress=lambda v: None) -> dict:
    """Execute the shown Tofu plan on local workers (raises ExplorerError / ValueError)."""
    if not doc:
        raise ExplorerError("partition the model first, then run the plan")
    state.request(doc.get("request"))            # a model file only where the server allows
    res = session.run_tofu(doc, memory_gib=memory_gib, progress=progress)
    res["tofu_id"] = tofu_id(doc)
    return res


def run_view(res: dict | None, doc: dict | None):
    """Reference check, bytes, memory per worker and step time of the last run - if it ran
    the shown plan."""
    if not _shown(res, doc):
        return html.P("Run the shown plan to check it against one device and to compare "
                      "measured with predicted memory per worker and step time.",
                      className="muted")
    ok = res.get("reference_ok")
    err = res.get("max_rel_error")
    ref = ("reference check: skipped" if ok is None else
           f"reference check: {'passed' if ok else 'FAILED'}"
           + (f" (max relative error {err:.1e}, float64)" if err is not None else ""))
    pred_mem = [float(x) for x in doc.get("peak_memory_bytes") or []]
    meas_mem = F.measured_peaks(res)
    mem = (f"memory per worker: predicted peak {fmt.bytes_(max(pred_mem))}"
           if pred_mem else "memory per worker: no prediction")
    if meas_mem:
        mem += f", measured peak {fmt.bytes_(max(meas_mem))} (largest worker)"
    else:
        mem += " (this run reports no per-worker measurement)"
    if res.get("memory_per_worker_bytes"):
        mem += f", limit {fmt.bytes_(res['memory_per_worker_bytes'])}"
    pred_t, what = F.predicted_step(res, doc)
    meas_t = res.get("measured_step_time_s")
    times = "step time: " + ", ".join(
        ([f"predicted {pred_t * 1e3:.2f} ms ({what})"] if pred_t is not None else []) +
        ([f"measured {meas_t * 1e3:.2f} ms on {res.get('workers', doc.get('devices'))} "
          f"local workers"] if meas_t is not None else []))
    items = [html.Div(html.B(ref, className="" if ok in (True, None) else "error"),
                      id="tofu-run-reference"),
             html.Div(f"communication: predicted {doc.get('comm_bytes', 0) / 1e6:.3f} MB, "
                      f"measured {res.get('measured_comm_bytes', 0) / 1e6:.3f} MB per step",
                      id="tofu-run-bytes"),
             html.Div(mem, id="tofu-run-peak"),
             html.Div(times, id="tofu-run-times")]
    if doc.get("preset") not in (None, "", "local"):
        items.append(html.Div(f"the plan was made for {doc['preset']}: its predictions are "
                              f"for those devices, not this machine", className="muted"))
    items += [html.Div(w, className="muted") for w in res.get("warnings", [])]
    return html.Div(items)


def run_history(doc: dict | None) -> list:
    """Stored runs of the shown plan (never breaks the panel)."""
    try:
        return session.runs(doc) if doc else []
    except Exception:  # noqa: BLE001 - history is a convenience
        return []


def register(app: dash.Dash) -> None:
    """The panel's callbacks on ``app``."""
    T.register_csv(app, ids.TOFU_CSV_BUTTON, ids.TOFU_CSV, ids.TOFU_STEPS, STEP_COLUMNS,
                   "tofu-steps", ids.STORE_TOFU)

    @app.callback(
        Output(ids.STORE_TOFU, "data"), Output(ids.TOFU_ERROR, "children"),
        Output(ids.TOFU_STATUS, "children"),
        Input(ids.TOFU_BUTTON, "n_clicks"),
        State(ids.STORE_REQUEST, "data"), State(ids.TOFU_ALGO, "value"),
        background=True, interval=250,
        progress=[Output(ids.TOFU_PROGRESS, "value")],
        running=running(ids.TOFU_BUTTON, ids.TOFU_CANCEL, ids.TOFU_PROGRESS, ids.TOFU_STATUS,
                        "tracing and partitioning…"),
        cancel=[Input(ids.TOFU_CANCEL, "n_clicks")],
        prevent_initial_call=True,
    )
    def partition(set_progress, _n, req_doc, algo):
        set_progress(["0"])
        try:
            doc = do_partition(req_doc, algo if state.family(algo) == "tofu" else
                               state.tab_method("tofu", req_doc),
                               lambda v: set_progress([str(v)]))
        except (ExplorerError, ValueError) as exc:
            return no_update, str(exc), ""
        set_progress(["100"])
        return doc, "", f"done: {doc['model']} on {doc['devices']} workers"

    @app.callback(Output(ids.TOFU_ALGO, "value", allow_duplicate=True),
                  Input(ids.STORE_TOFU, "data"), State(ids.TOFU_ALGO, "value"),
                  prevent_initial_call=True)
    def follow_shown(doc, algo):
        # the panel's method is the shown partition's (a Search or a loaded plan may bring
        # another one)
        # (set even when unchanged: the form's request follows it, so the URL reopens it)
        if not doc or state.family(doc.get("algo")) != "tofu":
            raise dash.exceptions.PreventUpdate
        return doc["algo"]

    register_download(app, ids.TOFU_DOWNLOAD_BUTTON, ids.TOFU_DOWNLOAD, ids.STORE_TOFU,
                      ids.TOFU_ERROR)

    @app.callback(Output(ids.TOFU_SUMMARY, "children"), Output(ids.TOFU_STEPS, "rowData"),
                  Output(ids.TOFU_STEP, "max"), Output(ids.TOFU_STEP, "marks"),
                  Output(ids.TOFU_STEP, "value"),
                  Input(ids.STORE_TOFU, "data"))
    def show(doc):
        return show_view(doc)

    @app.callback(Output(ids.TOFU_STRIP, "children"),
                  Input(ids.TOFU_STEP, "value"), State(ids.STORE_TOFU, "data"))
    def show_strip(step, doc):
        return strip_for(doc, step)

    register_local_run(
        app, button_id=ids.TOFU_RUN_BUTTON, cancel_id=ids.TOFU_RUN_CANCEL,
        progress_id=ids.TOFU_RUN_PROGRESS, status_id=ids.TOFU_RUN_STATUS,
        error_id=ids.TOFU_RUN_ERROR, store_id=ids.STORE_TOFU_RUN,
        states=[(ids.STORE_TOFU, "data"), (ids.TOFU_RUN_MEMORY, "value")],
        job=do_run,
        done=lambda res, doc, _m: f"done: {res.get('workers', doc.get('devices'))} workers")

    @app.callback(
        Output(ids.TOFU_RUN_RESULT, "children"), Output(ids.TOFU_RUN_MEMORY_FIG, "figure"),
        Output(ids.TOFU_RUN_TIME_FIG, "figure"), Output(ids.TOFU_RUN_HISTORY, "rowData"),
        Input(ids.STORE_TOFU_RUN, "data"), Input(ids.STORE_TOFU, "data"),
    )
    def show_run(res, doc):
        shown = res if _shown(res, doc) else None
        return (run_view(res, doc), F.run_memory_figure(shown, doc),
                F.run_time_figure(shown, doc) if shown else
                empty_figure(RUN_FIRST if doc else PARTITION_FIRST, "Step time"),
                run_history(doc))

    @app.callback(Output(ids.TOFU_COMPARE, "figure"), Output(ids.TOFU_COMPARE, "style"),
                  Output(ids.TOFU_ERROR, "children", allow_duplicate=True),
                  Input(ids.TOFU_COMPARE_BUTTON, "n_clicks"), State(ids.STORE_REQUEST, "data"),
                  prevent_initial_call=True)
    def compare(_n, req_doc):
        try:
            cmp = session.tofu_compare(state.request(req_doc))
        except (ExplorerError, ValueError) as exc:
            return no_update, no_update, str(exc)
        return F.compare_figure(cmp), {"height": "340px"}, ""

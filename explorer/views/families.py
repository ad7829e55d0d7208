"""Compare across families: the Compare tab's section that puts every family's methods - data,
model, OWT, Megatron, OptCNN; Tofu and its baselines; Celeritas and its baselines - on the
form's model and devices in one chart and one table (``service.compare_all``, the same
comparison as ``explorer compare``).

Each row says what its prediction rests on (``basis``): the families predict a step in three
ways, so the note above the chart says which numbers are one currency and which are not.  A
row's measured step is the newest stored run of exactly that plan.  Each row links to its
family's page opened on the same request and method, where the plan is shown, run and
downloaded.

The comparison searches every method (seconds to minutes, the first time), so it is a
background job with progress and Cancel; :func:`run_families` is what the job does, a plain
function the tests and the UI benchmark call.  The job runs in a process forked from the
server, which keeps none of the plans it finds; so the page keeps its last comparison
(``ids.STORE_FAMILIES``), and the button pressed again on the same request reads only the
runs stored since (``service.remeasure``) instead of searching every method again.
"""

from __future__ import annotations

import json
import time

import dash
from dash import Input, Output, State, dcc, html, no_update

from explorer import service as session
from explorer.errors import ExplorerError
from explorer.views import fmt, ids, state
from explorer.views import tables as T
from explorer.views.controls import job_controls, running
from explorer.views.figures import families as F

#: the table's columns: (field, header)
COLUMNS = [("rank", "#"), ("method", "method"), ("family", "family"),
           ("basis", "predicted by"), ("predicted", "predicted step"),
           ("measured", "measured step"), ("peak", "peak memory / device"),
           ("moved", "moved per step"), ("search", "search time"), ("fits", "fits"),
           ("open", "open the plan"), ("note", "what it is")]
WIDTHS = {"rank": 46, "method": 112, "family": 90, "basis": 152, "predicted": 90,
          "measured": 124, "peak": 98, "moved": 90, "search": 86, "fits": 56, "open": 120,
          "note": 220}
TOOLTIPS = {
    "basis": "what the prediction rests on: each family predicts a step its own way, on the "
             "same devices and operator rates",
    "measured": "the newest stored run of exactly this plan (Run on local workers on its page, "
                "or `explorer rank`), and how far the prediction was from it",
    "peak": "peak memory on the fullest device",
    "moved": "bytes sent between devices per training step",
    "search": "how long the method took to find its plan",
    "open": "opens the plan on its family's page (same model, devices and method)"}
ROW_STYLE = {"styleConditions": [
    {"condition": "params.data && params.data.best === '1'",
     "style": {"backgroundColor": "#e3f1e3", "fontWeight": "bold"}},
    {"condition": "params.data && (params.data.fits === 'NO' || params.data.rank === '–')",
     "style": {"color": "#b91c1c"}}]}
#: what each family's prediction is, in a sentence (the note above the chart)
BASIS_TEXT = {
    "layerwise": "equation 1 of OptCNN: each layer's compute, the transfers between layers and "
                 "the gradient synchronisation, summed",
    "tofu": "the time on the links (Tofu minimises bytes) plus the slowest device's compute",
    "placement": "the simulated schedule of every operator on its device, with transfers"}
HIDDEN = {"display": "none"}
SHOWN = {"display": "block"}


def family_page(fam: str) -> str:
    """The page that shows ``fam``'s plans ("Layer-wise", "Tofu", "Placement")."""
    return {"layerwise": "Layer-wise", "tofu": "Tofu", "placement": "Placement"}.get(fam, fam)


def plan_url(request: dict, method: str) -> str:
    """The address of ``method``'s plan on its family's page: the same model, batch,
    arguments and devices (no pins: the comparison runs every method unpinned)."""
    doc = {**(request or {}), "algo": method, "pins": []}
    return state.page_url(state.family(method) or "layerwise", doc)


def _error(row: dict) -> str:
    err = row.get("error")
    return "" if err is None else f" ({err * 100:+.0f} %)"


def table_rows(report: dict | None, descriptions: dict | None = None) -> list:
    """The table of ``report`` (``service.compare_all``): one row per method in the report's
    order (fastest predicted first), quantities in the unit their magnitude calls for; a
    method that cannot plan keeps its row with the reason.  ``descriptions``: method -> one
    line (the registry's)."""
    report = report or {}
    req, best = report.get("request") or {}, report.get("best")
    descriptions = descriptions or {}
    out, rank = [], 0
    for r in report.get("rows") or []:
        fam = r["family"]
        row = {"method": r["method"], "family": F.family_name(fam), "basis": r["basis"],
               "note": descriptions.get(r["method"], "")}
        if "failed" in r:
            row.update(rank="–", predicted="–", measured="–", fits="–", open="",
                       note=f"cannot plan: {r['failed']}", best="0")
            out.append(row)
            continue
        rank += 1
        meas = r.get("measured_step_s")
        row.update(rank=str(rank), predicted=fmt.seconds(r["predicted_step_s"]),
                   measured=(fmt.seconds(meas) + _error(r)) if meas else "not run",
                   peak=fmt.bytes_(r["peak_bytes"]), moved=fmt.bytes_(r["comm_bytes"]),
                   search=fmt.seconds(r["search_time_s"]),
                   fits="yes" if r["fits_memory"] else "NO",
                   open=f"[{family_page(fam)} page]({plan_url(req, r['method'])})",
                   best="1" if r["method"] == best else "0")
        out.append(row)
    return out


def basis_note(report: dict | None) -> list:
    """The lines above the chart: what each family's prediction rests on, that bars of
    different families are not one currency, and how many plans have a measured step."""
    rows = (report or {}).get("rows") or []
    fams = [f for f in F.FAMILIES if any(r["family"] == f for r in rows)]
    ok = [r for r in rows if "failed" not in r]
    measured = [r for r in ok if r.get("measured_step_s")]
    items = [html.Li([html.B(F.legend_name(f, next(r["basis"] for r in rows
                                                      if r["family"] == f))),
                      f": {BASIS_TEXT.get(f, '')}."]) for f in fams]
    req = (report or {}).get("request") or {}
    run_hint = "run a plan from its page (Run on local workers)"
    if req.get("preset") == "local":        # `explorer rank` runs plans made for this machine
        run_hint += (f", or all of them with `explorer rank {req.get('model')} --devices "
                     f"{req.get('devices')} --preset local`")
    tail = (f"{len(measured)} of {len(ok)} plans have a measured step (◆ in the chart): those "
            f"are one currency; for the others, {run_hint}." if measured else
            f"None of these plans has run here yet, so no row has a measured step: {run_hint}.")
    return [html.Div("Each family predicts a step its own way, on the same devices and "
                     "operator rates. Within a family the order is its predictor's; across "
                     "families the predicted steps are not one currency - only measured steps "
                     "are.", className="families-warning"),
            html.Ul(items, className="families-basis"),
            html.Div(tail, className="muted")]


def status_line(report: dict, seconds: float, pins: list | None = None) -> str:
    req = report.get("request") or {}
    rows = report.get("rows") or []
    failed = [r["method"] for r in rows if "failed" in r]
    parts = [f"{req.get('model')}, batch {req.get('batch') or 'default'}, "
             f"{req.get('devices')} × {req.get('preset')}",
             f"{len(rows) - len(failed)} plans from "
             f"{len({r['family'] for r in rows if 'failed' not in r})} families"]
    if report.get("best"):
        best = next(r for r in rows if r["method"] == report["best"])
        parts.append(f"fastest predicted that fits: {best['method']} "
                     f"({F.family_name(best['family'])}, {best['basis']})")
    if failed:
        parts.append("cannot plan: " + ", ".join(failed))
    if pins:
        parts.append("layer-wise pins not applied")
    parts.append(f"{seconds:.1f} s")
    return " · ".join(parts)


def request_key(req: session.Request) -> str:
    """Identity of a comparison: its request (pins are not applied)."""
    return json.dumps(req.to_dict(), sort_keys=True, default=str)


def run_families(req_doc: dict | None, progress=lambda pct, text: None,
                 last: dict | None = None) -> dict:
    """What the job does: every family's methods on the request ``req_doc`` (the form's).
    When ``last`` (the page's last comparison, ``{"key", "report"}``) is of the same request,
    its plans are kept and only their measured steps are read again (``service.remeasure``):
    the searches are deterministic, and the job runs in a process that has none of them
    cached.  Returns ``{"rows", "figure", "note", "status", "report", "store"}``, or
    ``{"error"}`` with one line (a bad request, no method could plan); never raises for
    what a user can enter."""
    t0 = time.perf_counter()
    try:
        req = state.request(req_doc)
        key = request_key(req)
        if last and last.get("key") == key and last.get("report"):
            progress(50, "reading the runs stored since…")
            report, again = session.remeasure(last["report"]), True
        else:
            methods = session.all_methods()
            index = {m: i for i, m in enumerate(methods)}

            def said(msg: str) -> None:
                m = msg.removeprefix("searching ")
                progress(int(100 * index.get(m, 0) / max(len(methods), 1)), f"{msg}…")
            report, again = session.compare_all(req, methods, progress=said), False
    except (ExplorerError, ValueError) as exc:
        return {"error": f"cannot compare across families: {exc}"}
    descriptions = {m: d for m, (_, d) in state.methods().items()}
    status = status_line(report, time.perf_counter() - t0, state.pins_of(req_doc))
    if again:
        status += " · the plans of the last comparison, runs read again (reload to search again)"
    return {"rows": table_rows(report, descriptions), "figure": F.families_figure(report),
            "note": basis_note(report), "report": report, "status": status,
            "store": {"key": key, "report": report}}


def _grid():
    """The table: an AG Grid whose "open the plan" cells are links (markdown)."""
    # widths fixed, not sized to the content: the grid is built hidden (before the first
    # comparison), where AG Grid's auto-size measures nothing and leaves every column narrow
    grid = T.grid(ids.FAMILIES_TABLE, COLUMNS, tooltips=TOOLTIPS, wrap=("note",),
                  row_style=ROW_STYLE, row_id="method", widths=WIDTHS, column_size=None)
    for col in grid.columnDefs:
        if col["field"] == "open":
            col["cellRenderer"] = "markdown"
    grid.defaultColDef = {**grid.defaultColDef, "wrapHeaderText": True,
                          "autoHeaderHeight": True}
    return grid


def layout():
    """The section: its bar (button, Cancel, progress, status), then - once compared - the
    note, the chart and the table, right under the button."""
    return html.Div(className="families-section", children=[
        html.Div(className="compare-bar families-bar", children=[
            html.Span("Across families", className="families-title"),
            *job_controls("Compare across families", ids.FAMILIES_BUTTON,
                          ids.FAMILIES_CANCEL, ids.FAMILIES_PROGRESS, ids.FAMILIES_STATUS,
                          primary=False),
        ]),
        html.Div("data, model, OWT, Megatron, OptCNN · Tofu and its baselines · Celeritas "
                 "and its baselines, on the form's model and devices: predicted step, memory, "
                 "bytes, search time, and measured step where a run is stored.",
                 className="muted families-hint"),
        dcc.Store(id=ids.STORE_FAMILIES, data=None),
        html.Div(id=ids.FAMILIES_RESULTS, style=HIDDEN, children=[
            html.Div(id=ids.FAMILIES_NOTE, className="families-note"),
            dcc.Graph(id=ids.FAMILIES_FIG, figure=F.families_figure(None),
                      config={"displaylogo": False}),
            _grid(),
            html.Div(className="row", children=T.csv_button(ids.FAMILIES_CSV_BUTTON,
                                                            ids.FAMILIES_CSV)),
        ]),
        html.Hr(className="families-rule"),
    ])


def register(app: dash.Dash) -> None:
    """The section's callbacks on ``app``: the comparison (a background job) and its CSV."""
    T.register_csv(app, ids.FAMILIES_CSV_BUTTON, ids.FAMILIES_CSV, ids.FAMILIES_TABLE,
                   [c for c in COLUMNS if c[0] != "open"], "families")

    @app.callback(
        Output(ids.FAMILIES_TABLE, "rowData"), Output(ids.FAMILIES_FIG, "figure"),
        Output(ids.FAMILIES_NOTE, "children"), Output(ids.FAMILIES_STATUS, "children"),
        Output(ids.FAMILIES_RESULTS, "style"), Output(ids.STORE_FAMILIES, "data"),
        Input(ids.FAMILIES_BUTTON, "n_clicks"),
        State(ids.STORE_REQUEST, "data"), State(ids.STORE_FAMILIES, "data"),
        background=True, interval=300,
        progress=[Output(ids.FAMILIES_PROGRESS, "value"),
                  Output(ids.FAMILIES_STATUS, "children")],
        running=running(ids.FAMILIES_BUTTON, ids.FAMILIES_CANCEL, ids.FAMILIES_PROGRESS),
        cancel=[Input(ids.FAMILIES_CANCEL, "n_clicks")],
        prevent_initial_call=True,
    )
    def compare_families(set_progress, _n, req_doc, last):
        set_progress(["0", "searching every family's methods…"])
        out = run_families(req_doc, lambda pct, text: set_progress([str(pct), text]), last)
        if "error" in out:
            return no_update, no_update, no_update, out["error"], no_update, no_update
        return (out["rows"], out["figure"], out["note"], out["status"], SHOWN,
                out["store"])


__all__ = ["COLUMNS", "BASIS_TEXT", "family_page", "plan_url", "table_rows", "basis_note",
           "status_line", "request_key", "run_families", "layout", "register"]

"""Rank by running: the Compare tab's section that checks the predicted order of plans against
the measured one on this machine (``service.rank``, the same check as ``explorer rank``).

Each chosen method searches its plan on the form's request; every plan runs on the local
workers, interleaved over the rounds, so a slow spell of a shared machine falls on all plans
alike.  The section shows, per plan, the predicted step beside the measured median and minimum
and the prediction's error; above the table Kendall's τ between the two orders, the regret of
trusting the prediction (the measured step of the plan predicted fastest over the fastest
measured) and the noise the runs saw - and, when a run was noisy, one line saying the measured
order may not be the machine's.

Plans run here, so the button is on only when the request's devices are the ``local`` preset;
otherwise one line says why.  The ranking runs plans for seconds to minutes, so it is a
background job with progress and Cancel; :func:`run_ranking` is what the job does, a plain
function the tests call.
"""

from __future__ import annotations

import re
import time

import dash
from dash import Input, Output, State, dcc, html, no_update

from explorer import service as session
from explorer.errors import ExplorerError
from explorer.views import fmt, ids, state
from explorer.views import tables as T
from explorer.views.controls import job_controls, running
from explorer.views.figures import families as FF
from explorer.views.figures import ranking as F

#: the table's columns: (field, header)
COLUMNS = [("measured_rank", "measured #"), ("method", "method"), ("family", "family"),
           ("basis", "predicted by"), ("predicted", "predicted step"),
           ("median", "measured median"), ("min", "measured min"), ("error", "error"),
           ("predicted_rank", "predicted #"), ("check", "check"), ("note", "note")]
WIDTHS = {"measured_rank": 96, "method": 110, "family": 90, "basis": 150, "predicted": 96,
          "median": 100, "min": 96, "error": 70, "predicted_rank": 96, "check": 70,
          "note": 200}
TOOLTIPS = {
    "measured_rank": "the plan's place in the measured order (1: fastest measured)",
    "basis": "what the prediction rests on: each family predicts a step its own way",
    "median": "the median over the rounds of each round's median step",
    "min": "the fastest round's median step",
    "error": "(predicted - measured median) / measured median",
    "predicted_rank": "the plan's place in the predicted order (1: predicted fastest, its "
                      "row in bold)",
    "check": "the first round's check of the plan's result against one device"}
ROW_STYLE = {"styleConditions": [
    {"condition": "params.data && params.data.predicted_rank === '1'",
     "style": {"fontWeight": "bold"}},
    {"condition": "params.data && params.data.measured_rank === '–'",
     "style": {"color": "#b91c1c"}}]}
HIDDEN = {"display": "none"}
SHOWN = {"display": "block"}
#: the bounds of the inputs: enough for a careful ranking, never an afternoon by a typo
ROUNDS = (1, 20)
STEPS = (1, 500)
DEFAULT_ROUNDS = 3
DEFAULT_STEPS = 5
#: what the page says once Cancel stopped a ranking
CANCELLED = "ranking cancelled: its worker processes were stopped"


def method_choices() -> dict:
    """The methods a ranking may run, per family (the comparison's lists), as checklist
    options whose label carries the method's description as a tooltip:
    ``{family: [{"label", "value"}]}``."""
    descriptions = {m: d for m, (_, d) in state.methods().items()}
    out: dict = {fam: [] for fam in FF.FAMILIES}
    for m in session.all_methods():
        fam = state.family(m)
        if fam in out:
            out[fam].append({"label": html.Span(m, title=descriptions.get(m, "")),
                             "value": m})
    return out


def count(value, name: str, bounds: tuple) -> int:
    """``value`` from a number box as a whole number within ``bounds``; a ``ValueError`` of
    one line naming the box otherwise (an empty or non-numeric box reads as ``None``)."""
    lo, hi = bounds
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name}: enter a whole number from {lo} to {hi}") from None
    if number != int(number) or not lo <= number <= hi:
        raise ValueError(f"{name}: enter a whole number from {lo} to {hi}, not {number:g}")
    return int(number)


def chosen(methods_by_family) -> list:
    """The ticked methods, families in order; a ``ValueError`` when none is."""
    got = [m for values in methods_by_family for m in (values or [])]
    if not got:
        raise ValueError("methods: tick at least one method to rank")
    return got


def gate(req_doc: dict | None) -> tuple:
    """``(disabled, why)`` for the button: plans run on this machine, so only the ``local``
    preset ranks; ``why`` is the one line that says so (empty when enabled)."""
    preset = (req_doc or {}).get("preset")
    if preset == "local":
        return False, ""
    return True, (f"Rank by running runs every plan on this machine's workers: choose the "
                  f"'local' devices preset to use it (now: {preset or 'none'}).")


def progress_pct(msg: str, methods: list, rounds: int) -> int:
    """How far a ranking is, from ``service.rank``'s progress message: the searches, then
    each plan's run in each round, as equal parts."""
    n = max(len(methods), 1)
    total = n * (1 + rounds)
    index = {m: i for i, m in enumerate(methods)}
    if msg.startswith("searching "):
        done = index.get(msg.removeprefix("searching "), 0)
    else:
        got = re.match(r"round (\d+)/\d+: running (.+)$", msg)
        if not got:
            return 0
        done = n + (int(got.group(1)) - 1) * n + index.get(got.group(2), 0)
    return int(100 * done / total)


def _order(row: dict) -> tuple:
    return ("measured_step_s" not in row, row.get("measured_rank", 0))


def table_rows(report: dict | None) -> list:
    """The table of ``report`` (``service.rank``): one row per method, fastest measured
    first; a method that could not plan or whose run failed keeps its row with the reason."""
    out = []
    for r in sorted((report or {}).get("rows") or [], key=_order):
        row = {"method": r["method"], "family": FF.family_name(r["family"]),
               "basis": r.get("basis", ""), "note": ""}
        if "measured_step_s" not in r:
            why = r.get("failed") or "no run finished"
            row.update(measured_rank="–", predicted="–", median="–", min="–", error="–",
                       predicted_rank="–", check="–", note=why)
            if "predicted_step_s" in r:
                row["predicted"] = fmt.seconds(r["predicted_step_s"])
            out.append(row)
            continue
        ok = r.get("reference_ok")
        row.update(measured_rank=str(r["measured_rank"]),
                   predicted=fmt.seconds(r["predicted_step_s"]),
                   median=fmt.seconds(r["measured_step_s"]),
                   min=fmt.seconds(r["measured_min_s"]), error=f"{r['error'] * 100:+.0f} %",
                   predicted_rank=str(r["predicted_rank"]),
                   check={True: "ok", False: "FAILED", None: "–"}[ok],
                   note="noisy run" if r.get("noisy") else "")
        out.append(row)
    return out


def headline(report: dict) -> str:
    """τ and the regret in one line, with the plans the regret compares."""
    rows = F.ran(report)
    tau, reg = report.get("kendall_tau"), report.get("regret")
    line = (f"Kendall τ {F.tau_text(tau)} between the predicted and measured orders"
            + (" (it needs two plans)" if tau is None and len(rows) < 2 else ""))
    if reg is None or not rows:
        return line + " · regret –"
    best_pred = next(r for r in rows if r["predicted_rank"] == 1)
    best_meas = next(r for r in rows if r["measured_rank"] == 1)
    if best_pred is best_meas:
        return (line + f" · regret {F.regret_text(reg)}: the plan predicted fastest, "
                f"{best_pred['method']}, ran fastest")
    return (line + f" · regret {F.regret_text(reg)}: the plan predicted fastest, "
            f"{best_pred['method']}, measured {fmt.seconds(best_pred['measured_step_s'])}; "
            f"the fastest measured, {best_meas['method']}, "
            f"{fmt.seconds(best_meas['measured_step_s'])}")


def noise_line(report: dict) -> str:
    """The noise the runs saw: the most CPU stolen, the largest change of the canary, the
    widest spread of steps, over how many runs - and whether any was above its threshold."""
    runs = [n for r in F.ran(report) for n in r.get("noise") or []]
    if not runs:
        return "noise: no run recorded it"
    steals = [n["steal"] for n in runs if n.get("steal") is not None]
    changes = [abs(n["canary_change"]) for n in runs if n.get("canary_change") is not None]
    spreads = [(n.get("spread") or {}).get("iqr_rel") for n in runs]
    spreads = [s for s in spreads if s is not None]
    parts = [f"CPU stolen up to {max(steals) * 100:.1f} %" if steals
             else "CPU steal not reported here",
             f"canary changed up to {max(changes) * 100:.0f} %" if changes
             else "no canary",
             f"steps' spread (IQR / median) up to {max(spreads) * 100:.0f} %" if spreads
             else "no spread"]
    tail = "" if report.get("noisy") else " - none above the noise thresholds"
    return f"noise over {len(runs)} runs: " + " · ".join(parts) + tail


def status_line(report: dict, seconds: float) -> str:
    """What was ranked and how long it took."""
    req = report.get("request") or {}
    rows = report.get("rows") or []
    failed = [r["method"] for r in rows if "measured_step_s" not in r]
    parts = [f"{req.get('model')}, batch {req.get('batch') or 'default'}, "
             f"{req.get('devices')} local workers",
             f"{len(rows) - len(failed)} plans × {report.get('rounds')} round(s) of "
             f"{report.get('steps')} steps"]
    if failed:
        parts.append("not ranked: " + ", ".join(failed))
    parts.append(f"{seconds:.1f} s")
    return " · ".join(parts)


def summary(report: dict) -> list:
    """The lines above the chart: τ and regret, the noise seen, and - when a run was noisy -
    the one line that says the measured order may not be the machine's."""
    out = [html.Div(html.B(headline(report)), className="rank-headline"),
           html.Div(noise_line(report), className="muted rank-noise")]
    if report.get("noise_note"):
        out.append(html.Div(report["noise_note"], className="rank-noisy"))
    return out


def run_ranking(req_doc: dict | None, methods_by_family, rounds, steps,
                progress=lambda pct, text: None) -> dict:
    """What the job does: the inputs checked, then ``service.rank`` on the request
    ``req_doc`` (the form's) with the ticked methods.  Returns ``{"rows", "figure",
    "summary", "status", "report"}``, or ``{"error"}`` with one line (bad input, a preset
    that is not local, no method could plan); never raises for what a user can enter."""
    t0 = time.perf_counter()
    try:
        rounds = count(rounds, "rounds", ROUNDS)
        steps = count(steps, "steps", STEPS)
        methods = chosen(methods_by_family)
        req = state.request(req_doc)
        disabled, why = gate({"preset": req.preset})
        if disabled:
            raise ExplorerError(why)
        report = session.rank(req, methods, rounds=rounds, steps=steps, progress=lambda msg:
                              progress(progress_pct(msg, methods, rounds), f"{msg}…"))
    except (ExplorerError, ValueError) as exc:
        return {"error": f"cannot rank: {exc}"}
    return {"rows": table_rows(report), "figure": F.ranking_figure(report),
            "summary": summary(report), "report": report,
            "status": status_line(report, time.perf_counter() - t0)}


def _grid():
    # widths fixed: the grid is built hidden, where AG Grid's auto-size measures nothing
    grid = T.grid(ids.RANK_TABLE, COLUMNS, tooltips=TOOLTIPS, wrap=("note",),
                  row_style=ROW_STYLE, row_id="method", widths=WIDTHS, column_size=None)
    for col in grid.columnDefs:
        if col["field"] == "note":      # wrapped, yet centred like the cells beside it
            col["cellStyle"] = {**col["cellStyle"], "display": "flex", "alignItems": "center"}
    grid.defaultColDef = {**grid.defaultColDef, "wrapHeaderText": True,
                          "autoHeaderHeight": True}
    return grid


def layout():
    """The section: its bar (rounds, steps, the methods, button, Cancel, progress, status),
    the line saying why it is off, then - once ranked - the summary, the chart and the table."""
    choices = method_choices()
    defaults = set(session.RANK_METHODS)
    return html.Div(className="rank-section", children=[
        html.Div(className="compare-bar rank-bar", children=[
            html.Span("Ranking check", className="families-title"),
            html.Label(["rounds", dcc.Input(id=ids.RANK_ROUNDS, type="number", min=ROUNDS[0],
                                            max=ROUNDS[1], step=1, value=DEFAULT_ROUNDS,
                                            className="rank-count")], className="rank-input"),
            html.Label(["steps", dcc.Input(id=ids.RANK_STEPS, type="number", min=STEPS[0],
                                           max=STEPS[1], step=1, value=DEFAULT_STEPS,
                                           className="rank-count")], className="rank-input"),
            *job_controls("Rank by running", ids.RANK_BUTTON, ids.RANK_CANCEL,
                          ids.RANK_PROGRESS, ids.RANK_STATUS, primary=False),
        ]),
        html.Div(className="rank-methods", children=[
            html.Div(className="rank-family", children=[
                html.Span(FF.family_name(fam), className="rank-family-name"),
                dcc.Checklist(id=ids.RANK_METHODS + fam, options=opts, inline=True,
                              value=[o["value"] for o in opts if o["value"] in defaults])])
            for fam, opts in choices.items()]),
        html.Div("Searches each ticked method on the form's model and runs every plan on the "
                 "local workers, the rounds interleaved: predicted against measured step per "
                 "plan, Kendall τ between the orders, the regret of trusting the prediction, "
                 "and the noise the runs saw.", className="muted families-hint"),
        html.Div(id=ids.RANK_GATE, className="rank-gate"),
        html.Div(id=ids.RANK_ERROR, className="error"),
        html.Div(id=ids.RANK_RESULTS, style=HIDDEN, children=[
            html.Div(id=ids.RANK_SUMMARY, className="rank-summary"),
            dcc.Graph(id=ids.RANK_FIG, figure=F.ranking_figure(None),
                      config={"displaylogo": False}),
            _grid(),
            html.Div(className="row", children=T.csv_button(ids.RANK_CSV_BUTTON,
                                                            ids.RANK_CSV)),
        ]),
        html.Hr(className="families-rule"),
    ])


def register(app: dash.Dash) -> None:
    """The section's callbacks on ``app``: the gate, the ranking (a background job), its
    cancel and its CSV."""
    T.register_csv(app, ids.RANK_CSV_BUTTON, ids.RANK_CSV, ids.RANK_TABLE, COLUMNS, "ranking")

    @app.callback(Output(ids.RANK_BUTTON, "disabled"), Output(ids.RANK_GATE, "children"),
                  Input(ids.STORE_REQUEST, "data"))
    def gate_button(req_doc):
        return gate(req_doc)

    @app.callback(
        Output(ids.RANK_TABLE, "rowData"), Output(ids.RANK_FIG, "figure"),
        Output(ids.RANK_SUMMARY, "children"), Output(ids.RANK_STATUS, "children"),
        Output(ids.RANK_ERROR, "children"), Output(ids.RANK_RESULTS, "style"),
        Input(ids.RANK_BUTTON, "n_clicks"),
        State(ids.STORE_REQUEST, "data"), State(ids.RANK_ROUNDS, "value"),
        State(ids.RANK_STEPS, "value"),
        *[State(ids.RANK_METHODS + fam, "value") for fam in FF.FAMILIES],
        background=True, interval=300,
        progress=[Output(ids.RANK_PROGRESS, "value"), Output(ids.RANK_STATUS, "children")],
        running=running(ids.RANK_BUTTON, ids.RANK_CANCEL, ids.RANK_PROGRESS),
        cancel=[Input(ids.RANK_CANCEL, "n_clicks")],
        prevent_initial_call=True,
    )
    def rank_plans(set_progress, _n, req_doc, rounds, steps, *methods):
        set_progress(["0", "searching the ticked methods…"])
        out = run_ranking(req_doc, methods, rounds, steps,
                          lambda pct, text: set_progress([str(pct), text]))
        if "error" in out:
            return no_update, no_update, no_update, "", out["error"], no_update
        return out["rows"], out["figure"], out["summary"], out["status"], "", SHOWN

    @app.callback(Output(ids.RANK_STATUS, "children", allow_duplicate=True),
                  Input(ids.RANK_CANCEL, "n_clicks"), prevent_initial_call=True)
    def rank_cancelled(_n):
        # Dash stops the job's process and every process it started (the workers)
        return CANCELLED


__all__ = ["COLUMNS", "CANCELLED", "method_choices", "count", "chosen", "gate", "progress_pct",
           "table_rows", "headline", "noise_line", "status_line", "summary", "run_ranking",
           "layout", "register"]

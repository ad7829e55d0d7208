"""Plans panel: the history of plans (SQLite, see :mod:`explorer.engine.history`), loading a
saved plan back into the app, downloading the current plan and uploading a plan file.

Every plan that reaches the plan store without an ``"error"`` is saved automatically, unless
it came from the history (it then carries ``history_id``) or an identical plan is already
saved (same model, devices, pins and per-layer choices).  ``dcc.Tabs`` mounts only the shown
tab, and Dash does not run a callback whose outputs are not on the page, so the auto-save is a
callback *without outputs* on the plan store (it runs whichever tab is open); the table's
callback saves too (atomically deduplicated), so it never lists the history without the plan
that just arrived.  The logic lives in plain functions
(:func:`autosave`, :func:`load_plan`, :func:`parse_upload`, :func:`ingest_upload`,
:func:`download_payload`); the callbacks only wire them to components.
"""

from __future__ import annotations

import base64
import binascii
import json
import re

import dash
from dash import Input, Output, State, dash_table, dcc, html

from .. import service as session
from ..engine.history import PlanStore
from ..engine.plandoc import dumps
from ..engine.plan import SCHEMA, Plan
from . import ids

COLUMNS = [
    {"id": "id", "name": "#", "type": "numeric"},
    {"id": "time", "name": "saved"},
    {"id": "model", "name": "model"},
    {"id": "algo", "name": "algorithm"},
    {"id": "preset", "name": "devices preset"},
    {"id": "devices", "name": "devices", "type": "numeric"},
    {"id": "batch", "name": "batch", "type": "numeric"},
    {"id": "objective_ms", "name": "objective (ms)", "type": "numeric"},
    {"id": "pins", "name": "pins"},
    {"id": "note", "name": "note"},
]


# ---- logic (plain functions, called by tests) -------------------------------------------------

def table_rows(store: PlanStore, limit: int = 200) -> list:
    """Rows for the DataTable (``id`` doubles as the row id for ``selected_row_ids``)."""
    rows = []
    for r in store.list(limit):
        r = dict(r)
        r["time"] = r["time"].replace("T", " ")[:19]
        r["objective_ms"] = None if r["objective_ms"] is None else round(r["objective_ms"], 4)
        r["pins"] = "; ".join(r["pins"])
        rows.append(r)
    return rows


def request_of(plan: dict) -> dict:
    """The search request a plan answers: its own ``request`` when the app made it, else rebuilt
    from the plan's fields (plans written by ``explorer search --json``)."""
    if plan.get("request"):
        return session.Request.from_dict(plan["request"]).to_dict()
    info = plan.get("info") or {}
    req = session.Request(model=plan.get("spec") or plan["model"], batch=plan.get("batch"),
                          model_args=dict(plan.get("model_args") or {}),
                          preset=plan["preset"], devices=plan["devices"], algo=plan["algo"],
                          cost=info.get("compute_cost", "analytic"), sync=info.get("sync", "ps"))
    return req.to_dict()


def autosave(plan, store: PlanStore, note: str = "search"):
    """Save a plan that just landed in the plan store.  Returns ``(id, message)``; ``(None,
    None)`` when there is nothing to save (no plan, an error, or a plan loaded from the history,
    which carries ``history_id``).  A plan identical to a saved one is not saved twice."""
    if not isinstance(plan, dict) or "error" in plan or "layers" not in plan:
        return None, None
    if plan.get("history_id") is not None:
        return None, None
    pid, created = store.save_new(plan, note)
    if not created:
        return pid, f"already saved as plan #{pid}"
    return pid, f"saved as plan #{pid}: {_describe(plan)}"


def load_plan(store: PlanStore, plan_id) -> tuple:
    """``(plan, request, pins)`` for the stores from saved plan ``plan_id``; the plan carries
    ``history_id`` (so it is not saved again) and ``request``."""
    plan = store.get(plan_id)
    plan["history_id"] = int(plan_id)
    plan["request"] = request_of(plan)
    return plan, plan["request"], list(plan.get("pins") or [])


def download_payload(plan) -> dict:
    """``dcc.Download`` data for the current plan: JSON without the trace (and without the
    local ``history_id``), named ``<model>-<algo>-<devices>dev.json``."""
    if isinstance(plan, dict) and "error" in plan:
        raise ValueError(f"the current search failed, nothing to download: {plan['error']}")
    if not isinstance(plan, dict) or "layers" not in plan:
        raise ValueError("there is no plan to download: run a search first")
    doc = {k: v for k, v in plan.items() if k not in ("trace", "history_id")}
    return dcc.send_string(dumps(doc, indent=2), download_name(doc),
                           type="application/json")


def download_name(plan: dict) -> str:
    model = re.sub(r"[^A-Za-z0-9_.-]+", "_", str(plan.get("model", "plan"))).strip("_.")
    algo = re.sub(r"[^A-Za-z0-9_.-]+", "_", str(plan.get("algo", "plan")))
    return f"{model or 'plan'}-{algo}-{plan.get('devices', '?')}dev.json"


def parse_upload(contents: str, filename: str | None = None) -> dict:
    """The plan dict in a ``dcc.Upload`` ``contents`` string (``data:...;base64,...``), checked
    with :meth:`Plan.from_dict`.  ``ValueError`` with a message saying what is wrong."""
    name = filename or "the file"
    if not contents:
        raise ValueError("no file received")
    _, sep, b64 = str(contents).partition(",")
    if not sep:
        raise ValueError(f"{name}: could not read the upload (no data)")
    try:
        text = base64.b64decode(b64, validate=False).decode("utf-8-sig")
    except (binascii.Error, UnicodeDecodeError):
        raise ValueError(f"{name} is not a JSON text file (binary or not UTF-8)") from None
    return parse_plan_text(text, name)


def parse_plan_text(text: str, name: str = "the file") -> dict:
    """A plan dict from JSON text, validated (see :func:`parse_upload`)."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{name} is not valid JSON: {exc.msg} at line {exc.lineno} "
                         f"column {exc.colno}") from None
    if not isinstance(doc, dict):
        raise ValueError(f"{name} holds a JSON {type(doc).__name__}, not a plan object "
                         f"(expected {{\"schema\": \"{SCHEMA}\", ...}})")
    if "error" in doc and "layers" not in doc:
        raise ValueError(f"{name} records a failed search, not a plan: {doc['error']}")
    try:
        Plan.from_dict(doc)
    except ValueError as exc:
        raise ValueError(f"{name}: {exc}") from None
    except Exception as exc:  # noqa: BLE001 - any other shape problem is a malformed plan
        raise ValueError(f"{name}: malformed plan: {type(exc).__name__}: {exc}") from None
    try:
        request_of(doc)
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"{name}: cannot tell which search this plan answers: {exc}") from None
    return doc


def check_model(plan: dict, request: dict) -> str | None:
    """Compare the plan's layers with the model it names.  Raises ``ValueError`` if they differ;
    returns a warning when the model cannot be imported here (other panels will say more)."""
    try:
        graph = session.graph_for(session.Request.from_dict(request))
    except Exception as exc:  # noqa: BLE001 - a model we cannot import is a warning only
        return f"model {request.get('model')!r} cannot be imported here ({exc})"
    names = {la["name"] for la in plan["layers"]}
    layers = set(graph.names())
    unknown, missing = sorted(names - layers), sorted(layers - names)
    if unknown or missing:
        parts = []
        if unknown:
            parts.append(f"{len(unknown)} layer(s) not in the model, e.g. {unknown[0]!r}")
        if missing:
            parts.append(f"{len(missing)} model layer(s) without a configuration, "
                         f"e.g. {missing[0]!r}")
        raise ValueError(f"plan does not match model {request.get('model')!r} "
                         f"(batch {request.get('batch')}): " + "; ".join(parts))
    return None


def ingest_upload(contents: str, filename: str | None, store: PlanStore) -> tuple:
    """Validate an uploaded plan, save it (unless an identical one is saved) and return
    ``(plan, request, pins, message)`` for the stores.  ``ValueError`` if it is not valid."""
    doc = parse_upload(contents, filename)
    doc.pop("history_id", None)
    request = request_of(doc)
    warning = check_model(doc, request)
    doc["request"] = request
    pid, created = store.save_new(doc, f"uploaded {filename}" if filename else "uploaded")
    how = f"saved as plan #{pid} and loaded" if created else \
        f"same plan as saved plan #{pid}; loaded it"
    plan, request, pins = load_plan(store, pid)
    msg = f"{filename or 'upload'}: {how}: {_describe(plan)}"
    if warning:
        msg += f" (warning: {warning})"
    return plan, request, pins, msg


def _describe(plan: dict) -> str:
    obj = plan.get("objective_s")
    text = (f"{plan.get('model')} {plan.get('algo')} on {plan.get('devices')} × "
            f"{plan.get('preset')}")
    if obj is not None:
        text += f", objective {float(obj) * 1e3:.3f} ms"
    return text


# ---- layout and callbacks -----------------------------------------------------------------------

def layout():
    return html.Div(className="panel plans", children=[
        html.Div(className="plans-bar", children=[
            html.Button("Refresh", id=ids.PLANS_REFRESH, n_clicks=0, className="button"),
            html.Button("Load selected", id=ids.PLAN_LOAD, n_clicks=0, className="button"),
            html.Button("Download current plan", id=ids.PLAN_DOWNLOAD_BUTTON, n_clicks=0,
                        className="button"),
            dcc.Download(id=ids.PLAN_DOWNLOAD),
            dcc.Upload(id=ids.PLAN_UPLOAD, className="upload plans-upload", multiple=False,
                       accept=".json,application/json",
                       children=html.Div(["Drop a plan JSON here or ",
                                          html.A("choose a file")])),
        ]),
        html.Div(id=ids.PLANS_STATUS, className="status plans-status"),
        dash_table.DataTable(
            id=ids.PLANS_TABLE, columns=COLUMNS, data=[], row_selectable="single",
            selected_rows=[], sort_action="native", filter_action="native", page_size=15,
            style_table={"overflowX": "auto"},
            style_cell={"fontFamily": "inherit", "fontSize": "13px", "padding": "4px 8px",
                        "textAlign": "left", "maxWidth": "320px", "overflow": "hidden",
                        "textOverflow": "ellipsis"},
            style_header={"fontWeight": "600"},
            tooltip_duration=None),
    ])


@dash.callback(Input(ids.STORE_PLAN, "data"))
def _autosave(plan):
    # no outputs: runs even while the Plans tab (and so its table) is not on the page
    try:
        autosave(plan, PlanStore())
    except Exception:  # noqa: BLE001 - the history is best effort; the table reports errors
        pass


@dash.callback(
    Output(ids.PLANS_TABLE, "data"),
    Output(ids.PLANS_STATUS, "children"),
    Input(ids.PLANS_REFRESH, "n_clicks"),
    Input(ids.STORE_PLAN, "data"),
)
def _on_plan_or_refresh(_clicks, plan):
    # while the tab is shown: save (a no-op if _autosave already did) and list
    try:
        store = PlanStore()
        _, msg = autosave(plan, store)
        rows = table_rows(store)
    except Exception as exc:  # noqa: BLE001 - a broken history file must not break the app
        return dash.no_update, f"plan history unavailable: {exc}"
    if dash.ctx.triggered_id == ids.PLANS_REFRESH:
        msg = msg or f"{len(rows)} saved plan(s) in {store.path}"
    return rows, msg if msg else dash.no_update


@dash.callback(
    Output(ids.STORE_PLAN, "data", allow_duplicate=True),
    Output(ids.STORE_REQUEST, "data", allow_duplicate=True),
    Output(ids.STORE_PINS, "data", allow_duplicate=True),
    Output(ids.PLANS_STATUS, "children", allow_duplicate=True),
    Input(ids.PLAN_LOAD, "n_clicks"),
    State(ids.PLANS_TABLE, "selected_row_ids"),
    prevent_initial_call=True,
)
def _on_load(_clicks, selected):
    if not selected:
        return dash.no_update, dash.no_update, dash.no_update, "select a plan in the table first"
    try:
        plan, request, pins = load_plan(PlanStore(), selected[0])
    except (KeyError, ValueError) as exc:
        msg = exc.args[0] if isinstance(exc, KeyError) and exc.args else str(exc)
        return dash.no_update, dash.no_update, dash.no_update, f"cannot load: {msg}"
    return plan, request, pins, f"loaded plan #{plan['history_id']}: {_describe(plan)}"


@dash.callback(
    Output(ids.PLAN_DOWNLOAD, "data"),
    Output(ids.PLANS_STATUS, "children", allow_duplicate=True),
    Input(ids.PLAN_DOWNLOAD_BUTTON, "n_clicks"),
    State(ids.STORE_PLAN, "data"),
    prevent_initial_call=True,
)
def _on_download(_clicks, plan):
    try:
        data = download_payload(plan)
    except ValueError as exc:
        return dash.no_update, str(exc)
    return data, f"downloading {data['filename']}"


@dash.callback(
    Output(ids.STORE_PLAN, "data", allow_duplicate=True),
    Output(ids.STORE_REQUEST, "data", allow_duplicate=True),
    Output(ids.STORE_PINS, "data", allow_duplicate=True),
    Output(ids.PLANS_STATUS, "children", allow_duplicate=True),
    Output(ids.PLAN_UPLOAD, "contents"),
    Input(ids.PLAN_UPLOAD, "contents"),
    State(ids.PLAN_UPLOAD, "filename"),
    prevent_initial_call=True,
)
def _on_upload(contents, filename):
    if not contents:
        raise dash.exceptions.PreventUpdate
    # contents is cleared so that choosing the same file again uploads it again
    try:
        plan, request, pins, msg = ingest_upload(contents, filename, PlanStore())
    except ValueError as exc:
        return dash.no_update, dash.no_update, dash.no_update, f"not loaded: {exc}", None
    return plan, request, pins, msg, None


__all__ = ["layout", "autosave", "load_plan", "download_payload", "download_name",
           "parse_upload", "parse_plan_text", "ingest_upload", "request_of", "table_rows",
           "check_model"]

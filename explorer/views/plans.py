"""Plans panel: the history of plans (SQLite, see :mod:`explorer.engine.core.history`), loading a
saved plan back into the app, downloading the current plan and uploading a plan file of any
kind (layer-wise, Tofu, placement): a loaded plan becomes the app's state - the page of its
family opens on its request (the form shows its model, devices and method) and shows it.

Every plan that reaches a page's result store (layer-wise, Tofu, placement) without an
``"error"`` is saved automatically, unless it came from the history (it then carries
``history_id``) or an identical plan is already saved (same model, devices, pins and
per-layer choices): one auto-save callback per family page, on its result store.  The table
lists the history when the Plans page opens and on Refresh.  Upload validation lives in
the plan-document module (:mod:`explorer.views.plan_files`); the logic here lives in plain
functions (:func:`autosave`, :func:`load_plan`, :func:`ingest`, :func:`opened`); the
callbacks, one per action, only wire them to components.
"""

from __future__ import annotations


import dash
from dash import Input, Output, State, dcc, html

from explorer import service as session
from explorer.engine.core import plandoc
from explorer.engine.core.history import PlanStore
from explorer.errors import ExplorerError
from explorer.views import ids, state
from explorer.views import tables as T
from explorer.views.controls import context
from explorer.views.plan_files import (  # noqa: F401 - re-exported: the panel's plain functions
    REQUIRED,
    download_name,
    download_payload,
    parse_plan_text,
    parse_upload,
)

COLUMNS = [("id", "#"), ("time", "saved"), ("kind", "kind"), ("model", "model"),
           ("algo", "algorithm"), ("preset", "devices preset"), ("devices", "devices"),
           ("batch", "batch"), ("step_ms", "step objective (ms)"),
           ("link_ms", "Tofu link time (ms)"), ("pins", "pins"), ("note", "note")]
#: header tooltips: the two objectives are different quantities, so they get a column each
TIPS = {"step_ms": "layer-wise: equation 1's t_O; placement: the simulated step time",
        "link_ms": "Tofu's objective: the time its communication takes on the links, not a "
                   "step time"}
#: what each plan kind's objective is
KIND_NAMES = {"layerwise": "layer-wise", "tofu": "Tofu", "placement": "placement"}


# ---- logic (plain functions, called by tests) -------------------------------------------------

def table_rows(store: PlanStore, limit: int = 200) -> list:
    """Rows for the table (``id`` doubles as the grid's row id); ``kind`` says which family
    made the plan (layer-wise, Tofu, placement)."""
    rows = []
    for r in store.list(limit):
        r = dict(r)
        try:
            fam = state.family(r["algo"])
        except Exception:  # noqa: BLE001 - an algorithm this build does not know
            fam = None
        r["kind"] = KIND_NAMES.get(fam, fam or "?")
        r["time"] = r["time"].replace("T", " ")[:19]
        ms = None if r["objective_ms"] is None else round(r["objective_ms"], 4)
        r["step_ms"], r["link_ms"] = (None, ms) if fam == "tofu" else (ms, None)
        r["pins"] = "; ".join(r["pins"])
        rows.append(r)
    return rows


def request_of(plan: dict) -> dict:
    """The request dict (with pins) a saved plan answers (any kind): its own
    ``request`` when the app made it, else rebuilt from the plan's fields (plans written by
    ``explorer search``)."""
    return state.request_from_document(plan, _kind(plan))


def _kind(plan: dict) -> str:
    """A saved plan's kind: ``tofu``, ``placement`` or ``layerwise`` (old in-app plans carry
    no schema)."""
    kind = plandoc.kind_of(plan)
    return kind if kind in ("tofu", "placement") else "layerwise"


def autosave(plan, store: PlanStore, note: str = "search"):
    """Save a plan of any kind (layer-wise, Tofu, placement) that just landed in its store.
    Returns ``(id, message)``; ``(None, None)`` when there is nothing to save (no plan, an
    error, or a plan loaded from the history, which carries ``history_id``).  A plan identical
    to a saved one is not saved twice."""
    if not isinstance(plan, dict) or "error" in plan:
        return None, None
    if "layers" not in plan and plandoc.kind_of(plan) not in ("tofu", "placement"):
        return None, None
    if plan.get("history_id") is not None:
        return None, None
    pid, created = store.save_new(plan, note)
    if not created:
        return pid, f"already saved as plan #{pid}"
    return pid, f"saved as plan #{pid}: {_describe(plan)}"


def load_plan(store: PlanStore, plan_id) -> tuple:
    """``(plan, request, pins)`` for the stores from saved plan ``plan_id``; the plan carries
    ``history_id`` (so it is not saved again) and ``request``.  A Tofu plan comes back as the
    Tofu tab shows it (:func:`tofu_doc`), a placement as the Placement tab does."""
    plan = store.get(plan_id)
    request = request_of(plan)
    if _kind(plan) == "tofu":
        plan = tofu_doc(plan, request)
    plan["history_id"] = int(plan_id)
    if _kind(plan) != "layerwise":
        return plan, request, []
    plan["request"] = request
    return plan, request, list(plan.get("pins") or [])


def check_model(plan: dict, request: dict) -> str | None:
    """Compare the plan's layers with the model it names.  Raises ``ValueError`` if they differ;
    returns a warning when the model cannot be imported here (other panels will say more)."""
    try:
        state.check_model(request.get("model"))
    except ExplorerError as exc:
        raise ValueError(str(exc)) from None
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
    """Validate an uploaded plan of any kind and return ``(doc, request, pins, message)``
    (see :func:`ingest`).  ``ValueError`` if it is not valid."""
    got = ingest(contents, filename, store)
    return got["doc"], got["request"], state.pins_of(got["request"]), got["message"]


def ingest(contents: str, filename: str | None, store: PlanStore) -> dict:
    """Validate an uploaded plan and make it the page's state: ``{"kind", "doc", "request",
    "message"}``.  A layer-wise plan is saved in the history (unless an identical one is)
    and loaded from there; a Tofu plan or a placement is shown as it is, on the request it
    names.  ``ValueError`` if the file is not a valid plan or names a model file the server
    does not load."""
    doc = parse_upload(contents, filename)
    kind = plandoc.kind_of(doc) or "layerwise"
    doc.pop("history_id", None)
    request = state.request_from_document(doc, kind)
    try:
        state.check_model(request["model"])
    except ExplorerError as exc:
        raise ValueError(f"{filename or 'the file'}: {exc}") from None
    label = filename or "upload"
    if kind in ("tofu", "placement"):
        from explorer.views.search_form import layerwise_plan
        shown = tofu_doc(doc, request) if kind == "tofu" else placement_doc(doc, request)
        what = "Tofu plan" if kind == "tofu" else "placement"
        return {"kind": kind, "doc": shown, "request": request,
                "plan": layerwise_plan(request),      # the graph shows the same model
                "message": f"{label}: {what} loaded: {_describe_kind(shown, request)}"}
    warning = check_model(doc, request)
    doc["request"] = request
    pid, created = store.save_new(doc, f"uploaded {filename}" if filename else "uploaded")
    how = f"saved as plan #{pid} and loaded" if created else \
        f"same plan as saved plan #{pid}; loaded it"
    plan, request, _ = load_plan(store, pid)
    msg = f"{label}: {how}: {_describe(plan)}"
    if warning:
        msg += f" (warning: {warning})"
    return {"kind": kind, "doc": plan, "request": request, "message": msg}


def tofu_doc(doc: dict, request: dict) -> dict:
    """A Tofu plan document as the Tofu tab shows it: without the per-tensor and per-operator
    lists (the strip is drawn from the request), with the request it answers."""
    out = {k: v for k, v in doc.items() if k not in ("tensors", "ops", "checksum")}
    out["request"] = {k: v for k, v in request.items() if k != "pins"}
    out["devices"] = request["devices"]
    return out


def placement_doc(doc: dict, request: dict) -> dict:
    """A placement document as the Placement tab shows it: every cluster with its operators
    per device (``shares``) and majority ``device``, the request it answers.  A baseline's
    document has no clusters; the graph is then drawn over Celeritas' clusters."""
    out = {k: v for k, v in doc.items() if k not in ("trace", "checksum")}
    out["request"] = {k: v for k, v in request.items() if k != "pins"}
    out.setdefault("memory_gib", None)
    rows = [p for p in out.get("pins") or [] if isinstance(p, dict)]   # older app documents
    if rows and not out.get("pin_rows"):
        out["pin_rows"] = rows
    out["pins"] = [p if isinstance(p, str) else f"{p['target']}=@{int(p['device'])}"
                   for p in out.get("pins") or []]
    out.setdefault("schedule", {})
    out["clusters_from"] = out.get("clusters_from") or out["algo"]
    if not out.get("clusters"):
        try:
            req = state.request(out["request"])
            out["clusters"] = session.placement(req, "celeritas",
                                                out["memory_gib"])["clusters"]
            out["clusters_from"] = "celeritas"
        except (ExplorerError, ValueError):
            out["clusters"] = []
    where = out["placement"]
    n = len(out.get("capacity_bytes") or []) or (max(where.values(), default=0) + 1)
    clusters = []
    for c in out["clusters"]:
        shares = [0] * n
        for op in c.get("ops", []):
            if op in where and 0 <= where[op] < n:
                shares[where[op]] += 1
        clusters.append(dict(c, shares=shares,
                             device=max(range(n), key=lambda d: (shares[d], -d))))
    out["clusters"] = clusters
    return out


def _describe_kind(doc: dict, request: dict) -> str:
    return f"{doc.get('model')} {doc.get('algo')} on {request['devices']} × {request['preset']}"


def loaded_outputs(kind: str, doc: dict, request: dict, plan: dict | None = None) -> dict:
    """What loading a plan of ``kind`` changes on the page: the result store of its kind (and
    the layer-wise ``plan`` the graph shows for a Tofu plan or a placement), the request
    store, the form, and the tab that shows it."""
    from explorer.views import search_form as model
    out = {"plan": dash.no_update, "tofu": dash.no_update, "placement": dash.no_update,
           "place_pins": dash.no_update, "tab": dash.no_update, "request": request,
           "form": model.form_update(request)}
    if kind == "tofu":
        out.update(tofu=doc, tab="tofu")
    elif kind == "placement":
        out.update(placement=doc, place_pins=session.placement_pin_rows(doc), tab="placement")
    else:
        out.update(plan=doc, tab="plan")
    if kind != "layerwise" and plan is not None:
        out["plan"] = plan
    return out


def _describe(plan: dict) -> str:
    obj = plan.get("objective_s")
    if obj is None:
        obj = plan.get("predicted_step_time_s")
    text = (f"{plan.get('model')} {plan.get('algo')} on {plan.get('devices')} × "
            f"{plan.get('preset')}")
    if obj is not None:
        text += f", objective {float(obj) * 1e3:.3f} ms"
    return text


# ---- layout and callbacks -----------------------------------------------------------------------

def layout():
    return html.Div(className="panel plans", children=[
        context("plans"),
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
        T.grid(ids.PLANS_TABLE, COLUMNS, height=440, selectable=True, row_id="id",
               tooltips=TIPS, widths={"time": 160},  # a date whole, never "2026-11-…"
               wrap=("pins",)),  # the row id keeps a selection across refreshes
        html.Div(className="row", children=T.csv_button(ids.PLANS_CSV_BUTTON, ids.PLANS_CSV,
                                                         "Download history as CSV")),
    ])


def opened(kind: str, doc: dict, request: dict) -> tuple:
    """``(loaded, href)``: what the shell hands to the page of a loaded plan's family
    (``ids.STORE_LOADED``) and that page's address on the plan's request (``ids.NAVIGATE``),
    where the form shows the request and the page shows the plan."""
    page = kind if kind in ("tofu", "placement") else "layerwise"
    return ({"kind": page, "doc": doc, "request": request}, state.page_url(page, request))


def _opened_values(kind=None, doc=None, request=None) -> list:
    """Values for the load callbacks' ``STORE_LOADED`` and ``NAVIGATE`` outputs (both
    ``no_update`` without a plan)."""
    if kind is None:
        return [dash.no_update, dash.no_update]
    return list(opened(kind, doc, request))


def load_saved(store: PlanStore, plan_id) -> tuple:
    """``(plan, request, message)`` for a plan of the history (``ValueError`` / ``KeyError``
    when it cannot be loaded, e.g. a model file the server does not load)."""
    plan, request, _ = load_plan(store, plan_id)
    try:
        state.check_model(request["model"])
    except ExplorerError as exc:
        raise ValueError(str(exc)) from None
    return plan, request, f"loaded plan #{plan['history_id']}: {_describe(plan)}"


def register(app: dash.Dash) -> None:
    """The panel's callbacks on ``app``."""

    T.register_csv(app, ids.PLANS_CSV_BUTTON, ids.PLANS_CSV, ids.PLANS_TABLE, COLUMNS,
                   "plan-history")

    def _register_autosave(family, store_id, note):
        @app.callback(Output(ids.SAVED + family, "data"), Input(store_id, "data"))
        def _autosave(doc):
            # the result a family page shows - the one it opened with, or a new one - goes
            # into the history (once: an identical plan is not saved again)
            try:
                return autosave(doc, PlanStore(), note)[0]
            except Exception:  # noqa: BLE001 - the history is best effort; the table reports
                return None

    for family, store_id, note in (("layerwise", ids.STORE_PLAN, "search"),
                                   ("tofu", ids.STORE_TOFU, "tofu"),
                                   ("placement", ids.STORE_PLACEMENT, "placement")):
        _register_autosave(family, store_id, note)

    @app.callback(
        Output(ids.PLANS_TABLE, "rowData"),
        Output(ids.PLANS_STATUS, "children"),
        Input(ids.PLANS_REFRESH, "n_clicks"),
    )
    def _on_open_or_refresh(_clicks):
        # the page lists the history when it opens, and again on Refresh
        try:
            store = PlanStore()
            rows = table_rows(store)
        except Exception as exc:  # noqa: BLE001 - a broken history file must not break the app
            return dash.no_update, f"plan history unavailable: {exc}"
        if dash.ctx.triggered_id == ids.PLANS_REFRESH:
            return rows, f"{len(rows)} saved plan(s) in {store.path}"
        return rows, dash.no_update

    @app.callback(
        Output(ids.STORE_LOADED, "data", allow_duplicate=True),
        Output(ids.NAVIGATE, "data", allow_duplicate=True),
        Output(ids.PLANS_STATUS, "children", allow_duplicate=True),
        Input(ids.PLAN_LOAD, "n_clicks"),
        State(ids.PLANS_TABLE, "selectedRows"),
        prevent_initial_call=True,
    )
    def _on_load(_clicks, selected):
        if not _clicks:              # the page mounting (its outputs are the shell's)
            raise dash.exceptions.PreventUpdate
        if not selected:
            return *_opened_values(), "select a plan in the table first"
        try:
            plan, request, msg = load_saved(PlanStore(), selected[0]["id"])
        except (KeyError, ValueError) as exc:
            msg = exc.args[0] if isinstance(exc, KeyError) and exc.args else str(exc)
            return *_opened_values(), f"cannot load: {msg}"
        return *_opened_values(_kind(plan), plan, request), msg

    @app.callback(
        Output(ids.PLAN_DOWNLOAD, "data"),
        Output(ids.PLANS_STATUS, "children", allow_duplicate=True),
        Input(ids.PLAN_DOWNLOAD_BUTTON, "n_clicks"),
        State(ids.STORE_REQUEST, "data"),
        prevent_initial_call=True,
    )
    def _on_download(_clicks, req_doc):
        from explorer.views.search_form import layerwise_plan
        try:
            data = download_payload(layerwise_plan(req_doc) if req_doc else None)
        except ValueError as exc:
            return dash.no_update, str(exc)
        return data, f"downloading {data['filename']}"

    @app.callback(
        Output(ids.STORE_LOADED, "data", allow_duplicate=True),
        Output(ids.NAVIGATE, "data", allow_duplicate=True),
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
            got = ingest(contents, filename, PlanStore())
        except ValueError as exc:
            return *_opened_values(), f"not loaded: {exc}", None
        return (*_opened_values(got["kind"], got["doc"], got["request"]), got["message"],
                None)


__all__ = ["layout", "autosave", "load_plan", "download_payload", "download_name",
           "parse_upload", "parse_plan_text", "ingest_upload", "ingest", "request_of",
           "table_rows", "check_model", "tofu_doc", "placement_doc", "loaded_outputs",
           "load_saved", "opened"]

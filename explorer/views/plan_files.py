"""Plan files in the app: the download of the current plan (the sealed document ``explorer run``
executes) and the validation of an uploaded plan file of any kind (layer-wise, Tofu,
placement).  Plain functions, no callbacks: the panels wire them to components."""

from __future__ import annotations

import base64
import binascii
import json
import re

from dash import dcc

from explorer import service as session
from explorer.engine.core import plandoc
from explorer.engine.core.plandoc import dumps
from explorer.engine.layerwise.plan import SCHEMA, Plan
from explorer.errors import PlanFileError
from explorer.views import state

__all__ = ["download_payload", "download_name", "parse_upload", "parse_plan_text", "REQUIRED"]


def download_payload(plan) -> dict:
    """``dcc.Download`` data for a plan of any kind the app shows: the sealed plan document
    ``explorer run`` executes (:func:`explorer.service.plan_file`), named ``<model>-<algo>-<devices>dev.json``."""
    if isinstance(plan, dict) and "error" in plan:
        raise ValueError(f"the current search failed, nothing to download: {plan['error']}")
    if not isinstance(plan, dict) or ("layers" not in plan and not plandoc.kind_of(plan)):
        raise ValueError("there is no plan to download: run a search first")
    if plandoc.kind_of(plan) is None:              # an old in-app layer-wise plan
        plan = dict(plan, schema=SCHEMA)
    doc = session.plan_file(plan)
    return dcc.send_string(dumps(doc, indent=1), download_name(doc),
                           type="application/json")


def download_name(plan: dict) -> str:
    model = re.sub(r"[^A-Za-z0-9_.-]+", "_", str(plan.get("model", "plan"))).strip("_.")
    algo = re.sub(r"[^A-Za-z0-9_.-]+", "_", str(plan.get("algo", "plan")))
    return f"{model or 'plan'}-{algo}-{plan.get('devices', '?')}dev.json"


def parse_upload(contents: str, filename: str | None = None) -> dict:
    """The plan document in a ``dcc.Upload`` ``contents`` string (``data:...;base64,...``),
    validated by :func:`parse_plan_text`.  ``ValueError`` with a message saying what is
    wrong."""
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


#: what a document of each kind must hold to be shown
REQUIRED = {"tofu": ("model", "algo", "factors", "objective_s", "comm_bytes",
                     "peak_memory_bytes", "search_time_s", "coarsening", "steps"),
            "placement": ("model", "algo", "placement", "clusters", "capacity_bytes",
                          "peak_memory_bytes", "predicted_step_time_s", "search_time_s",
                          "comm_bytes", "oom", "stats")}


def parse_plan_text(text: str, name: str = "the file") -> dict:
    """A plan document of any kind from JSON text, validated (see :func:`parse_upload`): its
    schema names a layer-wise, Tofu or placement plan (:func:`plandoc.open_document`), it
    holds the fields the app shows, and it says which request it answers.  Plans are data:
    nothing in them is executed."""
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
    kind = plandoc.kind_of(doc)
    if kind is None and "schema" in doc:
        raise ValueError(f"{name} is not a plan file: schema {doc.get('schema')!r} is none of "
                         f"{', '.join(plandoc.schema_of(k) for k in plandoc.KINDS)}")
    try:
        kind = plandoc.open_document(doc) if kind else "layerwise"
    except PlanFileError as exc:
        raise ValueError(f"{name}: {exc}") from None
    try:
        if kind == "layerwise":
            Plan.from_dict(dict(doc, schema=SCHEMA))
        else:
            missing = [k for k in REQUIRED[kind] if k not in doc]
            if missing:
                raise ValueError(f"missing field(s) {', '.join(map(repr, missing))} of a "
                                 f"{kind} plan")
            if kind == "placement" and not all(isinstance(d, int) and not isinstance(d, bool)
                                               for d in doc["placement"].values()):
                raise ValueError("'placement' must map every operator to a device index")
    except ValueError as exc:
        raise ValueError(f"{name}: {exc}") from None
    except Exception as exc:  # noqa: BLE001 - any other shape problem is a malformed plan
        raise ValueError(f"{name}: malformed plan: {type(exc).__name__}: {exc}") from None
    try:
        state.request_from_document(doc, kind)
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"{name}: cannot tell which search this plan answers: {exc}") from None
    return doc

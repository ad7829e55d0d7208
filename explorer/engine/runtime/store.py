"""Measured runs in SQLite (``$EXPLORER_HOME/runs.sqlite``), keyed by the plan's digest.

A row per run: when, model, algo, devices, the plan digest (same as the plan history's
:func:`explorer.engine.core.history.digest`, so a run can be matched to a saved plan), predicted
and measured step time, the reference verdict, the full result JSON and the plan JSON (the
key, :func:`run_key`).

The key has grown as plans that differ were found to share one (a Tofu plan's preset,
pins, partition and capacities; its cluster's links; a placement's preset and device
count).  Rows stored under an earlier key format stay where they are and are found by
:func:`run_digests`, which lists the current key's digest and the earlier formats' (an
earlier format cannot be migrated: it lacks the fields the current key adds).
"""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path

from explorer.engine.core.plandoc import dumps
from explorer.engine.core.storage import home, transaction

_SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    id            INTEGER PRIMARY KEY AUTOINCREMENT,
    ts            REAL NOT NULL,
    model         TEXT,
    algo          TEXT,
    devices       INTEGER,
    digest        TEXT,
    predicted_s   REAL,
    measured_s    REAL,
    reference_ok  INTEGER,
    result        TEXT NOT NULL,
    plan          TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS runs_digest ON runs (digest);
"""


def placement_key(doc: dict) -> dict:
    """What identifies a placement (a ``plan-explorer/placement`` document from the command
    line or the app) in the run store: model, batch, model arguments, algorithm, device preset
    and count, and every operator's device - timings, schedule and layout do not count."""
    args = doc.get("model_args")
    if args is None:
        args = (doc.get("request") or {}).get("model_args")
    return {"kind": "placement", "model": doc.get("model"), "batch": doc.get("batch"),
            "model_args": {str(k): str(v) for k, v in dict(args or {}).items()},
            "algo": doc.get("algo"), "preset": doc.get("preset"), "devices": doc.get("devices"),
            "placement": {str(k): int(v) for k, v in doc["placement"].items()}}


def tofu_key(doc: dict) -> dict:
    """What identifies a Tofu plan (the app's document or its sealed file) in the run store:
    model, batch, arguments and operator graph; algorithm, pins, device preset and worker
    count (the search is deterministic given these); the partition it found (factors and
    their levels), each worker's memory capacity and the digest of the cluster's link
    parameters (``info["links_digest"]``, :meth:`~explorer.engine.core.devices.DeviceGraph.
    links_digest`: bandwidth and latency of every pair) - which tell two ``custom`` clusters
    of the same size apart.  Timings do not count."""
    info = doc.get("info") or {}
    return dict(_tofu_key_v2(doc), links_digest=info.get("links_digest"))


def _tofu_key_v1(doc: dict) -> dict:
    """The first Tofu key: model, batch, arguments, algorithm, worker count, operator graph."""
    return {"kind": "tofu", "model": doc.get("model"), "batch": doc.get("batch"),
            "model_args": {str(k): str(v) for k, v in (doc.get("model_args") or {}).items()},
            "algo": doc.get("algo"), "devices": doc.get("devices"),
            "opgraph_digest": doc.get("opgraph_digest")}


def _tofu_key_v2(doc: dict) -> dict:
    """The second Tofu key: the first's plus pins, preset, partition and capacities."""
    info = doc.get("info") or {}
    return {"kind": "tofu", "model": doc.get("model"), "batch": doc.get("batch"),
            "model_args": {str(k): str(v) for k, v in (doc.get("model_args") or {}).items()},
            "opgraph_digest": doc.get("opgraph_digest"),
            "algo": doc.get("algo"), "pins": sorted(str(p) for p in doc.get("pins") or ()),
            "preset": doc.get("preset"), "devices": doc.get("devices"),
            "factors": [int(f) for f in doc.get("factors") or ()],
            "levels": [int(v) for v in doc.get("levels") or ()],
            "capacity_bytes": [float(c) for c in info.get("capacity_bytes") or ()]}


def legacy_keys(doc: dict) -> list:
    """The keys earlier versions of :func:`run_key` gave this plan document, newest first:
    a Tofu plan's first and second formats (:func:`_tofu_key_v1`, :func:`_tofu_key_v2`), a
    placement's without its preset and device count.  A layer-wise plan's key never changed."""
    from explorer.engine.core.plandoc import kind_of
    kind = kind_of(doc)
    if kind == "tofu":
        return [_tofu_key_v2(doc), _tofu_key_v1(doc)]
    if kind == "placement":
        key = placement_key(doc)
        return [{k: v for k, v in key.items() if k not in ("preset", "devices")}]
    return []


def run_digests(doc: dict) -> list:
    """Digests a plan document's runs are stored under: its :func:`run_key`'s, then those of
    its :func:`legacy_keys` (runs stored before the key last changed)."""
    from explorer.engine.core.history import digest
    out = [digest(run_key(doc))]
    for key in legacy_keys(doc):
        d = digest(key)
        if d not in out:
            out.append(d)
    return out


def run_key(doc: dict) -> dict:
    """What a run is stored under, by plan kind: a placement's :func:`placement_key`; a Tofu
    plan's :func:`tofu_key`; a layer-wise plan itself without its version and checksum (so a
    run of a saved file and of the same plan in the app share a digest)."""
    from explorer.engine.core.plandoc import kind_of
    kind = kind_of(doc)
    if kind == "placement":
        return placement_key(doc)
    if kind == "tofu":
        return tofu_key(doc)
    if kind == "layerwise":          # a saved file and the app's same plan share a key
        return {k: v for k, v in doc.items() if k not in ("version", "checksum")}
    return doc


class RunStore:
    """Runs saved at ``path`` (default ``$EXPLORER_HOME/runs.sqlite``)."""

    def __init__(self, path=None, timeout: float = 60.0):
        self.path = Path(path) if path else home() / "runs.sqlite"
        self.timeout = timeout
        with self._conn(_SCHEMA):  # creates the file and its table
            pass

    def _conn(self, schema_sql: str = ""):
        return transaction(self.path, schema_sql, self.timeout)

    def add(self, plan: dict, result: dict) -> int:
        from explorer.engine.core.history import digest
        with self._conn() as c:
            cur = c.execute(
                "INSERT INTO runs (ts, model, algo, devices, digest, predicted_s, measured_s, "
                "reference_ok, result, plan) VALUES (?,?,?,?,?,?,?,?,?,?)",
                (time.time(), result.get("model"), result.get("algo"), result.get("devices"),
                 digest(plan), result.get("predicted_step_time_s"),
                 result.get("measured_step_time_s"),
                 None if result.get("reference_ok") is None else int(bool(result["reference_ok"])),
                 dumps(result), dumps(plan)))
            return int(cur.lastrowid)

    def add_safely(self, plan: dict, result: dict) -> None:
        """:meth:`add`, recording ``run_id`` in ``result`` - or a warning there if the store
        cannot be written (storing is a convenience; a run never fails for it)."""
        try:
            result["run_id"] = self.add(plan, result)
        except (sqlite3.Error, OSError, TypeError, ValueError) as exc:
            result.setdefault("warnings", []).append(f"could not store the run: {exc}")

    def list(self, digest: str | None = None, limit: int = 100, legacy=(),
             preset: str | None = None) -> list:
        """Runs stored under ``digest`` (all when ``None``), newest first; ``legacy``: digests
        of the plan's earlier key formats (:func:`run_digests`), whose rows count when their
        result names no preset or ``preset`` (the first formats did not key by preset)."""
        q = ("SELECT id, ts, model, algo, devices, digest, predicted_s, measured_s, reference_ok "
             "FROM runs")
        args: tuple = ()
        legacy = [d for d in legacy if d != digest]
        if digest and legacy:
            marks = ",".join("?" * len(legacy))
            q += (f" WHERE digest = ? OR (digest IN ({marks}) AND (? IS NULL OR "
                  f"json_extract(result, '$.preset') IS NULL OR "
                  f"json_extract(result, '$.preset') = ?))")
            args = (digest, *legacy, preset, preset)
        elif digest:
            q += " WHERE digest = ?"
            args = (digest,)
        q += " ORDER BY id DESC LIMIT ?"
        with self._conn() as c:
            rows = c.execute(q, args + (limit,)).fetchall()
        keys = ("id", "ts", "model", "algo", "devices", "digest", "predicted_s", "measured_s",
                "reference_ok")
        return [dict(zip(keys, r)) for r in rows]

    def rows(self, digest: str, limit: int = 50, legacy=(), preset: str | None = None) -> list:
        """The runs of one plan or placement for a table, newest first: id, time, devices,
        predicted and measured ms, their error and the reference verdict (``legacy``,
        ``preset``: as :meth:`list`'s)."""
        import datetime
        out = []
        for r in self.list(digest=digest, limit=limit, legacy=legacy, preset=preset):
            p, m = r.get("predicted_s"), r.get("measured_s")
            out.append({"id": r["id"], "devices": r["devices"],
                        "time": datetime.datetime.fromtimestamp(r["ts"]).isoformat(
                            " ", "seconds"),
                        "predicted_ms": round(p * 1e3, 3) if p else None,
                        "measured_ms": round(m * 1e3, 3) if m else None,
                        "error": f"{(p - m) / m * 100:+.1f} %" if p and m else "",
                        "reference": {1: "ok", 0: "FAILED"}.get(r["reference_ok"], "–")})
        return out

    def get(self, run_id: int) -> dict | None:
        with self._conn() as c:
            row = c.execute("SELECT result FROM runs WHERE id = ?", (run_id,)).fetchone()
        return None if row is None else json.loads(row[0])

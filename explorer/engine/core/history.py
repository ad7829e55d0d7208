"""Saved plans and their history in SQLite, so nothing is lost when the app restarts.

One table, ``plans``: a row per saved plan with the columns the Plans panel lists and the full
plan JSON.  Every method opens its own short connection (with a busy timeout, see
:mod:`explorer.engine.core.storage`), so several app processes or threads can share the file.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from datetime import datetime
from pathlib import Path

from explorer.engine.core.plandoc import dumps
from explorer.engine.core.storage import home, transaction

_SCHEMA = """
CREATE TABLE IF NOT EXISTS plans (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    ts          REAL    NOT NULL,
    model       TEXT,
    algo        TEXT,
    preset      TEXT,
    devices     INTEGER,
    batch       INTEGER,
    objective_s REAL,
    pins        TEXT    NOT NULL DEFAULT '[]',
    note        TEXT    NOT NULL DEFAULT '',
    digest      TEXT,
    plan        TEXT    NOT NULL
);
CREATE INDEX IF NOT EXISTS plans_ts ON plans (ts);
CREATE INDEX IF NOT EXISTS plans_digest ON plans (digest);
"""

# keys that are not part of a plan's identity (bookkeeping added by the app or timings)
_VOLATILE = ("trace", "trace_ref", "history_id", "search_time_s", "request", "info", "checksum",
             "version", "previous")


def digest(plan: dict) -> str:
    """Content hash of a plan: same model, devices, pins and per-layer choices → same digest
    (timings, trace and app bookkeeping are ignored)."""
    core = {k: v for k, v in plan.items() if k not in _VOLATILE}
    if isinstance(core.get("steps"), list):      # a Tofu plan's steps carry their search time
        core["steps"] = [{k: v for k, v in s.items() if k != "search_time_s"}
                         if isinstance(s, dict) else s for s in core["steps"]]
    return hashlib.sha256(dumps(core, sort_keys=True).encode()).hexdigest()


class PlanStore:
    """Plans saved in SQLite at ``path`` (default ``$EXPLORER_HOME/plans.sqlite``)."""

    def __init__(self, path: str | os.PathLike | None = None, timeout: float = 60.0):
        self.path = Path(path) if path else home() / "plans.sqlite"
        self.timeout = timeout
        with self._connect(_SCHEMA):  # creates the file and its table
            pass

    def _connect(self, schema_sql: str = "", immediate: bool = False):
        return transaction(self.path, schema_sql, self.timeout, immediate)

    def save(self, plan: dict, note: str = "") -> int:
        """Store ``plan`` (any ``history_id`` key is dropped); returns its new id."""
        row = self._row(plan, note)
        with self._connect() as con:
            return self._insert(con, row)

    def save_new(self, plan: dict, note: str = "") -> tuple[int, bool]:
        """Save ``plan`` unless an identical one is saved (atomic, so two callbacks seeing the
        same plan at once save it once).  Returns ``(id, created)``."""
        row = self._row(plan, note)
        with self._connect(immediate=True) as con:
            r = con.execute("SELECT id FROM plans WHERE digest = ? ORDER BY ts DESC, "
                            "id DESC LIMIT 1", (row[-2],)).fetchone()
            return (int(r["id"]), False) if r else (self._insert(con, row), True)

    @staticmethod
    def _row(plan: dict, note: str) -> tuple:
        if not isinstance(plan, dict) or "error" in plan:
            raise ValueError("only a plan dict (without an 'error') can be saved")
        doc = {k: v for k, v in plan.items() if k != "history_id"}
        objective = doc.get("objective_s")
        return (time.time(), doc.get("model"), doc.get("algo"), doc.get("preset"),
                _int(doc.get("devices")), _int(doc.get("batch")),
                float(objective) if objective is not None else None,
                dumps(list(doc.get("pins") or [])), note or "", digest(doc), dumps(doc))

    @staticmethod
    def _insert(con, row) -> int:
        cur = con.execute("INSERT INTO plans (ts, model, algo, preset, devices, batch, "
                          "objective_s, pins, note, digest, plan) "
                          "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", row)
        return int(cur.lastrowid)

    def list(self, limit: int = 200) -> list[dict]:
        """Saved plans, newest first: id, time (ISO, local), model, algo, preset, devices,
        batch, objective_ms, pins (list), note."""
        with self._connect() as con:
            rows = con.execute("SELECT id, ts, model, algo, preset, devices, batch, objective_s, "
                               "pins, note FROM plans ORDER BY ts DESC, id DESC LIMIT ?",
                               (int(limit),)).fetchall()
        return [{"id": r["id"],
                 "time": datetime.fromtimestamp(r["ts"]).astimezone()
                 .isoformat(timespec="seconds"),
                 "model": r["model"], "algo": r["algo"], "preset": r["preset"],
                 "devices": r["devices"], "batch": r["batch"],
                 "objective_ms": None if r["objective_s"] is None else r["objective_s"] * 1e3,
                 "pins": json.loads(r["pins"] or "[]"), "note": r["note"]} for r in rows]

    def get(self, plan_id: int) -> dict:
        """The saved plan dict; ``KeyError`` if there is no plan ``plan_id``."""
        with self._connect() as con:
            r = con.execute("SELECT plan FROM plans WHERE id = ?", (_id(plan_id),)).fetchone()
        if r is None:
            raise KeyError(f"no saved plan with id {plan_id} in {self.path}")
        return json.loads(r["plan"])

    def find(self, plan: dict) -> int | None:
        """Id of the newest saved plan identical to ``plan`` (see :func:`digest`), or None."""
        with self._connect() as con:
            r = con.execute("SELECT id FROM plans WHERE digest = ? ORDER BY ts DESC, id DESC "
                            "LIMIT 1", (digest(plan),)).fetchone()
        return None if r is None else int(r["id"])

    def delete(self, plan_id: int) -> None:
        """Remove plan ``plan_id``; ``KeyError`` if there is none."""
        with self._connect() as con:
            cur = con.execute("DELETE FROM plans WHERE id = ?", (_id(plan_id),))
        if cur.rowcount == 0:
            raise KeyError(f"no saved plan with id {plan_id} in {self.path}")

    def __len__(self) -> int:
        with self._connect() as con:
            return int(con.execute("SELECT COUNT(*) FROM plans").fetchone()[0])


def _int(v):
    try:
        return None if v is None else int(v)
    except (TypeError, ValueError):
        return None


def _id(v) -> int:
    try:
        return int(v)
    except (TypeError, ValueError):
        raise KeyError(f"plan id must be an integer, got {v!r}") from None


__all__ = ["PlanStore", "digest", "home"]

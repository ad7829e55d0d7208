"""Measured runs in SQLite (``$EXPLORER_HOME/runs.sqlite``), keyed by the plan's digest.

A row per run: when, model, algo, devices, the plan digest (same as the plan history's
:func:`explorer.engine.history.digest`, so a run can be matched to a saved plan), predicted
and measured step time, the reference verdict, the full result JSON and the plan JSON.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from contextlib import closing
from pathlib import Path

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


def _home() -> Path:
    p = Path(os.environ.get("EXPLORER_HOME") or Path.home() / ".plan-explorer")
    p.mkdir(parents=True, exist_ok=True)
    return p


def _default(o):
    try:
        import numpy as np
        if isinstance(o, np.generic):
            return o.item()
        if isinstance(o, np.ndarray):
            return o.tolist()
    except ImportError:  # pragma: no cover
        pass
    if isinstance(o, (tuple, set)):
        return list(o)
    raise TypeError(f"{type(o).__name__} is not JSON serialisable")


class RunStore:
    """Runs saved at ``path`` (default ``$EXPLORER_HOME/runs.sqlite``)."""

    def __init__(self, path=None, timeout: float = 10.0):
        self.path = Path(path) if path else _home() / "runs.sqlite"
        self.timeout = timeout
        with closing(self._conn()) as c, c:
            c.executescript(_SCHEMA)

    def _conn(self):
        return sqlite3.connect(str(self.path), timeout=self.timeout)

    def add(self, plan: dict, result: dict) -> int:
        from ..history import digest
        with closing(self._conn()) as c, c:
            cur = c.execute(
                "INSERT INTO runs (ts, model, algo, devices, digest, predicted_s, measured_s, "
                "reference_ok, result, plan) VALUES (?,?,?,?,?,?,?,?,?,?)",
                (time.time(), result.get("model"), result.get("algo"), result.get("devices"),
                 digest(plan), result.get("predicted_step_time_s"),
                 result.get("measured_step_time_s"),
                 None if result.get("reference_ok") is None else int(bool(result["reference_ok"])),
                 json.dumps(result, default=_default), json.dumps(plan, default=_default)))
            return int(cur.lastrowid)

    def list(self, digest: str | None = None, limit: int = 100) -> list:
        q = ("SELECT id, ts, model, algo, devices, digest, predicted_s, measured_s, reference_ok "
             "FROM runs")
        args: tuple = ()
        if digest:
            q += " WHERE digest = ?"
            args = (digest,)
        q += " ORDER BY id DESC LIMIT ?"
        with closing(self._conn()) as c:
            rows = c.execute(q, args + (limit,)).fetchall()
        keys = ("id", "ts", "model", "algo", "devices", "digest", "predicted_s", "measured_s",
                "reference_ok")
        return [dict(zip(keys, r)) for r in rows]

    def get(self, run_id: int) -> dict | None:
        with closing(self._conn()) as c:
            row = c.execute("SELECT result FROM runs WHERE id = ?", (run_id,)).fetchone()
        return None if row is None else json.loads(row[0])

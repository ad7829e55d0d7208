"""The home directory and the one SQLite helper every store uses (explorer.engine.core.storage)."""

from __future__ import annotations

import sqlite3

import pytest

from explorer.engine.core import storage
from explorer.engine.core.history import PlanStore
from explorer.engine.core.profile import Profiler, default_cache_path
from explorer.engine.runtime.store import RunStore

SCHEMA = "CREATE TABLE IF NOT EXISTS t (x INTEGER PRIMARY KEY)"


def test_home_follows_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("EXPLORER_HOME", str(tmp_path / "a"))
    assert storage.home(create=False) == tmp_path / "a" and not (tmp_path / "a").exists()
    assert storage.home() == tmp_path / "a" and (tmp_path / "a").is_dir()
    monkeypatch.setenv("EXPLORER_HOME", "")
    assert storage.home(create=False).name == ".plan-explorer"


def test_every_store_lives_in_the_home(tmp_path, monkeypatch):
    monkeypatch.setenv("EXPLORER_HOME", str(tmp_path / "h"))
    assert PlanStore().path == tmp_path / "h" / "plans.sqlite"
    assert RunStore().path == tmp_path / "h" / "runs.sqlite"
    assert default_cache_path() == tmp_path / "h" / "profile.sqlite"
    with Profiler():
        pass
    for name in ("plans", "runs", "profile"):
        con = sqlite3.connect(tmp_path / "h" / f"{name}.sqlite")
        assert con.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        con.close()


def test_connect_creates_directory_schema_and_named_rows(tmp_path):
    path = tmp_path / "deep" / "er" / "db.sqlite"
    con = storage.connect(path, SCHEMA)
    try:
        with con:
            con.execute("INSERT INTO t VALUES (7)")
        row = con.execute("SELECT x FROM t").fetchone()
        assert row["x"] == 7 and row[0] == 7 and tuple(row) == (7,)
    finally:
        con.close()


def test_transaction_commits_or_rolls_back_and_closes(tmp_path):
    path = tmp_path / "db.sqlite"
    with storage.transaction(path, SCHEMA) as con:
        con.execute("INSERT INTO t VALUES (1)")
    with pytest.raises(RuntimeError):
        with storage.transaction(path) as con:
            con.execute("INSERT INTO t VALUES (2)")
            raise RuntimeError("boom")
    with pytest.raises(sqlite3.ProgrammingError):  # closed after the block
        con.execute("SELECT 1")
    with storage.transaction(path, immediate=True) as con:
        assert [r["x"] for r in con.execute("SELECT x FROM t")] == [1]
        con.execute("INSERT INTO t VALUES (3)")
    with storage.transaction(path) as con:
        assert [r[0] for r in con.execute("SELECT x FROM t ORDER BY x")] == [1, 3]


def test_immediate_transaction_holds_the_write_lock(tmp_path):
    """Two read-then-write blocks cannot interleave: the second waits for the first (here it
    gives up at once, with a zero timeout)."""
    path = tmp_path / "db.sqlite"
    with storage.transaction(path, SCHEMA, immediate=True):
        with pytest.raises(sqlite3.OperationalError, match="locked"):
            with storage.transaction(path, timeout=0.0, immediate=True):
                pass


@pytest.mark.parametrize("damage", ["garbage", "truncated"])
def test_a_damaged_store_is_moved_aside_with_one_line_and_a_fresh_one_opens(tmp_path, capsys,
                                                                          damage):
    """Nothing a user did loses work: a store that is not a database (garbage written over it,
    or cut short) is renamed ``NAME.damaged-<time>``, the user told in one line, and a fresh
    store opens with its schema."""
    from explorer.engine.core.storage import connect
    path = tmp_path / "runs.sqlite"
    if damage == "garbage":
        path.write_bytes(b"this is not a database, it is a shopping list\n" * 20)
    else:
        con = connect(path, "CREATE TABLE t (x INTEGER)")
        with con:
            con.executemany("INSERT INTO t VALUES (?)", [(i,) for i in range(5000)])
        con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        con.close()
        path.write_bytes(b"SQLite format 3\x00" + b"\xff" * 84 + path.read_bytes()[100:300])
    con = connect(path, "CREATE TABLE IF NOT EXISTS t (x INTEGER)")
    with con:
        con.execute("INSERT INTO t VALUES (7)")
    assert [r[0] for r in con.execute("SELECT x FROM t")] == [7]
    con.close()
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "runs.sqlite" in err[0] and "damaged-" in err[0], err
    aside = list(tmp_path.glob("runs.sqlite.damaged-*"))
    assert len(aside) == 1 and aside[0].stat().st_size > 0


@pytest.mark.slow
@pytest.mark.multiprocess
def test_a_run_with_a_damaged_run_store_prints_its_result(tmp_path):
    """``explorer run`` with ``runs.sqlite`` not a database: the run's result is printed and
    saved (exit 0), one warning line, no traceback."""
    import os
    import subprocess
    import sys
    home = tmp_path / "home"
    home.mkdir()
    for name in ("runs", "plans", "profile", "captures"):
        (home / f"{name}.sqlite").write_text("not a database\n")
    env = dict(os.environ, EXPLORER_HOME=str(home), EXPLORER_DEVICE="cpu")
    plan = tmp_path / "plan.json"
    cmd = [sys.executable, "-m", "explorer"]
    s = subprocess.run(cmd + ["search", "mlp", "--devices", "2", "--batch", "8", "--preset",
                              "local", "--out", str(plan)], env=env, capture_output=True,
                       text=True, timeout=600)
    assert s.returncode == 0, s.stderr
    r = subprocess.run(cmd + ["run", str(plan), "--steps", "2", "--warmup", "1", "--json"],
                       env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in s.stderr + r.stderr
    assert '"reference_ok": true' in r.stdout
    assert list(home.glob("runs.sqlite.damaged-*"))

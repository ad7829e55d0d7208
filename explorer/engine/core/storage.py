"""Where Plan Explorer keeps its files, and the one way it opens SQLite.

Everything lives in the home directory, ``$EXPLORER_HOME`` (default ``~/.plan-explorer``):
``plans.sqlite`` (plan history), ``runs.sqlite`` (measured runs), ``profile.sqlite`` (measured
layer times), ``captures.sqlite`` (traced models) and ``local.json`` (calibration).  Every SQLite store opens its file with
:func:`connect`: a busy timeout, so several app processes and threads can share a file; the
WAL journal, so readers do not block the writer; rows readable by index or column name; its
schema created if missing.  A file that is not a database (damaged, truncated, something else
written over it) loses nothing and stops nothing: it is moved aside to ``NAME.damaged-<time>``,
the user is told in one line on stderr, and a fresh store is created.  :func:`transaction` is a
short connection that commits (or rolls back) and closes.

    >>> with transaction(":memory:", "CREATE TABLE t (x INTEGER)") as con:
    ...     _ = con.execute("INSERT INTO t VALUES (1)")
    ...     con.execute("SELECT x FROM t").fetchone()["x"]
    1
"""

from __future__ import annotations

import os
import sqlite3
import sys
import time
from contextlib import contextmanager
from pathlib import Path

__all__ = ["HOME_ENV", "home", "kernel_cache", "connect", "transaction", "move_aside"]

HOME_ENV = "EXPLORER_HOME"


def home(create: bool = True) -> Path:
    """The home directory: ``$EXPLORER_HOME``, else ``~/.plan-explorer`` (read at each call,
    so a process or test can point it elsewhere); created unless ``create`` is false."""
    p = Path(os.environ.get(HOME_ENV) or Path.home() / ".plan-explorer").expanduser()
    if create:
        p.mkdir(parents=True, exist_ok=True)
    return p


def kernel_cache() -> str:
    """Where numba keeps the compiled kernels, set as ``NUMBA_CACHE_DIR`` unless the user set
    it: ``$XDG_CACHE_HOME/plan-explorer/numba`` (default ``~/.cache/plan-explorer/numba``).

    Machine code depends on the installed sources, not on a user's plans, so it lives outside
    :func:`home`: ``scripts/setup.sh`` compiles every kernel once, and a search in a new
    ``$EXPLORER_HOME`` loads them instead of compiling them again (numba keys each entry by
    its source file's path and time, so an edited kernel is compiled afresh)."""
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache").expanduser()
    return os.environ.setdefault("NUMBA_CACHE_DIR", str(base / "plan-explorer" / "numba"))


def connect(path, schema_sql: str = "", timeout: float = 60.0,
            check_same_thread: bool = True) -> sqlite3.Connection:
    """A connection to the SQLite file ``path`` (``":memory:"``: a private in-memory one).

    Its directory is created, the journal switched to WAL where the file system allows it
    (rollback journal otherwise), rows are :class:`sqlite3.Row` and ``schema_sql`` (``CREATE
    ... IF NOT EXISTS`` statements) is run.  A file that is not a database is moved aside
    (:func:`move_aside`) and a fresh one created.  The caller closes it."""
    try:
        return _open(path, schema_sql, timeout, check_same_thread)
    except sqlite3.DatabaseError as exc:
        if str(path) == ":memory:" or not _damaged(exc) or not Path(path).exists():
            raise
        move_aside(Path(path).expanduser(), str(exc))
        return _open(path, schema_sql, timeout, check_same_thread)


def _damaged(exc: sqlite3.DatabaseError) -> bool:
    """Whether ``exc`` says the file itself is unreadable (not a lock, not a full disk)."""
    text = str(exc).lower()
    return any(s in text for s in ("not a database", "malformed", "file is encrypted",
                                   "disk image"))


def move_aside(path: Path, why: str) -> Path:
    """Rename the damaged store ``path`` (and its ``-wal``/``-shm`` files) to
    ``NAME.damaged-<time>``, say so on stderr in one line, and return the new name."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    target = path.with_name(f"{path.name}.damaged-{stamp}")
    n = 1
    while target.exists():
        n += 1
        target = path.with_name(f"{path.name}.damaged-{stamp}-{n}")
    os.replace(path, target)
    for suffix in ("-wal", "-shm"):
        side = path.with_name(path.name + suffix)
        if side.exists():
            os.replace(side, target.with_name(target.name + suffix))
    print(f"warning: {path} could not be read ({why}); moved it to {target.name} and "
          f"started a fresh one", file=sys.stderr)
    return target


def _open(path, schema_sql: str, timeout: float, check_same_thread: bool):
    if str(path) != ":memory:":
        path = Path(path).expanduser()
        path.parent.mkdir(parents=True, exist_ok=True)
    con = sqlite3.connect(str(path), timeout=timeout, check_same_thread=check_same_thread)
    try:
        con.row_factory = sqlite3.Row
        if str(path) != ":memory:":
            con.execute("PRAGMA schema_version").fetchone()   # reads the header: damaged?
            try:
                if con.execute("PRAGMA journal_mode").fetchone()[0].lower() != "wal":
                    con.execute("PRAGMA journal_mode=WAL")
            except sqlite3.DatabaseError as exc:  # no shared memory, or busy: keep the
                if _damaged(exc):                  # rollback journal
                    raise
        if schema_sql:
            with con:
                con.executescript(schema_sql)
    except BaseException:
        con.close()
        raise
    return con


@contextmanager
def transaction(path, schema_sql: str = "", timeout: float = 60.0, immediate: bool = False):
    """A short connection (see :func:`connect`) as one transaction: committed when the block
    ends, rolled back when it raises, closed either way.  ``immediate`` takes the write lock
    at once, so a read-then-write (e.g. insert unless present) is atomic across processes."""
    con = connect(path, schema_sql, timeout)
    try:
        if immediate:
            con.isolation_level = None
            con.execute("BEGIN IMMEDIATE")
        with con:
            yield con
    finally:
        con.close()

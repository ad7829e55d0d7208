"""The capture cache: layer graphs and operator graphs kept across processes.

Capturing a model (build on the meta device, trace, propagate shapes) takes seconds and needs
torch; reading the result back takes milliseconds and needs neither.  :func:`layer_graph` and
:func:`op_graph` return the capture of ``(spec, batch, model arguments)`` from
``$EXPLORER_HOME/captures.sqlite`` when an entry for the same **code digest** is there, and
build and store it otherwise.  The digest covers everything the capture is computed from:

* our capture code (every module of ``explorer/engine/core``) and this cache's format;
* the versions of Python, torch, networkx (whose graphs are stored) and, for ``hf:NAME``,
  transformers, read from their files without importing them;
* the model's source: every file of ``example_models`` for an example, the file itself for
  ``file.py:function`` (and every other user module loaded when it was built, recorded with
  its hash and checked on every read; a capture built with a module that changed on disk
  after this process loaded it is not stored), nothing more for ``hf:NAME``.

An entry is a zlib-compressed pickle read back by an unpickler that only constructs our graph
classes, networkx graphs and builtin containers (no torch, no code of the file); one that is
corrupt, written by another format or unreadable is dropped and rebuilt, and a cache file that
is not a database is replaced.  Only the newest entry per ``(kind, spec, batch, arguments)``
is kept.  ``explorer cache clear`` (:func:`clear`) empties it; deleting the file does too.

A cached :class:`~explorer.engine.core.opgraph.OpGraph` has no ``gm`` (the traced GraphModule):
the searches never need it.  The runtime keeps its own kind, ``trace`` (:func:`trace`): the
float64 step it ships to its workers, already pickled by torch's graph pickler.  The entry
itself is bytes to this module (read back by the same restricted unpickler); only the runtime
unpickles what they hold, with torch, as it does with a trace it made in this process.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import importlib.util
import io
import json
import os
import pickle
import sqlite3
import sys
import time
import zlib
from pathlib import Path

from explorer.engine.core.storage import connect, home

__all__ = ["FILE", "PATH_ENV", "FORMAT", "layer_graph", "op_graph", "trace", "clear", "info", "path",
           "key_of"]

FILE = "captures.sqlite"
#: bump when what is stored changes shape (old entries are then never read again)
FORMAT = 1
#: entries kept in all (the oldest are removed beyond this)
MAX_ENTRIES = 256

_SCHEMA = """
CREATE TABLE IF NOT EXISTS captures (
    key TEXT PRIMARY KEY,
    kind TEXT NOT NULL,
    request TEXT NOT NULL,
    deps TEXT NOT NULL,
    created REAL NOT NULL,
    bytes INTEGER NOT NULL,
    blob BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS captures_request ON captures (kind, request);
"""

_PACKAGE = Path(__file__).resolve().parents[2]          # explorer/
_EXAMPLES = _PACKAGE.parent / "example_models"


#: a cache file to use instead of the home's (several homes, or CI jobs, sharing one cache)
PATH_ENV = "EXPLORER_CAPTURE_CACHE"


def path() -> Path:
    """The cache file: ``$EXPLORER_CAPTURE_CACHE`` when set, else
    ``$EXPLORER_HOME/captures.sqlite``.  Entries are keyed by the code digest, so a cache
    shared between homes never serves a capture made by other code."""
    shared = os.environ.get(PATH_ENV)
    if shared:
        p = Path(shared).expanduser()
        p.parent.mkdir(parents=True, exist_ok=True)
        return p
    return home() / FILE


# --------------------------------------------------------------------------------------------
# Digests
# --------------------------------------------------------------------------------------------


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def files_digest(paths) -> str:
    """One digest of the files at ``paths`` (names and contents, in name order)."""
    h = hashlib.sha256()
    for p in sorted(paths):
        h.update(str(p.name).encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()


@functools.cache
def _code_digest() -> str:
    """Our capture code: every module directly in ``explorer/engine/core`` plus the errors."""
    return files_digest(list((_PACKAGE / "engine" / "core").glob("*.py"))
                        + [_PACKAGE / "errors.py"])


@functools.cache
def _examples_digest() -> str:
    return files_digest(_EXAMPLES.glob("*.py"))


@functools.cache
def _library(name: str, version_file: str) -> str | None:
    """Digest of an installed package's version file, found without importing it."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.origin:
        return None
    f = Path(spec.origin).with_name(version_file)
    try:
        return _sha(f.read_bytes())
    except OSError:
        return None


def _model_file(spec: str) -> Path | None:
    """The file of a ``file.py:function`` spec (resolved), else ``None``."""
    import example_models
    if spec in example_models.MODELS or spec.startswith("hf:") or ":" not in spec:
        return None
    return Path(spec.rpartition(":")[0]).expanduser().resolve()


def key_of(kind: str, spec: str, batch, model_args: dict | None,
           extra: dict | None = None) -> tuple:
    """``(key, request)``: the entry's key (a digest of everything the capture depends on
    except a file model's imported modules, checked on read) and the request's text.
    ``extra``: more of what the entry depends on (JSON values), part of the request."""
    req = {"spec": spec, "batch": batch,
           "args": {str(k): str(v) for k, v in (model_args or {}).items()}}
    if extra:
        req["extra"] = extra
    request = json.dumps(req, sort_keys=True)
    parts = {"format": FORMAT, "kind": kind, "request": request, "code": _code_digest(),
             "python": list(sys.version_info[:2]), "torch": _library("torch", "version.py"),
             "networkx": _library("networkx", "__init__.py")}     # it pickles graph internals
    f = _model_file(spec)
    if spec.startswith("hf:"):
        parts["transformers"] = _library("transformers", "__init__.py")
    elif f is None:
        parts["examples"] = _examples_digest()
    else:
        parts["file"] = str(f)
        parts["source"] = _sha(f.read_bytes()) if f.is_file() else None
    return _sha(json.dumps(parts, sort_keys=True).encode()), request


def _user_modules(model_file: Path, before: set) -> dict | None:
    """``{path: sha256}`` of the model file and every user module loaded now (not the standard
    library, an installed package, explorer or the examples), or ``None`` when one that was
    already loaded before this capture changed on disk since this process started: the
    capture then used code the file no longer holds, so it must not be stored."""
    import sysconfig

    import psutil
    skip = [str(_PACKAGE) + "/", str(_EXAMPLES) + "/"]
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        p = sysconfig.get_paths().get(key)
        if p:
            skip.append(str(Path(p).resolve()) + "/")
    # psutil derives a start time from the boot time in whole seconds, so it can read up to a
    # second early: a file written just before this process started (a fresh checkout) must
    # not count as edited since
    started = psutil.Process().create_time() + 1.0
    files = {str(model_file): False}
    for name, mod in list(sys.modules.items()):
        f = getattr(mod, "__file__", None)
        if not f or not f.endswith(".py") or "-packages" in f:
            continue
        f = str(Path(f).resolve())
        if not any(f.startswith(s) for s in skip) and f not in files:
            # the model file itself is executed afresh by every load; others are reused
            files[f] = name in before and not name.startswith("_explorer_user_")
    deps = {}
    for f, reused in files.items():
        try:
            if reused and Path(f).stat().st_mtime > started:
                return None
            deps[f] = _sha(Path(f).read_bytes())
        except OSError:
            pass
    return deps


def _deps_hold(deps: dict) -> bool:
    for f, digest in deps.items():
        try:
            if _sha(Path(f).read_bytes()) != digest:
                return False
        except OSError:
            return False
    return True


# --------------------------------------------------------------------------------------------
# Reading and writing entries
# --------------------------------------------------------------------------------------------

_BUILTINS = {"set", "frozenset", "slice", "complex", "object", "bytearray", "range", "Ellipsis"}


class _Unpickler(pickle.Unpickler):
    """Constructs only our graph classes, networkx graphs and builtin containers."""

    def find_class(self, module, name):
        if module in ("explorer.engine.core.layergraph", "explorer.engine.core.opgraph") \
                or module.startswith("networkx.classes.") \
                or (module == "builtins" and name in _BUILTINS) \
                or (module == "copyreg" and name == "_reconstructor") \
                or (module == "collections" and name == "OrderedDict"):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"{module}.{name} is not allowed in a capture")


def _loads(blob: bytes):
    return _Unpickler(io.BytesIO(zlib.decompress(blob))).load()


def _dumps(obj) -> bytes | None:
    """The entry's bytes, or ``None`` when the object holds something the reader would refuse
    (then it is simply not cached)."""
    if hasattr(obj, "gm"):
        obj = copy.copy(obj)
        obj.gm = None
    try:
        raw = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
        _Unpickler(io.BytesIO(raw)).load()
    except Exception:  # noqa: BLE001 - an unpicklable or refused value: do not cache
        return None
    return zlib.compress(raw, 1)


def _connect():
    """A connection to the cache file; a file that is not a database is replaced."""
    f = path()
    try:
        return connect(f, _SCHEMA)
    except sqlite3.DatabaseError:
        for suffix in ("", "-wal", "-shm"):
            Path(str(f) + suffix).unlink(missing_ok=True)
        return connect(f, _SCHEMA)


def _kind_type(kind: str) -> type:
    if kind == "trace":
        return tuple
    if kind == "layers":
        from explorer.engine.core.layergraph import LayerGraph
        return LayerGraph
    from explorer.engine.core.opgraph import OpGraph
    return OpGraph


def _get(key: str, kind: str):
    try:
        con = _connect()
    except (sqlite3.Error, OSError):
        return None
    try:
        row = con.execute("SELECT kind, deps, blob FROM captures WHERE key = ?",
                          (key,)).fetchone()
        if row is None:
            return None
        try:
            obj = _loads(row["blob"]) if row["kind"] == kind else None
            ok = isinstance(obj, _kind_type(kind)) and _deps_hold(json.loads(row["deps"]))
        except Exception:  # noqa: BLE001 - a corrupt or foreign entry: rebuild it
            ok = False
        if not ok:
            with con:
                con.execute("DELETE FROM captures WHERE key = ?", (key,))
            return None
        return obj
    except sqlite3.Error:
        return None
    finally:
        con.close()


def _put(key: str, kind: str, request: str, deps: dict, obj) -> None:
    blob = _dumps(obj)
    if blob is None:
        return
    try:
        con = _connect()
    except (sqlite3.Error, OSError):
        return
    try:
        with con:
            con.execute("DELETE FROM captures WHERE kind = ? AND request = ?", (kind, request))
            con.execute("INSERT OR REPLACE INTO captures VALUES (?, ?, ?, ?, ?, ?, ?)",
                        (key, kind, request, json.dumps(deps), time.time(), len(blob), blob))
            con.execute("DELETE FROM captures WHERE key NOT IN (SELECT key FROM captures "
                        "ORDER BY created DESC LIMIT ?)", (MAX_ENTRIES,))
    except sqlite3.Error:               # read-only or full disk: the capture is still returned
        pass
    finally:
        con.close()


def _cached(kind: str, spec: str, batch, model_args: dict | None, build,
            extra: dict | None = None):
    key, request = key_of(kind, spec, batch, model_args, extra)
    hit = _get(key, kind)
    if hit is not None:
        return hit
    before = set(sys.modules)
    obj = build()
    f = _model_file(spec)
    deps = _user_modules(f, before) if f is not None else {}
    if deps is not None:
        _put(key, kind, request, deps, obj)
    return obj


# --------------------------------------------------------------------------------------------
# The captures
# --------------------------------------------------------------------------------------------


#: Capture a missing layer graph in a child process when this one has not imported torch
#: (``explorer search`` sets it): the child traces and stores the entry, this process reads
#: it back and never holds torch (about 260 MiB resident after tracing Inception-v3) through
#: the search that follows.  Whatever the child could not store is built here as before.
TRACE_IN_CHILD = False
_CHILDREN: dict = {}          # entry key -> the child capturing it (started, not yet waited)
_REAPER = False


def start_layer_graph(spec: str, batch: int | None = None,
                      model_args: dict | None = None) -> bool:
    """Start capturing ``spec``'s layer graph in a child process now (:data:`TRACE_IN_CHILD`,
    torch not imported here, the entry missing, the model an example, an ``hf:`` name or an
    existing file), so that the caller's own start-up overlaps it; :func:`layer_graph` waits
    for it.  ``True`` when a child was started."""
    if not TRACE_IN_CHILD or "torch" in sys.modules or not _plausible(spec):
        return False
    key, _ = key_of("layers", spec, batch, model_args)
    if key in _CHILDREN or _has(key):
        return False
    child = _child(spec, batch, model_args)
    if child is not None:
        _CHILDREN[key] = child
    return child is not None


def tracing(spec: str, batch: int | None = None, model_args: dict | None = None) -> bool:
    """Whether a child started by :func:`start_layer_graph` is capturing this entry."""
    return key_of("layers", spec, batch, model_args)[0] in _CHILDREN


def layer_graph(spec: str, batch: int | None = None, model_args: dict | None = None):
    """:func:`~explorer.engine.core.importer.import_spec`, from the cache when it holds it
    (see :data:`TRACE_IN_CHILD`)."""
    def build():
        from explorer.engine.core.importer import import_spec
        return import_spec(spec, batch, dict(model_args or {}))
    if TRACE_IN_CHILD and "torch" not in sys.modules:
        key, _ = key_of("layers", spec, batch, model_args)
        child = _CHILDREN.pop(key, None)
        hit = _get(key, "layers") if child is None else None
        if hit is None and child is None and _plausible(spec):
            child = _child(spec, batch, model_args)
        if child is not None and _wait(child) == 0:
            hit = _get(key, "layers")
        if hit is not None:
            return hit
    return _cached("layers", spec, batch, model_args, build)


def _plausible(spec: str) -> bool:
    """Whether a child could capture ``spec`` (an unknown name fails here at once instead)."""
    import example_models
    if spec in example_models.MODELS or spec.startswith("hf:"):
        return True
    f = _model_file(spec)
    return f is not None and f.is_file()


def _has(key: str) -> bool:
    """Whether the cache holds an entry under ``key`` (not read)."""
    try:
        con = _connect()
    except (sqlite3.Error, OSError):
        return False
    try:
        return con.execute("SELECT 1 FROM captures WHERE key = ?", (key,)).fetchone() \
            is not None
    except sqlite3.Error:
        return False
    finally:
        con.close()


def _child(spec: str, batch, model_args: dict | None):
    """A child Python (same environment, so the same cache file) running
    :func:`layer_graph`, or ``None``.  Its errors are not read: on failure the caller
    captures in this process, which raises them as usual."""
    import subprocess
    try:
        job = json.dumps([spec, batch, model_args or {}])
    except (TypeError, ValueError):
        return None
    code = ("import json, sys\n"
            "from explorer.engine.core.capture_cache import layer_graph\n"
            "spec, batch, args = json.loads(sys.argv[1])\n"
            "layer_graph(spec, batch, args)\n")
    try:
        child = subprocess.Popen([sys.executable, "-c", code, job], stdin=subprocess.DEVNULL,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    except OSError:
        return None
    global _REAPER
    if not _REAPER:
        import atexit
        atexit.register(_reap)
        _REAPER = True
    return child


def _wait(child) -> int:
    try:
        return child.wait()
    except BaseException:            # interrupted: the child goes too
        child.kill()
        child.wait()
        raise


def _reap() -> None:
    """At exit: children started but never waited for (the command failed first) stop."""
    for child in _CHILDREN.values():
        if child.poll() is None:
            child.kill()
            child.wait()
    _CHILDREN.clear()


def op_graph(spec: str, batch: int | None = None, model_args: dict | None = None):
    """:func:`~explorer.engine.core.opgraph.build_opgraph`, from the cache when it holds it."""
    def build():
        from explorer.engine.core.opgraph import build_opgraph
        return build_opgraph(spec, batch, dict(model_args or {}))
    return _cached("ops", spec, batch, model_args, build)


def trace(spec: str, batch, model_args: dict | None, extra: dict, build) -> tuple:
    """The runtime's pickled trace of a model's step: ``build()`` (a tuple of bytes and
    strings), from the cache when it holds it for the same code and ``extra`` (seed, rate,
    dtype, the runtime's own digest)."""
    return _cached("trace", spec, batch, model_args, build, extra)


def info() -> dict:
    """Where the cache is, how many entries of each kind it holds and its size in bytes."""
    f = path()
    out = {"path": str(f), "entries": {}, "bytes": 0}
    if not f.exists():
        return out
    try:
        con = _connect()
    except (sqlite3.Error, OSError):
        return out
    try:
        for row in con.execute("SELECT kind, COUNT(*) AS n FROM captures GROUP BY kind"):
            out["entries"][row["kind"]] = row["n"]
    except sqlite3.Error:
        pass
    finally:
        con.close()
    out["bytes"] = sum(Path(str(f) + s).stat().st_size for s in ("", "-wal")
                       if Path(str(f) + s).exists())
    return out


def clear() -> int:
    """Remove every entry; the number removed (:class:`ExplorerError` when the file cannot
    be written)."""
    from explorer.errors import ExplorerError
    if not path().exists():
        return 0
    try:
        con = _connect()
        try:
            with con:
                n = con.execute("DELETE FROM captures").rowcount
            con.execute("VACUUM")
        finally:
            con.close()
    except (sqlite3.Error, OSError) as exc:
        raise ExplorerError(f"cannot clear the capture cache {path()}: {exc}; delete the "
                            f"file instead") from None
    return n

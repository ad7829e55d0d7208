"""The capture cache (explorer/engine/core/capture_cache.py): cached graphs equal fresh ones, a
second capture neither traces nor imports torch, edits invalidate, damage is rebuilt; and the
command line's torch-free paths."""

import dataclasses
import inspect
import json
import pickle
import shutil
import sqlite3
import subprocess
import sys
import textwrap
import zlib

import networkx as nx
import pytest

import example_models
from explorer import service
from explorer.engine.core import capture_cache as cc
from explorer.engine.core.importer import import_spec
from explorer.engine.core.opgraph import Op, OpGraph, TorchValue, build_opgraph

pytest.importorskip("torch")

TINY_GPT2 = {"layers": 1, "hidden": 32, "heads": 2, "seq_len": 8, "vocab": 50}
TINY_HF = {"n_layer": 1, "n_embd": 32, "n_head": 2, "vocab_size": 64, "seq_len": 8}

MODEL_FILE = """
import torch
from torch import nn
{extra}

class Net(nn.Module):
    def __init__(self, hidden):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.fc = nn.Linear(4 * 8 * 8, hidden)

    def forward(self, x):
        return self.fc(torch.relu(self.bn(self.conv(x))).flatten(1))


def build(hidden={hidden}):
    return Net(hidden), torch.randn(2, 3, 8, 8)
"""


def _model_file(tmp_path, hidden=16, extra="", name="netfile.py") -> str:
    f = tmp_path / name
    f.write_text(MODEL_FILE.format(hidden=hidden, extra=extra))
    return f"{f}:build"


# --------------------------------------------------------------------------------------------
# Equality of graphs, field by field
# --------------------------------------------------------------------------------------------


def _same(a, b, where="graph"):
    """Assert ``a`` and ``b`` are equal values (graphs compared node by node, edge by edge,
    objects attribute by attribute, types included)."""
    assert type(a) is type(b), f"{where}: {type(a).__name__} != {type(b).__name__}"
    if isinstance(a, nx.Graph):
        assert list(a.nodes(data=True)) == list(b.nodes(data=True)), where
        assert list(a.edges(data=True, keys=True) if a.is_multigraph() else a.edges(data=True)) \
            == list(b.edges(data=True, keys=True) if b.is_multigraph() else b.edges(data=True)), \
            where
    elif isinstance(a, dict):
        assert list(a) == list(b), where
        for k in a:
            _same(a[k], b[k], f"{where}[{k!r}]")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _same(x, y, f"{where}[{i}]")
    elif dataclasses.is_dataclass(a) or hasattr(a, "__dict__"):
        va, vb = vars(a), vars(b)
        assert sorted(va) == sorted(vb), where
        for k in va:
            if k == "gm":
                continue
            _same(va[k], vb[k], f"{where}.{k}")
    else:
        assert a == b or (a != a and b != b), f"{where}: {a!r} != {b!r}"


def _cached_twice(kind, spec, batch, args):
    """The capture built through the cache (a miss, stored) and read back (a hit)."""
    get = cc.layer_graph if kind == "layers" else cc.op_graph
    first = get(spec, batch, args)
    assert cc.info()["entries"].get(kind) == 1
    return first, get(spec, batch, args)


@pytest.mark.slow
@pytest.mark.parametrize("spec,batch,args", [
    ("lenet5", 4, {}),
    ("gpt2", 2, TINY_GPT2),
    ("inception_v3", 2, {"image_size": 75}),
    ("file", None, {}),
    ("hf:gpt2", 2, TINY_HF),
])
def test_cached_layer_graph_equals_fresh(spec, batch, args, tmp_path):
    if spec.startswith("hf:"):
        pytest.importorskip("transformers")
    if spec == "file":
        spec = _model_file(tmp_path)
    built, cached = _cached_twice("layers", spec, batch, args)
    assert cached is not built
    fresh = import_spec(spec, batch, dict(args))
    _same(cached, fresh)
    _same(built, fresh)
    from explorer.engine.core.layergraph import graph_digest
    assert graph_digest(cached) == graph_digest(fresh)


@pytest.mark.parametrize("spec,batch,args", [
    ("mlp", 4, {"layers": 2, "hidden": 16}),
    ("gpt2", 2, TINY_GPT2),
    ("lstm", 2, {"layers": 1, "hidden": 8, "steps": 3}),
    ("file", None, {}),
    ("hf:gpt2", 2, TINY_HF),
])
def test_cached_operator_graph_equals_fresh(spec, batch, args, tmp_path):
    if spec.startswith("hf:"):
        pytest.importorskip("transformers")
    if spec == "file":
        spec = _model_file(tmp_path)
    built, cached = _cached_twice("ops", spec, batch, args)
    fresh = build_opgraph(spec, batch, dict(args))
    assert cached.gm is None and fresh.gm is not None and built.gm is not None
    _same(cached, fresh)
    from explorer.engine.core.opgraph import opgraph_digest
    assert opgraph_digest(cached) == opgraph_digest(fresh)
    for name in list(cached.ops)[:50]:           # the user's line without the traced module
        assert cached.where(name) == (fresh.ops[name].where or None)


@pytest.mark.slow
@pytest.mark.parametrize("spec,args", [("inception_v3", {"image_size": 75}),
                                       ("gpt2", TINY_GPT2), ("lstm", {"layers": 1})])
def test_import_without_source_lines_gives_the_same_graph(spec, args):
    """The importer traces without recording source lines (only errors need them): the
    graph is the one a trace with them gives."""
    from explorer.engine.core.capture import capture, load
    from explorer.engine.core.importer import _import, import_model
    model, x = load(spec, 2, args)
    _same(import_model(model, x, spec), _import(model, x, spec, capture(model, x, spec)))


@pytest.mark.parametrize("name", sorted(example_models.MODELS))
def test_every_example_layer_graph_is_stored(name):
    """Nothing in any example's layer graph is refused by the cache's reader."""
    assert cc._dumps(import_spec(name, 2)) is not None


def test_operator_arguments_are_plain_data():
    """Torch enums in an operator's arguments are TorchValue (torch-free), and name the same
    torch object; fx's immutable lists are lists."""
    import torch
    from torch.fx.immutable_collections import immutable_list
    g = build_opgraph("gpt2", 2, TINY_GPT2)
    seen = []

    def walk(a):
        if isinstance(a, (list, tuple)):
            assert type(a) in (list, tuple) and not isinstance(a, immutable_list)
            for x in a:
                walk(x)
        elif isinstance(a, dict):
            for x in a.values():
                walk(x)
        else:
            assert not isinstance(a, (torch.dtype, torch.device, torch.layout,
                                      torch.memory_format)), a
            if isinstance(a, TorchValue):
                seen.append(a)
    for op in g.ops.values():
        walk(op.args)
        walk(op.kwargs)
    assert {v.kind for v in seen} >= {"dtype", "memory_format"}
    for v in seen:
        assert TorchValue.of(v.value()) == v
    assert repr(TorchValue("dtype", "float32")) == "torch.float32"


def test_measured_replay_reads_torch_values(tmp_path):
    """The placers' measured replay calls aten ops with the graph's arguments: TorchValue
    turns back into torch objects (BatchNorm's ``empty(dtype=, layout=, device=)``)."""
    from explorer.engine.placement.estimate import measure_ops
    g = cc.op_graph(_model_file(tmp_path), None, {})
    assert any(isinstance(v, TorchValue) for op in g.ops.values() for v in op.kwargs.values())
    out = measure_ops(g, reps=1, warmup=0)
    assert out["failed"] == []


# --------------------------------------------------------------------------------------------
# A second capture does not trace
# --------------------------------------------------------------------------------------------


def test_second_capture_does_not_trace(monkeypatch):
    req = service.Request(model="lenet5", batch=4, devices=2)
    service.clear_caches()      # an earlier test's in-memory graph would skip this home's cache
    first_layers, first_ops = service.graph_for(req), service.opgraph_for(req)
    service.clear_caches()                     # a new process: only the capture cache is left

    def no_trace(*a, **k):
        raise AssertionError("traced again")
    from explorer.engine.core import importer
    from explorer.engine.core import opgraph
    monkeypatch.setattr(importer, "import_spec", no_trace)
    monkeypatch.setattr(opgraph, "build_opgraph", no_trace)
    _same(service.graph_for(req), first_layers)
    _same(service.opgraph_for(req), first_ops)
    # another batch is another capture
    with pytest.raises(AssertionError, match="traced again"):
        service.graph_for(service.Request(model="lenet5", batch=8, devices=2))


def _run_py(code: str, home) -> subprocess.CompletedProcess:
    import os
    env = dict(os.environ, EXPLORER_HOME=str(home))
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=600, env=env)


NO_TORCH = """
import sys
from explorer.cli import main
rc = main({argv!r})
assert rc == 0, rc
loaded = sorted(m for m in sys.modules if m == "torch" or m.startswith("torch."))
assert not loaded, loaded[:5]
print("no torch")
"""


@pytest.mark.multiprocess
@pytest.mark.parametrize("argv", [
    ["search", "lenet5", "-n", "2", "--batch", "4", "--json"],
    ["search", "mlp", "-n", "2", "--batch", "4", "-a", "layers=2", "-a", "hidden=16",
     "--algo", "tofu", "--json"],
    ["search", "mlp", "-n", "2", "--batch", "4", "-a", "layers=2", "-a", "hidden=16",
     "--algo", "m-etf", "--json"],
])
def test_second_search_imports_no_torch(argv, tmp_path):
    """The first ``explorer search`` traces and stores; a second one of the same model reads
    the capture, never imports torch and finds the same plan."""
    first = _run_py(f"from explorer.cli import main; raise SystemExit(main({argv!r}))", tmp_path)
    assert first.returncode == 0, first.stderr
    second = _run_py(NO_TORCH.format(argv=argv), tmp_path)
    assert second.returncode == 0, second.stderr
    out, _, tail = second.stdout.rpartition("no torch")
    assert not tail.strip()
    a, b = json.loads(first.stdout), json.loads(out)
    for k in ("objective_s", "comm_bytes", "memory_per_device_bytes", "algo", "devices"):
        assert a[k] == b[k], k


@pytest.mark.multiprocess
def test_a_first_layerwise_search_traces_in_a_child_and_holds_no_torch(tmp_path):
    """``explorer search`` of a model not yet captured traces it in a child process (which
    stores the capture), so the search itself never imports torch (its ~260 MiB are not held
    through the search); the plan is the one an in-process capture gives."""
    argv = ["search", "alexnet", "-n", "4", "--batch", "8", "-a", "image_size=64", "--json"]
    first = _run_py(NO_TORCH.format(argv=argv), tmp_path / "a")
    assert first.returncode == 0, first.stderr
    out = first.stdout.rpartition("no torch")[0]
    here = _run_py(f"import torch\nfrom explorer.cli import main\n"
                   f"raise SystemExit(main({argv!r}))", tmp_path / "b")
    assert here.returncode == 0, here.stderr
    a, b = json.loads(out), json.loads(here.stdout)
    for k in ("objective_s", "comm_bytes", "memory_per_device_bytes", "layers", "algo"):
        assert a[k] == b[k], k


@pytest.mark.multiprocess
def test_a_model_a_child_cannot_trace_is_refused_in_one_line(tmp_path):
    """When the child fails, the search captures here and says why in one line, exit 2."""
    f = tmp_path / "dd.py"
    f.write_text(textwrap.dedent("""
        import torch
        from torch import nn

        class M(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(8, 8)

            def forward(self, x):
                return self.fc(x[x > 0].reshape(-1, 8))

        def build(batch=4):
            return M(), torch.randn(batch, 8)
        """))
    r = _run_py(f"from explorer.cli import main\n"
                f"raise SystemExit(main(['search', '{f}:build', '-n', '2']))", tmp_path / "h")
    assert r.returncode == 2, (r.returncode, r.stderr)
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert "data" in lines[0].lower() or "mask" in lines[0].lower(), lines[0]


@pytest.mark.multiprocess
@pytest.mark.parametrize("argv", [["--help"], ["models"], ["presets"], ["search", "--help"],
                                  ["cache"]])
def test_listing_commands_import_no_torch(argv, tmp_path):
    code = f"""
    import sys
    from explorer.cli import main
    try:
        main({argv!r})
    except SystemExit as e:
        assert e.code in (0, None), e.code
    assert "torch" not in sys.modules
    print("ok")
    """
    r = _run_py(code, tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().endswith("ok")


def test_model_params_read_from_source_equal_the_signature():
    for name, entry in example_models.MODELS.items():
        sig = inspect.signature(entry.builder)
        want = {p.name: p.default for p in sig.parameters.values() if p.name != "batch"}
        assert example_models.model_params(name) == want, name
        assert entry.source.is_file()


# --------------------------------------------------------------------------------------------
# What invalidates an entry
# --------------------------------------------------------------------------------------------


def test_model_source_edit_invalidates(tmp_path):
    spec = _model_file(tmp_path, hidden=16)
    assert cc.layer_graph(spec).layer("fc").out_shape[-1] == 16
    assert cc.op_graph(spec).tensors["param:fc.weight"].shape == (16, 256)
    _model_file(tmp_path, hidden=124)                  # the same file, edited
    assert cc.layer_graph(spec).layer("fc").out_shape[-1] == 124
    assert cc.op_graph(spec).tensors["param:fc.weight"].shape == (124, 256)
    assert cc.info()["entries"] == {"layers": 1, "ops": 1}      # the stale entries replaced


def test_imported_user_module_edit_invalidates(tmp_path, monkeypatch):
    """A module the model file imports is recorded with its hash and checked on read."""
    lib = tmp_path / "sizes_for_cache_test.py"
    lib.write_text("HIDDEN = 12\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    spec = _model_file(tmp_path, hidden="sizes_for_cache_test.HIDDEN",
                       extra="import sizes_for_cache_test")
    try:
        assert cc.layer_graph(spec).layer("fc").out_shape[-1] == 12
        lib.write_text("HIDDEN = 120\n")
        sys.modules.pop("sizes_for_cache_test", None)
        assert cc.layer_graph(spec).layer("fc").out_shape[-1] == 120
    finally:    # loaded again above: a later capture would see it edited since start-up
        sys.modules.pop("sizes_for_cache_test", None)


def test_a_launch_ships_the_cached_trace_until_the_model_is_edited(tmp_path, monkeypatch):
    """The runtime's pickled float64 step (kind ``trace``) is traced once per code digest:
    a second launch of the same model ships the stored bytes without tracing, and an edited
    model file is traced again - the workers never receive a graph of the old code."""
    from unittest import mock

    from explorer.engine.runtime import opexec, traces
    spy = mock.Mock(wraps=opexec._build)
    monkeypatch.setattr(opexec, "_build", spy)
    traced = spy.call_args_list                         # one entry per trace made
    spec = _model_file(tmp_path, hidden=16)
    plans = [{"spec": spec, "batch": 2, "model_args": {}}]
    first = opexec._ship_traces(plans, 0, 0.01)
    assert len(traced) == 1 and len(first) == 1
    assert opexec._ship_traces(plans, 0, 0.01) == first and len(traced) == 1
    assert cc.info()["entries"] == {"trace": 1}
    g = traces.unpickle_trace(next(iter(first.values())))
    assert g is not None and g.tensors["param:fc.weight"].shape == (16, 256)
    assert len(opexec._ship_traces(plans, 1, 0.01)) == 1 and len(traced) == 2   # other seed
    _model_file(tmp_path, hidden=124)                  # the same file, edited
    edited = opexec._ship_traces(plans, 0, 0.01)
    assert len(traced) == 3
    g = traces.unpickle_trace(next(iter(edited.values())))
    assert g.tensors["param:fc.weight"].shape == (124, 256)


def test_a_float32_launch_ships_both_dtypes_traced_once_each(tmp_path):
    """Timed steps in float32 and the float64 check: the launcher ships both traces (the
    workers trace neither), each kept in the cache under its own dtype."""
    import torch

    from explorer.engine.runtime import opexec, traces
    spec = _model_file(tmp_path, hidden=16)
    plans = [{"spec": spec, "batch": 2, "model_args": {}}] * 2      # one model, two plans
    shipped = opexec._ship_traces(plans, 0, 0.01, (torch.float32, torch.float64))
    assert sorted(k[4] for k in shipped) == ["torch.float32", "torch.float64"]
    assert cc.info()["entries"] == {"trace": 2}
    for key, blob in shipped.items():
        g = traces.unpickle_trace(blob)
        dtypes = {v.dtype for v in g.tensors.values() if "float" in str(v.dtype)}
        assert dtypes == {key[4].replace("torch.", "")}, (key, dtypes)


def test_capture_with_a_stale_loaded_module_is_not_stored(tmp_path, monkeypatch):
    """A user module this process loaded before its file changed: the capture uses the code
    in memory, which the file no longer holds, so it is returned but not stored."""
    import importlib
    lib = tmp_path / "stale_for_cache_test.py"
    lib.write_text("HIDDEN = 12\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.import_module("stale_for_cache_test")
    lib.write_text("HIDDEN = 120\n")            # edited after this process loaded it
    spec = _model_file(tmp_path, hidden="stale_for_cache_test.HIDDEN",
                       extra="import stale_for_cache_test")
    try:
        assert cc.layer_graph(spec).layer("fc").out_shape[-1] == 12
        assert cc.info()["entries"] == {}
    finally:
        sys.modules.pop("stale_for_cache_test", None)


def test_capture_code_edit_changes_the_key(tmp_path, monkeypatch):
    """Every module of explorer/engine/core is in the code digest: editing one changes the key."""
    copy = tmp_path / "explorer"
    (copy / "engine" / "core").mkdir(parents=True)
    for f in (cc._PACKAGE / "engine" / "core").glob("*.py"):
        shutil.copy(f, copy / "engine" / "core" / f.name)
    shutil.copy(cc._PACKAGE / "errors.py", copy / "errors.py")
    monkeypatch.setattr(cc, "_PACKAGE", copy)
    cc._code_digest.cache_clear()
    try:
        before = cc.key_of("layers", "lenet5", 4, {})[0]
        f = copy / "engine" / "core" / "importer.py"
        f.write_text(f.read_text() + "\n# edited\n")
        cc._code_digest.cache_clear()
        assert cc.key_of("layers", "lenet5", 4, {})[0] != before
    finally:
        cc._code_digest.cache_clear()


def test_key_covers_request():
    base = cc.key_of("layers", "lenet5", 4, {})[0]
    assert cc.key_of("layers", "lenet5", 8, {})[0] != base
    assert cc.key_of("layers", "lenet5", 4, {"num_classes": "5"})[0] != base
    assert cc.key_of("ops", "lenet5", 4, {})[0] != base
    assert cc.key_of("layers", "lenet5", 4, {})[0] == base


# --------------------------------------------------------------------------------------------
# Damage is rebuilt, never a traceback
# --------------------------------------------------------------------------------------------


def _set_blob(blob: bytes):
    with sqlite3.connect(cc.path()) as con:
        con.execute("UPDATE captures SET blob = ?", (blob,))


class _Evil:
    def __reduce__(self):
        return (print, ("unpickled code ran",))


@pytest.mark.parametrize("damage", ["garbage", "truncated", "foreign class", "wrong kind",
                                    "old format"])
def test_damaged_entry_is_rebuilt(damage, capsys):
    fresh = cc.layer_graph("lenet5", 4)
    if damage == "garbage":
        _set_blob(b"not a capture")
    elif damage == "truncated":
        with sqlite3.connect(cc.path()) as con:
            blob = con.execute("SELECT blob FROM captures").fetchone()[0]
        _set_blob(blob[: len(blob) // 2])
    elif damage == "foreign class":
        _set_blob(zlib.compress(pickle.dumps(_Evil())))
    elif damage == "wrong kind":
        with sqlite3.connect(cc.path()) as con:
            con.execute("UPDATE captures SET kind = 'ops'")
    else:
        _set_blob(zlib.compress(pickle.dumps({"format": 0})))
    again = cc.layer_graph("lenet5", 4)
    _same(again, fresh)
    assert "unpickled code ran" not in capsys.readouterr().out
    with sqlite3.connect(cc.path()) as con:               # rebuilt and stored again
        assert con.execute("SELECT COUNT(*) FROM captures").fetchone()[0] == 1
    assert cc.layer_graph("lenet5", 4) is not None


def test_cache_file_that_is_not_a_database_is_replaced():
    cc.path().write_bytes(b"this is not an SQLite file" * 100)
    assert len(cc.layer_graph("lenet5", 4).layers()) > 3
    assert cc.info()["entries"] == {"layers": 1}


def test_unreadable_cache_still_captures(monkeypatch):
    """No cache at all (a home that cannot hold a database): the capture is still built."""
    def broken():
        raise sqlite3.OperationalError("unable to open database file")
    monkeypatch.setattr(cc, "_connect", broken)
    assert len(cc.layer_graph("lenet5", 4).layers()) > 3


# --------------------------------------------------------------------------------------------
# explorer cache
# --------------------------------------------------------------------------------------------


def test_cache_command_info_and_clear(capsys):
    from explorer.cli import main
    assert main(["cache"]) == 0
    assert "empty" in capsys.readouterr().out
    cc.layer_graph("lenet5", 4)
    cc.op_graph("mlp", 4, {"layers": 2, "hidden": 16})
    assert main(["cache", "info"]) == 0
    out = capsys.readouterr().out
    assert str(cc.path()) in out and "1 layer graph" in out and "1 operator graph" in out
    assert main(["cache", "clear"]) == 0
    assert "removed 2 cached captures" in capsys.readouterr().out
    assert cc.info()["entries"] == {}


def test_cache_clear_that_cannot_write_is_one_line(capsys, monkeypatch):
    from explorer.cli import main
    cc.layer_graph("lenet5", 4)

    def locked():
        raise sqlite3.OperationalError("attempt to write a readonly database")
    monkeypatch.setattr(cc, "_connect", locked)
    assert main(["cache", "clear"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: cannot clear the capture cache") and err.count("\n") == 1

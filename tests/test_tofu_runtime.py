"""Tofu plans executed on 2 gloo CPU workers against one device (float64).

Plans are searched here, in the test, and saved as documents; the runtime executes the
document (:func:`explorer.engine.runtime.dispatch.run_document`) and never searches.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from _helpers import explorer_cli, forbid_search, spawned_workers
from explorer.cli import main
from explorer.engine.core import plandoc
from explorer.engine.core.geometry import ExecutionLayout
from explorer.engine.core.opgraph import build_opgraph
from explorer.engine.runtime.launcher import RunFailed
from explorer.engine.runtime.dispatch import run_document
from explorer.engine.search import Problem, Request, run
from explorer.engine.tofu import search as tofu
from explorer.errors import InfeasiblePlan, PlanFileError

pytestmark = pytest.mark.multiprocess   # every test here starts worker processes


def tofu_doc(spec, batch, args, workers=2, algo="tofu") -> dict:
    """A saved Tofu plan (what `explorer search --algo ALGO --out` writes)."""
    prob = Problem(Request(spec, batch, dict(args), preset="local", devices=workers))
    return run(algo, prob).document()


@pytest.mark.parametrize("spec,batch,args,algo", [
    ("mlp", 16, {"layers": 2, "hidden": 32}, "tofu"),
    ("mlp", 16, {"layers": 2, "hidden": 32}, "allrow-greedy"),
    ("lenet5", 8, {}, "tofu"),
    ("lenet5", 8, {}, "icml18"),
])
def test_tofu_plan_matches_one_device_and_moves_the_predicted_bytes(spec, batch, args, algo):
    r = run_document(tofu_doc(spec, batch, args, 2, algo), timeout_s=120)
    assert r["reference_ok"], r
    assert r["max_rel_error"] < 1e-10
    # every updated parameter was compared with the single-device step
    assert r["reference"]["params_compared"] > 0 and not r["reference"]["problems"]
    # every byte the workers exchanged is one the plan's cost accounting predicted
    assert r["measured_comm_bytes"] == pytest.approx(r["predicted_comm_bytes"])
    assert r["predicted_comm_bytes"] > 0 and r["extra_bytes"] == 0


def test_a_small_resnet_with_batchnorm_and_residuals_runs_correctly():
    r = run_document(tofu_doc("wresnet", 2, {"depth": 50, "width": 1, "image_size": 32,
                                              "num_classes": 10}), timeout_s=240)
    assert r["reference_ok"], r
    assert r["measured_comm_bytes"] == pytest.approx(r["predicted_comm_bytes"])


def test_the_saved_layout_is_the_search_s_layout_in_compact_form():
    """The saved layout is geometry's ExecutionLayout in its compact JSON: it round-trips the
    search's execution plan; repeated boxes are stored once, so the document stays small."""
    result = run("tofu", Problem(Request("lenet5", 8, preset="local", devices=2)))
    g, res = result.capture, result.plan
    raw = tofu.execution_plan(res, g)
    # the saved form is geometry's vocabulary, where a 0-d tensor (the loss) is one element
    x = ExecutionLayout.from_plan(raw, {t: g.tensors[t].shape for t in raw["held"]}).to_plan()
    assert set(x["held"]) == set(raw["held"]) and set(x["ops"]) == set(raw["ops"])
    doc = result.document()
    assert plandoc.open_document(doc) == "tofu"
    assert doc["devices"] == 2 and doc["batch"] == 8 and doc["model_args"] == {}
    assert doc["algo"] == "tofu" and doc["comm_bytes"] == res.comm_bytes
    assert isinstance(doc["preset"], str) and len(doc["peak_memory_bytes"]) == 2
    back = ExecutionLayout.from_json(json.loads(json.dumps(doc["layout"]))).to_plan()
    assert set(back["held"]) == set(x["held"]) and set(back["ops"]) == set(x["ops"])
    for t, b in x["held"].items():
        assert np.array_equal(back["held"][t], b), t
    for o, info in x["ops"].items():
        got = back["ops"][o]
        assert np.array_equal(got["out"], info["out"]) and got["reducer"] == info["reducer"]
        assert {t: n.tolist() for t, n in got["needs"].items()} == \
            {t: n.tolist() for t, n in info["needs"].items()}
        assert {t: z.tolist() for t, z in got["zero"].items()} == \
            {t: np.asarray(z).tolist() for t, z in info["zero"].items()}
    assert len(doc["layout"]["boxes"]) < len(x["held"]) / 2
    with pytest.raises(ValueError, match="box index 1000000"):
        ExecutionLayout.from_json(dict(doc["layout"], held={"x": 10 ** 6}))
    broken = dict(doc, layout=dict(doc["layout"], held={"x": 10 ** 6}))
    with pytest.raises(PlanFileError, match="layout is malformed"):
        run_document(broken, verify=False)


def _workers():
    return {c.pid for c in spawned_workers()}


def test_a_worker_that_raises_fails_the_run_quickly_without_orphans():
    doc = tofu_doc("mlp", 8, {"layers": 1, "hidden": 8})
    before = _workers()
    with pytest.raises(RunFailed, match="rank 1.*injected fault") as info:
        run_document(doc, fault="1:1:raise", timeout_s=60)
    # the fault ended the run, not the clock (a timeout is "run timed out", rank None)
    assert info.value.rank == 1 and "timed out" not in str(info.value)
    assert not _workers() - before


def test_a_worker_that_dies_fails_the_run_with_one_line_and_no_orphans(tmp_path, capsys,
                                                                       monkeypatch):
    """The operator-level executor through `explorer run`: worker 0 exits mid-step."""
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(tofu_doc("mlp", 8, {"layers": 1, "hidden": 8})))
    monkeypatch.setenv("EXPLORER_RUNTIME_FAULT", "0:1:exit")
    before = _workers()
    code = main(["run", str(path), "--timeout", "60"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert "rank 0 died" in err and "exit code 3" in err, err
    assert not _workers() - before


def test_explorer_run_executes_a_saved_tofu_plan(tmp_path):
    plan = tmp_path / "plan.json"
    out = explorer_cli("search", "mlp", "-n", "2",
                       "--batch", "8", "-a", "hidden=16", "--algo", "tofu", "--out",
                       str(plan))
    assert out.returncode == 0, out.stderr
    out = explorer_cli("run", str(plan), "--json")
    assert out.returncode == 0, out.stderr
    d = json.loads(out.stdout)
    assert d["reference_ok"] and d["measured_comm_bytes"] == d["predicted_comm_bytes"]
    assert d["kind"] == "tofu" and d["run_id"] >= 1
    # a plan for other model arguments is refused before launching
    doc = json.loads(plan.read_text())
    doc["model_args"] = {"hidden": "32"}
    plan.write_text(json.dumps(doc))
    out = explorer_cli("run", str(plan))
    assert out.returncode != 0 and "does not match" in out.stderr
    # ... also when the edited document is sealed again: its operator graph is another
    plan.write_text(json.dumps(plandoc.seal(doc, "tofu")))
    out = explorer_cli("run", str(plan))
    assert out.returncode == 2 and "another operator graph" in out.stderr, out.stderr


def test_a_saved_tofu_plan_runs_without_any_search(tmp_path, capsys, monkeypatch):
    path = tmp_path / "plan.json"
    assert main(["search", "mlp", "-n", "2", "--batch", "8", "-a", "hidden=16", "--algo",
                 "icml18", "--out", str(path)]) == 0
    capsys.readouterr()
    forbid_search(monkeypatch)
    code = main(["run", str(path), "--json", "--timeout", "120"])
    out, err = capsys.readouterr()
    assert code == 0, err
    d = json.loads(out)
    assert d["reference_ok"] and d["algo"] == "icml18" and d["devices"] == 2
    assert d["measured_comm_bytes"] == d["predicted_comm_bytes"]
    code = main(["run", str(path), "--timeout", "120"])         # the text report
    out, err = capsys.readouterr()
    assert code == 0 and "mlp icml18 plan on 2 local workers" in out
    assert "reference check passed" in out and "communication: predicted" in out


@pytest.mark.parametrize("edit, words", [
    (lambda d: dict(d, schema="plan-explorer/quantum"), "unknown plan schema"),
    (lambda d: plandoc.seal(d, "tofu") | {"version": 99}, "newer Plan Explorer"),
    (lambda d: dict(d, comm_bytes=1.0), "edited after it was saved"),
    (lambda d: {k: v for k, v in d.items() if k not in ("layout", "checksum", "version")}
     | {"schema": "plan-explorer/tofu-plan@1"}, "without its execution layout"),
    (lambda d: {k: v for k, v in d.items() if k != "checksum"}, "no checksum"),
], ids=["unknown-schema", "newer-version", "edited", "version-1", "no-checksum"])
def test_unusable_tofu_documents_are_refused_before_launch(tmp_path, capsys, edit, words):
    doc = tofu_doc("mlp", 8, {"layers": 1, "hidden": 8})
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(edit(doc)))
    before = _workers()
    code = main(["run", str(path)])
    out, err = capsys.readouterr()
    assert code == 2 and out == "" and err.count("\n") == 1 and words in err, err
    assert not _workers() - before


def test_a_tofu_plan_for_other_devices_or_model_is_refused_before_launch(tmp_path, capsys):
    doc = tofu_doc("mlp", 8, {"layers": 1, "hidden": 8})
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(doc))
    before = _workers()
    code = main(["run", str(path), "--devices", "4"])
    err = capsys.readouterr().err
    assert code == 2 and "for 2 devices, not --devices 4" in err and err.count("\n") == 1
    code = main(["run", str(path), "--model", "lenet5"])
    err = capsys.readouterr().err
    assert code == 2 and "for model 'mlp', not 'lenet5'" in err
    with pytest.raises(InfeasiblePlan, match="batch 8, not 16"):
        run_document(doc, expect={"batch": 16})
    assert not _workers() - before


@pytest.mark.parametrize("fn,args", [("gpt2", {"dropout": 0.0, "cache": False}), ("vit", {})])
def test_tofu_plans_of_today_s_models_match_one_device(fn, args):
    """A Hugging Face GPT-2 (attention masks from tril/where, tied embeddings) and a ViT (class
    token, nn.MultiheadAttention, GELU, LayerNorm) run under their Tofu plans on 2 workers."""
    from pathlib import Path
    if fn == "gpt2":
        pytest.importorskip("transformers")
    spec = f"{Path(__file__).with_name('_tofu_models.py')}:{fn}"
    r = run_document(tofu_doc(spec, 2, args), timeout_s=240)
    assert r["reference_ok"], r
    assert r["max_rel_error"] < 1e-10 and r["reference"]["params_compared"] > 0
    assert r["measured_comm_bytes"] == pytest.approx(r["predicted_comm_bytes"])

"""Tofu plans executed on 2 gloo CPU workers against one device (float64)."""

from __future__ import annotations

import json
import time

import pytest

from _helpers import explorer_cli, spawned_workers
from explorer.engine.runtime.launcher import RunFailed
from explorer.engine.runtime.opexec import run_tofu_plan


@pytest.mark.parametrize("spec,batch,args,algo", [
    ("mlp", 16, {"layers": 2, "hidden": 32}, "tofu"),
    ("mlp", 16, {"layers": 2, "hidden": 32}, "allrow-greedy"),
    ("lenet5", 8, {}, "tofu"),
    ("lenet5", 8, {}, "icml18"),
])
def test_tofu_plan_matches_one_device_and_moves_the_predicted_bytes(spec, batch, args, algo):
    r = run_tofu_plan(spec, batch, args, 2, algo=algo, timeout_s=120)
    assert r["reference_ok"], r
    assert r["max_rel_error"] < 1e-10
    # every byte the workers exchanged is one the plan's cost accounting predicted
    assert r["measured_comm_bytes"] == pytest.approx(r["predicted_comm_bytes"])
    assert r["predicted_comm_bytes"] > 0 and r["extra_bytes"] == 0


def test_a_small_resnet_with_batchnorm_and_residuals_runs_correctly():
    r = run_tofu_plan("wresnet", 2, {"depth": 50, "width": 1, "image_size": 32,
                                     "num_classes": 10}, 2, timeout_s=240)
    assert r["reference_ok"], r
    assert r["measured_comm_bytes"] == pytest.approx(r["predicted_comm_bytes"])


def _workers():
    return {c.pid for c in spawned_workers()}


def test_a_worker_that_raises_fails_the_run_quickly_without_orphans():
    before = _workers()
    with pytest.raises(RunFailed, match="worker 1.*injected fault") as failed:
        run_tofu_plan("mlp", 8, {"layers": 1, "hidden": 8}, 2, fault="raise", timeout_s=60)
    # the fault ended the run, not the clock (a timeout is "run timed out", rank None)
    assert failed.value.rank == 1 and "timed out" not in str(failed.value)
    time.sleep(0.5)
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
    # a plan for other model arguments is refused before launching
    doc = json.loads(plan.read_text())
    doc["model_args"] = {"hidden": "32"}
    plan.write_text(json.dumps(doc))
    out = explorer_cli("run", str(plan))
    assert out.returncode != 0 and "does not match" in out.stderr

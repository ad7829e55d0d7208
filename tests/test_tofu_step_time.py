"""The predicted step time of a Tofu run on this machine: after ``explorer calibrate`` every
operator is rehearsed at its shard boxes as the worker runs it (cached per operator call,
boxes and dtype in profile.sqlite); before it, the run says the prediction is an uncalibrated
roofline.  The timed steps compute in float32, the reference check in float64."""

from __future__ import annotations

import json

import numpy as np
import pytest

from explorer.engine.core import profile
from explorer.engine.core.devices import preset
from explorer.engine.core.geometry import ExecutionLayout
from explorer.engine.core.opgraph import build_opgraph
from explorer.engine.runtime.report import format_run
from explorer.engine.runtime.dispatch import run_document
from explorer.engine.runtime.shardtime import predict_step, shard_seconds
from explorer.engine.search import Problem, run as run_method

pytestmark = pytest.mark.multiprocess   # every test here starts worker processes

ARGS = {"layers": 4, "hidden": 128}


@pytest.fixture()
def calibrated(_isolated_home):
    """A calibration file as `explorer calibrate` writes it (the rates do not matter here:
    the shards are timed, not derived from them)."""
    (_isolated_home / "local.json").write_text(json.dumps(
        {"peak_flops": 50e9, "mem_bw": 10e9, "link_bw": 2e9, "latency": 2e-4, "devices": 2}))
    return _isolated_home


def _plan(k=2):
    g = build_opgraph("mlp", 32, ARGS)
    doc = run_method("tofu", Problem.of(g, preset("local", k))).document()
    return g, doc, ExecutionLayout.from_json(doc["layout"]).to_plan()


def test_every_worker_s_shards_are_timed_and_equal_layers_are_timed_once(calibrated):
    g, doc, xplan = _plan()
    names, t, ex, info = shard_seconds(g, xplan, "float32")
    assert names == list(g.ops) and t.shape == ex.shape == (len(g.ops), 2)
    mm = [i for i, n in enumerate(names) if g.ops[n].target in ("mm", "addmm")]
    assert mm and (t[mm] > 0).all()                 # every worker computes its matmul shards
    assert info["measured"] + info["cached"] < len(g.ops) * 2   # the 4 layers share keys
    assert ex.sum() > 0                             # a split step exchanges something
    again = shard_seconds(g, xplan, "float32")
    assert again[3]["measured"] == 0 and np.array_equal(again[1], t)   # all from the cache
    f64 = shard_seconds(g, xplan, "float64")        # another dtype is another key
    assert f64[3]["measured"] > 0
    profile.clear_shard_times()
    assert shard_seconds(g, xplan, "float32")[3]["measured"] == info["measured"]


def test_the_prediction_is_the_lockstep_sum_plus_links_plus_latency(calibrated):
    g, doc, xplan = _plan()
    _, t, ex, _ = shard_seconds(g, xplan, "float32")
    p = predict_step(g, xplan, comm_s=0.01, latency_s=1e-3)
    assert p["predicted_compute_step_s"] == pytest.approx(t.max(axis=1).sum())
    assert p["predicted_latency_s"] == pytest.approx(ex.max(axis=1).sum() * 1e-3)
    assert p["predicted_step_time_s"] == pytest.approx(
        p["predicted_compute_step_s"] + 0.01 + p["predicted_latency_s"])
    assert p["predicted_compute_s"] == pytest.approx(list(t.sum(axis=0)))
    assert max(p["predicted_compute_s"]) <= p["predicted_compute_step_s"] + 1e-12


def test_a_calibrated_run_predicts_from_rehearsed_shards_and_checks_in_float64(calibrated):
    _, doc, _ = _plan()
    r = run_document(doc, steps=3, verify=False, timeout_s=300)
    assert r["reference_ok"] and r["max_rel_error"] < 1e-10     # the float64 check pass
    assert r["timed_dtype"] == "float32"
    assert r["compute_source"].startswith("operator shards rehearsed")
    assert r["shard_timing"]["measured"] > 0
    assert r["predicted_step_time_s"] == pytest.approx(
        r["predicted_compute_step_s"] + r["predicted_comm_s"] + r["predicted_latency_s"])
    assert r["predicted_comm_s"] == pytest.approx(doc["objective_s"])   # same calibration
    assert len(r["cpu_step_s"]) == 2 and all(c > 0 for c in r["cpu_step_s"])
    assert not any("uncalibrated" in w for w in r["warnings"])
    text = format_run(r)
    assert "rehearsed" in text and "float32" in text
    again = run_document(doc, steps=1, verify=False, timeout_s=300)
    assert again["shard_timing"]["measured"] == 0           # the shards come from the cache


def test_an_uncalibrated_run_says_its_prediction_is_a_roofline():
    _, doc, _ = _plan()
    r = run_document(doc, steps=1, verify=False, timeout_s=300)
    assert r["reference_ok"]
    assert r["compute_source"].startswith("roofline")
    assert r["predicted_step_time_s"] == pytest.approx(doc["predicted_step_time_s"])
    assert any("uncalibrated roofline" in w and "explorer calibrate" in w
               for w in r["warnings"])
    assert "uncalibrated roofline" in format_run(r)


def test_the_timed_steps_can_be_float64():
    from explorer.engine.runtime.opexec import run_layout
    from explorer.engine.core.opgraph import opgraph_digest
    g, doc, xplan = _plan()
    r = run_layout("mlp", 32, ARGS, xplan, digest=opgraph_digest(g), steps=2, dtype="float64",
                   timeout_s=300)
    assert r["reference_ok"] and r["timed_dtype"] == "float64"
    from explorer.errors import InfeasiblePlan
    with pytest.raises(InfeasiblePlan, match="float32 or float64"):
        run_layout("mlp", 32, ARGS, xplan, digest=opgraph_digest(g), dtype="bfloat16")


def test_a_long_shard_is_timed_once_after_its_warm_up(calibrated, monkeypatch):
    """A shard whose timed run reaches ``LONG_S`` is not repeated (a model one worker cannot
    hold would spend its rehearsal repeating multi-second products); short ones are."""
    from explorer.engine.runtime import shardtime
    g, doc, xplan = _plan()
    calls = []
    real = shardtime._Rehearsal.run_op

    def counted(self, *a, **k):
        calls.append(a[1].name)
        return real(self, *a, **k)
    monkeypatch.setattr(shardtime._Rehearsal, "run_op", counted)
    mm = next(n for n, o in g.ops.items() if o.target == "mm")
    shardtime.shard_seconds(g, xplan, "float32")
    assert calls.count(mm) == 2 * (1 + 3)            # both workers: warm-up and 3 timed runs
    profile.clear_shard_times()
    calls.clear()
    monkeypatch.setattr(shardtime, "LONG_S", 0.0)     # every run counts as long
    names, t, _, _ = shardtime.shard_seconds(g, xplan, "float32")
    assert calls.count(mm) == 2 * (1 + 1)            # warm-up and one timed run
    assert t[names.index(mm)].min() > 0


def test_plans_of_one_model_share_its_float64_reference(monkeypatch):
    """The single-device reference of a model is computed once for its plans on several
    worker counts (same graph, seed, rate and steps); anything else computes its own."""
    from explorer.engine.runtime import opexec
    made = []
    monkeypatch.setattr(opexec, "_LAST_REF", [])
    monkeypatch.setattr(opexec, "_reference_steps",
                        lambda plan, seed, lr, steps, train: made.append(1) or (len(made),))
    plan = {"spec": "mlp", "batch": 32, "model_args": dict(ARGS), "digest": "d1"}
    assert opexec._reference(plan, 0, 0.01, 3, True) == (1,)
    assert opexec._reference(dict(plan), 0, 0.01, 3, True) == (1,) and len(made) == 1
    assert opexec._reference(plan, 0, 0.01, 2, True) == (2,)            # other steps
    assert opexec._reference({**plan, "digest": "d2"}, 0, 0.01, 2, True) == (3,)   # model code
    assert opexec._reference({**plan, "digest": "d2"}, 1, 0.01, 2, True) == (4,)   # seed
    assert opexec._reference({**plan, "digest": "d2"}, 1, 0.01, 5, False) == (5,)  # one step
    assert opexec._reference({**plan, "digest": "d2"}, 1, 0.01, 1, False) == (5,)


def test_changed_runtime_code_is_rehearsed_afresh(calibrated, monkeypatch):
    """Cached shard times belong to the code that ran them: another digest of the tile rules
    (an upgrade that tiles an operator which fell back to full buffers) misses the cache."""
    from explorer.engine.runtime import shardtime
    g, doc, xplan = _plan()
    first = shard_seconds(g, xplan, "float32")[3]
    assert shard_seconds(g, xplan, "float32")[3]["measured"] == 0
    monkeypatch.setattr(shardtime, "_code", lambda: "another version of tiles.py")
    assert shard_seconds(g, xplan, "float32")[3]["measured"] == first["measured"]

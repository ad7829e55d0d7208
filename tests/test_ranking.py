"""The ranking check (explorer/service/ranking.py, `explorer rank`): Kendall's τ and regret by
hand, bad input in one line, and a real ranking of a tiny model's plans on 2 workers."""

import json
import subprocess
import sys

import pytest

from explorer.service.ranking import kendall_tau, regret


def test_kendall_tau_by_hand():
    assert kendall_tau([1, 2, 3], [10, 20, 30]) == pytest.approx(1.0)
    assert kendall_tau([1, 2, 3], [30, 20, 10]) == pytest.approx(-1.0)
    # one discordant pair of three: (2 - 1) / 3
    assert kendall_tau([1, 2, 3], [10, 30, 20]) == pytest.approx(1 / 3)
    assert kendall_tau([1], [2]) is None


def test_regret_is_the_predicted_best_against_the_measured_best():
    """Predicted fastest is plan 0, which measured 12 against the best 10: 20 % regret."""
    assert regret([1.0, 2.0, 3.0], [12.0, 10.0, 15.0]) == pytest.approx(0.2)
    assert regret([1.0, 2.0], [5.0, 6.0]) == 0.0


def _explorer(*args):
    return subprocess.run([sys.executable, "-m", "explorer", *args], capture_output=True,
                          text=True)


@pytest.mark.multiprocess
@pytest.mark.parametrize("args,words", [
    (["--preset", "p100-cluster"], "needs --preset local"),
    (["--methods", "data,nosuch"], "unknown method(s) nosuch"),
    (["--rounds", "0"], "rounds (0)"),
    (["--devices", "100000", "--methods", "data"], "no method could plan lenet5"),
])
def test_bad_input_is_one_line(args, words):
    got = _explorer("rank", "lenet5", "--batch", "8", *args)
    assert got.returncode == 2 and words in got.stderr, got.stderr
    said = [ln for ln in got.stderr.strip().splitlines() if not ln.endswith(" ...")]  # progress
    assert len(said) == 1 and said[0].startswith("error: ") and "Traceback" not in got.stderr


@pytest.mark.multiprocess
def test_a_ranking_runs_every_plan_and_compares_the_orders():
    got = _explorer("rank", "lenet5", "--batch", "8", "--methods", "data,optcnn,celeritas",
                    "--rounds", "2", "--steps", "2", "--warmup", "1", "--json")
    assert got.returncode == 0, got.stderr
    rep = json.loads(got.stdout)
    rows = rep["rows"]
    assert [r["method"] for r in rows] == ["data", "optcnn", "celeritas"]
    for r in rows:
        assert "failed" not in r, r
        assert len(r["rounds_s"]) == 2 and r["reference_ok"] is True
        assert r["measured_min_s"] <= r["measured_step_s"] and r["predicted_step_s"] > 0
        assert len(r["noise"]) == 2 and "steal" in r["noise"][0]
    assert sorted(r["predicted_rank"] for r in rows) == [1, 2, 3]
    assert sorted(r["measured_rank"] for r in rows) == [1, 2, 3]
    pred = [r["predicted_step_s"] for r in rows]
    meas = [r["measured_step_s"] for r in rows]
    assert rep["kendall_tau"] == pytest.approx(kendall_tau(pred, meas))
    assert rep["regret"] == pytest.approx(regret(pred, meas)) and rep["regret"] >= 0
    assert (rep["noise_note"] is None) == (not rep["noisy"])


@pytest.mark.multiprocess
def test_a_tofu_search_with_measured_costs_predicts_what_its_run_predicts():
    """With ``--cost measured`` every family predicts from this machine's operator times: a
    Tofu result's step is its shards timed here plus its exchanges - the figure its run
    reports - not the search's roofline (which put Tofu first in rankings it ran last in)."""
    from explorer import service
    from explorer.engine.runtime.calibrate import calibrate
    from explorer.engine.runtime.dispatch import run_document
    from explorer.service.ranking import basis
    calibrate(2, quick=True)
    req = service.Request(model="mlp", batch=8, preset="local", devices=2, algo="tofu",
                          cost="measured", model_args={"layers": 2, "hidden": 32})
    res = service.result(req, "tofu")
    assert res.info["prediction"].startswith("operator shards rehearsed on this machine")
    assert res.info["roofline_step_s"] > 0 and basis(res) == "shards timed here + exchanges"
    out = run_document(res.document(), steps=1, warmup=0)
    assert out["predicted_step_time_s"] == pytest.approx(res.predicted_step_time_s, rel=1e-6)
    roof = service.result(req.replace(cost="analytic"), "tofu")
    assert "roofline_step_s" not in roof.info and basis(roof) == "links + slowest compute"

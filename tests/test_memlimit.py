"""``explorer run PLAN --memory-per-worker GiB``: refused before launch when the plan's
predicted per-worker peak is over it; stopped, with no worker left, when a worker goes over."""

from __future__ import annotations

import os

import psutil
import pytest

from _helpers import explorer_cli
from explorer.engine.core.opgraph import build_opgraph
from explorer.engine.runtime.launcher import RunFailed
from explorer.engine.runtime.memlimit import GiB, MemoryGuard, check_predicted, parse_gib
from explorer.engine.runtime.dispatch import run_document
from explorer.engine.search import Problem, run as run_method
from explorer.engine.core.devices import preset
from explorer.engine.core.plandoc import dumps
from explorer.errors import InfeasiblePlan

pytestmark = pytest.mark.multiprocess   # every test here starts worker processes


@pytest.fixture(scope="module")
def doc():
    g = build_opgraph("mlp", 16, {"layers": 2, "hidden": 64})
    return run_method("tofu", Problem.of(g, preset("local", 2))).document()


def _gone(pids):
    for p in pids:
        try:
            if psutil.Process(p).status() != psutil.STATUS_ZOMBIE:
                return False
        except psutil.NoSuchProcess:
            pass
    return True


def test_limits_are_checked_and_parsed(doc):
    peak = max(doc["peak_memory_bytes"])
    check_predicted(doc, peak)                              # exactly at the peak: runs
    with pytest.raises(InfeasiblePlan, match=r"predicted peak.*over --memory-per-worker"):
        check_predicted(doc, peak - 1)
    with pytest.raises(InfeasiblePlan, match="predicts no per-worker memory"):
        check_predicted({"schema": "x"}, 1e9)
    assert parse_gib("0.5") == 0.5 * GiB and parse_gib(None) is None
    for bad in ("0", "-1", "nan", "inf", "lots"):
        with pytest.raises(InfeasiblePlan, match="--memory-per-worker"):
            parse_gib(bad)


def test_a_plan_predicted_over_the_limit_never_starts_a_worker(doc):
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    with pytest.raises(InfeasiblePlan, match="over --memory-per-worker"):
        run_document(doc, memory_per_worker=max(doc["peak_memory_bytes"]) / 2, verify=False)
    after = {p.pid for p in psutil.Process().children(recursive=True)}
    assert after <= before
    with pytest.raises(InfeasiblePlan, match="Tofu plans and placements"):
        run_document({**doc, "schema": "plan-explorer/layerwise"}, memory_per_worker=1e9,
                     verify=False)


def test_a_worker_over_the_limit_stops_the_run_and_leaves_no_process(doc, monkeypatch):
    # the plan fits 64 MiB; rank 1 then allocates 256 MiB more in its first step
    monkeypatch.setenv("EXPLORER_RUNTIME_FAULT", "1:1:alloc")
    with pytest.raises(RunFailed, match=r"rank 1 failed: its steps allocated 0\.0[6-9]\d* GiB, "
                                        r"over --memory-per-worker 0\.0625 GiB; the run was "
                                        r"stopped") as err:
        run_document(doc, memory_per_worker=64 * 1024 ** 2, verify=False, timeout_s=120)
    assert len(err.value.pids) == 2 and _gone(err.value.pids)
    assert "\n" not in str(err.value)


def test_a_run_within_the_limit_checks_against_one_device(doc):
    res = run_document(doc, memory_per_worker=1 * GiB, verify=False, timeout_s=120)
    assert res["reference_ok"] is True
    assert res["memory_per_worker_bytes"] == GiB
    assert _gone(res["pids"])


def test_one_allocation_past_the_limit_fails_and_says_why():
    """RLIMIT_DATA catches a burst the watchdog would only see afterwards; disarming (after
    the last step, before the result is gathered) lifts it."""
    import subprocess
    import sys
    code = (
        "import torch\n"
        "from explorer.engine.runtime.memlimit import MemoryGuard\n"
        "g = MemoryGuard(32 * 1024 ** 2, 0, print, interval_s=60)\n"
        "g.arm()\n"
        "try:\n"
        "    x = torch.ones(64 * 1024 ** 2, dtype=torch.float64)\n"
        "    print('allocated')\n"
        "except BaseException as exc:\n"
        "    print('refused:', g.translate(exc))\n"
        "g.disarm()\n"
        "x = torch.ones(64 * 1024 ** 2, dtype=torch.float64)\n"
        "print('after disarm: allocated')\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=120)
    assert "refused: an allocation was refused, over --memory-per-worker 0.0312 GiB" in \
        r.stdout, (r.stdout, r.stderr)
    assert "after disarm: allocated" in r.stdout        # the steps are over: no limit


def test_the_watchdog_sees_growth_beyond_its_baseline():
    said = []
    guard = MemoryGuard(32 * 1024 ** 2, 0, said.append)
    assert guard.used() == 0                                # not armed: nothing measured
    guard.base = 0                                          # as if it had started empty
    assert guard.used() > 0
    assert "over --memory-per-worker 0.0312 GiB" in guard.message(guard.used())
    assert guard.translate(MemoryError()) is not None
    assert guard.translate(ValueError("shape")) is None


def test_cli_refuses_in_one_line_with_exit_2(doc, tmp_path):
    path = tmp_path / "t.json"
    path.write_text(dumps(doc))
    r = explorer_cli("run", path, "--memory-per-worker", "0.000001")
    assert r.returncode == 2, r.stderr
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and "over --memory-per-worker" in lines[0], r.stderr
    r = explorer_cli("run", path, "--memory-per-worker", "-3")
    assert r.returncode == 2 and "positive" in r.stderr and "Traceback" not in r.stderr


def test_cli_stops_a_run_over_the_limit_with_exit_2(doc, tmp_path):
    path = tmp_path / "t.json"
    path.write_text(dumps(doc))
    env_before = os.environ.get("EXPLORER_RUNTIME_FAULT")
    os.environ["EXPLORER_RUNTIME_FAULT"] = "0:1:alloc"
    try:
        r = explorer_cli("run", path, "--memory-per-worker", "0.0625", "--timeout", "120")
    finally:
        if env_before is None:
            os.environ.pop("EXPLORER_RUNTIME_FAULT")
        else:
            os.environ["EXPLORER_RUNTIME_FAULT"] = env_before
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "over --memory-per-worker 0.0625 GiB" in r.stderr and "Traceback" not in r.stderr


def test_a_placement_is_checked_against_the_limit_too():
    g = build_opgraph("mlp", 16, {"layers": 2, "hidden": 64})
    doc = run_method("m-topo", Problem.of(g, preset("local", 2))).document()
    with pytest.raises(InfeasiblePlan, match="over --memory-per-worker"):
        run_document(doc, memory_per_worker=max(doc["peak_memory_bytes"]) / 2, verify=False)


def test_a_model_over_one_worker_s_limit_trains_across_2_and_4_workers_under_it():
    """The limit is below the step's peak on one worker: that plan is refused before launch,
    while the same step split over 2 and then 4 workers trains three steps with every worker
    under the runtime limit (watched while it runs) and matches the float64 reference."""
    g = build_opgraph("mlp", 256, {"layers": 3, "hidden": 2048})
    one = run_method("tofu", Problem.of(g, preset("local", 1))).document()
    limit = 0.8 * max(one["peak_memory_bytes"])          # 117 MiB; 2 workers allocate ~100
    with pytest.raises(InfeasiblePlan, match="over --memory-per-worker"):
        run_document(one, memory_per_worker=limit, verify=False)
    for k in (2, 4):
        d = run_method("tofu", Problem.of(g, preset("local", k))).document()
        assert max(d["peak_memory_bytes"]) < limit
        res = run_document(d, steps=3, train=True, memory_per_worker=limit, verify=False,
                           timeout_s=300)
        assert res["reference_ok"] is True and res["train"], res["max_rel_error"]
        assert res["max_rel_error"] < 1e-10
        assert len(res["measured_peak_memory_bytes"]) == k
        assert max(res["measured_peak_memory_bytes"]) < limit
        assert res["memory_per_worker_bytes"] == limit and _gone(res["pids"])

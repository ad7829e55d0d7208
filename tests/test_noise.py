"""How noisy a measurement was (explorer/engine/runtime/noise.py): /proc/stat's steal, the
canary, the steps' spread and the one-line verdict; runs and calibrations carry it."""

import pytest

from explorer.engine.runtime import noise

STAT_A = ("cpu  1000 0 500 8000 100 0 0 400 0 0\n"
          "cpu0 500 0 250 4000 50 0 0 200 0 0\nintr 1 2 3\n")
STAT_B = ("cpu  1600 0 700 8400 100 0 0 1200 50 0\n"
          "cpu0 800 0 350 4200 50 0 0 600 0 0\n")


def test_cpu_times_read_the_all_cpu_line_and_its_steal_column():
    assert noise.cpu_times(STAT_A) == (10000.0, 400.0)
    assert noise.cpu_times("cpu0 1 2 3\n") is None            # no all-CPU line
    assert noise.cpu_times("cpu  1 2 3 4\n") is None          # an old kernel: no steal column


def test_steal_is_the_stolen_share_of_the_cpu_time_between_two_readings():
    """Between A and B: 600 + 200 + 400 + 800 = 2,000 jiffies, 800 of them stolen: 40 %
    (the guest column is inside user time and not counted again)."""
    a, b = noise.cpu_times(STAT_A), noise.cpu_times(STAT_B)
    assert noise.steal_between(a, b) == pytest.approx(0.4)
    assert noise.steal_between(a, a) == 0.0
    assert noise.steal_between(None, b) is None


def test_spread_of_the_steps():
    s = noise.spread([0.10, 0.20, 0.12, 0.11, 0.13])
    assert s["median_s"] == 0.12 and s["min_s"] == 0.10 and s["max_s"] == 0.20
    assert s["iqr_rel"] == pytest.approx((0.13 - 0.11) / 0.12)
    assert noise.spread([])["median_s"] is None


@pytest.mark.parametrize("case,words", [
    ({"steal": 0.06, "canary_change": 0.0, "spread": {"iqr_rel": 0.0}}, ["6 %", "steal"]),
    ({"steal": 0.0, "canary_change": 0.15, "spread": {"iqr_rel": 0.0}}, ["15 %", "slower"]),
    ({"steal": 0.0, "canary_change": -0.2, "spread": {"iqr_rel": 0.0}}, ["20 %", "faster"]),
    ({"steal": None, "canary_change": 0.0, "spread": {"iqr_rel": 0.3}}, ["30 %", "varied"]),
])
def test_each_threshold_makes_a_one_line_verdict(case, words):
    line = noise.verdict(case)
    assert line.startswith("noisy timing:") and "\n" not in line
    assert all(w in line for w in words), line


def test_a_quiet_measurement_has_no_verdict():
    quiet = {"steal": 0.049, "canary_change": 0.09, "spread": {"iqr_rel": 0.24}}
    assert noise.verdict(quiet) is None and noise.verdict(None) is None


def test_the_monitor_reports_every_figure(monkeypatch):
    readings = iter([(1000.0, 10.0), (2000.0, 310.0)])
    monkeypatch.setattr(noise, "cpu_times", lambda stat=None: next(readings))
    canaries = iter([0.001, 0.0013])
    monkeypatch.setattr(noise, "canary", lambda repeats=9: next(canaries))
    with noise.Monitor() as m:
        pass
    r = m.report([0.1, 0.1, 0.1])
    assert r["steal"] == pytest.approx(0.3) and r["canary_change"] == pytest.approx(0.3)
    assert r["noisy"] and "30 % of the CPU" in r["note"] and "30 % slower" in r["note"]


@pytest.mark.multiprocess
def test_a_run_reports_its_noise_in_json_and_text(tmp_path):
    import json
    import subprocess
    import sys
    plan = tmp_path / "p.json"
    run = [sys.executable, "-m", "explorer"]
    subprocess.run(run + ["search", "lenet5", "--batch", "8", "--devices", "2", "--preset",
                          "local", "--out", str(plan)], check=True, capture_output=True)
    got = subprocess.run(run + ["run", str(plan), "--steps", "3", "--json"], check=True,
                         capture_output=True, text=True)
    nz = json.loads(got.stdout)["noise"]
    assert set(nz) >= {"steal", "canary_before_s", "canary_after_s", "spread", "noisy", "note"}
    assert nz["spread"]["steps"] == 3 and nz["canary_before_s"] > 0
    text = subprocess.run(run + ["run", str(plan), "--steps", "3"], check=True,
                          capture_output=True, text=True).stdout
    assert "noise: steps: median" in text

"""One comparison across the families (explorer/service/ranking.py `compare_all`,
`explorer compare`): every family's methods on one request in one table, fastest predicted
first, each row's numbers the method's own result, a stored run's measurement beside its
prediction, and bad input in one line."""

import subprocess
import sys

import pytest

from explorer import service
from explorer.engine.runtime.store import RunStore, run_key
from explorer.service.ranking import all_methods, compare_all

REQ = service.Request(model="mlp", batch=8, model_args={"hidden": 16, "layers": 1},
                      preset="p100-cluster", devices=2)
METHODS = ["data", "optcnn", "tofu", "equalchop", "celeritas", "m-etf"]


def test_every_family_s_comparison_is_in_the_default_list():
    got = all_methods()
    for m in ("data", "model", "owt", "optcnn", "tofu", "icml18", "celeritas", "m-sct", "metis"):
        assert m in got
    assert len(got) == len(set(got))


def test_rows_are_each_method_s_own_result_fastest_predicted_first():
    rep = compare_all(REQ, METHODS)
    rows = rep["rows"]
    assert [r["method"] for r in rows] != METHODS or len({r["predicted_step_s"] for r in rows}) == 1
    assert sorted(r["method"] for r in rows) == sorted(METHODS)
    assert {r["family"] for r in rows} == {"layerwise", "tofu", "placement"}
    steps = [r["predicted_step_s"] for r in rows]
    assert steps == sorted(steps)                     # every plan fits this small model
    for row in rows:
        res = service.result(REQ.replace(algo=row["method"]), row["method"])
        assert row["predicted_step_s"] == pytest.approx(res.predicted_step_time_s)
        assert row["peak_bytes"] == pytest.approx(max(res.memory_per_device_bytes))
        assert row["comm_bytes"] == pytest.approx(res.comm_bytes)
        assert row["measured_step_s"] is None         # nothing has run in this home
    assert rep["best"] == rows[0]["method"]
    assert rep["request"]["batch"] == 8


def test_a_stored_run_s_measurement_stands_beside_its_prediction():
    res = service.result(REQ.replace(algo="data"), "data")
    RunStore().add(run_key(res.document()), {"model": "mlp", "algo": "data", "devices": 2,
                                             "predicted_step_time_s": res.predicted_step_time_s,
                                             "measured_step_time_s": 0.5, "reference_ok": True})
    rows = {r["method"]: r for r in compare_all(REQ, ["data", "tofu"])["rows"]}
    assert rows["data"]["measured_step_s"] == pytest.approx(0.5)
    assert rows["data"]["error"] == pytest.approx((res.predicted_step_time_s - 0.5) / 0.5)
    assert rows["data"]["reference"] == "ok"
    assert rows["tofu"]["measured_step_s"] is None


def test_a_method_that_cannot_plan_is_a_row_with_its_reason_last():
    # data parallelism cannot split a batch of 8 over 3 devices: refused, not dropped
    rep = compare_all(REQ.replace(devices=3), ["data", "optcnn"])
    assert rep["rows"][0]["method"] == "optcnn"
    failed = rep["rows"][-1]
    assert failed["method"] == "data" and "batch divisible by 3" in failed["failed"]


def test_unknown_methods_are_named():
    with pytest.raises(ValueError, match="unknown method.*nosuch"):
        compare_all(REQ, ["data", "nosuch"])


@pytest.mark.multiprocess
@pytest.mark.parametrize("args,words", [
    (["--methods", "data,nosuch"], "unknown method(s) nosuch"),
    (["--devices", "0"], "--devices must be ≥ 1"),
    (["--preset", "nosuchpreset"], "nosuchpreset"),
])
def test_cli_bad_input_is_one_line(args, words):
    got = subprocess.run([sys.executable, "-m", "explorer", "compare", "mlp", "-b", "8", *args],
                         capture_output=True, text=True)
    assert got.returncode == 2, got.stderr
    assert words in got.stderr and "Traceback" not in got.stderr
    assert len(got.stderr.strip().splitlines()) == 1, got.stderr


@pytest.mark.multiprocess
def test_cli_prints_one_table_across_the_families():
    got = subprocess.run([sys.executable, "-m", "explorer", "compare", "mlp", "-b", "8",
                          "-a", "hidden=16", "-a", "layers=1", "-n", "2",
                          "--methods", "data,tofu,celeritas"], capture_output=True, text=True)
    assert got.returncode == 0, got.stderr
    lines = got.stdout.splitlines()
    assert "every method's predicted step" in lines[0]
    body = [line.split()[0] for line in lines[2:5]]
    assert sorted(body) == ["celeritas", "data", "tofu"]
    assert "fastest predicted that fits:" in got.stdout


def test_stored_runs_are_found_without_sealing_the_plans(monkeypatch):
    # compare_all looks each row's run up by the plan's run key, not its sealed file: a Tofu
    # file's execution layout (seconds on a large model) is no part of any run key
    from explorer.engine.search.result import Result
    docs = {m: service.result(REQ.replace(algo=m), m).document()
            for m in ("data", "tofu", "celeritas")}
    for i, (m, doc) in enumerate(docs.items()):
        RunStore().add(run_key(doc), {"model": "mlp", "algo": m, "devices": 2,
                                      "preset": "p100-cluster",
                                      "predicted_step_time_s": doc["predicted_step_time_s"],
                                      "measured_step_time_s": 0.25 + i})

    def sealed(self):
        raise AssertionError("compare_all sealed a plan document")
    monkeypatch.setattr(Result, "document", sealed)
    rows = {r["method"]: r for r in compare_all(REQ, list(docs))["rows"]}
    assert [rows[m]["measured_step_s"] for m in docs] == pytest.approx([0.25, 1.25, 2.25])


def test_remeasure_reads_runs_stored_since_without_searching(monkeypatch):
    rep = compare_all(REQ, ["data", "tofu"])
    assert all(r["measured_step_s"] is None for r in rep["rows"])
    doc = service.result(REQ.replace(algo="tofu"), "tofu").document()
    RunStore().add(run_key(doc), {"model": "mlp", "algo": "tofu", "devices": 2,
                                  "preset": "p100-cluster",
                                  "predicted_step_time_s": doc["predicted_step_time_s"],
                                  "measured_step_time_s": 0.5, "reference_ok": True})

    def searched(*_a, **_k):
        raise AssertionError("remeasure searched again")
    monkeypatch.setattr("explorer.service.ranking.result", searched)
    again = service.remeasure(rep)
    rows = {r["method"]: r for r in again["rows"]}
    assert rows["tofu"]["measured_step_s"] == pytest.approx(0.5)
    assert rows["tofu"]["reference"] == "ok" and rows["tofu"]["error"] is not None
    assert rows["data"]["measured_step_s"] is None and "error" not in rows["data"]
    assert [r["method"] for r in again["rows"]] == [r["method"] for r in rep["rows"]]
    assert rep["rows"][1]["measured_step_s"] is None          # the report itself is kept

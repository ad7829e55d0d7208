"""The Tofu page's run (measured against predicted memory per worker and step time) and Tofu
plans in the plan history - the plain functions behind the callbacks."""

from __future__ import annotations

import pytest

from explorer import service
from explorer.engine.core.history import PlanStore, digest
from explorer.views import plans, tofu as tofu_view
from explorer.views.figures import tofu as F

pytestmark = pytest.mark.multiprocess   # every test here starts worker processes


@pytest.fixture(scope="module")
def doc():
    req = service.Request(model="mlp", preset="local", devices=2, batch=16,
                          model_args={"layers": "2", "hidden": "64"}, algo="tofu")
    return service.tofu(req, "tofu")


def test_memory_figure_shows_predicted_and_measured_when_reported(doc):
    fig = F.run_memory_figure(None, doc)
    assert [t.name for t in fig.data] == ["predicted peak"]
    assert "no per-worker measurement" in fig.layout.title.text
    res = {"measured_peak_memory_bytes": [2 ** 20, 3 * 2 ** 20], "memory_per_worker_bytes": 2 ** 30}
    fig = F.run_memory_figure(res, doc)
    assert [t.name for t in fig.data] == ["predicted peak", "measured peak"]
    assert list(fig.data[1].y) == pytest.approx([2 ** 20 / 2 ** 30, 3 * 2 ** 20 / 2 ** 30])
    assert F.measured_peaks({"measured_peak_memory_bytes": {"1": 5, "0": 4}}) == [4.0, 5.0]


def test_step_time_prefers_the_runtime_s_prediction(doc):
    assert F.predicted_step(None, doc) == (doc["predicted_step_time_s"], "links only")
    res = {"predicted_step_time_s": 0.5, "measured_step_time_s": 0.25}
    assert F.predicted_step(res, doc) == (0.5, "compute + links")
    fig = F.run_time_figure(res, doc)
    assert list(fig.data[0].y) == [500.0, 250.0]


def test_run_view_is_only_for_the_shown_plan(doc):
    res = {"reference_ok": True, "max_rel_error": 1e-12, "measured_comm_bytes": 10.0,
           "measured_step_time_s": 0.01, "workers": 2, "tofu_id": tofu_view.tofu_id(doc)}
    text = str(tofu_view.run_view(res, doc))
    assert "passed" in text and "predicted peak" in text and "measured 10.00 ms" in text
    other = dict(doc, algo="equalchop")
    assert "Run the shown plan" in str(tofu_view.run_view(res, other))


def test_a_tofu_plan_is_kept_in_the_history_and_loads_back(doc, tmp_path):
    store = PlanStore(tmp_path / "plans.sqlite")
    pid, msg = plans.autosave(doc, store, "tofu")
    assert pid is not None and "saved as plan" in msg
    again = dict(doc, steps=[dict(s, search_time_s=9.0) for s in doc["steps"]])
    assert digest(again) == digest(doc)               # timings are not part of the plan
    assert plans.autosave(again, store, "tofu")[0] == pid
    row = plans.table_rows(store)[0]
    assert row["algo"] == "tofu" and row["devices"] == 2
    plan, request, pins = plans.load_plan(store, pid)
    assert plan["history_id"] == pid and plan["algo"] == "tofu" and pins == []
    assert request["model"] == "mlp" and request["devices"] == 2
    out = plans.loaded_outputs("tofu", plan, request)
    assert out["tab"] == "tofu" and out["tofu"]["factors"] == doc["factors"]
    assert plans.autosave(plan, store, "tofu") == (None, None)   # loaded: not saved again


def test_run_tofu_refuses_without_a_plan():
    from explorer.errors import ExplorerError
    with pytest.raises(ExplorerError, match="partition the model first"):
        service.run_tofu({"algo": "tofu"})


def test_runs_of_a_plan_for_another_preset_or_pins_are_not_shown(doc, tmp_path, monkeypatch):
    """The run store keys a Tofu plan by everything that makes it another plan: a run made
    for one device preset (or other pins) is not this plan's run."""
    from explorer.engine.runtime.store import RunStore, run_key
    monkeypatch.setenv("EXPLORER_HOME", str(tmp_path))
    req = service.Request.from_dict(dict(doc["request"], preset="p100-nvlink-4"))
    other = service.tofu(req, "tofu")
    assert (other["model"], other["devices"], other["opgraph_digest"]) == \
        (doc["model"], doc["devices"], doc["opgraph_digest"])
    RunStore().add(run_key(service.plan_file(other)), {"measured_step_time_s": 0.01})
    assert len(service.runs(other)) == 1            # the app's plan and its file share a key
    assert service.runs(doc) == []
    assert digest(run_key(doc)) != digest(run_key(dict(doc, pins=["op:split 0"])))
    assert digest(run_key(doc)) != digest(run_key(dict(doc, algo="data-parallel")))


def test_placement_runs_are_keyed_by_preset_and_device_count():
    """Two placements with the same operator map but another preset or device count are
    different plans to the run store (their predictions differ)."""
    from explorer.engine.runtime.store import run_key
    doc = {"schema": "plan-explorer/placement", "model": "lenet5", "batch": 8, "model_args": {},
           "algo": "celeritas", "preset": "local", "devices": 2, "placement": {"a": 0, "b": 1}}
    assert digest(run_key(doc)) == digest(run_key(dict(doc)))
    assert digest(run_key(doc)) != digest(run_key(dict(doc, preset="p100-nvlink-4")))
    assert digest(run_key(doc)) != digest(run_key(dict(doc, devices=4)))

"""PlanStore: SQLite history of plans (save / list / get / delete, survives restarts)."""

import time

import pytest

from explorer.engine.core.history import PlanStore, digest


def _plan(model="lenet5", algo="optcnn", objective=0.002, pins=(), **extra):
    doc = {"schema": "plan-explorer/plan@1", "model": model, "spec": model, "batch": 16,
           "model_args": {}, "algo": algo, "preset": "p100-cluster", "devices": 4,
           "objective_s": objective, "predicted_step_time_s": objective,
           "search_time_s": 0.01, "breakdown": {"compute_s": objective, "transfer_s": 0.0,
                                                 "sync_s": 0.0, "total_s": objective},
           "comm_bytes": 0.0, "info": {}, "pins": list(pins),
           "layers": [{"name": "conv1", "op": "conv2d", "config": {"n": 4, "c": 1},
                       "devices": [0, 1, 2, 3]}]}
    doc.update(extra)
    return doc


def test_round_trip(tmp_path):
    store = PlanStore(tmp_path / "plans.sqlite")
    plan = _plan(pins=["conv1=n=2@0,1"], trace=[{"step": 1}])
    pid = store.save(plan, note="first")
    assert isinstance(pid, int)
    assert store.get(pid) == plan
    (row,) = store.list()
    assert row["id"] == pid and row["model"] == "lenet5" and row["algo"] == "optcnn"
    assert row["preset"] == "p100-cluster" and row["devices"] == 4 and row["batch"] == 16
    assert row["objective_ms"] == pytest.approx(2.0)
    assert row["pins"] == ["conv1=n=2@0,1"] and row["note"] == "first"
    assert "T" in row["time"]  # ISO 8601
    store.delete(pid)
    assert store.list() == [] and len(store) == 0
    with pytest.raises(KeyError):
        store.delete(pid)


def test_history_id_not_stored(tmp_path):
    store = PlanStore(tmp_path / "p.sqlite")
    pid = store.save(dict(_plan(), history_id=99))
    assert "history_id" not in store.get(pid)


def test_persists_across_instances(tmp_path):
    path = tmp_path / "plans.sqlite"
    pid = PlanStore(path).save(_plan(model="vgg16"))
    again = PlanStore(path)  # "restart"
    assert again.get(pid)["model"] == "vgg16"
    assert [r["id"] for r in again.list()] == [pid]


def test_missing_id(tmp_path):
    store = PlanStore(tmp_path / "p.sqlite")
    with pytest.raises(KeyError, match="no saved plan with id 42"):
        store.get(42)
    with pytest.raises(KeyError, match="integer"):
        store.get("abc")


def test_newest_first_and_limit(tmp_path):
    store = PlanStore(tmp_path / "p.sqlite")
    ids = []
    for algo in ("data", "model", "owt"):
        ids.append(store.save(_plan(algo=algo)))
        time.sleep(0.002)
    rows = store.list()
    assert [r["id"] for r in rows] == ids[::-1]
    assert [r["algo"] for r in rows] == ["owt", "model", "data"]
    assert [r["id"] for r in store.list(limit=2)] == ids[:0:-1]


def test_default_path_uses_explorer_home(tmp_path, monkeypatch):
    home = tmp_path / "home" / "explorer"
    monkeypatch.setenv("EXPLORER_HOME", str(home))
    store = PlanStore()
    assert store.path == home / "plans.sqlite" and store.path.exists()


def test_find_identical(tmp_path):
    store = PlanStore(tmp_path / "p.sqlite")
    pid = store.save(_plan())
    # timings, trace and app bookkeeping do not change a plan's identity
    assert store.find(dict(_plan(), search_time_s=9.0, trace=[1], history_id=3)) == pid
    assert store.find(_plan(objective=0.5)) is None
    assert digest(_plan()) != digest(_plan(pins=["conv1=n=4"]))


def test_rejects_error_dict(tmp_path):
    with pytest.raises(ValueError):
        PlanStore(tmp_path / "p.sqlite").save({"error": "infeasible"})


def test_save_new_deduplicates(tmp_path):
    store = PlanStore(tmp_path / "p.sqlite")
    pid, created = store.save_new(_plan())
    assert created
    assert store.save_new(dict(_plan(), search_time_s=5.0)) == (pid, False)
    pid2, created2 = store.save_new(_plan(algo="data"))
    assert created2 and pid2 != pid and len(store) == 2

"""What a run is stored under (:mod:`explorer.engine.runtime.store`): a Tofu plan's key tells
custom clusters that differ only in their links apart, and runs stored under the key's earlier
formats still show for their plan through the app's :func:`explorer.service.runs`."""

from __future__ import annotations

import pytest

from explorer import service
from explorer.engine.core.history import digest
from explorer.engine.runtime.store import RunStore, run_key


def _cluster(inter_bw: float) -> dict:
    """Four devices on two nodes; only the inter-node bandwidth varies."""
    dev = {"kind": "gpu", "peak_flops": 10e12, "mem_bw": 500e9, "memory": 16e9}
    return {"name": "two-nodes", "intra_node_bw": 100e9, "inter_node_bw": inter_bw,
            "latency": 5e-6,
            "devices": [dict(dev, name=f"g{i}", node=i // 2) for i in range(4)]}


def _tofu(cluster: dict) -> dict:
    req = service.Request(model="mlp", preset="custom", devices=4, batch=16,
                          model_args={"layers": "2", "hidden": "64"}, algo="tofu",
                          cluster=cluster)
    return service.tofu(req, "tofu")


@pytest.fixture(scope="module")
def doc():
    req = service.Request(model="mlp", preset="local", devices=2, batch=16,
                          model_args={"layers": "2", "hidden": "64"}, algo="tofu")
    return service.tofu(req, "tofu")


def test_custom_clusters_differing_in_one_bandwidth_have_different_run_keys():
    slow, fast, slow_again = _tofu(_cluster(10e9)), _tofu(_cluster(25e9)), _tofu(_cluster(10e9))
    # the same partition, capacities and everything else: only the links differ
    assert slow["factors"] == fast["factors"] and slow["levels"] == fast["levels"]
    assert slow["info"]["capacity_bytes"] == fast["info"]["capacity_bytes"]
    assert digest(run_key(slow)) != digest(run_key(fast))
    assert digest(run_key(slow)) == digest(run_key(slow_again))
    # the app's plan and its saved file share the key
    assert digest(run_key(service.plan_file(slow))) == digest(run_key(slow))
    # a latency is a link parameter too
    lat = _tofu(dict(_cluster(10e9), latency=6e-6))
    assert digest(run_key(lat)) != digest(run_key(slow))


def _first_format(doc):
    """A Tofu plan's key as the run store wrote it first (literal, not the store's helper)."""
    return {"kind": "tofu", "model": doc["model"], "batch": doc["batch"],
            "model_args": {str(k): str(v) for k, v in doc["model_args"].items()},
            "algo": doc["algo"], "devices": doc["devices"],
            "opgraph_digest": doc["opgraph_digest"]}


def _second_format(doc):
    """The key before the links were added (preset, pins, partition, capacities)."""
    return {"kind": "tofu", "model": doc["model"], "batch": doc["batch"],
            "model_args": {str(k): str(v) for k, v in doc["model_args"].items()},
            "opgraph_digest": doc["opgraph_digest"], "algo": doc["algo"],
            "pins": sorted(doc.get("pins") or ()), "preset": doc["preset"],
            "devices": doc["devices"], "factors": list(doc["factors"]),
            "levels": list(doc["levels"]),
            "capacity_bytes": [float(c) for c in doc["info"]["capacity_bytes"]]}


def test_runs_stored_under_earlier_key_formats_show_for_their_plan(doc, tmp_path,
                                                                   monkeypatch):
    monkeypatch.setenv("EXPLORER_HOME", str(tmp_path))
    store = RunStore()
    old1 = store.add(_first_format(doc), {"model": "mlp", "algo": "tofu", "devices": 2,
                                         "measured_step_time_s": 0.01})
    old2 = store.add(_second_format(doc), {"model": "mlp", "algo": "tofu", "devices": 2,
                                          "preset": "local", "measured_step_time_s": 0.02})
    new = store.add(run_key(doc), {"model": "mlp", "algo": "tofu", "devices": 2,
                                   "preset": "local", "measured_step_time_s": 0.03})
    # a first-format row of the same model on another preset (that format had no preset)
    store.add(dict(_first_format(doc)), {"model": "mlp", "algo": "tofu", "devices": 2,
                                         "preset": "p100-nvlink-4",
                                         "measured_step_time_s": 0.04})
    # another plan's old row does not show
    store.add(dict(_first_format(doc), batch=32), {"measured_step_time_s": 0.05})
    rows = service.runs(doc)
    assert [r["id"] for r in rows] == [new, old2, old1]
    assert [r["measured_ms"] for r in rows] == [30.0, 20.0, 10.0]
    # the saved file of the plan finds them too
    assert [r["id"] for r in service.runs(service.plan_file(doc))] == [new, old2, old1]
    assert store.get(old1)["measured_step_time_s"] == 0.01


def test_placement_runs_stored_before_the_preset_was_keyed_show(tmp_path, monkeypatch):
    monkeypatch.setenv("EXPLORER_HOME", str(tmp_path))
    doc = {"schema": "plan-explorer/placement", "model": "lenet5", "batch": 8,
           "model_args": {}, "algo": "celeritas", "preset": "local", "devices": 2,
           "placement": {"a": 0, "b": 1}}
    old = {"kind": "placement", "model": "lenet5", "batch": 8, "model_args": {},
           "algo": "celeritas", "placement": {"a": 0, "b": 1}}
    store = RunStore()
    rid = store.add(old, {"model": "lenet5", "measured_step_time_s": 0.01})
    assert [r["id"] for r in service.runs(doc)] == [rid]
    assert service.runs(dict(doc, placement={"a": 1, "b": 0})) == []

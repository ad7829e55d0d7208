"""Device placements executed on 2 gloo CPU workers against one device (float64)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from _helpers import explorer_cli
from explorer.engine.devices import preset
from explorer.engine.opgraph import build_opgraph
from explorer.engine.runtime.opexec import run_placement
from explorer.engine.search.celeritas import placement_graph
from _helpers import place
from explorer.errors import InfeasiblePlan


@pytest.fixture(scope="module")
def lenet():
    dev = preset("local", 2)
    og = build_opgraph("lenet5", 8, {})
    return og, placement_graph(og, dev, {}), dev


@pytest.mark.parametrize("algo", ["metis", "m-etf", "celeritas"])
def test_placement_matches_one_device_and_moves_the_predicted_bytes(lenet, algo):
    og, pg, dev = lenet
    res = place(algo, pg, dev, {})
    r = run_placement("lenet5", 8, {}, res.names, res.placement, 2, steps=2, timeout_s=120)
    assert r["reference_ok"], r
    assert r["max_rel_error"] < 1e-10
    assert r["measured_comm_bytes"] == pytest.approx(r["predicted_comm_bytes"])
    assert r["measured_step_time_s"] > 0 and len(r["compute_s"]) == 2


def test_a_split_placement_really_uses_both_workers(lenet):
    og, pg, dev = lenet
    names = list(pg.names)
    half = np.array([0 if i < len(names) // 2 else 1 for i in range(len(names))])
    r = run_placement("lenet5", 8, {}, names, half, 2, steps=1, timeout_s=120)
    assert r["reference_ok"] and r["measured_comm_bytes"] > 0
    assert min(r["compute_s"]) > 0                # both workers computed operators


def test_a_placement_for_another_graph_or_device_count_is_refused(lenet):
    og, pg, dev = lenet
    with pytest.raises(InfeasiblePlan, match="does not cover"):
        run_placement("mlp", 8, {}, pg.names, np.zeros(len(pg.names), dtype=int), 2)
    with pytest.raises(InfeasiblePlan, match="devices"):
        run_placement("lenet5", 8, {}, pg.names, np.full(len(pg.names), 3), 2)


def test_explorer_run_executes_a_saved_placement(tmp_path):
    plan = tmp_path / "place.json"
    out = explorer_cli("search", "lenet5", "-n", "2",
                       "--batch", "8", "--preset", "local", "--algo", "metis", "--out",
                       str(plan))
    assert out.returncode == 0, out.stderr
    out = explorer_cli("run", str(plan), "--json")
    assert out.returncode == 0, out.stderr
    d = json.loads(out.stdout)
    assert d["reference_ok"] and d["predicted_step_time_s"] > 0
    # stored with the placement (same store and key as the app's Placement page)
    from explorer.service import placement_runs
    hist = placement_runs(json.loads(plan.read_text()))
    assert [h["id"] for h in hist] == [d["run_id"]] and hist[0]["reference"] == "ok"
    assert d["measured_comm_bytes"] == d["predicted_comm_bytes"]

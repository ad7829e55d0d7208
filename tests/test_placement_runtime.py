"""Device placements executed on 2 gloo CPU workers against one device."""

from __future__ import annotations

import json

import numpy as np
import pytest

from _helpers import explorer_cli, forbid_search, spawned_workers
from explorer.cli import main
from explorer.engine.core import plandoc
from explorer.engine.core.devices import preset
from explorer.engine.core.opgraph import build_opgraph
from explorer.engine.runtime.opexec import run_placement
from explorer.engine.placement.celeritas import placement_graph
from _helpers import place
from explorer.engine.runtime.launcher import RunFailed
from explorer.engine.runtime.dispatch import run_document
from explorer.errors import InfeasiblePlan

pytestmark = pytest.mark.multiprocess   # every test here starts worker processes


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
    # the simulator's bytes, less outputs of a multi-output call a device computes itself
    assert r["measured_comm_bytes"] == r["planned_comm_bytes"] <= r["predicted_comm_bytes"]
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
    assert d["kind"] == "placement" and d["devices"] == 2


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """`explorer search lenet5 --algo m-etf --out` on 2 local devices: the document."""
    path = tmp_path_factory.mktemp("placement") / "place.json"
    assert main(["search", "lenet5", "-n", "2", "--batch", "8", "--preset", "local",
                 "--algo", "m-etf", "--out", str(path)]) == 0
    return json.loads(path.read_text())


def test_a_saved_placement_is_a_sealed_standalone_document(saved):
    assert plandoc.open_document(saved) == "placement"
    assert saved["schema"] == "plan-explorer/placement" and saved["version"] == 2
    assert saved["devices"] == 2 and saved["preset"] == "local" and saved["batch"] == 8
    assert saved["opgraph_digest"] and "n_devices" not in saved


def test_a_saved_placement_runs_without_any_search(saved, tmp_path, capsys, monkeypatch):
    path = tmp_path / "place.json"
    path.write_text(json.dumps(saved))
    forbid_search(monkeypatch)
    code = main(["run", str(path), "--json", "--steps", "2", "--timeout", "120"])
    out, err = capsys.readouterr()
    assert code == 0, err
    d = json.loads(out)
    assert d["reference_ok"] and d["algo"] == "m-etf" and d["devices"] == 2
    assert d["measured_comm_bytes"] == d["planned_comm_bytes"] <= d["predicted_comm_bytes"]
    assert len(d["step_times_s"]) == 2 and d["predicted_step_time_s"] > 0
    code = main(["run", str(path), "--steps", "1", "--timeout", "120"])   # the text report
    out, err = capsys.readouterr()
    assert code == 0 and "lenet5 placement on 2 local workers" in out
    assert "reference check passed" in out and "step time: predicted" in out


def test_a_version_1_placement_file_still_runs(saved):
    """Version 1 wrote the preset's name in ``devices`` and the count in ``n_devices``."""
    old = {k: v for k, v in saved.items() if k not in ("version", "checksum", "opgraph_digest",
                                                       "preset")}
    old.update(schema="plan-explorer/placement@1", devices="local", n_devices=2)
    r = run_document(old, steps=1, timeout_s=120)
    assert r["reference_ok"] and r["devices"] == 2 and r["preset"] == "local"
    with pytest.raises(InfeasiblePlan, match="for 2 devices, not --devices 3"):
        run_document(old, expect={"devices": 3})


@pytest.mark.parametrize("edit, words", [
    (lambda d: dict(d, schema="plan-explorer/hologram"), "unknown plan schema"),
    (lambda d: plandoc.seal(d, "placement") | {"version": 3}, "newer Plan Explorer"),
    (lambda d: dict(d, placement={k: 0 for k in d["placement"]}), "edited after it was saved"),
    (lambda d: plandoc.seal(dict(d, batch=4), "placement"), "another operator graph"),
], ids=["unknown-schema", "newer-version", "edited", "other-graph"])
def test_unusable_placement_documents_are_refused_before_launch(saved, tmp_path, capsys, edit,
                                                                words):
    path = tmp_path / "place.json"
    path.write_text(json.dumps(edit(saved)))
    before = {c.pid for c in spawned_workers()}
    code = main(["run", str(path)])
    out, err = capsys.readouterr()
    assert code == 2 and out == "" and err.count("\n") == 1 and words in err, err
    code = main(["run", str(path.with_name("missing.json"))])
    assert code == 2 and "not found" in capsys.readouterr().err
    assert not {c.pid for c in spawned_workers()} - before


def test_a_placement_for_other_devices_is_refused_before_launch(saved, tmp_path, capsys):
    path = tmp_path / "place.json"
    path.write_text(json.dumps(saved))
    code = main(["run", str(path), "--devices", "4"])
    err = capsys.readouterr().err
    assert code == 2 and "placement is for 2 devices, not --devices 4" in err


def test_a_placement_worker_that_dies_or_raises_fails_cleanly(saved, monkeypatch):
    before = {c.pid for c in spawned_workers()}
    with pytest.raises(RunFailed, match="rank 1 failed: injected fault") as info:
        run_document(saved, steps=2, fault="1:2:raise", timeout_s=60)
    assert info.value.rank == 1
    monkeypatch.setenv("EXPLORER_RUNTIME_FAULT", "0:1:exit")
    with pytest.raises(RunFailed, match="rank 0 died.*exit code 3") as info:
        run_document(saved, steps=2, timeout_s=60)
    assert info.value.rank == 0
    assert not {c.pid for c in spawned_workers()} - before

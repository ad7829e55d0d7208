"""Placement page logic without a browser: session placement functions, graph elements with
one cluster expanded, the Gantt / memory / comparison figures, and pin / unpin / impossible pin."""

import pytest
from dash import no_update

from explorer import service as session
from explorer.errors import InfeasiblePlan
from explorer.views import placement as P
from explorer.views.figures import placement as PF

REQ = session.Request(model="vgg16", preset="p100-nvlink-4", devices=4)   # the app default


@pytest.fixture(scope="module")
def doc():
    return session.placement(REQ, "celeritas")


@pytest.fixture(scope="module")
def structure():
    return P.prepare(session.placement_structure(REQ))


def test_session_placement_doc_has_clusters_schedule_and_memory(doc):
    assert doc["algo"] == "celeritas" and doc["clusters_from"] == "celeritas"
    assert doc["ops"] == len(doc["placement"]) > 100
    covered = [op for c in doc["clusters"] for op in c["ops"]]
    assert sorted(covered) == sorted(doc["placement"])          # clusters partition the ops
    for c in doc["clusters"]:
        assert sum(c["shares"]) == len(c["ops"]) and c["shares"][c["device"]] > 0
    assert len(doc["peak_memory_bytes"]) == len(doc["capacity_bytes"]) == 4
    assert len(doc["schedule"]["ops"]) == doc["ops"] and doc["predicted_step_time_s"] > 0
    assert "trace" not in doc and doc["request"]["model"] == "vgg16"


def test_baselines_are_drawn_over_celeritas_clusters():
    d = session.placement(REQ, "m-etf")
    assert d["algo"] == "m-etf" and d["clusters_from"] == "celeritas" and d["clusters"]
    for c in d["clusters"]:
        assert sum(c["shares"]) == len(c["ops"])


def test_memory_limit_is_passed_to_the_placer():
    d = session.placement(REQ, "celeritas", memory_gib=2)
    assert all(abs(c - 2 * 2 ** 30) < 1 for c in d["capacity_bytes"])
    with pytest.raises(ValueError, match="> 0 GiB"):
        session.placement(REQ, "celeritas", memory_gib=0)


def test_cluster_pin_is_honoured_and_conflicts_are_errors(doc):
    c = doc["clusters"][len(doc["clusters"]) // 2]
    target = (c["device"] + 1) % 4
    pin = {"target": "cluster", "ops": c["ops"], "device": target}
    d = session.placement(REQ, "celeritas", pins=[pin])
    assert all(d["placement"][op] == target for op in c["ops"]) and P.honoured(pin, d)
    with pytest.raises(InfeasiblePlan, match="pinned to devices"):
        session.placement_pins([pin, {"target": c["ops"][0], "ops": c["ops"][:1],
                                      "device": (target + 1) % 4}])
    with pytest.raises(InfeasiblePlan, match="only 4 devices"):
        session.placement(REQ, "celeritas", pins=[dict(pin, device=9)])


def test_compare_runs_every_method_on_the_same_simulator():
    rows = session.placement_compare(REQ, algos=["celeritas", "m-topo", "metis", "single"])
    assert [r["algo"] for r in rows] == ["celeritas", "m-topo", "metis", "single"]
    table = P.compare_rows(rows)
    cel = next(r for r in table if r["algo"] == "celeritas")
    assert cel["vs"] == 1.0 and cel["oom"] == "no"
    single = next(r for r in table if r["algo"] == "single")
    assert single["moved"] == "0 B" and single["vs"] > 1.0
    # a numeric column holds numbers or nothing: a placer without clusters shows a blank,
    # not the grid's "Invalid Number"
    assert all(r["clusters"] is None or isinstance(r["clusters"], int) for r in table)
    assert single["clusters"] is None and isinstance(cel["clusters"], int)
    fig = PF.compare_figure(rows)
    assert list(fig.data[0].x) == ["celeritas", "m-topo", "metis", "single"]


def test_elements_collapsed_then_one_cluster_expanded(doc, structure):
    els, info = P.build_elements(doc, structure)
    nodes = [e for e in els if "source" not in e["data"]]
    assert len(nodes) == len(doc["clusters"]) == info["shown"]
    assert all(n["data"]["color"] == P.device_color(n["data"]["device"]) for n in nodes)
    assert all("position" in n for n in nodes)
    k = max(range(len(doc["clusters"])), key=lambda i: len(doc["clusters"][i]["ops"]))
    els2, info2 = P.build_elements(doc, structure, expanded=k,
                                   selected={"kind": "cluster", "id": k})
    ids2 = {e["data"]["id"] for e in els2}
    assert f"cluster:{k}" not in ids2
    assert all(f"op:{op}" in ids2 for op in doc["clusters"][k]["ops"])
    assert info2["shown"] == len(doc["clusters"]) - 1 + len(doc["clusters"][k]["ops"])
    node_ids = {e["data"]["id"] for e in els2 if "source" not in e["data"]}
    for e in els2:
        if "source" in e["data"]:
            assert e["data"]["source"] in node_ids and e["data"]["target"] in node_ids


def test_mixed_clusters_get_pies_and_pins_are_marked(structure):
    d = session.placement(REQ, "m-topo")
    els, _ = P.build_elements(d, structure)
    mixed = [e for e in els if "mixed" in e.get("classes", "")]
    assert mixed and abs(sum(mixed[0]["data"][f"p{i}"] for i in range(P.MAX_PIE)) - 100) < 1e-6
    c0 = d["clusters"][0]
    els, _ = P.build_elements(d, structure, pins=[{"target": "c", "ops": c0["ops"],
                                                    "device": 0}])
    assert "pinned" in next(e for e in els if e["data"]["id"] == "cluster:0")["classes"]


def test_gantt_and_memory_figures(doc):
    fig = PF.gantt_figure(doc)
    names = [t.name for t in fig.data]
    assert "transfers" in names and any(n.startswith("device ") for n in names)
    bars = sum(len(t.x) for t in fig.data if t.name.startswith("device "))
    assert bars == doc["ops"]
    mem = PF.memory_figure(doc)
    assert [t.name for t in mem.data] == ["peak", "capacity"]
    assert len(mem.data[0].y) == 4 and mem.data[1].y[0] == pytest.approx(100.0)
    assert mem.layout.yaxis.title.text == "% of device memory"
    assert PF.gantt_figure(None).data == () and PF.memory_figure(None).data == ()


def test_gantt_merges_runs_for_huge_schedules(doc, monkeypatch):
    monkeypatch.setattr(PF, "MAX_GANTT_BARS", 10)
    fig = PF.gantt_figure(doc)
    bars = sum(len(t.x) for t in fig.data if t.name.startswith("device "))
    assert bars < doc["ops"]
    assert any("cluster" in str(lbl) for t in fig.data if t.name.startswith("device ")
               for lbl in t.customdata)


def test_pin_rerun_unpin_clear_and_impossible_pin(doc):
    req_doc = REQ.to_dict()
    c = doc["clusters"][1]
    target = (c["device"] + 2) % 4
    sel = {"kind": "cluster", "id": 1}
    pins, new, err = P.apply_pins("pin", [], sel, target, req_doc, "celeritas", None, doc)
    assert err == "" and len(pins) == 1 and pins[0]["device"] == target
    assert all(new["placement"][op] == target for op in c["ops"])
    # impossible: a device that does not exist -> engine error, nothing changes
    p2, d2, err = P.apply_pins("pin", pins, sel, 9, req_doc, "celeritas", None, new)
    assert p2 is no_update and d2 is no_update
    assert "cannot pin cluster 1 to device 9" in err and "only 4 devices" in err
    # no selection
    _, _, err = P.apply_pins("pin", pins, None, 1, req_doc, "celeritas", None, new)
    assert "select a cluster" in err
    # an operator pin, then unpin the first pin, then clear
    op = new["clusters"][0]["ops"][-1]
    pins, new2, err = P.apply_pins("pin", pins, {"kind": "op", "name": op, "cluster": 0}, 3,
                                   req_doc, "celeritas", None, new)
    assert err == "" and len(pins) == 2 and new2["placement"][op] == 3
    pins, _, err = P.apply_pins("unpin", pins, None, None, req_doc, "celeritas", None, new2,
                                unpin_index=0)
    assert err == "" and [p["ops"] for p in pins] == [[op]]
    pins, _, err = P.apply_pins("clear", pins, None, None, req_doc, "celeritas", None, new2)
    assert pins == [] and err == ""


def test_summary_details_and_pin_items(doc, structure):
    text = str(P.summary_view(doc))
    assert "predicted step" in text and "clusters" in text
    det = str(P.details_view({"kind": "cluster", "id": 0}, doc, structure))
    assert "cluster 0" in det
    op = doc["clusters"][0]["ops"][0]
    assert op in str(P.details_view({"kind": "op", "name": op, "cluster": 0}, doc, structure))
    pin = {"target": "cluster 0", "ops": doc["clusters"][0]["ops"],
           "device": doc["clusters"][0]["device"]}
    assert "✔ honoured" in str(P.pin_items([pin], doc))


# -- running the shown placement on local workers ----------------------------------------------

@pytest.mark.slow
def test_running_the_shown_placement_checks_it_against_one_device():
    req = session.Request(model="lenet5", batch=8, preset="local", devices=2)
    d = session.placement(req, "metis")
    assert set(d["placement"].values()) == {0, 1}               # really split over 2 workers
    res = P.do_run(d, 2)
    assert res["reference_ok"] and res["max_rel_error"] < 1e-10 and res["workers"] == 2
    assert res["measured_comm_bytes"] == res["predicted_comm_bytes"] > 0
    assert res["predicted_step_time_s"] == d["predicted_step_time_s"]
    assert len(res["predicted_busy_s"]) == len(res["compute_s"]) == 2
    assert all(b > 0 for b in res["predicted_busy_s"])
    res["placement_id"] = P.placement_id(d)
    text = str(P.run_view(res, d))
    assert "passed" in text and "MB per step" in text
    assert {t.name for t in P.run_figure(res, d).data} == {"predicted busy (simulator)",
                                                           "measured compute"}
    # every measured step is drawn against the simulator's prediction
    assert len(res["step_times_s"]) == 2 and all(t > 0 for t in res["step_times_s"])
    series = P.run_series(res, d)
    assert list(series.data[0].y) == [t * 1e3 for t in res["step_times_s"]]
    assert any("predicted" in (s.text or "") for s in series.layout.annotations)
    # the run is stored with the placement: the history shows it, and only for this placement
    hist = P.history(d)
    assert [h["id"] for h in hist] == [res["run_id"]]
    assert hist[0]["reference"] == "ok" and hist[0]["devices"] == 2
    assert hist[0]["predicted_ms"] == round(d["predicted_step_time_s"] * 1e3, 3)
    # a result belongs to its placement: another placement shows the prompt, not stale numbers
    other = session.placement(req, "single")
    assert "Run the shown placement" in str(P.run_view(res, other))
    assert not P.run_figure(res, other).data
    assert not P.run_series(res, other).data and P.history(other) == []


def test_running_without_a_placement_or_beyond_free_memory_is_refused(doc):
    from explorer.errors import ExplorerError
    with pytest.raises(ExplorerError, match="place the model first"):
        P.do_run(None, 3)
    huge = dict(doc, peak_memory_bytes=[2.0 ** 50] * 4)          # 1 PiB per device
    with pytest.raises(ExplorerError, match="GiB is free"):
        P.do_run(huge, 3)

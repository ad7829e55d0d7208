"""The application service: captures are built once, even when many callbacks ask at once."""

import json
import threading

import pytest

from explorer import service


@pytest.mark.parametrize("fn", [service.graph_for, service.opgraph_for])
def test_concurrent_first_capture_builds_once(fn, monkeypatch):
    monkeypatch.delenv("EXPLORER_CAPTURE_CACHE", raising=False)   # a cold cache: this home's
    service.clear_caches()
    req = service.Request(model="lenet5", batch=8, devices=2)
    calls = []
    real = {service.graph_for: "import_spec", service.opgraph_for: None}[fn]
    if real:                          # the capture cache builds with the importer's
        from explorer.engine.core import importer
        orig = importer.import_spec

        def counting(*a, **k):
            calls.append(1)
            return orig(*a, **k)
        monkeypatch.setattr(importer, "import_spec", counting)
    results, errors = [], []
    barrier = threading.Barrier(6)

    def ask():
        barrier.wait()
        try:
            results.append(fn(req))
        except Exception as exc:  # noqa: BLE001 - the test reports it
            errors.append(exc)
    threads = [threading.Thread(target=ask) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    assert len(results) == 6 and all(r is results[0] for r in results)
    if real:
        assert len(calls) == 1


def test_different_models_at_once_each_get_their_own_graph():
    service.clear_caches()
    names = ["lenet5", "alexnet", "mlp", "vgg16"]
    out, errors = {}, []
    barrier = threading.Barrier(len(names))

    def ask(name):
        barrier.wait()
        try:
            out[name] = service.summary(service.Request(model=name, devices=2))
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)
    threads = [threading.Thread(target=ask, args=(n,)) for n in names]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not errors, errors
    assert sorted(out) == sorted(names)
    assert len({o["parameters"] for o in out.values()}) == len(names)


def test_engine_does_not_contain_the_service():
    import importlib.util
    assert importlib.util.find_spec("explorer.engine.session") is None


def test_plan_documents_schema_version_checksum():
    from explorer.engine.core import plandoc as P
    from explorer.errors import PlanFileError
    doc = P.seal({"model": "mlp", "layers": [], "x": (1, 2)}, "tofu")
    assert doc["schema"] == "plan-explorer/tofu" and doc["version"] == P.VERSION
    assert P.open_document(doc) == "tofu"
    assert P.open_document({"schema": "plan-explorer/plan@1"}) == "layerwise"
    for bad, words in [({"schema": "other/thing"}, "unknown plan schema"),
                       (dict(doc, version=P.VERSION + 1), "newer"),
                       (dict(doc, model="lenet5"), "edited"),
                       ([1, 2], "not a plan")]:
        with pytest.raises(PlanFileError, match=words):
            P.open_document(bad)


def test_placement_pins_are_text_in_documents_and_rows_on_the_page():
    req = service.Request(model="lenet5", batch=8, devices=2, preset="local")
    base = service.placement(req, "metis")
    op = next(o for o, d in base["placement"].items() if d == 0)
    doc = service.placement(req, "metis", pins=[{"target": op, "ops": [op], "device": 1}])
    assert doc["pins"] == [f"{op}=@1"] and doc["placement"][op] == 1
    assert service.placement_pin_rows(doc) == [{"target": op, "ops": [op], "device": 1}]
    ops = base["clusters"][0]["ops"]
    doc = service.placement(req, "metis", pins=[{"target": "cluster:0", "ops": ops,
                                                 "device": 1}])
    assert doc["pins"] == ["cluster:0=@1"] and set(doc["placement"].values()) == {1}
    assert service.placement_pin_rows(doc)[0]["ops"] == doc["clusters"][0]["ops"]
    # a placement saved by the command line names its pins the same way
    res = service.run_method(req, "metis", [f"{op}=@1"])
    assert res.to_dict()["pins"] == [f"{op}=@1"]
    assert service.placement_pin_rows(res.to_dict())[0] == {"target": op, "ops": [op],
                                                            "device": 1}


def test_a_failed_build_is_retried_not_cached():
    from explorer.service.cache import Cache
    calls = []

    def boom():
        calls.append(1)
        raise ValueError("no")
    cache = Cache("test")
    for _ in range(2):
        with pytest.raises(ValueError):
            cache.get("k", boom)
    assert len(calls) == 2 and "k" not in cache and not cache.building
    assert cache.get("k", lambda: 5) == 5 and cache.get("k", boom) == 5


def test_a_result_is_reused_while_its_capture_is_the_cached_one():
    """The one result cache: the same request, method and pins search once; a rebuilt cost
    model (e.g. after calibration) makes the result stale."""
    from explorer.service import captures, results
    r = service.Request("lenet5", 8, devices=2)
    first = service.result(r, "optcnn")
    assert service.result(r, "optcnn") is first
    assert service.result(r, "data") is not first
    captures.COST_MODELS.clear()
    assert service.result(r, "optcnn") is not first
    before = len(results.RESULTS)
    service.result(r, "tofu")
    service.result(r, "tofu")
    assert len(results.RESULTS) == before + 1


def test_a_tofu_run_that_would_not_fit_is_refused_before_launching(monkeypatch):
    """One run path: the memory check comes from the plan's own peaks, for any caller."""
    import psutil
    from explorer.errors import ExplorerError
    doc = service.plan_file(service.tofu(service.Request("mlp", 8, devices=2), "tofu"))
    need, why = service.execution.memory_needed(doc)
    assert need > 0 and "2 workers" in why
    free = type("M", (), {"available": need})()
    monkeypatch.setattr(psutil, "virtual_memory", lambda: free)
    with pytest.raises(ExplorerError, match="needs up to .* GiB here .* is free"):
        service.run_plan(doc, steps=1)


@pytest.mark.multiprocess
def test_the_app_saves_plans_of_every_kind_as_runnable_documents():
    from explorer.engine.core.plandoc import open_document
    from explorer.errors import ExplorerError
    from explorer.views.plans import download_payload
    req = service.Request(model="mlp", batch=8, devices=2, preset="local",
                          model_args={"layers": 1, "hidden": 8})
    tofu = service.plan_file(service.tofu(req, "tofu"))
    assert open_document(tofu) == "tofu" and tofu["layout"]["workers"] == 2
    assert tofu["opgraph_digest"] and tofu["model_args"] == {"layers": 1, "hidden": 8}
    op = next(iter(service.placement(req, "metis")["placement"]))
    place = service.plan_file(service.placement(
        req, "metis", pins=[{"target": op, "ops": [op], "device": 1}]))
    assert open_document(place) == "placement" and place["opgraph_digest"]
    assert place["pins"] == [f"{op}=@1"] and place["placement"][op] == 1
    layer = service.plan_file(service.search(req))
    assert open_document(layer) == "layerwise" and "trace" not in layer
    data = download_payload(service.tofu(req, "tofu"))
    assert data["filename"] == "mlp-tofu-2dev.json"
    with pytest.raises(ExplorerError, match="no plan"):
        service.plan_file({"error": "x"})
    # and the command line runs the Tofu file without searching
    from explorer.engine.runtime.dispatch import run_document
    out = run_document(json.loads(data["content"]), timeout_s=120)
    assert out["reference_ok"] and out["kind"] == "tofu"


def test_an_uploaded_cluster_is_read_from_its_document():
    from explorer.errors import UnknownPreset
    cluster = {"name": "box", "devices": [{"name": f"g{i}", "peak_flops": 1e12, "mem_bw": 1e11,
                                           "memory": 8e9} for i in range(4)],
               "intra_node_bw": 1e10}
    d = service.devices_for(service.Request(preset="custom", devices=2, cluster=cluster))
    assert d.n == 2 and d.name == "box"
    with pytest.raises(UnknownPreset, match="the uploaded cluster: KeyError"):
        service.devices_for(service.Request(preset="custom", devices=2,
                                            cluster={"devices": [{"name": "x"}]}))


def test_layerwise_results_are_cached_while_the_cost_model_is_the_same(monkeypatch):
    """A page opened again does not search again; new costs (calibration rebuilds the
    request's cost model) or other pins do."""
    from explorer import service as S
    from explorer.service import captures, results
    S.clear_caches()
    calls = []
    real = results.run_method
    monkeypatch.setattr(results, "run_method",
                        lambda *a, **k: calls.append(a) or real(*a, **k))
    req = S.Request(model="lenet5", preset="p100-cluster", devices=2, batch=8)
    first = S.search(req, keep_trace=True)
    again = S.search(req, keep_trace=True)
    assert len(calls) == 1 and again == first
    S.search(req, ["conv1=n=2"])
    assert len(calls) == 2
    captures.forget_preset("p100-cluster")          # what calibrate_local does for local
    S.search(req, keep_trace=True)
    assert len(calls) == 3

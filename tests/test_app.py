"""The app module without a browser: layout, default plan, port handling, graph elements."""

import socket

import pytest

from explorer import app as A
from explorer import service as session
from explorer.views import graph, ids, layerwise_page, plans_page, tofu_page
from explorer.views import search_form as model


@pytest.mark.slow
def test_app_builds_with_default_plan_and_all_panels():
    dash_app = A.create_app()
    assert "_pages_content" in str(dash_app.layout)          # the shell routes to the page
    text = str(layerwise_page.layout())                       # the main page, no query
    text += str(plans_page.layout()) + str(tofu_page.layout())   # the pages beside it
    for panel in (ids.GRAPH, ids.CANDIDATE_TABLE, ids.STEP_SLIDER, ids.TILING_FIGURE,
                  ids.COMPARE_TIME, ids.PLANS_TABLE, ids.SEARCH_BUTTON, ids.CANCEL_BUTTON,
                  ids.TOFU_BUTTON):
        assert panel in text
    req_doc, plan = A.initial_state(None)
    assert req_doc["model"] == "vgg16" and plan["algo"] == "optcnn"
    assert "trace" not in plan                        # the page holds the trace's reference
    assert session.trace_of(plan)[-1]["kind"] == "undo"


def test_serve_refuses_a_port_in_use(capsys):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        assert A.serve("127.0.0.1", port) == 2
    assert "already in use" in capsys.readouterr().err


@pytest.mark.slow
def test_large_graph_opens_collapsed_and_groups_expand():
    req = session.Request(model="inception_v3", preset="p100-cluster", devices=4)
    plan = session.search(req, [])
    els, info = graph.build_elements(req, plan, [])
    nodes = [e for e in els if "source" not in e["data"]]
    assert info["collapsed"] and len(nodes) < 40
    assert any(n["data"]["id"] == "group:Mixed_5b" for n in nodes)
    els2, _ = graph.build_elements(req, plan, ["group:Mixed_5b"])
    ids2 = {e["data"]["id"] for e in els2}
    assert "mixed_5b_branch1x1_conv" in ids2 and "group:Mixed_5b" in ids2   # parent box
    every_layer = {e["data"]["id"] for e in els2 if e["data"].get("kind") == "layer"}
    assert "mixed_5c_branch1x1_conv" not in every_layer                     # still collapsed


def test_stepper_classes_follow_the_trace():
    req = session.Request(model="vgg16", preset="p100-nvlink-4", devices=4, batch=16)
    plan = session.search(req, [])
    first = plan["trace"][0]
    els, _ = graph.build_elements(req, plan, [], step=1)
    cls = {e["data"]["id"]: e.get("classes", "") for e in els}
    assert "gone" in cls[first["node"]]                     # eliminated in step 0
    assert "current" in cls[plan["trace"][1]["node"]]
    assert any(e["data"]["id"].startswith("virtual:") for e in els)   # the new edge e'


def test_search_logic_keeps_plan_on_impossible_pin():
    req = session.Request(model="lenet5", preset="p100-cluster", devices=4, batch=16)
    plan = session.search(req, [])
    out = model.do_search(ids.PIN_BUTTON, {}, [], "conv2", "n=1,c=3,h=1,w=1", "", plan,
                          req.to_dict())
    assert out["plan"] is model.no_update and "cannot be met" in out["pin_error"]
    out = model.do_search(ids.PIN_BUTTON, {}, [], "conv2", "n=1,c=2,h=1,w=1", "", plan,
                          req.to_dict())
    assert out["pins"] == ["conv2=n=1,c=2,h=1,w=1"]
    new = out["plan"]
    assert next(la for la in new["layers"] if la["name"] == "conv2")["config"]["c"] == 2
    assert new["previous"]["objective_s"] == plan["objective_s"]


def test_request_from_controls_validates(monkeypatch):
    from explorer.errors import ModelFilesOff
    from explorer.views import state
    with pytest.raises(ModelFilesOff, match="--allow-model-files"):
        model.request_from_controls("vgg16", " my.py:f ", 8, "a=1", "p100-cluster", 2, "data",
                                    None)
    monkeypatch.setitem(state._POLICY, "model_files", True)
    with pytest.raises(ValueError, match="KEY=VALUE"):
        model.request_from_controls("vgg16", "", None, "depth", "p100-cluster", 4, "optcnn", None)
    with pytest.raises(ValueError, match="cluster JSON"):
        model.request_from_controls("vgg16", "", None, "", "custom", 4, "optcnn", None)
    r = model.request_from_controls("vgg16", " my.py:f ", 8, "a=1", "p100-cluster", 2, "data",
                                    None)
    assert r.model == "my.py:f" and r.batch == 8 and r.model_args == {"a": "1"}

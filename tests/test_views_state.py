"""One app state: the request store, the URL, plan documents of every kind filling the form,
the "operates on" lines, resets on a model change, one palette, one app per register."""

import base64
import json
from urllib.parse import parse_qs, urlsplit

import pytest
from dash import no_update

from explorer import service as session
from explorer.cli import main
from explorer.engine.core import plandoc
from explorer.engine.core.history import PlanStore
from explorer.errors import ModelFilesOff
from explorer.views import graph, ids, palette, placement, plans, state, steps, tofu
from explorer.views import search_form as model
from explorer.views.figures import placement as placement_figures
from explorer.views.figures import tiling as tiling_figures

LENET = session.Request(model="lenet5", batch=8, preset="local", devices=2)


def _params(query: str) -> dict:
    """What Dash pages passes a layout: one value per name, a list when repeated."""
    return {k: v[0] if len(v) == 1 else v
            for k, v in parse_qs(urlsplit(query).query, keep_blank_values=True).items()}


def _as_saved(obj):
    """A plan document as the tool saves it (sealed); anything else unchanged."""
    from explorer.engine.core.plandoc import kind_of, seal
    if isinstance(obj, dict) and obj.get("version") == 2 and "checksum" not in obj \
            and kind_of(obj):
        return seal(obj, kind_of(obj))
    return obj


def _upload(obj) -> str:
    obj = _as_saved(obj)
    return "data:application/json;base64," + base64.b64encode(json.dumps(obj).encode()).decode()


@pytest.fixture
def files_off(monkeypatch):
    monkeypatch.setitem(state._POLICY, "model_files", False)


def test_methods_of_three_families():
    assert state.family("optcnn") == "layerwise" and state.family("tofu") == "tofu"
    assert state.family("icml18") == "tofu" and state.family("metis") == "placement"
    assert state.family("nonsense") is None and state.family(None) is None
    values = [o["value"] for o in state.method_options()]
    assert {"optcnn", "tofu", "celeritas"} <= set(values)
    assert state.tab_method("tofu", {"algo": "optcnn"}) == "tofu"
    assert state.tab_method("tofu", {"algo": "spartan"}) == "spartan"
    assert state.tab_method("placement", {"algo": "optcnn"}, "metis") == "metis"


def test_url_carries_the_whole_request():
    req = session.Request(model="wresnet", batch=8, model_args={"depth": "50", "width": "1"},
                          preset="k80-pcie-8", devices=4, algo="icml18")
    doc = state.request_doc(req, ["conv1=n=2", "fc=c=2@0,1"])
    q = state.query_string(doc)
    assert q.startswith("?model=wresnet&devices=4&preset=k80-pcie-8&algo=icml18&batch=8")
    back, errors = state.from_query(_params(q), state.request_doc(session.Request()))
    assert errors == [] and back == doc
    # another model without batch or args gets its own defaults, not the server's
    default = state.request_doc(session.Request(model="vgg16", batch=32,
                                                model_args={"x": "1"}))
    got, _ = state.from_query({"model": "mlp", "devices": "2"}, default)
    assert (got["model"], got["batch"], got["model_args"], got["devices"]) == ("mlp", None,
                                                                              {}, 2)


def test_bad_url_values_keep_the_defaults_with_one_line_each():
    default = state.request_doc(session.Request())
    got, errors = state.from_query({"devices": "abc", "preset": "nope", "algo": "zzz",
                                    "batch": "0"}, default)
    assert got == default and len(errors) == 4
    assert all("\n" not in e for e in errors) and "unknown preset 'nope'" in errors[1] + \
        errors[2] + errors[3]


def test_model_files_refused_unless_the_server_allows_them(files_off, monkeypatch):
    assert state.is_model_file("models/mine.py:build") and not state.is_model_file("vgg16")
    with pytest.raises(ModelFilesOff, match="--allow-model-files"):
        state.check_model("models/mine.py:build")
    with pytest.raises(ModelFilesOff):
        state.request({"model": "mine.py:build"})
    state.check_model("lenet5")
    default = state.request_doc(session.Request())
    got, errors = state.from_query({"model": "mine.py:build"}, default)
    assert got["model"] == "vgg16" and "model files are off" in errors[0]
    out = model.sync_request(ids.MODEL_FILE, dict(model="vgg16", model_file="mine.py:build",
                                                  batch=None, args="", preset="p100-cluster",
                                                  devices=4, algo="optcnn", cluster=None),
                             None, None, default)
    assert out["request"] is no_update and "--allow-model-files" in out["error"]
    monkeypatch.setitem(state._POLICY, "model_files", True)
    assert state.from_query({"model": "mine.py:build"}, default)[0]["model"] == "mine.py:build"


def test_uploaded_plan_naming_a_model_file_is_refused(files_off, tmp_path):
    plan = session.search(LENET, [])
    doc = {k: v for k, v in plan.items() if k not in ("request", "trace")}
    doc["spec"] = "evil.py:build"
    with pytest.raises(ValueError, match="model files are off"):
        plans.ingest(_upload(doc), "evil.json", PlanStore(str(tmp_path / "h.sqlite")))


def test_request_from_documents_of_every_kind():
    lw = {k: v for k, v in session.search(LENET, ["conv1=n=2"]).items() if k != "request"}
    got = state.request_from_document(lw, "layerwise")
    assert (got["model"], got["preset"], got["devices"], got["algo"], got["pins"]) == (
        "lenet5", "local", 2, "optcnn", ["conv1=n=2"])
    tofu_v1 = {"schema": "plan-explorer/tofu-plan@1", "model": "lenet5", "algo": "icml18",
               "devices": 2, "preset": "local", "batch": 8, "model_args": {}}
    got = state.request_from_document(tofu_v1, "tofu")
    assert (got["model"], got["batch"], got["preset"], got["devices"], got["algo"]) == (
        "lenet5", 8, "local", 2, "icml18")
    place_v1 = {"schema": "plan-explorer/placement@1", "model": "alexnet", "algo": "metis",
                "devices": "p100-cluster", "n_devices": 4, "batch": 16, "model_args": {}}
    got = state.request_from_document(place_v1, "placement")
    assert (got["model"], got["preset"], got["devices"], got["algo"]) == (
        "alexnet", "p100-cluster", 4, "metis")
    counted = dict(place_v1, capacity_bytes=[1, 1, 1])
    del counted["n_devices"]
    assert state.request_from_document(counted, "placement")["devices"] == 3
    with pytest.raises(ValueError, match="preset"):
        state.request_from_document({"model": "mlp", "algo": "tofu"}, "tofu")


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A Tofu plan and a placement saved by ``explorer search --out``."""
    d = tmp_path_factory.mktemp("plans")
    out = {}
    for kind, algo in (("tofu", "icml18"), ("placement", "metis")):
        path = d / f"{kind}.json"
        assert main(["search", "lenet5", "--devices", "2", "--preset", "local", "--batch", "8",
                     "--algo", algo, "--out", str(path)]) in (0, 3)
        out[kind] = json.loads(path.read_text())
    return out


def test_loading_a_tofu_plan_fills_the_form_and_opens_its_tab(saved, tmp_path):
    store = PlanStore(str(tmp_path / "h.sqlite"))
    got = plans.ingest(_upload(saved["tofu"]), "t.json", store)
    assert got["kind"] == "tofu" and "Tofu plan loaded" in got["message"]
    assert (got["request"]["model"], got["request"]["devices"], got["request"]["preset"],
            got["request"]["algo"]) == ("lenet5", 2, "local", "icml18")
    assert "tensors" not in got["doc"] and got["doc"]["request"]["model"] == "lenet5"
    o = plans.loaded_outputs("tofu", got["doc"], got["request"])
    assert o["tab"] == "tofu" and o["tofu"] is got["doc"] and o["plan"] is no_update
    assert got["plan"]["model"] == "lenet5"              # the graph shows the same model
    assert plans.loaded_outputs("tofu", got["doc"], got["request"], got["plan"])["plan"] \
        is got["plan"]
    form = dict(zip([key for _, key in model.FORM], o["form"]))
    assert (form["model"], form["devices"], form["preset"], form["algo"]) == (
        "lenet5", 2, "local", "icml18")
    summary, rows, *_ = tofu.show_view(got["doc"])
    assert "B communicated" in str(summary) and len(rows) == len(saved["tofu"]["steps"])
    assert len(store) == 0                  # loading shows it; the page's autosave keeps it


def test_loading_a_placement_fills_the_form_and_draws_it(saved, tmp_path):
    got = plans.ingest(_upload(saved["placement"]), "p.json", PlanStore(str(tmp_path / "h")))
    assert got["kind"] == "placement"
    assert (got["request"]["model"], got["request"]["devices"], got["request"]["preset"],
            got["request"]["algo"]) == ("lenet5", 2, "local", "metis")
    doc = got["doc"]
    assert doc["clusters"] and all("shares" in c for c in doc["clusters"])
    assert plans.loaded_outputs("placement", doc, got["request"])["tab"] == "placement"
    els, info, legend, _ = placement.graph_view(doc, None, None, [])
    assert els and "clusters" in info and len(legend) == 2


def test_sealed_documents_are_read_and_edited_ones_refused(saved, tmp_path):
    store = PlanStore(str(tmp_path / "h"))
    body = {k: v for k, v in saved["tofu"].items() if k not in ("schema", "version",
                                                                 "checksum")}
    sealed = plandoc.seal(body, "tofu")
    assert plans.ingest(_upload(sealed), "s.json", store)["request"]["algo"] == "icml18"
    sealed["devices"] = 4
    with pytest.raises(ValueError, match="edited after it was saved"):
        plans.ingest(_upload(sealed), "s.json", store)
    with pytest.raises(ValueError, match="missing field"):
        plans.parse_upload(_upload({"schema": "plan-explorer/tofu-plan@1", "model": "mlp"}))


def test_the_form_writes_the_request_and_keeps_pins_on_the_same_target():
    doc = state.request_doc(LENET, ["conv1=n=2"])
    controls = dict(model="lenet5", model_file="", batch=8, args="", preset="local", devices=2,
                    algo="optcnn", cluster=None)
    out = model.sync_request(ids.ALGO_DROPDOWN, dict(controls, algo="spartan"), "tofu",
                             "celeritas", doc)
    assert out["request"]["algo"] == "spartan" and out["request"]["pins"] == ["conv1=n=2"]
    assert out["tofu_algo"] == "spartan" and out["place_algo"] is no_update
    # a tab's own method dropdown writes the request and the form
    out = model.sync_request(ids.PLACE_ALGO, controls, "tofu", "m-etf", doc)
    assert out["request"]["algo"] == "m-etf" and out["algo"] == "m-etf"
    # another device count drops the pins; an unchanged form changes nothing
    assert model.sync_request(ids.DEVICES_INPUT, dict(controls, devices=4), None, None,
                              doc)["request"]["pins"] == []
    assert model.sync_request(ids.BATCH_INPUT, controls, None, None, doc)["request"] \
        is no_update
    bad = model.sync_request(ids.DEVICES_INPUT, dict(controls, devices=None), None, None, doc)
    assert bad["request"] is no_update and "number of devices" in bad["error"]


def test_a_new_model_clears_selection_errors_and_highlights():
    doc = state.request_doc(LENET)
    seen = {"model": "lenet5", "batch": 8, "model_args": {}}
    assert model.reset_on_change(dict(doc, devices=4), seen) is None
    r = model.reset_on_change(state.request_doc(session.Request(model="mlp")), seen)
    assert r["selected"] is None and r["step"] is None and r["error"] == ""
    assert r["place_pins"] == [] and r["seen"]["model"] == "mlp"


def test_search_runs_the_forms_method_and_opens_its_tab():
    controls = dict(model="lenet5", model_file="", batch=8, args="", preset="local", devices=2,
                    algo="icml18", cluster=None)
    out = model.do_search(ids.SEARCH_BUTTON, controls, None, None, None, None, None, None)
    assert out["tab"] == "tofu" and out["tofu"]["algo"] == "icml18"
    assert out["request"]["algo"] == "icml18"
    assert out["plan"]["model"] == "lenet5" and out["plan"]["algo"] == "optcnn"   # the graph
    shown = out["plan"]
    out = model.do_search(ids.SEARCH_BUTTON, dict(controls, algo="metis"), None, None, None,
                          None, shown, out["request"])
    assert out["tab"] == "placement" and out["placement"]["algo"] == "metis"
    assert out["plan"] is no_update                       # the graph already shows lenet5
    assert out["place_pins"] == [] and out["request_error"] == ""
    # pins re-run the layer-wise search of the form's request, keeping its method
    out = model.do_search(ids.RERUN_BUTTON, {}, None, None, None, None, None, out["request"])
    assert out["plan"]["algo"] == "optcnn" and out["request"]["algo"] == "metis"
    # pinning a layer of a plan of another model is refused
    vgg = session.search(session.Request(model="vgg16", batch=8), [])
    out = model.do_search(ids.PIN_BUTTON, {}, None, "features_0", "n=1", "", vgg,
                          state.request_doc(LENET))
    assert out["plan"] is no_update and "press Search first" in out["pin_error"]


def test_every_tab_says_what_it_operates_on():
    doc = state.request_doc(session.Request(model="lenet5", batch=8, preset="local",
                                            devices=2, algo="icml18"))
    line = state.context_line("tofu", doc, None)
    assert line == "Operates on: lenet5 · batch 8 · 2 × local · icml18"
    assert state.context_line("plan", doc, None).endswith("· optcnn")
    vgg = session.search(session.Request(model="vgg16", batch=8), [])
    line = state.context_line("tiling", doc, vgg)
    assert "showing vgg16" in line and "press Search" in line
    same = dict(vgg, request=dict(vgg["request"], model="lenet5", batch=8, preset="local",
                                  devices=2))
    assert "showing" not in state.context_line("plan", doc, same)
    assert "loading a plan" in state.context_line("plans", doc, None)


def test_results_for_another_request_than_the_form_are_marked_stale():
    from explorer.views import pages
    shown = {"request": state.request_doc(session.Request(model="gpt2", batch=8,
                                                          preset="local", devices=8)),
             "algo": "optcnn", "layers": []}
    doc = dict(shown["request"])
    assert state.stale_note("plan", doc, shown) == ""
    assert pages.stale_view("plan", doc, shown) == ("", True, "results")
    doc["model"] = "mlp"
    note = state.stale_note("plan", doc, shown)
    assert note.startswith("These results are for gpt2") and "not the form (mlp" in note
    assert "press Search" in note
    assert pages.stale_view("plan", doc, shown)[1:] == (False, "results stale")
    # another layer-wise method in the form, or other devices, is stale too
    assert state.stale_note("plan", dict(shown["request"], algo="owt"), shown)
    assert state.stale_note("plan", dict(shown["request"], devices=4), shown)
    # a Tofu method in the form: the layer-wise page shows optcnn by design, not stale
    assert state.stale_note("plan", dict(shown["request"], algo="tofu"), shown) == ""
    # nothing shown, or an error, has nothing to mark
    assert state.stale_note("tofu", doc, None) == ""
    assert state.stale_note("plan", doc, {"error": "x"}) == ""
    tofu_shown = dict(shown, algo="tofu")
    assert state.stale_note("tofu", dict(shown["request"], algo="tofu"), tofu_shown) == ""
    assert "icml18" in state.stale_note("tofu", dict(shown["request"], algo="icml18"),
                                        tofu_shown)


def test_the_url_keeps_the_tab_the_layer_and_the_step():
    doc = state.request_doc(LENET)
    view = {"tab": "steps", "layer": "conv2", "step": 5}
    q = state.query_string(doc, view)
    assert q.endswith("&tab=steps&layer=conv2&step=5")
    back = state.view_from_query(_params(q))
    assert back == view
    # the first tab and no selection add nothing; a step only with the Steps tab
    assert state.query_string(doc, {"tab": "plan", "layer": None, "step": None}) == \
        state.query_string(doc)
    assert "step=" not in state.query_string(doc, {"tab": "tiling", "layer": "x", "step": 3})
    # nonsense in the address opens the first tab, no step
    assert state.view_from_query({"tab": "nope", "step": "-2"}) == \
        {"tab": "plan", "layer": None, "step": None}
    assert state.view_from_query({"step": "abc"})["step"] is None
    # the page drops a layer the plan does not have and a step past its trace
    from explorer.views import layerwise_page
    plan = session.search(LENET, [], keep_trace=True)
    name = plan["layers"][1]["name"]
    got = layerwise_page.opened_view({"tab": "steps", "layer": name, "step": "3"}, plan)
    assert got == {"tab": "steps", "layer": name, "step": 3}
    got = layerwise_page.opened_view({"tab": "steps", "layer": "nosuch", "step": "9999"}, plan)
    assert got == {"tab": "steps", "layer": None, "step": None}


def test_compare_status_says_the_scaling_time_once_it_is_drawn():
    from explorer.views import compare
    status = "lenet5, batch 8 · fastest: owt · compare 0.20 s, scaling next"
    assert compare.status_after_scaling(status, 1.234) == \
        "lenet5, batch 8 · fastest: owt · compare 0.20 s, scaling 1.23 s"
    assert compare.status_after_scaling("compare 0.2 s, scaling (cached)", 1.0) is no_update
    assert compare.status_after_scaling(None, 1.0) is no_update


def test_step_highlight_only_on_the_steps_tab():
    plan = session.search(LENET, [])
    assert steps.shown_step(3, "steps", plan)[0] == 2        # the slider counts from 1
    assert steps.shown_step(2, "tiling", plan)[0] is None
    assert steps.shown_step(None, "steps", plan)[0] is None


def test_one_colour_per_device_everywhere():
    for d in range(20):
        c = palette.device_color(d)
        assert tiling_figures.device_color(d) == placement.device_color(d) == c
        assert placement_figures.device_color(d) == c
    grid = tofu.tensor_grid({"name": "w", "shape": [2, 2], "owners": [[0, 1], [2, 3]]}, "W")
    import re
    tiles = re.findall(r'class="tofu-tile" title="worker (\d+)" style="background:([^;]+);', grid)
    assert tiles == [(str(w), palette.device_color(w)) for w in range(4)]
    plan = session.search(LENET, [])
    colors = set(graph.config_colors(plan).values())
    assert colors and not colors & set(palette.DEVICE_COLORS)     # configurations ≠ devices
    assert len(set(palette.DEVICE_COLORS)) == len(palette.DEVICE_COLORS) == 64


def test_apps_register_their_own_callbacks():
    from dash import _callback

    from explorer.app import create_app
    a, b = create_app(), create_app()
    for app in (a, b):
        outs = " ".join(app.callback_map)
        assert ids.STORE_PLAN in outs and ids.TOFU_SUMMARY in outs and ids.URL_QUERY in outs
    assert not _callback.GLOBAL_CALLBACK_LIST and not _callback.GLOBAL_CALLBACK_MAP


@pytest.mark.parametrize("pin", ["nosuchlayer=n=2", "garbage"])
def test_a_bad_pin_in_the_url_keeps_the_model_and_says_why(pin):
    """A link with a pin that cannot apply still opens its (valid) model: the graph, summary
    and plan are shown unpinned, and one line names the pin and the reason."""
    from explorer.views import pages
    doc, errors = state.from_query({"model": "lenet5", "devices": "2", "pin": pin},
                                   state.request_doc(state.DEFAULT_REQUEST))
    plan, error = pages.first_result(doc, "layerwise")
    first = {"plan": plan, "error": error}
    assert "error" not in first["plan"] and first["plan"]["layers"]
    assert first["error"].startswith(f"URL: pins {pin} ignored") and doc["pins"] == []
    if pin.startswith("nosuchlayer"):
        assert "its 8 layers are x, conv1, pool1" in first["error"]

"""Compare across families (explorer/views/families.py, figures/families.py): the chart and
the table of ``service.compare_all``'s report - one row per method of every family, each
with what its prediction rests on, a stored run's measurement beside its prediction, a link
to its family's page - and bad input as one line."""

from urllib.parse import parse_qs, urlparse

import pytest

from explorer import service
from explorer.engine.runtime.store import RunStore, run_key
from explorer.views import families as V
from explorer.views import fmt
from explorer.views import palette as P
from explorer.views.figures import families as F

REQ = dict(model="mlp", batch=8, model_args={"hidden": 16, "layers": 1},
           preset="p100-cluster", devices=2, algo="optcnn", pins=[])

#: a report as ``service.compare_all`` returns it, by hand: three families, a plan that does
#: not fit, a method that cannot plan, one stored run
REPORT = {
    "request": {**REQ, "cluster": None},
    "best": "optcnn",
    "rows": [
        {"method": "optcnn", "family": "layerwise", "basis": "equation 1", "batch": 8,
         "predicted_step_s": 2e-3, "peak_bytes": 3 * 2**20, "comm_bytes": 0.0,
         "search_time_s": 0.05, "fits_memory": True, "measured_step_s": 2.5e-3,
         "error": -0.2, "run_id": 1, "run_time": "2026-11-28 03:00", "reference": "ok"},
        {"method": "tofu", "family": "tofu", "basis": "links + slowest compute", "batch": 8,
         "predicted_step_s": 3e-3, "peak_bytes": 2 * 2**20, "comm_bytes": 2**20,
         "search_time_s": 0.1, "fits_memory": True, "measured_step_s": None},
        {"method": "celeritas", "family": "placement", "basis": "simulated schedule",
         "batch": 8, "predicted_step_s": 4e-3, "peak_bytes": 5 * 2**20,
         "comm_bytes": 2**19, "search_time_s": 0.02, "fits_memory": True,
         "measured_step_s": None},
        {"method": "single", "family": "placement", "basis": "simulated schedule", "batch": 8,
         "predicted_step_s": 1e-3, "peak_bytes": 9 * 2**30, "comm_bytes": 0.0,
         "search_time_s": 0.001, "fits_memory": False, "measured_step_s": None},
        {"method": "data", "family": "layerwise", "basis": "equation 1",
         "failed": "data parallelism needs a batch divisible by 3"},
    ]}


def test_figure_draws_every_family_with_its_basis_in_the_legend():
    fig = F.families_figure(REPORT)
    bars = [t for t in fig.data if t.type == "bar" and t.y[0] is not None]
    # three panels (step, memory, bytes) per family; one legend entry per family
    assert len(bars) == 9
    legend = [t.name for t in bars if t.showlegend]
    assert legend == ["layer-wise · equation 1", "Tofu · links + slowest compute",
                      "placement · simulated schedule"]
    for t in bars:
        fam = {"layer-wise": "layerwise", "Tofu": "tofu", "placement": "placement"}[
            t.name.split(" · ")[0]]
        assert t.marker.color == P.FAMILY_COLORS[fam]
    # one row per method, the fastest predicted at the top (plotly lists categories upwards)
    assert list(fig.layout.yaxis.categoryarray) == [r["method"] for r in REPORT["rows"]][::-1]
    # the step panel in the unit its magnitude calls for, with each bar's value
    step = {t.y[i]: (t.x[i], t.text[i]) for t in bars if t.xaxis == "x"
            for i in range(len(t.y))}
    assert fig.layout.xaxis.title.text == "predicted step (ms)"
    assert step["tofu"][0] == pytest.approx(3.0) and step["tofu"][1] == fmt.seconds(3e-3)
    assert fig.layout.xaxis2.title.text == "peak memory per device (GiB)"
    # the stored run's measurement as a diamond beside its prediction
    meas = [t for t in fig.data if t.type == "scatter" and t.name]
    assert len(meas) == 1 and list(meas[0].y) == ["optcnn"]
    assert meas[0].x[0] == pytest.approx(2.5) and meas[0].marker.symbol == "diamond"
    # a plan that does not fit is hatched (and the hatching named once in the legend)
    single = next(t for t in bars if "single" in t.y and t.xaxis == "x")
    assert single.marker.pattern.shape[list(single.y).index("single")] == "x"
    assert any(t.name == "does not fit memory" for t in fig.data)
    # a method that cannot plan keeps its row, with the reason
    notes = [a for a in fig.layout.annotations if a.y == "data"]
    assert len(notes) == 1 and "cannot plan: data parallelism" in notes[0].text
    assert "mlp · batch 8 · 2 × p100-cluster" in fig.layout.title.text
    assert "fastest predicted that fits: optcnn" in fig.layout.title.text


def test_step_panel_turns_logarithmic_when_steps_span_orders_of_magnitude():
    # a measurement 100x its prediction (an uncalibrated roofline on a CPU): the predicted bars
    # must stay readable beside it
    rows = [dict(r) for r in REPORT["rows"]]
    rows[1]["measured_step_s"], rows[1]["error"] = 0.3, -0.99
    fig = F.families_figure({**REPORT, "rows": rows})
    assert fig.layout.xaxis.type == "log"
    assert fig.layout.xaxis.title.text == "predicted step (ms, log scale)"
    lo, hi = fig.layout.xaxis.range
    assert 10 ** lo < 1.0 < 300.0 < 10 ** hi               # 1 ms .. 300 ms inside the axis
    assert fig.layout.xaxis2.type != "log"                  # memory and bytes stay linear
    note = next(a for a in fig.layout.annotations if a.y == "data")
    assert note.x == pytest.approx(lo)                      # "cannot plan" at the left edge


def test_figure_before_any_comparison_says_what_to_press():
    fig = F.families_figure(None)
    assert not fig.data and F.FIRST in fig.layout.annotations[0].text
    assert fig.layout.xaxis.visible is False


def test_table_rows_one_per_method_with_basis_measured_and_link():
    rows = V.table_rows(REPORT, {"tofu": "Tofu's recursive partition"})
    assert [r["method"] for r in rows] == [r["method"] for r in REPORT["rows"]]
    by = {r["method"]: r for r in rows}
    assert [by[m]["rank"] for m in ("optcnn", "tofu", "celeritas", "single")] == \
        ["1", "2", "3", "4"]
    assert by["optcnn"]["best"] == "1" and by["tofu"]["best"] == "0"
    assert {r["basis"] for r in rows} == {"equation 1", "links + slowest compute",
                                          "simulated schedule"}
    assert by["optcnn"]["family"] == "layer-wise" and by["tofu"]["family"] == "Tofu"
    assert by["optcnn"]["predicted"] == "2.00 ms"
    assert by["optcnn"]["measured"] == "2.50 ms (-20 %)"
    assert by["tofu"]["measured"] == "not run"
    assert by["single"]["fits"] == "NO" and by["single"]["peak"] == "9.00 GiB"
    assert by["tofu"]["note"] == "Tofu's recursive partition"
    assert by["data"]["rank"] == "–" and by["data"]["note"].startswith("cannot plan: data")
    # each row opens its plan on its family's page: same request, its method, no pins
    for method, path in (("optcnn", "/"), ("tofu", "/tofu"), ("celeritas", "/placement")):
        link = by[method]["open"]
        href = link[link.index("(") + 1:-1]
        url = urlparse(href)
        q = parse_qs(url.query)
        assert url.path == path and q["algo"] == [method] and q["model"] == ["mlp"]
        assert q["devices"] == ["2"] and q["batch"] == ["8"] and "pin" not in q
        assert sorted(q["arg"]) == ["hidden=16", "layers=1"]


def test_basis_note_says_the_families_are_not_one_currency():
    text = str(V.basis_note(REPORT))
    assert "not one currency" in text
    for f in ("layer-wise · equation 1", "Tofu · links + slowest compute",
              "placement · simulated schedule"):
        assert f in text
    assert "1 of 4 plans have a measured step" in text
    none = {**REPORT, "rows": [dict(r, measured_step_s=None) for r in REPORT["rows"]]}
    assert "None of these plans has run here yet" in str(V.basis_note(none))
    assert "explorer rank" not in str(V.basis_note(none))        # p100-cluster's plans
    local = {**none, "request": {**none["request"], "preset": "local"}}
    assert "explorer rank mlp --devices 2 --preset local" in str(V.basis_note(local))


@pytest.mark.slow
def test_run_families_on_the_real_service_and_a_stored_run(monkeypatch):
    methods = ["data", "optcnn", "tofu", "celeritas"]
    monkeypatch.setattr(service, "all_methods", lambda: methods)
    req = service.Request(model="mlp", batch=8, model_args={"hidden": 16, "layers": 1},
                          preset="p100-cluster", devices=2)
    res = service.result(req.replace(algo="data"), "data")
    RunStore().add(run_key(res.document()), {
        "model": "mlp", "algo": "data", "devices": 2,
        "predicted_step_time_s": res.predicted_step_time_s, "measured_step_time_s": 0.5,
        "reference_ok": True})
    seen = []
    out = V.run_families(REQ, lambda pct, text: seen.append((pct, text)))
    assert "error" not in out
    assert sorted(r["method"] for r in out["rows"]) == sorted(methods)
    assert {r["family"] for r in out["rows"]} == {"layer-wise", "Tofu", "placement"}
    data = next(r for r in out["rows"] if r["method"] == "data")
    assert data["measured"].startswith("500 ms")
    assert [p for p, _ in seen] == sorted(p for p, _ in seen) and len(seen) == 4
    assert "mlp, batch 8, 2 × p100-cluster" in out["status"]
    assert "3 families" in out["status"]
    assert any(t.type == "scatter" and t.name for t in out["figure"].data)


def test_pressed_again_on_the_same_request_only_the_runs_are_read_again(monkeypatch):
    calls = []
    monkeypatch.setattr(service, "compare_all",
                        lambda req, methods, progress: calls.append(req) or REPORT)
    monkeypatch.setattr(service, "remeasure", lambda rep: {**rep, "again": True})
    first = V.run_families(REQ)
    assert len(calls) == 1 and first["store"]["report"] is REPORT
    again = V.run_families(REQ, last=first["store"])
    assert len(calls) == 1 and again["report"]["again"]          # no search
    assert "runs read again" in again["status"]
    other = V.run_families(dict(REQ, devices=4), last=first["store"])
    assert len(calls) == 2 and calls[-1].devices == 4           # another request: searched
    assert "runs read again" not in other["status"]


@pytest.mark.parametrize("doc,words", [
    (dict(REQ, preset="nosuchpreset"), "unknown device preset 'nosuchpreset'"),
    (dict(REQ, devices=0), "devices"),
    (dict(REQ, model="nosuchmodel"), "unknown model 'nosuchmodel'"),
])
def test_bad_requests_are_one_line(doc, words):
    out = V.run_families(doc)
    assert set(out) == {"error"}
    assert out["error"].startswith("cannot compare across families: ")
    assert words in out["error"] and "\n" not in out["error"]

"""Rank by running (explorer/views/ranking.py, figures/ranking.py): the table, the lines above
it (τ, regret, the noise seen) and the predicted-against-measured chart of ``service.rank``'s
report, the inputs checked in one line, and the button off unless the preset is local."""

import copy

import pytest

from explorer import service
from explorer.views import fmt
from explorer.views import palette as P
from explorer.views import ranking as V
from explorer.views.figures import ranking as F

REQ = dict(model="lenet5", batch=8, model_args={}, preset="local", devices=2, algo="optcnn",
           pins=[])


def _noise(steal, change, iqr, note=None):
    return {"steal": steal, "canary_change": change, "spread": {"iqr_rel": iqr},
            "noisy": note is not None, "note": note}


#: a report as ``service.rank`` returns it, by hand: three plans of three families that ran
#: two rounds (data predicted fastest, tofu measured fastest), one method that cannot plan
REPORT = {
    "request": {**REQ, "cluster": None}, "rounds": 2, "steps": 3, "warmup": 2,
    "rows": [
        {"method": "data", "family": "layerwise", "basis": "equation 1",
         "predicted_step_s": 1e-3, "rounds_s": [4e-3, 5e-3], "measured_step_s": 4.5e-3,
         "measured_min_s": 4e-3, "error": (1e-3 - 4.5e-3) / 4.5e-3, "reference_ok": True,
         "noisy": False, "predicted_rank": 1, "measured_rank": 2,
         "noise": [_noise(0.01, 0.02, 0.05), _noise(0.02, -0.04, 0.08)]},
        {"method": "tofu", "family": "tofu", "basis": "links + slowest compute",
         "predicted_step_s": 2e-3, "rounds_s": [3e-3, 3e-3], "measured_step_s": 3e-3,
         "measured_min_s": 3e-3, "error": (2e-3 - 3e-3) / 3e-3, "reference_ok": True,
         "noisy": False, "predicted_rank": 2, "measured_rank": 1,
         "noise": [_noise(0.0, 0.03, 0.10), _noise(0.0, 0.01, 0.12)]},
        {"method": "celeritas", "family": "placement", "basis": "simulated schedule",
         "predicted_step_s": 3e-3, "rounds_s": [6e-3, 7e-3], "measured_step_s": 6.5e-3,
         "measured_min_s": 6e-3, "error": (3e-3 - 6.5e-3) / 6.5e-3, "reference_ok": True,
         "noisy": False, "predicted_rank": 3, "measured_rank": 3,
         "noise": [_noise(0.0, 0.05, 0.02), _noise(0.0, 0.06, 0.03)]},
        {"method": "megatron", "family": "layerwise", "basis": "equation 1",
         "rounds_s": [], "noise": [], "failed": "search: megatron needs attention heads"},
    ],
    "kendall_tau": 1 / 3, "regret": 4.5e-3 / 3e-3 - 1.0, "max_steal": 0.02, "noisy": False,
    "noise_note": None}


def noisy_report():
    rep = copy.deepcopy(REPORT)
    note = "noisy timing: the machine ran 37 % slower at the end than at the start"
    rep["rows"][2]["noise"][1] = _noise(0.0, 0.37, 0.03, note)
    rep["rows"][2]["noisy"] = True
    rep["noisy"] = True
    rep["noise_note"] = ("noisy ranking: 1 of 6 runs were noisy (the machine ran 37 % slower "
                         "at the end than at the start) - the measured order may not be the "
                         "machine's")
    return rep


def test_table_rows_fastest_measured_first_with_predicted_median_min_and_error():
    rows = V.table_rows(REPORT)
    assert [r["method"] for r in rows] == ["tofu", "data", "celeritas", "megatron"]
    data = rows[1]
    assert data["measured_rank"] == "2" and data["predicted_rank"] == "1"
    assert data["predicted"] == fmt.seconds(1e-3) == "1.00 ms"
    assert data["median"] == "4.50 ms" and data["min"] == "4.00 ms"
    assert data["error"] == "-78 %" and data["check"] == "ok"
    assert data["family"] == "layer-wise" and data["basis"] == "equation 1"
    assert rows[0]["error"] == "-33 %" and rows[0]["family"] == "Tofu"
    # a method that cannot plan keeps its row, with the reason and no numbers
    bad = rows[3]
    assert bad["measured_rank"] == "–" and bad["median"] == "–"
    assert bad["note"] == "search: megatron needs attention heads"
    # every column the table declares is filled in every row
    fields = [f for f, _ in V.COLUMNS]
    assert all(set(fields) <= set(r) for r in rows)


def test_a_noisy_run_is_marked_on_its_row():
    rows = {r["method"]: r for r in V.table_rows(noisy_report())}
    assert rows["celeritas"]["note"] == "noisy run" and rows["data"]["note"] == ""


def test_headline_gives_tau_and_the_regret_with_the_plans_it_compares():
    line = V.headline(REPORT)
    assert "Kendall τ +0.33 between the predicted and measured orders" in line
    assert ("regret 50 %: the plan predicted fastest, data, measured 4.50 ms; the fastest "
            "measured, tofu, 3.00 ms") in line
    # the plan predicted fastest ran fastest: no regret
    rep = copy.deepcopy(REPORT)
    rep["rows"][0]["measured_step_s"], rep["rows"][1]["measured_step_s"] = 3e-3, 4.5e-3
    rep["rows"][0]["measured_rank"], rep["rows"][1]["measured_rank"] = 1, 2
    rep["regret"], rep["kendall_tau"] = 0.0, 1.0
    assert V.headline(rep).endswith("regret 0 %: the plan predicted fastest, data, ran fastest")
    # one plan: no order to compare
    one = {**REPORT, "rows": REPORT["rows"][:1], "kendall_tau": None, "regret": 0.0}
    one["rows"] = [dict(REPORT["rows"][0], predicted_rank=1, measured_rank=1)]
    assert "Kendall τ – between" in V.headline(one) and "(it needs two plans)" in V.headline(one)


def test_noise_line_gives_the_worst_steal_canary_and_spread_over_the_runs():
    line = V.noise_line(REPORT)
    assert line.startswith("noise over 6 runs: ")
    assert "CPU stolen up to 2.0 %" in line
    assert "canary changed up to 6 %" in line            # |−4 %| < 6 %: the largest change
    assert "steps' spread (IQR / median) up to 12 %" in line
    assert line.endswith("none above the noise thresholds")
    assert "none above" not in V.noise_line(noisy_report())
    assert "canary changed up to 37 %" in V.noise_line(noisy_report())
    no_steal = copy.deepcopy(REPORT)
    for r in no_steal["rows"]:
        for n in r["noise"]:
            n["steal"] = None
    assert "CPU steal not reported here" in V.noise_line(no_steal)


def test_summary_says_a_noisy_ranking_in_one_line_and_a_clean_one_not():
    def texts(rep):
        return [str(c.children if isinstance(c.children, str) else c.children.children)
                for c in V.summary(rep)]
    clean = texts(REPORT)
    assert len(clean) == 2 and not any("noisy ranking" in t for t in clean)
    noisy = texts(noisy_report())
    assert len(noisy) == 3 and noisy[2] == noisy_report()["noise_note"]
    assert "\n" not in noisy[2]


@pytest.mark.parametrize("value,name,words", [
    (None, "rounds", "rounds: enter a whole number from 1 to 20"),
    ("abc", "rounds", "rounds: enter a whole number from 1 to 20"),
    (0, "rounds", "from 1 to 20, not 0"),
    (21, "rounds", "not 21"),
    (2.5, "steps", "steps: enter a whole number from 1 to 500, not 2.5"),
])
def test_bad_counts_are_one_line(value, name, words):
    bounds = V.ROUNDS if name == "rounds" else V.STEPS
    with pytest.raises(ValueError) as err:
        V.count(value, name, bounds)
    assert words in str(err.value) and "\n" not in str(err.value)


def test_good_counts_and_methods_pass():
    assert V.count(3, "rounds", V.ROUNDS) == 3 and V.count("2", "steps", V.STEPS) == 2
    assert V.count(4.0, "steps", V.STEPS) == 4
    assert V.chosen([["data"], None, ["celeritas", "metis"]]) == ["data", "celeritas", "metis"]
    with pytest.raises(ValueError, match="tick at least one method"):
        V.chosen([[], None, []])


def test_the_button_is_on_only_for_the_local_preset():
    assert V.gate({**REQ}) == (False, "")
    off, why = V.gate({**REQ, "preset": "p100-cluster"})
    assert off and "choose the 'local' devices preset" in why and "p100-cluster" in why
    assert "\n" not in why
    assert V.gate(None)[0] is True


def test_method_choices_are_the_comparison_lists_with_the_defaults_among_them():
    got = V.method_choices()
    assert list(got) == ["layerwise", "tofu", "placement"]
    values = [o["value"] for opts in got.values() for o in opts]
    assert values == service.all_methods()
    assert set(service.RANK_METHODS) <= set(values)
    assert got["layerwise"][0]["label"].title.startswith("data parallelism")


def test_progress_goes_from_the_searches_through_every_round():
    methods = ["data", "tofu"]
    msgs = ["searching data", "searching tofu", "round 1/2: running data",
            "round 1/2: running tofu", "round 2/2: running data", "round 2/2: running tofu"]
    pcts = [V.progress_pct(m, methods, 2) for m in msgs]
    assert pcts == sorted(pcts) and len(set(pcts)) == len(pcts)
    assert pcts[0] == 0 and pcts[-1] < 100
    assert V.progress_pct("something else", methods, 2) == 0


def test_figure_puts_each_plan_at_predicted_and_measured_with_the_diagonal():
    fig = F.ranking_figure(REPORT)
    points = [t for t in fig.data if t.mode == "markers+text"]
    assert [t.name for t in points] == ["layer-wise · equation 1",
                                        "Tofu · links + slowest compute",
                                        "placement · simulated schedule"]
    assert [t.marker.color for t in points] == [P.FAMILY_COLORS[f]
                                                for f in ("layerwise", "tofu", "placement")]
    data = points[0]
    assert list(data.text) == ["data"]              # the plan that cannot plan is not drawn
    assert data.x[0] == pytest.approx(1.0) and data.y[0] == pytest.approx(4.5)
    # a bar down to the fastest round
    assert data.error_y.arrayminus[0] == pytest.approx(0.5) and data.error_y.array[0] == 0
    line = next(t for t in fig.data if t.name == F.IDEAL_NAME)
    assert list(line.x) == list(line.y) and line.line.dash == "dash"
    # one unit and one range on both axes, so y = x is the diagonal
    assert fig.layout.xaxis.title.text == "predicted step (ms)"
    assert fig.layout.yaxis.title.text.startswith("measured step (ms)")
    assert tuple(fig.layout.xaxis.range) == tuple(fig.layout.yaxis.range)
    assert fig.layout.xaxis.range[1] >= 6.5 and fig.layout.xaxis.type == "linear"
    assert "Kendall τ +0.33 · regret 50 %" in fig.layout.title.text
    assert "lenet5 · batch 8 · 2 local workers · 2 round(s) of 3 steps" in fig.layout.title.text


def test_figure_turns_logarithmic_when_steps_span_orders_of_magnitude():
    rep = copy.deepcopy(REPORT)
    rep["rows"][0].update(predicted_step_s=1e-5)
    fig = F.ranking_figure(rep)
    assert fig.layout.xaxis.type == "log" and fig.layout.yaxis.type == "log"
    assert "log scale" in fig.layout.xaxis.title.text
    # labelled in full at 1, 2, 5 of each decade, on both axes alike
    assert list(fig.layout.xaxis.ticktext)[:3] == ["0.01", "0.02", "0.05"]
    assert "1" in fig.layout.xaxis.ticktext and "5" in fig.layout.xaxis.ticktext
    assert list(fig.layout.yaxis.tickvals) == list(fig.layout.xaxis.tickvals)
    line = next(t for t in fig.data if t.name == F.IDEAL_NAME)
    assert line.x[0] <= 1e-2 and line.x[1] >= 6.5         # ms, over every point


def test_figure_before_any_ranking_says_what_to_press():
    for rep in (None, {"rows": [REPORT["rows"][3]]}):
        fig = F.ranking_figure(rep)
        assert not fig.data and "press Rank by running" in fig.layout.annotations[0].text


def test_run_ranking_hands_the_inputs_to_the_service_and_draws_its_report(monkeypatch):
    calls = []

    def rank(req, methods, rounds, steps, progress):
        calls.append((req.model, req.preset, methods, rounds, steps))
        progress("round 1/2: running data")
        return REPORT
    monkeypatch.setattr(V.session, "rank", rank)
    said = []
    out = V.run_ranking(REQ, [["data"], ["tofu"], ["celeritas"]], 2, "3",
                        lambda pct, text: said.append((pct, text)))
    assert "error" not in out, out
    assert calls == [("lenet5", "local", ["data", "tofu", "celeritas"], 2, 3)]
    assert said == [(33, "round 1/2: running data…")]   # 3 searches of 9 parts
    assert [r["method"] for r in out["rows"]] == ["tofu", "data", "celeritas", "megatron"]
    assert out["figure"].layout.title.text.startswith(F.TITLE)
    assert out["status"].startswith("lenet5, batch 8, 2 local workers · 3 plans × 2 round(s) "
                                    "of 3 steps · not ranked: megatron · ")


@pytest.mark.parametrize("doc,rounds,steps,methods,words", [
    ({**REQ, "preset": "p100-cluster"}, 1, 1, [["data"]], "choose the 'local' devices preset"),
    (REQ, 0, 1, [["data"]], "rounds: enter a whole number"),
    (REQ, 1, None, [["data"]], "steps: enter a whole number"),
    (REQ, 1, 1, [[], []], "tick at least one method"),
    ({**REQ, "devices": 0}, 1, 1, [["data"]], "devices"),
])
def test_bad_input_is_one_line_and_runs_nothing(monkeypatch, doc, rounds, steps, methods,
                                                words):
    monkeypatch.setattr(V.session, "rank", lambda *a, **k: pytest.fail("ranked bad input"))
    out = V.run_ranking(doc, methods, rounds, steps)
    assert set(out) == {"error"} and out["error"].startswith("cannot rank: ")
    assert words in out["error"] and "\n" not in out["error"]

"""Explanations and units the app shows, as plain functions: the one formatter, the
glossary, equations 1-3 with a step's numbers (carried by the search trace), the candidate
table's transfer and "why" columns, colours, CSV, and the Run panel's cost-model line."""

import itertools

import pytest

from explorer import service as session
from explorer.views import fmt, glossary, graph, palette, placement, run, steps, tables
from explorer.views import search_form as model

REQ = session.Request(model="vgg16", preset="p100-nvlink-4", devices=4, algo="optcnn")


@pytest.fixture(scope="module")
def plan():
    return session.search(REQ)


def test_units_follow_the_magnitude():
    assert fmt.bytes_(0) == "0 B" and fmt.bytes_(800e-6 * 2 ** 30) == "839 KiB"
    assert fmt.bytes_(3.5 * 2 ** 30) == "3.50 GiB"
    assert fmt.seconds(4.06e-3) == "4.06 ms" and fmt.seconds(0.8e-3) == "800 µs"
    assert fmt.flops(2.3e6) == "2.30 MFLOP"
    assert fmt.of(3.52 * 2 ** 20, 16 * 2 ** 30) == "3.52 MiB of 16.0 GiB"
    assert fmt.percent(1, 5000) == "<1 %" and fmt.percent(29, 50) == "58 %"
    assert fmt.scale(800e-6 * 2 ** 30) == ("KiB", 1024)


def test_small_models_never_read_zero_gigabytes():
    lenet = session.Request(model="lenet5", preset="p100-nvlink-4", devices=4)
    text = model.summary_text(lenet)
    assert "0.00" not in text and " 0 MiB" not in text and "MFLOP" in text
    summary, _, _ = graph.summary_view(session.search(lenet), [])
    assert "0.00 GiB" not in str(summary) and "KiB" in str(summary) or "MiB" in str(summary)


def test_glossary_explains_letters_symbols_equations():
    parts = glossary.explain("n4 c4 costs t_C + t_X by equation 2 (Theorem 1)")
    terms = [p for p in parts if not isinstance(p, str)]
    assert [t.children for t in terms] == ["n4", "c4", "t_C", "t_X", "equation 2", "Theorem 1"]
    assert "sample" in terms[0].title and "channel" in terms[1].title
    assert "node elimination" in terms[4].title
    for key in ("n", "c", "h", "w", "l", "k", "t_C", "t_X", "t_S", "t_R"):
        assert glossary.GLOSSARY[key]


def test_trace_carries_the_numbers_of_equations_1_to_3(plan):
    trace = plan["trace"]
    node = next(s for s in trace if s["kind"] == "node")
    q = node["eq2"]
    assert q["total_s"] == pytest.approx(q["t_in_s"] + q["t_compute_s"] + q["t_sync_s"]
                                         + q["t_reduce_s"] + q["t_out_s"])
    final = next(s for s in trace if s["kind"] == "final")
    assert final["eq1"]["nodes_s"] + final["eq1"]["edges_s"] == pytest.approx(
        plan["objective_s"])
    # each undo picks the c_j equation 2 minimised for the neighbours' final choices
    chosen = {la["name"]: la["config_label"] for la in plan["layers"]}
    for s in (s for s in trace if s["kind"] == "undo"):
        assert s["eq2"]["c_j"] == chosen[s["node"]]
        assert s["eq2"]["c_i"] == chosen[s["src"]] and s["eq2"]["c_k"] == chosen[s["dst"]]
    lines = [str(d.children) for d in steps.equations(node, plan)]
    assert "equation 2" in lines[0] and "=" in lines[-1]
    assert "objective" in str(steps.equations(final, plan)[-1].children)


def test_edge_elimination_numbers_add_up():
    g = session.Request(model="resnet50", preset="p100-nvlink-4", devices=2, batch=8)
    trace = session.search(g)["trace"]
    edge = next(s for s in trace if s["kind"] == "edge")
    q = edge["eq3"]
    assert q["total_s"] == pytest.approx(q["t_1_s"] + q["t_2_s"])
    assert "equation 3" in str(steps.equations(edge)[0].children)


def test_slider_counts_from_one_like_the_text(plan):
    index, text, _ = steps.shown_step(3, "steps", plan)
    assert index == 2 and "Step 3/" in "".join(t if isinstance(t, str) else t.children
                                               for t in text)


def test_candidate_table_has_transfer_and_why(plan):
    rows = session.candidates(REQ, "features_24", plan)
    chosen = next(r for r in rows if r["chosen"])
    for r in rows:
        assert r["total_ms"] == pytest.approx(r["t_compute_ms"] + r["t_sync_ms"]
                                              + r["t_reduce_ms"] + r["t_xin_ms"]
                                              + r["t_xout_ms"], abs=1e-3)
    # given the neighbours' choices, the chosen configuration is the cheapest (optimality)
    assert chosen["total_ms"] <= min(r["total_ms"] for r in rows) + 1e-6
    shown = graph.why_lines(rows)
    assert next(r for r in shown if r["chosen"])["why"].startswith("chosen:")
    other = next(r for r in shown if not r["chosen"] and r["total_ms"] > chosen["total_ms"])
    assert "vs chosen" in other["why"] and "t_" in other["why"]
    assert graph.device_ranges("0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15") == "0–15"


def test_step_colours_stay_apart_from_configuration_colours():
    for s, c in itertools.product(palette.STEP_COLORS.values(), palette.CONFIG_COLORS):
        assert palette.distance(s, c) > 100
    labels = ["h4 w4", "n8 c2", "n4 c4", "n4", "n16", "c16", "n2 c2", "n4 h4"]
    colors = palette.config_colors(labels)
    for a, b in itertools.combinations(labels, 2):
        assert palette.distance(colors[a], colors[b]) >= palette.CONFIG_APART
    # a busier plan (16 devices): still no two alike
    labels += ["n2 c8", "h16", "n8 h2"]
    colors = palette.config_colors(labels)
    assert min(palette.distance(colors[a], colors[b])
               for a, b in itertools.combinations(labels, 2)) >= 50


def test_csv_has_the_tables_columns_and_rows():
    text = tables.csv_text([{"a": 1, "b": "x, y"}, {"a": 2}], [("a", "A"), ("b", "B")])
    assert text.splitlines() == ["A,B", '1,"x, y"', "2,"]
    assert tables.csv_name("layers", {"model": "vgg16", "algo": "optcnn"}) == \
        "vgg16-optcnn-layers.csv"


def test_model_labels_and_args_hints():
    assert model.first_clause("LSTM seq2seq (NMT-style, Wu et al. 2016): x") == \
        "LSTM seq2seq (NMT-style, Wu et al. 2016)"
    assert "depth" in model.args_placeholder("wresnet")
    assert "depth" not in model.args_placeholder("lenet5")
    assert model.args_placeholder("transformer") != model.args_placeholder("wresnet")


def test_oom_text_agrees_with_the_memory_chart():
    """One memory verdict: OOM only when a simulated peak is over its capacity; a placer's
    budget exceeded while the peaks fit is a note, not OOM."""
    base = {"oom": False, "peak_memory_bytes": [0.58e9, 0.5e9], "capacity_bytes": [1e9, 1e9],
            "best_effort": ["op3"]}
    note = placement.memory_note(base)
    assert "OOM" not in note and note.startswith(" fits:") and "simulated peaks below fit" in note
    over = dict(base, oom=True, peak_memory_bytes=[1.2e9, 0.5e9])
    assert "exceeds the capacity of device 0" in placement.memory_note(over)
    assert placement.memory_note(dict(base, best_effort=[])) == ""


def test_run_panel_names_the_cost_model_without_cli_flags(plan):
    info = session.cost_model_info(plan)
    assert info["cost"] == "analytic" and "roofline" in info["text"]
    assert "not this machine" in info["text"]
    measured = dict(plan, request=dict(plan["request"], cost="measured", preset="local"),
                    preset="local")
    assert session.cost_model_info(measured)["text"].startswith("measured")
    warn = ("the plan's predictions are for preset 'p100-nvlink-4', not this machine: search "
            "with --preset local to compare with measurements")
    assert "--" not in run.ui_text(warn) and "'local' devices preset" in run.ui_text(warn)


def test_tiling_regions_are_shaded_labelled_hover_boxes():
    from explorer.views import tiling
    from explorer.views.figures import tiling as TF
    plan = session.search(REQ)
    geom, producers = tiling.layer_geometry(plan, REQ.to_dict(), "features_24")
    one = TF.tiling_figure(geom, 0, producers)
    regions = [t for t in one.data if t.meta == "needed region"]
    assert regions and all(t.fill == "toself" and t.hoveron == "fills" for t in regions)
    assert "needs" in regions[0].name                       # the hover says what is read
    assert any("halo" in a.text for a in one.layout.annotations)
    every = TF.tiling_figure(geom, "all", producers)
    colors = {t.fillcolor for t in every.data if t.meta == "needed region"}
    assert len(colors) == 4                                 # every device's region shaded


def test_strip_thumbnails_name_the_split_dimensions():
    from explorer.views.figures import tiling as TF
    layers = [{"name": "a", "op": "conv", "config": {"n": 4, "c": 4, "h": 1, "w": 1},
               "config_label": "n4 c4", "devices": list(range(16))},
              {"name": "b", "op": "conv", "config": {"n": 1, "c": 1, "h": 4, "w": 4},
               "config_label": "h4 w4", "devices": list(range(16))}]
    fig = TF.strip_figure({"layers": layers, "devices": 16})
    dims = next(t for t in fig.data if t.meta == "strip-dimensions")
    assert list(dims.text) == ["n", "c", "h", "w"]


def test_the_page_holds_the_trace_by_reference_and_fetches_one_step(tmp_path, monkeypatch):
    """The plan store carries ``trace_ref`` (id, length, counts), not the 2-MB trace; the
    slider's step comes from the server (memory, else the file a background search wrote),
    and a trace gone from the server says so instead of showing nothing."""
    from explorer import service as session
    monkeypatch.setenv("EXPLORER_HOME", str(tmp_path))
    req = session.Request(model="lenet5", preset="p100-cluster", devices=4, batch=16)
    inline = session.search(req)
    kept = session.search(req, keep_trace=True)
    assert "trace" not in kept and kept["trace_ref"]["steps"] == len(inline["trace"])
    assert kept["trace_ref"]["counts"]["undo"] == sum(s["kind"] == "undo"
                                                      for s in inline["trace"])
    assert session.trace_of(kept) == inline["trace"]
    index, text, eq = steps.shown_step(2, "steps", kept)
    assert index == 1 and "Step 2/" in str(text) and eq
    session.layerwise._TRACES.clear()                          # another process: read from the file
    assert session.trace_of(kept) == inline["trace"]
    session.layerwise._TRACES.clear()
    for f in (tmp_path / "traces").glob("*.json"):
        f.unlink()
    assert session.trace_of(kept) is None
    assert steps.shown_step(2, "steps", kept)[1] == steps.GONE
    # the step-count line needs no trace at all
    assert f"{len(inline['trace'])} steps" in steps.reset_view(kept)[2]
    assert steps.reset_view(kept)[2] == steps.reset_view(inline)[2]
    # bookkeeping never changes a plan's identity in the history
    from explorer.engine.core.history import digest
    assert digest({k: v for k, v in kept.items() if k != "trace_ref"}) == digest(kept)


def test_learn_terms_and_configuration_1_carry_their_definition():
    from explorer.views import glossary as G
    got = G.explain("Standard Evaluation, then CPD-TOPO and Adjusting Placement; Baechi's "
                    "m-TOPO; the coarsened graph; at c_j = 1, not c_j = 12")
    tips = {str(p.children): p.title for p in got if not isinstance(p, str)}
    assert set(tips) == {"Standard Evaluation", "CPD-TOPO", "Adjusting Placement", "Baechi",
                         "coarsened graph", "c_j = 1"}
    assert "not split" in tips["c_j = 1"] and "critical path" in tips["CPD-TOPO"]


def test_a_pipelined_plans_summary_gives_its_pipeline_not_equation_1():
    """A pipelined plan's step overlaps its stages, so the summary names the schedule, the
    stages and micro-batches and the bubble instead of equation 1's sum (whose terms would
    not add up to the step)."""
    req = session.Request(model="llama", preset="local", devices=4, batch=8, algo="pipeline",
                          model_args=dict(layers=4, hidden=64, heads=4, kv_heads=2,
                                          intermediate=128, seq_len=16, vocab=100))
    plan = session.search(req)
    text = str(graph.summary_view(plan, [])[0])
    pipe = plan["pipeline"]
    assert "equation 1" not in text and "final graph" not in text
    assert f"({pipe['schedule']} pipeline)" in text
    assert f"{pipe['stages']} stages of 1 device, {pipe['micro_batches']} micro-batches of " \
           f"{pipe['micro_batch']} sample" in text            # 4 stages on 4 devices
    assert f"bubble {pipe['bubble_fraction'] * 100:.0f} %" in text
    lenet = graph.summary_view(session.search(session.Request(model="lenet5")), [])[0]
    assert "equation 1" in str(lenet) and "final graph" in str(lenet)

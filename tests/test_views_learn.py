"""The Learn page without a browser: registered at /learn, its first render computes
nothing (scenarios compute in their callbacks), the tour's steps, every scenario's view
function and the figures drawn from plain dicts."""

import pytest

from explorer import service as S
from explorer.views import learn
from explorer.views.figures import learn as LF
from explorer.views.learn import celeritas, optcnn, paper, tofu


def test_page_is_registered_at_learn_and_linked_from_the_header():
    import dash

    from explorer.app import create_app
    app = create_app()
    pages = {p["path"]: p for p in dash.page_registry.values()}
    assert pages["/learn"]["name"] == "Learn"
    assert "href='/learn'" in str(app.layout)             # the header's page links


def test_first_render_computes_nothing(monkeypatch):
    """The page and any scenario's layout are built without a capture or a search."""
    def refuse(*a, **k):
        raise AssertionError("the layout must not compute")
    for name in ("graph_for", "run_method", "search", "candidates", "tiles", "scaling",
                 "compare", "tofu_compare", "placement_compare", "learn_dense",
                 "learn_elimination", "learn_conv1d", "learn_orders", "learn_recursion",
                 "learn_pipeline"):
        monkeypatch.setattr(S, name, refuse)
    page = learn.layout()
    assert "learn-optcnn-dims-section" in str(page)
    for key, build in learn.LAYOUTS.items():
        assert key in learn.SCENARIOS
        build()


def test_query_opens_a_scenario_and_unknown_falls_back():
    assert "learn-tofu-conv1d-section" in str(learn.layout(s="tofu-conv1d"))
    assert "learn-optcnn-dims-section" in str(learn.layout(s="nope"))


def test_tour_steps():
    hidden, content = learn.tour_step(None)
    assert hidden and content == []
    hidden, content = learn.tour_step(0)
    assert not hidden and "1 / 4" in str(content)
    hidden, content = learn.tour_step(99)                 # clamped to the last step
    assert not hidden and "4 / 4" in str(content)


def test_dims_scenario_uses_the_cost_model_and_geometry():
    layers, layer, configs, best, rows = optcnn.dims_options(4, 8, None)
    assert layer == "features_17"                         # Conv8, the paper's Figure 1 layer
    assert {c["label"] for c in configs} >= {"n4", "c4", "h4", "w4", "h2 w2"}
    times, tiles, reads, ours, href = optcnn.dims_figures(4, 8, layer, "n=1,c=1,h=2,w=2")
    # h2 w2: four devices each compute a quarter of every sample's plane
    assert len(tiles.data) == 4 + 4
    reads_y = reads.data[1].y                             # input region read, with halo
    out_y = reads.data[0].y
    assert all(r > 0 for r in reads_y) and len(set(out_y)) == 1
    assert "pin=features_17" in href and "model=vgg16" in href
    # what each device must fetch after a data-parallel layer: nothing under n4, three
    # quarters of the (whole) input under c4
    fetch = optcnn.dims_figures(4, 8, layer, "n=4,c=1,h=1,w=1", rows)[2].data[2].y
    assert list(fetch) == [0, 0, 0, 0]
    reads = optcnn.dims_figures(4, 8, layer, "n=1,c=4,h=1,w=1", rows)[2].data
    assert [f * 4 for f in reads[2].y] == [r * 3 for r in reads[1].y]


def test_dense_and_scale_scenarios_show_the_papers_comparison():
    fig, ours, href = optcnn.dense_figures(2, 32, "p100-nvlink-4")
    assert "the paper: 12×" in str(ours)
    assert [t.name for t in fig.data] == ["parameter synchronisation", "input transfer"]
    rows = optcnn.table5_rows()
    assert len(rows) == 8 and rows[0][2] == "n=4" and rows[4][2] == "h=2, w=2"


def test_elimination_view_steps_through_equations():
    doc = optcnn.elim_doc("lenet5", 2)
    eq, diagram, fig, ours, last = optcnn.elim_view(doc, 1, "any")
    assert last == len(doc["steps"])                  # the slider counts from 1, like the text
    assert f"Elimination 1 of {last}" in str(eq)
    assert "Equation 2" in fig.layout.title.text
    # Figure 5a: l_i -> l_j -> l_k before, one new edge e' after
    labels = [a.text for a in diagram.layout.annotations]
    assert {"e1", "e2", "e'"} <= set(labels)
    eq, diagram, fig, ours, last = optcnn.elim_view(doc, 0, "edge")   # a chain: no edge step
    assert "no such step" in eq


def test_tofu_and_celeritas_views():
    opts, sel, fig, ours = tofu.conv1d_view(2, 4, 4, 8, 3, 2, 3)
    assert sel == 3 and len(opts) == 5 and "sum" in fig.layout.title.text
    opts, sel, fig, ours = tofu.conv1d_view(2, 4, 4, 8, 3, 2, 42)   # out of range: first
    assert sel == 0
    fig, ours = celeritas.orders_view(4, 2, 2)
    titles = [a.text for a in fig.layout.annotations]
    assert titles == ["M-TOPO: 4 edges cut", "DFS-TOPO: 0 edges cut",
                      "fusion: 4 clusters: 0 edges cut"]


def test_figures_from_plain_dicts():
    step = {"kind": "edge", "src": "a", "dst": "b", "t_x1_s": 1e-6, "t_x2_s": 2e-6,
            "value_s": 3e-6}
    fig = LF.elimination_figure(step)
    assert list(fig.data[0].y) == pytest.approx([1, 2, 3])
    cmp = {"tofu": {"predicted_step_time_s": 0.001, "comm_bytes": 2 * 2 ** 20},   # MiB
           "spartan": {"predicted_step_time_s": 0.002, "comm_bytes": 4 * 2 ** 20},
           "icml18": {"error": "OOM"}}
    fig = LF.tofu_algorithms_figure(cmp)
    assert list(fig.data[0].x) == ["tofu", "spartan"] and list(fig.data[1].y) == [2, 4]
    rows = [{"algo": "celeritas", "step_time_s": 0.002, "search_time_s": 0.5, "oom": False},
            {"algo": "metis", "error": "no metis"}]
    fig = LF.placement_algorithms_figure(rows)
    assert list(fig.data[0].x) == ["celeritas"]


def test_paper_numbers_are_the_papers():
    assert paper.OPTCNN["speedup16"]["vgg16"] == (14.8, 10.2)
    assert paper.CELERITAS["table3"]["Inception_V3"][-1] == "2.859"
    assert paper.CELERITAS["fig3_cuts"] == {"M-TOPO": 4, "DFS-TOPO": 0}


def test_figure8_bytes_are_counted_alike_and_the_page_says_why_layerwise_moves_more():
    """OptCNN Fig. 8: layer-wise moving more bytes than OWT is equation 1 trading slow
    synchronisation bytes for fast transfer bytes, not a counting error: transfers and
    synchronisation are both what every device receives, forward and backward."""
    from explorer import service as session
    req = optcnn._req("vgg16", 4, 128)
    owt = session.search(req, algo="owt")
    # n4 -> c4 into the first dense layer: each device fetches 3/4 of the input forward and
    # 3/4 of its gradient backward - 2 (k-1) times the tensor, like a 4-replica PS sync
    e = next(e for e in owt["edges"] if e["dst"] == "classifier_0")
    act = 128 * 25088 * 4
    assert e["bytes"] == pytest.approx(2 * 3 * act)
    # OWT synchronises the 14,714,688 conv parameters of VGG-16 among 4 replicas through a
    # parameter server: 3 gradients in, 3 copies out (its dense layers have none to sync)
    assert owt["info"]["sync_bytes"] == pytest.approx(2 * 3 * 14_714_688 * 4)
    cmp = session.compare(req, None, ["owt", "optcnn"])
    why = optcnn.bytes_why(cmp)
    more = cmp["optcnn"]["comm_bytes"] > cmp["owt"]["comm_bytes"]
    assert why["more"] == more
    assert "minimises time, not bytes" in why["text"][0]
    assert cmp["optcnn"]["predicted_step_time_s"] <= cmp["owt"]["predicted_step_time_s"]
    # Table 5: the paper's plan under our costs is slower than ours; its last conv block
    # synchronises as much as n4, ours less
    t5 = optcnn.table5_why()
    assert t5["plans"]["paper"]["step_s"] >= t5["plans"]["ours"]["step_s"]
    convs = [r for r in t5["rows"] if r["paper"] == "h2 w2"]
    assert len(convs) == 3 and all(r["ours_sync_ms"] < r["paper_sync_ms"] for r in convs)
    assert all(r["ours_ms"] <= r["paper_ms"] for r in t5["rows"])
    view = str(optcnn.table5_why_view())
    assert "h2 w2" in view and "the paper's Table 5, our costs" in view


def test_the_minimum_arrow_points_at_the_chosen_bar_when_it_is_configuration_1():
    """Plotly reads an annotation's x "1" as position 1 (the second bar), even on a
    categorical axis: the "min: c_j*" arrow is placed by the chosen bar's position (the
    browser test checks where Chromium draws it)."""
    from explorer.views.figures.learn import elimination_figure
    rows = [{"config": c, "t_compute_s": t, "t_sync_s": 0.0, "t_reduce_s": 0.0,
             "t_x_in_s": 0.0, "t_x_out_s": 0.0, "total_s": t}
            for c, t in (("n2", 3e-6), ("c2", 2e-6), ("1", 1e-6))]
    fig = elimination_figure({"kind": "node", "node": "fc1", "rows": rows, "best": 2})
    assert fig.layout.xaxis.type == "category"
    # the arrow is placed by the bar's position (Plotly reads an x of "1" as position 1)
    assert fig.layout.annotations[0].x == 2 and list(fig.data[0].x) == ["n2", "c2", "1"]


def test_learn_titles_name_configurations_and_units_are_mib():
    from explorer.views.learn.common import fmt_bytes
    tiles = {"devices": [0, 1], "config": {"n": 1, "c": 2, "h": 1, "w": 1},
             "boxes": [[[0, 8], [0, 4]], [[0, 8], [4, 8]]], "inputs": [], "params": {}}
    title = LF.device_reads_figure(tiles).layout.title.text
    assert "under c2 (Figure 4)" in title and "{" not in title
    assert LF.config_label({"n": 1, "c": 1}) == "1" and LF.config_label("n2 c2") == "n2 c2"
    dense = LF.dense_figure({"layer": "fc6", "devices": 2, "strategies": [
        {"strategy": "data", "config": "n2", "sync_bytes": 2 ** 21, "xfer_bytes": 0}]})
    assert dense.layout.yaxis.title.text == "MiB per step"
    assert dense.data[0].y[0] == 2.0 and "MiB" in dense.data[0].texttemplate
    assert fmt_bytes(3 * 2 ** 20) == "3.00 MiB"
    # the title sits above the legend's own line
    lay = LF.elimination_figure({"kind": "edge", "src": "a", "dst": "b", "t_x1_s": 1e-6,
                                 "t_x2_s": 2e-6, "value_s": 3e-6}).layout
    assert lay.title.y > 0.9 and lay.margin.t >= 90


def test_recursion_view_counts_the_steps_of_the_workers():
    """Tofu Section 5.2: 2, 4, 8 workers take 1, 2, 3 recursion steps; the tree holds every
    worker group, the bars every step's bytes, and the table a row per step."""
    for workers, m in ((2, 1), (4, 2), (8, 3)):
        tree, steps, ours, href = tofu.recursion_view("lstm", workers)
        assert len(tree.data[0].ids) == 2 * workers - 1
        assert len(steps.data[0].y) == m and f"step {m} (×2)" in steps.data[0].x
        text = str(ours)
        assert f"{m} recursion step" in text and "MiB" in text and " MB" not in text
        assert "tofu" in href and f"devices={workers}" in href
    # the steps' bars add up to the total the line ends at
    assert sum(steps.data[0].y) == pytest.approx(steps.data[1].y[-1])


def test_pipeline_view_shows_the_four_stages_with_their_terms():
    fig, ours, href = celeritas.pipeline_view("seq2seq", 2)
    stages = list(fig.data[0].y)
    assert stages[:4] == ["Standard Evaluation", "CPD-TOPO", "Optimal Operation Fusion",
                          "Adjusting Placement"]
    assert list(fig.data[0].x)[2] <= list(fig.data[0].x)[0]       # clusters ≤ operators
    assert fig.layout.xaxis.type == "log"
    text = str(ours)
    for term in ("Standard Evaluation", "CPD-TOPO", "Optimal Operation Fusion",
                 "Adjusting Placement", "CCR"):
        assert f"children='{term}'" in text and "title=" in text, term
    assert "celeritas" in href


def test_recursion_and_pipeline_figures_from_plain_dicts():
    step = {"step": 1, "k": 2, "groups_before": 1, "groups_after": 2, "group_workers": 1,
            "delta_bytes": 3 * 2 ** 20, "total_bytes": 3 * 2 ** 20, "bytes_per_group":
            3 * 2 ** 20, "tensors": {"data": {"axis 0": 2}}, "ops": {"split": 2}, "top": []}
    doc = {"workers": 2, "total_bytes": 3 * 2 ** 20, "steps": [step],
           "tree": [{"id": "all", "parent": "", "step": 0, "workers": 2, "devices": "0–1"},
                    {"id": "s1g0", "parent": "all", "step": 1, "workers": 1, "devices": "0"},
                    {"id": "s1g1", "parent": "all", "step": 1, "workers": 1, "devices": "1"}]}
    tree = LF.recursion_tree_figure(doc)
    assert list(tree.data[0].labels) == ["2 workers: 3.00 MiB", "device 0<br>step 1",
                                         "device 1<br>step 1"]
    assert "2 axis 0" in tree.data[0].customdata[1]
    bars = LF.recursion_steps_figure(doc)
    assert list(bars.data[0].y) == [3.0] and bars.layout.yaxis.title.text.startswith("MiB")
    stages = [{"stage": "Standard Evaluation", "nodes": 10, "time_s": 4e-3},
              {"stage": "CPD-TOPO", "nodes": 10, "critical_path_s": 2e-3},
              {"stage": "Optimal Operation Fusion", "nodes": 3},
              {"stage": "Adjusting Placement", "nodes": 2, "placer_step_s": 3e-3,
               "step_s": 2.5e-3}]
    fig = LF.pipeline_figure({"model": "m", "devices": 2, "stages": stages})
    assert list(fig.data[0].x) == [10, 10, 3, 2]
    assert list(fig.data[1].x) == pytest.approx([4.0, 2.0, 3.0, 2.5])

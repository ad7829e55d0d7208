"""Tests for the tiling panel (explorer/views/tiling.py) and its figures
(explorer/views/figures/tiling.py) with real geometry from the session.

VGG-16 on the 4×P100 preset, batch 8, with ``features_24`` pinned to ``h=2,w=2``: its
output is [8, 512, 14, 14] in four 7×7 spatial tiles and its 3×3 convolution needs a one-row,
one-column halo from its neighbours' tiles of ``features_23``.
"""

from __future__ import annotations

import math

import dash
import pytest
from dash import dcc, html

from explorer import service as session
from explorer.views import ids, tiling
from explorer.views.figures import tiling as TF


@pytest.fixture(scope="module")
def req():
    return session.Request(model="vgg16", preset="p100-nvlink-4", devices=4, batch=8)


@pytest.fixture(scope="module")
def plan(req):
    return session.search(req, ["features_24=h=2,w=2"])


@pytest.fixture(scope="module")
def f24(plan, req):
    return tiling.layer_geometry(plan, req.to_dict(), "features_24")


def entry(plan, name):
    return next(la for la in plan["layers"] if la["name"] == name)


def panel(fig, section, pair):
    for p in fig.layout.meta["panels"]:
        if p["section"] == section and p["pair"] == pair:
            return p
    raise AssertionError(f"no {section} panel {pair}: {fig.layout.meta['panels']}")


def on(objs, p):
    """Traces or shapes drawn on panel ``p``."""
    return [o for o in objs if (o.xaxis if hasattr(o, "xaxis") else o.xref) == p["xaxis"]]


def tile_labels(fig, p):
    (t,) = [tr for tr in on(fig.data, p) if tr.meta == "tile-labels"]
    return list(t.text)


def fill_traces(fig, p):
    return [tr for tr in on(fig.data, p) if tr.fill == "toself"]


def test_output_hw_view_has_four_device_tiles(f24):
    geom, producers = f24
    assert geom["config"] == {"n": 1, "c": 1, "h": 2, "w": 2}
    fig = TF.tiling_figure(geom, "all", producers)
    hw = panel(fig, "output", "h × w")
    assert sorted(tile_labels(fig, hw)) == ["d0", "d1", "d2", "d3"]
    fills = fill_traces(fig, hw)
    colors = {tr.fillcolor for tr in fills}
    assert len(fills) == 4 and len(colors) == 4
    # each device's trace is one closed rectangle: 5 points + a gap
    assert all(len(tr.x) == 6 for tr in fills)
    # tiles meet at row/column 7 of the 14×14 map
    xs = sorted({x for tr in fills for x in tr.x if x is not None})
    assert xs == [0, 7, 14]
    # the n × c view shows one cell all four devices share (split along h, w)
    nc = panel(fig, "output", "n × c")
    assert tile_labels(fig, nc) == ["d0-3"]
    assert "features_24 (conv)" in fig.layout.title.text
    assert "h2 w2" in fig.layout.title.text and "devices 0-3" in fig.layout.title.text


def test_axis_titles_show_letters_and_sizes(f24):
    geom, producers = f24
    fig = TF.tiling_figure(geom, "all", producers)
    hw = panel(fig, "output", "h × w")
    n = hw["xaxis"][1:] or ""
    assert fig.layout[f"xaxis{n}"].title.text == "w (14)"
    assert fig.layout[f"yaxis{n}"].title.text == "h (14)"


def test_device0_halo_extends_one_row_and_column(f24):
    geom, producers = f24
    fig = TF.tiling_figure(geom, 0, producers)
    # its own output tile: rows/cols [0, 7), outlined solid
    out_hw = panel(fig, "output", "h × w")
    own = [s for s in on(fig.layout.shapes, out_hw) if s.line.dash == "solid"]
    assert [(s.y0, s.y1, s.x0, s.x1) for s in own] == [(0, 7, 0, 7)]
    # the region of features_23 it needs: [0, 8) × [0, 8) of 14 — one row/col of halo
    in_hw = panel(fig, "inputs", "h × w")
    dashed = [s for s in on(fig.layout.shapes, in_hw) if s.line.dash == "dash"]
    assert len(dashed) == 1
    (r,) = dashed
    assert (r.y0, r.y1, r.x0, r.x1) == (0, 8, 0, 8)
    assert r.line.color == TF.device_color(0)
    assert r.y1 - own[0].y1 == 1 and r.x1 - own[0].x1 == 1
    # this layer's own tile boundaries are dotted over the input, so the halo crosses them
    assert any(s.line.dash == "dot" and s.y1 == 7 for s in on(fig.layout.shapes, in_hw))
    # the input's producer keeps its own tiling (features_23 is n2 c2)
    in_nc = panel(fig, "inputs", "n × c")
    assert sorted(tile_labels(fig, in_nc)) == ["d0", "d1", "d2", "d3"]
    assert "features_23" in in_hw["title"] and "n2 c2" in in_hw["title"]


def test_all_devices_draw_every_region_in_its_colour(f24):
    geom, producers = f24
    fig = TF.tiling_figure(geom, "all", producers)
    in_hw = panel(fig, "inputs", "h × w")
    dashed = [s for s in on(fig.layout.shapes, in_hw) if s.line.dash == "dash"]
    got = {s.line.color: (s.y0, s.y1, s.x0, s.x1) for s in dashed}
    assert got == {TF.device_color(0): (0, 8, 0, 8), TF.device_color(1): (0, 8, 6, 14),
                   TF.device_color(2): (6, 14, 0, 8), TF.device_color(3): (6, 14, 6, 14)}


def test_weights_of_n_split_layer_are_replicated_x4(plan, req):
    name = next(la["name"] for la in plan["layers"]
                if la["op"] == "conv" and la["config_label"] == "n4")
    geom, producers = tiling.layer_geometry(plan, req.to_dict(), name)
    fig = TF.tiling_figure(geom, "all", producers)
    wpanels = [p for p in fig.layout.meta["panels"] if p["section"] == "weights"]
    assert wpanels, "conv weights drawn"
    for p in wpanels:
        assert tile_labels(fig, p) == ["d0-3 ×4"]
    wt = next(p for p in wpanels if "weight [" in p["title"])
    n = wt["xaxis"][1:]
    shape = geom["params"]["weight"]["shape"]
    assert fig.layout[f"xaxis{n}"].range == (0, math.prod(shape[1:]))   # [out, in] matrix
    assert fig.layout[f"yaxis{n}"].range == (shape[0], 0)


def test_weights_of_n2c2_layer_are_two_replica_pairs(plan, req):
    geom, producers = tiling.layer_geometry(plan, req.to_dict(), "features_17")
    fig = TF.tiling_figure(geom, "all", producers)
    wt = next(p for p in fig.layout.meta["panels"]
              if p["section"] == "weights" and "weight [" in p["title"])
    assert sorted(tile_labels(fig, wt)) == ["d0,d2 ×2", "d1,d3 ×2"]


def test_linear_layer_weights_split_by_rows(plan, req):
    name = next(la["name"] for la in plan["layers"] if la["op"] == "linear")
    geom, producers = tiling.layer_geometry(plan, req.to_dict(), name)
    assert entry(plan, name)["config_label"] == "c4"
    fig = TF.tiling_figure(geom, 2, producers)
    wt = next(p for p in fig.layout.meta["panels"]
              if p["section"] == "weights" and "weight [" in p["title"])
    assert sorted(tile_labels(fig, wt)) == ["d0", "d1", "d2", "d3"]
    # 2-D output [N, C]: a single n × c grid
    assert [p["pair"] for p in fig.layout.meta["panels"] if p["section"] == "output"] == [
        "n × c"]


def test_one_device_layer_is_one_tile():
    geom = {"layer": "fc", "op": "linear", "shape": [8, 10], "axes": ["n", "c"],
            "config": {"n": 1, "c": 1}, "devices": [0], "boxes": [[[0, 8], [0, 10]]],
            "inputs": [], "params": {"weight": {"shape": [10, 20], "boxes": [[[0, 10], [0, 20]]]}}}
    fig = TF.tiling_figure(geom, "all")
    out = panel(fig, "output", "n × c")
    assert tile_labels(fig, out) == ["d0"]
    assert "· 1 on devices 0" in fig.layout.title.text


def test_axis_pairs_cover_every_axis():
    assert TF.axis_pairs(4) == [(0, 1), (2, 3)]
    assert TF.axis_pairs(3) == [(0, 1), (1, 2)]
    assert TF.axis_pairs(2) == [(0, 1)]
    assert TF.axis_pairs(1) == [(0, None)]
    for r in range(1, 7):
        covered = {a for p in TF.axis_pairs(r) for a in p if a is not None}
        assert covered == set(range(r))


def test_device_colours_distinct_for_64():
    cols = [TF.device_color(d) for d in range(64)]
    assert len(set(c.lower() for c in cols)) == 64
    assert TF.format_devices([0, 2]) == "d0,d2"
    assert TF.format_devices([3, 0, 1, 2, 6]) == "d0-3,d6"


def test_strip_folds_repeated_layers(plan):
    blocks = TF.strip_blocks(plan)
    # expected folding, computed independently
    expected = []
    for la in plan["layers"]:
        key = (la["op"], tuple(la["config"].items()), tuple(la["devices"]))
        if expected and expected[-1][0] == key:
            expected[-1][1] += 1
        else:
            expected.append([key, 1])
    assert [b["count"] for b in blocks] == [n for _, n in expected]
    assert len(blocks) < len(plan["layers"])
    assert sum(b["count"] for b in blocks) == len(plan["layers"])
    fig = TF.strip_figure(plan, "features_24")
    (labels,) = [t for t in fig.data if t.meta == "strip-labels"]
    assert len(labels.text) == len(blocks)            # one entry per block
    assert any("×2" in t or "×3" in t for t in labels.text)
    folded = [t for t, b in zip(labels.text, blocks) if b["count"] > 1]
    assert folded and all(f"×{b['count']}" in t for t, b in
                          zip(folded, [b for b in blocks if b["count"] > 1]))
    (hover,) = [t for t in fig.data if t.name == "blocks-hover"]
    assert list(hover.customdata) == [b["names"][0] for b in blocks]
    assert len(fig.layout.shapes) == 1                 # the selected block's outline
    assert fig.layout.meta["blocks"] == len(blocks)


def test_strip_grid_matches_geometry(f24):
    geom, _ = f24
    rows, cols, cells = TF.strip_grid(geom["config"], geom["devices"])
    assert (rows, cols) == (["h"], ["w"])
    # cell (r, c) belongs to the device whose output box is that h-tile × w-tile
    for d, box in zip(geom["devices"], geom["boxes"]):
        r, c = box[2][0] // 7, box[3][0] // 7
        assert cells[r][c] == d
    assert TF.strip_grid({"n": 4, "c": 1}, [0, 1, 2, 3])[2] == [[0], [1], [2], [3]]
    assert TF.strip_grid({"n": 1, "c": 4}, [0, 1, 2, 3])[2] == [[0, 1, 2, 3]]
    r, c, cells = TF.strip_grid({"n": 2, "c": 2, "h": 2, "w": 1}, list(range(8)))
    assert sorted(d for line in cells for d in line) == list(range(8))   # one cell per device
    assert TF.strip_grid({"n": 1}, [5])[2] == [[5]]


def strip_plan(n_layers: int = 125) -> dict:
    """A plan of ``n_layers`` on 4 devices whose ops alternate, so no two layers fold."""
    configs = [({"n": 4, "c": 1, "h": 1, "w": 1}, "n4"), ({"n": 2, "c": 2, "h": 1, "w": 1},
               "n2 c2"), ({"n": 1, "c": 1, "h": 2, "w": 2}, "h2 w2")]
    layers = []
    for i in range(n_layers):
        cfg, label = configs[(i // 3) % 3]
        layers.append({"name": f"layer_{i}", "op": ["conv", "pool", "concat"][i % 2],
                       "config": cfg, "config_label": label, "devices": [0, 1, 2, 3]})
    return {"layers": layers, "devices": 4}


def test_strip_of_125_layers_draws_a_fixed_number_of_traces():
    """The strip stays cheap however many blocks it shows: one filled trace per device, one
    for the block borders, one for the labels, one for the dimension letters, one for the
    click markers, and one outline shape (``python benchmarks/ui.py --figures`` times it)."""
    fake = strip_plan(125)
    fig = TF.strip_figure(fake, "layer_60")
    assert fig.to_json()
    assert fig.layout.meta["blocks"] == len(TF.strip_blocks(fake)) == 125
    assert len(fig.data) == 4 + 4 and len(fig.layout.shapes) == 1
    assert len(TF.strip_figure(strip_plan(250)).data) == len(fig.data)


def test_no_plan_gives_message():
    for bad in (None, {}, {"error": "no feasible configuration"}):
        out = tiling.render_figure(bad, None, None, "all")
        assert isinstance(out, html.Div) and "tiling-message" in out.className
        assert out.children
        strip = TF.strip_figure(bad)
        assert strip.layout.annotations and not strip.data
    assert "no feasible" in tiling.render_figure({"error": "no feasible configuration"},
                                                 None, None, "all").children
    assert tiling.choose_layer(None, "features_24", None, None) == ([], None)


def test_choose_layer(plan):
    opts, value = tiling.choose_layer(plan, None, None, None)
    assert value == "features_24"            # first conv with h/w partitioning
    assert len(opts) == len(plan["layers"])
    assert tiling.choose_layer(plan, "features_5", None, "features_24",
                               ids.STORE_SELECTED)[1] == "features_5"
    # stale selection -> default
    assert tiling.choose_layer(plan, "gone", None, None)[1] == "features_24"
    # a click on the strip
    click = {"points": [{"customdata": "classifier_0"}]}
    assert tiling.choose_layer(plan, "features_5", click, "features_24",
                               ids.TILING_STRIP)[1] == "classifier_0"
    # a new plan keeps the layer on show
    assert tiling.choose_layer(plan, None, None, "features_9", ids.STORE_PLAN)[1] == "features_9"
    # without h/w partitioning: the first non-input layer
    flat = dict(plan, layers=[dict(la, config={k: 1 for k in la["config"]}, config_label="1")
                              for la in plan["layers"]])
    assert tiling.default_layer(flat) == "features_0"


def test_callbacks_called_directly(plan, req):
    opts, value = tiling._cb_layer(plan, None, None, None)
    assert value == "features_24"
    dopts, dval = tiling._cb_device("features_24", plan, 7)
    assert dval == "all" and [o["value"] for o in dopts] == ["all", 0, 1, 2, 3]
    assert tiling._cb_device("features_24", plan, 2)[1] == 2
    out = tiling._cb_figure("features_24", 0, plan, "tiling", req.to_dict())
    assert isinstance(out, dcc.Graph)
    assert "features_24" in out.figure.layout.title.text
    # stale layer name: falls back to the default layer
    out = tiling._cb_figure("no_such_layer", "all", plan, "tiling", req.to_dict())
    assert isinstance(out, dcc.Graph) and "features_24" in out.figure.layout.title.text
    strip = tiling._cb_strip(plan, "features_24")
    assert strip.layout.meta["blocks"] == len(TF.strip_blocks(plan))
    assert isinstance(tiling._cb_figure(None, "all", {"error": "boom"}, "tiling", None), html.Div)
    # another tab shown: nothing is drawn (opening the Tiling tab draws the current plan's)
    assert tiling._cb_figure("features_24", 0, plan, "plan", req.to_dict()) is dash.no_update


def test_layout_has_the_panel_ids():
    lay = tiling.layout()
    found = set()

    def walk(c):
        if getattr(c, "id", None):
            found.add(c.id)
        kids = getattr(c, "children", None)
        for k in kids if isinstance(kids, (list, tuple)) else [kids]:
            if hasattr(k, "to_plotly_json"):
                walk(k)
    walk(lay)
    assert {ids.TILING_LAYER, ids.TILING_DEVICE, ids.TILING_FIGURE, ids.TILING_STRIP} <= found


def test_figures_pass_plotly_validation(f24, plan, monkeypatch):
    """Figures are built without plotly's (slow) validation; check the dicts are valid."""
    monkeypatch.setattr(TF, "VALIDATE", True)
    geom, producers = f24
    for dev in ("all", 0):
        TF.tiling_figure(geom, dev, producers).to_json()
    TF.strip_figure(plan, "features_24").to_json()

"""Row-parallel (``k``) configurations and the ``megatron`` baseline: geometry, costs, search,
the runtime against the float64 reference (2 and 4 workers), the command line and the views."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from explorer import service as session
from explorer.cli import main
from explorer.engine.core import geometry as G
from explorer.engine.layerwise.costmodel import CostModel, CostTables
from explorer.engine.core.devices import Device, DeviceGraph
from explorer.engine.core.layergraph import Edge, Layer, LayerGraph
from explorer.engine.core.importer import import_spec
from explorer.engine.runtime import launch_many
from explorer.engine.search import Problem, Request, comparison, run
from explorer.engine.layerwise.classic import default_tp, megatron_roles

BW = 10e9
#: a one-block transformer small enough for the runtime (4 heads, 16 tokens)
TINY = {"layers": 1, "hidden": 32, "heads": 4, "seq": 16, "vocab": 50, "num_classes": 4}
MLP = {"layers": 2, "hidden": 16, "num_classes": 4}


def flat(n, bw=BW, peak=1e12):
    devs = [Device(f"d{i}", "toy", peak, 100e9, 16e9, 0) for i in range(n)]
    return DeviceGraph("toy", devs, np.full((n, n), bw), np.zeros((n, n)))


def two_linears(N=4, D=64, H=256):
    """x [N, D] -> fc1 [N, H] -> fc2 [N, D]: an MLP block."""
    g = LayerGraph("mlp2", N)
    g.add_layer(Layer("x", "input", (N, D), ("n", "c")))
    g.add_layer(Layer("fc1", "linear", (N, H), ("n", "c"), ((N, D),),
                      {"weight": (H, D), "bias": (H,)}, flops=2.0 * N * H * D))
    g.add_layer(Layer("fc2", "linear", (N, D), ("n", "c"), ((N, H),),
                      {"weight": (D, H), "bias": (D,)}, flops=2.0 * N * D * H))
    g.add_edge(Edge("x", "fc1", 0))
    g.add_edge(Edge("fc1", "fc2", 0))
    return g


def seq_linear(N=4, L=8, C=16, K=32):
    return Layer("fc", "linear", (N, L, C), ("n", "l", "c"), ((N, L, K),),
                 {"weight": (C, K), "bias": (C,)}, flops=2.0 * N * L * C * K)


# --------------------------------------------------------------------------------------------
# geometry
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("layer", [seq_linear(), two_linears().layer("fc2")],
                         ids=["sequence", "samples"])
def test_k_groups_partition_their_tile_and_the_features(layer):
    cands = G.enumerate_configs(layer, 4)
    ks = [c for c in cands if c.deg("k") > 1]
    assert ks and all(c.degrees[-1][0] == "k" for c in ks)
    assert all("k" not in c.as_dict() for c in cands if c.deg("k") == 1)
    K = layer.in_shapes[0][-1]
    total = int(np.prod(layer.out_shape))
    scatter = G.scatter_axis(layer)
    assert layer.axes[scatter] == ("l" if "l" in layer.dims else "n")
    owned_all, _ = G.stacked_output_boxes(layer, cands)
    tiles_all, red_all, _ = G.stacked_compute_boxes(layer, cands)
    for i, cfg in enumerate(cands):
        owned = G.output_boxes(layer, cfg)
        tiles, red = G.compute_boxes(layer, cfg)
        np.testing.assert_array_equal(owned_all[i, : cfg.total], owned)
        np.testing.assert_array_equal(tiles_all[i, : cfg.total], tiles)
        # every output element is owned by exactly one device
        assert int(G.volume(owned).sum()) == total
        for a, b in itertools.combinations(range(cfg.total), 2):
            assert G.overlap(owned[a], owned[b]) == 0
        if cfg.deg("k") == 1:
            assert red is None and np.array_equal(tiles, owned)
            continue
        np.testing.assert_array_equal(red_all[i, : cfg.total], red)
        w = G.param_shards(layer, tiles, red)["weight"][1]
        for members in G.reduce_groups(cfg):
            # the members own disjoint parts of one tile, along the scatter axis only
            assert all(np.array_equal(tiles[m], tiles[members[0]]) for m in members)
            assert sum(int(G.volume(owned[m])) for m in members) == int(G.volume(tiles[members[0]]))
            assert {tuple(map(tuple, np.delete(owned[m], scatter, 0))) for m in members} == \
                {tuple(map(tuple, np.delete(tiles[members[0]], scatter, 0)))}
            # ... and sum over disjoint feature slices covering all of them
            assert sorted(tuple(red[m]) for m in members)[0][0] == 0
            assert sum(int(red[m][1] - red[m][0]) for m in members) == K
            reg = G.input_regions(layer, 0, tiles[members], red[members])
            assert (reg[:, -1, :] == red[members]).all()
            assert int(G.volume(w[members]).sum()) == int(tiles[members[0]][-1, 1] -
                                                          tiles[members[0]][-1, 0]) * K


def test_k_only_for_matrix_products_and_never_wider_than_the_features():
    conv = Layer("conv", "conv", (4, 8, 6, 6), ("n", "c", "h", "w"), ((4, 3, 6, 6),),
                 {"weight": (8, 3, 3, 3)}, {"kernel": (3, 3), "stride": (1, 1),
                                            "padding": (1, 1), "dilation": (1, 1), "groups": 1})
    assert all(c.deg("k") == 1 for c in G.enumerate_configs(conv, 4))
    narrow = seq_linear(K=2)
    assert max(c.deg("k") for c in G.enumerate_configs(narrow, 8)) == 2
    cfg = G.Config((("k", 2), ("n", 2), ("l", 1), ("c", 1)), (0, 1, 2, 3))
    assert cfg.degrees[-1] == ("k", 2) and cfg.label() == "n2 k2"
    assert G.reduce_groups(cfg) == [[0, 1], [2, 3]]


# --------------------------------------------------------------------------------------------
# costs and search
# --------------------------------------------------------------------------------------------


def test_reduce_scatter_term_bytes_and_memory():
    g = LayerGraph("one", 4)
    g.add_layer(Layer("x", "input", (4, 8, 32), ("n", "l", "c")))
    g.add_layer(seq_linear())
    g.add_edge(Edge("x", "fc", 0))
    cm = CostModel(g, flat(2))
    fc = g.layer("fc")
    whole = G.Config((("n", 1), ("l", 1), ("c", 1)), (0,))
    k2 = G.Config((("n", 1), ("l", 1), ("c", 1), ("k", 2)), (0, 1))
    t, nbytes = cm.reduce_costs("fc", [whole, k2])
    tile = 4 * 8 * 16 * 4
    # ring reduce-scatter of the tile forward, the all-gather of its gradient backward
    assert t[0] == 0 and t[1] == pytest.approx(2 * (0.5 * tile / BW))
    assert nbytes[1] == pytest.approx(2 * tile)
    _, _, mem = cm.layer_costs("fc", [k2])
    pel = 16 * 16 + 16
    assert mem[0] == pytest.approx((3 * pel + 2 * 4 * 4 * 16 + 4 * 8 * 16 + 2 * 4 * 8 * 16) * 4)
    tables = cm.tables([])
    i = tables.candidates["fc"].index(k2)
    assert tables.node_cost("fc")[i] == pytest.approx(
        tables.t_compute["fc"][i] + tables.t_sync["fc"][i] + t[1])
    choice = {"x": 0, "fc": i}
    assert tables.breakdown(choice)["reduce_s"] == pytest.approx(t[1])
    assert tables.breakdown(choice)["total_s"] == pytest.approx(tables.objective(choice))


def test_column_then_row_wins_and_optcnn_equals_exhaustive():
    """Compute-bound weights, a small batch: splitting fc1's columns and fc2's rows moves only
    the input once and fc2's small output (reduce-scatter), no weight is replicated."""
    g = two_linears()
    d = flat(2, peak=1e9)
    cm = CostModel(g, d)
    fast = run("optcnn", Problem.of(g, d, cm))
    slow = run("exhaustive", Problem.of(g, d, cm))
    assert fast.plan.objective_s == pytest.approx(slow.plan.objective_s, rel=1e-9)
    labels = {la.name: la.config.label() for la in fast.plan.layers}
    assert labels["fc1"] == "c2" and labels["fc2"] == "k2"
    assert fast.plan.breakdown["reduce_s"] > 0
    # strictly better than the best plan without a reduction split
    t = fast.tables
    keep = {n: [i for i, c in enumerate(t.candidates[n]) if c.deg("k") == 1] for n in t.names}
    sub = CostTables(t.names, {n: [t.candidates[n][i] for i in keep[n]] for n in t.names},
                     {n: t.t_compute[n][keep[n]] for n in t.names},
                     {n: t.t_sync[n][keep[n]] for n in t.names},
                     {n: t.memory[n][keep[n]] for n in t.names},
                     [(e, m[np.ix_(keep[e.src], keep[e.dst])]) for e, m in t.edges])
    best = min(sub.objective(dict(zip(t.names, combo)))
               for combo in itertools.product(*[range(len(keep[n])) for n in t.names]))
    assert fast.plan.objective_s < best


def test_megatron_plan_on_the_transformer_example():
    p = Problem(Request("transformer", 8, TINY, preset="p100-nvlink-4", devices=4))
    g = p.layer_graph()
    roles = megatron_roles(g)
    assert {n for n, r in roles.items() if r == "row"} == {"blocks_0_attn_out", "blocks_0_fc2"}
    assert {n for n, r in roles.items() if r == "column"} == {
        "blocks_0_attn_q", "blocks_0_attn_k", "blocks_0_attn_v",
        "scaled_dot_product_attention", "blocks_0_fc1"}
    meg = run("megatron", p, options={"tp": 2})
    labels = {la.name: la.config.label() for la in meg.plan.layers}
    assert meg.info["tp"] == 2 and meg.info["dp"] == 2 and not meg.info["fallback"]
    for name, role in roles.items():
        want = {"column": "n2 c2", "row": "n2 k2"}.get(role)
        if want is None:      # sequence-parallel where there is a sequence, else data-parallel
            want = "n2 l2" if "l" in g.layer(name).dims else "n4"
        assert labels[name] == want, name
    assert meg.fits_memory and meg.plan.breakdown["reduce_s"] > 0
    assert run("optcnn", p).objective_s <= meg.objective_s * (1 + 1e-9)
    assert comparison("layerwise")[-2:] == ["megatron", "optcnn"]
    assert default_tp(g, 4) == 4 and default_tp(g, 8) == 4 and default_tp(g, 6) == 2
    assert run("megatron", p).info["tp"] == 4


@pytest.mark.parametrize("tp, words", [(3, "tp=3 does not divide the 4 devices"),
                                       (0, "tp must be ≥ 1, got 0"),
                                       ("two", "tp must be an integer")])
def test_megatron_tp_is_validated_with_the_numbers(tp, words):
    p = Problem(Request("transformer", 8, TINY, preset="p100-nvlink-4", devices=4))
    with pytest.raises(ValueError, match=words):
        run("megatron", p, options={"tp": tp})


def test_cli_megatron_with_tp_option(capsys):
    args = ["search", "transformer", "-n", "4", "-b", "8", "--algo", "megatron"]
    args += [x for k, v in TINY.items() for x in ("-a", f"{k}={v}")]
    assert main(args + ["--opt", "tp=2", "--json"]) == 0
    import json
    doc = json.loads(capsys.readouterr().out)
    assert doc["algo"] == "megatron" and doc["info"]["tp"] == 2
    assert {"n2 c2", "n2 k2", "n2 l2"} <= {la["config_label"] for la in doc["layers"]}
    assert main(args + ["--opt", "tp=3"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "tp=3 does not divide the 4 devices" in err
    assert main(args + ["--opt", "pp=2"]) == 2
    assert "unknown option pp for MegatronOptions: valid are ep, tp" in capsys.readouterr().err


def test_views_candidate_table_and_tiles_show_k():
    req = session.Request(model="transformer", preset="p100-nvlink-4", devices=2, batch=4,
                          model_args=dict(TINY))
    rows = session.candidates(req, "blocks_0_fc2")
    assert "k2" in [r["config"] for r in rows]
    assert any(r["degrees"].endswith("k=2") for r in rows)
    assert all((r["t_reduce_ms"] > 0) == r["degrees"].endswith("k=2") for r in rows)
    geom = session.tiles(req, "blocks_0_fc2", {"k": 2}, [0, 1])
    assert geom["config"] == {"n": 1, "l": 1, "c": 1, "k": 2}
    (inp,) = geom["inputs"]
    feats = [r[-1] for r in inp["regions"]]
    assert feats == [[0, 64], [64, 128]]                         # each its half of fc1's 128
    assert [b[1] for b in geom["boxes"]] == [[0, 8], [8, 16]]    # owned: half the tokens


# --------------------------------------------------------------------------------------------
# runtime: the float64 reference check
# --------------------------------------------------------------------------------------------


def _plan(model, algo, batch, args, devices, pins=None, options=None):
    req = session.Request(model=model, preset="local", devices=devices, batch=batch,
                          model_args=dict(args))
    res = session.run_method(req, algo, pins, options)
    return res.to_dict()


def _check(results, plans):
    for p, r in zip(plans, results):
        ref = r["reference"]
        assert r["reference_ok"], (p["algo"], ref["worst_grad"], ref["max_grad_rel_err"],
                                   ref["problems"])
        assert ref["loss_rel_err"] < 1e-5


@pytest.mark.multiprocess
def test_row_parallel_runs_match_the_reference_on_two_workers():
    """Column- then row-parallel MLP (a folded ReLU after the reduce-scatter) and Megatron's
    transformer plan (tp=2): point-to-point reduce-scatter / all-gather."""
    plans = [_plan("mlp", "optcnn", 8, MLP, 2, pins=["body_0=c=2", "body_2=k=2", "head=k=2"]),
             _plan("transformer", "megatron", 4, TINY, 2, options={"tp": 2})]
    labels = [{la["config_label"] for la in p["layers"]} for p in plans]
    assert "k2" in labels[0] and {"c2", "k2", "l2"} <= labels[1]
    _check(launch_many(plans, steps=1, warmup=0, timeout_s=300, store=False), plans)


@pytest.mark.multiprocess
def test_row_parallel_runs_match_the_reference_on_four_workers():
    """tp=2 x dp=2 (two k groups) and a k=4 group, with the all_reduce collectives."""
    plans = [_plan("transformer", "megatron", 8, TINY, 4, options={"tp": 2}),
             _plan("mlp", "optcnn", 8, MLP, 4, pins=["body_0=c=4", "body_2=k=4", "head=n=4"])]
    assert {"n2 c2", "n2 k2", "n2 l2"} <= {la["config_label"] for la in plans[0]["layers"]}
    with pytest.warns(RuntimeWarning, match="4 CPU workers"):
        results = launch_many(plans, steps=1, warmup=0, timeout_s=600, store=False,
                              sync="allreduce")
    _check(results, plans)

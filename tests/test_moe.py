"""Mixture-of-experts layers (the ``moe`` example): router, top-k, capacity-based one-hot
dispatch and experts as batched matmuls, all with static shapes.

The static dispatch is checked against a loop over tokens that routes each one with
``torch.topk`` and drops it past an expert's capacity; the import gives ``experts`` layers
whose expert axis ``e`` splits the weights (expert parallelism) and a ``cumsum`` scan layer;
the layer-wise search chooses expert parallelism where it pays and equals exhaustive search on
a tiny instance; Tofu and Celeritas plan the model too.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import example_models as em
from example_models.moe import capacity_of

TINY = {"layers": 1, "hidden": 16, "heads": 2, "intermediate": 24, "experts": 4, "top_k": 2,
        "seq_len": 8, "vocab": 20}


def _loop_moe(moe, x, capacity=None):
    """The MoE layer token by token: ``torch.topk`` routing, gates renormalised, an expert
    taking the first ``capacity`` tokens of each sequence that pick it."""
    b, s, h = x.shape
    capacity = moe.capacity if capacity is None else capacity
    out = torch.zeros_like(x)
    probs = F.softmax(moe.router(x), dim=-1)
    for i in range(b):
        count = [0] * moe.experts
        for t in range(s):
            vals, idx = probs[i, t].topk(moe.top_k)
            gates = vals / vals.sum()
            for g, e in zip(gates, idx.tolist()):
                count[e] += 1
                if count[e] > capacity:
                    continue                      # over capacity: dropped
                y = F.silu(x[i, t] @ moe.w_gate[e]) * (x[i, t] @ moe.w_up[e])
                out[i, t] += g * (y @ moe.w_down[e])
    return out


@pytest.mark.parametrize("factor,top_k", [(1.0, 2), (0.5, 1), (2.0, 3)])
def test_static_dispatch_equals_a_token_loop(factor, top_k):
    torch.manual_seed(0)
    model, _ = em.build("moe", 3, **dict(TINY, capacity_factor=factor, top_k=top_k))
    moe = model.layers[0].moe
    assert moe.capacity == capacity_of(8, 4, top_k, factor)
    x = torch.randn(3, 8, 16)
    got, want = moe(x), _loop_moe(moe, x)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    if factor < 1:                                # tokens past the capacity were dropped
        assert not torch.allclose(got, _loop_moe(moe, x, capacity=8))


@pytest.mark.parametrize("top_k", [1, 2, 3])
def test_tied_router_probabilities_route_to_exactly_top_k_experts(top_k):
    """A router whose weights are zero gives every expert 1/E: exactly ``top_k`` experts take
    each token (the lowest indices, ties broken as a stable top-k does), not every tied one."""
    torch.manual_seed(0)
    model, _ = em.build("moe", 2, **dict(TINY, top_k=top_k, capacity_factor=4.0))
    moe = model.layers[0].moe
    torch.nn.init.zeros_(moe.router.weight)
    x = torch.randn(2, 8, 16)
    want = torch.zeros_like(x)
    for i in range(2):
        for t in range(8):
            for e in range(top_k):                     # experts 0..k-1, gates 1/k each
                y = F.silu(x[i, t] @ moe.w_gate[e]) * (x[i, t] @ moe.w_up[e])
                want[i, t] += (y @ moe.w_down[e]) / top_k
    torch.testing.assert_close(moe(x), want, rtol=1e-5, atol=1e-6)


def test_builder_validates():
    with pytest.raises(ValueError, match=r"top_k \(5\) must be at most experts \(4\)"):
        em.build("moe", 2, **dict(TINY, top_k=5))
    with pytest.raises(ValueError, match="capacity_factor must be > 0"):
        em.build("moe", 2, **dict(TINY, capacity_factor=0.0))
    assert capacity_of(128, 8, 2, 1.25) == 40 and capacity_of(8, 4, 2, 9.0) == 8


# --------------------------------------------------------------------------------------------
# import, geometry and costs of expert parallelism
# --------------------------------------------------------------------------------------------

from explorer.engine.core import geometry as G                       # noqa: E402
from explorer.engine.core.devices import Device, DeviceGraph, preset  # noqa: E402
from explorer.engine.core.importer import import_model                # noqa: E402
from explorer.engine.layerwise.costmodel import CostModel             # noqa: E402
from explorer.engine.search import Problem, run                       # noqa: E402
from example_models.moe import MoE                                    # noqa: E402

BW = 10e9


def _layer_graph(hidden=16, inter=32, experts=4, seq=8, batch=4, top_k=2):
    """One MoE layer on ``x [batch, seq, hidden]`` (capacity ``top_k·seq/experts``)."""
    with torch.device("meta"):
        m = MoE(hidden, inter, experts, top_k, top_k * seq // experts)
        x = torch.randn(batch, seq, hidden)
    return import_model(m, x, "moe-layer")


def _flat(n, peak=1e12):
    devs = [Device(f"d{i}", "toy", peak, 100e9, 16e9, 0) for i in range(n)]
    return DeviceGraph("toy", devs, np.full((n, n), BW), np.zeros((n, n)))


def _experts(g):
    return [la for la in g.layers() if la.op == "experts"]


def test_import_gives_experts_layers_and_a_scan():
    g = _layer_graph()
    ex = _experts(g)
    assert [la.out_shape for la in ex] == [(4, 4, 4, 32), (4, 4, 4, 32), (4, 4, 4, 16)]
    assert all(la.axes == ("n", "e", "-", "c") and la.dims == ("n", "e", "c") for la in ex)
    assert [tuple(la.params.values()) for la in ex] == [((4, 16, 32),), ((4, 16, 32),),
                                                        ((4, 32, 16),)]
    # balanced load × capacity factor: every expert computes its capacity of tokens, so the
    # FLOPs are those of top_k tokens per token (factor 1 here) through one expert's MLP
    # (the down projection; gate's layer adds its folded SiLU)
    assert ex[2].flops == 2.0 * 4 * 8 * 2 * 32 * 16 == 2.0 * math.prod(ex[2].out_shape) * 32
    scan = next(la for la in g.layers() if la.op == "cumsum")
    assert scan.attrs["full_axes"] == (1,) and scan.axes[1] == "-"
    assert g.parameters == 16 * 4 + 3 * 4 * 16 * 32


def test_expert_split_shards_the_experts_weights_and_regions():
    la = _experts(_layer_graph())[0]
    cfg = G.Config((("n", 1), ("e", 2), ("c", 1)), (0, 1))
    boxes = G.output_boxes(la, cfg)
    (shape, shard), = G.param_shards(la, boxes).values()
    assert shape == (4, 16, 32)
    assert shard.tolist() == [[[0, 2], [0, 16], [0, 32]], [[2, 4], [0, 16], [0, 32]]]
    reg = G.input_regions(la, 0, boxes)          # its experts' slots, every sample and feature
    assert reg.tolist() == [[[0, 4], [0, 2], [0, 4], [0, 16]], [[0, 4], [2, 4], [0, 4], [0, 16]]]


def test_dispatch_and_combine_cost_an_all_to_all():
    """Tokens split by samples (``n4``) feeding experts split by experts (``e4``): each device
    receives its quarter of the experts' slots from the 3 others, (p−1)/p² of the tensor — an
    all-to-all, forward and backward; the experts hold a quarter of the weights each, so
    nothing synchronises, where sample-split experts replicate (and synchronise) them all."""
    g = _layer_graph()
    cm = CostModel(g, _flat(4))
    disp = next(la for la in g.layers() if la.op == "matmul" and la.out_shape == (4, 16, 16))
    first = _experts(g)[0]
    edge = next(e for e in g.in_edges(first.name))
    assert edge.src == disp.name
    n4 = G.Config((("n", 4), ("l", 1), ("c", 1)), (0, 1, 2, 3))
    e4 = G.Config((("n", 1), ("e", 4), ("c", 1)), (0, 1, 2, 3))
    t, nbytes = cm.xfer(edge, [n4], [e4])
    tensor = 4 * 16 * 16 * 4                     # [4, 4·4, 16] float32
    assert nbytes[0, 0] == pytest.approx(2 * 4 * 3 * tensor / 16)
    assert t[0, 0] == pytest.approx(2 * 3 * (tensor / 16) / BW)
    en4 = G.Config((("n", 4), ("e", 1), ("c", 1)), (0, 1, 2, 3))
    tc, ts, mem = cm.layer_costs(first.name, [e4, en4])
    assert ts[0] == 0 and ts[1] > 0
    assert mem[0] < mem[1]


@pytest.mark.parametrize("devices", [2, 4])
def test_search_chooses_expert_parallelism_and_equals_exhaustive(devices):
    """Weights large against the tokens: the optimum splits the experts (all-to-all in and
    out) rather than replicating them, and the elimination equals the exhaustive search."""
    g = _layer_graph(hidden=256, inter=1024, experts=4, seq=16, batch=4)
    d = preset("p100-nvlink-4", devices)
    cm = CostModel(g, d)
    fast = run("optcnn", Problem.of(g, d, cm))
    slow = run("exhaustive", Problem.of(g, d, cm), options={"max_space": 10 ** 90})
    assert fast.objective_s == pytest.approx(slow.objective_s, rel=1e-9)
    labels = {la.name: la.config for la in fast.plan.layers}
    assert all(labels[la.name].deg("e") == devices for la in _experts(g))
    # the best plan that keeps every expert whole on each device is slower
    pins = [f"{la.name}=e=1" for la in _experts(g)]
    kept = run("optcnn", Problem.of(g, d, cm), pins=pins)
    assert kept.objective_s > fast.objective_s * 1.05


# --------------------------------------------------------------------------------------------
# runtime: experts on different workers against one device
# --------------------------------------------------------------------------------------------


def _run_plans():
    """Expert parallelism as MoE systems run it (tokens split by samples, experts split over
    the 2 workers: all-to-all in and out), the searched plan, and Megatron's (tensor
    parallel attention, expert-parallel experts)."""
    from explorer import service as session
    req = session.Request(model="moe", preset="local", devices=2, batch=4,
                          model_args=dict(em.SMALL["moe"]))
    g = session.graph_for(req)
    ex = [la.name for la in _experts(g)]
    mm = [la.name for la in g.layers() if la.op == "matmul"]        # dispatch, combine
    ep = [f"{n}=e=2" for n in ex] + [f"{n}=n=2" for n in mm]
    plans = [session.run_method(req, "optcnn", pins).to_dict() for pins in (ep, None)]
    plans.append(session.run_method(req, "megatron").to_dict())
    return ex, plans


@pytest.fixture(scope="module")
def moe_runs():
    from explorer.engine.runtime import launch_many
    ex, plans = _run_plans()
    for p in plans:
        p.pop("trace", None)
    return ex, plans, launch_many(plans, steps=1, warmup=0, timeout_s=600, store=False)


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.parametrize("case", [0, 1, 2], ids=["experts-split", "searched", "megatron"])
def test_moe_runs_on_two_workers_match_one_device(moe_runs, case):
    ex, plans, results = moe_runs
    res, plan = results[case], plans[case]
    ref = res["reference"]
    assert res["reference_ok"], (ref["worst_grad"], ref["max_grad_rel_err"], ref["problems"])
    assert ref["loss_rel_err"] < 1e-5
    # embedding, q/k/v/o, router, 3 experts' weights, 3 RMSNorm scales, LM head
    assert ref["params_compared"] == 13
    cfg = {la["name"]: la for la in plan["layers"]}
    if case == 0:                    # each worker holds half the experts, tokens all-to-all
        assert all(cfg[n]["config_label"] == "e2" and cfg[n]["devices"] == [0, 1] for n in ex)
        assert plan["breakdown"]["transfer_s"] > 0
    if case == 2:                    # expert parallelism over both workers
        assert plan["info"]["ep"] == 2
        assert all(cfg[n]["config_label"] == "e2" for n in ex)


# --------------------------------------------------------------------------------------------
# repeated MoE blocks: the chain search fixes one layer (not series-parallel)
# --------------------------------------------------------------------------------------------


def test_moe_blocks_reduce_exactly_with_one_layer_fixed():
    """The routing's slot numbers are read by the dispatch and by the combine, so an MoE
    block is not series-parallel; the chain search reduces it with one layer fixed per
    candidate and finds the same optimum as the elimination (Algorithm 1 with its exact
    residual solve)."""
    from explorer.engine.layerwise import optcnn, stages
    from explorer.engine.layerwise.memory import MemorySettings
    from explorer.engine.search import Request
    args = dict(TINY, layers=6, hidden=32, intermediate=64)
    p = Problem(Request("moe", 4, args, preset="h100-cluster", devices=4))
    cm, tables = p.cost_model(), p.cost_model().tables()
    chain = stages.Chain.of(tables)
    moe_seg = next(s for s in chain.segments
                   if any(cm.graph.layer(n).op == "experts" for n in s.interior))
    unary = {n: tables.node_cost(n) for n in tables.names}
    edges = {i: (tables.edges[i][0].src, tables.edges[i][0].dst, tables.edges[i][1])
             for i in moe_seg.edges}
    assert stages._SP(moe_seg.a, moe_seg.b, moe_seg.interior, edges, dict(unary)).alive
    assert stages.repeated_chain(tables, chain)
    ev = stages.Evaluator(cm, tables, MemorySettings(recompute=False, zero=0), 1e30)
    e = ev.evaluate(0.0)
    choice, _, _ = optcnn.solve(tables)
    assert e.time_s == pytest.approx(tables.objective(choice), rel=1e-9)
    assert tables.objective(e.choice) == pytest.approx(e.time_s, rel=1e-9)


@pytest.mark.slow
@pytest.mark.parametrize("algo", ["tofu", "celeritas"])
def test_operator_families_plan_the_moe(algo):
    """Tofu and Celeritas plan the operator graph of the same model (cumsum, comparisons,
    the experts' batched matmuls are aten ops they describe)."""
    from explorer import service as session
    req = session.Request(model="moe", preset="local", devices=2, batch=2,
                          model_args=dict(em.SMALL["moe"]))
    res = session.run_method(req, algo)
    assert res.objective_s > 0 and res.plan is not None


def test_export_computes_split_experts_as_planned():
    """``explorer export``: an experts layer split on ``e`` multiplies each rank's experts'
    tokens by its experts' weights (input Shard(1), weight Shard(0)): not listed."""
    from explorer.engine.core.capture_cache import layer_graph
    from explorer.engine.export import not_as_planned, program
    args = dict(em.SMALL["moe"])
    g = layer_graph("moe", 4, args)
    ex = [la.name for la in _experts(g)]
    cfg = {la.name: ({"n": 2} if "n" in la.dims else {}, (0, 1) if "n" in la.dims else (0,))
           for la in g.layers()}
    cfg[ex[0]] = ({"e": 2}, (0, 1))
    _, text = program("moe", 4, args, 2, cfg)
    assert not_as_planned(text) == []


def _megatron_experts_degrees(algo, opts, devices=4):
    from explorer.engine.search import Problem, Request, run
    res = run(algo, Problem(Request("moe", 8, dict(TINY, layers=2), preset="p100-cluster",
                                    devices=devices)), options=opts)
    plan = res.to_dict()
    degs = {la["name"]: la for la in plan["layers"]}
    ex = [n for n in degs if "e" in (degs[n].get("config") or {})]
    return res, {n: degs[n]["config"] for n in ex}


@pytest.mark.parametrize("algo", ["megatron", "megatron-3d"])
def test_megatron_takes_the_expert_parallel_degree_it_is_given(algo):
    """``--opt ep=K`` puts every expert on K groups of devices (the samples over the rest);
    the default is the largest divisor of the devices dividing the expert count (4 here)."""
    opts = {"pp": 1} if algo == "megatron-3d" else {}
    res, cfg = _megatron_experts_degrees(algo, dict(opts))
    assert cfg and {c["e"] for c in cfg.values()} == {4}
    assert res.info["ep"] == 4 if algo == "megatron" else True
    res, cfg = _megatron_experts_degrees(algo, dict(opts, ep=2))
    assert {c["e"] for c in cfg.values()} == {2} and {c["n"] for c in cfg.values()} == {2}


@pytest.mark.parametrize("ep,message", [
    (3, r"ep=3 must divide the 4 devices and every expert count \(4\); possible: 1, 2, 4"),
    (0, r"ep must be ≥ 1, got 0")])
@pytest.mark.parametrize("algo", ["megatron", "megatron-3d"])
def test_a_bad_expert_parallel_degree_is_one_line_with_the_numbers(ep, message, algo):
    with pytest.raises(ValueError, match=message) as info:
        _megatron_experts_degrees(algo, {"ep": ep})
    assert str(info.value).count("ep=") <= 1            # said once, not once per stage count


def test_an_expert_parallel_degree_for_a_model_without_experts_is_refused():
    from explorer.engine.search import Problem, Request, run
    with pytest.raises(ValueError, match="ep=2 applies to experts layers; this model has none"):
        run("megatron", Problem(Request("mlp", 8, {}, preset="p100-cluster", devices=4)),
            options={"ep": 2})

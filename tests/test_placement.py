"""Celeritas placement: orders, fusion (acyclic), Adjusting Placement vs Order-Place, memory,
pins, baselines and the simulator on a hand-checked graph."""

import json

import networkx as nx
import numpy as np
import pytest

from explorer.engine.core.devices import DeviceGraph, Device, preset
from explorer.engine.placement.estimate import from_opgraph, regress
from explorer.engine.placement.fusion import fuse
from explorer.engine.placement.placement_graph import PlacementGraph, from_networkx
from explorer.engine.placement.order import dfs_topo, graph_order, m_topo
from explorer.engine.placement.place import adjusting_placement, order_place
from explorer.engine.placement.simulator import simulate
from explorer.engine.placement import celeritas
from _helpers import place as run
from explorer.engine.search import names

PLACEMENT_ALGORITHMS = names("placement")
from explorer.errors import InfeasiblePlan

from _helpers import random_dag

GB = 1e9


def two_devices(bw=1e9, lat=0.0, mem=100.0):
    devs = [Device(f"d{i}", "test", 1e12, 1e12, mem) for i in range(2)]
    return DeviceGraph("t2", devs, np.full((2, 2), bw), np.full((2, 2), lat))


# -- orders -----------------------------------------------------------------------------------

def test_orders_are_topological_and_differ_as_the_paper_says():
    # Figure 3: two chains a1->a2->a3, b1->b2->b3; m-TOPO interleaves, DFS-TOPO keeps chains
    g = nx.DiGraph([("a1", "a2"), ("a2", "a3"), ("b1", "b2"), ("b2", "b3")])
    pg = from_networkx(g, two_devices())
    names = pg.names
    bfs = [names[v] for v in m_topo(pg.n, pg.succ, pg.pred)]
    dfs = [names[v] for v in dfs_topo(pg.n, pg.succ, pg.pred)]
    assert bfs[:2] == ["a1", "b1"]
    assert dfs[:3] == ["a1", "a2", "a3"]
    for order in (bfs, dfs):
        pos = {v: i for i, v in enumerate(order)}
        assert all(pos[u] < pos[v] for u, v in g.edges)


def test_cpd_topo_follows_the_critical_path():
    # s -> {light, heavy}; heavy is on the critical path so it must follow s directly
    g = nx.DiGraph()
    g.add_node("s", time=1.0)
    g.add_node("light", time=0.1)
    g.add_node("heavy", time=5.0)
    g.add_node("t", time=1.0)
    g.add_edges_from([("s", "light"), ("s", "heavy"), ("light", "t"), ("heavy", "t")])
    pg = from_networkx(g, two_devices())
    order, tl, bl = graph_order(pg, "cpd")
    assert [pg.names[v] for v in order] == ["s", "heavy", "light", "t"]
    i = pg.index()
    # equations 2 and 3 (c = 0: out_bytes 0, latency 0)
    assert tl[i["t"]] == pytest.approx(6.0) and bl[i["s"]] == pytest.approx(7.0)


def test_cpd_topo_equal_paths_tie_despite_rounding():
    """Two branches of equal length whose tlevel + blevel differ only by float rounding
    (0.1 + ((0.3 + 0.2) + 0.1) != 0.1 + ((0.3 + 0.1) + 0.2)): the graph order decides, not the noise; a
    branch 1 % longer still goes first."""
    def graph(c2):
        g = nx.DiGraph()
        for name, t in (("s", 0.1), ("b1", 0.1), ("b2", 0.2), ("c1", 0.2), ("c2", c2),
                        ("t", 0.3)):
            g.add_node(name, time=t)
        g.add_edges_from([("s", "b1"), ("b1", "b2"), ("b2", "t"),
                          ("s", "c1"), ("c1", "c2"), ("c2", "t")])
        return from_networkx(g, two_devices())
    pg = graph(0.1)
    order, tl, bl = graph_order(pg, "cpd")
    i = pg.index()
    cp = tl + bl
    assert cp[i["b1"]] != cp[i["c1"]]            # the noise the tie rule must ignore
    assert [pg.names[v] for v in order][:3] == ["s", "b1", "b2"]
    pg = graph(0.1 * 1.01 + 0.006)               # c-branch now really longer
    order, _, _ = graph_order(pg, "cpd")
    assert [pg.names[v] for v in order][:3] == ["s", "c1", "c2"]


# -- fusion ---------------------------------------------------------------------------------

@pytest.mark.parametrize("seed", range(25))
def test_fusion_never_creates_a_cycle(seed):
    g, dg = random_dag(seed, n=80)
    pg = from_networkx(g, dg)
    order, _, _ = graph_order(pg, "cpd")
    co, bps, s_n = fuse(pg, order, R=int(3 + seed % 7), M=40.0)
    assert nx.is_directed_acyclic_graph(co.to_networkx())
    assert sorted(np.concatenate(co.members).tolist()) == list(range(pg.n))
    # every cluster respects R and M (a lone node may exceed M)
    for m in co.members:
        assert len(m) <= 3 + seed % 7
        assert len(m) == 1 or pg.mem[m].sum() <= 40.0 + 1e-9
    # S(v_n) is the cut communication of the chosen clusters (equation 4)
    c = pg.edge_comm()
    cut = sum(c[e] for e in range(pg.n_edges) if co.cid[pg.src[e]] != co.cid[pg.dst[e]])
    assert s_n == pytest.approx(cut, rel=1e-9)


def test_fusion_dp_is_optimal_on_small_sequences():
    """Brute force over every breakpoint set of a 9-node graph agrees with the DP."""
    import itertools
    g, dg = random_dag(3, n=9, p=0.3)
    pg = from_networkx(g, dg)
    order, _, _ = graph_order(pg, "cpd")
    R, M = 4, 25.0
    co, _, s_n = fuse(pg, order, R=R, M=M)
    order = list(order)
    pos = {v: i for i, v in enumerate(order)}
    c = pg.edge_comm()
    best = np.inf
    for mask in itertools.product([0, 1], repeat=len(order) - 1):
        cuts = [0] + [i + 1 for i, b in enumerate(mask) if b] + [len(order)]
        ok = all(cuts[k + 1] - cuts[k] <= R and (cuts[k + 1] - cuts[k] == 1 or
                 pg.mem[order[cuts[k]:cuts[k + 1]]].sum() <= M) for k in range(len(cuts) - 1))
        if not ok:
            continue
        cl = np.searchsorted(cuts, [pos[v] for v in range(pg.n)], side="right")
        cut = sum(c[e] for e in range(pg.n_edges) if cl[pg.src[e]] != cl[pg.dst[e]])
        best = min(best, cut)
    assert s_n == pytest.approx(best)


# -- simulator ------------------------------------------------------------------------------

def test_simulator_hand_checked_makespan_and_memory():
    """a(1s) -> b(2s), a -> c(3s), b, c -> d(1s); 1 GB tensors over a 1 GB/s link + 0.5 s.

    a, b, d on device 0; c on device 1.  a ends at 1; a->dev1 transfer 1..2.5; c 2.5..5.5;
    b 1..3 on dev0; c->dev0 transfer 5.5..7; d 7..8.  Makespan 8 s.
    """
    g = nx.DiGraph()
    for n, t in (("a", 1.0), ("b", 2.0), ("c", 3.0), ("d", 1.0)):
        g.add_node(n, time=t, mem=1e9, out_bytes=1e9)
    g.add_edges_from([("a", "b"), ("a", "c"), ("b", "d"), ("c", "d")])
    pg = from_networkx(g, two_devices(bw=1e9, lat=0.5, mem=1e10))
    i = pg.index()
    pl = np.zeros(4, dtype=int)
    pl[i["c"]] = 1
    r = simulate(pg, pl)
    assert r.makespan == pytest.approx(8.0)
    assert r.start[i["c"]] == pytest.approx(2.5) and r.start[i["d"]] == pytest.approx(7.0)
    # dev0 peak: a (freed after b and the send), b, received c, d -> a+b at 1..2.5, then
    # b + c_copy + d = 3 GB at 7..8 (b freed only after d)
    assert r.peak_memory[0] == pytest.approx(3e9)
    # dev1: a copy + c = 2 GB
    assert r.peak_memory[1] == pytest.approx(2e9)
    # everything on one device: 1 + 2 + 3 + 1 = 7 s, no transfers
    assert simulate(pg, np.zeros(4, dtype=int)).makespan == pytest.approx(7.0)


def test_simulator_link_contention_serialises_transfers():
    # a -> b, a2 -> b: both tensors go 0 -> 1 at t=1; with ports they queue
    g = nx.DiGraph()
    for n, t in (("a", 1.0), ("a2", 1.0), ("b", 1.0)):
        g.add_node(n, time=t, mem=0.0, out_bytes=1e9)
    g.add_edges_from([("a", "b"), ("a2", "b")])
    dg = DeviceGraph("t3", [Device(f"d{k}", "t", 1e12, 1e12, 1e12) for k in range(3)],
                     np.full((3, 3), 1e9), np.zeros((3, 3)))
    pg = from_networkx(g, dg)
    i = pg.index()
    pl = np.zeros(3, dtype=int)
    pl[i["a2"]] = 2
    pl[i["b"]] = 1
    # a on 0, a2 on 2, both send to 1 at t=1: receive port of 1 serialises -> b at 3
    assert simulate(pg, pl).start[i["b"]] == pytest.approx(3.0)
    assert simulate(pg, pl, contention="none").start[i["b"]] == pytest.approx(2.0)


# -- placement ------------------------------------------------------------------------------

@pytest.mark.parametrize("seed", range(20))
def test_adjusting_never_worse_than_order_place(seed):
    g, dg = random_dag(100 + seed, n=70)
    pg = from_networkx(g, dg, capacity=1e12)
    order, _, _ = graph_order(pg, "cpd")
    co, _, _ = fuse(pg, order, R=6, M=1e12)
    adj = adjusting_placement(co, pg)
    op = order_place(co, pg)
    # in the placer's own model (the paper's proof): never worse
    assert adj.finish.max() <= op.finish.max() * (1 + 1e-9)
    # and in the simulator
    res_adj = celeritas.place(pg, dg, {"R": 6, "M": 1e12, "algo": "celeritas-paper"})
    res_op = celeritas.place(pg, dg, {"R": 6, "M": 1e12, "algo": "order-place"})
    assert res_adj.predicted_step_time_s <= res_op.predicted_step_time_s * (1 + 1e-9)


@pytest.mark.parametrize("seed", range(10))
def test_placements_respect_memory_unless_oom(seed):
    g, dg = random_dag(200 + seed, n=60, mem_scale=1e9)
    total = sum(a["mem"] for _, a in g.nodes(data=True))
    cap = total / 2.0          # needs at least two of three devices
    pg = from_networkx(g, dg, capacity=cap)
    for algo in PLACEMENT_ALGORITHMS:
        res = run(algo, pg, dg, {"R": 8})
        if not res.oom:
            assert max(res.peak_memory_bytes) <= cap * (1 + 1e-9), algo
        assert res.oom == (max(res.peak_memory_bytes) > cap * (1 + 1e-9))
    # Adjusting Placement keeps its live budget within capacity (no best effort needed)
    res = celeritas.place(pg, dg, {"R": 8, "algo": "celeritas-paper"})
    assert not res.best_effort
    assert (np.array(res.stats["placer_memory_bytes"]) <= cap * (1 + 1e-9)).all()
    # and the refinement keeps every simulated peak within capacity
    assert not celeritas.place(pg, dg, {"R": 8}).oom
    # a device too small for the single-device peak is reported
    one = run("single", pg, dg)
    assert run("single", pg.with_capacity(max(one.peak_memory_bytes) / 2), dg).oom


def test_best_effort_when_everything_is_full():
    g, dg = random_dag(7, n=30, mem_scale=1e9)
    total = sum(a["mem"] for _, a in g.nodes(data=True))
    pg = from_networkx(g, dg, capacity=total / 10)
    res = celeritas.place(pg, dg, {"R": 5})
    assert res.oom and res.best_effort
    assert len(res.placement) == pg.n


def test_pins_are_respected_for_operators_and_clusters():
    g, dg = random_dag(11, n=50)
    pg = from_networkx(g, dg)
    pins = {"3": 2, "17": 1, "40": 0}
    for algo in PLACEMENT_ALGORITHMS:
        res = run(algo, pg, dg, {"pins": pins, "R": 6})
        for nm, d in pins.items():
            assert res.device_of(nm) == d, algo
    base = celeritas.place(pg, dg, {"R": 6})
    res = celeritas.place(pg, dg, {"R": 6, "pins": {"cluster:2": 1}})
    for nm in base.clusters[2]["ops"]:
        assert res.device_of(nm) == 1


def test_impossible_pins_raise_infeasible_plan():
    g, dg = random_dag(12, n=20, mem_scale=1e9)
    pg = from_networkx(g, dg, capacity=5e9)
    with pytest.raises(InfeasiblePlan, match="only 3 devices"):
        celeritas.place(pg, dg, {"pins": {"1": 7}})
    with pytest.raises(InfeasiblePlan, match="no operator"):
        celeritas.place(pg, dg, {"pins": {"nope": 0}})
    with pytest.raises(InfeasiblePlan, match="pinned to device 0 need"):
        celeritas.place(pg, dg, {"pins": {str(i): 0 for i in range(20)}})


def test_validation_errors_carry_numbers():
    dg = two_devices()
    with pytest.raises(ValueError, match=r"shape \(3,\)"):
        PlacementGraph(["a", "b"], np.zeros(2), np.zeros(3), np.zeros(2), [0], [1], dg)
    with pytest.raises(ValueError, match="cycle"):
        PlacementGraph(["a", "b"], np.zeros(2), np.zeros(2), np.zeros(2), [0, 1], [1, 0], dg)
    with pytest.raises(ValueError, match="R must be >= 1, got 0"):
        celeritas.place(from_networkx(nx.DiGraph([(0, 1)]), dg), dg, {"R": 0})


# -- real operator graphs --------------------------------------------------------------------

@pytest.fixture(scope="module")
def mlp_graph():
    from explorer.engine.core.opgraph import build_opgraph
    return build_opgraph("mlp", 64, {"layers": 3, "hidden": 256})


def test_every_method_places_a_training_graph(mlp_graph, tmp_path):
    dg = preset("v100-pcie-4")
    pg = from_opgraph(mlp_graph, dg)
    cap = pg.total_memory() / 3
    results = {algo: run(algo, mlp_graph, dg, {"memory_per_device": cap})
               for algo in PLACEMENT_ALGORITHMS}
    for algo, res in results.items():
        assert len(res.placement) == pg.n and res.predicted_step_time_s > 0, algo
        doc = res.to_dict()
        json.dumps(doc)
        for key in ("ops", "clusters", "predicted_step_time_s", "search_time_s",
                    "peak_memory_bytes", "oom", "placement"):
            assert key in doc
        assert len(doc["peak_memory_bytes"]) == 4 and len(doc["placement"]) == pg.n
    cel = results["celeritas"]
    assert cel.stats["nodes_after"] < cel.stats["nodes_before"]
    assert not cel.oom
    # backward ops follow their forward op (co-location groups)
    grp = pg.group
    for gid in np.unique(grp[grp >= 0])[:20]:
        assert len(set(cel.placement[grp == gid].tolist())) == 1
    # the dumped graph is node-link JSON networkx can read back
    dump = pg.to_node_link()
    path = tmp_path / "g.json"
    path.write_text(json.dumps(dump))
    g2 = nx.node_link_graph(json.loads(path.read_text()), edges="links")
    assert g2.number_of_nodes() == pg.n and g2.number_of_edges() == pg.n_edges


def test_memory_regression_extrapolates_linear_sizes():
    y = np.array([[10 + 3 * b for b in (1, 2, 4, 8)], [5, 5, 5, 5]], dtype=float)
    assert regress([1, 2, 4, 8], y, 512).tolist() == [10 + 3 * 512, 5]
    with pytest.raises(ValueError, match="two distinct batch sizes"):
        regress([2, 2], np.ones((1, 2)), 8)


# -- co-location groups and the placer's own schedule -----------------------------------------

@pytest.fixture(scope="module")
def tiny_transformer():
    from explorer.engine.core.opgraph import build_opgraph
    return build_opgraph("transformer", 2, {"layers": 2, "heads": 2, "hidden": 16, "seq": 4})


def test_gradient_accumulations_are_not_colocated_with_the_loss(tiny_transformer):
    """autograd's gradient-accumulation adds carry the loss op's sequence number; they must
    not all join the loss op's co-location group (one device every block's gradients would
    have to visit), but the group of the tensor whose gradients they sum."""
    og = tiny_transformer
    pg = from_opgraph(og, preset("v100-pcie-4"))
    idx = pg.index()
    fwd_ops = [o for o in og.ops.values() if o.phase == "forward"]
    loss = fwd_ops[-1].name
    accum = [o for o in og.ops.values()
             if o.phase == "backward" and o.fwd == loss and o.target == "add"]
    assert len(accum) >= 4           # the residual stream of every block
    gl = pg.group[idx[loss]]
    assert not any(pg.group[idx[o.name]] == gl for o in accum)
    homes = {int(pg.group[idx[o.name]]) for o in accum}
    assert len(homes) >= 2 and -1 not in homes
    for o in accum:                  # each joins the group of a forward op or a parameter
        lead = [pg.names[x] for x in np.nonzero(pg.group == pg.group[idx[o.name]])[0]]
        assert any(x.startswith("param:") or og.ops[x].phase == "forward"
                   for x in lead if x.startswith("param:") or x in og.ops)
    # no group spans more than a few dozen ops (the loss group used to hold all of them)
    sizes = np.bincount(pg.group[pg.group >= 0])
    assert sizes.max() < 20


def test_placer_schedule_respects_every_edge_when_clusters_split(tiny_transformer):
    """Backward clusters are split over the devices of their forward ops; the placer's own
    schedule (Fin_t, hence its ESTs) must still wait for every predecessor, including the
    ones in the same cluster on another device."""
    dg = preset("v100-pcie-4")
    pg = from_opgraph(tiny_transformer, dg)
    pg = pg.with_capacity(pg.total_memory() / 3)       # forces several devices
    order, _, _ = graph_order(pg, "cpd")
    co, _, _ = fuse(pg, order, R=12, M=pg.total_memory() / 12)
    split = 0
    for placer in (adjusting_placement, order_place):
        cp = placer(co, pg)
        dev = cp.node_device
        split += sum(len(set(dev[m].tolist())) > 1 for m in co.members)
        for u, v in zip(pg.src.tolist(), pg.dst.tolist()):
            if cp.node_run[u] == cp.node_run[v]:
                continue
            arrive = cp.node_finish[u] + pg.comm(pg.out_bytes[u], dev[u], dev[v])
            assert cp.node_start[v] >= arrive - 1e-12, (pg.names[u], pg.names[v])
        # runs on one device never overlap
        for d in range(pg.ndev):
            runs = sorted({(cp.node_start[x], cp.node_finish[x])
                           for x in np.nonzero(dev == d)[0].tolist()})
            for (s0, e0), (s1, e1) in zip(runs, runs[1:]):
                assert s1 >= e0 - 1e-12
    assert split > 0                 # the case under test happened


@pytest.mark.parametrize("name", ["gpt2", "llama", "vit", "mobilenet_v2", "unet"])
def test_celeritas_and_metis_place_today_s_models(name):
    """Operator graphs of a Hugging Face GPT-2 and Llama, a ViT, a MobileNetV2 block and a
    U-Net with a transposed convolution: every op gets a positive cost (FLOPs known or the
    element-count fallback), and Celeritas and METIS place every op on 2 devices."""
    import _tofu_models
    from explorer.engine.core.opgraph import build_from_module
    if name in ("gpt2", "llama"):
        pytest.importorskip("transformers")
    model, x = getattr(_tofu_models, name)()
    g = build_from_module(model.train(), x, name)
    heavy = {"convolution", "convolution_backward", "mm", "addmm", "bmm",
             "_scaled_dot_product_flash_attention_for_cpu",
             "_scaled_dot_product_flash_attention_for_cpu_backward"}
    for op in g.ops.values():
        assert op.flops > 0 or g.tensors[op.output].numel == 0, op.name
        if op.target in heavy and op.index < 2:
            assert op.flops >= 2 * g.tensors[op.output].numel, op.name
    dg = preset("v100-pcie-4")
    pg = from_opgraph(g, dg)
    for algo in ("celeritas", "metis"):
        plan = run(algo, pg, dg, {"memory_per_device": pg.total_memory() / 1.5})
        assert len(plan.placement) == pg.n and plan.predicted_step_time_s > 0, algo
        assert set(plan.placement.tolist()) <= {0, 1, 2, 3}

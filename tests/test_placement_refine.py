"""Simulated refinement of a Celeritas placement: never worse, a local optimum, pins and memory
kept, units that keep co-location groups whole, and the budget."""

import itertools

import networkx as nx
import numpy as np
import pytest

from explorer.engine.core.devices import Device, DeviceGraph, preset
from explorer.engine.placement.estimate import from_opgraph
from explorer.engine.placement.fusion import fuse
from explorer.engine.placement.placement_graph import from_networkx
from explorer.engine.placement.order import _graph_levels, graph_order
from explorer.engine.placement.place import adjusting_placement
from explorer.engine.placement.refine import placement_units, refine
from explorer.engine.placement.simulator import simulate
from explorer.engine.placement import celeritas

from _helpers import random_dag


def devices(n=2, bw=1e9, lat=1e-5, mem=1e12):
    devs = [Device(f"d{i}", "test", 1e12, 1e12, mem) for i in range(n)]
    return DeviceGraph(f"t{n}", devs, np.full((n, n), bw), np.full((n, n), lat))


def random_graph(seed, n=40, ndev=3, mem_scale=1.0):
    g, dg = random_dag(seed, n, p=0.25 / 3, ndev=ndev, mem_scale=mem_scale, window=8,
                       gb=(0.01, 0.5))
    return from_networkx(g, dg), dg


def score(pg, placement):
    s = simulate(pg, placement)
    return float(np.maximum(s.peak_memory - pg.capacity, 0).sum()), float(s.makespan)


def test_two_parallel_branches_are_split():
    """s -> {b, c} (1 s each, tiny tensors): on one device 2.01 s; refinement moves one
    branch to the idle device (about 1.01 s)."""
    g = nx.DiGraph([("s", "b"), ("s", "c")])
    nx.set_node_attributes(g, {"s": 0.01, "b": 1.0, "c": 1.0}, "time")
    nx.set_node_attributes(g, 1e3, "out_bytes")
    pg = from_networkx(g, devices(2))
    res = refine(pg, np.zeros(3, dtype=int), [np.array([v]) for v in range(3)])
    i = pg.index()
    assert res.before == pytest.approx(2.01)
    assert res.after == pytest.approx(1.01, rel=1e-3)
    assert res.placement[i["b"]] != res.placement[i["c"]]
    assert res.moves and res.moves[0]["step_s"] == pytest.approx(res.after)
    assert not res.exhausted


@pytest.mark.parametrize("seed", range(8))
def test_never_worse_and_a_local_optimum(seed):
    """Brute force over every single-unit move of the result: none improves it; the result is
    never worse than the start; with few units, no better than the brute-force optimum."""
    pg, _ = random_graph(seed, n=24, ndev=2)
    order, _, _ = graph_order(pg, "cpd")
    co, _, _ = fuse(pg, order, R=5, M=1e12)
    units = placement_units(pg, co)
    start = adjusting_placement(co, pg).node_device
    res = refine(pg, start, units, max_evals=10_000, boundary=False)
    assert not res.exhausted
    best = score(pg, res.placement)
    assert best <= score(pg, start)
    assert res.after == pytest.approx(best[1])
    for u in units:
        cur = int(res.placement[u[0]])
        for d in range(pg.ndev):
            if d != cur:
                p = res.placement.copy()
                p[u] = d
                sc = score(pg, p)
                assert not (sc < best and (sc[0] < best[0] or sc[1] < best[1] - 1e-12))
    if len(units) <= 10:                                 # brute force: 2^units placements
        opt = min(score(pg, np.concatenate([np.full(len(u), d) for u, d in zip(units, ds)])[
            np.argsort(np.concatenate(units))]) for ds in itertools.product(range(2),
                                                                            repeat=len(units)))
        assert opt <= best


@pytest.mark.parametrize("seed", range(4))
def test_boundary_phase_improves_on_cluster_moves_to_a_local_optimum(seed):
    """On 9 operators (no groups), brute force over all 2^9 placements bounds the result;
    after both phases no operator touching the cut improves by moving across it."""
    pg, _ = random_graph(50 + seed, n=9, ndev=2)
    order, _, _ = graph_order(pg, "cpd")
    co, _, _ = fuse(pg, order, R=3, M=1e12)
    units = placement_units(pg, co)
    start = adjusting_placement(co, pg).node_device
    phase1 = refine(pg, start, units, max_evals=10_000, boundary=False)
    both = refine(pg, start, units, max_evals=10_000)
    assert not both.exhausted
    best = score(pg, both.placement)
    assert best <= score(pg, phase1.placement)
    assert all(m["phase"] in ("cluster", "boundary") for m in both.moves)
    p = both.placement
    for s_, t_ in zip(pg.src.tolist(), pg.dst.tolist()):
        if p[s_] != p[t_]:
            for v, d in ((s_, p[t_]), (t_, p[s_])):
                q = p.copy()
                q[v] = d
                sc = score(pg, q)
                assert not (sc < best and (sc[0] < best[0] or sc[1] < best[1] - 1e-12))
    opt = min(score(pg, np.array(ds)) for ds in itertools.product(range(2), repeat=pg.n))
    assert opt <= best


def test_pinned_units_stay_and_memory_is_not_broken():
    pg, dg = random_graph(3, n=40, ndev=3, mem_scale=1e9)
    start = np.zeros(pg.n, dtype=int)
    units = [np.array([v]) for v in range(pg.n)]
    pins = np.full(pg.n, -1)
    pins[[0, 5, 9]] = 0
    one = simulate(pg, start)
    tight = pg.with_capacity(one.peak_memory[0] * 0.6)   # everything on one device: OOM
    res = refine(tight, start, units, pins=pins, max_evals=600, memory="simulated")
    assert (res.placement[[0, 5, 9]] == 0).all()
    after = simulate(tight, res.placement)
    assert not after.oom(tight.capacity)                 # the overflow was repaired first
    # from a feasible start, every accepted move keeps the simulated peaks within capacity
    res2 = refine(tight, res.placement, units, max_evals=300, memory="simulated")
    assert not simulate(tight, res2.placement).oom(tight.capacity)
    assert res2.after <= res.after + 1e-12


def test_budget_and_bad_input():
    pg, _ = random_graph(4, n=20)
    start = np.zeros(pg.n, dtype=int)
    units = [np.array([v]) for v in range(pg.n)]
    res = refine(pg, start, units, max_evals=0)
    assert res.evals == 0 and res.exhausted and (res.placement == start).all()
    res = refine(pg, start, units, max_evals=5)
    assert res.evals == 5 and res.exhausted
    with pytest.raises(ValueError, match=r"shape \(3,\), expected \(20,\)"):
        refine(pg, np.zeros(3, dtype=int), units)
    with pytest.raises(ValueError, match="max_evals=-1"):
        refine(pg, start, units, max_evals=-1)
    # nothing to move: the start comes back unchanged
    assert (refine(pg, start, []).placement == start).all()


def test_units_partition_the_graph_and_keep_groups_whole():
    from explorer.engine.core.opgraph import build_opgraph
    og = build_opgraph("transformer", 2, {"layers": 2, "heads": 2, "hidden": 16, "seq": 4})
    pg = from_opgraph(og, preset("v100-pcie-4"))
    order, _, _ = graph_order(pg, "cpd")
    co, _, _ = fuse(pg, order, R=20, M=1e12)
    units = placement_units(pg, co)
    allv = np.concatenate(units)
    assert sorted(allv.tolist()) == list(range(pg.n))
    owner = np.empty(pg.n, dtype=int)
    for k, u in enumerate(units):
        owner[u] = k
    grp = pg.group
    for gid in np.unique(grp[grp >= 0]):
        assert len(set(owner[grp == gid].tolist())) == 1
    # a unit's operators sit on one device after Adjusting Placement (its one decision)
    cp = adjusting_placement(co, pg)
    for u in units:
        assert len(set(cp.node_device[u].tolist())) <= 1


@pytest.mark.slow
def test_celeritas_refines_adjusting_placement_and_records_it():
    pg, dg = random_graph(5, n=60, ndev=3)
    paper = celeritas.place(pg, dg, {"R": 6, "algo": "celeritas-paper"})
    off = celeritas.place(pg, dg, {"R": 6, "refine": False})
    full = celeritas.place(pg, dg, {"R": 6})
    assert (paper.placement == off.placement).all()
    assert full.predicted_step_time_s <= paper.predicted_step_time_s + 1e-12
    assert full.stats["step_before_refine_s"] == pytest.approx(paper.predicted_step_time_s)
    step = [t for t in full.trace if t["step"] == "refinement"][0]
    # the refinement judges moves in CPD-TOPO; the plan runs in the better of its schedules
    assert step["after_s"] == pytest.approx(full.stats["schedule_steps_s"]["CPD-TOPO"])
    assert full.predicted_step_time_s <= step["after_s"] + 1e-12
    assert full.stats["refine_moves"] == len(step["moves"])
    assert "refinement" not in [t["step"] for t in paper.trace]
    # co-location groups stay whole after refinement (tiny transformer)
    from explorer.engine.core.opgraph import build_opgraph
    og = build_opgraph("transformer", 2, {"layers": 2, "heads": 2, "hidden": 16, "seq": 4})
    tp = from_opgraph(og, preset("v100-pcie-4"))
    res = celeritas.place(tp, preset("v100-pcie-4"), {"R": 20})
    for gid in np.unique(tp.group[tp.group >= 0]):
        assert len(set(res.placement[tp.group == gid].tolist())) == 1
    # the plan's step: the simulator in CPD-TOPO, or in the placed blevel where that is faster
    assert res.stats["schedule_steps_s"]["CPD-TOPO"] == pytest.approx(
        simulate(tp, res.placement).makespan)
    assert res.predicted_step_time_s == pytest.approx(min(res.stats["schedule_steps_s"].values()))


def test_budget_per_device_is_the_whole_step_sum():
    """a -> b, a -> c, b -> d: a, b on 0; c, d on 1.  Device 1 holds c, d and receives a and
    b once each."""
    g = nx.DiGraph([("a", "b"), ("a", "c"), ("b", "d"), ("c", "d")])
    nx.set_node_attributes(g, {"a": 1.0, "b": 2.0, "c": 4.0, "d": 8.0}, "mem")
    nx.set_node_attributes(g, {"a": 10.0, "b": 20.0, "c": 40.0, "d": 80.0}, "out_bytes")
    pg = from_networkx(g, devices(2))
    i = pg.index()
    pl = np.zeros(4, dtype=int)
    pl[[i["c"], i["d"]]] = 1
    from explorer.engine.placement.refine import budget_per_device
    assert budget_per_device(pg, pl).tolist() == [3.0, 12.0 + 10.0 + 20.0]


def test_budget_memory_rule_is_stricter():
    """With memory="budget" a placement within the whole-step sum stays within it."""
    from explorer.engine.placement.refine import budget_per_device
    pg, _ = random_graph(6, n=40, ndev=3, mem_scale=1e9)
    pg = pg.with_capacity(float(pg.mem.sum()) * 0.7)
    order, _, _ = graph_order(pg, "cpd")
    co, _, _ = fuse(pg, order, R=6, M=1e12)
    start = np.zeros(pg.n, dtype=np.int64)           # Adjusting Placement keeps liveness only:
    start[pg.topo[pg.n // 2:]] = 1                    # a start within the whole-step sum
    assert (budget_per_device(pg, start) <= pg.capacity * (1 + 1e-9)).all()
    res = refine(pg, start, placement_units(pg, co), memory="budget", max_evals=500)
    assert (budget_per_device(pg, res.placement) <= pg.capacity * (1 + 1e-9)).all()
    assert res.after <= res.before
    with pytest.raises(ValueError, match="'simulated' or 'budget'"):
        refine(pg, start, [], memory="peak")


def block_graph():
    """s -> {b, c} -> j (b, c: 1 s each, tiny tensors), all on device 0 of 2: 2.02 s."""
    g = nx.DiGraph([("s", "b"), ("s", "c"), ("b", "j"), ("c", "j")])
    nx.set_node_attributes(g, {"s": 0.01, "b": 1.0, "c": 1.0, "j": 0.01}, "time")
    nx.set_node_attributes(g, 1e3, "out_bytes")
    return from_networkx(g, devices(2))


def test_split_moves_give_a_branch_of_a_block_to_the_idle_device():
    """One coarse unit holds the whole block: moving it only swaps devices (no gain) and no
    edge crosses devices (no boundary move).  The finer units let a branch go: ~1.02 s."""
    pg = block_graph()
    i = pg.index()
    start = np.zeros(4, dtype=int)
    whole = [np.arange(4)]
    alone = refine(pg, start, whole, max_evals=100)
    assert alone.after == pytest.approx(2.02) and not alone.moves
    fine = [np.array([i[x]]) for x in ("s", "b", "c", "j")]
    res = refine(pg, start, whole, max_evals=100, split_units=fine)
    assert res.after == pytest.approx(1.02, rel=1e-2)
    assert res.placement[i["b"]] != res.placement[i["c"]]
    assert res.moves and {m["phase"] for m in res.moves} == {"split"}


def test_busy_overlap_by_hand():
    """Device 0 runs x in [0, 2) and y in [3, 4); device 1 runs z in [1, 3).  While z runs,
    device 0 is busy 1 s (of x) and device 1 for z's own 2 s."""
    from types import SimpleNamespace

    from explorer.engine.placement.refine import busy_overlap
    sim = SimpleNamespace(start=np.array([0.0, 3.0, 1.0]), finish=np.array([2.0, 4.0, 3.0]),
                          placement=np.array([0, 0, 1]))
    assert busy_overlap(sim, 3, np.array([2])).tolist() == [1.0, 2.0, 0.0]
    assert busy_overlap(sim, 3, np.array([1, 2])).tolist() == [2.0, 2.0, 0.0]   # z ends at 3


def least_busy_case():
    """Three devices: device 1 computes an independent chain p -> q (1.2 s) while the block
    s -> {b, c} -> j runs on device 0 (2.02 s); device 2 is idle."""
    g = nx.DiGraph([("s", "b"), ("s", "c"), ("b", "j"), ("c", "j"), ("p", "q")])
    nx.set_node_attributes(g, {"s": 0.01, "b": 1.0, "c": 1.0, "j": 0.01, "p": 0.6, "q": 0.6},
                           "time")
    nx.set_node_attributes(g, 1e3, "out_bytes")
    pg = from_networkx(g, devices(3))
    i = pg.index()
    start = np.zeros(6, dtype=int)
    start[[i["p"], i["q"]]] = 1
    return pg, i, start


def test_split_moves_try_the_least_busy_device_first():
    """With one try per unit the branch goes to device 2, not to the busy device 1."""
    pg, i, start = least_busy_case()
    res = refine(pg, start, [], max_evals=100, split_units=[np.array([i["b"]])],
                 split_tries=1, boundary=False)
    assert res.placement[i["b"]] == 2
    assert res.after == pytest.approx(1.2)          # device 1's chain is the step now
    assert res.evals == 2            # the move, then one try of a pass that finds nothing more


def test_cluster_moves_try_the_least_busy_device_first():
    """A budget of one simulation: the cluster phase's first try is the idle device 2."""
    pg, i, start = least_busy_case()
    res = refine(pg, start, [np.array([i["b"]])], max_evals=1, boundary=False)
    assert res.evals == 1
    assert res.placement[i["b"]] == 2 and res.after == pytest.approx(1.2)




@pytest.mark.parametrize("seed", range(6))
def test_split_phase_never_worse_than_its_start(seed):
    """Random DAGs, coarse units of R=8, split units of R=2: the result is never worse than
    the placement it starts from, and co-location-free units stay within capacity."""
    pg, _ = random_graph(seed, n=40, ndev=3)
    order, _, _ = graph_order(pg, "cpd")
    co, _, _ = fuse(pg, order, R=8, M=1e12)
    fine, _, _ = fuse(pg, order, R=2, M=1e12)
    start = adjusting_placement(co, pg).node_device
    res = refine(pg, start, placement_units(pg, co), max_evals=300,
                 split_units=placement_units(pg, fine))
    assert score(pg, res.placement) <= score(pg, start)
    assert res.after == pytest.approx(simulate(pg, res.placement).makespan)


def test_celeritas_split_option():
    """split_R=0 turns the split moves off; a negative window is refused."""
    from explorer.engine.search.options import CeleritasOptions
    pg, dg = random_graph(3, n=60, ndev=3)
    on = celeritas.place(pg, dg, {"R": 30, "split_R": 3})
    off = celeritas.place(pg, dg, {"R": 30, "split_R": 0})
    assert not [m for m in off.trace[-1]["moves"] if m["phase"] == "split"]
    assert on.predicted_step_time_s <= on.stats["step_before_refine_s"] + 1e-12
    with pytest.raises(ValueError, match="split_R"):
        CeleritasOptions(split_R=-1)


def test_a_rejected_move_of_a_unit_across_devices_restores_each_operator():
    """s -> {b, c} with b on 0 and c on 1 (1.01 s): the unit {b, c} straddles the devices;
    moving it whole to either device is slower, so the placement stays exactly as it was."""
    g = nx.DiGraph([("s", "b"), ("s", "c")])
    nx.set_node_attributes(g, {"s": 0.01, "b": 1.0, "c": 1.0}, "time")
    nx.set_node_attributes(g, 1e3, "out_bytes")
    pg = from_networkx(g, devices(2))
    i = pg.index()
    start = np.zeros(3, dtype=int)
    start[i["c"]] = 1
    res = refine(pg, start, [], max_evals=50, boundary=False,
                 split_units=[np.array([i["b"], i["c"]])], split_tries=2)
    assert res.evals >= 1 and not res.moves
    assert (res.placement == start).all()

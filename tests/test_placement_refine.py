"""Simulated refinement of a Celeritas placement: never worse, a local optimum, pins and memory
kept, units that keep co-location groups whole, and the budget."""

import itertools

import networkx as nx
import numpy as np
import pytest

from explorer.engine.devices import Device, DeviceGraph, preset
from explorer.engine.placement.estimate import from_opgraph
from explorer.engine.placement.fusion import fuse
from explorer.engine.placement.graph import from_networkx
from explorer.engine.placement.order import _graph_levels, graph_order
from explorer.engine.placement.place import adjusting_placement
from explorer.engine.placement.refine import placement_units, refine
from explorer.engine.placement.simulator import simulate
from explorer.engine.search import celeritas

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
    from explorer.engine.opgraph import build_opgraph
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


def test_celeritas_refines_adjusting_placement_and_records_it():
    pg, dg = random_graph(5, n=60, ndev=3)
    paper = celeritas.place(pg, dg, {"R": 6, "algo": "celeritas-paper"})
    off = celeritas.place(pg, dg, {"R": 6, "refine": False})
    full = celeritas.place(pg, dg, {"R": 6})
    assert (paper.placement == off.placement).all()
    assert full.predicted_step_time_s <= paper.predicted_step_time_s + 1e-12
    assert full.stats["step_before_refine_s"] == pytest.approx(paper.predicted_step_time_s)
    step = [t for t in full.trace if t["step"] == "refinement"][0]
    assert step["after_s"] == pytest.approx(full.predicted_step_time_s)
    assert full.stats["refine_moves"] == len(step["moves"])
    assert "refinement" not in [t["step"] for t in paper.trace]
    # co-location groups stay whole after refinement (tiny transformer)
    from explorer.engine.opgraph import build_opgraph
    og = build_opgraph("transformer", 2, {"layers": 2, "heads": 2, "hidden": 16, "seq": 4})
    tp = from_opgraph(og, preset("v100-pcie-4"))
    res = celeritas.place(tp, preset("v100-pcie-4"), {"R": 20})
    for gid in np.unique(tp.group[tp.group >= 0]):
        assert len(set(res.placement[tp.group == gid].tolist())) == 1
    assert res.predicted_step_time_s == pytest.approx(simulate(tp, res.placement).makespan)


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

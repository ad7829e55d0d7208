"""Celeritas's own schedule: the placed graph's blevel (HEFT's upward rank once the placement is
known), kept only where it runs the placement faster within capacity than CPD-TOPO.

The hand-worked graph: ``s -> a -> c`` and ``s -> b -> d`` (s 0 s, a 1 s, b 1 s, c 1 s,
d 1.5 s; every tensor 1 byte on 1 GB/s links with 0.2 s latency), ``c`` on device 1 and the
rest on device 0.  CPD-TOPO follows the longer mean-link path first, ``s b d a c``; device 0
then runs d before a, and c waits for a: 4.7 s.  Placed, a's path crosses the link
(1 + 0.2 + 1 = 2.2 s) and d's does not (1.5 s): a runs at 1 s and c overlaps d, 3.5 s.
"""

import networkx as nx
import numpy as np
import pytest

from explorer.engine.core.devices import Device, DeviceGraph
from explorer.engine.placement import celeritas
from explorer.engine.placement.celeritas import (SCHEDULE_CPD, SCHEDULE_PLACED,
                                                 choose_schedule)
from explorer.engine.placement.order import graph_order, placed_blevel, placed_order
from explorer.engine.placement.placement_graph import from_networkx
from explorer.engine.placement.simulator import simulate

from _helpers import random_dag


def devices(n=2, bw=1e9, lat=0.2, mem=1e12):
    devs = [Device(f"d{i}", "test", 1e12, 1e12, mem) for i in range(n)]
    return DeviceGraph(f"t{n}", devs, np.full((n, n), bw), np.full((n, n), lat))


def two_paths(mem=1e12):
    g = nx.DiGraph([("s", "a"), ("s", "b"), ("a", "c"), ("b", "d")])
    nx.set_node_attributes(g, {"s": 0.0, "a": 1.0, "b": 1.0, "c": 1.0, "d": 1.5}, "time")
    nx.set_node_attributes(g, 1.0, "out_bytes")
    nx.set_node_attributes(g, {"s": 1.0, "a": 10.0, "b": 10.0, "c": 1.0, "d": 10.0}, "mem")
    pg = from_networkx(g, devices(mem=mem))
    i = pg.index()
    dev = np.zeros(pg.n, dtype=np.int64)
    dev[i["c"]] = 1
    return pg, dev


def run_in(pg, dev, order):
    pr = np.empty(pg.n)
    pr[np.asarray(order)] = -np.arange(pg.n, dtype=np.float64)
    return simulate(pg, dev, priority=pr)


def names(pg, order):
    return [pg.names[v] for v in order]


def test_placed_blevel_by_hand():
    """Only the edge a -> c crosses devices (0.2 s + 1 byte at 1 GB/s)."""
    pg, dev = two_paths()
    bl = dict(zip(pg.names, placed_blevel(pg, dev)))
    assert bl["c"] == pytest.approx(1.0)
    assert bl["d"] == pytest.approx(1.5)
    assert bl["a"] == pytest.approx(2.2, abs=1e-8)        # 1 + 0.2 + 1e-9 + 1
    assert bl["b"] == pytest.approx(2.5)                  # 1 + 0 (same device) + 1.5
    assert bl["s"] == pytest.approx(2.5)
    # all on one device: no transfer counts, the longest chain is s b d
    one = dict(zip(pg.names, placed_blevel(pg, np.zeros(pg.n, dtype=np.int64))))
    assert one["a"] == pytest.approx(2.0) and one["s"] == pytest.approx(2.5)


def test_placed_order_runs_the_crossing_path_first():
    """CPD-TOPO: s b d a c, 4.7 s; placed: s b a d c, 3.5 s (a at 1 s, c from 2.2 s)."""
    pg, dev = two_paths()
    cpd, _, _ = graph_order(pg, "cpd")
    assert names(pg, cpd) == ["s", "b", "d", "a", "c"]
    po = placed_order(pg, dev, cpd)
    assert names(pg, po) == ["s", "b", "a", "d", "c"]
    i = pg.index()
    s_cpd, s_pl = run_in(pg, dev, cpd), run_in(pg, dev, po)
    assert s_cpd.start[i["a"]] == pytest.approx(2.5) and s_cpd.makespan == pytest.approx(4.7)
    assert s_pl.start[i["a"]] == pytest.approx(1.0)
    assert s_pl.start[i["c"]] == pytest.approx(2.2)
    assert s_pl.makespan == pytest.approx(3.5)


def test_choose_schedule_prefers_the_faster_one_within_capacity():
    """Unlimited memory: placed (3.5 s).  At 25 bytes per device the placed order holds b,
    a and d together on device 0 (30 B) while CPD-TOPO never holds more than 21 B, so
    CPD-TOPO is kept although it is slower."""
    pg, dev = two_paths()
    cpd, _, _ = graph_order(pg, "cpd")
    cands = [(SCHEDULE_CPD, cpd), (SCHEDULE_PLACED, placed_order(pg, dev, cpd))]
    (name, _), sc = choose_schedule(pg, dev, cands)
    assert name == SCHEDULE_PLACED
    assert sc[0] == pytest.approx((0.0, 4.7)) and sc[1] == pytest.approx((0.0, 3.5))
    assert run_in(pg, dev, cands[1][1]).peak_memory[0] == pytest.approx(30.0)
    assert run_in(pg, dev, cpd).peak_memory[0] == pytest.approx(21.0)

    pg, dev = two_paths(mem=25.0)
    (name, _), sc = choose_schedule(pg, dev, cands)
    assert name == SCHEDULE_CPD
    assert sc[0] == pytest.approx((0.0, 4.7)) and sc[1][0] == pytest.approx(5.0, rel=1e-6)
    # equal scores: the first candidate (CPD-TOPO) is kept
    (name, _), _ = choose_schedule(pg, dev, [(SCHEDULE_CPD, cpd), ("again", cpd)])
    assert name == SCHEDULE_CPD


def _random(seed, n=40, ndev=3):
    g, dg = random_dag(seed, n, p=0.25 / 3, ndev=ndev, mem_scale=1.0, window=8,
                       gb=(0.01, 0.5))
    return from_networkx(g, dg), dg


@pytest.mark.parametrize("seed", range(6))
def test_celeritas_never_worse_than_its_cpd_topo_schedule(seed):
    """The schedule is chosen after the refinement: the plan is never slower than the same
    method in CPD-TOPO, the plan's step is the chosen schedule's, and the plan's ``order``
    is a topological order the simulator reproduces."""
    pg, dg = _random(seed)
    new = celeritas.place(pg, dg, {"algo": "celeritas"})
    old = celeritas.place(pg, dg, {"algo": "celeritas", "schedule": "cpd"})
    assert np.array_equal(new.placement, old.placement)      # the same placement
    assert new.predicted_step_time_s <= old.predicted_step_time_s + 1e-12
    steps = new.stats["schedule_steps_s"]
    assert steps[SCHEDULE_CPD] == pytest.approx(old.predicted_step_time_s)
    assert new.predicted_step_time_s == pytest.approx(min(steps.values()))
    assert new.stats["schedule"] in (SCHEDULE_CPD, SCHEDULE_PLACED)
    assert old.stats["schedule"] == SCHEDULE_CPD and "schedule_steps_s" not in old.stats
    pos = {nm: k for k, nm in enumerate(new.schedule_order())}
    assert all(pos[pg.names[s]] <= pos[pg.names[t]] for s, t in zip(pg.src, pg.dst))
    assert not new.oom or old.oom


def test_celeritas_paper_keeps_cpd_topo():
    """The published algorithm's schedule stays CPD-TOPO; ``schedule`` is validated."""
    pg, dg = _random(3)
    paper = celeritas.place(pg, dg, {"algo": "celeritas-paper"})
    assert paper.stats["schedule"] == SCHEDULE_CPD
    assert "schedule_steps_s" not in paper.stats
    with pytest.raises(ValueError, match="schedule"):
        celeritas.place(pg, dg, {"algo": "celeritas", "schedule": "blevel"})

"""The Tofu step-time model after ``explorer calibrate``: every worker's rehearsed shards plus
the executor's own transfers and collectives at the calibrated gloo costs, worker clocks
advanced operator by operator (``shardtime.simulate_step``), computing time-shared when the
workers outnumber the cores; and the run's "where did the step go" profile."""

from __future__ import annotations

import json
import types

import numpy as np
import pytest

from explorer.engine.core.devices import preset
from explorer.engine.core.geometry import ExecutionLayout
from explorer.engine.core.opgraph import build_opgraph
from explorer.engine.runtime import shardtime
from explorer.engine.runtime.dispatch import run_document
from explorer.engine.search import Problem, run as run_method

ARGS = {"layers": 4, "hidden": 128}

#: costs as :func:`shardtime.comm_costs` gives them (hand-picked round numbers)
COSTS = {"latency": 1e-3, "bw": 1e9, "send_s": 1e-4, "send_bw": 1e10, "recv_s": 5e-5,
         "recv_bw": 2e10, "coll_s": 2e-3, "coll_k": 1e-9}

# two operators on two workers: op 0 computes, then worker 1 sends 1 kB to worker 0; op 1
# fetches 1 MB from worker 0 to worker 1, computes, then sums by one all-reduce of 4 kB
T = np.array([[0.010, 0.020], [0.030, 0.005]])
X0 = ("x", [(1, 0, 1000)])
X1 = ("x", [(0, 1, 10 ** 6)])
C1 = ("c", (0, 1), None, 4000)
PHASES = [[(0, [X0]), (0, [X0])], [(1, [X1, C1]), (1, [X1, C1])]]


def _hand():
    """The same step worked by hand (seconds)."""
    # op 0: compute; worker 1's isend call (1e-4 + 1000 / 1e10) then the transfer (worker 0
    # is already there): latency + 1000 / 1e9; worker 0 then pays its receive call
    c1 = 0.020 + 1e-4 + 1e-7                        # worker 1 made its call
    land = c1 + 1e-3 + 1e-6
    w0 = land + 5e-5 + 1000 / 2e10                   # + receive call
    w1 = land
    # op 1 fetch: worker 0's call (1e-4 + 1e6 / 1e10); worker 1 is waiting already
    sent = w0 + 1e-4 + 1e-4
    land = sent + 1e-3 + 1e-3
    w0, w1 = land, land + 5e-5 + 1e6 / 2e10
    w0, w1 = w0 + 0.030, w1 + 0.005                  # compute
    end = max(w0, w1) + 2e-3 + 1e-9 * 4000           # the all-reduce starts with its last member
    calls = [5e-5 + 1000 / 2e10 + 1e-4 + 1e-4, 1e-4 + 1e-7 + 5e-5 + 1e6 / 2e10]
    return end, calls


def test_simulated_step_matches_the_hand_worked_two_op_plan():
    sim = shardtime.simulate_step(T, PHASES, COSTS)
    end, calls = _hand()
    assert sim["clock"] == pytest.approx([end, end], rel=1e-12)
    assert sim["compute"] == pytest.approx([0.040, 0.025])
    assert sim["calls"] == pytest.approx(calls, rel=1e-12)
    assert sim["wait"] == pytest.approx(sim["clock"] - sim["compute"] - sim["calls"])


def test_a_reduce_scatter_moves_half_an_all_reduce_s_bytes():
    ar = shardtime.simulate_step(np.zeros((1, 2)), [[(0, [("c", (0, 1), None, 10 ** 6)])] * 2],
                                 COSTS)
    rs = shardtime.simulate_step(np.zeros((1, 2)), [[(0, [("c", (0, 1), 0, 10 ** 6)])] * 2],
                                 COSTS)
    assert ar["clock"][0] == pytest.approx(2e-3 + 1e-3)
    assert rs["clock"][0] == pytest.approx(2e-3 + 0.5e-3)


def test_more_workers_than_cores_share_them():
    assert shardtime.share_factor(4, 2) == 2.0
    assert shardtime.share_factor(2, 2) == 1.0 and shardtime.share_factor(1, 8) == 1.0
    assert shardtime.share_factor(3, 2) == 1.5
    assert shardtime.share_factor(64) >= 1.0              # this machine's cores
    one = shardtime.simulate_step(T, PHASES, COSTS)
    two = shardtime.simulate_step(T, PHASES, COSTS, share=2.0)
    assert two["compute"] == pytest.approx(2 * one["compute"])
    # op 1's worker 0 computes 30 ms more alone: the all-reduce ends that much later again
    assert two["clock"][0] > one["clock"][0] + 0.030


def test_predict_step_is_the_simulation_of_the_rehearsed_shards(monkeypatch):
    """A 2-op plan with known rehearsal times and exchanges gives the hand-worked step;
    its terms are the slowest worker's."""
    g = types.SimpleNamespace(ops={"a": types.SimpleNamespace(target="mm"),
                                   "b": types.SimpleNamespace(target="mm")})
    xplan = {"workers": 2, "ops": {"a": {}, "b": {}}}
    monkeypatch.setattr(shardtime, "shard_seconds", lambda *a, **k: (
        ["a", "b"], T, np.ones((2, 2)), {"measured": 0, "cached": 4, "seconds": 0.0}))
    monkeypatch.setattr(shardtime, "exchange_phases", lambda *a, **k: PHASES)
    p = shardtime.predict_step(g, xplan, comm_s=0.5, latency_s=1.0, costs=COSTS)
    end, calls = _hand()
    assert p["predicted_step_time_s"] == pytest.approx(end)
    assert p["predicted_compute_step_s"] == pytest.approx(0.020 + 0.030)   # lockstep compute
    t = p["predicted_terms"]
    assert t["compute"] + t["calls"] + t["wait"] == pytest.approx(end)
    assert p["predicted_by_target"]["mm"] == pytest.approx([0.040, 0.025])
    old = shardtime.predict_step(g, xplan, comm_s=0.5, latency_s=1.0)      # no costs: the sum
    assert old["predicted_step_time_s"] == pytest.approx(0.050 + 0.5 + 2.0)


def test_comm_costs_come_from_the_calibration(_isolated_home):
    (_isolated_home / "local.json").write_text(json.dumps(_CAL))
    from explorer.engine.core.devices import local
    c = shardtime.comm_costs(local(2))
    # the exchange latency between computing workers, not the idle one-way figure
    assert c["latency"] == _CAL["latency"] != _CAL["p2p_latency_s"] and c["bw"] == _CAL["p2p_bw"]
    assert c["send_s"] == _CAL["p2p_send_s"] and c["recv_bw"] == _CAL["p2p_recv_bw"]
    k = (_CAL["allreduce_big_s"] - _CAL["allreduce_1k_s"]) / (_CAL["allreduce_big_bytes"] - 1024)
    assert c["coll_k"] == pytest.approx(k)
    assert c["coll_s"] + 1024 * c["coll_k"] == pytest.approx(_CAL["allreduce_1k_s"])
    # with the means over the calibration's messages (tails included) those are used
    (_isolated_home / "local.json").write_text(json.dumps(
        {**_CAL, "p2p_latency_mean_s": 4e-4, "p2p_1mb_mean_s": 4e-4 + (2 ** 20 - 1024) / 5e8}))
    c = shardtime.comm_costs(local(2))
    assert c["latency"] == _CAL["latency"] and c["bw"] == pytest.approx(5e8)


_CAL = {"peak_flops": 50e9, "mem_bw": 10e9, "link_bw": 2e9, "latency": 2e-4, "devices": 2,
        "p2p_latency_s": 1e-4, "p2p_bw": 1e9, "p2p_send_s": 3e-5, "p2p_send_bw": 5e9,
        "p2p_recv_s": 2e-5, "p2p_recv_bw": 8e9, "allreduce_1k_s": 3e-4,
        "allreduce_big_s": 1.3e-2, "allreduce_big_bytes": 16 * 2 ** 20}


def _plan(k=2):
    g = build_opgraph("mlp", 32, ARGS)
    doc = run_method("tofu", Problem.of(g, preset("local", k))).document()
    return g, doc, ExecutionLayout.from_json(doc["layout"]).to_plan()


def test_the_recorded_exchanges_are_the_rehearsal_s(_isolated_home):
    """The dry run records an exchange for exactly the operators and workers the rehearsal
    counted one for, and the point-to-point bytes are the plan's (4 bytes an element)."""
    g, doc, xplan = _plan()
    _, _, ex, _ = shardtime.shard_seconds(g, xplan, "float32")
    ph = shardtime.exchange_phases(g, xplan)
    for i in range(len(g.ops)):
        for w in range(2):
            took = any((e[0] == "x" and any(w in (s, d) for s, d, _ in e[1])) or e[0] == "c"
                       for e in ph[i][w][1])
            assert took == (ex[i, w] > 0), (list(g.ops)[i], w)
    p2p = sum(b for i in range(len(g.ops)) for e in ph[i][0][1] if e[0] == "x"
              for _, _, b in e[1])
    assert 0 < p2p <= doc["comm_bytes"] + 1e-6


@pytest.mark.multiprocess
def test_a_calibrated_run_models_the_executor_and_says_where_the_step_went(_isolated_home):
    (_isolated_home / "local.json").write_text(json.dumps(_CAL))
    _, doc, _ = _plan()
    r = run_document(doc, steps=3, verify=False, timeout_s=300)
    assert r["reference_ok"]
    t = r["predicted_terms"]
    assert t["compute"] > 0 and t["wait"] >= 0 and t["calls"] > 0
    assert r["predicted_step_time_s"] == pytest.approx(t["compute"] + t["calls"] + t["wait"])
    assert r["predicted_share"] >= 1.0
    prof = r["step_profile"]
    assert len(prof) == 2
    for p in prof:
        tot = p["total"]
        assert tot["ops"] == sum(v["ops"] for v in p["by_target"].values())
        assert tot["ops"] >= len(doc["layout"]["ops"]) if isinstance(doc["layout"].get("ops"),
                                                                      dict) else tot["ops"] > 0
        assert "mm" in p["by_target"] and p["by_target"]["mm"]["compute_cpu_s"] > 0
        assert tot["wait_s"] + tot["collective_s"] <= tot["fetch_s"] + tot["send_s"] + 1e-6
        assert 0 < tot["cpu_s"] and tot["step_s"] >= tot["compute_cpu_s"]
    from explorer.engine.runtime.report import format_run
    assert "where the step went" in format_run(r)


def test_a_transposed_view_is_rehearsed_with_the_worker_s_strides():
    """``t`` runs unchanged on the tiles, so the worker holds a view: the matrix product that
    reads it is rehearsed on a view too (its kernel differs from a contiguous copy's)."""
    g = build_opgraph("mlp", 32, ARGS)
    import torch
    gen = torch.Generator().manual_seed(0)
    o = next(o for o in g.ops.values() if o.target == "t")
    ten = g.tensors[o.output]
    box = np.array([[0, s] for s in ten.shape])
    v = shardtime._random(ten, box, torch.float32, gen, g)
    assert tuple(v.shape) == tuple(ten.shape) and not v.is_contiguous()
    assert v.t().is_contiguous()
    other = next(t for t in g.tensors.values() if len(t.shape) == 2 and t.kind == "param")
    w = shardtime._random(other, np.array([[0, s] for s in other.shape]), torch.float32, gen, g)
    assert w.is_contiguous()

"""The Learn page's worked examples (``explorer.engine.lessons``) and their service calls:
the numbers are the engine's own, checked against the tables, the papers' claims and
brute force."""

import numpy as np
import pytest

from explorer import service as S
from explorer.engine import lessons as L
from explorer.errors import ExplorerError


def _result(model="inception_v3", devices=4, batch=8, args=None):
    req = S.Request(model=model, devices=devices, batch=batch, preset="p100-nvlink-4",
                    model_args=dict(args if args is not None else {"image_size": "75"}))
    return req, S.run_method(req, "optcnn")


def test_elimination_replay_evaluates_equations_2_and_3_and_theorem_1():
    req, res = _result()
    doc = L.elimination_steps(res.tables, res.trace, res.choice)
    kinds = {s["kind"] for s in doc["steps"]}
    assert kinds == {"node", "edge"}                  # an Inception module needs both
    assert len(doc["residual"]) == 2                  # Table 3: K = 2
    # equation 1 on the reduced graph at the optimal choice is the plan's objective
    assert doc["check_s"] == pytest.approx(doc["objective_s"], rel=1e-9)
    assert doc["objective_s"] == pytest.approx(res.objective_s, rel=1e-9)
    for s in doc["steps"]:
        if s["kind"] == "node":
            totals = [r["total_s"] for r in s["rows"]]
            r = s["rows"][s["best"]]
            assert s["value_s"] == pytest.approx(min(totals))
            assert r["total_s"] == pytest.approx(r["t_compute_s"] + r["t_sync_s"]
                                                 + r["t_reduce_s"] + r["t_x_in_s"]
                                                 + r["t_x_out_s"])
            # Theorem 1: the plan's c_j attains equation 2's minimum for its neighbours
            chosen = next(x for x in s["rows"] if x["config"] == s["chosen"])
            assert chosen["total_s"] == pytest.approx(min(totals), rel=1e-9, abs=1e-15)
        else:
            assert s["value_s"] == pytest.approx(s["t_x1_s"] + s["t_x2_s"])


def test_first_node_step_reads_the_cost_tables():
    req, res = _result("lenet5", 2, 16, {})
    doc = L.elimination_steps(res.tables, res.trace, res.choice)
    s = doc["steps"][0]
    t = res.tables
    j, i, k = s["node"], s["src"], s["dst"]
    e1 = next(m for e, m in t.edges if e.src == i and e.dst == j)
    e2 = next(m for e, m in t.edges if e.src == j and e.dst == k)
    ci, ck = res.choice[i], res.choice[k]
    for cj, row in enumerate(s["rows"]):
        assert row["t_compute_s"] == pytest.approx(float(t.t_compute[j][cj]))
        assert row["t_x_in_s"] == pytest.approx(float(e1[ci, cj]))
        assert row["t_x_out_s"] == pytest.approx(float(e2[cj, ck]))


def test_dense_layer_data_against_channel_parallelism():
    req = S.Request(model="vgg16", devices=2, batch=64, preset="p100-nvlink-4")
    doc = S.learn_dense(req)
    assert doc["layer"] == "classifier_0"
    data, chan = doc["strategies"]
    assert (data["config"], chan["config"]) == ("n2", "c2")
    # data parallelism: both replicas push gradients and pull parameters (weights + bias)
    assert data["sync_bytes"] == pytest.approx(2 * 1 * doc["params"] * 4)
    assert data["xfer_bytes"] == 0                    # the producer is data-parallel too
    assert chan["sync_bytes"] == 0                    # disjoint parameters
    assert chan["xfer_bytes"] > 0                     # but the whole input must be gathered
    assert doc["reduction"] == pytest.approx(data["total_bytes"] / chan["total_bytes"])
    assert doc["reduction"] > 1


def test_dense_layer_errors_are_one_line():
    req = S.Request(model="vgg16", devices=2, batch=64, preset="p100-nvlink-4")
    with pytest.raises(ExplorerError, match="not a fully-connected layer"):
        S.learn_dense(req, "features_0")
    with pytest.raises(ExplorerError, match="no fully-connected layer"):
        S.learn_dense(S.Request(model="holography", batch=1, devices=2,
                                model_args={"layers": "2", "res": "16"}))


def test_conv1d_strategies_include_figure_2a_and_2b():
    doc = S.learn_conv1d(4, 4, 6, 16, 3, 2)
    got = {(s["kind"], s["dim"]): s for s in doc["strategies"]}
    assert set(got) == {("split", "b"), ("split", "co"), ("split", "x"),
                        ("reduce", "ci"), ("reduce", "dx")}
    a = got[("split", "b")]                          # Figure 2(a)
    assert a["reads"]["filters"]["layout"] == "replicated"
    assert a["reads"]["data"]["elements"] == [2 * 4 * 16, 2 * 4 * 16]   # half of data each
    b = got[("reduce", "ci")]                        # Figure 2(b): output reduction
    assert b["reducer"] == "sum"
    assert b["reads"]["data"]["elements"] == [4 * 2 * 16] * 2
    assert b["reads"]["filters"]["elements"] == [2 * 6 * 3] * 2
    x = got[("split", "x")]                          # a window: neighbours share a halo
    assert x["reads"]["data"]["halo"] == {"2": 2}
    assert doc["shapes"]["output"] == [4, 6, 14]


@pytest.mark.parametrize("args, msg", [((0, 4, 4, 16, 3, 2), "batch must be ≥ 1"),
                                       ((2, 4, 4, 3, 5, 2), "longer than the data"),
                                       ((2, 4, 4, 16, 3, "x"), "invalid literal")])
def test_conv1d_bad_sizes(args, msg):
    with pytest.raises(ExplorerError, match=msg):
        S.learn_conv1d(*args)


def test_topo_orders_reproduce_figure_3():
    doc = S.learn_orders(4, 2, 2)
    assert doc["orders"]["M-TOPO"]["cut_edges"] == 4        # the paper: 4 edges cut
    assert doc["orders"]["DFS-TOPO"]["cut_edges"] == 0      # and none
    for o in doc["orders"].values():                         # every order is topological
        pos = {v: i for i, v in enumerate(o["order"])}
        assert sorted(o["order"]) == list(range(len(doc["names"])))
        assert all(pos[s] < pos[t] for s, t in zip(doc["src"], doc["dst"]))
    # fusion: clusters partition the nodes in runs of the CPD-TOPO order, no edge cut
    cpd = doc["orders"]["CPD-TOPO"]["order"]
    flat = [v for c in doc["fusion"]["clusters"] for v in c]
    assert flat == cpd
    assert doc["fusion"]["cut_comm"] == 0


def test_topo_orders_count_cuts_against_brute_force():
    doc = S.learn_orders(3, 4, 3)
    src, dst = np.array(doc["src"]), np.array(doc["dst"])
    for o in doc["orders"].values():
        dev = np.array(o["device"])
        assert o["cut_edges"] == int((dev[src] != dev[dst]).sum())
        per = -(-len(doc["names"]) // 3)
        assert [dev[v] for v in o["order"]] == [i // per for i in range(len(o["order"]))]


@pytest.mark.parametrize("args, msg", [((0, 2, 2), "≥ 1"), ((40, 40, 2), "at most 400")])
def test_topo_orders_bad_input(args, msg):
    with pytest.raises(ExplorerError, match=msg):
        S.learn_orders(*args)


@pytest.mark.parametrize("workers", [2, 4, 8])
def test_tofu_recursion_replays_the_plans_steps(workers):
    """Section 5.2: k = 2^m workers take m steps, each halving every group; the bytes the
    steps add sum to the plan's communication, and each step's per-operator bytes to that
    level's total; every tensor and operator is counted once per step; the tree's leaves
    are the devices, each once."""
    from explorer.engine.core.opgraph import build_opgraph
    from explorer.engine.tofu.partition import partition
    g = build_opgraph("mlp", 64)
    plan = partition(g, workers=workers)
    doc = L.tofu_recursion(plan, g)
    m = workers.bit_length() - 1
    assert len(doc["steps"]) == m and doc["factors"] == [2] * m
    assert [s["groups_before"] for s in doc["steps"]] == [2 ** i for i in range(m)]
    assert sum(s["delta_bytes"] for s in doc["steps"]) == pytest.approx(plan.comm_bytes)
    assert doc["total_bytes"] == plan.comm_bytes == doc["steps"][-1]["total_bytes"]
    for s, trace in zip(doc["steps"], plan.steps):
        assert sum(trace.op_bytes.values()) == pytest.approx(trace.total_bytes)
        assert sum(n for axes in s["tensors"].values() for n in axes.values()) == \
            len(plan.tilings)
        assert sum(s["ops"].values()) == len(plan.strategies)
        assert set(s["ops"]) <= {"split", "reduce", "replicate"}
        assert all(t["bytes"] > 0 for t in s["top"]) and len(s["top"]) <= 3
        # the largest weights' grids after this step: their tilings' first steps
        for w in s["largest"]:
            grid = [1] * len(w["shape"])
            for ax in plan.tilings[w["tensor"]]["steps"][:s["step"]]:
                if ax >= 0:
                    grid[ax] *= 2
            assert w["grid"] == grid and g.tensors[w["tensor"]].kind == "param"
        # the strategy recorded for the step is the plan's strategy at that step
        assert all(trace.strategies[o] == plan.strategies[o][s["step"] - 1]
                   for o in plan.strategies)
    assert len(doc["tree"]) == 2 * workers - 1
    leaves = [n for n in doc["tree"] if n["step"] == m]
    assert sorted(int(n["devices"]) for n in leaves) == list(range(workers))
    ids = {n["id"] for n in doc["tree"]}
    assert all(n["parent"] in ids for n in doc["tree"] if n["parent"])


def test_tofu_recursion_of_one_worker_has_no_step():
    from explorer.engine.core.opgraph import build_opgraph
    from explorer.engine.tofu.partition import partition
    g = build_opgraph("mlp", 64)
    doc = L.tofu_recursion(partition(g, workers=1), g)
    assert doc["steps"] == [] and len(doc["tree"]) == 1 and doc["total_bytes"] == 0


def test_learn_recursion_is_the_tofu_pages_plan():
    req = S.Request(model="mlp", devices=4, batch=64, preset="k80-pcie-8", algo="tofu")
    doc = S.learn_recursion(req)
    assert doc["total_bytes"] == pytest.approx(S.tofu(req)["comm_bytes"])
    assert len(doc["steps"]) == 2 and doc["request"]["devices"] == 4


def test_celeritas_pipeline_stages_in_numbers():
    """Figure 2: the graph shrinks from operators to clusters to devices; Standard
    Evaluation's one-device time is the operators' sum; the last stage's step is the
    plan's simulated step."""
    req = S.Request(model="mlp", devices=4, batch=64, model_args={"layers": "4"},
                    preset="v100-pcie-4", algo="celeritas")
    doc = S.learn_pipeline(req)
    names = [s["stage"] for s in doc["stages"]]
    assert names[:4] == ["Standard Evaluation", "CPD-TOPO", "Optimal Operation Fusion",
                         "Adjusting Placement"]
    se, order, fusion, place = doc["stages"][:4]
    pg = S.placement_graph_for(req)
    assert se["nodes"] == order["nodes"] == pg.n and se["edges"] == pg.n_edges
    assert se["time_s"] == pytest.approx(float(pg.w[:, 0].sum()))
    assert 1 <= fusion["nodes"] <= se["nodes"] and 1 <= place["nodes"] <= place["devices"] == 4
    assert place["nodes"] <= fusion["nodes"]
    assert order["critical_path_s"] >= float(pg.w[:, 0].max())
    # stages 1-4 are Celeritas as published; our refinement, when it ran, comes last
    paper = S.run_method(req, "celeritas-paper")
    assert place["step_s"] == pytest.approx(paper.predicted_step_time_s)
    assert place["nodes"] == len(set(paper.plan.placement.tolist()))
    assert fusion["nodes"] == len(paper.plan.clusters)
    res = S.run_method(req, "celeritas")
    assert doc["step_s"] == pytest.approx(res.predicted_step_time_s)
    assert doc["stages"][-1]["step_s"] == pytest.approx(res.predicted_step_time_s)
    assert (names[-1] == "refinement") == bool(res.plan.stats.get("refine"))

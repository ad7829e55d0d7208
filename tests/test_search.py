"""The elimination search is exact: it matches brute force on random DAGs and on LeNet-5."""

import itertools
import random

import numpy as np
import pytest

from explorer.engine.core import geometry as G
from explorer.engine.layerwise.costmodel import CostModel, CostTables, Pin
from explorer.engine.core.devices import preset
from explorer.engine.core.layergraph import Edge
from explorer.engine.core.importer import import_spec
from explorer.engine.search import Problem, run
from explorer.engine.layerwise import exhaustive, optcnn
from explorer.errors import InfeasiblePlan


def random_tables(rng: random.Random, n_nodes: int, max_c: int, extra_edges: int,
                  parallel: int) -> CostTables:
    """A random DAG (a spanning chain-ish tree plus random forward edges and parallel edges)
    with random non-negative cost tables."""
    names = [f"l{i}" for i in range(n_nodes)]
    cands = {n: [G.Config((("n", 1),), (0,))] * rng.randint(1, max_c) for n in names}
    tc = {n: np.array([rng.uniform(0, 10) for _ in cands[n]]) for n in names}
    ts = {n: np.array([rng.uniform(0, 3) for _ in cands[n]]) for n in names}
    mem = {n: np.zeros(len(cands[n])) for n in names}
    pairs = []
    for j in range(1, n_nodes):
        pairs.append((rng.randrange(j), j))
    for _ in range(extra_edges):
        i, j = sorted(rng.sample(range(n_nodes), 2))
        pairs.append((i, j))
    for _ in range(parallel):
        pairs.append(rng.choice(pairs))
    edges = []
    for k, (i, j) in enumerate(pairs):
        m = np.array([[rng.uniform(0, 10) for _ in cands[names[j]]] for _ in cands[names[i]]])
        edges.append((Edge(names[i], names[j], k), m))
    return CostTables(names, cands, tc, ts, mem, edges)


def brute_force(t: CostTables) -> float:
    best = np.inf
    for combo in itertools.product(*[range(len(t.candidates[n])) for n in t.names]):
        best = min(best, t.objective(dict(zip(t.names, combo))))
    return best


@pytest.mark.parametrize("seed", range(60))
def test_elimination_matches_brute_force_on_random_dags(seed):
    rng = random.Random(seed)
    t = random_tables(rng, rng.randint(2, 7), 4, rng.randint(0, 6), rng.randint(0, 2))
    choice, trace, info = optcnn.solve(t)
    assert set(choice) == set(t.names)
    assert t.objective(choice) == pytest.approx(brute_force(t), rel=1e-12, abs=1e-12)
    # the trace's final step solved exactly the residual graph it reports
    final = [s for s in trace if s["kind"] == "final"][0]
    assert len(final["nodes"]) == info["residual_nodes"]


@pytest.mark.parametrize("seed", range(30))
def test_variable_elimination_path_is_exact(seed, monkeypatch):
    """Force the residual solve through variable elimination (no enumeration)."""
    monkeypatch.setattr(optcnn, "ENUMERATION_LIMIT", 0)
    rng = random.Random(1000 + seed)
    t = random_tables(rng, rng.randint(3, 7), 4, rng.randint(3, 9), rng.randint(0, 2))
    choice, _, info = optcnn.solve(t)
    assert t.objective(choice) == pytest.approx(brute_force(t), rel=1e-12, abs=1e-12)
    if info["residual_nodes"] > 0:
        assert info["residual_method"] == "variable-elimination"


@pytest.mark.parametrize("seed", range(25))
def test_milp_path_is_exact(seed, monkeypatch):
    """Force the residual solve through the MILP (as for wide, densely connected graphs)."""
    monkeypatch.setattr(optcnn, "ENUMERATION_LIMIT", 0)
    monkeypatch.setattr(optcnn, "VE_LIMIT", 0)
    rng = random.Random(2000 + seed)
    t = random_tables(rng, rng.randint(3, 7), 4, rng.randint(3, 9), rng.randint(0, 2))
    choice, _, info = optcnn.solve(t)
    assert info["residual_method"] == "milp"
    assert t.objective(choice) == pytest.approx(brute_force(t), rel=1e-9, abs=1e-12)


def test_dominance_pruning_keeps_an_optimum():
    rng = random.Random(99)
    for _ in range(20):
        t = random_tables(rng, 5, 5, 4, 1)
        nodes = t.names
        unary = {n: t.node_cost(n) for n in nodes}
        edges = [(e.src, e.dst, m) for e, m in t.edges]
        keep = optcnn._prune_dominated(nodes, unary, edges)
        sub = CostTables(nodes, {n: [t.candidates[n][i] for i in keep[n]] for n in nodes},
                         {n: t.t_compute[n][keep[n]] for n in nodes},
                         {n: t.t_sync[n][keep[n]] for n in nodes},
                         {n: t.memory[n][keep[n]] for n in nodes},
                         [(e, m[np.ix_(keep[e.src], keep[e.dst])]) for e, m in t.edges])
        assert brute_force(sub) == pytest.approx(brute_force(t))


@pytest.mark.parametrize("seed", range(10))
def test_exhaustive_dfs_matches_brute_force(seed):
    rng = random.Random(500 + seed)
    t = random_tables(rng, rng.randint(2, 6), 3, rng.randint(0, 4), 1)
    choice, visited = exhaustive.solve(t)
    assert t.objective(choice) == pytest.approx(brute_force(t))
    assert visited > 0


def test_chain_reduces_to_two_nodes_with_node_eliminations():
    # l0 -> l1 -> l2 -> l3: two node eliminations leave l0 -> l3 (the paper's K = 2)
    rng = random.Random(7)
    t = random_tables(rng, 4, 3, 0, 0)
    t.edges = [(Edge(f"l{i}", f"l{i + 1}", 0), np.ones((len(t.candidates[f"l{i}"]),
                                                         len(t.candidates[f"l{i + 1}"]))))
               for i in range(3)]
    choice, trace, info = optcnn.solve(t)
    assert [s["kind"] for s in trace].count("node") == 2
    assert info["residual_nodes"] == 2
    assert [s["node"] for s in trace if s["kind"] == "undo"] == ["l2", "l1"]


def test_parallel_edges_are_merged_by_edge_elimination():
    # diamond l0 -> {l1, l2} -> l3: node eliminations of l1 and l2 leave two parallel edges
    rng = random.Random(3)
    t = random_tables(rng, 4, 3, 0, 0)
    mk = lambda a, b: np.ones((len(t.candidates[a]), len(t.candidates[b])))  # noqa: E731
    t.edges = [(Edge("l0", "l1", 0), mk("l0", "l1")), (Edge("l0", "l2", 0), mk("l0", "l2")),
               (Edge("l1", "l3", 0), mk("l1", "l3")), (Edge("l2", "l3", 1), mk("l2", "l3"))]
    choice, trace, info = optcnn.solve(t)
    kinds = [s["kind"] for s in trace]
    assert kinds.count("node") == 2 and kinds.count("edge") == 1
    assert info["residual_nodes"] == 2
    assert t.objective(choice) == pytest.approx(brute_force(t))


def test_single_node_graph():
    rng = random.Random(1)
    t = random_tables(rng, 1, 4, 0, 0)
    choice, _, info = optcnn.solve(t)
    assert choice["l0"] == int(np.argmin(t.node_cost("l0")))
    assert info["residual_nodes"] == 1


@pytest.mark.parametrize("n", [2, 4])
def test_lenet5_matches_exhaustive(n):
    g = import_spec("lenet5", batch=16)
    d = preset("p100-cluster", n)
    cm = CostModel(g, d)
    fast = run("optcnn", Problem.of(g, d, cm))
    slow = run("exhaustive", Problem.of(g, d, cm))
    assert fast.plan.objective_s == pytest.approx(slow.plan.objective_s, rel=1e-9)
    assert fast.info["residual_nodes"] == 2
    for algo in ("data", "model", "owt"):
        assert fast.plan.objective_s <= run(algo, Problem.of(g, d, cm)).plan.objective_s + 1e-15


def test_pins_are_honoured_and_cost_at_least_the_optimum():
    g = import_spec("lenet5", batch=16)
    d = preset("p100-cluster", 4)
    cm = CostModel(g, d)
    free = run("optcnn", Problem.of(g, d, cm))
    pinned = run("optcnn", Problem.of(g, d, cm), [Pin.parse("conv2=c=2"), Pin.parse("fc1=@2,3")])
    assert pinned.plan.config_of("conv2").deg("c") == 2
    assert pinned.plan.config_of("fc1").devices == (2, 3)
    assert pinned.plan.objective_s >= free.plan.objective_s - 1e-15
    # the pinned optimum is the best among plans that satisfy the pins
    slow = run("exhaustive", Problem.of(g, d, cm), [Pin.parse("conv2=c=2"), Pin.parse("fc1=@2,3")])
    assert pinned.plan.objective_s == pytest.approx(slow.plan.objective_s, rel=1e-9)


@pytest.mark.parametrize("pin, words", [
    ("conv2=h=3", "cannot be met"),
    ("nosuch=n=2", "no layer named"),
    ("fc1=h=2", "has no dimension"),
    ("fc1=@0,9", "do not exist"),
    ("fc1=@0,1,2", "do not divide"),
])
def test_impossible_pins_raise_clear_errors(pin, words):
    g = import_spec("lenet5", batch=16)
    d = preset("p100-cluster", 4)
    with pytest.raises(InfeasiblePlan, match=words):
        run("optcnn", Problem.of(g, d, CostModel(g, d)), [Pin.parse(pin)])


def test_exhaustive_refuses_huge_spaces():
    g = import_spec("vgg16", batch=16)
    d = preset("p100-cluster", 4)
    with pytest.raises(InfeasiblePlan, match="optcnn"):
        run("exhaustive", Problem.of(g, d, CostModel(g, d)))


def test_data_parallel_rejects_indivisible_batch():
    g = import_spec("lenet5", batch=6)
    d = preset("p100-cluster", 4)
    with pytest.raises(InfeasiblePlan, match="batch"):
        run("data", Problem.of(g, d, CostModel(g, d)))


def test_dense_blocks_get_the_exact_optimum():
    # a DenseNet block: every layer reads the concat of all earlier ones; the final graph
    # stays large and wide, and the search still matches exhaustive enumeration
    g = import_spec("densenet", batch=8, model_args={"block": 3, "blocks": 1, "growth": 4,
                                                      "image_size": 16})
    d = preset("p100-cluster", 2)
    cm = CostModel(g, d)
    fast = run("optcnn", Problem.of(g, d, cm))
    slow = run("exhaustive", Problem.of(g, d, cm), options={"max_space": 10 ** 12})
    assert fast.info["residual_nodes"] > 2
    assert fast.plan.objective_s == pytest.approx(slow.plan.objective_s, rel=1e-9)


def test_unet_skips_nest_and_reduce_to_two_nodes():
    g = import_spec("unet", batch=4, model_args={"depth": 3, "base": 8, "image_size": 32})
    d = preset("p100-cluster", 4)
    r = run("optcnn", Problem.of(g, d, CostModel(g, d)))
    assert r.info["residual_nodes"] == 2


def test_models_with_skip_connections_get_exact_optimum_via_residual_solver():
    # the unrolled LSTM's state edges skip across time steps: the residual graph is large
    g = import_spec("lstm", batch=8, model_args={"layers": 2, "hidden": 64, "steps": 3})
    d = preset("p100-cluster", 2)
    cm = CostModel(g, d)
    fast = run("optcnn", Problem.of(g, d, cm))
    slow = run("exhaustive", Problem.of(g, d, cm))
    assert fast.plan.objective_s == pytest.approx(slow.plan.objective_s, rel=1e-9)
    assert fast.info["residual_nodes"] > 2

"""Expert parallelism in the export: an ``experts`` layer (``x [n, E, C, in] @ W [E, in, out]``)
split on its experts ``e`` computes on each rank's experts (input ``Shard(1)``, weight stored
``Shard(0)``, output ``Shard(1)``), split on ``c`` on each rank's output features (weight
``Shard(2)``, output ``Shard(3)``), and the program matches one process under torchrun.

The ``moe`` example at its small size; every torchrun costs seconds on the shared cores.
"""

from __future__ import annotations

import pytest

import example_models as em
from explorer.engine.export import not_as_planned, program
from tests.test_export import cli, layouts_of, passes

ARGS = dict(em.SMALL["moe"])
WEIGHTS = ["layers.0.moe.w_gate", "layers.0.moe.w_up", "layers.0.moe.w_down"]


def _experts(graph):
    return [la.name for la in graph.layers() if la.op == "experts"]


def _program(n, splits, ranks=None):
    """The small moe on ``n`` devices, samples split over all of them, its three experts
    layers (gate, up, down) split as ``splits`` says (on ``ranks``, default all)."""
    from explorer.engine.core.capture_cache import layer_graph
    g = layer_graph("moe", 4, ARGS)
    every = tuple(range(n))
    cfg = {la.name: ({"n": n} if "n" in la.dims else {}, every) for la in g.layers()}
    for name, deg in zip(_experts(g), splits):
        cfg[name] = (deg, tuple(ranks or every))
    name, text = program("moe", 4, ARGS, n, cfg)
    return _experts(g), name, text


def test_an_experts_split_is_placements_on_both_operands():
    """e: input S1, weight S0, output S1; c: input whole, weight S2, output S3; n: input S0,
    weight whole; each weight stored as its one reader reads it; none listed."""
    ex, _, text = _program(2, [{"e": 2}, {"c": 2}, {"n": 2}])
    assert not_as_planned(text) == []
    lay = layouts_of(text)
    assert [lay[n]["mode"] for n in ex] == ["local"] * 3
    assert [lay[n]["out"] for n in ex] == [["S1"], ["S3"], ["S0"]]
    assert [lay[n]["args"] for n in ex] == [[["S1"], ["S0"]], [["R"], ["S2"]],
                                             [["S0"], ["R"]]]
    assert [lay[n]["weights"] for n in ex] == [{WEIGHTS[0]: ["S0"]}, {WEIGHTS[1]: ["S2"]},
                                               {WEIGHTS[2]: ["R"]}]
    # on the 2 x 2 mesh: n2 e2, e4 (both mesh dimensions on the experts), e2 c2
    ex, _, text = _program(4, [{"n": 2, "e": 2}, {"e": 4}, {"e": 2, "c": 2}])
    assert not_as_planned(text) == []
    lay = layouts_of(text)
    assert [lay[n]["out"] for n in ex] == [["S0", "S1"], ["S1", "S1"], ["S3", "S1"]]
    assert [lay[n]["args"] for n in ex] == [[["S0", "S1"], ["R", "S0"]],
                                             [["S1", "S1"], ["S0", "S0"]],
                                             [["R", "S1"], ["S2", "S0"]]]


@pytest.mark.multiprocess
@pytest.mark.parametrize("n", [2, 4])
def test_megatron_expert_parallel_plan_runs_as_planned(capsys, tmp_path, n):
    """``explorer search moe --algo megatron --opt ep=2`` then ``explorer export``: every
    layer as planned (the experts e2, n2 e2 on 4), and ``--check`` passes on n processes."""
    plan, prog = tmp_path / "moe.json", tmp_path / "moe_ep.py"
    code, _, err = cli(capsys, "search", "moe", "-n", n, "--preset", "local", "--algo",
                       "megatron", "--opt", "ep=2", "-b", 4,
                       *(x for k, v in ARGS.items() for x in ("-a", f"{k}={v}")), "-o", plan)
    assert code == 0, err
    code, out, err = cli(capsys, "export", plan, "--to", "torch", "-o", prog)
    assert code == 0, err
    text = prog.read_text()
    assert not_as_planned(text) == [] and "49 of 49 layers as planned" in out
    lay = layouts_of(text)
    experts = [v for v in lay.values() if "weights" in v]
    assert len(experts) == 3 and all(v["out"][-1] == "S1" for v in experts)
    assert "check: passed" in passes(prog, n=n)


@pytest.mark.multiprocess
def test_experts_split_every_way_on_four_processes(tmp_path):
    """e4, e2 c2 and c4 experts on the 2 x 2 mesh (e4 puts both mesh dimensions on one
    tensor dimension) against one process."""
    _, name, text = _program(4, [{"e": 4}, {"e": 2, "c": 2}, {"c": 4}])
    assert not_as_planned(text) == []
    prog = tmp_path / name
    prog.write_text(text)
    out = passes(prog, n=4)
    assert "computed in other placements" not in out


@pytest.mark.multiprocess
def test_searched_optcnn_plan_with_experts_on_a_sub_mesh(capsys, tmp_path):
    """optcnn on 4 devices with the experts pinned to e2 and the dispatch and combine to n2
    puts them on ranks 0-1 and the rest on rank 0: the experts split on their sub-mesh, and
    the slot numbers (read only by comparisons, so without a gradient) get zeros there."""
    from explorer.engine.core.capture_cache import layer_graph
    g = layer_graph("moe", 4, ARGS)
    ex = _experts(g)
    mm = [la.name for la in g.layers() if la.op == "matmul"]          # dispatch, combine
    pins = [x for n in ex for x in ("--pin", f"{n}=e=2")] + \
        [x for n in mm for x in ("--pin", f"{n}=n=2")]
    plan, prog = tmp_path / "moe.json", tmp_path / "moe_optcnn.py"
    code, _, err = cli(capsys, "search", "moe", "-n", 4, "--preset", "local", "--algo",
                       "optcnn", "-b", 4, *pins,
                       *(x for k, v in ARGS.items() for x in ("-a", f"{k}={v}")), "-o", plan)
    assert code == 0, err
    code, out, err = cli(capsys, "export", plan, "--to", "torch", "-o", prog)
    assert code == 0, err
    text = prog.read_text()
    assert not_as_planned(text) == []
    lay = layouts_of(text)
    assert all(lay[n]["args"] == [["S1"], ["S0"]] and lay[n].get("ranks") for n in ex)
    passes(prog, n=4)

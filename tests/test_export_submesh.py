"""Exported layers on a subset of the devices: each computes on a ``DeviceMesh`` of its own
ranks, tensors crossing meshes are gathered and broadcast, and the program run under torchrun
on 4 gloo processes matches one process (--check).

Tiny models: every torchrun costs seconds on the shared cores.
"""

from __future__ import annotations

import pytest

from explorer.engine.export import not_as_planned, program
from tests.test_export import TRANSFORMER, cli, layouts_of, passes

MLP_ARGS = {"hidden": 16, "layers": 2}
#: the mlp on four meshes: all 4 ranks, ranks 0-1, ranks 2-3, ranks 1 and 3
MLP_SUB = {"x": ({"n": 4}, (0, 1, 2, 3)), "body_0": ({"n": 2}, (0, 1)),
           "body_2": ({"c": 2}, (2, 3)), "head": ({"k": 2}, (1, 3))}


def transformer_configs():
    """The tiny transformer with attention on ranks 0-1 (heads split), the MLP Megatron-style
    on all 4 ranks, its norms and residuals on 2-3 or 1 rank, the head on rank 3 alone."""
    cfg = {}
    attn = ("blocks_0_ln1", "blocks_0_attn_q", "blocks_0_attn_k", "blocks_0_attn_v",
            "scaled_dot_product_attention", "blocks_0_attn_out")
    for name in attn:
        leaf = name.rsplit("_", 1)[-1]
        deg = ({"c": 2} if leaf in ("q", "k", "v") else {"k": 2} if leaf == "out"
               else {"c": 2} if name.startswith("scaled") else {"n": 2})
        cfg[name] = (deg, (0, 1))
    cfg.update({"tokens": ({"n": 4}, (0, 1, 2, 3)), "embed": ({"c": 2}, (2, 3)),
                "add_1": ({"l": 2}, (2, 3)), "blocks_0_ln2": ({"n": 2, "l": 2}, (0, 1, 2, 3)),
                "blocks_0_fc1": ({"c": 4}, (0, 1, 2, 3)), "blocks_0_fc2": ({"k": 4}, (0, 1, 2, 3)),
                "add_2": ({}, (1,)), "ln_f": ({"n": 2}, (0, 2)), "mean": ({}, (0,)),
                "head": ({}, (3,))})
    return cfg


def test_a_subset_layer_gets_a_mesh_of_its_ranks():
    """A layer on devices [2, 3] is planned on a mesh of those two ranks (shape (2,)), its
    placements there; layers on all ranks keep the global 2 x 2 mesh.  Nothing departs."""
    _, text = program("mlp", 8, MLP_ARGS, 4, MLP_SUB)
    lay = layouts_of(text)
    assert not_as_planned(text) == [] and "# 4 of 4 layers as planned." in text
    assert "ranks" not in lay["x"] and lay["x"]["out"] == ["S0", "S0"]
    assert (lay["body_2"]["ranks"], lay["body_2"]["mesh"]) == ([2, 3], [2])
    assert lay["body_2"]["params"]["weight"] == ["S0"] and lay["body_2"]["out"] == ["S1"]
    assert (lay["head"]["ranks"], lay["head"]["in"], lay["head"]["out"]) == ([1, 3], ["S1"],
                                                                            ["P"])


def test_what_still_departs_on_a_sub_mesh_is_listed_with_its_ranks():
    """A norm split on the axis it normalises, on ranks 0-1: listed, computed whole on
    those ranks (not on every rank); recomputation and ZeRO-3 in a program with sub-meshes
    are listed (they would communicate outside the order the program keeps)."""
    cfg = transformer_configs()
    cfg["blocks_0_ln1"] = ({"c": 2}, (0, 1))
    _, text = program("transformer", 4, TRANSFORMER, 4, cfg,
                      savings={"blocks_0_fc1": (True, 0), "blocks_0_ln2": (False, 3)})
    off = {d[0]: d for d in not_as_planned(text)}
    assert set(off) == {"blocks_0_ln1", "blocks_0_fc1", "blocks_0_ln2"}
    assert "ZeRO-3" in off["blocks_0_ln2"][1] and "sub-meshes" in off["blocks_0_ln2"][3]
    assert "fsdp" not in layouts_of(text)["blocks_0_ln2"]
    assert off["blocks_0_ln1"][1:3] == ("c2 on [0, 1]", "whole on ranks [0, 1]")
    assert "statistics reduced" in off["blocks_0_ln1"][3]
    assert "recomputed" in off["blocks_0_fc1"][1] and "sub-meshes" in off["blocks_0_fc1"][3]
    assert "recompute" not in layouts_of(text)["blocks_0_fc1"]


@pytest.mark.multiprocess
def test_mlp_on_four_meshes_matches_one_process(tmp_path):
    """Sample split on all 4, then ranks 0-1, a column split on 2-3, a reduction split on
    1 and 3: each crossing gathered and re-placed; 3 SGD steps match one process."""
    name, text = program("mlp", 8, MLP_ARGS, 4, MLP_SUB)
    prog = tmp_path / name
    prog.write_text(text)
    out = passes(prog, n=4)
    assert "4 of 4 layers as planned" in out


@pytest.mark.multiprocess
def test_transformer_on_sub_meshes_matches_one_process(tmp_path):
    """Attention on ranks 0-1 (heads split), the MLP on all 4 (column then row), residuals
    and norms on 2-3, 1 and {0, 2}, the head on rank 3 alone: every layer as planned, and the
    program matches one process (the backward's collectives in one order on every rank)."""
    name, text = program("transformer", 4, TRANSFORMER, 4, transformer_configs())
    assert not_as_planned(text) == []
    prog = tmp_path / name
    prog.write_text(text)
    passes(prog, n=4)


@pytest.mark.slow
@pytest.mark.multiprocess
def test_eight_processes_on_a_2x2x2_mesh_and_its_sub_meshes(tmp_path):
    """8 gloo processes: the input split 8 ways on the 2 x 2 x 2 mesh, a layer on the 2 x 2
    sub-mesh of ranks 0-3, one on ranks 4-7, the head on rank 5 alone."""
    cfg = {"x": ({"n": 2, "c": 4}, tuple(range(8))), "body_0": ({"n": 2, "c": 2}, (0, 1, 2, 3)),
           "body_2": ({"k": 4}, (4, 5, 6, 7)), "head": ({}, (5,))}
    name, text = program("mlp", 8, MLP_ARGS, 8, cfg)
    lay = layouts_of(text)
    assert not_as_planned(text) == [] and lay["body_0"]["mesh"] == [2, 2]
    prog = tmp_path / name
    prog.write_text(text)
    passes(prog, n=8)


@pytest.mark.multiprocess
def test_searched_small_gpt2_plan_runs_as_planned_on_4_processes(capsys, tmp_path):
    """optcnn at example_models.SMALL puts GPT-2 on device 0: before sub-meshes the export
    followed none of its layers; now each is on the one-rank mesh {0}, the other ranks idle."""
    from example_models import SMALL
    plan, prog = tmp_path / "gpt2.json", tmp_path / "gpt2_small.py"
    args = [x for k, v in SMALL["gpt2"].items() for x in ("-a", f"{k}={v}")]
    code, _, err = cli(capsys, "search", "gpt2", "-n", 4, "--algo", "optcnn", *args, "-o", plan)
    assert code == 0, err
    code, out, err = cli(capsys, "export", plan, "--to", "torch", "--strict", "-o", prog)
    assert code == 0, err
    assert "16 of 16 layers as planned" in out
    assert all(v.get("ranks") == [0] for v in layouts_of(prog.read_text()).values())
    passes(prog, n=4)

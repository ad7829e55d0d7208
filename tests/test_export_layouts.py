"""Per-layer layouts (issue 29): each layer's configuration becomes DTensor placements on one
prime-factor mesh, so layers with different degrees in one plan are each exported as planned;
what the mesh cannot express is listed with its reason, and ``--strict`` refuses it."""

from __future__ import annotations

import pytest

from explorer.engine.export import not_as_planned, program
from explorer.engine.export.layouts import assign, factors
from tests.test_export import cli, passes

GPT2 = {"layers": 1, "hidden": 16, "heads": 4, "seq_len": 8, "vocab": 32}
VGG = {"image_size": 32, "num_classes": 8, "fc": 16}


def test_mesh_is_the_prime_factors_and_every_factorisation_maps_onto_it():
    assert factors(4) == (2, 2) and factors(8) == (2, 2, 2) and factors(6) == (2, 3)
    assert assign({"n": 2, "c": 4}, (2, 2, 2)) == {"n": (0,), "c": (1, 2)}
    assert assign({"c": 2, "k": 4}, (2, 2, 2)) == {"c": (0,), "k": (1, 2)}
    assert assign({"n": 3, "l": 2}, (2, 3)) == {"n": (1,), "l": (0,)}
    assert assign({"n": 4}, (2, 3)) is None


def _configs(graph, rule, n):
    return {la.name: (rule(la), tuple(range(n))) for la in graph.layers()}


def test_mixed_degrees_in_one_plan_are_each_as_planned():
    """One plan mixing n2 l2 norms and adds, n2 c2 / c2 k2 linears, n4 attention on 4 devices:
    a single (dp, tp) mesh could follow one of them; the per-layer layouts follow all."""
    from explorer.engine.core.capture_cache import layer_graph
    g = layer_graph("gpt2", 4, GPT2)

    def rule(la):
        if la.op == "linear":
            return {"c": 2, "k": 2} if la.name.endswith("_proj") else {"n": 2, "c": 2}
        if la.op == "sdpa":
            return {"n": 4}
        if la.op == "embedding":
            return {"c": 4}
        return {"n": 2, "l": 2} if "n" in la.axes else {"c": 4}
    name, text = program("gpt2", 4, GPT2, 4, _configs(g, rule, 4), algo="mixed")
    assert not_as_planned(text) == []
    assert "LAYER_MESH = (2, 2)" in text
    assert "'blocks_0_proj': {'in': ['R', 'S2']" in text            # k: input sharded
    assert "'mode': 'module'" in text and "'P'" in text              # k: Partial output


def test_what_the_mesh_cannot_express_is_listed_with_its_reason():
    from explorer.engine.core.capture_cache import layer_graph
    g = layer_graph("vgg16", 4, VGG)
    convs = [la.name for la in g.layers() if la.op == "conv"]
    cfg = _configs(g, lambda la: {"n": 4}, 4)
    cfg[convs[0]] = ({"h": 2, "n": 2}, (0, 1, 2, 3))
    cfg[convs[1]] = ({"n": 2}, (0, 1))
    _, text = program("vgg16", 4, VGG, 4, cfg)
    off = {d[0]: d for d in not_as_planned(text)}
    assert set(off) == {convs[0]}           # the subset layer is on a mesh of its own ranks
    assert "halos" in off[convs[0]][3] and off[convs[0]][2].startswith("n2, replicated")


@pytest.mark.multiprocess
def test_mixed_layouts_match_one_process_under_torchrun(tmp_path):
    """A mixed plan on 2 gloo processes: n2 norms and attention, c2 then k2 linears,
    l2 adds, c2 embeddings; 3 SGD steps match one process."""
    from explorer.engine.core.capture_cache import layer_graph
    g = layer_graph("gpt2", 4, GPT2)

    def rule(la):
        if la.op == "linear":
            return {"k": 2} if la.name.endswith("_proj") else {"c": 2}
        if la.op in ("sdpa", "norm", "input"):
            return {"n": 2}
        if la.op == "embedding":
            return {"c": 2}
        return {"l": 2} if "l" in la.axes else {"c": 2}
    name, text = program("gpt2", 4, GPT2, 2, _configs(g, rule, 2), algo="mixed")
    assert not_as_planned(text) == []
    prog = tmp_path / name
    prog.write_text(text)
    out = passes(prog)
    assert "computed in other placements" not in out


@pytest.mark.multiprocess
def test_conv_channel_and_batch_splits_match_one_process(tmp_path):
    """VGG-16 with n2 convolutions, c2 / k2 convolutions and linears, n2 pooling."""
    from explorer.engine.core.capture_cache import layer_graph
    g = layer_graph("vgg16", 2, VGG)
    convs = [la.name for la in g.layers() if la.op == "conv"]

    def rule(la):
        if la.name == convs[1] or la.op == "linear" and la.name.endswith("0"):
            return {"c": 2}
        if la.name == convs[2]:
            return {"k": 2}
        if la.op == "linear":
            return {"k": 2}
        return {"n": 2}
    name, text = program("vgg16", 2, VGG, 2, _configs(g, rule, 2))
    assert not_as_planned(text) == []
    prog = tmp_path / name
    prog.write_text(text)
    passes(prog)


def test_strict_refuses_a_program_that_departs_from_the_plan(capsys, tmp_path):
    plan, prog = tmp_path / "p.json", tmp_path / "p.py"
    code, _, err = cli(capsys, "search", "lenet5", "-n", 2, "--preset", "local", "--algo",
                       "optcnn", "-b", "8", "--pin", "conv1=h=2", "-o", plan)
    assert code == 0, err
    code, out, err = cli(capsys, "export", plan, "--strict", "-o", prog)
    assert code == 1 and not prog.exists()
    assert "--strict: not written" in err and "conv1: plan h2" in err
    code, out, err = cli(capsys, "export", plan, "-o", prog)
    assert code == 0 and prog.exists()
    assert "layers as planned" in out and "not as planned:" in out and "conv1: plan h2" in out

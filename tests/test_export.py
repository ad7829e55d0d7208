"""`explorer export PLAN.json --to torch`: the written program applies the plan with PyTorch's
own parallel APIs and, run under torchrun on 2 gloo processes, matches one process (--check).

Each program runs in a fresh directory without the repository on the path: it must be
self-contained.  Tiny model sizes keep every torchrun under a few seconds of compute.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from explorer.cli import main
from explorer.engine.core import plandoc

MLP = ["-a", "hidden=16", "-a", "layers=2", "-b", "8"]
TRANSFORMER = {"layers": 1, "hidden": 16, "heads": 2, "seq": 8, "vocab": 32}


def cli(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def export(capsys, tmp_path, model, algo, *extra):
    """Search ``model`` with ``algo`` on 2 local devices, export the plan: the program's path."""
    plan, prog = tmp_path / f"{model}-{algo}.json", tmp_path / f"{model}_{algo}.py"
    code, _, err = cli(capsys, "search", model, "-n", 2, "--preset", "local", "--algo", algo,
                       *extra, "-o", plan)
    assert code == 0, err
    code, out, err = cli(capsys, "export", plan, "--to", "torch", "-o", prog)
    assert code == 0, err
    assert "torchrun --standalone --nproc_per_node 2" in out
    return prog


def torchrun(prog, *args, n=2):
    """``torchrun --standalone --nproc_per_node n prog --steps 3 --check`` outside the repo."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(OMP_NUM_THREADS="1", TORCH_CPP_LOG_LEVEL="ERROR")
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           "--nproc_per_node", str(n), str(prog), "--steps", "3", "--check",
                           *args], cwd=prog.parent, env=env, capture_output=True, text=True,
                          timeout=300)


def layouts_of(text):
    """The program's LAYOUTS: fx node -> mode and placements."""
    import ast
    start = text.index("LAYOUTS = ") + len("LAYOUTS = ")
    return ast.literal_eval(text[start:text.index("\n\n", start)])


def passes(prog, n=2):
    proc = torchrun(prog, n=n)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "check: passed" in proc.stdout
    return proc.stdout


@pytest.mark.multiprocess
def test_program_is_self_contained(capsys, tmp_path):
    prog = export(capsys, tmp_path, "transformer", "model", *(
        x for k, v in TRANSFORMER.items() for x in ("-a", f"{k}={v}")), "-b", "4")
    text = prog.read_text()
    imports = {line.split()[1].split(".")[0] for line in text.splitlines()
               if line.startswith(("import ", "from "))}
    assert imports <= {"__future__", "argparse", "contextlib", "copy", "os", "sys", "torch",
                       "importlib"}   # the standard library and torch only
    assert "class TransformerClassifier" in text          # the example's source, inlined
    assert "LAYER_MESH = (2,)" in text and "'mode': 'module'" in text   # per-layer layouts
    compile(text, str(prog), "exec")


@pytest.mark.multiprocess
@pytest.mark.parametrize("algo", ["data", "model"])
def test_mlp_plans_match_one_process(capsys, tmp_path, algo):
    prog = export(capsys, tmp_path, "mlp", algo, *MLP)
    text = prog.read_text()
    assert "LAYER_MESH = (2,)" in text and "NOT_AS_PLANNED = []" in text
    assert ("'out': ['S0']" in text) if algo == "data" else ("'params': {'bias': ['S0'], "
                                                               "'weight': ['S0']}" in text)
    passes(prog)


@pytest.mark.multiprocess
def test_megatron_pairs_and_sequence_parallel_norms(tmp_path):
    """Column-parallel q/k/v and fc1, row-parallel out and fc2 (the degree letter k),
    sequence-parallel norms: fc1 hands its shard to fc2, attention gets whole tensors."""
    from explorer.engine.export import program
    from explorer.engine.core.importer import import_spec
    g = import_spec("transformer", 4, TRANSFORMER)
    cfg = {}
    for la in g.layers():
        leaf = la.name.rsplit("_", 1)[-1]
        deg = ({"c": 2} if leaf in ("q", "k", "v", "fc1") else {"k": 2} if leaf in ("out", "fc2")
               else {"l": 2} if la.op == "norm" else {"n": 2})
        cfg[la.name] = (deg, (0, 1))
    name, text = program("transformer", 4, TRANSFORMER, 2, cfg, algo="megatron")
    assert name == "transformer_megatron_2dev.py"
    from explorer.engine.export import not_as_planned
    assert not_as_planned(text) == []            # attention n2 too, on its local shard
    lay = layouts_of(text)
    assert (lay["blocks_0_fc1"]["in"], lay["blocks_0_fc1"]["out"]) == (["R"], ["S2"])  # column
    assert (lay["blocks_0_fc2"]["in"], lay["blocks_0_fc2"]["out"]) == (["S2"], ["P"])  # row
    assert lay["blocks_0_fc2"]["params"]["weight"] == ["S1"]
    prog = tmp_path / name
    prog.write_text(text)
    passes(prog)


@pytest.mark.multiprocess
def test_spatial_conv_split_is_listed_and_the_program_still_matches(capsys, tmp_path):
    prog = export(capsys, tmp_path, "lenet5", "optcnn", "-b", "8", "--pin", "conv1=h=2",
                  "--pin", "conv2=h=2")
    text = prog.read_text()
    head = text[:text.index("from __future__")]
    assert "#   conv1  plan: h2  ->  exported: whole on every rank" in head
    assert "a convolution split on h needs halos" in head
    assert "conv2" in head
    out = passes(prog)
    assert "not as planned: conv1: plan h2 -> whole on every rank: a convolution split" in out


@pytest.mark.multiprocess
def test_check_fails_when_the_distributed_step_differs(capsys, tmp_path):
    """The --check is not vacuous: every rank training on the first half of the batch gives
    other updates than one process on the whole batch, and the program exits 1."""
    prog = export(capsys, tmp_path, "mlp", "data", *MLP)
    text = prog.read_text()
    wrong = text.replace("xs = x                     # the input layer takes its own shard",
                         "xs = x * (1 + dist.get_rank())")
    assert wrong != text
    prog.write_text(wrong)
    proc = torchrun(prog)
    assert proc.returncode != 0 and "check: FAILED" in proc.stdout, proc.stdout[-2000:]


def test_bad_input_is_one_line(capsys, tmp_path):
    tofu = tmp_path / "tofu.json"
    tofu.write_text(json.dumps(plandoc.seal({"model": "mlp", "devices": 2}, "tofu")))
    place = tmp_path / "place.json"
    place.write_text(json.dumps(plandoc.seal({"model": "mlp", "placement": {}}, "placement")))
    junk = tmp_path / "junk.json"
    junk.write_text("[1, 2]")
    code, _, err = cli(capsys, "search", "mlp", "-n", 2, "--preset", "local", "--algo", "data",
                       *MLP, "-o", tmp_path / "p.json")
    assert code == 0, err
    cases = [((tofu,), "Tofu plan"), ((place,), "device placement"),
             ((junk,), "is not a plan"), ((tmp_path / "missing.json",), "not found"),
             ((tmp_path / "p.json", "--to", "jax"), "cannot export to 'jax'"),
             ((tmp_path / "p.json", "-o", tmp_path / "no" / "such" / "dir.py"), "cannot write")]
    for argv, words in cases:
        code, out, err = cli(capsys, "export", *argv)
        assert code == 2 and words in err, (argv, err)
        assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert "layer-wise plans" in cli(capsys, "export", tofu)[2]


@pytest.mark.multiprocess
def test_the_app_offers_the_program_for_its_layerwise_plan():
    """The Plan tab's "Export to PyTorch" goes through service.export, which seals the app's
    in-memory plan first; other plan kinds get the one-line refusal."""
    from explorer import service
    from explorer.app import create_app
    from explorer.errors import ExplorerError
    from explorer.views import ids
    req = service.Request(model="mlp", batch=8, devices=2, preset="local", algo="data",
                          model_args={"layers": 1, "hidden": 8})
    name, text = service.export(service.search(req))
    assert name == "mlp_data_2dev.py" and "LAYER_MESH = (2,)" in text
    compile(text, name, "exec")
    with pytest.raises(ExplorerError, match="layer-wise plans"):
        service.export(service.plan_file(service.tofu(req, "tofu")))
    assert any(ids.PLAN_EXPORT in key for key in create_app().callback_map)


TODAY = {"gpt2": ["-a", "layers=1", "-a", "hidden=32", "-a", "heads=2", "-a", "seq_len=8",
                  "-a", "vocab=64", "-b", "4"],
         "bert": ["-a", "layers=1", "-a", "hidden=32", "-a", "heads=2", "-a", "seq_len=8",
                  "-a", "vocab=64", "-b", "4"]}


@pytest.mark.multiprocess
@pytest.mark.parametrize("model", list(TODAY))
def test_transformer_megatron_plans_run_under_torchrun(capsys, tmp_path, model):
    """The GPT-2- and BERT-style examples' megatron plans (column- then row-parallel linears)
    exported and run for 3 steps on 2 gloo processes match one process."""
    prog = export(capsys, tmp_path, model, "megatron", *TODAY[model])
    text = prog.read_text()
    outs = {tuple(v["out"]) for v in layouts_of(text).values() if v["mode"] == "module"}
    assert ("S2",) in outs and ("P",) in outs          # column- then row-parallel linears
    passes(prog)


def test_the_exported_body_is_a_module_whose_helpers_compute_what_the_runtime_does():
    """The program body is a real module: it imports alone, its loss is the runtime's
    (Σ mean(o²) over floating outputs), its SGD is p -= lr·grad, and ``rel`` is relative."""
    import torch

    from explorer.engine.export import runner as program

    out = {"a": torch.tensor([1.0, 3.0]), "b": (torch.tensor([2.0]), torch.tensor([1, 2]))}
    assert [t.tolist() for t in program.tensors(out)] == [[1.0, 3.0], [2.0], [1, 2]]
    assert float(program.loss_of(out)) == pytest.approx(5.0 + 4.0)
    lin = torch.nn.Linear(2, 1)
    before = lin.weight.detach().clone()
    program.loss_of(lin(torch.ones(3, 2))).backward()
    grad = lin.weight.grad.clone()
    program.sgd_(lin, 0.5)
    assert torch.allclose(lin.weight, before - 0.5 * grad) and lin.weight.grad is None
    assert program.rel([1.0, 2.0], [1.0, 4.0]) == pytest.approx(0.5)
    assert "def main(argv=None)" in program.body() and "PROGRAM BODY" not in program.body()


def test_an_export_says_how_many_layers_are_not_as_planned():
    """The exported file's NOT_AS_PLANNED list is read back into one line for the user
    (command line and app): nothing is dropped silently."""
    from explorer import service
    from explorer.engine.export import not_as_planned, summary
    text = 'x = 1\nNOT_AS_PLANNED = [("conv1", "w2", "n2", "halos")]\n'
    assert not_as_planned(text) == [("conv1", "w2", "n2", "halos")]
    assert summary(text, 7).startswith("6 of 7 layers as planned; 1 not") and "conv1" in summary(
        text, 7)
    assert summary("NOT_AS_PLANNED = []\n", 3) == "3 of 3 layers as planned"
    assert service.export_note("NOT_AS_PLANNED = []\n", 3) == "3 of 3 layers as planned"
    note = service.export_note(text, 7)
    assert note.startswith("6 of 7 layers as planned. Not as planned:") and "conv1: plan w2" in note


@pytest.mark.slow
@pytest.mark.multiprocess
def test_fsdp_plan_exports_checkpoint_and_fully_shard(capsys, tmp_path):
    """The fsdp baseline (every layer data-parallel, ZeRO-3 and recomputed): each layer's
    module under fully_shard, run under torch.utils.checkpoint, as planned; the program
    matches one process."""
    prog = export(capsys, tmp_path, "mlp", "fsdp", *MLP)
    text = prog.read_text()
    assert "NOT_AS_PLANNED = []" in text
    specs = layouts_of(text)
    assert all(specs[n].get("fsdp") == 3 and specs[n].get("recompute")
               for n in ("body_0", "body_2", "head"))
    passes(prog)


@pytest.mark.slow
@pytest.mark.multiprocess
def test_zero2_recompute_and_zero1_export(tmp_path):
    """ZeRO-2 (fully_shard keeping the gathered weights until the backward) and a
    recomputed feature-split layer as planned; ZeRO-1 (optimizer state only) listed as not
    as planned with its reason.  The program matches one process."""
    from explorer.engine.export import not_as_planned, program
    cfg = {"x": ({"n": 2}, (0, 1)), "body_0": ({"n": 2}, (0, 1)),
           "body_2": ({"c": 2}, (0, 1)), "head": ({"n": 2}, (0, 1))}
    savings = {"body_0": (True, 2), "body_2": (True, 0), "head": (False, 1)}
    _, text = program("mlp", 8, {"hidden": 16, "layers": 2}, 2, cfg, savings=savings)
    specs = layouts_of(text)
    assert specs["body_0"]["fsdp"] == 2 and specs["body_0"]["recompute"]
    assert specs["body_2"]["recompute"] and "fsdp" not in specs["body_2"]
    off = not_as_planned(text)
    assert [d[0] for d in off] == ["head"] and "ZeRO-1" in off[0][1]
    prog = tmp_path / "mlp_zero.py"
    prog.write_text(text)
    out = passes(prog)
    assert "3 of 4 layers as planned" in out

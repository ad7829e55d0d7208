"""Tests for the `explorer` command line (explorer.cli.main, run in-process).

The JSON printed by `search --json` and the file written by `--dump-costs` are contracts:
other tools parse them, so their fields are checked here, and equation 1 is
recomputed from the dump alone.
"""

from __future__ import annotations

import json

import pytest

from explorer.cli import main
import example_models


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def search_json(capsys, *argv):
    code, out, err = run(capsys, "search", *argv, "--json")
    assert code == 0, err
    return json.loads(out)


def equation1(plan: dict, dump: dict) -> float:
    """Σ_layers (t_C + t_S + t_R) + Σ_edges t_X for the plan's configurations, from the dump
    only (t_R: the reduce-scatter of a row-parallel configuration)."""
    chosen = {la["name"]: la for la in plan["layers"]}
    assert [la["name"] for la in dump["layers"]] and set(chosen) == {
        la["name"] for la in dump["layers"]}
    index, total = {}, 0.0
    for la in dump["layers"]:
        want = chosen[la["name"]]
        hits = [i for i, c in enumerate(la["candidates"])
                if c["config"] == want["config"] and c["devices"] == want["devices"]]
        assert len(hits) == 1, f"{la['name']}: chosen config not among the candidates"
        i = hits[0]
        index[la["name"]] = i
        total += la["candidates"][i]["t_compute_s"] + la["candidates"][i]["t_sync_s"] + \
            la["candidates"][i]["t_reduce_s"]
    for e in dump["edges"]:
        total += e["t_xfer_s"][index[e["src"]]][index[e["dst"]]]
    return total


# --------------------------------------------------------------------------------------------
# search --json
# --------------------------------------------------------------------------------------------


def test_search_json_contract_fields(capsys):
    doc = search_json(capsys, "lenet5", "--devices", "4")
    assert doc["schema"] == "plan-explorer/layerwise" and doc["version"] == 2
    assert doc["model"] == "lenet5" and doc["algo"] == "optcnn" and doc["devices"] == 4
    assert doc["batch"] == example_models.MODELS["lenet5"].default_batch
    for key in ("objective_s", "predicted_step_time_s", "search_time_s"):
        assert isinstance(doc[key], float) and doc[key] >= 0, key
    assert doc["objective_s"] > 0
    names = [la["name"] for la in doc["layers"]]
    assert names == ["x", "conv1", "pool1", "conv2", "pool2", "fc1", "fc2", "fc3"]
    for la in doc["layers"]:
        assert set(la) >= {"name", "op", "config", "devices"}
        assert set(la["config"]) <= set("nchwl")
        assert all(isinstance(v, int) and v >= 1 for v in la["config"].values())
        prod = 1
        for v in la["config"].values():
            prod *= v
        assert len(la["devices"]) == prod                       # one device per tile
        assert len(set(la["devices"])) == prod
        assert all(0 <= d < 4 for d in la["devices"])
    ops = {la["name"]: la["op"] for la in doc["layers"]}
    assert ops["conv1"] == "conv" and ops["fc1"] == "linear" and ops["x"] == "input"
    assert set(doc["layers"][1]["config"]) == {"n", "c", "h", "w"}
    assert set(doc["layers"][5]["config"]) == {"n", "c"}


def test_search_text_output(capsys):
    code, out, err = run(capsys, "search", "lenet5", "--devices", "2", "--batch", "8")
    assert code == 0, err
    assert out.startswith("lenet5  batch 8  on 2× P100")
    assert "objective (eq. 1)" in out and "conv1" in out and "fc3" in out


@pytest.mark.parametrize("argv", [
    ("lenet5", "--devices", "4"),
    ("lenet5", "--devices", "4", "--algo", "data"),
    ("lenet5", "--devices", "8", "--batch", "16", "--sync", "ring"),
    ("resnet50", "--devices", "4", "--batch", "8", "-a", "image_size=32", "-a",
     "num_classes=10"),
    ("lstm", "--devices", "4", "--batch", "4", "-a", "hidden=32", "-a", "steps=3"),
], ids=["lenet5", "lenet5-data", "lenet5-8-ring", "resnet50", "lstm"])
def test_dump_costs_recomputes_objective(capsys, tmp_path, argv):
    dump_path = tmp_path / "costs.json"
    plan = search_json(capsys, *argv, "--dump-costs", str(dump_path))
    dump = json.loads(dump_path.read_text())
    assert set(dump) >= {"layers", "edges"}
    for la in dump["layers"]:
        assert la["candidates"]
        for c in la["candidates"]:
            assert set(c) >= {"config", "devices", "t_compute_s", "t_sync_s"}
            assert c["t_compute_s"] >= 0 and c["t_sync_s"] >= 0
    names = {la["name"] for la in dump["layers"]}
    sizes = {la["name"]: len(la["candidates"]) for la in dump["layers"]}
    for e in dump["edges"]:
        assert set(e) >= {"src", "dst", "t_xfer_s"}
        assert e["src"] in names and e["dst"] in names
        m = e["t_xfer_s"]
        assert len(m) == sizes[e["src"]] and all(len(r) == sizes[e["dst"]] for r in m)
    assert equation1(plan, dump) == pytest.approx(plan["objective_s"], rel=1e-9, abs=0)


def test_optcnn_plan_is_the_minimum_of_equation1_on_a_chain(capsys, tmp_path):
    # lenet5's layer graph is a chain, so the exact minimum of equation 1 over the dumped
    # tables is a small dynamic programme; the OptCNN search must reach it.
    dump_path = tmp_path / "costs.json"
    plan = search_json(capsys, "lenet5", "--devices", "4", "--dump-costs", str(dump_path))
    dump = json.loads(dump_path.read_text())
    layers = dump["layers"]
    edges = {(e["src"], e["dst"]): e["t_xfer_s"] for e in dump["edges"]}
    assert len(edges) == len(layers) - 1
    best = [c["t_compute_s"] + c["t_sync_s"] for c in layers[0]["candidates"]]
    for prev, cur in zip(layers, layers[1:]):
        x = edges[(prev["name"], cur["name"])]
        best = [c["t_compute_s"] + c["t_sync_s"] + min(best[i] + x[i][j] for i in range(len(best)))
                for j, c in enumerate(cur["candidates"])]
    assert plan["objective_s"] == pytest.approx(min(best), rel=1e-9, abs=0)


def test_pin_is_honoured(capsys):
    doc = search_json(capsys, "lenet5", "--devices", "4", "--pin", "conv1=c=2")
    conv1 = next(la for la in doc["layers"] if la["name"] == "conv1")
    assert conv1["config"]["c"] == 2
    assert "conv1=c=2" in doc["pins"]
    doc = search_json(capsys, "lenet5", "--devices", "4", "--pin", "fc1=n=2@2,3")
    fc1 = next(la for la in doc["layers"] if la["name"] == "fc1")
    assert fc1["config"] == {"n": 2, "c": 1} and fc1["devices"] == [2, 3]


@pytest.mark.parametrize("pin, needles", [
    ("conv1=h=3", ["conv1=h=3", "cannot be met", "no such configuration on 4 devices",
                   "Possible:"]),
    ("nosuch=c=2", ["no layer named 'nosuch'"]),
    ("fc1=h=2", ["fc1", "no dimension ['h']", "its dimensions are ['n', 'c']"]),
    ("conv1", ["cannot read pin 'conv1'"]),
    ("conv1=q=2", ["'q=2'"]),
    ("conv1=@0,1,2", ["3 devices do not divide the 4"]),
    ("conv1=@9", ["devices [9] do not exist"]),
])
def test_impossible_pins_exit_2_with_message(capsys, pin, needles):
    code, out, err = run(capsys, "search", "lenet5", "--devices", "4", "--pin", pin)
    assert code == 2
    assert out == ""
    assert err.startswith("error: ") and err.count("\n") == 1   # one line
    for n in needles:
        assert n in err, (n, err)


def test_pinning_a_layer_twice_is_an_error(capsys):
    code, _, err = run(capsys, "search", "lenet5", "--pin", "conv1=c=2", "--pin", "conv1=n=2")
    assert code == 2 and "conv1 is pinned twice" in err


def test_data_parallel_needs_divisible_batch(capsys):
    code, out, err = run(capsys, "search", "lenet5", "--algo", "data", "--batch", "6",
                         "--devices", "4")
    assert code == 2 and out == ""
    assert "batch (6)" in err and "4 devices" in err


def test_model_arg_passes_through(capsys):
    small = search_json(capsys, "mlp", "--devices", "2", "-a", "layers=2", "-a", "hidden=64")
    big = search_json(capsys, "mlp", "--devices", "2", "-a", "hidden=64")
    assert [la["op"] for la in small["layers"]] == ["input"] + ["linear"] * 3
    assert len(big["layers"]) == 6                    # default layers=4: 4 hidden + head
    assert small["model_args"]["layers"] in ("2", 2)


def test_out_file_equals_printed_json(capsys, tmp_path):
    out_path = tmp_path / "plan.json"
    doc = search_json(capsys, "lenet5", "--devices", "2", "--out", str(out_path))
    saved = json.loads(out_path.read_text())
    assert saved["layers"] == doc["layers"] and saved["objective_s"] == doc["objective_s"]
    # the file is a sealed plan document (the printed JSON is the plan as before)
    from explorer.engine.core import plandoc
    assert saved["schema"] == "plan-explorer/layerwise" and saved["version"] == 2
    assert plandoc.open_document(saved) == "layerwise"


def test_run_of_a_missing_or_foreign_file_is_one_line(capsys, tmp_path):
    code, out, err = run(capsys, "run", str(tmp_path / "nope.json"))
    assert code == 2 and out == "" and "not found" in err and err.count("\n") == 1
    bad = tmp_path / "bad.json"
    bad.write_text("{broken")
    code, _, err = run(capsys, "run", str(bad))
    assert code == 2 and "cannot read plan" in err and err.count("\n") == 1
    bad.write_text('{"hello": 1}')
    code, _, err = run(capsys, "run", str(bad))
    assert code == 2 and "is not a plan" in err


def test_bad_numbers_exit_2(capsys):
    code, _, err = run(capsys, "search", "lenet5", "--devices", "0")
    assert code == 2 and "--devices must be ≥ 1, got 0" in err
    code, _, err = run(capsys, "search", "lenet5", "--batch", "0")
    assert code == 2 and "--batch must be ≥ 1, got 0" in err
    code, _, err = run(capsys, "search", "lenet5", "--preset", "p100-nvlink-4", "--devices", "8")
    assert code == 2 and "has 4 devices, 8 were asked for" in err


def test_unknown_model_exit_2(capsys):
    code, out, err = run(capsys, "search", "nosuchnet")
    assert code == 2 and out == ""
    assert "unknown model 'nosuchnet'" in err and "lenet5" in err
    code, _, err = run(capsys, "graph", "nosuchnet")
    assert code == 2 and "unknown model 'nosuchnet'" in err


def test_unknown_model_arg_exit_2(capsys):
    code, _, err = run(capsys, "search", "mlp", "-a", "depth=3")
    assert code == 2 and "depth" in err and "layers" in err


def test_malformed_arguments_are_argparse_errors(capsys):
    with pytest.raises(SystemExit) as ei:
        main(["search", "mlp", "-a", "layers"])          # not KEY=VALUE
    assert ei.value.code == 2
    assert "expected KEY=VALUE, got 'layers'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["search", "lenet5", "--algo", "magic"])
    assert "invalid choice: 'magic'" in capsys.readouterr().err


# --------------------------------------------------------------------------------------------
# listings
# --------------------------------------------------------------------------------------------


def test_models_lists_every_example(capsys):
    code, out, _ = run(capsys, "models")
    assert code == 0
    lines = [l for l in out.splitlines() if l and not l.startswith(" ")]
    assert [l.split()[0] for l in lines] == list(example_models.MODELS)
    assert any(l.startswith("lenet5") and "batch 64" in l for l in lines)
    assert "args: " in out and "num_classes=10" in out


def test_presets_lists_every_preset(capsys):
    from explorer.engine.core.devices import PRESETS
    code, out, _ = run(capsys, "presets")
    assert code == 0
    for name in PRESETS:
        assert any(l.startswith(name) for l in out.splitlines()), name
    assert "k80-pcie-8     devices 8" in out
    assert "cluster.json" in out


def test_graph_lists_layers(capsys):
    code, out, _ = run(capsys, "graph", "lenet5", "--batch", "2")
    assert code == 0
    lines = out.splitlines()
    assert lines[0].startswith("lenet5: 8 layers, 7 edges") and "captured with fx" in lines[0]
    assert "(batch 2" in lines[0]
    conv1 = next(l for l in lines if l.startswith("conv1"))
    assert "conv" in conv1 and "[2, 6, 24, 24]" in conv1 and "<- x" in conv1
    assert len(lines) == 1 + 8


def test_graph_json(capsys):
    code, out, _ = run(capsys, "graph", "lenet5", "--batch", "2", "--json")
    assert code == 0
    doc = json.loads(out)
    assert doc["model"] == "lenet5" and doc["batch"] == 2 and doc["source"] == "fx"
    assert len(doc["layers"]) == 8 and len(doc["edges"]) == 7
    fc1 = next(l for l in doc["layers"] if l["name"] == "fc1")
    assert fc1["in_shapes"] == [[2, 256]] and fc1["axes"] == "nc"


def test_search_on_custom_cluster_file(capsys, tmp_path):
    cluster = {"name": "two-box", "intra_node_bw": 50e9, "latency": 1e-6,
               "devices": [{"name": f"g{i}", "kind": "Z1", "peak_flops": 5e12, "mem_bw": 5e11,
                            "memory": 8e9} for i in range(2)]}
    p = tmp_path / "two.json"
    p.write_text(json.dumps(cluster))
    doc = search_json(capsys, "lenet5", "--preset", str(p), "--devices", "2")
    assert doc["devices"] == 2 and doc["preset"] == "two-box"
    assert all(max(la["devices"]) <= 1 for la in doc["layers"])
    code, _, err = run(capsys, "search", "lenet5", "--preset", str(p), "--devices", "4")
    assert code == 2 and "has 2 devices, 4 were asked for" in err
    p.write_text("{broken")
    code, _, err = run(capsys, "search", "lenet5", "--preset", str(p), "--devices", "2")
    assert code == 2 and "two.json" in err


def test_unknown_preset_exit_2(capsys):
    code, _, err = run(capsys, "search", "lenet5", "--preset", "tpu-v9")
    assert code == 2 and "unknown device preset 'tpu-v9'" in err and "k80-pcie-8" in err


def test_graph_json_reports_parameters(capsys):
    code, out, _ = run(capsys, "graph", "lenet5", "--batch", "2", "--json")
    assert code == 0
    doc = json.loads(out)
    assert doc["parameters"] == 44426 == doc["opgraph"]["parameters"]
    assert doc["unused_parameters"] == 0


# --------------------------------------------------------------------------------------------
# data-dependent ops and ops without a rule: one line naming the op and the user's line
# --------------------------------------------------------------------------------------------

DATA_DEPENDENT = '''
import torch
from torch import nn


class M(nn.Module):
    def __init__(self, kind):
        super().__init__()
        self.kind = kind
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        y = self.fc(x)
        if self.kind == "nonzero":
            return y * (y > 0).nonzero().shape[0]
        if self.kind == "item":
            return y[:, :int((y > 0).sum().item())]
        if self.kind == "mask":
            return y[y > 0]
        return torch.logcumsumexp(y, 1)


def build(kind="nonzero"):
    return M(kind), torch.randn(4, 8)
'''


@pytest.mark.parametrize("algo,kind,needle", [
    ("optcnn", "nonzero", "data-dependent op 'nonzero'"),
    ("tofu", "nonzero", "data-dependent op 'nonzero'"),
    ("celeritas", "item", "data-dependent op 'item'"),
    ("metis", "mask", "data-dependent op 'boolean-mask indexing'"),
    ("optcnn", "mask", "data-dependent op 'boolean-mask indexing'"),
    ("optcnn", "norule", "unsupported op 'logcumsumexp'"),
    ("tofu", "norule", "logcumsumexp"),
])
def test_data_dependent_and_unknown_ops_name_the_users_line(capsys, tmp_path, algo, kind,
                                                            needle):
    p = tmp_path / "dd.py"
    p.write_text(DATA_DEPENDENT)
    code, out, err = run(capsys, "search", f"{p}:build", "--algo", algo, "-a", f"kind={kind}",
                         "--devices", "2")
    assert code == 2
    line = {"nonzero": "return y * (y > 0).nonzero().shape[0]",
            "item": "return y[:, :int((y > 0).sum().item())]", "mask": "return y[y > 0]",
            "norule": "return torch.logcumsumexp(y, 1)"}[kind]
    assert needle in err and "dd.py:" in err and line in err, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_absurd_device_count_is_one_line(capsys):
    """A device count whose device graph cannot be allocated here: one line, exit 2, no
    traceback (the allocation fails at once, so the test is bounded)."""
    code = main(["search", "mlp", "-a", "layers=1", "-a", "hidden=8", "-n", "1000000"])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("error: ") and "Traceback" not in err
    assert "1000000 devices" in err and len(err.strip().splitlines()) == 1


def test_batch_norm_at_batch_one_says_what_to_change(capsys):
    """A training step with one value per batch-norm channel cannot be traced: the one-line
    error names the batch size, not in-place ops."""
    code, out, err = run(capsys, "search", "resnet50", "--batch", "1", "-a", "image_size=32",
                         "--devices", "4", "--algo", "tofu")
    assert code == 2 and out == "" and err.count("\n") == 1
    assert "larger --batch" in err and "In-place" not in err


NEEDS_TWO_INPUTS = '''
import torch


class M(torch.nn.Module):
    """Raises while traced, as an encoder-decoder model fed no decoder inputs did."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)

    def forward(self, x, decoder_input_ids=None):
        if decoder_input_ids is None:
            raise ValueError("You must specify exactly one of decoder_input_ids or embeds")
        return self.fc(x)


def build():
    return M(), torch.randn(4, 8)
'''


@pytest.mark.parametrize("algo", ["tofu", "celeritas"])
def test_an_untraceable_step_is_one_line_not_a_traceback(capsys, tmp_path, algo):
    """A model whose forward raises while traced: the operator-level families say so in one
    line (exit 2), not with an error raised while cleaning up."""
    p = tmp_path / "two.py"
    p.write_text(NEEDS_TWO_INPUTS)
    code = main(["search", f"{p}:build", "--devices", "2", "--batch", "2", "--algo", algo])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert "could not trace" in err


@pytest.mark.parametrize("argv,want", [
    (["search", "mlp", "-b", "8", "-a", "layers=2", "--devices", "64"], ("mlp", 8, {"layers": "2"})),
    (["search", "vgg16", "--batch=16", "--model-arg=image_size=64"],
     ("vgg16", 16, {"image_size": "64"})),
    (["search", "mlp", "--algo", "optcnn"], ("mlp", None, {})),
    (["search", "mlp", "--algo", "tofu"], None),           # another family: no layer graph
    (["search", "--devices", "4", "mlp"], None),           # not plainly readable
    (["search", "mlp", "--batch", "0"], None),
    (["search", "mlp", "-a", "oops"], None),
    (["models"], None),
])
def test_search_starts_tracing_before_the_parser_when_it_reads_plainly(monkeypatch, argv, want):
    """``explorer search MODEL`` starts its capture child before the parser and the method
    registry are imported (a first search waits 0.3 s less), only when the command line
    says plainly which layer graph it needs."""
    from explorer import cli
    from explorer.engine.core import capture_cache
    calls = []
    monkeypatch.setattr(capture_cache, "TRACE_IN_CHILD", False)
    monkeypatch.setattr(capture_cache, "start_layer_graph",
                        lambda spec, batch, margs: calls.append((spec, batch, margs)))
    cli._trace_early(argv)
    assert calls == ([want] if want else [])


def test_a_meta_build_makes_random_inputs_without_torchs_python_references():
    """Models are built on meta tensors; their random example inputs are empty meta tensors
    of the same shape and dtype (torch's references for them import sympy, 0.6 s)."""
    import torch

    from explorer.engine.core.models import _call_builder

    def build():
        x = torch.randn(2, 3, 4)
        return torch.nn.Linear(4, 5), (x, torch.randint(0, 9, (2, 7)),
                                       torch.rand((3,), dtype=torch.float64),
                                       torch.randn_like(x))
    seen = {}

    def builder():
        m, parts = build()
        seen["parts"] = parts
        return m, parts[0]
    model, x = _call_builder(builder, True, "t")
    shapes = [(tuple(t.shape), t.dtype, t.device.type) for t in seen["parts"]]
    assert shapes == [((2, 3, 4), torch.float32, "meta"), ((2, 7), torch.int64, "meta"),
                      ((3,), torch.float64, "meta"), ((2, 3, 4), torch.float32, "meta")]
    assert model.weight.device.type == "meta"

"""Layer-wise transformer ops: today's attention blocks import, cost, search (OptCNN equal to
exhaustive search) and run on 2 local workers exactly as one device computes them.

Models: hand-written GPT-2, Llama, BERT and ViT blocks (``tests/transformer_blocks.py``) and Hugging
Face GPT-2, BERT and Llama at tiny configurations (skipped without ``transformers``).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from explorer import service as session
from explorer.engine.core import geometry as G
from explorer.engine.layerwise.costmodel import CostModel
from explorer.engine.core.devices import preset
from explorer.engine.core.importer import import_model
from explorer.engine.search import Problem, run
from explorer.errors import UnsupportedModel

HERE = Path(__file__).resolve().parent
SPEC = str(HERE / "transformer_blocks.py")
sys.path.insert(0, str(HERE))
import transformer_blocks as M  # noqa: E402

pytestmark = pytest.mark.multiprocess   # every test here starts worker processes

HAVE_HF = importlib.util.find_spec("transformers") is not None
HF = pytest.mark.skipif(not HAVE_HF, reason="transformers is not installed")
MODELS = ["gpt2", "llama", "bert", "vit", "vit_seq_first",
          pytest.param("hf_gpt2", marks=HF), pytest.param("hf_bert", marks=HF),
          pytest.param("hf_llama", marks=HF)]


def _graph(name, **kw):
    model, x = getattr(M, name)(**kw)
    return model, import_model(model, x, name)


# --------------------------------------------------------------------------------------------
# import
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", MODELS)
def test_imports_every_parameter_and_no_constant_layer(name):
    model, g = _graph(name)
    assert g.summary()["parameters"] == sum(p.numel() for p in model.parameters())
    ops = {la.op for la in g.layers()}
    assert ops <= {"input", "embedding", "conv", "linear", "norm", "eltwise", "reduce", "concat",
                   "matmul", "softmax", "sdpa", "mha"}
    # masks, positions and rotary tables never become layers, and every layer reads the input
    assert all(la.op == "input" or g.in_edges(la.name) for la in g.layers())


def test_conv1d_addmm_is_a_linear_layer_with_the_weight_transposed():
    _, g = _graph("gpt2")
    lins = [la for la in g.layers() if la.op == "linear"]
    assert len(lins) == 4 and all(la.attrs["weight_t"] for la in lins)
    qkv = lins[0]
    assert qkv.params == {"bias": (96,), "weight": (32, 96)} and qkv.out_shape == (32, 96)
    # the weight [in, out] is split on its columns with the output channels, the bias too
    cfg = G.Config((("n", 1), ("c", 2)), (0, 1))
    shards = G.param_shards(qkv, G.output_boxes(qkv, cfg))
    assert shards["weight"][1].tolist() == [[[0, 32], [0, 48]], [[0, 32], [48, 96]]]
    assert shards["bias"][1].tolist() == [[[0, 48]], [[48, 96]]]
    # split of the fused projection: three slices of the one layer
    att = next(la for la in g.layers() if la.op == "matmul")
    starts = sorted(t[2] for e in g.in_edges(att.name) for t in e.transforms if t[0] == "slice")
    assert starts == [0, 32]


def test_a_value_read_twice_is_not_folded():
    # gelu_new: h*0.5, h**3 and h + ... all read the projection h: folding any of them into
    # the projection would change what the others read
    _, g = _graph("gpt2")
    fc = [la for la in g.layers() if la.op == "linear"][2]
    assert fc.folded == []
    readers = sorted(g.layer(e.dst).attrs.get("fn") for e in g.out_edges(fc.name))
    assert readers == ["add", "mul", "pow"]


def test_llama_block_rmsnorm_rotary_causal_swiglu():
    _, g = _graph("llama")
    by_op = {}
    for la in g.layers():
        by_op.setdefault(la.op, []).append(la)
    assert [la.attrs.get("causal") for la in by_op["sdpa"]] == [True]
    assert len(by_op["reduce"]) == 2 and len(by_op["norm"]) == 1       # written out / nn.RMSNorm
    assert len(by_op["concat"]) == 2                                   # rotate_half of q and k
    gate = next(la for la in by_op["linear"] if "gate" in la.name)
    assert any("silu" in f for f in gate.folded)


def test_bert_block_unbind_baddbmm_where():
    _, g = _graph("bert")
    bmm = next(la for la in g.layers() if la.op == "matmul" and la.attrs.get("addend"))
    assert bmm.attrs["addend"] == "const" and len(g.in_edges(bmm.name)) == 2
    assert all(any(t[0] == "select" for t in e.transforms) for e in g.in_edges(bmm.name))
    assert any(la.attrs.get("fn") == "where" for la in g.layers())


@pytest.mark.parametrize("batch_first", [True, False])
def test_multihead_attention_is_one_layer(batch_first):
    _, g = _graph("vit", batch_first=batch_first)
    mha = next(la for la in g.layers() if la.op == "mha")
    assert mha.axes == (("n", "l", "-") if batch_first else ("l", "n", "-"))
    assert set(mha.params) == {"in_proj_weight", "in_proj_bias", "out_proj.weight",
                               "out_proj.bias"}
    assert mha.attrs["mask"] == (None if batch_first else "const")
    assert len(g.in_edges(mha.name)) == 3
    # queries follow the box, keys and values need every position of the box's samples
    cfg = G.Config(tuple((d, 2 if d == "l" else 1) for d in mha.dims), (0, 1))
    boxes = G.output_boxes(mha, cfg)
    l_ax = mha.axes.index("l")
    q, k = G.input_regions(mha, 0, boxes), G.input_regions(mha, 1, boxes)
    assert q[1, l_ax].tolist() == [2, 4] and k[1, l_ax].tolist() == [0, 4]


@pytest.mark.parametrize("forward, words", [
    (lambda m, x: m.attn(x, x, x, key_padding_mask=x[:, :, 0] > 0)[0],
     "key_padding_mask"),
    (lambda m, x: torch.einsum("nld,nmd->nlm", m.lin(x), x), "einsum"),
])
def test_ops_without_a_rule_are_named(forward, words):
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.attn = nn.MultiheadAttention(8, 2, batch_first=True)
            self.lin = nn.Linear(8, 8)

        def forward(self, x):
            return forward(self, x)
    with pytest.raises(UnsupportedModel, match=words):
        import_model(Net(), torch.randn(2, 4, 8))


def test_constant_computed_from_a_parameter_is_refused():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)
            self.table = nn.Parameter(torch.randn(4, 4))

        def forward(self, x):
            return self.lin(x) * torch.tanh(self.table)
    with pytest.raises(UnsupportedModel, match="table"):
        import_model(Net(), torch.randn(3, 4))


# --------------------------------------------------------------------------------------------
# search
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", MODELS)
def test_optcnn_equals_exhaustive_at_two_devices(name):
    _, g = _graph(name)
    d = preset("p100-cluster", 2)
    cm = CostModel(g, d)
    fast = run("optcnn", Problem.of(g, d, cm))
    slow = run("exhaustive", Problem.of(g, d, cm), options={"max_space": 10 ** 20})
    assert fast.plan.objective_s == pytest.approx(slow.plan.objective_s, rel=1e-9)
    for algo in ("data", "model", "owt"):
        assert fast.plan.objective_s <= run(algo, Problem.of(g, d, cm)).plan.objective_s + 1e-15


# --------------------------------------------------------------------------------------------
# runtime: 2 workers against the single-device step
# --------------------------------------------------------------------------------------------


def _pins(name, letters):
    """Pin every layer to the first of ``letters`` it can split in two (a mixed plan: rows of
    attention, columns of projections, positions elsewhere)."""
    req = session.Request(model=f"{SPEC}:{name}", preset="local", devices=2, batch=4)
    out = []
    for la in session.graph_for(req).layers():
        for letter in letters:
            if la.op != "input" and letter in la.dims and la.size(letter) >= 2:
                out.append(f"{la.name}={letter}=2")
                break
    return out


# (case id, model, pin letters or None for the searched plan)
RUNS = [("gpt2-rows", "gpt2", "lhc"), ("gpt2-columns", "gpt2", "cw"),
        ("llama-rows", "llama", "lhc"), ("llama-searched", "llama", None),
        ("bert-rows", "bert", "lhc"), ("vit-seq-first-rows", "vit_seq_first", "l")]
if HAVE_HF:
    RUNS += [("hf_gpt2-rows", "hf_gpt2", "lhc"), ("hf_llama-columns", "hf_llama", "cw")]


@pytest.fixture(scope="module")
def ran():
    from explorer.engine.runtime import launch_many
    plans = []
    for _, name, letters in RUNS:
        req = session.Request(model=f"{SPEC}:{name}", preset="local", devices=2, batch=4,
                              algo="optcnn")
        doc = session.search(req, _pins(name, letters) if letters else None)
        doc.pop("trace", None)
        plans.append(doc)
    results = launch_many(plans, steps=0, warmup=0, timeout_s=900, store=False)
    return {c[0]: (p, r) for c, p, r in zip(RUNS, plans, results)}


@pytest.mark.parametrize("case", [c[0] for c in RUNS])
def test_runs_match_one_device(ran, case):
    plan, res = ran[case]
    ref = res["reference"]
    assert res["reference_ok"], (
        f"{case}: loss err {ref['loss_rel_err']:.2e}, worst grad {ref['worst_grad']} "
        f"{ref['max_grad_rel_err']:.2e}, problems {ref['problems']}")
    model, _ = getattr(M, next(c[1] for c in RUNS if c[0] == case))()
    assert ref["params_compared"] == len(list(model.parameters()))
    assert ref["vs_float32_max_grad_rel_err"] < 1e-3
    assert ref["loss_rel_err"] < 1e-5
    if not case.endswith("searched"):      # the pins split what they name
        assert any(lay["config_label"] != "1" for lay in plan["layers"]
                   if lay["op"] in ("sdpa", "mha", "matmul", "linear"))


def test_causal_attention_on_split_rows_is_exact():
    """The runtime's sdpa rule on each half of the query rows equals one device's result."""
    from explorer.engine.core.layergraph import Layer
    from explorer.engine.runtime import ops
    q, k, v = (torch.randn(2, 2, 6, 4) for _ in range(3))
    full = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    node = type("N", (), {"args": (None, None, None), "kwargs": {"is_causal": True}})()
    lay = Layer("a", "sdpa", (2, 2, 6, 4), ("n", "c", "l", "-"), in_shapes=((2, 2, 6, 4),) * 3,
                attrs={"causal": True})
    ctx = ops.LayerContext(lay, node, [], None, {}, {}, {})
    for lo, hi in ((0, 3), (3, 6)):
        box = np.array([[0, 2], [0, 2], [lo, hi], [0, 4]])
        got = ops._sdpa(ctx, [q[:, :, lo:hi], k, v], None, box)
        torch.testing.assert_close(got, full[:, :, lo:hi])


@pytest.mark.parametrize("name, op", [("vit_seq_first", "mha"), ("gpt2", "linear")])
def test_measured_costs_build_shards_of_the_new_ops(name, op):
    from explorer.engine.core.profile import build_shard
    _, g = _graph(name)
    lay = next(la for la in g.layers() if la.op == op)
    cfg = G.Config(tuple((d, 2 if d == lay.dims[0] else 1) for d in lay.dims), (0, 1))
    box = G.output_boxes(lay, cfg)[:1]
    ins = [G.box_shape(G.input_regions(lay, i, box)[0]) for i in range(len(lay.in_shapes))]
    fn, leaves = build_shard(lay, G.box_shape(box[0]), ins)
    assert tuple(fn()[0].shape) == G.box_shape(box[0]) and leaves

"""Grouped-query and multi-query attention (Llama 3, Mistral, Qwen 2, Gemma): key/value heads
repeated per group of query heads by ``expand`` + ``reshape`` (Hugging Face's ``repeat_kv``),
``repeat_interleave`` or ``scaled_dot_product_attention(enable_gqa=True)``; and the LM head
tied to the embedding that such decoders often have.

The importer writes each form as edge transforms (``expand`` between reshapes); geometry maps a
box on the repeated heads back to its group's key/value heads; the runtime expands the region
it receives.  Checked here against PyTorch element by element, and on 2 workers against one
device with the heads (and so the key/value heads) split.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from explorer.engine.core import geometry as G
from explorer.engine.core.importer import import_model, import_spec
from explorer.engine.layerwise.classic import default_tp, kv_heads
from explorer.engine.runtime import transforms as T
from explorer.errors import UnsupportedModel

B, S, D = 2, 4, 2                     # batch, sequence, head dim of the tiny attention


class Attn(nn.Module):
    """q from one projection, k/v from ``kv`` heads repeated by ``form`` to ``heads``."""

    def __init__(self, heads: int, kv: int, form: str) -> None:
        super().__init__()
        self.heads, self.kv, self.form = heads, kv, form
        self.q = nn.Linear(8, heads * D, bias=False)
        self.k = nn.Linear(8, kv * D, bias=False)
        self.v = nn.Linear(8, kv * D, bias=False)

    def split(self, t, n):
        return t.view(B, S, n, D).transpose(1, 2)

    def repeat(self, t):
        rep = self.heads // self.kv
        if self.form == "expand":           # transformers' repeat_kv
            return t[:, :, None].expand(B, self.kv, rep, S, D).reshape(B, self.heads, S, D)
        if self.form == "interleave":
            return t.repeat_interleave(rep, dim=1)
        if self.form == "repeat":           # tiling: query head h reads kv head h % kv
            return t.repeat(1, rep, 1, 1)
        return t                            # "sdpa": enable_gqa inside the op

    def forward(self, x):
        q = self.split(self.q(x), self.heads)
        k, v = self.repeat(self.split(self.k(x), self.kv)), self.repeat(self.split(self.v(x), self.kv))
        gqa = {"enable_gqa": True} if self.form == "sdpa" else {}
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, **gqa)


FORMS = ["expand", "interleave", "repeat", "sdpa"]


def _attn(form, heads=4, kv=2):
    torch.manual_seed(0)
    model = Attn(heads, kv, form)
    x = torch.randn(B, S, 8)
    g = import_model(model, x, f"gqa-{form}")
    att = next(la for la in g.layers() if la.op == "sdpa")
    key = next(e for e in g.in_edges(att.name) if e.index == 1)
    return model, g, att, key


def _group(form, h, heads, kv):
    """The key/value head query head ``h`` reads."""
    return h % kv if form == "repeat" else h // (heads // kv)


# --------------------------------------------------------------------------------------------
# import and geometry
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("form", FORMS)
def test_every_form_imports_as_attention_over_repeated_keys(form):
    _, g, att, key = _attn(form)
    assert {la.op for la in g.layers()} == {"input", "linear", "sdpa"}
    assert att.in_shapes[1] == (B, 4, S, D)           # the attention sees every query head
    assert any(t[0] == "expand" for t in key.transforms)
    assert g.layer(key.src).out_shape == (B, S, 2 * D)  # the key projection: kv heads only
    assert kv_heads(g, att) == 2


@pytest.mark.parametrize("form,heads,kv", [(f, h, k) for f in FORMS
                                           for h, k in ((4, 2), (4, 1), (6, 3), (6, 2))])
def test_a_box_of_query_heads_needs_exactly_its_groups_key_heads(form, heads, kv):
    """Every head range of every sample: the key projection's region is the bounding box of
    the key/value heads those query heads read (a superset only where a range straddles
    non-adjacent groups), and it is always the projection's whole feature rows of them."""
    _, g, att, key = _attn(form, heads, kv)
    for n0, n1, h0, h1 in itertools.product(range(B), range(1, B + 1), range(heads),
                                            range(1, heads + 1)):
        if n1 <= n0 or h1 <= h0:
            continue
        box = np.array([[n0, n1], [h0, h1], [0, S], [0, D]])
        reg = G.edge_regions(g, key, box[None])[0]
        groups = {_group(form, h, heads, kv) for h in range(h0, h1)}
        want = [[n0, n1], [0, S], [min(groups) * D, (max(groups) + 1) * D]]
        if form == "repeat" and len(groups) != max(groups) - min(groups) + 1:
            assert reg[2, 0] <= want[2][0] and reg[2, 1] >= want[2][1]
        else:
            assert reg.tolist() == want, (h0, h1)


def test_expand_geometry_broadcast_and_new_leading_axes():
    # [3, 1, 5] -> [2, 3, 4, 5]: the new axis is dropped, the broadcast one reads its one element
    t = ("expand", (3, 1, 5), (2, 3, 4, 5))
    boxes = np.array([[[0, 1], [1, 3], [2, 4], [0, 5]],
                      [[0, 2], [0, 3], [0, 0], [1, 2]],      # empty on the broadcast axis
                      [[1, 1], [0, 3], [0, 4], [0, 5]]])     # empty on the new axis
    got = G.apply_transforms(boxes, (t,))
    assert got[0].tolist() == [[1, 3], [0, 1], [0, 5]]
    assert G.volume(got[1:]).tolist() == [0, 0]


@pytest.mark.parametrize("form", FORMS)
def test_runtime_expands_each_devices_region_into_its_heads(form):
    """The edge's forward steps turn each device's region of the key projection into exactly
    that device's slice of the repeated keys, and the gradient flows back summed over the
    group (as autograd sums a whole-tensor repeat's)."""
    model, g, att, key = _attn(form, 6, 2)
    src = torch.randn(g.layer(key.src).out_shape, dtype=torch.float64, requires_grad=True)
    full = model.repeat(model.split(src, 2))
    if form == "sdpa":
        full = src.view(B, S, 2, D).transpose(1, 2).repeat_interleave(3, dim=1)
    cot = torch.randn(full.shape, dtype=torch.float64)
    want = torch.autograd.grad(full, src, cot)[0]
    got = torch.zeros_like(src)
    for heads in ((0, 3), (3, 6), (2, 5), (0, 6)):
        box = np.array([[0, B], list(heads), [0, S], [0, D]])
        chain, steps = T.plan_edge(att, 1, box, key.transforms, "test")
        reg = chain[-1]
        assert np.array_equal(reg, G.edge_regions(g, key, box[None])[0])
        piece = src.detach()[tuple(slice(a, b) for a, b in reg)].clone().requires_grad_(True)
        out = T.forward(piece, steps)
        sl = tuple(slice(a, b) for a, b in box)
        torch.testing.assert_close(out, full.detach()[sl])
        if heads in ((0, 3), (3, 6)):               # the two halves add up to the whole
            gr = torch.autograd.grad(out, piece, cot[sl])[0]
            got[tuple(slice(a, b) for a, b in reg)] += gr
    torch.testing.assert_close(got, want)


def test_repeat_interleave_with_a_tensor_of_repeats_is_refused_in_one_line():
    """Its result's shape depends on the repeats' values: refused at capture, naming it."""
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.k = nn.Linear(8, 4)
            self.register_buffer("reps", torch.tensor([1, 2, 1, 2]))

        def forward(self, x):
            return self.k(x).repeat_interleave(self.reps, dim=-1) * 2

    with pytest.raises(UnsupportedModel, match="op 'repeat_interleave' at .*test_gqa.py") as e:
        import_model(M(), torch.randn(2, 8), "m")
    assert "\n" not in str(e.value)


LLAMA = dict(layers=1, hidden=32, heads=4, intermediate=48, seq_len=8, vocab=50)


@pytest.mark.parametrize("repeat_kv", ["expand", "interleave", "sdpa"])
def test_llama_example_forms_import_with_their_key_value_heads(repeat_kv):
    g = import_spec("llama", 2, dict(LLAMA, kv_heads=2, repeat_kv=repeat_kv))
    att = next(la for la in g.layers() if la.op == "sdpa")
    assert kv_heads(g, att) == 2 and att.size("c") == 4
    # Megatron-LM's tensor-parallel degree divides the key/value groups too
    assert default_tp(g, 4) == 2 and default_tp(g, 2) == 2
    mqa = import_spec("llama", 2, dict(LLAMA, kv_heads=1, repeat_kv=repeat_kv))
    assert default_tp(mqa, 4) == 1
    mha = import_spec("llama", 2, dict(LLAMA))
    assert default_tp(mha, 4) == 4


# --------------------------------------------------------------------------------------------
# runtime: 2 workers against one device
# --------------------------------------------------------------------------------------------


def _plan(algo, args, pins=None, options=None):
    from explorer import service as session
    req = session.Request(model="llama", preset="local", devices=2, batch=4,
                          model_args=dict(LLAMA, **args))
    return session.run_method(req, algo, pins, options).to_dict()


# (case, model args, method, pins, options): heads split with their key/value heads (Megatron
# tp=2), multi-query attention with the one key/value head needed by both halves, the searched
# plan, and the query heads split by pins alone
RUNS = [
    ("expand-tp2", {"kv_heads": 2}, "megatron", None, {"tp": 2}),
    ("interleave-tp2", {"kv_heads": 2, "repeat_kv": "interleave"}, "megatron", None, {"tp": 2}),
    ("sdpa-tp2", {"kv_heads": 2, "repeat_kv": "sdpa"}, "megatron", None, {"tp": 2}),
    ("mqa-tp2", {"kv_heads": 1}, "megatron", None, {"tp": 2}),
    ("expand-searched", {"kv_heads": 2}, "optcnn", None, None),
    ("interleave-heads-pinned", {"kv_heads": 2, "repeat_kv": "interleave"}, "optcnn",
     ["scaled_dot_product_attention=c=2"], None),
    # weight tying: the LM head shares the embedding's table, the two split differently (the
    # table's columns by the embedding, its rows by the head), and its gradient is their sum
    ("tied-split", {"kv_heads": 2, "tie_embeddings": True}, "optcnn",
     ["embed_tokens=c=2", "lm_head=c=2"], None),
    ("tied-tp2", {"kv_heads": 2, "tie_embeddings": True}, "megatron", None, {"tp": 2}),
]


@pytest.fixture(scope="module")
def ran():
    from explorer.engine.runtime import launch_many
    plans = [_plan(algo, args, pins, opts) for _, args, algo, pins, opts in RUNS]
    results = launch_many(plans, steps=1, warmup=0, timeout_s=600, store=False)
    return {c[0]: (p, r) for c, p, r in zip(RUNS, plans, results)}


@pytest.mark.multiprocess
@pytest.mark.parametrize("case", [c[0] for c in RUNS])
def test_gqa_runs_match_one_device(ran, case):
    plan, res = ran[case]
    ref = res["reference"]
    assert res["reference_ok"], (case, ref["worst_grad"], ref["max_grad_rel_err"],
                                 ref["problems"])
    assert ref["loss_rel_err"] < 1e-5
    # embedding, 9 weights (the LM head's unless tied), 3 RMSNorm scales
    assert ref["params_compared"] == (11 if case.startswith("tied") else 12)
    cfg = {la["name"]: la["config_label"] for la in plan["layers"]}
    if "tp2" in case or "pinned" in case:
        assert cfg["scaled_dot_product_attention"] == "c2"
    if "tp2" in case:
        # the key/value projections split with the query heads: each worker owns its group's
        assert cfg["layers_0_self_attn_k_proj"] == cfg["layers_0_self_attn_v_proj"] == "c2"
    if case == "tied-split":
        assert cfg["embed_tokens"] == cfg["lm_head"] == "c2"

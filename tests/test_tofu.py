"""Tofu: operator graph, aten descriptions, coarsening, recursive DP, baselines, CLI."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from torch import nn

from _helpers import explorer_cli
from explorer.engine.core.opgraph import TorchValue, build_from_module, build_opgraph
from explorer.engine.search import names
from explorer.engine.tofu import partition as P
from explorer.engine.tofu import search as tofu
from explorer.engine.tofu.tdl.aten import UnsupportedOp, describe_op


@pytest.fixture(scope="module")
def mlp():
    return build_opgraph("mlp", 8, {"layers": 2, "hidden": 16})


def test_opgraph_links_backward_ops_to_their_forward_op(mlp):
    phases = mlp.phase_counts()
    assert phases["forward"] > 0 and phases["backward"] > 0 and phases["update"] > 0
    for op in mlp.ops.values():
        if op.phase == "backward":
            assert op.fwd in mlp.ops and mlp.ops[op.fwd].phase == "forward"
    # every parameter has a gradient and an update
    assert set(mlp.param_grads) == set(mlp.params.values())
    addmm = [o for o in mlp.ops.values() if o.target == "addmm"][0]
    assert addmm.module.startswith("body.0") and addmm.flops == 2 * 8 * 16 * 16


@pytest.mark.slow
def test_opgraph_of_a_huge_model_costs_no_memory():
    # WResNet-50-10 has 1.1 G parameters = 4.4 GB in float32: traced over fake tensors
    g = build_opgraph("wresnet", 8, {"depth": 50, "width": 10})
    assert g.counts()["param_bytes"] > 4e9
    assert g.phase_counts()["backward"] > 100


@pytest.mark.slow
def test_every_op_of_the_example_models_has_a_description():
    for spec, batch, args in [("lenet5", 4, {}), ("resnet50", 2, {"image_size": 64}),
                              ("lstm", 4, {"layers": 2, "hidden": 32, "steps": 3}),
                              ("transformer", 2, {"layers": 1})]:
        g = build_opgraph(spec, batch, args)
        for op in g.ops.values():
            describe_op(op, g)         # raises UnsupportedOp naming the op otherwise


def test_an_op_without_description_is_reported_by_name():
    class Odd(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, x):
            return torch.logcumsumexp(self.fc(x), dim=1)
    g = build_from_module(Odd(), torch.randn(2, 4), "odd")
    with pytest.raises(UnsupportedOp, match="logcumsumexp"):
        tofu.partition(g, 2)


def test_coarsening_of_an_mlp_follows_figure5(mlp):
    co = tofu.coarsen(mlp)
    # forward op + its backward ops form a group: far fewer groups than ops
    assert co.counts["ops_after"] < co.counts["ops_before"] / 3
    assert co.counts["linear"]
    # the weight, its gradient and its SGD update share one partition class (element-wise)
    for pt, gt in mlp.param_grads.items():
        assert co.cls[pt] == co.cls[gt]
    # the matmul of layer 2 and its two backward matmuls (dx, dW) are in one op group
    fwd = [o for o in mlp.ops.values() if o.target == "addmm" and o.module == "body.2"][0]
    bwd = [o.name for o in mlp.ops.values() if o.fwd == fwd.name and o.target == "mm"]
    assert len(bwd) == 2 and {co.op_group[b] for b in bwd} == {co.op_group[fwd.name]}


def test_unrolled_time_steps_are_merged_into_one_template():
    g = build_opgraph("lstm", 4, {"layers": 2, "hidden": 16, "steps": 4})
    co = tofu.coarsen(g)
    plain = tofu.coarsen(g, coalesce=False)
    assert co.counts["classes"] < plain.counts["classes"] / 3
    # all time steps' hidden-state matmuls of a layer share one template
    addmm = [o.name for o in g.ops.values() if o.target == "addmm" and o.module == "cells.0"
             and o.phase == "forward"]
    assert len(addmm) > 4 and len({co.ops[a].template for a in addmm}) <= 2


def _brute_force(factors, dom):
    """min over every assignment of Σ factors, by broadcasting over all variables."""
    vars_ = sorted(dom, key=str)
    pos = {v: i for i, v in enumerate(vars_)}
    total = np.zeros([len(dom[v]) for v in vars_])
    for f in factors:
        t = f.table
        perm = sorted(range(len(f.vars)), key=lambda i: pos[f.vars[i]])
        t = np.transpose(t, perm) if t.ndim > 1 else t
        idx = [None] * len(vars_)
        for i in sorted(pos[v] for v in f.vars):
            idx[i] = slice(None)
        total = total + t[tuple(idx)]
    return float(total.min())


def test_variable_elimination_equals_brute_force_on_random_factor_graphs():
    rng = np.random.default_rng(0)
    for trial in range(30):
        n = int(rng.integers(2, 9))
        dom = {f"c{i}": list(range(int(rng.integers(1, 4)))) for i in range(n)}
        factors = []
        for _ in range(int(rng.integers(1, 12))):
            vs = list(rng.choice(n, size=int(rng.integers(1, min(4, n) + 1)), replace=False))
            vs = [f"c{i}" for i in vs]
            factors.append(P.Factor(vs, rng.random([len(dom[v]) for v in vs]) * 10))
        opt, assign = P.eliminate(factors, dom, 1 << 20)
        assert opt == pytest.approx(_brute_force(factors, dom))
        # the assignment achieves the optimum
        val = sum(float(f.table[tuple(assign[v] for v in f.vars)]) for f in factors)
        assert val == pytest.approx(opt)


def test_each_recursive_step_is_optimal_against_brute_force_on_a_small_chain():
    g = build_opgraph("mlp", 4, {"layers": 1, "hidden": 4})
    seen = []
    orig = P.eliminate

    def check(factors, dom, mx):
        opt, assign = orig(factors, dom, mx)
        assert np.prod([len(d) for d in dom.values()]) < 5e6
        seen.append((opt, _brute_force(factors, dom)))
        return opt, assign
    P.eliminate = check
    try:
        res = tofu.partition(g, 4)
    finally:
        P.eliminate = orig
    assert len(seen) == 2 == len(res.steps)
    for opt, brute in seen:
        assert opt == pytest.approx(brute)
    assert res.comm_bytes == pytest.approx(res.steps[-1].total_bytes)


def test_hand_checked_plan_for_one_matmul():
    """y = x·Wᵀ on 2 workers with x [8, 2], W [64, 2]: the cheapest plan splits the batch
    and fetches half of the (small) weight: no transfer would need x partitioned by batch and
    W replicated; tofu must find a plan no worse than the data-parallel one."""
    class One(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(2, 64, bias=False)

        def forward(self, x):
            return self.fc(x)
    g = build_from_module(One(), torch.randn(8, 2), "one")
    res = tofu.partition(g, 2)
    allrow = tofu.partition(g, 2, options={"algo": "allrow-greedy"})
    assert 0 < res.comm_bytes <= allrow.comm_bytes
    assert res.factors == [2]


@pytest.mark.slow
@pytest.mark.parametrize("spec,batch,args,k", [
    ("mlp", 16, {"layers": 2, "hidden": 32}, 4),
    ("lenet5", 8, {}, 4),
    ("lstm", 8, {"layers": 2, "hidden": 32, "steps": 3}, 4),
    ("wresnet", 4, {"depth": 50, "width": 1, "image_size": 32}, 8),
])
def test_tofu_never_communicates_more_than_a_baseline(spec, batch, args, k):
    g = build_opgraph(spec, batch, args)
    res = {a: tofu.partition(g, k, options={"algo": a}) for a in names("tofu")}
    for a, r in res.items():
        assert r.comm_bytes >= 0 and len(r.peak_memory_bytes) == k
        assert res["tofu"].comm_bytes <= r.comm_bytes * (1 + 1e-9), a
    # every live tensor is tiled over the workers (grids multiply to k unless too small)
    t = res["tofu"].tilings
    w = [v for v in t.values() if v["kind"] == "param" and min(v["shape"]) >= k]
    assert w and all(np.prod(v["grid"]) == k for v in w)


def test_partitioning_cuts_memory_per_worker():
    g = build_opgraph("mlp", 64, {"layers": 2, "hidden": 256})
    one = tofu.partition(g, 1)
    four = tofu.partition(g, 4)
    assert one.comm_bytes == 0 and one.factors == []
    assert max(four.peak_memory_bytes) < one.peak_memory_bytes[0] / 2


def test_factorize_and_options_validation():
    assert tofu.factorize(8) == [2, 2, 2]
    assert tofu.factorize(12) == [3, 2, 2]
    assert tofu.factorize(1) == []
    with pytest.raises(ValueError, match="unknown Tofu algorithm"):
        tofu.TofuOptions(algo="nope")
    with pytest.raises(ValueError, match="workers"):
        tofu.factorize(0)


@pytest.mark.multiprocess
def test_cli_tofu_json_contract():
    out = explorer_cli("search", "mlp", "-n", "4",
                       "--batch", "16", "-a", "hidden=32", "--algo", "tofu",
                       "--preset", "k80-pcie-8", "--json")
    assert out.returncode == 0, out.stderr
    d = json.loads(out.stdout)
    for key in ("objective_s", "comm_bytes", "peak_memory_bytes", "search_time_s", "coarsening",
                "tensors", "steps"):
        assert key in d
    assert len(d["peak_memory_bytes"]) == 4 and d["algo"] == "tofu"
    assert d["coarsening"]["ops_before"] > d["coarsening"]["ops_after"]
    assert all("grid" in t and "shape" in t for t in d["tensors"])


@pytest.mark.multiprocess
def test_cli_tofu_rejects_pins_with_a_clear_message():
    out = explorer_cli("search", "mlp", "-n", "2",
                       "--algo", "tofu", "--pin", "fc=n=2")
    assert out.returncode != 0 and "pin" in out.stderr


@pytest.mark.slow
@pytest.mark.parametrize("spec,args", [
    ("mlp", {"layers": 3, "hidden": 16}), ("lenet5", {}),
    ("wresnet", {"depth": 50, "width": 1, "image_size": 32}),
    ("lstm", {"layers": 3, "hidden": 16, "steps": 4}), ("transformer", {"layers": 2})])
def test_coarsened_graphs_are_chains_the_dp_can_walk(spec, args):
    g = build_opgraph(spec, 2, args)
    co = tofu.coarsen(g)
    assert co.counts["linear"], co.counts
    if spec == "lstm":
        # every cell with all its time steps (forward and backward) is one group
        cells = {co.op_group[o] for o, op in g.ops.items() if op.module.startswith("cells.")
                 and op.name in co.ops}
        assert len(cells) == 3


@pytest.mark.slow
def test_a_reused_activation_module_is_not_taken_for_time_steps():
    # ResNet blocks call one nn.ReLU three times; only modules with weights are RNN cells
    g = build_opgraph("resnet50", 2, {"image_size": 32})
    co = tofu.coarsen(g)
    relus = [o for o, op in g.ops.items() if op.target == "relu" and op.phase == "forward"]
    assert len({co.op_group[o] for o in relus}) == len(relus)


# --------------------------------------------------------------------------------------------
# Today's models: every op's description, run the way the runtime runs a plan
# --------------------------------------------------------------------------------------------

_TODAY = ["gpt2", "bert", "llama", "vit", "mobilenet_v2", "unet", "zoo"]
_HF = {"gpt2", "bert", "llama"}


def _step_values(g, model, x) -> dict:
    """Every tensor of the traced step on real (float64) values, by tensor id."""
    params = [p.detach() for _, p in model.named_parameters() if p.requires_grad]
    env: dict = {}

    class Record(torch.fx.Interpreter):
        def run_node(self, n):
            r = super().run_node(n)     # copies: in-place ops (ReLU6(inplace)) mutate later
            env[n.name] = r.clone() if torch.is_tensor(r) else r
            return r
    Record(g.gm).run(params, [b.detach() for _, b in model.named_buffers()], x)
    ph = [n.name for n in g.gm.graph.nodes if n.op == "placeholder"]
    ids = list(g.params.values()) + [f"buffer:{b}" for b in g.buffer_names] + g.inputs
    return {**{t: env[n] for t, n in zip(ids, ph)}, **{t: env[t] for t in g.tensors if t in env}}


def _runs_as_described(op, g, vals, d) -> list:
    """Run every strategy the Tofu search may pick for ``op`` on 2 workers as the runtime
    does (the aten call on full-size buffers holding only the description's input regions,
    zeros elsewhere; partial outputs summed / maxed) and compare with the op's real output.
    Returns the strategies that disagree."""
    from explorer.engine.runtime.opexec import _constant
    from explorer.engine.tofu.tdl import strategies
    node = next(n for n in g.gm.graph.nodes if n.name == op.node)
    full = vals[op.output].double()
    sl = lambda box: tuple(slice(int(a), int(b)) for a, b in box)   # noqa: E731
    flat = lambda t: t.reshape(1) if t.dim() == 0 else t             # noqa: E731
    bad = []
    for s in strategies(d.op, d.shapes, k=2, symbolic=False, runnable=True):
        inside = {acc.tensor for acc, scope in d.bound.accesses
                  if any(v.name == s.dim for r in scope for v in getattr(r, "vars", ()))}
        parts = []
        for w in range(2):
            bufs = {t: torch.zeros_like(vals[t]) for t in op.inputs}
            for name, t in d.bindings:
                v = vals[t]
                b = torch.full_like(v, float("-inf")) if s.reducer == "max" else bufs[t]
                if not (s.reducer == "sum" and name not in inside and w > 0):
                    flat(b)[sl(s.regions[name][w])] = flat(v)[sl(s.regions[name][w])]
                bufs[t] = b

            def sub(a, fa):
                if isinstance(a, str) and a in g.tensors:
                    return bufs[a]
                if a is None and isinstance(fa, torch.fx.Node):
                    return _constant(g.gm, fa)
                if isinstance(a, (list, tuple)):
                    return type(a)(sub(b, fb) for b, fb in zip(a, fa))
                if isinstance(a, TorchValue):          # a dtype, memory format... by name
                    return a.value()
                return a
            res = node.target(*sub(op.args, node.args),
                              **{k: sub(v, node.kwargs[k]) for k, v in op.kwargs.items()})
            res = (res[op.index] if isinstance(res, (tuple, list)) else res).double()
            if s.reducer is None:
                box = sl(s.out_boxes[w])
                if not torch.allclose(res[box], full[box], rtol=1e-7, atol=1e-10):
                    bad.append((s.name, w))
            parts.append(res)
        if s.reducer is not None:
            got = parts[0] + parts[1] if s.reducer == "sum" else torch.maximum(*parts)
            if not torch.allclose(got, full, rtol=1e-7, atol=1e-10):
                bad.append((s.name, "combined"))
    return bad


@pytest.mark.slow
@pytest.mark.parametrize("name", _TODAY)
def test_every_op_of_today_s_models_computes_what_its_description_says(name):
    """GPT-2, BERT and Llama (Hugging Face configs), a ViT with a class token and
    nn.MultiheadAttention, a MobileNetV2 block, a U-Net with a transposed convolution and a
    zoo of indexing ops: every aten op of the training step has a description, and each
    split or output reduction the search may choose, run on input regions alone, gives the
    op's exact output (float64) - a wrong region or reduction shows as a wrong number."""
    import _tofu_models
    if name in _HF:
        pytest.importorskip("transformers")
    torch.manual_seed(0)
    model, x = getattr(_tofu_models, name)()
    model = model.double().train()
    x = x.double() if x.is_floating_point() else x
    g = build_from_module(model, x, name)
    vals = _step_values(g, model, x)
    seen, wrong, checked = set(), [], 0
    for op in g.ops.values():
        d = describe_op(op, g)            # raises UnsupportedOp naming the op otherwise
        if d is None or op.target.rstrip("_") in ("bernoulli", "native_dropout"):
            continue
        key = (op.target, op.index, tuple(g.tensors[t].shape for t in op.inputs),
               repr([a if not (isinstance(a, str) and a in g.tensors) else 0 for a in op.args]))
        if key not in seen:
            seen.add(key)
            checked += 1
            bad = _runs_as_described(op, g, vals, d)
            if bad:
                wrong.append((op.name, op.target, op.index, bad[:2]))
    assert checked > 40 and not wrong, wrong


def test_an_op_without_description_names_the_line_of_model_code(tmp_path, capsys):
    from explorer.cli import main
    model = tmp_path / "odd.py"
    model.write_text("import torch\nfrom torch import nn\n\n\n"
                     "def odd():\n"
                     "    class Odd(nn.Module):\n"
                     "        def __init__(self):\n"
                     "            super().__init__()\n"
                     "            self.fc = nn.Linear(4, 4)\n\n"
                     "        def forward(self, x):\n"
                     "            return torch.logcumsumexp(self.fc(x), 1)\n"
                     "    return Odd(), torch.randn(2, 4)\n")
    assert main(["search", f"{model}:odd", "--algo", "tofu", "--devices", "2"]) == 2
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    msg = (out + err).strip().splitlines()
    assert len(msg) == 1, msg
    assert "aten.logcumsumexp" in msg[0] and "odd.py:12: return torch.logcumsumexp" in msg[0]

"""Tests for explorer.engine.core.importer: PyTorch model -> LayerGraph.

Example models are imported at batch 2 on the meta device (cheap); small hand-written
models check shapes, FLOPs, folding and the error messages users see.
"""

from __future__ import annotations

import textwrap

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import example_models
from explorer.engine.core import geometry as G
from explorer.engine.core.importer import import_model, import_spec, load_model
from explorer.errors import ExplorerError, UnknownModel, UnsupportedModel

# --------------------------------------------------------------------------------------------
# example models
# --------------------------------------------------------------------------------------------

SMALL = {
    "wresnet": {"depth": 50, "width": 1},
    "transformer": {"seq": 16, "hidden": 64, "heads": 4, "vocab": 50},
    "lstm": {"layers": 2, "steps": 3, "hidden": 32},
    "mlp": {"hidden": 64},
}

# op -> count, for the ops that define each architecture
EXPECTED_OPS = {
    "lenet5": {"input": 1, "conv": 2, "pool": 2, "linear": 3},
    "alexnet": {"input": 1, "conv": 5, "pool": 3, "adaptive_pool": 1, "linear": 3},
    "vgg16": {"input": 1, "conv": 13, "pool": 5, "adaptive_pool": 1, "linear": 3},
    "inception_v3": {"conv": 94, "concat": 15, "linear": 1},
    "resnet50": {"conv": 53, "eltwise": 16, "linear": 1},
    "wresnet": {"conv": 53, "eltwise": 16, "linear": 1},
    "mlp": {"input": 1, "linear": 5},                        # 4 hidden layers + head
    "lstm": {"input": 1, "lstm_cell": 6, "linear": 1},       # 2 layers x 3 steps
    "transformer": {"embedding": 1, "sdpa": 2, "norm": 5, "linear": 13, "reduce": 1},
}


@pytest.mark.parametrize("name", list(EXPECTED_OPS))
def test_every_example_imports_with_expected_ops(name):
    g = import_spec(name, batch=2, model_args=SMALL.get(name))
    ops = g.summary()["ops"]
    for op, n in EXPECTED_OPS[name].items():
        assert ops.get(op, 0) == n, f"{name}: {op} count {ops.get(op, 0)} != {n} ({ops})"
    assert g.source == "fx"
    assert g.batch == 2 and g.spec == name
    layers = g.layers()
    assert layers[0].op == "input" and layers[0].out_shape[0] == 2
    # every layer keeps the batch as its sample dimension, and (except the input) has inputs
    for lay in layers:
        assert lay.out_shape[0] == 2, lay.name
        assert lay.axes[0] == "n", lay.name
        if lay.op != "input":
            assert g.in_edges(lay.name), f"{lay.name} has no inputs"
            assert len(lay.in_shapes) == len(g.in_edges(lay.name))
    assert layers[-1].out_shape == (2, example_models.model_params(name)["num_classes"])
    assert g.summary()["parameters"] > 0 and g.summary()["flops_forward"] > 0
    # every layer has a geometry rule: its full output maps to in-bounds input regions
    for lay in layers:
        if lay.op == "input":
            continue
        full = G.full_box(lay.out_shape)[None]
        for i, shp in enumerate(lay.in_shapes):
            reg = G.input_regions(lay, i, full)[0]
            assert reg.shape == (len(shp), 2), lay.name
            assert (reg[:, 0] >= 0).all() and (reg[:, 1] <= np.array(shp)).all(), lay.name


def test_vgg16_folds_relu_and_dropout():
    g = import_spec("vgg16", batch=2)
    ops = g.summary()["ops"]
    assert set(ops) == {"input", "conv", "pool", "adaptive_pool", "linear"}
    convs = [l for l in g.layers() if l.op == "conv"]
    assert all(len(c.folded) == 1 for c in convs)        # its ReLU
    fcs = [l for l in g.layers() if l.op == "linear"]
    assert [len(f.folded) for f in fcs] == [2, 2, 0]     # ReLU + dropout, twice; logits bare
    # first conv: 3 -> 64 channels 3x3 on 224x224 (padding 1 keeps the size)
    c0 = convs[0]
    assert c0.out_shape == (2, 64, 224, 224)
    assert c0.params == {"weight": (64, 3, 3, 3), "bias": (64,)}
    assert c0.attrs["kernel"] == (3, 3) and c0.attrs["padding"] == (1, 1)


def test_resnet50_adds_are_residual_eltwise_and_bn_folds():
    g = import_spec("resnet50", batch=2)
    adds = [l for l in g.layers() if l.op == "eltwise"]
    assert len(adds) == 16 and all(a.attrs["fn"] == "add" for a in adds)
    assert all(len(g.in_edges(a.name)) == 2 for a in adds)
    conv1 = g.layer("conv1")
    # BatchNorm folds into the conv: its affine parameters belong to the conv layer
    assert conv1.params == {"weight": (64, 3, 7, 7), "bn1.weight": (64,), "bn1.bias": (64,)}
    assert "bn1" in conv1.folded
    assert conv1.out_shape == (2, 64, 112, 112)


def test_inception_concat_offsets_add_up():
    g = import_spec("inception_v3", batch=2)
    cats = [l for l in g.layers() if l.op == "concat"]
    assert len(cats) == 15
    for cat in cats:
        d = cat.attrs["dim"]
        widths = [s[d] for s in cat.in_shapes]
        assert sum(widths) == cat.out_shape[d]
        assert list(cat.attrs["offsets"]) == [sum(widths[:i]) for i in range(len(widths))]


def test_lstm_unrolled_cells_and_state_edges():
    g = import_spec("lstm", batch=2, model_args={"layers": 2, "steps": 3, "hidden": 32})
    cells = [l for l in g.layers() if l.op == "lstm_cell"]
    assert len(cells) == 6
    # first step of each layer has no state input; later steps get (x, h, c)
    assert [len(c.in_shapes) for c in cells] == [1, 1, 3, 3, 3, 3]
    assert all(c.out_shape == (2, 32) for c in cells)
    assert cells[0].params["weight_ih"] == (128, 32)    # 4 gates x hidden rows


def test_model_args_change_the_graph():
    small = import_spec("mlp", batch=2, model_args={"layers": 2, "hidden": 16})
    assert small.summary()["ops"]["linear"] == 3
    assert small.model_args == {"layers": 2, "hidden": 16}
    with pytest.raises(ValueError, match=r"unknown parameter\(s\) 'depth'"):
        import_spec("mlp", batch=2, model_args={"depth": 3})


class TwoHeads(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Linear(4, 8)
        self.head_a = nn.Linear(8, 3)
        self.head_b = nn.Linear(8, 2)

    def forward(self, x):
        h = self.body(x)
        return self.head_a(h), self.head_b(h)


def test_multi_output_model_keeps_every_output_head():
    # both heads are outputs of the model: neither is dead code
    g = import_model(TwoHeads(), torch.randn(2, 4))
    names = [l.name for l in g.layers()]
    assert "head_a" in names and "head_b" in names, names
    assert len(g.out_edges("body")) == 2


def test_inception_aux_head_is_dead_code_and_dropped():
    # example_models/inception.py evaluates the aux head in training mode but discards its
    # output: nothing reaches the model output through it, so import drops it (94 convs)
    g = import_spec("inception_v3", batch=2, model_args={"aux_logits": True})
    assert g.summary()["ops"]["conv"] == 94


# --------------------------------------------------------------------------------------------
# hand-checked layers
# --------------------------------------------------------------------------------------------


class ConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, kernel_size=5, stride=2)
        self.fc = nn.Linear(8 * 4 * 4, 6)

    def forward(self, x):
        return self.fc(torch.flatten(self.conv(x), 1))


def test_conv_and_linear_shapes_and_flops():
    g = import_model(ConvNet(), torch.randn(2, 3, 11, 11), "convnet")
    conv = g.layer("conv")
    # (11 - 5) // 2 + 1 = 4
    assert conv.out_shape == (2, 8, 4, 4)
    assert conv.in_shapes == ((2, 3, 11, 11),)
    assert conv.axes == ("n", "c", "h", "w")
    # FLOPs = 2 N Cout H W Cin k k = 2*2*8*4*4*3*5*5 = 38400
    assert conv.flops == 38400
    assert conv.attrs == {"kernel": (5, 5), "stride": (2, 2), "padding": (0, 0),
                          "dilation": (1, 1), "groups": 1}
    fc = g.layer("fc")
    assert fc.out_shape == (2, 6) and fc.in_shapes == ((2, 128),)
    # 2 N out in = 2*2*6*128 = 3072
    assert fc.flops == 3072
    assert fc.params == {"weight": (6, 128), "bias": (6,)}
    # the flatten folds onto the edge as a reshape the geometry can follow
    (e,) = g.in_edges("fc")
    assert e.src == "conv" and e.transforms == (("reshape", (2, 8, 4, 4), (2, 128)),)
    assert g.summary()["parameters"] == 8 * 3 * 25 + 8 + 6 * 128 + 6


def test_grouped_conv_flops():
    m = nn.Sequential(nn.Conv2d(4, 8, 3, padding=1, groups=2))
    g = import_model(m, torch.randn(1, 4, 5, 5))
    conv = next(l for l in g.layers() if l.op == "conv")
    # each output reads Cin/groups = 2 channels: 2*1*8*5*5*2*3*3 = 7200
    assert conv.flops == 7200 and conv.attrs["groups"] == 2


class ConvBN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(8)
        self.act = nn.ReLU()

    def forward(self, x):
        return self.act(self.bn(self.conv(x)))


def test_batchnorm_and_relu_fold_into_conv():
    g = import_model(ConvBN(), torch.randn(2, 3, 6, 6))
    assert [l.op for l in g.layers()] == ["input", "conv"]
    conv = g.layer("conv")
    assert conv.params == {"weight": (8, 3, 3, 3), "bn.weight": (8,), "bn.bias": (8,)}
    assert conv.folded == ["bn", "act"]
    assert conv.param_count == 216 + 16
    # conv 2*2*8*6*6*3*9 = 31104, BN 4 per element (576 elements) = 2304, ReLU 1 each = 576
    assert conv.flops == 31104 + 2304 + 576


class FunctionalBN(nn.Module):
    """F.batch_norm takes (input, running_mean, running_var, weight, bias, ...)."""

    def __init__(self, keywords=False):
        super().__init__()
        self.keywords = keywords
        self.conv = nn.Conv2d(3, 8, 3, padding=1, bias=False)
        self.gamma = nn.Parameter(torch.rand(8) + 0.5)
        self.beta = nn.Parameter(torch.randn(8))
        self.register_buffer("mean", torch.zeros(8))
        self.register_buffer("var", torch.ones(8))

    def forward(self, x):
        y = self.conv(x)
        if self.keywords:
            return F.batch_norm(y, self.mean, self.var, weight=self.gamma, bias=self.beta)
        return F.batch_norm(y, self.mean, self.var, self.gamma, self.beta, False, 0.1, 1e-5)


@pytest.mark.parametrize("keywords", [False, True], ids=["positional", "keywords"])
def test_functional_batchnorm_folds_its_weight_and_bias_not_running_stats(keywords):
    g = import_model(FunctionalBN(keywords), torch.randn(2, 3, 6, 6))
    conv = g.layer("conv")
    assert conv.params == {"weight": (8, 3, 3, 3), "gamma": (8,), "beta": (8,)}
    assert conv.param_count == 216 + 16
    assert conv.folded == ["batch_norm"]


class Pools(nn.Module):
    def __init__(self):
        super().__init__()
        self.avg = nn.AvgPool2d(2, ceil_mode=True)
        self.amax = nn.AdaptiveMaxPool2d(2)
        self.aavg = nn.AdaptiveAvgPool2d(2)

    def forward(self, x):
        a = F.max_pool2d(x, 3, 2, 1, ceil_mode=True)
        b = F.avg_pool2d(x, 3, 2, 1, False, False)
        c = self.avg(x)
        d = F.adaptive_max_pool2d(a, 2) + F.adaptive_avg_pool2d(b, 2)
        return d + self.amax(c) + self.aavg(c)


def test_pool_modes_are_recorded():
    g = import_model(Pools(), torch.randn(2, 3, 9, 9))
    pools = {l.name: l.attrs for l in g.layers() if l.op == "pool"}
    assert pools["max_pool2d"]["kind"] == "max" and pools["max_pool2d"]["ceil_mode"] is True
    assert "count_include_pad" not in pools["max_pool2d"]
    assert pools["avg_pool2d"] == {"kernel": (3, 3), "stride": (2, 2), "padding": (1, 1),
                                   "dilation": (1, 1), "kind": "avg", "ceil_mode": False,
                                   "count_include_pad": False}
    mod_avg = [a for n, a in pools.items() if n not in ("max_pool2d", "avg_pool2d")]
    assert len(mod_avg) == 1 and mod_avg[0]["ceil_mode"] is True
    assert mod_avg[0]["count_include_pad"] is True
    kinds = sorted(l.attrs["kind"] for l in g.layers() if l.op == "adaptive_pool")
    assert kinds == ["avg", "avg", "max", "max"]


class FunctionalConv(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(8, 3, 3, 3))
        self.bias = nn.Parameter(torch.randn(8))

    def forward(self, x):
        return F.conv2d(x, self.weight, self.bias, stride=2, padding=1)


def test_functional_conv_with_parameter_weight_matches_module_conv():
    x = torch.randn(2, 3, 9, 9)
    fn = next(l for l in import_model(FunctionalConv(), x).layers() if l.op == "conv")
    mod = next(l for l in import_model(nn.Sequential(nn.Conv2d(3, 8, 3, stride=2, padding=1)),
                                       x).layers() if l.op == "conv")
    for attr in ("op", "out_shape", "axes", "in_shapes", "params", "attrs", "flops"):
        assert getattr(fn, attr) == getattr(mod, attr), attr
    assert fn.out_shape == (2, 8, 5, 5)


class ComputedWeightConv(FunctionalConv):
    def forward(self, x):
        return F.conv2d(x, self.weight * 2, self.bias)


def test_functional_conv_with_computed_weight_is_rejected():
    with pytest.raises(UnsupportedModel, match=r"computed \(non-parameter\) weight"):
        import_model(ComputedWeightConv(), torch.randn(1, 3, 5, 5))


# --------------------------------------------------------------------------------------------
# capture: fx, export, and what neither can do
# --------------------------------------------------------------------------------------------


class ValueBranch(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        y = self.fc(x)
        if y.sum() > 0:          # depends on tensor values: neither fx nor export can follow
            return y * 2
        return y


class DimBranch(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)

    def forward(self, x):
        if x.dim() == 4:         # fx cannot branch on a proxy; export specialises on the shape
            return self.conv(x)
        return x


def test_value_dependent_control_flow_is_unsupported_naming_the_branch_s_line():
    """Neither fx nor export can follow a branch on a tensor's value: the one line says so as
    the operator-level families do (data-dependent control flow) and names the user's line."""
    with pytest.raises(UnsupportedModel) as ei:
        import_model(ValueBranch(), torch.randn(2, 4), "vb")
    msg = str(ei.value)
    assert msg.startswith("vb: data-dependent control flow")
    assert "test_importer.py" in msg and "if y.sum() > 0" in msg
    assert "torch.where" in msg


def test_shape_dependent_control_flow_falls_back_to_export():
    g = import_model(DimBranch(), torch.randn(2, 3, 6, 6), "db")
    assert g.source == "export"
    conv = next(l for l in g.layers() if l.op == "conv")
    assert conv.out_shape == (2, 8, 6, 6)
    assert conv.params == {"weight": (8, 3, 3, 3), "bias": (8,)}
    assert conv.attrs["padding"] == (1, 1)
    assert conv.flops == 2 * 2 * 8 * 6 * 6 * 3 * 9


class Tail(nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.fn = fn

    def forward(self, x):
        return self.fn(self.fc(x))


@pytest.mark.parametrize("fn, op", [
    (lambda y: torch.sort(y, dim=1)[0], "sort"),
    (lambda y: torch.cumprod(y, 1), "cumprod"),
    (lambda y: y.argmax(1).float(), "argmax"),
])
def test_unsupported_op_names_op_and_node(fn, op):
    with pytest.raises(UnsupportedModel) as ei:
        import_model(Tail(fn), torch.randn(2, 4))
    msg = str(ei.value)
    assert f"unsupported op '{op}'" in msg
    assert f"at node '{op}'" in msg


# --------------------------------------------------------------------------------------------
# user files and names
# --------------------------------------------------------------------------------------------

USER_FILE = textwrap.dedent("""
    import torch
    from torch import nn


    def helper():
        return 1


    def build():
        return nn.Sequential(nn.Linear(8, 4), nn.ReLU(), nn.Linear(4, 2)), torch.randn(3, 8)


    def build_wide(width=4):
        return nn.Sequential(nn.Linear(8, width)), torch.randn(3, 8)


    def not_a_model():
        return nn.Linear(2, 2)
""")


@pytest.fixture
def user_file(tmp_path):
    p = tmp_path / "m.py"
    p.write_text(USER_FILE)
    return p


def test_user_file_function_imports(user_file):
    g = import_spec(f"{user_file}:build")
    assert g.model == "m:build" and g.spec == f"{user_file}:build"
    assert g.batch == 3
    assert [l.op for l in g.layers()] == ["input", "linear", "linear"]
    assert g.layers()[0].out_shape == (3, 8)
    assert g.layers()[-1].out_shape == (3, 2)


def test_user_file_batch_override_resizes_input(user_file):
    g = import_spec(f"{user_file}:build", batch=5)
    assert g.batch == 5
    assert all(l.out_shape[0] == 5 for l in g.layers())
    # real (non-meta) loading repeats rows to the new batch
    _, x = load_model(f"{user_file}:build", batch=7, meta=False)
    assert tuple(x.shape) == (7, 8)
    torch.testing.assert_close(x[3], x[0])


def test_user_file_model_args(user_file):
    g = import_spec(f"{user_file}:build_wide", model_args={"width": 6})
    assert g.layers()[-1].out_shape == (3, 6)
    with pytest.raises(UnknownModel) as ei:
        import_spec(f"{user_file}:build_wide", model_args={"depth": 2})
    assert "depth" in str(ei.value) and "width" in str(ei.value)


def test_user_file_without_the_function_lists_functions(user_file):
    with pytest.raises(UnknownModel) as ei:
        import_spec(f"{user_file}:make_model")
    msg = str(ei.value)
    assert "'make_model'" in msg
    for fn in ("helper", "build", "build_wide", "not_a_model"):
        assert fn in msg
    assert "torch" not in msg.split("defines:")[1]   # imported names are not listed


def test_missing_user_file(tmp_path):
    missing = tmp_path / "nope.py"
    with pytest.raises(UnknownModel) as ei:
        import_spec(f"{missing}:build")
    assert "not found" in str(ei.value) and "nope.py" in str(ei.value)


def test_user_function_returning_wrong_thing(user_file):
    with pytest.raises(UnsupportedModel) as ei:
        import_spec(f"{user_file}:not_a_model")
    assert "(torch.nn.Module, example_input" in str(ei.value) and "Linear" in str(ei.value)


def test_user_file_that_fails_to_import(tmp_path):
    p = tmp_path / "broken.py"
    p.write_text("def build(:\n    pass\n")
    with pytest.raises(UnsupportedModel) as ei:
        import_spec(f"{p}:build")
    assert "broken.py" in str(ei.value) and "SyntaxError" in str(ei.value)


def test_unknown_example_name_lists_examples():
    with pytest.raises(UnknownModel) as ei:
        import_spec("vgg17")
    msg = str(ei.value)
    assert "'vgg17'" in msg
    for name in ("lenet5", "vgg16", "inception_v3", "resnet50", "transformer"):
        assert name in msg
    assert isinstance(ei.value, ExplorerError)
    assert not msg.startswith('"')   # KeyError's quoting is undone


# --------------------------------------------------------------------------------------------
# one capture (train mode), every output, every parameter
# --------------------------------------------------------------------------------------------

#: A tiny ViT: a class token concatenated to the patches, a position embedding indexed by a
#: registered buffer, dropout and a train-only ``contiguous`` (as BERT's attention has).
TINY_VIT = textwrap.dedent('''
    import torch
    from torch import nn


    class TinyViT(nn.Module):
        def __init__(self, d=8, patches=4):
            super().__init__()
            self.patches = patches
            self.proj = nn.Linear(6, d)
            self.cls = nn.Parameter(torch.randn(1, 1, d))
            self.pos = nn.Embedding(patches + 1, d)
            self.register_buffer("position_ids", torch.arange(patches + 1).unsqueeze(0))
            self.drop = nn.Dropout(0.1)
            self.norm = nn.LayerNorm(d)
            self.head = nn.Linear(d, 3)

        def forward(self, x):
            h = self.proj(x)
            h = torch.cat([self.cls.expand(x.shape[0], -1, -1), h], 1)
            h = h + self.pos(self.position_ids[:, :self.patches + 1])
            h = self.drop(h)
            if self.training:
                h = h.contiguous()
            h = self.norm(h)
            return self.head(h), h


    def build():
        return TinyViT(), torch.randn(4, 4, 6)
''')


@pytest.fixture
def vit_spec(tmp_path):
    p = tmp_path / "tinyvit.py"
    p.write_text(TINY_VIT)
    return f"{p}:build"


def test_search_and_run_capture_the_same_train_mode_graph(vit_spec):
    from explorer.engine.core.capture import load
    from explorer.engine.core.layergraph import graph_digest
    g = import_spec(vit_spec)
    assert "contiguous" in g.layer("add").folded          # the train-only node is there
    model, x = load(vit_spec, meta=False)                  # what a worker builds
    model.eval()                                           # whatever mode it was left in
    assert graph_digest(import_model(model, x, "vit")) == graph_digest(g)


def test_class_token_and_buffer_indexed_embedding_reach_the_graph(vit_spec):
    from explorer.engine.core.opgraph import build_opgraph
    g = import_spec(vit_spec)
    model, _ = load_model(vit_spec)
    total = sum(p.numel() for p in model.parameters())
    assert g.parameters == g.summary()["parameters"] == total
    cls = g.layer("expand")                                # the class token's source layer
    assert cls.op == "param" and cls.params == {"cls": (1, 1, 8)} and cls.out_shape == (4, 1, 8)
    assert g.layer("cat").in_shapes == ((4, 1, 8), (4, 4, 8))
    (ids,) = [e.src for e in g.in_edges("pos")]            # position ids: a buffer's layer
    assert g.layer(ids).op == "param" and not g.layer(ids).params
    assert g.layer("pos").params == {"weight": (5, 8)}
    assert build_opgraph(vit_spec).parameters == total


def test_shared_weights_count_once():
    args = {"layers": 1, "hidden": 8, "steps": 3, "num_classes": 10}
    g = import_spec("lstm", batch=2, model_args=args)
    model, _ = load_model("lstm", 2, args)
    assert g.parameters == sum(p.numel() for p in model.parameters())
    assert sum(la.param_count for la in g.layers()) > g.parameters     # the cell, per step


@pytest.mark.parametrize("name", sorted(example_models.MODELS))
def test_parameter_count_invariant_on_every_example(name):
    g = import_spec(name, batch=2)
    model, _ = load_model(name, 2)
    assert g.parameters + sum(g.unused_parameters.values()) == \
        sum(p.numel() for p in model.parameters())


class Scaled(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.w = nn.Parameter(torch.ones(4))

    def forward(self, x):
        return self.fc(x) + self.w * 2          # a computed parameter: no rule keeps it


def test_a_parameter_the_importer_drops_fails_naming_it():
    with pytest.raises(UnsupportedModel) as ei:
        import_model(Scaled(), torch.randn(2, 4), "scaled")
    msg = str(ei.value)
    assert "do not reach the layer graph: w;" in msg and "test_importer.py:" in msg
    assert "\n" not in msg


class Unused(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.spare = nn.Linear(4, 2)            # never used: gets no gradient in training

    def forward(self, x):
        return self.fc(x)


def test_unused_parameters_are_listed_not_counted():
    g = import_model(Unused(), torch.randn(2, 4), "unused")
    assert g.parameters == 20 and g.unused_parameters == {"spare.weight": 8, "spare.bias": 2}


class FakeModelOutput(__import__("collections").OrderedDict):
    """What a Hugging Face ``ModelOutput`` is: an ``OrderedDict`` subclass."""


class Outputs(nn.Module):
    def __init__(self, kind):
        super().__init__()
        self.kind = kind
        self.a, self.b = nn.Linear(4, 3), nn.Linear(4, 2)
        self.register_buffer("ids", torch.arange(3))       # an integer output: no loss term

    def forward(self, x):
        a, b = self.a(x), self.b(x)
        if self.kind == "tuple":
            return a, (b, self.ids)
        if self.kind == "dict":
            return {"a": a, "rest": [b, self.ids]}
        if self.kind == "fake":
            return FakeModelOutput(a=a, b=b, ids=self.ids)
        from transformers.modeling_outputs import BaseModelOutput
        return BaseModelOutput(last_hidden_state=a, hidden_states=(b,))


@pytest.mark.parametrize("kind", ["tuple", "dict", "fake", "hf"])
def test_loss_covers_every_float_output_leaf(kind):
    from explorer.engine.core.opgraph import build_from_module
    from explorer.engine.runtime.reference import traced_step
    if kind == "hf":
        pytest.importorskip("transformers")
    torch.manual_seed(0)
    model, x = Outputs(kind), torch.randn(2, 4)
    g = import_model(model, x, kind)
    assert len(g.outputs) == 2 and {g.layer(o).op for o in g.outputs} == {"linear"}
    og = build_from_module(model, x, kind)
    assert og.parameters == 25 == g.parameters
    loss, _, _ = traced_step(og, [p.detach() for p in model.parameters()],
                             [b for b in model.buffers()], x)
    want = model.a(x).pow(2).mean() + model.b(x).pow(2).mean()
    assert loss == pytest.approx(float(want.detach()), rel=1e-6)


def test_model_file_loss_function_is_used(tmp_path):
    from explorer.engine.core.capture import loss_function
    from explorer.engine.core.opgraph import build_opgraph, build_from_module
    from explorer.engine.runtime.reference import traced_step
    p = tmp_path / "withloss.py"
    p.write_text(textwrap.dedent('''
        import torch
        from torch import nn

        def build():
            return nn.Linear(4, 3), torch.randn(2, 4)

        def loss(out):
            return (out - 1.0).abs().sum()
    '''))
    spec = f"{p}:build"
    assert loss_function(spec) is not None and build_opgraph(spec).loss is not None
    torch.manual_seed(0)
    model, x = load_model(spec, meta=False)
    og = build_from_module(model, x, "withloss", loss_fn=loss_function(spec))
    got, _, _ = traced_step(og, [q.detach() for q in model.parameters()], [], x)
    assert got == pytest.approx(float((model(x) - 1.0).abs().sum().detach()), rel=1e-6)

"""Transposed, grouped and depthwise convolution in the layer-wise engine.

Geometry is checked against PyTorch's own dependencies (which input rows a transposed
convolution's output rows are computed from), and the runtime's local computation of every
device's box (``runtime.ops.compute`` from the regions and weight shards geometry gives) is
checked against the single-device PyTorch result and its gradients, on every tile split at 1-4
devices.  Two small models (a U-Net-like net with ``ConvTranspose2d`` and skip concatenation,
a MobileNetV2-style depthwise-separable block) import, search exactly and run on 2 workers.
"""

from __future__ import annotations

import itertools
import textwrap
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from explorer.engine.core import geometry as G
from explorer.engine.layerwise.costmodel import CostModel
from explorer.engine.core.devices import preset
from explorer.engine.core.importer import _Importer, capture, import_model, import_spec
from explorer.engine.runtime import ops
from explorer.engine.runtime.executor import Executor
from explorer.engine.search import Problem, run


@pytest.fixture(autouse=True)
def _one_torch_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _sl(box):
    return tuple(slice(int(a), int(b)) for a, b in box)


def _sweep(strides=(1, 2, 3), kernels=(1, 2, 3, 4), pads=(0, 1, 2), dils=(1, 2), size=5):
    """Every (stride, kernel, padding, dilation, output_padding) with a non-empty output."""
    for s, k, p, d in itertools.product(strides, kernels, pads, dils):
        for op in range(max(s, d)):
            if (size - 1) * s - 2 * p + d * (k - 1) + op + 1 > 0:
                yield s, k, p, d, op


class Branches(nn.Module):
    """Several layers applied to the same input (one capture for many configurations)."""

    def __init__(self, mods):
        super().__init__()
        self.m = nn.ModuleList(mods)

    def forward(self, x):
        return tuple(m(x) for m in self.m)


# --------------------------------------------------------------------------------------------
# geometry: output rows -> input rows, against PyTorch
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("size", [1, 5])
def test_transpose_window_is_the_hull_of_torch_dependencies(size):
    """For every output interval of every small configuration, the region is exactly the hull
    of the input rows PyTorch's conv_transpose1d reads for it (empty when none)."""
    checked = 0
    for s, k, p, d, op in _sweep(dils=(1, 2, 3), size=size):
        eye = torch.eye(size).reshape(size, 1, size)
        y = F.conv_transpose1d(eye, torch.ones(1, 1, k), None, s, p, op, 1, d)
        dep = (y[:, 0, :] != 0).numpy().T                 # [out, in]: output o reads input i
        out = dep.shape[0]
        lo, hi = np.array([(a, b) for a in range(out) for b in range(a + 1, out + 1)]).T
        got0, got1 = G.transpose_window(lo, hi, size, k, s, p, d)
        for a, b, g0, g1 in zip(lo, hi, got0, got1):
            rows = np.nonzero(dep[a:b].any(0))[0]
            want = (rows[0], rows[-1] + 1) if len(rows) else (0, 0)
            assert (g0, g1) == want, f"s{s} k{k} p{p} d{d} op{op} outputs [{a}, {b})"
            checked += 1
    assert checked > 2000 if size == 5 else checked > 200


def test_transpose_regions_agree_with_the_tdl_oracle():
    """TDL's interval analysis of the description (a convolution's data gradient) gives the
    same regions on every tile of every configuration at 1-4 devices without dilation; with
    dilation it may keep a border row no tap reaches, which geometry (exact, above) drops."""
    from explorer.engine.tofu.tdl import oracle
    mods = [nn.ConvTranspose1d(4, 6, k, stride=s, padding=p, output_padding=op, dilation=d,
                               groups=1 + i % 2)
            for i, (s, k, p, d, op) in enumerate(_sweep(strides=(1, 3), kernels=(2, 3),
                                                        pads=(1, 2)))]
    g = import_model(Branches(mods), torch.randn(2, 4, 5))
    looser = 0
    for lay in g.layers():
        if lay.op != "conv_transpose":
            continue
        boxes = np.concatenate([G.output_boxes(lay, c) for n in (3, 4)
                                for c in G.enumerate_configs(lay, n)])
        want, got = G.input_regions(lay, 0, boxes), oracle.input_regions(lay, 0, boxes)
        same = (want == got).all(axis=(-1, -2)) | (G.volume(want) == 0)
        if lay.attrs["dilation"] == (1,):
            assert same.all(), (lay.attrs, boxes[~same][0].tolist())
        assert all(G.volume(w) == 0 or G.inside(w, t) for w, t in zip(want, got))
        looser += int((~same).sum())
    assert looser > 0


def test_transpose_crop_names_a_region_that_is_not_the_window():
    out_box = np.array([[0, 1], [0, 2], [2, 6]])
    in_box = np.array([[0, 1], [0, 2], [0, 3]])
    with pytest.raises(ValueError, match="geometry and runtime disagree"):
        G.transpose_crop(out_box, in_box, (1, 2, 5), (3,), (2,), (1,), (1,))


def _ct_layer(cin=4, cout=6, groups=2, size=5):
    m = nn.Sequential(nn.ConvTranspose1d(cin, cout, 3, stride=2, groups=groups))
    return next(la for la in import_model(m, torch.randn(2, cin, size)).layers()
                if la.op == "conv_transpose")


def test_transposed_weight_shards_by_output_channels():
    # ungrouped: weight [Cin, Cout, k] sliced on dim 1; bias on the output channels
    layer = _ct_layer(groups=1)
    boxes = G.output_boxes(layer, G.Config((("n", 1), ("c", 3), ("l", 1)), (0, 1, 2)))
    sh = G.param_shards(layer, boxes)
    assert sh["weight"][0] == (4, 6, 3)
    assert sh["weight"][1][:, 1].tolist() == [[0, 2], [2, 4], [4, 6]]
    assert sh["weight"][1][:, 0].tolist() == [[0, 4]] * 3
    assert sh["bias"][1][:, 0].tolist() == [[0, 2], [2, 4], [4, 6]]
    # grouped (2 groups of 3 outputs / 2 inputs): logical [g, Cin/g, Cout/g, k]
    layer = _ct_layer(groups=2)
    boxes = G.output_boxes(layer, G.Config((("n", 1), ("c", 2), ("l", 1)), (0, 1)))
    logical, reg = G.param_shards(layer, boxes)["weight"]
    assert logical == (2, 2, 3, 3)
    assert reg[:, 0].tolist() == [[0, 1], [1, 2]] and reg[:, 2].tolist() == [[0, 3]] * 2
    # c=3 tiles [0,2) [2,4) [4,6): the middle one cuts through both groups, so every device
    # holds both groups whole - one replica group, whose gradients are summed
    boxes = G.output_boxes(layer, G.Config((("n", 1), ("c", 3), ("l", 1)), (0, 1, 2)))
    logical, reg = G.param_shards(layer, boxes)["weight"]
    assert reg[:, 0].tolist() == [[0, 2]] * 3 and reg[:, 2].tolist() == [[0, 3]] * 3
    # c=4 tiles [0,1) [1,3) [3,4) [4,6): each inside one group, disjoint columns
    boxes = G.output_boxes(layer, G.Config((("n", 1), ("c", 4), ("l", 1)), (0, 1, 2, 3)))
    logical, reg = G.param_shards(layer, boxes)["weight"]
    assert reg[:, 0].tolist() == [[0, 1], [0, 1], [1, 2], [1, 2]]
    assert reg[:, 2].tolist() == [[0, 1], [1, 3], [0, 1], [1, 3]]
    # the same shards from the stacked boxes the cost model uses (unused rows empty)
    cfgs = [G.Config((("n", 1), ("c", d), ("l", 1)), tuple(range(d))) for d in (1, 3, 4)]
    stacked, used = G.stacked_output_boxes(layer, cfgs)
    _, sreg = G.param_shards(layer, stacked)["weight"]
    assert sreg[2].tolist() == reg.tolist()
    assert sreg[1, :3, 0].tolist() == [[0, 2]] * 3 and G.volume(sreg[1, 3]) == 0


def test_grouped_and_transposed_flops_and_regions():
    x = torch.randn(2, 8, 6, 6)
    dw = nn.Sequential(nn.Conv2d(8, 8, 3, padding=1, groups=8))
    conv = next(la for la in import_model(dw, x).layers() if la.op == "conv")
    assert conv.flops == 2 * 2 * 8 * 36 * 1 * 9               # Cin/groups = 1 per output
    assert conv.params["weight"] == (8, 1, 3, 3)
    boxes = G.output_boxes(conv, G.Config((("n", 1), ("c", 4), ("h", 1), ("w", 1)),
                                          (0, 1, 2, 3)))
    assert G.input_regions(conv, 0, boxes)[:, 1].tolist() == [[0, 2], [2, 4], [4, 6], [6, 8]]
    assert G.param_shards(conv, boxes)["weight"][1][:, 0].tolist() == \
        [[0, 2], [2, 4], [4, 6], [6, 8]]
    up = nn.Sequential(nn.ConvTranspose2d(8, 4, 2, stride=2, groups=2))
    ct = next(la for la in import_model(up, x).layers() if la.op == "conv_transpose")
    assert ct.out_shape == (2, 4, 12, 12)
    # every input element meets Cout/groups * k*k = 2 * 4 weights
    assert ct.flops == 2 * (2 * 8 * 36) * 2 * 4
    assert ct.attrs == {"kernel": (2, 2), "stride": (2, 2), "padding": (0, 0),
                        "output_padding": (0, 0), "dilation": (1, 1), "groups": 2}
    boxes = G.output_boxes(ct, G.Config((("n", 1), ("c", 2), ("h", 2), ("w", 1)),
                                        (0, 1, 2, 3)))
    reg = G.input_regions(ct, 0, boxes)
    assert reg[:, 1].tolist() == [[0, 4], [0, 4], [4, 8], [4, 8]]     # the group's inputs
    assert reg[:, 2].tolist() == [[0, 3], [3, 6]] * 2                  # stride 2, kernel 2


def test_every_conv_transpose_shard_can_be_measured(tmp_path):
    """Measured costs: the profiler builds each shard from its input region (halo, channel
    groups, empty regions included) and yields the box's shape (it raises otherwise)."""
    from explorer.engine.core.profile import Profiler
    x = torch.randn(2, 4, 4, 5)
    m = Branches([nn.ConvTranspose2d(4, 6, 3, stride=2, padding=1, output_padding=1, groups=2),
                  nn.ConvTranspose2d(4, 4, 1, stride=3, bias=False)])
    layers = [la for la in import_model(m, x).layers() if la.op == "conv_transpose"]
    with Profiler(tmp_path / "p.sqlite", reps=1, warmup=0) as prof:
        for layer in layers:
            for cfg in G.enumerate_configs(layer, 3):
                boxes = G.output_boxes(layer, cfg)
                reg = G.input_regions(layer, 0, boxes)
                for k in range(cfg.total):
                    out = tuple(int(v) for v in boxes[k, :, 1] - boxes[k, :, 0])
                    ins = [tuple(int(v) for v in reg[k, :, 1] - reg[k, :, 0])]
                    assert prof.measure(layer, out, ins, "cpu") > 0
        assert prof.misses > 10


# --------------------------------------------------------------------------------------------
# import: module, functional and aten forms
# --------------------------------------------------------------------------------------------


class FunctionalCT(nn.Module):
    def __init__(self, aten=False):
        super().__init__()
        self.aten = aten
        self.weight = nn.Parameter(torch.randn(4, 3, 3, 3))
        self.bias = nn.Parameter(torch.randn(6))

    def forward(self, x):
        if self.aten:
            return torch.ops.aten.convolution(x, self.weight, self.bias, [2, 2], [1, 1], [1, 1],
                                              True, [1, 1], 2)
        return F.conv_transpose2d(x, self.weight, self.bias, 2, 1, 1, 2)


class OutputSize(nn.Module):
    def __init__(self):
        super().__init__()
        self.up = nn.ConvTranspose2d(4, 6, 3, stride=2, padding=1, groups=2)

    def forward(self, x):
        return self.up(x, output_size=[10, 10])


@pytest.mark.parametrize("make", [
    lambda: nn.Sequential(nn.ConvTranspose2d(4, 6, 3, stride=2, padding=1, output_padding=1,
                                             groups=2)),
    lambda: nn.ConvTranspose2d(4, 6, 3, stride=2, padding=1, output_padding=1, groups=2),
    lambda: FunctionalCT(), lambda: FunctionalCT(aten=True), lambda: OutputSize(),
], ids=["module", "module-export", "functional", "aten-convolution", "output-size"])
def test_conv_transpose_imports_the_same_layer_from_every_form(make):
    x = torch.randn(2, 4, 5, 5)
    g = import_model(make(), x)
    (ct,) = [la for la in g.layers() if la.op != "input"]
    assert ct.op == "conv_transpose" and ct.out_shape == (2, 6, 10, 10)
    assert ct.axes == ("n", "c", "h", "w") and ct.in_shapes == ((2, 4, 5, 5),)
    assert ct.attrs == {"kernel": (3, 3), "stride": (2, 2), "padding": (1, 1),
                        "output_padding": (1, 1), "dilation": (1, 1), "groups": 2}
    assert sorted(ct.params.values()) == [(4, 3, 3, 3), (6,)]
    assert ct.flops == 2 * (2 * 4 * 25) * 3 * 9
    assert g.summary()["parameters"] == 4 * 3 * 9 + 6


# --------------------------------------------------------------------------------------------
# runtime: every device's box from its regions and shards, against PyTorch
# --------------------------------------------------------------------------------------------


def _tiles_equal_torch(model, x, op, counts=(1, 2, 3, 4), letters=None):
    """For each ``op`` layer of ``model`` reading the model input ``x``: compute every device's
    output box with ``ops.compute`` from the input region and weight shards geometry gives,
    for every configuration on each device count in ``counts`` (only those splitting
    ``letters``, when given); compare the boxes with the single-device output, and the summed
    input-region and shard gradients of ``sum(out·gy)`` with PyTorch's.  Returns the number
    of device boxes checked."""
    model = model.eval()
    gm, source = capture(model, x)
    gm.eval()          # capture traces in train mode; compare with running statistics, as runs do
    layers = [la for la in _Importer(gm, "m", x.shape[0], source).run().layers()
              if la.op == op]
    nodes = {n.name: n for n in gm.graph.nodes}
    tensors = dict(gm.named_parameters())
    tensors.update(dict(gm.named_buffers()))
    xf = x.clone().requires_grad_(True)
    interp = torch.fx.Interpreter(gm, garbage_collect_values=False)
    interp.run(xf)
    checked = 0
    for layer in layers:
        assert layer.in_shapes == (tuple(x.shape),)
        node, folded = nodes[layer.name], [nodes[f] for f in layer.folded]
        full = interp.env[folded[-1] if folded else node]
        mapping = Executor._resolve_params(SimpleNamespace(tensors=tensors), layer, node)
        quals = [q for q in mapping.values() if tensors[q].requires_grad]
        gy = torch.randn_like(full)
        grads = torch.autograd.grad((full * gy).sum(), [xf] + [tensors[q] for q in quals],
                                    retain_graph=True)
        want_x, want = grads[0], dict(zip(quals, grads[1:]))
        full = full.detach()
        for n in counts:
            for cfg in G.enumerate_configs(layer, n):
                split = {k for k, v in cfg.degrees if v > 1}
                if cfg.total != n or (letters is not None and not split <= set(letters)):
                    continue
                boxes = G.output_boxes(layer, cfg)
                reg = G.input_regions(layer, 0, boxes)
                shards = {mapping[k]: v for k, v in G.param_shards(layer, boxes).items()}
                xg = torch.zeros_like(x)
                pg = {q: torch.zeros(logical) for q, (logical, _) in shards.items()}
                for k in range(cfg.total):
                    sh = {q: tensors[q].detach().reshape(logical)[_sl(r[k])].clone()
                          .requires_grad_(True) for q, (logical, r) in shards.items()}
                    ctx = ops.LayerContext(layer, node, folded, gm, tensors, sh,
                                           {q: r[k] for q, (_, r) in shards.items()})
                    ctx.weight_name, ctx.bias_name = mapping.get("weight"), mapping.get("bias")
                    xr = None
                    if G.volume(reg[k]) > 0:
                        xr = x[_sl(reg[k])].clone().requires_grad_(True)
                    y = ops.compute(ctx, [xr], [reg[k] if xr is not None else None], boxes[k])
                    where = f"{layer.module} {layer.attrs} {cfg.key()} box {boxes[k].tolist()}"
                    torch.testing.assert_close(y, full[_sl(boxes[k])], rtol=1e-5, atol=1e-5,
                                               msg=lambda m: f"{where}: {m}")
                    (y * gy[_sl(boxes[k])]).sum().backward()
                    if xr is not None:
                        xg[_sl(reg[k])] += xr.grad
                    for q, t in sh.items():
                        if t.grad is not None:
                            pg[q][_sl(shards[q][1][k])] += t.grad
                    checked += 1
                where = f"{layer.module} {layer.attrs} {cfg.key()}"
                torch.testing.assert_close(xg, want_x, rtol=1e-4, atol=1e-5,
                                           msg=lambda m: f"{where} input gradient: {m}")
                for q, w in want.items():
                    torch.testing.assert_close(pg[q].reshape(w.shape), w, rtol=1e-4, atol=1e-5,
                                               msg=lambda m: f"{where} {q} gradient: {m}")
    return checked


@pytest.mark.slow
@pytest.mark.parametrize("stride", [1, 2, 3])
def test_conv_transpose1d_length_tiles_equal_torch_on_every_configuration(stride):
    """Every kernel 1-4, padding 0-2, dilation 1-2 and output padding of this stride, the
    length split over 1-4 devices (the window arithmetic; channel/sample splits below)."""
    torch.manual_seed(stride)
    mods = [nn.ConvTranspose1d(4, 6, k, stride=s, padding=p, output_padding=op, dilation=d,
                               groups=1 + i % 2)
            for i, (s, k, p, d, op) in enumerate(_sweep(strides=(stride,)))]
    assert _tiles_equal_torch(Branches(mods), torch.randn(2, 4, 5), "conv_transpose",
                              letters="l") >= 8 * len(mods)


CT_CASES = [
    dict(dim=1, cin=4, cout=6, k=3, s=2, p=1, op=1, d=1, groups=2),      # cuts through groups
    dict(dim=1, cin=6, cout=6, k=4, s=3, p=2, op=2, d=1, groups=3),
    dict(dim=1, cin=4, cout=4, k=2, s=2, p=0, op=1, d=2, groups=4),      # depthwise
    dict(dim=2, cin=4, cout=6, k=3, s=2, p=1, op=1, d=1, groups=2),
    dict(dim=2, cin=4, cout=4, k=2, s=2, p=0, op=0, d=1, groups=1),      # U-Net up-sampling
    dict(dim=2, cin=2, cout=4, k=4, s=3, p=2, op=1, d=2, groups=1, bias=False),
]


@pytest.mark.parametrize("spec", CT_CASES, ids=lambda s: "-".join(
    f"{k}{v}" for k, v in s.items()))
def test_conv_transpose_tiles_equal_torch_on_every_split(spec):
    """All n/c/h/w (or n/c/l) tile splits at 1-4 devices, grouped and depthwise included."""
    torch.manual_seed(0)
    cls = nn.ConvTranspose1d if spec["dim"] == 1 else nn.ConvTranspose2d
    m = nn.Sequential(cls(spec["cin"], spec["cout"], spec["k"], stride=spec["s"],
                          padding=spec["p"], output_padding=spec["op"], dilation=spec["d"],
                          groups=spec["groups"], bias=spec.get("bias", True)))
    shape = (2, spec["cin"], 5) if spec["dim"] == 1 else (2, spec["cin"], 4, 5)
    assert _tiles_equal_torch(m, torch.randn(shape), "conv_transpose") > 30


class DepthwiseBlock(nn.Module):
    """MobileNetV2's inverted residual core: depthwise 3x3 + BatchNorm + ReLU6."""

    def __init__(self, c=6, stride=1, groups=None):
        super().__init__()
        self.conv = nn.Conv2d(c, c, 3, stride=stride, padding=1, groups=groups or c, bias=False)
        self.bn = nn.BatchNorm2d(c)
        self.act = nn.ReLU6()
        with torch.no_grad():        # running statistics that are not the identity
            self.bn.running_mean.uniform_(-1, 1)
            self.bn.running_var.uniform_(0.5, 2)
            self.bn.weight.uniform_(0.5, 2)
            self.bn.bias.uniform_(-1, 1)

    def forward(self, x):
        return self.act(self.bn(self.conv(x)))


@pytest.mark.parametrize("stride, groups", [(1, None), (2, None), (1, 2), (2, 3)],
                         ids=["depthwise", "depthwise-s2", "groups2", "groups3-s2"])
def test_grouped_and_depthwise_conv_tiles_equal_torch_on_every_split(stride, groups):
    """Depthwise (groups = channels) and grouped convolutions with folded BatchNorm + ReLU6:
    a channel split reads only its groups' input channels; all splits at 1-4 devices."""
    torch.manual_seed(1)
    m = DepthwiseBlock(6, stride, groups)
    assert _tiles_equal_torch(m, torch.randn(2, 6, 5, 4), "conv") > 30


# --------------------------------------------------------------------------------------------
# whole models: import, exact search, 2 workers against the reference
# --------------------------------------------------------------------------------------------

MODELS = textwrap.dedent('''
    import torch
    from torch import nn


    class TinyUNet(nn.Module):
        """One level: encode, pool + conv, up-sample by a grouped ConvTranspose2d(2, stride
        2) with BatchNorm, concatenate the skip, decode.  With c=6 and 3 groups (2 output
        channels each) a 2-way channel split cuts through the middle group."""

        def __init__(self, c=6):
            super().__init__()
            self.enc = nn.Sequential(nn.Conv2d(3, c, 3, padding=1), nn.ReLU())
            self.down = nn.Sequential(nn.MaxPool2d(2), nn.Conv2d(c, 2 * c, 3, padding=1),
                                      nn.BatchNorm2d(2 * c), nn.ReLU())
            self.up = nn.Sequential(nn.ConvTranspose2d(2 * c, c, 2, stride=2, groups=3),
                                    nn.BatchNorm2d(c), nn.ReLU())
            self.dec = nn.Sequential(nn.Conv2d(2 * c, c, 3, padding=1), nn.ReLU())
            self.head = nn.Conv2d(c, 2, 1)

        def forward(self, x):
            e = self.enc(x)
            u = self.up(self.down(e))
            return self.head(self.dec(torch.cat([u, e], 1)))


    class Separable(nn.Module):
        """MobileNetV2-style: expand 1x1, depthwise 3x3 (stride 2), project 1x1, each with
        BatchNorm; ReLU6 after the first two."""

        def __init__(self, c=4, t=2):
            super().__init__()
            h = c * t
            self.stem = nn.Sequential(nn.Conv2d(3, c, 3, padding=1, bias=False),
                                      nn.BatchNorm2d(c), nn.ReLU6())
            self.expand = nn.Sequential(nn.Conv2d(c, h, 1, bias=False), nn.BatchNorm2d(h),
                                        nn.ReLU6())
            self.dw = nn.Sequential(nn.Conv2d(h, h, 3, stride=2, padding=1, groups=h,
                                              bias=False), nn.BatchNorm2d(h), nn.ReLU6())
            self.project = nn.Sequential(nn.Conv2d(h, c, 1, bias=False), nn.BatchNorm2d(c))
            self.head = nn.Linear(c, 3)

        def forward(self, x):
            y = self.project(self.dw(self.expand(self.stem(x))))
            return self.head(y.mean((2, 3)))


    def unet(size=8):
        return TinyUNet(), torch.randn(4, 3, size, size)


    def separable(size=8):
        return Separable(), torch.randn(4, 3, size, size)
''')


@pytest.fixture(scope="module")
def model_file(tmp_path_factory):
    p = tmp_path_factory.mktemp("convops") / "convmodels.py"
    p.write_text(MODELS)
    return p


@pytest.mark.parametrize("fn, ops_", [
    ("unet", {"conv_transpose": 1, "concat": 1, "conv": 4, "pool": 1}),
    ("separable", {"conv": 4, "reduce": 1, "linear": 1}),
])
def test_small_models_import_and_optcnn_equals_exhaustive(model_file, fn, ops_):
    g = import_spec(f"{model_file}:{fn}", batch=4)
    counts = g.summary()["ops"]
    assert all(counts.get(k) == v for k, v in ops_.items()), counts
    if fn == "unet":
        up = g.layer("up_0")
        assert up.out_shape == (4, 6, 8, 8) and up.folded == ["up_1", "up_2"]
        assert up.params["weight"] == (12, 2, 2, 2) and up.attrs["groups"] == 3
    if fn == "separable":
        dw = g.layer("dw_0")
        assert dw.attrs["groups"] == 8 and dw.folded == ["dw_1", "dw_2"]
    d = preset("p100-cluster", 2)
    cm = CostModel(g, d)
    fast = run("optcnn", Problem.of(g, d, cm))
    slow = run("exhaustive", Problem.of(g, d, cm), options={"max_space": 10 ** 9})
    assert fast.plan.objective_s == pytest.approx(slow.plan.objective_s, rel=1e-9)


@pytest.mark.multiprocess
def test_small_models_run_on_two_workers_against_the_reference(model_file):
    """Hand-pinned plans that split the transposed convolution and the depthwise convolution
    by channels and by height/width, plus the searched plans: one launch of 2 workers."""
    from explorer import service
    from explorer.engine.runtime import launch_many

    def plan(fn, pins=None, algo="optcnn"):
        req = service.Request(model=f"{model_file}:{fn}", preset="local", devices=2, batch=4,
                              algo=algo)
        doc = service.search(req, pins)
        doc.pop("trace", None)
        return doc

    plans = [plan("unet"), plan("unet", ["up_0=c=2", "dec_0=h=2"]), plan("unet", ["up_0=w=2"]),
             plan("separable", ["dw_0=c=2", "expand_0=h=2"]), plan("separable", ["dw_0=w=2"])]
    labels = [{la["name"]: la["config_label"] for la in p["layers"]} for p in plans]
    assert labels[1]["up_0"] == "c2" and labels[1]["dec_0"] == "h2"
    assert labels[2]["up_0"] == "w2"
    assert labels[3]["dw_0"] == "c2" and labels[3]["expand_0"] == "h2"
    assert labels[4]["dw_0"] == "w2"
    results = launch_many(plans, steps=1, warmup=0, timeout_s=600, store=False)
    for p, r in zip(plans, results):
        ref = r["reference"]
        assert r["reference_ok"], (p["model"], [la["config_label"] for la in p["layers"]],
                                   ref["worst_grad"], ref["max_grad_rel_err"], ref["problems"])

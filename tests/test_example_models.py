"""Tests for the example model registry (example_models/)."""

from __future__ import annotations

import inspect
import math

import pytest
import torch
import torch.fx
from torch import nn

import example_models as em

NAMES = ["lenet5", "alexnet", "vgg16", "inception_v3", "resnet50", "wresnet", "mlp", "lstm", "transformer",
         "densenet", "unet", "seq2seq", "holography", "gpt2", "bert", "llama", "moe", "vit", "mobilenet_v2"]

# Small settings so that a real CPU forward+backward of every model stays fast.
SMALL = {
    "lenet5": {},
    "alexnet": {"image_size": 64, "num_classes": 10},
    "vgg16": {"image_size": 32, "num_classes": 10},
    "inception_v3": {"image_size": 75, "num_classes": 10},
    "resnet50": {"image_size": 32, "num_classes": 10},
    "wresnet": {"depth": 50, "width": 1, "image_size": 32, "num_classes": 10},
    "mlp": {"hidden": 64, "layers": 2},
    "lstm": {"hidden": 32, "steps": 3},
    "transformer": {"seq": 16, "hidden": 64, "heads": 4, "vocab": 50},
    "densenet": {"block": 2, "growth": 8, "image_size": 32, "num_classes": 10},
    "unet": {"depth": 2, "base": 8, "image_size": 32, "num_classes": 3},
    "seq2seq": {"layers": 1, "hidden": 16, "src_steps": 2, "tgt_steps": 3, "vocab": 20},
    "holography": {"layers": 3, "filters": 4, "res": 8},
    "gpt2": {"layers": 2, "hidden": 32, "heads": 4, "seq_len": 16, "vocab": 50},
    "bert": {"layers": 2, "hidden": 32, "heads": 4, "seq_len": 16, "vocab": 50, "num_classes": 3},
    "llama": {"layers": 2, "hidden": 32, "heads": 4, "intermediate": 48, "seq_len": 16, "vocab": 50},
    "moe": {"layers": 2, "hidden": 32, "heads": 4, "intermediate": 48, "experts": 4, "top_k": 2,
            "seq_len": 16, "vocab": 50},
    "vit": {"image_size": 32, "patch": 8, "layers": 2, "hidden": 32, "heads": 4, "mlp": 64,
            "num_classes": 10},
    "mobilenet_v2": {"width": 0.25, "image_size": 32, "num_classes": 10},
}


def out_shape(name, batch, params):
    """Classifiers give [batch, classes]; U-Net gives per-pixel scores."""
    if name == "unet":
        size = params.get("image_size", 256)
        return (batch, params["num_classes"], size, size)
    if name == "seq2seq":            # next-token scores for every target step
        return (batch, params["tgt_steps"], params["vocab"])
    if name == "holography":         # amplitude and phase for 3 colours, per pixel
        return (batch, 6, params["res"], params["res"])
    if name in ("gpt2", "llama", "moe"):    # next-token scores for every position
        return (batch, params["seq_len"], params["vocab"])
    return (batch, params["num_classes"])


def count(model: nn.Module, kind: type) -> int:
    return sum(isinstance(m, kind) for m in model.modules())


def test_registry_keys_and_entries():
    assert list(em.MODELS) == NAMES
    for name, entry in em.MODELS.items():
        assert entry.name == name
        assert entry.description and "\n" not in entry.description
        assert entry.default_batch >= 1
        params = list(inspect.signature(entry.builder).parameters.values())
        assert params[0].name == "batch"
        assert all(p.default is not inspect.Parameter.empty for p in params[1:])


@pytest.mark.parametrize("name", NAMES)
def test_meta_build_defaults_shape(name):
    with torch.device("meta"):
        model, x = em.build(name)
        y = model(x)
    batch = em.MODELS[name].default_batch
    assert x.device.type == "meta"
    assert all(p.device.type == "meta" for p in model.parameters())
    assert x.shape[0] == batch
    assert tuple(y.shape) == out_shape(name, batch, em.model_params(name))


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_cpu_forward_backward_small(name):
    torch.manual_seed(0)
    model, x = em.build(name, batch=2, **SMALL[name])
    assert x.device.type == "cpu"
    y = model(x)
    assert tuple(y.shape) == out_shape(name, 2, dict(em.model_params(name), **SMALL[name]))
    loss = y.pow(2).mean()
    loss.backward()
    assert math.isfinite(loss.item())
    grads = [p.grad for p in model.parameters()]
    assert all(g is not None for g in grads)
    assert all(torch.isfinite(g).all() for g in grads)


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_fx_symbolic_trace(name):
    with torch.device("meta"):
        model, x = em.build(name)
    gm = torch.fx.symbolic_trace(model)
    assert len(list(gm.graph.nodes)) > 2
    with torch.device("meta"):
        assert gm(x).shape == model(x).shape


def test_layer_counts():
    with torch.device("meta"):
        inc, _ = em.build("inception_v3")
        inc_aux, _ = em.build("inception_v3", aux_logits=True)
        r50, _ = em.build("resnet50")
        w101, _ = em.build("wresnet", depth=101)
        w152, _ = em.build("wresnet", depth=152, width=10)
        w26, _ = em.build("wresnet", depth=26, width=2)
        lstm, _ = em.build("lstm", layers=3)
        tr, _ = em.build("transformer", layers=3)
    assert 90 <= count(inc, nn.Conv2d) <= 100
    assert count(inc, nn.Conv2d) == 94 and count(inc_aux, nn.Conv2d) == 96
    assert count(r50, nn.Conv2d) == 53
    assert len(w101.layer3) == 23
    assert [len(getattr(w152, f"layer{i}")) for i in range(1, 5)] == [3, 8, 36, 3]
    assert count(w26, nn.Conv2d) == 1 + 3 * 8 + 4        # stem, 8 bottlenecks, 4 downsamples
    assert w26.layer1[0].conv1.out_channels == 2 * 64    # the width doubles the inner channels
    assert count(lstm, nn.LSTMCell) == 3
    assert count(tr, nn.Linear) == 6 * 3 + 1


def test_resnet50_is_wresnet_width_1():
    with torch.device("meta"):
        r50, _ = em.build("resnet50")
        w, _ = em.build("wresnet", depth=50, width=1)
        w2, _ = em.build("wresnet", depth=50, width=2)
    n = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    assert n(r50) == n(w) == 25_557_032  # torchvision resnet50
    assert n(w2) == 68_883_240  # torchvision wide_resnet50_2


def test_inception_aux_logits_still_single_output():
    with torch.device("meta"):
        model, x = em.build("inception_v3", aux_logits=True, batch=4)
        y = model(x)
    assert isinstance(y, torch.Tensor) and tuple(y.shape) == (4, 1000)
    with pytest.raises(ValueError, match="aux_logits"):
        em.build("inception_v3", aux_logits=True, image_size=150)


def test_model_params():
    assert em.model_params("wresnet") == {"depth": 50, "width": 4, "num_classes": 1000, "image_size": 224}
    assert em.model_params("transformer") == {
        "layers": 2,
        "heads": 8,
        "hidden": 512,
        "seq": 128,
        "vocab": 1000,
        "num_classes": 10,
    }
    with pytest.raises(em.UnknownModel):
        em.model_params("nope")


def test_string_kwargs_are_converted():
    with torch.device("meta"):
        model, x = em.build("wresnet", batch="3", depth="101", width="2")
        inc, _ = em.build("inception_v3", aux_logits="yes")
        inc2, _ = em.build("inception_v3", aux_logits="0")
        _, tokens = em.build("transformer", seq="20", hidden="64", heads="4")
    assert x.shape[0] == 3
    assert len(model.layer3) == 23
    assert inc.AuxLogits is not None and inc2.AuxLogits is None
    assert tuple(tokens.shape) == (32, 20)
    with pytest.raises(ValueError, match="depth"):
        em.build("wresnet", depth="fifty")
    with pytest.raises(ValueError, match="aux_logits"):
        em.build("inception_v3", aux_logits="maybe")


def test_unknown_name_lists_known_names():
    with pytest.raises(em.UnknownModel) as info:
        em.build("resnet18")
    assert isinstance(info.value, KeyError) and isinstance(info.value, ValueError)
    msg = str(info.value)
    assert "resnet18" in msg
    assert all(n in msg for n in NAMES)


def test_unknown_kwarg():
    with pytest.raises(ValueError, match="widht") as info:
        em.build("wresnet", widht=2)
    assert "depth" in str(info.value) and "width" in str(info.value)


def test_builder_validation():
    with pytest.raises(ValueError, match="34"):
        em.build("wresnet", depth=34)
    with pytest.raises(ValueError, match="11"):
        em.build("wresnet", width=11)
    with pytest.raises(ValueError, match="0"):
        em.build("wresnet", width=0)
    with pytest.raises(ValueError, match="heads"):
        em.build("transformer", hidden=100, heads=8)
    with pytest.raises(ValueError, match="batch"):
        em.build("mlp", batch=0)


def test_default_batch():
    with torch.device("meta"):
        for name in NAMES:
            _, x = em.build(name)
            assert x.shape[0] == em.MODELS[name].default_batch
            _, x = em.build(name, batch=5)
            assert x.shape[0] == 5


# --------------------------------------------------------------------------------------------
# Today's models: transformers, ViT, MobileNetV2, U-Net with up-convolutions
# --------------------------------------------------------------------------------------------

# the new examples (and U-Net's transposed-convolution decoder) at tiny sizes
EXPORTED = [(n, SMALL[n]) for n in ("gpt2", "bert", "llama", "vit", "mobilenet_v2")] + [
    ("llama", dict(SMALL["llama"], kv_heads=2)),
    ("unet", dict(SMALL["unet"], up="transpose")),
]


@pytest.mark.slow
@pytest.mark.parametrize("name,args", EXPORTED, ids=[f"{n}-{i}" for i, (n, _) in enumerate(EXPORTED)])
def test_fx_and_export_capture_in_train_mode(name, args):
    """Both capture paths the importer uses follow the model in train mode: symbolic tracing
    computes what the model computes, and torch.export captures it on the meta device (where
    the importer builds models)."""
    torch.manual_seed(0)
    model, x = em.build(name, batch=2, **args)
    model.train()
    want = model(x)
    gm = torch.fx.symbolic_trace(model)
    torch.testing.assert_close(gm(x), want)
    with torch.device("meta"):
        model, x = em.build(name, batch=2, **args)
    ep = torch.export.export(model.train(), (x,))
    assert tuple(ep.module()(x).shape) == tuple(want.shape)
    assert any(n.op == "call_function" for n in ep.graph.nodes)


def test_gpt2_parameter_count_formula():
    """V*H token + S*H position embeddings, per block 2 LayerNorms (4H), qkv (3H^2+3H), proj
    (H^2+H), MLP (8H^2+5H); final LayerNorm (2H) and the bias-free LM head (H*V)."""
    layers, h, heads, s, v = 3, 16, 2, 8, 40
    model, x = em.build("gpt2", batch=2, layers=layers, hidden=h, heads=heads, seq_len=s, vocab=v)
    n = sum(p.numel() for p in model.parameters())
    assert n == v * h + s * h + layers * (12 * h * h + 13 * h) + 2 * h + h * v
    assert x.dtype == torch.int64 and tuple(x.shape) == (2, s) and int(x.max()) < v
    assert [b for b, _ in model.named_buffers()] == ["position_ids"]


def test_parameter_counts_match_reference_architectures():
    with torch.device("meta"):
        vit, _ = em.build("vit")
        mnv2, _ = em.build("mobilenet_v2")
        bert, _ = em.build("bert", seq_len=512, num_classes=2)
    n = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    assert n(vit) == 86_567_656  # torchvision vit_b_16
    assert n(mnv2) == 3_504_872  # torchvision mobilenet_v2
    assert n(bert) == 109_482_240 + 768 * 2 + 2  # bert-base-uncased + a 2-class classifier
    assert count(mnv2, nn.ReLU6) == 35
    depthwise = [m for m in mnv2.modules() if isinstance(m, nn.Conv2d) and m.groups > 1]
    assert len(depthwise) == 17 and all(m.groups == m.in_channels == m.out_channels for m in depthwise)
    assert count(vit, nn.MultiheadAttention) == 12


def test_llama_grouped_query_attention_and_rotary():
    model, tokens = em.build("llama", batch=2, **dict(SMALL["llama"], kv_heads=2))
    attn = model.layers[0].self_attn
    assert attn.k_proj.out_features == 2 * 8 and attn.q_proj.out_features == 32
    assert all(m.bias is None for m in model.modules() if isinstance(m, nn.Linear))
    assert tuple(model.cos.shape) == tuple(model.sin.shape) == (16, 8)
    # causal: the scores at position t do not depend on tokens after t
    later = tokens.clone()
    later[:, 10:] = (later[:, 10:] + 1) % 50
    torch.testing.assert_close(model(tokens)[:, :10], model(later)[:, :10])


def test_unet_transposed_convolutions():
    args = dict(SMALL["unet"], up="transpose")
    with torch.device("meta"):
        model, x = em.build("unet", batch=2, **args)
        y = model(x)
    ups = [m for m in model.modules() if isinstance(m, nn.ConvTranspose2d)]
    assert [(m.in_channels, m.out_channels, m.kernel_size, m.stride) for m in ups] == [
        (32, 16, (2, 2), (2, 2)), (16, 8, (2, 2), (2, 2))]
    assert tuple(y.shape) == (2, 3, 32, 32)
    assert em.model_params("unet")["up"] == "nearest"
    nearest, _ = em.build("unet", batch=2, **SMALL["unet"])
    assert count(nearest, nn.ConvTranspose2d) == 0


@pytest.mark.parametrize("name,args,match", [
    ("gpt2", {"hidden": 100, "heads": 12}, r"hidden \(100\).*heads \(12\)"),
    ("gpt2", {"seq_len": 0}, "seq_len must be >= 1, got 0"),
    ("bert", {"hidden": 64, "heads": 5}, r"hidden \(64\).*heads \(5\)"),
    ("llama", {"heads": 12, "kv_heads": 5}, r"heads \(12\).*kv_heads \(5\)"),
    ("llama", {"hidden": 36, "heads": 12}, "2 \\(rotary"),
    ("vit", {"image_size": 100, "patch": 16}, r"image_size \(100\).*patch \(16\)"),
    ("mobilenet_v2", {"width": 0.0}, "width must be > 0, got 0.0"),
    ("unet", {"up": "bilinear"}, "nearest, transpose.*'bilinear'"),
])
def test_new_builders_validate(name, args, match):
    with pytest.raises(ValueError, match=match):
        em.build(name, **args)

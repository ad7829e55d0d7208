"""Example PyTorch models for Plan Explorer, written from scratch (no torchvision).

``MODELS`` maps a short name to an :class:`ExampleModel`; :func:`build` makes
``(model, example_input)`` where the input's first dimension is the global
batch. Models and inputs are created without explicit devices, so building
inside ``with torch.device("meta"):`` is instant even for huge models (shape
analysis), and building normally gives a real CPU model. Every model is
traceable by ``torch.fx.symbolic_trace`` (and the transformers and newer CNNs by
``torch.export.export`` in train mode too).

The registry itself does not import torch: a builder's module is imported when the builder is
first used, and :func:`model_params` reads the builder's keyword defaults from its source, so
listing the models (``explorer models``) starts in a fraction of a second.
"""

from __future__ import annotations

import ast
import functools
import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

__all__ = ["ExampleModel", "MODELS", "SMALL", "UnknownModel", "build", "model_params"]


@dataclass(frozen=True)
class ExampleModel:
    name: str  # e.g. "vgg16"
    description: str  # one line
    module: str  # the submodule defining the builder, e.g. "vgg"
    function: str  # builder(batch=..., **kwargs) -> (nn.Module, example_input)
    default_batch: int

    @property
    def builder(self) -> Callable:
        """The builder function (its module, and torch, imported on first use)."""
        return getattr(importlib.import_module(f"{__name__}.{self.module}"), self.function)

    @property
    def source(self) -> Path:
        """The file defining the builder."""
        return Path(__file__).with_name(f"{self.module}.py")


class UnknownModel(KeyError, ValueError):
    """Raised by :func:`build` / :func:`model_params` for a name not in ``MODELS``."""

    def __str__(self) -> str:  # KeyError would repr() the message, adding quotes
        return str(self.args[0]) if self.args else ""


_ENTRIES = [
    ("lenet5", "LeNet-5 (LeCun et al. 1998), 1x28x28 MNIST-style input", ("lenet", "build_lenet5"), 64),
    ("alexnet", "AlexNet (Krizhevsky et al. 2012), torchvision layout, 224x224 ImageNet", ("alexnet", "build_alexnet"), 128),
    ("vgg16", "VGG-16 (Simonyan & Zisserman 2014), 224x224 ImageNet", ("vgg", "build_vgg16"), 128),
    ("inception_v3", "Inception-v3 (Szegedy et al. 2016), full network, 299x299 ImageNet", ("inception", "build_inception_v3"), 128),
    ("resnet50", "ResNet-50 v1.5 (He et al. 2016), 224x224 ImageNet", ("resnet", "build_resnet50"), 128),
    ("wresnet", "Wide-ResNet (Zagoruyko & Komodakis 2016), bottleneck ResNet-50/101/152 x width, 224x224",
     ("resnet", "build_wresnet"), 32),
    ("mlp", "Multilayer perceptron: layers x Linear(hidden)+ReLU, then Linear(num_classes)", ("mlp", "build_mlp"), 256),
    ("lstm", "Stacked LSTM (Hochreiter & Schmidhuber 1997) unrolled over time, Tofu-style RNN", ("lstm", "build_lstm"), 64),
    ("transformer", "Pre-LN Transformer encoder classifier (Vaswani et al. 2017)", ("transformer", "build_transformer"), 32),
    ("densenet", "DenseNet (Huang et al. 2017): dense blocks, every layer reads all earlier ones",
     ("densenet", "build_densenet"), 64),
    ("unet", "U-Net (Ronneberger et al. 2015): encoder-decoder with long skip connections, "
     "up=transpose for 2x2 up-convolutions", ("unet", "build_unet"), 16),
    ("seq2seq", "LSTM seq2seq (NMT-style, Wu et al. 2016): stacked encoder/decoder LSTMCells", ("seq2seq", "build_seq2seq"), 64),
    ("holography", "Tensor-Holography-like CNN (Shi et al. 2021): 30 full-resolution 3x3 convs", ("holography", "build_holography"), 4),
    ("gpt2", "GPT-2-style decoder (Radford et al. 2019): fused qkv, causal SDPA, pre-LN, GELU MLP, LM head",
     ("gpt2", "build_gpt2"), 8),
    ("bert", "BERT-style encoder (Devlin et al. 2019): 3 embeddings, post-LN blocks, tanh pooler, classifier",
     ("bert", "build_bert"), 8),
    ("llama", "Llama-style decoder (Touvron et al. 2023): RMSNorm, SwiGLU, rotary, causal SDPA, no biases",
     ("llama", "build_llama"), 8),
    ("moe", "Mixture-of-experts decoder (Mixtral-style, GShard/Switch dispatch): router, top-k, "
     "capacity-based one-hot dispatch, experts as batched matmuls", ("moe", "build_moe"), 8),
    ("vit", "Vision Transformer (Dosovitskiy et al. 2021), torchvision ViT-B/16 layout, nn.MultiheadAttention",
     ("vit", "build_vit"), 32),
    ("mobilenet_v2", "MobileNetV2 (Sandler et al. 2018): inverted residuals, depthwise 3x3, ReLU6, 224x224",
     ("mobilenet", "build_mobilenet_v2"), 64),
]

MODELS: dict[str, ExampleModel] = {name: ExampleModel(name, desc, mod, fn, b)
                                   for name, desc, (mod, fn), b in _ENTRIES}


def _get(name: str) -> ExampleModel:
    try:
        return MODELS[name]
    except (KeyError, TypeError):
        raise UnknownModel(f"unknown model {name!r}; known models: {', '.join(MODELS)}") from None


def model_params(name: str) -> dict[str, object]:
    """The builder's keyword arguments other than ``batch``, with their defaults (read from
    the builder's source, so torch is not imported)."""
    entry = _get(name)
    return dict(_source_params(entry.source, entry.function))


@functools.cache
def _source_params(path: Path, function: str) -> tuple:
    """``((name, default), ...)`` of ``function``'s parameters after ``batch`` in ``path``
    (every builder's defaults are literals)."""
    tree = ast.parse(path.read_text(), str(path))
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == function)
    a = fn.args
    positional = a.posonlyargs + a.args
    pos_defaults = [None] * (len(positional) - len(a.defaults)) + list(a.defaults)
    pairs = list(zip(positional, pos_defaults)) + list(zip(a.kwonlyargs, a.kw_defaults))
    return tuple((arg.arg, ast.literal_eval(d)) for arg, d in pairs
                 if arg.arg != "batch" and d is not None)


_TRUE = {"true", "1", "yes", "y", "on"}
_FALSE = {"false", "0", "no", "n", "off"}


def _coerce(model: str, key: str, value: object, default: object) -> object:
    """Convert ``value`` (possibly a command-line string) to the type of ``default``."""
    kind = type(default)
    if isinstance(default, bool):
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
            return value.strip().lower() in _TRUE
        if isinstance(value, int) and value in (0, 1):
            return bool(value)
        raise ValueError(f"{model}: parameter {key!r} expects a bool (true/false/1/0/yes/no), got {value!r}")
    if kind in (int, float):
        if isinstance(value, bool):
            raise ValueError(f"{model}: parameter {key!r} expects {kind.__name__}, got bool {value!r}")
        if isinstance(value, str):
            try:
                return kind(value.strip())
            except ValueError:
                raise ValueError(f"{model}: parameter {key!r} expects {kind.__name__}, got {value!r}") from None
        if kind is float and isinstance(value, (int, float)):
            return float(value)
        if kind is int and isinstance(value, int):
            return value
        if kind is int and isinstance(value, float) and value.is_integer():
            return int(value)
        raise ValueError(f"{model}: parameter {key!r} expects {kind.__name__}, got {value!r}")
    return value


def build(name: str, batch: int | str | None = None, **kwargs) -> tuple:
    """Build model ``name`` and its example input (first dimension = ``batch``).

    Unknown name -> :class:`UnknownModel` listing the known names. Unknown kwarg
    -> ValueError listing the accepted ones. String values (from the command
    line) are converted to the type of the builder's default. ``batch=None``
    uses the model's ``default_batch``. Builders validate their own values.
    """
    entry = _get(name)
    params = model_params(name)
    unknown = [k for k in kwargs if k not in params]
    if unknown:
        accepted = ", ".join(params) or "(none)"
        raise ValueError(f"{name}: unknown parameter(s) {', '.join(map(repr, unknown))}; accepted: {accepted}")
    converted = {k: _coerce(name, k, v, params[k]) for k, v in kwargs.items()}
    if batch is None:
        batch = entry.default_batch
    else:
        batch = _coerce(name, "batch", batch, 0)
        if batch < 1:
            raise ValueError(f"{name}: batch must be >= 1, got {batch}")
    return entry.builder(batch, **converted)

#: every example model at a size that trains a step on 2 cores in seconds (``-a KEY=VALUE``
#: arguments; the Tofu example tests and ``benchmarks/tofu_fallbacks.py`` use them)
SMALL = {
    "lenet5": {},
    "alexnet": {"image_size": 63, "num_classes": 10, "fc": 32},
    "vgg16": {"image_size": 32, "num_classes": 10, "fc": 32},
    "inception_v3": {"image_size": 75, "num_classes": 10},
    "resnet50": {"image_size": 32, "num_classes": 10},
    # wide (width 2) and shallow: depth 50 at width 1 would be resnet50's test again
    "wresnet": {"depth": 26, "width": 2, "image_size": 32, "num_classes": 10},
    "mlp": {"hidden": 16, "layers": 1},
    "lstm": {"hidden": 16, "steps": 2, "layers": 1},
    "transformer": {"layers": 1, "seq": 8, "hidden": 16, "heads": 2, "vocab": 20},
    "densenet": {"block": 2, "blocks": 2, "growth": 4, "image_size": 16, "num_classes": 10},
    "unet": {"depth": 2, "base": 4, "image_size": 16, "num_classes": 3},
    "seq2seq": {"layers": 1, "hidden": 16, "src_steps": 2, "tgt_steps": 2, "vocab": 20},
    "holography": {"layers": 3, "filters": 4, "res": 8},
    "gpt2": {"layers": 1, "hidden": 16, "heads": 2, "seq_len": 8, "vocab": 20},
    "bert": {"layers": 1, "hidden": 16, "heads": 2, "seq_len": 8, "vocab": 20, "num_classes": 3},
    "llama": {"layers": 1, "hidden": 16, "heads": 2, "intermediate": 24, "seq_len": 8,
              "vocab": 20},
    "moe": {"layers": 1, "hidden": 16, "heads": 2, "intermediate": 24, "experts": 4, "top_k": 2,
            "seq_len": 8, "vocab": 20},
    "vit": {"image_size": 16, "patch": 8, "layers": 1, "hidden": 16, "heads": 2, "mlp": 32,
            "num_classes": 10},
    "mobilenet_v2": {"width": 0.25, "image_size": 32, "num_classes": 10},
}

"""Hugging Face architectures by name: the model spec ``hf:NAME``.

``NAME`` is a Transformers ``model_type`` (``gpt2``, ``bert``, ``llama``, ``vit``, ...).  The
model is built from its configuration class with the user's overrides
(``transformers.AutoConfig.for_model(NAME, **overrides)``, then ``from_config``): random
weights, nothing downloaded, no network, and on the meta device when the importer asks for it.

Model arguments are split in two: ``seq_len`` (token models; default 128) and ``task`` are ours,
everything else must be a key the configuration knows (``n_layer=4``, ``hidden_size=256``;
command-line strings are converted to the type of the configuration's default).  ``task``
chooses the model class: ``base`` (``AutoModel``, the default: the architecture itself, whose
outputs are its hidden states, so no vocabulary-sized head dominates the costs), ``causal-lm``,
``masked-lm``, ``sequence-classification`` or ``image-classification``.

Defaults we change, each overridable: ``use_cache=False`` (a key/value cache is an output no
training step uses and torch.export cannot return), every dropout probability 0 (a training
step must be reproducible to be checked against one device), and attention is
``attn_implementation="sdpa"`` (one ``scaled_dot_product_attention`` operator, as our
built-in transformers use; ``eager`` when an architecture has no SDPA path).  Hugging Face
models are captured by ``torch.export`` (symbolic tracing cannot follow them) in train mode.
"""

from __future__ import annotations

import ast
import contextlib
import difflib
import inspect

from explorer.errors import UnknownModel, UnsupportedModel

PREFIX = "hf:"
DEFAULT_BATCH = 8
DEFAULT_SEQ_LEN = 128
#: ``task`` -> the Transformers auto class building that head.
TASKS = {
    "base": "AutoModel",
    "causal-lm": "AutoModelForCausalLM",
    "masked-lm": "AutoModelForMaskedLM",
    "sequence-classification": "AutoModelForSequenceClassification",
    "image-classification": "AutoModelForImageClassification",
}
EXTRA = "hf: models need the optional extra: pip install .[hf]"
USAGE = ("hf:NAME  a Hugging Face architecture by model_type (hf:gpt2, hf:bert, hf:llama, "
         "hf:vit, ...), random weights, nothing downloaded; -a KEY=VALUE overrides its config "
         f"(-a n_layer=4), plus -a seq_len=N (default {DEFAULT_SEQ_LEN}) and "
         f"-a task={'|'.join(TASKS)}; needs pip install .[hf]")


def is_hf(spec: object) -> bool:
    """Whether ``spec`` names a Hugging Face architecture (``hf:NAME``)."""
    return isinstance(spec, str) and spec.startswith(PREFIX)


def _transformers():
    try:
        import transformers
    except ImportError:
        raise UnsupportedModel(EXTRA) from None
    return transformers


@contextlib.contextmanager
def _quiet(transformers):
    """Silence Transformers' advice while configs and models are built (e.g. a token id
    outside a shrunken vocabulary): the user asked for a tiny config on purpose."""
    log = transformers.logging
    level = log.get_verbosity()
    log.set_verbosity_error()
    try:
        yield
    finally:
        log.set_verbosity(level)


def _config_class(transformers, name: str):
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING
    if name in CONFIG_MAPPING:
        return CONFIG_MAPPING[name]
    close = difflib.get_close_matches(name, list(CONFIG_MAPPING.keys()), n=4, cutoff=0.6)
    hint = f"did you mean {', '.join(close)}? " if close else ""
    raise UnknownModel(f"hf:{name}: unknown Hugging Face architecture; {hint}NAME is a "
                       f"Transformers model_type such as gpt2, bert, llama, vit, t5")


def _config_keys(cls, default) -> set[str]:
    """Every key the configuration accepts: its fields, aliases, init arguments and settable
    properties (``num_labels``)."""
    keys = set(default.to_dict()) | set(getattr(cls, "attribute_map", {}) or {})
    for klass in cls.__mro__:
        init = vars(klass).get("__init__")
        if init is not None:
            keys |= {p.name for p in inspect.signature(init).parameters.values()
                     if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL) and p.name != "self"}
        keys |= {k for k, v in vars(klass).items()
                 if isinstance(v, property) and v.fset is not None and not k.startswith("_")}
    return {k for k in keys if not k.startswith("_")}


def _coerce(name: str, key: str, value: object, default: object) -> object:
    """A command-line string converted to the type of the configuration's default."""
    if not isinstance(value, str):
        return value
    text = value.strip()
    if isinstance(default, bool):
        low = text.lower()
        if low in ("true", "1", "yes", "on"):
            return True
        if low in ("false", "0", "no", "off"):
            return False
        raise ValueError(f"hf:{name}: {key} expects a bool (true/false), got {value!r}")
    if isinstance(default, (int, float)):
        try:
            number = float(text) if isinstance(default, float) else int(text)
        except ValueError:
            raise ValueError(f"hf:{name}: {key} expects {type(default).__name__}, got "
                             f"{value!r}") from None
        return number
    if isinstance(default, str):
        return text
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def split_args(name: str, model_args: dict | None, cls, default) -> tuple[dict, dict]:
    """``(config overrides, input args)``; an unknown key is one line naming close or a few
    valid keys."""
    args = dict(model_args or {})
    inputs = {"seq_len": args.pop("seq_len", None), "task": args.pop("task", "base")}
    keys = _config_keys(cls, default)
    unknown = [k for k in args if k not in keys]
    if unknown:
        close = sorted({c for k in unknown for c in difflib.get_close_matches(k, keys, n=3)})
        sizes = sorted(k for k, v in default.to_dict().items()   # the integer sizes
                       if type(v) is int and not k.endswith("_id"))
        lead = (f"did you mean {', '.join(close)}?" if close
                else f"valid keys include {', '.join(sizes[:8])}.")
        raise UnknownModel(f"hf:{name}: unknown config key(s) {', '.join(map(repr, unknown))} "
                           f"for {cls.__name__}; {lead} Model arguments are config keys, plus "
                           f"seq_len and task")
    overrides = {k: _coerce(name, k, v, getattr(default, k, None)) for k, v in args.items()}
    return overrides, inputs


def _defaults(default, overrides: dict, task: str) -> dict:
    """Our defaults (no cache, no dropout, a padding id for a classifier that needs one)
    under the user's overrides."""
    mine = {"use_cache": False} if hasattr(default, "use_cache") else {}
    if task == "sequence-classification" and getattr(default, "pad_token_id", 0) is None:
        mine["pad_token_id"] = 0       # decoders find each row's last token by its padding id
    for key, value in default.to_dict().items():
        if (("dropout" in key or "pdrop" in key) and isinstance(value, float)
                and not isinstance(value, bool)):
            mine[key] = 0.0
    return {**mine, **overrides}


def _model(transformers, name: str, task: str, config):
    """The ``task``'s model class from ``config`` with SDPA attention (eager when the
    architecture has none); failures are one line."""
    auto = getattr(transformers, TASKS[task])
    try:
        try:
            return auto.from_config(config, attn_implementation="sdpa")
        except ValueError as exc:
            text = str(exc).lower()
            if "sdpa" not in text and "scaled_dot_product" not in text:
                raise
        return auto.from_config(config, attn_implementation="eager")
    except Exception as exc:  # noqa: BLE001 - e.g. a size the layers cannot divide
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        if isinstance(exc, ValueError) and "Unrecognized configuration class" in first:
            raise UnsupportedModel(f"hf:{name}: Transformers has no {task} model for "
                                   f"{type(config).__name__}; tasks: {', '.join(TASKS)}") from None
        raise UnsupportedModel(f"hf:{name}: building the model failed: {type(exc).__name__}: "
                               f"{first}") from exc


def _example_input(name: str, model, config, batch: int, seq_len: int | None):
    import torch
    kind = getattr(model, "main_input_name", "input_ids")
    if kind == "input_ids":
        vocab = getattr(config, "vocab_size", None)
        if not isinstance(vocab, int) or vocab < 1:
            raise UnsupportedModel(f"hf:{name}: the config has no vocab_size to draw token ids "
                                   f"from")
        seq = DEFAULT_SEQ_LEN if seq_len is None else seq_len
        longest = getattr(config, "max_position_embeddings", None)
        if isinstance(longest, int) and longest > 0 and seq_len is None:
            seq = min(seq, longest)
        if isinstance(longest, int) and longest > 0 and seq > longest:
            raise ValueError(f"hf:{name}: seq_len {seq} exceeds the config's "
                             f"max_position_embeddings {longest}")
        return torch.randint(0, vocab, (batch, seq))
    if kind == "pixel_values":
        if seq_len is not None:
            raise ValueError(f"hf:{name}: seq_len applies to token models; an image model's "
                             f"input size is its config's image_size")
        size = getattr(config, "image_size", 224)
        size = tuple(size) if isinstance(size, (list, tuple)) else (size, size)
        return torch.randn(batch, getattr(config, "num_channels", 3), *size)
    raise UnsupportedModel(f"hf:{name}: inputs named {kind!r} are not supported; hf: models "
                           f"take token ids (input_ids) or images (pixel_values)")


def build(name: str, batch: int | None = None, model_args: dict | None = None):
    """``(model, example_input)`` for the architecture ``name`` with ``model_args``: config
    overrides plus ``seq_len`` and ``task`` (see the module docstring).  Bad input raises
    :class:`UnknownModel`, :class:`UnsupportedModel` or ``ValueError`` with one line."""
    transformers = _transformers()
    if not name:
        raise UnknownModel("hf: needs an architecture name (a Transformers model_type), "
                           "e.g. hf:gpt2, hf:bert, hf:llama")
    with _quiet(transformers):
        cls = _config_class(transformers, name)
        default = cls()
        overrides, inputs = split_args(name, model_args, cls, default)
        task = inputs["task"]
        if task not in TASKS:
            raise ValueError(f"hf:{name}: task must be one of {', '.join(TASKS)}, got {task!r}")
        seq_len = inputs["seq_len"]
        if seq_len is not None:
            seq_len = _coerce(name, "seq_len", seq_len, 0)
            if isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len < 1:
                raise ValueError(f"hf:{name}: seq_len must be an integer >= 1, got {seq_len!r}")
        batch = DEFAULT_BATCH if batch is None else batch
        if batch < 1:
            raise ValueError(f"hf:{name}: batch must be >= 1, got {batch}")
        try:
            config = transformers.AutoConfig.for_model(name, **_defaults(default, overrides, task))
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise ValueError(f"hf:{name}: the config rejects the overrides: {first}") from None
        model = _model(transformers, name, task, config)
    x = _example_input(name, model, config, batch, seq_len)
    if getattr(config, "is_encoder_decoder", False):
        model = EncoderDecoder(model, config)
    model.train()
    return model, x


def _encoder_decoder_class():
    import torch

    class EncoderDecoder(torch.nn.Module):
        """An encoder–decoder model (T5, BART, ...) fed one tensor of token ids: the decoder
        reads the same tokens shifted right behind the start token, as teacher-forced
        training feeds it (the model's own ``forward`` needs both inputs)."""

        def __init__(self, model, config):
            super().__init__()
            self.model = model
            self.config = model.config
            start = getattr(config, "decoder_start_token_id", None)
            self.start = int(start) if isinstance(start, int) else 0

        def forward(self, input_ids):
            dec = torch.cat([torch.full_like(input_ids[:, :1], self.start),
                             input_ids[:, :-1]], dim=1)
            return self.model(input_ids=input_ids, decoder_input_ids=dec)
    return EncoderDecoder


def EncoderDecoder(model, config):  # noqa: N802 - builds the module class on first use
    """:func:`_encoder_decoder_class`'s module around ``model`` (torch is imported lazily)."""
    return _encoder_decoder_class()(model, config)

"""``hf:NAME`` models: Hugging Face architectures built from their configs (explorer/engine/core/hf.py).

Tests that build a model need the optional ``transformers`` (``pip install .[hf]``) and skip
cleanly without it; the message for a missing extra and the CLI listing are checked either way.
"""

from __future__ import annotations

import sys

import pytest
import torch

from explorer import cli
from explorer.engine.core import hf
from explorer.engine.core.importer import load_model
from explorer.errors import ExplorerError, UnknownModel, UnsupportedModel

# tiny configurations: 2 layers, width 32, vocabulary 64, 16 tokens
TINY = {
    "hf:gpt2": {"n_layer": 2, "n_embd": 32, "n_head": 2, "vocab_size": 64, "seq_len": 16},
    "hf:bert": {"num_hidden_layers": 2, "hidden_size": 32, "num_attention_heads": 2,
                "intermediate_size": 64, "vocab_size": 64, "seq_len": 16},
    "hf:llama": {"num_hidden_layers": 2, "hidden_size": 32, "num_attention_heads": 4,
                 "num_key_value_heads": 2, "intermediate_size": 64, "vocab_size": 64,
                 "seq_len": 16},
}


@pytest.fixture(scope="module")
def transformers():
    return pytest.importorskip("transformers")


@pytest.mark.parametrize("spec", list(TINY))
def test_tiny_configs_build_on_meta_and_export_in_train_mode(transformers, spec):
    model, x = load_model(spec, 3, TINY[spec], meta=True)
    assert x.device.type == "meta" and x.dtype == torch.int64 and tuple(x.shape) == (3, 16)
    assert all(p.device.type == "meta" for p in model.parameters())
    assert model.training
    config = model.config
    assert config.num_hidden_layers == 2 and config.hidden_size == 32 and config.vocab_size == 64
    assert config.use_cache is False
    assert config._attn_implementation == "sdpa"
    dropouts = {k: v for k, v in config.to_dict().items()
                if ("dropout" in k or "pdrop" in k) and isinstance(v, float)}
    assert dropouts and not any(dropouts.values())
    ep = torch.export.export(model, (x,))           # how the importer captures hf: models
    out = ep.module()(x)
    assert tuple(out["last_hidden_state"].shape) == (3, 16, 32)


def test_real_build_runs_and_strings_are_converted(transformers):
    args = {k: str(v) for k, v in TINY["hf:gpt2"].items()}      # as `-a KEY=VALUE` gives them
    model, x = load_model("hf:gpt2", 2, dict(args, task="causal-lm", embd_pdrop="0.1"), meta=False)
    assert type(model).__name__ == "GPT2LMHeadModel"
    assert x.device.type == "cpu" and int(x.max()) < 64
    assert model.config.n_layer == 2 and model.config.embd_pdrop == 0.1   # an override wins
    logits = model(x).logits
    assert tuple(logits.shape) == (2, 16, 64)
    logits.float().pow(2).mean().backward()
    assert all(p.grad is not None for p in model.parameters())


def test_tasks_and_image_models(transformers):
    cls, x = load_model("hf:bert", 2, dict(TINY["hf:bert"], task="sequence-classification",
                                           num_labels=3))
    assert type(cls).__name__ == "BertForSequenceClassification" and cls.config.num_labels == 3
    vit, pixels = load_model("hf:vit", 2, {"num_hidden_layers": 1, "hidden_size": 32,
                                           "num_attention_heads": 2, "intermediate_size": 64,
                                           "image_size": 32, "patch_size": 8})
    assert tuple(pixels.shape) == (2, 3, 32, 32) and pixels.is_floating_point()
    _, default = load_model("hf:gpt2", None, {"n_layer": 1})
    assert tuple(default.shape) == (hf.DEFAULT_BATCH, hf.DEFAULT_SEQ_LEN)


@pytest.mark.parametrize("spec,args,kind,words", [
    ("hf:gpt3", {}, UnknownModel, ["gpt3", "did you mean", "gpt2"]),
    ("hf:", {}, UnknownModel, ["hf:gpt2"]),
    ("hf:gpt2", {"n_layers": 2}, UnknownModel, ["'n_layers'", "GPT2Config", "n_layer"]),
    ("hf:bert", {"zzz": 1}, UnknownModel, ["'zzz'", "valid keys include", "hidden_size"]),
    ("hf:gpt2", {"n_layer": "four"}, ValueError, ["n_layer", "int", "'four'"]),
    ("hf:gpt2", {"seq_len": 5000}, ValueError, ["5000", "1024"]),
    ("hf:gpt2", {"task": "translate"}, ValueError, ["causal-lm", "'translate'"]),
    ("hf:vit", {"task": "causal-lm"}, UnsupportedModel, ["causal-lm", "ViTConfig"]),
])
def test_bad_input_is_one_line(transformers, spec, args, kind, words):
    with pytest.raises(kind) as info:
        load_model(spec, 2, args)
    msg = str(info.value)
    assert "\n" not in msg and all(w in msg for w in words), msg


def test_without_transformers_one_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)      # import transformers fails
    with pytest.raises(UnsupportedModel, match=r"^hf: models need the optional extra: "
                                               r"pip install \.\[hf\]$"):
        load_model("hf:gpt2", 2, {})


def test_cli_lists_hf_usage_and_rejects_unknown_names(capsys, monkeypatch):
    assert cli.main(["models"]) == 0
    out = capsys.readouterr().out
    assert "hf:NAME" in out and "pip install .[hf]" in out and "seq_len" in out
    monkeypatch.setitem(sys.modules, "transformers", None)
    assert cli.main(["graph", "hf:gpt2"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "pip install .[hf]" in err


def test_hf_specs_are_not_model_files():
    from explorer.views import state
    assert not state.is_model_file("hf:gpt2")
    assert state.is_model_file("models/mine.py:build")
    assert hf.is_hf("hf:llama") and not hf.is_hf("llama")
    assert issubclass(UnknownModel, ExplorerError)


T5 = {"num_layers": 1, "num_decoder_layers": 1, "d_model": 32, "d_ff": 64, "num_heads": 2,
      "d_kv": 16, "vocab_size": 64, "seq_len": 8}


def test_an_encoder_decoder_model_is_fed_its_decoder_tokens(transformers):
    """T5 (encoder–decoder) needs decoder inputs its ``forward`` cannot take from one tensor:
    the model is wrapped so the decoder reads the tokens shifted right behind the start token,
    as teacher-forced training does - and every family plans it."""
    model, x = load_model("hf:t5", 2, T5, meta=False)
    assert type(model).__name__ == "EncoderDecoder" and model.config.is_encoder_decoder
    out = model(x)
    assert tuple(out["last_hidden_state"].shape) == (2, 8, 32)
    for algo in ("optcnn", "tofu", "celeritas"):
        assert cli.main(["search", "hf:t5", *sum((["-a", f"{k}={v}"] for k, v in T5.items()),
                                                 []), "-n", "2", "-b", "2", "--algo", algo]) == 0


@pytest.mark.multiprocess
def test_an_encoder_decoder_layerwise_plan_runs_against_one_device(transformers, tmp_path,
                                                                    capsys):
    plan = tmp_path / "t5.json"
    args = sum((["-a", f"{k}={v}"] for k, v in T5.items()), [])
    assert cli.main(["search", "hf:t5", *args, "-n", "2", "-b", "2", "--preset", "local",
                     "--out", str(plan)]) == 0
    assert cli.main(["run", str(plan), "--steps", "1"]) == 0
    assert "reference check: OK" in capsys.readouterr().out


MIXTRAL = ["-a", "num_hidden_layers=1", "-a", "hidden_size=32", "-a", "intermediate_size=64",
           "-a", "num_attention_heads=2", "-a", "num_key_value_heads=1", "-a",
           "num_local_experts=4", "-a", "vocab_size=50", "--devices", "2", "--batch", "2"]


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.parametrize("algo,words", [
    ("optcnn", ["data-dependent op 'histc'", "fixed shapes"]),
    ("tofu", ["grouped matmul", "`moe` example"]),
    ("celeritas", ["grouped matmul", "`moe` example"])])
def test_a_mixtral_layer_is_refused_in_one_line_without_torchs_log(transformers, algo, words):
    """Hugging Face's Mixtral routes tokens to experts with data-dependent shapes: every
    family says so in one line (exit 2), and torch's fake-tensor logger, which logs each
    operator it cannot run with a traceback, prints nothing."""
    from _helpers import explorer_cli
    r = explorer_cli("search", "hf:mixtral", *MIXTRAL, "--algo", algo)
    assert r.returncode == 2, r.stderr
    lines = [ln for ln in (r.stdout + r.stderr).splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), lines
    assert all(w in lines[0] for w in words), lines[0]

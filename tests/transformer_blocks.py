"""Small hand-written transformer blocks in the styles people write today, for the layer-wise
importer, search and runtime tests (``tests/test_transformer_ops.py``).  Each function returns
``(model, example_input)`` and is used as the model spec ``tests/transformer_blocks.py:NAME``.

* ``gpt2``: Hugging Face ``Conv1D`` projections (``addmm``, weight ``[in, out]``), a fused
  qkv split, ``q @ k.T`` with a causal ``tril`` buffer sliced ``[:, :, :T, :T]`` and
  ``masked_fill``, softmax, the written-out tanh GELU (``pow``, ``tanh``), a learned position
  embedding.
* ``llama``: RMSNorm written out (``float``, ``pow``, ``mean``, ``rsqrt``, ``type_as``) and
  ``nn.RMSNorm``, rotary embeddings from ``cos``/``sin`` buffers (constants under fx;
  ``rotate_half`` by slicing and ``cat``), ``sdpa(is_causal=True)``, SwiGLU (``silu(a) * b``).
* ``bert``: post-LN, fused qkv ``view``/``permute``/``unbind``, ``baddbmm`` scores, a
  ``where`` over a ``full_like`` and a causal ``triu`` mask created in forward (``ones_like``),
  exact GELU.
* ``vit``: ``nn.MultiheadAttention`` (``batch_first`` either way, a constant causal mask when
  not), tanh GELU and ReLU6 modules.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


class Conv1D(nn.Module):
    """Hugging Face's ``Conv1D``: a linear layer with the weight stored ``[in, out]``."""

    def __init__(self, nf: int, nx: int) -> None:
        super().__init__()
        self.nf = nf
        self.weight = nn.Parameter(torch.randn(nx, nf) * 0.02)
        self.bias = nn.Parameter(torch.randn(nf) * 0.02)

    def forward(self, x):
        size_out = x.size()[:-1] + (self.nf,)
        x = torch.addmm(self.bias, x.view(-1, x.size(-1)), self.weight)
        return x.view(size_out)


class GPT2Block(nn.Module):
    def __init__(self, d: int, heads: int, seq: int) -> None:
        super().__init__()
        self.d, self.heads, self.hd = d, heads, d // heads
        self.ln_1 = nn.LayerNorm(d)
        self.c_attn = Conv1D(3 * d, d)
        self.c_proj = Conv1D(d, d)
        self.ln_2 = nn.LayerNorm(d)
        self.c_fc = Conv1D(4 * d, d)
        self.mlp_proj = Conv1D(d, 4 * d)
        self.register_buffer("bias", torch.tril(torch.ones(seq, seq)).view(1, 1, seq, seq))

    def attn(self, x):
        b, t = x.shape[0], x.shape[1]
        q, k, v = self.c_attn(x).split(self.d, dim=2)
        q = q.view(b, t, self.heads, self.hd).transpose(1, 2)
        k = k.view(b, t, self.heads, self.hd).transpose(1, 2)
        v = v.view(b, t, self.heads, self.hd).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(self.hd))
        att = att.masked_fill(self.bias[:, :, :t, :t] == 0, float("-inf"))
        att = F.softmax(att, dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(b, t, self.d)
        return self.c_proj(y)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        h = self.c_fc(self.ln_2(x))
        h = 0.5 * h * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi)
                                        * (h + 0.044715 * torch.pow(h, 3.0))))
        return x + self.mlp_proj(h)


class GPT2(nn.Module):
    def __init__(self, vocab=64, d=32, heads=4, seq=8, layers=1) -> None:
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Parameter(torch.randn(1, seq, d) * 0.02)
        self.h = nn.ModuleList(GPT2Block(d, heads, seq) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)

    def forward(self, ids):
        x = self.wte(ids) + self.wpe
        for blk in self.h:
            x = blk(x)
        return self.ln_f(x)


class RMSNorm(nn.Module):
    """Llama's RMSNorm, written out."""

    def __init__(self, d: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x):
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.type_as(x)


def rotate_half(x):
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


class LlamaBlock(nn.Module):
    def __init__(self, d: int, heads: int, hidden: int) -> None:
        super().__init__()
        self.heads, self.hd = heads, d // heads
        self.input_layernorm = RMSNorm(d)
        self.q_proj = nn.Linear(d, d, bias=False)
        self.k_proj = nn.Linear(d, d, bias=False)
        self.v_proj = nn.Linear(d, d, bias=False)
        self.o_proj = nn.Linear(d, d, bias=False)
        self.post_attention_layernorm = RMSNorm(d)
        self.gate_proj = nn.Linear(d, hidden, bias=False)
        self.up_proj = nn.Linear(d, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, d, bias=False)

    def forward(self, x, cos, sin):
        b, t, d = x.shape
        h = self.input_layernorm(x)
        q = self.q_proj(h).view(b, t, self.heads, self.hd).transpose(1, 2)
        k = self.k_proj(h).view(b, t, self.heads, self.hd).transpose(1, 2)
        v = self.v_proj(h).view(b, t, self.heads, self.hd).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o_proj(y.transpose(1, 2).reshape(b, t, d))
        h = self.post_attention_layernorm(x)
        return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))


class Llama(nn.Module):
    def __init__(self, vocab=64, d=32, heads=4, hidden=48, seq=8, layers=1) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(vocab, d)
        self.layers = nn.ModuleList(LlamaBlock(d, heads, hidden) for _ in range(layers))
        self.norm = nn.RMSNorm(d, eps=1e-6)
        hd = d // heads
        inv_freq = 1.0 / (10000 ** (torch.arange(0, hd, 2).float() / hd))
        freqs = torch.outer(torch.arange(seq).float(), inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        self.register_buffer("cos_cached", emb.cos(), persistent=False)
        self.register_buffer("sin_cached", emb.sin(), persistent=False)

    def forward(self, ids):
        x = self.embed_tokens(ids)
        cos, sin = self.cos_cached, self.sin_cached     # fx: constants of the traced graph
        for blk in self.layers:
            x = blk(x, cos, sin)
        return self.norm(x)


class BertBlock(nn.Module):
    def __init__(self, d: int, heads: int, causal: bool) -> None:
        super().__init__()
        self.heads, self.hd, self.causal = heads, d // heads, causal
        self.qkv = nn.Linear(d, 3 * d)
        self.out = nn.Linear(d, d)
        self.ln1 = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, 2 * d)
        self.fc2 = nn.Linear(2 * d, d)
        self.ln2 = nn.LayerNorm(d)

    def forward(self, x):
        b, t, d = x.shape
        qkv = self.qkv(x).view(b, t, 3, self.heads, self.hd).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        q = q.reshape(b * self.heads, t, self.hd)
        k = k.reshape(b * self.heads, t, self.hd)
        bias = x.new_zeros(t, t)
        s = torch.baddbmm(bias, q, k.transpose(1, 2), beta=1.0, alpha=1.0 / math.sqrt(self.hd))
        s = s.view(b, self.heads, t, t)
        if self.causal:
            keep = torch.triu(torch.ones_like(s), diagonal=1) == 0
            s = torch.where(keep, s, torch.full_like(s, -1e4))
        p = s.softmax(-1)
        y = (p @ v).transpose(1, 2).reshape(b, t, d)
        x = self.ln1(x + self.out(y))
        return self.ln2(x + self.fc2(F.gelu(self.fc1(x))))


class Bert(nn.Module):
    def __init__(self, vocab=64, d=32, heads=4, seq=8, layers=1, causal=True) -> None:
        super().__init__()
        self.word = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(torch.randn(1, seq, d) * 0.02)
        self.ln = nn.LayerNorm(d)
        self.layers = nn.ModuleList(BertBlock(d, heads, causal) for _ in range(layers))

    def forward(self, ids):
        x = self.ln(self.word(ids) + self.pos)
        for blk in self.layers:
            x = blk(x)
        return x


class ViTBlock(nn.Module):
    def __init__(self, d: int, heads: int, batch_first: bool) -> None:
        super().__init__()
        self.batch_first = batch_first
        self.norm1 = nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, heads, batch_first=batch_first)
        self.norm2 = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, 2 * d)
        self.act = nn.GELU(approximate="tanh") if batch_first else nn.ReLU6()
        self.fc2 = nn.Linear(2 * d, d)

    def forward(self, x):
        h = self.norm1(x)
        if self.batch_first:
            y, _ = self.attn(h, h, h)
        else:
            t = h.shape[1]
            mask = torch.triu(torch.full((t, t), float("-inf"), device=x.device), diagonal=1)
            h = h.transpose(0, 1)
            y = self.attn(h, h, h, attn_mask=mask, need_weights=False)[0].transpose(0, 1)
        x = x + y
        return x + self.fc2(self.act(self.fc1(self.norm2(x))))


class ViT(nn.Module):
    def __init__(self, d=32, heads=4, patch=4, image=8, batch_first=True) -> None:
        super().__init__()
        self.patch = nn.Conv2d(3, d, patch, patch)
        self.pos = nn.Parameter(torch.randn(1, (image // patch) ** 2, d) * 0.02)
        self.block = ViTBlock(d, heads, batch_first)
        self.norm = nn.LayerNorm(d)

    def forward(self, img):
        x = self.patch(img).flatten(2).transpose(1, 2) + self.pos
        return self.norm(self.block(x))


def gpt2(batch: int = 4, seq: int = 8, d: int = 32, heads: int = 4, layers: int = 1):
    return GPT2(64, d, heads, seq, layers), torch.randint(0, 64, (batch, seq))


def llama(batch: int = 4, seq: int = 8, d: int = 32, heads: int = 4, layers: int = 1):
    return Llama(64, d, heads, 48, seq, layers), torch.randint(0, 64, (batch, seq))


def bert(batch: int = 4, seq: int = 8, d: int = 32, heads: int = 4, layers: int = 1,
         causal: bool = True):
    return Bert(64, d, heads, seq, layers, causal), torch.randint(0, 64, (batch, seq))


def vit(batch: int = 4, batch_first: bool = True):
    return ViT(batch_first=batch_first), torch.randn(batch, 3, 8, 8)


def vit_seq_first(batch: int = 4):
    return vit(batch, batch_first=False)


# --------------------------------------------------------------------------------------------
# Hugging Face models at tiny configurations (no weights downloaded)
# --------------------------------------------------------------------------------------------


class HFHidden(nn.Module):
    """A Hugging Face base model returning ``last_hidden_state``.  Position (and token type)
    ids are passed computed from the input ids, so the position embeddings read an activation
    (an embedding indexed by a constant is the capture's business, not these ops').  Built in
    eval mode, the mode the runtime captures in (dropout is off either way)."""

    def __init__(self, model, positions: bool = True, token_types: bool = False) -> None:
        super().__init__()
        self.model, self.positions, self.token_types = model, positions, token_types

    def forward(self, ids):
        kw = {}
        if self.positions:
            kw["position_ids"] = ids * 0 + torch.arange(ids.shape[1], device=ids.device)
        if self.token_types:
            kw["token_type_ids"] = ids * 0
        return self.model(ids, **kw).last_hidden_state


def hf_gpt2(batch: int = 4, seq: int = 8, layers: int = 1):
    import transformers
    cfg = transformers.GPT2Config(n_layer=layers, n_embd=32, n_head=4, vocab_size=64,
                                  n_positions=seq, resid_pdrop=0.0, embd_pdrop=0.0,
                                  attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)
    return HFHidden(transformers.GPT2Model(cfg)).eval(), torch.randint(0, 64, (batch, seq))


def hf_bert(batch: int = 4, seq: int = 8, layers: int = 1):
    import transformers
    cfg = transformers.BertConfig(num_hidden_layers=layers, hidden_size=32, intermediate_size=64,
                                  num_attention_heads=4, vocab_size=64,
                                  max_position_embeddings=seq, hidden_dropout_prob=0.0,
                                  attention_probs_dropout_prob=0.0)
    model = transformers.BertModel(cfg, add_pooling_layer=False)
    return HFHidden(model, token_types=True).eval(), torch.randint(1, 64, (batch, seq))


def hf_llama(batch: int = 4, seq: int = 8, layers: int = 1):
    import transformers
    cfg = transformers.LlamaConfig(num_hidden_layers=layers, hidden_size=32, intermediate_size=48,
                                   num_attention_heads=4, num_key_value_heads=4, vocab_size=64,
                                   max_position_embeddings=seq, bos_token_id=0, eos_token_id=0)
    return HFHidden(transformers.LlamaModel(cfg), positions=False).eval(), \
        torch.randint(0, 64, (batch, seq))

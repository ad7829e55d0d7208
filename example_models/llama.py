"""Llama-style decoder (Touvron et al. 2023, "LLaMA: Open and Efficient Foundation Language
Models"), computed as Hugging Face's ``LlamaForCausalLM`` does.

Token embedding, ``layers`` pre-norm blocks [RMSNorm -> q/k/v Linear -> rotary position
embedding (Su et al. 2021) on q and k -> causal SDPA -> o Linear -> residual; RMSNorm ->
SwiGLU MLP down(silu(gate(x)) * up(x)) (Shazeer 2020) -> residual], final RMSNorm and an
LM head.  No biases anywhere.  RMSNorm is written out (x * rsqrt(mean(x^2) + eps) * w) and
rotary uses cos/sin tables registered as buffers and ``rotate_half`` by slicing and ``cat``,
so capture sees the elementary ops a Llama checkpoint's code produces.  ``kv_heads`` < heads
gives grouped-query attention (Ainslie et al. 2023), multi-query with ``kv_heads=1``
(Shazeer 2019); 0 means kv_heads = heads.  ``repeat_kv`` says how k and v are repeated per
group: ``expand`` as Hugging Face's ``repeat_kv`` does (``[:, :, None].expand(...).reshape``,
Llama 3, Mistral, Qwen 2, Gemma), ``interleave`` with ``repeat_interleave`` (hand-written
decoders), ``sdpa`` not at all (``scaled_dot_product_attention(..., enable_gqa=True)``).
``tie_embeddings`` makes the LM head share the token embedding's table (GPT-2, Gemma, small
Llama 3.2 checkpoints).  Causality: ``is_causal=True``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ._check import divisible, positive

REPEAT_KV = ("expand", "interleave", "sdpa")


class RMSNorm(nn.Module):
    """Root-mean-square LayerNorm (Zhang & Sennrich 2019): no mean, no bias."""

    def __init__(self, hidden: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotate_half(x: torch.Tensor, half: int) -> torch.Tensor:
    """(x1, x2) -> (-x2, x1) on the last dimension's halves (``half`` = head_dim / 2, a Python
    int so that tracing sees plain slices)."""
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class Attention(nn.Module):
    """q/k/v projections, rotary on q and k, optional k/v head repeat, causal SDPA, o."""

    def __init__(self, hidden: int, heads: int, kv_heads: int, repeat_kv: str = "expand") -> None:
        super().__init__()
        self.hidden = hidden
        self.heads = heads
        self.kv_heads = kv_heads
        self.repeat_kv = repeat_kv
        self.head_dim = hidden // heads
        self.q_proj = nn.Linear(hidden, heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(hidden, kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(hidden, kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(heads * self.head_dim, hidden, bias=False)

    def _repeat_kv(self, t: torch.Tensor, b: int, s: int) -> torch.Tensor:
        rep = self.heads // self.kv_heads
        if rep == 1 or self.repeat_kv == "sdpa":
            return t
        if self.repeat_kv == "interleave":
            return torch.repeat_interleave(t, rep, dim=1)
        t = t[:, :, None].expand(b, self.kv_heads, rep, s, self.head_dim)
        return t.reshape(b, self.heads, s, self.head_dim)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, s = x.shape[0], x.shape[1]
        q = self.q_proj(x).view(b, s, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        half = self.head_dim // 2
        q = q * cos + rotate_half(q, half) * sin
        k = k * cos + rotate_half(k, half) * sin
        k, v = self._repeat_kv(k, b, s), self._repeat_kv(v, b, s)
        if self.repeat_kv == "sdpa" and self.kv_heads != self.heads:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        else:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(y.transpose(1, 2).reshape(b, s, self.heads * self.head_dim))


class MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x))."""

    def __init__(self, hidden: int, intermediate: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    """Pre-norm decoder block: x + Attn(RMSNorm(x)), then x + MLP(RMSNorm(x))."""

    def __init__(self, hidden: int, heads: int, kv_heads: int, intermediate: int,
                 repeat_kv: str = "expand") -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(hidden)
        self.self_attn = Attention(hidden, heads, kv_heads, repeat_kv)
        self.post_attention_layernorm = RMSNorm(hidden)
        self.mlp = MLP(hidden, intermediate)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class Llama(nn.Module):
    """Token ids [batch, seq_len] -> next-token scores [batch, seq_len, vocab]."""

    def __init__(self, layers: int, hidden: int, heads: int, kv_heads: int, intermediate: int,
                 seq_len: int, vocab: int, rope_theta: float, repeat_kv: str = "expand",
                 tie_embeddings: bool = False) -> None:
        super().__init__()
        head_dim = hidden // heads
        inv_freq = 1.0 / rope_theta ** (torch.arange(0, head_dim, 2).float() / head_dim)
        angles = torch.outer(torch.arange(seq_len).float(), inv_freq)
        angles = torch.cat((angles, angles), dim=-1)           # [seq_len, head_dim]
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)
        self.embed_tokens = nn.Embedding(vocab, hidden)
        self.layers = nn.ModuleList(Block(hidden, heads, kv_heads, intermediate, repeat_kv)
                                    for _ in range(layers))
        self.norm = RMSNorm(hidden)
        self.lm_head = nn.Linear(hidden, vocab, bias=False)
        if tie_embeddings:
            self.lm_head.weight = self.embed_tokens.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed_tokens(tokens)
        for layer in self.layers:
            x = layer(x, self.cos, self.sin)
        return self.lm_head(self.norm(x))


def build_llama(batch: int, *, layers: int = 12, hidden: int = 768, heads: int = 12,
                kv_heads: int = 0, intermediate: int = 2048, seq_len: int = 128,
                vocab: int = 32000, rope_theta: float = 10000.0, repeat_kv: str = "expand",
                tie_embeddings: bool = False):
    """Llama-style decoder and token ids [batch, seq_len] in [0, vocab); kv_heads=0 means
    kv_heads = heads (plain multi-head attention); ``repeat_kv`` one of ``REPEAT_KV``."""
    kv_heads = kv_heads or heads
    if repeat_kv not in REPEAT_KV:
        raise ValueError(f"llama: repeat_kv must be one of {', '.join(REPEAT_KV)}, "
                         f"got {repeat_kv!r}")
    positive("llama", layers=layers, hidden=hidden, heads=heads, kv_heads=kv_heads,
             intermediate=intermediate, seq_len=seq_len, vocab=vocab, rope_theta=rope_theta)
    divisible("llama", "hidden", hidden, "heads", heads)
    divisible("llama", "heads", heads, "kv_heads", kv_heads)
    divisible("llama", "head dim hidden/heads", hidden // heads, "2 (rotary pairs)", 2)
    model = Llama(layers, hidden, heads, kv_heads, intermediate, seq_len, vocab, rope_theta,
                  repeat_kv, tie_embeddings)
    return model, torch.randint(0, vocab, (batch, seq_len))

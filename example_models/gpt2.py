"""GPT-2-style decoder (Radford et al. 2019, "Language Models are Unsupervised Multitask
Learners"), written the way Hugging Face's ``GPT2Model`` computes it.

Token embedding + learned position embedding indexed by a registered buffer ``position_ids``
(as Hugging Face does), ``layers`` pre-LN blocks [LN -> fused qkv Linear split into heads ->
causal attention -> out Linear -> residual; LN -> Linear(4h) -> GELU (tanh form) -> Linear(h)
-> residual], final LN and an LM head giving next-token scores for every position.

Causality uses ``F.scaled_dot_product_attention(..., is_causal=True)``: one operator, no
mask buffer, the form current PyTorch code (and Hugging Face's "sdpa" attention) uses.  The LM
head is a separate ``Linear`` without bias (GPT-2 ties it to the token embedding; untied here
so every parameter belongs to exactly one layer).  The sequence length is fixed at ``seq_len``:
the position table has ``seq_len`` rows and the input must have that length.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ._check import divisible, positive


class CausalSelfAttention(nn.Module):
    """Fused qkv projection split into ``heads`` heads, causal SDPA, output projection."""

    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        self.hidden = hidden
        self.heads = heads
        self.head_dim = hidden // heads
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.proj = nn.Linear(hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s = x.shape[0], x.shape[1]
        q, k, v = self.qkv(x).split(self.hidden, dim=2)
        q = q.view(b, s, self.heads, self.head_dim).transpose(1, 2)
        k = k.view(b, s, self.heads, self.head_dim).transpose(1, 2)
        v = v.view(b, s, self.heads, self.head_dim).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, s, self.hidden))


class Block(nn.Module):
    """Pre-LN decoder block: x + Attn(LN(x)), then x + MLP(LN(x))."""

    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(hidden)
        self.attn = CausalSelfAttention(hidden, heads)
        self.ln_2 = nn.LayerNorm(hidden)
        self.fc = nn.Linear(hidden, 4 * hidden)
        self.act = nn.GELU(approximate="tanh")
        self.proj = nn.Linear(4 * hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.proj(self.act(self.fc(self.ln_2(x))))


class GPT2(nn.Module):
    """Token ids [batch, seq_len] -> next-token scores [batch, seq_len, vocab]."""

    def __init__(self, layers: int, hidden: int, heads: int, seq_len: int, vocab: int) -> None:
        super().__init__()
        self.wte = nn.Embedding(vocab, hidden)
        self.wpe = nn.Embedding(seq_len, hidden)
        self.register_buffer("position_ids", torch.arange(seq_len).unsqueeze(0), persistent=False)
        self.blocks = nn.ModuleList(Block(hidden, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(hidden)
        self.lm_head = nn.Linear(hidden, vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.wte(tokens) + self.wpe(self.position_ids)
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.ln_f(x))


def build_gpt2(batch: int, *, layers: int = 12, hidden: int = 768, heads: int = 12,
               seq_len: int = 128, vocab: int = 50257):
    """GPT-2-style decoder (defaults: GPT-2 small) and token ids [batch, seq_len] in [0, vocab)."""
    positive("gpt2", layers=layers, hidden=hidden, heads=heads, seq_len=seq_len, vocab=vocab)
    divisible("gpt2", "hidden", hidden, "heads", heads)
    return GPT2(layers, hidden, heads, seq_len, vocab), torch.randint(0, vocab, (batch, seq_len))

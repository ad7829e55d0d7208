"""Transformer encoder classifier (Vaswani et al. 2017, "Attention Is All You
Need") with pre-LayerNorm blocks (Xiong et al. 2020, "On Layer Normalization
in the Transformer Architecture").

Written out explicitly (not ``nn.TransformerEncoder``) so that torch.fx sees
every projection as its own ``nn.Linear`` and attention as one
``F.scaled_dot_product_attention`` call: token embedding + learned positions,
``layers`` x [LN -> q/k/v Linear -> multi-head SDPA -> out Linear -> residual;
LN -> Linear(4h) -> GELU -> Linear(h) -> residual], final LN, mean over the
sequence, Linear classifier.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class SelfAttention(nn.Module):
    """Multi-head self-attention with separate q, k, v and output projections."""

    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        self.hidden = hidden
        self.heads = heads
        self.head_dim = hidden // heads
        self.q = nn.Linear(hidden, hidden)
        self.k = nn.Linear(hidden, hidden)
        self.v = nn.Linear(hidden, hidden)
        self.out = nn.Linear(hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s = x.shape[0], x.shape[1]
        q = self.q(x).view(b, s, self.heads, self.head_dim).transpose(1, 2)
        k = self.k(x).view(b, s, self.heads, self.head_dim).transpose(1, 2)
        v = self.v(x).view(b, s, self.heads, self.head_dim).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v)
        y = y.transpose(1, 2).reshape(b, s, self.hidden)
        return self.out(y)


class Block(nn.Module):
    """Pre-LN encoder block: x + Attn(LN(x)), then x + MLP(LN(x))."""

    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(hidden)
        self.attn = SelfAttention(hidden, heads)
        self.ln2 = nn.LayerNorm(hidden)
        self.fc1 = nn.Linear(hidden, 4 * hidden)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(4 * hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        x = x + self.fc2(self.act(self.fc1(self.ln2(x))))
        return x


class TransformerClassifier(nn.Module):
    """Token ids [batch, seq] -> logits [batch, num_classes]."""

    def __init__(
        self,
        layers: int = 2,
        heads: int = 8,
        hidden: int = 512,
        seq: int = 128,
        vocab: int = 1000,
        num_classes: int = 10,
    ) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden)
        self.pos = nn.Parameter(torch.zeros(1, seq, hidden))
        self.blocks = nn.ModuleList(Block(hidden, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(hidden)
        self.head = nn.Linear(hidden, num_classes)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        x = x + self.pos
        for block in self.blocks:
            x = block(x)
        x = self.ln_f(x)
        x = x.mean(dim=1)
        return self.head(x)


def build_transformer(
    batch: int,
    *,
    layers: int = 2,
    heads: int = 8,
    hidden: int = 512,
    seq: int = 128,
    vocab: int = 1000,
    num_classes: int = 10,
):
    """Transformer encoder classifier and token ids of shape [batch, seq] in [0, vocab)."""
    for key, value in (
        ("layers", layers),
        ("heads", heads),
        ("hidden", hidden),
        ("seq", seq),
        ("vocab", vocab),
        ("num_classes", num_classes),
    ):
        if value < 1:
            raise ValueError(f"transformer: {key} must be >= 1, got {value}")
    if hidden % heads != 0:
        raise ValueError(f"transformer: hidden ({hidden}) must be divisible by heads ({heads})")
    model = TransformerClassifier(
        layers=layers, heads=heads, hidden=hidden, seq=seq, vocab=vocab, num_classes=num_classes
    )
    return model, torch.randint(0, vocab, (batch, seq))

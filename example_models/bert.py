"""BERT-style encoder classifier (Devlin et al. 2019, "BERT: Pre-training of Deep
Bidirectional Transformers for Language Understanding"), laid out as Hugging Face's
``BertForSequenceClassification``.

Embeddings: word + position + token type, the last two indexed by registered buffers
(``position_ids`` = 0..seq_len-1, ``token_type_ids`` = zeros: one segment), then LayerNorm.
``layers`` post-LN blocks [q/k/v Linear -> bidirectional SDPA -> out Linear -> LN(x + .);
Linear(4h) -> GELU -> Linear(h) -> LN(x + .)], a pooler (Linear + tanh on the first token)
and a Linear classifier.  No dropout (deterministic steps); the sequence length is fixed at
``seq_len``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ._check import divisible, positive

EPS = 1e-12  # BERT's LayerNorm epsilon


class SelfAttention(nn.Module):
    """Separate q, k, v projections split into heads, SDPA without a mask, output projection."""

    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        self.hidden = hidden
        self.heads = heads
        self.head_dim = hidden // heads
        self.query = nn.Linear(hidden, hidden)
        self.key = nn.Linear(hidden, hidden)
        self.value = nn.Linear(hidden, hidden)
        self.out = nn.Linear(hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s = x.shape[0], x.shape[1]
        q = self.query(x).view(b, s, self.heads, self.head_dim).transpose(1, 2)
        k = self.key(x).view(b, s, self.heads, self.head_dim).transpose(1, 2)
        v = self.value(x).view(b, s, self.heads, self.head_dim).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v)
        return self.out(y.transpose(1, 2).reshape(b, s, self.hidden))


class Layer(nn.Module):
    """Post-LN encoder block: LN(x + Attn(x)), then LN(x + MLP(x))."""

    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        self.attention = SelfAttention(hidden, heads)
        self.ln_1 = nn.LayerNorm(hidden, eps=EPS)
        self.intermediate = nn.Linear(hidden, 4 * hidden)
        self.act = nn.GELU()
        self.output = nn.Linear(4 * hidden, hidden)
        self.ln_2 = nn.LayerNorm(hidden, eps=EPS)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.ln_1(x + self.attention(x))
        return self.ln_2(x + self.output(self.act(self.intermediate(x))))


class Bert(nn.Module):
    """Token ids [batch, seq_len] -> class scores [batch, num_classes]."""

    def __init__(self, layers: int, hidden: int, heads: int, seq_len: int, vocab: int,
                 type_vocab: int, num_classes: int) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(vocab, hidden)
        self.position_embeddings = nn.Embedding(seq_len, hidden)
        self.token_type_embeddings = nn.Embedding(type_vocab, hidden)
        self.register_buffer("position_ids", torch.arange(seq_len).unsqueeze(0), persistent=False)
        self.register_buffer("token_type_ids", torch.zeros(1, seq_len, dtype=torch.long),
                             persistent=False)
        self.ln_emb = nn.LayerNorm(hidden, eps=EPS)
        self.layers = nn.ModuleList(Layer(hidden, heads) for _ in range(layers))
        self.pooler = nn.Linear(hidden, hidden)
        self.classifier = nn.Linear(hidden, num_classes)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = (self.word_embeddings(tokens) + self.position_embeddings(self.position_ids)
             + self.token_type_embeddings(self.token_type_ids))
        x = self.ln_emb(x)
        for layer in self.layers:
            x = layer(x)
        pooled = torch.tanh(self.pooler(x[:, 0]))
        return self.classifier(pooled)


def build_bert(batch: int, *, layers: int = 12, hidden: int = 768, heads: int = 12,
               seq_len: int = 128, vocab: int = 30522, type_vocab: int = 2, num_classes: int = 2):
    """BERT-style classifier (defaults: BERT-base) and token ids [batch, seq_len] in [0, vocab)."""
    positive("bert", layers=layers, hidden=hidden, heads=heads, seq_len=seq_len, vocab=vocab,
             type_vocab=type_vocab, num_classes=num_classes)
    divisible("bert", "hidden", hidden, "heads", heads)
    model = Bert(layers, hidden, heads, seq_len, vocab, type_vocab, num_classes)
    return model, torch.randint(0, vocab, (batch, seq_len))

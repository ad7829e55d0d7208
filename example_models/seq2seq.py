"""LSTM sequence-to-sequence model in the style of GNMT/NMT (Wu et al. 2016), the "NMT" of
the Celeritas paper (Section 6.2.1: 4 layers, 2,048 hidden units, batch 512).

An encoder of ``layers`` stacked ``nn.LSTMCell`` unrolled over ``src_steps`` reads embedded
source tokens; a decoder of ``layers`` cells, initialised with the encoder's final states,
reads embedded target tokens for ``tgt_steps`` steps and projects every top-layer output to
the vocabulary.  Written as Python loops over cells (no ``nn.LSTM``) so every time step is
its own set of operators in the traced graph, as in a TensorFlow NMT graph.
"""

from __future__ import annotations

import torch
from torch import nn


class Seq2Seq(nn.Module):
    """Token ids ``[batch, src_steps + tgt_steps]`` -> logits ``[batch, tgt_steps, vocab]``."""

    def __init__(self, layers: int = 4, hidden: int = 2048, src_steps: int = 8,
                 tgt_steps: int = 8, vocab: int = 8000) -> None:
        super().__init__()
        self.src_steps, self.tgt_steps = src_steps, tgt_steps
        self.src_embed = nn.Embedding(vocab, hidden)
        self.tgt_embed = nn.Embedding(vocab, hidden)
        self.enc = nn.ModuleList(nn.LSTMCell(hidden, hidden) for _ in range(layers))
        self.dec = nn.ModuleList(nn.LSTMCell(hidden, hidden) for _ in range(layers))
        self.proj = nn.Linear(hidden, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        src = self.src_embed(tokens[:, :self.src_steps])
        tgt = self.tgt_embed(tokens[:, self.src_steps:])
        states: list = [None] * len(self.enc)
        for t in range(self.src_steps):
            inp = src[:, t]
            for i, cell in enumerate(self.enc):
                h, c = cell(inp) if states[i] is None else cell(inp, states[i])
                states[i] = (h, c)
                inp = h
        outs = []
        for t in range(self.tgt_steps):
            inp = tgt[:, t]
            for i, cell in enumerate(self.dec):
                h, c = cell(inp, states[i])
                states[i] = (h, c)
                inp = h
            outs.append(self.proj(inp))
        return torch.stack(outs, dim=1)


def build_seq2seq(batch: int, *, layers: int = 4, hidden: int = 2048, src_steps: int = 8,
                  tgt_steps: int = 8, vocab: int = 8000):
    """The seq2seq model and int64 token ids of shape ``[batch, src_steps + tgt_steps]``."""
    for key, value in (("layers", layers), ("hidden", hidden), ("src_steps", src_steps),
                       ("tgt_steps", tgt_steps), ("vocab", vocab)):
        if value < 1:
            raise ValueError(f"seq2seq: {key} must be >= 1, got {value}")
    model = Seq2Seq(layers, hidden, src_steps, tgt_steps, vocab)
    return model, torch.randint(0, vocab, (batch, src_steps + tgt_steps))

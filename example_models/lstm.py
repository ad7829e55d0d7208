"""Stacked LSTM (Hochreiter & Schmidhuber 1997, "Long Short-Term Memory")
unrolled over time, in the style of the RNN benchmark of Tofu (Wang, Huang &
Li 2019, "Supporting Very Large Models using Automatic Dataflow Graph
Partitioning").

One ``nn.LSTMCell`` per layer, shared by all time steps; forward is a Python
loop over time steps and layers, so tracing yields a layer graph of
``layers * steps`` cell calls (a 2-D grid with weight sharing along time),
followed by a Linear classifier on the last top-layer hidden state.
"""

from __future__ import annotations

import torch
from torch import nn


class StackedLSTM(nn.Module):
    """``layers`` LSTMCells of size ``hidden`` unrolled over ``steps`` time steps.

    Input is [batch, steps, hidden]. The first step calls each cell without a
    state (``hx=None`` means zeros), so no tensor is created inside forward:
    that keeps the model traceable by torch.fx and usable on the meta device.
    """

    def __init__(self, layers: int = 2, hidden: int = 1024, steps: int = 10, num_classes: int = 10) -> None:
        super().__init__()
        self.steps = steps
        self.cells = nn.ModuleList(nn.LSTMCell(hidden, hidden) for _ in range(layers))
        self.fc = nn.Linear(hidden, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        states: list = [None] * len(self.cells)
        for t in range(self.steps):
            inp = x[:, t]
            for i, cell in enumerate(self.cells):
                if t == 0:
                    h, c = cell(inp)
                else:
                    h, c = cell(inp, states[i])
                states[i] = (h, c)
                inp = h
        return self.fc(inp)


def build_lstm(batch: int, *, layers: int = 2, hidden: int = 1024, steps: int = 10, num_classes: int = 10):
    """Stacked unrolled LSTM and a float input of shape [batch, steps, hidden]."""
    for key, value in (("layers", layers), ("hidden", hidden), ("steps", steps), ("num_classes", num_classes)):
        if value < 1:
            raise ValueError(f"lstm: {key} must be >= 1, got {value}")
    model = StackedLSTM(layers=layers, hidden=hidden, steps=steps, num_classes=num_classes)
    return model, torch.randn(batch, steps, hidden)

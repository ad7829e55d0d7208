"""Multilayer perceptron (Rumelhart, Hinton & Williams 1986, "Learning
representations by back-propagating errors").

``layers`` Linear+ReLU layers of equal width ``hidden`` then a Linear to
``num_classes``. The simplest chain of matrix multiplies: its plans are easy
to check by hand (data vs. row/column model parallelism per layer).
"""

from __future__ import annotations

import torch
from torch import nn


class MLP(nn.Module):
    """Stack of equal-width Linear+ReLU layers followed by a classifier Linear."""

    def __init__(self, layers: int = 4, hidden: int = 1024, num_classes: int = 10) -> None:
        super().__init__()
        body: list[nn.Module] = []
        for _ in range(layers):
            body += [nn.Linear(hidden, hidden), nn.ReLU()]
        self.body = nn.Sequential(*body)
        self.head = nn.Linear(hidden, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


def build_mlp(batch: int, *, layers: int = 4, hidden: int = 1024, num_classes: int = 10):
    """MLP and an input of shape [batch, hidden]."""
    if layers < 0:
        raise ValueError(f"mlp: layers must be >= 0, got {layers}")
    if hidden < 1:
        raise ValueError(f"mlp: hidden must be >= 1, got {hidden}")
    if num_classes < 1:
        raise ValueError(f"mlp: num_classes must be >= 1, got {num_classes}")
    return MLP(layers=layers, hidden=hidden, num_classes=num_classes), torch.randn(batch, hidden)

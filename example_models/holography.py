"""A fully convolutional network shaped like Tensor Holography (Shi et al., Nature 2021), the
fourth model of the Celeritas paper (Section 6.2.1: 30 convolutional layers, 24 filters per
layer, batch 32; "30 GB of GPU memory even with a batch size of 16").

Input is an RGB-D image ``[batch, 4, res, res]``; ``layers - 1`` blocks of 3x3 convolution
(``filters`` channels, stride 1, same padding) + BatchNorm + ReLU keep the full resolution, and
a last 3x3 convolution predicts the 6-channel hologram (amplitude and phase per colour).
Full resolution everywhere is what makes its activations - not its 160 K parameters - huge.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class HoloNet(nn.Module):
    """``layers`` 3x3 convolutions at full resolution, ``filters`` channels in between."""

    def __init__(self, layers: int = 30, filters: int = 24, in_channels: int = 4,
                 out_channels: int = 6) -> None:
        super().__init__()
        self.convs = nn.ModuleList()
        self.norms = nn.ModuleList()
        c = in_channels
        for _ in range(layers - 1):
            self.convs.append(nn.Conv2d(c, filters, 3, padding=1, bias=False))
            self.norms.append(nn.BatchNorm2d(filters))
            c = filters
        self.head = nn.Conv2d(c, out_channels, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for conv, bn in zip(self.convs, self.norms):
            x = F.relu(bn(conv(x)))
        return self.head(x)


def build_holography(batch: int, *, layers: int = 30, filters: int = 24, res: int = 384):
    """The network and an RGB-D input of shape ``[batch, 4, res, res]``."""
    for key, value, low in (("layers", layers, 2), ("filters", filters, 1), ("res", res, 1)):
        if value < low:
            raise ValueError(f"holography: {key} must be >= {low}, got {value}")
    return HoloNet(layers, filters), torch.randn(batch, 4, res, res)

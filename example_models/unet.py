"""U-Net (Ronneberger et al. 2015): an encoder-decoder whose skip connections join each
encoder stage to the decoder stage of the same resolution.

The long skips leave a residual graph after OptCNN's eliminations (nested "ladders"), a
second shape of graph the search must solve exactly.

``up`` chooses the decoder's upsampling: ``"transpose"`` is the paper's 2x2 up-convolution
``nn.ConvTranspose2d(c, c/2, 2, stride=2)`` (halving the channels before the skip is
concatenated); ``"nearest"`` (the default, kept so earlier plans and numbers stay valid) is
parameter-free nearest-neighbour interpolation keeping the channels.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def _double_conv(cin, cout):
    return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1), nn.ReLU(),
                         nn.Conv2d(cout, cout, 3, padding=1), nn.ReLU())


UP_MODES = ("nearest", "transpose")


class UNet(nn.Module):
    def __init__(self, depth=4, base=64, in_channels=3, num_classes=2, up="nearest"):
        super().__init__()
        chans = [base * 2 ** i for i in range(depth + 1)]
        self.down = nn.ModuleList()
        c = in_channels
        for ch in chans:
            self.down.append(_double_conv(c, ch))
            c = ch
        self.transpose = up == "transpose"
        if self.transpose:
            self.upconv = nn.ModuleList(nn.ConvTranspose2d(chans[i + 1], chans[i], 2, stride=2)
                                        for i in reversed(range(depth)))
            self.up = nn.ModuleList(_double_conv(2 * chans[i], chans[i])
                                    for i in reversed(range(depth)))
        else:
            self.up = nn.ModuleList(_double_conv(chans[i + 1] + chans[i], chans[i])
                                    for i in reversed(range(depth)))
        self.head = nn.Conv2d(chans[0], num_classes, 1)
        self.depth = depth

    def forward(self, x):
        skips = []
        for i, stage in enumerate(self.down):
            x = stage(x)
            if i < self.depth:
                skips.append(x)
                x = F.max_pool2d(x, 2)
        for i, (stage, skip) in enumerate(zip(self.up, reversed(skips))):
            if self.transpose:
                x = self.upconv[i](x)
            else:
                x = F.interpolate(x, scale_factor=2, mode="nearest")
            x = stage(torch.cat([x, skip], 1))
        return self.head(x)


def build_unet(batch: int, *, depth: int = 4, base: int = 64, num_classes: int = 2,
               image_size: int = 256, up: str = "nearest"):
    """U-Net with ``depth`` down/up stages upsampling by ``up`` (``"nearest"`` or
    ``"transpose"``); input ``[batch, 3, image_size, image_size]``, output per-pixel class
    scores ``[batch, num_classes, image_size, image_size]``."""
    if up not in UP_MODES:
        raise ValueError(f"unet: up must be one of {', '.join(UP_MODES)}, got {up!r}")
    if depth < 1 or base < 1:
        raise ValueError(f"unet: depth={depth} and base={base} must be ≥ 1")
    if image_size % (2 ** depth):
        raise ValueError(f"unet: image_size {image_size} must be divisible by 2**depth = "
                         f"{2 ** depth}")
    return UNet(depth, base, 3, num_classes, up), torch.randn(batch, 3, image_size, image_size)

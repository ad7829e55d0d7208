"""MobileNetV2 (Sandler et al. 2018, "MobileNetV2: Inverted Residuals and Linear
Bottlenecks"), laid out as torchvision's ``mobilenet_v2`` (same parameter count at the
defaults: 3,504,872).

A 3x3/2 stem, 17 inverted residual blocks [1x1 expand (x t) -> depthwise 3x3 (groups =
channels) -> 1x1 linear projection, BatchNorm after each conv, ReLU6 after the first two,
residual add when stride 1 and channels match], a 1x1 conv to 1280 channels, global average
pooling and a Linear classifier.  ``width`` is the width multiplier (channels rounded to
multiples of 8).  No dropout (deterministic steps).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ._check import positive

#: (expansion t, output channels c, repeats n, first stride s) per stage, from the paper.
SETTINGS = [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1),
            (6, 160, 3, 2), (6, 320, 1, 1)]


def make_divisible(v: float, divisor: int = 8) -> int:
    """Round ``v`` to a multiple of ``divisor``, never below 90% of ``v`` (as the paper's code)."""
    new_v = max(divisor, int(v + divisor / 2) // divisor * divisor)
    return new_v + divisor if new_v < 0.9 * v else new_v


def conv_bn(cin: int, cout: int, kernel: int = 1, stride: int = 1, groups: int = 1,
            relu6: bool = True) -> nn.Sequential:
    """Conv (no bias) + BatchNorm (+ ReLU6)."""
    layers = [nn.Conv2d(cin, cout, kernel, stride, (kernel - 1) // 2, groups=groups, bias=False),
              nn.BatchNorm2d(cout)]
    if relu6:
        layers.append(nn.ReLU6())
    return nn.Sequential(*layers)


class InvertedResidual(nn.Module):
    """1x1 expand -> depthwise 3x3 -> 1x1 project, with a residual when shapes allow."""

    def __init__(self, cin: int, cout: int, stride: int, expand: int) -> None:
        super().__init__()
        hidden = int(round(cin * expand))
        self.use_res = stride == 1 and cin == cout
        layers = [conv_bn(cin, hidden)] if expand != 1 else []
        layers += [conv_bn(hidden, hidden, 3, stride, groups=hidden),
                   conv_bn(hidden, cout, relu6=False)]
        self.conv = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv(x) if self.use_res else self.conv(x)


class MobileNetV2(nn.Module):
    """Images [batch, 3, H, W] -> class scores [batch, num_classes]."""

    def __init__(self, width: float = 1.0, num_classes: int = 1000) -> None:
        super().__init__()
        cin = make_divisible(32 * width)
        last = make_divisible(1280 * max(1.0, width))
        blocks: list[nn.Module] = [conv_bn(3, cin, 3, 2)]
        for t, c, n, s in SETTINGS:
            cout = make_divisible(c * width)
            for i in range(n):
                blocks.append(InvertedResidual(cin, cout, s if i == 0 else 1, t))
                cin = cout
        blocks.append(conv_bn(cin, last))
        self.features = nn.Sequential(*blocks)
        self.classifier = nn.Linear(last, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.adaptive_avg_pool2d(self.features(x), 1)
        return self.classifier(torch.flatten(x, 1))


def build_mobilenet_v2(batch: int, *, width: float = 1.0, num_classes: int = 1000,
                       image_size: int = 224):
    """MobileNetV2 and images [batch, 3, image_size, image_size]."""
    positive("mobilenet_v2", width=width, num_classes=num_classes, image_size=image_size)
    return MobileNetV2(width, num_classes), torch.randn(batch, 3, image_size, image_size)

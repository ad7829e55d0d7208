"""VGG-16 (Simonyan & Zisserman 2014, "Very Deep Convolutional Networks for
Large-Scale Image Recognition"), configuration D without BatchNorm.

13 3x3 convs (padding 1) with ReLU, 5 max pools, AdaptiveAvgPool2d((7, 7)) and
fc 4096-4096-num_classes with ReLU + dropout, as in torchvision's ``vgg16`` (``fc``: the
hidden width).
Heavy convolutions followed by ~120M fc parameters: a classic example for
hybrid parallelization plans.
"""

from __future__ import annotations

import torch
from torch import nn

# Configuration "D" of the paper: numbers are conv output channels, "M" a 2x2 max pool.
CFG_D = [64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M"]


class VGG(nn.Module):
    """VGG from a layer configuration list (default: VGG-16, config D)."""

    def __init__(self, cfg=CFG_D, num_classes: int = 1000, dropout: float = 0.5,
                 fc: int = 4096) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        in_ch = 3
        for v in cfg:
            if v == "M":
                layers.append(nn.MaxPool2d(kernel_size=2, stride=2))
            else:
                layers.append(nn.Conv2d(in_ch, v, kernel_size=3, padding=1))
                layers.append(nn.ReLU())
                in_ch = v
        self.features = nn.Sequential(*layers)
        self.avgpool = nn.AdaptiveAvgPool2d((7, 7))
        self.classifier = nn.Sequential(
            nn.Linear(512 * 7 * 7, fc),
            nn.ReLU(),
            nn.Dropout(p=dropout),
            nn.Linear(fc, fc),
            nn.ReLU(),
            nn.Dropout(p=dropout),
            nn.Linear(fc, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.features(x)
        x = self.avgpool(x)
        x = torch.flatten(x, 1)
        return self.classifier(x)


def build_vgg16(batch: int, *, num_classes: int = 1000, image_size: int = 224, fc: int = 4096):
    """VGG-16 (``fc``: width of the two hidden fully-connected layers) and an input of shape
    [batch, 3, image_size, image_size]."""
    if image_size < 32:
        raise ValueError(f"vgg16: image_size must be >= 32 (224 is standard), got {image_size}")
    if num_classes < 1:
        raise ValueError(f"vgg16: num_classes must be >= 1, got {num_classes}")
    if fc < 1:
        raise ValueError(f"vgg16: fc must be >= 1, got {fc}")
    x = torch.randn(batch, 3, image_size, image_size)
    return VGG(CFG_D, num_classes=num_classes, fc=fc), x

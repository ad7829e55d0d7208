"""AlexNet (Krizhevsky, Sutskever & Hinton 2012, "ImageNet Classification with
Deep Convolutional Neural Networks").

Same layer shapes as torchvision's ``alexnet``, which follows the single-tower
variant of Krizhevsky 2014 ("One weird trick for parallelizing convolutional
neural networks"): 5 convs (64-192-384-256-256) with ReLU and 3 max pools,
AdaptiveAvgPool2d((6, 6)), then dropout + fc 4096-4096-num_classes (``fc``: the hidden
width). The large fully-connected layers make it the textbook case for mixing data parallelism
(convs) with model parallelism (fcs).
"""

from __future__ import annotations

import torch
from torch import nn


class AlexNet(nn.Module):
    """AlexNet with torchvision's layer shapes (non-inplace ReLUs, same math)."""

    def __init__(self, num_classes: int = 1000, dropout: float = 0.5, fc: int = 4096) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 64, kernel_size=11, stride=4, padding=2),
            nn.ReLU(),
            nn.MaxPool2d(kernel_size=3, stride=2),
            nn.Conv2d(64, 192, kernel_size=5, padding=2),
            nn.ReLU(),
            nn.MaxPool2d(kernel_size=3, stride=2),
            nn.Conv2d(192, 384, kernel_size=3, padding=1),
            nn.ReLU(),
            nn.Conv2d(384, 256, kernel_size=3, padding=1),
            nn.ReLU(),
            nn.Conv2d(256, 256, kernel_size=3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(kernel_size=3, stride=2),
        )
        self.avgpool = nn.AdaptiveAvgPool2d((6, 6))
        self.classifier = nn.Sequential(
            nn.Dropout(p=dropout),
            nn.Linear(256 * 6 * 6, fc),
            nn.ReLU(),
            nn.Dropout(p=dropout),
            nn.Linear(fc, fc),
            nn.ReLU(),
            nn.Linear(fc, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.features(x)
        x = self.avgpool(x)
        x = torch.flatten(x, 1)
        return self.classifier(x)


def build_alexnet(batch: int, *, num_classes: int = 1000, image_size: int = 224, fc: int = 4096):
    """AlexNet (``fc``: width of the two hidden fully-connected layers) and an input of shape
    [batch, 3, image_size, image_size]."""
    if image_size < 63:
        raise ValueError(f"alexnet: image_size must be >= 63 (224 is standard), got {image_size}")
    if num_classes < 1:
        raise ValueError(f"alexnet: num_classes must be >= 1, got {num_classes}")
    if fc < 1:
        raise ValueError(f"alexnet: fc must be >= 1, got {fc}")
    return AlexNet(num_classes=num_classes, fc=fc), torch.randn(batch, 3, image_size, image_size)

"""LeNet-5 (LeCun, Bottou, Bengio & Haffner 1998, "Gradient-based learning
applied to document recognition").

The classic small CNN: conv(6, 5x5)-relu-maxpool-conv(16, 5x5)-relu-maxpool
-fc120-fc84-fc10. It is the smallest convolutional example and is useful as
a quick sanity check of the importer and planner.
"""

from __future__ import annotations

import torch
from torch import nn


class LeNet5(nn.Module):
    """LeNet-5 on single-channel square images (28x28 MNIST or the original 32x32).

    ReLU and max pooling replace the paper's scaled tanh and trainable
    subsampling, as in every modern re-implementation.
    """

    def __init__(self, num_classes: int = 10, image_size: int = 28) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 6, kernel_size=5)
        self.relu1 = nn.ReLU()
        self.pool1 = nn.MaxPool2d(kernel_size=2, stride=2)
        self.conv2 = nn.Conv2d(6, 16, kernel_size=5)
        self.relu2 = nn.ReLU()
        self.pool2 = nn.MaxPool2d(kernel_size=2, stride=2)
        side = ((image_size - 4) // 2 - 4) // 2  # spatial size after the two conv+pool stages
        self.fc1 = nn.Linear(16 * side * side, 120)
        self.relu3 = nn.ReLU()
        self.fc2 = nn.Linear(120, 84)
        self.relu4 = nn.ReLU()
        self.fc3 = nn.Linear(84, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool1(self.relu1(self.conv1(x)))
        x = self.pool2(self.relu2(self.conv2(x)))
        x = torch.flatten(x, 1)
        x = self.relu3(self.fc1(x))
        x = self.relu4(self.fc2(x))
        return self.fc3(x)


def build_lenet5(batch: int, *, image_size: int = 28, num_classes: int = 10):
    """LeNet-5 and an input of shape [batch, 1, image_size, image_size]."""
    if image_size < 16:
        raise ValueError(f"lenet5: image_size must be >= 16 (28 or 32 are the classic sizes), got {image_size}")
    if num_classes < 1:
        raise ValueError(f"lenet5: num_classes must be >= 1, got {num_classes}")
    model = LeNet5(num_classes=num_classes, image_size=image_size)
    return model, torch.randn(batch, 1, image_size, image_size)

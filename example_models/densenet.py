"""DenseNet (Huang et al. 2017, "Densely Connected Convolutional Networks").

Every layer of a dense block reads the concatenation of all earlier feature maps of the block,
so its layer graph does *not* reduce to two nodes under OptCNN's node/edge eliminations: the
search must solve a residual graph whose size grows with the block length.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class DenseLayer(nn.Module):
    """BN-ReLU-Conv1x1 (bottleneck, 4·growth) then BN-ReLU-Conv3x3 (growth)."""

    def __init__(self, cin: int, growth: int):
        super().__init__()
        self.norm1 = nn.BatchNorm2d(cin)
        self.conv1 = nn.Conv2d(cin, 4 * growth, 1, bias=False)
        self.norm2 = nn.BatchNorm2d(4 * growth)
        self.conv2 = nn.Conv2d(4 * growth, growth, 3, padding=1, bias=False)

    def forward(self, x):
        return self.conv2(F.relu(self.norm2(self.conv1(F.relu(self.norm1(x))))))


class DenseBlock(nn.Module):
    def __init__(self, layers: int, cin: int, growth: int):
        super().__init__()
        self.layers = nn.ModuleList(DenseLayer(cin + i * growth, growth) for i in range(layers))

    def forward(self, x):
        feats = [x]
        for layer in self.layers:
            feats.append(layer(torch.cat(feats, 1)))
        return torch.cat(feats, 1)


class DenseNet(nn.Module):
    def __init__(self, blocks=(6, 12, 24, 16), growth=32, num_classes=1000):
        super().__init__()
        c = 2 * growth
        self.stem = nn.Sequential(nn.Conv2d(3, c, 7, 2, 3, bias=False), nn.BatchNorm2d(c),
                                  nn.ReLU(), nn.MaxPool2d(3, 2, 1))
        stages = []
        for i, n in enumerate(blocks):
            stages.append(DenseBlock(n, c, growth))
            c += n * growth
            if i < len(blocks) - 1:   # transition: BN-ReLU-Conv1x1 halving channels, avg-pool
                stages += [nn.BatchNorm2d(c), nn.ReLU(), nn.Conv2d(c, c // 2, 1, bias=False),
                           nn.AvgPool2d(2, 2)]
                c //= 2
        self.features = nn.Sequential(*stages)
        self.norm = nn.BatchNorm2d(c)
        self.fc = nn.Linear(c, num_classes)

    def forward(self, x):
        x = F.relu(self.norm(self.features(self.stem(x))))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def build_densenet(batch: int, *, block: int = 4, blocks: int = 4, growth: int = 32,
                   num_classes: int = 1000, image_size: int = 224):
    """DenseNet with ``blocks`` dense blocks of ``block`` layers each (DenseNet-121 has
    6-12-24-16); input ``[batch, 3, image_size, image_size]``."""
    if not 1 <= blocks <= 4:
        raise ValueError(f"densenet: blocks must be 1..4, got {blocks}")
    if block < 1 or growth < 1:
        raise ValueError(f"densenet: block={block} and growth={growth} must be ≥ 1")
    if image_size < 2 ** (blocks + 1):
        raise ValueError(f"densenet: image_size {image_size} too small for {blocks} blocks")
    model = DenseNet((block,) * blocks, growth, num_classes)
    return model, torch.randn(batch, 3, image_size, image_size)

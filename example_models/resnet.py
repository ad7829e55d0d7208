"""ResNet-50 (He, Zhang, Ren & Sun 2016, "Deep Residual Learning for Image
Recognition") and Wide-ResNet (Zagoruyko & Komodakis 2016, "Wide Residual
Networks").

Both use the torchvision bottleneck design, ResNet "v1.5" (stride 2 on the 3x3
conv of a downsampling bottleneck, not on the first 1x1). Wide-ResNet
multiplies the bottleneck's inner width by ``width`` (torchvision's
``wide_resnet50_2`` is depth=50, width=2); ResNet-50 is depth 50, width 1.
Large widths/depths (e.g. WResNet-152 with width 4..10, as in the Tofu paper,
Wang et al. 2019) give models far too big for one device, which is what the
planner is for.
"""

from __future__ import annotations

import torch
from torch import nn

#: Bottleneck blocks per stage for each supported depth.
DEPTH_BLOCKS: dict[int, tuple[int, int, int, int]] = {
    26: (2, 2, 2, 2),          # the smallest bottleneck ResNet (1 + 3 x 8 + 1 layers)
    50: (3, 4, 6, 3),
    101: (3, 4, 23, 3),
    152: (3, 8, 36, 3),
}
MAX_WIDTH = 10


class Bottleneck(nn.Module):
    """1x1 reduce -> 3x3 (stride here, v1.5) -> 1x1 expand (x4), BatchNorm after each,
    residual add then ReLU. ``width`` multiplies the inner (reduced) channel count."""

    expansion = 4

    def __init__(self, inplanes: int, planes: int, stride: int = 1, width: int = 1) -> None:
        super().__init__()
        inner = planes * width
        out = planes * self.expansion
        self.conv1 = nn.Conv2d(inplanes, inner, kernel_size=1, bias=False)
        self.bn1 = nn.BatchNorm2d(inner)
        self.conv2 = nn.Conv2d(inner, inner, kernel_size=3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(inner)
        self.conv3 = nn.Conv2d(inner, out, kernel_size=1, bias=False)
        self.bn3 = nn.BatchNorm2d(out)
        self.relu = nn.ReLU()
        self.downsample = None
        if stride != 1 or inplanes != out:
            self.downsample = nn.Sequential(
                nn.Conv2d(inplanes, out, kernel_size=1, stride=stride, bias=False),
                nn.BatchNorm2d(out),
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        if self.downsample is not None:
            identity = self.downsample(x)
        out = out + identity
        return self.relu(out)


class ResNet(nn.Module):
    """Bottleneck ResNet: 7x7/2 stem + maxpool, 4 stages (64, 128, 256, 512 planes),
    global average pool, fc. ``blocks`` gives the number of bottlenecks per stage."""

    def __init__(self, blocks=(3, 4, 6, 3), width: int = 1, num_classes: int = 1000) -> None:
        super().__init__()
        self.inplanes = 64
        self.conv1 = nn.Conv2d(3, 64, kernel_size=7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU()
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        self.layer1 = self._make_layer(64, blocks[0], stride=1, width=width)
        self.layer2 = self._make_layer(128, blocks[1], stride=2, width=width)
        self.layer3 = self._make_layer(256, blocks[2], stride=2, width=width)
        self.layer4 = self._make_layer(512, blocks[3], stride=2, width=width)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(512 * Bottleneck.expansion, num_classes)

    def _make_layer(self, planes: int, n: int, stride: int, width: int) -> nn.Sequential:
        layers = [Bottleneck(self.inplanes, planes, stride=stride, width=width)]
        self.inplanes = planes * Bottleneck.expansion
        layers += [Bottleneck(self.inplanes, planes, width=width) for _ in range(1, n)]
        return nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer1(x)
        x = self.layer2(x)
        x = self.layer3(x)
        x = self.layer4(x)
        x = self.avgpool(x)
        x = torch.flatten(x, 1)
        return self.fc(x)


def build_wresnet(batch: int, *, depth: int = 50, width: int = 4, num_classes: int = 1000, image_size: int = 224):
    """Wide-ResNet of the given depth/width and an input [batch, 3, image_size, image_size]."""
    if depth not in DEPTH_BLOCKS:
        allowed = "/".join(str(d) for d in DEPTH_BLOCKS)
        raise ValueError(f"wresnet: depth must be one of {allowed}, got {depth}")
    if not 1 <= width <= MAX_WIDTH:
        raise ValueError(f"wresnet: width must be between 1 and {MAX_WIDTH}, got {width}")
    if num_classes < 1:
        raise ValueError(f"wresnet: num_classes must be >= 1, got {num_classes}")
    if image_size < 32:
        raise ValueError(f"wresnet: image_size must be >= 32 (224 is standard), got {image_size}")
    model = ResNet(DEPTH_BLOCKS[depth], width=width, num_classes=num_classes)
    return model, torch.randn(batch, 3, image_size, image_size)


def build_resnet50(batch: int, *, num_classes: int = 1000, image_size: int = 224):
    """ResNet-50 v1.5 (= Wide-ResNet depth 50, width 1) and an input [batch, 3, image_size, image_size]."""
    return build_wresnet(batch, depth=50, width=1, num_classes=num_classes, image_size=image_size)

"""Vision Transformer (Dosovitskiy et al. 2021, "An Image is Worth 16x16 Words"), laid out
as torchvision's ``vit_b_16`` (same parameter names and count at the defaults).

Patch embedding by ``Conv2d(3, hidden, patch, stride=patch)``, flattened to a sequence; a
class-token *parameter* concatenated in front (``torch.cat([class_token.expand(B, -1, -1), x],
1)``) and a learned position-embedding parameter added, both used directly as tensors;
``layers`` pre-LN encoder blocks built on ``nn.MultiheadAttention`` (batch first, as
torchvision's ViT), GELU MLP; final LayerNorm and a Linear head on the class token.  No
dropout (deterministic steps).
"""

from __future__ import annotations

import torch
from torch import nn

from ._check import divisible, positive

EPS = 1e-6  # torchvision's LayerNorm epsilon for ViT


class EncoderBlock(nn.Module):
    """x + MHA(LN(x)), then x + MLP(LN(x))."""

    def __init__(self, hidden: int, heads: int, mlp: int) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(hidden, eps=EPS)
        self.self_attention = nn.MultiheadAttention(hidden, heads, batch_first=True)
        self.ln_2 = nn.LayerNorm(hidden, eps=EPS)
        self.mlp = nn.Sequential(nn.Linear(hidden, mlp), nn.GELU(), nn.Linear(mlp, hidden))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.ln_1(x)
        y, _ = self.self_attention(y, y, y, need_weights=False)
        x = x + y
        return x + self.mlp(self.ln_2(x))


class ViT(nn.Module):
    """Images [batch, 3, image_size, image_size] -> class scores [batch, num_classes]."""

    def __init__(self, image_size: int, patch: int, layers: int, hidden: int, heads: int,
                 mlp: int, num_classes: int) -> None:
        super().__init__()
        tokens = (image_size // patch) ** 2 + 1
        self.conv_proj = nn.Conv2d(3, hidden, kernel_size=patch, stride=patch)
        self.class_token = nn.Parameter(torch.zeros(1, 1, hidden))
        self.pos_embedding = nn.Parameter(torch.empty(1, tokens, hidden).normal_(std=0.02))
        self.layers = nn.ModuleList(EncoderBlock(hidden, heads, mlp) for _ in range(layers))
        self.ln = nn.LayerNorm(hidden, eps=EPS)
        self.head = nn.Linear(hidden, num_classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = self.conv_proj(images).flatten(2).transpose(1, 2)        # [B, patches, hidden]
        x = torch.cat([self.class_token.expand(x.shape[0], -1, -1), x], 1)
        x = x + self.pos_embedding
        for layer in self.layers:
            x = layer(x)
        return self.head(self.ln(x)[:, 0])


def build_vit(batch: int, *, image_size: int = 224, patch: int = 16, layers: int = 12,
              hidden: int = 768, heads: int = 12, mlp: int = 3072, num_classes: int = 1000):
    """ViT (defaults: ViT-B/16) and images [batch, 3, image_size, image_size]."""
    positive("vit", image_size=image_size, patch=patch, layers=layers, hidden=hidden,
             heads=heads, mlp=mlp, num_classes=num_classes)
    divisible("vit", "image_size", image_size, "patch", patch)
    divisible("vit", "hidden", hidden, "heads", heads)
    model = ViT(image_size, patch, layers, hidden, heads, mlp, num_classes)
    return model, torch.randn(batch, 3, image_size, image_size)

"""A tiny model with BatchNorm for the pipeline runs (tests/test_pipeline_run.py)."""

import torch
from torch import nn


def conv_bn():
    """Conv 3 -> 4, BatchNorm, ReLU, then a linear head: ``(model, x)`` at batch 4."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(),
                          nn.Flatten(), nn.Linear(4 * 4 * 4, 5))
    return model, torch.randn(4, 3, 4, 4)

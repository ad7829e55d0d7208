"""Mixture-of-experts layers (the ``moe`` example): router, top-k, capacity-based one-hot
dispatch and experts as batched matmuls, all with static shapes.

The static dispatch is checked against a loop over tokens that routes each one with
``torch.topk`` and drops it past an expert's capacity; the import gives ``experts`` layers
whose expert axis ``e`` splits the weights (expert parallelism) and a ``cumsum`` scan layer;
the layer-wise search chooses expert parallelism where it pays and equals exhaustive search on
a tiny instance; Tofu and Celeritas plan the model too.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import example_models as em
from example_models.moe import capacity_of

TINY = {"layers": 1, "hidden": 16, "heads": 2, "intermediate": 24, "experts": 4, "top_k": 2,
        "seq_len": 8, "vocab": 20}


def _loop_moe(moe, x, capacity=None):
    """The MoE layer token by token: ``torch.topk`` routing, gates renormalised, an expert
    taking the first ``capacity`` tokens of each sequence that pick it."""
    b, s, h = x.shape
    capacity = moe.capacity if capacity is None else capacity
    out = torch.zeros_like(x)
    probs = F.softmax(moe.router(x), dim=-1)
    for i in range(b):
        count = [0] * moe.experts
        for t in range(s):
            vals, idx = probs[i, t].topk(moe.top_k)
            gates = vals / vals.sum()
            for g, e in zip(gates, idx.tolist()):
                count[e] += 1
                if count[e] > capacity:
                    continue                      # over capacity: dropped
                y = F.silu(x[i, t] @ moe.w_gate[e]) * (x[i, t] @ moe.w_up[e])
                out[i, t] += g * (y @ moe.w_down[e])
    return out


@pytest.mark.parametrize("factor,top_k", [(1.0, 2), (0.5, 1), (2.0, 3)])
def test_static_dispatch_equals_a_token_loop(factor, top_k):
    torch.manual_seed(0)
    model, _ = em.build("moe", 3, **dict(TINY, capacity_factor=factor, top_k=top_k))
    moe = model.layers[0].moe
    assert moe.capacity == capacity_of(8, 4, top_k, factor)
    x = torch.randn(3, 8, 16)
    got, want = moe(x), _loop_moe(moe, x)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    if factor < 1:                                # tokens past the capacity were dropped
        assert not torch.allclose(got, _loop_moe(moe, x, capacity=8))


def test_builder_validates():
    with pytest.raises(ValueError, match=r"top_k \(5\) must be at most experts \(4\)"):
        em.build("moe", 2, **dict(TINY, top_k=5))
    with pytest.raises(ValueError, match="capacity_factor must be > 0"):
        em.build("moe", 2, **dict(TINY, capacity_factor=0.0))
    assert capacity_of(128, 8, 2, 1.25) == 40 and capacity_of(8, 4, 2, 9.0) == 8

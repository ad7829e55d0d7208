"""Mixture-of-experts decoder (Mixtral-style blocks, dispatched as GShard and Switch do, with
static shapes): the Llama decoder of :mod:`.llama` whose SwiGLU MLP is replaced by ``experts``
SwiGLU experts behind a router.

Each MoE layer, on hidden states ``x [b, s, h]``:

* **router**: ``probs = softmax(router(x))`` over the experts, ``[b, s, E]``;
* **top-k**: ``top_k − 1`` rounds of "drop the largest remaining probability" (``amax``,
  ``>=``, minus 2) leave the k-th largest as the largest; the probabilities at least that large are
  the 0/1 ``mask [b, s, E]`` (ranked with ties broken by expert index, so exactly ``top_k``); the gates are the chosen probabilities renormalised to sum to
  1 per token (as Mixtral does);
* **capacity**: every expert takes at most ``capacity = ceil(capacity_factor · top_k · s /
  E)`` tokens of each sequence; a routed token's slot in expert ``e``'s queue is the running
  count ``cumsum(mask, dim=1)`` (earlier tokens first), and tokens past the capacity are
  dropped;
* **dispatch / combine**: the one-hot ``dispatch [b, s, E, capacity]`` (slot == 1…capacity)
  and ``combine = dispatch · gate``; the experts' inputs are ``dispatchᵀ @ x``, ``[b, E,
  capacity, h]``;
* **experts**: a batched matmul of that tensor by each expert's weights ``[E, h, f]`` (gate and
  up), SiLU·up, and ``[E, f, h]`` (down): every expert computes ``capacity`` tokens, the
  balanced load times the capacity factor;
* **combine**: ``combine @ expert outputs`` back to ``[b, s, h]``, then the residual.

The routing's slot numbers feed both the dispatch and the combine, so a block's layer graph
is not series-parallel; with that one tensor fixed it is, which is how the layer-wise chain
search reduces the block (exactly, once per candidate of that tensor; it splits only samples,
so it has few).  The combine therefore compares the slots again rather than reading the
dispatch tensor, which would be a second such tensor with many candidates.

Every shape is fixed by the arguments, whatever the router picks (no ``nonzero``, ``histc``
or index lists), so the model traces and every device's share of the experts is known ahead.
Routing happens per sequence (a sequence is GShard's *group*), so splitting the samples never
moves a token's slot.  Comparisons are turned into 0.0/1.0 with ``torch.where`` at once (buffers in
the input's precision), so every tensor between layers is floating point (no boolean tensor
crosses from one layer to another).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ._check import divisible, positive
from .llama import Attention, RMSNorm


class MoE(nn.Module):
    """Router, top-k dispatch with a capacity per expert, experts as batched matmuls."""

    def __init__(self, hidden: int, intermediate: int, experts: int, top_k: int,
                 capacity: int) -> None:
        super().__init__()
        self.experts, self.top_k, self.capacity = experts, top_k, capacity
        self.router = nn.Linear(hidden, experts, bias=False)
        scale_in, scale_mid = hidden ** -0.5, intermediate ** -0.5
        self.w_gate = nn.Parameter(torch.randn(experts, hidden, intermediate) * scale_in)
        self.w_up = nn.Parameter(torch.randn(experts, hidden, intermediate) * scale_in)
        self.w_down = nn.Parameter(torch.randn(experts, intermediate, hidden) * scale_mid)
        # slot numbers 1..capacity of an expert's queue (a token's running count)
        self.register_buffer("slots", torch.arange(1, capacity + 1, dtype=torch.float32),
                             persistent=False)
        # 1.0 and 0.0 as buffers, so ``model.to(dtype)`` converts them: comparisons become
        # 0.0/1.0 in the model's precision with the same operators in float32 and float64
        self.register_buffer("one", torch.ones(()), persistent=False)
        self.register_buffer("zero", torch.zeros(()), persistent=False)
        # ties broken by expert index, as top-k does: expert j's probability counts
        # j · 1e-7 less when ranking (never for the gates), so exactly top_k are chosen even
        # when probabilities are equal (a router that starts at zero gives all experts 1/E)
        self.register_buffer("tiebreak", -1e-7 * torch.arange(experts, dtype=torch.float32),
                             persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape[0], x.shape[1], x.shape[2]
        e, cap = self.experts, self.capacity
        probs = F.softmax(self.router(x), dim=-1)                        # [b, s, E]
        one, zero = self.one, self.zero      # in the model's precision (no conversion op)
        rank = probs + self.tiebreak                                    # no two equal
        rest = rank
        for _ in range(self.top_k - 1):                                 # drop the largest
            top = torch.where(rest >= rest.amax(dim=-1, keepdim=True), one, zero)
            rest = rest - 2.0 * top
        kth = rest.amax(dim=-1, keepdim=True)                           # k-th largest
        mask = torch.where(rank >= kth, one, zero)                      # the top k
        gates = probs * mask
        gates = gates / gates.sum(dim=-1, keepdim=True)                 # renormalised top-k
        slot = torch.cumsum(mask, dim=1) * mask          # 1-based queue position, 0: not routed
        dispatch = torch.where(slot.unsqueeze(-1) == self.slots, one, zero)
        # the combine compares the slots again instead of reading ``dispatch``: then the
        # slot numbers are the one tensor both read (see the module docstring)
        combine = torch.where(slot.unsqueeze(-1) == self.slots, one, zero) \
            * gates.unsqueeze(-1)
        xe = torch.matmul(dispatch.reshape(b, s, e * cap).transpose(1, 2), x)
        xe = xe.reshape(b, e, cap, h)                                   # experts' inputs
        act = F.silu(torch.matmul(xe, self.w_gate)) * torch.matmul(xe, self.w_up)
        ye = torch.matmul(act, self.w_down)                             # [b, E, cap, h]
        return torch.matmul(combine.reshape(b, s, e * cap), ye.reshape(b, e * cap, h))


class Block(nn.Module):
    """Pre-norm decoder block: x + Attn(RMSNorm(x)), then x + MoE(RMSNorm(x))."""

    def __init__(self, hidden: int, heads: int, kv_heads: int, intermediate: int, experts: int,
                 top_k: int, capacity: int) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(hidden)
        self.self_attn = Attention(hidden, heads, kv_heads)
        self.post_attention_layernorm = RMSNorm(hidden)
        self.moe = MoE(hidden, intermediate, experts, top_k, capacity)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.moe(self.post_attention_layernorm(x))


class MoEDecoder(nn.Module):
    """Token ids [batch, seq_len] -> next-token scores [batch, seq_len, vocab]."""

    def __init__(self, layers: int, hidden: int, heads: int, kv_heads: int, intermediate: int,
                 experts: int, top_k: int, capacity: int, seq_len: int, vocab: int,
                 rope_theta: float) -> None:
        super().__init__()
        head_dim = hidden // heads
        inv_freq = 1.0 / rope_theta ** (torch.arange(0, head_dim, 2).float() / head_dim)
        angles = torch.outer(torch.arange(seq_len).float(), inv_freq)
        angles = torch.cat((angles, angles), dim=-1)
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)
        self.embed_tokens = nn.Embedding(vocab, hidden)
        self.layers = nn.ModuleList(Block(hidden, heads, kv_heads, intermediate, experts, top_k,
                                          capacity) for _ in range(layers))
        self.norm = RMSNorm(hidden)
        self.lm_head = nn.Linear(hidden, vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed_tokens(tokens)
        for layer in self.layers:
            x = layer(x, self.cos, self.sin)
        return self.lm_head(self.norm(x))


def capacity_of(seq_len: int, experts: int, top_k: int, capacity_factor: float) -> int:
    """Tokens each expert takes per sequence: ``ceil(capacity_factor · top_k · seq_len /
    experts)``, at most ``seq_len`` (a token picks an expert once)."""
    return min(seq_len, max(1, math.ceil(capacity_factor * top_k * seq_len / experts)))


def build_moe(batch: int, *, layers: int = 4, hidden: int = 512, heads: int = 8,
              kv_heads: int = 0, intermediate: int = 1024, experts: int = 8, top_k: int = 2,
              capacity_factor: float = 1.25, seq_len: int = 128, vocab: int = 32000,
              rope_theta: float = 10000.0):
    """MoE decoder and token ids [batch, seq_len] in [0, vocab); kv_heads=0 means kv_heads =
    heads; ``top_k`` experts per token out of ``experts``, each taking
    :func:`capacity_of` tokens per sequence."""
    kv_heads = kv_heads or heads
    positive("moe", layers=layers, hidden=hidden, heads=heads, kv_heads=kv_heads,
             intermediate=intermediate, experts=experts, top_k=top_k,
             capacity_factor=capacity_factor, seq_len=seq_len, vocab=vocab,
             rope_theta=rope_theta)
    if top_k > experts:
        raise ValueError(f"moe: top_k ({top_k}) must be at most experts ({experts})")
    divisible("moe", "hidden", hidden, "heads", heads)
    divisible("moe", "heads", heads, "kv_heads", kv_heads)
    divisible("moe", "head dim hidden/heads", hidden // heads, "2 (rotary pairs)", 2)
    model = MoEDecoder(layers, hidden, heads, kv_heads, intermediate, experts, top_k,
                       capacity_of(seq_len, experts, top_k, capacity_factor), seq_len, vocab,
                       rope_theta)
    return model, torch.randint(0, vocab, (batch, seq_len))

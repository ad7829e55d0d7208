"""Tiny versions of the models people train today, for the operator-level tests (Tofu's
descriptions, its runtime, Celeritas and METIS): each function returns ``(module, input)``
and is also a ``file.py:function`` model spec.  Hugging Face models are built from their
config classes (no weights downloaded) and wrapped to return a tensor.

Every model is built on the CPU even inside the importer's meta-device build: some make
CPU tensors inside ``forward`` (``torch.ones`` masks, a Hugging Face cache or position ids),
which do not mix with meta parameters.  (Attention no longer needs it: every trace takes
``scaled_dot_product_attention``'s math path, :func:`explorer.engine.core.opgraph.trace_step`.)"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def _on_cpu(build):
    """``build`` run under ``torch.device("cpu")`` (see the module docstring)."""
    import functools

    @functools.wraps(build)
    def wrapped(*args, **kwargs):
        with torch.device("cpu"):
            return build(*args, **kwargs)
    return wrapped


class HFLogits(nn.Module):
    """A Hugging Face model returning ``out.<attr>`` (a tensor, not a ModelOutput)."""

    def __init__(self, model, attr="logits"):
        super().__init__()
        self.m, self.attr = model, attr

    def forward(self, ids):
        return getattr(self.m(ids), self.attr)


@_on_cpu
def gpt2(dropout: float = 0.1, cache: bool = True):
    """``cache=True`` (the config's default) concatenates an empty key/value cache constant;
    the eager attention (bmm, causal mask by tril/where) is what a meta-device build picks."""
    from transformers import GPT2Config, GPT2LMHeadModel
    cfg = GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=64, n_positions=16,
                     resid_pdrop=dropout, embd_pdrop=dropout, attn_pdrop=dropout,
                     use_cache=cache, attn_implementation="eager")
    return HFLogits(GPT2LMHeadModel(cfg)), torch.randint(0, 64, (2, 8))


@_on_cpu
def bert():
    from transformers import BertConfig, BertModel
    cfg = BertConfig(num_hidden_layers=1, hidden_size=32, num_attention_heads=4,
                     intermediate_size=64, vocab_size=64, max_position_embeddings=16)
    return HFLogits(BertModel(cfg), "last_hidden_state"), torch.randint(0, 64, (2, 8))


@_on_cpu
def llama():
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(num_hidden_layers=1, hidden_size=32, num_attention_heads=4,
                      num_key_value_heads=2, intermediate_size=64, vocab_size=64,
                      max_position_embeddings=16)
    return HFLogits(LlamaForCausalLM(cfg)), torch.randint(0, 64, (2, 8))


class ViT(nn.Module):
    """Patch embedding, a class token concatenated to the patches, learned positions,
    pre-norm blocks with ``nn.MultiheadAttention`` and a GELU MLP."""

    def __init__(self, image=8, patch=4, dim=16, heads=2, depth=1, classes=5):
        super().__init__()
        self.patch = nn.Conv2d(3, dim, patch, patch)
        self.cls = nn.Parameter(torch.randn(1, 1, dim) * 0.02)
        self.pos = nn.Parameter(torch.randn(1, (image // patch) ** 2 + 1, dim) * 0.02)
        self.blocks = nn.ModuleList(nn.ModuleDict(dict(
            ln1=nn.LayerNorm(dim), attn=nn.MultiheadAttention(dim, heads, batch_first=True),
            ln2=nn.LayerNorm(dim), mlp=nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(),
                                                     nn.Linear(2 * dim, dim))))
            for _ in range(depth))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, classes)

    def forward(self, x):
        x = self.patch(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], 1) + self.pos
        for b in self.blocks:
            h = b["ln1"](x)
            x = x + b["attn"](h, h, h, need_weights=False)[0]
            x = x + b["mlp"](b["ln2"](x))
        return self.head(self.norm(x[:, 0]))


@_on_cpu
def vit():
    return ViT(), torch.randn(2, 3, 8, 8)


class MobileNetV2Block(nn.Module):
    """A stem and one inverted residual: 1x1 expansion, 3x3 depthwise, 1x1 projection, BN
    and ReLU6."""

    def __init__(self, c=4, t=2):
        super().__init__()
        h = c * t
        self.stem = nn.Sequential(nn.Conv2d(3, c, 3, 2, 1, bias=False), nn.BatchNorm2d(c),
                                  nn.ReLU6())
        self.block = nn.Sequential(
            nn.Conv2d(c, h, 1, bias=False), nn.BatchNorm2d(h), nn.ReLU6(inplace=True),
            nn.Conv2d(h, h, 3, 1, 1, groups=h, bias=False), nn.BatchNorm2d(h),
            nn.ReLU6(inplace=True), nn.Conv2d(h, c, 1, bias=False), nn.BatchNorm2d(c))
        self.head = nn.Linear(c, 5)

    def forward(self, x):
        x = self.stem(x)
        x = x + self.block(x)
        return self.head(F.adaptive_avg_pool2d(x, 1).flatten(1))


@_on_cpu
def mobilenet_v2():
    return MobileNetV2Block(), torch.randn(2, 3, 8, 8)


class UNet(nn.Module):
    """One level down (max pool) and up (a stride-2 ``ConvTranspose2d``), a skip concat."""

    def __init__(self, c=4):
        super().__init__()
        self.down = nn.Sequential(nn.Conv2d(3, c, 3, padding=1), nn.ReLU())
        self.mid = nn.Sequential(nn.MaxPool2d(2), nn.Conv2d(c, 2 * c, 3, padding=1), nn.ReLU())
        self.up = nn.ConvTranspose2d(2 * c, c, 3, stride=2, padding=1, output_padding=1)
        self.out = nn.Conv2d(2 * c, 2, 1)

    def forward(self, x):
        a = self.down(x)
        return self.out(torch.cat([a, self.up(self.mid(a))], 1))


@_on_cpu
def unet():
    return UNet(), torch.randn(2, 3, 8, 8)


class Zoo(nn.Module):
    """The indexing, scan and masking ops the models above reach only in some versions:
    gather, index_select, advanced indexing by a buffer, cumsum, tril, masked_fill, baddbmm,
    slice/select scatters and attention with a mask (their gradients: scatter_add,
    index_add / index_put, flip...)."""

    def __init__(self, vocab=12, dim=8):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.proj = nn.Linear(dim, dim)
        self.register_buffer("pick", torch.tensor([3, 0, 2, 1]))

    def forward(self, ids):
        h = self.proj(self.emb(ids))                                   # [B, T, D]
        T = h.shape[1]
        c = torch.cumsum(h, 1)
        g = torch.gather(c, 1, (ids % T)[..., None].expand(-1, -1, h.shape[2]))
        s = torch.index_select(g, 1, self.pick) + h[:, self.pick]      # [B, 4, D]
        a = torch.baddbmm(s.new_ones(1, 4, 4), s, s.transpose(1, 2))   # [B, 4, 4]
        a = a.masked_fill(torch.ones(4, 4, dtype=torch.bool).triu(1), float("-inf"))
        att = torch.softmax(a, -1) @ s
        m = torch.tril(torch.ones(4, 4)).bool()
        q = s.view(s.shape[0], 1, 4, -1)
        o = F.scaled_dot_product_attention(q, q, q, attn_mask=m).flatten(1, 2)
        z = torch.slice_scatter(o, att[:, 1:3], 1, 1, 3)
        z = torch.select_scatter(z, att[:, 0], 1, 0)
        return z


@_on_cpu
def zoo():
    return Zoo(), torch.randint(0, 12, (2, 6))

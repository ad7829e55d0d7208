"""Live memory of one layer-wise step, by category, counted per storage (CPU and CUDA alike).

A worker's step holds parameter shards, their gradients, activations (layer outputs, the
fetched input regions and their gradients, what autograd saved for the backward pass) and,
briefly, transients (a ZeRO-3 layer's gathered weights, a recomputed layer's recomputed
tensors).  :class:`MemoryMeter` samples, at fixed points of a step (after each layer's
forward, around each layer's backward), the bytes of every distinct storage the executor
and autograd hold, and keeps each category's largest value and the largest total: the
measured side of the plan's ``memory_by_category``.  Autograd's saved tensors are seen
through :func:`torch.autograd.graph.saved_tensors_hooks` (weak references: a tensor is
counted until autograd frees it).  A storage is counted once, in the first category that
holds it (parameters, gradients, transient, activations): a weight's transposed view saved
by a matmul is a parameter, an output viewed by its consumer's region one activation.

CPU allocators keep no peak, so this is the count on every device; it is the tensors'
bytes, not the allocator's pages (no fragmentation, no workspace of a kernel in flight).
"""

from __future__ import annotations

import weakref

import torch

#: the sample taken when the forward pass and the loss are done (what training keeps for the
#: backward pass: activation checkpointing's measure)
FORWARD_END = "end of the forward pass"
#: categories measured, in the order the report gives them (the plan's, and ``transient``)
CATEGORIES = ("params", "grads", "optimizer", "activations", "transient")


class MemoryMeter:
    """Samples of one step's live bytes by category (module docstring)."""

    def __init__(self):
        self._saved: list = []           # (weakref to a saved tensor, category)
        self.kind = "activations"        # what autograd saves now: activations or transient
        self.peak = dict.fromkeys(CATEGORIES, 0)
        self.peak_total = 0
        self.at_peak = dict.fromkeys(CATEGORIES, 0)
        self.where = ""
        self.samples: dict = {}          # where -> categories (the last sample there)

    def hooks(self):
        """The context in which autograd's saved tensors are recorded."""
        return torch.autograd.graph.saved_tensors_hooks(self._pack, _unpack)

    def _pack(self, t):
        d = t.detach()                   # no reference to the graph: no cycle through it
        self._saved.append((weakref.ref(d), self.kind))
        return d

    def saved(self) -> list:
        """``[(tensor, category)]`` autograd still holds."""
        live = [(r(), k) for r, k in self._saved]
        self._saved = [(r, k) for (r, k), (t, _) in zip(self._saved, live) if t is not None]
        return [(t, k) for t, k in live if t is not None]

    def sample(self, where: str, groups: dict, skip=(), sized: dict | None = None) -> None:
        """One sample: ``groups`` maps a category to an iterable of tensors (``None`` and
        non-tensors skipped), counted in the order params, grads, activations, transient,
        optimizer; then autograd's saved tensors under the category they were saved in.
        ``skip``: tensors whose storages are not counted (and views of them);
        ``sized``: bytes added to a category as they are."""
        # Outside any torch-function mode (the run's ``deterministic`` context would see
        # every storage query): a sample looks at every live tensor, at every layer.
        with torch._C.DisableTorchFunction():
            seen = {_key(t) for t in skip if isinstance(t, torch.Tensor)}
            got = dict.fromkeys(CATEGORIES, 0)
            for cat, n in (sized or {}).items():
                got[cat] += int(n)
            saved = [(k, t) for t, k in self.saved()]
            order = [(cat, t) for cat in ("params", "grads", "activations", "transient",
                                          "optimizer") for t in groups.get(cat, ())]
            for cat, t in order + saved:
                if not isinstance(t, torch.Tensor):
                    continue
                storage = t.untyped_storage()
                n = storage.nbytes()
                key = (storage.data_ptr(), t.device)
                if n == 0 or key in seen:
                    continue
                seen.add(key)
                got[cat] += n
        self.samples[where] = got
        for cat, v in got.items():
            self.peak[cat] = max(self.peak[cat], v)
        total = sum(got.values())
        if total > self.peak_total:
            self.peak_total, self.at_peak, self.where = total, got, where

    def result(self) -> dict:
        """Each category's largest value, ``peak`` (the largest total), ``at_peak`` (the
        categories then), where in the step it was, and ``forward_end`` (the categories
        at :data:`FORWARD_END`)."""
        end = self.samples.get(FORWARD_END, {})
        return {**{k: int(v) for k, v in self.peak.items()}, "peak": int(self.peak_total),
                "at_peak": {k: int(v) for k, v in self.at_peak.items()}, "where": self.where,
                "forward_end": {k: int(v) for k, v in end.items()}}


def _unpack(t):
    return t


def _key(t) -> tuple:
    """A storage's identity: where its data lives."""
    return (t.untyped_storage().data_ptr(), t.device)

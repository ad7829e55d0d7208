"""Clocks and memory readings that mean the same on CPU and CUDA workers.

CUDA kernels run asynchronously: a host clock read right after a launch measures the launch,
not the kernel.  On a CUDA device :func:`clock` synchronises the device before it reads the
clock, so the time between two readings covers the work queued between them (the
synchronise-bracketed clock); :class:`EventTimer` times with CUDA events where the host
should not wait.  Peak memory on CUDA is the caching allocator's
``torch.cuda.max_memory_allocated`` (:func:`peak_allocated`); CPU workers have no allocator
hook (``None``: the executors count their live tensor bytes themselves).
"""

from __future__ import annotations

import time

import torch

__all__ = ["is_cuda", "synchronize", "clock", "reset_peak", "peak_allocated", "EventTimer"]


def is_cuda(device) -> bool:
    return torch.device(device).type == "cuda"


def synchronize(device) -> None:
    """Wait for every kernel queued on ``device`` (nothing to wait for on CPU)."""
    if is_cuda(device):
        torch.cuda.synchronize(torch.device(device))


def clock(device):
    """A ``perf_counter``-like function for ``device``: on CUDA it synchronises first."""
    if not is_cuda(device):
        return time.perf_counter
    dev = torch.device(device)

    def synced() -> float:
        torch.cuda.synchronize(dev)
        return time.perf_counter()
    return synced


def reset_peak(device) -> None:
    """Start a new peak of allocated memory (CUDA; nothing on CPU)."""
    if is_cuda(device):
        torch.cuda.reset_peak_memory_stats(torch.device(device))


def peak_allocated(device) -> int | None:
    """Bytes: the most the caching allocator held for tensors on ``device`` since the last
    :func:`reset_peak` (``torch.cuda.max_memory_allocated``); ``None`` on CPU."""
    if is_cuda(device):
        return int(torch.cuda.max_memory_allocated(torch.device(device)))
    return None


class EventTimer:
    """Seconds between :meth:`start` and :meth:`stop` of the work queued on ``device`` (CUDA
    events, read once at :meth:`seconds`; the host clock on CPU)."""

    def __init__(self, device):
        self.cuda = is_cuda(device)
        self.device = torch.device(device)
        self._t0 = self._t1 = None

    def start(self) -> None:
        if self.cuda:
            self._t0 = torch.cuda.Event(enable_timing=True)
            self._t1 = torch.cuda.Event(enable_timing=True)
            self._t0.record()
        else:
            self._t0 = time.perf_counter()

    def stop(self) -> None:
        if self.cuda:
            self._t1.record()
        else:
            self._t1 = time.perf_counter()

    def seconds(self) -> float:
        if self.cuda:
            self._t1.synchronize()
            return self._t0.elapsed_time(self._t1) / 1e3
        return float(self._t1 - self._t0)

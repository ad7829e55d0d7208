"""The executors' point-to-point transfers and collectives, staged through host memory when
the workers compute on CUDA but talk over gloo (workers sharing a GPU: NCCL refuses two ranks
on one GPU, and gloo cannot send CUDA tensors).

:func:`set_staged` is called once per worker by :func:`.worker.join_group`
(:attr:`.devicemap.WorkerMap.staged`).  Unstaged (CPU workers, or NCCL), every call is the
``torch.distributed`` call itself.  Staged, a CUDA tensor is copied to a host buffer before it
is sent or reduced, and a receive lands in a host buffer that ``wait()`` copies into the CUDA
buffer the caller gave - so callers keep one code path: post ``irecv(buf)``, ``wait()``, read
``buf``.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

__all__ = ["set_staged", "staged", "isend", "irecv", "all_reduce", "reduce_scatter"]

_STAGED = [False]


def set_staged(flag: bool) -> None:
    """Stage this process's CUDA tensors through host memory (gloo between CUDA workers)."""
    _STAGED[0] = bool(flag)


def staged() -> bool:
    return _STAGED[0]


def _needs_host(t: torch.Tensor) -> bool:
    return _STAGED[0] and t.device.type != "cpu"


class StagedWork:
    """A transfer through a host buffer: ``wait()`` waits for it and, for a receive, copies
    the host buffer into the device buffer it stands for."""

    def __init__(self, work, host: torch.Tensor, target: torch.Tensor | None = None):
        self.work, self.host, self.target = work, host, target
        self._done = False

    def wait(self, timeout=None):
        if timeout is None:
            self.work.wait()
        else:
            self.work.wait(timeout)
        if self.target is not None and not self._done:
            self.target.copy_(self.host)
        self._done = True
        return True

    def is_completed(self) -> bool:
        return self._done or bool(self.work.is_completed())


def isend(t: torch.Tensor, dst: int, tag: int = 0, group=None):
    """``dist.isend``; staged: a host copy of ``t`` is sent (kept alive by the work)."""
    if _needs_host(t):
        host = t.detach().to("cpu")
        return StagedWork(dist.isend(host, dst, group=group, tag=tag), host)
    return dist.isend(t, dst, group=group, tag=tag)


def irecv(buf: torch.Tensor, src: int, tag: int = 0, group=None):
    """``dist.irecv`` into ``buf``; staged: into a host buffer copied to ``buf`` by ``wait()``."""
    if _needs_host(buf):
        host = torch.empty(buf.shape, dtype=buf.dtype, device="cpu")
        return StagedWork(dist.irecv(host, src, group=group, tag=tag), host, buf)
    return dist.irecv(buf, src, group=group, tag=tag)


def all_reduce(t: torch.Tensor, group=None, op=None) -> torch.Tensor:
    """``dist.all_reduce`` of ``t`` in place (sum by default); staged: through a host copy."""
    op = dist.ReduceOp.SUM if op is None else op
    if _needs_host(t):
        host = t.detach().to("cpu")
        dist.all_reduce(host, op=op, group=group)
        t.copy_(host)
        return t
    dist.all_reduce(t, op=op, group=group)
    return t


def reduce_scatter(out: torch.Tensor, inp: torch.Tensor, group=None) -> torch.Tensor:
    """Sum ``inp`` over the group and keep this rank's slice (dim 0) in ``out``; staged:
    through host copies."""
    rs = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    if _needs_host(out) or _needs_host(inp):
        h_out = torch.empty(out.shape, dtype=out.dtype, device="cpu")
        rs(h_out, inp.detach().to("cpu"), group=group)
        out.copy_(h_out)
        return out
    rs(out, inp, group=group)
    return out

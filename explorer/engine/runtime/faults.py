"""Injected faults, the runtime's test hook: ``EXPLORER_RUNTIME_FAULT=RANK:STEP[:MODE]`` (or a
run's ``fault`` option) makes that rank raise, exit, hang or allocate at that step, so the
launcher's handling of dead, stuck and over-budget workers is tested on every executor."""

from __future__ import annotations

import os
import time

import torch

__all__ = ["FAULT_ENV", "WorkerError", "parse_fault", "inject_fault"]

FAULT_ENV = "EXPLORER_RUNTIME_FAULT"


class WorkerError(RuntimeError):
    """A failure inside a worker, with where it happened."""


def parse_fault(text: str | None):
    """``"RANK:STEP[:MODE]"`` (MODE ``raise`` (default), ``exit``, ``hang`` or ``alloc``: 256 MiB
    more, for the memory limit) or ``None``."""
    if not text:
        return None
    parts = str(text).split(":")
    try:
        rank, step = int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        raise ValueError(f"fault spec {text!r}: write RANK:STEP[:raise|exit|hang|alloc]") \
            from None
    mode = parts[2] if len(parts) > 2 else "raise"
    if mode not in ("raise", "exit", "hang", "alloc"):
        raise ValueError(f"fault mode {mode!r}: use raise, exit, hang or alloc")
    return rank, step, mode


def inject_fault(fault, rank: int, step: int, where: str) -> None:
    """Test hook: act out ``fault`` = ``(rank, step, mode)`` (:func:`parse_fault`)
    when this is that rank and step - raise, exit with code 3, hang, or allocate (and touch)
    256 MiB more, 16 MiB at a time, for a moment (a step over ``--memory-per-worker``)."""
    if fault is None or fault[0] != rank or fault[1] != step:
        return
    if fault[2] == "alloc":
        extra = []
        for _ in range(16):
            extra.append(torch.ones(2 * 1024 ** 2, dtype=torch.float64))
            time.sleep(0.02)           # the memory guard looks every few milliseconds
        del extra
        return
    if fault[2] == "exit":
        os._exit(3)
    if fault[2] == "hang":
        time.sleep(10 ** 6)
    raise WorkerError(f"injected fault on rank {rank} at step {step} ({where})")

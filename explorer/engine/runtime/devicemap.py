"""Which device and which ``torch.distributed`` backend each local worker gets.

One pure function, :func:`map_workers`, decides it from the worker count ``n``, the GPU count
``G`` and what was asked for (device kind, backend, GPUs to use):

=================  ===========  ====================  ===============================
machine / request  backend      rank ``r`` computes on  note
=================  ===========  ====================  ===============================
``G = 0`` or cpu   gloo         ``cpu``
``n ≤ G``          NCCL         ``cuda:r``            one GPU per worker
``n > G ≥ 1``      gloo         ``cuda:(r mod G)``    workers share GPUs (``shared``):
                                                      host-staged transfers; timing
                                                      shared, not a prediction target
=================  ===========  ====================  ===============================

``backend="gloo"`` with a GPU per worker is allowed (host-staged transfers, ``staged``).
Refused with :class:`~explorer.engine.core.devices.DeviceRequestError` (one line, exit 2):
NCCL without GPUs, NCCL with fewer GPUs than workers (NCCL refuses two ranks on one GPU),
CUDA workers without a GPU, more GPUs asked for than exist, an unknown backend or kind.

:func:`local_map` is the same for this machine (``$EXPLORER_DEVICE``, ``$EXPLORER_GPUS``,
torch's GPU count); :func:`torchrun_device` places one rank started by ``torchrun``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from explorer.engine.core.devices import (GPUS_ENV, DeviceRequestError, gpu_count,
                                          worker_device_kind)

__all__ = ["WorkerMap", "map_workers", "local_map", "torchrun_device", "requested",
           "DeviceRequestError",
           "GPUS_ENV", "BACKEND_ENV", "BACKENDS", "SHARED_NOTE"]

#: the backend local workers use when the caller leaves it at ``auto`` (``explorer run
#: --backend``)
BACKEND_ENV = "EXPLORER_BACKEND"
BACKENDS = ("auto", "gloo", "nccl")
#: what a run whose workers share GPUs says about its times
SHARED_NOTE = ("{n} workers share {g} GPU{s} (gloo, host-staged transfers): the timing is "
               "shared, not a prediction target")


@dataclass(frozen=True)
class WorkerMap:
    """Where ``workers`` local processes compute: ``backend`` (``gloo`` / ``nccl``),
    ``devices[rank]`` (``"cpu"`` or ``"cuda:i"``), ``gpus`` (GPUs used, 0 on CPU) and
    ``shared`` (several workers on one GPU: their timing is not a prediction target)."""

    workers: int
    backend: str
    devices: tuple
    gpus: int = 0
    shared: bool = False

    @property
    def kind(self) -> str:
        """``"cuda"`` or ``"cpu"``."""
        return "cuda" if self.gpus else "cpu"

    @property
    def staged(self) -> bool:
        """gloo between CUDA workers: point-to-point transfers and collectives go through host
        memory (gloo cannot send CUDA tensors)."""
        return self.backend == "gloo" and self.kind == "cuda"

    def device(self, rank: int) -> str:
        return self.devices[rank]

    @property
    def note(self) -> str | None:
        """The one line a shared run reports (None otherwise)."""
        if not self.shared:
            return None
        return SHARED_NOTE.format(n=self.workers, g=self.gpus, s="" if self.gpus == 1 else "s")

    def describe(self) -> dict:
        """What a run result reports about its workers' devices."""
        return {"backend": self.backend, "worker_devices": list(self.devices),
                "device_kind": self.kind, "gpus_used": self.gpus, "shared": self.shared,
                "staged_transfers": self.staged, "timing_note": self.note}


def map_workers(n: int, gpus: int, *, backend: str = "auto", kind: str = "auto",
                use_gpus: int | None = None) -> WorkerMap:
    """``n`` workers on a machine with ``gpus`` CUDA GPUs (see the module's table).

    ``kind``: ``auto`` (CUDA when there is a GPU), ``cpu`` or ``cuda``; ``backend``: ``auto``,
    ``gloo`` or ``nccl``; ``use_gpus``: how many of the GPUs to use (default all; more than
    there are is refused).  Pure: reads no environment and no device."""
    try:
        n = int(n)
    except (TypeError, ValueError):
        raise DeviceRequestError(f"worker count {n!r} is not a number") from None
    if n < 1:
        raise DeviceRequestError(f"a run needs at least one worker, not {n}")
    gpus = max(0, int(gpus))
    b = str(backend).strip().lower()
    if b not in BACKENDS:
        raise DeviceRequestError(f"backend {backend!r}: use auto, gloo or nccl")
    k = worker_device_kind(str(kind), gpus)
    if use_gpus is not None:
        try:
            use = int(use_gpus)
        except (TypeError, ValueError):
            raise DeviceRequestError(f"--gpus {use_gpus!r} is not a number") from None
        if use < 1:
            raise DeviceRequestError(f"--gpus must be ≥ 1, got {use}")
        if use > gpus:
            raise DeviceRequestError(f"{use} GPUs asked for, this machine has {gpus}"
                                     + ("" if gpus else ": use --device cpu"))
        if k == "cpu":
            raise DeviceRequestError(f"--gpus {use} with CPU workers: drop --gpus or use "
                                     f"--device cuda")
        gpus = use
    if k == "cpu":
        if b == "nccl":
            raise DeviceRequestError("NCCL needs CUDA GPUs" + (
                ": this machine has none" if gpus == 0 else ", and CPU workers were asked for")
                + "; use --backend gloo")
        return WorkerMap(n, "gloo", ("cpu",) * n, 0, False)
    if n <= gpus:
        return WorkerMap(n, "nccl" if b == "auto" else b,
                         tuple(f"cuda:{r}" for r in range(n)), n, False)
    if b == "nccl":
        raise DeviceRequestError(f"NCCL needs a GPU per worker: {n} workers, {gpus} GPU"
                                 f"{'' if gpus == 1 else 's'} (NCCL refuses two ranks on one "
                                 f"GPU); use --backend gloo or auto")
    return WorkerMap(n, "gloo", tuple(f"cuda:{r % gpus}" for r in range(n)), gpus, True)


def local_map(n: int, *, backend: str = "auto", kind: str | None = None,
              use_gpus: int | None = None) -> WorkerMap:
    """:func:`map_workers` on this machine: ``kind`` defaults to ``$EXPLORER_DEVICE``
    (``auto``), ``use_gpus`` to ``$EXPLORER_GPUS`` (all), ``backend="auto"`` to
    ``$EXPLORER_BACKEND`` (``auto``)."""
    k = worker_device_kind(kind)       # reads $EXPLORER_DEVICE when kind is None
    if use_gpus is None and os.environ.get(GPUS_ENV) and k == "cuda":
        use_gpus = os.environ[GPUS_ENV]
    if backend == "auto" and os.environ.get(BACKEND_ENV):
        backend = os.environ[BACKEND_ENV]
    return map_workers(n, gpu_count() if k == "cuda" else 0, backend=backend, kind=k,
                       use_gpus=use_gpus)


def torchrun_device(local_rank: int, local_world: int, gpus: int, *,
                    backend: str = "auto", kind: str = "auto") -> tuple:
    """``(backend, device)`` of one rank started by ``torchrun``: this node's
    ``local_world`` processes mapped onto its ``gpus`` GPUs as :func:`map_workers` maps local
    workers (every node maps the same way, so the backend agrees across nodes when they have
    the same GPUs)."""
    m = map_workers(max(1, int(local_world)), gpus, backend=backend, kind=kind)
    return m.backend, m.device(int(local_rank) % m.workers)


class requested:
    """Context: the local workers of what runs inside use ``device`` (``cpu`` / ``cuda`` /
    ``auto``), ``backend`` and ``gpus`` GPUs (``None``: leave as is) - ``explorer run
    --device/--backend/--gpus``.  Set as ``$EXPLORER_DEVICE`` / ``$EXPLORER_BACKEND`` /
    ``$EXPLORER_GPUS`` for the duration (the launcher, ``local`` and the workers read them),
    checked first: an impossible request is a :class:`DeviceRequestError` before anything
    starts."""

    def __init__(self, device: str | None = None, backend: str | None = None,
                 gpus: int | None = None):
        from explorer.engine.core.devices import DEVICE_ENV
        self.env = {}
        if device is not None:
            worker_device_kind(str(device))            # refuses cuda without a GPU, typos
            self.env[DEVICE_ENV] = str(device)
        if backend is not None:
            if str(backend) not in BACKENDS:
                raise DeviceRequestError(f"backend {backend!r}: use auto, gloo or nccl")
            self.env[BACKEND_ENV] = str(backend)
        if gpus is not None:
            k = worker_device_kind(None if device is None else str(device))
            map_workers(1, gpu_count() if k == "cuda" else 0, kind=k, use_gpus=gpus)
            self.env[GPUS_ENV] = str(int(gpus))
        self.saved: dict = {}

    def __enter__(self):
        for k, v in self.env.items():
            self.saved[k] = os.environ.get(k)
            os.environ[k] = v
        return self

    def __exit__(self, *exc):
        for k, v in self.saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        return False

"""Device graphs (paper Section 4): devices with their speed and memory, links with bandwidth.

Presets reproduce the papers' hardware from the vendors' published figures:

* ``p100-cluster`` (default): 4-GPU P100 (SXM2) nodes, NVLink inside a node, 100 Gb/s EDR
  InfiniBand between nodes; as many nodes as the device count needs (OptCNN Section 6).
* ``p100-nvlink-4``: one such node.  ``p100-ib-16``: 16 P100s on 4 nodes.
* ``k80-pcie-8``: 8 K80 GPUs (GK210 dies) on PCIe, 21 GB/s peer to peer (Tofu Section 7).
* ``v100-pcie-4``: 4 V100 PCIe cards of 32 GB on PCIe (Celeritas Section 6.1).
* ``h100-nvlink-8``: one 8×H100 SXM5 80 GB node (NVLink 4 through NVSwitch), as in a DGX H100 /
  HGX H100 8-GPU board.  ``h100-ib-16`` / ``h100-ib-32``: 2 / 4 such nodes over 400 Gb/s NDR
  InfiniBand (one ConnectX-7 port per GPU); ``h100-cluster``: as many nodes as ``--devices``
  needs.
* ``a100-nvlink-8``: one 8×A100 SXM4 80 GB node (NVLink 3 through NVSwitch), as in a DGX A100.
* ``local``: this machine's CUDA GPUs, or CPU worker processes when there are none.

Custom clusters come from a JSON file (see :func:`from_json`).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from explorer.errors import ExplorerError, UnknownPreset
from explorer.engine.core.storage import home

GB = 1e9
GiB = 1024 ** 3

#: what local workers compute on: ``cpu``, ``cuda`` or ``auto`` (default: CUDA when this
#: machine has a GPU, else CPU).  The tests set ``cpu`` so they run the same on a GPU machine.
DEVICE_ENV = "EXPLORER_DEVICE"
DEVICE_KINDS = ("auto", "cpu", "cuda")
#: how many of this machine's GPUs local workers may use (default: all)
GPUS_ENV = "EXPLORER_GPUS"


class DeviceRequestError(ExplorerError):
    """Devices asked for that this machine does not have (CUDA or NCCL without a GPU, more
    GPUs than exist, an unknown device kind): one line, exit code 2."""


def gpu_count() -> int:
    """CUDA GPUs torch sees here (0 without a CUDA build or driver; never raises)."""
    try:
        import torch
        return int(torch.cuda.device_count()) if torch.cuda.is_available() else 0
    except Exception:  # noqa: BLE001 - a broken driver is no GPU
        return 0


def worker_device_kind(kind: str | None = None, gpus: int | None = None) -> str:
    """``"cpu"`` or ``"cuda"``: what local workers compute on.  ``kind`` (else
    ``$EXPLORER_DEVICE``, else ``auto``): ``auto`` is CUDA when there is a GPU, else CPU;
    ``cuda`` on a machine without one is a :class:`DeviceRequestError`.  ``gpus``: the GPU
    count to judge by (default: :func:`gpu_count`)."""
    raw = kind if kind is not None else os.environ.get(DEVICE_ENV) or "auto"
    k = str(raw).strip().lower()
    if k not in DEVICE_KINDS:
        src = "" if kind is not None else f" (from ${DEVICE_ENV})"
        raise DeviceRequestError(f"device kind {raw!r}{src}: use cpu, cuda or auto")
    g = gpu_count() if gpus is None else int(gpus)
    if k == "cuda" and g < 1:
        raise DeviceRequestError("CUDA workers asked for (--device cuda or EXPLORER_DEVICE=cuda)"
                                 " but this machine has no CUDA GPU: use --device cpu")
    if k == "auto":
        k = "cuda" if g > 0 else "cpu"
    return k


@dataclass(frozen=True)
class Device:
    """One device: ``peak_flops`` (FP32 FLOP/s), ``mem_bw`` (bytes/s), ``memory`` (bytes)."""

    name: str
    kind: str
    peak_flops: float
    mem_bw: float
    memory: float
    node: int = 0

    def __post_init__(self):
        for attr in ("peak_flops", "mem_bw", "memory"):
            if not getattr(self, attr) > 0:
                raise ValueError(f"device {self.name}: {attr}={getattr(self, attr)} must be > 0")


@dataclass
class DeviceGraph:
    """Devices plus a bandwidth matrix ``bw[i, j]`` (bytes/s, i→j) and link latency (s).

    ``bw[i, i]`` is infinite (a device never sends to itself).

    >>> d = preset("p100-cluster", 8)
    >>> d.n, d.bandwidth(0, 1) > d.bandwidth(0, 4)
    (8, True)
    """

    name: str
    devices: list
    bw: np.ndarray
    latency: np.ndarray
    description: str = ""
    meta: dict = field(default_factory=dict)

    def __post_init__(self):
        n = len(self.devices)
        if n < 1:
            raise ValueError("a device graph needs at least one device")
        self.bw = np.asarray(self.bw, dtype=np.float64)
        self.latency = np.asarray(self.latency, dtype=np.float64)
        if self.bw.shape != (n, n) or self.latency.shape != (n, n):
            raise ValueError(f"bandwidth matrix {self.bw.shape} / latency {self.latency.shape} "
                             f"must be {n}×{n} for {n} devices")
        off = ~np.eye(n, dtype=bool)
        if n > 1 and not (self.bw[off] > 0).all():
            raise ValueError("every pair of devices needs a positive bandwidth")
        np.fill_diagonal(self.bw, np.inf)
        np.fill_diagonal(self.latency, 0.0)

    @property
    def n(self) -> int:
        return len(self.devices)

    @property
    def kind(self) -> str:
        kinds = sorted({d.kind for d in self.devices})
        return "+".join(kinds)

    def bandwidth(self, i: int, j: int) -> float:
        return float(self.bw[i, j])

    def peak_flops(self, dtype: str = "fp32") -> np.ndarray:
        """``[n]`` peak FLOP/s of every device in precision ``dtype`` (``fp32`` | ``tf32`` |
        ``bf16``): the device's own ``peak_flops`` for fp32, else the graph's
        ``meta["peak_flops_by_dtype"][dtype]`` (presets: the data sheets' dense tensor-core
        rates; ``local`` GPUs: the calibrated matmul rates).  A device without a rate for
        ``dtype`` (P100, V100 and K80 have neither TF32 nor bf16 tensor cores; CPU workers)
        computes at its fp32 rate."""
        fp32 = np.array([d.peak_flops for d in self.devices], dtype=np.float64)
        if dtype in (None, "fp32"):
            return fp32
        rate = (self.meta.get("peak_flops_by_dtype") or {}).get(dtype)
        if not rate or not float(rate) > 0:
            return fp32
        # a graph-wide figure scales with each device's own fp32 rate (presets: one kind of
        # device, so the figure itself)
        ref = (self.meta.get("peak_flops_by_dtype") or {}).get("fp32") or float(fp32.max())
        return fp32 * (float(rate) / float(ref))

    def subset(self, n: int) -> "DeviceGraph":
        """The first ``n`` devices (presets list a node's devices together)."""
        if n < 1:
            raise ValueError(f"--devices must be ≥ 1, got {n}")
        if n > self.n:
            raise ValueError(f"preset {self.name} has {self.n} devices, {n} were asked for; "
                             f"use --devices ≤ {self.n} or another preset")
        return DeviceGraph(self.name, self.devices[:n], self.bw[:n, :n].copy(),
                           self.latency[:n, :n].copy(), self.description, dict(self.meta))

    def links_digest(self) -> str:
        """A short digest of the link parameters (bandwidth and latency of every pair): two
        clusters of the same devices that differ in one link's speed differ here."""
        import hashlib
        h = hashlib.sha256()
        for m in (self.bw, self.latency):
            a = np.ascontiguousarray(m, dtype=np.float64)
            h.update(str(a.shape).encode())
            h.update(a.tobytes())
        return h.hexdigest()[:16]

    def to_dict(self) -> dict:
        bw = self.bw.copy()
        np.fill_diagonal(bw, 0)
        return {
            "name": self.name, "description": self.description,
            "devices": [vars(d) | {} for d in self.devices],
            "bandwidth": bw.tolist(), "latency": self.latency.tolist(), "meta": self.meta,
        }


def _check_size(n: int) -> None:
    """Refuse, before anything is built, a device count whose dense link matrices
    (bandwidth and latency, ``n × n`` float64 each) cannot fit in this machine's memory."""
    import psutil
    need = 16.0 * n * n
    avail = float(psutil.virtual_memory().available)
    if need > avail:
        raise ValueError(f"{n} devices need {need / 2**30:.3g} GiB for the device graph's link "
                         f"matrices but {avail / 2**30:.1f} GiB is available: ask for fewer "
                         f"devices")


def _cluster(name, n, per_node, make_dev, intra_bw, inter_bw, intra_lat, inter_lat, desc):
    devs = [make_dev(i, i // per_node) for i in range(n)]
    node = np.array([d.node for d in devs])
    same = node[:, None] == node[None, :]
    bw = np.where(same, intra_bw, inter_bw).astype(float)
    lat = np.where(same, intra_lat, inter_lat).astype(float)
    return DeviceGraph(name, devs, bw, lat, desc)


# Each figure, and where it comes from (the papers give the machine and the memory; the speeds
# are the vendors' data sheets for that card):
#  P100 SXM2 (OptCNN Section 6: "four NVIDIA Tesla P100 GPUs" per node, NVLink inside a node,
#    "100Gb/s EDR Infiniband" between nodes; the paper gives no capacity: the P100 SXM2 has
#    16 GB): 10.6 TFLOP/s FP32, 732 GB/s HBM2, 16 GB; NVLink 1.0 with 4 links of 20 GB/s per
#    direction; in a 4-GPU node each pair is joined by one link pair -> 40 GB/s.
#  K80 (Tofu Section 7: "8 K80 GPUs with 12GB memory each", "PCI-e bus with 21GB/s
#    peer-to-peer bandwidth"; per GK210 die, boost clock): 4.37 TFLOP/s, 240 GB/s, 12 GB.
#  V100 PCIe (Celeritas Section 6.1: "4 NVIDIA Tesla V100 GPUs (each has 32GB memory)",
#    "interconnected via the PCIe bus"): 14 TFLOP/s FP32, 900 GB/s HBM2, 32 GB (the 32 GB
#    card's 32 GiB); PCIe 3.0 x16 16 GB/s per direction.
#  EDR InfiniBand 100 Gb/s = 12.5 GB/s.
#  Precision: the P100 (Pascal) has no tensor cores - FP16 runs at 2x FP32 (21.2 TFLOP/s SXM2,
#    NVIDIA Tesla P100 datasheet), but there is neither TF32 nor bf16; the K80 (Kepler) has
#    neither.  The V100 (Volta) tensor cores compute FP16 only (112 TFLOP/s PCIe, NVIDIA V100
#    datasheet): no TF32, no bf16 (bf16 matmuls run without tensor cores).  So on these three
#    ``--dtype tf32`` and ``--dtype bf16`` compute at the FP32 rate (``DeviceGraph.peak_flops``
#    falls back to it); bf16 still halves activation bytes and transfers.
P100_FLOPS = {"fp64": 5.3e12, "fp32": 10.6e12, "fp16": 21.2e12}
K80_FLOPS = {"fp64": 1.46e12, "fp32": 4.37e12}
V100_PCIE_FLOPS = {"fp64": 7e12, "fp32": 14.0e12, "fp16": 112e12}
def _p100(i, node):
    return Device(f"p100:{i}", "P100", 10.6e12, 732 * GB, 16 * GiB, node)


def _k80(i, node):
    return Device(f"k80:{i}", "K80", 4.37e12, 240 * GB, 12 * GiB, node)


def _v100(i, node):
    return Device(f"v100:{i}", "V100-PCIe", 14.0e12, 900 * GB, 32 * GiB, node)


# Today's GPUs (the vendor's data sheets; "with sparsity" figures halved to dense):
#  H100 SXM5 80GB - NVIDIA H100 Tensor Core GPU datasheet (nvidia.com/en-us/data-center/h100,
#    "H100 SXM" column): FP64 34 TFLOPS, FP64 Tensor Core 67 TFLOPS, FP32 67 TFLOPS, TF32
#    Tensor Core 989 TFLOPS with sparsity (494.5 dense), BF16 / FP16 Tensor Core 1,979 TFLOPS
#    with sparsity (989.5 dense), FP8 3,958 with sparsity (1,979 dense); GPU memory 80 GB
#    (HBM3), memory bandwidth 3.35 TB/s; interconnect NVLink 900 GB/s (fourth-generation
#    NVLink, 18 links: bidirectional, so 450 GB/s each way; through the NVSwitch chips of an
#    HGX / DGX H100 board every GPU reaches every other at that rate), PCIe Gen5 128 GB/s.
#  DGX H100 - NVIDIA DGX H100 datasheet / DGX H100 user guide: 8×H100 SXM5, "8x NVIDIA
#    ConnectX-7 ... up to 400 Gb/s InfiniBand" for the compute fabric: one NDR port of
#    400 Gb/s = 50 GB/s each way per GPU between nodes.
#  A100 SXM4 80GB - NVIDIA A100 Tensor Core GPU datasheet ("A100 80GB SXM" column): FP64
#    9.7 TFLOPS, FP64 Tensor Core 19.5, FP32 19.5, TF32 Tensor Core 156 (312 with sparsity),
#    BF16 / FP16 Tensor Core 312 (624 with sparsity); GPU memory 80 GB HBM2e, memory bandwidth
#    2,039 GB/s; NVLink 600 GB/s (third generation, 12 links; 300 GB/s each way) through
#    NVSwitch in a DGX / HGX A100 8-GPU board; PCIe Gen4 64 GB/s.
#  The memory is the stacks' capacity as the V100's above (80 GiB: torch reports ~79.2 GiB
#  total of which the driver keeps some).  ``peak_flops`` is the FP32 figure (``--dtype fp32``,
#  the default); every precision's dense peak is in ``meta["peak_flops_by_dtype"]``: tf32 and
#  bf16 are the "Tensor Core" columns above without sparsity (H100: 494.5 / 989.5 TFLOP/s,
#  A100: 156 / 312 TFLOP/s), read by ``DeviceGraph.peak_flops(dtype)``.
#  Latencies are not data-sheet figures: the same order as the presets above assume
#  (5 µs inside a node, 10 µs across the fabric).
H100_FLOPS = {"fp64": 67e12, "fp32": 67e12, "tf32": 494.5e12, "bf16": 989.5e12,
              "fp16": 989.5e12, "fp8": 1979e12}      # fp64: the FP64 Tensor Core figure
A100_FLOPS = {"fp64": 19.5e12, "fp32": 19.5e12, "tf32": 156e12, "bf16": 312e12,
              "fp16": 312e12}                        # fp64: the FP64 Tensor Core figure
NVLINK4_BW = 900 * GB / 2          # per direction, per GPU (900 GB/s bidirectional)
NVLINK3_BW = 600 * GB / 2          # per direction, per GPU (600 GB/s bidirectional)
NDR_BW = 400e9 / 8                 # 400 Gb/s NDR InfiniBand per GPU, per direction


def _h100(i, node):
    return Device(f"h100:{i}", "H100-SXM5-80GB", H100_FLOPS["fp32"], 3.35e12, 80 * GiB, node)


def _a100(i, node):
    return Device(f"a100:{i}", "A100-SXM4-80GB", A100_FLOPS["fp32"], 2039 * GB, 80 * GiB, node)


PRESETS = {
    "p100-cluster": ("P100 nodes of 4 (NVLink 40 GB/s) over 100 Gb/s InfiniBand; sized to "
                     "--devices (OptCNN's cluster, default)", None),
    "p100-nvlink-4": ("one node, 4×P100 SXM2 with NVLink (OptCNN Table 5)", 4),
    "p100-ib-16": ("16×P100 on 4 nodes, NVLink inside, 100 Gb/s EDR InfiniBand between", 16),
    "k80-pcie-8": ("8×K80 (GK210) on PCIe, 21 GB/s peer-to-peer (Tofu's machine)", 8),
    "v100-pcie-4": ("4×V100 PCIe 32 GB, 16 GB/s PCIe 3.0 x16 (Celeritas's machine)", 4),
    "h100-nvlink-8": ("one node, 8×H100 SXM5 80 GB, NVLink 4 / NVSwitch 450 GB/s each way", 8),
    "h100-ib-16": ("16×H100 SXM5 on 2 nodes of 8, NVLink 4 inside, 400 Gb/s NDR InfiniBand "
                   "per GPU between", 16),
    "h100-ib-32": ("32×H100 SXM5 on 4 nodes of 8, NVLink 4 inside, 400 Gb/s NDR InfiniBand "
                   "per GPU between", 32),
    "h100-cluster": ("H100 SXM5 nodes of 8 (NVLink 4) over 400 Gb/s NDR InfiniBand; sized to "
                     "--devices", None),
    "a100-nvlink-8": ("one node, 8×A100 SXM4 80 GB, NVLink 3 / NVSwitch 300 GB/s each way", 8),
    "local": ("this machine: CUDA GPUs, or CPU worker processes when there are none", None),
}


def preset(name: str, n: int | None = None) -> DeviceGraph:
    """A named preset (or a path to a cluster JSON file), restricted to ``n`` devices."""
    if name.endswith(".json") or os.path.sep in name:
        g = from_json(name)
        return g.subset(n) if n is not None else g
    if name not in PRESETS:
        raise UnknownPreset(f"unknown device preset {name!r}: choose one of "
                            f"{', '.join(PRESETS)} or give a cluster JSON file")
    if n is not None and n < 1:
        raise ValueError(f"--devices must be ≥ 1, got {n}")
    if n is not None:
        _check_size(n)
    if name == "p100-cluster":
        n = 4 if n is None else n
        nodes = -(-n // 4)
        g = _cluster("p100-cluster", nodes * 4, 4, _p100, 40 * GB, 12.5 * GB, 5e-6, 10e-6,
                     PRESETS[name][0])
        g.meta.update(peak_flops_by_dtype=dict(P100_FLOPS))
        return g.subset(n)
    if name == "p100-nvlink-4":
        g = _cluster(name, 4, 4, _p100, 40 * GB, 12.5 * GB, 5e-6, 10e-6, PRESETS[name][0])
        g.meta.update(peak_flops_by_dtype=dict(P100_FLOPS))
    elif name == "p100-ib-16":
        g = _cluster(name, 16, 4, _p100, 40 * GB, 12.5 * GB, 5e-6, 10e-6, PRESETS[name][0])
        g.meta.update(peak_flops_by_dtype=dict(P100_FLOPS))
    elif name == "k80-pcie-8":
        g = _cluster(name, 8, 8, _k80, 21 * GB, 21 * GB, 10e-6, 10e-6, PRESETS[name][0])
        g.meta.update(peak_flops_by_dtype=dict(K80_FLOPS))
    elif name == "v100-pcie-4":
        g = _cluster(name, 4, 4, _v100, 16 * GB, 16 * GB, 10e-6, 10e-6, PRESETS[name][0])
        g.meta.update(peak_flops_by_dtype=dict(V100_PCIE_FLOPS))
    elif name in ("h100-nvlink-8", "h100-ib-16", "h100-ib-32", "h100-cluster"):
        total = {"h100-nvlink-8": 8, "h100-ib-16": 16, "h100-ib-32": 32}.get(name)
        if total is None:
            total = 8 * -(-(8 if n is None else n) // 8)
        g = _cluster(name, total, 8, _h100, NVLINK4_BW, NDR_BW, 5e-6, 10e-6, PRESETS[name][0])
        g.meta.update(peak_flops_by_dtype=dict(H100_FLOPS))
    elif name == "a100-nvlink-8":
        g = _cluster(name, 8, 8, _a100, NVLINK3_BW, NVLINK3_BW, 5e-6, 5e-6, PRESETS[name][0])
        g.meta.update(peak_flops_by_dtype=dict(A100_FLOPS))
    else:
        return local(n)
    return g.subset(n) if n is not None else g


def local(n: int | None = None) -> DeviceGraph:
    """The local machine: its CUDA GPUs (:func:`local_gpus`), else ``n`` CPU worker processes
    (default: cores); ``$EXPLORER_DEVICE=cpu`` gives CPU workers on a GPU machine too.

    Uses the calibrated figures written by ``explorer calibrate`` when present (a GPU
    calibration for GPUs, a CPU one for CPU workers), otherwise conservative defaults for one
    CPU core per worker (gloo over loopback, ~9 GB/s measured).
    """
    ngpu = gpu_count() if worker_device_kind() == "cuda" else 0   # $EXPLORER_DEVICE=cpu: CPU
    cal = _calibration()
    if ngpu:
        return local_gpus(n, ngpu, cal if _is_gpu_calibration(cal) else {})
    if _is_gpu_calibration(cal):
        cal = {}                       # the GPUs' figures say nothing about CPU workers
    cores = int(cal.get("cores") or 0) or os.cpu_count() or 1   # the workers' cores
    if n is not None and n < 1:
        raise ValueError(f"--devices must be ≥ 1, got {n}")
    n = cores if n is None else n
    try:
        total_mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        total_mem = 8 * GiB
    devs = [Device(f"cpu:{i}", "cpu-worker", cal.get("peak_flops", 30e9),
                   cal.get("mem_bw", 8 * GB), total_mem / n, 0) for i in range(n)]
    bw = np.full((n, n), cal.get("link_bw", 4 * GB))
    lat = np.full((n, n), cal.get("latency", 100e-6))
    meta = {"backend": "gloo", "cores": cores, "calibrated": bool(cal),
            "calibrated_at": cal.get("measured_at")}
    if cal.get("p2p_latency_s") and cal.get("p2p_bw"):
        # a placement's transfers are single isend/irecv into a posted receive: their own
        # calibrated latency and bandwidth (``latency`` above is a two-way exchange)
        meta["p2p"] = {"latency": float(cal["p2p_latency_s"]), "bw": float(cal["p2p_bw"])}
        if cal.get("p2p_send_s") and cal.get("p2p_send_bw"):    # the sender's isend call
            meta["p2p"].update(send_s=float(cal["p2p_send_s"]),
                               send_bw=float(cal["p2p_send_bw"]))
        if cal.get("p2p_recv_s") and cal.get("p2p_recv_bw"):    # the receiver's calls
            meta["p2p"].update(recv_s=float(cal["p2p_recv_s"]),
                               recv_bw=float(cal["p2p_recv_bw"]))
        if cal.get("p2p_latency_mean_s") and cal.get("p2p_1mb_mean_s"):   # tails included
            meta["p2p"].update(latency_mean=float(cal["p2p_latency_mean_s"]),
                               s_1mb_mean=float(cal["p2p_1mb_mean_s"]))
    # the layer-wise runtime's gradient sync on gloo (point to point, one message per
    # parameter tensor, then an in-place add) and its SGD update (the same add): what a
    # message beyond an exchange's first costs and the add's rate, as calibrated; without a
    # calibration the add runs at the copy bandwidth and messages cost nothing extra
    meta["swap"] = {"message_s": float(cal.get("swap_message_s") or 0.0),
                    "add_s": float(cal.get("add_s") or 0.0),
                    "add_bw": float(cal.get("add_bw") or cal.get("mem_bw", 8 * GB))}
    if cal.get("allreduce_1k_s") and cal.get("allreduce_big_s") and cal.get("allreduce_big_bytes"):
        meta["allreduce"] = {"small_s": float(cal["allreduce_1k_s"]),      # 1 KB
                             "big_s": float(cal["allreduce_big_s"]),
                             "big_bytes": float(cal["allreduce_big_bytes"])}
    if n > cores:
        meta["warning"] = (f"{n} CPU workers on {cores} cores: timings will mean little")
    return DeviceGraph("local", devs, bw, lat, f"{n} CPU worker processes (gloo)", meta)


def _is_gpu_calibration(cal: dict) -> bool:
    """Written by ``explorer calibrate`` on GPUs (``"backend"`` ``nccl`` or ``cuda``)."""
    return cal.get("device_kind") == "cuda" or cal.get("backend") in ("nccl", "cuda")


def _gpu_limit(ngpu: int) -> int:
    """The GPUs local workers may use: all, or ``$EXPLORER_GPUS`` (more than exist: an
    error)."""
    raw = os.environ.get(GPUS_ENV)
    if not raw:
        return ngpu
    try:
        k = int(raw)
    except ValueError:
        raise DeviceRequestError(f"${GPUS_ENV}={raw!r} is not a number of GPUs") from None
    if k < 1 or k > ngpu:
        raise DeviceRequestError(f"{k} GPUs asked for (${GPUS_ENV}), this machine has {ngpu}")
    return k


def local_gpus(n: int | None, ngpu: int, cal: dict | None = None) -> DeviceGraph:
    """``n`` local workers (default: one per GPU) on this machine's ``ngpu`` CUDA GPUs, as
    the runtime maps them (:mod:`explorer.engine.runtime.devicemap`): worker ``i`` on GPU
    ``i mod G`` - its own GPU when ``n ≤ G`` (NCCL), else sharing (gloo, the GPU's memory
    split between its workers, ``meta["shared"]``: timings are not prediction targets).

    Name, memory and count come from ``torch.cuda.get_device_properties``; speeds from the
    GPU calibration ``cal`` (``explorer calibrate`` on GPUs: ``peak_flops`` the float32
    matmul, ``mem_bw`` a large device copy, ``link_bw`` / ``latency`` NCCL point to point,
    per precision ``matmul_flops_by_dtype``), else defaults flagged ``calibrated: False``."""
    import torch
    cal = dict(cal or {})
    g = _gpu_limit(int(ngpu))
    n = g if n is None else int(n)
    if n < 1:
        raise ValueError(f"--devices must be ≥ 1, got {n}")
    props = [torch.cuda.get_device_properties(i) for i in range(g)]
    per_gpu = [sum(1 for w in range(n) if w % g == i) for i in range(g)]
    shared = n > g
    devs = [Device(f"cuda:{i % g}" if not shared else f"cuda:{i % g}/w{i}", props[i % g].name,
                   float(cal.get("peak_flops", 10e12)), float(cal.get("mem_bw", 500 * GB)),
                   float(props[i % g].total_memory) / per_gpu[i % g], 0)
            for i in range(n)]
    if shared:     # gloo with host-staged copies between workers
        link, lat = cal.get("staged_link_bw", 4 * GB), cal.get("staged_latency", 200e-6)
    else:
        link, lat = cal.get("link_bw", 10 * GB), cal.get("latency", 20e-6)
    bw = np.full((n, n), float(link))
    meta = {"backend": "gloo" if shared else "nccl", "device_kind": "cuda", "gpus": g,
            "gpu_name": props[0].name, "shared": shared, "calibrated": bool(cal),
            "calibrated_at": cal.get("measured_at")}
    for key in ("matmul_flops_by_dtype", "conv_flops_by_dtype", "h2d_bw", "d2h_bw"):
        if cal.get(key) is not None:
            meta[key] = cal[key]
    if cal.get("matmul_flops_by_dtype"):
        meta["peak_flops_by_dtype"] = dict(cal["matmul_flops_by_dtype"])
    if not shared and cal.get("allreduce_1k_s") and cal.get("allreduce_big_s") and \
            cal.get("allreduce_big_bytes"):
        meta["allreduce"] = {"small_s": float(cal["allreduce_1k_s"]),
                             "big_s": float(cal["allreduce_big_s"]),
                             "big_bytes": float(cal["allreduce_big_bytes"])}
    if not cal:
        meta["warning"] = (f"the GPUs are not calibrated: {props[0].name} at a default "
                           f"{devs[0].peak_flops / 1e12:g} TFLOP/s; run `explorer calibrate`")
    if shared:
        meta["warning"] = (f"{n} workers share {g} GPU{'s' if g > 1 else ''}: their timing is "
                           f"shared, not a prediction target")
    what = f"{n} workers on {g} local CUDA GPU{'s' if g > 1 else ''} ({props[0].name})"
    return DeviceGraph("local", devs, bw, np.full((n, n), float(lat)), what, meta)


def _calibration() -> dict:
    path = home(create=False) / "local.json"
    if path.is_file():
        try:
            return json.loads(path.read_text())
        except (OSError, ValueError):
            return {}
    return {}


def from_json(path: str) -> DeviceGraph:
    """Load a custom cluster from a file (format: :func:`from_dict`)."""
    p = Path(path)
    if not p.is_file():
        raise UnknownPreset(f"cluster file {path!r} not found")
    try:
        spec = json.loads(p.read_text())
    except ValueError as exc:
        raise UnknownPreset(f"cluster file {path}: not JSON ({exc}); see `explorer presets` "
                            f"for the format") from None
    return from_dict(spec, p.stem, f"cluster file {path}")


def from_dict(spec: dict, name: str = "custom", where: str = "the cluster") -> DeviceGraph:
    """A custom cluster from its JSON document.

    Format::

        {"name": "my-box",
         "devices": [{"name": "gpu0", "kind": "A100", "peak_flops": 19.5e12,
                      "mem_bw": 1.5e12, "memory": 40e9, "node": 0}, ...],
         "intra_node_bw": 300e9, "inter_node_bw": 25e9,          # or "bandwidth": [[...]]
         "latency": 5e-6,                                         # or a matrix
         "peak_flops_by_dtype": {"tf32": 156e12, "bf16": 312e12}} # optional: --dtype rates

    ``peak_flops_by_dtype`` gives the rate of each precision relative to which a device's
    ``peak_flops`` (its fp32 rate) is scaled; without it tf32 and bf16 compute at fp32's.
    """
    try:
        devs = [Device(d["name"], d.get("kind", "custom"), float(d["peak_flops"]),
                       float(d["mem_bw"]), float(d["memory"]), int(d.get("node", 0)))
                for d in spec["devices"]]
        n = len(devs)
        if "bandwidth" in spec:
            bw = np.asarray(spec["bandwidth"], dtype=float)
        else:
            node = np.array([d.node for d in devs])
            same = node[:, None] == node[None, :]
            bw = np.where(same, float(spec["intra_node_bw"]),
                          float(spec.get("inter_node_bw", spec["intra_node_bw"])))
        lat = spec.get("latency", 10e-6)
        lat = np.asarray(lat, dtype=float) if isinstance(lat, list) else np.full((n, n), lat)
        meta = {}
        if spec.get("peak_flops_by_dtype"):      # {"tf32": ..., "bf16": ...}, FLOP/s
            meta["peak_flops_by_dtype"] = {str(k): float(v)
                                           for k, v in spec["peak_flops_by_dtype"].items()}
        return DeviceGraph(spec.get("name", name), devs, bw, lat,
                           spec.get("description", f"custom cluster ({name})"), meta)
    except UnknownPreset:
        raise
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise UnknownPreset(f"{where}: {type(exc).__name__}: {exc}; see `explorer presets` for "
                            f"the format") from exc


def list_presets() -> list:
    return [{"name": k, "description": v[0], "devices": v[1]} for k, v in PRESETS.items()]

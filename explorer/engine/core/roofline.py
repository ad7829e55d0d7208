"""Roofline time of aten operators on a device graph: ``max(flops / (peak·eff), bytes / mem_bw)``
plus a kernel launch, 0 for views.  The analytic operator costs of the operator-level families
(Celeritas's Standard Evaluation, Tofu's shard compute) both read it."""

from __future__ import annotations

import numpy as np

__all__ = ["VIEW_OPS", "LAUNCH_S", "analytic_times"]

#: aten ops whose output shares its input's storage: no kernel, no new memory.
VIEW_OPS = frozenset({
    "view", "_unsafe_view", "reshape", "t", "transpose", "permute", "expand", "slice", "select",
    "unsqueeze", "squeeze", "as_strided", "alias", "unfold", "split", "split_with_sizes",
    "chunk", "unbind", "narrow", "diagonal", "view_as", "_reshape_alias", "detach",
    "expand_as", "numpy_T", "unsafe_split", "unsafe_chunk"})
#: fraction of peak FLOP/s reached by dense kernels (as the layer cost model assumes)
_DENSE = {"mm": 0.6, "addmm": 0.6, "bmm": 0.6, "baddbmm": 0.6, "matmul": 0.6,
          "convolution": 0.6, "convolution_backward": 0.6,
          "_scaled_dot_product_flash_attention_for_cpu": 0.5,
          "_scaled_dot_product_efficient_attention": 0.5,
          "_scaled_dot_product_flash_attention": 0.5,
          "_scaled_dot_product_flash_attention_for_cpu_backward": 0.5}
#: fixed cost of one kernel launch (s)
LAUNCH_S = 5e-6


def analytic_times(flops, nbytes, targets, devices, dtype: str = "fp32") -> np.ndarray:
    """Roofline time per operator and device, shape ``(n, D)`` (vectorised).

    ``max(flops / (peak·eff), bytes / mem_bw) + launch``; views cost nothing.  ``peak`` is
    the devices' rate in precision ``dtype`` (:meth:`DeviceGraph.peak_flops`: fp32 unless
    the device has a tf32 / bf16 rate); ``nbytes`` are counted by the caller in that
    precision (:func:`explorer.engine.core.precision.at_precision`).
    """
    flops = np.asarray(flops, dtype=np.float64)
    nbytes = np.asarray(nbytes, dtype=np.float64)
    eff = np.array([_DENSE.get(t, 1.0) for t in targets])
    view = np.array([t in VIEW_OPS for t in targets], dtype=bool)
    peak = devices.peak_flops(dtype)
    bw = np.array([d.mem_bw for d in devices.devices])
    t = np.maximum((flops / eff)[:, None] / peak[None, :], nbytes[:, None] / bw[None, :])
    t = t + LAUNCH_S
    t[view] = 0.0
    return t

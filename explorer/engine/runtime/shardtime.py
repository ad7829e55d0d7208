"""Measured compute of an operator-level plan: every operator timed at its shard shapes, the
way a worker computes it.

A Tofu worker computes each operator on the region tiles the plan gives it
(:meth:`.opexec._Worker.compute`, :mod:`.tiles`), in lockstep with the others: an operator's
step lasts as long as its slowest worker's shard.  :func:`shard_seconds` builds, for every
operator and worker, random tensors of exactly the region shapes that worker fetches (integer
tensors zero: valid indices), and times that same ``compute`` call - tile rule, halo padding,
a fallback on full-size buffers - in the timed steps' dtype, one thread, under the run's
deterministic numerics; the median of ``reps`` runs after ``warmup``, on this thread's CPU
clock (as :func:`explorer.engine.profile.step_op_times`: a busy shared machine does not
charge an operator for other processes' time).  Times are cached in the profile database per
(operator call, shard shapes, dtype) (:func:`explorer.engine.profile.shard_cache`), so equal
shards - the layers of a stage, the workers of a batch split - and the next run cost nothing.

:func:`predict_step` adds them up: ``Σ_ops max_w t[op, w]`` (lockstep) plus the plan's
communication time.
"""

from __future__ import annotations

import json
import statistics
import time

import numpy as np
import torch

from .. import profile
from . import tiles
from .opexec import _Worker, _extent, substitute

__all__ = ["shard_seconds", "predict_step"]

#: ops whose cost depends on where the tile sits (padding only at the tensor's border)
_WINDOW = {"convolution", "convolution_backward", "max_pool2d_with_indices",
           "max_pool2d_with_indices_backward", "avg_pool2d", "avg_pool2d_backward"}


def _region_key(box, shape, window: bool):
    ext = list(_extent(box))
    if not window:
        return ext
    return [ext, [int(a) == 0 for a, _ in np.asarray(box)],
            [int(b) == int(s) for (_, b), s in zip(np.asarray(box), shape or (1,))]]


def _value_key(a, g, region, window):
    if isinstance(a, str) and a in g.tensors:
        r = region.get(a)
        ten = g.tensors[a]
        return ["T", ten.dtype] + ([None] if r is None else
                                   [_region_key(r, ten.shape, window)])
    if isinstance(a, (list, tuple)):
        return [_value_key(b, g, region, window) for b in a]
    if a is None or isinstance(a, (bool, int, float, str)):
        return a
    return str(a)


def _signature(o, g, region, out_box, dtype, window) -> str:
    return json.dumps([o.target, o.index, dtype,
                       _value_key(list(o.args), g, region, window),
                       [[k, _value_key(v, g, region, window)]
                        for k, v in sorted(o.kwargs.items())],
                       _region_key(out_box, g.tensors[o.output].shape, window)],
                      separators=(",", ":"), default=str)


def _tensor(ten, extent, dtype, zero, gen):
    dt = getattr(torch, ten.dtype, None)
    if not isinstance(dt, torch.dtype) or dt.is_floating_point:
        if zero:
            return torch.zeros(extent, dtype=dtype)
        return torch.randn(extent, dtype=dtype, generator=gen)
    return torch.zeros(extent, dtype=dt)


def shard_seconds(g, xplan: dict, dtype: str = "float32", device_kind: str = "cpu",
                  cache_path=None, reps: int = 3, warmup: int = 1, progress=None):
    """``(names, t, info)``: ``t[i, w]`` the seconds worker ``w`` computes step ``i`` of the
    plan's operators (``names[i]``; 0 where it computes nothing), measured as the module says
    (cached); ``info = {"measured": shards timed now, "cached": shards from the cache,
    "seconds": time spent}``."""
    from ..capture import deterministic
    K = int(xplan["workers"])
    fdt = getattr(torch, dtype)
    steps = list(g.ops.values())
    work: dict = {}                    # signature -> (op name, worker, region, out box, info)
    sig = np.empty((len(steps), K), dtype=object)
    for i, o in enumerate(steps):
        info = xplan["ops"].get(o.name)
        window = o.target in _WINDOW
        for w in range(K):
            if info is None:           # bookkeeping computed whole on every worker
                region = {t: np.array([[0, s] for s in g.tensors[t].shape] or [[0, 1]])
                          for t in o.inputs}
                out_box = np.array([[0, s] for s in g.tensors[o.output].shape] or [[0, 1]])
            else:
                out_box = np.asarray(info["out"][w])
                if (out_box[:, 1] <= out_box[:, 0]).any():
                    continue
                region = {t: np.asarray(need[w]) for t, need in info["needs"].items()
                          if (np.asarray(need[w])[:, 1] > np.asarray(need[w])[:, 0]).all()}
            s = _signature(o, g, region, out_box, dtype, window)
            sig[i, w] = s
            work.setdefault(s, (o.name, w, region, out_box, info))
    t0 = time.perf_counter()
    got = profile.shard_cache(device_kind, list(work), cache_path=cache_path)
    todo = [s for s in work if s not in got]
    if todo and progress:
        progress(f"timing {len(todo)} operator shards of {g.model} ({dtype})")
    fresh = {}
    if todo:
        from ..opgraph import with_step
        g = with_step(g)               # the traced step (a cached graph holds none)
    node = {n.name: n for n in g.gm.graph.nodes} if todo else {}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    try:
        with deterministic(running_stats=False):
            for s in todo:
                name, w, region, out_box, info = work[s]
                o = g.ops[name]
                fresh[s] = _time_one(g, xplan, K, fdt, gen, reps, warmup, node[o.node], o, w,
                                     region, out_box, info)
    finally:
        torch.set_num_threads(threads)
    if fresh:
        profile.store_shard_times(device_kind, fresh, reps, cache_path=cache_path)
    got.update(fresh)
    t = np.zeros((len(steps), K))
    for i in range(len(steps)):
        for w in range(K):
            if sig[i, w] is not None:
                t[i, w] = got.get(sig[i, w], 0.0)
    return [o.name for o in steps], t, {"measured": len(fresh), "cached": len(work) -
                                            len(fresh), "seconds": time.perf_counter() - t0}


def _time_one(g, xplan, K, fdt, gen, reps, warmup, n, o, w, region, out_box, info):
    """Seconds of worker ``w``'s ``compute`` of op ``o`` on random region tiles."""
    bufs, shape_of = {}, {}
    zero = (info or {}).get("zero", {})
    for t, box in region.items():
        z = bool(zero.get(t, [False] * K)[w]) if t in zero else False
        b = _tensor(g.tensors[t], _extent(box), fdt, z, gen)
        if not g.tensors[t].shape and b.numel() == 1:
            b = b.reshape(())
        bufs[t] = b
        shape_of[id(b)] = (box, g.tensors[t].shape)
    for t in o.inputs:
        bufs.setdefault(t, None)
    worker = _Worker(w, K, g, xplan, 0.0)
    worker.float_dtype = fdt
    for t in o.inputs:                 # a fallback reads each input's dtype from its tile
        ten = g.tensors[t]
        dt = getattr(torch, ten.dtype, None)
        worker.tiles[t] = (None, bufs[t] if bufs[t] is not None else torch.empty(
            0, dtype=fdt if not isinstance(dt, torch.dtype) or dt.is_floating_point else dt))

    def sub(a, bs, fa=None):
        return substitute(g, a, bs, lambda t: worker.tiles[t][1], fa)

    ten = g.tensors[o.output]
    fill = float("-inf") if (info or {}).get("reducer") == "max" else 0.0
    if info is None:
        def run():
            res = n.target(*sub(o.args, bufs, n.args),
                           **{k: sub(v, bufs, n.kwargs.get(k)) for k, v in o.kwargs.items()})
            return res
    else:
        def run():
            return worker.compute(n, o, bufs, sub, out_box, ten, fill, shape_of)
    runs = []
    for r in range(warmup + reps):
        c0 = time.thread_time()
        try:
            run()
        except Exception:  # noqa: BLE001 - random data a real step never feeds: not timed
            return 0.0
        if r >= warmup:
            runs.append(time.thread_time() - c0)
    return float(statistics.median(runs))


def predict_step(g, xplan: dict, comm_s: float, dtype: str = "float32",
                 device_kind: str = "cpu", cache_path=None, progress=None) -> dict:
    """The step time of an operator-level plan on this machine: ``compute_s`` = Σ over the
    operators of the slowest worker's measured shard (the workers run in lockstep) plus
    ``comm_s`` (the plan's communication time).  Returns ``predicted_step_time_s``,
    ``predicted_compute_step_s``, ``predicted_compute_s`` (per worker, its own shards),
    ``predicted_comm_s``, ``compute_source`` and ``shard_timing`` (:func:`shard_seconds`'s
    info)."""
    _, t, info = shard_seconds(g, xplan, dtype, device_kind, cache_path, progress=progress)
    lock = float(t.max(axis=1).sum()) if t.size else 0.0
    return {"predicted_step_time_s": lock + float(comm_s),
            "predicted_compute_step_s": lock,
            "predicted_compute_s": [float(x) for x in t.sum(axis=0)],
            "predicted_comm_s": float(comm_s),
            "compute_source": f"measured shard times ({dtype}, after explorer calibrate)",
            "shard_timing": info}

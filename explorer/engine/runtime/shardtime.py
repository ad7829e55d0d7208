"""Measured compute of an operator-level plan: every operator rehearsed at its shard shapes,
the way a worker runs it.

A Tofu worker runs each operator as :meth:`.opexec._Worker.run_op`: it assembles the input
regions the plan gives it (its own tile, pieces from peers), computes the output box on them
(:mod:`.tiles`: tile rule, halo padding, or a fallback on full-size buffers) and combines
what it sends and receives - in lockstep with the others, so an operator's step lasts as long
as its slowest worker's.  :func:`shard_seconds` rehearses exactly that call for every
operator and worker in this process, one thread per worker running at once (so the
workers' kernels share the cores and the memory system as in a run): the worker's tiles are
random tensors of its boxes (integer tensors zero: valid indices), the wire is left out (a peer's piece is a fresh
buffer of its shape, a collective keeps its local part) - the plan's communication time
covers it - and the rest is timed in the timed steps' dtype, one thread, under the run's
deterministic numerics; the median of ``reps`` runs (one when it takes ``LONG_S`` or more)
after ``warmup`` on this thread's CPU
clock (as :func:`explorer.engine.profile.step_op_times`: a busy shared machine does not
charge an operator for other processes' time).  Times are cached in the profile database per
(operator call, the op's boxes on every worker, worker, dtype, and the code that runs it: a
digest of this module, :mod:`.opexec` and :mod:`.tiles` with torch's version, so a changed
tile rule is rehearsed afresh) (:func:`explorer.engine.profile.shard_cache`), so equal layers
and the next run cost nothing.

:func:`predict_step` adds them up: ``Σ_ops max_w t[op, w]`` (lockstep), the plan's
communication time, and one link latency per operator whose workers exchange anything.
"""

from __future__ import annotations

import functools
import json
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

from .. import profile
from .opexec import _Worker, _extent, _pattern, substitute

__all__ = ["shard_seconds", "predict_step"]

#: a shard whose timed run takes this long (CPU seconds) is timed once after its warm-up,
#: not ``reps`` times: the thread clock's resolution is microseconds, and a model one worker
#: cannot hold would otherwise spend its rehearsal repeating multi-second matrix products
LONG_S = 0.25


class _Rehearsal(_Worker):
    """A worker without peers (see the module): ``exchanges`` counts the calls that would
    have moved something to or from it."""

    def __init__(self, rank, world, g, xplan, groups, dtype):
        super().__init__(rank, world, g, xplan, 0.0, groups)
        self.float_dtype = dtype
        self.exchanges = 0

    def exchange(self, transfers, source):
        got, mine = {}, False
        for i, (src, dst, box, dtype) in enumerate(transfers):
            if src == self.rank:
                source(i, box).contiguous()
                mine = True
            elif dst == self.rank:
                got[i] = torch.zeros(_extent(box), dtype=dtype)
                mine = True
        self.exchanges += mine
        return got

    def collective(self, coll, transfers, result, box, me):
        _, axis, members = coll
        self.exchanges += 1
        if axis is None:
            return result.contiguous().clone()
        moved = result.movedim(axis, 0).contiguous()
        return moved[:moved.shape[0] // len(members)].clone().movedim(0, axis).contiguous()


def _groups(g, xplan, rank, world) -> dict:
    """The collectives :func:`.opexec.make_groups` would make, as seen from ``rank``."""
    out = {}
    for o, info in xplan["ops"].items():
        if info.get("reducer") != "sum" or o not in g.ops:
            continue
        t = g.ops[o].output
        got = _pattern(info["out"], xplan["held"][t], world) if t in xplan["held"] else None
        for members, axis in got or ():
            if rank in members:
                out[("op", t)] = (None, axis, members)
    return out


def _boxes(v) -> list:
    return np.asarray(v).astype(int).tolist()


def _arg_key(a, g):
    if isinstance(a, str) and a in g.tensors:
        ten = g.tensors[a]
        return ["T", ten.dtype, list(ten.shape)]
    if isinstance(a, (list, tuple)):
        return [_arg_key(b, g) for b in a]
    if a is None or isinstance(a, (bool, int, float, str)):
        return a
    return str(a)


@functools.cache
def _code() -> str:
    """What a shard's time depends on besides its call: the code that runs it and torch."""
    from pathlib import Path

    from ..capture_cache import files_digest
    here = Path(__file__).parent
    return files_digest([here / f for f in ("shardtime.py", "opexec.py", "tiles.py")]
                         )[:16] + "/" + torch.__version__


def _signature(o, g, xplan, w, dtype) -> str:
    """An op's rehearsal key: the call, its arguments, every worker's boxes, the worker, and
    the code that runs it (:func:`_code`)."""
    info = xplan["ops"].get(o.name)
    geo = None
    if info is not None:
        geo = [info.get("reducer"),
               [[t, _boxes(need), _boxes(xplan["held"][t]), list(map(bool, info["zero"].get(
                   t, [])))] for t, need in sorted(info["needs"].items())],
               _boxes(info["out"]), _boxes(xplan["held"].get(o.output, []))]
        geo[1] = [[x[1], x[2], x[3]] for x in geo[1]]          # by position, not tensor id
    return json.dumps([_code(), o.target, o.index, dtype, int(xplan["workers"]), w,
                       _arg_key(list(o.args), g),
                       [[k, _arg_key(v, g)] for k, v in sorted(o.kwargs.items())], geo],
                      separators=(",", ":"), default=str)


def _random(ten, box, dtype, gen):
    dt = getattr(torch, ten.dtype, None)
    ext = _extent(box)
    if not isinstance(dt, torch.dtype) or dt.is_floating_point:
        return torch.randn(ext, dtype=dtype, generator=gen)
    return torch.zeros(ext, dtype=dt)


def shard_seconds(g, xplan: dict, dtype: str = "float32", device_kind: str = "cpu",
                  cache_path=None, reps: int = 3, warmup: int = 1, progress=None):
    """``(names, t, exchanges, info)``: ``t[i, w]`` the seconds worker ``w`` spends on
    operator ``names[i]`` short of the wire, ``exchanges[i, w]`` the transfers it takes part
    in (as the module says; cached); ``info = {"measured": shards rehearsed now, "cached":
    shards from the cache, "seconds": time spent}``."""
    from ..capture import deterministic
    K = int(xplan["workers"])
    fdt = getattr(torch, dtype)
    ops = list(g.ops.values())
    sig = [[_signature(o, g, xplan, w, dtype) for w in range(K)] for o in ops]
    work = {}
    for i, o in enumerate(ops):
        for w in range(K):
            work.setdefault(sig[i][w], (o.name, w))
    t0 = time.perf_counter()
    got = profile.shard_cache(device_kind, list(work), cache_path=cache_path)
    todo = [s for s in work if s not in got]
    if todo and progress:
        progress(f"rehearsing {len(todo)} operator shards of {g.model} ({dtype})")
    fresh = {}
    if todo:
        from ..opgraph import with_step
        g = with_step(g)               # the traced step (a cached graph holds none)
        node = {n.name: n for n in g.gm.graph.nodes}
        per = [[s for s in todo if work[s][1] == w] for w in range(K)]

        def worker(w):                 # one thread per worker, all at once (lockstep)
            groups = _groups(g, xplan, w, K)
            gen = torch.Generator().manual_seed(w)
            with deterministic(running_stats=False):
                for s in per[w]:
                    o = g.ops[work[s][0]]
                    fresh[s] = _rehearse(g, xplan, K, w, groups, fdt, gen, reps, warmup,
                                         node[o.node], o)
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            with ThreadPoolExecutor(K) as pool:
                list(pool.map(worker, range(K)))
        finally:
            torch.set_num_threads(threads)
        profile.store_shard_times(device_kind, fresh, reps, cache_path=cache_path)
    got.update(fresh)
    t = np.zeros((len(ops), K))
    ex = np.zeros((len(ops), K))
    for i in range(len(ops)):
        for w in range(K):
            t[i, w], ex[i, w] = got.get(sig[i][w], (0.0, 0))
    return [o.name for o in ops], t, ex, {"measured": len(fresh),
                                          "cached": len(work) - len(fresh),
                                          "seconds": time.perf_counter() - t0}


def _rehearse(g, xplan, K, w, groups, fdt, gen, reps, warmup, n, o):
    """``(seconds, exchanges)`` of worker ``w`` running op ``o`` (see the module)."""
    info = xplan["ops"].get(o.name)
    worker = _Rehearsal(w, K, g, xplan, groups, fdt)
    for t in dict.fromkeys(o.inputs):
        ten = g.tensors[t]
        box = xplan["held"][t][w] if t in xplan["held"] else \
            np.array([[0, s] for s in ten.shape] or [[0, 1]])
        v = _random(ten, box, fdt, gen)
        worker.tiles[t] = (np.asarray(box), worker.shaped(t, v))

    def sub(a, bufs, fa=None):
        return substitute(g, a, bufs, lambda t: worker.tiles[t][1], fa)

    if info is None:                   # bookkeeping computed whole on every worker
        def run():
            return n.target(*sub(o.args, {}, n.args),
                            **{k: sub(v, {}, n.kwargs.get(k)) for k, v in o.kwargs.items()})
    else:
        def run():
            return worker.run_op(n, o, info, sub, {})
    runs = []
    for r in range(warmup + reps):
        worker.exchanges = 0
        c0 = time.thread_time()
        try:
            run()
        except Exception:  # noqa: BLE001 - random data a real step never feeds: not timed
            return 0.0, 0
        took = time.thread_time() - c0
        if r >= warmup:
            runs.append(took)
            if took >= LONG_S:         # one long run is many clock ticks: repeating buys time
                break
    return float(statistics.median(runs)), int(worker.exchanges)


def predict_step(g, xplan: dict, comm_s: float, latency_s: float = 0.0,
                 dtype: str = "float32", device_kind: str = "cpu", cache_path=None,
                 progress=None) -> dict:
    """The step time of an operator-level plan on this machine: Σ over the operators of the
    slowest worker's rehearsed time (the workers run in lockstep), plus ``comm_s`` (the
    plan's communication time: bytes over the links), plus ``latency_s`` for each operator
    whose workers exchange anything.  Returns ``predicted_step_time_s``,
    ``predicted_compute_step_s``, ``predicted_compute_s`` (per worker, its own operators),
    ``predicted_comm_s``, ``predicted_latency_s``, ``compute_source`` and ``shard_timing``
    (:func:`shard_seconds`'s info)."""
    _, t, ex, info = shard_seconds(g, xplan, dtype, device_kind, cache_path,
                                   progress=progress)
    lock = float(t.max(axis=1).sum()) if t.size else 0.0
    lat = float((ex.max(axis=1) if ex.size else ex).sum()) * float(latency_s)
    return {"predicted_step_time_s": lock + float(comm_s) + lat,
            "predicted_compute_step_s": lock,
            "predicted_compute_s": [float(x) for x in t.sum(axis=0)],
            "predicted_comm_s": float(comm_s), "predicted_latency_s": lat,
            "compute_source": f"operator shards rehearsed on this machine ({dtype}, "
                              f"after explorer calibrate)",
            "shard_timing": info}

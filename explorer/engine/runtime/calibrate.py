"""``explorer calibrate``: measure this machine and write the ``local`` device graph's numbers.

Writes ``$EXPLORER_HOME/local.json`` with the keys :func:`explorer.engine.devices.local` reads:

* ``peak_flops`` – FP32 FLOP/s of one worker thread: the best of a square matmul and a 3×3
  convolution (the analytic cost model multiplies it by an efficiency per op);
* ``mem_bw`` – bytes/s of a large copy (read + write) by one thread;
* ``link_bw`` – bytes/s of a 64 MB point-to-point transfer between two worker processes
  (gloo over loopback, or NCCL between GPUs);
* ``latency`` – mean seconds per point-to-point exchange of 1 KB **while the processes also
  compute** (~2 ms of convolution between exchanges), as they do in a training step.  On the
  2-vCPU virtual machine this was developed on, that costs 1–3 ms, 20–40× the ping-pong
  latency of two processes that do nothing else (~0.08 ms): a blocked worker lets its vCPU
  halt, and a busy peer's I/O thread has to wait for the scheduler; the runtime pays the
  former, so the cost model must use it.

plus the raw measurements (ping-pong latency, all-reduce times, matmul/conv FLOP/s) for
reference.  With ``model`` it also fills the profile cache (SQLite) with the measured
forward+backward time of every candidate configuration of every layer, so
``explorer search MODEL --preset local --cost measured`` needs no further profiling.
"""

from __future__ import annotations

import json
import os
import queue as queue_mod
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F


def _home() -> Path:
    p = Path(os.environ.get("EXPLORER_HOME") or Path.home() / ".plan-explorer")
    p.mkdir(parents=True, exist_ok=True)
    return p


def _best(fn, reps: int = 5, warm: int = 1) -> float:
    for _ in range(warm):
        fn()
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return min(ts)


def measure_compute(quick: bool = False) -> dict:
    """One-thread matmul and conv FLOP/s and copy bandwidth (in this process)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        n = 384 if quick else 768
        a, b = torch.randn(n, n), torch.randn(n, n)
        t_mm = _best(lambda: torch.mm(a, b), 3 if quick else 5)
        mm = 2.0 * n ** 3 / t_mm
        x = torch.randn(4 if quick else 8, 64, 32, 32)
        w = torch.randn(64, 64, 3, 3)
        t_cv = _best(lambda: F.conv2d(x, w, padding=1), 3 if quick else 5)
        conv = 2.0 * x.shape[0] * 64 * 32 * 32 * 64 * 9 / t_cv
        m = (16 if quick else 64) * 2 ** 20
        src, dst = torch.randn(m // 4), torch.empty(m // 4)
        t_cp = _best(lambda: dst.copy_(src), 3 if quick else 5)
        mem_bw = 2.0 * m / t_cp
    finally:
        torch.set_num_threads(threads)
    return {"matmul_flops": mm, "conv_flops": conv, "peak_flops": max(mm, conv),
            "mem_bw": mem_bw}


def _link_worker(rank, world, port, q, quick):
    import torch.distributed as dist
    from .worker import _set_pdeathsig, _threads
    _set_pdeathsig()
    _threads()
    os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
    try:
        dist.init_process_group("gloo", rank=rank, world_size=world)
        from .worker import _pin
        _pin(rank, world)
        peer = 1 - rank if rank < 2 else None
        res = {}
        reps = 20 if quick else 60
        small, rs = torch.randn(256), torch.empty(256)            # 1 KB
        x, w = torch.randn(8, 512, 4, 4), torch.randn(1024, 512, 1, 1)   # ~2 ms of compute
        if rank < 2:
            # raw ping-pong (nothing else running)
            ts = []
            for i in range(reps + 5):
                t = time.perf_counter()
                if rank == 0:
                    dist.send(small, peer)
                    dist.recv(rs, peer)
                else:
                    dist.recv(rs, peer)
                    dist.send(small, peer)
                if i >= 5:
                    ts.append((time.perf_counter() - t) / 2)
            res["pingpong_latency"] = statistics.median(ts)
            # exchange while computing between exchanges (what a training step does); the
            # mean, not the median: a step pays every exchange, tails included
            ts = []
            for i in range(reps + 5):
                F.conv2d(x, w)
                t = time.perf_counter()
                ws = [dist.irecv(rs, peer, tag=1), dist.isend(small, peer, tag=1)]
                for wk in ws:
                    wk.wait()
                if i >= 5:
                    ts.append(time.perf_counter() - t)
            res["latency"] = statistics.fmean(ts)
            res["latency_median"] = statistics.median(ts)
            # bandwidth: 64 MB one way, and both ways at once
            m = (16 if quick else 64) * 2 ** 20
            big, rb = torch.randn(m // 4), torch.empty(m // 4)
            ts = []
            for i in range(4 if quick else 6):
                t = time.perf_counter()
                if rank == 0:
                    dist.send(big, peer)
                else:
                    dist.recv(rb, peer)
                if i >= 1:
                    ts.append(time.perf_counter() - t)
            res["link_bw"] = m / statistics.median(ts)
            res["link_bytes"] = m
        dist.barrier()
        for size, key in ((256, "allreduce_1k_s"), ((4 if quick else 16) * 2 ** 20 // 4,
                                                    "allreduce_big_s")):
            t_ = torch.randn(size)
            ts = []
            for i in range(reps // 4 + 2):
                t = time.perf_counter()
                dist.all_reduce(t_)
                if i >= 2:
                    ts.append(time.perf_counter() - t)
            res[key] = statistics.median(ts)
            if key == "allreduce_big_s":
                res["allreduce_big_bytes"] = size * 4
        if rank == 0:
            q.put(("ok", res))
        dist.barrier()
        dist.destroy_process_group()
    except BaseException as exc:  # noqa: BLE001
        q.put(("error", f"rank {rank}: {type(exc).__name__}: {exc}"))
        os._exit(1)


def measure_link(devices: int = 2, quick: bool = False, timeout_s: float = 120.0) -> dict:
    """Point-to-point and all-reduce numbers between ``devices`` (≥ 2) gloo processes."""
    import torch.multiprocessing as mp
    from .launcher import RunFailed, _free_port, _kill
    n = max(2, int(devices))
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_link_worker, args=(r, n, port, q, quick)) for r in range(n)]
    try:
        for p in procs:
            p.start()
        t0 = time.monotonic()
        while True:
            try:
                kind, val = q.get(timeout=0.2)
            except queue_mod.Empty:
                if time.monotonic() - t0 > timeout_s:
                    raise RunFailed(f"link calibration did not finish within {timeout_s:g} s")
                if any(p.exitcode not in (None, 0) for p in procs):
                    raise RunFailed("a link calibration worker died: " + ", ".join(
                        f"rank {r} exit code {p.exitcode}" for r, p in enumerate(procs)
                        if p.exitcode not in (None, 0)))
                continue
            if kind == "error":
                raise RunFailed(f"link calibration failed: {val}")
            return val
    finally:
        _kill(procs)
        q.close()
        q.cancel_join_thread()


def calibrate(devices: int = 2, model: str | None = None, batch: int | None = None,
              model_args: dict | None = None, quick: bool = False, write: bool = True,
              progress=None) -> dict:
    """Measure compute, memory and link speed; write ``$EXPLORER_HOME/local.json``.

    With ``model`` also profile every candidate configuration of every layer of that model on
    ``devices`` local workers into the profile cache.  Returns the calibration dict (plus
    ``path``, and ``profiled`` / ``profile_time_s`` with a model).
    """
    say = progress or (lambda msg: None)
    say("compute and memory bandwidth (1 thread)")
    comp = measure_compute(quick)
    say(f"point-to-point and all-reduce between {max(2, devices)} processes")
    link = measure_link(devices, quick)
    cal = {"peak_flops": comp["peak_flops"], "mem_bw": comp["mem_bw"],
           "link_bw": link["link_bw"], "latency": link["latency"],
           "matmul_flops": comp["matmul_flops"], "conv_flops": comp["conv_flops"],
           "pingpong_latency_s": link.get("pingpong_latency"),
           "latency_median_s": link.get("latency_median"),
           "allreduce_1k_s": link.get("allreduce_1k_s"),
           "allreduce_big_s": link.get("allreduce_big_s"),
           "allreduce_big_bytes": link.get("allreduce_big_bytes"),
           "devices": int(devices), "threads_per_worker": 1,
           "backend": "gloo", "measured_at": time.time()}
    path = _home() / "local.json"
    if write:
        path.write_text(json.dumps(cal, indent=2))
    cal["path"] = str(path)
    if model:
        say(f"profiling every candidate configuration of {model}")
        cal.update(profile_model(model, devices, batch, model_args,
                                 reps=5 if quick else 15, warmup=1 if quick else 3))
    return cal


def _shard_list(g, cm):
    """Every distinct (layer, output box shape, input region shapes) the cost model asks for."""
    out = []
    for name in g.names():
        layer = g.layer(name)
        if layer.op == "input":
            continue
        seen = set()
        for cfg in cm.candidates(name):
            for out_shape, in_shapes in cm.shard_shapes(layer, cfg):
                key = (tuple(out_shape), tuple(map(tuple, in_shapes)))
                if key not in seen:
                    seen.add(key)
                    out.append((name, out_shape, list(in_shapes)))
    return out


def _cold_profiler_class():
    """A :class:`~explorer.engine.profile.Profiler` that evicts the caches before every timed
    forward+backward run.

    In a training step each layer finds its weights and inputs evicted by the layers before
    it; the profiler's hot loop (the same tensors over and over) underestimates small layers
    by 30–50 % on this machine.  Writing a buffer larger than the last-level cache before each
    run reproduces the step's conditions.
    """
    import statistics as st

    from ..profile import Profiler, build_shard

    class ColdProfiler(Profiler):
        flush_bytes = int(os.environ.get("EXPLORER_PROFILE_FLUSH_MB", "8")) * 2 ** 20

        def _run(self, layer, out_shape, in_shapes):
            threads = torch.get_num_threads()
            if not self._cuda:
                torch.set_num_threads(1)
            flush = torch.empty(self.flush_bytes // 4, device=self.device)
            try:
                run, leaves = build_shard(layer, out_shape, in_shapes, self.device)
                outs = run()
                if tuple(outs[0].shape) != tuple(out_shape):
                    raise ValueError(f"profiling {layer.name} ({layer.op}): the shard has "
                                     f"output {tuple(outs[0].shape)}, geometry says "
                                     f"{tuple(out_shape)}")
                grads = [torch.ones_like(o) for o in outs]
                torch.autograd.backward(outs, grads)
                del outs
                times = []
                for i in range(self.warmup + self.reps):
                    for x in leaves:
                        x.grad = None
                    flush.fill_(float(i))
                    self._sync()
                    t = time.perf_counter()
                    torch.autograd.backward(run(), grads)
                    self._sync()
                    if i >= self.warmup:
                        times.append(time.perf_counter() - t)
                    if self.budget_s is not None and sum(times) > self.budget_s:
                        break
                return float(st.median(times or [0.0])), len(times)
            finally:
                if not self._cuda:
                    torch.set_num_threads(threads)

    return ColdProfiler


def _profile_into(path, model, devices, batch, model_args, reps, warmup, progress=None):
    from ..costmodel import CostModel
    from ..devices import local
    from ..importer import import_spec
    Profiler = _cold_profiler_class()
    g = import_spec(model, batch, dict(model_args or {}))
    dev = local(devices)
    cm = CostModel(g, dev, compute="measured")
    shards = _shard_list(g, cm)
    kind = dev.devices[0].kind
    with Profiler(path, reps=reps, warmup=warmup, budget_s=10.0) as prof:
        for i, (name, out_shape, in_shapes) in enumerate(shards):
            prof.measure(g.layer(name), out_shape, in_shapes, kind)
            if progress:
                progress(i + 1, len(shards))
    return len(shards)


def _profile_worker(rank, path, model, devices, batch, model_args, reps, warmup, q):
    from .worker import _set_pdeathsig, _threads
    _set_pdeathsig()
    _threads()
    try:
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[rank]})
    except (AttributeError, OSError, IndexError):
        pass
    try:
        n = _profile_into(path, model, devices, batch, model_args, reps, warmup)
        q.put(("ok", rank, n))
    except BaseException as exc:  # noqa: BLE001
        q.put(("error", rank, f"{type(exc).__name__}: {exc}"))


def _merge(paths, into):
    """Average the per-process measurements into the profile cache ``into``."""
    import sqlite3
    from contextlib import closing

    from ..profile import _SCHEMA
    rows: dict = {}
    for p in paths:
        with closing(sqlite3.connect(str(p))) as c:
            for kind, sig, shape, sec, reps, at in c.execute("SELECT * FROM profile"):
                rows.setdefault((kind, sig, shape), []).append((sec, reps, at))
    Path(into).parent.mkdir(parents=True, exist_ok=True)
    with closing(sqlite3.connect(str(into), timeout=60.0)) as c, c:
        c.execute(_SCHEMA)
        for key, vals in rows.items():
            sec = statistics.fmean(v[0] for v in vals)
            c.execute("INSERT OR REPLACE INTO profile VALUES (?, ?, ?, ?, ?, ?)",
                      key + (sec, sum(v[1] for v in vals), max(v[2] for v in vals)))
    return len(rows)


def profile_model(model: str, devices: int, batch: int | None = None,
                  model_args: dict | None = None, reps: int = 15, warmup: int = 3,
                  progress=None, concurrent: bool | None = None) -> dict:
    """Fill the profile cache for every (layer, candidate) of ``model`` on local workers.

    Each distinct shard shape the cost model will ask for is measured with ``reps`` timed
    runs (median; the cost model's own default is 5, too few on a noisy 2-core VM), with the
    caches evicted before each run as in a training step (see ``_cold_profiler_class``).  With
    ``concurrent`` (default when ``devices`` > 1 and there is a core per worker), one
    profiling process per worker measures the same shards at the same time, each on its own
    core, and the cache gets their mean: in a run every worker computes while the others do,
    and sharing the memory system costs 5–15 % here.  Then the cost tables are built once, so
    every later lookup is a cache hit.
    """
    from ..costmodel import CostModel
    from ..devices import local
    from ..importer import import_spec
    from ..profile import default_cache_path
    t = time.perf_counter()
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count() or 1
    nproc = min(devices, cores)
    if concurrent is None:
        concurrent = nproc > 1
    if concurrent and nproc > 1:
        import tempfile

        import torch.multiprocessing as mp

        from .launcher import RunFailed, _kill
        tmp = Path(tempfile.mkdtemp(prefix="explorer-profile-"))
        paths = [tmp / f"rank{r}.sqlite" for r in range(nproc)]
        ctx = mp.get_context("spawn")
        q = ctx.Queue()
        procs = [ctx.Process(target=_profile_worker, args=(r, str(paths[r]), model, devices,
                                                          batch, model_args, reps, warmup, q))
                 for r in range(nproc)]
        try:
            for p in procs:
                p.start()
            shards = 0
            for _ in procs:
                kind, rank, val = q.get(timeout=3600)
                if kind == "error":
                    raise RunFailed(f"profiling on worker {rank} failed: {val}")
                shards = val
        finally:
            _kill(procs)
            q.close()
            q.cancel_join_thread()
        _merge(paths, default_cache_path())
        shutil_rm(tmp)
    else:
        shards = _profile_into(None, model, devices, batch, model_args, reps, warmup,
                               progress)
    g = import_spec(model, batch, dict(model_args or {}))
    tables = CostModel(g, local(devices), compute="measured").tables()
    n = sum(len(c) for c in tables.candidates.values())
    return {"profiled": {"model": model, "layers": len(tables.names), "candidates": n,
                         "shards": shards, "concurrent_workers": nproc if concurrent else 1},
            "profile_time_s": time.perf_counter() - t}


def shutil_rm(path):
    import shutil
    shutil.rmtree(path, ignore_errors=True)

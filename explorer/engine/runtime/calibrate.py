"""``explorer calibrate``: measure this machine and write the ``local`` device graph's numbers.

Writes ``$EXPLORER_HOME/local.json`` with the keys :func:`explorer.engine.core.devices.local` reads:

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
  former, so the cost model must use it;
* ``swap_message_s`` – what each message beyond the first adds to such an exchange (the
  layer-wise runtime's gradient swap sends one message per parameter tensor);
* ``add_s`` / ``add_bw`` – one in-place add call and the bytes it touches per second (the
  runtime's SGD update and its sum of swapped gradients, :func:`measure_add`);

plus the raw measurements (ping-pong latency, all-reduce times, matmul/conv FLOP/s) for
reference.  With ``model`` it also fills the profile cache (SQLite) with the measured
forward+backward time of every candidate configuration of every layer and the time of every
operator of the training step, so ``explorer search MODEL --preset local --cost measured``
needs no further profiling, layer-wise or placement.
"""

from __future__ import annotations

import json
import os
import statistics
import time

import torch
import torch.nn.functional as F

from explorer.engine.core.storage import home


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


def measure_add(reps: int = 7, calls: int = 256, tensors: int = 8,
                elems: int = 2 ** 20) -> tuple:
    """The in-place add the layer-wise runtime makes for every parameter tensor twice a
    step - the SGD update ``p.add_(p.grad, alpha=-lr)``, the gradient dropped after it, and,
    in a replicated layer's gradient swap, ``g.add_(received)``: ``(add_s, add_bw)``, the
    seconds of one call on a tiny tensor (``calls`` of them in a loop, as the runtime's
    loop over shards) and the bytes touched per second (read both, write one: 12 bytes per
    float32 element) of ``tensors`` calls on ``elems`` elements each beyond that, on
    gradients freshly made as a backward pass makes them and freed after the add.  The
    median: a step pays the usual time, not the best.  Run in every worker at once
    (:func:`_link_worker`), as the workers of a data-parallel step update together and
    share the memory system."""
    small = [(torch.zeros(16), torch.zeros(16)) for _ in range(calls)]
    ts = []
    for _ in range(reps + 1):
        t = time.perf_counter()
        for p, g in small:
            p.add_(g, alpha=-0.01)
        ts.append((time.perf_counter() - t) / calls)
    add_s = statistics.median(ts[1:])
    ps = [torch.zeros(elems) for _ in range(tensors)]
    ts = []
    for _ in range(reps + 1):
        for p in ps:
            p.grad = torch.empty(elems).fill_(1.0)
        t = time.perf_counter()
        for p in ps:
            p.add_(p.grad, alpha=-0.01)
            p.grad = None
        ts.append(time.perf_counter() - t)
    t_big = statistics.median(ts[1:])
    return add_s, 12.0 * elems * tensors / max(t_big - tensors * add_s, 1e-9)


def _link_worker(rank, world, device, quick, send):
    """Rank ``rank`` of the link measurement (an entry of :func:`launcher.start_workers`:
    gloo group joined, one thread, pinned to its core); rank 0 sends the numbers."""
    import torch.distributed as dist
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
        res["swap_message_s"] = _swap_message(peer, reps, x, w, small, res["latency"])
        # one-way point-to-point as a placement's step pays it: the receiver has posted its
        # irecv and waits, the sender computes, then isends; the message carries its send
        # time (the monotonic clock is the machine's), small (latency) and 1 MB (bandwidth)
        res.update(_one_way(rank, peer, reps, x, w))
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
    res["add_s"], res["add_bw"] = measure_add(4 if quick else 7)    # every worker at once
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
        send("result", "link", res)
    dist.barrier()


def _swap_message(peer, reps, x, w, small, one: float, k: int = 8) -> float:
    """Seconds each message beyond the first adds to an exchange: the layer-wise runtime's
    gradient swap posts one ``irecv`` and one ``isend`` per parameter tensor of the layer
    and waits for all of them (:meth:`.executor.Executor._sync_grads`).  Measured as the
    latency is (``one``: the mean of one 1 KB message each way, the workers computing
    between exchanges), with ``k`` messages each way: ``(mean_k - one) / (k - 1)``."""
    import torch.distributed as dist
    sends = [small.clone() for _ in range(k)]
    recvs = [torch.empty_like(small) for _ in range(k)]
    ts = []
    for i in range(reps + 5):
        F.conv2d(x, w)
        t = time.perf_counter()
        ws = [dist.irecv(b, peer, tag=10 + j) for j, b in enumerate(recvs)]
        ws += [dist.isend(b, peer, tag=10 + j) for j, b in enumerate(sends)]
        for wk in ws:
            wk.wait()
        if i >= 5:
            ts.append(time.perf_counter() - t)
    return max(statistics.fmean(ts) - one, 0.0) / (k - 1)


def _one_way(rank, peer, reps, x, w) -> dict:
    """``p2p_latency_s`` (median one-way time of a 1 KB isend into a posted irecv whose
    process is waiting for it, the sender computing between messages) and ``p2p_bw`` (1 MB
    the same way: bytes over its time less the latency), both directions in turn; and
    what the ``isend`` call itself takes the sender's thread (``p2p_send_s`` for 1 KB,
    ``p2p_send_bw`` for the bytes beyond: gloo writes into the socket from the call), and
    what receiving takes the receiver's thread - the run's own calls
    (:mod:`.compiled`: the buffer allocated and the ``irecv`` posted, then waited for), on
    its CPU clock, so the time it sleeps waiting is not in it (``p2p_recv_s`` for 1 KB,
    ``p2p_recv_bw`` for the bytes beyond).  The median, as the operators' times are each
    one's time alone: the turns other processes take on a shared machine are in the means
    (``*_mean_s``), not in the model."""
    import torch.distributed as dist

    from explorer.engine.runtime.compiled import irecv_into, wait_recv
    out = {}
    for nbytes in (1024, 2 ** 20):
        buf, ack = torch.zeros(nbytes // 8, dtype=torch.float64), torch.zeros(1)
        ts, calls, rcalls = [], [], []
        for i in range(reps + 4):
            if rank == i % 2:                      # the sender
                F.conv2d(x, w)
                buf[0] = t0 = time.perf_counter()
                work = dist.isend(buf, peer, tag=2)
                if i >= 4:
                    calls.append(time.perf_counter() - t0)
                work.wait()
                dist.recv(ack, peer, tag=3)         # the next message after this one landed
            else:
                c0 = time.thread_time()
                got = wait_recv(irecv_into(tuple(buf.shape), buf.dtype, peer, 2))
                if i >= 4:
                    rcalls.append(time.thread_time() - c0)
                    ts.append(time.perf_counter() - float(got[0]))
                dist.send(ack, peer, tag=3)
        out[nbytes] = statistics.median(ts)
        out[-nbytes] = statistics.fmean(ts)
        out[("call", nbytes)] = statistics.median(calls)
        out[("recv", nbytes)] = statistics.median(rcalls)
    lat, call, rcall = out[1024], out[("call", 1024)], out[("recv", 1024)]
    return {"p2p_latency_s": lat,
            "p2p_bw": (2 ** 20 - 1024) / max(out[2 ** 20] - lat, 1e-9),
            "p2p_1mb_s": out[2 ** 20], "p2p_latency_mean_s": out[-1024],
            "p2p_1mb_mean_s": out[-2 ** 20], "p2p_send_s": call,
            "p2p_send_bw": (2 ** 20 - 1024) / max(out[("call", 2 ** 20)] - call, 1e-9),
            "p2p_recv_s": rcall,
            "p2p_recv_bw": (2 ** 20 - 1024) / max(out[("recv", 2 ** 20)] - rcall, 1e-9)}


def measure_link(devices: int = 2, quick: bool = False, timeout_s: float = 120.0) -> dict:
    """Point-to-point and all-reduce numbers between ``devices`` (≥ 2) gloo processes."""
    from explorer.engine.runtime.launcher import RunFailed, start_workers
    try:
        got = start_workers(max(2, int(devices)), _link_worker, quick, timeout_s=timeout_s,
                            backend="gloo", name="explorer-calibrate", kind="cpu")
    except RunFailed as exc:
        raise RunFailed(f"link calibration: {exc}", exc.rank, exc.pids) from None
    return got.results[0]["link"]


def _cores() -> int:
    """The cores this process (and the workers it starts) may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def calibrate(devices: int | None = None, model: str | None = None, batch: int | None = None,
              model_args: dict | None = None, quick: bool = False, write: bool = True,
              progress=None, profiled=None, dtype: str = "fp32") -> dict:
    """Measure compute, memory and link speed; write ``$EXPLORER_HOME/local.json``.

    On a GPU machine (the workers' device kind, ``$EXPLORER_DEVICE``, is ``cuda``) the GPUs are
    measured instead (:func:`calibrate_gpus`: ``devices`` GPUs, default all); on CPU
    ``devices`` worker processes (default 2).  ``noise`` records the CPU stolen by other
    tenants and the machine's speed before and after the measurement (:mod:`.noise`).

    With ``model`` also profile every candidate configuration of every layer of that model on
    ``devices`` local workers into the profile cache.  Returns the calibration dict (plus
    ``path``, and ``profiled`` / ``profile_time_s`` with a model).
    """
    from explorer.engine.core.devices import worker_device_kind
    if worker_device_kind() == "cuda":          # GPUs here (and not $EXPLORER_DEVICE=cpu)
        return calibrate_gpus(devices, model, batch, model_args, quick, write, progress,
                              profiled, dtype)
    from explorer.engine.runtime.noise import Monitor
    devices = 2 if devices is None else int(devices)
    say = progress or (lambda msg: None)
    with Monitor() as watch:
        say("compute and memory bandwidth (1 thread)")
        comp = measure_compute(quick)
        say(f"point-to-point and all-reduce between {max(2, devices)} processes")
        link = measure_link(devices, quick)
    cal = {"peak_flops": comp["peak_flops"], "mem_bw": comp["mem_bw"],
           "link_bw": link["link_bw"], "latency": link["latency"],
           "swap_message_s": link.get("swap_message_s"),
           "add_s": link.get("add_s"), "add_bw": link.get("add_bw"),
           "matmul_flops": comp["matmul_flops"], "conv_flops": comp["conv_flops"],
           "pingpong_latency_s": link.get("pingpong_latency"),
           "p2p_latency_s": link.get("p2p_latency_s"), "p2p_bw": link.get("p2p_bw"),
           "p2p_1mb_s": link.get("p2p_1mb_s"),
           "p2p_latency_mean_s": link.get("p2p_latency_mean_s"),
           "p2p_1mb_mean_s": link.get("p2p_1mb_mean_s"),
           "p2p_send_s": link.get("p2p_send_s"), "p2p_send_bw": link.get("p2p_send_bw"),
           "p2p_recv_s": link.get("p2p_recv_s"), "p2p_recv_bw": link.get("p2p_recv_bw"),
           "latency_median_s": link.get("latency_median"),
           "allreduce_1k_s": link.get("allreduce_1k_s"),
           "allreduce_big_s": link.get("allreduce_big_s"),
           "allreduce_big_bytes": link.get("allreduce_big_bytes"),
           "devices": int(devices), "threads_per_worker": 1, "cores": _cores(),
           "backend": "gloo", "measured_at": time.time(), "noise": watch.report()}
    path = home() / "local.json"
    if write:
        path.write_text(json.dumps(cal, indent=2))
    cal["path"] = str(path)
    if model:
        say(f"profiling every candidate configuration of {model}")
        cal.update(profile_model(model, devices, batch, model_args,
                                 reps=5 if quick else 15, warmup=1 if quick else 3,
                                 progress=profiled, dtype=dtype))
        say(f"timing every operator of {model}'s training step (placement methods)")
        cal["op_profile"] = profile_ops(model, batch, model_args, quick, devices)
    return cal


def profile_ops(model: str, batch: int | None = None, model_args: dict | None = None,
                quick: bool = False, devices: int = 2) -> dict:
    """Time every aten call of the model's training step on this machine into the profile
    cache (:func:`explorer.engine.core.profile.op_times`) as ``devices`` placement workers run
    it side by side (as many at once as there are cores), so a placement search with
    ``--cost measured`` on that many local workers needs no further measuring.  Returns ``{"ops", "seconds", "step_s"}``."""
    from explorer.engine.core.devices import local
    from explorer.engine.core.opgraph import build_opgraph
    from explorer.engine.core.profile import op_times
    from explorer.engine.runtime.compiled import instep_op_times
    g = build_opgraph(model, batch, dict(model_args or {}))
    times, info = op_times(g, local(1).devices[0].kind, reps=3 if quick else 7,
                           fresh=True,    # this machine now, not an earlier measurement
                           in_step=max(1, min(int(devices), _cores())),
                           measure=instep_op_times)
    return {"ops": info["ops"], "seconds": info["seconds"], "step_s": sum(times.values())}


def _shard_list(g, cm):
    """Every distinct (layer, output box shape, input region shapes, input gradient flags,
    device counts of the configurations that use it) the cost model asks for (the keys
    :meth:`CostModel._measured` looks up)."""
    out = []
    for name in g.names():
        layer = g.layer(name)
        if layer.op == "input":
            continue
        seen: dict = {}
        grads = cm.input_grads(name)
        for cfg in cm.candidates(name):
            for out_shape, in_shapes in cm.shard_shapes(layer, cfg):
                key = (tuple(out_shape), tuple(map(tuple, in_shapes)))
                if key not in seen:
                    seen[key] = (name, out_shape, list(in_shapes), grads, set())
                    out.append(seen[key])
                seen[key][4].add(cfg.total)
    return out


def _graph_and_shards(model, devices, batch, model_args):
    from explorer.engine.layerwise.costmodel import CostModel
    from explorer.engine.core.devices import local
    from explorer.engine.core.importer import import_spec
    g = import_spec(model, batch, dict(model_args or {}))
    dev = local(devices)
    cm = CostModel(g, dev, compute="measured")
    return g, dev.devices[0].kind, _shard_list(g, cm)


def _profile_into(path, model, devices, batch, model_args, reps, warmup, progress=None,
                  dtype: str = "fp32"):
    """Every shard alone (one process), cold, in precision ``dtype``, into the cache at
    ``path``."""
    from explorer.engine.core.profile import Profiler
    g, kind, shards = _graph_and_shards(model, devices, batch, model_args)
    # cold: the caches are evicted before every run, as the layers before it do in a step
    with Profiler(path, reps=reps, warmup=warmup, budget_s=10.0, cold=True,
                  dtype=dtype) as prof:
        for i, (name, out_shape, in_shapes, grads, _) in enumerate(shards):
            prof.measure(g.layer(name), out_shape, in_shapes, kind, input_grads=grads)
            if progress:
                progress(i + 1, len(shards))
    return len(shards)


def _lockstep_worker(rank, k, device, job, send):
    """Rank ``rank`` of ``k`` profiling processes (an entry of :func:`launcher.start_workers`,
    each pinned to its own core): time every shard used by k-device configurations, all
    processes starting each run together (a barrier before it); sends the times."""
    from explorer.engine.core.profile import Profiler, build_shard
    model, devices, batch, model_args, reps, warmup, barrier = job
    g, _, shards = _graph_and_shards(model, devices, batch, model_args)
    shards = [s for s in shards if k in s[4]]
    flush = torch.empty(Profiler(":memory:").flush_bytes // 4)
    out = []
    for (name, out_shape, in_shapes, grads, _), n in zip(shards, reps):
        run, leaves = build_shard(g.layer(name), out_shape, in_shapes, input_grads=grads)
        backward = bool(leaves)
        outs = run()
        ograds = [torch.ones_like(o) for o in outs]
        if backward:
            torch.autograd.backward(outs, ograds)
        del outs
        times = []
        for i in range(warmup + n):
            for x in leaves:
                x.grad = None
            flush.fill_(float(i))
            barrier.wait(timeout=600)
            t = time.perf_counter()
            outs = run()
            if backward:
                torch.autograd.backward(outs, ograds)
            if i >= warmup:
                times.append(time.perf_counter() - t)
            del outs
        out.append(times)
    send("result", "times", out)


def _profile_lockstep(k, model, devices, batch, model_args, reps, warmup,
                      budget_s: float = 5.0) -> int:
    """Time the shards of every k-device configuration with k processes in lockstep and
    record, per shard, the median over runs of the slowest process's time (a step waits for
    the slowest worker) under ``concurrency=k``.  Returns the number of shards."""
    import torch.multiprocessing as mp

    from explorer.engine.core.profile import Profiler, default_cache_path
    from explorer.engine.runtime.launcher import RunFailed, start_workers
    g, kind, shards = _graph_and_shards(model, devices, batch, model_args)
    shards = [s for s in shards if k in s[4]]
    if not shards:
        return 0
    with Profiler(default_cache_path()) as prof:
        # as many timed runs as fit in the budget, from the shard's time alone (all
        # processes must run the same count)
        counts = []
        for name, out_shape, in_shapes, grads, _ in shards:
            alone = prof.lookup(g.layer(name), out_shape, in_shapes, kind, grads) or 0.0
            counts.append(max(1, min(reps, int(budget_s // max(alone, 1e-9)))))
    barrier = mp.get_context("spawn").Barrier(k)
    try:
        got = start_workers(k, _lockstep_worker, (model, devices, batch, model_args, counts,
                                                  warmup, barrier),
                            timeout_s=3600.0, backend="gloo", name="explorer-profile",
                            kind="cpu")
    except RunFailed as exc:
        raise RunFailed(f"lockstep profiling: {exc}", exc.rank, exc.pids) from None
    res = {r: v["times"] for r, v in got.results.items()}
    with Profiler(default_cache_path()) as prof:
        for j, (name, out_shape, in_shapes, grads, _) in enumerate(shards):
            runs = [max(res[r][j][i] for r in range(k)) for i in range(counts[j])]
            prof.record(g.layer(name), out_shape, in_shapes, kind, statistics.median(runs),
                        reps=counts[j], input_grads=grads, concurrency=k)
    return len(shards)


def profile_model(model: str, devices: int, batch: int | None = None,
                  model_args: dict | None = None, reps: int = 15, warmup: int = 3,
                  progress=None, concurrent: bool | None = None, dtype: str = "fp32") -> dict:
    """Fill the profile cache for every (layer, candidate) of ``model`` on local workers.

    Each distinct shard shape the cost model will ask for is measured alone with ``reps``
    timed runs (median; the cost model's own default is 5, too few on a noisy 2-core VM), with
    the caches evicted before each run as in a training step (``Profiler(cold=True)``): in a
    run, a layer on one device computes while the others wait.  With ``concurrent`` (default
    when ``devices`` > 1 and there is a core per worker), the shards of configurations that
    use every worker are measured again with one process per worker, each on its own core,
    all starting every run together, and the slowest process's time is stored for that
    worker count: in a run those workers compute at once, share the memory system (5–20 %
    slower here) and the step waits for the slowest.  Then the cost tables are built once,
    so every later lookup is a cache hit.  ``dtype``: the precision the shards are timed in
    (``search --cost measured --dtype`` reads them); the lockstep pass is fp32's only (in
    another precision a configuration's shards count alone).
    """
    from explorer.engine.layerwise.costmodel import CostModel
    from explorer.engine.core.devices import local
    from explorer.engine.core.importer import import_spec
    t = time.perf_counter()
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count() or 1
    nproc = min(devices, cores)
    if concurrent is None:
        concurrent = nproc > 1
    if dtype != "fp32":
        concurrent = False
    shards = _profile_into(None, model, devices, batch, model_args, reps, warmup, progress,
                           dtype)
    together = 0
    if concurrent and nproc > 1:
        together = _profile_lockstep(nproc, model, devices, batch, model_args, reps, warmup)
    g = import_spec(model, batch, dict(model_args or {}))
    tables = CostModel(g, local(devices), compute="measured", dtype=dtype).tables()
    n = sum(len(c) for c in tables.candidates.values())
    return {"profiled": {"model": model, "layers": len(tables.names), "candidates": n,
                         "shards": shards, "shards_in_lockstep": together,
                         "concurrent_workers": nproc if concurrent else 1},
            "profile_time_s": time.perf_counter() - t}



# --------------------------------------------------------------------------------------------
# On CUDA GPUs (``explorer calibrate`` where the workers are GPUs: ``$EXPLORER_DEVICE``)
# --------------------------------------------------------------------------------------------

#: the precisions calibrated on a GPU: fp32 with TF32 off, TF32 tensor cores, bf16
GPU_DTYPES = ("fp32", "tf32", "bf16")


class _precision:
    """Context: ``fp32`` (TF32 off for matmul and cuDNN), ``tf32`` (on), ``bf16`` (tensors in
    bfloat16; TF32 setting irrelevant).  Restores the flags."""

    def __init__(self, name: str):
        self.name = name

    def __enter__(self):
        self.saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
        on = self.name == "tf32"
        torch.backends.cuda.matmul.allow_tf32 = on
        torch.backends.cudnn.allow_tf32 = on
        return torch.bfloat16 if self.name == "bf16" else torch.float32

    def __exit__(self, *exc):
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = self.saved
        return False


def _cuda_best(fn, device, reps: int = 10, warm: int = 3) -> float:
    """Seconds of ``fn``'s kernels: the best of ``reps`` runs timed with CUDA events, after
    ``warm`` untimed runs (library initialisation, algorithm selection)."""
    from explorer.engine.runtime.timing import EventTimer
    for _ in range(warm):
        fn()
    torch.cuda.synchronize(device)
    best = float("inf")
    t = EventTimer(device)
    for _ in range(reps):
        t.start()
        fn()
        t.stop()
        best = min(best, t.seconds())
    return best


def measure_gpu(device: str = "cuda:0", quick: bool = False, progress=None) -> dict:
    """One GPU's rates, timed with CUDA events after warm-up: square matmul and 3×3
    convolution FLOP/s per precision (:data:`GPU_DTYPES`), HBM bandwidth (a device-to-device
    copy, read + write), host-to-device and device-to-host copies from pinned memory."""
    import torch.nn.functional as F_
    say = progress or (lambda msg: None)
    dev = torch.device(device)
    torch.cuda.set_device(dev)
    n = 4096 if quick else 8192
    reps = 5 if quick else 10
    out: dict = {"matmul_flops_by_dtype": {}, "conv_flops_by_dtype": {}}

    def matmul(dt) -> float:
        a = torch.randn(n, n, device=dev, dtype=dt)
        b = torch.randn(n, n, device=dev, dtype=dt)
        return 2.0 * n ** 3 / _cuda_best(lambda: torch.mm(a, b), dev, reps)

    def conv(dt) -> float:
        x = torch.randn(32 if quick else 64, 256, 56, 56, device=dev, dtype=dt)
        w = torch.randn(256, 256, 3, 3, device=dev, dtype=dt)
        t = _cuda_best(lambda: F_.conv2d(x, w, padding=1), dev, reps)
        return 2.0 * x.shape[0] * 256 * 56 * 56 * 256 * 9 / t

    def copies(m: int) -> tuple:
        src = torch.empty(m // 4, device=dev)
        dst = torch.empty_like(src)
        host = torch.empty(m // 4, pin_memory=True)
        return (2.0 * m / _cuda_best(lambda: dst.copy_(src), dev, reps),
                m / _cuda_best(lambda: src.copy_(host, non_blocking=True), dev, reps),
                m / _cuda_best(lambda: host.copy_(src, non_blocking=True), dev, reps))

    for name in GPU_DTYPES:
        say(f"matmul and convolution in {name}")
        with _precision(name) as dt:
            out["matmul_flops_by_dtype"][name] = matmul(dt)
            out["conv_flops_by_dtype"][name] = conv(dt)
    say("device memory bandwidth and host copies")
    out["mem_bw"], out["h2d_bw"], out["d2h_bw"] = copies((256 if quick else 1024) * 2 ** 20)
    torch.cuda.empty_cache()
    out["matmul_flops"] = out["matmul_flops_by_dtype"]["fp32"]
    out["conv_flops"] = out["conv_flops_by_dtype"]["fp32"]
    out["peak_flops"] = max(out["matmul_flops"], out["conv_flops"])     # float32, TF32 off
    props = torch.cuda.get_device_properties(dev)
    out.update(gpu_name=props.name, gpu_memory=float(props.total_memory))
    return out


def _gpu_link_worker(rank, world, device, quick, send):
    """Rank ``rank`` of the NCCL measurement between GPUs (an entry of
    :func:`launcher.start_workers`, one GPU each): point-to-point 1 KB (latency) and 64 MB
    (bandwidth) between ranks 0 and 1, all-reduce of 1 KB and 64 MB over all; synchronised
    clocks after warm-up.  Rank 0 sends the numbers."""
    import torch.distributed as dist
    from explorer.engine.runtime.timing import clock
    dev = torch.device(device)
    pc = clock(dev)
    reps = 10 if quick else 30
    res = {}
    for nbytes, key in ((1024, "latency"), ((16 if quick else 64) * 2 ** 20, "link")):
        buf = torch.zeros(nbytes // 4, device=dev)
        ts = []
        for i in range(reps + 3):
            dist.barrier()
            t = pc()
            if rank == 0:
                dist.send(buf, 1)
                dist.recv(buf, 1)
            elif rank == 1:
                dist.recv(buf, 0)
                dist.send(buf, 0)
            if i >= 3:
                ts.append((pc() - t) / 2)        # one way
        if key == "latency":
            res["latency"] = statistics.median(ts)
        else:
            res["link_bw"] = nbytes / max(statistics.median(ts) - res["latency"], 1e-9)
            res["link_bytes"] = nbytes
    for nbytes, key in ((1024, "allreduce_1k_s"), ((16 if quick else 64) * 2 ** 20,
                                                   "allreduce_big_s")):
        t_ = torch.ones(nbytes // 4, device=dev)
        ts = []
        for i in range(reps + 3):
            dist.barrier()
            t = pc()
            dist.all_reduce(t_)
            if i >= 3:
                ts.append(pc() - t)
        res[key] = statistics.median(ts)
        if key == "allreduce_big_s":
            res["allreduce_big_bytes"] = nbytes
    if rank == 0:
        send("result", "link", res)
    dist.barrier()


def measure_gpu_links(gpus: int, quick: bool = False, timeout_s: float = 120.0) -> dict:
    """NCCL point-to-point and all-reduce between ``gpus`` (≥ 2) local GPUs, one worker each."""
    from explorer.engine.runtime.launcher import RunFailed, start_workers
    try:
        got = start_workers(int(gpus), _gpu_link_worker, quick, timeout_s=timeout_s,
                            backend="nccl", kind="cuda", name="explorer-calibrate-gpu")
    except RunFailed as exc:
        raise RunFailed(f"GPU link calibration: {exc}", exc.rank, exc.pids) from None
    return got.results[0]["link"]


def gpu_calibration(compute: dict, links: dict | None, gpus: int,
                    measured_at: float | None = None) -> dict:
    """The calibration document of a GPU machine (what :func:`explorer.engine.core.devices.
    local_gpus` reads) from :func:`measure_gpu`'s ``compute`` and, with two GPUs or more,
    :func:`measure_gpu_links`' ``links``: ``backend`` ``nccl`` (several GPUs) or ``cuda``
    (one), ``device_kind`` ``cuda``, ``peak_flops`` (float32, TF32 off), per precision
    ``matmul_flops_by_dtype`` / ``conv_flops_by_dtype``, ``mem_bw``, ``h2d_bw``,
    ``d2h_bw``, ``link_bw`` / ``latency`` (NCCL one way; one GPU: the host-staged path's
    estimate from the host copies) and the all-reduce times.  Pure: no device is touched."""
    need = ("matmul_flops_by_dtype", "conv_flops_by_dtype", "mem_bw", "h2d_bw", "d2h_bw")
    missing = [k for k in need if compute.get(k) is None]
    if missing:
        raise ValueError(f"GPU calibration without {', '.join(missing)}")
    for what in ("matmul_flops_by_dtype", "conv_flops_by_dtype"):
        bad = [k for k in GPU_DTYPES if not float(compute[what].get(k, 0)) > 0]
        if bad:
            raise ValueError(f"GPU calibration: {what} has no positive {', '.join(bad)}")
    mm = {k: float(v) for k, v in compute["matmul_flops_by_dtype"].items()}
    cv = {k: float(v) for k, v in compute["conv_flops_by_dtype"].items()}
    gpus = int(gpus)
    cal = {"backend": "nccl" if gpus > 1 else "cuda", "device_kind": "cuda", "gpus": gpus,
           "gpu_name": compute.get("gpu_name"), "gpu_memory": compute.get("gpu_memory"),
           "peak_flops": max(mm["fp32"], cv["fp32"]), "matmul_flops": mm["fp32"],
           "conv_flops": cv["fp32"], "matmul_flops_by_dtype": mm,
           "conv_flops_by_dtype": cv, "mem_bw": float(compute["mem_bw"]),
           "h2d_bw": float(compute["h2d_bw"]), "d2h_bw": float(compute["d2h_bw"]),
           # workers sharing a GPU talk over gloo through host memory: down and up again
           "staged_link_bw": 1.0 / (1.0 / float(compute["d2h_bw"]) +
                                    1.0 / float(compute["h2d_bw"]) + 1.0 / 9e9),
           "threads_per_worker": 1, "measured_at": measured_at if measured_at is not None
           else time.time()}
    if links:
        cal.update(link_bw=float(links["link_bw"]), latency=float(links["latency"]),
                   allreduce_1k_s=links.get("allreduce_1k_s"),
                   allreduce_big_s=links.get("allreduce_big_s"),
                   allreduce_big_bytes=links.get("allreduce_big_bytes"))
    else:
        cal.update(link_bw=cal["staged_link_bw"], latency=200e-6)
    return cal


def calibrate_gpus(devices: int | None = None, model: str | None = None,
                   batch: int | None = None, model_args: dict | None = None,
                   quick: bool = False, write: bool = True, progress=None,
                   profiled=None, dtype: str = "fp32") -> dict:
    """``explorer calibrate`` on a GPU machine: :func:`measure_gpu` on the first GPU, NCCL
    links between ``devices`` GPUs (default all) when there are two or more; written to
    ``$EXPLORER_HOME/local.json`` (:func:`gpu_calibration`).  With ``model``: the profile cache
    filled on the GPU (every candidate configuration's shards, then every operator of the
    step), kernels timed after warm-up."""
    from explorer.engine.core.devices import DeviceRequestError, gpu_count
    say = progress or (lambda msg: None)
    have = gpu_count()
    if have < 1:
        raise DeviceRequestError("no CUDA GPU to calibrate: use --device cpu")
    gpus = have if devices is None else int(devices)
    if gpus > have:
        raise DeviceRequestError(f"{gpus} GPUs asked for, this machine has {have}")
    say(f"one GPU ({torch.cuda.get_device_name(0)})")
    comp = measure_gpu("cuda:0", quick, progress)
    links = None
    if gpus > 1:
        say(f"NCCL point-to-point and all-reduce between {gpus} GPUs")
        links = measure_gpu_links(gpus, quick)
    cal = gpu_calibration(comp, links, gpus)
    path = home() / "local.json"
    if write:
        path.write_text(json.dumps(cal, indent=2))
    cal["path"] = str(path)
    if model:
        say(f"profiling every candidate configuration of {model} on the GPU")
        cal.update(profile_model(model, gpus, batch, model_args, reps=5 if quick else 15,
                                 warmup=2 if quick else 5, progress=profiled,
                                 concurrent=False, dtype=dtype))
        say(f"timing every operator of {model}'s training step on the GPU")
        cal["op_profile"] = profile_ops(model, batch, model_args, quick, 1)
    return cal

"""The worker side: one rank of a process group, running an executor's entry.

Used two ways:

* by :func:`explorer.engine.runtime.launcher.start_workers`, which spawns N local processes
  and runs :func:`process_main` in each (:func:`join_group`, then the executor's entry:
  :func:`run_jobs` for layer-wise plans, the operator-level executor's for Tofu plans and
  placements);
* under ``torchrun`` (layer-wise plans), so a plan can span several machines with torchrun's
  rendezvous::

      torchrun --standalone --nproc_per_node 2 \\
               -m explorer.engine.runtime.worker PLAN.json --steps 20
      # several machines (same command on each, node_rank 0..N-1):
      torchrun --nnodes 2 --nproc_per_node 4 --node_rank $R --rdzv_backend c10d \\
               --rdzv_endpoint HOST:29400 -m explorer.engine.runtime.worker PLAN.json

  The worker reads ``RANK``, ``WORLD_SIZE`` and ``LOCAL_RANK`` (and ``MASTER_ADDR``/
  ``MASTER_PORT``) from the environment; rank 0 prints the report (``--json`` for JSON) and
  writes it to ``--out``.  Without those variables the command runs the plan locally, of
  any kind (same as ``explorer run``).

A job: ``{"plan": plan dict, "steps": 20, "warmup": 5, "check": true, "lr": 0.01, "seed": 0,
"fault": "RANK:STEP[:raise|exit|hang]" (tests), "dump": path (rank 0 saves the checked
step's loss, parameters and gradients with ``torch.save``; debugging)}``.  The environment variable
``EXPLORER_RUNTIME_FAULT`` injects the same fault (test hook).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import time
import traceback
import zlib
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist

from explorer.engine.runtime.faults import FAULT_ENV, WorkerError, inject_fault  # noqa: F401 - re-exported



#: ``[(key, (float32 step, float64 step))]``: the last single-device reference steps this
#: worker computed.  Plans of one model launched together (the example tests, ``explorer
#: rank``) share them: a reference depends on the model's values, the input, the rate and the
#: precision - not on the plan - so it is computed once per model, not once per plan.
_LAST_REF: list = []


def fingerprint(model, x) -> tuple:
    """What a reference step starts from: every parameter's and buffer's name, shape, dtype
    and contents, and the input's (two plans of a model built from one seed agree).  The
    contents are a CRC-32 of the bytes on the CPU (exact, and several times cheaper than
    summing in float64), a float64 sum and absolute sum on an accelerator."""
    def contents(t):
        if t.device.type == "cpu":
            return (zlib.crc32(t.reshape(-1).contiguous().view(torch.uint8).numpy()),)
        if not (t.is_floating_point() or t.is_complex()):
            t = t.double()
        return (float(t.sum(dtype=torch.float64)),
                float(torch.linalg.vector_norm(t, 1, dtype=torch.float64)))

    with torch.no_grad():
        parts = tuple((n, tuple(t.shape), str(t.dtype), *contents(t))
                      for n, t in itertools.chain(model.named_parameters(),
                                                  model.named_buffers()))
        return parts + ((tuple(x.shape), str(x.dtype), *contents(x)),)


def _barrier(world):
    if world > 1:
        dist.barrier()


def run_job(job: dict, rank: int, world: int, device: str = "cpu", progress=None):
    """Run one job on this rank; rank 0 returns the result dict, other ranks ``None``."""
    from explorer.engine.layerwise.plan import Plan
    from explorer.engine.runtime.executor import PHASES, Executor
    from explorer.engine.runtime.faults import parse_fault
    from explorer.engine.runtime.reference import compare, reference_step
    from explorer.engine.core import precision as P
    from explorer.engine.runtime.timing import clock, is_cuda, peak_allocated, reset_peak

    t_start = time.perf_counter()
    plan = Plan.from_dict(job["plan"])
    steps, warmup = int(job.get("steps", 20)), int(job.get("warmup", 5))
    lr = float(job.get("lr", 0.01))
    fault = parse_fault(job.get("fault") or os.environ.get(FAULT_ENV))
    ex = None
    try:
        ex = Executor(plan, rank, world, lr=lr, seed=int(job.get("seed", 0)), device=device,
                      fault=fault, sync=job.get("sync", "auto"))
        setup_s = time.perf_counter() - t_start
        _barrier(world)
        gathered, loss = None, None
        total = warmup + steps + (1 if job.get("check", True) else 0)
        done = 0
        check_s = reference_s = 0.0
        memory = None                  # the step's live memory by category (.memtrack)
        if job.get("check", True):
            t_check = time.perf_counter()
            _, extra = ex.step(check=True, measure=True)
            memory = extra["memory"]
            loss = extra["loss"]
            ex.phase = "gathering parameters on rank 0"
            gathered = ex.gather(extra["grads"])
            check_s = time.perf_counter() - t_check
            done += 1
            if progress:
                progress(done, total)
        step_times, timings = [], []
        pc = clock(device)             # on CUDA: synchronised, the step's kernels included
        # On CUDA the timed steps queue their kernels without waiting between phases (a
        # synchronisation per layer and phase would add its latency to every layer), and one
        # more step with synchronised phases gives the per-layer breakdown.
        phased = ex.clock
        cuda = is_cuda(device)
        reset_peak(device)
        for i in range(warmup + steps):
            ex.phase = "barrier before a step"
            _barrier(world)
            if cuda:
                ex.clock = time.perf_counter if i >= warmup else phased
            t0 = pc()
            measure = memory is None and i < warmup     # a warm-up step, not a timed one
            tm, extra = ex.step(measure=measure)
            t1 = pc()
            if measure:
                memory = extra["memory"]
            if i >= warmup:
                step_times.append(t1 - t0)
                if not cuda:
                    timings.append(tm)
            done += 1
            if progress:
                progress(done, total)
        if cuda:
            ex.clock = phased
            if steps:
                ex.phase = "barrier before the breakdown step"
                _barrier(world)
                tm, _ = ex.step()
                timings.append(tm)
        ex.phase = "collecting timings"
        payload = (step_times, np.asarray(timings), ex.participation(),
                   peak_allocated(device), memory)
        if world > 1:
            objs = [None] * world
            dist.all_gather_object(objs, payload)
        else:
            objs = [payload]
        if rank != 0:
            return None
        ref = None
        if gathered is not None and job.get("dump"):
            torch.save({"loss": loss, "params": gathered[0], "grads": gathered[1]}, job["dump"])
        t_ref = time.perf_counter()
        if gathered is not None:
            ex.phase = "reference check"
            params, grads = gathered
            mode = job.get("reference", "both")
            # the plan's precision: the single-device run computes in it, and the tolerance
            # is its own (precision.TOLERANCE) unless the caller set one
            prec = ex.dtype
            tol = job.get("tol")
            tol = P.tolerance(prec) if tol is None else float(tol)
            key = (mode, prec, lr, fingerprint(ex.model, ex.x))
            if _LAST_REF and _LAST_REF[0][0] == key:      # another plan of this model
                ref32, ref64, memo = _LAST_REF[0][1]
            else:
                _LAST_REF.clear()
                ref32 = ref64 = None
                if mode in ("both", "float32"):
                    import copy
                    m32 = copy.deepcopy(ex.model) if mode == "both" else ex.model
                    ref32 = reference_step(m32, ex.x, lr, torch.float32, precision=prec)
                    del m32
                if mode != "float32":
                    ref64 = reference_step(ex.model, ex.x, lr, torch.float64)
                memo = {}
                _LAST_REF.append((key, (ref32, ref64, memo)))
            if mode == "float32":
                ref = compare(loss, params, grads, ref32, None, tol, precision=prec, memo=memo)
                ref["precision"] = "float32" if prec == "fp32" else prec
            else:
                ref = compare(loss, params, grads, ref64, ref32, tol, precision=prec,
                              memo=memo)
            del ref32, ref64, memo
        reference_s = time.perf_counter() - t_ref
        no_grad = {n for n in ex.order if not ex.state[n].needs_grad}
        res = summarize(plan, ex.order, objs, PHASES, no_grad)
        if "pipeline" in res:
            res["pipeline"]["executed_schedule"] = ex.schedule
        res.update({"reference": ref, "reference_ok": None if ref is None else ref["ok"],
                    "setup_s": setup_s, "job_s": time.perf_counter() - t_start,
                    "check_s": check_s, "reference_s": reference_s, "steps": steps,
                    "warmup": warmup, "lr": lr,
                    "backend": dist.get_backend() if world > 1 else "none",
                    "device": str(device),
                    # CUDA: max_memory_allocated per worker over the timed steps (CPU: none)
                    "measured_peak_memory_bytes": (
                        [o[3] for o in objs] if all(len(o) > 3 and o[3] is not None
                                                    for o in objs) else None),
                    "sync": ex.sync_mode, "dtype": ex.dtype,
                    "world": world,
                    **memory_report(plan, [o[4] if len(o) > 4 else None for o in objs])})
        return res
    except Exception as exc:
        where = "setting up the plan" if ex is None else f"step {ex.step_no}, {ex.phase}"
        raise WorkerError(f"{where}: {type(exc).__name__}: {exc}") from exc


def memory_report(plan, measured: list) -> dict:
    """The plan's memory by category per worker beside what the first step held
    (:mod:`.memtrack`): ``predicted_memory_by_category`` / ``measured_memory_by_category``,
    ``{category: [bytes per worker]}`` (params, grads, optimizer, activations, transient;
    measured: each category's largest value in the step, and ``peak``, the largest total).
    Empty when no step was measured."""
    from explorer.engine.runtime.memtrack import CATEGORIES
    if not measured or any(m is None for m in measured):
        return {}
    out = {"measured_memory_by_category": {
        k: [int(m[k]) for m in measured] for k in (*CATEGORIES, "peak")},
        "measured_memory_peak_at": [m.get("where", "") for m in measured],
        "measured_memory_forward_end": [m.get("forward_end", {}) for m in measured]}
    cats = plan.memory_by_category or {}
    if all(isinstance(cats.get(k), list) and len(cats[k]) == len(measured)
           for k in CATEGORIES):
        pred = {k: [float(v) for v in cats[k]] for k in CATEGORIES}
        pred["peak"] = [sum(pred[k][w] for k in CATEGORIES) for w in range(len(measured))]
        out["predicted_memory_by_category"] = pred
    return out


def summarize(plan, order, per_rank, phases, no_grad=()) -> dict:
    """Predicted vs measured: step time (median over steps of the slowest worker) and per
    layer compute (forward + backward + SGD update, as t_C counts them; median over steps,
    maximum over workers; the update alone is ``measured_update_s``) and communication (fetch
    + gradient return + sync; median over steps of the last-arriving worker's exchange time,
    waiting for other workers reported as ``measured_wait_s``).  ``no_grad``: layers that
    need no gradient (their out-edges' t_X is all forward fetch)."""
    steps = np.array([np.asarray(s[0], dtype=float) for s in per_rank])      # [W, S]
    nl, npz = len(order), len(phases)
    tim = np.stack([np.asarray(s[1], dtype=float).reshape(-1, nl, npz) for s in per_rank])
    part = np.stack([np.asarray(s[2], dtype=bool) for s in per_rank])        # [W, L, 3]
    per_step = steps.max(axis=0) if steps.size else np.zeros(0)
    measured = float(np.median(per_step)) if per_step.size else None
    ph = {p: i for i, p in enumerate(phases)}
    comp = tim[..., ph["fwd_compute"]] + tim[..., ph["bwd_compute"]]
    upd = tim[..., ph["update"]]
    def med(a):
        return np.median(a, axis=1).max(axis=0) if a.shape[1] else np.zeros(a.shape[2])
    comp_m, upd_m = med(comp + upd), med(upd)
    # communication of a layer: the exchange time of the worker that arrived last (it did not
    # wait for anyone), i.e. the minimum over the workers taking part; what the others spent
    # on top of that is waiting for the slowest (load imbalance), reported apart
    comm_steps = np.zeros(tim.shape[1:3])
    wait_steps = np.zeros(tim.shape[1:3])
    for j, p in enumerate(("fwd_comm", "bwd_comm", "sync")):
        a = tim[..., ph[p]]                                                   # [W, S, L]
        m = part[:, None, :, j]
        lo = np.where(m, a, np.inf).min(axis=0)
        hi = np.where(m, a, -np.inf).max(axis=0)
        some = np.isfinite(lo)
        comm_steps += np.where(some, lo, 0.0)
        wait_steps += np.where(some, hi - lo, 0.0)
    comm_m = np.median(comm_steps, axis=0) if tim.shape[1] else np.zeros(nl)
    wait_m = np.median(wait_steps, axis=0) if tim.shape[1] else np.zeros(nl)
    xfer_in: dict = {}
    xfer_out: dict = {}
    for e in plan.edges:
        t = float(e.get("t_xfer_s", 0.0))
        fwd = t if e["src"] in no_grad else 0.5 * t
        xfer_in[e["dst"]] = xfer_in.get(e["dst"], 0.0) + fwd
        xfer_out[e["src"]] = xfer_out.get(e["src"], 0.0) + t - fwd
    by_name = {la.name: la for la in plan.layers}
    # a pipelined plan's layer costs are per micro-batch; the step computes M of them
    M = int((plan.pipeline or {}).get("micro_batches", 1) or 1)
    layers = []
    for i, name in enumerate(order):
        la = by_name[name]
        p_comp = float(la.t_compute_s)
        # t_X counts the forward transfer and the gradient's way back: the forward half is
        # measured at the consumer (fetch), the backward half at the producer (return)
        p_comm = float(la.t_sync_s) + xfer_in.get(name, 0.0) + xfer_out.get(name, 0.0)
        # t_C includes the SGD update of the layer's shards
        p_comp, p_comm = p_comp * M, p_comm * M
        m_comp, m_comm = float(comp_m[i]), float(comm_m[i])
        layers.append({"name": name, "op": la.op, "config": la.config.label(),
                       "devices": list(la.config.devices),
                       "predicted_s": p_comp + p_comm, "measured_s": m_comp + m_comm,
                       "predicted_compute_s": p_comp, "measured_compute_s": m_comp,
                       "predicted_comm_s": p_comm, "measured_comm_s": m_comm,
                       "measured_wait_s": float(wait_m[i]),
                       "measured_update_s": float(upd_m[i])})
    predicted = float(plan.predicted_step_time_s)
    # the step split by phase (sum over layers of the slowest worker's medians)
    tot = {p: float(np.median(tim[..., ph[p]].sum(axis=2), axis=1).max()) if tim.shape[1]
           else 0.0 for p in phases}
    out = {
        "model": plan.model, "spec": plan.spec, "batch": plan.batch,
        "model_args": plan.model_args, "algo": plan.algo, "preset": plan.preset,
        "devices": plan.n_devices,
        "predicted_step_time_s": predicted, "measured_step_time_s": measured,
        "rel_error": (predicted - measured) / measured if measured else None,
        "step_times_s": [float(v) for v in per_step],
        "measured_breakdown_s": tot,
        "predicted_breakdown_s": dict(plan.breakdown),
        # per worker, median over steps: its computing (forward, backward, update) and its
        # waiting for slower workers inside collectives - the imbalance a model of equal
        # workers does not predict
        "measured_worker_compute_s": [float(v) for v in np.median(
            (comp + upd).sum(axis=2), axis=1)] if tim.shape[1] else [],
        "measured_wait_s": float(np.median(wait_steps.sum(axis=1))) if tim.shape[1] else 0.0,
        "layers": layers,
        "edges": [{"src": e["src"], "dst": e["dst"], "index": e.get("index", 0),
                   "predicted_s": float(e.get("t_xfer_s", 0.0))} for e in plan.edges],
    }
    if plan.pipeline:
        out["pipeline"] = pipeline_report(plan.pipeline, comp + upd, per_step, measured)
    return out


def pipeline_report(pipe: dict, busy, per_step, measured) -> dict:
    """A pipelined run's stages: predicted against measured time per micro-batch and bubble.

    ``busy`` is ``[workers, steps, layers]`` compute (forward, backward, update) seconds.  A
    stage's measured busy time is its slowest worker's median per step (its time per
    micro-batch: that over ``M``); its idle fraction is ``1 − busy / step``, the time it
    waits for the other stages and for transfers.  The measured bubble is the busiest
    stage's idle fraction, which the plan's ``(S − 1)/(M + S − 1)`` predicts for balanced
    stages (the transfers at the boundaries are in it too)."""
    S, M = int(pipe["stages"]), int(pipe["micro_batches"])
    G_ = int(pipe.get("devices_per_stage", 1))
    W = busy.shape[0]
    per_worker = np.median(busy.sum(axis=2), axis=1) if busy.shape[1] else np.zeros(W)
    stage_busy = [float(max((per_worker[w] for w in range(s * G_, min((s + 1) * G_, W))),
                            default=0.0)) for s in range(S)]
    idle = [None if not measured else max(0.0, 1.0 - b / measured) for b in stage_busy]
    return {"stages": S, "micro_batches": M, "devices_per_stage": G_,
            "schedule": pipe.get("schedule"),
            # the order the workers ran (run_job sets it: 1F1B runs as GPipe on NCCL)
            "executed_schedule": pipe.get("schedule"),
            "predicted_stage_time_per_microbatch_s": [
                float(t) for t in pipe.get("stage_time_per_microbatch_s", [])],
            "measured_stage_time_per_microbatch_s": [b / M for b in stage_busy],
            "predicted_bubble_fraction": float(pipe.get("bubble_fraction",
                                                        (S - 1) / (M + S - 1))),
            "measured_idle_fraction": idle,
            "measured_bubble_fraction": (None if not measured or not stage_busy
                                         else max(0.0, 1.0 - max(stage_busy) / measured))}


def _set_pdeathsig():
    """Die with the parent (Linux): a killed launcher never leaves workers behind.  A worker
    forked from the fork server has the server as its parent, and the server exits as soon
    as the launcher's pipe to it closes, so the signal still follows the launcher.

    A launcher killed while this process was still starting (importing torch, before the
    ``prctl``; e.g. a job cancelled from the app) has already handed it to another parent, and
    the signal would never come: then it exits at once instead of waiting for peers that will
    never join."""
    import multiprocessing
    launcher = multiprocessing.parent_process()
    try:
        import ctypes
        import signal
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)   # PR_SET_PDEATHSIG
    except Exception:  # noqa: BLE001 - not Linux
        return
    # the launcher's pipe (spawn), or its pipe to the fork server, closed: it is gone
    if launcher is not None and not launcher.is_alive():
        os._exit(1)


def _pin(rank: int, world: int) -> bool:
    """Pin this (main) thread to core ``rank`` when every worker gets its own core.

    Called after ``init_process_group`` so gloo's I/O threads (created there) stay free to run
    on any core.  Without pinning, the scheduler's wake-affine placement stacks two tightly
    communicating workers on one core now and then, halving their speed.
    """
    try:
        cores = sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return False
    if world > len(cores) or os.environ.get("EXPLORER_RUNTIME_NO_PIN"):
        return False
    try:
        os.sched_setaffinity(0, {cores[rank % len(cores)]})
        return True
    except OSError:
        return False


def _threads():
    torch.set_num_threads(1)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:
        pass


def join_group(rank: int, world: int, backend: str, timeout_s: float,
               local_rank: int | None = None, device: str | None = None,
               staged: bool | None = None) -> str:
    """Set this process up as rank ``rank`` of ``world``: one compute thread, its device, the
    process group (``MASTER_ADDR``/``MASTER_PORT`` from the environment: set by the launcher
    or by torchrun; none for a single worker), pinned to its own core on CPU when the launcher
    started it (``local_rank`` is None).  ``device``: what :func:`.devicemap.map_workers`
    gave this rank (``cpu`` or ``cuda:i``); None: ``cuda:LOCAL_RANK`` with NCCL, else ``cpu``.
    ``staged``: move tensors through host memory for gloo (:mod:`.comm`; default: gloo on a
    CUDA device).  Returns the torch device the rank computes on."""
    from explorer.engine.runtime import comm
    _threads()
    if device is None:
        local = rank if local_rank is None else local_rank
        device = f"cuda:{local}" if backend == "nccl" else "cpu"
    if str(device).startswith("cuda"):
        torch.cuda.set_device(torch.device(device))
        # float32 means float32: cuDNN's convolutions default to TF32, which a plan in fp32
        # neither predicts nor matches one device with (a tf32 plan turns it on per step)
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    if staged is None:
        staged = backend == "gloo" and str(device).startswith("cuda")
    comm.set_staged(bool(staged))
    if world > 1:
        kw = {}
        if backend == "nccl":
            kw["device_id"] = torch.device(device)     # binds the group to this rank's GPU
        try:
            dist.init_process_group(backend, rank=rank, world_size=world,
                                    timeout=timedelta(seconds=float(timeout_s)), **kw)
        except TypeError:              # a torch without ``device_id``
            dist.init_process_group(backend, rank=rank, world_size=world,
                                    timeout=timedelta(seconds=float(timeout_s)))
    if not str(device).startswith("cuda") and local_rank is None:   # torchrun places its own
        _pin(rank, world)
    return str(device)


def _adopt(context: dict | None) -> None:
    """Take the launcher's environment, directory and import path (a worker forked from the
    fork server starts with the server's, from whenever it started)."""
    if not context:
        return
    os.environ.clear()
    os.environ.update(context["env"])
    os.chdir(context["cwd"])
    sys.path[:] = context["sys_path"]


def _thread_progress_lock() -> None:
    """torch.fx's interpreter draws a (disabled) tqdm bar, and tqdm's first bar makes a
    multiprocessing lock, a named semaphore.  A worker that ends at once after a failure
    (``os._exit``) never releases it, and the resource tracker then reports "leaked semaphore
    objects" when the launcher exits.  A worker's bars never cross processes: a thread lock
    does."""
    try:
        import threading

        from tqdm import tqdm
    except ImportError:
        return
    tqdm.set_lock(threading.RLock())


def process_main(rank, world, addr, port, backend, timeout_s, entry, payload, queue,
                 memory_limit=None, device=None, staged=None, context=None):
    """Body of every local worker process (:func:`launcher.start_workers`, one per rank).

    Joins the process group, then calls ``entry(rank, world, device, payload, send)``;
    ``send(kind, key, value)`` reports to the launcher (``"result"``, ``"progress"``).  Ends by
    reporting ``done``, or the error, after which the process exits at once.
    ``memory_limit`` (bytes): a :class:`.memlimit.MemoryGuard` the entry arms once set up.
    ``device`` / ``staged``: this rank's device and transfer staging (:func:`join_group`);
    ``context``: the launcher's environment, directory and import path (:func:`_adopt`)."""
    from explorer.engine.runtime import memlimit
    _set_pdeathsig()
    _adopt(context)
    _thread_progress_lock()
    os.environ.update({"MASTER_ADDR": addr, "MASTER_PORT": str(port), "RANK": str(rank),
                       "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank)})

    def send(kind, key=None, value=None):
        queue.put((kind, rank, key, value))

    def over_limit(message):
        queue.put(("error", rank, message, ""))
        queue.close()
        queue.join_thread()
    guard = memlimit.install(memory_limit, rank, over_limit)
    try:
        device = join_group(rank, world, backend, timeout_s, device=device, staged=staged)
        entry(rank, world, device, payload, send)
        send("done")
        queue.close()
        queue.join_thread()
    except BaseException as exc:  # noqa: BLE001 - report everything, then die
        msg = guard.translate(exc) if guard is not None else None
        if msg is not None:
            exc = WorkerError(msg)
        report_and_exit(queue, rank, exc)
    finally:
        destroy_group()


def run_jobs(rank, world, device, jobs, send):
    """The layer executor's entry for :func:`process_main`: run the jobs (plans) one after
    the other; rank 0 sends each result under the job's index."""
    for i, job in enumerate(jobs):
        def progress(done, total, i=i):
            if rank == 0:
                send("progress", i, (done, total))
        res = run_job(job, rank, world, device, progress)
        if rank == 0:
            send("result", i, res)
    _LAST_REF.clear()                  # the references are for this launch's plans only


def report_and_exit(queue, rank: int, exc: BaseException) -> None:
    """Send ``exc`` to the launcher (flushing the queue) and end this worker at once: a
    worker that failed mid-step must not wait in a collective its peers never reach."""
    msg = str(exc) if isinstance(exc, WorkerError) else f"{type(exc).__name__}: {exc}"
    queue.put(("error", rank, msg, traceback.format_exc()))
    queue.close()
    queue.join_thread()
    os._exit(1)


def destroy_group() -> None:
    """Tear down the process group if there is one (errors on the way out are moot)."""
    if dist.is_initialized():
        try:
            dist.destroy_process_group()
        except Exception:  # noqa: BLE001
            pass

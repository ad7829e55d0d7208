"""Launching workers on the local devices: N processes, a watchdog, the results.

:func:`start_workers` is the one way the runtime starts workers, for both executors (the
layer executor's :func:`worker.run_jobs`, the operator-level executor's entry in
:mod:`.opexec`): one process per rank with ``torch.multiprocessing`` (forked from a server
that imported torch once, or spawned with ``EXPLORER_START_METHOD=spawn``; one thread each;
the process group is gloo on CPU, NCCL when there is a CUDA GPU per worker), and a watchdog:

* a worker that raises reports ``(rank, error)`` through a queue and exits;
* a worker that dies (signal, ``os._exit``) is noticed by its exit code;
* either way the launch stops within a second or two, kills every remaining worker (they
  also die with the launcher: ``PR_SET_PDEATHSIG``) and raises :class:`RunFailed` naming
  the rank and the error; a run longer than ``timeout_s`` is killed the same way, and gloo
  operations time out after ``timeout_s`` inside the workers too.

:func:`launch` validates a layer-wise plan against the request *before* starting anything
(model, batch, model arguments, device count; the layer names and configurations against the
model's graph) and runs it.  Several plans for the same device count can share one launch
(:func:`launch_many`): the processes start once and run the plans one after the other (tests
use this to check many plans in a few seconds).
"""

from __future__ import annotations

import os
import queue as queue_mod
import socket
import threading
import time
import warnings
from dataclasses import dataclass

from explorer.errors import ExplorerError, InfeasiblePlan


class RunFailed(ExplorerError):
    """A worker raised, died or the run timed out; ``rank`` is the failing rank (or None)."""

    def __init__(self, message, rank=None, pids=()):
        super().__init__(message)
        self.rank = rank
        self.pids = list(pids)


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def validate(plan_dict: dict, expect: dict | None = None, check_local: bool = True):
    """Check a plan dict before launching; returns ``(Plan, warnings)``.

    ``expect`` may hold ``model`` (name or spec), ``batch``, ``model_args`` and ``devices``:
    a plan made for anything else is rejected with :class:`InfeasiblePlan`.  The plan's
    layers must be exactly the model's layers with configurations the layers can take, and
    its ``graph_digest`` (when it has one) must be that of the graph the plan's model, batch
    and model arguments give now.
    """
    from explorer.engine.core.capture_cache import layer_graph
    from explorer.engine.layerwise.plan import Plan
    if not isinstance(plan_dict, dict):
        raise InfeasiblePlan("a plan must be a JSON object written by `explorer search --json`")
    try:
        plan = Plan.from_dict(plan_dict)
    except ValueError as exc:
        raise InfeasiblePlan(f"not a runnable plan: {exc}") from None
    from explorer.engine.layerwise.plan import unsupported
    why = unsupported(plan_dict)
    if why:
        raise InfeasiblePlan(why)
    expect = dict(expect or {})
    warns = []
    want = expect.get("model")
    if want is not None and want not in (plan.model, plan.spec):
        raise InfeasiblePlan(f"the plan is for model {plan.model!r}, not {want!r}: search a plan "
                             f"for {want} first")
    if expect.get("batch") is not None and int(expect["batch"]) != plan.batch:
        raise InfeasiblePlan(f"the plan is for batch {plan.batch}, not {expect['batch']}")
    if expect.get("model_args") is not None:
        a = {k: str(v) for k, v in (expect["model_args"] or {}).items()}
        b = {k: str(v) for k, v in (plan.model_args or {}).items()}
        if a != b:
            raise InfeasiblePlan(f"the plan is for model arguments {plan.model_args}, not "
                                 f"{expect['model_args']}")
    if expect.get("devices") is not None and int(expect["devices"]) != plan.n_devices:
        raise InfeasiblePlan(f"the plan is for {plan.n_devices} devices, {expect['devices']} "
                             f"were asked for: search a plan for {expect['devices']} devices")
    graph = layer_graph(plan.spec, plan.batch, plan.model_args)   # (cached: shapes only)
    names = set(graph.names())
    given = [la.name for la in plan.layers]
    missing = [n for n in graph.names() if n not in given]
    extra = [n for n in given if n not in names]
    if missing or extra:
        raise InfeasiblePlan(
            f"the plan does not fit model {plan.spec!r} (batch {plan.batch}, args "
            f"{plan.model_args}): it has no configuration for {missing[:4]}"
            f"{' ...' if len(missing) > 4 else ''} and unknown layers {extra[:4]}"
            f"{' ...' if len(extra) > 4 else ''}")
    if plan.graph_digest:
        from explorer.engine.core.layergraph import graph_digest
        now = graph_digest(graph)
        if now != plan.graph_digest:
            raise InfeasiblePlan(
                f"the plan was searched on another graph of {plan.spec!r} than batch "
                f"{plan.batch} and arguments {plan.model_args} give now (layer shapes differ: "
                f"digest {plan.graph_digest} vs {now}; the plan file was edited or the model "
                f"changed): search the plan again")
    for la in plan.layers:
        layer = graph.layer(la.name)
        from explorer.engine.core.geometry import REDUCE, reduction_size
        red = reduction_size(layer)
        for k, v in la.config.degrees:
            if k == REDUCE and red is not None:          # row-parallel matrix product
                if v > red:
                    raise InfeasiblePlan(f"layer {la.name}: degree k={v} exceeds its "
                                         f"{red} reduction features")
                continue
            if v > 1 and k not in layer.dims:
                raise InfeasiblePlan(f"layer {la.name}: the plan splits {k}={v}, the layer's "
                                     f"dimensions are {list(layer.dims)}")
            if v > 1 and v > layer.size(k):
                raise InfeasiblePlan(f"layer {la.name}: degree {k}={v} exceeds its size "
                                     f"{layer.size(k)}")
    if check_local:
        from explorer.engine.runtime.devicemap import local_map
        wmap = local_map(plan.n_devices)      # refuses what this machine cannot give
        cores = _cores()
        if wmap.shared:
            warns.append(wmap.note)
        if wmap.kind == "cpu" and plan.n_devices > cores:
            warns.append(f"{plan.n_devices} CPU workers on {cores} cores: the processes share "
                         f"cores, so the measured times mean little")
        if plan.preset != "local":
            warns.append(f"the plan's predictions are for preset {plan.preset!r}, not this "
                         f"machine: search with --preset local to compare with measurements")
    return plan, warns


#: how workers are started: ``forkserver`` (default: one server process imports torch once and
#: every worker is forked from it, so a worker starts in milliseconds instead of importing
#: torch for seconds) or ``spawn`` (a fresh interpreter per worker)
START_METHOD_ENV = "EXPLORER_START_METHOD"
#: what the fork server imports before forking workers (nothing here starts a thread or CUDA).
#: ``torch._dynamo``: torch imports it (with inductor, about a second) the first time a trace
#: records its nodes' source lines, which every worker's trace does; ``torch.export._trace``:
#: what a worker's fake tensors import the first time they ask where a line is; then the
#: modules the three kinds of worker run (layer-wise executor, Tofu's tiles, placement
#: programs).  Imported once here, each worker gets them with its fork (about 0.4 s a worker).
PRELOAD = ["numpy", "torch", "torch.distributed", "torch._dynamo", "torch.export._trace",
           "explorer.engine.runtime.worker", "explorer.engine.layerwise.plan",
           "explorer.engine.runtime.executor", "explorer.engine.runtime.opexec",
           "explorer.engine.runtime.compiled"]


def _forget_inherited_forkserver() -> None:
    """In a process just forked from one that had started the fork server (the app's
    background-callback processes, forked from the server): forget that server.  Its pid is
    not this process's child, so the standard library's liveness check (``waitpid``) would
    fail with ``ChildProcessError`` at the first launch; forgetting it makes this process
    start a server of its own.  Registered with :func:`os.register_at_fork`."""
    from multiprocessing import forkserver
    server = getattr(forkserver, "_forkserver", None)
    if server is None or getattr(server, "_forkserver_pid", None) is None:
        return
    fd = getattr(server, "_forkserver_alive_fd", None)
    if fd is not None:
        try:
            os.close(fd)      # this copy would keep the parent's server alive as long as us
        except OSError:
            pass
    server._forkserver_alive_fd = None
    server._forkserver_pid = None
    server._forkserver_address = None
    server._lock = threading.Lock()     # it may have been held by another thread at the fork


os.register_at_fork(after_in_child=_forget_inherited_forkserver)


def _context():
    """The multiprocessing context workers start from (:data:`START_METHOD_ENV`)."""
    import torch.multiprocessing as mp
    method = os.environ.get(START_METHOD_ENV, "forkserver") or "forkserver"
    if method not in ("forkserver", "spawn"):
        raise ExplorerError(f"{START_METHOD_ENV}={method!r}: use forkserver or spawn")
    ctx = mp.get_context(method)
    if method == "forkserver":
        ctx.set_forkserver_preload(PRELOAD)
    return ctx


def _launch_context() -> dict:
    """What a worker takes from the launcher as it is now, not as the fork server was when it
    started: environment, working directory and import path."""
    import sys
    return {"env": dict(os.environ), "cwd": os.getcwd(), "sys_path": list(sys.path)}


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _kill(procs):
    started = [p for p in procs if p.pid is not None]
    for p in started:
        if p.is_alive():
            p.kill()
    for p in started:
        p.join(timeout=5)


_PEER_HINTS = ("Connection closed by peer", "Connection reset", "Broken pipe",
               "ProcessGroupGloo", "Gloo", "gloo", "closed", "timed out", "Timed out")


def choose_backend(n: int, backend: str = "auto") -> str:
    """The backend ``n`` local workers use (:func:`.devicemap.local_map`): NCCL when this
    machine has a CUDA GPU for each worker, else gloo; ``"gloo"`` / ``"nccl"`` force one
    (NCCL only when the GPUs are there: else :class:`.devicemap.DeviceRequestError`)."""
    from explorer.engine.runtime.devicemap import local_map
    return local_map(n, backend=backend).backend


@dataclass
class Gathered:
    """What :func:`start_workers` collected: ``results[rank][key]`` for every
    ``send("result", key, value)``, the workers' pids, the wall time and the backend."""

    results: dict
    pids: list
    elapsed_s: float
    backend: str
    map: object = None           # the :class:`.devicemap.WorkerMap` the workers ran on

    def describe(self) -> dict:
        """The workers' devices for a run result (:meth:`.devicemap.WorkerMap.describe`)."""
        return self.map.describe() if self.map is not None else {"backend": self.backend}


def start_workers(n: int, entry, payload, *, timeout_s: float, backend: str = "auto",
                  progress=None, name: str = "explorer-worker", jobs: int = 1,
                  memory_limit: float | None = None, kind: str | None = None,
                  use_gpus: int | None = None) -> Gathered:
    """Run ``entry(rank, world, device, payload, send)`` in ``n`` new local processes.

    The one way the runtime starts workers: ``torch.multiprocessing`` (a fork server that
    imported torch once, :data:`START_METHOD_ENV`; each worker takes the launcher's current
    environment, directory and import path), a free port on
    127.0.0.1 for the rendezvous, the process group set up in each worker
    (:func:`worker.process_main`), one thread each.  Devices and backend come from
    :func:`.devicemap.local_map` (``kind``: ``cpu`` / ``cuda`` / ``auto``, default
    ``$EXPLORER_DEVICE``; ``use_gpus``, default ``$EXPLORER_GPUS``): gloo on CPU, NCCL with a
    GPU per worker, gloo with host-staged transfers when workers share GPUs; the
    :class:`Gathered` result carries the map (``describe()``: what a run reports).
    The launcher then watches: a worker that reports an error or dies stops the run within
    about two seconds, a run longer than ``timeout_s`` is stopped, and either way every worker
    is killed (they also die with the launcher) and :class:`RunFailed` names the rank that
    failed first and why.  ``progress(key, done, total)`` receives the workers' progress
    reports; ``jobs`` (how many jobs ``payload`` holds) only words the timeout message.
    ``memory_limit`` (bytes): each worker's :class:`.memlimit.MemoryGuard` (armed by the
    entry once set up); a worker over it reports so and exits, and the run stops as above.
    """
    from explorer.engine.runtime.devicemap import local_map
    from explorer.engine.runtime.worker import process_main
    wmap = local_map(n, backend=backend, kind=kind, use_gpus=use_gpus)
    backend = wmap.backend
    ctx = _context()
    q = ctx.Queue()
    port = _free_port()
    here = _launch_context()
    procs = [ctx.Process(target=process_main, name=f"{name}-{r}",
                         args=(r, n, "127.0.0.1", port, backend, timeout_s, entry, payload, q,
                               memory_limit, wmap.device(r), wmap.staged, here))
             for r in range(n)]
    t0 = time.monotonic()
    results: dict = {}
    done, errors, dead = set(), {}, {}
    fail_t = None
    timed_out = False
    last_progress = None
    pids: list = []
    try:
        for p in procs:
            p.start()
        pids = [p.pid for p in procs]
        while True:
            try:
                kind, rank, a, b = q.get(timeout=0.1)
            except queue_mod.Empty:
                kind = None
            now = time.monotonic()
            if kind == "result":
                results.setdefault(rank, {})[a] = b
            elif kind == "done":
                done.add(rank)
            elif kind == "error":
                errors.setdefault(rank, (a, b))
            elif kind == "progress":
                last_progress = (a, b)
                if progress is not None:
                    progress(a, *b)
            if kind is not None:
                continue      # drain the queue before judging the processes
            for r, p in enumerate(procs):
                if r not in done and r not in errors and r not in dead and not p.is_alive():
                    dead[r] = p.exitcode
            if len(done) == n:
                break
            if (errors or dead) and fail_t is None:
                fail_t = now
            if fail_t is not None and (now - fail_t > 2.0 or
                                       all(not p.is_alive() for p in procs)):
                break
            if now - t0 > timeout_s:
                timed_out = True
                break
    finally:
        stuck = [r for r, p in enumerate(procs)
                 if p.pid is not None and p.is_alive() and r not in done and r not in errors]
        _kill(procs)
        q.close()
        q.cancel_join_thread()
    if errors or dead or timed_out or len(done) < n:
        if os.environ.get("EXPLORER_DEBUG"):
            print("\n".join(f"--- rank {r}\n{tb}" for r, (_, tb) in sorted(errors.items())))
        msg = _failure_message(errors, dead, timed_out, timeout_s, last_progress, jobs, n, done)
        if stuck and (errors or dead or timed_out):
            msg += (f". Rank{'s' if len(stuck) > 1 else ''} {', '.join(map(str, stuck))} "
                    f"{'were' if len(stuck) > 1 else 'was'} still running without reporting "
                    f"an error (stuck?) and {'were' if len(stuck) > 1 else 'was'} killed")
        rank = _failed_rank(errors, dead)
        if rank is not None and rank in errors and stuck and \
                any(h in errors[rank][0] for h in _PEER_HINTS):
            rank = stuck[0]
        raise RunFailed(msg, rank, pids)
    return Gathered(results, pids, time.monotonic() - t0, backend, wmap)


def launch_many(plans: list, steps: int = 20, warmup: int = 5, timeout_s: float = 600.0, *,
                check: bool = True, expect: dict | None = None, lr: float = 0.01,
                seed: int = 0, fault: str | None = None, progress=None, store: bool = False,
                tol: float | None = None, sync: str = "auto", dump: str | None = None,
                reference: str = "both") -> list:
    """Run several plans (same device count) in one set of worker processes.

    Returns one result dict per plan (see :func:`launch`).
    """
    if not plans:
        return []
    if steps < 0 or warmup < 0:
        raise InfeasiblePlan(f"steps ({steps}) and warmup ({warmup}) must be ≥ 0")
    plans = list(plans)
    checked = [validate(p, expect) for p in plans]
    n = checked[0][0].n_devices
    if any(pl.n_devices != n for pl, _ in checked):
        raise InfeasiblePlan("plans launched together must use the same device count")
    warns = sorted({w for _, ws in checked for w in ws})
    for w in warns:
        warnings.warn(w, RuntimeWarning, stacklevel=2)
    jobs = [{"plan": p, "steps": steps, "warmup": warmup, "check": check, "lr": lr,
             "seed": seed, "fault": fault, "tol": tol, "sync": sync, "reference": reference,
             "dump": None if dump is None else (dump if len(plans) == 1 else f"{dump}.{i}")}
            for i, p in enumerate(plans)]
    from explorer.engine.runtime.worker import run_jobs
    got = start_workers(n, run_jobs, jobs, timeout_s=timeout_s, progress=progress,
                        jobs=len(plans))
    out = []
    for i, pl in enumerate(plans):
        res = got.results.get(0, {}).get(i)
        if res is None:
            raise RunFailed(f"rank 0 finished without a result for plan {i}", 0, got.pids)
        res.update(got.describe())
        res["warnings"] = warns
        res["launch_time_s"] = got.elapsed_s
        res["pids"] = got.pids
        if store:
            from explorer.engine.runtime.store import RunStore, run_key
            RunStore().add_safely(run_key(pl), res)
        out.append(res)
    return out


def _primary(errors, dead):
    """The rank whose failure caused the others (not a peer-connection error)."""
    for r in sorted(dead):
        return r
    own = [r for r, (m, _) in sorted(errors.items()) if not any(h in m for h in _PEER_HINTS)]
    if own:
        return own[0]
    return min(errors) if errors else None


def _failed_rank(errors, dead):
    return _primary(errors, dead)


def _failure_message(errors, dead, timed_out, timeout_s, last_progress, njobs, n, done):
    r = _primary(errors, dead)
    parts = []
    if r is not None and r in dead:
        code = dead[r]
        how = f"killed by signal {-code}" if code is not None and code < 0 else \
            f"exit code {code}"
        parts.append(f"worker rank {r} died ({how}) before finishing")
    elif r is not None:
        parts.append(f"worker rank {r} failed: {errors[r][0]}")
    elif timed_out:
        where = ""
        if last_progress is not None:
            where = f" (plan {last_progress[0] + 1} of {njobs}, step {last_progress[1][0]} of " \
                    f"{last_progress[1][1]})"
        parts.append(f"the run did not finish within {timeout_s:g} s{where}; every worker was "
                     f"killed")
    else:
        missing = sorted(set(range(n)) - set(done))
        parts.append(f"workers {missing} exited without finishing")
    others = [f"rank {k}: {m.splitlines()[0][:160]}" for k, (m, _) in sorted(errors.items())
              if k != r]
    others += [f"rank {k} died (exit code {c})" for k, c in sorted(dead.items()) if k != r]
    if others:
        parts.append("then " + "; ".join(others))
    return ". ".join(parts)


def launch(plan_dict: dict, steps: int = 20, warmup: int = 5, timeout_s: float = 600.0,
           **kw) -> dict:
    """Execute ``plan_dict`` on its device count of local workers and measure it.

    Keyword options: ``check`` (reference check, default True), ``expect`` (dict with
    ``model``/``batch``/``model_args``/``devices`` the plan must match), ``lr`` (0.01),
    ``seed`` (0), ``sync`` (``"auto"``: point-to-point gradient sums on gloo, all-reduce on
    NCCL; or ``"p2p"`` / ``"allreduce"``), ``fault`` (``"RANK:STEP[:raise|exit|hang]"``,
    tests), ``progress`` (``callable(plan_index, steps_done, steps_total)``), ``store``
    (save the run in ``$EXPLORER_HOME/runs.sqlite``, default False: the service stores the
    runs it makes), ``tol`` (``None``: the plan's precision's, 1e-4 in fp32), ``reference``
    (``"both"`` default: the exact float64 single-device step, with the float32 single-device
    step's own error as the rounding allowance; ``"float64"``: exact step only, tolerance
    ``tol``; ``"float32"``: the float32 single-device step only).

    Returns a dict with ``reference_ok``, ``reference`` (errors per parameter),
    ``predicted_step_time_s``, ``measured_step_time_s``, ``rel_error``
    (``(predicted − measured) / measured``), ``step_times_s``, ``layers`` (per layer
    predicted/measured compute and communication), ``edges``, ``warnings`` and more.
    Raises :class:`InfeasiblePlan` before launching when the plan does not fit, and
    :class:`RunFailed` when a worker fails, dies or the run exceeds ``timeout_s``.
    """
    return launch_many([plan_dict], steps, warmup, timeout_s, **kw)[0]

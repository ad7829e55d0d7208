"""Measured compute of an operator-level plan: every operator rehearsed at its shard shapes,
the way a worker runs it.

A Tofu worker runs each operator as :meth:`.opexec.TileWorker.run_op`: it assembles the input
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
clock (as :func:`explorer.engine.core.profile.step_op_times`: a busy shared machine does not
charge an operator for other processes' time).  Times are cached in the profile database per
(operator call, the op's boxes on every worker, worker, dtype, and the code that runs it: a
digest of this module, :mod:`.opexec` and :mod:`.tiles` with torch's version, so a changed
tile rule is rehearsed afresh) (:func:`explorer.engine.core.profile.shard_cache`), so equal layers
and the next run cost nothing.

:func:`predict_step` then runs the step as the executor does (:func:`simulate_step`): each
worker's clock advances operator by operator through its exchanges - the transfers and
collectives :func:`exchange_phases` records from a dry run of the worker's own ``run_op`` -
at the calibrated gloo costs (:func:`comm_costs`), a transfer starting when both its sender
and its receiver reached it, and the rehearsed compute stretched by :func:`share_factor` when
more workers than cores share them.  Without the point-to-point calibration it is the earlier
sum: ``Σ_ops max_w t[op, w]`` (lockstep), the plan's communication time, and one link
latency per exchange.
"""

from __future__ import annotations

import functools
import json
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

from explorer.engine.core import profile
from explorer.engine.runtime.opexec import TileWorker, torch_dtype, box_extent, fill_pattern, substitute

__all__ = ["shard_seconds", "predict_step", "simulate_step", "exchange_phases", "comm_costs",
           "share_factor"]

#: a shard whose timed run takes this long (CPU seconds) is timed once after its warm-up,
#: not ``reps`` times: the thread clock's resolution is microseconds, and a model one worker
#: cannot hold would otherwise spend its rehearsal repeating multi-second matrix products
LONG_S = 0.25


class _Rehearsal(TileWorker):
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
                got[i] = torch.zeros(box_extent(box), dtype=dtype)
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
        got = fill_pattern(info["out"], xplan["held"][t], world) if t in xplan["held"] else None
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

    from explorer.engine.core.capture_cache import files_digest
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


def _random(ten, box, dtype, gen, g=None):
    """A random tile of ``box``, laid out as the worker holds it: the output of a transposing
    view (``t``, ``transpose``, ``permute``: run unchanged on the tiles, so the worker keeps
    a view) is a view with the same strides - a matrix product reading it runs another
    kernel than on a contiguous copy (LSTM's ``mm`` 1.4× slower)."""
    dt = getattr(torch, ten.dtype, None)
    ext = box_extent(box)
    if not isinstance(dt, torch.dtype) or dt.is_floating_point:
        perm = _view_perm(g, ten, len(ext))
        if perm is None:
            return torch.randn(ext, dtype=dtype, generator=gen)
        base = [0] * len(ext)
        for i, p in enumerate(perm):
            base[p] = ext[i]
        return torch.randn(tuple(base), dtype=dtype, generator=gen).permute(perm)
    return torch.zeros(ext, dtype=dt)


def _view_perm(g, ten, ndim):
    """The dimension order of the transposing view that produces ``ten`` (None: none)."""
    o = g.ops.get(ten.producer) if g is not None and ten.producer else None
    if o is None or ndim < 2:
        return None
    if o.target == "t" and ndim == 2:
        return [1, 0]
    args = [a for a in o.args[1:]]
    try:
        if o.target == "transpose" and len(args) >= 2:
            d0, d1 = int(args[0]) % ndim, int(args[1]) % ndim
            perm = list(range(ndim))
            perm[d0], perm[d1] = perm[d1], perm[d0]
            return perm
        if o.target == "permute" and args and len(args[0]) == ndim:
            return [int(d) % ndim for d in args[0]]
    except (TypeError, ValueError):
        return None
    return None


def shard_seconds(g, xplan: dict, dtype: str = "float32", device_kind: str = "cpu",
                  cache_path=None, reps: int = 3, warmup: int = 1, progress=None):
    """``(names, t, exchanges, info)``: ``t[i, w]`` the seconds worker ``w`` spends on
    operator ``names[i]`` short of the wire, ``exchanges[i, w]`` the transfers it takes part
    in (as the module says; cached); ``info = {"measured": shards rehearsed now, "cached":
    shards from the cache, "seconds": time spent}``."""
    from explorer.engine.core.capture import deterministic
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
        from explorer.engine.core.opgraph import with_step
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
        v = _random(ten, box, fdt, gen, g)
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


class _Dry(_Rehearsal):
    """A worker that records the exchanges an operator makes, in order, without computing:
    ``phases`` = [("x", [(src, dst, bytes), ...]) for each :meth:`exchange` call (the whole
    list, the same on every worker), ("c", members, axis, bytes) for each collective]."""

    def __init__(self, *a):
        super().__init__(*a)
        self.phases: list = []

    def exchange(self, transfers, source):
        self.phases.append(("x", [(int(s), int(d), _nbytes(box, dt))
                                  for s, d, box, dt in transfers]))
        return {i: torch.zeros(box_extent(box), dtype=dt)
                for i, (s, d, box, dt) in enumerate(transfers) if d == self.rank}

    def collective(self, coll, transfers, result, box, me):
        _, axis, members = coll
        self.phases.append(("c", tuple(int(m) for m in members), axis,
                            int(result.numel() * result.element_size())))
        return super().collective(coll, transfers, result, box, me)

    def compute(self, n, o, bufs, sub, out_box, ten, fill, shape_of):
        return torch.zeros(box_extent(out_box), dtype=torch_dtype(ten, self.float_dtype))


def _nbytes(box, dtype) -> int:
    return int(np.prod(box_extent(box))) * torch.empty((), dtype=dtype).element_size()


_PHASES: dict = {}                     # an op's rehearsal signature -> its exchanges


def exchange_phases(g, xplan: dict, dtype: str = "float32") -> list:
    """``phases[i][w]``: what worker ``w`` exchanges for operator ``i`` (in ``g.ops``
    order), as :class:`_Dry` records it running the worker's own :meth:`run_op` on zero
    tiles - ``(n_fetch, [phase, ...])``, the first ``n_fetch`` phases before the operator
    computes (its input regions), the rest after (sending and combining its output)."""
    K = int(xplan["workers"])
    fdt = getattr(torch, dtype)
    out = [[(0, [])] * K for _ in g.ops]
    if K < 2:
        return out
    from explorer.engine.core.capture import deterministic
    from explorer.engine.core.opgraph import with_step
    gs = None
    for w in range(K):
        groups = _groups(g, xplan, w, K)
        for i, o in enumerate(g.ops.values()):
            info = xplan["ops"].get(o.name)
            if info is None:
                continue
            key = _signature(o, g, xplan, w, dtype)     # the op's geometry on every worker
            if key not in _PHASES:
                if gs is None:
                    gs = with_step(g)
                    node = {n.name: n for n in gs.gm.graph.nodes}
                dry = _Dry(w, K, gs, xplan, groups, fdt)
                for t in dict.fromkeys(o.inputs):
                    ten = gs.tensors[t]
                    box = xplan["held"][t][w] if t in xplan["held"] else \
                        np.array([[0, s] for s in ten.shape] or [[0, 1]])
                    dt = getattr(torch, ten.dtype, None)
                    dt = fdt if not isinstance(dt, torch.dtype) or dt.is_floating_point else dt
                    dry.tiles[t] = (np.asarray(box), dry.shaped(t, torch.zeros(box_extent(box),
                                                                               dtype=dt)))

                def sub(a, bufs, fa=None, dry=dry):
                    return substitute(gs, a, bufs, lambda t: dry.tiles[t][1], fa)
                try:
                    with deterministic(running_stats=False):
                        dry.run_op(node[o.node], gs.ops[o.name], info, sub, {})
                except Exception:  # noqa: BLE001 - as the rehearsal: no exchange modelled
                    dry.phases = []
                _PHASES[key] = (len(info["needs"]), dry.phases)
            out[i][w] = _PHASES[key]
    return out


def comm_costs(devices) -> dict:
    """The calibrated costs of the executor's calls on ``devices`` (a ``local`` device
    graph, :mod:`.calibrate`): ``latency`` of one transfer - the device graph's, i.e. the
    calibration's mean exchange **between workers that also compute**, as a step's workers
    do (idle ping-pong figures are several times smaller and under-predict a step) - and
    ``bw``: from the means over the calibration's messages (``p2p_1mb_mean_s`` less
    ``p2p_latency_mean_s``: a step pays every exchange, tails included), else the medians
    (``p2p_bw``), else the link bandwidth; the rendezvous, a receiver not yet there, is
    :func:`simulate_step`'s -;
    ``send_s`` + bytes / ``send_bw`` of the sender's ``isend`` call and ``recv_s`` +
    bytes / ``recv_bw`` of the receiver's calls (``p2p_send_*``, ``p2p_recv_*``); a
    collective as ``coll_s`` + bytes × ``coll_k`` through the two calibrated all-reduce
    sizes (``allreduce_1k_s``, ``allreduce_big_s``).  A missing figure costs nothing."""
    meta = getattr(devices, "meta", None) or {}
    p2p = meta.get("p2p") or {}
    n = len(devices.devices)
    lat = float(devices.latency[0, 1]) if n > 1 else 0.0
    bw = float(p2p.get("bw") or (devices.bw[0, 1] if n > 1 else 0.0) or 0.0)
    if p2p.get("latency_mean") and p2p.get("s_1mb_mean"):
        # a step pays every one of its exchanges, their tails included: the means
        bw = (2 ** 20 - 1024) / max(float(p2p["s_1mb_mean"]) - float(p2p["latency_mean"]),
                                    1e-9)
    ar = meta.get("allreduce") or {}
    coll_s = coll_k = 0.0
    if ar.get("small_s") and ar.get("big_s") and ar.get("big_bytes"):
        coll_k = max(0.0, (float(ar["big_s"]) - float(ar["small_s"])) /
                     (float(ar["big_bytes"]) - 1024.0))
        coll_s = max(0.0, float(ar["small_s"]) - 1024.0 * coll_k)
    return {"latency": lat, "bw": bw,
            "send_s": float(p2p.get("send_s") or 0.0), "send_bw": float(p2p.get("send_bw") or 0.0),
            "recv_s": float(p2p.get("recv_s") or 0.0), "recv_bw": float(p2p.get("recv_bw") or 0.0),
            "coll_s": coll_s, "coll_k": coll_k}


def share_factor(workers: int, cores: int | None = None) -> float:
    """How much slower a worker computes when ``workers`` run at once on ``cores`` cores
    (``os.sched_getaffinity``: the ones this process may use): the operating system shares
    them evenly, ``max(1, workers / cores)``."""
    import os
    if cores is None:
        try:
            cores = len(os.sched_getaffinity(0))
        except (AttributeError, OSError):
            cores = os.cpu_count() or 1
    return max(1.0, float(workers) / max(1, int(cores)))


def _per(b, s, bw):
    return s + (b / bw if bw > 0 else 0.0)


def simulate_step(t, phases, costs: dict, share: float = 1.0) -> dict:
    """One step as the executor runs it, worker clocks advanced operator by operator:
    each operator's input exchanges, then its compute ``t[i, w] × share``, then its output's
    exchanges (``phases``: :func:`exchange_phases`).  In an exchange every worker first
    makes its ``isend`` calls in list order (``send_s + bytes / send_bw`` each, on its own
    clock); a transfer starts when its sender has made the call *and* its receiver has
    reached the exchange (the rendezvous: gloo moves a message into a posted receive), after
    the previous transfer on that link, and lands ``latency + bytes / bw`` later; a worker
    leaves the exchange when its own transfers have landed, then pays ``recv_s + bytes /
    recv_bw`` per piece it received.  A collective starts when its last member arrives and
    takes ``coll_s + coll_k × bytes`` (a reduce-scatter half the bytes of an all-reduce:
    the second half of a ring all-reduce is the all-gather).  Returns per worker ``clock``
    (its step), ``compute`` (its compute), ``calls`` (send and receive calls) and ``wait``
    (the rest: waiting on peers and links)."""
    t = np.asarray(t, dtype=np.float64)
    n, K = t.shape if t.ndim == 2 else (0, len(phases[0]) if phases else 1)
    clock = np.zeros(K)
    compute = np.zeros(K)
    calls = np.zeros(K)
    c = costs

    def exchange(trs, who):
        """One exchange call on the workers ``who`` (list order)."""
        start = clock.copy()
        posted = clock.copy()
        free: dict = {}
        done = clock.copy()
        for s, d, b in trs:
            if s not in who or d not in who:
                continue
            posted[s] += _per(b, c["send_s"], c["send_bw"])
            begin = max(posted[s], start[d], free.get((s, d), 0.0))
            wire = b / c["bw"] if c["bw"] > 0 else 0.0
            free[(s, d)] = begin + wire
            land = begin + c["latency"] + wire
            done[s] = max(done[s], land)
            done[d] = max(done[d], land)
        spent = posted - start
        for s, d, b in trs:
            if s in who and d in who:
                spent[d] += _per(b, c["recv_s"], c["recv_bw"])
                done[d] += _per(b, c["recv_s"], c["recv_bw"])
        for w in who:
            clock[w] = max(done[w], posted[w])
            calls[w] += spent[w]

    def collective(members, axis, b):
        end = max(clock[m] for m in members) + c["coll_s"] + c["coll_k"] * (
            b if axis is None else b / 2.0)
        for m in members:
            clock[m] = end

    def run(ph):
        """Phases in the same order on every worker: an exchange each worker takes part
        in; a collective only its members call."""
        steps = max((len(p) for p in ph), default=0)
        for j in range(steps):
            seen = {}
            for w in range(K):
                if j < len(ph[w]):
                    seen.setdefault(repr(ph[w][j][:2] if ph[w][j][0] == "c" else "x"),
                                    []).append(ph[w][j])
            for kind, got in seen.items():
                first = got[0]
                if first[0] == "x":
                    exchange(first[1], set(range(K)))
                else:
                    collective(first[1], first[2], first[3])

    for i in range(n):
        ph = phases[i] if i < len(phases) else [(0, [])] * K
        run([p[1][:p[0]] for p in ph])
        took = t[i] * share
        clock += took
        compute += took
        run([p[1][p[0]:] for p in ph])
    wait = clock - compute - calls
    return {"clock": clock, "compute": compute, "calls": calls, "wait": np.maximum(wait, 0.0)}


def predict_step(g, xplan: dict, comm_s: float, latency_s: float = 0.0,
                 dtype: str = "float32", device_kind: str = "cpu", cache_path=None,
                 progress=None, costs: dict | None = None, share: float = 1.0) -> dict:
    """The step time of an operator-level plan on this machine.

    With ``costs`` (:func:`comm_costs` of a calibrated device graph) the step is
    :func:`simulate_step`: every worker's rehearsed shards (× ``share``,
    :func:`share_factor`, when workers outnumber cores) and every transfer and collective
    the executor makes, at their calibrated costs, in the executor's order; the slowest
    worker's clock is ``predicted_step_time_s``, split into ``predicted_terms`` (its
    ``compute``, ``calls``, ``wait``; per worker in ``predicted_workers``).  Without, the
    earlier sum: Σ over the operators of the slowest worker's rehearsed time (lockstep), plus
    ``comm_s`` (the plan's bytes over the links), plus ``latency_s`` for each exchange.
    Both report ``predicted_compute_step_s`` (the lockstep compute), ``predicted_compute_s``
    (per worker, its own operators), ``predicted_comm_s`` (``comm_s``),
    ``predicted_latency_s``, ``compute_source`` and ``shard_timing``
    (:func:`shard_seconds`'s info)."""
    names, t, ex, info = shard_seconds(g, xplan, dtype, device_kind, cache_path,
                                       progress=progress)
    lock = float(t.max(axis=1).sum()) if t.size else 0.0
    lat = float((ex.max(axis=1) if ex.size else ex).sum()) * float(latency_s)
    out = {"predicted_step_time_s": lock + float(comm_s) + lat,
           "predicted_compute_step_s": lock,
           "predicted_compute_s": [float(x) for x in t.sum(axis=0)],
           "predicted_comm_s": float(comm_s), "predicted_latency_s": lat,
           "compute_source": f"operator shards rehearsed on this machine ({dtype}, "
                             f"after explorer calibrate)",
           "shard_timing": info}
    if costs is None:
        return out
    sim = simulate_step(t, exchange_phases(g, xplan, dtype), costs, share)
    slow = int(np.argmax(sim["clock"]))
    out.update(predicted_step_time_s=float(sim["clock"][slow]), predicted_latency_s=0.0,
               predicted_terms={k: float(sim[k][slow]) for k in ("compute", "calls", "wait")},
               predicted_workers=[{k: float(sim[k][w]) for k in ("clock", "compute", "calls",
                                                                   "wait")}
                                  for w in range(len(sim["clock"]))],
               predicted_share=float(share),
               predicted_by_target=_by_target(g, xplan, names, t, share),
               comm_model="executor's transfers and collectives at the calibrated gloo costs")
    return out


def _by_target(g, xplan, names, t, share) -> dict:
    """Rehearsed seconds per aten target and worker (× ``share``), to set beside the run's
    ``step_profile``."""
    out: dict = {}
    for i, nm in enumerate(names):
        o = g.ops[nm]
        k = o.target if nm in xplan["ops"] else "(bookkeeping)"
        acc = out.setdefault(k, [0.0] * t.shape[1])
        for w in range(t.shape[1]):
            acc[w] += float(t[i, w]) * share
    return out

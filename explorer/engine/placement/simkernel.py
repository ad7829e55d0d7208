"""The simulator's event loop compiled with numba: the same schedule, many times faster.

Celeritas's refinement judges every candidate move by simulating the whole step (hundreds of
simulations per placement), so the event loop of :func:`~.simulator.simulate` is its cost.
:func:`run` is that loop, line for line, over arrays instead of Python lists and dicts - the
same arithmetic in the same order, so its schedule is identical (tested against the Python
loop on random graphs, every device graph kind: contention, rendezvous, shared cores, send and
receive calls).

``scripts/setup.sh`` compiles it ahead of time (:func:`build`, numba's ``pycc``) into an
extension module in the user cache directory (:func:`.storage.kernel_cache`), keyed by this
file's source: loading it costs milliseconds and needs no numba at all, where loading numba
and its cached machine code costs about half a second of every new process - as much as a
whole placement of Inception-v3.  Without that module (no C compiler, an edited source) the
loop is compiled by ``numba.njit(cache=True)`` on first use, as before.
"""

from __future__ import annotations

import hashlib
import heapq
import importlib.machinery
import importlib.util
import os
import platform
import sys
from pathlib import Path

import numpy as np

__all__ = ["available", "run", "warm", "build", "aot_path", "kind", "main", "MIN_NODES"]

#: below this many operators the Python loop is as fast as loading numba
MIN_NODES = 400

#: the ahead-of-time module's name (its ``PyInit_`` symbol); the file name carries the key
_AOT_NAME = "_explorer_simloop"

_KERNEL = None
_KIND = ""                               # "aot" or "jit" once loaded


def _mode() -> str:
    """``EXPLORER_SIM_KERNEL``: ``0`` the Python loop, ``jit`` numba's cache only, else any."""
    return os.environ.get("EXPLORER_SIM_KERNEL", "1")


def available() -> bool:
    """Whether the compiled loop can be used: its ahead-of-time module is built or numba is
    importable, and ``EXPLORER_SIM_KERNEL=0`` does not disable it."""
    if _mode() == "0":
        return False
    if _KERNEL is not None:
        return True
    return (_mode() != "jit" and aot_path().exists()) or \
        importlib.util.find_spec("numba") is not None


def aot_path() -> Path:
    """Where :func:`build` puts the compiled module: the kernel cache's ``aot`` folder, the
    file named by a hash of this source, numpy's version and the interpreter, so an edited
    loop or another numpy is never served a stale module."""
    from explorer.engine.core.storage import kernel_cache
    key = hashlib.sha1(Path(__file__).read_bytes())
    key.update(f"{np.__version__}|{sys.implementation.cache_tag}|{platform.machine()}".encode())
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    return Path(kernel_cache()) / "aot" / f"{_AOT_NAME}-{key.hexdigest()[:16]}{suffix}"


def _load_aot():
    """The ahead-of-time module's ``run``, or ``None`` (not built, or it does not load)."""
    path = aot_path()
    if not path.exists():
        return None
    try:
        spec = importlib.util.spec_from_file_location(_AOT_NAME, path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod.run
    except (ImportError, OSError, AttributeError):
        return None


def _jit_helpers():
    """Compile the loop's helpers with numba (once): the loop calls them as compiled code."""
    import numba
    g = _loop.__globals__
    for name in ("_hold", "_try_start", "_launch", "_advance"):
        if not isinstance(g[name], numba.core.dispatcher.Dispatcher):
            g[name] = numba.njit(cache=True)(g[name])
    return numba


def _jit():
    """The loop compiled by numba (loaded from its cache, compiled into it when empty)."""
    from explorer.engine.core.storage import kernel_cache
    kernel_cache()
    return _jit_helpers().njit(cache=True)(_loop)


def _kernel():
    global _KERNEL, _KIND
    if _KERNEL is None:
        fn = _load_aot() if _mode() != "jit" else None
        _KERNEL, _KIND = (fn, "aot") if fn is not None else (_jit(), "jit")
    return _KERNEL


def kind() -> str:
    """Which compiled loop this process runs: ``"aot"``, ``"jit"`` or ``""`` (none yet)."""
    return _KIND


def build() -> Path:
    """Compile the loop ahead of time (numba's ``pycc``, for any CPU of this architecture)
    into :func:`aot_path`; written under a temporary name and renamed, so a concurrent search
    never loads half a file.  Raises what the compiler raises (no C compiler, no headers)."""
    import tempfile
    import warnings
    from numba import types as T
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")          # pycc's pending deprecation
        from numba.pycc import CC
        _jit_helpers()
        i8, f8, b1 = T.int64, T.float64, T.boolean
        ai, af, af2 = T.Array(i8, 1, "C"), T.Array(f8, 1, "C"), T.Array(f8, 2, "C")
        out = T.Tuple((af, af, af, f8, T.Array(f8, 2, "A"), b1))
        sig = out(i8, i8, ai, af, af, ai, ai, ai, ai, ai, af2, af2, b1, b1, b1, f8, f8, f8, f8,
                  f8, i8)
        dest = aot_path()
        dest.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=dest.parent) as tmp:
            cc = CC(_AOT_NAME)
            cc.output_dir = tmp
            cc.verbose = False
            cc.export("run", sig)(_loop)
            cc.compile()
            built = next(Path(tmp).glob(_AOT_NAME + "*"))
            os.replace(built, dest)
    import time
    for old in dest.parent.glob(_AOT_NAME + "-*"):   # built from other sources a week ago:
        try:                                         # (another checkout may use a newer one)
            if old != dest and time.time() - old.stat().st_mtime > 7 * 86400:
                old.unlink()
        except OSError:
            pass
    return dest


def run(n, nd, dev, w, ob, succ_ptr, succ_idx, rank, rem_ptr, rem_dev, K, B, ports,
        rendezvous, shared, cores, send_b, send_k, recv_b, recv_k, kernel=None):
    """The event loop; returns ``(start, finish, busy, comm_bytes, transfers [m, 6], stalled)``.
    Arrays as :func:`build` declares them: int64 and float64, C-contiguous."""
    ntr = max(1, len(rem_dev))
    return (kernel or _kernel())(n, nd, dev, w, ob, succ_ptr, succ_idx, rank, rem_ptr, rem_dev,
                                 K, B, ports, rendezvous, shared, float(cores), send_b, send_k,
                                 recv_b, recv_k, ntr)


def warm(kernel=None) -> bool:
    """Load the loop now - the ahead-of-time module, else numba's cache, compiling into it if
    empty - so that the first placement does not pay for it; ``False`` without either."""
    if kernel is None and not available():
        return False
    i64, f64 = np.int64, np.float64
    run(2, 2, np.array([0, 1], i64), np.ones(2), np.ones(2), np.array([0, 1, 1], i64),
        np.array([1], i64), np.array([0, 1], i64), np.array([0, 1, 1], i64),
        np.array([1], i64), np.ones((2, 2), f64), np.zeros((2, 2), f64), True, False, False,
        0.0, 0.0, 0.0, 0.0, 0.0, kernel=kernel)
    return True


# The loop's state that its helpers update: ``ctr`` = [event sequence number, transfers so far,
# devices running while cores are shared]; ``cb`` = [bytes sent].  The helpers are compiled with
# the loop (:func:`_kernel`) and mirror the nested functions of the Python loop.

def _hold(d, t, call, idle, busy, shared, run_on, run_v, run_left, ctr, events):
    """Device ``d``'s thread is busy from ``t`` for ``call`` seconds of send or receive calls."""
    idle[d] = False
    busy[d] += call
    if shared:
        if not run_on[d]:
            ctr[2] += 1
        run_on[d] = True
        run_v[d] = -1
        run_left[d] = call
    else:
        ctr[0] += 1
        heapq.heappush(events, (t + call, ctr[0], 2, -1, d))


def _try_start(d, t, idle, pend, ready, cur, start, finish, busy, w, shared, run_on, run_v,
               run_left, ctr, events):
    """An idle device pays the receive calls it owes, else starts its first ready operator."""
    if not idle[d]:
        return
    if pend[d] > 0:
        call = pend[d]
        pend[d] = 0.0
        _hold(d, t, call, idle, busy, shared, run_on, run_v, run_left, ctr, events)
        return
    if len(ready[d]) == 0:
        return
    _, v = heapq.heappop(ready[d])
    idle[d] = False
    cur[d] = v
    start[v] = t
    busy[d] += w[v]
    if shared:
        if not run_on[d]:
            ctr[2] += 1
        run_on[d] = True
        run_v[d] = v
        run_left[d] = w[v]
        return
    f = t + w[v]
    finish[v] = f
    ctr[0] += 1
    heapq.heappush(events, (f, ctr[0], 0, v, d))


def _launch(u, src, e, t, extra, ob, K, B, ports, send_free, recv_free, tr, ctr, cb, events):
    """Transfer ``u``'s output from ``src`` to ``e``, its message ready at ``t``."""
    nb = ob[u]
    dur = K[src, e] * nb + B[src, e] + extra
    st = t
    if ports:
        if send_free[src] > st:
            st = send_free[src]
        if recv_free[e] > st:
            st = recv_free[e]
        send_free[src] = st + dur
        recv_free[e] = st + dur
    cb[0] += nb
    k = ctr[1]
    tr[k, 0] = u
    tr[k, 1] = src
    tr[k, 2] = e
    tr[k, 3] = st
    tr[k, 4] = st + dur
    tr[k, 5] = nb
    ctr[1] += 1
    ctr[0] += 1
    heapq.heappush(events, (st + dur, ctr[0], 1, u, e))


def _advance(t, clock, cores, run_on, run_left, ctr):
    """Shared cores: the running operators progress from ``clock`` to ``t``; the new clock."""
    if ctr[2] > 0 and t > clock:
        r = min(1.0, cores / ctr[2])
        for dd in range(len(run_on)):
            if run_on[dd]:
                run_left[dd] -= (t - clock) * r
    return max(clock, t)


def _loop(n, nd, dev, w, ob, succ_ptr, succ_idx, rank, rem_ptr, rem_dev, K, B, ports,
          rendezvous, shared, cores, send_b, send_k, recv_b, recv_k, ntr):
    start = np.zeros(n)
    finish = np.zeros(n)
    busy = np.zeros(nd)
    waiting = np.zeros(n, dtype=np.int64)
    for v in range(n):
        for k in range(succ_ptr[v], succ_ptr[v + 1]):
            waiting[succ_idx[k]] += 1
    idle = np.ones(nd, dtype=np.bool_)
    send_free = np.zeros(nd)
    recv_free = np.zeros(nd)
    pend = np.zeros(nd)
    cur = np.full(nd, -1, dtype=np.int64)
    # shared cores: run_on[d], with (node or -1 for send calls, work left)
    run_on = np.zeros(nd, dtype=np.bool_)
    run_v = np.full(nd, -1, dtype=np.int64)
    run_left = np.zeros(nd)
    clock = 0.0
    tr = np.zeros((ntr, 6))              # transfers in launch order: node, src, dst, start, end, bytes
    ctr = np.zeros(3, dtype=np.int64)
    cb = np.zeros(1)
    # deferred receives: per operator a linked list of (node, src, dst), in insertion order
    d_head = np.full(n, -1, dtype=np.int64)
    d_tail = np.full(n, -1, dtype=np.int64)
    d_next = np.full(ntr, -1, dtype=np.int64)
    d_u = np.zeros(ntr, dtype=np.int64)
    d_src = np.zeros(ntr, dtype=np.int64)
    d_dst = np.zeros(ntr, dtype=np.int64)
    nd_def = 0
    events = [(0.0, 0, 0, 0, 0)]
    events.pop()
    ready = [[(0, 0)] for _ in range(nd)]
    for d in range(nd):
        ready[d].pop()

    for v in range(n):
        if waiting[v] == 0:
            heapq.heappush(ready[dev[v]], (rank[v], v))
    for d in range(nd):
        _try_start(d, 0.0, idle, pend, ready, cur, start, finish, busy, w, shared, run_on,
                   run_v, run_left, ctr, events)

    while len(events) > 0 or ctr[2] > 0:
        tf = 0.0
        dn = -1
        vn = -1
        if ctr[2] > 0:                   # shared: the next operator (or calls) to finish
            best = 0.0
            for dd in range(nd):
                if run_on[dd] and (dn < 0 or run_left[dd] < best):
                    best = run_left[dd]
                    dn = dd
            vn = run_v[dn]
            tf = clock + max(run_left[dn], 0.0) / min(1.0, cores / ctr[2])
        if ctr[2] > 0 and not (len(events) > 0 and events[0][0] < tf):
            clock = _advance(tf, clock, cores, run_on, run_left, ctr)
            run_on[dn] = False
            ctr[2] -= 1
            if vn >= 0:
                finish[vn] = tf
            t = tf
            kind = 0 if vn >= 0 else 2
            a = vn
            d = dn
        else:
            ev = heapq.heappop(events)
            t = ev[0]
            kind = ev[2]
            a = ev[3]
            d = ev[4]
            clock = _advance(t, clock, cores, run_on, run_left, ctr)
        target = d
        if kind == 2:                    # the device's send calls are done
            idle[d] = True
        elif kind == 0:
            v = a
            idle[d] = True
            cur[d] = -1
            k = d_head[v]
            d_head[v] = -1
            while k >= 0:                # receives posted after v: now
                _launch(d_u[k], d_src[k], d_dst[k], t, B[d_src[k], d_dst[k]], ob, K, B, ports,
                        send_free, recv_free, tr, ctr, cb, events)
                k = d_next[k]
            for kk in range(succ_ptr[v], succ_ptr[v + 1]):
                s = succ_idx[kk]
                if dev[s] == d:
                    waiting[s] -= 1
                    if waiting[s] == 0:
                        heapq.heappush(ready[d], (rank[s], s))
            nrem = rem_ptr[v + 1] - rem_ptr[v]
            if nrem > 0:
                for kk in range(rem_ptr[v], rem_ptr[v + 1]):
                    e = rem_dev[kk]
                    r2 = cur[e]
                    if rendezvous and r2 >= 0 and (start[r2] < start[v] or
                                                   (start[r2] == start[v] and r2 < v)):
                        d_u[nd_def] = v
                        d_src[nd_def] = d
                        d_dst[nd_def] = e
                        if d_head[r2] < 0:
                            d_head[r2] = nd_def
                        else:
                            d_next[d_tail[r2]] = nd_def
                        d_tail[r2] = nd_def
                        nd_def += 1
                    else:
                        _launch(v, d, e, t, 0.0, ob, K, B, ports, send_free, recv_free, tr,
                                ctr, cb, events)
                call = nrem * (send_b + send_k * ob[v])
                if call > 0:             # the sender's thread makes the isend calls
                    _hold(d, t, call, idle, busy, shared, run_on, run_v, run_left, ctr, events)
                    target = -1
        else:                            # a transfer arrived at device d
            u = a
            pend[d] += recv_b + recv_k * ob[u]
            for kk in range(succ_ptr[u], succ_ptr[u + 1]):
                s = succ_idx[kk]
                if dev[s] == d:
                    waiting[s] -= 1
                    if waiting[s] == 0:
                        heapq.heappush(ready[d], (rank[s], s))
        if target >= 0:
            _try_start(target, t, idle, pend, ready, cur, start, finish, busy, w, shared,
                       run_on, run_v, run_left, ctr, events)
    stalled = False
    for v in range(n):
        if waiting[v] > 0:
            stalled = True
    return start, finish, busy, cb[0], tr[:ctr[1]], stalled


def main() -> None:
    """scripts/setup.sh: compile once at install - ahead of time where a C compiler allows,
    into numba's cache otherwise (and as well, for ``EXPLORER_SIM_KERNEL=jit``)."""
    if importlib.util.find_spec("numba") is None:
        print("setup: placement simulator kernel skipped (no numba)")
        return
    how = "compiled ahead of time"
    if _load_aot() is None:
        try:
            build()
        except Exception as exc:         # noqa: BLE001 - any compiler failure: numba's cache
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            how = f"compiled into numba's cache (ahead of time not built: {first[:120]})"
    warm(_jit())
    print("setup: placement simulator kernel " + how)

"""The simulator's event loop compiled with numba: the same schedule, many times faster.

Celeritas's refinement judges every candidate move by simulating the whole step (hundreds of
simulations per placement), so the event loop of :func:`~.simulator.simulate` is its cost.
:func:`run` is that loop, line for line, over arrays instead of Python lists and dicts - the
same arithmetic in the same order, so its schedule is identical (tested against the Python
loop on random graphs, every device graph kind: contention, rendezvous, shared cores, send and
receive calls).  numba is imported on first use, and its machine code is cached in
the user cache directory (:func:`.storage.kernel_cache`, ``cache=True``), like the layer-wise kernels.
"""

from __future__ import annotations

import heapq
import os

import numpy as np

__all__ = ["available", "run", "warm", "main", "MIN_NODES"]

#: below this many operators the Python loop is as fast as loading numba
MIN_NODES = 400

_KERNEL = None


def available() -> bool:
    """Whether the compiled loop can be used (numba importable; not disabled by
    ``EXPLORER_SIM_KERNEL=0``)."""
    if os.environ.get("EXPLORER_SIM_KERNEL", "1") == "0":
        return False
    import importlib.util
    return importlib.util.find_spec("numba") is not None


def _kernel():
    global _KERNEL
    if _KERNEL is None:
        from explorer.engine.core.storage import kernel_cache
        kernel_cache()
        import numba
        g = _loop.__globals__            # the helpers, compiled with the loop that calls them
        for name in ("_hold", "_try_start", "_launch", "_advance"):
            g[name] = numba.njit(cache=True)(g[name])
        _KERNEL = numba.njit(cache=True)(_loop)
    return _KERNEL


def run(n, nd, dev, w, ob, succ_ptr, succ_idx, rank, rem_ptr, rem_dev, K, B, ports,
        rendezvous, shared, cores, send_b, send_k, recv_b, recv_k):
    """The event loop; returns ``(start, finish, busy, comm_bytes, transfers [m, 6], stalled)``.
    """
    ntr = max(1, len(rem_dev))
    return _kernel()(n, nd, dev, w, ob, succ_ptr, succ_idx, rank, rem_ptr, rem_dev, K, B,
                     ports, rendezvous, shared, float(cores), send_b, send_k, recv_b, recv_k,
                     ntr)


def warm() -> bool:
    """Compile the loop now (into numba's cache: later processes load it in well under a
    second) so that the first placement does not pay for it; ``False`` without numba."""
    if not available():
        return False
    i64, f64 = np.int64, np.float64
    run(2, 2, np.array([0, 1], i64), np.ones(2), np.ones(2), np.array([0, 1, 1], i64),
        np.array([1], i64), np.array([0, 1], i64), np.array([0, 1, 1], i64),
        np.array([1], i64), np.ones((2, 2), f64), np.zeros((2, 2), f64), True, False, False,
        0.0, 0.0, 0.0, 0.0, 0.0)
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
    """scripts/setup.sh: compile once at install."""
    print("setup: placement simulator kernel " + ("compiled" if warm() else "skipped (no numba)"))

"""The simulator's event loop compiled with numba: the same schedule, many times faster.

Celeritas's refinement judges every candidate move by simulating the whole step (hundreds of
simulations per placement), so the event loop of :func:`~.simulator.simulate` is its cost.
:func:`run` is that loop, line for line, over arrays instead of Python lists and dicts - the
same arithmetic in the same order, so its schedule is identical (tested against the Python
loop on random graphs, every device graph kind: contention, rendezvous, shared cores, send and
receive calls).  numba is imported on first use, and its machine code is cached in
``$EXPLORER_HOME/numba`` (``cache=True``), like the layer-wise kernels.
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
        from explorer.engine.core.storage import home
        os.environ.setdefault("NUMBA_CACHE_DIR", str(home() / "numba"))
        import numba
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
    # shared cores: running[d] = (node or -1 for send calls, work left)
    run_on = np.zeros(nd, dtype=np.bool_)
    run_v = np.full(nd, -1, dtype=np.int64)
    run_left = np.zeros(nd)
    n_running = 0
    clock = 0.0
    # transfers, in launch order: node, src, dst, start, end, bytes
    tr = np.zeros((ntr, 6))
    ntrans = 0
    comm_bytes = 0.0
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
    seq = 0

    for v in range(n):
        if waiting[v] == 0:
            heapq.heappush(ready[dev[v]], (rank[v], v))
    for d0 in range(nd):
        # try_start(d0, 0.0)
        if not idle[d0]:
            continue
        if pend[d0] > 0:
            call = pend[d0]
            pend[d0] = 0.0
            idle[d0] = False
            busy[d0] += call
            if shared:
                if not run_on[d0]:
                    n_running += 1
                run_on[d0] = True
                run_v[d0] = -1
                run_left[d0] = call
            else:
                seq += 1
                heapq.heappush(events, (0.0 + call, seq, 2, -1, d0))
            continue
        if len(ready[d0]) == 0:
            continue
        _, v = heapq.heappop(ready[d0])
        idle[d0] = False
        cur[d0] = v
        start[v] = 0.0
        busy[d0] += w[v]
        if shared:
            if not run_on[d0]:
                n_running += 1
            run_on[d0] = True
            run_v[d0] = v
            run_left[d0] = w[v]
            continue
        f = 0.0 + w[v]
        finish[v] = f
        seq += 1
        heapq.heappush(events, (f, seq, 0, v, d0))

    while len(events) > 0 or n_running > 0:
        tf = 0.0
        dn = -1
        vn = -1
        if n_running > 0:
            best = 0.0
            for dd in range(nd):
                if run_on[dd] and (dn < 0 or run_left[dd] < best):
                    best = run_left[dd]
                    dn = dd
            vn = run_v[dn]
            left = run_left[dn]
            tf = clock + max(left, 0.0) / min(1.0, cores / n_running)
        if n_running > 0 and not (len(events) > 0 and events[0][0] < tf):
            # advance(tf)
            if tf > clock:
                r = min(1.0, cores / n_running)
                for dd in range(nd):
                    if run_on[dd]:
                        run_left[dd] -= (tf - clock) * r
            clock = max(clock, tf)
            run_on[dn] = False
            n_running -= 1
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
            if n_running > 0 and t > clock:
                r = min(1.0, cores / n_running)
                for dd in range(nd):
                    if run_on[dd]:
                        run_left[dd] -= (t - clock) * r
            clock = max(clock, t)
        if kind == 2:
            idle[d] = True
            target = d
        elif kind == 0:
            v = a
            idle[d] = True
            cur[d] = -1
            k = d_head[v]
            d_head[v] = -1
            while k >= 0:                           # receives posted after v: now
                u, src, e = d_u[k], d_src[k], d_dst[k]
                nb = ob[u]
                dur = K[src, e] * nb + B[src, e] + B[src, e]
                st = t
                if ports:
                    if send_free[src] > st:
                        st = send_free[src]
                    if recv_free[e] > st:
                        st = recv_free[e]
                    send_free[src] = st + dur
                    recv_free[e] = st + dur
                comm_bytes += nb
                tr[ntrans, 0] = u
                tr[ntrans, 1] = src
                tr[ntrans, 2] = e
                tr[ntrans, 3] = st
                tr[ntrans, 4] = st + dur
                tr[ntrans, 5] = nb
                ntrans += 1
                seq += 1
                heapq.heappush(events, (st + dur, seq, 1, u, e))
                k = d_next[k]
            for kk in range(succ_ptr[v], succ_ptr[v + 1]):
                s = succ_idx[kk]
                if dev[s] == d:
                    waiting[s] -= 1
                    if waiting[s] == 0:
                        heapq.heappush(ready[d], (rank[s], s))
            nrem = rem_ptr[v + 1] - rem_ptr[v]
            target = d
            if nrem > 0:
                nb = ob[v]
                for kk in range(rem_ptr[v], rem_ptr[v + 1]):
                    e = rem_dev[kk]
                    r2 = cur[e]
                    if rendezvous and r2 >= 0 and (start[r2] < start[v] or
                                                   (start[r2] == start[v] and r2 < v)):
                        d_u[nd_def] = v
                        d_src[nd_def] = d
                        d_dst[nd_def] = e
                        d_next[nd_def] = -1
                        if d_head[r2] < 0:
                            d_head[r2] = nd_def
                        else:
                            d_next[d_tail[r2]] = nd_def
                        d_tail[r2] = nd_def
                        nd_def += 1
                    else:
                        dur = K[d, e] * nb + B[d, e] + 0.0
                        st = t
                        if ports:
                            if send_free[d] > st:
                                st = send_free[d]
                            if recv_free[e] > st:
                                st = recv_free[e]
                            send_free[d] = st + dur
                            recv_free[e] = st + dur
                        comm_bytes += nb
                        tr[ntrans, 0] = v
                        tr[ntrans, 1] = d
                        tr[ntrans, 2] = e
                        tr[ntrans, 3] = st
                        tr[ntrans, 4] = st + dur
                        tr[ntrans, 5] = nb
                        ntrans += 1
                        seq += 1
                        heapq.heappush(events, (st + dur, seq, 1, v, e))
                call = nrem * (send_b + send_k * nb)
                if call > 0:                        # the sender's thread makes the isend calls
                    idle[d] = False
                    busy[d] += call
                    if shared:
                        if not run_on[d]:
                            n_running += 1
                        run_on[d] = True
                        run_v[d] = -1
                        run_left[d] = call
                    else:
                        seq += 1
                        heapq.heappush(events, (t + call, seq, 2, -1, d))
                    target = -1
        else:
            u = a
            e = d
            pend[e] += recv_b + recv_k * ob[u]
            for kk in range(succ_ptr[u], succ_ptr[u + 1]):
                s = succ_idx[kk]
                if dev[s] == e:
                    waiting[s] -= 1
                    if waiting[s] == 0:
                        heapq.heappush(ready[e], (rank[s], s))
            target = e
        if target < 0 or not idle[target]:
            continue
        # try_start(target, t)
        d = target
        if pend[d] > 0:
            call = pend[d]
            pend[d] = 0.0
            idle[d] = False
            busy[d] += call
            if shared:
                if not run_on[d]:
                    n_running += 1
                run_on[d] = True
                run_v[d] = -1
                run_left[d] = call
            else:
                seq += 1
                heapq.heappush(events, (t + call, seq, 2, -1, d))
            continue
        if len(ready[d]) == 0:
            continue
        _, v = heapq.heappop(ready[d])
        idle[d] = False
        cur[d] = v
        start[v] = t
        busy[d] += w[v]
        if shared:
            if not run_on[d]:
                n_running += 1
            run_on[d] = True
            run_v[d] = v
            run_left[d] = w[v]
            continue
        f = t + w[v]
        finish[v] = f
        seq += 1
        heapq.heappush(events, (f, seq, 0, v, d))
    stalled = False
    for v in range(n):
        if waiting[v] > 0:
            stalled = True
    return start, finish, busy, comm_bytes, tr[:ntrans], stalled


def main() -> None:
    """scripts/setup.sh: compile once at install."""
    print("setup: placement simulator kernel " + ("compiled" if warm() else "skipped (no numba)"))

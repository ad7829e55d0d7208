"""Kernels compiled with numba for searches at hundreds of devices: the by-node transfer
kernel (one loop per (source candidate, destination candidate) over the destination's
devices, no temporaries) and the elimination's min-plus product over each row's useful
columns (:func:`.search.optcnn._min_plus`).

:meth:`.costmodel.CostModel._xfer_by_node` computes, for every source candidate ``s`` and
destination candidate ``j``, the bytes each device ``m`` of ``j`` receives from its own node
(``|R_m ∩ node box| − |R_m ∩ own tile|``) and from other nodes (``|R_m| − |R_m ∩ node
box|``), its time (bytes over each link's bandwidth plus the larger latency it pays) and the
slowest device.  The numpy path does it over ``[s, j, m]`` blocks, a few dozen passes over
memory per element; this kernel does it in one pass over boxes laid out per axis (so its
loops vectorise), skips the overlap on an axis one side covers whole, and is used above
:data:`.costmodel.CostModel.JIT_WORK` elements (hundreds of devices), where it takes about a
quarter of the numpy path's CPU.  Both kernels release the GIL and run over disjoint halves
on two Python threads (:func:`split`).  Compiling takes a few seconds the first time; the
machine code is cached in the user cache directory (:func:`.storage.kernel_cache`, numba's ``cache=True``; compiled by ``scripts/setup.sh``), so later
processes load it.

Every number equals the numpy path's bit for bit: volumes are exact integers (products and
sums of integers far below 2**53, in any order), and the seconds are the same IEEE operations
in the same order (``intra / bw_in + inter / bw_out``, then the latency).
"""

from __future__ import annotations

import os
import threading
from contextlib import contextmanager

import numpy as np

from explorer.engine.core.storage import kernel_cache

_KERNEL = None
_NOGIL: dict = {}      # name -> compiled kernel
_INIT = threading.Lock()


def _fresh_lock_in_child() -> None:
    """A forked search starts with the kernels' lock free (see :mod:`.costmodel`)."""
    global _INIT
    _INIT = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_fresh_lock_in_child)
#: Threads a compiled call is split over (disjoint destination blocks or rows): the kernels
#: release the GIL, so plain Python threads run them on both cores - no numba thread pool,
#: whose default layer must not be entered from two threads at once nor used after a fork
THREADS = min(2, os.cpu_count() or 1)


def kernel():
    """The compiled kernel (numba imported, and its cache directory set, on first use)."""
    global _KERNEL
    with _INIT:
        if _KERNEL is None:
            kernel_cache()
            import numba

            # the two reductions may run in any order: a maximum, and a sum of whole numbers
            # (exact in float64); the times themselves are computed without fast-math
            fast = numba.njit(cache=True, fastmath={"nnan", "nsz", "reassoc"})
            g = _by_node.__globals__
            g["_amax"], g["_asum"] = fast(_amax), fast(_asum)
            _KERNEL = numba.njit(cache=True, nogil=True)(_by_node)
    return _KERNEL


def _compiled(fn):
    """``fn`` compiled once per process (GIL released, numba's cache; see :func:`kernel`)."""
    kernel()
    with _INIT:
        got = _NOGIL.get(fn.__name__)
        if got is None:
            import numba

            got = _NOGIL[fn.__name__] = numba.njit(cache=True, nogil=True)(fn)
    return got


def min_plus_kernel():
    """The compiled :func:`_min_plus_rows`."""
    return _compiled(_min_plus_rows)


@contextmanager
def threads(n: int):
    """:data:`THREADS` set to ``n`` inside (a search whose processes already take the
    cores: :mod:`explorer.engine.core.forked`), restored after."""
    global THREADS
    was, THREADS = THREADS, max(1, int(n))
    try:
        yield
    finally:
        THREADS = was


def split(fn, n: int, threads: int = 0, weight=None) -> None:
    """``fn(lo, hi)`` over ``[0, n)`` cut into ``threads`` (default :data:`THREADS`) parts run
    on as many threads (each part writes its own rows of the outputs).

    ``weight [n]``: each index's work; the parts then carry equal work, not equal counts.
    Destinations are ordered by device count and rows' useful columns vary, so equal counts
    leave one thread with most of it (a 1,024-device transfer table: 44 k device slots on
    one half, 289 k on the other - the pair ran at 1.25 cores instead of 2)."""
    threads = threads or THREADS
    if threads <= 1 or n < 2:
        fn(0, n)
        return
    from concurrent.futures import ThreadPoolExecutor

    cuts = weighted_cuts(n, threads, weight)
    with ThreadPoolExecutor(threads - 1) as ex:
        rest = [ex.submit(fn, a, b) for a, b in zip(cuts[1:-1], cuts[2:]) if b > a]
        fn(cuts[0], cuts[1])
        for f in rest:
            f.result()                  # re-raises a part's error here


def weighted_cuts(n: int, parts: int, weight=None) -> list:
    """``parts + 1`` ascending bounds over ``[0, n)`` giving each part about ``1/parts`` of
    the total ``weight`` (equal counts without one).

    Examples
    --------
    >>> weighted_cuts(4, 2)
    [0, 2, 4]
    >>> weighted_cuts(4, 2, [1, 1, 1, 9])
    [0, 3, 4]
    """
    acc = None if weight is None else np.concatenate(
        [[0.0], np.cumsum(np.asarray(weight, dtype=np.float64))])
    if acc is None or not acc[-1] > 0:
        return [n * i // parts for i in range(parts + 1)]
    target = acc[-1] * np.arange(1, parts) / parts
    hi = np.searchsorted(acc, target, side="left")      # first bound reaching the target
    lo = np.maximum(hi - 1, 0)
    near = np.where(target - acc[lo] < acc[hi] - target, lo, hi)   # the nearer bound
    return [0] + [int(c) for c in np.maximum.accumulate(near)] + [n]


def _useful_rows(a, b, refs, margin, keep, i0, i1):
    """:func:`.optcnn._useful_middle`'s test for rows ``i0 <= i < i1``, fused: ``keep[i, j]``
    stays true only if ``a[i, j] − a[i, t] <= max_k (b[t, k] − b[j, k]) + margin`` for every
    reference ``t`` - the same subtractions, maximum and comparison as its numpy lines, in
    one pass without temporaries."""
    cj = b.shape[0]
    ck = b.shape[1]
    gain = np.empty(cj)
    for t in refs:
        for j in range(cj):
            g = b[t, 0] - b[j, 0]
            for k in range(1, ck):
                g = max(g, b[t, k] - b[j, k])
            gain[j] = g + margin
        for i in range(i0, i1):
            at = a[i, t]
            for j in range(cj):
                if a[i, j] - at > gain[j]:
                    keep[i, j] = False


def useful_kernel():
    """The compiled :func:`_useful_rows`."""
    return _compiled(_useful_rows)


def _min_plus_rows(a, b, ptr, cols, arg, m, i0, i1):
    """``arg[i, k]`` and ``m[i, k]`` for rows ``i0 <= i < i1``: the first ``j`` (ascending)
    among row ``i``'s columns ``cols[ptr[i]:ptr[i + 1]]`` minimising ``a[i, j] + b[j, k]``,
    and that sum (the one computed, so the same number as adding the two again).

    Each column ``j`` updates the row's running minimum over every ``k`` at once (``b``'s
    row ``j`` is contiguous, so the loop over ``k`` vectorises; five times the speed of one
    ``k`` at a time over gathered columns).  The same sums as numpy's ``argmin`` over them,
    compared in ascending ``j`` with a strict ``<``, so the first of equal ones: the same
    answer for finite tables (the caller's condition)."""
    ck = b.shape[1]
    best = np.empty(ck)
    barg = np.empty(ck, dtype=np.int32)          # (selects without branches vectorise)
    for i in range(i0, i1):
        c0 = ptr[i]
        c1 = ptr[i + 1]
        j = cols[c0]
        aij = a[i, j]
        for k in range(ck):
            best[k] = aij + b[j, k]
            barg[k] = j
        for q in range(c0 + 1, c1):
            j = cols[q]
            jj = np.int32(j)
            aij = a[i, j]
            bj = b[j]
            for k in range(ck):
                v = aij + bj[k]
                lt = v < best[k]
                best[k] = min(v, best[k])
                barg[k] = jj if lt else barg[k]
        for k in range(ck):
            m[i, k] = best[k]
            arg[i, k] = barg[k]


def _amax(a, u):
    """Largest of ``a[:u]`` (times: non-negative), 0 when empty."""
    best = 0.0
    for m in range(u):
        best = max(best, a[m])
    return best


def _asum(a, u):
    """Sum of ``a[:u]``."""
    tot = 0.0
    for m in range(u):
        tot += a[m]
    return tot


def _by_node(t, nbytes, ddev, kd, ident, cut, nlo, nhi, tot, tot_b, sfx, olo, ohi, blo, bhi,
             ks, hend, sfull, rfull, item, bw_in, bw_out, lat_in, lat_out, fin_in, fin_out,
             afull, bown, bnode, jlo, jhi):
    """Fill columns ``jlo <= j < jhi`` of ``t [Cs, Cd]`` and ``nbytes [Cs, Cd]``.

    ``ddev [Cd, Dd]`` destination devices (``kd [Cd]`` used), ``ident [Cd]``: destination
    ``j`` runs on devices ``0..kd[j]-1``, so its devices from ``cut[s]`` on (past the last node
    holding source ``s``'s tiles) receive their whole region remotely: their time is the
    suffix maximum ``sfx [Cd, Dd + 1]`` (0 past the end), their owned bytes 0.
    ``nlo / nhi [Cd, nd, Dd]`` the regions' bounds per axis, ``tot [Cd, Dd]`` their bytes,
    ``tot_b [Cd]`` their sum; ``olo / ohi [Cs, nd, N]`` each device's tile of source ``s``,
    ``blo / bhi [Cs, nd, N]`` the bounding box of its node's tiles; ``fin_*``: the bandwidth
    is finite.  Axis by axis over a destination's devices, so the loops vectorise.

    ``afull [nd]``: the axes every destination's regions cover whole (a convolution reads all
    input channels); their factors depend on the source alone, so ``bown / bnode [Cs, N]``
    hold ``item`` times their product over the own tile and the node's box, and the main
    branch starts from those instead of visiting the axes for every pair (exact integers:
    the same products in another order).
    """
    Cs = olo.shape[0]
    Cd = nlo.shape[0]
    nd = nlo.shape[1]
    Dd = nlo.shape[2]
    jb = 32                       # destinations per block: their regions stay in cache
    for j0 in range(jlo, jhi, jb):
        j1 = min(jhi, j0 + jb)
        vm = np.empty(Dd)
        vl = np.empty(Dd)
        tw = np.empty(Dd)
        dv = np.empty(Dd, dtype=np.int64)
        for s in range(Cs):
            for j in range(j0, j1):
                K = kd[j]
                u = K
                if ident[j] and cut[s] < K:
                    u = cut[s]
                main = ident[j] and ks[s] >= 0 and u <= hend[s]
                if main:
                    for m in range(u):
                        vm[m] = bown[s, m]
                        vl[m] = bnode[s, m]
                else:
                    for m in range(u):
                        vm[m] = item
                        vl[m] = item
                if main:
                    # the source runs on devices 0..ks-1 (a device past them owns nothing)
                    # and every device here has a node-mate holding tiles: an axis that
                    # one side covers whole on every device costs the other side's extent
                    um = min(u, ks[s])
                    for m in range(um, u):
                        vm[m] = 0.0
                    for ax in range(nd):
                        if afull[ax]:
                            continue
                        if rfull[j, ax]:
                            for m in range(um):
                                vm[m] *= ohi[s, ax, m] - olo[s, ax, m]
                            for m in range(u):
                                vl[m] *= bhi[s, ax, m] - blo[s, ax, m]
                        elif sfull[s, ax]:
                            for m in range(u):
                                e = max(nhi[j, ax, m] - nlo[j, ax, m], 0)
                                vm[m] *= e
                                vl[m] *= e
                        elif um == u:           # both overlaps in one pass
                            for m in range(u):
                                rl = nlo[j, ax, m]
                                rh = nhi[j, ax, m]
                                e = min(rh, ohi[s, ax, m]) - max(rl, olo[s, ax, m])
                                vm[m] *= max(e, 0)
                                e = min(rh, bhi[s, ax, m]) - max(rl, blo[s, ax, m])
                                vl[m] *= max(e, 0)
                        else:
                            for m in range(um):
                                e = min(nhi[j, ax, m], ohi[s, ax, m]) - max(nlo[j, ax, m],
                                                                          olo[s, ax, m])
                                vm[m] *= max(e, 0)
                            for m in range(u):
                                e = min(nhi[j, ax, m], bhi[s, ax, m]) - max(nlo[j, ax, m],
                                                                          blo[s, ax, m])
                                vl[m] *= max(e, 0)
                elif ident[j]:
                    for ax in range(nd):
                        for m in range(u):
                            rl = nlo[j, ax, m]
                            rh = nhi[j, ax, m]
                            e = min(rh, ohi[s, ax, m]) - max(rl, olo[s, ax, m])
                            vm[m] *= max(e, 0)
                            e = min(rh, bhi[s, ax, m]) - max(rl, blo[s, ax, m])
                            vl[m] *= max(e, 0)
                else:
                    for m in range(u):
                        dv[m] = ddev[j, m]
                    for ax in range(nd):
                        for m in range(u):
                            d = dv[m]
                            rl = nlo[j, ax, m]
                            rh = nhi[j, ax, m]
                            e = min(rh, ohi[s, ax, d]) - max(rl, olo[s, ax, d])
                            vm[m] *= max(e, 0)
                            e = min(rh, bhi[s, ax, d]) - max(rl, blo[s, ax, d])
                            vl[m] *= max(e, 0)
                if fin_in and fin_out and lat_out >= lat_in:
                    # the presets' case in one pass: the same operations as the two below
                    for m in range(u):
                        a = vl[m]
                        b = vm[m]
                        tj = tot[j, m]
                        w = (a - b) / bw_in + (tj - a) / bw_out
                        w += lat_out if tj - a > 0 else (lat_in if a - b > 0 else 0.0)
                        tw[m] = w
                else:
                    if fin_in and fin_out:
                        for m in range(u):
                            tw[m] = (vl[m] - vm[m]) / bw_in + (tot[j, m] - vl[m]) / bw_out
                    elif fin_in:
                        for m in range(u):
                            tw[m] = (vl[m] - vm[m]) / bw_in
                    elif fin_out:
                        for m in range(u):
                            tw[m] = (tot[j, m] - vl[m]) / bw_out
                    else:
                        for m in range(u):
                            tw[m] = 0.0
                    if lat_out >= lat_in:     # max(lat_in [intra], lat_out [inter])
                        for m in range(u):
                            far = tot[j, m] - vl[m] > 0
                            near = vl[m] - vm[m] > 0
                            tw[m] += lat_out if far else (lat_in if near else 0.0)
                    else:
                        for m in range(u):
                            far = tot[j, m] - vl[m] > 0
                            near = vl[m] - vm[m] > 0
                            tw[m] += max(lat_in if near else 0.0, lat_out if far else 0.0)
                best = _amax(tw, u)
                msum = _asum(vm, u)
                if u < K and sfx[j, u] > best:
                    best = sfx[j, u]
                t[s, j] = best
                nbytes[s, j] = tot_b[j] - msum


def coord_dtype(sizes):
    """The integer type the kernel reads a tensor's box bounds in: int16 when every extent
    is below 2**15 (half the memory traffic of int32, twice the lanes: the kernel takes
    about 10 % less CPU at 1,024 devices), else int32.  Bounds lie in ``[0, size]``.

    Examples
    --------
    >>> coord_dtype((128, 2048, 8, 8)).__name__, coord_dtype((4, 50257)).__name__
    ('int16', 'int32')
    """
    return np.int16 if max(sizes, default=0) < 1 << 15 else np.int32


def source_side(own, nbox, node_of, sizes):
    """What the kernel reads of a source layout (the same for every edge leaving it):
    ``(olo, ohi, blo, bhi [Cs, nd, N], ks [Cs], hend [Cs], sfull [Cs, nd])`` (bounds in
    :func:`coord_dtype`) - each device's tile and its node's box per axis, the device count
    when the source runs on devices ``0..k-1`` (else -1), how many leading devices have a
    node holding its tiles, and the axes its tiles cover whole."""
    dt = coord_dtype(sizes)
    olo, ohi = _soa(own, dt)
    # per node, then per device (no [Cs, N, nd, 2] int64 temporary); C order for the kernel
    blo, bhi = (np.ascontiguousarray(a[..., node_of]) for a in _soa(nbox, dt))
    return side_flags(olo, ohi, blo, bhi, sizes)


def side_flags(olo, ohi, blo, bhi, sizes):
    """:func:`source_side` from its per-axis boxes: adds ``ks``, ``hend`` and ``sfull``."""
    nd = olo.shape[1]
    used = (ohi > olo).all(axis=1) if nd else np.zeros(olo.shape[::2], dtype=bool)
    ks = used.sum(axis=1)
    prefix = (used == (np.arange(used.shape[1])[None] < ks[:, None])).all(axis=1)
    ks = np.where(prefix & (ks > 0), ks, -1).astype(np.int64)
    held = (bhi > blo).all(axis=1) if nd else np.zeros_like(used)   # node holds tiles
    hend = np.where(held.all(axis=1), held.shape[1], held.argmin(axis=1)).astype(np.int64)
    size = np.asarray(sizes, dtype=np.int32)[:, None]
    sfull = ((olo == 0) & (ohi == size) | ~used[:, None]).all(axis=2)
    return olo, ohi, blo, bhi, ks, hend, sfull


def _soa(a, dtype=np.int32):
    """``[..., N, nd, 2]`` boxes as ``lo, hi [..., nd, N]`` of ``dtype`` (int32, or
    :func:`coord_dtype`'s): a device's neighbours are contiguous, so the kernel's loops
    vectorise."""
    a = np.moveaxis(a, -3, -1)
    return (np.ascontiguousarray(a[..., 0, :], dtype=dtype),
            np.ascontiguousarray(a[..., 1, :], dtype=dtype))


def soa_volume(lo, hi):
    """``[C, D]`` int64 volumes of boxes given per axis (``lo, hi [C, nd, D]``, as
    :func:`_soa`); the same integers as :func:`.geometry.volume` of the boxes."""
    out = np.ones((lo.shape[0], lo.shape[2]), dtype=np.int64)
    for ax in range(lo.shape[1]):
        out *= np.maximum(hi[:, ax] - lo[:, ax], 0)
    return out


def by_node(src_side, need, ddev, cut, item, nodes, sizes):
    """``(t [Cs, Cd], bytes [Cs, Cd])`` of the by-node kernel over every pair of candidates:
    ``src_side`` from :func:`source_side`, ``need`` the regions each destination device
    needs as ``[Cd, Dd, nd, 2]`` boxes or already per axis (``(lo, hi)`` ``[Cd, nd, Dd]``
    int32, :func:`_soa`), ``ddev [Cd, Dd]`` its devices (-1 unused), ``cut [Cs]`` as in
    the numpy path (the device count when no cut applies).  See :func:`_by_node`."""
    _, bw_in, bw_out, lat_in, lat_out = nodes
    olo, ohi, blo, bhi, ks, hend, sfull = src_side
    nlo, nhi = need if isinstance(need, tuple) else _soa(need, olo.dtype)
    if nlo.dtype != olo.dtype:          # one integer type per call (one compiled version)
        dt = np.promote_types(nlo.dtype, olo.dtype)
        nlo, nhi, olo, ohi, blo, bhi = (a.astype(dt, copy=False)
                                        for a in (nlo, nhi, olo, ohi, blo, bhi))
    Cs, Cd, Dd = olo.shape[0], nlo.shape[0], nlo.shape[2]
    kd = (ddev >= 0).sum(axis=1).astype(np.int64)
    ident = (ddev == np.where(ddev >= 0, np.arange(Dd), -1)).all(axis=1)
    tot = np.where(ddev >= 0, soa_volume(nlo, nhi), 0).astype(np.float64) * item  # [Cd, Dd]
    tot_b = tot.sum(axis=1)
    sfx = np.zeros((Cd, Dd + 1))
    if np.isfinite(bw_out):
        far = tot / bw_out + np.where(tot > 0, lat_out, 0.0)
        sfx[:, :Dd] = np.maximum.accumulate(far[:, ::-1], axis=1)[:, ::-1]
    t = np.zeros((Cs, Cd))
    nbytes = np.zeros((Cs, Cd))
    live = (np.arange(Dd)[None] < kd[:, None])[:, None]
    size = np.asarray(sizes, dtype=np.int32)[:, None]
    rfull = ((nlo == 0) & (nhi == size) | ~live).all(axis=2)    # regions cover the axis
    args = (t, nbytes, np.ascontiguousarray(np.clip(ddev, 0, None), dtype=np.int64), kd,
            ident, np.ascontiguousarray(cut, dtype=np.int64), nlo, nhi, tot, tot_b, sfx,
            olo, ohi, blo, bhi, ks, hend, sfull, rfull, float(item), float(bw_in),
            float(bw_out), float(lat_in), float(lat_out), bool(np.isfinite(bw_in)),
            bool(np.isfinite(bw_out)))
    # axes every destination reads whole: their factors, per source device, computed once
    afull = rfull.all(axis=0)
    bown = np.full(olo.shape[::2], float(item))
    bnode = bown.copy()
    for ax in np.flatnonzero(afull):
        bown *= ohi[:, ax] - olo[:, ax]
        bnode *= bhi[:, ax] - blo[:, ax]
    args += (afull, bown, bnode)
    run = kernel()
    split(lambda lo, hi: run(*args, lo, hi), Cd, weight=kd)
    return t, nbytes


_RANGES = None


def ranges_kernel():
    """The compiled :func:`_stage_ranges` (see :func:`kernel`)."""
    global _RANGES
    with _INIT:
        if _RANGES is None:
            kernel_cache()
            import numba

            _RANGES = numba.njit(cache=True, nogil=True)(_stage_ranges)
    return _RANGES


def _stage_ranges(K, every, nc, seg, L, A, B, Ms, Ma, P, U, SV, SQ, best_v, best_q, base,
                  lcp, hidx, nh):
    """:meth:`.stages.Evaluator._ranges` over padded arrays, the same sums in the same order
    and the same ties (the first minimum).  ``nc[k]`` candidates at cut ``k``; segment ``k``
    (cut ``k`` to ``k + 1``) is reduction ``u = seg[k]``: ``L/A/B/Ms/Ma[u, :nc[k], :nc[k+1]]``
    (identical segments share one); at cut ``k``: parts ``P[k, 4, :nc[k]]`` and unary
    ``U[k, :nc[k]]``; ``SV``/``SQ``: the first stage at cut 1 (the later stages' starts are
    computed here, as :meth:`~.stages.Evaluator._start` does).  Writes ``best_v[i + 1, j]``
    and ``best_q[:, i + 1, j]``.

    Repeated blocks (:func:`shift_agreement`): the stage starting after cut ``r`` meets, over
    its first ``lcp[r]`` segments, the same reductions and cuts as the stage starting after
    cut ``b = base[r]`` (``-1``: none), so there it holds ``b``'s vectors ``r − b`` cuts
    later: they are copied from ``b``'s history (row ``hidx[b]`` of ``nh`` kept), not
    recomputed - the same numbers, the same operations on the same operands - and a chain of
    ``K`` identical blocks costs ``O(K)`` min-plus steps instead of ``O(K²)``."""
    cmax = L.shape[2]
    V = np.empty((K, cmax))
    Q = np.empty((4, K, cmax))
    V2 = np.empty((K, cmax))
    Q2 = np.empty((4, K, cmax))
    HV = np.empty((nh, K + 1, cmax))
    HQ = np.empty((4, nh, K + 1, cmax))
    for c in range(nc[1]):
        V[0, c] = SV[c]
        for m in range(4):
            Q[m, 0, c] = SQ[m, c]
    n = 1
    j = 1
    while True:
        cj = nc[j]
        for r in range(n):
            best = 0
            for c in range(1, cj):
                if V[r, c] < V[r, best]:
                    best = c
            at = 0 if r == 0 else r + 1
            best_v[at, j] = V[r, best]
            for m in range(4):
                best_q[m, at, j] = Q[m, r, best]
        if j == K:
            break
        cb = nc[j + 1]
        u = seg[j]
        for r in range(n):
            b = base[r] if r > 0 else -1
            if b > 0 and j - r < lcp[r]:       # base b's vectors at cut j + 1 - (r - b)
                h = hidx[b]
                c = j + 1 - (r - b)
                for x in range(cb):
                    V2[r, x] = HV[h, c, x]
                    for m in range(4):
                        Q2[m, r, x] = HQ[m, h, c, x]
                continue
            for x in range(cb):
                arg = 0
                low = V[r, 0] + L[u, 0, x]
                for a in range(1, cj):
                    y = V[r, a] + L[u, a, x]
                    if y < low:
                        low, arg = y, a
                V2[r, x] = low + U[j + 1, x]
                Q2[0, r, x] = Q[0, r, arg] + A[u, arg, x] + P[j + 1, 0, x]
                Q2[1, r, x] = Q[1, r, arg] + B[u, arg, x] + P[j + 1, 1, x]
                Q2[2, r, x] = Q[2, r, arg] + Ms[u, arg, x] + P[j + 1, 2, x]
                Q2[3, r, x] = Q[3, r, arg] + Ma[u, arg, x] + P[j + 1, 3, x]
            if r > 0 and hidx[r] >= 0:         # a base: keep its vectors at cut j + 1
                h = hidx[r]
                for x in range(cb):
                    HV[h, j + 1, x] = V2[r, x]
                    for m in range(4):
                        HQ[m, h, j + 1, x] = Q2[m, r, x]
        V, V2 = V2, V
        Q, Q2 = Q2, Q
        if every:                      # a stage starting after cut j, at cut j + 1
            for x in range(cb):
                arg = 0
                for a in range(1, cj):
                    if L[u, a, x] < L[u, arg, x]:
                        arg = a
                V[n, x] = L[u, arg, x] + U[j + 1, x]
                Q[0, n, x] = A[u, arg, x] + P[j + 1, 0, x]
                Q[1, n, x] = B[u, arg, x] + P[j + 1, 1, x]
                Q[2, n, x] = Ms[u, arg, x] + P[j + 1, 2, x]
                Q[3, n, x] = Ma[u, arg, x] + P[j + 1, 3, x]
            if hidx[n] >= 0:
                h = hidx[n]
                for x in range(cb):
                    HV[h, j + 1, x] = V[n, x]
                    for m in range(4):
                        HQ[m, h, j + 1, x] = Q[m, n, x]
            n += 1
        j += 1


#: Shifts (in segments) between stage starts that :func:`shift_agreement` compares: a
#: repeated block is a few segments long (a Transformer block: 2)
MAX_SHIFT = 8


def shift_agreement(seg, U, P, nc):
    """``(base, lcp, hidx, nh)`` for :func:`_stage_ranges`.  Segment ``k``'s token is its
    reduction ``seg[k]`` and the cut after it (candidate count, unary and parts, compared
    by content); the stage starting after cut ``r`` (``r ≥ 1``; ``r = 0`` starts
    differently) meets tokens ``r, r + 1, ...``.  ``base[r]`` is a stage start ``b < r``
    computed in full whose first ``lcp[r]`` tokens are ``r``'s (found through shifts of
    up to :data:`MAX_SHIFT` segments, longest first, chained to the first start of the
    chain), ``-1`` when none; ``hidx[b]`` the history row kept for each base that others
    copy (``-1`` otherwise), ``nh`` their count."""
    K = len(seg)
    cut = {}
    cid = np.array([cut.setdefault((int(nc[k]), U[k, :nc[k]].tobytes(),
                                    P[k, :, :nc[k]].tobytes()), len(cut))
                    for k in range(K + 1)], dtype=np.int64)
    tok = np.asarray(seg, dtype=np.int64) * (len(cut) + 1) + cid[1:]
    # run[p][i]: how many tokens from i on equal those p earlier (tok[i + t] == tok[i - p + t])
    runs = {}
    for p in range(1, min(MAX_SHIFT, K - 1) + 1):
        eq = np.zeros(K + 1, dtype=np.int64)
        eq[p:K] = tok[p:] == tok[:-p]
        run = np.zeros(K + 1, dtype=np.int64)
        for i in range(K - 1, p - 1, -1):
            run[i] = run[i + 1] + 1 if eq[i] else 0
        runs[p] = run
    base = np.full(K + 1, -1, dtype=np.int64)
    lcp = np.zeros(K + 1, dtype=np.int64)
    for r in range(2, K):
        best_p, best_l = 0, 0
        for p, run in runs.items():
            if r - p >= 1 and run[r] > best_l:
                best_p, best_l = p, int(run[r])
        if best_l == 0:
            continue
        src = r - best_p
        if base[src] >= 0:                 # src copies its own base: chain to it
            base[r], lcp[r] = base[src], min(best_l, int(lcp[src]))
        else:
            base[r], lcp[r] = src, best_l
    hidx = np.full(K + 1, -1, dtype=np.int64)
    nh = 0
    for b in np.unique(base[base >= 0]):
        hidx[b] = nh
        nh += 1
    return base, lcp, hidx, nh


def preload(ranges: bool = False) -> bool:
    """Import numba and load the by-node, min-plus and pruning kernels (with ``ranges``, the
    stage-range kernel too) from its cache now, with the argument types a search passes
    (tiny inputs), so that a search about to need them (many devices) does not wait for them
    - ``explorer search`` does it while the model is traced in a child process, the pipeline
    search before it forks (so that its second process does not load them again);
    ``False`` without numba."""
    import importlib.util
    if importlib.util.find_spec("numba") is None:
        return False
    _tiny_by_node(np.int16)
    _small_kernels()
    if ranges:
        _tiny_ranges()
        _tiny_split()
    return True


def _tiny_by_node(dtype) -> None:
    """Call the by-node kernel once on a tiny edge with ``dtype`` bounds (compiled or
    loaded)."""
    lo, hi = np.zeros((1, 1, 2), dtype), np.ones((1, 1, 2), dtype)
    side = side_flags(lo, hi, lo.copy(), hi.copy(), (2,))
    by_node(side, (lo.copy(), hi.copy()), np.array([[0, 1]]), np.array([2]), 4.0,
            (np.array([0, 0]), 1e9, 1e8, 1e-5, 1e-4), (2,))


def _small_kernels() -> None:
    """Call the min-plus and pruning kernels once on tiny inputs (compiled or loaded)."""
    a = np.zeros((2, 2))
    min_plus_kernel()(a, a.copy(), np.array([0, 2, 4]), np.array([0, 1, 0, 1]),
                      np.zeros((2, 2), dtype=np.int64), np.zeros((2, 2)), 0, 2)
    useful_kernel()(a, a.copy(), np.array([0]), 0.0, np.ones((2, 2), dtype=bool), 0, 2)


def min_plus_loaded() -> bool:
    """Whether this process has loaded the min-plus and pruning kernels (:func:`preload`, or
    an earlier large product): smaller products then run compiled too."""
    return "_min_plus_rows" in _NOGIL and "_useful_rows" in _NOGIL


def ranges_loaded() -> bool:
    """Whether this process has loaded the stage-range kernel (a search then runs every
    chain compiled: loading it is what small chains avoid)."""
    return _RANGES is not None


def warm() -> bool:
    """Compile the min-plus rows and the stage ranges into numba's cache now (through
    :func:`.costmodel.warm`, which compiles the by-node kernel by a small search; see
    scripts/setup.sh), so that a user's first search of a large model or at many devices
    does not pay for it; ``False`` without numba."""
    import importlib.util
    if importlib.util.find_spec("numba") is None:
        return False
    _small_kernels()
    for dt in (np.int16, np.int32):     # both bound types (:func:`coord_dtype`)
        _tiny_by_node(dt)
    _tiny_ranges()
    _tiny_split()
    return True


def _tiny_split() -> None:
    """Call the split kernel once on two segments (compiled or loaded)."""
    F = np.array([0.0, np.inf, np.inf])
    split_dp_kernel()(np.ones((2, 1)), np.ones((2, 1)), np.zeros(2, dtype=np.int64), F,
                      np.zeros(3))


def _split_dp(sv, sm, kix, F, used):
    """:func:`.pipeline.dual_bound`'s split of ``K`` segments into ``len(kix)`` stages in
    order, in place: ``F[j]`` the least summed cost of the stages so far over segments
    ``0 .. j−1`` (``F[0] = 0`` on entry, the rest ``inf``), ``used[j]`` the memory of the
    minimising split; stage ``s`` costs ``sv[:, kix[s]]`` and holds ``sm[:, kix[s]]`` per
    segment.  The same additions, minima and ties (the last start attaining a prefix
    minimum) as the numpy lines it replaces."""
    K = sv.shape[0]
    P = np.empty(K + 1)
    Q = np.empty(K + 1)
    nF = np.empty(K + 1)
    nU = np.empty(K + 1)
    for s in range(kix.shape[0]):
        c = kix[s]
        P[0] = 0.0
        Q[0] = 0.0
        for j in range(K):
            P[j + 1] = P[j] + sv[j, c]
            Q[j + 1] = Q[j] + sm[j, c]
        nF[0] = np.inf
        nU[0] = 0.0
        best = np.inf
        bi = 0
        for j in range(1, K + 1):
            g = F[j - 1] - P[j - 1]
            if g <= best:                     # the prefix minimum over starts i < j
                best = g
                bi = j - 1
            v = P[j] + best
            nF[j] = v
            nU[j] = used[bi] + Q[j] - Q[bi] if np.isfinite(v) else 0.0
        for j in range(K + 1):
            F[j] = nF[j]
            used[j] = nU[j]


def split_dp_kernel():
    """The compiled :func:`_split_dp`."""
    return _compiled(_split_dp)


def split_dp_loaded() -> bool:
    """Whether this process has loaded :func:`split_dp_kernel` (:func:`preload`)."""
    return "_split_dp" in _NOGIL


def _tiny_ranges() -> None:
    """Call the stage-range kernel once on a two-segment chain (compiled or loaded)."""
    i64 = np.int64
    K, c = 2, 1
    nc = np.ones(K + 1, dtype=i64)
    seg = np.zeros(K, dtype=i64)
    L = np.zeros((1, c, c))
    ranges_kernel()(K, True, nc, seg, L, L.copy(), L.copy(), L.copy(), L.copy(),
                    np.zeros((K + 1, 4, c)), np.zeros((K + 1, c)), np.zeros(c),
                    np.zeros((4, c)), np.full((K + 1, K + 1), np.nan),
                    np.full((4, K + 1, K + 1), np.nan), np.full(K + 1, -1, dtype=i64),
                    np.zeros(K + 1, dtype=i64), np.full(K + 1, -1, dtype=i64), 0)

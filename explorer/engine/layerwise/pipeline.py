"""Pipeline stages over the layer-wise search, and the practitioners' baselines (issue 28).

* ``pipeline`` — the two-level search (Alpa's outer DP over contiguous stage splits with the
  elimination search inside each stage; the formulas are in :mod:`.stages`): for each stage
  count ``S`` (powers of two dividing the devices) and micro-batch count ``M``, one stage's
  device group ``G = N / S`` is costed at the micro-batch's size (the captured graph
  rebatched, :mod:`.rebatch`), the stage split and every
  layer's configuration, recomputation and ZeRO stage are chosen under the memory limit, and
  the fastest fitting ``(S, M)`` wins; configurations are tried in order of a lower bound
  from the layers' own costs (:func:`step_bound`) and skipped when it cannot beat the plan
  found, or when their least memory (:func:`memory_bound`) is over the limit and a plan
  fits.  Stages get equal device groups (Alpa also searches unequal submeshes).
* ``megatron-3d`` — Megatron-LM's ``tp × pp × dp`` (Narayanan et al. 2021): inside each of
  ``pp`` stages the Megatron tensor × data layout of :func:`.classic.megatron` on
  ``tp · dp`` devices, 1F1B over ``M`` micro-batches, full recomputation when asked, no ZeRO;
  the stage split is the outer DP's (balanced stage times, as Megatron's even split of
  identical blocks).
* ``fsdp`` — ZeRO-3 data parallelism (PyTorch FSDP): every layer split on the sample over all
  devices, optimizer state, gradients and parameters sharded over them.
"""

from __future__ import annotations

import time

import numpy as np

from explorer.errors import InfeasiblePlan
from explorer.engine.layerwise import stages as ST
from explorer.engine.layerwise import xkernel
from explorer.engine.layerwise.costmodel import CostModel, graph_memo
from explorer.engine.layerwise.memory import MemorySettings
from explorer.engine.layerwise.result import memory_result
from explorer.engine.search.options import FSDPOptions, Megatron3DOptions, PipelineOptions
from explorer.engine.search.result import Result


def _cap(devices, limit_gib) -> float:
    cap = min(d.memory for d in devices.devices)
    return cap if limit_gib is None else min(cap, float(limit_gib) * 2 ** 30)


def _degrees(spec: str, G: int) -> str:
    """The request's degrees for a stage's group of ``G`` devices (an explicit list keeps
    the degrees that divide ``G``)."""
    if spec in ("auto", "pow2", "divisors"):
        return spec
    keep = [d for d in (int(x) for x in str(spec).split(",")) if G % d == 0]
    return ",".join(map(str, sorted(set(keep) | {1})))


def _stage_setup(problem, S: int, M: int, how: dict | None = None):
    """``(cost model, tables, boundary bw, latency)`` of one stage's group at the
    micro-batch's size (:func:`_stage_model`), with every candidate's tables."""
    cm, bw, lat = _stage_model(problem, S, M, how)
    return cm, cm.tables(), bw, lat


def _stage_model(problem, S: int, M: int, how: dict | None = None):
    """``(cost model, boundary bw, latency)`` of one stage's group at the micro-batch's size
    (the graph rebatched from the capture, :mod:`.rebatch`, once per size: ``how`` maps each
    size to its graph and whether it was rebatched or captured)."""
    from explorer.engine.layerwise.rebatch import graph_at
    N = problem.devices.n
    G = N // S
    b = problem.layer_graph().batch // M
    if how is not None and b in how:
        graph, way = how[b]
    else:
        graph, way = graph_at(problem, b)
        if how is not None:
            how[b] = (graph, way)
    devs = problem.devices.subset(G) if G < N else problem.devices
    if G == N and M == 1:
        cm = problem.cost_model()
    elif how is not None and ("cost model", G, b) in how:
        cm = how[("cost model", G, b)]
    else:
        cm = CostModel(graph, devs, compute=problem.cost, sync=problem.sync,
                       degrees=_degrees(problem.degrees, G), dtype=problem.dtype)
    bw, lat = None, 0.0
    if S > 1:
        bw = float(problem.devices.bw[0, G])
        lat = float(problem.devices.latency[0, G])
    return cm, bw, lat


def step_bound(problem, S: int, M: int, settings, how: dict) -> float:
    """A lower bound of the step time of any plan with ``S`` stages and ``M`` micro-batches,
    from the layers' own costs alone (no transfer tables, no memory limit):

        T = Σ_s t_s + (M − 1)·max_s t_s + max_s u_s
          ≥ (1/S) · Σ_layers min_(candidate, option) [(M + S − 1)·t_mb + t_once]

    (each stage's ``t_s`` is at least its layers' per-micro-batch times, a maximum at least
    the mean, transfers and boundaries cost ≥ 0).  The pipeline search tries
    configurations in order of this bound and skips those whose bound is no better than
    the fastest fitting plan found, so the skipped ones cannot hold a faster plan."""
    N = problem.devices.n
    G = N // S
    b = problem.layer_graph().batch // M
    if b in how:
        graph, _ = how[b]
    else:
        from explorer.engine.layerwise.rebatch import graph_at
        graph, way = how[b] = graph_at(problem, b)
    devs = problem.devices.subset(G) if G < N else problem.devices
    if G == N and M == 1:
        cm = problem.cost_model()
    elif ("cost model", G, b) in how:
        cm = how[("cost model", G, b)]
    else:
        cm = how[("cost model", G, b)] = CostModel(
            graph, devs, compute=problem.cost, sync=problem.sync,
            degrees=_degrees(problem.degrees, G), dtype=problem.dtype)
    names, rep_of, opts = _layer_options(problem, graph, cm, G, b, settings, how)
    W = float(M + S - 1)
    total, seen = 0.0, {}
    for n in names:
        lo = opts[rep_of[n]]
        v = seen.get(id(lo))
        if v is None:
            v = seen[id(lo)] = float(np.min(W * lo.t_mb + lo.t_once))
        total += v
    return max(total / S, _partition_bound(graph, rep_of, opts, S, M))


def _partition_bound(graph, rep_of, opts, S: int, M: int) -> float:
    """The step bound of stages made of whole segments (the outer DP cuts only at
    single-tensor cuts): with ``a_k``, ``u_k`` the least per-micro-batch and once-per-step
    times of segment ``k``'s layers (the first stage also holds cut 0),

        T ≥ Σ_k a_k + (M − 1) · min_(splits into S) max_s Σ_(k ∈ s) a_k
              + max(Σ_k u_k / S, max_k u_k)

    - the slowest stage is at least the best balanced split's, which the segments' sizes
    can keep well above the mean (64 stages over 67 segments)."""
    chain = ST.Chain.of(graph)
    K = len(chain.segments)
    if S > K or S < 2:
        return 0.0
    least: dict = {}

    def lows(n):
        lo = opts[rep_of[n]]
        hit = least.get(id(lo))
        if hit is None:
            ok = np.isfinite(lo.t_mb) & np.isfinite(lo.t_once)
            hit = least[id(lo)] = (float(lo.t_mb[ok].min()), float(lo.t_once[ok].min())) \
                if ok.any() else (np.inf, np.inf)
        return hit
    a, u = np.zeros(K), np.zeros(K)
    for k, seg in enumerate(chain.segments):
        for n in seg.interior + [seg.b] + ([seg.a] if k == 0 else []):
            x, y = lows(n)
            a[k] += x
            u[k] += y
    if not np.isfinite(a).all():
        return np.inf
    P = np.concatenate([[0.0], np.cumsum(a)])
    cost = P[None, :] - P[:, None]                    # [i, j]: segments i .. j-1
    cost[np.tril_indices(K + 1)] = np.inf             # a stage holds at least one segment
    f = cost[0].copy()                                # one stage over segments 0 .. j-1
    for _ in range(2, S + 1):
        f = np.minimum.reduce(np.maximum(f[:, None], cost), axis=0)
    return float(P[-1] + (M - 1) * f[K] + max(u.sum() / S, u.max()))


def dual_inputs(problem, S: int, M: int, settings, how: dict):
    """What :func:`dual_bound` reads of ``S, M``'s layer options, kept in ``how`` (a few MB:
    the two processes of a search swap them with the bounds, so that either can bound a
    count whose layer options the other computed): ``(cnt [K, reps], t_mb, t_once / S,
    static, act [reps, N])`` - each representative layer's finite (candidate, option) terms
    padded to one length (padding: infinite time, no memory, so no minimum picks it) and
    the count of its layers in each segment; ``0.0`` when there are more stages than
    segments, ``inf`` when a layer has no finite option."""
    key = ("dual inputs", S, M)
    if key in how:
        return how[key]
    graph, (names, rep_of, opts) = _read_options(problem, S, M, settings, how)
    chain = ST.Chain.of(graph)
    K = len(chain.segments)
    if S > K:
        how[key] = 0.0
        return 0.0
    reps = list(dict.fromkeys(rep_of[n] for n in names))
    rpos = {r: i for i, r in enumerate(reps)}
    cnt = np.zeros((K, len(reps)))                          # layers of each rep per segment
    for k, seg in enumerate(chain.segments):
        for n in seg.interior + [seg.b] + ([seg.a] if k == 0 else []):
            cnt[k, rpos[rep_of[n]]] += 1
    N = max(opts[r].t_mb.size for r in reps)
    TM, TO = np.full((len(reps), N), np.inf), np.zeros((len(reps), N))
    ST_, AC = np.zeros((len(reps), N)), np.zeros((len(reps), N))
    for i, r in enumerate(reps):
        lo = opts[r]
        tm, to = lo.t_mb.ravel(), (lo.t_once / S).ravel()
        st, ac = lo.static.ravel(), lo.act.ravel()
        ok = np.isfinite(tm) & np.isfinite(to) & np.isfinite(st) & np.isfinite(ac)
        if not ok.any():
            how[key] = np.inf
            return np.inf
        n_ = int(ok.sum())
        TM[i, :n_], TO[i, :n_], ST_[i, :n_], AC[i, :n_] = tm[ok], to[ok], st[ok], ac[ok]
    out = how[key] = (cnt, TM, TO, ST_, AC)
    return out


def dual_bound(problem, S: int, M: int, settings, how: dict, schedule: str,
               cap: float, target: float = np.inf, weights=None) -> float:
    """A lower bound of the step time of any plan with ``S`` stages and ``M`` micro-batches
    whose every stage fits ``cap`` (after :func:`step_bound` of the same ``S, M``, whose
    layer options it reads): :func:`step_bound`'s mean relaxation with the stages' memory
    kept.  Stage ``s`` holds ``Σ_(l ∈ s) (static + k_s · act) ≤ cap`` with ``k_s`` its
    micro-batches in flight (``min(S − s, M)`` under 1F1B, ``M`` under GPipe), and
    ``T ≥ Σ_s (W·t_s + u_s) / S`` with ``W = M + S − 1``; for any price ``μ ≥ 0`` per byte
    (weak duality: every stage's ``μ·(memory − cap)`` is at most 0 in a fitting plan)

        T ≥ min_(splits into S stages of whole segments)
              Σ_s Σ_(l ∈ s) min_(candidate, option) [(W·t_mb + t_once) / S
                                                     + μ·(static + k_s · act)]  −  μ·S·cap

    - the split by a dynamic program over the segments (a prefix minimum per stage), the
    layers' minima per distinct ``k_s``.  Maximised over ``μ`` by bisection on the sign of
    the split's memory over ``S · cap`` (the function is concave); stops early once it
    reaches ``target`` (the plan found: the configuration is skipped either way).  Where
    memory does not bind this is the mean bound (``μ = 0``); where it does, it prices the
    recomputation and sharding that fitting costs, stage by stage - which the search would
    pay too - so a configuration whose fitting plans must all be slower than one found is
    skipped without building its tables.  ``inf``: no split fits at any price.

    ``weights`` ``[S]`` (non-negative, summing to 1; default uniform) weigh the stages in
    place of the slowest one: ``max_s t_s ≥ Σ_s w_s · t_s``, so stage ``s``'s layers count
    ``(1 + (M − 1)·w_s)·t_mb + t_once / S`` - every such weighting is a bound, and weights
    on the stages that hold few micro-batches (which memory makes the longest) are tighter
    where memory binds."""
    inputs = dual_inputs(problem, S, M, settings, how)
    if not isinstance(inputs, tuple):
        return inputs                       # 0.0: more stages than segments; inf: no option
    cnt, TM, TO, ST_, AC = inputs
    K = cnt.shape[0]
    ks = np.array([float(M if schedule == "gpipe" else min(S - s, M)) for s in range(S)])
    w = np.full(S, 1.0 / S) if weights is None else np.asarray(weights, dtype=float)
    coef = 1.0 + (M - 1) * w                                # t_mb's weight per stage
    # stages differ by (in-flight count, t_mb weight): the layers' minima once per pair
    kv, kix = np.unique(np.stack([ks, coef], axis=1), axis=0, return_inverse=True)
    kix = kix.reshape(-1)
    budget = S * float(cap)
    # per (in-flight, weight) pair: [pairs, reps, N]
    Mem = ST_[None] + kv[:, 0, None, None] * AC[None]
    Cost = kv[:, 1, None, None] * TM[None] + TO[None]
    Cost = np.where(np.isfinite(Cost), Cost, np.inf)

    # the split in the compiled loop once this process has loaded it (a large search loads
    # the kernels before it forks); small ones keep numpy rather than load numba for it
    compiled = xkernel.split_dp_loaded()
    kix_c = np.ascontiguousarray(kix, dtype=np.int64)

    def at(mu: float):
        """``(L(μ), memory of the minimising split)``."""
        tot = Cost + mu * Mem
        j = np.argmin(tot, axis=2)[..., None]                      # [pairs, reps, 1]
        val = np.take_along_axis(tot, j, axis=2)[..., 0].T          # [reps, pairs]
        mem = np.take_along_axis(Mem, j, axis=2)[..., 0].T
        sv, sm = cnt @ val, cnt @ mem                              # [K, k]
        F = np.full(K + 1, np.inf)
        F[0] = 0.0
        used = np.zeros(K + 1)
        if compiled:                             # the same loop compiled (xkernel)
            xkernel.split_dp_kernel()(np.ascontiguousarray(sv), np.ascontiguousarray(sm),
                                      kix_c, F, used)
            return float(F[K]) - mu * budget, float(used[K])
        for s in range(S):                       # stage s covers segments i .. j-1, i < j
            P = np.concatenate([[0.0], np.cumsum(sv[:, kix[s]])])
            Q = np.concatenate([[0.0], np.cumsum(sm[:, kix[s]])])
            g = F - P
            acc = np.minimum.accumulate(g)           # prefix minimum over i < j
            at_min = np.maximum.accumulate(np.where(g == acc, np.arange(K + 1), 0))
            newF = np.full(K + 1, np.inf)
            newF[1:] = P[1:] + acc[:-1]
            arg = np.concatenate([[0], at_min[:-1]])
            newU = np.where(np.isfinite(newF), used[arg] + Q - Q[arg], 0.0)
            F, used = newF, newU
        return float(F[K]) - mu * budget, float(used[K])

    best, used = at(0.0)
    if used <= budget or best >= target:
        return best
    lo_mu, hi_mu = 0.0, 1e-12
    while True:
        v, u = at(hi_mu)
        best = max(best, v)
        if u <= budget or best >= target:
            break
        lo_mu, hi_mu = hi_mu, hi_mu * 4.0
        if hi_mu > 1e6:                      # nothing fits even at any price: no plan
            return np.inf
    for _ in range(40):
        # (any μ gives a bound: a bracket of 0.1 % leaves the best of them within a hair
        # of the maximum)
        if best >= target or hi_mu - lo_mu <= 1e-3 * hi_mu:
            break
        mid = 0.5 * (lo_mu + hi_mu)
        v, u = at(mid)
        best = max(best, v)
        if u > budget:
            lo_mu = mid
        else:
            hi_mu = mid
    return best


def _weighted_bound(problem, S, M, settings, how, schedule, cap, target) -> float:
    """The best of :func:`dual_bound` under weights on the stages holding the fewest
    micro-batches (``w_s ∝ k_s^(−p)``, and the last stage alone), stopping at ``target``."""
    ks = np.array([float(M if schedule == "gpipe" else min(S - s, M)) for s in range(S)])
    out = 0.0
    for p in (1.0, 2.0, 4.0, None):
        w = np.zeros(S) if p is None else ks ** -p
        if p is None:
            w[-1] = 1.0
        out = max(out, dual_bound(problem, S, M, settings, how, schedule, cap, target,
                                  w / w.sum()))
        if out >= target:
            break
    return out


def memory_bound(problem, S: int, M: int, settings, how: dict, schedule: str) -> float:
    """A lower bound of the peak bytes of any plan with ``S`` stages and ``M`` micro-batches
    (after :func:`step_bound` of the same ``S, M``, whose layer options it reads): a stage
    holds ``Σ_layers (static + inflight · act)`` of its layers (:mod:`.stages`), every stage
    holds at least ``inflight(S − 1)`` micro-batches (all ``M`` under GPipe, one under 1F1B),
    and the fullest stage holds at least the mean and at least any one layer:

        peak ≥ max( (1/S) · Σ_l m_l, max_l m_l ),  m_l = min_(candidate, option)
                                                     [static + inflight(S − 1) · act]

    A configuration whose bound exceeds the cap cannot hold a fitting plan, so the search
    costs it only when nothing else fits."""
    _, (names, rep_of, opts) = _read_options(problem, S, M, settings, how)
    k = float(M if schedule == "gpipe" else min(1, M))
    total, most, seen = 0.0, 0.0, {}
    for n in names:
        lo = opts[rep_of[n]]
        v = seen.get(id(lo))
        if v is None:
            v = seen[id(lo)] = float(np.min(lo.static + k * lo.act))
        total += v
        most = max(most, v)
    return max(total / S, most)


def _read_options(problem, S: int, M: int, settings, how: dict):
    """``(graph, (names, representative of each, options))`` of ``S, M`` that
    :func:`step_bound` already computed (its graph and cost model are in ``how``)."""
    G = problem.devices.n // S
    b = problem.layer_graph().batch // M
    if ("layer options", G, b) not in how:          # computed by the other process
        step_bound(problem, S, M, settings, how)
    graph = how[b][0]
    cm = problem.cost_model() if G == problem.devices.n and M == 1 else \
        how[("cost model", G, b)]
    return graph, _layer_options(problem, graph, cm, G, b, settings, how)


def _layer_options(problem, graph, cm, G: int, b: int, settings, how: dict):
    """``(names, representative of each, options of each representative)`` of the graph at
    micro-batch size ``b`` on ``G`` devices (cached in ``how``)."""
    from explorer.engine.layerwise.costmodel import CostTables
    from explorer.engine.layerwise.memory import options_of
    from explorer.engine.layerwise.plan import layer_content_key
    hit = how.get(("layer options", G, b))
    if hit is not None:
        return hit
    names = graph.names()
    # a layer's term depends on its content and gradient flags only: the layers of repeated
    # blocks are costed once (one representative each), then summed in the layers' order;
    # which layer represents which depends on the graph alone (kept with it)
    memo = graph_memo(graph)
    rep_of = memo.get("representatives")
    if rep_of is None:
        rep_of, reps = {}, {}
        for n in names:
            layer = graph.layer(n)
            key = (layer_content_key(layer), layer.flops, cm.needs_grad(n), cm.input_grads(n))
            rep_of[n] = reps.setdefault(key, n)
        memo["representatives"] = rep_of
    reps = {n: n for n in rep_of.values()}
    cands, tc, ts, mem, tr = {}, {}, {}, {}, {}
    for n in dict.fromkeys(reps.values()):
        cands[n] = cm.candidates(n, None)
        tc[n], ts[n], mem[n] = cm.layer_costs(n, cands[n])
        red = cm.reduce_costs(n, cands[n])
        if red is not None:
            tr[n] = red[0]
    part = CostTables(list(cands), cands, tc, ts, mem, [], t_reduce=tr)
    opts = options_of(cm, part, settings, how.setdefault(("options", G, b), {}))
    how[("layer options", G, b)] = names, rep_of, opts
    return names, rep_of, opts


def search(problem, pins=None, options: PipelineOptions | None = None) -> Result:
    """The fastest fitting pipelined plan (module docstring).  Large searches run on two
    processes (:func:`_team`): the same plan, in about half the time on two cores."""
    options = options or PipelineOptions()
    if pins:
        raise InfeasiblePlan("the pipeline search takes no pins yet: use --algo optcnn to pin "
                             "layers")
    t0 = time.perf_counter()
    graph = problem.layer_graph()
    N, B = problem.devices.n, graph.batch
    settings = options.settings()
    cap = _cap(problem.devices, options.memory_limit_gib)
    K = len(ST.Chain.of(graph).segments)
    counts = [options.stages] if options.stages else ST.stage_counts(N, K, B)
    configs = []
    for S in counts:
        if N % S:
            raise InfeasiblePlan(f"{S} stages do not divide the {N} devices")
        if options.micro_batches:
            Ms = [options.micro_batches]
        else:
            Ms = [1] if S == 1 else [m for m in (2 * S, 4 * S, 8 * S) if B % m == 0] or \
                [m for m in range(min(B, 8 * S), 0, -1) if B % m == 0][:1]
        for M in Ms:
            if B % M:
                raise InfeasiblePlan(f"{M} micro-batches do not divide the batch {B}")
            configs.append((S, M))
    team = _team(problem, configs, options)
    try:
        with xkernel.threads(1 if team.processes > 1 else xkernel.THREADS):
            out = _search(problem, options, settings, cap, configs, team, t0)
    except BaseException as exc:
        team.close(exc)                     # the child leaves here, the parent reaps it
        raise
    team.close()                            # the child leaves here
    return out


#: the least devices for which the pipeline search forks a second process (the tables of a
#: few hundred devices' candidates cost seconds; small searches finish before a fork pays)
FORK_DEVICES = 64


def _team(problem, configs, options):
    """Two processes for a search of several configurations on at least
    :data:`FORK_DEVICES` devices (``options.processes`` and the environment permitting,
    :func:`~explorer.engine.core.forked.team`), else one."""
    from explorer.engine.core import forked
    want = options.processes
    if want is None and (len(configs) < 2 or problem.devices.n < FORK_DEVICES):
        want = 1
    # the kernels both processes use, loaded once before the fork, not once in each
    return forked.team(want, prepare=lambda: xkernel.preload(ranges=True))


def _search(problem, options, settings, cap, configs, team, t0) -> Result:
    """:func:`search`'s configurations on ``team``: bounds of every configuration, then the
    configurations in order of their bounds, each skipped when its bound cannot beat the
    plan either process found."""
    how: dict = {}
    mine = {}
    for i in team.claims(len(configs)):
        S, M = configs[i]
        try:
            mine[i] = (float(max(step_bound(problem, S, M, settings, how),
                                 dual_bound(problem, S, M, settings, how, options.schedule,
                                            cap))),
                       memory_bound(problem, S, M, settings, how, options.schedule),
                       # what the weighted bounds read, for the other process
                       dual_inputs(problem, S, M, settings, how) if team.processes > 1
                       else None)
        except InfeasiblePlan as exc:
            mine[i] = str(exc)
    every = {}
    for part in team.exchange(mine):
        every.update(part)
    bounds, least, errors = {}, {}, {}
    for i, (S, M) in enumerate(configs):
        if isinstance(every[i], str):
            errors[(S, M)] = every[i]
        else:
            bounds[(S, M)], least[(S, M)], inputs = every[i]
            if inputs is not None:
                how.setdefault(("dual inputs", S, M), inputs)
    # one stage last: its group is all the devices (the largest tables), and by then the plan
    # found lets its unconstrained optimum, a bound too, stand in for its whole search;
    # configurations that cannot fit (memory bound over the cap) only when nothing else does
    order = sorted(bounds, key=lambda c: (c[0] == 1, bounds[c], c))
    order = [c for c in order if least[c] <= cap] + [c for c in order if least[c] > cap]
    tried = {}                                 # position in the order -> what happened
    best = smallest = None                     # (Evaluation, cm, tables, ev, position)
    held = [k for k, c in enumerate(order) if configs.index(c) in mine]
    for k in team.claims(len(order), prefer=held):
        S, M = order[k]
        entry, found, small, kept = _cost(problem, S, M, options, settings, cap, how,
                                          bounds[(S, M)], least[(S, M)], team.best())
        tried[k] = entry
        if found is not None:
            team.offer(found.time_s)
            if best is None or found.time_s < best[0].time_s:
                best = (found, *kept, k)
        if small is not None and (smallest is None or small.peak < smallest[0].peak):
            smallest = (small, *kept, k)
    # what each process found: the parent picks (the fastest, then the first in the order;
    # else the smallest footprint) and the process holding it builds the result
    summary = (tried, None if best is None else (best[0].time_s, best[4]),
               None if smallest is None else (smallest[0].peak, smallest[4]),
               {b: v[1] for b, v in how.items() if isinstance(b, int)})
    parts = team.exchange(summary)
    runs, fast, small_, ways = {}, [], [], {}
    for p, (t, b, s, w) in enumerate(parts):
        runs.update(t)
        ways.update(w)
        if b is not None:
            fast.append((b[0], b[1], p))
        if s is not None:
            small_.append((s[0], s[1], p))
    entries = [{"stages": S, "micro_batches": M, "error": errors[(S, M)]}
               for S, M in configs if (S, M) in errors]
    entries += [runs[k] for k in sorted(runs)]
    if not fast and not small_:
        raise InfeasiblePlan("no pipeline configuration could be costed: "
                             + "; ".join(t.get("error", "") for t in entries[:3]))
    info = {"strategy": "pipeline", "tried": entries, "processes": team.processes,
            "memory": {"limit_bytes": cap, "constrained": True,
                       "optimizer": settings.optimizer},
            "micro_batch_graphs": {str(b): ways[b] for b in sorted(ways)}}
    pick = min(fast) if fast else min(small_)
    holder = pick[2]
    mine_ = best if fast else smallest
    if not fast:
        info["memory"]["why"] = (
            f"no pipelined plan fits {cap / 2**30:.3g} GiB per device: the smallest footprint "
            f"found needs {pick[0] / 2**30:.3g} GiB on a device ({len(entries)} "
            f"stage/micro-batch counts tried, optimizer {settings.optimizer}); use more "
            f"devices or a smaller --batch")
    if team.processes == 1:
        return memory_result("pipeline", problem, mine_[1], mine_[2], mine_[0], settings,
                             mine_[3], info, time.perf_counter() - t0)
    # the parent tells the child whether to build (with the whole search's info) and takes
    # its result; a child that holds nothing to build just leaves
    if team.child:
        if holder == 1:
            elapsed = team.recv()
            team.send(memory_result("pipeline", problem, mine_[1], mine_[2], mine_[0],
                                    settings, mine_[3], info, elapsed))
        return None
    if holder == 1:
        team.send(time.perf_counter() - t0)
        return team.recv()
    return memory_result("pipeline", problem, mine_[1], mine_[2], mine_[0], settings,
                         mine_[3], info, time.perf_counter() - t0)


def _cost(problem, S, M, options, settings, cap, how, bound, least, best_s):
    """One configuration: ``(tried entry, fastest fitting Evaluation or None, smallest
    Evaluation or None, (cost model, tables, evaluator))``, skipped (no evaluations) when
    its bounds say it cannot beat ``best_s``, the plan found so far."""
    head = {"stages": S, "micro_batches": M}
    none = (None, None, None)
    if least > cap and np.isfinite(best_s):
        return ({**head, "bound_s": bound, "memory_bound_bytes": least,
                 "skipped": f"its plans need at least {least / 2**30:.3g} GiB on a device, "
                            f"over the {cap / 2**30:.3g} GiB limit"}, None, None, none)
    found_one = bool(np.isfinite(best_s))
    if found_one and bound < best_s and S > 1:
        # before building its tables: the stage-weighted bounds, up to the plan found
        bound = max(bound, _weighted_bound(problem, S, M, settings, how, options.schedule,
                                           cap, best_s))
    if found_one and bound >= best_s:
        return ({**head, "bound_s": bound,
                 "skipped": "its lower bound is no faster than the plan found"},
                None, None, none)
    try:
        cm, tables, bw, lat = _stage_setup(problem, S, M, how)
        ev = ST.Evaluator(cm, tables, settings, cap, S, M, options.schedule, bw, lat,
                          opts_cache=how.get(("options", cm.devices.n, cm.graph.batch)))
        plain = ev.evaluate(0.0)
        if plain.floor_s is not None:
            bound = max(bound, plain.floor_s)
        if found_one and bound >= best_s and not plain.fits:
            # λ = 0 bounds every plan of these counts with its transfers counted
            # (Evaluator.floor; one stage: its optimum without a memory limit): the search
            # over λ could not find a faster one
            return ({**head, "bound_s": bound,
                     "skipped": "its least step time without a memory limit is no faster "
                                "than the plan found"}, None, None, none)
        if plain.fits and options.saving == "when-needed":
            found, small = plain, plain
        else:
            found, small, _ = ST.lagrangian(ev, plain)
    except InfeasiblePlan as exc:
        return {**head, "error": str(exc)}, None, None, none
    return ({**head, "bound_s": bound, "time_s": None if found is None else found.time_s,
             "peak_bytes": small.peak}, found, small, (cm, tables, ev))


# --------------------------------------------------------------------------------------------
# baselines
# --------------------------------------------------------------------------------------------

def _option_masks(ev_opts, choice_masks, settings, want, recompute: bool) -> dict:
    """Per layer, the options ``want(rc, z)`` allows, falling back to ``(rc, 0)`` where that
    option does not exist for the layer's allowed candidate (no replicas to shard)."""
    out = {}
    for n, lo in ev_opts.items():
        ok = np.array([want(rc, z) for rc, z in lo.options])
        idx = choice_masks.get(n, slice(None))
        if not np.isfinite(lo.t_mb[idx][:, ok]).any():
            ok = np.array([rc == recompute and z == 0 for rc, z in lo.options])
            if not np.isfinite(lo.t_mb[idx][:, ok]).any():
                ok = np.array([z == 0 and not rc for rc, z in lo.options])
        out[n] = ok
    return out


def fsdp(problem, pins=None, options: FSDPOptions | None = None) -> Result:
    """ZeRO-3 data parallelism (module docstring)."""
    options = options or FSDPOptions()
    t0 = time.perf_counter()
    graph, cm = problem.layer_graph(), problem.cost_model()
    N = cm.devices.n
    nodes = cm.node_tables(pins)
    keep = {}
    for nm in nodes.names:
        cands = nodes.candidates[nm]
        want = [i for i, c in enumerate(cands) if c.deg("n") == N and c.total == N]
        if not want:
            layer = graph.layer(nm)
            if layer.op != "input" and "n" in layer.dims:
                raise InfeasiblePlan(f"FSDP needs the batch ({graph.batch}) split across {N} "
                                     f"devices, but layer {nm} cannot be: choose a batch "
                                     f"divisible by {N}")
            want = [0]
        keep[nm] = want
    # the edges between FSDP's configurations only (one per layer): the same entries as
    # the search's tables, a 1 × 1 table per edge
    tables = cm.kept_tables(keep, pins)
    settings = MemorySettings(options.optimizer, True, 3)
    cap = _cap(cm.devices, options.memory_limit_gib)
    ev = ST.Evaluator(cm, tables, settings, cap)
    ev.option_mask = _option_masks(ev.opts, {}, settings,
                                   lambda rc, z: z == 3 and rc == options.recompute,
                                   options.recompute)
    e = ev.evaluate(0.0)
    info = {"strategy": "fsdp", "recompute": options.recompute,
            "memory": {"limit_bytes": cap, "constrained": False, "layout": True,
                       "optimizer": settings.optimizer}}
    return memory_result("fsdp", problem, cm, tables, e, settings, ev, info,
                         time.perf_counter() - t0, pins)


def megatron3d(problem, pins=None, options: Megatron3DOptions | None = None) -> Result:
    """Megatron-LM's tp × pp × dp (module docstring).  ``pp`` by default the fewest stages
    (powers of two) at which some ``tp`` fits; ``tp`` by default every divisor of a node's
    devices (and of the stage's group) that divides every attention's head count, the
    fastest fitting one kept, as a Megatron user tunes it (the same stage tables serve every
    ``tp``: only the layers' configurations change)."""
    from explorer.engine.layerwise import classic
    from explorer.engine.search.options import MegatronOptions
    options = options or Megatron3DOptions()
    if pins:
        raise InfeasiblePlan("megatron-3d takes no pins")
    t0 = time.perf_counter()
    graph = problem.layer_graph()
    N, B = problem.devices.n, graph.batch
    if options.ep is not None:         # a degree dividing a stage's devices divides them all
        from explorer.engine.search.options import check_ep
        check_ep(options.ep, N, [la.size("e") for la in graph.layers() if "e" in la.dims])
    node = sum(1 for d in problem.devices.devices if d.node == problem.devices.devices[0].node)
    top = classic.default_tp(graph, min(node, N))
    tps = [options.tp] if options.tp else [t for t in range(top, 0, -1) if top % t == 0]
    K = len(ST.Chain.of(graph).segments)
    pps = [options.pp] if options.pp else ST.stage_counts(N, K, B)
    settings = MemorySettings(options.optimizer, True, 0)
    cap = _cap(problem.devices, options.memory_limit_gib)
    best, least, tried = None, None, []
    for pp in pps:
        if N % pp:
            raise InfeasiblePlan(f"pp={pp} does not divide the {N} devices")
        M = options.micro_batches or next((m for m in range(min(B, 4 * pp), 0, -1)
                                           if B % m == 0), 1)
        if pp == 1 and not options.micro_batches:
            M = 1
        try:
            cm, bw, lat = _stage_model(problem, pp, M)
            nodes = cm.node_tables()
        except (InfeasiblePlan, ValueError) as exc:
            tried.append({"pp": pp, "error": str(exc)})
            continue
        choices = {}                      # tp -> Megatron's candidate per layer
        for tp in tps:
            if (N // pp) % tp:
                if options.tp:
                    raise InfeasiblePlan(f"tp={tp} x pp={pp} does not divide the {N} devices")
                continue
            try:
                choices[tp], _ = classic.megatron_choice(
                    cm.graph, nodes, cm.devices.n, MegatronOptions(tp=tp, ep=options.ep))
            except (InfeasiblePlan, ValueError) as exc:
                tried.append({"pp": pp, "tp": tp, "error": str(exc)})
        if not choices:
            continue
        # the edges between the configurations some tp chose only (the same entries as
        # the full tables'): every tp of this pp reads these tables through its mask
        keep = {n: sorted({ch[n] for ch in choices.values()}) for n in nodes.names}
        try:
            tables = cm.kept_tables(keep)
        except (InfeasiblePlan, ValueError) as exc:
            tried.append({"pp": pp, "error": str(exc)})
            continue
        opts: dict = {}                   # layer options shared by every tp of this pp
        for tp, choice in choices.items():
            masks = {n: [keep[n].index(i)] for n, i in choice.items()}
            ev = ST.Evaluator(cm, tables, settings, cap, pp, M, "1f1b", bw, lat, masks=masks,
                              opts_cache=opts)
            ev.option_mask = _option_masks(ev.opts, masks, settings,
                                           lambda rc, z: z == 0 and rc == options.recompute,
                                           options.recompute)
            e = ev.evaluate(0.0)
            tried.append({"pp": pp, "tp": tp, "micro_batches": M, "time_s": e.time_s,
                          "peak_bytes": e.peak, "fits": e.fits})
            item = (e, cm, tables, ev, tp, pp, M)
            if e.fits and (best is None or e.time_s < best[0].time_s):
                best = item
            if least is None or e.peak < least[0].peak:
                least = item
        if best is not None:
            break
    pick = best or least
    if pick is None:
        raise InfeasiblePlan("megatron-3d: no tp x pp layout could be costed: "
                             + "; ".join(t["error"] for t in tried[:3] if "error" in t))
    e, cm, tables, ev, tp, pp, M = pick
    info = {"strategy": "megatron-3d", "tp": tp, "pp": pp, "dp": N // (tp * pp),
            "micro_batches": M, "recompute": options.recompute, "tried": tried,
            "memory": {"limit_bytes": cap, "constrained": False, "layout": True,
                       "optimizer": settings.optimizer}}
    return memory_result("megatron-3d", problem, cm, tables, e, settings, ev, info,
                         time.perf_counter() - t0)

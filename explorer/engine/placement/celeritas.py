"""Celeritas device placement (Xu et al.): CPD-TOPO, optimal operation fusion, Adjusting
Placement - the one public entry point :func:`search` (a :class:`Result` for a
:class:`~explorer.engine.search.problem.Problem`); :func:`place` is the algorithm on a graph.

Pipeline (paper Sections 4-5):

1. Standard Evaluation -> :class:`~explorer.engine.placement.placement_graph.PlacementGraph`
   (per-operator time and memory, ``t = k·d + b`` links);
2. CPD-TOPO order from ``tlevel + blevel`` (equations 2-3, Algorithm 1 ``CPD_Topo``);
3. optimal operation fusion: breakpoint DP over that order with window ``R`` and memory cap
   ``M`` (equations 4-6) -> acyclic coarse graph;
4. Adjusting Placement (Algorithm 2) of the coarse graph - or Order-Place with
   ``algo="order-place"`` - then every operator takes its cluster's device;
5. (``algo="celeritas"`` only; not in the paper) simulated refinement: each cluster decision
   is revisited with the shared simulator and moved to another device when that shortens
   the simulated step without a simulated OOM, then the clusters of a finer fusion (window
   ``split_R``: a block's parallel branches apart) and the operators on the cut
   (:mod:`~explorer.engine.placement.refine`).
   ``algo="celeritas-paper"`` (or ``refine=False``) stops after step 4, as published;
6. (``algo="celeritas"`` only, ``schedule="placed"``) the schedule: each device runs its ready
   operators in CPD-TOPO, or by the *placed* graph's blevel (an edge costs its transfer only
   where the placement cuts it; CPD-TOPO breaks ties) when that simulates the placement
   faster within capacity (:func:`choose_schedule`); the plan carries it as its ``order``;
7. the shared simulator predicts step time and per-device peak memory.

Example
-------
>>> from explorer.engine.search.problem import Problem, Request
>>> res = search(Problem(Request("mlp", 8, {"layers": 2}, preset="v100-pcie-4")))
>>> res.family, res.predicted_step_time_s > 0, len(res.plan.placement) == len(res.plan.names)
('placement', True, True)
"""

from __future__ import annotations

import functools
import time

import numpy as np

from explorer.errors import InfeasiblePlan
from explorer.engine.placement.fusion import fuse
from explorer.engine.placement.placement_graph import PlacementGraph
from explorer.engine.placement.order import graph_order, placed_order
from explorer.engine.placement.place import adjusting_placement, order_place
from explorer.engine.placement.refine import placement_units, refine
from explorer.engine.placement.result import PlacementPlan, placement_result, simulated_plan
from explorer.engine.placement.simulator import simulate
from explorer.engine.search.options import CeleritasOptions, make
from explorer.engine.search.result import Result

__all__ = ["search", "place", "placement_graph", "resolve_pins", "pin_map"]


def placement_graph(graph, devices, options: dict | None = None) -> PlacementGraph:
    """The placers' input for ``graph``: a PlacementGraph as is, an OpGraph, or a model spec
    string (built with fake tensors at ``options['batch']`` / ``options['model_args']``).
    ``options['memory_per_device']`` (bytes) overrides the devices' capacity."""
    from explorer.engine.placement.estimate import from_opgraph
    opts = dict(options or {})
    cap = opts.get("memory_per_device")
    if isinstance(graph, PlacementGraph):
        return graph if cap is None else graph.with_capacity(cap)
    if isinstance(graph, str):
        from explorer.engine.core.opgraph import build_opgraph
        graph = build_opgraph(graph, opts.get("batch"), opts.get("model_args"))
    return from_opgraph(graph, devices, cap, opts.get("times"), opts.get("memory"))


def resolve_pins(pg: PlacementGraph, pins, clusters=None) -> np.ndarray:
    """Pins as a device per node (-1 = free).

    ``pins`` maps an operator name, or ``"cluster:K"`` (cluster K of ``clusters``), to a
    device index.  Raises :class:`InfeasiblePlan` for unknown names, devices out of range or
    pins whose memory alone exceeds a device's capacity.
    """
    out = np.full(pg.n, -1, dtype=np.int64)
    if not pins:
        return out
    idx = pg.index()
    for key, d in dict(pins).items():
        d = int(d)
        if not 0 <= d < pg.ndev:
            raise InfeasiblePlan(f"pin {key}={d}: there are only {pg.ndev} devices "
                                 f"(0..{pg.ndev - 1})")
        if str(key).startswith("cluster:"):
            k = int(str(key).split(":", 1)[1])
            if clusters is None or not 0 <= k < len(clusters):
                raise InfeasiblePlan(f"pin {key}: no such cluster (there are "
                                     f"{0 if clusters is None else len(clusters)})")
            members = clusters[k]
        elif key in idx:
            members = [idx[key]]
        else:
            raise InfeasiblePlan(f"pin {key}: no operator of that name in the graph "
                                 f"({pg.n} operators, e.g. {pg.names[min(5, pg.n - 1)]!r})")
        for v in members:
            if out[v] >= 0 and out[v] != d:
                raise InfeasiblePlan(f"operator {pg.names[v]} is pinned to devices {out[v]} "
                                     f"and {d}")
            out[v] = d
    for d in range(pg.ndev):
        m = float(pg.mem[out == d].sum())
        if m > pg.capacity[d]:
            raise InfeasiblePlan(f"operators pinned to device {d} need {m / 2**30:.2f} GiB but "
                                 f"it holds {pg.capacity[d] / 2**30:.2f} GiB: unpin some or "
                                 f"raise --memory-per-device")
    return out


def pin_map(pins) -> dict:
    """Placement pins (``OP=@D`` / ``cluster:K=@D``) as ``{target: device}``."""
    from explorer.engine.core.pins import check
    return {p.target: int(p.devices[0]) for p in check(pins, "placement")}


def search(problem, pins=None, options: CeleritasOptions | None = None) -> Result:
    """Celeritas, Celeritas as published, or Order-Place (``options.algo``) on the
    problem's operator graph; ``pins`` put operators or fused clusters on devices."""
    options = make(CeleritasOptions, options)
    pg = problem.placement_graph(options.memory_per_device)
    opts = options.as_dict()
    opts.pop("memory_per_device")
    opts["pins"] = pin_map(pins)
    return placement_result(place(pg, problem.devices, opts), problem, pins)


def _finer_units(pg, order, R, M, pin) -> list:
    """The refinement's split units: the placement units of a fusion with window ``R``."""
    fine, _, _ = fuse(pg, order, R, M, pin if (pin >= 0).any() else None)
    return placement_units(pg, fine)


#: the schedules ``celeritas`` chooses between (``schedule="placed"``)
SCHEDULE_CPD, SCHEDULE_PLACED = "CPD-TOPO", "placed blevel, then CPD-TOPO"


def choose_schedule(pg, dev, candidates, contention="ports"):
    """The ``(name, order)`` among ``candidates`` (``order``: node ids, first runs first)
    that runs placement ``dev`` best - least memory over capacity by the simulated peaks,
    then the shortest simulated step, the first on a tie - and each one's ``(over, step)``."""
    scored = []
    for _, order in candidates:
        pr = np.empty(pg.n)
        pr[np.asarray(order, dtype=np.int64)] = -np.arange(pg.n, dtype=np.float64)
        s = simulate(pg, dev, priority=pr, contention=contention)
        over = float(np.maximum(s.peak_memory - pg.capacity * (1 + 1e-9), 0.0).sum())
        scored.append((over, float(s.makespan)))
    best = min(range(len(candidates)), key=lambda i: (scored[i], i))
    return candidates[best], scored


def place(graph, devices, options: dict | None = None) -> PlacementPlan:
    """Place ``graph`` on ``devices`` with Celeritas (or Order-Place).

    Parameters
    ----------
    graph : OpGraph, PlacementGraph or str
        The operator graph (a model spec string is traced with fake tensors).
    devices : DeviceGraph
    options : dict, optional
        ``algo`` ("celeritas" | "celeritas-paper" | "order-place"), ``refine`` (True: the
        simulated refinement after Adjusting Placement, celeritas only), ``refine_evals``
        (simulation budget, default by graph size), ``split_R`` (10: window of the finer
        fusion whose clusters the refinement moves next; 0: none), ``refine_memory``
        ("budget": the
        placers' whole-step budget | "simulated": only the simulated peaks within capacity), ``R`` (200), ``M`` (bytes; default
        ``M_fraction`` 0.25 of the smallest capacity), ``memory_per_device`` (bytes),
        ``pins`` ({op name or "cluster:K": device}), ``contention`` ("ports" | "none"),
        ``batch`` / ``model_args`` (for a spec string).

    Returns
    -------
    PlacementPlan
        Placement of every operator, clusters with their devices, simulated step time and
        peak memory, ``oom``, and a trace (order, breakpoints, Adjusting Placement steps).
    """
    given = dict(options or {})
    pins = given.pop("pins", None) or {}
    graph_opts = {k: given.pop(k) for k in ("batch", "model_args", "times", "memory")
                  if k in given}
    checked = make(CeleritasOptions, given)          # validated once (R, M, algo, ...)
    opts = checked.as_dict()
    algo, R = checked.algo, int(checked.R)
    pg = placement_graph(graph, devices, {**graph_opts,
                                          "memory_per_device": checked.memory_per_device})
    t0 = time.perf_counter()
    M = float(checked.M) if checked.M is not None else (
        float(checked.M_fraction) * float(pg.capacity.min()))
    clusters0 = None
    if any(str(k).startswith("cluster:") for k in pins):
        order0, _, _ = graph_order(pg, "cpd")
        co0, _, _ = fuse(pg, order0, R, M)
        clusters0 = co0.members
    pin = resolve_pins(pg, pins, clusters0)
    order, tl, bl = graph_order(pg, "cpd")
    t_order = time.perf_counter()
    co, bps, s_n = fuse(pg, order, R, M, pin if (pin >= 0).any() else None)
    t_fuse = time.perf_counter()
    cp = order_place(co, pg) if algo == "order-place" else adjusting_placement(co, pg)
    placement = cp.node_device
    t_place = time.perf_counter()
    ref = None
    if algo == "celeritas" and opts["refine"]:
        split = None                    # fused only when the budget lasts to the split moves
        if 0 < int(checked.split_R) < R:
            split = functools.partial(_finer_units, pg, order, int(checked.split_R), M, pin)
        ref = refine(pg, placement, placement_units(pg, co), pin, opts["refine_evals"],
                     contention=opts["contention"], memory=opts["refine_memory"],
                     split_units=split)
        placement = ref.placement
    # the schedule is part of the plan: CPD-TOPO (the one the refinement judged moves in), or
    # the placed graph's blevel where that runs this placement faster within capacity
    schedules, schedule_scores = [(SCHEDULE_CPD, order)], None
    sched = schedules[0]
    if algo == "celeritas" and checked.schedule == "placed":
        schedules.append((SCHEDULE_PLACED, placed_order(pg, placement, order)))
        sched, schedule_scores = choose_schedule(pg, placement, schedules, opts["contention"])
    sched_order = None if sched[0] == SCHEDULE_CPD else sched[1]
    elapsed = time.perf_counter() - t0
    if ref is not None:               # a cluster's device: where most of its work now runs
        cdev = [int(np.bincount(placement[m], weights=pg.w[m, 0] + 1e-12,
                                minlength=pg.ndev).argmax()) for m in co.members]
    else:
        cdev = [int(x) for x in cp.device]
    clusters = [{"ops": [pg.names[v] for v in m.tolist()], "device": cdev[k],
                 "devices": sorted(set(placement[m].tolist())),
                 "time_s": float(co.w[k, cdev[k]]), "memory_bytes": float(co.mem[k]),
                 "placer_start_s": float(cp.start[k]), "placer_end_s": float(cp.finish[k])}
                for k, m in enumerate(co.members)]
    stats = {"nodes_before": pg.n, "edges_before": pg.n_edges, "ccr_before": pg.ccr(),
             "nodes_after": co.n, "edges_after": len(co.edges),
             "ccr_after": co.ccr(pg.k_mean, pg.b_mean), "R": R, "M_bytes": M,
             "cut_comm_s": s_n, "order_s": t_order - t0, "fusion_s": t_fuse - t_order,
             "place_s": t_place - t_fuse, "moves": cp.moves,
             "placer_makespan_s": float(cp.finish.max()) if co.n else 0.0,
             "placer_memory_bytes": cp.used.tolist() if cp.used is not None else None,
             "refine": ref is not None}
    if schedule_scores is not None:
        stats["schedule_steps_s"] = {name: sc[1] for (name, _), sc in
                                     zip(schedules, schedule_scores)}
    if ref is not None:
        stats.update({"step_before_refine_s": ref.before, "refine_moves": len(ref.moves),
                      "refine_evals": ref.evals, "refine_passes": ref.passes,
                      "refine_s": ref.seconds, "refine_exhausted": ref.exhausted})
    trace = [{"step": "cpd-topo", "order": [pg.names[v] for v in order[:2000]],
              "truncated": pg.n > 2000},
             {"step": "fusion", "breakpoints": bps, "S_n": s_n, "clusters": co.n},
             {"step": "placement", "algo": algo, "order": [int(x) for x in cp.order],
              "decisions": cp.log}]
    if ref is not None:
        trace.append({"step": "refinement", "before_s": ref.before, "after_s": ref.after,
                      "evals": ref.evals, "exhausted": ref.exhausted,
                      "moves": [{**m, "first_op": pg.names[m["first_op"]]} for m in ref.moves]})
    best = [f"cluster:{k}" for k in cp.best_effort]
    if ref is not None:
        # the refined placement is held to the simulated (liveness) peaks: Adjusting
        # Placement's best effort is resolved when the refinement ends within every capacity
        stats["placer_best_effort"] = best
        if ref.overflow == 0.0 and opts["refine_memory"] == "simulated":
            best = []
    return simulated_plan(algo, pg, placement, elapsed, best, clusters, stats, trace,
                          opts["contention"], order=sched_order, schedule=sched[0])

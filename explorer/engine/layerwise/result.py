"""A layer-wise :class:`~explorer.engine.search.result.Result` from a method's choice of one
candidate configuration per layer: the :class:`~explorer.engine.layerwise.plan.Plan`, its
objective (equation 1), breakdown, memory per device and bytes moved."""

from __future__ import annotations

import numpy as np

from explorer.engine.core import geometry as G
from explorer.engine.core.layergraph import graph_digest
from explorer.engine.layerwise.costmodel import CostTables
from explorer.engine.layerwise.plan import (
    LayerAssignment,
    Plan,
    layer_content_key,
    memory_per_device,
)
from explorer.engine.search.result import Result

__all__ = ["layerwise_result"]


def layerwise_result(algo, graph, devices, cost_model, tables: CostTables, choice: dict, trace,
                     info, elapsed_s: float, pins=None) -> Result:
    """A layer-wise :class:`Result`: the :class:`Plan` for ``choice`` (objective,
    breakdown, memory, bytes moved)."""
    bd = tables.breakdown(choice)
    layers = []
    for n in tables.names:
        i = choice[n]
        layers.append(LayerAssignment(n, graph.layer(n).op, tables.candidates[n][i],
                                      float(tables.t_compute[n][i]), float(tables.t_sync[n][i]),
                                      float(tables.memory[n][i]), tables.reduce_time(n, i)))
    mem = memory_per_device(graph, tables, choice, devices.n, cost_model.dtype_bytes,
                            getattr(cost_model, "param_bytes", 4),
                            getattr(cost_model, "copy_bytes", 0))
    xfer_bytes = sum(float(nb[choice[e.src], choice[e.dst]])
                     for (e, _), nb in zip(tables.edges, tables.bytes_xfer))
    sync_bytes = _sync_bytes(graph, tables, choice, cost_model)
    reduce_bytes = sum(float(nb[choice[n]]) for n, nb in tables.bytes_reduce.items())
    info = dict(info)
    info.update({"compute_cost": cost_model.compute, "sync": cost_model.sync,
                 "degrees": list(getattr(cost_model, "degrees", ())),
                 "estimate": dict(tables.estimate),
                 "tables_time_s": tables.build_time_s,
                 "profile_time_s": getattr(cost_model, "profile_time_s", 0.0),
                 "layers": len(tables.names), "edges": len(tables.edges),
                 "candidates_per_layer": {
                     "max": max(len(c) for c in tables.candidates.values()),
                     "mean": float(np.mean([len(c) for c in tables.candidates.values()]))},
                 "transfer_bytes": xfer_bytes, "sync_bytes": sync_bytes,
                 "reduce_bytes": reduce_bytes,
                 "fits_memory": bool(all(mem[d] <= devices.devices[d].memory
                                         for d in range(devices.n)))})
    edges = [{"src": e.src, "dst": e.dst, "index": e.index,
              "t_xfer_s": float(m[choice[e.src], choice[e.dst]]),
              "bytes": float(nb[choice[e.src], choice[e.dst]])}
             for (e, m), nb in zip(tables.edges, tables.bytes_xfer)]
    objective = tables.objective(choice)
    # profiling a new device is reported apart (info.profile_time_s), not as search time
    search_s = max(elapsed_s - info["profile_time_s"], 0.0)
    plan = Plan(graph.model, getattr(graph, "spec", graph.model), graph.batch, algo, devices.name,
                devices.n, layers, objective, objective, search_s, bd,
                xfer_bytes + sync_bytes + reduce_bytes, mem.tolist(), dict(getattr(graph, "model_args", {})),
                [p.text() for p in (pins or [])], info, edges)
    plan.graph_digest = graph_digest(graph)
    plan.dtype = getattr(cost_model, "dtype", "fp32")
    return Result(algo, "layerwise", plan.model, plan.batch, plan.model_args, devices.name,
                  devices.n, objective, objective, search_s, mem.tolist(), plan.comm_bytes,
                  info["fits_memory"], plan, plan.pins, list(trace), info, tables, dict(choice))


def _sync_bytes(graph, tables, choice, cost_model) -> float:
    """Bytes moved by parameter synchronisation (both directions) under ``choice``."""
    total = 0.0
    seen: dict = {}         # repeated blocks under the same configuration: computed once
    for n in tables.names:
        cfg = tables.candidates[n][choice[n]]
        key = (layer_content_key(graph.layer(n)), cfg)
        if key not in seen:
            _, _, groups = G.shard_summary(graph.layer(n), cfg)
            seen[key] = sum(2.0 * (len(members) - 1) * elems
                            * getattr(cost_model, "param_bytes", 4)
                            for elems, members in groups if len(members) > 1)
        total += seen[key]
    return total


def memory_result(algo, problem, cost_model, tables: CostTables, ev, settings, evaluator,
                  info: dict, elapsed_s: float, pins=None, trace=None, base=None) -> Result:
    """A layer-wise :class:`Result` for a plan of the memory-aware searches
    (:mod:`.stages`): ``ev`` an :class:`~.stages.Evaluation` (each layer's candidate and
    memory option, its pipeline stages).  ``cost_model``/``tables`` are those the plan was
    searched with: a pipeline's are one stage's device group at the micro-batch's size,
    and stage ``s`` runs on devices ``s·G … (s+1)·G − 1``.  The objective is the step time
    (equation 1 with the options' times; with stages, the pipeline's formula); memory is
    exact per device and by category (:func:`~.memory.plan_memory`)."""
    from explorer.engine.layerwise.memory import CATEGORIES, plan_memory
    full = problem.layer_graph()
    devices = problem.devices
    N = devices.n
    G_ = cost_model.devices.n
    S, M = evaluator.S, evaluator.M
    stage_of = {n: s for s, names in enumerate(ev.stages) for n in names}
    offsets = {n: stage_of[n] * G_ for n in stage_of}
    mult = {n: evaluator.inflight(stage_of[n]) for n in stage_of}
    mem = plan_memory(cost_model, tables, ev.choice, ev.option, settings, N, offsets, mult,
                      evaluator.opts)
    total = np.sum([mem[k] for k in CATEGORIES + ("transient",)], axis=0)
    layers = []
    for n in tables.names:
        i, o = ev.choice[n], ev.option[n]
        cfg = tables.candidates[n][i]
        if offsets.get(n):
            cfg = G.Config(cfg.degrees, tuple(d + offsets[n] for d in cfg.devices))
        rc, z = evaluator.opts[n].options[o]
        lo = evaluator.opts[n]
        layers.append(LayerAssignment(
            n, cost_model.graph.layer(n).op, cfg, float(tables.t_compute[n][i]),
            float(tables.t_sync[n][i]), float(lo.static[i, o] + mult.get(n, 1.0) * lo.act[i, o]),
            tables.reduce_time(n, i), bool(rc), int(z), stage_of.get(n, 0)))
    bd = tables.breakdown(ev.choice)
    bd.update({"per_microbatch_s": float(sum(ev.t_mb)), "once_per_step_s": float(max(ev.t_once)),
               "total_s": float(ev.time_s)})
    cap = evaluator.cap
    fits = bool(all(total[d] <= min(devices.devices[d].memory, cap) * (1 + 1e-9)
                    for d in range(N)))
    xfer_bytes = sum(float(nb[ev.choice[e.src], ev.choice[e.dst]])
                     for (e, _), nb in zip(tables.edges, tables.bytes_xfer)) * M
    info = dict(info)
    info.update({"compute_cost": cost_model.compute, "sync": cost_model.sync,
                 "degrees": list(getattr(cost_model, "degrees", ())),
                 "estimate": dict(tables.estimate), "tables_time_s": tables.build_time_s,
                 "layers": len(tables.names), "edges": len(tables.edges),
                 "transfer_bytes": xfer_bytes, "fits_memory": fits,
                 "recomputed_layers": sum(1 for la in layers if la.recompute),
                 "zero_layers": {str(z): sum(1 for la in layers if la.zero == z)
                                 for z in (1, 2, 3) if any(la.zero == z for la in layers)}})
    pipeline = None
    if S > 1 or M > 1:
        pipeline = {"stages": S, "micro_batches": M, "schedule": evaluator.schedule,
                    "devices_per_stage": G_, "micro_batch": cost_model.graph.batch,
                    "bubble_fraction": (S - 1) / (M + S - 1),
                    "stage_layers": [[names[0], names[-1], len(names)] for names in ev.stages],
                    "stage_time_per_microbatch_s": [float(t) for t in ev.t_mb],
                    "stage_time_once_s": [float(t) for t in ev.t_once],
                    "stage_boundary_s": [float(t) for t in ev.boundary_s],
                    "stage_memory_bytes": [float(m) for m in ev.memory],
                    "in_flight": [evaluator.inflight(s) for s in range(S)]}
        info["pipeline"] = pipeline
    by_cat = {"optimizer_kind": settings.optimizer, **mem}
    search_s = max(elapsed_s, 0.0)
    plan = Plan(full.model, getattr(full, "spec", full.model), full.batch, algo, devices.name,
                N, layers, float(ev.time_s), float(ev.time_s), search_s, bd, xfer_bytes,
                total.tolist(), dict(getattr(full, "model_args", {})),
                [p.text() for p in (pins or [])], info, [], memory_by_category=by_cat,
                pipeline=pipeline)
    plan.graph_digest = graph_digest(full)
    plan.dtype = getattr(cost_model, "dtype", "fp32")
    return Result(algo, "layerwise", plan.model, plan.batch, plan.model_args, devices.name, N,
                  plan.objective_s, plan.objective_s, search_s, total.tolist(), plan.comm_bytes,
                  fits, plan, plan.pins, list(trace or []), info,
                  tables if (S == 1 and M == 1) else None,
                  dict(ev.choice) if (S == 1 and M == 1) else None)

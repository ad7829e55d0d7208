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

"""What every search returns: the :class:`Plan`, the cost tables it used and a replayable trace."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..costmodel import CostTables
from ..plan import LayerAssignment, Plan, memory_per_device


@dataclass
class SearchResult:
    """``plan`` – the chosen strategy; ``tables`` – the cost tables (for ``--dump-costs`` and
    re-costing); ``choice`` – candidate index per layer; ``trace`` – algorithm steps in order;
    ``info`` – algorithm facts (residual graph size, method, ...)."""

    plan: Plan
    tables: CostTables
    choice: dict
    trace: list = field(default_factory=list)
    info: dict = field(default_factory=dict)


def finish(algo, graph, devices, cost_model, tables: CostTables, choice: dict, trace, info,
           elapsed_s: float, pins=None) -> SearchResult:
    """Assemble the :class:`Plan` for ``choice`` (objective, breakdown, memory, bytes moved)."""
    bd = tables.breakdown(choice)
    layers = []
    for n in tables.names:
        i = choice[n]
        layers.append(LayerAssignment(n, graph.layer(n).op, tables.candidates[n][i],
                                      float(tables.t_compute[n][i]), float(tables.t_sync[n][i]),
                                      float(tables.memory[n][i])))
    mem = memory_per_device(graph, tables, choice, devices.n, cost_model.dtype_bytes)
    xfer_bytes = sum(float(nb[choice[e.src], choice[e.dst]])
                     for (e, _), nb in zip(tables.edges, tables.bytes_xfer))
    sync_bytes = _sync_bytes(graph, tables, choice, cost_model)
    info = dict(info)
    info.update({"compute_cost": cost_model.compute, "sync": cost_model.sync,
                 "tables_time_s": tables.build_time_s,
                 "profile_time_s": getattr(cost_model, "profile_time_s", 0.0),
                 "layers": len(tables.names), "edges": len(tables.edges),
                 "candidates_per_layer": {
                     "max": max(len(c) for c in tables.candidates.values()),
                     "mean": float(np.mean([len(c) for c in tables.candidates.values()]))},
                 "transfer_bytes": xfer_bytes, "sync_bytes": sync_bytes,
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
                xfer_bytes + sync_bytes, mem.tolist(), dict(getattr(graph, "model_args", {})),
                [p.text() for p in (pins or [])], info, edges)
    return SearchResult(plan, tables, dict(choice), list(trace), info)


def _sync_bytes(graph, tables, choice, cost_model) -> float:
    """Bytes moved by parameter synchronisation (both directions) under ``choice``."""
    from .. import geometry as G
    total = 0.0
    for n in tables.names:
        cfg = tables.candidates[n][choice[n]]
        _, _, groups = G.shard_summary(graph.layer(n), cfg)
        for elems, members in groups:
            r = len(members)
            if r > 1:
                f = 2.0 * (r - 1) if cost_model.sync == "ps" else 2.0 * (r - 1)
                total += f * elems * cost_model.dtype_bytes
    return total

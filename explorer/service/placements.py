"""Device placements for the app (Celeritas and its baselines): a placement with its schedule
and clusters, the operator graph the placers saw, and every placer side by side."""

from __future__ import annotations

from explorer.engine.search.request import Request
from explorer.errors import ExplorerError
from explorer.service.captures import memory_bytes, placement_graph_for
from explorer.service.results import methods, result

__all__ = ["placement", "placement_pins", "placement_pin_rows", "placement_structure",
           "placement_compare", "placement_result"]


def placement_pins(pins: list | None) -> list:
    """The Placement page's pins ``[{"target", "ops", "device"}]`` as engine pins."""
    from explorer.engine.core.pins import from_placement_ui
    return from_placement_ui(pins)



def placement_result(req: Request, algo: str, memory_gib=None, pins: list | None = None):
    """The placement method's result (the one result cache) for the page's pin rows and
    memory limit (GiB; ``None``: the devices' own)."""
    cap = memory_bytes(memory_gib)
    opts = {} if cap is None else {"memory_per_device": cap}
    return result(req, algo, placement_pins(pins), opts)


def placement(req: Request, algo: str = "celeritas", memory_gib=None,
              pins: list | None = None) -> dict:
    """Place the request's forward+backward operator graph with ``algo`` (Celeritas or a
    baseline) honouring ``pins``: the result's JSON with its schedule (Gantt intervals).

    Every cluster gets ``shares`` (operators per device).  Baselines place operators, not
    clusters, so their graph is drawn over Celeritas' fused clusters (``clusters_from``), each
    coloured by the devices its operators landed on."""
    res = placement_result(req, algo, memory_gib, pins)
    doc = res.to_dict(schedule=True)
    doc.pop("trace", None)
    doc["clusters_from"] = algo
    if not doc["clusters"]:
        doc["clusters"] = placement_result(req, "celeritas", memory_gib,
                                            pins).plan.to_dict()["clusters"]
        doc["clusters_from"] = "celeritas"
    where = doc["placement"]
    for c in doc["clusters"]:
        shares = [0] * len(doc["capacity_bytes"])
        for op in c["ops"]:
            shares[where[op]] += 1
        c["shares"] = shares
        c["device"] = max(range(len(shares)), key=lambda d: (shares[d], -d))
    doc["request"] = req.to_dict()
    doc["memory_gib"] = memory_gib
    doc["pins"] = [f"{r['target']}=@{int(r['device'])}" for r in pins or []]  # text, as
    doc["pin_rows"] = [dict(r) for r in pins or []]   # everywhere; the page's rows keep the
    return doc                                        # operators a cluster pin stood for


def placement_pin_rows(doc: dict) -> list:
    """The Placement page's pin rows of a placement document: the rows it was made with, or
    rows from its text pins (a ``cluster:K`` pin lists that cluster's operators)."""
    from explorer.engine.core.pins import to_placement_ui
    if isinstance((doc or {}).get("pin_rows"), list):
        return [dict(r) for r in doc["pin_rows"]]
    pins = [p for p in (doc or {}).get("pins") or [] if isinstance(p, str)]
    legacy = [p for p in (doc or {}).get("pins") or [] if isinstance(p, dict)]
    return legacy + to_placement_ui(pins, (doc or {}).get("clusters") or [])


def placement_structure(req: Request, memory_gib=None) -> dict:
    """The operator graph the placers saw, for drawing: names, edges (index pairs), each
    operator's target, phase, time on device 0 and memory."""
    pg = placement_graph_for(req, memory_gib)
    return {"names": list(pg.names), "src": pg.src.tolist(), "dst": pg.dst.tolist(),
            "out_bytes": pg.out_bytes.tolist(), "target": list(pg.info.get("target", [])),
            "phase": list(pg.info.get("phase", [])), "time_s": pg.w[:, 0].tolist(),
            "memory_bytes": pg.mem.tolist()}


def placement_compare(req: Request, memory_gib=None, pins: list | None = None, algos=None,
                      progress=lambda done, total, algo: None) -> list:
    """Every placement algorithm on the same graph and simulator (Celeritas Tables 3-4):
    predicted step time, placement time, peak memory, OOM - or the error it raised."""
    described = methods("placement")
    algos = list(algos or described)
    rows = []
    for i, a in enumerate(algos):
        progress(i, len(algos), a)
        try:
            r = placement_result(req, a, memory_gib, pins).plan
            rows.append({"algo": a, "description": described.get(a, ""),
                         "step_time_s": r.predicted_step_time_s,
                         "search_time_s": float(r.search_time_s),
                         "peak_bytes": max(r.peak_memory_bytes, default=0.0),
                         "capacity_bytes": float(min(r.capacity)), "oom": r.oom,
                         "clusters": len(r.clusters), "comm_bytes": float(r.sim.comm_bytes)})
        except (ExplorerError, ValueError) as exc:
            rows.append({"algo": a, "description": described.get(a, ""),
                         "error": str(exc)})
    progress(len(algos), len(algos), "")
    return rows


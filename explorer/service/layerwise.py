"""Layer-wise plans for the app and the command line: searches with their elimination traces
(kept on the server), each layer's candidate table, the comparison of strategies and their
scaling, and the tiles of one configuration."""

from __future__ import annotations

import json
import threading
from collections import OrderedDict

from explorer.engine.core import geometry as G
from explorer.engine.search.request import Request
from explorer.errors import ExplorerError, InfeasiblePlan
from explorer.service.captures import cost_model_for, graph_for
from explorer.service.results import result

__all__ = ["search", "keep_trace_steps", "trace_of", "trace_length", "trace_counts",
           "candidates", "layer_info", "plan_changes", "comparison", "comparison_baselines",
           "compare", "scaling", "tiles"]


def search(req: Request, pins: list | None = None, algo: str | None = None,
           keep_trace: bool = False) -> dict:
    """Run layer-wise ``algo`` (default ``req.algo``) honouring ``pins``; the plan dict with
    its trace - or, with ``keep_trace``, with ``trace_ref`` instead (:func:`keep_trace_steps`:
    the trace stays on the server and the page fetches one step at a time)."""
    res = result(req, algo or req.algo, pins)
    doc = res.to_dict(trace=not keep_trace)
    if keep_trace:
        from explorer.engine.core.plandoc import dumps
        text = dumps(res.trace or [])
        doc["trace_ref"] = keep_trace_steps(json.loads(text), text)
    doc["request"] = req.to_dict()
    return doc


# -- search traces kept on the server ---------------------------------------------------------
#
# An elimination trace has a few steps per layer, each with the numbers of its equation (2 MB
# for 2,000 layers): the page holds only its reference and asks for the step it shows.  The
# trace is kept in this process and in a file under the home directory, because Dash runs
# background callbacks (the search button) in other processes than the one serving the page.

_TRACES: OrderedDict = OrderedDict()     # id -> list of steps (this process)
_TRACES_LOCK = threading.Lock()
_TRACES_KEPT = 8                         # in memory
_TRACE_FILES = 64                        # on disk (the oldest are removed)


def _trace_dir():
    from explorer.engine.core.storage import home
    return home() / "traces"


def keep_trace_steps(trace: list, text: str | None = None) -> dict:
    """Keep ``trace`` (``text``: its JSON, when already written) on the server: ``{"id",
    "steps", "counts"}`` (its content hash, its length, and how many steps of each kind) for
    the page to fetch it with."""
    import collections
    import hashlib
    import os
    text = text if text is not None else json.dumps(trace, separators=(",", ":"))
    key = hashlib.sha256(text.encode()).hexdigest()[:32]
    with _TRACES_LOCK:
        _TRACES[key] = trace
        _TRACES.move_to_end(key)
        while len(_TRACES) > _TRACES_KEPT:
            _TRACES.popitem(last=False)
    try:
        folder = _trace_dir()
        folder.mkdir(exist_ok=True)
        path = folder / f"{key}.json"
        if not path.exists():
            tmp = folder / f".{key}.{os.getpid()}.tmp"
            tmp.write_text(text)
            os.replace(tmp, path)
            files = sorted(folder.glob("*.json"), key=lambda f: f.stat().st_mtime)
            for old in files[:-_TRACE_FILES]:
                old.unlink(missing_ok=True)
        else:
            path.touch()
    except OSError:
        pass                             # kept in this process only
    return {"id": key, "steps": len(trace),
            "counts": dict(collections.Counter(s.get("kind") for s in trace))}


def trace_of(plan: dict | None) -> list | None:
    """A plan dict's elimination trace: inline (``trace``) or kept on the server
    (``trace_ref``); ``[]`` when the plan has none, ``None`` when its kept trace is gone."""
    plan = plan or {}
    if plan.get("trace") is not None:
        return plan["trace"]
    ref = plan.get("trace_ref")
    if not ref:
        return []
    key = str(ref.get("id", ""))
    with _TRACES_LOCK:
        if key in _TRACES:
            _TRACES.move_to_end(key)
            return _TRACES[key]
    if not key.isalnum():
        return None
    try:
        trace = json.loads((_trace_dir() / f"{key}.json").read_text())
    except (OSError, ValueError):
        return None
    with _TRACES_LOCK:
        _TRACES[key] = trace
        while len(_TRACES) > _TRACES_KEPT:
            _TRACES.popitem(last=False)
    return trace


def trace_length(plan: dict | None) -> int:
    """How many steps a plan's trace has (without fetching a kept one)."""
    plan = plan or {}
    if plan.get("trace") is not None:
        return len(plan["trace"])
    return int((plan.get("trace_ref") or {}).get("steps") or 0)


def trace_counts(plan: dict | None) -> dict:
    """Steps of each kind (``node``, ``edge``, ``final``, ``undo``) of a plan's trace."""
    import collections
    plan = plan or {}
    if plan.get("trace") is not None:
        return dict(collections.Counter(s.get("kind") for s in plan["trace"]))
    return dict((plan.get("trace_ref") or {}).get("counts") or {})


def candidates(req: Request, layer: str, plan: dict | None = None) -> list:
    """Rows for the candidate table of ``layer``: config, devices, t_C, t_S, t_R (the
    reduce-scatter of a row-parallel configuration), memory, chosen - and, given ``plan``,
    each candidate's transfer in from and out to the neighbours' chosen configurations
    (``t_xin_ms``, ``t_xout_ms``, ``None`` when a neighbour's choice is not a candidate, e.g.
    pinned to other devices) and ``total_ms`` = t_C + t_S + t_R + transfer in + out: the part
    of equation 1 that changes with this layer's choice alone, so the chosen row is the
    smallest unless a neighbour's choice is what made it so."""
    g = graph_for(req)
    cm = cost_model_for(req)
    if layer not in g:
        raise KeyError(f"no layer named {layer!r}")
    cands = cm.candidates(layer)
    tc, ts, mem = cm.layer_costs(layer, cands)
    red = cm.reduce_costs(layer, cands)
    tr = red[0] if red is not None else [0.0] * len(cands)
    chosen = None
    picked: dict = {}
    if plan:
        for la in plan.get("layers", []):
            picked[la["name"]] = (tuple(sorted(la["config"].items())), tuple(la["devices"]))
        chosen = picked.get(layer)
    xin, xout = _neighbour_xfer(g, cm, layer, cands, picked) if picked else (None, None)
    rows = []
    for i, c in enumerate(cands):
        key = (tuple(sorted(c.as_dict().items())), c.devices)
        row = {"config": c.label(), "degrees": ",".join(f"{k}={v}" for k, v in c.degrees),
               "devices": ",".join(map(str, c.devices)),
               "t_compute_ms": round(float(tc[i]) * 1e3, 4),
               "t_sync_ms": round(float(ts[i]) * 1e3, 4),
               "t_reduce_ms": round(float(tr[i]) * 1e3, 4),
               "memory_mib": round(float(mem[i]) / 2 ** 20, 2),
               "chosen": "✔" if key == chosen else ""}
        if xin is not None:
            row["t_xin_ms"] = round(float(xin[i]) * 1e3, 4)
            row["t_xout_ms"] = round(float(xout[i]) * 1e3, 4)
            row["total_ms"] = round(float(tc[i] + ts[i] + tr[i] + xin[i] + xout[i]) * 1e3, 4)
        rows.append(row)
    if chosen is not None and not any(r["chosen"] for r in rows):
        rows.append({"config": "(pinned devices)", "degrees": "", "devices": "",
                     "t_compute_ms": None, "t_sync_ms": None, "t_reduce_ms": None,
                     "memory_mib": None, "chosen": "✔"})
    return rows


def _neighbour_xfer(g, cm, layer: str, cands: list, picked: dict) -> tuple:
    """``(t_in [C], t_out [C])`` seconds: each candidate's transfers (equation 1's t_X, forward
    and backward) from its producers' and to its consumers' configurations in ``picked``
    (``None, None`` when a neighbour's choice is not among its candidates)."""
    import numpy as np

    def index(name):
        want = picked.get(name)
        for j, c in enumerate(cm.candidates(name)):
            if (tuple(sorted(c.as_dict().items())), c.devices) == want:
                return j
        return None
    t_in = np.zeros(len(cands))
    t_out = np.zeros(len(cands))
    for e in g.in_edges(layer):
        j = index(e.src)
        if j is None:
            return None, None
        t_in += cm.xfer(e, cm.candidates(e.src), cands)[0][j, :]
    for e in g.out_edges(layer):
        j = index(e.dst)
        if j is None:
            return None, None
        t_out += cm.xfer(e, cands, cm.candidates(e.dst))[0][:, j]
    return t_in, t_out


def layer_info(req: Request, layer: str) -> dict:
    g = graph_for(req)
    lay = g.layer(layer)
    d = lay.to_dict()
    d["inputs"] = [e.src for e in g.in_edges(layer)]
    d["outputs"] = [e.dst for e in g.out_edges(layer)]
    return d


def plan_changes(old: dict | None, new: dict) -> list:
    """Layers whose configuration or devices differ between two plan dicts."""
    if not old:
        return []
    before = {la["name"]: (la["config_label"], tuple(la["devices"])) for la in old["layers"]}
    out = []
    for la in new["layers"]:
        b = before.get(la["name"])
        if b is not None and b != (la["config_label"], tuple(la["devices"])):
            out.append({"layer": la["name"], "before": b[0], "after": la["config_label"]})
    return out


def comparison(family: str = "layerwise") -> list:
    """The methods a family's comparison shows (baselines, then the searches)."""
    from explorer.engine.search import comparison as listed
    return listed(family)


def comparison_baselines(family: str = "layerwise") -> list:
    """The baselines of a family's comparison."""
    from explorer.engine.search import METHODS
    return [n for n in comparison(family) if METHODS[n].role == "baseline"]


def compare(req: Request, pins=None, algos=None) -> dict:
    """Each strategy's plan dict (without trace) or ``{"error": message}``."""
    out = {}
    for a in algos or comparison("layerwise"):
        try:
            doc = search(req, pins, algo=a)
            doc.pop("trace", None)
            out[a] = doc
        except InfeasiblePlan as exc:
            out[a] = {"error": str(exc)}
    return out


def scaling(req: Request, algos=None) -> dict:
    """Predicted throughput (samples/s) at 1, 2, 4, ... ``req.devices`` devices per strategy,
    with the per-device batch held fixed (the paper's Figure 7 setting)."""
    g = graph_for(req)
    per_device = max(g.batch // req.devices, 1)
    counts = [n for n in (1, 2, 4, 8, 16, 32, 64) if n <= req.devices]
    if req.devices not in counts:
        counts.append(req.devices)
    res: dict = {"devices": counts, "per_device_batch": per_device}
    algos = list(algos or comparison("layerwise"))
    for a in algos:
        ys = []
        for n in counts:
            sub = Request.from_dict(dict(req.to_dict(), devices=n, batch=per_device * n))
            try:
                doc = search(sub, None, algo=a)
                ys.append(sub.batch / doc["predicted_step_time_s"])
            except (ExplorerError, ValueError):
                ys.append(None)
        res[a] = ys
    searches = [a for a in algos if a not in comparison_baselines()]
    base = next((res[a][0] for a in searches + algos if res[a] and res[a][0]), None)
    res["ideal"] = [base * n if base else None for n in counts]
    return res


def tiles(req: Request, layer: str, config: dict, devices: list) -> dict:
    """Geometry of one layer under one configuration, for drawing: per device its output box,
    its input regions (per input, on the producer's tensor) and its weight shards (a
    row-parallel ``k`` device: the regions and shards of the partial tile it computes)."""
    g = graph_for(req)
    lay = g.layer(layer)
    letters = lay.dims + ((G.REDUCE,) if G.reduction_size(lay) is not None else ())
    cfg = G.Config(tuple((k, config.get(k, 1)) for k in letters), tuple(devices))
    boxes = G.output_boxes(lay, cfg)
    tiles, red = G.compute_boxes(lay, cfg)
    ins = []
    for e in g.in_edges(layer):
        src = g.layer(e.src)
        ins.append({"src": e.src, "index": e.index, "shape": list(src.out_shape),
                    "axes": list(src.axes),
                    "regions": G.edge_regions(g, e, tiles, red).tolist()})
    shards = {k: {"shape": list(shape), "boxes": reg.tolist()}
              for k, (shape, reg) in G.param_shards(lay, tiles, red).items()}
    return {"layer": layer, "op": lay.op, "shape": list(lay.out_shape), "axes": list(lay.axes),
            "config": cfg.as_dict(), "devices": list(cfg.devices), "boxes": boxes.tolist(),
            "inputs": ins, "params": shards}


"""The application service: what the app and the command line call.

Requests in, JSON-able results out, with caches.  Views never touch graphs or cost models
directly; they send a :class:`Request` (plain dict in a ``dcc.Store``) and get dicts back.
Imported graphs and cost models are cached per request, so re-running a search after a pin
only recomputes the pinned layers' tables; captures also persist across processes
(:mod:`explorer.engine.core.capture_cache`), so a second ``explorer search`` of a model neither
traces it again nor imports torch.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict


from explorer.errors import ExplorerError, InfeasiblePlan
from explorer.engine.core import capture_cache
from explorer.engine.core import geometry as G
from explorer.engine.core.devices import DeviceGraph
from explorer.engine.core.layergraph import LayerGraph
from explorer.engine.layerwise.costmodel import CostModel
from explorer.engine.search.request import Request


_LOCK = threading.RLock()
_BUILDING: dict = {}                 # key -> lock held while that value is being built
_GRAPHS: OrderedDict = OrderedDict()
_MODELS: OrderedDict = OrderedDict()
_CACHE_SIZE = 8


def _lru(cache, key, make):
    """``cache[key]``, built by ``make()`` once even when many callbacks ask at the same time.

    A per-key lock serialises builders of the same value (the others wait and reuse it);
    values for different keys build in parallel, except captures, which torch.fx and make_fx
    only allow one at a time (:data:`_CAPTURE`)."""
    while True:
        with _LOCK:
            if key in cache:
                cache.move_to_end(key)
                return cache[key]
            building = _BUILDING.setdefault((id(cache), key), threading.Lock())
        with building:
            with _LOCK:
                if key in cache:
                    cache.move_to_end(key)
                    return cache[key]
                if _BUILDING.get((id(cache), key)) is not building:
                    continue               # the builder failed or the caches were cleared
            try:
                value = make()
            except BaseException:
                with _LOCK:                # waiters retry (and see the same error themselves)
                    if _BUILDING.get((id(cache), key)) is building:
                        del _BUILDING[(id(cache), key)]
                raise
            with _LOCK:                    # publish and release in one step
                if _BUILDING.get((id(cache), key)) is building:
                    del _BUILDING[(id(cache), key)]
                    cache[key] = value
                    while len(cache) > _CACHE_SIZE:
                        cache.popitem(last=False)
            return value


_CAPTURE = threading.Lock()          # torch.fx tracing is not thread-safe: one capture at a time


def _captured(build):
    """Run a model capture under :data:`_CAPTURE`."""
    def make():
        with _CAPTURE:
            return build()
    return make


def parse_model_args(text: str) -> dict:
    """``"depth=101, width=8"`` -> ``{"depth": "101", "width": "8"}`` (builders coerce)."""
    out = {}
    for part in (text or "").replace(";", ",").split(","):
        part = part.strip()
        if not part:
            continue
        k, eq, v = part.partition("=")
        if not eq or not k.strip():
            raise ValueError(f"model argument {part!r}: write KEY=VALUE, e.g. depth=101")
        out[k.strip()] = v.strip()
    return out


def graph_for(req: Request) -> LayerGraph:
    """The request's layer graph (cached here and in the capture cache)."""
    return _lru(_GRAPHS, req.graph_key(), _captured(
        lambda: capture_cache.layer_graph(req.model, req.batch, dict(req.model_args))))


def devices_for(req: Request) -> DeviceGraph:
    """The request's device graph."""
    return req.device_graph()


def cost_model_for(req: Request) -> CostModel:
    def make():
        return CostModel(graph_for(req), devices_for(req), compute=req.cost, sync=req.sync,
                         degrees=req.degrees)
    return _lru(_MODELS, req.cost_key(), make)


def summary(req: Request) -> dict:
    """Layers, parameters, FLOPs and activation memory of the request's model."""
    g = graph_for(req)
    s = g.summary()
    s["source"] = g.source
    return s


def problem_for(req: Request):
    """The request as a method's :class:`~explorer.engine.search.Problem`, whose captures
    come from this service's caches (each built once)."""
    from explorer.engine.search import Problem
    return Problem(req, devices_for(req), builders={
                       "layer_graph": lambda: graph_for(req),
                       "cost_model": lambda: cost_model_for(req),
                       "opgraph": lambda: opgraph_for(req),
                       "placement_graph": lambda cap: _placement_graph(req, cap)})


def methods(family: str | None = None) -> dict:
    """``{name: description}`` of the registered methods (one family or all)."""
    from explorer.engine.search import describe
    return describe(family)


def run_method(req: Request, algo: str | None = None, pins=None, options=None):
    """Run any registered method on the request: the :class:`Result`."""
    from explorer.engine.search import run
    return run(algo or req.algo, problem_for(req), pins, options)


_RESULTS: OrderedDict = OrderedDict()


def _layerwise_result(req: Request, algo: str, pins):
    """:func:`run_method`'s result, cached per request, method and pins while the request's
    cost model is the one it was searched with (the searches are deterministic): opening the
    same page again, or the page's plan again under Compare, does not search again."""
    from explorer.engine.search import METHODS
    if algo not in METHODS or METHODS[algo].family != "layerwise":
        return run_method(req, algo, pins)
    cm = cost_model_for(req)
    key = req.graph_key() + req.device_key() + (req.cost, req.sync, req.degrees, algo,
                                                 tuple(p if isinstance(p, str) else repr(p)
                                                       for p in pins or ()))
    with _LOCK:
        got = _RESULTS.get(key)
        if got is not None and got[0] is cm:
            _RESULTS.move_to_end(key)
            return got[1]
    res = run_method(req, algo, pins)
    with _LOCK:
        _RESULTS[key] = (cm, res)
        while len(_RESULTS) > _CACHE_SIZE:
            _RESULTS.popitem(last=False)
    return res


def search(req: Request, pins: list | None = None, algo: str | None = None,
           keep_trace: bool = False) -> dict:
    """Run layer-wise ``algo`` (default ``req.algo``) honouring ``pins``; the plan dict with
    its trace - or, with ``keep_trace``, with ``trace_ref`` instead (:func:`keep_trace`: the
    trace stays on the server and the page fetches one step at a time)."""
    res = _layerwise_result(req, algo or req.algo, pins)
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


# -- the Learn page: the papers' worked examples (explorer.engine.lessons) -------------------

def learn_elimination(req: Request) -> dict:
    """OptCNN Figures 5-6 on the request's model: every node and edge elimination of the
    optimal search with equations 2 and 3 evaluated at the plan's configurations."""
    from explorer.engine.lessons import elimination_steps
    res = run_method(req, "optcnn")
    out = elimination_steps(res.tables, res.trace, res.choice)
    out["request"] = req.to_dict()
    return out


def learn_dense(req: Request, layer: str | None = None) -> dict:
    """OptCNN Section 3 (Figure 2): the request's first fully-connected layer (or ``layer``)
    under data against channel parallelism on ``req.devices`` devices."""
    from explorer.engine.lessons import dense_layer
    g = graph_for(req)
    if layer is None:
        layer = next((n for n in g.names() if g.layer(n).op == "linear"), None)
        if layer is None:
            raise ExplorerError(f"{req.model} has no fully-connected layer")
    try:
        return dense_layer(g, cost_model_for(req).tables(), layer, req.devices)
    except ValueError as exc:
        raise ExplorerError(str(exc)) from None


def learn_conv1d(batch: int, ci: int, co: int, length: int, window: int, workers: int) -> dict:
    """Tofu Figures 1-3: conv1d's strategies found by the interval analysis."""
    from explorer.engine.lessons import conv1d_strategies
    try:
        return conv1d_strategies(int(batch), int(ci), int(co), int(length), int(window),
                                 int(workers))
    except (ValueError, TypeError) as exc:
        raise ExplorerError(str(exc)) from None


def learn_orders(chains: int, length: int, devices: int) -> dict:
    """Celeritas Figure 3: M-TOPO, DFS-TOPO and CPD-TOPO on parallel chains, and fusion."""
    from explorer.engine.lessons import topo_orders
    try:
        return topo_orders(int(chains), int(length), int(devices))
    except (ValueError, TypeError) as exc:
        raise ExplorerError(str(exc)) from None


_OPGRAPHS: OrderedDict = OrderedDict()
_TOFU: OrderedDict = OrderedDict()


def _after_fork_in_child():
    global _LOCK, _CAPTURE
    _LOCK = threading.RLock()          # a forked background job must not inherit a held lock
    _CAPTURE = threading.Lock()
    _BUILDING.clear()


if hasattr(__import__("os"), "register_at_fork"):
    __import__("os").register_at_fork(after_in_child=_after_fork_in_child)


def opgraph_for(req: Request):
    """The joint forward+backward operator graph of the request's model (cached here and in
    the capture cache; traced by one thread at a time)."""
    # build_opgraph traces one graph at a time with fresh torch.fx.traceback state
    return _lru(_OPGRAPHS, req.graph_key(), _captured(
        lambda: capture_cache.op_graph(req.model, req.batch, dict(req.model_args))))


def _tofu_result(req: Request, algo: str, pins=()):
    key = req.graph_key() + req.device_key() + (algo, tuple(pins or ()))
    return _lru(_TOFU, key, lambda: run_method(req, algo, list(pins or ())))


def tofu(req: Request, algo: str = "tofu", pins=()) -> dict:
    """Tofu (or a Section 7.3 baseline) on the request's model: the plan summary and steps,
    with the digest of the operator graph it was made on (its runs are stored under it)."""
    from explorer.engine.core.opgraph import opgraph_digest
    res = _tofu_result(req, algo, pins)
    doc = res.to_dict(tensors=False)
    doc["request"] = req.to_dict()
    doc["opgraph_digest"] = opgraph_digest(opgraph_for(req))
    return doc


def run_tofu(doc: dict, timeout_s: float = 600.0, memory_gib=None,
             progress=lambda v: None) -> dict:
    """Execute the Tofu plan the Tofu page shows (:func:`tofu`) on local gloo workers, one per
    worker of the plan (:func:`run_plan` on its sealed document, :func:`plan_file`): the
    reference check against one device (float64), bytes moved, step time and whatever the
    runtime measures per worker.  ``memory_gib``: the per-worker limit
    (``--memory-per-worker``).  Refuses, before launching, a run that would not fit in this
    machine's free memory.  The result carries ``plan_predicted_step_time_s`` (the plan's
    own prediction: time on the links) next to the runtime's fields."""
    from explorer.engine.core.plandoc import kind_of
    if not isinstance(doc, dict) or kind_of(doc) != "tofu" or "request" not in doc:
        raise ExplorerError("partition the model first, then run the Tofu plan")
    n = int(doc.get("devices") or 1)
    peaks = [float(x) for x in doc.get("peak_memory_bytes") or []]
    # float64 (twice the plan's float32 bytes) on every worker, full-size buffers in the worst
    # case, plus the single-device reference
    _check_free_memory(2.0 * (n + 1) * sum(peaks), "this Tofu plan",
                       f"float64, {n} workers and the reference")
    limit = _memory_bytes(memory_gib)
    progress(5)
    sealed = plan_file(doc)
    progress(20)
    out = run_plan(sealed, steps=3, timeout_s=timeout_s, verify=False,
                   memory_per_worker=limit)
    out["plan_predicted_step_time_s"] = float(doc.get("predicted_step_time_s") or 0.0)
    out["plan_peak_memory_bytes"] = peaks
    progress(95)
    return out


def tofu_strip(req: Request, algo: str = "tofu", upto: int | None = None) -> list:
    """Figure 11 blocks (weight and activation tile owners) after the first ``upto`` steps."""
    from explorer.engine.tofu import search as T
    return T.strip(_tofu_result(req, algo).plan, opgraph_for(req), upto=upto)


def tofu_compare(req: Request) -> dict:
    """Every Tofu-family algorithm's communication, time and memory (Figure 10)."""
    from explorer.engine.search import names
    out = {}
    for algo in names("tofu"):
        r = _tofu_result(req, algo)
        out[algo] = r.summary()
    return out


# -- device placement (Celeritas and its baselines) --------------------------------------------

_PLACE_GRAPHS: OrderedDict = OrderedDict()
_PLACEMENTS: OrderedDict = OrderedDict()


def _memory_bytes(memory_gib) -> float | None:
    if memory_gib in (None, ""):
        return None
    m = float(memory_gib)
    if not m > 0:
        raise ValueError(f"memory per device must be > 0 GiB, got {memory_gib}")
    return m * 2 ** 30


def placement_pins(pins: list | None) -> list:
    """The Placement page's pins ``[{"target", "ops", "device"}]`` as engine pins."""
    from explorer.engine.core.pins import from_placement_ui
    return from_placement_ui(pins)


def _placement_graph(req: Request, cap: float | None):
    from explorer.engine.placement.estimate import from_opgraph, measured_times

    def make():
        og, dev = opgraph_for(req), devices_for(req)
        times = measured_times(og, dev) if req.cost == "measured" else None
        return from_opgraph(og, dev, cap, times=times)
    return _lru(_PLACE_GRAPHS, req.graph_key() + req.device_key() + (cap, req.cost), make)


def placement_graph_for(req: Request, memory_gib=None):
    """The placers' input graph (Standard Evaluation of the operator graph), cached."""
    return _placement_graph(req, _memory_bytes(memory_gib))


def _placement_result(req: Request, algo: str, memory_gib=None, pins: list | None = None):
    cap = _memory_bytes(memory_gib)
    parsed = placement_pins(pins)
    opts = {} if cap is None else {"memory_per_device": cap}
    key = req.graph_key() + req.device_key() + (algo, cap, tuple(p.text() for p in parsed))
    return _lru(_PLACEMENTS, key, lambda: run_method(req, algo, parsed, opts))


def placement(req: Request, algo: str = "celeritas", memory_gib=None,
              pins: list | None = None) -> dict:
    """Place the request's forward+backward operator graph with ``algo`` (Celeritas or a
    baseline) honouring ``pins``: the result's JSON with its schedule (Gantt intervals).

    Every cluster gets ``shares`` (operators per device).  Baselines place operators, not
    clusters, so their graph is drawn over Celeritas' fused clusters (``clusters_from``), each
    coloured by the devices its operators landed on."""
    res = _placement_result(req, algo, memory_gib, pins)
    doc = res.to_dict(schedule=True)
    doc.pop("trace", None)
    doc["clusters_from"] = algo
    if not doc["clusters"]:
        doc["clusters"] = _placement_result(req, "celeritas", memory_gib,
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


def plan_file(doc: dict) -> dict:
    """The saved form of a plan the app shows, of any kind: a sealed plan document that
    ``explorer run`` executes without searching (a Tofu plan with its execution layout, a
    placement with its operator graph's digest).  Tofu and placement documents are rebuilt
    from the method's cached result for the document's request (the searches are
    deterministic)."""
    from explorer.engine.core.plandoc import kind_of, seal
    kind = kind_of(doc) if isinstance(doc, dict) and "error" not in doc else None
    if kind is None:
        raise ExplorerError("there is no plan to download: run a search first")
    if kind == "layerwise":
        return seal({k: v for k, v in doc.items()
                     if k not in ("trace", "trace_ref", "history_id", "checksum",
                                  "previous")}, kind)
    if not isinstance(doc.get("request"), dict):
        raise ExplorerError("this plan has no request to rebuild it from: search again")
    req = Request.from_dict(doc["request"])
    if kind == "tofu":
        res = _tofu_result(req, doc["algo"], tuple(doc.get("pins") or ()))
    else:
        res = _placement_result(req, doc["algo"], doc.get("memory_gib"),
                                placement_pin_rows(doc))
    return res.document()


def export(doc: dict, to: str = "torch") -> tuple:
    """``(file name, text)`` of a layer-wise plan exported as a program using PyTorch's own
    parallel APIs (:func:`explorer.engine.export.export_torch`).  ``doc``: a sealed document
    read from a file, or the app's plan (sealed here first)."""
    from explorer.engine.export import TARGETS, export_torch
    from explorer.engine.core.plandoc import kind_of
    if to not in TARGETS:
        raise ExplorerError(f"cannot export to {to!r}: --to {' or '.join(TARGETS)}")
    if isinstance(doc, dict) and "checksum" not in doc and kind_of(doc) == "layerwise":
        doc = plan_file(doc)
    return export_torch(doc)


def export_note(text: str, layers: int) -> str:
    """The line the app shows after an export: empty when every one of the ``layers`` layers
    is exported as planned, else how many are not and where the file says why."""
    from explorer.engine.export import not_as_planned, summary
    return summary(text, layers) if not_as_planned(text) else ""


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
            r = _placement_result(req, a, memory_gib, pins).plan
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


def run_plan(doc: dict, **opts) -> dict:
    """Execute a plan document of any kind (:func:`explorer.engine.runtime.dispatch.run_document`,
    which never searches) and store the run with its plan (``$EXPLORER_HOME/runs.sqlite``):
    its ``run_id`` is in the result."""
    from explorer.engine.runtime.dispatch import run_document
    from explorer.engine.runtime.store import RunStore, run_key
    out = run_document(doc, **opts)
    RunStore().add_safely(run_key(doc), out)
    return out


def _check_free_memory(need: float, what: str, why: str) -> None:
    """Refuse, before launching, a run of ``what`` that needs ``need`` bytes here (``why``:
    what they hold) when that is over 70 % of this machine's free memory."""
    import psutil
    free = float(psutil.virtual_memory().available)
    if need > 0.7 * free:
        raise ExplorerError(
            f"running {what} needs up to {need / 2**30:.1f} GiB here ({why}) but "
            f"{free / 2**30:.1f} GiB is free: choose a smaller batch or model to execute it on "
            f"this machine")


def run_placement(doc: dict, steps: int = 3, timeout_s: float = 600.0,
                  progress=lambda v: None) -> dict:
    """Execute a placement document (:func:`placement`) on local gloo workers, one per device
    of the placement (:func:`run_plan`, one compiled program per device): the reference check
    against one device, the bytes moved, and the measured step time next to the simulator's
    (per device: predicted busy time vs measured compute).  Refuses, before launching, a run
    that would not fit in this machine's free memory."""
    if not doc or "placement" not in doc or "request" not in doc:
        raise ExplorerError("place the model first, then run the placement")
    n = len(doc.get("capacity_bytes") or []) or (max(map(int, doc["placement"].values())) + 1)
    # the workers' simulated peaks plus the single-device reference step in this process
    _check_free_memory(2.0 * float(sum(doc.get("peak_memory_bytes") or [])), "this placement",
                       f"{n} workers and the reference")
    progress(5)
    # the app's document lives in memory (no checksum to verify)
    out = run_plan(doc, steps=max(1, int(steps)), timeout_s=timeout_s, verify=False)
    progress(95)
    return out


def runs(doc: dict, limit: int = 50) -> list:
    """Stored runs of this plan, of any kind (command line or app), newest first: when,
    workers, predicted and measured step time, their error and the reference verdict."""
    from explorer.engine.core.plandoc import kind_of
    from explorer.engine.runtime.store import RunStore, run_digests
    if not isinstance(doc, dict) or "error" in doc or kind_of(doc) is None:
        return []
    doc = {k: v for k, v in doc.items()
           if k not in ("trace", "trace_ref", "previous", "history_id")}
    # runs stored under the plan's current key, and under its earlier key formats
    first, *legacy = run_digests(doc)
    return RunStore().rows(first, limit, legacy=legacy, preset=doc.get("preset"))


def placement_runs(doc: dict, limit: int = 50) -> list:
    """Stored runs of this placement (:func:`runs`)."""
    if not doc or "placement" not in doc:
        return []
    return runs(doc, limit)


def cost_model_info(doc: dict | None) -> dict:
    """Which cost model made a plan's predictions: ``{"cost", "preset", "calibrated",
    "text"}``.  ``cost`` is ``analytic`` (roofline: FLOPs and bytes over the devices' peak
    rates) or ``measured`` (every layer's configurations profiled on this machine);
    ``calibrated`` says whether the ``local`` preset's rates were measured here
    (``explorer calibrate``, or Calibrate in the app) or are defaults."""
    doc = doc or {}
    req = doc.get("request") or {}
    info = doc.get("info") or {}
    cost = req.get("cost") or info.get("compute_cost") or "analytic"
    preset_name = doc.get("preset") or req.get("preset") or ""
    calibrated = None
    if preset_name == "local":
        from explorer.engine.core.devices import local
        try:
            calibrated = bool(local(int(doc.get("devices") or 1)).meta.get("calibrated"))
        except (ValueError, ExplorerError):
            calibrated = False
    if cost == "measured":
        text = ("measured: every layer's configurations were profiled on this machine, "
                "transfers use the " + ("calibrated" if calibrated else "default")
                + " link rates")
    elif preset_name == "local":
        text = ("roofline (FLOPs and bytes over peak rates), "
                + ("calibrated on this machine" if calibrated else
                   "uncalibrated: default rates, not this machine's"))
    else:
        text = (f"roofline (FLOPs and bytes over peak rates) of the {preset_name or '?'} "
                f"preset's devices, not this machine")
    return {"cost": cost, "preset": preset_name, "calibrated": calibrated, "text": text}


def calibrate_local(req: Request, quick: bool = True, progress=None) -> dict:
    """Measure this machine for the ``local`` preset (compute, memory, links) and profile
    every candidate configuration of ``req``'s model on ``req.devices`` local workers - what
    ``explorer calibrate --model`` does - then search ``req``'s layer-wise method on
    ``local`` with the measured costs.  ``progress(percent, message)`` follows the phases and
    the profiled shapes.  Returns ``{"calibration", "plan"}`` (the plan dict with its
    request)."""
    from explorer.engine.runtime.calibrate import calibrate
    say = progress or (lambda pct, msg: None)
    phase = {"n": 0}

    def message(msg):
        phase["n"] += 1
        say(min(5 + 10 * phase["n"], 30), msg)

    def profiled(done, total):
        say(30 + int(60 * done / max(total, 1)), f"profiling {done}/{total} layer shapes")
    graph_for(req)                                   # an unknown model fails before measuring
    cal = calibrate(req.devices, model=req.model, batch=req.batch,
                    model_args=dict(req.model_args), quick=quick, progress=message,
                    profiled=profiled)
    with _LOCK:                                      # local's rates changed: rebuild its costs
        for key in [k for k in _MODELS if "local" in k]:
            _MODELS.pop(key, None)
    say(92, "searching with the measured costs")
    algo = req.algo if _family(req.algo) == "layerwise" else "optcnn"
    local_req = Request.from_dict(dict(req.to_dict(), preset="local", cost="measured",
                                       algo=algo, cluster=None))
    plan = search(local_req)
    say(100, f"calibrated; {plan['algo']} searched on {local_req.devices} local workers with "
             f"measured costs")
    return {"calibration": cal, "plan": plan}


def _family(algo: str) -> str | None:
    from explorer.engine.search import METHODS
    return METHODS[algo].family if algo in METHODS else None


def clear_caches():
    with _LOCK:
        _BUILDING.clear()
        _RESULTS.clear()
        _PLACE_GRAPHS.clear()
        _PLACEMENTS.clear()
        _GRAPHS.clear()
        _MODELS.clear()
        _OPGRAPHS.clear()
        _TOFU.clear()


__all__ = ["Request", "search", "candidates", "compare", "scaling", "tiles", "summary",
           "layer_info", "plan_changes", "parse_model_args", "graph_for", "clear_caches",
           "opgraph_for", "tofu", "tofu_strip", "tofu_compare", "placement",
           "placement_compare", "placement_structure", "placement_pins", "placement_graph_for",
           "run_plan", "run_placement", "placement_runs", "cost_model_info", "calibrate_local",
           "keep_trace_steps", "trace_of", "trace_length", "trace_counts"]

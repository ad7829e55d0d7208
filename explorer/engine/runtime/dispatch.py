"""Executing a saved plan: one entry point for every plan kind, and no search.

:func:`run_document` opens a plan document (:func:`explorer.engine.core.plandoc.open_document`:
schema, version, checksum) and hands it to the executor its schema names:

==========================  ============================================================
``plan-explorer/layerwise`` the layer executor (:func:`.launcher.launch`)
``plan-explorer/tofu``      the operator-level executor with the document's execution
                            layout (:func:`.opexec.run_layout`)
``plan-explorer/placement`` the operator-level executor with the placement's layout
                            (:func:`.opexec.run_placement`)
==========================  ============================================================

Everything the run needs comes from the document; nothing is searched again.  A document
that cannot be run - unknown schema, newer version, edited after saving, a version-1 Tofu
plan without its layout, made for other devices or another model than the caller expects, or
whose model, batch and arguments now give another operator graph - is refused with one line
(:class:`~explorer.errors.PlanFileError` / :class:`~explorer.errors.InfeasiblePlan`) before any
worker starts.
"""

from __future__ import annotations

import json
import math

from explorer.errors import InfeasiblePlan, PlanFileError
from explorer.engine.core import plandoc
from explorer.engine.core import precision as P
from explorer.engine.core.geometry import ExecutionLayout

__all__ = ["read_document", "run_document", "run_tofu_documents"]


def read_document(path: str) -> dict:
    """The JSON object in ``path`` (:class:`PlanFileError` when it is missing, unreadable or
    not a plan document)."""
    try:
        with open(path) as fh:
            doc = json.load(fh)
    except FileNotFoundError:
        raise PlanFileError(f"plan file {path!r} not found: write one with `explorer search "
                            f"MODEL --devices N --preset local --out {path}`") from None
    except (OSError, ValueError) as exc:
        raise PlanFileError(f"cannot read plan {path!r}: {exc}") from None
    if not isinstance(doc, dict) or "schema" not in doc:
        raise PlanFileError(f"{path} is not a plan (write one with `explorer search --out`)")
    return doc


#: training steps a Tofu run takes at most: the first is its warm-up, and the second still
#: page-faults while the worker's allocator settles (its heap grows again once the first
#: step's kept tensors are freed: ~70,000 faults, 0.1 s of system time for a Wide-ResNet
#: worker, none by the third), so the median of the three after the first is a settled step
TOFU_STEPS = 4


def run_document(doc: dict, *, steps: int = 20, warmup: int = 5, timeout_s: float = 600.0,
                 check: bool = True, expect: dict | None = None, sync: str = "auto",
                 progress=None, fault: str | None = None, tol: float | None = None,
                 verify: bool = True, memory_per_worker: float | None = None,
                 train: bool = False, timeline: bool = False, device: str | None = None,
                 backend: str | None = None, gpus: int | None = None) -> dict:
    """Execute a plan document on local workers and check it against one device.

    ``expect`` (``model``, ``devices``, ``batch``, ``model_args``; ``None`` values ignored):
    refuse a plan made for anything else.  ``verify``: check the checksum (a document that
    comes from a file; the app's in-memory documents need not).  ``steps`` / ``warmup`` /
    ``sync`` / ``progress`` as :func:`.launcher.launch` for a layer-wise plan; a placement runs
    as one compiled program per device (:mod:`.compiled`), ``warmup`` + ``steps`` steps, a
    Tofu plan ``steps`` steps (at most
    ``TOFU_STEPS``) with every worker holding only its tiles, and reports its measured peak
    memory per worker and step time next to the plan's; each step repeats the first (checked
    against one reference step) unless ``train``: then each starts from the parameters the
    last one updated, checked against as many reference steps (a model whose training is
    chaotic, e.g. BatchNorm over two values, amplifies rounding step by step).
    ``memory_per_worker`` (bytes; Tofu plans and placements): refuse a plan predicted over it
    before launching, stop a run whose worker goes over it (:mod:`.memlimit`).
    ``timeline`` (placements): also run one traced step and return each worker's
    ``timeline`` (:func:`.compiled.timeline`).

    ``device`` (``cpu`` / ``cuda`` / ``auto``), ``backend`` (``auto`` / ``gloo`` / ``nccl``),
    ``gpus`` (how many GPUs): where the workers compute (:mod:`.devicemap`; default
    ``$EXPLORER_DEVICE``, else the GPUs when there are any); an impossible request is refused
    before anything starts.

    Precision: the document's ``dtype`` (``fp32`` when absent; ``expect["dtype"]`` refuses
    another), run as :mod:`explorer.engine.core.precision` says; ``bf16`` where the workers'
    device has no bfloat16 support is refused in one line before anything starts.  ``tol``
    (``None``): the precision's tolerance (1e-4 in fp32, 2e-2 in bf16).  Tofu plans and
    placements run in fp32 only so far (another dtype is refused in one line).

    Returns the executor's result with ``kind`` (the plan kind), ``warnings`` and ``noise``
    (:mod:`.noise`: the CPU stolen by other tenants, the machine's speed before and after, the
    steps' spread, and a one-line ``note`` when the timing is noisy); the caller stores it
    (:func:`.store.run_key`).
    """
    from explorer.engine.runtime.devicemap import requested
    from explorer.engine.runtime.noise import Monitor
    with requested(device, backend, gpus), Monitor() as watch:
        out = _run_document(doc, steps=steps, warmup=warmup, timeout_s=timeout_s,
                            check=check, expect=expect, sync=sync, progress=progress,
                            fault=fault, tol=tol, verify=verify,
                            memory_per_worker=memory_per_worker, train=train,
                            timeline=timeline)
    out["noise"] = watch.report(out.get("step_times_s"))
    return out


def _run_document(doc, *, steps, warmup, timeout_s, check, expect, sync, progress, fault, tol,
                  verify, memory_per_worker, train, timeline) -> dict:
    kind = plandoc.open_document(doc, verify=verify)
    _check_fields(doc, kind)
    if steps < 0 or warmup < 0:
        raise InfeasiblePlan(f"steps ({steps}) and warmup ({warmup}) must be ≥ 0")
    expect = {k: v for k, v in (expect or {}).items() if v is not None}
    dtype = _check_precision(doc, kind, expect)
    if tol is None:
        tol = P.tolerance(dtype)
    mem = {}
    if memory_per_worker is not None:
        from explorer.engine.runtime.memlimit import check_predicted
        if kind == "layerwise":
            raise InfeasiblePlan("--memory-per-worker applies to Tofu plans and placements "
                                 "(operator-level runs); a layer-wise run checks one device "
                                 "inside rank 0")
        if not float(memory_per_worker) > 0:
            raise InfeasiblePlan(f"--memory-per-worker must be > 0, got {memory_per_worker}")
        check_predicted(doc, float(memory_per_worker))
        mem = {"memory_limit": float(memory_per_worker)}
    if kind == "layerwise":
        from explorer.engine.runtime.launcher import launch
        out = launch(doc, steps=steps, warmup=warmup, timeout_s=timeout_s, check=check,
                     expect=expect, sync=sync, progress=progress, fault=fault, tol=tol,
                     store=False)
    elif kind == "tofu":
        out = _run_tofu(doc, expect, steps=max(1, min(int(steps), TOFU_STEPS)),
                        timeout_s=timeout_s, check=check, fault=fault, tol=tol, train=train,
                        **mem)
    else:
        out = _run_placement(doc, expect, steps=max(1, int(steps)), warmup=warmup,
                             timeout_s=timeout_s, check=check, fault=fault, tol=tol,
                             timeline=timeline, **mem)
    if mem:
        out["memory_per_worker_bytes"] = mem["memory_limit"]
    out["kind"] = kind
    out["dtype"] = dtype
    out.setdefault("warnings", [])
    return out


# --------------------------------------------------------------------------------------------

#: field -> (allowed types, what it should be); absent fields and None are checked elsewhere
_FIELDS = {"model": ((str,), "a model name"), "spec": ((str,), "a model spec"),
           "batch": ((int,), "a batch size"), "model_args": ((dict,), "an object of arguments"),
           "request": ((dict,), "an object"), "preset": ((str,), "a preset name"),
           "algo": ((str,), "a method name"), "layers": ((list,), "a list of layers"),
           "placement": ((dict,), "an object mapping operators to devices"),
           "layout": ((dict,), "an execution layout object")}


def _check_fields(doc: dict, kind: str) -> None:
    """A sealed document can still hold hand-written nonsense: one clear line for a field of
    the wrong type instead of a traceback deep in an executor."""
    for key, (types, what) in _FIELDS.items():
        v = doc.get(key)
        if v is not None and (not isinstance(v, types) or isinstance(v, bool)):
            raise PlanFileError(f"the plan's {key!r} is {type(v).__name__} {v!r:.40}, not "
                                f"{what}")
    if kind == "layerwise":
        for la in doc.get("layers") or []:
            if not isinstance(la, dict) or not isinstance(la.get("config"), dict) \
                    or not isinstance(la.get("devices"), list):
                raise PlanFileError(f"the plan's layer {str(la)[:60]!r} needs a 'config' object "
                                    f"and a 'devices' list")


def _check_precision(doc: dict, kind: str, expect: dict) -> str:
    """The document's precision, refused in one line where it cannot run here: a bad
    ``dtype`` field, another than ``--dtype`` asked for, bf16 where the workers' device has
    no bfloat16, or a Tofu plan or placement in anything but fp32."""
    try:
        dtype = P.of(doc)
    except ValueError as exc:
        raise PlanFileError(f"the plan's {exc}") from None
    want = expect.pop("dtype", None)
    if want is not None and P.check(want) != dtype:
        raise InfeasiblePlan(f"the plan is for --dtype {dtype}, not {P.check(want)}: search "
                             f"one with --dtype {P.check(want)}")
    if kind != "layerwise" and dtype != "fp32":
        raise InfeasiblePlan(f"{kind} plans run in fp32 only so far; this one is for "
                             f"{dtype}: search it with --dtype fp32, or a layer-wise plan")
    from explorer.engine.core.devices import worker_device_kind
    P.require_supported(dtype, worker_device_kind())
    return dtype


def _check_expect(what: str, model: str, spec: str | None, batch, model_args: dict, n: int,
                  expect: dict) -> None:
    """Refuse a plan made for another model, batch, model arguments or device count."""
    want = expect.get("model")
    if want is not None and want not in (model, spec):
        raise InfeasiblePlan(f"the {what} is for model {model!r}, not {want!r}: search one "
                             f"for {want} first")
    if expect.get("devices") is not None and int(expect["devices"]) != n:
        raise InfeasiblePlan(f"the {what} is for {n} devices, not --devices "
                             f"{expect['devices']}: search one for {expect['devices']} devices")
    if expect.get("batch") is not None and batch is not None and int(expect["batch"]) != batch:
        raise InfeasiblePlan(f"the {what} is for batch {batch}, not {expect['batch']}")
    if expect.get("model_args") is not None:
        a = {k: str(v) for k, v in expect["model_args"].items()}
        if a != {k: str(v) for k, v in model_args.items()}:
            raise InfeasiblePlan(f"the {what} is for model arguments {model_args}, not "
                                 f"{expect['model_args']}")


def _opgraph(what: str, doc: dict, model: str, batch, model_args: dict):
    """The model's operator graph now (from the capture cache when the search stored it: the
    workers trace their real model themselves); refused when the document's digest is
    another's."""
    from explorer.engine.core.capture_cache import op_graph
    from explorer.engine.core.opgraph import opgraph_digest
    g = op_graph(model, batch, model_args)
    saved = doc.get("opgraph_digest")
    now = opgraph_digest(g)
    if saved is not None and saved != now:
        raise InfeasiblePlan(
            f"the {what} does not match {model} (batch {batch}, arguments {model_args}) any "
            f"more: it was made on another operator graph (digest {saved}, now {now}; the "
            f"model code or the plan file changed): search it again")
    return g, now


def _int(v) -> int | None:
    return int(v) if isinstance(v, int) and not isinstance(v, bool) else None


def _tofu_layout(doc: dict, expect: dict) -> dict:
    """A Tofu document checked against the request and the model's operator graph now: what
    :func:`.opexec.run_layouts` runs (``spec``, ``batch``, ``model_args``, ``xplan``,
    ``digest``) and the graph ``g``."""
    for key in ("model", "devices"):
        if key not in doc:
            raise PlanFileError(f"the Tofu plan has no {key!r}: save it with `explorer search "
                                f"MODEL --algo tofu --out PLAN.json`")
    algo = doc.get("algo", "tofu")
    if "layout" not in doc:
        raise PlanFileError(
            f"the Tofu plan was saved without its execution layout (a version-1 file): save it "
            f"again with `explorer search {doc['model']} --devices {doc['devices']} --algo "
            f"{algo} --out PLAN.json`")
    n = _int(doc["devices"])
    if n is None or n < 1:
        raise PlanFileError(f"the Tofu plan's devices {doc['devices']!r} is not a worker count")
    margs = dict(doc.get("model_args") or {})
    batch = doc.get("batch")
    _check_expect("plan", doc["model"], None, batch, margs, n, expect)
    try:
        layout = ExecutionLayout.from_json(doc["layout"])
    except (ValueError, TypeError) as exc:
        raise PlanFileError(f"the plan's execution layout is malformed ({exc}): save the plan "
                            f"again with `explorer search --out`") from None
    if layout.workers != n:
        raise PlanFileError(f"the Tofu plan's layout is for {layout.workers} workers, the "
                            f"plan for {n}")
    if "opgraph_digest" not in doc:
        raise PlanFileError("the Tofu plan has no operator graph digest: save it again with "
                            "`explorer search --out`")
    g, digest = _opgraph("plan", doc, doc["model"], batch, margs)
    unknown = sorted(set(layout.held) - set(g.tensors))
    if unknown:
        raise PlanFileError(f"the Tofu plan's layout names tensor {unknown[0]!r}, which the "
                            f"model's operator graph does not have")
    wrong = [t for t, lay in layout.held.items() if lay.shape != tuple(g.tensors[t].shape)]
    if wrong:
        raise PlanFileError(f"the Tofu plan's layout gives tensor {wrong[0]!r} the shape "
                            f"{list(layout.held[wrong[0]].shape)}; the model's is "
                            f"{list(g.tensors[wrong[0]].shape)}")
    return {"spec": doc["model"], "batch": g.batch, "model_args": margs,
            "xplan": layout.to_plan(), "digest": digest, "g": g}


def _run_tofu(doc: dict, expect: dict, steps: int = 1, train: bool = False, **kw) -> dict:
    lay = _tofu_layout(doc, expect)
    from explorer.engine.runtime.opexec import TIMED_DTYPE, run_layout
    dtype = kw.pop("dtype", None) or TIMED_DTYPE
    predicted = tofu_prediction(doc, lay["g"], lay["xplan"], dtype,
                                progress=kw.pop("progress", None))
    out = run_layout(lay["spec"], lay["batch"], lay["model_args"], lay["xplan"],
                     digest=lay["digest"], steps=steps, train=train, dtype=dtype, **kw)
    return _tofu_report(out, doc, lay, steps, train, predicted)


def run_tofu_documents(docs: list, *, steps: int = 1, timeout_s: float = 600.0,
                       check: bool = True, tol: float = 1e-4, verify: bool = True,
                       dtype: str = "float64") -> list:
    """Several Tofu plan documents for one worker count in one launch
    (:func:`.opexec.run_layouts`: the processes start once, one reference per model): one
    result per document, as :func:`run_document`'s.  Every document is checked before any
    worker starts.  ``dtype`` float64 (default): the timed steps are the checked ones (one
    pass per plan)."""
    lays = []
    for doc in docs:
        kind = plandoc.open_document(doc, verify=verify)
        _check_fields(doc, kind)
        if kind != "tofu":
            raise InfeasiblePlan(f"run_tofu_documents runs Tofu plans, not a {kind} plan")
        lays.append(_tofu_layout(doc, {}))
    from explorer.engine.runtime.opexec import run_layouts
    steps = max(1, min(int(steps), TOFU_STEPS))
    outs = run_layouts([{k: v for k, v in lay.items() if k != "g"} for lay in lays],
                       steps=steps, timeout_s=timeout_s, check=check, tol=tol, dtype=dtype)
    return [dict(_tofu_report(out, doc, lay, steps, False,
                              tofu_prediction(doc, lay["g"], lay["xplan"], dtype)),
                 kind="tofu")
            for out, doc, lay in zip(outs, docs, lays)]


def _tofu_report(out: dict, doc: dict, lay: dict, steps: int, train: bool,
                 predicted: dict) -> dict:
    """A Tofu run's result next to its document's predictions."""
    n = int(doc["devices"])
    algo = doc.get("algo", "tofu")
    out.update(algo=algo, devices=n, steps=steps, train=bool(train), batch=lay["batch"],
               preset=doc.get("preset"),
               predicted_comm_bytes=float(doc.get("comm_bytes", 0.0)),
               peak_memory_bytes=list(doc.get("peak_memory_bytes") or []), **predicted)
    pred = out.get("predicted_step_time_s")
    if pred and out.get("measured_step_time_s"):
        out["rel_error"] = (pred - out["measured_step_time_s"]) / out["measured_step_time_s"]
    if predicted.get("compute_source", "").startswith("roofline") and \
            predicted["compute_source"] != "roofline at the calibrated GPU rates":
        out.setdefault("warnings", []).append(
            f"the predicted step time is an uncalibrated {predicted['compute_source']}: run "
            f"`explorer calibrate` and search the plan on the local preset to predict it from "
            f"operator shards measured on this machine")
    return out


def tofu_prediction_of(doc: dict, progress=None) -> dict:
    """:func:`tofu_prediction` of a Tofu plan document as its run will compute it (float32
    timed steps): what a search with measured costs reports, so that the search, the ranking
    and the run predict the same step."""
    from explorer.engine.runtime.opexec import TIMED_DTYPE
    lay = _tofu_layout(doc, {})
    return tofu_prediction(doc, lay["g"], lay["xplan"], TIMED_DTYPE, progress=progress)


def _link_seconds(doc: dict, bw: float) -> float:
    """Tofu's time on the links at this machine's calibrated bandwidth ``bw`` (the plan's
    recursion steps moved their bytes at the bandwidth of the search; ``local`` links are
    uniform), else the plan's own ``objective_s``."""
    steps = doc.get("steps") or []
    try:
        return float(sum(float(s["seconds"]) * float(s["bandwidth_Bps"]) / bw for s in steps
                         if float(s["seconds"]) > 0 and math.isfinite(float(s["bandwidth_Bps"]))))
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        return float(doc.get("objective_s") or 0.0)


def tofu_prediction(doc: dict, g, xplan: dict, dtype: str, progress=None) -> dict:
    """A Tofu plan's predicted step time on this machine: on a calibrated ``local`` preset,
    every operator's shards timed as the workers compute them (in ``dtype``, cached:
    :func:`.shardtime.predict_step`) plus the plan's communication time; otherwise the
    plan's own roofline compute + communication (``compute_source`` says which)."""
    comm = float(doc.get("objective_s") or 0.0)
    n = int(xplan["workers"])
    if doc.get("preset") == "local":
        from explorer.engine.core.devices import local
        dev = local(n)
        if dev.meta.get("device_kind") == "cuda":
            # shard rehearsal times CPU workers; on GPUs the plan's own costs (searched on this
            # calibrated local preset) are the prediction
            why = ("roofline at the calibrated GPU rates" if dev.meta.get("calibrated") else
                   "roofline at the local GPUs' default rates (not calibrated)")
        elif dev.meta.get("calibrated"):
            from explorer.engine.runtime.shardtime import comm_costs, predict_step, share_factor
            lat = float(dev.latency[0, 1]) if n > 1 else 0.0
            # shards timed under an earlier calibration (another state of the machine) are
            # not reused: the cache key names this one
            kind = f"{dev.devices[0].kind}@{dev.meta.get('calibrated_at')}"
            # the executor's own transfers at the calibrated point-to-point costs (a
            # calibration from before they were measured: the plan's link time + latency)
            costs = comm_costs(dev) if dev.meta.get("p2p") else None
            return predict_step(g, xplan, _link_seconds(doc, float(dev.bw[0, 1])) if n > 1
                                else comm, lat, dtype, kind, progress=progress, costs=costs,
                                share=share_factor(n))
        else:
            why = "roofline at the local preset's default rates (not calibrated)"
    else:
        why = f"roofline of the {doc.get('preset') or '?'} preset's devices, not this machine"
    compute = doc.get("predicted_compute_s")
    return {"predicted_step_time_s": doc.get("predicted_step_time_s"),
            "predicted_compute_s": compute,
            "predicted_compute_step_s": max(compute) if compute else None,
            "predicted_comm_s": comm, "compute_source": why}


def _run_placement(doc: dict, expect: dict, *, steps: int, warmup: int, **kw) -> dict:
    req = doc.get("request") or {}
    model = doc.get("model") or req.get("model")
    if not model or not isinstance(doc.get("placement"), dict) or not doc["placement"]:
        raise PlanFileError("the placement needs 'model' and 'placement': save placements with "
                            "`explorer search MODEL --algo celeritas --out PLAN.json`")
    batch = doc.get("batch") if doc.get("batch") is not None else req.get("batch")
    margs = doc.get("model_args")
    margs = dict((req.get("model_args") if margs is None else margs) or {})
    names = list(doc["placement"])
    try:
        devs = [int(doc["placement"][nm]) for nm in names]
    except (TypeError, ValueError):
        raise PlanFileError("the placement maps an operator to something that is not a "
                            "device number") from None
    # version 2: devices = count, preset = name; version 1 (and the app): devices = the
    # preset's name, n_devices or one capacity per device = the count
    n = _int(doc.get("devices")) or _int(doc.get("n_devices")) or \
        len(doc.get("capacity_bytes") or []) or (max(devs) + 1)
    preset = doc.get("preset") or (doc.get("devices") if isinstance(doc.get("devices"), str)
                                   else None)
    order = doc.get("order")           # the simulated schedule's order (older plans: none)
    if order is not None and not (isinstance(order, list) and len(order) == len(names) and
                                  all(isinstance(x, str) for x in order) and
                                  set(order) == set(names)):
        raise PlanFileError("the placement's 'order' must list every operator of its "
                            "'placement' once")
    _check_expect("placement", model, None, batch, margs, n, expect)
    g, _ = _opgraph("placement", doc, model, batch, margs)
    from explorer.engine.runtime.opexec import run_placement
    out = run_placement(model, g.batch, margs, names, devs, n, steps=steps, warmup=warmup,
                        g=g, order=order, **kw)
    pred = doc.get("predicted_step_time_s")
    out["predicted_step_time_s"] = pred
    if pred and out.get("measured_step_time_s"):
        out["rel_error"] = (pred - out["measured_step_time_s"]) / out["measured_step_time_s"]
    busy = [0.0] * n
    for o in (doc.get("schedule") or {}).get("ops", []):
        if 0 <= int(o["device"]) < n:
            busy[int(o["device"])] += float(o["end"]) - float(o["start"])
    saved = doc.get("busy_s")
    if not any(busy) and isinstance(saved, list) and len(saved) == n:
        busy = [float(b) for b in saved]       # the simulator's compute time per device
    peaks = doc.get("peak_memory_bytes")
    out.update(predicted_busy_s=busy, algo=doc.get("algo"), devices=n, steps=steps,
               batch=g.batch, preset=preset, cost=(doc.get("info") or {}).get("cost"),
               predicted_peak_memory_bytes=list(peaks) if isinstance(peaks, list) else None)
    if preset not in (None, "", "local"):
        out.setdefault("warnings", []).append(
            f"the placement was made for the {preset} preset: its predicted times are for "
            f"those devices, not this machine")
    return out

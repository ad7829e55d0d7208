"""Does the predicted order of plans hold when they run?  The ranking check.

For one request, every chosen method searches its plan; every plan runs on the local workers,
interleaved over several rounds (round 1 runs each plan once, then round 2, ...), so a slow
spell of a shared machine falls on all plans alike.  The report puts each plan's predicted
step beside its measured one (median over the rounds' step medians, and the minimum), ranks
them, and gives Kendall's τ between the two orders and the *regret* of trusting the
prediction: the measured step of the plan predicted fastest over the measured fastest, minus
one.  Every run's noise (:mod:`explorer.engine.runtime.noise`) is kept, and a ranking taken
under noise says so in one line.

The predictions are each family's own, on the same device graph and operator rates: equation 1
(layer-wise), the time on the links plus the slowest device's compute (Tofu), the simulated
schedule (placements) - ``basis`` names it per row.  :func:`compare_all` puts every family's
methods in one table without running them.
"""

from __future__ import annotations

import statistics

from explorer.engine.runtime.store import run_digests
from explorer.engine.search.request import Request
from explorer.errors import ExplorerError
from explorer.service.execution import run_plan
from explorer.service.results import family, result

__all__ = ["rank", "compare_all", "remeasure", "all_methods", "DEFAULT_METHODS", "kendall_tau", "regret"]

#: what is ranked unless ``methods`` says otherwise: the layer-wise baselines and search, Tofu,
#: and Celeritas with two of its baselines
DEFAULT_METHODS = ("data", "model", "owt", "megatron", "optcnn", "tofu", "celeritas",
                   "m-etf", "metis")

BASIS = {"layerwise": "equation 1", "tofu": "links + slowest compute",
         "placement": "simulated schedule"}


def basis(res) -> str:
    """What a result's predicted step rests on: its family's predictor, or, for a Tofu plan
    with measured costs, its operator shards timed here (:func:`.results.measured_tofu_step`)."""
    if res.family == "tofu" and "roofline_step_s" in (res.info or {}):
        return "shards timed here + exchanges"
    return BASIS[res.family]


def kendall_tau(predicted: list, measured: list) -> float | None:
    """Kendall's τ (τ-b: ties counted) between two orders; ``None`` below two plans."""
    if len(predicted) < 2:
        return None
    from scipy.stats import kendalltau
    tau = kendalltau(predicted, measured).statistic
    return None if tau != tau else float(tau)          # NaN: every value tied


def regret(predicted: list, measured: list) -> float | None:
    """Measured step of the plan predicted fastest over the fastest measured, minus one."""
    if not predicted:
        return None
    best_pred = min(range(len(predicted)), key=lambda i: (predicted[i], i))
    return float(measured[best_pred] / min(measured) - 1.0)


def rank(req: Request, methods=None, rounds: int = 3, steps: int = 5, warmup: int = 2,
         timeout_s: float = 600.0, progress=lambda msg: None) -> dict:
    """Search each of ``methods`` on ``req``, run every plan ``rounds`` times interleaved
    (``steps`` measured steps after ``warmup`` each; the first round also checks the plan
    against one device), and compare predicted and measured steps.

    Returns ``{"request", "rounds", "steps", "rows", "kendall_tau", "regret", "noisy",
    "noise_note", "max_steal"}``; each row has ``method``, ``family``, ``basis``,
    ``predicted_step_s``, ``measured_step_s`` (median of the rounds), ``measured_min_s``,
    ``rounds_s``, ``error`` (relative), ``reference_ok``, ``noisy`` - or ``failed`` with the
    one-line reason (a method that cannot plan this model, a run that failed)."""
    if req.preset != "local":
        raise ExplorerError(f"ranking runs every plan here, so it needs --preset local, not "
                            f"{req.preset}")
    if rounds < 1 or steps < 1 or warmup < 0:
        raise ValueError(f"rounds ({rounds}) and steps ({steps}) must be ≥ 1 and warmup "
                         f"({warmup}) ≥ 0")
    methods = list(methods or DEFAULT_METHODS)
    unknown = [m for m in methods if family(m) is None]
    if unknown:
        raise ValueError(f"unknown method(s) {', '.join(unknown)}: see `explorer search --help`")
    rows, docs = [], {}
    for m in methods:
        fam = family(m)
        row = {"method": m, "family": fam, "basis": BASIS[fam], "rounds_s": [], "noise": []}
        progress(f"searching {m}")
        try:
            res = result(req.replace(algo=m), m)
            row["predicted_step_s"] = float(res.predicted_step_time_s)
            row["basis"] = basis(res)
            docs[m] = res.document()
        except (ExplorerError, ValueError) as exc:
            row["failed"] = f"search: {exc}"
        rows.append(row)
    if all("failed" in row for row in rows):
        why = rows[0]["failed"].removeprefix("search: ")
        raise ExplorerError(f"no method could plan {req.model} on {req.devices} local workers"
                            f" - {rows[0]['method']}: {why}")
    for r in range(rounds):
        for row in rows:
            if "failed" in row:
                continue
            progress(f"round {r + 1}/{rounds}: running {row['method']}")
            try:
                out = run_plan(docs[row["method"]], steps=steps, warmup=warmup,
                               timeout_s=timeout_s, check=(r == 0))
            except (ExplorerError, ValueError) as exc:
                row["failed"] = f"run: {exc}"
                continue
            row["rounds_s"].append(float(out["measured_step_time_s"]))
            row["noise"].append(out.get("noise") or {})
            if r == 0:
                row["reference_ok"] = out.get("reference_ok",
                                              (out.get("reference") or {}).get("ok"))
    ranked = [row for row in rows if "failed" not in row and row["rounds_s"]]
    for row in ranked:
        row["measured_step_s"] = statistics.median(row["rounds_s"])
        row["measured_min_s"] = min(row["rounds_s"])
        row["error"] = (row["predicted_step_s"] - row["measured_step_s"]) / row["measured_step_s"]
        row["noisy"] = any(n.get("noisy") for n in row["noise"])
    pred = [row["predicted_step_s"] for row in ranked]
    meas = [row["measured_step_s"] for row in ranked]
    for key, values in (("predicted_rank", pred), ("measured_rank", meas)):
        order = sorted(range(len(values)), key=lambda i: (values[i], i))
        for place, i in enumerate(order, 1):
            ranked[i][key] = place
    steals = [n.get("steal") for row in ranked for n in row["noise"]
              if n.get("steal") is not None]
    notes = [n["note"] for row in ranked for n in row["noise"] if n.get("note")]
    noisy = bool(notes)
    return {"request": req.to_dict(), "rounds": rounds, "steps": steps, "warmup": warmup,
            "rows": rows, "kendall_tau": kendall_tau(pred, meas), "regret": regret(pred, meas),
            "max_steal": max(steals) if steals else None, "noisy": noisy,
            "noise_note": (f"noisy ranking: {len(notes)} of "
                           f"{sum(len(r['noise']) for r in ranked)} runs were noisy ("
                           + notes[0].removeprefix("noisy timing: ")
                           .removesuffix(" - compare these timings with care")
                           + ") - the measured order may not be the machine's")
            if noisy else None}


def all_methods() -> list:
    """Every family's comparison, in one list: the layer-wise baselines and OptCNN, Tofu and
    its baselines, Celeritas and its baselines (the registry's ``comparison`` of each)."""
    from explorer.engine.search import comparison
    return [m for fam in ("layerwise", "tofu", "placement") for m in comparison(fam)]


def _run_doc(res) -> dict:
    """What the run store keys the runs of result ``res`` by (``run_key``): its plan document
    with the operator graph's digest, unsealed and without the execution ``layout`` a Tofu
    file adds - no run key reads it, and it takes seconds on a large model (15 s of a warm
    comparison of Inception-v3 on 16 devices)."""
    doc = res.to_dict()
    if getattr(res.plan, "operator_level", False) and res.capture is not None:
        from explorer.engine.core.opgraph import opgraph_digest
        if callable(res.capture):           # as Result.document() does: built once
            res.capture = res.capture()
        doc["opgraph_digest"] = opgraph_digest(res.capture)
    return doc


def _stored_run(digests: list, preset: str | None) -> dict | None:
    """The newest stored run of the plan whose run digests are ``digests`` (its current
    key's, then its earlier formats'), or None."""
    from explorer.engine.runtime.store import RunStore
    try:
        first, *legacy = digests
        got = RunStore().rows(first, 1, legacy=legacy, preset=preset)
    except Exception:  # noqa: BLE001 - an unreadable store: no measurement to show
        return None
    return got[0] if got else None


_MEASURED = ("measured_step_s", "run_id", "run_time", "reference", "error")


def _measured(row: dict, preset: str | None) -> dict:
    """``row`` with the newest stored run of its plan (``run_digests``) beside its
    prediction: ``measured_step_s`` (``None`` without one), ``run_id``, ``run_time``,
    ``reference`` and ``error`` (relative)."""
    row = {k: v for k, v in row.items() if k not in _MEASURED}
    row["measured_step_s"] = None
    run = _stored_run(row.get("run_digests") or [], preset)
    if run and run.get("measured_ms"):
        row.update(measured_step_s=run["measured_ms"] / 1e3, run_id=run["id"],
                   run_time=run["time"], reference=run["reference"])
        row["error"] = (row["predicted_step_s"] - row["measured_step_s"]) / \
            row["measured_step_s"]
    return row


def remeasure(report: dict) -> dict:
    """A :func:`compare_all` report with every row's measured step read again from the run
    store (runs stored since, e.g. from a plan's page), without searching again: the plans
    are the report's."""
    preset = (report.get("request") or {}).get("preset")
    return {**report, "rows": [_measured(r, preset) if "run_digests" in r else dict(r)
                               for r in report.get("rows") or []]}


def compare_all(req: Request, methods=None, progress=lambda msg: None) -> dict:
    """One comparison across the families: every method of ``methods`` (default
    :func:`all_methods`) searched on ``req``, each row its predicted step time on the same
    device graph (``basis`` names the family's predictor), peak memory per device, bytes
    moved per step, search time, whether it fits, and - when this plan was run before (the
    run store, any kind) - the newest measured step beside the prediction.  Each row keeps
    its plan's ``run_digests``, so :func:`remeasure` reads the runs again without searching.

    Rows are ordered by predicted step (a plan that does not fit after those that do; a
    method that cannot plan the model last, with its one-line reason).  Nothing is run here:
    `explorer rank` runs them."""
    methods = list(methods or all_methods())
    unknown = [m for m in methods if family(m) is None]
    if unknown:
        raise ValueError(f"unknown method(s) {', '.join(unknown)}: see `explorer search --help`")
    req.device_graph()                  # an unknown preset is the request's error, said once
    rows = []
    for m in methods:
        fam = family(m)
        row = {"method": m, "family": fam, "basis": BASIS[fam]}
        progress(f"searching {m}")
        try:
            res = result(req.replace(algo=m), m)
        except (ExplorerError, ValueError) as exc:
            row["failed"] = str(exc)
            rows.append(row)
            continue
        row.update(batch=res.batch, predicted_step_s=float(res.predicted_step_time_s),
                   basis=basis(res),
                   peak_bytes=float(max(res.memory_per_device_bytes, default=0.0)),
                   comm_bytes=float(res.comm_bytes), search_time_s=float(res.search_time_s),
                   fits_memory=bool(res.fits_memory),
                   run_digests=run_digests(_run_doc(res)))
        rows.append(_measured(row, req.preset))
    if all("failed" in row for row in rows):
        raise ExplorerError(f"no method could plan {req.model} on {req.devices} devices - "
                            f"{rows[0]['method']}: {rows[0]['failed']}")
    rows.sort(key=lambda r: ("failed" in r, not r.get("fits_memory", False),
                             r.get("predicted_step_s", 0.0)))
    ok = [r for r in rows if "failed" not in r and r["fits_memory"]]
    batch = next((r["batch"] for r in rows if "batch" in r), req.batch)
    return {"request": {**req.to_dict(), "batch": batch}, "rows": rows,
            "best": ok[0]["method"] if ok else None}

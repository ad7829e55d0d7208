"""Running a registered method on a request, with the one result cache.

The searches are deterministic, so a method's result is a function of the request, the method,
its pins and its options — and of the capture it was made from: a result is reused while the
capture it rests on (the layer-wise cost model, or the operator graph) is the one cached now.
Opening the same page again, Compare after a search, or downloading a plan the page shows,
does not search again.
"""

from __future__ import annotations

import json

from explorer.engine.search.request import Request
from explorer.service.cache import Cache
from explorer.service.captures import cost_model_for, opgraph_for, problem_for

__all__ = ["methods", "family", "run_method", "result", "measured_tofu_step", "RESULTS"]

RESULTS = Cache("method results", size=32)


def methods(family: str | None = None) -> dict:
    """``{name: description}`` of the registered methods (one family or all)."""
    from explorer.engine.search import describe
    return describe(family)


def family(algo: str) -> str | None:
    """The family of method ``algo`` (``None`` for an unknown name)."""
    from explorer.engine.search import METHODS
    return METHODS[algo].family if algo in METHODS else None


def run_method(req: Request, algo: str | None = None, pins=None, options=None):
    """Run any registered method on the request, uncached: the :class:`Result`."""
    from explorer.engine.search import run
    res = run(algo or req.algo, problem_for(req), pins, options)
    if res.family == "tofu":
        measured_tofu_step(req, res)
    return res


def _pin_text(pin) -> str:
    if isinstance(pin, str):
        return pin
    text = getattr(pin, "text", None)
    return text() if callable(text) else repr(pin)


def result(req: Request, algo: str | None = None, pins=(), options: dict | None = None):
    """:func:`run_method`'s result, from the one cache when the same request, method, pins and
    options were run on the capture cached now."""
    algo = algo or req.algo
    fam = family(algo)
    if fam is None:                      # an unknown name: the registry's one-line error
        return run_method(req, algo, pins, options)
    capture = cost_model_for(req) if fam == "layerwise" else opgraph_for(req)
    key = req.cost_key() + (algo, tuple(_pin_text(p) for p in pins or ()),
                            json.dumps(options or {}, sort_keys=True, default=repr))

    def make():
        return capture, run_method(req, algo, list(pins or ()), options)
    return RESULTS.get(key, make, valid=lambda got: got[0] is capture)[1]


def measured_tofu_step(req: Request, res) -> None:
    """With ``--cost measured`` on a calibrated CPU ``local`` preset, a Tofu result's
    predicted step is the one its run will report: every operator's shards timed on this
    machine as the workers compute them, plus the plan's exchanges
    (:func:`explorer.engine.runtime.dispatch.tofu_prediction_of`) - the currency the other
    families' measured costs use.  Otherwise the search's own roofline stays.  Sets
    ``res.info["prediction"]`` to what the figure rests on."""
    if req.cost != "measured":
        return
    from explorer.errors import ExplorerError, NotCalibrated
    if req.dtype != "fp32":
        raise ExplorerError(f"--cost measured times a Tofu plan's operator shards in fp32 only "
                            f"(Tofu plans run in fp32), not {req.dtype}: use --cost analytic "
                            f"with --dtype {req.dtype}")
    if req.preset != "local":
        raise ExplorerError(f"--cost measured times a Tofu plan's operator shards on this "
                            f"machine: search it on --preset local, not {req.preset}")
    from explorer.engine.runtime.dispatch import tofu_prediction_of
    pred = tofu_prediction_of(res.document())
    if "not calibrated" in str(pred.get("compute_source")):
        raise NotCalibrated("--cost measured needs this machine's compute and link figures: "
                            "run `explorer calibrate` first")
    res.info["prediction"] = pred.get("compute_source")
    if pred.get("compute_source", "").startswith("operator shards") and \
            pred.get("predicted_step_time_s"):
        res.info["roofline_step_s"] = float(res.predicted_step_time_s)
        res.predicted_step_time_s = float(pred["predicted_step_time_s"])

"""Which costs a plan's predictions rest on, and calibrating this machine for the ``local``
preset from the app."""

from __future__ import annotations

from explorer.engine.search.request import Request
from explorer.errors import ExplorerError
from explorer.service.captures import forget_preset, graph_for
from explorer.service.layerwise import search
from explorer.service.results import family

__all__ = ["cost_model_info", "calibrate_local"]


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
    forget_preset("local")                          # local's rates changed: rebuild its costs
    say(92, "searching with the measured costs")
    algo = req.algo if family(req.algo) == "layerwise" else "optcnn"
    local_req = req.replace(preset="local", cost="measured", algo=algo, cluster=None)
    plan = search(local_req)
    say(100, f"calibrated; {plan['algo']} searched on {local_req.devices} local workers with "
             f"measured costs")
    return {"calibration": cal, "plan": plan}


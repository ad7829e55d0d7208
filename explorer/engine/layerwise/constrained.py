"""The registry's ``optcnn``: the paper's elimination search (:func:`.optcnn.solve`) under the
devices' memory (issue 28): the paper's plan when it fits, else the Lagrangian search of
:mod:`.stages` over configurations, recomputation and ZeRO stages."""

from __future__ import annotations

import time

import numpy as np

from explorer.engine.layerwise.optcnn import solve
from explorer.engine.layerwise.result import layerwise_result
from explorer.engine.search.options import OptCNNOptions
from explorer.engine.search.result import Result

__all__ = ["search", "constrain"]


def search(problem, pins=None, options: OptCNNOptions | None = None) -> Result:
    """Equation 1's optimum (Algorithm 1) when it fits in memory, else the fastest plan
    found that fits (:func:`constrain`)."""
    options = options or OptCNNOptions()
    cost_model = problem.cost_model()
    t0 = time.perf_counter()
    tables = cost_model.tables(pins)
    choice, trace, info = solve(tables)
    return constrain("optcnn", problem, cost_model, tables, choice, trace, info, options, t0,
                     pins)


def constrain(algo, problem, cost_model, tables, choice, trace, info, options, t0, pins):
    """The memory constraint (:mod:`.stages`): the plan ``choice`` of equation 1 when it
    fits (``options.saving == "when-needed"``), else the Lagrangian search over
    configurations, recomputation and ZeRO stages; when nothing fits, the plan of least
    memory found, ``fits_memory`` false and ``info.memory.why`` saying so in one line."""
    from explorer.engine.layerwise import stages
    from explorer.engine.layerwise.memory import plan_memory, CATEGORIES
    from explorer.engine.layerwise.result import memory_result
    devices = cost_model.devices
    settings = options.settings()
    cap = min(d.memory for d in devices.devices)
    if options.memory_limit_gib is not None:
        cap = min(cap, options.memory_limit_gib * 2 ** 30)
    plain = {n: 0 for n in tables.names}
    mem = plan_memory(cost_model, tables, choice, plain, settings, devices.n)
    peak = float(np.max(np.sum([mem[k] for k in CATEGORIES], axis=0)))
    if peak <= cap and options.saving == "when-needed":
        res = layerwise_result(algo, problem.layer_graph(), devices, cost_model, tables,
                               choice, trace, info, time.perf_counter() - t0, pins)
        res.plan.memory_by_category = {"optimizer_kind": settings.optimizer, **mem}
        res.memory_per_device_bytes = res.plan.memory_per_device_bytes = \
            np.sum([mem[k] for k in CATEGORIES], axis=0).tolist()
        res.fits_memory = res.info["fits_memory"] = bool(peak <= cap)
        res.info["memory"] = {"limit_bytes": cap, "constrained": False,
                              "optimizer": settings.optimizer}
        return res
    ev = stages.Evaluator(cost_model, tables, settings, cap)
    best, smallest, linfo = stages.lagrangian(ev)
    plan = best or smallest
    minfo = {"limit_bytes": cap, "constrained": True, "optimizer": settings.optimizer,
             "unconstrained_peak_bytes": peak, **linfo}
    if best is None:
        minfo["why"] = (
            f"no {algo} plan fits {cap / 2**30:.3g} GiB per device: the smallest footprint "
            f"found needs {smallest.peak / 2**30:.3g} GiB on a device (with "
            f"{'recomputation, ' if settings.recompute else ''}ZeRO up to stage "
            f"{settings.zero}, optimizer {settings.optimizer}); use more devices, a smaller "
            f"--batch, --algo pipeline, or --ignore-memory to see it anyway")
    info = dict(info, memory=minfo)
    return memory_result(algo, problem, cost_model, tables, plan, settings, ev, info,
                         time.perf_counter() - t0, pins, trace if plan.lam == 0 else [])



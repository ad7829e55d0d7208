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
    return constrain("optcnn", problem, cost_model, tables, None, None, None, options, t0,
                     pins)


def constrain(algo, problem, cost_model, tables, choice, trace, info, options, t0, pins):
    """The memory constraint (:mod:`.stages`): the plan of equation 1 when it fits
    (``options.saving == "when-needed"``), else the Lagrangian search over configurations,
    recomputation and ZeRO stages; when nothing fits, the plan of least memory found,
    ``fits_memory`` false and ``info.memory.why`` saying so in one line.

    ``choice``/``trace``/``info`` are equation 1's plan from :func:`.optcnn.solve`, or
    ``None`` to have it found here.  On a chain of repeated blocks
    (:func:`.stages.repeated_chain`) an equation-1 optimum is first found by the chain
    search (:class:`.stages.Evaluator` with the plain option only, seconds faster at
    hundreds of layers), and Algorithm 1 runs (for its plan and trace) only when that
    optimum fits; on other graphs Algorithm 1 runs first, as before.  When it does not, the constrained search
    starts at once: any other equation-1 optimum that fits (a tie) is one the Lagrangian
    finds at the smallest λ."""
    from explorer.engine.layerwise import stages
    from explorer.engine.layerwise.memory import plan_memory, CATEGORIES
    from explorer.engine.layerwise.result import memory_result
    devices = cost_model.devices
    settings = options.settings()
    cap = min(d.memory for d in devices.devices)
    if options.memory_limit_gib is not None:
        cap = min(cap, options.memory_limit_gib * 2 ** 30)
    plain = {n: 0 for n in tables.names}

    def peak_of(ch):
        m = plan_memory(cost_model, tables, ch, plain, settings, devices.n)
        return m, float(np.max(np.sum([m[k] for k in CATEGORIES], axis=0)))

    if choice is None and not stages.repeated_chain(tables):
        choice, trace, info = solve(tables)          # Algorithm 1 first, as the paper does
    ev = stages.Evaluator(cost_model, tables, settings, cap) if choice is None else None
    mem = peak = None
    early = (None, None)
    if choice is None:
        first, mem, peak, early = _first(ev, settings, peak_of, devices.n)
        if peak <= cap and options.saving == "when-needed":
            choice, trace, info = solve(tables)
            mem = peak = None
        else:
            info = {"residual_method": "chain of repeated blocks (equation 1's optimum "
                                       "does not fit: no elimination trace)"}
            trace = []
    if mem is None:
        mem, peak = peak_of(choice)
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
    ev = ev or stages.Evaluator(cost_model, tables, settings, cap)
    best, smallest, linfo = stages.lagrangian(ev, *early)
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


#: the least devices at which the chain search evaluates equation 1's plan and the
#: Lagrangian's first two multipliers on two processes (each evaluation then takes about half
#: a second; below, a fork and the kernels' loading cost more than they save)
FORK_DEVICES = 256


def _first(ev, settings, peak_of, n_devices: int):
    """Equation 1's optimum by the chain search (the plain option only, ``λ = 0``), its
    memory and peak, and the Lagrangian's first two evaluations ``(λ = 0, the least-memory
    price)`` when they were made beside it: from :data:`FORK_DEVICES` a forked child
    evaluates equation 1's plan while this process makes those two, which the Lagrangian
    needs whenever that plan does not fit (the same evaluations as one process makes, so the
    same search)."""
    from explorer.engine.core import forked
    from explorer.engine.layerwise import stages, xkernel
    mask = np.array([o == (False, 0) for o in settings.options()])

    def plain_optimum():
        ev.option_mask = mask
        try:
            first = ev.evaluate(0.0)
        finally:
            ev.option_mask = None
        mem, peak = peak_of(first.choice)
        return first, mem, peak

    pair = forked.team(None if n_devices >= FORK_DEVICES else 1,
                       prepare=lambda: xkernel.preload(ranges=True))
    if pair.processes == 1:
        return (*plain_optimum(), (None, None))
    try:
        with xkernel.threads(1):
            if pair.child:
                pair.send(plain_optimum())
            else:
                e0 = ev.evaluate(0.0)
                top = None if e0.fits else ev.evaluate(stages.top_price(e0))
                first, mem, peak = pair.recv()
    except BaseException as exc:
        pair.close(exc)                    # the child leaves here
        raise
    pair.close()                           # the child leaves here
    return first, mem, peak, (e0, top)

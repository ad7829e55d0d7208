"""Standard Evaluation (Celeritas Section 4.2): per-operator compute time and memory.

* **Time** - analytic for preset devices: a roofline ``max(flops / (peak·eff), bytes / mem_bw)``
  plus a kernel launch, 0 for views (no kernel).  On the local CPU it can be *measured* by
  running the training step operator by operator with real tensors (:func:`measure_ops`).
* **Memory** - each operator's output (views share storage: 0); parameters, buffers and inputs
  become nodes of their own, as TensorFlow's ``Variable`` nodes are.  The paper's *linear
  regression per operator over several small batch sizes, extrapolated to the target batch*
  is :func:`regress`; :func:`memory_regression` fits it on measured (or fake-tensor) sizes at
  small batches and reports the relative deviation against the target batch's exact sizes.
* **Communication** - ``t = k·d + b`` from the device graph (see :mod:`.placement_graph`).
"""

from __future__ import annotations

import math
import statistics
import time

import numpy as np

from explorer.engine.core.roofline import LAUNCH_S, VIEW_OPS, analytic_times  # noqa: F401 - re-exported
from explorer.engine.placement.placement_graph import PlacementGraph

__all__ = ["VIEW_OPS", "analytic_times", "from_opgraph", "regress", "memory_regression",
           "measure_ops", "time_regression", "measured_times"]


def _placeholder_kind(tensor) -> str:
    return tensor.kind if tensor.kind in ("param", "buffer", "input") else "input"


#: what the autograd engine emits to sum the gradients of a tensor read more than once
_ACCUMULATE = frozenset({"add", "add_"})


def colocation_groups(og, names: list) -> np.ndarray:
    """Co-location group per node: a forward op with its backward ops (``Op.fwd``), a
    parameter with the updates of it, the update chain with the gradient it consumes.
    Returns group ids (-1 = none) aligned with ``names``.

    ``Op.fwd`` comes from autograd's sequence number, and the autograd engine's *gradient
    accumulations* (the ``add`` summing the gradients of a tensor read by several operators:
    every branch point of an Inception block, a weight shared by all time steps of an RNN,
    a residual stream) carry the sequence number of whatever forward op was last - the loss
    ``add`` - so taking ``fwd`` at face value puts every accumulation of the whole backward
    pass into the loss op's group (35 ops / 14 GiB on Inception-v3, 772 on the LSTM), one
    device that every block's gradients must then visit and leave.  A backward op is
    therefore kept with its ``fwd`` unless it is an ``add`` that is not *linked* to it (reads
    no input or output of that op, no gradient of one of them, no output of a linked
    backward op of the same op): such an ``add`` is a gradient accumulation, and - as
    TensorFlow's ``colocate_gradients_with_ops`` colocates the aggregation of ``t``'s
    gradients with the op producing ``t`` - it joins the group of the producer of the tensor
    whose gradients it sums (the parameter's group for a shared weight), else no group.
    """
    idx = {nm: i for i, nm in enumerate(names)}
    group = np.full(len(names), -1, dtype=np.int64)
    gid: dict = {}
    tensors, ops = og.tensors, og.ops

    def g_of(key):
        if key not in gid:
            gid[key] = len(gid)
        return gid[key]

    pos = {nm: k for k, nm in enumerate(ops)}   # trace (topological) position
    linked: set = set()                 # backward ops kept with their fwd
    accum_of: dict = {}                 # accumulation op -> tensor whose grads it sums
    for op in ops.values():
        i = idx[op.name]
        if op.phase == "forward":
            group[i] = g_of(op.name)
            continue
        if op.phase != "backward" or op.fwd is None or op.fwd not in idx:
            continue
        f = ops[op.fwd]
        near = set(f.inputs)
        near.add(f.output)
        ok = op.target not in _ACCUMULATE
        for x in op.inputs:
            if ok:
                break
            t = tensors[x]
            ok = x in near or t.grad_of in near or (
                t.producer in linked and ops[t.producer].fwd == op.fwd)
        if ok:
            linked.add(op.name)
            group[i] = g_of(op.fwd)
            continue
        # a gradient accumulation: the summed tensor is the earliest-produced one among the
        # tensors its inputs are gradients of (the others lie downstream of it, their
        # gradients reaching it through identity backward ops such as a residual add's)
        cands = set()
        for x in op.inputs:
            t = tensors[x]
            tg = t.grad_of if t.grad_of is not None else accum_of.get(t.producer)
            if tg is not None and tg in tensors:
                cands.add(tg)
        target = min(cands, key=lambda x: (pos.get(tensors[x].producer, -1), x), default=None)
        accum_of[op.name] = target
        if target is None:
            continue
        tp = tensors[target].producer
        if tp is None:
            if tensors[target].kind == "param" and target in idx:
                group[i] = g_of(target)
                group[idx[target]] = g_of(target)
        elif tp in idx and ops[tp].phase == "forward":
            group[i] = g_of(tp)
    for op in og.ops.values():            # updates: with the parameter, else their input
        if op.phase != "update":
            continue
        i = idx[op.name]
        params = [x for x in op.inputs if og.tensors[x].kind == "param"]
        if params:
            group[i] = g_of(params[0])
            group[idx[params[0]]] = g_of(params[0])
            continue
        for x in op.inputs:
            p = og.tensors[x].producer
            if p is not None and group[idx[p]] >= 0:
                group[i] = group[idx[p]]
                break
    return group


def from_opgraph(og, devices, capacity=None, times: dict | None = None,
                 memory: dict | None = None, colocate: bool = True,
                 dtype: str = "fp32") -> PlacementGraph:
    """The :class:`PlacementGraph` of an :class:`~explorer.engine.core.opgraph.OpGraph`.

    Parameters
    ----------
    og : OpGraph
        Joint forward + backward + update graph (fake tensors).
    devices : DeviceGraph
    capacity : float or array, optional
        Memory limit per device (bytes); default: each device's memory.
    times : dict, optional
        Operator name -> seconds (e.g. measured or regressed); replaces the roofline for those.
    memory : dict, optional
        Operator name -> bytes (e.g. regressed); replaces the output size for those.
    colocate : bool
        Add co-location groups (:func:`colocation_groups`), as TensorFlow graphs have.
    dtype : str
        The step's precision: operators compute at the devices' rate in it; tensor sizes are
        ``og``'s (a bf16 request's graph has 2-byte activations,
        :func:`explorer.engine.core.precision.at_precision`).
    """
    ph = [t for t in og.tensors.values() if t.producer is None]
    ops = list(og.ops.values())
    names = [t.id for t in ph] + [op.name for op in ops]
    idx = {nm: i for i, nm in enumerate(names)}
    n = len(names)
    out_bytes = np.zeros(n)
    mem = np.zeros(n)
    flops = np.zeros(n)
    nbytes = np.zeros(n)
    targets: list = []
    phase: list = []
    module: list = []
    persistent = np.zeros(n, dtype=bool)
    alias = np.full(n, -1, dtype=np.int64)
    src, dst = [], []
    for i, t in enumerate(ph):
        out_bytes[i] = mem[i] = t.bytes
        targets.append(_placeholder_kind(t))
        phase.append("source")
        module.append("")
        persistent[i] = t.kind in ("param", "buffer")
    base = len(ph)
    grads = set(og.param_grads.values())
    read = {x for op in ops for x in op.inputs}
    for j, op in enumerate(ops):
        i = base + j
        out = og.tensors[op.output]
        out_bytes[i] = out.bytes
        targets.append(op.target)
        phase.append(op.phase)
        module.append(op.module)
        flops[i] = op.flops
        ins = [og.tensors[x] for x in op.inputs]
        nbytes[i] = sum(x.bytes for x in ins) + out.bytes
        view = op.target in VIEW_OPS
        mem[i] = 0.0 if view else out.bytes
        # parameter gradients and the optimizer's results (updated parameters, its state:
        # the step's outputs) persist (the liveness rule, .memory); the update's
        # temporaries (lr·grad) are freed after their last reader like any other tensor
        persistent[i] = op.output in grads or (out.kind == "update" and op.output not in read)
        for k, x in enumerate(ins):
            p = x.producer if x.producer is not None else x.id
            if p == op.name or p not in idx:
                continue
            src.append(idx[p])
            dst.append(i)
            if view and k == 0:
                alias[i] = idx[p]
    w = analytic_times(flops, nbytes, targets, devices, dtype)
    if times:
        for nm, s in times.items():
            if nm in idx:
                w[idx[nm], :] = s
    if memory:
        for nm, b in memory.items():
            if nm in idx:
                mem[idx[nm]] = max(float(b), 0.0)
    group = colocation_groups(og, names) if colocate else None
    return PlacementGraph(names, w, mem, out_bytes, np.array(src, dtype=np.int64),
                          np.array(dst, dtype=np.int64), devices, capacity, persistent, alias,
                          {"target": targets, "phase": phase, "module": module},
                          {"model": og.model, "batch": og.batch}, group)


def measured_times(og, devices, progress=None, dtype: str = "fp32") -> dict:
    """Every operator's time measured on this machine for the ``local`` preset (``--cost
    measured``): the step's aten calls timed as the placement's workers run them - compiled,
    one thread, in as many processes side by side as the workers keep cores busy - cached in the
    profile SQLite (:func:`explorer.engine.core.profile.op_times` with ``in_step``), so the
    placers, the simulator and ``explorer run`` see the same hardware.  :class:`~explorer.errors.NotCalibrated` for
    another preset or before ``explorer calibrate`` (the links' latency and bandwidth come
    from there)."""
    from explorer.errors import ExplorerError, NotCalibrated
    from explorer.engine.core.profile import op_times
    if dtype != "fp32":
        raise ExplorerError(f"--cost measured times a placement's operators in fp32 only (a "
                            f"placement runs in fp32), not {dtype}: use --cost analytic with "
                            f"--dtype {dtype}")
    if getattr(devices, "name", None) != "local":
        raise NotCalibrated(f"--cost measured times operators on this machine, so it needs "
                            f"--preset local; the {getattr(devices, 'name', '?')} preset's "
                            f"devices are not here (use --cost analytic)")
    if not (devices.meta or {}).get("calibrated"):
        raise NotCalibrated("--cost measured needs this machine's link and compute figures: "
                            "run `explorer calibrate` first")
    # as many processes as the workers keep cores busy at once: more workers than cores
    # time-share them, which the simulator models (processor sharing), not the op times
    busy = min(len(devices.devices), int((devices.meta or {}).get("cores") or
                                         len(devices.devices)))
    from explorer.engine.runtime.compiled import instep_op_times
    times, _ = op_times(og, devices.devices[0].kind, progress=progress, in_step=max(1, busy),
                        measure=instep_op_times)
    return times


# ------------------------------------------------------------------------------------------
# Linear regression over small batches (Section 4.2.1, first step)
# ------------------------------------------------------------------------------------------


def regress(batches, values, target_batch: float) -> np.ndarray:
    """Per-row least-squares line ``y = a + b·batch`` over ``batches``, evaluated at
    ``target_batch`` and clipped at 0.

    ``values`` has shape ``(n, len(batches))``; vectorised over the n operators.
    """
    x = np.asarray(batches, dtype=np.float64)
    y = np.asarray(values, dtype=np.float64)
    if y.ndim != 2 or y.shape[1] != len(x):
        raise ValueError(f"values must have shape (n, {len(x)}), got {y.shape}")
    if len(set(x.tolist())) < 2:
        raise ValueError(f"a linear fit needs at least two distinct batch sizes, got {x.tolist()}")
    xm = x.mean()
    ym = y.mean(axis=1)
    slope = ((x - xm)[None, :] * (y - ym[:, None])).sum(axis=1) / ((x - xm) ** 2).sum()
    return np.maximum(ym + slope * (target_batch - xm), 0.0)


def _deviation(est: np.ndarray, actual: np.ndarray) -> dict:
    """Relative deviation |d_e - d_a| / d_a over nodes with d_a > 0 (Section 6.3)."""
    mask = actual > 0
    if not mask.any():
        return {"mean": 0.0, "p90": 0.0, "exact_fraction": 1.0, "nodes": 0}
    dev = np.abs(est[mask] - actual[mask]) / actual[mask]
    return {"mean": float(dev.mean()), "p90": float(np.quantile(dev, 0.9)),
            "exact_fraction": float((dev < 1e-3).mean()), "nodes": int(mask.sum())}


def memory_regression(spec: str, target_batch: int, model_args: dict | None = None,
                      small_batches=(1, 2, 4, 8), measured: bool = False) -> dict:
    """Fit each operator's memory over ``small_batches`` and extrapolate to ``target_batch``.

    With ``measured=True`` the small-batch sizes come from really running the step on the CPU
    (:func:`measure_ops`: storage actually allocated by each operator), otherwise from the
    fake-tensor shapes.  The target batch's fake-tensor sizes are the reference.

    Returns ``{"memory": {name: bytes}, "deviation": {...}, "batches": [...]}``.
    """
    from explorer.engine.core.opgraph import build_opgraph
    target = build_opgraph(spec, target_batch, model_args)
    names = [op.name for op in target.ops.values()]
    cols = []
    for b in small_batches:
        g = build_opgraph(spec, b, model_args)
        if measured:
            m = measure_ops(g, reps=1)["memory"]
        else:
            m = {op.name: (0 if op.target in VIEW_OPS else g.tensors[op.output].bytes)
                 for op in g.ops.values()}
        cols.append([float(m.get(nm, np.nan)) for nm in names])
    y = np.array(cols).T
    ok = ~np.isnan(y).any(axis=1)
    est = regress(small_batches, np.nan_to_num(y), target_batch)
    actual = np.array([0.0 if op.target in VIEW_OPS else target.tensors[op.output].bytes
                       for op in target.ops.values()])
    return {"memory": {nm: float(e) for nm, e, k in zip(names, est, ok) if k},
            "deviation": _deviation(est[ok], actual[ok]), "batches": list(small_batches),
            "matched_ops": int(ok.sum()), "ops": len(names)}


# ------------------------------------------------------------------------------------------
# Measured per-operator time and memory on the local CPU
# ------------------------------------------------------------------------------------------


def _dtype_for(t):
    import torch
    return {8: torch.int64, 4: torch.float32, 2: torch.float16, 1: torch.bool}.get(
        t.itemsize, torch.float32)


def measure_ops(og, reps: int = 3, warmup: int = 1, seed: int = 0) -> dict:
    """Run one training step of ``og`` operator by operator with real CPU tensors.

    Every aten call runs ``warmup + reps`` times; the median of the timed runs is the op's
    time.  Memory is the storage the output really allocated (0 when it aliases an input).
    Operators that cannot be replayed (rare) are reported in ``failed`` and left out.

    Returns ``{"time": {name: s}, "memory": {name: bytes}, "failed": [names]}``.
    """
    import torch

    from explorer.engine.core.opgraph import TorchValue
    torch.manual_seed(seed)
    env: dict = {}
    for t in og.tensors.values():
        if t.producer is None:
            dt = _dtype_for(t)
            env[t.id] = (torch.zeros(t.shape, dtype=dt) if not dt.is_floating_point
                         else torch.randn(t.shape, dtype=dt) * 0.1)

    def sub(a):
        if isinstance(a, str) and a in env:
            return env[a]
        if isinstance(a, (list, tuple)):
            return type(a)(sub(x) for x in a)
        if isinstance(a, TorchValue):                 # a dtype, device... by name
            return a.value()
        return a

    times: dict = {}
    mem: dict = {}
    failed: list = []
    done: dict = {}
    for op in og.ops.values():
        key = (op.target, repr(op.args), repr(sorted(op.kwargs.items())))
        try:
            if key in done:
                res, secs = done[key]
            else:
                fn = getattr(torch.ops.aten, op.target)
                args, kwargs = sub(op.args), {k: sub(v) for k, v in op.kwargs.items()}
                for _ in range(warmup):
                    res = fn(*args, **kwargs)
                runs = []
                for _ in range(max(reps, 1)):
                    t0 = time.perf_counter()
                    res = fn(*args, **kwargs)
                    runs.append(time.perf_counter() - t0)
                secs = statistics.median(runs)
                done[key] = (res, secs)
            out = res[op.index] if isinstance(res, (tuple, list)) else res
            env[op.output] = out
            times[op.name] = secs if op.index == 0 or not isinstance(res, (tuple, list)) else 0.0
            in_ptrs = {env[x].untyped_storage().data_ptr() for x in op.inputs
                       if x in env and hasattr(env[x], "untyped_storage")}
            st = out.untyped_storage()
            mem[op.name] = 0.0 if st.data_ptr() in in_ptrs else float(st.nbytes())
        except Exception:  # noqa: BLE001 - replay is best effort; the op keeps its estimate
            failed.append(op.name)
            t = og.tensors[op.output]
            env[op.output] = torch.zeros(t.shape, dtype=_dtype_for(t))
    return {"time": times, "memory": mem, "failed": failed}


def time_regression(spec: str, small_batches=(1, 2, 4), check_batch: int = 8,
                    model_args: dict | None = None, reps: int = 3) -> dict:
    """Measured per-op time at ``small_batches``, regressed to ``check_batch`` and compared
    with the time measured there (the paper's time deviation, Table 5 / Figure 5b)."""
    from explorer.engine.core.opgraph import build_opgraph
    ref_g = build_opgraph(spec, check_batch, model_args)
    ref = measure_ops(ref_g, reps=reps)
    names = [nm for nm in ref["time"] if ref["time"][nm] > 0
             and ref_g.ops[nm].target not in VIEW_OPS]
    cols = []
    for b in small_batches:
        m = measure_ops(build_opgraph(spec, b, model_args), reps=reps)["time"]
        cols.append([m.get(nm, np.nan) for nm in names])
    y = np.array(cols).T
    ok = ~np.isnan(y).any(axis=1)
    est = regress(small_batches, y[ok], check_batch)
    actual = np.array([ref["time"][nm] for nm, k in zip(names, ok) if k])
    return {"deviation": _deviation(est, actual), "ops_timed": int(ok.sum()),
            "failed": len(ref["failed"]), "batches": list(small_batches),
            "check_batch": check_batch,
            "total_measured_s": float(actual.sum()), "total_estimated_s": float(est.sum())}


def summarize(pg: PlacementGraph) -> dict:
    """Totals for reports: nodes, edges, CCR, compute and memory."""
    return {"nodes": pg.n, "edges": pg.n_edges, "ccr": pg.ccr(),
            "compute_s": float(pg.w_ref().sum()), "memory_bytes": pg.total_memory(),
            "memory_gib": pg.total_memory() / 2 ** 30, "capacity_gib":
            [c / 2 ** 30 for c in pg.capacity.tolist()], "fits_one_device":
            bool(pg.total_memory() <= pg.capacity.max()) if math.isfinite(pg.total_memory())
            else False}

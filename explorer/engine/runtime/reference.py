"""The single-device reference step and the comparison with a distributed step - for both
executors: :func:`reference_step` (the layer executor's step of the model) and
:func:`traced_step` (the operator-level executor's traced training step), each compared by
:func:`compare`.

The rest of this note is about the layer executor.

Both sides train the same model from the same seeded weights on the same input, in **train
mode** (the graph the search captured: train-only branches included) with **deterministic
numerics** (:class:`explorer.engine.core.capture.deterministic`): dropout is the identity and
BatchNorm normalises with its running statistics (which therefore do not change), because
random masks cannot agree across processes, and batch statistics would make every sample
depend on the whole batch, which a sample-split plan could only reproduce with an extra
all-reduce the cost model does not know about.  Gradients are computed and one SGD step
(``p -= lr·grad``, no momentum) is taken.  The operator-level reference (:func:`traced_step`)
runs the traced step with dropout the identity too, but keeps BatchNorm's batch statistics
(Tofu partitions that reduction exactly).

Loss: :func:`explorer.engine.core.capture.loss_of` - ``Σ mean(o²)`` over every floating-point
output leaf (tuple, dict, ``ModelOutput``), or the model file's own ``loss(output)``.

Precision: the distributed run computes in the plan's precision (``dtype``: float32 by
default; ``bf16`` autocast with float32 master weights; ``tf32`` on CUDA,
:mod:`explorer.engine.core.precision`).  The reference is the same model, input and initial
weights on one process, run twice: in **float64** (the exact result of the step) and in the
plan's precision (what one device computes: float32, or float32 weights under bf16
autocast).  A float32 single-device run is not a good
yardstick on its own: on ResNet-50 its gradients differ from the exact ones by up to 3e-4
(relative), and on Inception-v3 a few tiny, ill-conditioned gradients (1e-4..1e-8 of the
largest) by several percent — the distributed run shows exactly the same errors there, since
float32 rounding, not the plan, decides them.

Criterion (loss, every parameter after the step, every gradient): the distributed run's
relative error against the exact step, ``max|a − b| / max|b|`` (the maximum over the tensor,
relative to the exact tensor's largest magnitude; gradients relative to at least
``GRAD_FLOOR`` × the model's largest gradient), must be at most ``max(tol,
ROUNDING_FACTOR × the float32 single-device run's error on that tensor)``, ``tol = 1e-4``.
In **tf32 and bf16** the allowance is ``LOW_PRECISION_FACTOR`` (2) × the single-device
run's error in the same precision, not 10×: in bf16 the exact step is 10-25 % away from
one device's bf16 step on some gradients of a plain MLP (the backward pass rounds every
activation gradient to 8 bits, and a weight gradient sums them over the batch), so ten
times that would pass anything.  A plan that rounds in another order (row-parallel partial
sums) lands about as far from the exact step as one device does, never twice as far, while
a wrong region, halo or shard is off by the gradient itself; and the tensors bf16 keeps
well (the last layers: a few 1e-3) are held to the tolerance, 2e-2.

Comparing gradients is the strict part: with ``lr = 0.01`` a parameter moves by ~1e-4 of its
size, so a parameter-only check would hide a wrong gradient.  A wrong region, halo, shard or
synchronisation gives errors of order 1 and fails.
"""

from __future__ import annotations

import torch

from explorer.engine.core import precision as P
from explorer.engine.core.capture import deterministic, float_leaves, loss_of

DEFAULT_TOL = 1e-4
#: Gradients are compared relative to max(max|ref grad|, GRAD_FLOOR · largest gradient of the
#: model): some gradients are zero up to rounding (the key bias of attention: softmax does not
#: change when a constant is added to every score), and rounding noise relative to ~0 means
#: nothing.
GRAD_FLOOR = 1e-3
#: the same for updated parameters, relative to the largest one: a zero bias whose gradient is
#: zero up to rounding (a BatchNorm's shift followed by another normalisation) stays zero up to
#: rounding, and a tile-local run sums in another order
PARAM_FLOOR = 1e-9
#: A tensor may differ from the exact result by up to this many times the error a float32
#: single-device run makes on it (float32 rounding, not the plan, decides there).
ROUNDING_FACTOR = 10.0
#: The same in tf32 and bf16, where the single-device run's own error is large (see above).
LOW_PRECISION_FACTOR = 2.0


def reference_step(model, x, lr: float, dtype=torch.float64, loss_fn=None,
                   precision: str = "fp32"):
    """``(loss, params_after, grads)`` of one train-mode, deterministic SGD step of ``model``
    on ``x`` (``loss_fn``: the model file's ``loss(output)``, default ``Σ mean(o²)``).

    ``dtype`` is the storage precision of the reference (the model and a floating-point input
    are converted first; ``None`` keeps them).  ``precision`` (fp32 | tf32 | bf16) is how the
    forward pass computes (:func:`explorer.engine.core.precision.autocast`, as the workers
    do): in bf16 the model's float32 weights are the master weights, the forward runs under
    autocast and the loss is summed in float32 outside it, as the workers sum it.  Modifies
    ``model`` in place: pass a copy if the model is needed afterwards.
    """
    if dtype is not None:
        model = model.to(dtype)
        if x.is_floating_point():
            x = x.to(dtype)
    model.train()
    for p in model.parameters():
        p.grad = None
    with deterministic(running_stats=True):
        if P.check(precision) == "fp32":
            loss = loss_of(model(x), loss_fn)
        else:
            with P.autocast(precision, x.device.type):
                out = model(x)
            if loss_fn is None:
                leaves = [o.float() for o in float_leaves(out)]
                loss = loss_of(leaves[0] if len(leaves) == 1 else tuple(leaves))
            else:
                loss = loss_of(out, loss_fn)
        loss.backward()
    with torch.no_grad():
        for p in model.parameters():
            if p.grad is not None:
                p.add_(p.grad, alpha=-lr)
    # the model's own tensors (no copies: the model is not used again, and fresh gigabyte
    # allocations cost seconds of page faults on a VM)
    grads = {n: p.grad.detach() for n, p in model.named_parameters() if p.grad is not None}
    params = {n: p.detach() for n, p in model.named_parameters()}
    return float(loss.item()), params, grads


def traced_step(g, params, buffers, x):
    """``(loss, params_after, None)`` of the traced training step of an operator graph
    (:func:`explorer.engine.core.opgraph.trace_step`: the step Tofu partitions and Celeritas
    places, in the precision ``params`` and ``x`` have) run whole on this process - the
    reference of the operator-level executor.  Gradients are not returned: that executor
    brings back the loss and the updated parameters only."""
    with deterministic(running_stats=False):                    # the step's (loss, grads, new)
        loss, _grads, new = g.gm(list(params), list(buffers), x)
    return float(loss), {pn: v.detach() for pn, v in zip(g.param_names, new)}, None


_CHUNK = 1 << 20
#: how :func:`compare` names the single-device run of each precision
_NAMES = {"fp32": "float32", "tf32": "tf32", "bf16": "bf16-autocast"}


def rel_err(a: torch.Tensor, b: torch.Tensor, floor: float = 0.0,
            scale: float | None = None) -> float:
    """``max|a − b| / max(max|b|, floor)`` (the absolute difference when both are 0).

    Computed in ``b``'s precision, a million elements at a time (small reused temporaries
    instead of tensor-sized ones).  ``scale``: ``max|b|`` when the caller knows it already.
    """
    if not a.numel():
        return 0.0
    a, b = a.detach().reshape(-1), b.detach().reshape(-1)
    d, known = 0.0, scale is not None
    scale = float(scale) if known else 0.0
    for i in range(0, a.numel(), _CHUNK):
        x, y = a[i:i + _CHUNK], b[i:i + _CHUNK]
        if x.dtype != y.dtype or x.device != y.device:
            x = x.to(device=y.device, dtype=y.dtype)
        diff = float(torch.sub(x, y).abs_().max().item())
        if diff != diff:               # NaN: a broken run, never within tolerance
            return float("nan")
        d = max(d, diff)
        if not known:
            scale = max(scale, float(y.abs().max().item()))
    scale = max(scale, floor)
    return d / scale if scale > 0 else d


def _absmax(t: torch.Tensor) -> float:
    t = t.detach().reshape(-1)
    return max((float(t[i:i + _CHUNK].abs().max().item()) for i in range(0, t.numel(), _CHUNK)),
               default=0.0)


def compare(loss, params, grads, ref, ref32=None, tol: float = DEFAULT_TOL,
            precision: str = "fp32", memo: dict | None = None) -> dict:
    """The reference check document.

    ``ref`` = ``(loss, params, grads)`` of the exact (float64) single-device step, ``ref32``
    the same in float32 (optional).  For the loss and every parameter and gradient, the
    distributed run's error against ``ref`` must be at most ``max(tol, ROUNDING_FACTOR ×
    the float32 single-device run's own error)``.  ``grads=None`` (a run that brings back
    only the loss and the updated parameters): parameters and loss only, and every
    parameter of ``ref`` must be there.  ``precision``: what ``ref32`` and the run computed
    in (fp32, tf32 or bf16; the ``float32_*`` fields then hold that single-device run's
    errors, and ``precision`` says so).  ``memo``: a dict kept with ``ref`` and ``ref32``
    across plans of one model - what depends on the references alone (each tensor's
    ``max|b|``, the float32 run's own errors, the floors) is computed once into it.
    """
    memo = {} if memo is None else memo
    ref_loss, ref_params, ref_grads = ref
    factor = ROUNDING_FACTOR if P.check(precision) == "fp32" else LOW_PRECISION_FACTOR
    check_grads = grads is not None and ref_grads is not None
    grads, ref_grads = grads or {}, ref_grads or {}
    problems, rows = [], []
    if "floors" not in memo:
        gmax = max((_absmax(g) for g in ref_grads.values() if g.numel()), default=0.0)
        memo["floors"] = (GRAD_FLOOR * gmax, PARAM_FLOOR * max(
            (_absmax(p) for p in ref_params.values() if p.numel()), default=0.0))
    floor, pfloor = memo["floors"]
    worst = {"param": (0.0, None), "grad": (0.0, None)}
    allowance_used = []
    ok = True

    def judge(kind, name, a, b, b32, fl=0.0):
        nonlocal ok
        key = (kind, name, fl)
        if key not in memo:            # the references' own figures: once per model
            bmax = _absmax(b)
            memo[key] = (bmax, rel_err(b32, b, fl, bmax) if b32 is not None else None)
        bmax, e32 = memo[key]
        e = rel_err(a, b, fl, bmax)
        allowed = max(tol, factor * e32) if e32 is not None else tol
        if not e <= allowed:           # NaN fails too
            ok = False
        elif e > tol:
            allowance_used.append(f"{kind} {name}")
        if e > worst[kind][0]:
            worst[kind] = (e, name)
        return e, e32, allowed

    for name, rp in ref_params.items():
        if name not in params:
            if not check_grads:
                problems.append(f"parameter {name} was not brought back by the run")
                ok = False
            elif name in ref_grads and _absmax(ref_grads[name]) > 0:
                problems.append(f"parameter {name} has a gradient in the reference but no layer "
                                f"of the plan owns it")
                ok = False
            continue
        r32p = ref32[1].get(name) if ref32 else None
        r32g = ref32[2].get(name) if ref32 and ref32[2] is not None else None
        pe, pe32, pa = judge("param", name, params[name], rp, r32p, pfloor)
        rg = ref_grads.get(name)
        if rg is None:
            rg = torch.zeros_like(rp)
        if not check_grads:
            ge, ge32, ga = None, None, None
        elif name in grads:
            ge, ge32, ga = judge("grad", name, grads[name], rg, r32g, floor)
        else:
            ge, ge32, ga = float("inf"), None, tol
            ok = False
        rows.append({"name": name, "param_rel_err": pe, "grad_rel_err": ge,
                     "float32_param_rel_err": pe32, "float32_grad_rel_err": ge32,
                     "allowed_param": pa, "allowed_grad": ga})
    loss_err = abs(loss - ref_loss) / max(abs(ref_loss), 1e-30) if loss is not None \
        else float("inf")
    loss32_err = abs(ref32[0] - ref_loss) / max(abs(ref_loss), 1e-30) if ref32 else None
    if not loss_err <= max(tol, factor * (loss32_err or 0.0)):
        ok = False
    if not rows:
        problems.append("no parameter was compared")
        ok = False
    doc = {"ok": bool(ok), "tolerance": tol, "rounding_factor": factor,
           "precision": "float64" + (f"+{_NAMES[P.check(precision)]}" if ref32 is not None
                                     else ""),
           "dtype": P.check(precision),
           "loss": loss, "loss_ref": ref_loss, "loss_rel_err": loss_err,
           "loss_float32": None if ref32 is None else ref32[0],
           "max_param_rel_err": worst["param"][0], "worst_param": worst["param"][1],
           "max_grad_rel_err": worst["grad"][0], "worst_grad": worst["grad"][1],
           "max_rel_error": max(loss_err, worst["param"][0], worst["grad"][0]),
           "params_compared": len(rows), "rounding_allowance_used": allowance_used,
           "problems": problems, "params": rows}
    if ref32 is not None:
        doc["float32_max_grad_rel_err"] = max(
            (r["float32_grad_rel_err"] for r in rows if r["float32_grad_rel_err"] is not None),
            default=0.0)
        doc["float32_max_param_rel_err"] = max(
            (r["float32_param_rel_err"] for r in rows if r["float32_param_rel_err"] is not None),
            default=0.0)
        # the literal comparison with the single-device float32 run, for information
        doc["vs_float32_max_grad_rel_err"] = max(
            (rel_err(grads[n], ref32[2][n], floor) for n in grads if n in ref32[2]),
            default=0.0)
        doc["vs_float32_max_param_rel_err"] = max(
            (rel_err(params[n], ref32[1][n]) for n in params if n in ref32[1]), default=0.0)
    return doc

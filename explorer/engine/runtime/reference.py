"""The single-device reference step and the comparison with a distributed step.

Both sides train the same model from the same seeded weights on the same input, in
**eval mode**: dropout is the identity and BatchNorm normalises with its running statistics
(which therefore do not change), because batch statistics would make every sample depend on
the whole batch and a sample-split plan could only reproduce them with an extra all-reduce the
cost model does not know about.  Gradients are still computed and one SGD step
(``p -= lr·grad``, no momentum) is taken.

Loss: ``Σ_outputs mean(out.float()²)`` over the model's outputs (one for every example model).

Tolerances: the loss, every parameter after the step and every gradient must agree to a
relative error ``max|a − b| / max|b|`` (the maximum over the tensor, relative to the
reference tensor's largest magnitude) of at most ``tol`` (1e-4 by default) in float32.
Comparing the gradients is the strict part: with ``lr = 0.01`` a parameter moves by ~1e-4 of
its size, so a parameter-only check would hide a wrong gradient.
"""

from __future__ import annotations

import torch

DEFAULT_TOL = 1e-4


def _tensors(out):
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, dict):
        out = list(out.values())
    if isinstance(out, (list, tuple)):
        return [t for o in out for t in _tensors(o)]
    return []


def reference_step(model, x, lr: float):
    """``(loss, grads, params_after)`` of one eval-mode SGD step of ``model`` on ``x``.

    Modifies ``model``'s parameters in place (call it after the distributed run).
    """
    model.eval()
    for p in model.parameters():
        p.grad = None
    out = model(x)
    loss = sum(o.float().pow(2).mean() for o in _tensors(out))
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()
             if p.grad is not None}
    with torch.no_grad():
        for p in model.parameters():
            if p.grad is not None:
                p.add_(p.grad, alpha=-lr)
    params = {n: p.detach().clone() for n, p in model.named_parameters()}
    return float(loss.item()), grads, params


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """``max|a − b| / max|b|`` (absolute difference when ``b`` is all zeros)."""
    if not a.numel():
        return 0.0
    a, b = a.detach().float(), b.detach().float()
    d = float((a - b).abs().max().item())
    scale = float(b.abs().max().item())
    return d / scale if scale > 0 else d


def compare(loss, params, grads, ref_loss, ref_params, ref_grads, tol: float = DEFAULT_TOL
            ) -> dict:
    """The reference check document: ``ok``, errors, the worst tensors and any problems."""
    problems = []
    rows = []
    worst_p = worst_g = 0.0
    worst_p_name = worst_g_name = None
    for name, ref in ref_params.items():
        if name not in params:
            if name in ref_grads and ref_grads[name].abs().max().item() > 0:
                problems.append(f"parameter {name} has a gradient in the reference but no layer "
                                f"of the plan owns it")
            continue
        pe = rel_err(params[name], ref)
        if name in ref_grads:
            ge = rel_err(grads[name], ref_grads[name]) if name in grads else float("inf")
        else:
            ge = rel_err(grads[name], torch.zeros_like(grads[name])) if name in grads else 0.0
        rows.append({"name": name, "param_rel_err": pe, "grad_rel_err": ge})
        if pe > worst_p:
            worst_p, worst_p_name = pe, name
        if ge > worst_g:
            worst_g, worst_g_name = ge, name
    loss_err = abs(loss - ref_loss) / max(abs(ref_loss), 1e-30)
    ok = (not problems and loss_err <= tol and worst_p <= tol and worst_g <= tol
          and bool(rows))
    if not rows:
        problems.append("no parameter was compared")
    return {"ok": bool(ok), "tolerance": tol, "loss": loss, "loss_ref": ref_loss,
            "loss_rel_err": loss_err, "max_param_rel_err": worst_p, "worst_param": worst_p_name,
            "max_grad_rel_err": worst_g, "worst_grad": worst_g_name, "params_compared": len(rows),
            "problems": problems, "params": rows}

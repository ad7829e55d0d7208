"""The body of every exported program: a real module, so that linters, the tests and readers see
the code each ``torchrun`` program runs.  :func:`explorer.engine.export.render` writes a file of
the plan's own header (its docstring, the layers not computed as planned, ``DEVICES``, ``MESH``
… , ``build_model`` and ``parallelize``) followed by this module's text below the
``PROGRAM BODY`` line; here those names have placeholders so that the module imports alone.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.parallel import (
    PrepareModuleOutput,
    SequenceParallel,
    parallelize_module,
)

# Placeholders: the exported file defines these above the body.
DEVICES = 1
MESH = (1, 1)                  # (dp, tp)
BATCH_DIM = 0
LR = 0.01
SEED = 0
TOL = 1e-4
ROUNDING_FACTOR = 10.0
UPDATE_FLOOR = 1e-3
DTYPE = "fp32"                 # the plan's precision: fp32 | tf32 | bf16 (autocast)
NOT_AS_PLANNED: list = []


def build_model():
    """``(module, input)`` of the plan's model (the exported file defines it)."""
    raise NotImplementedError("the exported program defines build_model()")


def parallelize(model, mesh):
    """The plan applied to ``model`` on ``mesh`` (the exported file defines it)."""
    return model


def body() -> str:
    """This module's text below the ``PROGRAM BODY`` line: what every exported file runs."""
    text = Path(__file__).read_text()
    marker = "# " + "-" * 20 + " PROGRAM BODY " + "-" * 20 + "\n"
    return text[text.index(marker) + len(marker):]


# -------------------- PROGRAM BODY --------------------
def sequence_parallel(module, mesh, dim):
    """SequenceParallel on ``module`` between whole tensors: its input is scattered along
    ``dim`` (a local slice), its output gathered back."""
    def as_dtensor(_mod, args):
        x, *rest = args
        return (DTensor.from_local(x, mesh, [Replicate()], run_check=False), *rest)
    parallelize_module(module, mesh, SequenceParallel(sequence_dim=dim))
    module.register_forward_pre_hook(as_dtensor, prepend=True)
    parallelize_module(module, mesh, PrepareModuleOutput(output_layouts=Shard(dim),
                                                         desired_output_layouts=Replicate()))


def tensors(out):
    """The tensors of a model output: a tensor, tuple, list, dict or ModelOutput."""
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, dict):
        out = list(out.values())
    if isinstance(out, (list, tuple)):
        return [t for o in out for t in tensors(o)]
    return []


def loss_of(out):
    """Plan Explorer's training loss: the sum over floating-point outputs of mean(o**2),
    in float32 at least (a bf16 output of autocast is summed in float32)."""
    ts = [o.full_tensor() if isinstance(o, DTensor) else o for o in tensors(out)]
    return sum((t if t.dtype == torch.float64 else t.float()).pow(2).mean()
               for t in ts if t.is_floating_point())


def precision(device_type):
    """The plan's numerics for a forward pass: bf16 autocast (float32 master weights);
    on CUDA TF32 on for tf32, off otherwise (a no-op on CPU for fp32 and tf32)."""
    if device_type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = DTYPE == "tf32"
        torch.backends.cudnn.allow_tf32 = DTYPE == "tf32"
    if DTYPE == "bf16":
        return torch.autocast(device_type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def sgd_(model, lr):
    """p -= lr * grad (plain SGD, as Plan Explorer's runtime)."""
    with torch.no_grad():
        for p in model.parameters():
            if p.grad is not None:
                p.add_(p.grad, alpha=-lr)
                p.grad = None


def whole(p):
    """A parameter as one full tensor (a collective for DTensors: every rank calls it)."""
    return (p.full_tensor() if isinstance(p, DTensor) else p).detach()


def single_process(model, x, steps, lr, dtype):
    """Losses and parameters of the same steps on one process in ``dtype`` (float32: in the
    plan's precision, as the processes compute; float64: exact)."""
    m = copy.deepcopy(model).to(dtype)
    if x.is_floating_point():
        x = x.to(dtype)
    losses = []
    for _ in range(steps):
        with precision(x.device.type) if dtype == torch.float32 else contextlib.nullcontext():
            out = m(x)
        loss = loss_of(out)
        loss.backward()
        sgd_(m, lr)
        losses.append(float(loss.detach()))
    return losses, {n: p.detach() for n, p in m.named_parameters()}


def rel(a, b, floor=0.0):
    """max|a - b| / max(max|b|, floor) (the absolute difference when that is 0)."""
    a, b = torch.as_tensor(a, dtype=torch.float64), torch.as_tensor(b, dtype=torch.float64)
    if not b.numel():
        return 0.0
    d, s = float((a - b).abs().max()), max(float(b.abs().max()), floor)
    return d / s if s > 0 else d


def check(reference, x, before, losses, after, steps, lr):
    """Compare the losses and the parameter updates with one process (float64 = exact; each
    error may be max(TOL, ROUNDING_FACTOR x the single process's own in the plan's
    precision)).  Prints a table; True when everything is within tolerance."""
    l64, p64 = single_process(reference, x, steps, lr, torch.float64)
    l32, p32 = single_process(reference, x, steps, lr, torch.float32)
    ok = True
    print(f"{'step':>4}  {'loss (' + str(DEVICES) + ' processes)':>22}  "
          f"{'loss (1 process)':>18}  {'rel. error':>10}  {'allowed':>9}")
    for i, (a, b, c) in enumerate(zip(losses, l64, l32)):
        err, allowed = rel(a, b), max(TOL, ROUNDING_FACTOR * rel(c, b))
        ok &= err <= allowed
        print(f"{i + 1:>4}  {a:>22.8g}  {b:>18.8g}  {err:>10.2e}  {allowed:>9.2e}"
              f"{'' if err <= allowed else '  DIFFERS'}")
    d64 = {n: p64[n] - before[n].double() for n in p64}
    floor = UPDATE_FLOOR * max((float(d.abs().max()) for d in d64.values() if d.numel()),
                               default=0.0)
    worst, bad = (0.0, 0.0, None), []
    for n, d in d64.items():
        got = after[n].double() - before[n].double()
        err = rel(got, d, floor)
        allowed = max(TOL, ROUNDING_FACTOR * rel(p32[n].double() - before[n].double(), d, floor))
        if err > allowed:
            bad.append(n)
        if err / allowed >= worst[0] / max(worst[1], 1e-300):
            worst = (err, allowed, n)
    print(f"parameter updates: {len(d64)} tensors, worst {worst[2]} rel. error "
          f"{worst[0]:.2e} (allowed {worst[1]:.2e})")
    if bad:
        print(f"DIFFERS: {', '.join(bad[:5])}{' ...' if len(bad) > 5 else ''}")
    print("check: passed" if ok and not bad else "check: FAILED")
    return ok and not bad


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=3, help="SGD steps (default 3)")
    ap.add_argument("--lr", type=float, default=LR, help=f"learning rate (default {LR})")
    ap.add_argument("--check", action="store_true",
                    help="compare with the same steps on one process; exit 1 when they differ")
    args = ap.parse_args(argv)
    world = int(os.environ.get("WORLD_SIZE", "0"))
    if world != DEVICES:
        print(f"error: this plan is for {DEVICES} processes: run it with `torchrun --standalone "
              f"--nproc_per_node {DEVICES} {os.path.basename(sys.argv[0])} --steps K`",
              file=sys.stderr)
        return 2
    if args.steps < 1:
        print(f"error: --steps must be >= 1, got {args.steps}", file=sys.stderr)
        return 2
    # NCCL when every process of this node has its own GPU (several nodes: per node)
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", DEVICES))
    cuda = torch.cuda.is_available() and torch.cuda.device_count() >= local_world
    dist.init_process_group("nccl" if cuda else "gloo")
    rank = dist.get_rank()
    device = torch.device(f"cuda:{int(os.environ.get('LOCAL_RANK', rank))}" if cuda else "cpu")
    if cuda:
        torch.cuda.set_device(device)
    mesh = init_device_mesh(device.type, MESH, mesh_dim_names=("dp", "tp"))
    if rank == 0:
        print(f"{DEVICES} processes, mesh dp={MESH[0]} x tp={MESH[1]}, {args.steps} steps, "
              f"{DTYPE}")
        for layer, planned, exported, reason in NOT_AS_PLANNED:
            print(f"not as planned: {layer}: plan {planned} -> {exported}: {reason}")
    torch.manual_seed(SEED)
    model, x = build_model()
    model, x = model.to(device).eval(), x.to(device)   # eval: dropout off, BatchNorm running
    reference = copy.deepcopy(model) if args.check and rank == 0 else None   # stats (as the
    before = {n: p.detach().clone() for n, p in model.named_parameters()}    # reference)
    parallelize(model, mesh)
    xs = x.tensor_split(MESH[0], dim=BATCH_DIM)[mesh.get_local_rank("dp")]
    losses = []
    for _ in range(args.steps):
        with precision(device.type):
            out = model(xs)
        loss = loss_of(out)
        loss.backward()
        sgd_(model, args.lr)
        value = loss.detach().reshape(1).to(torch.float64)
        if MESH[0] > 1:
            dist.all_reduce(value, group=mesh.get_group("dp"))
            value /= MESH[0]
        losses.append(float(value))
    after = {n: whole(p).cpu() for n, p in model.named_parameters()}
    ok = True
    if rank == 0:
        if reference is not None:
            ok = check(reference.cpu(), x.cpu(), {n: p.cpu() for n, p in before.items()},
                       losses, after, args.steps, args.lr)
        else:
            for i, value in enumerate(losses):
                print(f"step {i + 1}  loss {value:.8g}")
    flag = torch.tensor([int(ok)], device=device)
    dist.broadcast(flag, 0)
    dist.barrier()
    return 0 if int(flag.item()) else 1


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # every rank has finished and agreed on the result (the barrier above); end the process
    # without tearing the process groups down: with gloo on a loaded CPU, destroying the
    # mesh's sub-groups can abort a rank ("terminate called without an active exception")
    # after a run that passed
    os._exit(code)

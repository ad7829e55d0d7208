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
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor
from torch.distributed.tensor.parallel import (
    PrepareModuleOutput,
    SequenceParallel,
    parallelize_module,
)
from torch.utils.checkpoint import checkpoint

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
LAYER_MESH = None              # the prime-factor mesh of the per-layer layouts (None: (dp, tp))
LAYOUTS: dict = {}             # fx node name -> the layer's placements (per-layer layouts)


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


def placement(code):
    """``"R"`` / ``"P"`` / ``"S<dim>"`` as a DTensor placement."""
    return Replicate() if code == "R" else Partial() if code == "P" else Shard(int(code[1:]))


class Layouts:
    """The plan's per-layer placements applied to an fx-traced model on ``mesh``: every
    layer's node is replaced by :meth:`run`, which redistributes its inputs to the layer's
    placements and computes it on local shards (module layers, element-wise ops, attention,
    pooling) or through DTensor (other ops, whose output placements are then checked)."""

    def __init__(self, gm, mesh, layouts):
        self.gm, self.mesh, self.layouts = gm, mesh, layouts
        self.fns, self.drift = {}, {}

    def coords(self):
        return self.mesh.get_coordinate()

    def arg_layout(self, spec, shape, pls=None):
        """The placements an input of global ``shape`` takes for a layer whose output has
        ``spec['shape']``: the output's, right-aligned, Replicate where the sizes differ."""
        out, oshape = pls or spec["out"], spec["shape"]
        off = len(oshape) - len(shape)
        if off < 0:            # a reduction's input: its dims matched to the output's in order
            where, i = {}, 0
            for j, size in enumerate(oshape):
                while i < len(shape) and shape[i] != size:
                    i += 1
                if i < len(shape):
                    where[j], i = i, i + 1
            return [f"S{where[int(c[1:])]}" if c.startswith("S") and int(c[1:]) in where
                    else "R" for c in out]
        res = []
        for code in out:
            if code.startswith("S"):
                d = int(code[1:]) - off
                res.append(code[0] + str(d) if 0 <= d < len(shape)
                           and shape[d] == oshape[int(code[1:])] else "R")
            else:
                res.append("R")
        return res

    def to_layout(self, t, codes):
        if not isinstance(t, DTensor):
            t = DTensor.from_local(t, self.mesh, [Replicate()] * self.mesh.ndim,
                                   run_check=False)
        want = tuple(placement(c) for c in codes)
        return t if tuple(t.placements) == want else t.redistribute(self.mesh, want)

    def local(self, t, codes, active):
        """``t`` in ``codes`` as this rank's shard; its gradient is summed over the mesh
        dims where the layer splits something and ``t`` is replicated."""
        d = self.to_layout(t, codes)
        grads = [Partial() if c == "R" and a else placement(c) for c, a in zip(codes, active)]
        out = d.to_local(grad_placements=grads)
        return _ContiguousGrad.apply(out) if out.requires_grad else out

    def run(self, name, *args, **kwargs):
        """The layer ``name`` on its placements; a recomputed layer (``recompute``) under
        ``torch.utils.checkpoint``: nothing of it is kept for the backward pass but its
        inputs, and its forward (redistributions and gathers included) runs again there."""
        spec = self.layouts.get(name)
        if spec is not None and spec.get("recompute") and torch.is_grad_enabled():
            return checkpoint(self.compute, name, *args, use_reentrant=False, **kwargs)
        return self.compute(name, *args, **kwargs)

    def compute(self, name, *args, **kwargs):
        if name not in self.layouts:           # an op folded into a layer, or a view
            fn = self.fns[name][1]
            if any(isinstance(a, DTensor) for a in args):
                args = [DTensor.from_local(a, self.mesh, [Replicate()] * self.mesh.ndim,
                                           run_check=False)
                        if isinstance(a, torch.Tensor) and not isinstance(a, DTensor)
                        and a.dim() > 0 else a for a in args]
            return _map_tensors(fn(*args, **kwargs), lambda o: _LocalContiguousGrad.apply(o)
                                if isinstance(o, DTensor) and o.requires_grad else o)
        spec, (mode, fn) = self.layouts[name], self.fns[name]
        out_codes = spec["out"]
        active = [c != "R" for c in out_codes]
        if mode == "value":
            return self.to_layout(fn(*args, **kwargs), out_codes)
        if mode == "module":
            active = [a or i != "R" or any(p[d] != "R" for p in spec["params"].values())
                      for d, (a, i) in enumerate(zip(active, spec["in"]))]
        if mode in ("module", "local"):
            largs = []
            for i, a in enumerate(args):
                if isinstance(a, torch.Tensor):
                    codes = (spec["in"] if mode == "module"
                             else self.arg_layout(spec, tuple(a.shape)))
                    if mode == "module" and i > 0:
                        codes = self.arg_layout(spec, tuple(a.shape), spec["in"])
                    a = self.local(a, codes, active)
                largs.append(a)
            lkw = {k: self.local(v, self.arg_layout(spec, tuple(v.shape)), active)
                   if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
            if mode == "module" and spec.get("fsdp"):
                out = fn(*largs, **lkw)        # fully_shard's hooks gather its parameters
            elif mode == "module":
                params = {}
                for pname, p in fn.named_parameters():
                    codes = spec["params"].get(pname, ["R"] * self.mesh.ndim)
                    pcodes = ["R" if c == "mask" else c for c in codes]
                    lp = self.local(p, pcodes, active)
                    if "mask" in codes and any(self.coords()[d] for d, c in enumerate(codes)
                                               if c == "mask"):
                        lp = lp * 0.0     # the bias of a reduction split: added once
                    params[pname] = lp
                for bname, b in fn.named_buffers():
                    params[bname] = (b.to_local() if isinstance(b, DTensor) else b)
                out = torch.func.functional_call(fn, params, tuple(largs), lkw)
            else:
                out = fn(*largs, **lkw)
            pls = [placement(c) for c in out_codes]
            shape = torch.Size(spec["shape"])
            stride = tuple(int(torch.Size(shape[i + 1:]).numel()) for i in range(len(shape)))
            return _map_tensors(out, lambda o: DTensor.from_local(
                o.contiguous(), self.mesh, pls, run_check=False, shape=shape, stride=stride)
                if o.dim() == len(shape) else o)
        # inputs of the output's rank take its placements; others (a reduction's input)
        # join the mesh as they come and DTensor's propagation places the output
        def join(a):
            if a.dim() >= len(spec["shape"]):
                return self.to_layout(a, self.arg_layout(spec, tuple(a.shape)))
            return a if isinstance(a, DTensor) else self.to_layout(a, ["R"] * self.mesh.ndim)
        args = [_map_tensors(a, join) for a in args]
        out = fn(*args, **kwargs)
        want = tuple(placement(c) for c in out_codes)

        def fix(o):
            if not isinstance(o, DTensor) or o.dim() != len(spec["shape"]):
                return o
            if tuple(o.placements) != want:
                self.drift[name] = "".join(str(p) for p in o.placements)
                return o.redistribute(self.mesh, want)
            return o
        return _map_tensors(out, fix)


class _ContiguousGrad(torch.autograd.Function):
    """Identity whose gradient is made contiguous: a shard's gradient becomes a DTensor
    whose global view ops assume contiguous shards."""

    @staticmethod
    def forward(ctx, t):
        return t.view_as(t)

    @staticmethod
    def backward(ctx, g):
        return g.contiguous()


class _LocalContiguousGrad(torch.autograd.Function):
    """Identity on a DTensor whose gradient's shard is made contiguous: DTensor decides a
    view from the global strides, and a non-contiguous shard then fails ``view``."""

    @staticmethod
    def forward(ctx, t):
        return t.view_as(t)

    @staticmethod
    def backward(ctx, g):
        if isinstance(g, DTensor) and not g.to_local().is_contiguous():
            g = DTensor.from_local(g.to_local().contiguous(), g.device_mesh, g.placements,
                                   run_check=False, shape=g.shape, stride=g.stride())
        return g


def _map_tensors(out, f):
    if isinstance(out, torch.Tensor):
        return f(out)
    if isinstance(out, tuple):
        return tuple(_map_tensors(o, f) for o in out)
    if isinstance(out, list):
        return [_map_tensors(o, f) for o in out]
    return out


_LAYOUTS = None


def run_layer(name, *args, **kwargs):
    """A layer's node in the traced model (see :class:`Layouts`)."""
    return _LAYOUTS.run(name, *args, **kwargs)


def _method(name):
    return lambda self, *a, **k: getattr(self, name)(*a, **k)


def parallelize_layers(model, mesh, layouts):
    """The plan's per-layer layouts on ``model``: parameters distributed with their layer's
    placements (Replicate where no layer splits them), every layer's fx node wrapped."""
    global _LAYOUTS
    import torch.fx
    gm = torch.fx.symbolic_trace(model)
    lay = Layouts(gm, mesh, layouts)
    owned = {}
    for nd in gm.graph.nodes:
        spec = layouts.get(nd.name)
        if spec is not None and spec["mode"] == "module":
            owned[nd.target] = spec
    sharded = {m: s["fsdp"] for m, s in owned.items() if s.get("fsdp")}
    for mname, mod in gm.named_modules():
        spec = owned.get(mname)
        if mname in sharded or any(mname.startswith(m + ".") for m in sharded):
            continue                   # fully_shard distributes these below
        for pname, p in list(mod.named_parameters(recurse=False)):
            codes = (spec["params"].get(pname) if spec else None) or ["R"] * mesh.ndim
            if spec is None:
                for prefix, other in owned.items():       # a submodule of a module layer
                    if mname.startswith(prefix + "."):
                        key = mname[len(prefix) + 1:] + "." + pname
                        codes = other["params"].get(key, codes)
            pls = [Replicate() if c in ("R", "mask") else placement(c) for c in codes]
            mod.register_parameter(pname, torch.nn.Parameter(
                distribute_tensor(p.detach(), mesh, pls)))
        if list(mod.parameters(recurse=False)):
            for bname, b in list(mod.named_buffers(recurse=False)):
                if b is not None and b.is_floating_point():
                    mod.register_buffer(bname, DTensor.from_local(
                        b, mesh, [Replicate()] * mesh.ndim, run_check=False))
    if sharded:
        # ZeRO: a layer computed on every rank with whole parameters shards them over all
        # the ranks (its replica group): ZeRO-3 regathers them in the backward pass,
        # ZeRO-2 keeps them gathered until then (PyTorch's SHARD_GRAD_OP); gradients are
        # reduce-scattered as sums (each rank's loss is the whole loss)
        flat = mesh if mesh.ndim == 1 else init_device_mesh(
            mesh.device_type, (mesh.size(),), mesh_dim_names=("zero",))
        for mname, zero in sharded.items():
            mod = gm.get_submodule(mname)
            fully_shard(mod, mesh=flat, reshard_after_forward=zero >= 3)
            mod.set_gradient_divide_factor(1.0)
            mod.set_force_sum_reduction_for_comms(True)    # a plain sum (gloo has no PREMUL)
    graph = gm.graph
    for nd in list(graph.nodes):
        spec = layouts.get(nd.name)
        if spec is None and nd.op in ("call_function", "call_method"):
            # an op between layers (a view, an op folded into a layer): a constant it reads
            # with an activation (a rotary table) joins the mesh replicated
            lay.fns[nd.name] = ("mixed", _method(nd.target) if nd.op == "call_method"
                                else nd.target)
            with graph.inserting_before(nd):
                new = graph.call_function(run_layer, (nd.name, *nd.args), dict(nd.kwargs))
            nd.replace_all_uses_with(new)
            graph.erase_node(nd)
            continue
        if spec is None:
            continue
        name = nd.name
        if nd.op in ("placeholder", "get_attr"):
            lay.fns[name] = ("value", lambda t: t)
            with graph.inserting_after(nd):
                new = graph.call_function(run_layer, (name, nd))
            nd.replace_all_uses_with(new, delete_user_cb=lambda u: u is not new)
            continue
        if nd.op == "call_module":
            fn = gm.get_submodule(nd.target)
        elif nd.op == "call_method":
            fn = _method(nd.target)
        else:
            fn = nd.target
        mode = spec["mode"] if spec["mode"] != "value" else "value"
        lay.fns[name] = (mode, fn)
        with graph.inserting_before(nd):
            new = graph.call_function(run_layer, (name, *nd.args), dict(nd.kwargs))
        nd.replace_all_uses_with(new)
        graph.erase_node(nd)
    gm.recompile()
    _LAYOUTS = lay
    return gm


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
                g = p.grad
                if isinstance(p, DTensor) and tuple(g.placements) != tuple(p.placements):
                    g = g.redistribute(p.device_mesh, p.placements)   # e.g. Partial -> sum
                p.add_(g, alpha=-lr)
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
    if LAYER_MESH:
        mesh = init_device_mesh(device.type, tuple(LAYER_MESH),
                                mesh_dim_names=tuple(f"m{i}" for i in range(len(LAYER_MESH))))
    else:
        mesh = init_device_mesh(device.type, MESH, mesh_dim_names=("dp", "tp"))
    if rank == 0:
        shape = (" x ".join(str(s) for s in LAYER_MESH) + " (one placement per layer)"
                 if LAYER_MESH else f"dp={MESH[0]} x tp={MESH[1]}")
        print(f"{DEVICES} processes, mesh {shape}, {args.steps} steps, {DTYPE}; "
              f"{len(LAYOUTS) - len(NOT_AS_PLANNED) if LAYOUTS else '?'} of "
              f"{len(LAYOUTS) or '?'} layers as planned")
        for layer, planned, exported, reason in NOT_AS_PLANNED:
            print(f"not as planned: {layer}: plan {planned} -> {exported}: {reason}")
    torch.manual_seed(SEED)
    model, x = build_model()
    model, x = model.to(device).eval(), x.to(device)   # eval: dropout off, BatchNorm running
    reference = copy.deepcopy(model) if args.check and rank == 0 else None   # stats (as the
    before = {n: p.detach().clone() for n, p in model.named_parameters()}    # reference)
    if LAYER_MESH:
        model = parallelize_layers(model, mesh, LAYOUTS)
        xs = x                     # the input layer takes its own shard
    else:
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
        if MESH[0] > 1 and not LAYER_MESH:
            dist.all_reduce(value, group=mesh.get_group("dp"))
            value /= MESH[0]
        losses.append(float(value))
    after = {n: whole(p).cpu() for n, p in model.named_parameters()}
    ok = True
    drift = dict(_LAYOUTS.drift) if _LAYOUTS is not None else {}
    if rank == 0 and drift:
        print(f"computed in other placements than planned at run time: "
              f"{', '.join(f'{k} ({v})' for k, v in sorted(drift.items()))}")
        ok = False
    if rank == 0:
        if reference is not None:
            ok = ok & check(reference.cpu(), x.cpu(), {n: p.cpu() for n, p in before.items()},
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

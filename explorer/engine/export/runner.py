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
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
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
PIPELINE: dict = {}            # the plan's pipeline (stages, micro-batches, schedule, ...)
PIPELINE_NOT_AS_PLANNED: list = []   # (plan, exported, reason) of the pipeline itself


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
    pooling, experts: an input's placements given in ``args`` or else the output's) or
    through DTensor (other ops, whose output placements are then checked).

    A layer on a subset of the ranks (``ranks`` in its spec) computes on a ``DeviceMesh`` of
    those ranks only; the others hold a placeholder (a DTensor without data).  A tensor
    crossing meshes is gathered on its source mesh and broadcast to every rank (:class:`_Hop`),
    then placed on the destination mesh.  Ranks then build different autograd graphs, so the
    backward pass could order its collectives differently on two ranks and hang: a token
    threads every layer and every crossing (:class:`_Tie`), which makes the backward pass
    visit them in one order, the reverse of the forward's, on every rank."""

    def __init__(self, gm, mesh, layouts):
        self.gm, self.mesh, self.layouts = gm, mesh, layouts
        self.fns, self.drift = {}, {}
        self.meshes, self.token = {}, None
        for spec in layouts.values():          # every rank creates every mesh, in one order
            key = tuple(spec.get("ranks") or ())
            if key and key not in self.meshes:
                self.meshes[key] = DeviceMesh(mesh.device_type,
                                              torch.tensor(key).reshape(tuple(spec["mesh"])))
        if self.meshes:
            self.token = torch.zeros((), requires_grad=True,
                                     device=_device_of(mesh))

    def mesh_of(self, spec):
        """The mesh a layer computes on: its own ranks', or the global one."""
        return self.meshes[tuple(spec["ranks"])] if spec and spec.get("ranks") else self.mesh

    def move(self, t, mesh):
        """``t`` on ``mesh``: a DTensor of another mesh is gathered on its ranks, broadcast
        from the first, and replicated on ``mesh`` (a placeholder where this rank is not in
        ``mesh``).  Every rank calls it for every crossing, in the same order."""
        if self.token is None or not isinstance(t, DTensor) or t.device_mesh is mesh:
            return t                   # (without sub-meshes every layer is on one mesh)
        src = t.device_mesh.mesh.flatten().tolist()
        dst = mesh.mesh.flatten().tolist()
        me, dev = dist.get_rank(), _device_of(mesh)
        every = len(src) == dist.get_world_size()    # from the global mesh: no broadcast
        dtype, shape = t.dtype, tuple(t.shape)
        if not every:          # a placeholder's dtype may be a guess: the source's says
            head = torch.zeros(10, dtype=torch.int64, device=dev)
            if me == src[0]:
                head[0], head[1] = _DTYPES.index(t.dtype), t.dim()
                head[2:2 + t.dim()] = torch.tensor(list(t.shape), dtype=torch.int64)
            dist.broadcast(head, src[0])
            dtype = _DTYPES[int(head[0])]
            shape = tuple(int(v) for v in head[2:2 + int(head[1])])
        full = t.full_tensor() if me in src else torch.empty(0, dtype=dtype, device=dev)
        self.token, buf = _Hop.apply(self.token, full, None if every else src[0], shape, dtype,
                                     me == dst[0], me in src)
        pls = [Replicate()] * mesh.ndim
        if me in dst:
            return DTensor.from_local(buf, mesh, pls, run_check=False)
        return _placeholder(mesh, pls, shape, dtype)

    def tie(self, tree):
        """``tree`` with its tensors that carry gradients tied to the token (identity)."""
        if self.token is None:
            return tree
        found = []
        _map_tensors(tree, lambda t: found.append(t) if t.requires_grad else None)
        if not found:
            return tree
        self.token, *tied = _Tie.apply(self.token, *found)
        it = iter(tied)
        return _map_tensors(tree, lambda t: next(it) if t.requires_grad else t)

    def finish(self, out):
        """The model's output on the global mesh (what every rank's loss reads)."""
        if self.token is None:
            return out
        return self.tie(_map_tensors(out, lambda o: self.move(o, self.mesh)))

    def anchor(self, loss):
        """``loss`` that also reaches the token, so every rank's backward pass visits every
        layer and crossing (each adds 0)."""
        if self.token is None:
            return loss
        loss = loss + 0.0 * self.token.to(loss.dtype)
        self.token = torch.zeros((), requires_grad=True, device=self.token.device)  # next step
        return loss

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

    def to_layout(self, t, codes, mesh=None):
        mesh = mesh or self.mesh
        if not isinstance(t, DTensor):
            t = DTensor.from_local(t, mesh, [Replicate()] * mesh.ndim, run_check=False)
        t = self.move(t, mesh)
        want = tuple(placement(c) for c in codes)
        return t if tuple(t.placements) == want else t.redistribute(mesh, want)

    def local(self, t, codes, active, mesh=None):
        """``t`` in ``codes`` as this rank's shard; its gradient is summed over the mesh
        dims where the layer splits something and ``t`` is replicated."""
        d = self.to_layout(t, codes, mesh)
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
        if self.token is None:
            return self.compute_on(name, *args, **kwargs)
        keys = list(kwargs)                           # the layer after everything before it
        args, vals = self.tie((args, [kwargs[k] for k in keys]))
        kwargs = dict(zip(keys, vals))
        return self.tie(self.compute_on(name, *args, **kwargs))

    def compute_on(self, name, *args, **kwargs):
        if name not in self.layouts:           # an op folded into a layer, or a view
            fn = self.fns[name][1]
            meshes = {id(a.device_mesh): a.device_mesh for a in args if isinstance(a, DTensor)}
            mesh = next(iter(meshes.values())) if len(meshes) == 1 else self.mesh
            args = [self.move(a, mesh) for a in args]
            if meshes:
                args = [DTensor.from_local(a, mesh, [Replicate()] * mesh.ndim,
                                           run_check=False)
                        if isinstance(a, torch.Tensor) and not isinstance(a, DTensor)
                        and a.dim() > 0 else a for a in args]
            return _map_tensors(fn(*args, **kwargs), lambda o: _LocalContiguousGrad.apply(o)
                                if isinstance(o, DTensor) and o.requires_grad else o)
        spec, (mode, fn) = self.layouts[name], self.fns[name]
        mesh = self.mesh_of(spec)
        out_codes = spec["out"]
        active = [c != "R" for c in out_codes]
        # every rank moves the inputs (a crossing is a collective of all ranks); the ranks
        # outside the layer's mesh hold a placeholder of its output
        args = _map_tensors(args, lambda a: self.move(a, mesh))
        kwargs = {k: self.move(v, mesh) for k, v in kwargs.items()}
        if mesh.get_coordinate() is None:
            dtype = next((a.dtype for a in _flat(args) if a.is_floating_point()),
                         torch.get_default_dtype())
            if mode == "value":
                dtype = next((a.dtype for a in _flat(args)), dtype)
            dtype = _meta_dtype(fn, args, kwargs, dtype)
            return _placeholder(mesh, [placement(c) for c in out_codes], tuple(spec["shape"]),
                                dtype)
        if mode == "value":
            return self.to_layout(fn(*args, **kwargs), out_codes, mesh)
        if mode == "module":
            active = [a or i != "R" or any(p[d] != "R" for p in spec["params"].values())
                      for d, (a, i) in enumerate(zip(active, spec["in"]))]
        if mode in ("module", "local"):
            largs, given = [], spec.get("args") or []     # given: an arg's own placements
            for i, a in enumerate(args):
                if isinstance(a, torch.Tensor):
                    codes = (spec["in"] if mode == "module"
                             else self.arg_layout(spec, tuple(a.shape)))
                    if mode == "module" and i > 0:
                        codes = self.arg_layout(spec, tuple(a.shape), spec["in"])
                    if i < len(given) and given[i] is not None:
                        codes = given[i]
                    a = self.local(a, codes, active, mesh)
                largs.append(a)
            lkw = {k: self.local(v, self.arg_layout(spec, tuple(v.shape)), active, mesh)
                   if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
            if mode == "module" and spec.get("fsdp"):
                out = fn(*largs, **lkw)        # fully_shard's hooks gather its parameters
            elif mode == "module":
                params = {}
                for pname, p in fn.named_parameters():
                    codes = spec["params"].get(pname, ["R"] * mesh.ndim)
                    pcodes = ["R" if c == "mask" else c for c in codes]
                    lp = self.local(p, pcodes, active, mesh)
                    if "mask" in codes and any(mesh.get_coordinate()[d]
                                               for d, c in enumerate(codes) if c == "mask"):
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
                o.contiguous(), mesh, pls, run_check=False, shape=shape, stride=stride)
                if o.dim() == len(shape) else o)
        # inputs of the output's rank take its placements; others (a reduction's input)
        # join the mesh as they come and DTensor's propagation places the output
        def join(a):
            if a.dim() >= len(spec["shape"]):
                return self.to_layout(a, self.arg_layout(spec, tuple(a.shape)), mesh)
            return a if isinstance(a, DTensor) else self.to_layout(a, ["R"] * mesh.ndim, mesh)
        args = [_map_tensors(a, join) for a in args]
        if isinstance(fn, torch.nn.Module) and self.token is not None:
            # a module computed through DTensor whose parameters live on another mesh (one
            # module called by layers on several meshes): they cross to this layer's mesh
            params = {k: self.move(p, mesh) for k, p in fn.named_parameters()}
            if any(params[k] is not p for k, p in fn.named_parameters()):
                out = torch.func.functional_call(fn, params, tuple(args), kwargs)
            else:
                out = fn(*args, **kwargs)
        else:
            out = fn(*args, **kwargs)
        want = tuple(placement(c) for c in out_codes)

        def fix(o):
            if not isinstance(o, DTensor) or o.dim() != len(spec["shape"]):
                return o
            if tuple(o.placements) != want:
                self.drift[name] = "".join(str(p) for p in o.placements)
                return o.redistribute(mesh, want)
            return o
        return _map_tensors(out, fix)


_DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int64,
           torch.int32, torch.bool, torch.uint8, torch.int8, torch.int16]


def _device_of(mesh):
    return torch.device(mesh.device_type, torch.cuda.current_device()) \
        if mesh.device_type == "cuda" else torch.device(mesh.device_type)


def _meta_dtype(fn, args, kwargs, default):
    """The dtype ``fn`` gives on these arguments (a comparison: bool), found on the meta
    device so a rank outside a layer's mesh holds a placeholder of the right dtype;
    ``default`` when a plain function of tensors cannot tell (a module, an error)."""
    if isinstance(fn, torch.nn.Module):
        return default
    try:
        def meta(a):
            return torch.empty(tuple(a.shape), dtype=a.dtype, device="meta") \
                if isinstance(a, torch.Tensor) else a
        out = fn(*[meta(a) for a in args], **{k: meta(v) for k, v in kwargs.items()})
    except Exception:  # noqa: BLE001 - any op meta cannot run keeps the default
        return default
    return out.dtype if isinstance(out, torch.Tensor) else default


def _placeholder(mesh, pls, shape, dtype):
    """A DTensor of global ``shape`` on a mesh this rank is not in (no data)."""
    stride = tuple(int(torch.Size(shape[i + 1:]).numel()) for i in range(len(shape)))
    return DTensor.from_local(torch.empty(0, dtype=dtype, device=_device_of(mesh)), mesh, pls,
                              run_check=False, shape=torch.Size(shape), stride=stride)


def _flat(tree):
    found = []
    _map_tensors(tree, found.append)
    return found


class _Hop(torch.autograd.Function):
    """A tensor crossing meshes: the whole tensor (on the source mesh's ranks) broadcast from
    its first rank (``root``) to every rank; backward, the gradient of the destination mesh's
    first rank (every rank of that mesh holds the whole one) summed to every rank, the source
    ranks' gradient of the whole tensor.  The token in and out orders it among the others."""

    @staticmethod
    def forward(ctx, token, full, root, shape, dtype, contributes, source):
        buf = (full.detach().contiguous().clone() if source
               else torch.empty(shape, dtype=dtype, device=token.device))
        if root is not None:               # None: every rank holds the whole tensor already
            dist.broadcast(buf, root)
        ctx.shape, ctx.dtype, ctx.contributes, ctx.source = shape, dtype, contributes, source
        if not dtype.is_floating_point:
            ctx.mark_non_differentiable(buf)
        return token.clone(), buf

    @staticmethod
    def backward(ctx, gtoken, gbuf):
        grad = None
        if ctx.dtype.is_floating_point:
            grad = (gbuf.contiguous().clone() if ctx.contributes and gbuf is not None
                    else torch.zeros(ctx.shape, dtype=ctx.dtype, device=gtoken.device))
            dist.all_reduce(grad)
        return gtoken, (grad if ctx.source else None), None, None, None, None, None


class _Tie(torch.autograd.Function):
    """Identity on the token and some tensors: in the backward pass none of them is done
    before all of them have their gradients.  A DTensor that gets none (read only by a
    comparison, as an MoE's slot numbers are) gets zeros in its own layout: autograd would
    otherwise hand the op that made it a plain zero tensor, which DTensor's backward refuses."""

    @staticmethod
    def forward(ctx, token, *ts):
        ctx.set_materialize_grads(False)      # a rank that does not compute the layer
        ctx.zeros = [_zeros_of(t) for t in ts]
        return (token.clone(), *(t.view_as(t) for t in ts))   # leaves its inputs unused

    @staticmethod
    def backward(ctx, gtoken, *grads):
        return (gtoken, *(z() if g is None and z is not None else g
                          for g, z in zip(grads, ctx.zeros)))


def _zeros_of(t):
    """A function making a zero gradient for the DTensor ``t`` (its mesh, its placements with
    Partial as Replicate, its shard's shape), or None for a plain tensor."""
    if not isinstance(t, DTensor):
        return None
    with torch.no_grad():
        local = t.to_local()
    mesh, shape, stride = t.device_mesh, t.shape, t.stride()
    pls = [Replicate() if p.is_partial() else p for p in t.placements]
    lshape, dtype, device = tuple(local.shape), local.dtype, local.device
    return lambda: DTensor.from_local(torch.zeros(lshape, dtype=dtype, device=device), mesh,
                                      pls, run_check=False, shape=shape, stride=stride)


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
    calls: dict = {}
    for nd in gm.graph.nodes:
        spec = layouts.get(nd.name)
        if spec is not None and spec["mode"] == "module":
            owned[nd.target] = spec
        if nd.op == "call_module":
            calls.setdefault(nd.target, []).append(spec)
    # a module computed through DTensor by one layer on a sub-mesh keeps its parameters there
    homes = {m: specs[0] for m, specs in calls.items() if len(specs) == 1
             and specs[0] is not None and specs[0].get("ranks") and m not in owned}
    sharded = {m: s["fsdp"] for m, s in owned.items() if s.get("fsdp")}
    # a weight an op layer reads (an experts layer's) stored as that layer reads it
    weights = {p: (codes, spec) for spec in layouts.values()
               for p, codes in (spec.get("weights") or {}).items()}
    for mname, mod in gm.named_modules():
        spec = owned.get(mname)
        if mname in sharded or any(mname.startswith(m + ".") for m in sharded):
            continue                   # fully_shard distributes these below
        owner = spec
        if spec is None:
            owner = next((other for prefix, other in {**homes, **owned}.items()  # a submodule
                          if mname == prefix or mname.startswith(prefix + ".")), None)
        pmesh = lay.mesh_of(owner)            # the owning layer's mesh (a sub-mesh, or all)
        for pname, p in list(mod.named_parameters(recurse=False)):
            codes = (spec["params"].get(pname) if spec else None) or ["R"] * pmesh.ndim
            if spec is None and owner is not None and "params" in owner:
                prefix = next(m for m, o in owned.items() if o is owner
                              and mname.startswith(m + "."))
                key = mname[len(prefix) + 1:] + "." + pname
                codes = owner["params"].get(key, codes)
            where, full = pmesh, (f"{mname}.{pname}" if mname else pname)
            if full in weights:
                codes, reader = weights[full]
                where = lay.mesh_of(reader)
            pls = [Replicate() if c in ("R", "mask") else placement(c) for c in codes]
            mod.register_parameter(pname, torch.nn.Parameter(
                distribute_tensor(p.detach(), where, pls)))
        if list(mod.parameters(recurse=False)):
            for bname, b in list(mod.named_buffers(recurse=False)):
                if b is not None and b.is_floating_point():
                    mod.register_buffer(bname, DTensor.from_local(
                        b, pmesh, [Replicate()] * pmesh.ndim, run_check=False))
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


def stage_of_nodes(gm, stage_of, n_stages):
    """fx node -> pipeline stage of the traced model ``gm``: a layer's node its plan's stage
    (``stage_of``), the model's inputs stage 0, its output the last stage, an op between
    layers (a view, a shape, an op folded into a layer) the first stage that reads it (so
    the tensors a stage boundary carries are the layers' outputs); a constant (``get_attr``)
    none: each stage that reads it has its own copy.  Raises ValueError when a node would
    read a later stage's value (the stages are not contiguous in the graph)."""
    nodes = list(gm.graph.nodes)
    where = {}
    for nd in reversed(nodes):
        if nd.op == "output":
            where[nd] = n_stages - 1
        elif nd.name in stage_of:
            where[nd] = int(stage_of[nd.name])
        elif nd.op == "placeholder":
            where[nd] = 0
        elif nd.op != "get_attr":
            users = [where[u] for u in nd.users if where.get(u) is not None]
            where[nd] = min(users) if users else None        # None: nothing reads it
    for nd in nodes:
        for a in nd.all_input_nodes:
            if where.get(a) is not None and where.get(nd) is not None and where[a] > where[nd]:
                raise ValueError(f"{nd.name} (stage {where[nd]}) reads {a.name} of the later "
                                 f"stage {where[a]}")
    return where


def _recomputed(fn):
    """``fn`` under ``torch.utils.checkpoint`` (non-reentrant): nothing of it is kept for
    the backward pass but its inputs, and its forward runs again there."""
    def run(*args, **kwargs):
        return checkpoint(fn, *args, use_reentrant=False, **kwargs)
    return run


def _recompute_module(module, *args, **kwargs):
    return checkpoint(module, *args, use_reentrant=False, **kwargs)


def _recomputed_node(g, nd, env):
    """A copy of the layer node ``nd`` in graph ``g`` that computes under checkpoint (a
    module layer reads its module through ``get_attr``, so the stage keeps its parameters)."""
    import torch.fx
    args = torch.fx.map_arg(nd.args, lambda a: env[a])
    kwargs = torch.fx.map_arg(nd.kwargs, lambda a: env[a])
    if nd.op == "call_module":
        return g.call_function(_recompute_module, (g.get_attr(nd.target), *args), kwargs)
    fn = _method(nd.target) if nd.op == "call_method" else nd.target
    return g.call_function(_recomputed(fn), args, kwargs)


def split_stages(gm, stage_of, n_stages, recompute=()):
    """``(modules, received)``: the traced model ``gm`` cut into one ``GraphModule`` per
    pipeline stage (:func:`stage_of_nodes`), sharing ``gm``'s parameters, and per stage the
    names of the values it receives from the previous one.  A value read ``k`` stages after
    the one computing it is passed on by the stages between (a pipeline stage talks to its
    neighbours only); stage 0 takes the model's inputs, the last returns its output.  The
    layers named in ``recompute`` compute under ``torch.utils.checkpoint``."""
    import torch.fx
    nodes = list(gm.graph.nodes)
    where = stage_of_nodes(gm, stage_of, n_stages)
    last_use = {}
    for nd in nodes:
        if where.get(nd) is None:
            continue
        for a in nd.all_input_nodes:
            if where.get(a) is not None and where[a] < where[nd]:
                last_use[a] = max(last_use.get(a, -1), where[nd])
    received = [[a for a in nodes if a in last_use and where[a] < s <= last_use[a]]
                for s in range(n_stages)]
    modules = []
    for s in range(n_stages):
        g = torch.fx.Graph()
        env = {a: g.placeholder(a.name) for a in received[s]}
        for nd in nodes:
            if nd.op == "output":
                continue
            if nd.op == "placeholder":
                keep = s == 0
            elif nd.op == "get_attr":
                keep = any(where.get(u) == s for u in nd.users)
            else:
                keep = where.get(nd) == s
            if keep and nd.name in recompute and nd.op in ("call_function", "call_method",
                                                           "call_module"):
                env[nd] = _recomputed_node(g, nd, env)
            elif keep:
                env[nd] = g.node_copy(nd, lambda a: env[a])
        if s == n_stages - 1:
            g.output(torch.fx.map_arg(nodes[-1].args[0], lambda a: env[a]))
        else:
            sends = tuple(env[a] for a in received[s + 1])
            g.output(sends[0] if len(sends) == 1 else sends)
        modules.append(torch.fx.GraphModule(gm, g))
    return modules, [[a.name for a in r] for r in received]


def _local(t):
    """A DTensor's local shard (the tensor itself otherwise), sharing its storage (outside
    autograd ``to_local`` returns the shard itself)."""
    with torch.no_grad():
        return t.to_local() if isinstance(t, DTensor) else t


class Pipelined:
    """The plan's pipeline with ``torch.distributed.pipelining``: the ranks form a
    (stages x dp x tp) mesh ("pp", "dp", "tp"); this rank runs the stage module of its "pp"
    coordinate (:func:`split_stages`) as a ``PipelineStage`` under ``ScheduleGPipe`` or
    ``Schedule1F1B`` over the plan's micro-batches.  A stage's group is ``dp`` data-parallel
    replicas (each its share of the batch, or all of it when the micro-batch does not split
    over them; gradients averaged) of ``tp`` ranks, on which the stage's linears take
    ``ColwiseParallel`` / ``RowwiseParallel`` (``styles``), whole tensors between modules
    (the rest is replicated on the tp ranks).  Each micro-batch's loss is its
    mean and the schedule divides the accumulated gradients by the micro-batch count, so a
    step is the full batch's mean, as on one process.  A parameter several stages read (tied
    weights) has its gradients summed over their ranks."""

    def __init__(self, model, mesh, device):
        import torch.fx
        from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe
        from torch.distributed.pipelining.microbatch import TensorChunkSpec
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel
        self.model, self.mesh, self.device = model, mesh, device
        S, dp, tp = PIPELINE["stages"], PIPELINE["dp"], PIPELINE["tp"]
        self.s, self.d = mesh.get_local_rank("pp"), mesh.get_local_rank("dp")
        self.t = mesh.get_local_rank("tp")
        modules, _ = split_stages(torch.fx.symbolic_trace(model), PIPELINE["stage_of"], S,
                                  set(PIPELINE.get("recompute", ())))
        self.module = modules[self.s]
        name_of = {id(p): n for n, p in model.named_parameters()}
        self.readers = {}                 # parameter name -> the stages that read it
        for i, m in enumerate(modules):
            for p in m.parameters():
                self.readers.setdefault(name_of[id(p)], []).append(i)
        # tensor parallel inside the stage: its linears' styles on the stage's tp ranks,
        # outputs whole (replicated) between modules
        mine = dict(self.module.named_modules())
        styles = {path: (ColwiseParallel(output_layouts=Replicate()) if style == "colwise"
                         else RowwiseParallel(input_layouts=Replicate()))
                  for path, style in PIPELINE.get("styles", {}).items() if path in mine}
        if tp > 1 and styles:
            parallelize_module(self.module, mesh["tp"], styles)
        # ZeRO-2/3: fully_shard of a layer's module over the stage's dp replicas; gradients
        # reduce-scattered as sums (gloo has no average) and divided by the replicas below
        self.sharded = []
        for path, zero in PIPELINE.get("fsdp", {}).items():
            if dp > 1 and path in mine:
                fully_shard(mine[path], mesh=mesh["dp"], reshard_after_forward=zero >= 3)
                mine[path].set_gradient_divide_factor(1.0)
                mine[path].set_force_sum_reduction_for_comms(True)
                self.sharded += [id(p) for p in mine[path].parameters()]
        self.params = dict(model.named_parameters())
        self.ties, groups = {}, {}        # every rank creates every group, in one order
        for name, stages in sorted(self.readers.items()):
            if len(stages) < 2:
                continue
            for d in range(dp):
                for t in range(tp):
                    ranks = tuple(int(mesh.mesh[i, d, t]) for i in stages)
                    if ranks not in groups:
                        groups[ranks] = dist.new_group(list(ranks))
                    if (d, t) == (self.d, self.t) and self.s in stages:
                        self.ties[name] = groups[ranks]
        self.dp = mesh.get_group("dp") if dp > 1 else None
        stage = PipelineStage(self.module, self.s, S, device, group=mesh.get_group("pp"))
        kind = Schedule1F1B if PIPELINE["schedule"] == "1f1b" else ScheduleGPipe
        # the schedule divides the gradients by the micro-batch count (scale_grads, torch
        # >= 2.6); an older torch has no such option, and the step divides them itself
        import inspect
        self.divide = "scale_grads" not in inspect.signature(kind.__init__).parameters
        self.schedule = kind(stage, PIPELINE["micro_batches"],
                             loss_fn=lambda out, _target: loss_of(out),
                             args_chunk_spec=(TensorChunkSpec(BATCH_DIM),),
                             **({} if self.divide else {"scale_grads": True}))

    def input_of(self, x):
        """This rank's share of the batch: its replica's slice, or all of it."""
        dp = PIPELINE["dp"]
        return x.tensor_split(dp, dim=BATCH_DIM)[self.d] if PIPELINE["split"] and dp > 1 else x

    def step(self, x, lr):
        """One SGD step of the pipeline on ``x`` (this rank's share); the loss on every rank."""
        S, dp = PIPELINE["stages"], PIPELINE["dp"]
        losses = []
        # the schedule splits a target with the micro-batches; the loss reads the output only
        target = torch.zeros(x.shape[BATCH_DIM], device=self.device)
        with precision(self.device.type):
            self.schedule.step(*((x,) if self.s == 0 else ()), target=target, losses=losses)
        if self.divide:
            for p in self.module.parameters():
                if p.grad is not None:
                    p.grad.div_(PIPELINE["micro_batches"])
        with torch.no_grad():
            for name, group in sorted(self.ties.items()):
                if self.params[name].grad is not None:
                    dist.all_reduce(_local(self.params[name].grad), group=group)
            if self.dp is not None:
                for p in self.module.parameters():
                    if p.grad is not None:
                        g = _local(p.grad)       # a tensor-parallel shard: its own replicas
                        if id(p) not in self.sharded:    # (fully_shard summed its own)
                            dist.all_reduce(g, group=self.dp)
                        g.div_(dp)
        sgd_(self.module, lr)
        value = torch.zeros(1, dtype=torch.float64, device=self.device)
        if self.s == S - 1:
            value += torch.stack([v.detach().double() for v in losses]).mean()
            if self.dp is not None:
                dist.all_reduce(value, group=self.dp)
                value /= dp
        dist.broadcast(value, int(self.mesh.mesh[S - 1, 0, 0]))
        return float(value)

    def whole_params(self):
        """Every parameter of the model by name, from the first rank of the first stage that
        reads it (a collective: every rank calls it)."""
        out = {}
        for name, p in self.model.named_parameters():
            src = int(self.mesh.mesh[self.readers.get(name, [0])[0], 0, 0])
            t = (p.full_tensor() if isinstance(p, DTensor) else p).detach().contiguous().clone()
            dist.broadcast(t, src)
            out[name] = t.cpu()
        return out


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
    """A parameter as one full tensor (a collective for DTensors: every rank calls it); one
    on a sub-mesh is gathered there and broadcast from its first rank."""
    if not isinstance(p, DTensor):
        return p.detach()
    ranks = p.device_mesh.mesh.flatten().tolist()
    if len(ranks) == dist.get_world_size():
        return p.full_tensor().detach()
    full = (p.full_tensor().detach().contiguous().clone() if dist.get_rank() in ranks
            else torch.empty(p.shape, dtype=p.dtype, device=p.to_local().device))
    dist.broadcast(full, ranks[0])
    return full


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


def train(model, mesh, device, x, steps, lr):
    """``(losses, parameters after)`` of ``steps`` SGD steps of the plan's layouts (or of
    the (dp, tp) mesh's styles) applied to ``model``."""
    if LAYER_MESH:
        model = parallelize_layers(model, mesh, LAYOUTS)
        xs = x                     # the input layer takes its own shard
    else:
        parallelize(model, mesh)
        xs = x.tensor_split(MESH[0], dim=BATCH_DIM)[mesh.get_local_rank("dp")]
    losses = []
    for _ in range(steps):
        with precision(device.type):
            out = model(xs)
        if _LAYOUTS is not None:
            out = _LAYOUTS.finish(out)           # sub-mesh outputs onto the global mesh
        loss = loss_of(out)
        if _LAYOUTS is not None:
            loss = _LAYOUTS.anchor(loss)
        loss.backward()
        sgd_(model, lr)
        value = loss.detach().reshape(1).to(torch.float64)
        if MESH[0] > 1 and not LAYER_MESH:
            dist.all_reduce(value, group=mesh.get_group("dp"))
            value /= MESH[0]
        losses.append(float(value))
    return losses, {n: whole(p).cpu() for n, p in model.named_parameters()}


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
    if PIPELINE:
        mesh = init_device_mesh(device.type, (PIPELINE["stages"], PIPELINE["dp"],
                                              PIPELINE["tp"]), mesh_dim_names=("pp", "dp", "tp"))
    elif LAYER_MESH:
        mesh = init_device_mesh(device.type, tuple(LAYER_MESH),
                                mesh_dim_names=tuple(f"m{i}" for i in range(len(LAYER_MESH))))
    else:
        mesh = init_device_mesh(device.type, MESH, mesh_dim_names=("dp", "tp"))
    if rank == 0:
        if PIPELINE:
            shape = (f"pp={PIPELINE['stages']} x dp={PIPELINE['dp']} x tp={PIPELINE['tp']} "
                     f"({PIPELINE['schedule']}, {PIPELINE['micro_batches']} micro-batches)")
        else:
            shape = (" x ".join(str(s) for s in LAYER_MESH) + " (one placement per layer)"
                     if LAYER_MESH else f"dp={MESH[0]} x tp={MESH[1]}")
        count = len(PIPELINE["stage_of"]) if PIPELINE else len(LAYOUTS)
        print(f"{DEVICES} processes, mesh {shape}, {args.steps} steps, {DTYPE}; "
              f"{count - len(NOT_AS_PLANNED) if count else '?'} of "
              f"{count or '?'} layers as planned")
        for layer, planned, exported, reason in NOT_AS_PLANNED:
            print(f"not as planned: {layer}: plan {planned} -> {exported}: {reason}")
        for planned, exported, reason in PIPELINE_NOT_AS_PLANNED:
            print(f"not as planned: the pipeline: plan {planned} -> {exported}: {reason}")
    torch.manual_seed(SEED)
    model, x = build_model()
    model, x = model.to(device).eval(), x.to(device)   # eval: dropout off, BatchNorm running
    reference = copy.deepcopy(model) if args.check and rank == 0 else None   # stats (as the
    before = {n: p.detach().clone() for n, p in model.named_parameters()}    # reference)
    if PIPELINE:
        pipe = Pipelined(model, mesh, device)
        xs = pipe.input_of(x)
        losses = [pipe.step(xs, args.lr) for _ in range(args.steps)]
        after = pipe.whole_params()
    else:
        losses, after = train(model, mesh, device, x, args.steps, args.lr)
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

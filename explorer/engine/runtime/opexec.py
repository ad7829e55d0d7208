"""Execute an operator-level plan (a Tofu partition or a device placement) on local workers
and check it against one device.

Every worker interprets the traced training step (the same ``make_fx`` graph the plan was
made from) aten call by aten call.  Each tensor lives on a worker only inside the box the plan
gives it; before an operator runs, the worker receives exactly the parts of the input regions
it needs that other workers hold (the plan's ``N_w \\ H_w``), runs the aten call on
zero-padded full-size buffers, keeps its output box (a partial sum for a split reduction -
terms outside the reduction, e.g. a bias, added by one worker only; a partial max for a split
max), and sends the parts other workers hold to them, which add the partial results up.

So the run moves exactly the bytes the plan predicts (checked), and the loss and every updated
parameter are compared with a single-device run of the same step.  Both trace the model in
train mode (:mod:`explorer.engine.capture`, with the model file's ``loss(output)`` when it has
one) and compute under its deterministic numerics (dropout the identity, BatchNorm with batch
statistics); a step that still draws random numbers is refused.  For a Tofu plan each worker
computes its ops on full-size zero-padded buffers: the runtime checks a plan's data movement
and results, it does not make the step faster.  A device placement is the special case where
every box is a whole tensor on one device (:func:`placement_xplan`): each worker then computes
only its own operators and tensors travel once to each device that reads them, so the step
time is measured too.
"""

from __future__ import annotations

import os
import time

import numpy as np
import torch
import torch.distributed as dist

from ...errors import InfeasiblePlan
from ..geometry import TensorLayout
from ..geometry import common as _inter, inside as _inside, to_slices as _sl
from .launcher import RunFailed

__all__ = ["run_layout", "run_placement", "placement_xplan", "placement_comm_bytes"]

#: random ops :class:`~explorer.engine.capture.deterministic` cannot make the identity
#: (it makes ``native_dropout`` the identity; ``bernoulli_``, which dropout traces to, stays)
_NOT_DETERMINISTIC = {"bernoulli", "bernoulli_", "rand_like", "randn_like"}


def _flat(t):
    """A 0-d tensor as a 1-element view, so a placement's [(0, 1)] box can address it."""
    return t.reshape(1) if t.dim() == 0 else t


class _Worker:
    def __init__(self, rank, world, g, xplan, timeout_s):
        self.rank, self.world, self.g, self.x = rank, world, g, xplan
        self.sent = 0
        self.extra = 0
        self.tag = 0
        self.delivered: set = set()
        self.compute_s = 0.0
        self.received: dict = {}

    # -- transfers ---------------------------------------------------------------------------
    def exchange(self, transfers, source):
        """``transfers``: [(src, dst, box)] in the same order on every worker; ``source(box)``
        gives this worker's data for a box it sends.  Returns {index: received tensor}."""
        reqs, got = [], {}
        for i, (src, dst, box, like) in enumerate(transfers):
            tag = (self.tag + i) % (1 << 30)
            if src == self.rank:
                data = source(i, box).contiguous()
                self.sent += data.numel() * (4 if data.is_floating_point()
                                             else data.element_size())
                reqs.append(dist.isend(data, dst, tag=tag))
            elif dst == self.rank:
                buf = torch.empty(tuple(int(b - a) for a, b in box), dtype=like.dtype)
                got[i] = buf
                reqs.append(dist.irecv(buf, src, tag=tag))
        for r in reqs:
            r.wait()
        self.tag += len(transfers)
        return got

    def fetch(self, t, env_val, needs, fill):
        """Full-size buffer of tensor ``t`` valid in this worker's needed region (None when
        this worker needs nothing of it).  With ``xplan["cache"]`` a piece delivered once to
        a worker is not sent again (a placement keeps received tensors)."""
        held = self.x["held"][t]
        K = self.world
        cache = self.x.get("cache", False)
        transfers = []
        for w in range(K):
            taken = []
            for w2 in range(K):
                if w2 == w:
                    continue
                piece = _inter(needs[w], held[w2])
                if piece is None or _inside(piece, held[w]) or \
                        any(_inside(piece, p) for p in taken):
                    continue
                taken.append(piece)
                key = (t, w, piece.tobytes())
                if cache and key in self.delivered:
                    continue
                if cache:
                    self.delivered.add(key)
                transfers.append((w2, w, piece, env_val))
        got = self.exchange(transfers, lambda i, box: _flat(env_val)[_sl(box)])
        if cache:
            for i, data in got.items():
                self.received[(t, transfers[i][2].tobytes())] = data
        if _inter(needs[self.rank], needs[self.rank]) is None:
            return None
        if fill == 0.0 and _inside(needs[self.rank], held[self.rank]) and \
                bool((held[self.rank][:, 0] == 0).all()) and \
                tuple(held[self.rank][:, 1]) == (tuple(env_val.shape) or (1,)):
            return env_val                # this worker holds the whole tensor: no copy
        buf = torch.full(env_val.shape, fill, dtype=env_val.dtype)
        if cache:
            for (tt, bb), data in self.received.items():
                if tt == t:
                    box = np.frombuffer(bb, dtype=np.int64).reshape(-1, 2)
                    _flat(buf)[_sl(box)] = data
        own = _inter(needs[self.rank], held[self.rank])
        if own is not None:
            _flat(buf)[_sl(own)] = _flat(env_val)[_sl(own)]
        for i, data in got.items():
            _flat(buf)[_sl(transfers[i][2])] = data
        return buf

    def distribute(self, t, result, out, reducer):
        """Send the parts of this worker's output box others hold; combine what arrives."""
        held = self.x["held"][t]
        K = self.world
        transfers = []
        for dst in range(K):
            taken = []
            for src in range(K):
                if src == dst:
                    continue
                piece = _inter(out[src], held[dst])
                if piece is None:
                    continue
                if reducer is None and (_inside(piece, out[dst]) or
                                        any(_inside(piece, p) for p in taken)):
                    continue             # the receiver computed it, or another sender sends it
                taken.append(piece)
                transfers.append((src, dst, piece, result))
        got = self.exchange(transfers, lambda i, box: _flat(result)[_sl(box)])
        if reducer is None and not got and np.array_equal(out[self.rank], held[self.rank]):
            return result                 # computed exactly what this worker holds
        fill = float("-inf") if reducer == "max" else 0.0
        acc = torch.full(result.shape, fill if reducer else 0.0, dtype=result.dtype)
        own = _inter(out[self.rank], held[self.rank])
        if own is not None:
            _flat(acc)[_sl(own)] = _flat(result)[_sl(own)]
        for i, data in got.items():
            box = _sl(transfers[i][2])
            fa = _flat(acc)
            if reducer == "sum":
                fa[box] = fa[box] + data
            elif reducer == "max":
                fa[box] = torch.maximum(fa[box], data)
            else:
                fa[box] = data
        if reducer == "max":
            acc = torch.where(torch.isinf(acc), torch.zeros_like(acc), acc)
        return acc

    # -- the step ----------------------------------------------------------------------------
    def full_value(self, val):
        """Every worker gets the whole of a tensor the plan does not describe (counted apart)."""
        return val

    def step(self, params, buffers, x):
        """One traced step in the reference's numerics (dropout the identity, BatchNorm with
        batch statistics: :mod:`explorer.engine.capture`)."""
        from ..capture import deterministic
        with deterministic(running_stats=False):
            return self._step(params, buffers, x)

    def _step(self, params, buffers, x):
        import operator
        g, gm = self.g, self.g.gm
        env: dict = {}
        tensor_of: dict = {}            # fx node name -> tensor id
        for t in g.tensors:
            tensor_of[t] = t
        ph = [n for n in gm.graph.nodes if n.op == "placeholder"]
        values = list(params) + list(buffers) + [x]
        for n, v in zip(ph, values):
            env[n.name] = v
        # placeholders -> tensor ids in order
        pids = list(g.params.values()) + [f"buffer:{b}" for b in g.buffer_names] + g.inputs
        tval: dict = {}
        for t, v in zip(pids, values):
            v = v.detach().clone()
            if t in self.x["held"]:       # keep only the worker's box: the plan must bring the rest
                h = self.x["held"][t][self.rank]
                mask = torch.zeros_like(v, dtype=torch.bool)
                _flat(mask)[_sl(h)] = True
                v = torch.where(mask, v, torch.zeros_like(v))
            tval[t] = v
        by_node: dict = {}
        for o in g.ops.values():
            by_node.setdefault(o.node, []).append(o)
        from ..opgraph import _DROP, _target
        alias: dict = {}
        for n in gm.graph.nodes:
            if n.op != "call_function" or n.target is operator.getitem:
                continue
            name = _target(n)
            if name in _DROP and n.args and isinstance(n.args[0], torch.fx.Node):
                alias[n.name] = n.args[0].name
            if name in _NOT_DETERMINISTIC:
                raise InfeasiblePlan(f"op {n.name} (aten.{name}) draws random numbers: the "
                                     f"operator-level runtime cannot check it against one "
                                     f"device")

        def sub(a, bufs, fa=None):
            if isinstance(a, str) and a in g.tensors:
                return bufs.get(a, tval.get(a))
            if a is None and isinstance(fa, torch.fx.Node):
                return _constant(gm, fa)  # a tensor constant of the trace (no tensor id)
            if isinstance(a, (list, tuple)):
                fas = fa if isinstance(fa, (list, tuple)) else [None] * len(a)
                return type(a)(sub(b, bufs, fb) for b, fb in zip(a, fas))
            return a

        def call(n, o, bufs):
            return n.target(*sub(o.args, bufs, n.args),
                            **{k: sub(v, bufs, n.kwargs.get(k)) for k, v in o.kwargs.items()})

        for n in gm.graph.nodes:
            if n.op != "call_function" or n.target is operator.getitem or n.name in alias:
                continue
            for o in by_node.get(n.name, []):
                info = self.x["ops"].get(o.name)
                if info is None:          # a source or scalar bookkeeping: computed everywhere
                    res = call(n, o, {})
                    tval[o.output] = res[o.index] if isinstance(res, (tuple, list)) else res
                    continue
                fill = float("-inf") if info["reducer"] == "max" else 0.0
                bufs = {}
                for t, need in info["needs"].items():
                    b = self.fetch(t, tval[t], need, fill)
                    if b is not None and t in info["zero"] and info["zero"][t][self.rank]:
                        b = torch.zeros_like(b)
                    bufs[t] = b
                if _inter(info["out"][self.rank], info["out"][self.rank]) is None:
                    # nothing of this output is computed here (e.g. another device's op)
                    ten = g.tensors[o.output]
                    res = torch.zeros(ten.shape, dtype=getattr(torch, ten.dtype, torch.float64))
                else:
                    for t in sorted(t for t in o.inputs if bufs.get(t) is None):
                        # an argument the description of this output does not read (e.g. x
                        # for convolution_backward's data gradient): its values must not matter
                        bufs[t] = torch.zeros_like(tval[t])
                    t0 = time.perf_counter()
                    res = call(n, o, bufs)
                    res = res[o.index] if isinstance(res, (tuple, list)) else res
                    self.compute_s += time.perf_counter() - t0
                tval[o.output] = self.distribute(o.output, res, info["out"], info["reducer"])
        return tval

    def gather_full(self, t, val):
        held = self.x["held"].get(t)
        if held is None:
            return val
        out = torch.zeros_like(val)
        parts = [None] * self.world
        boxes = [held[w] for w in range(self.world)]
        transfers = []
        for dst in range(self.world):
            for src in range(self.world):
                if src != dst and not _inside(boxes[src], boxes[dst]):
                    transfers.append((src, dst, boxes[src], val))
        before = self.sent
        got = self.exchange(transfers, lambda i, box: _flat(val)[_sl(box)])
        self.extra += self.sent - before
        _flat(out)[_sl(boxes[self.rank])] = _flat(val)[_sl(boxes[self.rank])]
        for i, data in got.items():
            _flat(out)[_sl(transfers[i][2])] = data
        del parts
        return out


def _constant(gm, node):
    """The tensor constant an fx argument refers to (``get_attr``, possibly through dropped
    aliases such as ``lift_fresh_copy``: an empty key cache of a Hugging Face model), else
    None."""
    from ..opgraph import _DROP, _target
    while node.op == "call_function" and _target(node) in _DROP and node.args and \
            isinstance(node.args[0], torch.fx.Node):
        node = node.args[0]
    return getattr(gm, node.target) if node.op == "get_attr" else None


def _build(spec, batch, model_args, seed, lr, dtype=torch.float64):
    """The real model and input (seeded: every worker and the reference get the same), in
    float64 by default so that a wrong region shows as a large error, not as rounding."""
    from ..capture import load, loss_function
    from ..opgraph import build_from_module
    torch.manual_seed(seed)
    model, x = load(spec, batch, model_args, meta=False)          # train mode
    if dtype is not None:
        model = model.to(dtype)
        if x.is_floating_point():
            x = x.to(dtype)
    g = build_from_module(model, x, spec, lr, loss_function(spec))
    params = [p.detach() for n, p in model.named_parameters() if p.requires_grad]
    buffers = [b.detach() for _, b in model.named_buffers()]
    return g, params, buffers, x


def _op_entry(rank, world, device, job, send):
    """One worker of an operator-level run (the entry :func:`launcher.start_workers` calls):
    trace the step, check the trace is the plan's graph, run ``steps`` steps; rank 0 sends the
    loss and updated parameters, every rank its bytes and times."""
    from ..opgraph import opgraph_digest
    from .executor import parse_fault
    from .worker import FAULT_ENV, inject_fault
    fault = parse_fault(job.get("fault") or os.environ.get(FAULT_ENV))
    g, params, buffers, x = _build(job["spec"], job["batch"], job["model_args"],
                                   job["seed"], job["lr"])
    if opgraph_digest(g) != job["digest"]:
        raise InfeasiblePlan("the worker's trace of the model differs from the plan's "
                             "operator graph (model code or arguments changed?)")
    xplan = job["xplan"]
    w = _Worker(rank, world, g, xplan, job["timeout_s"])
    from .memlimit import arm, disarm
    arm()                              # --memory-per-worker counts the steps (set up done)
    times = []
    for i in range(max(1, int(job.get("steps", 1)))):
        inject_fault(fault, rank, i + 1, "operator-level step")
        w.delivered.clear()
        w.received.clear()
        w.compute_s = 0.0
        if world > 1:
            dist.barrier()
        t0 = time.perf_counter()
        tval = w.step(params, buffers, x)
        times.append(time.perf_counter() - t0)
        if i == 0:
            sent, extra, compute_s = w.sent, w.extra, w.compute_s
    disarm()                           # the final gather is not part of the steps
    step_s = float(np.median(times[1:] if len(times) > 2 else times))
    # updated parameters and the loss back on rank 0 (not part of the step's traffic)
    finals = {}
    flat = list(list(g.gm.graph.nodes)[-1].args[0])
    npar = len(g.param_names)
    new_ids = [a.name if isinstance(a, torch.fx.Node) else None
               for a in flat[1 + npar:1 + 2 * npar]]
    for pn, tid in zip(g.param_names, new_ids):
        if tid is None or tid not in tval:
            continue
        finals[pn] = w.gather_full(tid, tval[tid]) if tid in xplan["held"] else tval[tid]
    loss = None
    if g.loss in tval:
        loss = w.gather_full(g.loss, tval[g.loss]) if g.loss in xplan["held"] else tval[g.loss]
    if job.get("debug"):               # every tensor's value inside this worker's box
        dbg = {}
        for t, v in tval.items():
            h = xplan["held"].get(t)
            if h is not None and torch.is_tensor(v):
                dbg[t] = (h[rank], v[_sl(h[rank])].detach().numpy())
        send("result", "debug", dbg)
    if rank == 0:
        send("result", "main", {"loss": None if loss is None else float(loss),
                                "params": {k: v.numpy() for k, v in finals.items()}})
    send("result", "stats", (sent, extra, step_s, compute_s, times))
    if world > 1:
        dist.barrier()                 # nobody leaves while a peer still gathers


def run_layout(spec: str, batch: int | None, model_args: dict | None, xplan: dict, *,
               digest: str, steps: int = 1, seed: int = 0, lr: float = 0.01,
               timeout_s: float = 300.0, tol: float = 1e-4, check: bool = True,
               fault: str | None = None, debug: bool = False,
               memory_limit: float | None = None) -> dict:
    """Run an execution layout (a Tofu plan's, or :func:`placement_xplan` of a placement) on
    ``xplan["workers"]`` gloo CPU processes and compare with one device.

    ``digest`` is the plan's :func:`~explorer.engine.opgraph.opgraph_digest`: every worker
    refuses a trace that differs.  Returns ``reference_ok`` / ``reference`` (the loss and every
    updated parameter against the float64 single-device step, :mod:`.reference`),
    ``max_rel_error``, ``loss`` / ``reference_loss``, ``measured_comm_bytes`` (bytes the
    workers exchanged during the first step), ``extra_bytes`` (the final gather, not part of
    the step), ``step_time_s`` (rank 0) and ``measured_step_time_s`` (the slowest worker;
    median of ``steps``), ``compute_s`` per worker and ``step_times_s``.
    ``memory_limit`` (bytes): stop a worker whose steps allocate more (:mod:`.memlimit`).
    """
    from .launcher import start_workers
    from .reference import compare, traced_step
    workers = int(xplan["workers"])
    job = {"spec": spec, "batch": batch, "model_args": dict(model_args or {}), "seed": seed,
           "lr": lr, "xplan": xplan, "fault": fault, "debug": debug, "digest": digest,
           "steps": max(1, int(steps)), "timeout_s": timeout_s}
    got = start_workers(workers, _op_entry, job, timeout_s=timeout_s, backend="gloo",
                        name="explorer-op-worker", memory_limit=memory_limit)
    main = got.results.get(0, {}).get("main")
    stats = {r: v["stats"] for r, v in got.results.items() if "stats" in v}
    if main is None or len(stats) != workers:
        raise RunFailed("the workers finished without sending their results", 0, got.pids)
    out = {"model": spec, "workers": workers, "loss": main["loss"],
           "measured_comm_bytes": float(sum(v[0] - v[1] for v in stats.values())),
           "extra_bytes": float(sum(v[1] for v in stats.values())),
           "step_time_s": stats[0][2],
           "measured_step_time_s": max(v[2] for v in stats.values()),
           "compute_s": [stats[r][3] for r in sorted(stats)],
           # each step's wall time on the slowest worker (the first step includes warm-up)
           "step_times_s": [max(ts) for ts in zip(*(v[4] for v in stats.values()))],
           "launch_time_s": got.elapsed_s, "pids": got.pids, "backend": got.backend,
           "reference": None, "reference_ok": None, "max_rel_error": None,
           "reference_loss": None}
    if check:
        g, params, buffers, x = _build(spec, batch, model_args, seed, lr)
        ref = traced_step(g, params, buffers, x)
        got_params = {k: torch.from_numpy(v) for k, v in main["params"].items()}
        doc = compare(main["loss"], got_params, None, ref, None, tol)
        out.update(reference=doc, reference_ok=doc["ok"], max_rel_error=doc["max_rel_error"],
                   reference_loss=ref[0])
    if debug:
        out["debug"] = {r: v["debug"] for r, v in got.results.items() if "debug" in v}
    return out


def placement_xplan(g, names, placement, workers: int) -> dict:
    """Execution boxes of a device placement: each operator computed whole on its device,
    each tensor held whole by its producer's device (placeholders: their own node's)."""
    dev = {nm: int(d) for nm, d in zip(names, placement)}
    bad = sorted({d for d in dev.values() if not 0 <= d < workers})
    if bad:
        raise InfeasiblePlan(f"the placement uses devices {bad}; this run has {workers} "
                             f"workers (0..{workers - 1})")

    def on(d, shape):                 # d None: every worker (a placeholder no op places)
        return TensorLayout.whole_on(shape, d, workers).boxes
    held = {}
    for t, ten in g.tensors.items():
        d = dev.get(ten.producer) if ten.producer else dev.get(t)
        held[t] = on(d, ten.shape)
    ops = {}
    for o in g.ops.values():
        if o.name not in dev:
            continue
        d = dev[o.name]
        ops[o.name] = {"out": on(d, g.tensors[o.output].shape),
                       "needs": {t: on(d, g.tensors[t].shape) for t in dict.fromkeys(o.inputs)},
                       "reducer": None, "zero": {}}
    return {"held": held, "ops": ops, "workers": workers, "cache": True}


def placement_comm_bytes(g, names, placement) -> float:
    """Bytes a placement must move per step: each tensor once to every other device that
    reads it."""
    dev = {nm: int(d) for nm, d in zip(names, placement)}
    consumers = g.consumers()
    pred = 0.0
    for t, ten in g.tensors.items():
        src = dev.get(ten.producer) if ten.producer else dev.get(t)
        readers = {dev[o] for o in consumers[t] if o in dev}
        pred += ten.bytes * len(readers - {src})
    return pred


def run_placement(spec: str, batch: int | None, model_args: dict | None, names, placement,
                  workers: int = 2, seed: int = 0, lr: float = 0.01, timeout_s: float = 300.0,
                  tol: float = 1e-4, steps: int = 3, fault: str | None = None, g=None,
                  check: bool = True, memory_limit: float | None = None) -> dict:
    """Run a device placement (operator -> device) on ``workers`` gloo processes: each worker
    computes its operators, tensors go to the devices that consume them (once), and the
    result is compared with one device.  Returns the :func:`run_layout` keys plus
    ``predicted_comm_bytes``.  ``g``: the model's operator graph when the caller has it."""
    from ..opgraph import build_opgraph, opgraph_digest
    if g is None:
        g = build_opgraph(spec, batch, model_args)
    names = list(names)
    missing = [o for o in g.ops if o not in set(names)]
    if missing:
        raise InfeasiblePlan(f"the placement does not cover operator {missing[0]} of "
                             f"{spec} ({len(missing)} missing): was it made for another model "
                             f"or batch?")
    x = placement_xplan(g, names, placement, workers)
    out = run_layout(spec, batch, model_args, x, digest=opgraph_digest(g), steps=steps,
                     seed=seed, lr=lr, timeout_s=timeout_s, tol=tol, fault=fault, check=check,
                     memory_limit=memory_limit)
    out["predicted_comm_bytes"] = placement_comm_bytes(g, names, placement)
    return out

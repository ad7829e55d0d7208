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
parameter are compared with a single-device run of the same step.  For a Tofu plan each worker
computes its ops on full-size zero-padded buffers: the runtime checks a plan's data movement
and results, it does not make the step faster.  A device placement is the special case where
every box is a whole tensor on one device (:func:`placement_xplan`): each worker then computes
only its own operators and tensors travel once to each device that reads them, so the step
time is measured too.
"""

from __future__ import annotations

import os
import queue as queue_mod
import time
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist

from ...errors import InfeasiblePlan
from ..geometry import TensorLayout
from ..geometry import common as _inter, inside as _inside, to_slices as _sl
from .launcher import _PEER_HINTS, RunFailed, _free_port, _kill
from .worker import _set_pdeathsig, destroy_group, report_and_exit

__all__ = ["run_tofu_plan", "run_placement", "placement_xplan", "graph_digest"]

_NOT_DETERMINISTIC = {"bernoulli", "bernoulli_", "native_dropout", "rand_like", "randn_like"}


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
                                     f"Tofu runtime cannot check a model with dropout")

        def sub(a, bufs):
            if isinstance(a, str) and a in g.tensors:
                return bufs.get(a, tval.get(a))
            if isinstance(a, (list, tuple)):
                return type(a)(sub(b, bufs) for b in a)
            return a

        for n in gm.graph.nodes:
            if n.op != "call_function" or n.target is operator.getitem or n.name in alias:
                continue
            for o in by_node.get(n.name, []):
                info = self.x["ops"].get(o.name)
                if info is None:          # a source or scalar bookkeeping: computed everywhere
                    res = n.target(*sub(o.args, {}), **sub(o.kwargs, {}))
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
                    res = n.target(*sub(o.args, bufs), **sub(o.kwargs, bufs))
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


def _build(spec, batch, model_args, seed, lr, dtype=torch.float64):
    """The real model and input (seeded: every worker and the reference get the same), in
    float64 by default so that a wrong region shows as a large error, not as rounding."""
    from ..importer import load_model
    from ..opgraph import build_from_module
    torch.manual_seed(seed)
    model, x = load_model(spec, batch, model_args, meta=False)
    model.train()
    if dtype is not None:
        model = model.to(dtype)
        if x.is_floating_point():
            x = x.to(dtype)
    g = build_from_module(model, x, spec, lr)
    params = [p.detach() for n, p in model.named_parameters() if p.requires_grad]
    buffers = [b.detach() for _, b in model.named_buffers()]
    return g, params, buffers, x


def graph_digest(g) -> str:
    """Operators, targets and shapes: the workers' trace must be the plan's graph."""
    import hashlib
    h = hashlib.sha256()
    for o in g.ops.values():
        h.update(f"{o.name}|{o.target}|{o.index}|{g.tensors[o.output].shape};".encode())
    return h.hexdigest()[:16]


def _entry(rank, world, port, job, q, timeout_s):
    _set_pdeathsig()           # a cancelled or killed launcher takes its workers with it
    os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
    torch.set_num_threads(1)
    try:
        dist.init_process_group("gloo", rank=rank, world_size=world,
                                timeout=timedelta(seconds=float(timeout_s)))
        g, params, buffers, x = _build(job["spec"], job["batch"], job["model_args"],
                                       job["seed"], job["lr"])
        if graph_digest(g) != job["digest"]:
            raise InfeasiblePlan("the worker's trace of the model differs from the plan's "
                                 "operator graph (model code or arguments changed?)")
        w = _Worker(rank, world, g, job["xplan"], timeout_s)
        if job.get("fault") == "raise" and rank == 1:
            raise RuntimeError("injected fault: worker 1 raised mid-step")
        times = []
        for i in range(max(1, int(job.get("steps", 1)))):
            w.delivered.clear()
            w.received.clear()
            w.compute_s = 0.0
            dist.barrier()
            t0 = time.perf_counter()
            tval = w.step(params, buffers, x)
            times.append(time.perf_counter() - t0)
            if i == 0:
                sent, extra, compute_s = w.sent, w.extra, w.compute_s
        step_s = float(np.median(times[1:] if len(times) > 2 else times))
        # updated parameters and the loss back on rank 0 (not part of the step's traffic)
        finals = {}
        out_node = list(g.gm.graph.nodes)[-1]
        flat = list(out_node.args[0])
        npar = len(g.param_names)
        new_ids = []
        for a in flat[1 + npar:1 + 2 * npar]:
            new_ids.append(a.name if isinstance(a, torch.fx.Node) else None)
        for pn, tid in zip(g.param_names, new_ids):
            if tid is None or tid not in tval:
                continue
            full = w.gather_full(tid, tval[tid]) if tid in job["xplan"]["held"] else tval[tid]
            finals[pn] = full
        loss_id = g.loss
        loss = None
        if loss_id in tval:
            loss = w.gather_full(loss_id, tval[loss_id]) \
                if loss_id in job["xplan"]["held"] else tval[loss_id]
        if job.get("debug"):               # every tensor's value inside this worker's box
            dbg = {}
            for t, v in tval.items():
                h = job["xplan"]["held"].get(t)
                if h is not None and torch.is_tensor(v):
                    dbg[t] = (h[rank], v[_sl(h[rank])].detach().numpy())
            q.put(("debug", rank, dbg, None))
        if rank == 0:
            q.put(("result", rank, {"loss": None if loss is None else float(loss),
                                    "params": {k: v.numpy() for k, v in finals.items()},
                                    "sent": sent, "extra": extra, "step_s": step_s,
                                    "compute_s": compute_s, "times": times}, None))
        else:
            q.put(("sent", rank, (sent, extra, step_s, compute_s, times), None))
        q.put(("done", rank, None, None))
        dist.barrier()
    except BaseException as exc:  # noqa: BLE001 - report, then die
        report_and_exit(q, rank, exc)
    finally:
        destroy_group()


def _reference(spec, batch, model_args, seed, lr):
    g, params, buffers, x = _build(spec, batch, model_args, seed, lr)
    out = g.gm(list(params), list(buffers), x)
    npar = len(g.param_names)
    loss = float(out[0])
    new = {pn: v.detach().numpy() for pn, v in zip(g.param_names, out[1 + npar:1 + 2 * npar])}
    return loss, new


def run_tofu_plan(spec: str, batch: int | None, model_args: dict | None, workers: int = 2,
                  algo: str = "tofu", seed: int = 0, lr: float = 0.01, timeout_s: float = 300.0,
                  tol: float = 1e-4, fault: str | None = None, plan=None,
                  debug: bool = False) -> dict:
    """Search (or take) a Tofu plan for ``spec`` and run one training step of it on
    ``workers`` gloo CPU processes; compare with one device.

    Returns ``reference_ok``, ``loss`` / ``reference_loss``, ``max_rel_error`` over the updated
    parameters, ``measured_comm_bytes`` (bytes the workers exchanged) against
    ``predicted_comm_bytes`` (the plan's), and the step's wall time.
    """
    from ..opgraph import build_opgraph
    from ..search import tofu
    if workers < 1:
        raise InfeasiblePlan(f"workers must be ≥ 1, got {workers}")
    g = build_opgraph(spec, batch, model_args)
    res = plan if plan is not None else tofu.search(g, workers, options={"algo": algo})
    if res.workers != workers:
        raise InfeasiblePlan(f"the plan is for {res.workers} workers, not {workers}")
    out = _launch(spec, batch, model_args, workers, tofu.execution_plan(res, g), g, seed, lr,
                  timeout_s, tol, fault, debug, steps=1)
    out.update({"algo": res.algo, "predicted_comm_bytes": res.comm_bytes})
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


def run_placement(spec: str, batch: int | None, model_args: dict | None, names, placement,
                  workers: int = 2, seed: int = 0, lr: float = 0.01, timeout_s: float = 300.0,
                  tol: float = 1e-4, steps: int = 3, fault: str | None = None) -> dict:
    """Run a device placement (operator -> device) on ``workers`` gloo processes: each worker
    computes its operators, tensors go to the devices that consume them (once), and the
    result is compared with one device.  Returns the :func:`run_tofu_plan` keys plus
    ``measured_step_time_s`` (median of ``steps``, the slowest worker) and per-worker compute
    time."""
    from ..opgraph import build_opgraph
    g = build_opgraph(spec, batch, model_args)
    missing = [o for o in g.ops if o not in set(names)]
    if missing:
        raise InfeasiblePlan(f"the placement does not cover operator {missing[0]} of "
                             f"{spec} ({len(missing)} missing): was it made for another model "
                             f"or batch?")
    x = placement_xplan(g, names, placement, workers)
    # bytes a placement must move: each tensor once to every other device that reads it
    dev = {nm: int(d) for nm, d in zip(names, placement)}
    pred = 0.0
    for t, ten in g.tensors.items():
        src = dev.get(ten.producer) if ten.producer else dev.get(t)
        readers = {dev[o] for o in g.consumers()[t] if o in dev}
        pred += ten.bytes * len(readers - {src})
    out = _launch(spec, batch, model_args, workers, x, g, seed, lr, timeout_s, tol, fault,
                  False, steps=steps)
    out["predicted_comm_bytes"] = pred
    return out


def _launch(spec, batch, model_args, workers, xplan, g, seed, lr, timeout_s, tol, fault, debug,
            steps=1) -> dict:
    job = {"spec": spec, "batch": batch, "model_args": dict(model_args or {}), "seed": seed,
           "lr": lr, "xplan": xplan, "fault": fault, "debug": debug,
           "digest": graph_digest(g), "steps": steps}
    import torch.multiprocessing as mp
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_entry, args=(r, workers, port, job, q, timeout_s),
                         name=f"explorer-op-worker-{r}") for r in range(workers)]
    result, sent, done, errors, tb, debug = None, {}, set(), {}, {}, {}
    t0 = time.monotonic()
    try:
        for p in procs:
            p.start()
        while len(done) < workers:
            try:
                kind, rank, a, b = q.get(timeout=0.2)
            except queue_mod.Empty:
                if any(p.exitcode not in (None, 0) for p in procs) or errors:
                    time.sleep(1.0)
                    while True:
                        try:
                            kind, rank, a, b = q.get_nowait()
                        except queue_mod.Empty:
                            break
                        if kind == "error":
                            errors.setdefault(rank, a)
                            tb.setdefault(rank, b)
                    dead = [r for r, p in enumerate(procs) if p.exitcode not in (None, 0)]
                    # the cause, not a peer's "connection closed" that follows it
                    causes = [r for r in sorted(errors)
                              if not any(h in errors[r] for h in _PEER_HINTS)]
                    first = (causes or sorted(errors) or dead or [None])[0]
                    msg = errors.get(first, f"exited with code {procs[first].exitcode}") \
                        if first is not None else "a worker failed"
                    if os.environ.get("EXPLORER_DEBUG"):
                        print("\n".join(f"--- rank {r}\n{t}" for r, t in tb.items()))
                    raise RunFailed(f"run failed: worker {first}: {msg}", first)
                if time.monotonic() - t0 > timeout_s:
                    raise RunFailed(f"run timed out after {timeout_s:.0f} s", None)
                continue
            if kind == "result":
                result = a
                sent[0] = (a["sent"], a["extra"], a["step_s"], a["compute_s"], a["times"])
            elif kind == "sent":
                sent[rank] = a
            elif kind == "debug":
                debug[rank] = a
            elif kind == "done":
                done.add(rank)
            elif kind == "error":
                errors.setdefault(rank, a)
                tb.setdefault(rank, b)
    finally:
        _kill(procs)
        q.close()
        q.cancel_join_thread()
    ref_loss, ref_params = _reference(spec, batch, model_args, seed, lr)
    errs = []
    for k, v in ref_params.items():
        got = result["params"].get(k)
        if got is None:
            errs.append(float("inf"))
            continue
        errs.append(float(np.abs(got - v).max() / max(np.abs(v).max(), 1e-12)))
    loss_err = abs(result["loss"] - ref_loss) / max(abs(ref_loss), 1e-12)
    max_err = max(errs + [loss_err])
    out = {"model": spec, "workers": workers,
            "reference_ok": bool(max_err <= tol), "max_rel_error": max_err,
            "loss": result["loss"], "reference_loss": ref_loss,
            "measured_comm_bytes": float(sum(v[0] - v[1] for v in sent.values())),
            "extra_bytes": float(sum(v[1] for v in sent.values())),
            "step_time_s": result["step_s"],
            "measured_step_time_s": max(v[2] for v in sent.values()),
            "compute_s": [sent[r][3] for r in sorted(sent)],
            # each step's wall time on the slowest worker (the first step includes warm-up)
            "step_times_s": [max(ts) for ts in zip(*(v[4] for v in sent.values()))]}
    if debug:
        out["debug"] = debug
    return out

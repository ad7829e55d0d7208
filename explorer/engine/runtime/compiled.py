"""Execute a device placement as compiled code: one fx ``GraphModule`` per device.

A placement (operator -> device) of the traced training step (the ``make_fx`` graph the
operator graph comes from, :mod:`explorer.engine.core.opgraph`) is cut into one program per
device: :func:`device_program` copies, in the plan's order (its simulated schedule: each
operator by its predicted start, so a device runs its operators and sends their outputs
when the prediction assumed; the traced step's order for a plan without one), the aten
calls placed on that device into a new ``torch.fx`` graph and inserts point-to-point
communication where a tensor crosses devices - an ``isend`` (``torch.distributed``, gloo on
CPU) right after its producer ran, one per device that reads it, and on the reader an
``irecv`` posted where the tensor is produced in that order and waited for just before its
first reader.  Every device follows the one global topological order and sends never block, so the programs cannot
deadlock.  fx generates plain Python for each program (no interpreter loop: the aten calls
run back to back, as the per-operator times the placers were given were measured), so
``explorer run`` measures a step that can be held against the simulator's prediction.

A tensor moves once to each device that reads it (the simulator's rule), parameters, buffers
and the input start on the device the placement gives them, and a multi-output aten call
whose outputs lie on several devices is computed by each of them.  Dropout is the identity
(:mod:`explorer.engine.core.capture`'s deterministic numerics, rewritten into the graph rather
than intercepted at run time); an op that still draws random numbers is refused.

Every worker runs the graph the plan was made on (:func:`~explorer.engine.core.opgraph.runnable`:
the meta-device trace of :func:`~explorer.engine.core.opgraph.build_opgraph`, on real tensors) in
the model's precision (float32), with the same seeded parameters and input.  The run is
checked against one device: the loss and every updated parameter of the first step against
the same step run whole in this process (the checked program is the timed one).  Per worker
it reports the measured step time, the time spent waiting for transfers, bytes sent, and the
peak of live tensor bytes (:class:`LiveBytes`), next to the plan's predictions.
"""

from __future__ import annotations

import heapq
import operator
import os
import statistics
import time
import weakref

import torch
import torch.distributed as dist
import torch.fx as fx
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from explorer.errors import InfeasiblePlan
from explorer.engine.runtime import comm
from explorer.engine.runtime.launcher import RunFailed
from explorer.engine.runtime.timing import clock, is_cuda, peak_allocated, reset_peak
from explorer.engine.runtime.traces import pickle_trace, shipped, unpickle_trace

__all__ = ["device_program", "transfers", "run_compiled", "run_compiled_many", "LiveBytes",
           "traced_program", "timeline", "instep_op_times"]

#: random ops the deterministic numerics cannot make the identity
_RANDOM = {"bernoulli", "bernoulli_", "rand_like", "randn_like", "rand", "randn",
           "randint", "normal", "uniform_", "normal_"}


# --------------------------------------------------------------------------------------------
# Communication and dropout helpers (the programs call them as fx call_function nodes)
# --------------------------------------------------------------------------------------------

class _Stats:
    """Per-process counters of the current step (bytes sent, seconds waiting) and the
    worker's device (receive buffers are made there; its clock synchronises on CUDA)."""
    sent = 0
    wait_s = 0.0
    device = torch.device("cpu")
    clock = staticmethod(time.perf_counter)


def set_device(device) -> None:
    """The device this process's programs compute on (receive buffers, clocks)."""
    _Stats.device = torch.device(device)
    _Stats.clock = staticmethod(clock(_Stats.device))


def _isend(t, dst: int, tag: int):
    t = t.contiguous()
    _Stats.sent += t.numel() * t.element_size()
    return comm.isend(t, dst, tag=tag)


def irecv_into(shape, dtype, src: int, tag: int):
    buf = torch.empty(shape, dtype=dtype, device=_Stats.device)
    return buf, comm.irecv(buf, src, tag=tag)


def wait_recv(handle):
    t0 = _Stats.clock()
    handle[1].wait()
    _Stats.wait_s += _Stats.clock() - t0
    return handle[0]


def _wait_sends(*works):
    t0 = _Stats.clock()
    for w in works:
        w.wait()
    _Stats.wait_s += _Stats.clock() - t0
    return None


# --------------------------------------------------------------------------------------------
# The plan of transfers and the per-device programs
# --------------------------------------------------------------------------------------------

def _target_name(n) -> str:
    from explorer.engine.core.opgraph import aten_name
    return aten_name(n)


def _placeholder_ids(g) -> list:
    """Tensor ids of the step's placeholders, in order: parameters, buffers, input."""
    return list(g.params.values()) + [f"buffer:{b}" for b in g.buffer_names] + list(g.inputs)


def _layout(g, dev: dict, workers: int):
    """``(owner, computed, readers)``: the device holding each tensor (None: every device, a
    placeholder the placement does not name), the devices computing each aten call, and the
    devices whose operators read each tensor."""
    missing = [o for o in g.ops if o not in dev]
    if missing:
        raise InfeasiblePlan(f"the placement does not place operator {missing[0]} "
                             f"({len(missing)} missing): was it made for another graph?")
    bad = sorted({int(d) for d in dev.values() if not 0 <= int(d) < workers})
    if bad:
        raise InfeasiblePlan(f"the placement uses devices {bad}; this run has {workers} "
                             f"workers (0..{workers - 1})")
    owner: dict = {}
    for t in _placeholder_ids(g):
        owner[t] = dev.get(t)
    computed: dict = {}
    readers: dict = {}
    for o in g.ops.values():
        d = int(dev[o.name])
        owner[o.output] = d
        computed.setdefault(o.node, set()).add(d)
        for t in o.inputs:
            readers.setdefault(t, set()).add(d)
    return owner, computed, readers


def transfers(g, dev: dict, workers: int) -> list:
    """``[(tensor id, src, dst, tag)]``: every tensor once to every other device whose
    operators read it and that does not compute it itself, in the step's order (the same list
    on every worker; ``tag`` is its index)."""
    owner, computed, readers = _layout(g, dev, workers)
    out = []
    for t, ten in g.tensors.items():
        src = owner.get(t)
        if src is None:
            continue
        node = g.ops[ten.producer].node if ten.producer else None
        have = computed.get(node, set()) | {src}
        for d in sorted(readers.get(t, ())):
            if d not in have:
                out.append((t, src, d, len(out)))
    return out


def _step_order(gm, by_node: dict, order) -> list:
    """The traced step's fx nodes (placeholders and output aside) in one topological order:
    aten calls by their first operator's position in ``order`` (the plan's operators in its
    simulated schedule, itself topological), everything else (``getitem``, views, scalars)
    as soon as its inputs exist; ``order=None``: the trace's own order."""
    body = [n for n in gm.graph.nodes if n.op not in ("placeholder", "output")]
    if order is None:
        return body
    pos = {nm: i for i, nm in enumerate(order)}
    key = {n: min((pos.get(o.name, len(pos)) for o in by_node.get(n.name, ())), default=-1)
           for n in body}
    index = {n: i for i, n in enumerate(body)}
    need = {n: sum(1 for a in n.all_input_nodes if a in index) for n in body}
    ready = [(key[n], index[n], n.name) for n in body if need[n] == 0]
    heapq.heapify(ready)
    by_name = {n.name: n for n in body}
    out = []
    while ready:
        n = by_name[heapq.heappop(ready)[2]]
        out.append(n)
        for u in n.users:
            if u in need:
                need[u] -= 1
                if need[u] == 0:
                    heapq.heappush(ready, (key[u], index[u], u.name))
    return out


def device_program(g, dev: dict, rank: int, workers: int, order=None):
    """The fx ``GraphModule`` device ``rank`` runs: its aten calls in the step's order with
    sends and receives.  Called with the step's placeholders (parameters, buffers, input)
    flattened, it returns ``(held, None)``: the loss and the updated parameters this device
    holds (``program.meta["finals"]`` names them), after waiting for its sends.
    ``program.meta`` also holds the transfers and the placeholders this device owns.
    ``order`` (the plan's operators in its simulated schedule, :func:`_step_order`): the
    one global order every device follows; default the traced step's."""
    gm = g.gm
    owner, computed, _ = _layout(g, dev, workers)
    plan = transfers(g, dev, workers)
    sends: dict = {}
    recvs: dict = {}
    for t, src, dst, tag in plan:
        if src == rank:
            sends.setdefault(t, []).append((dst, tag))
        if dst == rank:
            recvs[t] = (src, tag)
    by_node: dict = {}
    for o in g.ops.values():
        by_node.setdefault(o.node, []).append(o)
    pids = _placeholder_ids(g)
    nodes = list(gm.graph.nodes)
    placeholders = [n for n in nodes if n.op == "placeholder"]
    tid_of = {n.name: t for n, t in zip(placeholders, pids)}
    for n in nodes:
        if n.op == "call_function" and n.name in g.tensors:
            tid_of[n.name] = n.name
    from explorer.engine.core.capture import DETERMINISTIC_ATEN
    from explorer.engine.core.opgraph import DROPPED

    new = fx.Graph()
    env: dict = {}                       # original node name -> node of the new graph
    pending: dict = {}                   # tensor id -> irecv handle node
    send_works: list = []
    by_name = {n.name: n for n in nodes}

    def base_of(n):
        while n.op == "call_function" and _target_name(n) in DROPPED and n.args and \
                isinstance(n.args[0], fx.Node):
            n = n.args[0]
        return n

    def value(a):
        b = base_of(a)
        if b.name in env:
            return env[b.name]
        t = tid_of.get(b.name)
        if t is not None and t in pending:
            env[b.name] = new.call_function(wait_recv, (pending.pop(t),))
            return env[b.name]
        if b.op == "get_attr" or (b.op == "call_function" and b.name not in by_node
                                  and b.target is not operator.getitem):
            env[b.name] = new.node_copy(b, value)   # a constant or scalar bookkeeping
            return env[b.name]
        raise InfeasiblePlan(f"device {rank} needs tensor {t or b.name} but the placement "
                             f"neither computes nor sends it there")

    def produced(t, node):
        """``t`` exists in the step's order now: send it, or post its receive."""
        for dst, tag in sends.get(t, ()):
            send_works.append(new.call_function(_isend, (node, dst, tag)))
        if t in recvs:
            src, tag = recvs[t]
            v = g.tensors[t]
            meta = by_name[_node_of(g, t, placeholders, pids)].meta.get("val")
            dtype = getattr(meta, "dtype", None) or getattr(torch, v.dtype)
            pending[t] = new.call_function(irecv_into, (tuple(v.shape), dtype, src, tag))

    owned_ph = []
    for n, t in zip(placeholders, pids):
        p = new.placeholder(n.name)
        p.meta = dict(n.meta)
        if owner.get(t) in (None, rank):
            env[n.name] = p
            owned_ph.append(t)
        produced(t, p)
    for n in _step_order(gm, by_node, order):
        if n.op != "call_function":
            continue
        if n.target is operator.getitem:
            src = n.args[0]
            if src.name in env and rank in computed.get(src.name, ()):
                env[n.name] = new.node_copy(n, value)
            t = tid_of.get(n.name)
            if t is not None and (t in recvs or n.name in env):
                produced(t, env.get(n.name))
            continue
        name = _target_name(n)
        if name in DROPPED:
            continue
        if n.name not in by_node:
            continue
        if name in _RANDOM and name not in DETERMINISTIC_ATEN:
            raise InfeasiblePlan(f"op {n.name} (aten.{name}) draws random numbers: a "
                                 f"placement cannot be checked against one device")
        if rank in computed[n.name]:
            if name in DETERMINISTIC_ATEN:
                env[n.name] = new.call_function(
                    DETERMINISTIC_ATEN[name], tuple(fx.node.map_arg(n.args, value)),
                    dict(fx.node.map_arg(n.kwargs, value)))
                env[n.name].meta = dict(n.meta)
            else:
                env[n.name] = new.node_copy(n, value)
            # the plan's operators this call computes here (none: a multi-output call
            # computed again for an output another device owns)
            env[n.name].meta["step_ops"] = [o.name for o in by_node[n.name]
                                            if int(dev[o.name]) == rank]
        t = tid_of.get(n.name)
        if t is not None and (t in recvs or n.name in env):
            produced(t, env.get(n.name))
    # what this device returns: the loss and the updated parameters it holds
    flat = list(nodes[-1].args[0])
    npar = len(g.param_names)
    wanted = [("loss", flat[0])] + [(pn, a) for pn, a in
                                    zip(g.param_names, flat[1 + npar:1 + 2 * npar])]
    names, outs = [], []
    for key, a in wanted:
        if not isinstance(a, fx.Node):
            continue
        b = base_of(a)
        t = tid_of.get(b.name)
        if t is None or owner.get(t) not in (None, rank):
            continue
        if owner.get(t) is None and rank != 0:
            continue
        names.append(key)
        outs.append(value(b))
    done = new.call_function(_wait_sends, tuple(send_works))
    new.output((tuple(outs), done))
    if pending:
        stray = sorted(pending)[0]
        raise InfeasiblePlan(f"device {rank} receives tensor {stray} but no operator there "
                             f"reads it")
    new.lint()
    prog = fx.GraphModule(gm, new, class_name=f"Device{rank}Step")
    prog.meta["finals"] = names
    prog.meta["transfers"] = plan
    prog.meta["owned_placeholders"] = owned_ph
    return prog


# --------------------------------------------------------------------------------------------
# A timeline of one step (what the benchmark holds against the simulator's schedule)
# --------------------------------------------------------------------------------------------

class _Clock:
    """The marks of the traced step: (wall, thread CPU) after every call."""
    marks: list = []


def _tick():
    _Clock.marks.append((_Stats.clock(), time.thread_time()))


def _label(n) -> tuple:
    """``(kind, what)`` of a device program's call: ``op`` (an aten call of the step: the
    plan's operators it computes on this device), ``again`` (a multi-output call computed
    again here for an output another device owns), ``send`` / ``post`` / ``recv`` (isend,
    irecv posted, waiting for a received tensor; by transfer tag), ``sends`` (waiting for
    the step's sends) or ``other``."""
    if n.target is _isend:
        return "send", int(n.args[2])
    if n.target is irecv_into:
        return "post", int(n.args[3])
    if n.target is wait_recv:
        return "recv", int(n.args[0].args[3])
    if n.target is _wait_sends:
        return "sends", None
    if "step_ops" in n.meta:
        return ("op", n.meta["step_ops"]) if n.meta["step_ops"] else ("again", n.name)
    return "other", n.name


def traced_program(prog):
    """A copy of device program ``prog`` that reads the wall clock and the thread's CPU clock
    before its first call and after every call (``getitem`` aside), and ``meta["labels"]``:
    the :func:`_label` of each timed call.  Costs about half a microsecond per call, so it is
    run as an extra step, never as a timed one."""
    new = fx.Graph()
    env: dict = {}
    labels = []
    first = True
    for n in prog.graph.nodes:
        if n.op == "output":
            new.output(fx.node.map_arg(n.args[0], env.__getitem__))
            continue
        if n.op == "call_function" and first:
            new.call_function(_tick, ())
            first = False
        env[n] = new.node_copy(n, env.__getitem__)
        if n.op == "call_function" and n.target is not operator.getitem:
            new.call_function(_tick, ())
            labels.append(_label(n))
    out = fx.GraphModule(prog, new, class_name=type(prog).__name__ + "Traced")
    out.meta.update(prog.meta)
    out.meta["labels"] = labels
    return out


def timeline(prog, flat) -> list:
    """Run traced program ``prog`` (:func:`traced_program`) once: ``[[kind, what, start,
    end, cpu_s]]`` per call, ``start``/``end`` on the machine's monotonic clock (the same
    in every worker process)."""
    _Clock.marks = []
    outs, _ = prog(*flat)
    del outs
    m = _Clock.marks
    return [[k, w, m[i][0], m[i + 1][0], m[i + 1][1] - m[i][1]]
            for i, (k, w) in enumerate(prog.meta["labels"])]


def _node_of(g, t: str, placeholders, pids) -> str:
    """The fx node name holding tensor ``t``."""
    if t in g.tensors and g.tensors[t].producer is not None:
        return t
    return placeholders[pids.index(t)].name


# --------------------------------------------------------------------------------------------
# Operator times as a worker's step pays them (the placers' measured costs)
# --------------------------------------------------------------------------------------------

def _instep_entry(rank, world, device, job, send):
    """One process of :func:`instep_op_times`: the whole step as one compiled device program
    (every operator on this worker, no transfers), traced (:func:`traced_program`), run
    ``warmup + reps`` times in lockstep with the other processes; sends each aten call's
    CPU time per timed step, by fx node."""
    from explorer.engine.core.opgraph import opgraph_digest
    set_device(device)
    cuda = is_cuda(device)
    g, gm, params, buffers, x = _real_step(job["spec"], job["batch"], job["model_args"],
                                           job["seed"], job["lr"], device=device)
    if opgraph_digest(g) != job["digest"]:
        raise InfeasiblePlan("the worker's trace of the model differs from the operator "
                             "graph being timed (model code or arguments changed?)")
    g.gm = gm
    node_of = {o.name: o.node for o in g.ops.values()}
    everything = {t: 0 for t in _placeholder_ids(g)} | {o: 0 for o in g.ops}
    prog = traced_program(device_program(g, everything, 0, 1))
    flat = list(params) + list(buffers) + [x]
    runs: dict = {}
    for i in range(int(job["warmup"]) + int(job["reps"])):
        if world > 1:
            dist.barrier()                 # the processes compute side by side, as workers do
        line = timeline(prog, flat)
        if i >= int(job["warmup"]):
            for kind, what, start, end, cpu in line:
                if kind == "op":       # CUDA: the kernels' time (synchronised marks)
                    runs.setdefault(node_of[what[0]], []).append(end - start if cuda else cpu)
    send("result", "times", runs)
    if world > 1:
        dist.barrier()


def instep_op_times(og, workers: int, reps: int = 7, warmup: int = 3,
                    timeout_s: float = 600.0) -> dict:
    """Seconds of every aten call of ``og``'s step as a placement's worker pays it: the step
    compiled into one fx program (:func:`device_program` with every operator on one device:
    the code a worker runs, no interpreter between the calls), its calls timed on the
    thread's CPU clock by :func:`traced_program`'s marks, in ``workers`` worker processes
    started as a run starts them (one thread each, pinned to its own core while there are
    enough cores) and stepping in lockstep, so each call also pays what computing beside
    the other workers costs it (shared caches and memory bandwidth).  Per call the median
    over ``reps``
    timed steps of every process, scaled so that the calls add up to the median step (a step
    pays its calls' occasional slow runs).  ``{fx node name: seconds}``."""
    from explorer.engine.core.opgraph import opgraph_digest
    from explorer.engine.runtime.launcher import start_workers
    job = {"spec": og.model, "batch": og.batch, "model_args": dict(og.model_args or {}),
           "seed": 0, "lr": 0.01, "digest": opgraph_digest(og), "reps": max(1, int(reps)),
           "warmup": max(0, int(warmup))}
    got = start_workers(max(1, int(workers)), _instep_entry, job, timeout_s=timeout_s,
                        backend="gloo", name="explorer-op-timer")
    per_proc = [got.results[r]["times"] for r in sorted(got.results)
                if "times" in got.results[r]]
    if not per_proc:
        raise RunFailed("the operator timers finished without sending their times", 0,
                        got.pids)
    runs: dict = {}
    for times in per_proc:
        for node, ts in times.items():
            runs.setdefault(node, []).extend(ts)
    med = {nm: float(statistics.median(ts)) for nm, ts in runs.items()}
    steps = [sum(ts[k] for ts in times.values()) for times in per_proc
             for k in range(min(len(ts) for ts in times.values()))]
    total = statistics.median(steps) if steps else 0.0
    scale = total / sum(med.values()) if sum(med.values()) > 0 else 1.0
    return {nm: v * scale for nm, v in med.items()}


# --------------------------------------------------------------------------------------------
# Measured live bytes
# --------------------------------------------------------------------------------------------

class LiveBytes(TorchDispatchMode):
    """Peak bytes of live tensor storage created while the mode is on (plus ``base``): every
    aten call's outputs are counted once per storage and freed when the last tensor object
    counted on it is collected.  What a worker's step really keeps alive, without an
    allocator hook (CPU tensors have none)."""

    def __init__(self, base: float = 0.0):
        super().__init__()
        self.live = self.peak = float(base)
        self.refs: dict = {}

    def _drop(self, ptr):
        e = self.refs.get(ptr)
        if e is None:
            return
        e[1] -= 1
        if e[1] == 0:
            self.live -= e[0]
            del self.refs[ptr]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if not isinstance(t, torch.Tensor):
                continue
            st = t.untyped_storage()
            ptr, nb = st.data_ptr(), st.nbytes()
            if not ptr or not nb:
                continue
            e = self.refs.get(ptr)
            if e is None:
                self.refs[ptr] = [float(nb), 1]
                self.live += nb
                self.peak = max(self.peak, self.live)
            else:
                e[1] += 1
            weakref.finalize(t, self._drop, ptr)
        return out


# --------------------------------------------------------------------------------------------
# The run
# --------------------------------------------------------------------------------------------

def _real_step(spec, batch, model_args, seed: int, lr: float, g=None, device="cpu"):
    """``(g, params, buffers, x)``: the plan's operator graph (:func:`build_opgraph`, the
    meta-device trace the plan was made on, runnable on real tensors on ``device``) and the
    real model's seeded parameters, buffers and input (made on CPU, so every worker and the
    reference get the same numbers, then moved to ``device``)."""
    from explorer.engine.core.capture import load
    from explorer.engine.core.opgraph import build_opgraph, runnable, with_step
    if g is None:
        g = build_opgraph(spec, batch, model_args, lr)
    g = with_step(g)                   # a graph from the capture cache has no traced step
    torch.manual_seed(seed)
    model, x = load(spec, batch, model_args, meta=False)            # train mode
    dev = torch.device(device)
    params = [p.detach().to(dev) for _, p in model.named_parameters() if p.requires_grad]
    buffers = [b.detach().to(dev) for _, b in model.named_buffers()]
    return g, _constants_on(runnable(g.gm, str(dev)), dev), params, buffers, x.to(dev)


def _constants_on(gm, device):
    """``gm`` with the tensor constants its ``get_attr`` nodes read moved to ``device``."""
    for n in gm.graph.nodes:
        if n.op != "get_attr":
            continue
        *path, leaf = str(n.target).split(".")
        owner = gm
        for p in path:
            owner = getattr(owner, p)
        v = getattr(owner, leaf, None)
        if isinstance(v, torch.Tensor) and v.device != device:
            moved = v.to(device)
            if isinstance(v, torch.nn.Parameter):
                moved = torch.nn.Parameter(moved, requires_grad=v.requires_grad)
            setattr(owner, leaf, moved)
    return gm


def _entry(rank, world, device, job, send):
    """One worker (an entry of :func:`launcher.start_workers`): trace the step once, check it
    is the plans' graph, then each placement of ``job["plans"]`` in turn
    (:func:`_run_plan`), its results sent under ``(plan index, kind)``."""
    from explorer.engine.core.opgraph import opgraph_digest
    from explorer.engine.runtime.faults import FAULT_ENV, parse_fault
    fault = parse_fault(job.get("fault") or os.environ.get(FAULT_ENV))
    set_device(device)
    g, gm, params, buffers, x = _real_step(job["spec"], job["batch"], job["model_args"],
                                           job["seed"], job["lr"], device=device,
                                           g=_shipped_step(job.get("trace")))
    if opgraph_digest(g) != job["digest"]:
        raise InfeasiblePlan("the worker's trace of the model differs from the plan's "
                             "operator graph (model code or arguments changed?)")
    g.gm = gm
    flat = list(params) + list(buffers) + [x]
    # a step may update buffers in place (BatchNorm's ``num_batches_tracked.add_``): with
    # several plans, each starts from a copy of the values the first one was given
    pristine = [t.clone() for t in flat] if len(job["plans"]) > 1 else None
    for i, plan in enumerate(job["plans"]):
        def send_i(kind, what=None, value=None, i=i):
            send(kind, (i, what), value)
        start = flat if i == 0 else [t.clone() for t in pristine]
        _run_plan(rank, world, device, g, start, {**job, **plan}, fault, send_i)


def _meta_step(spec, batch, model_args, lr) -> tuple | None:
    """The plan's meta-device step (:func:`build_opgraph` with its GraphModule), pickled for
    the workers (:mod:`.traces`: traced once per model code, then read from the capture
    cache), or ``None`` when it cannot be: the workers then trace it themselves."""
    from explorer.engine.core.opgraph import build_opgraph
    try:
        return shipped(spec, batch, model_args, {"lr": lr, "dtype": "meta"},
                       lambda: pickle_trace(build_opgraph(spec, batch, model_args, lr)))
    except Exception:  # noqa: BLE001 - the workers trace it and say why it fails
        return None


def _shipped_step(blob):
    """:func:`_meta_step`'s graph again (``None``: none shipped, or it did not come back)."""
    return unpickle_trace(blob) if blob is not None else None


def _run_plan(rank, world, device, g, flat, job, fault, send):
    """One placement on this worker: build this device's program, run it ``warmup + steps``
    times and once more counting live bytes; send the held finals, times, bytes and memory."""
    from explorer.engine.runtime.faults import inject_fault
    dev = job["placement"]
    prog = device_program(g, dev, rank, world, job.get("order"))
    times, waits, cpus, finals, sent = [], [], [], None, 0
    warmup, steps = int(job["warmup"]), int(job["steps"])
    from explorer.engine.runtime.memlimit import arm, disarm
    arm()                              # --memory-per-worker counts the steps (set up done)
    reset_peak(device)
    for i in range(warmup + steps):
        inject_fault(fault, rank, i + 1, "compiled placement step")
        _Stats.sent, _Stats.wait_s = 0, 0.0
        if world > 1:
            dist.barrier()
        c0, t0 = time.thread_time(), _Stats.clock()
        outs, _ = prog(*flat)
        dt, cpu = _Stats.clock() - t0, time.thread_time() - c0
        if i == 0:
            finals, sent = outs, _Stats.sent
        if i >= warmup:
            times.append(dt)
            waits.append(_Stats.wait_s)
            cpus.append(cpu)
        del outs
    allocated = peak_allocated(device)     # CUDA: max_memory_allocated of the steps
    marks = None
    if job.get("timeline"):            # one traced step: each call's wall and CPU time
        traced = traced_program(prog)
        if world > 1:
            dist.barrier()
        marks = timeline(traced, flat)
    # one more step counting live tensor bytes (not timed: the mode costs time per op)
    idx = {t: k for k, t in enumerate(_placeholder_ids(g))}
    base = sum(flat[idx[t]].untyped_storage().nbytes()
               for t in prog.meta["owned_placeholders"])
    if world > 1:
        dist.barrier()
    with LiveBytes(base) as mem:
        outs, _ = prog(*flat)
    del outs
    disarm()                           # sending the results is not part of the steps
    held = {k: v.detach().cpu().numpy() for k, v in zip(prog.meta["finals"], finals)}
    send("result", "main", held)
    send("result", "stats", {"sent": sent, "times": times, "waits": waits, "cpu": cpus,
                             "peak": mem.peak, "nodes": len(prog.graph.nodes),
                             "allocated": allocated,
                             "timeline": marks,
                             "transfers": sum(1 for t in prog.meta["transfers"]
                                              if rank in (t[1], t[2]))})
    if world > 1:
        dist.barrier()                 # nobody leaves while a peer still waits


def _aligned(lines: list) -> list:
    """The workers' timelines with times in seconds from the first call any worker made."""
    t0 = min((ln[0][2] for ln in lines if ln), default=0.0)
    return [[[k, w, a - t0, b - t0, c] for k, w, a, b, c in ln] for ln in lines]


class _Whole:
    """``g`` with its step runnable on real tensors, for :func:`.reference.traced_step`."""

    def __init__(self, g, gm):
        self.gm, self.param_names = gm, g.param_names


#: how a placement that ran on GPUs was judged (the reference check's ``basis``)
GPU_BASIS = ("the float64 step, allowing 10 × the float32 CPU step's own error: CUDA kernels "
             "round otherwise than the CPU's")


def _judge(out, got_params, ref32, tol, float64_ref=None) -> dict:
    """The reference check of a compiled placement's first step.  Workers on CPU run the
    CPU's float32 kernels, so they must match this process's float32 step (``tol``).  Workers
    on GPUs round otherwise (cuDNN's algorithms, other reduction orders): they are judged as
    the layer-wise runtime judges every run, against the float64 step with the float32 step's
    own error (times :data:`.reference.ROUNDING_FACTOR`) allowed.  ``float64_ref()`` gives
    that step (the caller's: :func:`.opexec.float64_reference`); without it, the float32
    check."""
    from explorer.engine.runtime.reference import compare
    if out.get("device_kind") != "cuda" or float64_ref is None:
        return compare(out["loss"], got_params, None, ref32, None, tol)
    doc = compare(out["loss"], got_params, None, float64_ref(), ref32, tol)
    doc["basis"] = GPU_BASIS
    return doc


def run_compiled(spec: str, batch: int | None, model_args: dict | None, names, placement,
                 workers: int = 2, *, g, digest: str, order=None, **kw) -> dict:
    """Run placement ``names[i] -> placement[i]`` of ``spec``'s step as one compiled program
    per device on ``workers`` local worker processes (CPU or CUDA: :mod:`.devicemap`),
    ``warmup`` discarded and ``steps`` timed steps (:func:`run_compiled_many` with one plan,
    whose keyword arguments it takes).

    Returns ``reference_ok`` / ``reference`` / ``max_rel_error`` / ``loss`` /
    ``reference_loss`` (the first step against the whole step run in this process),
    ``measured_step_time_s`` (median over the timed steps of the slowest worker's time),
    ``step_times_s``, per worker ``compute_s`` (step time minus time waiting for transfers)
    and ``wait_s``, ``measured_comm_bytes`` (sent during the first step) and
    ``planned_comm_bytes`` (:func:`transfers`), ``cpu_s`` (the worker thread's CPU time per
    step: below ``compute_s`` when other processes take the core), ``peak_memory_bytes``
    (live tensor bytes), ``transfers`` and ``program_nodes``; with ``timeline`` also one
    traced step per worker (:func:`timeline`, times from the first call of any worker).
    ``float64_ref``: a function giving the float64 step a run on GPUs is judged against
    (:func:`_judge`).
    ``order``: the plan's operators in its simulated schedule (:func:`device_program`)."""
    return run_compiled_many(spec, batch, model_args, [(names, placement, order)], workers,
                             g=g, digest=digest, **kw)[0]


def run_compiled_many(spec: str, batch: int | None, model_args: dict | None, plans: list,
                      workers: int = 2, *, g, digest: str, steps: int = 20, warmup: int = 3,
                      seed: int = 0, lr: float = 0.01, timeout_s: float = 300.0,
                      tol: float = 1e-4, fault: str | None = None, check: bool = True,
                      memory_limit: float | None = None, timeline: bool = False,
                      float64_ref=None) -> list:
    """Several placements of one model, ``plans`` = ``[(names, placement, order), ...]``
    (``order`` may be None), in one launch: the workers start and trace the step once and
    run the placements one after the other; the single-device reference is computed once.
    One result per plan, as :func:`run_compiled`'s.  ``memory_limit`` guards a launch of one
    plan only."""
    from explorer.engine.runtime.launcher import start_workers
    from explorer.engine.runtime.reference import traced_step
    if not plans:
        return []
    if memory_limit is not None and len(plans) > 1:
        raise InfeasiblePlan("a memory limit guards a launch of one plan: run the plans one "
                             "at a time")
    devs, moves = [], []
    for names, placement, _ in plans:
        dev = {str(nm): int(d) for nm, d in zip(names, placement)}
        bad = sorted({d for d in dev.values() if not 0 <= d < workers})
        if bad:
            raise InfeasiblePlan(f"the placement uses devices {bad}; this run has {workers} "
                                 f"workers (0..{workers - 1})")
        devs.append(dev)
        moves.append(transfers(g, dev, workers))
    job = {"spec": spec, "batch": batch, "model_args": dict(model_args or {}), "seed": seed,
           "lr": lr, "fault": fault, "digest": digest,
           "steps": max(1, int(steps)), "warmup": max(0, int(warmup)), "timeline": timeline,
           "plans": [{"placement": dev, "order": list(order) if order is not None else None}
                     for dev, (_, _, order) in zip(devs, plans)]}
    job["trace"] = _meta_step(spec, batch, model_args, lr)
    got = start_workers(workers, _entry, job, timeout_s=timeout_s,
                        name="explorer-place-worker", memory_limit=memory_limit,
                        jobs=len(plans))
    ref = None
    outs = []
    for i, plan in enumerate(moves):
        res = {r: {k[1]: v for k, v in got.results[r].items() if k[0] == i}
               for r in got.results}
        out, held = _plan_result(spec, g, res, workers, got, plan, timeline)
        if check:
            if ref is None:
                _, gm, params, buffers, x = _real_step(
                    spec, batch, model_args, seed, lr,
                    g if getattr(g, "gm", None) is not None else
                    (_shipped_step(job["trace"]) or g))
                threads = torch.get_num_threads()
                torch.set_num_threads(1)       # as the workers: the same kernels' rounding
                try:
                    ref = traced_step(_Whole(g, gm), params, buffers, x)
                finally:
                    torch.set_num_threads(threads)
            got_params = {k: torch.from_numpy(v) for k, v in held.items() if k != "loss"}
            doc = _judge(out, got_params, ref, tol, float64_ref)
            out.update(reference=doc, reference_ok=doc["ok"],
                       max_rel_error=doc["max_rel_error"], reference_loss=ref[0])
        outs.append(out)
    return outs


def _plan_result(spec, g, res, workers, got, plan, timeline):
    """One plan's result from what its workers sent (``res``: rank -> kind -> value), and the
    finals the workers held."""
    stats = {r: v["stats"] for r, v in res.items() if "stats" in v}
    if len(stats) != workers or any("main" not in v for v in res.values()):
        raise RunFailed("the workers finished without sending their results", 0, got.pids)
    held: dict = {}
    for r in sorted(res):
        held.update(res[r]["main"])
    per_step = [max(ts) for ts in zip(*(stats[r]["times"] for r in sorted(stats)))]
    out = {"model": spec, "workers": workers, "executor": "compiled",
           "dtype": g.tensors[next(iter(g.params.values()))].dtype,
           "loss": float(held["loss"]) if "loss" in held else None,
           "measured_step_time_s": statistics.median(per_step),
           "step_time_s": statistics.median(stats[0]["times"]),
           "step_times_s": per_step,
           "compute_s": [statistics.median(t - w for t, w in zip(stats[r]["times"],
                                                                  stats[r]["waits"]))
                         for r in sorted(stats)],
           "wait_s": [statistics.median(stats[r]["waits"]) for r in sorted(stats)],
           "cpu_s": [statistics.median(stats[r]["cpu"]) for r in sorted(stats)],
           "peak_memory_bytes": [float(stats[r]["peak"]) for r in sorted(stats)],
           "measured_comm_bytes": float(sum(s["sent"] for s in stats.values())),
           "planned_comm_bytes": float(sum(g.tensors[t].bytes for t, *_ in plan)),
           "transfers": len(plan),
           "program_nodes": [stats[r]["nodes"] for r in sorted(stats)],
           "timeline": (_aligned([stats[r]["timeline"] for r in sorted(stats)])
                        if timeline else None),
           "launch_time_s": got.elapsed_s, "pids": got.pids, "backend": got.backend,
           "reference": None, "reference_ok": None, "max_rel_error": None,
           "reference_loss": None}
    alloc = [stats[r].get("allocated") for r in sorted(stats)]
    out["measured_allocated_peak_bytes"] = alloc if all(a is not None for a in alloc) else None
    out.update(got.describe())
    if got.map is not None and got.map.shared:
        out.setdefault("warnings", []).append(got.map.note)
    return out, held

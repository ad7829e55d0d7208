"""A Tofu plan (:class:`TofuPlan`): every tensor's tiling, every operator's strategy per step,
communication and memory; its execution plan (each worker's boxes, every operator's output
box, input regions and reduction) and the per-step view the app draws."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from explorer.engine.core.geometry import (
    tile_owners,
)


@dataclass
class StepTrace:
    """One recursion step: k_i, the bytes it adds, the choices made (every tensor class's
    axis, every operator's strategy) and each operator's bytes at this step's level (its
    share of ``total_bytes``), so the recursion can be replayed step by step."""

    k: int
    groups: int
    delta_bytes: float
    total_bytes: float
    bandwidth: float
    seconds: float
    classes: dict                      # class id -> axis (or -1)
    strategies: dict                   # op name -> "split 0" / "reduce ci" / "replicate"
    search_time_s: float = 0.0
    op_bytes: dict = field(default_factory=dict)   # op name -> its bytes at this level

    def to_dict(self) -> dict:
        return {"k": self.k, "groups": self.groups, "delta_bytes": self.delta_bytes,
                "total_bytes": self.total_bytes, "bandwidth_Bps": self.bandwidth,
                "seconds": self.seconds, "search_time_s": self.search_time_s}


@dataclass
class TofuPlan:
    """A Tofu plan: per-tensor tilings, per-op strategies per step, communication, memory."""

    algo: str
    model: str
    workers: int
    factors: list
    steps: list
    comm_bytes: float
    objective_s: float
    peak_memory_bytes: list
    search_time_s: float
    coarse: dict
    tilings: dict                      # tensor id -> {"grid": [...], "steps": [axis...]}
    strategies: dict                   # op name -> ["split 0", ...] per step
    op_bytes: dict                     # op name -> bytes it moves (all steps)
    preset: str = ""                   # the device graph's name
    state: object = field(default=None, repr=False)     # final _State (per-device boxes)
    coarse_graph: object = field(default=None, repr=False)
    levels: list = field(default_factory=list)  # steps, most significant device digit first
    compute_s: list | None = None      # per worker, predicted compute seconds of its shards
    #: (graph, execution plan) of the last :func:`execution_plan` call: the search and the
    #: document both need it, and it is the largest part of either
    xplan_memo: tuple | None = field(default=None, repr=False, compare=False)

    #: an operator-level plan: its document carries the operator graph's digest
    operator_level = True

    def document_fields(self, g) -> dict:
        """The execution ``layout`` a sealed document adds: every tensor's box per worker,
        every operator's output box, input regions and reduction."""
        from explorer.engine.core.geometry import ExecutionLayout
        plan = execution_plan(self, g)
        return {"layout": ExecutionLayout.from_plan(
            plan, {t: g.tensors[t].shape for t in plan["held"]}).to_json()}

    def layouts(self, problem, n: int) -> dict:
        """Every partitioned tensor's tile per worker, keyed by tensor id."""
        from explorer.engine.core.geometry import TensorLayout
        og = problem.opgraph()
        held = self.state.held
        return {t: TensorLayout.from_boxes(og.tensors[t].shape, held[t]) for t in self.tilings}

    def to_dict(self, tensors: bool = True) -> dict:
        d = {"model": self.model, "algo": self.algo,
             "devices": self.workers, "preset": self.preset, "factors": self.factors,
             "levels": list(self.levels or range(len(self.factors))),
             "objective_s": self.objective_s, "comm_bytes": self.comm_bytes,
             "peak_memory_bytes": self.peak_memory_bytes,
             "search_time_s": self.search_time_s, "coarsening": self.coarse,
             "predicted_compute_s": self.compute_s,
             "steps": [s.to_dict() for s in self.steps]}
        if tensors:
            d["tensors"] = [{"name": t, **v} for t, v in self.tilings.items()]
            d["ops"] = [{"name": o, "strategies": s, "bytes": self.op_bytes.get(o, 0.0)}
                        for o, s in self.strategies.items()]
        return d



def execution_plan(res: TofuPlan, g) -> dict:
    """What every worker holds and computes under ``res`` (for the runtime).

    Returns ``{"held": {tensor: [K, nd, 2]}, "ops": {op: {"out": [K, nd, 2], "needs":
    {tensor: [K, nd, 2]}, "reducer": "sum" | "max" | None, "zero": {tensor: [K] bool}}}}``:
    ``zero[t][w]`` marks inputs that worker w must not add (terms outside a partitioned sum,
    e.g. a bias, are added by the first worker of the reduction only).
    """
    if res.xplan_memo is not None and res.xplan_memo[0] is g:
        return res.xplan_memo[1]
    st, co = res.state, res.coarse_graph
    K = max(1, math.prod(res.factors))
    held = {t: st.held[t] for t in res.tilings}
    ops = {}
    for o, oi in co.ops.items():
        red = st.red[o]
        regs = oi.bound.regions(st.out[o], red={v: (r[:, 0], r[:, 1] - 1)
                                                for v, r in red.items()})
        reducible = {v.name: kind for v, kind in oi.bound.reducible().items()}
        split = [v for v, r in red.items()
                 if (r[:, 1] - r[:, 0] < oi.bound.extent[oi.bound.var(v)]).any()]
        reducer = None
        for v in split:
            reducer = reducible.get(v, "sum")
        zero = {}
        if reducer == "sum":
            first = np.ones(K, dtype=bool)
            for v in split:
                first &= red[v][:, 0] == 0
            inside = set()
            for acc, scope in oi.bound.accesses:
                if any(v.name in split for r in scope for v in getattr(r, "vars", ())):
                    inside.add(acc.tensor)
            for n, t in oi.inputs:
                if n not in inside:
                    zero[t] = ~first
        ops[o] = {"out": st.out[o], "needs": {t: regs[n] for n, t in oi.inputs},
                  "reducer": reducer, "zero": zero}
    plan = {"held": held, "ops": ops, "workers": K}
    res.xplan_memo = (g, plan)
    return plan


# ------------------------------------------------------------------------------------------------
# Pictures: who owns which tile (Figure 11)
# ------------------------------------------------------------------------------------------------


def strip(res: TofuPlan, g, upto: int | None = None, limit: int = 400) -> list:
    """Figure 11: for every forward op that reads a weight, in execution order, its weight
    (top row) and its activation input (bottom row) with tile owners; consecutive blocks that
    are tiled identically are folded into one with a count ("×N")."""
    views = {"t", "transpose", "permute", "view", "_unsafe_view", "reshape", "expand"}

    def param_of(t):
        # a weight read through a transpose/view (nn.Linear reads t(W)) counts as the weight
        for _ in range(4):
            ten = g.tensors[t]
            if ten.kind == "param":
                return t
            p = g.ops.get(ten.producer) if ten.producer else None
            if p is None or p.target not in views or not p.inputs:
                return None
            t = p.inputs[0]
        return None

    blocks = []
    for op in g.ops.values():
        if op.phase != "forward":
            continue
        w = [param_of(t) for t in op.inputs]
        w = [t for t in w if t is not None and len(g.tensors[t].shape) >= 2]
        a = [t for t in op.inputs if g.tensors[t].kind in ("activation", "input")
             and param_of(t) is None and len(g.tensors[t].shape) >= 2]
        if not w or not a or w[0] not in res.tilings or a[0] not in res.tilings:
            continue
        wt, at = res.tilings[w[0]], res.tilings[a[0]]
        blk = {"op": op.name, "module": op.module, "target": op.target,
               "weight": {"name": w[0], "shape": wt["shape"],
                          "owners": tile_owners(wt["steps"], res.factors, upto=upto,
                                               order=res.levels or None)},
               "activation": {"name": a[0], "shape": at["shape"],
                              "owners": tile_owners(at["steps"], res.factors, upto=upto,
                                                   order=res.levels or None)},
               "count": 1}
        key = (json_key(blk["weight"]), json_key(blk["activation"]), op.target)
        if blocks and blocks[-1]["_key"] == key:
            blocks[-1]["count"] += 1
            blocks[-1]["last"] = op.module or op.name
            continue
        blk["_key"] = key
        blocks.append(blk)
        if len(blocks) >= limit:
            break
    for b in blocks:
        b.pop("_key", None)
    return blocks


def json_key(t: dict) -> tuple:
    return (tuple(t["shape"]), tuple(tuple(r) for r in t["owners"]))


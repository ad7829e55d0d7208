"""The OptCNN cost model (paper Section 5.1): t_C, t_S per layer and configuration, t_X per edge.

* ``t_C(l, c)`` – forward + backward time of the slowest device's shard, plus the SGD update of
  its weight shards (``p -= lr·g``: read the weights and gradients, write the weights, so
  ``3 · shard bytes / memory bandwidth``; the runtime measures 2–3 % of a step for it).
  ``analytic`` uses a roofline of the device (peak FLOP/s × efficiency vs. memory bandwidth,
  plus kernel launch overhead); ``measured`` runs the shard on the local device (see
  :mod:`.profile`), cached in SQLite, as the paper does — without an input gradient when no
  gradient flows into the layer's inputs (layers fed by the model input), and, for a
  configuration on k > 1 devices, with k workers computing their shards at once when
  ``explorer calibrate`` measured that (they share the memory system; alone otherwise).
* ``t_X(e, c_i, c_j)`` – each destination device receives the part of the region it needs that
  other devices own (geometry decides both), over the link's bandwidth, plus one link latency;
  a device receives from its sources one after the other, devices receive in parallel; counted
  twice, for the activations forward and the gradients of the same region backward — once
  when the producer needs no gradient (the model input, or layers computed from it without
  parameters): no gradient flows back along that edge.
* ``t_S(l, c)`` – parameter synchronisation of replicated weight shards: the paper's parameter
  server (every replica sends its gradients to the shard's server and gets the parameters back:
  ``2 (r-1) s / b``, two exchanges: gradients in, parameters out; with ``r = 2`` the server is
  one of the replicas and both messages go in one exchange, as the runtime's swap does — the
  same ``2 s / b`` of data, one latency), or ring all-reduce (``2 (r-1)/r · s / b``,
  ``2 (r-1)`` steps of the replica group).  On calibrated local CPU workers
  (``meta["swap"]``, the runtime's point-to-point sync on gloo) the parameter server also
  pays what the runtime does besides moving bytes: one message per parameter tensor (each
  beyond an exchange's first at the calibrated ``message_s``) and the adds of the received
  gradients (``r - 1`` on the first member, one add call and three passes per element at the
  calibrated add rate); the SGD update in ``t_C`` is then one add call per weight shard at
  that rate (reported apart as ``update_s`` in the breakdown, still inside ``compute_s``).
* ``t_R(l, c)`` – the reduce-scatter of a row-parallel configuration (a ``k`` degree, see
  :mod:`.geometry.config`): the ``k`` devices of a group each hold a partial sum of the
  group's tile and end up owning ``1/k`` of it, a ring reduce-scatter of
  ``(k-1)/k · tile bytes / b`` over the group's slowest link plus ``k-1`` latencies; the
  same again backward (the all-gather of the output gradient every member's local matmuls
  need).  Groups work in parallel, so the slowest group counts.  It is its own term of the
  node cost (``reduce_s`` in the breakdown).  Such a device computes ``1/k`` of its tile's
  FLOPs and holds the partial tile and its gathered gradient besides its owned box.

Precision (``dtype``, :mod:`explorer.engine.core.precision`): the roofline computes at the
devices' rate in that precision (:meth:`DeviceGraph.peak_flops`); activations, their
gradients, transfers and row-parallel partial sums count ``activation_bytes(dtype)`` per
element (2 in bf16), parameters, their gradients, the momentum, the SGD update and the
parameter synchronisation 4 (float32 master weights); bf16 adds the 2-byte working copy of
each weight shard to memory, and its cast (read 4, write 2 bytes) to the traffic.

All tables are numpy arrays indexed by candidate position, so the search is pure array work.
"""

from __future__ import annotations

import hashlib
import math
import os
import threading
import time
import weakref
from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np

from explorer.errors import InfeasiblePlan
from explorer.engine.core import geometry as G
from explorer.engine.core import precision as P
from explorer.engine.core.devices import DeviceGraph
from explorer.engine.core.layergraph import Edge, Layer, LayerGraph
from explorer.engine.layerwise.plan import params_key
from explorer.engine.core.pins import Pin  # noqa: F401 - the one pin type, re-exported for cost-model users

#: Fraction of peak FLOP/s dense kernels reach (cuDNN/cuBLAS on P100 ~ 50-70%).
EFFICIENCY = {"conv": 0.6, "linear": 0.6, "matmul": 0.6, "sdpa": 0.5, "lstm_cell": 0.5,
              "mha": 0.5}
EFFICIENCY["conv_transpose"] = EFFICIENCY["conv"]   # the same kernels (a data gradient)
#: Forward+backward kernel launches per layer and their fixed cost (seconds).
LAUNCH_OVERHEAD_S = 3 * 5e-6
#: Memory passes of the SGD update per weight byte: read weights, read gradients, write weights.
UPDATE_PASSES = 3.0
#: Largest work (:meth:`CostModel.estimate`'s ``work``: kernel elements of the distinct edge
#: tables, those of the compiled kernel weighted by :data:`JIT_COST`, plus elimination
#: steps / 16) a search may start: measured at about 8e7 work per CPU second on a busy
#: 2-core machine (ResNet-50 and Inception-v3 at 1,024 devices with powers of two: 2.8e9
#: and 7.1e9), so about two minutes of CPU there.
MAX_WORK = 1e10
#: ``degrees="auto"`` beyond 16 devices takes powers of two (the issue's default), or, only
#: when their work is over this - the work a search may start at all - the first coarser
#: ladder (powers of 4, 8, ...) within it, rather than refusing.  Inception-v3 (7.1e9),
#: ResNet-50 (2.8e9) and the GPT-2 example (1.2e9) at 1,024 devices take powers of two
#: (Inception-v3: 41 s wall, 2.3 GiB on a quiet 2-core machine); 4,096 devices coarsen.
AUTO_WORK = MAX_WORK
#: Cost of an element of the compiled transfer kernel (:mod:`.xkernel`) relative to the
#: numpy kernel's: measured 2 against 8 ns per element (ResNet-50, 1,024 devices)
JIT_COST = 0.25
#: Work from which a search builds its tables on two threads (numpy's large array
#: operations and the compiled kernel release the GIL; the tables are the same)
THREAD_WORK = 1e9
#: guards the LRU caches' bookkeeping when tables are built on several threads
_LRU_LOCK = threading.Lock()


def _fresh_lock_in_child() -> None:
    """A forked search (:mod:`explorer.engine.core.forked`) starts with this lock free even
    if another thread of its parent held it at the fork (a server running two searches)."""
    global _LRU_LOCK
    _LRU_LOCK = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_fresh_lock_in_child)


@dataclass
class CostTables:
    """Everything equation 1 needs, over each layer's candidate list.

    ``candidates[name]`` – list of :class:`Config`; ``t_compute[name]``, ``t_sync[name]`` –
    arrays ``[C]``; ``memory[name]`` – ``[C]`` peak bytes on one device for that layer;
    ``edges`` – list of ``(Edge, t_xfer [C_src, C_dst])`` with parallel edges separate.
    """

    names: list
    candidates: dict
    t_compute: dict
    t_sync: dict
    memory: dict
    edges: list
    build_time_s: float = 0.0
    bytes_xfer: list = field(default_factory=list)  # per edge [C_src, C_dst] bytes moved
    #: ``t_R`` per layer ``[C]``: reduce-scatter of row-parallel (``k``) candidates (layers
    #: without any are absent: 0) and the bytes it moves
    t_reduce: dict = field(default_factory=dict)
    bytes_reduce: dict = field(default_factory=dict)
    #: :meth:`CostModel.estimate` made before building (candidates, bytes, work)
    estimate: dict = field(default_factory=dict)
    #: the SGD update's part of ``t_compute`` per layer ``[C]`` (reported as ``update_s``)
    t_update: dict = field(default_factory=dict)

    def node_cost(self, name: str) -> np.ndarray:
        red = self.t_reduce.get(name)
        base = self.t_compute[name] + self.t_sync[name]
        return base if red is None else base + red

    def reduce_time(self, name: str, i: int) -> float:
        red = self.t_reduce.get(name)
        return 0.0 if red is None else float(red[i])

    def objective(self, choice: dict) -> float:
        """Equation 1 for ``choice`` (layer name -> candidate index)."""
        tot = sum(float(self.node_cost(n)[choice[n]]) for n in self.names)
        for e, m in self.edges:
            tot += float(m[choice[e.src], choice[e.dst]])
        return tot

    def breakdown(self, choice: dict) -> dict:
        comp = sum(float(self.t_compute[n][choice[n]]) for n in self.names)
        sync = sum(float(self.t_sync[n][choice[n]]) for n in self.names)
        red = sum(self.reduce_time(n, choice[n]) for n in self.names)
        xfer = sum(float(m[choice[e.src], choice[e.dst]]) for e, m in self.edges)
        # update_s: the SGD update, already inside compute_s (t_C counts it, equation 1's
        # terms are unchanged); apart so that it compares with a run's ``update`` phase
        upd = sum(float(self.t_update[n][choice[n]]) for n in self.names if n in self.t_update)
        return {"compute_s": comp, "sync_s": sync, "reduce_s": red, "transfer_s": xfer,
                "total_s": comp + sync + red + xfer, "update_s": upd}

    def dump(self) -> dict:
        """The ``--dump-costs`` document: enough to recompute equation 1 offline."""
        return {
            "layers": [{"name": n, "candidates": [
                {"config": c.as_dict(), "devices": list(c.devices),
                 "t_compute_s": float(self.t_compute[n][i]), "t_sync_s": float(self.t_sync[n][i]),
                 "t_reduce_s": self.reduce_time(n, i)}
                for i, c in enumerate(self.candidates[n])]} for n in self.names],
            "edges": [{"src": e.src, "dst": e.dst, "input_index": e.index,
                       "t_xfer_s": m.tolist()} for e, m in self.edges],
        }


def _soa_regions(need: np.ndarray, live: np.ndarray, dtype=np.int32):
    """``[Cd, Dd, nd, 2]`` regions as ``(lo, hi)`` ``[Cd, nd, Dd]`` of ``dtype`` (int32, or
    :func:`.xkernel.coord_dtype`'s for the tensor), empty (``0, 0``) where ``live [Cd, Dd]``
    is false."""
    m = np.broadcast_to(live[:, None, :], (need.shape[0], need.shape[2], need.shape[1]))
    out = []
    for i in (0, 1):
        a = np.zeros(m.shape, dtype=dtype)
        np.copyto(a, np.moveaxis(need[..., i], 1, 2), casting="unsafe", where=m)
        out.append(a)
    return tuple(out)


def _column_range(a: np.ndarray, fold: int = 64):
    """``(min, max)`` of each column of a 2-D array.  numpy reduces a narrow array's first
    axis with an inner loop over its few columns; folding ``fold`` rows into one row makes
    that loop ``fold`` times longer (eight times faster on a ``[400 000, 8]`` array).

    Examples
    --------
    >>> lo, hi = _column_range(np.array([[3, 1], [0, 1], [5, 2]]), fold=2)
    >>> lo.tolist(), hi.tolist()
    ([0, 1], [5, 2])
    """
    n = len(a) - len(a) % fold
    lo, hi = a[n:].min(axis=0, initial=np.iinfo(a.dtype).max), \
        a[n:].max(axis=0, initial=np.iinfo(a.dtype).min)
    if n:
        f = a[:n].reshape(-1, fold * a.shape[1])
        lo = np.minimum(lo, f.min(axis=0).reshape(fold, -1).min(axis=0))
        hi = np.maximum(hi, f.max(axis=0).reshape(fold, -1).max(axis=0))
    return lo, hi


def _aos_regions(need) -> np.ndarray:
    """:func:`_soa_regions`' arrays back as ``[Cd, Dd, nd, 2]`` int64 boxes."""
    lo, hi = need
    return np.ascontiguousarray(np.stack([lo, hi], axis=-1).transpose(0, 2, 1, 3),
                                dtype=np.int64)


class CostModel:
    """Cost functions of one (layer graph, device graph) pair.

    Parameters
    ----------
    graph, devices: what to cost.
    compute: ``"analytic"`` (roofline) or ``"measured"`` (profile the local device).
    sync: ``"ps"`` (parameter server, the paper) or ``"ring"`` (all-reduce).
    profile_cache: path of the SQLite profile cache (measured mode).
    degrees: the degrees a dimension may take (:func:`.geometry.degree_values`): ``"auto"``
        (every divisor up to 16 devices; beyond, powers of two, or of 4, 8, ... when powers
        of two would be over :data:`AUTO_WORK`, the most a search may start), ``"divisors"``,
        ``"pow2"`` or explicit degrees such as ``"1,4,16,64"``.  Pinned layers always get
        every divisor.
    dtype: the step's precision, ``"fp32"`` (default), ``"tf32"`` or ``"bf16"`` (autocast with
        float32 master weights; see the module's note).  ``dtype_bytes`` is the activation
        element size it gives; ``param_bytes`` stays 4.
    """

    def __init__(self, graph: LayerGraph, devices: DeviceGraph, compute: str = "analytic",
                 sync: str = "ps", profile_cache=None, dtype_bytes: int | None = None,
                 degrees="auto", dtype: str = "fp32"):
        if compute not in ("analytic", "measured"):
            raise ValueError(f"compute cost mode {compute!r}: use 'analytic' or 'measured'")
        if sync not in ("ps", "ring"):
            raise ValueError(f"sync mode {sync!r}: use 'ps' or 'ring'")
        self.graph, self.devices = graph, devices
        self.compute, self.sync = compute, sync
        self.degrees = G.degree_values(degrees, devices.n)     # ValueError with the numbers
        self.dtype = P.check(dtype)
        #: bytes of an activation element (and of its gradient and transfers)
        self.dtype_bytes = P.activation_bytes(self.dtype) if dtype_bytes is None \
            else int(dtype_bytes)
        #: bytes of a parameter element (master weights, gradients, momentum: float32)
        self.param_bytes = P.PARAM_BYTES
        #: bytes of the low-precision working copy of a weight element (bf16: 2)
        self.copy_bytes = P.working_copy_bytes(self.dtype)
        self.profile_cache = profile_cache
        #: the runtime's gradient swap as calibrated on local CPU workers (``meta["swap"]``
        #: of :func:`~explorer.engine.core.devices.local`): each message of an exchange beyond
        #: its first, and the in-place add (per call, bytes touched per second) that sums
        #: the received gradients and makes the SGD update; ``None``: not modelled (presets)
        self._swap = self._swap_figures(devices)
        self._profiler = None
        self.profile_time_s = 0.0
        self._xcache: dict = {}
        self._tile_cache: OrderedDict = OrderedDict()   # big per-layout arrays: a few, LRU
        self._layer_cache: dict = {}
        self._bw_cache: dict = {}
        self._stack_cache: OrderedDict = OrderedDict()
        self._live_cache: OrderedDict = OrderedDict()   # used rows only (edges' consumers)
        self._group_stacks: dict = {}       # a layer's candidates of one total, while costed
        self._lat_cache: dict = {}
        self._cand_cache: dict = {}
        self._ctok: dict = {}
        self._ctok_content: dict = {}
        self._cinfo_cache: OrderedDict = OrderedDict()
        # what depends on the graph alone is shared by every cost model on it (a pipeline
        # search builds one per stage group and micro-batch size over a few graphs)
        self._graph_memo = graph_memo(graph)
        self._esig: dict = self._graph_memo.setdefault("edge signatures", {})
        self._grad_cache: dict | None = self._graph_memo.get("gradients")
        self._memory = None
        self._tables_cache: dict = {}      # pins' text -> CostTables (shared by the methods)
        self._nodes_cache: dict = {}       # pins' text -> node-only CostTables
        self._jit_search = False           # this search's tables use the compiled kernel
        if degrees in (None, "auto") and devices.n > G.ALL_DIVISORS_UP_TO:
            self.degrees = self._auto_degrees()

    @staticmethod
    def _swap_figures(devices: DeviceGraph):
        sw = (getattr(devices, "meta", None) or {}).get("swap")
        if not sw or not float(sw.get("add_bw") or 0) > 0:
            return None
        return {"message_s": max(float(sw.get("message_s") or 0.0), 0.0),
                "add_s": max(float(sw.get("add_s") or 0.0), 0.0),
                "add_bw": float(sw["add_bw"])}

    def _sync_extra(self, r, elems):
        """What the runtime's point-to-point sync (the parameter-server model) does besides
        moving ``elems`` float32 gradients over the link, for one tensor of a replica group
        of ``r``, on the group's first member: ``(messages, seconds of adds)``.  Two replicas
        swap (one message each way, then each adds the other's gradient); a larger group's
        first member receives ``r - 1`` gradients and sends the sum back (``2 (r - 1)``
        messages) and adds ``r - 1`` times.  ``(0, 0)`` where not modelled (presets, ring)."""
        sw = self._swap
        if sw is None or self.sync != "ps":
            return 0, 0.0
        msgs = 1 if r == 2 else 2 * (r - 1)
        add = (r - 1) * (sw["add_s"] + UPDATE_PASSES * self.param_bytes * elems / sw["add_bw"])
        return msgs, add

    def _message_time(self, msgs, r: int):
        """Seconds of the messages of a layer's sync beyond the first of each exchange (the
        calibrated latency is that of a one-message exchange)."""
        if self._swap is None or self.sync != "ps":
            return 0.0 * msgs
        return self._swap["message_s"] * np.maximum(msgs - self._sync_steps(r), 0)

    # -- gradients -------------------------------------------------------------------------
    def needs_grad(self, name: str) -> bool:
        """Whether a gradient flows into ``name``'s output: it has parameters or an input that
        does.  The model input needs none, so no gradient is sent back along its out-edges and
        layers fed only by it compute no input gradient (as the runtime does)."""
        if self._grad_cache is None:
            g = self.graph
            flags: dict = {}
            for n in g.names():
                layer = g.layer(n)
                flags[n] = layer.op != "input" and (
                    bool(layer.params) or any(flags.get(e.src, True) for e in g.in_edges(n)))
            self._grad_cache = self._graph_memo["gradients"] = flags
        return self._grad_cache[name]

    def input_grads(self, name: str) -> tuple:
        """Per input of ``name`` (in op order): does its producer need a gradient."""
        memo = self._graph_memo.setdefault("input gradients", {})
        hit = memo.get(name)
        if hit is None:
            hit = memo[name] = self._input_grads(name)
        return hit

    def _input_grads(self, name: str) -> tuple:
        layer = self.graph.layer(name)
        flags = [True] * len(layer.in_shapes)
        for e in self.graph.in_edges(name):
            if 0 <= e.index < len(flags):
                flags[e.index] = self.needs_grad(e.src)
        return tuple(flags)

    # -- candidates --------------------------------------------------------------------------
    def candidates(self, name: str, pin: Pin | None = None) -> list:
        """Configurations the search may give ``name``, honouring ``pin``."""
        layer = self.graph.layer(name)
        n = self.devices.n
        if pin is not None and pin.devices is not None:
            devs = tuple(pin.devices)
            bad = [d for d in devs if not 0 <= d < n]
            if bad:
                raise InfeasiblePlan(f"pin {pin.text()}: devices {bad} do not exist "
                                     f"(devices are 0..{n - 1})")
            if n % len(devs):
                raise InfeasiblePlan(
                    f"pin {pin.text()}: {len(devs)} devices do not divide the {n} available; "
                    f"pin 1, 2, ... devices that divide {n}")
            cands = G.enumerate_configs(layer, n, devices=devs)
        elif pin is not None:               # a pinned layer may take any divisor
            cands = G.enumerate_configs(layer, n)
        else:
            key = (tuple(layer.size(a) for a in layer.dims), layer.dims,
                   G.reduction_size(layer))
            cands = self._cand_cache.get(key)
            if cands is None:
                cands = G.enumerate_configs(layer, n, degrees=self.degrees)
                self._cand_cache[key] = cands
        if pin is not None:
            allc = cands
            cands = [c for c in cands if pin.matches(c)]
            if not cands:
                bad = [k for k in pin.degrees if k not in layer.dims
                       and not (k == G.REDUCE and G.reduction_size(layer))]
                why = (f"layer {name} ({layer.op}, output {list(layer.out_shape)}) has no "
                       f"dimension {bad}; its dimensions are {list(layer.dims)}" if bad else
                       f"layer {name} ({layer.op}, output {list(layer.out_shape)}) has no such "
                       f"configuration on {n} devices")
                opts = ", ".join(c.label().replace(" ", "") for c in allc[:12])
                raise InfeasiblePlan(f"pin {pin.text()} cannot be met: {why}. Possible: "
                                     f"{opts}{' ...' if len(allc) > 12 else ''}")
        return cands

    # -- per-layer costs -------------------------------------------------------------------
    def _layout_key(self, layer: Layer, cands: list) -> tuple:
        """What a layer's boxes under ``cands`` depend on: layers with the same output shape,
        axes and reduction share them (repeated blocks)."""
        return (layer.out_shape, layer.axes, G.reduction_size(layer), self._ckey(cands))

    def candidates_key(self, cands: list) -> int:
        """A small integer standing for a candidate list's contents, equal for equal lists
        of this cost model (what caches of per-candidate arrays key on)."""
        return self._ckey(cands)

    def _ckey(self, cands: list) -> int:
        """A small key for a candidate list's contents (hashing hundreds of configurations
        of 1,024 devices each on every cache lookup would cost seconds)."""
        hit = self._ctok.get(id(cands))
        if hit is not None and hit[0] is cands:
            return hit[1]
        with _LRU_LOCK:                           # tokens must stay distinct across threads
            tok = self._ctok_content.setdefault(tuple(cands), len(self._ctok_content))
            self._ctok[id(cands)] = (cands, tok)  # holds the list: its id stays unique
        return tok

    def _cinfo(self, cands: list):
        """``(totals [C], devices [C, Dm], capacity [C])`` of a candidate list, by content:
        each candidate's device count, its devices (-1 past the count) and the smallest
        memory among them (read per candidate by every table; hundreds of thousands of
        attribute reads otherwise)."""
        def make():
            totals = np.fromiter((len(c.devices) for c in cands), dtype=np.int64,
                                 count=len(cands))
            dev = np.full((len(cands), int(totals.max())), -1, dtype=np.int64)
            for i, c in enumerate(cands):
                dev[i, : totals[i]] = c.devices
            if self._memory is None:
                self._memory = np.array([d.memory for d in self.devices.devices], dtype=float)
            cap = np.where(dev >= 0, self._memory[np.clip(dev, 0, None)], np.inf).min(axis=1)
            return totals, dev, cap
        # [C, devices] each: a few MiB at 1,024 devices, so only the most recent are kept
        return self._lru(self._cinfo_cache, self._ckey(cands), make, size=24)

    @staticmethod
    def _lru(cache: OrderedDict, key, make, size: int = 12):
        """``cache[key]`` or ``make()``, keeping the ``size`` most recent: these arrays are
        ``[C, devices, ndim, 2]``, tens of MiB each at 1,024 devices."""
        with _LRU_LOCK:
            v = cache.get(key)
            if v is not None:
                cache.move_to_end(key)
                return v
        v = make()                 # outside the lock: two threads may both make it (equal)
        with _LRU_LOCK:
            cache[key] = v
            while len(cache) > size:
                cache.popitem(last=False)
        return v

    def _stacked_all(self, layer: Layer, cands: list):
        """``(tiles, reduce, owned, used)`` of every candidate (one pass for both views)."""
        key = self._layout_key(layer, cands)
        hit = self._group_stacks.get(key)
        if hit is not None:
            return hit
        return self._lru(self._stack_cache, key, lambda: G.stacked_boxes(layer, cands))

    def _stacked(self, layer: Layer, cands: list):
        _, _, owned, used = self._stacked_all(layer, cands)
        return owned, used

    def _stacked_compute(self, layer: Layer, cands: list):
        tiles, red, _, used = self._stacked_all(layer, cands)
        return tiles, red, used

    def shard_shapes(self, layer: Layer, cfg: G.Config) -> list:
        """Per device of ``cfg``: (shape of the box it computes, input region shapes); a
        row-parallel device computes its group's whole tile over its feature slice."""
        boxes, red = G.compute_boxes(layer, cfg)
        ins = [G.input_regions(layer, i, boxes, red) for i in range(len(layer.in_shapes))]
        out = []
        for k in range(cfg.total):
            out.append((tuple(int(x) for x in boxes[k, :, 1] - boxes[k, :, 0]),
                        [tuple(int(x) for x in r[k, :, 1] - r[k, :, 0]) for r in ins]))
        return out

    def layer_costs(self, name: str, cands: list):
        """``(t_compute[C], t_sync[C], memory[C])`` for ``name`` over ``cands``."""
        return tuple(a.copy() for a in self._layer_hit(name, cands)[:3])

    def update_costs(self, name: str, cands: list) -> np.ndarray:
        """``[C]``: the SGD update of the slowest device's weight shards, the part of
        ``t_compute`` the breakdown reports as ``update_s`` (see the module docstring)."""
        return self._layer_hit(name, cands)[3].copy()

    def _layer_hit(self, name: str, cands: list):
        layer = self.graph.layer(name)
        key = (layer.op, repr(sorted(layer.attrs.items())), tuple(map(tuple, layer.in_shapes)),
               layer.out_shape, layer.axes, params_key(layer), layer.flops,
               self._ckey(cands), self.input_grads(name))
        hit = self._layer_cache.get(key)
        if hit is None:
            totals = self._cinfo(cands)[0]
            if len(cands) * totals.max() <= self.GROUP_ROWS or len(set(totals.tolist())) < 2:
                hit = self._layer_costs(layer, cands)
            else:
                # the arrays are [C, most devices]: by total degree, a candidate on k devices
                # costs k rows, not the largest candidate's count (each candidate's costs are
                # its own, so the numbers are the same)
                hit = tuple(np.empty(len(cands)) for _ in range(4))
                # the used rows only (candidate-major: candidate i's k devices are rows
                # start[i]..start[i]+k-1), a third of the padded boxes at 1,024 devices
                tiles, red, owned, _, _ = self._live_rows(layer, cands)
                start = np.concatenate([[0], np.cumsum(totals)[:-1]])
                for k in np.unique(totals):
                    idx = np.flatnonzero(totals == k)
                    sub = [cands[i] for i in idx]
                    # the group's boxes are rows of the whole list's (a row is its
                    # candidate's alone): gathered, not stacked again
                    k = int(k)
                    rows = (start[idx][:, None] + np.arange(k)[None]).reshape(-1)
                    t_ = tiles[rows].reshape(len(idx), k, *tiles.shape[1:])
                    o_ = owned[rows].reshape(t_.shape)
                    r_ = None
                    if red is not None and any(c.deg(G.REDUCE) > 1 for c in sub):
                        r_ = red[rows].reshape(len(idx), k, 2)
                    else:
                        o_ = t_
                    # (held apart from the LRU of whole lists while the group is costed:
                    # eleven groups a layer evicted the whole lists the edges read next,
                    # which were then stacked again - 92 stackings for 30 layouts)
                    gkey = self._layout_key(layer, sub)
                    with _LRU_LOCK:
                        self._group_stacks[gkey] = (t_, r_, o_,
                                                    np.ones((len(idx), k), dtype=bool))
                    try:
                        for out, part in zip(hit, self._layer_costs(layer, sub)):
                            out[idx] = part
                    finally:
                        with _LRU_LOCK:
                            self._group_stacks.pop(gkey, None)
            self._layer_cache[key] = hit
        return hit

    def _layer_costs(self, layer: Layer, cands: list):
        C = len(cands)
        # every candidate's tiles at once: [C, Dm, nd, 2], padding rows are empty boxes
        boxes, used = self._stacked(layer, cands)
        dev = np.clip(self._cinfo(cands)[1], 0, None)
        Dm = dev.shape[1]
        db, pb, cb = self.dtype_bytes, self.param_bytes, self.copy_bytes
        vol = np.where(used, G.volume(boxes), 0).astype(float)
        tc, ts = np.zeros(C), np.zeros(C)
        if layer.op == "input":
            return tc, ts, vol.max(axis=1) * db, np.zeros(C)
        # what each device computes: its owned box, or (row-parallel) a partial sum of its
        # group's tile over its feature slice - same FLOPs as the owned box's share
        tiles, red, _ = self._stacked_compute(layer, cands)
        partial = 0.0 if red is None else np.where(used & (red[..., 1] - red[..., 0] <
                                                           (G.reduction_size(layer) or 0)),
                                                   G.volume(tiles), 0).astype(float)
        in_el = np.zeros((C, Dm))
        for j in range(len(layer.in_shapes)):
            in_el += np.where(used, G.volume(G.input_regions(layer, j, tiles, red)), 0)
        shards = G.param_shards(layer, tiles, red)
        pel = np.zeros((C, Dm))
        ntens = np.zeros((C, Dm))           # the device's non-empty weight shards (tensors)
        svols = [G.volume(reg) for _, reg in shards.values()]
        for v in svols:
            v = np.where(used, v, 0)
            pel += v
            ntens += v > 0
        mbw = np.array([d.mem_bw for d in self.devices.devices])[dev]
        # SGD update of the device's weight shards (read p, read grad, write p): at the
        # calibrated rate of the runtime's in-place add, one call per shard, when measured
        sw = self._swap
        if sw is not None:
            upd = ntens * sw["add_s"] + UPDATE_PASSES * pb * pel / sw["add_bw"]
        else:
            upd = UPDATE_PASSES * pb * pel / mbw
        upd = np.where(used, upd, 0.0)
        tu = upd.max(axis=1)
        if self.compute == "measured":
            for i, cfg in enumerate(cands):
                tc[i] = self._measured(layer, cfg) + upd[i].max()
        else:
            out_vol = max(math.prod(layer.out_shape), 1)
            peak = self.devices.peak_flops(self.dtype)[dev]
            flops = 3.0 * layer.flops * vol / out_vol          # forward + 2x backward
            # kernels read weights at the working precision: bf16 from autocast's copy
            # (made once a step: read 4, write 2 bytes), fp32 / tf32 the master itself
            wb = cb if cb else pb
            traffic = 3.0 * (db * (in_el + vol + partial) + wb * pel) + \
                (pb + cb) * pel * (cb > 0)
            eff = EFFICIENCY.get(layer.op, 0.5)
            t = np.maximum(flops / (peak * eff), traffic / mbw) + LAUNCH_OVERHEAD_S + upd
            tc = np.where(used, t, 0.0).max(axis=1)
        nodes = self._node_structure()
        if nodes is not None and shards:
            ts = self._sync_by_node(shards, dev, used, cands, nodes, svols)
        else:
            pvols = [G.volume(reg) for _, reg in shards.values()]
            for i, cfg in enumerate(cands):
                groups = []
                for (_, reg), pva in zip(shards.values(), pvols):
                    rows = reg[i, : cfg.total].reshape(cfg.total, -1)
                    keyed: dict = {}
                    for k, row in enumerate(rows.tolist()):
                        keyed.setdefault(tuple(row), []).append(k)
                    groups.extend((int(pva[i][m[0]]), m) for m in keyed.values())
                ts[i] = self._sync(cfg, groups)
        # weights + gradients + momentum, activation + its gradient, fetched inputs (and a
        # row-parallel device's partial tile and the gathered gradient of it)
        mem = ((pb * 3 + cb) * pel + db * (2 * vol + in_el + 2 * partial)).max(axis=1)
        return tc, ts, mem, tu

    def reduce_costs(self, name: str, cands: list):
        """``(t_R [C], bytes [C])``: the reduce-scatter of each row-parallel candidate's
        partial tiles (and the all-gather of their gradient backward), ``None`` when no
        candidate has a ``k`` degree.  See the module docstring."""
        layer = self.graph.layer(name)
        # the same layout and gradient flag give the same numbers (repeated blocks)
        key = ("reduce", self._layout_key(layer, cands), self.needs_grad(name))
        if key not in self._layer_cache:
            self._layer_cache[key] = self._reduce_costs(name, cands)
        hit = self._layer_cache[key]
        return None if hit is None else (hit[0].copy(), hit[1].copy())

    def _reduce_costs(self, name: str, cands: list):
        if all(c.deg(G.REDUCE) == 1 for c in cands):
            return None
        layer = self.graph.layer(name)
        passes = 2.0 if self.needs_grad(name) else 1.0
        t, nbytes = np.zeros(len(cands)), np.zeros(len(cands))
        nodes = self._node_structure()
        if nodes is not None:
            # every group of every candidate with the same (k, device count) at once; a
            # group's slowest link follows from the node structure
            node_of, bw_in, bw_out, lat_in, lat_out = nodes
            tiles, _, _ = self._stacked_compute(layer, cands)
            vols = G.volume(tiles).astype(float) * self.dtype_bytes     # [C, Dm]
            totals, dev, _ = self._cinfo(cands)
            ks = np.array([c.deg(G.REDUCE) for c in cands])
            for k, tot in sorted({kt for kt in zip(ks.tolist(), totals.tolist())
                                  if kt[0] > 1}):
                idx = np.flatnonzero((ks == k) & (totals == tot))
                nn_ = np.sort(node_of[dev[idx, :tot]].reshape(len(idx), -1, k), axis=2)
                out = nn_[..., 0] != nn_[..., -1]
                inn = (nn_[..., 1:] == nn_[..., :-1]).any(axis=2)
                bw = np.minimum(np.where(inn, bw_in, np.inf), np.where(out, bw_out, np.inf))
                lat = np.maximum(np.where(inn, lat_in, 0.0), np.where(out, lat_out, 0.0))
                sz = vols[idx, :tot:k]                                   # [g, groups]
                t[idx] = (passes * ((k - 1) / k * sz / bw + (k - 1) * lat)).max(axis=1)
                nbytes[idx] = (passes * (k - 1) * sz).sum(axis=1)  # whole bytes: exact
            return t, nbytes
        for i, cfg in enumerate(cands):
            k = cfg.deg(G.REDUCE)
            if k == 1:
                continue
            tiles, _ = G.compute_boxes(layer, cfg)
            for members in G.reduce_groups(cfg):
                devs = tuple(cfg.devices[m] for m in members)
                s = float(G.volume(tiles[members[0]])) * self.dtype_bytes
                one = (k - 1) / k * s / self._group_bw(devs) + (k - 1) * self._group_lat(devs)
                t[i] = max(t[i], passes * one)
                nbytes[i] += passes * (k - 1) * s
        return t, nbytes

    def _sync_by_node(self, shards, dev, used, cands, nodes, svols=None) -> np.ndarray:
        """Vectorised :meth:`_sync` for two-level device graphs (same numbers, no loops).

        For each device slot, its replica group is the set of slots of its candidate holding
        an identical shard (found by sorting the shards, ``O(C·D log)`` rather than comparing
        every pair of slots); the group's server is its first slot; a group's slowest link is
        the inter-node one as soon as it spans two nodes.  ``svols``: the shards' volumes
        ``[C, Dm]`` when the caller has them.
        """
        node_of, bw_in, bw_out, lat_in, lat_out = nodes
        if svols is None:
            svols = [G.volume(reg) for _, reg in shards.values()]
        C, Dm = used.shape
        load = np.zeros((C, Dm))
        msgs = np.zeros((C, Dm))                                     # the runtime's messages
        rmax = np.zeros(C, dtype=np.int64)                           # largest replica group
        node = node_of[dev]                                          # [C, Dm]
        ci, slot = np.nonzero(used)                                  # candidate-major order
        dense = ci.size == C * Dm          # every slot used (layer costs go by total degree)
        node_u = node.reshape(-1) if dense else node[ci, slot]
        for (_, reg), svol in zip(shards.values(), svols):
            flat = reg.reshape(C * Dm, -1) if dense else reg.reshape(C, Dm, -1)[ci, slot]
            code = self._slot_code(ci, C, flat)
            if code is not None:        # one integer per row, in the same order: one sort
                order = np.argsort(code, kind="stable")
                ks = code[order]
                start = np.ones(len(ks), dtype=bool)
                start[1:] = ks[1:] != ks[:-1]
            else:
                keys = np.column_stack([ci, flat[:, (flat != flat[:1]).any(axis=0)]])
                order = np.lexsort(keys.T[::-1])                     # stable: slots in order
                ks = keys[order]
                start = np.ones(len(ks), dtype=bool)
                start[1:] = (ks[1:] != ks[:-1]).any(axis=1)
            first = np.flatnonzero(start)
            r = np.diff(np.append(first, len(ks)))                   # group sizes
            nn_ = node_u[order]
            span = np.minimum.reduceat(nn_, first) != np.maximum.reduceat(nn_, first)
            lead = order[first]                                      # the group's first slot
            s = svol[ci[lead], slot[lead]].astype(float) * self.param_bytes
            bw = np.where(span, bw_out, bw_in)
            if self.sync == "ps":
                cost = 2.0 * (r - 1) * s / bw
            else:
                cost = 2.0 * (r - 1) / np.maximum(r, 1) * s / bw
            if self._swap is not None and self.sync == "ps":
                m_, a_ = self._sync_extra_arrays(r, s / self.param_bytes)
                cost = cost + a_
            else:
                m_ = np.zeros(len(r))
            many = (r > 1) & (s > 0)
            load[ci[lead][many], slot[lead][many]] += cost[many]
            msgs[ci[lead][many], slot[lead][many]] += m_[many]
            np.maximum.at(rmax, ci[lead], np.where(s > 0, r, 0))
        ts = np.zeros(C)
        for i, c in enumerate(cands):
            if (load[i] > 0).any():
                r_ = int(rmax[i])
                ts[i] = (load[i] + self._message_time(msgs[i], r_)).max() + \
                    self._sync_steps(r_) * self._group_lat(c.devices)
        return ts

    def _sync_extra_arrays(self, r: np.ndarray, elems: np.ndarray):
        """:meth:`_sync_extra` over arrays of group sizes and tensor elements."""
        sw = self._swap
        msgs = np.where(r == 2, 1, 2 * (r - 1)).astype(float)
        add = (r - 1) * (sw["add_s"] + UPDATE_PASSES * self.param_bytes * elems / sw["add_bw"])
        return msgs, add

    @staticmethod
    def _slot_code(ci: np.ndarray, C: int, flat: np.ndarray):
        """Each row ``(ci, the columns of flat that vary)`` as one int64 that sorts as those
        rows do lexicographically (so one stable sort of integers gives the same order),
        without building the rows: mixed radix with ``ci`` in ``[0, C)`` the most
        significant digit, then each varying column over its range; ``None`` when that does
        not fit in 62 bits."""
        if not len(flat):
            return np.zeros(0, dtype=np.int64)
        lo, hi = _column_range(flat)
        var = np.flatnonzero(hi > lo)
        spans = [int(hi[c]) - int(lo[c]) + 1 for c in var]
        if math.prod(spans) * max(C, 1) >= 1 << 62:
            return None
        code = ci.astype(np.int64)
        for c, sp in zip(var, spans):
            code *= sp
            code += flat[:, c] - lo[c]
        return code

    def _sync_steps(self, r: int) -> int:
        """Exchanges (each paying one latency) to synchronise a replica group of ``r``.

        Parameter server: gradients to the server, parameters back — two exchanges, or one
        when ``r = 2`` (the server is one replica: the two swap, as the runtime does).  Ring
        all-reduce: ``2 (r-1)`` steps."""
        if r < 2:
            return 0
        if self.sync == "ps":
            return 1 if r == 2 else 2
        return 2 * (r - 1)

    def _sync(self, cfg: G.Config, groups) -> float:
        """Synchronisation time of the layer's replicated shards under ``cfg``.

        Each replica group (devices holding the same shard) has its server on its first
        member; different servers work in parallel, one server handles its groups in turn.
        """
        load: dict = {}
        msgs: dict = {}
        rmax = 0
        for elems, members in groups:
            r = len(members)
            if r < 2 or elems == 0:
                continue
            rmax = max(rmax, r)
            devs = tuple(cfg.devices[k] for k in members)
            bw = self._group_bw(devs)
            s = elems * self.param_bytes          # float32 gradients and parameters
            if self.sync == "ps":
                cost = 2.0 * (r - 1) * s / bw
            else:
                cost = 2.0 * (r - 1) / r * s / bw
            m, add = self._sync_extra(r, elems)
            load[devs[0]] = load.get(devs[0], 0.0) + cost + add
            msgs[devs[0]] = msgs.get(devs[0], 0) + m
        if not load:
            return 0.0
        lat = self._group_lat(cfg.devices)
        return max(v + float(self._message_time(msgs[k], rmax)) for k, v in load.items()) + \
            self._sync_steps(rmax) * lat

    def _group_bw(self, devs: tuple) -> float:
        """Slowest link inside a group of devices (cached: groups repeat across layers)."""
        v = self._bw_cache.get(devs)
        if v is None:
            idx = list(devs)
            v = float(self.devices.bw[idx][:, idx].min())
            self._bw_cache[devs] = v
        return v

    def _group_lat(self, devs: tuple) -> float:
        v = self._lat_cache.get(devs)
        if v is None:
            idx = list(devs)
            v = float(self.devices.latency[idx][:, idx].max())
            self._lat_cache[devs] = v
        return v

    def _measured(self, layer: Layer, cfg: G.Config) -> float:
        """t_C by running the slowest shard shape on this machine (cached in SQLite)."""
        if self._profiler is None:
            from explorer.engine.core.profile import Profiler
            self._profiler = Profiler(self.profile_cache, dtype=self.dtype)
        worst = 0.0
        shapes = {(s[0], tuple(s[1])) for s in self.shard_shapes(layer, cfg)}
        grads = self.input_grads(layer.name)
        # the devices of the configuration compute at once (the others wait): the time
        # measured with that many workers in lockstep when calibrated, else the shard alone
        conc = cfg.total if cfg.total > 1 else 1
        for out_shape, in_shapes in sorted(shapes):
            t = self._profiler.measure(layer, out_shape, list(in_shapes),
                                       self.devices.devices[0].kind, input_grads=grads,
                                       concurrency=conc)
            self.profile_time_s += self._profiler.last_profile_s
            worst = max(worst, t)
        return worst

    # -- per-edge costs --------------------------------------------------------------------
    def _node_structure(self):
        """``(node_of[d], intra_bw, inter_bw, intra_lat, inter_lat)`` when the device graph's
        links depend only on whether two devices share a node (all presets), else ``None``."""
        if hasattr(self, "_nodes"):
            return self._nodes
        d = self.devices
        node = np.array([dev.node for dev in d.devices])
        same = node[:, None] == node[None, :]
        off = ~np.eye(d.n, dtype=bool)
        res = None
        vals = []
        for mask in (same & off, ~same):
            if mask.any():
                b, lt = d.bw[mask], d.latency[mask]
                if not (np.all(b == b[0]) and np.all(lt == lt[0])):
                    vals = None
                    break
                vals.append((float(b[0]), float(lt[0])))
            else:
                vals.append((np.inf, 0.0))
        if vals is not None:
            res = (node, vals[0][0], vals[1][0], vals[0][1], vals[1][1])
        self._nodes = res
        return res

    def xfer(self, edge: Edge, src_cands: list, dst_cands: list):
        """``(t_xfer [Cs, Cd], bytes [Cs, Cd])`` for one edge (forward + backward).

        Destination device ``m`` needs region ``R_m`` of the producer's tensor; it receives
        ``R_m`` minus what it already owns, from each owner over that pair's link, one source
        after another (plus one link latency, the largest among its sources); destinations
        receive in parallel, so the edge takes the slowest one.  Twice that (the gradient of
        the region goes back the same way), or once when the producer needs no gradient.

        Tables depend only on the producer's box layout and the regions the consumer's
        devices need, so edges with the same pair of layouts (repeated blocks, a tensor read
        by several branches alike) share one table, found by the layouts' contents.
        """
        src, dst = self.graph.layer(edge.src), self.graph.layer(edge.dst)
        skey = self._edge_sig(edge, self._ckey(src_cands), self._ckey(dst_cands))
        hit = self._xcache.get(skey)            # the same edge signature: no geometry at all
        if hit is not None:
            return hit
        ddev = self._cinfo(dst_cands)[1]
        # the regions each device needs on the producer, per axis ([Cd, nd, Dd] lo and hi:
        # half the bytes to hash, and the compiled kernel's layout); unused slots need nothing
        need = self._edge_need(edge, dst, dst_cands, ddev >= 0)
        digest = hashlib.sha1(need[0])      # (hardware SHA: twice blake2b's speed here)
        digest.update(need[1])
        digest.update(np.ascontiguousarray(ddev))
        key = (self._layout_key(src, src_cands), need[0].shape, digest.digest(),
               self.needs_grad(edge.src))
        hit = self._xcache.get(key)             # another consumer needing the same regions
        if hit is not None:
            self._xcache[skey] = hit
            return hit
        nodes = self._node_structure()
        res = None
        if nodes is not None:
            res = self._xfer_by_node(src, src_cands, need, ddev, nodes)
        if res is None:
            res = self._xfer_pairwise(src, src_cands, _aos_regions(need), ddev)
        if self.needs_grad(edge.src):
            res = (2.0 * res[0], 2.0 * res[1])
        self._xcache[key] = self._xcache[skey] = res
        return res

    def _live_rows(self, layer: Layer, cands: list):
        """:func:`.geometry.stacked_live` of a layout (a few kept): the edges' regions and
        the producers' per-axis tiles read these, not the padded boxes."""
        return self._lru(self._live_cache, self._layout_key(layer, cands),
                         lambda: G.stacked_live(layer, cands), size=6)

    def _edge_need(self, edge: Edge, dst: Layer, cands: list, live):
        """:func:`_soa_regions` of ``G.edge_regions(graph, edge, boxes, red)`` of what each
        device of ``cands`` computes, under ``live [Cd, Dd]``: computed over the live slots
        only when some are not (a candidate on ``k`` devices costs ``k`` rows, not the
        largest count; regions are per box), from :func:`.geometry.stacked_live` - no padded
        ``[Cd, Dd, nd, 2]`` boxes (a layout's are rebuilt for its edges otherwise: the layer
        pass before has evicted them)."""
        from explorer.engine.layerwise.xkernel import coord_dtype
        dt = coord_dtype(self.graph.layer(edge.src).out_shape)
        if live.sum() > 0.75 * live.size:           # mostly live: no gather, no scatter
            boxes, red, _ = self._stacked_compute(dst, cands)
            return _soa_regions(G.edge_regions(self.graph, edge, boxes, red), live, dt)
        tiles, red, _, ci, sl = self._live_rows(dst, cands)
        reg = G.edge_regions(self.graph, edge, tiles, red)                  # [U, nd, 2]
        out = []
        for i in (0, 1):
            a = np.zeros((live.shape[0], reg.shape[1], live.shape[1]), dtype=dt)
            a[ci, :, sl] = reg[..., i]
            out.append(a)
        return tuple(out)

    #: Candidates × devices above which a layer's costs are computed per total degree
    GROUP_ROWS = 1 << 16
    #: Elements of the largest temporary a per-edge kernel builds (bounded memory whatever
    #: the device count: the work is cut into blocks of source candidates).
    BLOCK = 1 << 20
    #: Elements per block of the by-node transfer kernel: its few temporaries then stay in a
    #: core's L2 cache (about 10 % less CPU at 64 devices than :data:`BLOCK`-sized blocks).
    NODE_BLOCK = 1 << 16
    #: Source × destination candidates × devices up to which the by-node kernel runs once
    #: over every destination padded to the largest device count (fixed per-call costs
    #: dominate there, not the padding's extra elements)
    PAD_LIMIT = 1 << 20
    #: Kernel elements (``Cs · Σ_dst k``) from which an edge's by-node table is computed by
    #: the compiled kernel (:mod:`.xkernel`): several times faster, but loading numba costs
    #: about a second, and compiling it (once; cached) a few more
    JIT_WORK = 1 << 24
    #: By-node kernel elements of a whole search (:meth:`estimate`'s ``xfer_work``) from
    #: which every one of its edges above :data:`JIT_EDGE` elements runs compiled: loading
    #: the kernel compiled at install costs about 0.4 s, which 6e7 elements at the numpy
    #: path's ~8 ns against the kernel's ~2 ns repay (Inception-v3 at 64 devices, 9e7: its
    #: tables take 1.1 s instead of 2.5 s; ResNet-50 at 64, 3e7, stays on numpy)
    JIT_SEARCH = 6e7
    JIT_EDGE = 1 << 16

    def _src_tiles(self, src, src_cands):
        """``(tiles [Cs, Ds, nd, 2], device [Cs, Ds])`` of the producer (device -1: unused)."""
        sb, _ = self._stacked(src, src_cands)
        return sb, self._cinfo(src_cands)[1]

    @staticmethod
    def _axes(boxes: np.ndarray) -> list:
        """Per axis ``(lo, hi)`` as contiguous int32 arrays (half the memory traffic of int64;
        tensor extents are far below 2**31)."""
        return [(np.ascontiguousarray(boxes[..., ax, 0], dtype=np.int32),
                 np.ascontiguousarray(boxes[..., ax, 1], dtype=np.int32))
                for ax in range(boxes.shape[-2])]

    @staticmethod
    def _ov(a: list, b: list, shape, sizes, scale: float = 1.0) -> np.ndarray:
        """Volume of the intersection of broadcast boxes given per axis (:meth:`_axes`) of a
        tensor of ``sizes``, times ``scale`` (bytes per element), as float64 (exact: products
        of integers below 2**53).

        An axis one side covers whole everywhere (an unsplit axis, a full input-channel
        range) contributes the other side's extent, multiplied on that side's smaller array;
        only axes both sides cut pay the full-size ``max / min / clip``."""
        out = None
        small = float(scale)
        for (alo, ahi), (blo, bhi), size in zip(a, b, sizes):
            if not blo.any() and (bhi == size).all():
                small = small * (ahi - alo).astype(np.float64)
                continue
            if not alo.any() and (ahi == size).all():
                small = small * (bhi - blo).astype(np.float64)
                continue
            ext = np.minimum(ahi, bhi)
            ext -= np.maximum(alo, blo)
            np.maximum(ext, 0, out=ext)
            if out is None:
                out = ext.astype(np.float64)
            else:
                out *= ext
        if out is None:
            return np.broadcast_to(small, shape) * 1.0
        out *= small
        return out

    def _xfer_by_node(self, src, src_cands, need, ddev, nodes):
        """Fast path for two-level (node-local / remote) links.

        Bytes a destination gets from its own node = |R ∩ node's tiles| − |R ∩ own tile|, from
        other nodes = |R| − |R ∩ node's tiles| (the tiles partition the tensor).  Needs each
        node's tiles to form a box, which holds for the presets' power-of-two configurations;
        returns ``None`` otherwise and the pairwise path is used.  Work is
        ``Σ_dst Cs · devices(dst)`` (a destination on ``k`` devices costs ``k``), in blocks of
        at most :data:`NODE_BLOCK` elements.
        """
        node_of, bw_in, bw_out, lat_in, lat_out = nodes
        Cs, Cd = len(src_cands), ddev.shape[0]
        kd = (ddev >= 0).sum(axis=1)
        Dd = ddev.shape[1]
        small = Cs * Cd * Dd <= self.PAD_LIMIT and (ddev == np.where(ddev >= 0, np.arange(Dd),
                                                                      -1)).all()
        work = Cs * int(kd.sum())
        jit = not small and (work >= self.JIT_WORK or
                             (self._jit_search and work >= self.JIT_EDGE))
        if jit:           # the compiled kernel reads the source's boxes per axis (int32)
            side = self._node_side(src, src_cands, node_of)
            if side is None:
                return None
        else:
            tiles = self._node_tiles(src, src_cands, node_of)
            if tiles is None:
                return None
            own, nbox = tiles                                       # [Cs, N|nodes, nd, 2]
            need = _aos_regions(need)
        sizes = src.out_shape
        item = float(self.dtype_bytes)
        t = np.zeros((Cs, Cd))
        nbytes = np.zeros((Cs, Cd))
        if small:
            # small and unpinned (destination j on devices 0..k_j-1): one kernel call over
            # all destinations padded to Dd devices (padding needs nothing: it adds zeros
            # to exact byte sums and to a maximum of non-negative times)
            tot = G.volume(need).astype(np.float64)[None] * item
            self._xfer_block(t, nbytes, np.arange(Cs), np.arange(Cd), need, tot,
                             tot.sum(axis=2), own[:, :Dd], nbox[:, node_of[:Dd]], sizes, item,
                             nodes)
            return t, nbytes
        # a source candidate's tiles lie on the nodes of its devices: a destination device
        # past ``cut`` (the end of the last such node) owns nothing and has no node-mate
        # that does, so it receives its whole region remotely - no kernel needed there
        cut = np.full(Cs, self.devices.n)
        if np.isfinite(bw_out) and (np.diff(node_of) >= 0).all():
            node_end = np.searchsorted(node_of, np.arange(int(node_of.max()) + 1), "right")
            cut = node_end[node_of[self._cinfo(src_cands)[1].max(axis=1)]]
        if jit:
            from explorer.engine.layerwise import xkernel
            return xkernel.by_node(side, need, ddev, cut, item, nodes, sizes)
        for K in np.unique(kd):
            K = int(K)
            js = np.flatnonzero(kd == K)
            dv = ddev[js, :K]
            if (dv == np.arange(K)).all():      # unpinned: devices 0..K-1, no gathers
                groups = [(js, np.arange(K))]
            else:                               # pinned devices: one destination at a time
                groups = [(js[i:i + 1], dv[i]) for i in range(len(js))]
            for jj, devs in groups:
                nd_ = need[jj][:, :K]                                 # [g, K, nd, 2]
                tot = G.volume(nd_).astype(np.float64)[None] * item   # [1, g, K] bytes
                tot_b = tot.sum(axis=2)
                ident = devs[-1] == K - 1 and (devs == np.arange(K)).all()
                # what a device past the cut costs (the kernel's own formula with
                # intra = 0, inter = |R|), and its suffix maximum over devices
                far = tot[0] / bw_out + np.where(tot[0] > 0, lat_out, 0.0)      # [g, K]
                sfx = np.maximum.accumulate(far[:, ::-1], axis=1)[:, ::-1]
                for u in np.unique(np.minimum(cut, K) if ident else [K]):
                    u = int(u)
                    ss = np.flatnonzero(np.minimum(cut, K) == u) if ident else np.arange(Cs)
                    self._xfer_block(t, nbytes, ss, jj, nd_[:, :u], tot[:, :, :u], tot_b,
                                     own[ss][:, devs[:u]], nbox[ss][:, node_of[devs[:u]]],
                                     sizes, item, nodes)
                    if u < K:
                        t[np.ix_(ss, jj)] = np.maximum(t[np.ix_(ss, jj)], sfx[None, :, u])
        return t, nbytes

    def _xfer_block(self, t, nbytes, ss, jj, nd_, tot, tot_b, own, nbox, sizes, item, nodes):
        """The by-node kernel for source candidates ``ss`` and destinations ``jj`` over the
        devices given (``own`` / ``nbox`` ``[len(ss), K, nd, 2]``, ``nd_`` ``[g, K, nd, 2]``),
        in blocks of at most :data:`NODE_BLOCK` elements; writes ``t`` and ``nbytes``."""
        _, bw_in, bw_out, lat_in, lat_out = nodes
        K = nd_.shape[1]
        B = self._axes(nd_[None])                                     # [1, g, K]
        own_k = self._axes(own[:, None])                              # [s, 1, K]
        nb_k = self._axes(nbox[:, None])
        Cs = len(ss)
        step = max(1, self.NODE_BLOCK // max(1, len(jj) * K))
        for a in range(0, Cs, step):
            sl = slice(a, a + step)
            rows = ss[sl]
            shape = (len(rows), len(jj), K)
            # bytes (whole numbers: every sum and difference below is exact)
            mine = self._ov([(lo[sl], hi[sl]) for lo, hi in own_k], B, shape, sizes,
                            item)
            local = self._ov([(lo[sl], hi[sl]) for lo, hi in nb_k], B, shape, sizes,
                             item)
            nbytes[np.ix_(rows, jj)] = tot_b - mine.sum(axis=2)  # Σ (intra + inter)
            intra = np.subtract(local, mine, out=mine)
            inter = np.subtract(tot, local, out=local)
            far, near = inter > 0, intra > 0
            # seconds, in place over the byte buffers (the same sums, fewer temporaries)
            tm = None
            if np.isfinite(bw_in):
                tm = np.divide(intra, bw_in, out=intra)
            if np.isfinite(bw_out):
                np.divide(inter, bw_out, out=inter)
                tm = inter if tm is None else np.add(tm, inter, out=tm)
            if tm is None:
                tm = np.zeros(shape)
            if lat_out >= lat_in:      # max(lat_in [intra], lat_out [inter])
                np.add(tm, lat_out, out=tm, where=far)
                np.add(tm, lat_in, out=tm, where=np.greater(near, far, out=near))
            else:
                tm += np.maximum(lat_in * near, lat_out * far)
            t[np.ix_(rows, jj)] = tm.max(axis=2)

    def _node_tiles(self, src, src_cands, node_of):
        """Per source candidate: the tile each device owns ``[Cs, N, nd, 2]`` and the bounding
        box of each node's tiles ``[Cs, nodes, nd, 2]``; ``None`` if some node's tiles are not
        a box (vectorised over candidates and devices)."""
        def make():
            sb, sdev = self._src_tiles(src, src_cands)          # [Cs, Ds, nd, 2], [Cs, Ds]
            n_nodes = int(node_of.max()) + 1
            Cs, Ds, nd = sb.shape[0], sb.shape[1], sb.shape[2]
            used = sdev >= 0
            ci = np.broadcast_to(np.arange(Cs)[:, None], (Cs, Ds))[used]
            dv = sdev[used]
            sbu = sb[used]                                      # [U, nd, 2], gathered once
            own = np.zeros((Cs, self.devices.n, nd, 2), dtype=np.int64)
            own[ci, dv] = sbu
            nn_ = node_of[dv]
            big = np.iinfo(np.int64).max
            lo = np.full((Cs, n_nodes, nd), big, dtype=np.int64)
            hi = np.full((Cs, n_nodes, nd), -1, dtype=np.int64)
            np.minimum.at(lo, (ci, nn_), sbu[:, :, 0])
            np.maximum.at(hi, (ci, nn_), sbu[:, :, 1])
            vol = np.zeros((Cs, n_nodes))
            np.add.at(vol, (ci, nn_), G.volume(sbu).astype(np.float64))
            present = hi[..., 0] >= 0 if nd else vol > 0
            nbox = np.zeros((Cs, n_nodes, nd, 2), dtype=np.int64)
            nbox[present, :, 0] = lo[present]
            nbox[present, :, 1] = hi[present]
            if not np.array_equal(G.volume(nbox[present]).astype(np.float64), vol[present]):
                return False
            return own, nbox
        res = self._lru(self._tile_cache, ("nodes",) + self._layout_key(src, src_cands), make,
                        size=4)
        return None if res is False else res

    def _node_side(self, src, src_cands, node_of):
        """:func:`.xkernel.source_side` of ``_node_tiles(...)`` (the same arrays), built per
        axis (:func:`.xkernel.coord_dtype`) straight from the used slots' tiles
        (:meth:`_live_rows`) when every candidate runs on devices ``0..k-1`` and nodes are
        equal blocks of consecutive devices (the presets): no
        ``[Cs, N, nd, 2]`` int64 arrays, no scattered ``ufunc.at`` reductions.  ``None`` when
        some node's tiles are not a box."""
        def make():
            from explorer.engine.layerwise import xkernel
            sdev = self._cinfo(src_cands)[1]                    # [Cs, Ds]
            N = self.devices.n
            (Cs, Ds), nd = sdev.shape, len(src.out_shape)
            g = int((node_of == 0).sum())
            slots = np.arange(Ds)
            if (N % g or Ds > N or not (node_of == np.arange(N) // g).all()
                    or not (sdev == np.where(sdev >= 0, slots, -1)).all()):
                tiles = self._node_tiles(src, src_cands, node_of)
                return False if tiles is None else xkernel.source_side(*tiles, node_of,
                                                                       src.out_shape)
            dt = xkernel.coord_dtype(src.out_shape)
            _, _, own, ci, sl = self._live_rows(src, src_cands)  # the used slots' tiles
            olo = np.zeros((Cs, nd, N), dtype=dt)
            ohi = np.zeros((Cs, nd, N), dtype=dt)
            olo[ci, :, sl] = own[..., 0]
            ohi[ci, :, sl] = own[..., 1]
            used = np.zeros((Cs, N), dtype=bool)
            used[ci, sl] = True
            un = used.reshape(Cs, 1, N // g, g)                  # [Cs, 1, nodes, g]
            present = un.any(axis=3)                             # the node holds tiles
            big = np.iinfo(dt).max
            lo = np.where(un, olo.reshape(Cs, nd, N // g, g), big).min(axis=3)
            hi = np.where(un, ohi.reshape(Cs, nd, N // g, g), -1).max(axis=3)
            lo = np.where(present, lo, 0)
            hi = np.where(present, hi, 0)
            # the node's tiles form its bounding box iff their volumes add up to its volume
            vol = np.where(used, xkernel.soa_volume(olo, ohi), 0)
            bvol = xkernel.soa_volume(lo, hi)                    # [Cs, nodes]
            if not np.array_equal(vol.reshape(Cs, N // g, g).sum(axis=2)[present[:, 0]],
                                  bvol[present[:, 0]]):
                return False
            blo = np.ascontiguousarray(np.repeat(lo, g, axis=2), dtype=dt)
            bhi = np.ascontiguousarray(np.repeat(hi, g, axis=2), dtype=dt)
            return xkernel.side_flags(olo, ohi, blo, bhi, src.out_shape)
        res = self._lru(self._tile_cache, ("side",) + self._layout_key(src, src_cands), make,
                        size=4)
        return None if res is False else res

    def _xfer_pairwise(self, src, src_cands, need, ddev):
        """General path: every (source device, destination device) pair, any bandwidths; in
        blocks of source candidates so no temporary exceeds :data:`BLOCK` elements."""
        sb, sdev = self._src_tiles(src, src_cands)
        Cs, Ds = sdev.shape
        Cd, Dd = ddev.shape
        A = self._axes(sb[:, :, None, None])
        B = self._axes(need[None, None])
        t, nb = np.zeros((Cs, Cd)), np.zeros((Cs, Cd))
        step = max(1, self.BLOCK // max(1, Ds * Cd * Dd))
        di = np.clip(ddev, 0, None)[None, None]
        for a in range(0, Cs, step):
            sl = slice(a, a + step)
            sd = sdev[sl][:, :, None, None]
            vol = self._ov([(lo[sl], hi[sl]) for lo, hi in A], B,
                           (len(sdev[sl]), Ds, Cd, Dd), src.out_shape)   # [cs, Ds, Cd, Dd]
            valid = (sd >= 0) & (ddev[None, None] >= 0) & (sd != ddev[None, None])
            nbytes = np.where(valid, vol, 0.0) * self.dtype_bytes
            si = np.clip(sd, 0, None)
            per = np.where(nbytes > 0, nbytes / self.devices.bw[si, di], 0.0)
            lat = np.where(nbytes > 0, self.devices.latency[si, di], 0.0).max(axis=1)
            t[sl] = (per.sum(axis=1) + lat).max(axis=2)      # receive serially, dst parallel
            nb[sl] = nbytes.sum(axis=(1, 3))
        return t, nb

    # -- all tables ------------------------------------------------------------------------
    def _auto_degrees(self) -> tuple:
        """Powers of two, else of 4, 8, ...: the finest ladder whose work fits
        :data:`AUTO_WORK` (the coarsest one tried when none does)."""
        n, base, vals = self.devices.n, 2, self.degrees
        names = self.graph.names()
        key_of, first = {}, {}
        for name in names:
            layer = self.graph.layer(name)
            dims = layer.dims
            key = key_of[name] = (tuple(layer.size(a) for a in dims), dims,
                                  G.reduction_size(layer))
            first.setdefault(key, layer)
        tok = {nm: k[:2] for nm, k in key_of.items()}
        distinct = self._distinct_edges(tok)          # the same for every ladder
        while True:
            vals = tuple(d for d in G.degree_values("divisors", n)
                         if d == 1 or round(math.log(d, base), 9).is_integer())
            sizes = {k: G.count_configs(layer, n, vals) for k, layer in first.items()}
            per = {nm: sizes[key_of[nm]] for nm in names}
            if self._work(per, tok, distinct) <= AUTO_WORK or base >= n or len(vals) <= 2:
                return vals
            base *= 2

    def _work(self, per: dict, tok: dict, distinct: list | None = None) -> float:
        """:meth:`estimate`'s work from ``{layer: (candidates, Σ total, max total)}``; edges
        with the same :meth:`_edge_sig` (``tok``: what identifies each layer's candidate
        list) share one table, so they count once (``distinct``: those edges, when already
        known)."""
        two_level = self._node_structure() is not None
        work = 0.0
        for e in (self._distinct_edges(tok) if distinct is None else distinct):
            w = float(per[e.src][0]) * per[e.dst][1]
            if not two_level:
                w *= per[e.src][2]
            elif w >= self.JIT_WORK:          # the compiled kernel's edges
                w *= JIT_COST
            work += w
        return work + sum(float(c) ** 3 for c, _, _ in per.values()) / 16

    def _edge_sig(self, edge: Edge, src_tok, dst_tok) -> tuple:
        """What an edge's transfer table depends on (as :meth:`xfer`'s first cache key):
        the producer's layout, the consumer's operator, shapes and layout, which input, the
        edge's transforms and whether a gradient flows back; ``*_tok`` stand for the two
        candidate lists."""
        key = (edge.src, edge.dst, edge.index)
        static = self._esig.get(key)
        if static is None:
            src, dst = self.graph.layer(edge.src), self.graph.layer(edge.dst)
            static = self._esig[key] = (
                src.out_shape, src.axes, G.reduction_size(src), dst.op,
                repr(sorted(dst.attrs.items())), tuple(map(tuple, dst.in_shapes)),
                dst.out_shape, dst.axes, G.reduction_size(dst), edge.index, edge.transforms,
                self.needs_grad(edge.src))
        return static + (src_tok, dst_tok)

    def _distinct_edges(self, tok: dict) -> list:
        """One edge per distinct :meth:`_edge_sig` (repeated blocks build one table)."""
        seen, out = set(), []
        for e in self.graph.edges():
            sig = self._edge_sig(e, tok[e.src], tok[e.dst])
            if sig not in seen:
                seen.add(sig)
                out.append(e)
        return out

    def estimate(self, pins: list | None = None) -> dict:
        """Size of the search before any table is built: candidates per layer, bytes of the
        tables, peak bytes of building and solving them, and work.

        ``table_bytes`` counts ``t_xfer`` and bytes ``[Cs, Cd]`` per distinct edge table
        (edges of repeated blocks share one, :meth:`_edge_sig`) and the per-layer vectors;
        ``peak_bytes`` adds the search's merged edge tables (one per edge), the per-edge
        kernels' blocks and the cached box layouts; ``work`` is the kernel elements of the
        distinct edge tables (``Cs`` times the devices of every destination candidate; times
        the source devices when links are not two-level; times :data:`JIT_COST` for the
        compiled kernel's edges) plus the node eliminations' ``C³`` steps / 16 (cheaper per
        step).  Counts are before the memory filter, so upper bounds.
        """
        by_layer = self._pins_by_layer(pins)
        per, sizes, tok = {}, {}, {}
        for n in self.graph.names():
            cs = self.candidates(n, by_layer.get(n))
            totals = self._cinfo(cs)[0]
            per[n] = (len(cs), int(totals.sum()), int(totals.max()))
            sizes[n] = len(cs)
            tok[n] = self._ckey(cs)
        distinct = self._distinct_edges(tok)
        table = sum(16.0 * sizes[e.src] * sizes[e.dst] for e in distinct)
        xfer = (sum(float(per[e.src][0]) * per[e.dst][1] for e in distinct)
                if self._node_structure() is not None else 0.0)
        table += sum(48.0 * c for c in sizes.values())
        merged = sum(16.0 * sizes[e.src] * sizes[e.dst] for e in self.graph.edges())
        work = self._work(per, tok, distinct)
        cmax = max(sizes.values())
        nd = max((len(self.graph.layer(n).out_shape) for n in sizes), default=1)
        layouts = 20.0 * cmax * self.devices.n * max(nd, 1) * 2 * 8
        peak = table + merged + 12 * 8.0 * self.BLOCK + layouts
        return {"degrees": list(self.degrees), "candidates_mean": sum(sizes.values()) / len(sizes),
                "candidates_max": cmax, "table_bytes": table, "peak_bytes": peak,
                "work": work, "xfer_work": xfer}

    def check_fits(self, est: dict) -> None:
        """``InfeasiblePlan`` naming the estimate when the search cannot fit this machine: peak
        bytes over the memory available now (psutil), or work over :data:`MAX_WORK`."""
        import psutil
        avail = float(psutil.virtual_memory().available)
        over_mem = est["peak_bytes"] > avail
        if not over_mem and est["work"] <= MAX_WORK:
            return
        what = (f"≈ {est['peak_bytes'] / 2**30:.1f} GiB at peak (tables "
                f"{est['table_bytes'] / 2**30:.1f} GiB) but {avail / 2**30:.1f} GiB is "
                f"available" if over_mem else
                f"work ≈ {est['work']:.2g} steps, over the limit of {MAX_WORK:.2g} (about two "
                f"minutes of CPU here)")
        degs = est["degrees"]
        coarse = ",".join(str(d) for d in degs if d == 1 or math.log(d, 4).is_integer())
        raise InfeasiblePlan(
            f"{getattr(self.graph, 'spec', None) or 'the model'} on {self.devices.n} devices "
            f"is too big a search for this machine: {est['candidates_mean']:.0f} candidates per "
            f"layer on average (max {est['candidates_max']}, degrees "
            f"{','.join(map(str, degs[:8]))}{',...' if len(degs) > 8 else ''}), {what}; "
            f"use coarser degrees (--degrees {coarse}) or fewer devices")

    def _pins_by_layer(self, pins) -> dict:
        by_layer: dict = {}
        for p in list(pins or []):
            if p.layer not in self.graph:
                names = list(self.graph.names())
                close = [n for n in names if p.layer.lower() in n.lower()][:8]
                raise InfeasiblePlan(
                    f"pin {p.text()}: no layer named {p.layer!r}"
                    + (f"; did you mean {', '.join(close)}?" if close else
                       f"; its {len(names)} layers are {', '.join(names[:8])}"
                       f"{', … (the graph names them all)' if len(names) > 8 else ''}"))
            if p.layer in by_layer:
                raise InfeasiblePlan(f"layer {p.layer} is pinned twice")
            by_layer[p.layer] = p
        return by_layer

    #: how many pin sets' tables one cost model keeps
    TABLES_KEPT = 8

    def tables(self, pins: list | None = None) -> CostTables:
        """Every table the search needs, honouring ``pins`` (unknown layers rejected); refused
        with the :meth:`estimate` first when it cannot fit this machine.  Built once per pin
        set and shared: a comparison's baselines and searches read the same tables (the
        methods never modify them)."""
        pins = list(pins or [])
        key = tuple(p.text() for p in pins)
        hit = self._tables_cache.get(key)
        if hit is None:
            hit = self._build_tables(pins)
            if len(self._tables_cache) >= self.TABLES_KEPT:
                self._tables_cache.pop(next(iter(self._tables_cache)))
            self._tables_cache[key] = hit
        return hit

    @staticmethod
    def _each(fn, items, threads: int) -> list:
        """``[fn(item) ...]``, on ``threads`` threads when more than one (each table is
        computed alone from the same inputs, so the numbers do not depend on the order)."""
        if threads <= 1:
            return [fn(it) for it in items]
        from concurrent.futures import ThreadPoolExecutor
        with ThreadPoolExecutor(threads) as ex:
            return list(ex.map(fn, items))

    def node_tables(self, pins: list | None = None) -> CostTables:
        """The tables without edges: every layer's candidates (those that fit a device's
        memory), compute, synchronisation, update and reduction costs - what a baseline reads
        to choose its configurations before :meth:`tables` ``keep=`` costs the edges between
        the chosen ones only.  Refused, as :meth:`tables`, when the full search cannot fit
        this machine; built once per pin set."""
        pins = list(pins or [])
        key = tuple(p.text() for p in pins)
        hit = self._nodes_cache.get(key)
        if hit is None:
            hit = self._nodes_cache[key] = self._build_nodes(pins)
        return hit

    def _build_nodes(self, pins: list) -> CostTables:
        t0 = time.perf_counter()
        est = self.estimate(pins)
        self.check_fits(est)
        self._jit_search = est["xfer_work"] >= self.JIT_SEARCH
        by_layer = self._pins_by_layer(pins)
        names = self.graph.names()
        cands, tc, ts, mem, tr, br = {}, {}, {}, {}, {}, {}
        # (measured costs profile layers on this machine: one at a time)
        threads = self._threads(est)
        lists = {n: self.candidates(n, by_layer.get(n)) for n in names}
        costs = self._each(lambda n: self.layer_costs(n, lists[n]), names, threads)
        tu = {}
        for n, (a, b, m) in zip(names, costs):
            u = self.update_costs(n, lists[n])
            cs = lists[n]
            cap_of = self._cinfo(cs)[2]
            cap = float(cap_of.min())
            keep = np.flatnonzero(m <= cap_of).tolist()
            if not keep:
                raise InfeasiblePlan(
                    f"layer {n} does not fit in device memory under any allowed configuration "
                    f"(needs ≥ {m.min() / 2**30:.2f} GiB per device, devices have "
                    f"{cap / 2**30:.2f} GiB): use more devices or a smaller batch")
            if len(keep) < len(cs):
                cs = [cs[i] for i in keep]
                a, b, m, u = a[keep], b[keep], m[keep], u[keep]
            cands[n], tc[n], ts[n], mem[n], tu[n] = cs, a, b, m, u
            red = self.reduce_costs(n, cs)
            if red is not None:
                tr[n], br[n] = red
        return CostTables(names, cands, tc, ts, mem, [], time.perf_counter() - t0, [],
                          tr, br, est, tu)

    def _threads(self, est: dict) -> int:
        from explorer.engine.layerwise import xkernel
        return (xkernel.THREADS
                if est["work"] >= THREAD_WORK and self.compute == "analytic" else 1)

    def _build_tables(self, pins: list) -> CostTables:
        t0 = time.perf_counter()
        nodes = self.node_tables(pins)
        out = self._with_edges(nodes, nodes.candidates, self._threads(nodes.estimate))
        out.build_time_s = time.perf_counter() - t0
        return out

    def kept_tables(self, keep: dict, pins: list | None = None) -> CostTables:
        """:meth:`node_tables` restricted to ``keep`` (``{layer: [candidate indices]}``, in
        the node tables' order; a layer not named keeps all), with the edge tables between
        the kept candidates only: a baseline that fixes one configuration per layer costs
        ``1 × 1`` tables instead of the search's ``C × C`` (the same entries).  Not cached."""
        t0 = time.perf_counter()
        nodes = self.node_tables(pins)
        names = nodes.names
        idx = {n: (np.asarray(keep[n], dtype=np.int64) if n in keep else
                   np.arange(len(nodes.candidates[n]))) for n in names}
        cut = lambda d: {n: d[n][idx[n]] for n in d}              # noqa: E731
        cands = {n: [nodes.candidates[n][i] for i in idx[n].tolist()] for n in names}
        part = CostTables(names, cands, cut(nodes.t_compute), cut(nodes.t_sync),
                          cut(nodes.memory), [], 0.0, [], cut(nodes.t_reduce),
                          cut(nodes.bytes_reduce), nodes.estimate, cut(nodes.t_update))
        out = self._with_edges(part, cands, 1)
        out.build_time_s = time.perf_counter() - t0
        return out

    def _with_edges(self, nodes: CostTables, cands: dict, threads: int) -> CostTables:
        """``nodes`` with the transfer table of every edge between ``cands``."""
        edges, nbytes = [], []
        xf = self._each(lambda e: self.xfer(e, cands[e.src], cands[e.dst]), self.graph.edges(),
                        threads)
        for e, (t, nb) in zip(self.graph.edges(), xf):
            edges.append((e, t))
            nbytes.append(nb)
        # the box layouts ([C, devices, ndim, 2] each: up to a gigabyte at 1,024 devices) are
        # only the tables' inputs; the search that follows needs the memory
        with _LRU_LOCK:
            self._stack_cache.clear()
            self._tile_cache.clear()
            self._live_cache.clear()
        return CostTables(nodes.names, cands, nodes.t_compute, nodes.t_sync, nodes.memory,
                          edges, 0.0, nbytes, nodes.t_reduce, nodes.bytes_reduce,
                          nodes.estimate, nodes.t_update)


#: per graph, what every cost model on it shares (:class:`CostModel`'s edge signatures and
#: gradient flags); entries go with their graph
_GRAPH_MEMOS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def graph_memo(graph) -> dict:
    """The shared memo of ``graph`` (a plain dict for graphs that cannot be weakly held)."""
    try:
        with _LRU_LOCK:
            return _GRAPH_MEMOS.setdefault(graph, {})
    except TypeError:
        return {}


def warm() -> bool:
    """Compile every layer-wise kernel into numba's cache now (scripts/setup.sh): the by-node
    transfer kernel through a small two-level search (so with the argument types real
    searches pass), then :func:`.xkernel.warm`'s; ``False`` without numba."""
    import importlib.util
    if importlib.util.find_spec("numba") is None:
        return False
    from explorer.engine.core.devices import preset
    from explorer.engine.core.importer import import_spec
    from explorer.engine.layerwise import xkernel
    cm = CostModel(import_spec("mlp"), preset("p100-cluster", 8), degrees="pow2")
    cm.JIT_WORK = cm.PAD_LIMIT = 0        # every by-node table through the kernel
    cm.tables()
    return xkernel.warm()

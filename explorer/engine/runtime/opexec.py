"""Execute an operator-level plan (a Tofu partition or a device placement) on local workers
and check it against one device.

Every worker interprets the traced training step (the same ``make_fx`` graph the plan was
made from) aten call by aten call, holding each tensor only as a *tile*: the box the plan
gives it, nothing else.  Before an operator runs, the worker receives exactly the parts of
the input regions it needs that other workers hold (the plan's ``N_w \\ H_w``) into a buffer of
the region's shape (a view of its own tile when that covers the region), and computes the
operator on those local shapes (:mod:`.tiles`: element-wise ops on tiles, matrix products on
row / column blocks, convolutions and pools on a tile with its halo - padding only at the
tensor's true border -, views on local boxes).  Its output box is then sent to the workers
that hold parts of it; a split reduction's partial results are summed - by one
``reduce_scatter`` (``all_reduce``) over the group the plan reduces over when the pattern is
a collective's, else point to point (terms outside the reduction, e.g. a bias, added by one
worker only; a partial max for a split max).  A tile is freed after the last operator that
reads it.  An operator without a tile rule runs on full-size zero-padded buffers (correct, not
tile-local); the run lists such targets (``fallback_ops``).

So the run moves exactly the bytes the plan predicts (checked), each worker's peak memory is
measured (its live tiles and the operator in flight's buffers, per storage) next to the
plan's, and the loss and every updated parameter are compared with a single-device run of the
same step.  Both trace the model in train mode (:mod:`explorer.engine.core.capture`, with the
model file's ``loss(output)`` when it has one) and compute under its deterministic numerics
(dropout the identity, BatchNorm with batch statistics); a step that still draws random
numbers is refused.  A device placement is the special case where every box is a whole
tensor on one device (:func:`placement_xplan`): each worker computes only its own operators
and tensors travel once to each device that reads them.
"""

from __future__ import annotations

import json
import os
import resource
import time
from collections import OrderedDict

import numpy as np
import torch
import torch.distributed as dist

from explorer.errors import InfeasiblePlan
from explorer.engine.core.geometry import TensorLayout
from explorer.engine.core.geometry import common as _inter, inside as _inside, to_slices as _sl
from explorer.engine.core.opgraph import TorchValue
from explorer.engine.runtime import comm
from explorer.engine.runtime.launcher import RunFailed
from explorer.engine.runtime.timing import clock, peak_allocated, reset_peak
from explorer.engine.runtime.traces import pickle_trace, shipped, unpickle_trace

__all__ = ["run_layout", "run_layouts", "run_placement", "run_placements", "placement_xplan",
           "placement_comm_bytes"]

#: random ops :class:`~explorer.engine.core.capture.deterministic` cannot make the identity
#: (it makes ``native_dropout`` and the ``bernoulli_`` mask a dropout traces to the identity)
_NOT_DETERMINISTIC = {"rand_like", "randn_like"}


def _flat(t):
    """A 0-d tensor as a 1-element view, so a placement's [(0, 1)] box can address it."""
    return t.reshape(1) if t.dim() == 0 else t


class TileWorker:
    """One worker's tiles: ``tiles[t] = (box, tensor)`` - the box of ``t`` it holds (global
    coordinates) and a tensor of just that box's shape.  Bytes are accounted per storage (a
    view of a tile costs nothing); ``peak_bytes`` is the largest sum over the step of the live
    tiles and the operator in flight's region buffers and result."""

    def __init__(self, rank, world, g, xplan, timeout_s, groups=None, device="cpu"):
        self.rank, self.world, self.g, self.x = rank, world, g, xplan
        self.device = torch.device(device)   # every tile, buffer and accumulator lives here
        self.clock = clock(self.device)      # on CUDA: synchronised (kernels, not launches)
        self.sent = 0
        self.extra = 0
        self.tag = 0
        self.delivered: set = set()
        self.compute_s = 0.0
        self.compute_cpu_s = 0.0        # the same on this thread's CPU clock
        self.received: dict = {}
        self.groups = groups or {}
        self.tiles: dict = {}
        self.store: dict = {}           # storage key -> [bytes, references]
        self.live_bytes = 0
        self.peak_bytes = 0
        self.fallback: dict = {}        # aten target -> ops computed on full buffers
        self.local_ops: dict = {}       # aten target -> ops computed on tiles
        self.collectives = 0
        self.why: dict = {}             # aten target -> why its first fallback happened
        self.float_dtype = torch.float64  # what floating-point tensors compute in
        # where the step goes (timing hooks, :meth:`_profiled`): aten target -> seconds
        # [ops, fetch wall, fetch CPU, compute wall, compute CPU, send/combine wall,
        #  send/combine CPU, waiting in transfers, in collectives, page faults]
        self.prof: dict = {}
        self.wait_s = 0.0               # wall time in transfer waits (exchange)
        self.coll_s = 0.0               # wall time in collective calls

    # -- tiles and their bytes ---------------------------------------------------------------
    @staticmethod
    def _key(v):
        """(storage, bytes at the model's precision): the run computes in float64 to check
        against the reference, floating-point elements count at 4 bytes as the plan's
        (and as the bytes moved are counted)."""
        st = v.untyped_storage()
        n = st.nbytes()
        if v.is_floating_point() and v.element_size() > 4:
            n = n // v.element_size() * 4
        return st.data_ptr(), n

    def hold(self, t, box, v):
        """Keep tile ``v`` (of ``box``) as tensor ``t``'s value on this worker."""
        self.drop(t)
        v = self.shaped(t, v)
        self.tiles[t] = (None if box is None else np.asarray(box), v)
        if torch.is_tensor(v):
            k = self._key(v)
            ent = self.store.setdefault(k, [k[1], 0])
            if ent[1] == 0:
                self.live_bytes += ent[0]
            ent[1] += 1
            self.peak_bytes = max(self.peak_bytes, self.live_bytes)

    def drop(self, t):
        got = self.tiles.pop(t, None)
        if got is None or not torch.is_tensor(got[1]):
            return
        k = self._key(got[1])
        ent = self.store[k]
        ent[1] -= 1
        if ent[1] == 0:
            self.live_bytes -= ent[0]
            del self.store[k]

    def in_flight(self, tensors):
        """Account the operator in flight's temporaries (region buffers, result) at once."""
        extra, seen = 0, set()
        for v in tensors:
            if torch.is_tensor(v):
                k = self._key(v)
                if k not in self.store and k not in seen:
                    seen.add(k)
                    extra += k[1]
        self.peak_bytes = max(self.peak_bytes, self.live_bytes + extra)

    def piece(self, t, box):
        """This worker's data of tensor ``t`` inside ``box`` (a view of its tile)."""
        own, v = self.tiles[t]
        return _flat(v)[_sl(box, own)]

    # -- transfers ---------------------------------------------------------------------------
    def exchange(self, transfers, source):
        """``transfers``: [(src, dst, box, dtype)] in the same order on every worker;
        ``source(i, box)`` gives this worker's data for a box it sends.  Returns {index:
        received tensor}."""
        reqs, got = [], {}
        for i, (src, dst, box, dtype) in enumerate(transfers):
            tag = (self.tag + i) % (1 << 30)
            if src == self.rank:
                data = source(i, box).contiguous()
                self.sent += data.numel() * (4 if data.is_floating_point()
                                             else data.element_size())
                reqs.append(comm.isend(data, dst, tag=tag))
            elif dst == self.rank:
                buf = torch.empty(tuple(int(b - a) for a, b in box), dtype=dtype,
                                  device=self.device)
                got[i] = buf
                reqs.append(comm.irecv(buf, src, tag=tag))
        t0 = self.clock()
        for r in reqs:
            r.wait()
        self.wait_s += self.clock() - t0
        self.tag += len(transfers)
        return got

    def fetch(self, t, needs, fill):
        """Tensor ``t``'s region ``needs[rank]`` as a tile of that shape (None when this worker
        needs nothing of it): a view of its own tile when that covers the region, else a new
        buffer of the region's shape filled from its tile and the pieces peers send.  With
        ``xplan["cache"]`` a piece delivered once to a worker is not sent again (a placement
        keeps received tensors)."""
        held = self.x["held"][t]
        K = self.world
        cache = self.x.get("cache", False)
        dtype = self.tiles[t][1].dtype
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
                transfers.append((w2, w, piece, dtype))
        got = self.exchange(transfers, lambda i, box: self.piece(t, box))
        if cache:
            for i, data in got.items():
                self.received[(t, transfers[i][2].tobytes())] = data
        need = needs[self.rank]
        if _inter(need, need) is None:
            return None
        own_box, own = self.tiles[t]
        if _inside(need, own_box):
            return self.shaped(t, _flat(own)[_sl(need, own_box)])     # a view: no copy
        buf = torch.full(box_extent(need), fill, dtype=dtype, device=self.device)
        if cache:
            for (tt, bb), data in self.received.items():
                if tt == t:
                    src = np.frombuffer(bb, dtype=np.int64).reshape(-1, 2)
                    box = _inter(src, need)
                    if box is not None:
                        buf[_sl(box, need)] = data[_sl(box, src)]
        mine = _inter(need, own_box)
        if mine is not None:
            buf[_sl(mine, need)] = _flat(own)[_sl(mine, own_box)]
        for i, data in got.items():
            buf[_sl(transfers[i][2], need)] = data
        return self.shaped(t, buf)

    def shaped(self, t, v):
        """A 0-d tensor's one-element tile as a 0-d tensor again."""
        ten = self.g.tensors.get(t)
        if ten is not None and not ten.shape and torch.is_tensor(v) and v.numel() == 1:
            return v.reshape(())
        return v

    def distribute(self, t, result, out, reducer, rep=None):
        """Send the parts of this worker's output tile (box ``out[rank]``) others hold and
        combine what arrives into this worker's held tile.  A split sum whose partial results
        every member of a group computes for the same box and holds a balanced slice of is
        combined by one ``reduce_scatter`` (``all_reduce`` when each holds it whole) over that
        group; other patterns move the same pieces point to point.  ``rep[w]``: the lowest rank
        computing the same partial sum as worker w (:func:`partial_copies`): each distinct
        partial is added once - a worker uses its own copy and receives the others' from
        their lowest rank."""
        held = self.x["held"][t]
        K = self.world
        me = held[self.rank]
        coll = self.groups.get(("op", t))
        transfers = []
        copies = rep is not None and bool((rep != np.arange(K)).any())
        for dst in range(K):
            taken = []
            for src in range(K):
                if src == dst or (copies and (rep[src] != src or rep[src] == rep[dst])):
                    continue             # a copy of a partial sum: sent once, never to a copy
                piece = _inter(out[src], held[dst])
                if piece is None:
                    continue
                if reducer is None and (_inside(piece, out[dst]) or
                                        any(_inside(piece, p) for p in taken)):
                    continue             # the receiver computed it, or another sender sends it
                taken.append(piece)
                transfers.append((src, dst, piece, None))
        dtype = result.dtype if result is not None else torch_dtype(self.g.tensors[t],
                                                                    self.float_dtype)
        if coll is not None and reducer == "sum" and result is not None:
            if copies and rep[self.rank] != self.rank:
                result = torch.zeros_like(result)   # the collective adds each partial once
            return self.collective(coll, transfers, result, out[self.rank], me)
        transfers = [(s, d, b, dtype) for s, d, b, _ in transfers]
        got = self.exchange(transfers, lambda i, box: _flat(result)[_sl(box, out[self.rank])])
        if result is not None and reducer is None and not got and \
                np.array_equal(out[self.rank], me):
            return result                 # computed exactly what this worker holds
        fill = float("-inf") if reducer == "max" else 0.0
        acc = torch.full(box_extent(me), fill if reducer else 0.0, dtype=dtype,
                         device=self.device)
        own = _inter(out[self.rank], me) if result is not None else None
        if own is not None:
            acc[_sl(own, me)] = _flat(result)[_sl(own, out[self.rank])]
        for i, data in got.items():
            box = _sl(transfers[i][2], me)
            if reducer == "sum":
                acc[box] = acc[box] + data
            elif reducer == "max":
                acc[box] = torch.maximum(acc[box], data)
            else:
                acc[box] = data
        if reducer == "max":
            acc = torch.where(torch.isinf(acc), torch.zeros_like(acc), acc)
        return acc

    def collective(self, coll, transfers, result, box, me):
        """A split sum as one collective over ``coll = (group, axis, members)``: the bytes
        counted are the plan's pieces this worker would send point to point."""
        group, axis, members = coll
        for src, dst, piece, _ in transfers:
            if src == self.rank:
                self.sent += int(np.prod(box_extent(piece))) * \
                    (4 if result.is_floating_point() else result.element_size())
        self.collectives += 1
        if axis is None:
            out = result.contiguous()
            t0 = self.clock()
            comm.all_reduce(out, group=group)
            self.coll_s += self.clock() - t0
            return out
        moved = result.movedim(axis, 0).contiguous()
        out = torch.empty((moved.shape[0] // len(members),) + tuple(moved.shape[1:]),
                          dtype=result.dtype, device=result.device)
        t0 = self.clock()
        comm.reduce_scatter(out, moved, group=group)
        self.coll_s += self.clock() - t0
        return out.movedim(0, axis).contiguous()

    # -- the step ----------------------------------------------------------------------------
    def placeholders(self) -> list:
        """Tensor ids of the step's inputs in order: parameters, buffers, the data."""
        g = self.g
        return list(g.params.values()) + [f"buffer:{b}" for b in g.buffer_names] + g.inputs

    def load(self, params, buffers, x):
        """Hold the worker's boxes of the parameters, buffers and input (the plan brings the
        rest); a tensor the plan does not partition is held whole."""
        for t, v in zip(self.placeholders(), list(params) + list(buffers) + [x]):
            v = v.detach()
            if t in self.x["held"]:
                h = self.x["held"][t][self.rank]
                self.hold(t, h, _flat(v)[_sl(h)].clone())
            else:
                self.hold(t, _full(v), v.clone())

    def advance(self, new_ids):
        """Training: each parameter's box from its update's tiles (moved where the update is
        tiled differently; counted apart from the step's traffic)."""
        before = self.sent
        for p, u in zip(self.g.params.values(), new_ids):
            if u is None or u not in self.tiles:
                continue
            if p in self.x["held"] and u in self.x["held"]:
                # the update's tile (or a buffer assembled from it) becomes the parameter's:
                # no copy, so between steps a worker holds what the plan counts
                v = self.fetch(u, self.x["held"][p], 0.0)
                box = self.x["held"][p][self.rank]
                self.hold(p, box, v if v is not None else
                          torch.zeros(box_extent(box), dtype=self.tiles[u][1].dtype,
                                      device=self.device))
            else:
                v = self.whole(u)
                box = self.x["held"][p][self.rank] if p in self.x["held"] else _full(v)
                self.hold(p, box, _flat(v)[_sl(box)].clone())
        self.extra += self.sent - before

    def step(self):
        """One traced step from the held placeholders, in the reference's numerics (dropout
        the identity, BatchNorm with batch statistics: :mod:`explorer.engine.core.capture`)."""
        from explorer.engine.core.capture import deterministic
        with deterministic(running_stats=False):
            return self._step()

    def _step(self):
        import operator
        g, gm = self.g, self.g.gm
        inputs = set(self.placeholders())
        for t in list(self.tiles):
            if t not in inputs:
                self.drop(t)
        self.peak_bytes = self.live_bytes
        by_node: dict = {}
        for o in g.ops.values():
            by_node.setdefault(o.node, []).append(o)
        from explorer.engine.core.opgraph import DROPPED, aten_name
        alias: dict = {}
        for n in gm.graph.nodes:
            if n.op != "call_function" or n.target is operator.getitem:
                continue
            name = aten_name(n)
            if name in DROPPED and n.args and isinstance(n.args[0], torch.fx.Node):
                alias[n.name] = n.args[0].name
            if name in _NOT_DETERMINISTIC:
                raise InfeasiblePlan(f"op {n.name} (aten.{name}) draws random numbers: the "
                                     f"operator-level runtime cannot check it against one "
                                     f"device")
        last = self._last_reads(by_node, alias)
        keep = self._kept()
        shape_of = {}                     # id(tile) -> (region box, the tensor's shape)

        def tile(t):
            return self.tiles[t][1] if t in self.tiles else None

        def sub(a, bufs, fa=None):
            return substitute(g, a, bufs, tile, fa, self.device)

        def call(n, o, bufs):
            return n.target(*sub(o.args, bufs, n.args),
                            **{k: sub(v, bufs, n.kwargs.get(k)) for k, v in o.kwargs.items()})

        for n in gm.graph.nodes:
            if n.op != "call_function" or n.target is operator.getitem or n.name in alias:
                continue
            for o in by_node.get(n.name, []):
                info = self.x["ops"].get(o.name)
                if info is None:          # a source or scalar bookkeeping: computed everywhere
                    m0 = self._mark()
                    full = {t: self.whole(t) for t in o.inputs}
                    res = call(n, o, full)
                    res = res[o.index] if isinstance(res, (tuple, list)) else res
                    del full
                    if o.output in self.x["held"] and torch.is_tensor(res):
                        h = self.x["held"][o.output][self.rank]
                        self.hold(o.output, h, _flat(res)[_sl(h)].clone())
                    else:
                        self.hold(o.output, _full(res) if torch.is_tensor(res) else None, res)
                    m1 = self._mark()
                    self._profiled("(bookkeeping)", [m0, m0, m1, m1])
                    continue
                self.hold(o.output, self.x["held"][o.output][self.rank],
                          self.run_op(n, o, info, sub, shape_of))
            for t in last.get(n.name, ()):
                if t not in keep:
                    self.drop(t)
        return {t: v for t, (_, v) in self.tiles.items()}

    def run_op(self, n, o, info, sub, shape_of):
        """Operator ``o`` (fx node ``n``, layout entry ``info``) on this worker: fetch its
        input regions, compute its output box on them, send and combine; returns the tile
        this worker holds of its output."""
        g = self.g
        fill = float("-inf") if info["reducer"] == "max" else 0.0
        bufs = {}
        marks = [self._mark()]
        for t, need in info["needs"].items():
            b = self.fetch(t, need, fill)
            if b is not None and t in info["zero"] and info["zero"][t][self.rank]:
                b = torch.zeros_like(b)
            bufs[t] = b
            if b is not None:
                shape_of[id(b)] = (need[self.rank], g.tensors[t].shape)
        for t in o.inputs:
            bufs.setdefault(t, None)
        out_box = info["out"][self.rank]
        res = None
        marks.append(self._mark())
        if _inter(out_box, out_box) is not None:
            t0, c0 = self.clock(), time.thread_time()
            res = self.compute(n, o, bufs, sub, out_box, g.tensors[o.output], fill, shape_of)
            self.compute_s += self.clock() - t0
            self.compute_cpu_s += time.thread_time() - c0
        self.in_flight(list(bufs.values()) + [res])
        marks.append(self._mark())
        rep = partial_copies(info, self.world) if info["reducer"] == "sum" else None
        val = self.distribute(o.output, res, info["out"], info["reducer"], rep)
        marks.append(self._mark())
        self._profiled(o.target, marks)
        self.in_flight(list(bufs.values()) + [res, val])
        for t in bufs:
            shape_of.pop(id(bufs[t]), None)
        return val

    def _mark(self):
        """A timing hook's reading: wall clock, this thread's CPU, waits so far, and the page
        faults it took (first touches of fresh memory)."""
        return self.clock(), time.thread_time(), self.wait_s, self.coll_s, _faults()

    def _profiled(self, target, marks):
        """Add one operator's phases (fetch, compute, send / combine: :meth:`_mark`s between
        them) to ``prof[target]``."""
        (w0, c0, _, _, _), (w1, c1, _, _, _), (w2, c2, _, _, _), (w3, c3, x3, k3, f3) = marks
        row = self.prof.setdefault(target, [0.0] * 10)
        for i, v in enumerate((1, w1 - w0, c1 - c0, w2 - w1, c2 - c1, w3 - w2, c3 - c2,
                               x3 - marks[0][2], k3 - marks[0][3], f3 - marks[0][4])):
            row[i] += v

    def compute(self, n, o, bufs, sub, out_box, ten, fill, shape_of):
        """Operator ``o``'s output tile on region tiles (:mod:`.tiles`); an op without a tile
        rule runs on full-size buffers of its regions (``fill`` outside) and is cut to the box."""
        from explorer.engine.runtime import tiles
        args = sub(o.args, bufs, n.args)
        kwargs = {k: sub(v, bufs, n.kwargs.get(k)) for k, v in o.kwargs.items()}
        tile_of = (lambda v: shape_of.get(id(v), (None, None)))
        try:
            if o.target in tiles.GENERIC and o.target not in tiles.NONE_OK and \
                    any(v is None for v in bufs.values()):
                raise tiles.Fallback("an input without a region")
            res = tiles.compute(o.target, n.target, args, kwargs, o.index, tile_of, out_box,
                                ten.shape)
            self.local_ops[o.target] = self.local_ops.get(o.target, 0) + 1
            return res
        except tiles.Fallback as exc:
            why = str(exc)
        except (RuntimeError, ValueError, IndexError, TypeError) as exc:
            why = f"aten.{o.target} refused the tiles: {str(exc).splitlines()[0][:160]}"
        self.fallback[o.target] = self.fallback.get(o.target, 0) + 1
        self.why.setdefault(o.target, why)
        full = {}
        for t, b in bufs.items():
            shape = tuple(self.g.tensors[t].shape)
            dtype = self.tiles[t][1].dtype
            buf = torch.full(shape, fill, dtype=dtype, device=self.device) if shape else \
                torch.full((), fill, dtype=dtype, device=self.device)
            if b is not None:
                need = shape_of[id(b)][0]
                _flat(buf)[_sl(need)] = b
            full[t] = buf
        self.in_flight(list(bufs.values()) + list(full.values()))
        res = n.target(*sub(o.args, full, n.args),
                       **{k: sub(v, full, n.kwargs.get(k)) for k, v in o.kwargs.items()})
        res = res[o.index] if isinstance(res, (tuple, list)) else res
        self.in_flight(list(bufs.values()) + list(full.values()) + [res])
        return _flat(res)[_sl(out_box)].clone()

    def whole(self, t):
        """The whole of tensor ``t`` on this worker (for the few bookkeeping ops the plan does
        not describe; gathered when partitioned, counted apart)."""
        box, v = self.tiles[t]
        if not torch.is_tensor(v) or t not in self.x["held"]:
            return v
        return self.gather_full(t, v)

    def _last_reads(self, by_node, alias):
        """fx node -> tensors it is the last reader of (freed once it ran)."""
        import operator
        last: dict = {}
        for n in self.g.gm.graph.nodes:
            if n.op != "call_function" or n.target is operator.getitem or n.name in alias:
                continue
            for o in by_node.get(n.name, []):
                for t in o.inputs:
                    last[t] = n.name
        out: dict = {}
        for t, nn in last.items():
            out.setdefault(nn, []).append(t)
        return out

    def _kept(self):
        """Tensors alive the whole step: parameters, buffers, the input, the updated parameters
        and the loss (what the plan's memory model keeps)."""
        g = self.g
        keep = {t for t, ten in g.tensors.items()
                if ten.kind in ("param", "update", "buffer", "input")}
        keep |= set(g.params.values()) | set(g.inputs)
        if g.loss:
            keep.add(g.loss)
        return keep

    def gather_full(self, t, val):
        held = self.x["held"].get(t)
        if held is None:
            return val
        shape = tuple(self.g.tensors[t].shape)
        out = torch.zeros(shape, dtype=val.dtype, device=val.device)
        boxes = [held[w] for w in range(self.world)]
        transfers = []
        for dst in range(self.world):
            for src in range(self.world):
                if src != dst and not _inside(boxes[src], boxes[dst]):
                    transfers.append((src, dst, boxes[src], val.dtype))
        before = self.sent
        got = self.exchange(transfers, lambda i, box: _flat(val))
        self.extra += self.sent - before
        if _inter(boxes[self.rank], boxes[self.rank]) is not None:
            _flat(out)[_sl(boxes[self.rank])] = _flat(val).reshape(box_extent(boxes[self.rank]))
        for i, data in got.items():
            _flat(out)[_sl(transfers[i][2])] = data
        return out


def substitute(g, a, bufs, tile, fa=None, device=None):
    """Operator argument ``a`` (``fa`` its fx argument) with tensor ids replaced by their
    values: ``bufs[t]`` (the region tiles of the operator in flight), else ``tile(t)``.
    ``device``: the worker's device - the trace (made on CPU or meta) names its own device in
    tensor-creating calls and holds its constants there; they follow the worker instead."""
    if isinstance(a, str) and a in g.tensors:
        return bufs[a] if a in bufs else tile(a)
    if a is None and isinstance(fa, torch.fx.Node):
        c = _constant(g.gm, fa)           # a tensor constant of the trace (no tensor id)
        return c.to(device) if device is not None and torch.is_tensor(c) else c
    if isinstance(a, (list, tuple)):
        fas = fa if isinstance(fa, (list, tuple)) else [None] * len(a)
        return type(a)(substitute(g, b, bufs, tile, fb, device) for b, fb in zip(a, fas))
    if isinstance(a, TorchValue):          # a dtype, device... by name
        v = a.value()
        if device is not None and isinstance(v, torch.device):
            return torch.device(device)
        return v
    return a


def box_extent(box) -> tuple:
    return tuple(int(b - a) for a, b in np.asarray(box))


def _full(v):
    """The box of a whole tensor ``v`` (a 0-d tensor is one element)."""
    return np.array([[0, s] for s in v.shape] or [[0, 1]], dtype=np.int64)


def torch_dtype(ten, floating=torch.float64):
    """The run's dtype of a tensor of the trace (floating point runs in ``floating``)."""
    dt = getattr(torch, ten.dtype, None)
    return floating if not isinstance(dt, torch.dtype) or dt.is_floating_point else dt


def partial_copies(info: dict, world: int) -> np.ndarray:
    """``[world]`` int: the lowest rank that computes the same partial sum as worker w.

    A split sum replicated across workers (e.g. a reduction split in 2 on 4 workers) has
    several workers compute one partial result - same output box, same input regions, same
    terms zeroed.  Each distinct partial may be added only once, else the sum counts it twice.

    >>> box = lambda a, b: [[a, b]]
    >>> info = {"out": [box(0, 1)] * 4, "zero": {},
    ...         "needs": {"x": [box(0, 1), box(0, 1), box(1, 3), box(1, 3)]}}
    >>> partial_copies(info, 4).tolist()
    [0, 0, 2, 2]
    """
    seen: dict = {}
    rep = np.arange(world)
    for w in range(world):
        key = (np.asarray(info["out"][w]).tobytes(),
               tuple((t, np.asarray(n[w]).tobytes()) for t, n in sorted(info["needs"].items())),
               tuple((t, bool(z[w])) for t, z in sorted(info.get("zero", {}).items())))
        rep[w] = seen.setdefault(key, w)
    return rep


def make_groups(g, xplan, world):
    """Process groups for the split sums a collective can combine (created on every worker
    in the same order): ``{("op", tensor): (group, axis or None, members)}``.

    A tensor qualifies when its producing op's reducer is ``sum`` and the workers fall into
    groups that each compute one box together, hold no part of another group's box, and hold
    that box either whole (``all_reduce``) or in equal slices along one axis in rank order
    (``reduce_scatter``)."""
    if world < 2 or not dist.is_initialized():
        return {}
    plans, wanted = {}, {}
    for o, info in xplan["ops"].items():
        if info.get("reducer") != "sum":
            continue
        t = g.ops[o].output if o in g.ops else None
        if t is None or t not in xplan["held"]:
            continue
        got = fill_pattern(info["out"], xplan["held"][t], world)
        if got is not None:
            plans[t] = got
            for members, _ in got:
                wanted[members] = None
    made = {}
    for members in sorted(wanted):
        made[members] = dist.new_group(list(members))   # every rank, same order
    out = {}
    for t, pattern in plans.items():
        for members, axis in pattern:
            if _member(members):
                out[("op", t)] = (made[members], axis, members)
    return out


def _member(members) -> bool:
    return dist.get_rank() in members


def fill_pattern(out, held, world):
    """[(members, axis)] when the split sum of boxes ``out`` into ``held`` is one collective per
    group of workers computing the same box (see :func:`make_groups`), else None."""
    groups: dict = {}
    for w in range(world):
        if _inter(out[w], out[w]) is None:
            return None
        groups.setdefault(np.asarray(out[w]).tobytes(), []).append(w)
    result = []
    for key, members in groups.items():
        box = np.frombuffer(key, dtype=np.int64).reshape(-1, 2)
        if len(members) < 2:
            return None
        for w in range(world):            # nobody outside holds part of this box
            if w not in members and _inter(held[w], box) is not None:
                return None
        hs = [np.asarray(held[w]) for w in members]
        if all(np.array_equal(h, box) for h in hs):
            result.append((tuple(members), None))
            continue
        diff = [a for a in range(box.shape[0])
                if any(not np.array_equal(h[a], box[a]) for h in hs)]
        if len(diff) != 1:
            return None
        a = diff[0]
        size = (box[a, 1] - box[a, 0]) // len(members)
        if size * len(members) != box[a, 1] - box[a, 0]:
            return None
        for i, h in enumerate(hs):
            want = box.copy()
            want[a] = (box[a, 0] + i * size, box[a, 0] + (i + 1) * size)
            if not np.array_equal(h, want):
                return None
        result.append((tuple(members), a))
    return result


def _constant(gm, node):
    """The tensor constant an fx argument refers to (``get_attr``, possibly through dropped
    aliases such as ``lift_fresh_copy``: an empty key cache of a Hugging Face model), else
    None."""
    from explorer.engine.core.opgraph import DROPPED, aten_name
    while node.op == "call_function" and aten_name(node) in DROPPED and node.args and \
            isinstance(node.args[0], torch.fx.Node):
        node = node.args[0]
    return getattr(gm, node.target) if node.op == "get_attr" else None


#: this process's latest traces, ``(spec, batch, arguments, lr, dtype, seed) -> OpGraph``: the
#: plans of one launch are grouped by model, so a worker traces each model once per dtype
#: instead of once per plan (tracing is most of a small plan's run)
_TRACES: OrderedDict = OrderedDict()
_TRACES_KEPT = 2
#: traces the launcher made and shipped with the job (``key -> `` :func:`.traces.pickle_trace`): a worker
#: unpickles one (a fraction of a second) instead of tracing the step again (seconds to
#: minutes, once per worker); the launcher traces each model once anyway for its reference
_SHIPPED: dict = {}


def _trace_key(spec, batch, model_args, seed, lr, dtype) -> tuple:
    return (spec, batch, json.dumps(model_args or {}, sort_keys=True, default=str), lr,
            str(dtype), seed)


def _ship_traces(plans: list, seed, lr, dtypes=(torch.float64,)) -> dict:
    """The traces of the launch's models in ``dtypes`` (float64: what the check pass and the
    reference run; the timed steps' dtype when it differs), pickled for the workers
    (:data:`_SHIPPED`).  Each is traced and pickled once per code
    digest and kept in the capture cache (:func:`.traces.shipped`: an edited model file
    or runtime makes a new entry), so launching a model again costs an unpickle, not a
    trace.  A model that does not trace or pickle here is left out: its workers trace it
    (and report an error) as before."""
    out = {}
    for plan in plans:
        for dtype in dtypes:
            key = _trace_key(plan["spec"], plan["batch"], plan["model_args"], seed, lr, dtype)
            if key in out:
                continue

            def build(plan=plan, dtype=dtype):
                return pickle_trace(_build(plan["spec"], plan["batch"], plan["model_args"],
                                            seed, lr, dtype=dtype, fresh=True)[0])
            try:
                out[key] = shipped(plan["spec"], plan["batch"], plan["model_args"],
                                   {"seed": seed, "lr": lr,
                                    "dtype": str(dtype).replace("torch.", "")}, build)
            except Exception:  # noqa: BLE001 - the workers trace it and say why it fails
                continue
    return out


def _build(spec, batch, model_args, seed, lr, dtype=torch.float64, fresh=False):
    """The real model and input (seeded: every worker and the reference get the same), in
    float64 by default so that a wrong region shows as a large error, not as rounding.  The
    traced step is reused from :data:`_TRACES` when this process traced the same one, or
    unpickled from :data:`_SHIPPED` when the launcher sent it (the graph is read, never
    changed, by the passes; the model and its parameters are rebuilt).  ``fresh``: trace
    it again whatever was kept."""
    from explorer.engine.core.capture import load, loss_function
    from explorer.engine.core.opgraph import build_from_module
    torch.manual_seed(seed)
    model, x = load(spec, batch, model_args, meta=False)          # train mode
    if dtype is not None:
        model = model.to(dtype)
        if x.is_floating_point():
            x = x.to(dtype)
    key = _trace_key(spec, batch, model_args, seed, lr, dtype)
    g = None if fresh else _TRACES.get(key)
    if g is None:
        blob = None if fresh else _SHIPPED.get(key)
        g = unpickle_trace(blob) if blob is not None else None
        if g is None:
            g = build_from_module(model, x, spec, lr, loss_function(spec))
        _TRACES[key] = g
        while len(_TRACES) > _TRACES_KEPT:
            _TRACES.popitem(last=False)
    _TRACES.move_to_end(key)
    params = [p.detach() for n, p in model.named_parameters() if p.requires_grad]
    buffers = [b.detach() for _, b in model.named_buffers()]
    return g, params, buffers, x


#: what the timed steps of an operator-level run compute in (the reference check is float64)
TIMED_DTYPE = "float32"


def _op_entry(rank, world, device, job, send):
    """One worker of an operator-level launch (the entry :func:`launcher.start_workers`
    calls): each plan of ``job["plans"]`` in turn (:func:`_op_plan`) on the worker's
    ``device``, its results sent under ``(plan index, kind)``."""
    common = {k: v for k, v in job.items() if k not in ("plans", "traces")}
    _SHIPPED.clear()
    _SHIPPED.update(job.get("traces") or {})
    for i, plan in enumerate(job["plans"]):
        def send_i(kind, what=None, value=None, i=i):
            send(kind, (i, what), value)
        _op_plan(rank, world, {**common, **plan}, send_i, device)


def _op_plan(rank, world, job, send, device="cpu"):
    """One plan on this worker.

    Two passes over the same layout: the **timed** steps in ``job["dtype"]`` (float32, what a
    user trains in: their step times, bytes and peak are reported), then - with ``check`` -
    the **check** steps in float64 (one step, or ``steps`` when training), whose loss and
    updated parameters rank 0 sends for the exact comparison with one device.  Each pass
    traces the step and checks the trace is the plan's graph; ``dtype`` float64 makes one
    pass do both (timed in float64)."""
    dtype = getattr(torch, str(job.get("dtype") or TIMED_DTYPE))
    steps = max(1, int(job.get("steps", 1)))
    check = bool(job.get("check", True))
    from explorer.engine.runtime.faults import FAULT_ENV, parse_fault
    fault = parse_fault(job.get("fault") or os.environ.get(FAULT_ENV))
    groups = None
    timed = got = None
    if dtype != torch.float64:
        timed, groups = _op_pass(rank, world, job, dtype, steps, fault, groups, 1.0, device)
        fault = None                   # injected once, in the first pass
        if check:
            timed = _summary(timed)    # its tiles go before the check pass starts
    if check or timed is None:
        n = steps if (job.get("train") or timed is None) else 1
        got, groups = _op_pass(rank, world, job, torch.float64, n, fault, groups, 2.0, device)
    res = got or timed                 # the pass whose results rank 0 sends
    tval, w, g, new_ids = res["tval"], res["worker"], res["g"], res["new_ids"]
    timed = _summary(timed or got)
    xplan = job["xplan"]
    finals = {}                        # updated parameters and the loss back on rank 0
    for pn, tid in zip(g.param_names, new_ids):
        if tid is None or tid not in tval:
            continue
        finals[pn] = w.gather_full(tid, tval[tid]) if tid in xplan["held"] else tval[tid]
    loss = None
    if g.loss in tval:
        loss = w.gather_full(g.loss, tval[g.loss]) if g.loss in xplan["held"] \
            else tval[g.loss]
    if job.get("debug"):               # every tensor's value inside this worker's box
        dbg = {}
        for t, v in tval.items():
            h = xplan["held"].get(t)
            if h is not None and torch.is_tensor(v):
                dbg[t] = (h[rank], v.detach().reshape(box_extent(h[rank])).cpu().numpy())
        send("result", "debug", dbg)
    if rank == 0:
        send("result", "main", {"loss": None if loss is None else float(loss),
                                "params": {k: v.detach().cpu().numpy()
                                           for k, v in finals.items()},
                                "dtype": "float64" if got else timed["dtype"]})
    send("result", "stats", (timed["sent"], timed["extra"], timed["step_s"],
                             timed["compute_s"], timed["times"]))
    send("result", "memory", {"peak_bytes": int(max(timed["peak"], got["peak"] if got else 0)),
                              "fallback": timed["fallback"], "local": timed["local"],
                              "collectives": timed["collectives"], "why": timed["why"],
                              "dtype": timed["dtype"], "cpu_s": timed["cpu_s"],
                              "compute_cpu_s": timed["compute_cpu_s"],
                              "profile": timed["profile"],
                              # CUDA: max_memory_allocated over the timed steps (CPU: None)
                              "allocated_bytes": timed["allocated"]})
    if world > 1:
        dist.barrier()                 # nobody leaves while a peer still gathers


def _summary(p: dict) -> dict:
    """A pass's numbers without its tiles (so they can be freed)."""
    if "worker" not in p:
        return p
    w = p["worker"]
    return {**{k: p[k] for k in ("times", "peak", "sent", "extra", "compute_s", "step_s",
                                 "cpu_s", "compute_cpu_s", "profile", "allocated")},
            "fallback": dict(w.fallback), "local": dict(w.local_ops),
            "collectives": w.collectives, "why": dict(w.why),
            "dtype": str(w.float_dtype).replace("torch.", "")}


def _op_pass(rank, world, job, dtype, steps, fault, groups, mem_scale, device="cpu"):
    """``steps`` steps of the layout with floating point in ``dtype`` (see :func:`_op_entry`);
    the memory guard, when there is one, counts them at ``mem_scale`` × the limit (float64
    doubles every floating-point tensor the plan counts at 4 bytes)."""
    from explorer.engine.core.opgraph import opgraph_digest
    from explorer.engine.runtime.memlimit import arm, disarm
    from explorer.engine.runtime.faults import inject_fault
    g, params, buffers, x = _build(job["spec"], job["batch"], job["model_args"],
                                   job["seed"], job["lr"], dtype=dtype)
    if opgraph_digest(g) != job["digest"]:
        raise InfeasiblePlan("the worker's trace of the model differs from the plan's "
                             "operator graph (model code or arguments changed?)")
    xplan = job["xplan"]
    if groups is None:
        groups = make_groups(g, xplan, world) if job.get("collectives", True) else {}
    w = TileWorker(rank, world, g, xplan, job["timeout_s"], groups, device=device)
    w.float_dtype = dtype
    # traced on CPU (the search's graph); the worker computes on its device
    w.load([p.to(w.device) for p in params], [b.to(w.device) for b in buffers],
           x.to(w.device))
    del params, buffers, x            # the worker keeps its boxes only
    flat = list(list(g.gm.graph.nodes)[-1].args[0])
    npar = len(g.param_names)
    new_ids = [a.name if isinstance(a, torch.fx.Node) else None
               for a in flat[1 + npar:1 + 2 * npar]]
    arm(mem_scale)                     # --memory-per-worker counts the steps (set up done)
    times, cpu, compute_cpu, peak, profs = [], [], [], 0, []
    sent = extra = compute_s = 0.0
    reset_peak(w.device)
    for i in range(steps):
        inject_fault(fault, rank, i + 1, "operator-level step")
        w.delivered.clear()
        w.received.clear()
        w.compute_s = w.compute_cpu_s = 0.0
        w.prof = {}
        if world > 1:
            dist.barrier()
        t0, c0 = w.clock(), time.thread_time()
        tval = w.step()
        times.append(w.clock() - t0)
        cpu.append(time.thread_time() - c0)
        compute_cpu.append(w.compute_cpu_s)
        profs.append(w.prof)
        if i == 0:
            sent, extra, compute_s = w.sent, w.extra, w.compute_s
        peak = max(peak, w.peak_bytes)
        if job.get("train") and i + 1 < steps:
            w.advance(new_ids)        # the next step starts from the updated parameters
    disarm()                           # the final gather is not part of the steps

    def med(v):
        return float(np.median(v[1:] if len(v) > 2 else v))
    return {"tval": tval, "worker": w, "g": g, "new_ids": new_ids, "times": times,
            "peak": peak, "sent": sent, "extra": extra, "compute_s": compute_s,
            "step_s": med(times), "cpu_s": med(cpu), "compute_cpu_s": med(compute_cpu),
            "profile": _mean_profile(profs), "allocated": peak_allocated(w.device)}, groups


def _mean_profile(profs: list) -> dict:
    """The timing hooks' per-target seconds (:meth:`TileWorker._profiled`) per step, averaged
    over the steps after the first (the warm-up) when there are more."""
    use = profs[1:] if len(profs) > 1 else profs
    out: dict = {}
    for p in use:
        for k, row in p.items():
            acc = out.setdefault(k, [0.0] * len(row))
            for i, v in enumerate(row):
                acc[i] += v / len(use)
    return out


def run_layout(spec: str, batch: int | None, model_args: dict | None, xplan: dict, *,
               digest: str, steps: int = 1, seed: int = 0, lr: float = 0.01,
               timeout_s: float = 300.0, tol: float = 1e-4, check: bool = True,
               fault: str | None = None, debug: bool = False, train: bool = False,
               memory_limit: float | None = None, dtype: str = TIMED_DTYPE) -> dict:
    """Run an execution layout (a Tofu plan's, or :func:`placement_xplan` of a placement) on
    ``xplan["workers"]`` local worker processes (:func:`.launcher.start_workers`: CPU or
    CUDA, :mod:`.devicemap`) and compare with one device.

    ``digest`` is the plan's :func:`~explorer.engine.core.opgraph.opgraph_digest`: every worker
    refuses a trace that differs.  Returns ``reference_ok`` / ``reference`` (the loss and every
    updated parameter against the float64 single-device step, :mod:`.reference`),
    ``max_rel_error``, ``loss`` / ``reference_loss``, ``measured_comm_bytes`` (bytes the
    workers exchanged during the first step), ``extra_bytes`` (the final gather, not part of
    the step), ``step_time_s`` (rank 0) and ``measured_step_time_s`` (the slowest worker;
    median of ``steps``), ``compute_s`` per worker and ``step_times_s``.  ``train``: each step
    starts from the parameters the previous one updated (checked against as many reference
    steps); otherwise every step repeats the first;
    ``measured_peak_memory_bytes`` per worker (the largest sum of its live tiles and the
    operator in flight's buffers, floating point at 4 bytes an element as the plan counts),
    ``tile_local_ops`` / ``fallback_ops`` (aten target -> operators per worker computed on
    tiles / on full-size buffers) and ``collectives`` (split sums combined by one
    ``reduce_scatter`` or ``all_reduce``).
    ``memory_limit`` (bytes): stop a worker whose steps allocate more (:mod:`.memlimit`).
    ``dtype``: what the timed steps compute in (``timed_dtype``; float32 by default, what a
    user trains in); the check runs its own float64 step(s) after them
    (:func:`_op_entry`), ``float64`` makes the timed steps the checked ones.
    """
    layout = {"spec": spec, "batch": batch, "model_args": dict(model_args or {}),
              "xplan": xplan, "digest": digest}
    return run_layouts([layout], steps=steps, seed=seed, lr=lr, timeout_s=timeout_s, tol=tol,
                       check=check, fault=fault, debug=debug, train=train,
                       memory_limit=memory_limit, dtype=dtype)[0]


def _model_key(plan: dict) -> tuple:
    """What a plan's reference is computed for: the model, its batch and arguments."""
    import json
    return plan["spec"], plan["batch"], json.dumps(plan["model_args"], sort_keys=True)


def run_layouts(layouts: list, *, steps: int = 1, seed: int = 0, lr: float = 0.01,
                timeout_s: float = 300.0, tol: float = 1e-4, check: bool = True,
                fault: str | None = None, debug: bool = False, train: bool = False,
                memory_limit: float | None = None, dtype: str = TIMED_DTYPE) -> list:
    """Several execution layouts (dicts with ``spec``, ``batch``, ``model_args``, ``xplan``,
    ``digest``; one worker count) in one launch: the processes start once and run the plans
    one after the other (how the tests run every example's plans), the reference computed
    once per model.  One result dict per layout, as :func:`run_layout`'s.  ``memory_limit``
    guards a launch of one plan only."""
    from explorer.engine.runtime.launcher import start_workers
    if dtype not in ("float32", "float64"):
        raise InfeasiblePlan(f"the timed steps compute in float32 or float64, not {dtype!r}")
    if not layouts:
        return []
    counts = {int(lay["xplan"]["workers"]) for lay in layouts}
    if len(counts) != 1:
        raise InfeasiblePlan(f"layouts launched together must use one worker count, not "
                             f"{sorted(counts)}")
    if memory_limit is not None and len(layouts) > 1:
        raise InfeasiblePlan("a memory limit guards a launch of one plan: run the plans one "
                             "at a time")
    workers = counts.pop()
    plans = [{"spec": lay["spec"], "batch": lay["batch"],
              "model_args": dict(lay.get("model_args") or {}), "xplan": lay["xplan"],
              "digest": lay["digest"]} for lay in layouts]
    # the launcher traces each model once per dtype (its reference needs the float64 one;
    # the timed steps the other) and the workers take those traces instead of tracing
    # them again each
    timed = getattr(torch, str(dtype))
    traces = _ship_traces(plans, seed, lr,
                          tuple(dict.fromkeys([timed] + ([torch.float64] if check else []))))
    job = {"plans": plans, "seed": seed, "lr": lr, "fault": fault, "debug": debug,
           "steps": max(1, int(steps)), "timeout_s": timeout_s, "train": bool(train),
           "dtype": dtype, "check": bool(check), "traces": traces}
    got = start_workers(workers, _op_entry, job, timeout_s=timeout_s,
                        name="explorer-op-worker", memory_limit=memory_limit,
                        jobs=len(plans))
    _SHIPPED.clear()
    _SHIPPED.update(traces)            # the references below read them, not trace again
    try:
        return _gather_layouts(plans, got, workers, dtype, check, seed, lr, steps, train,
                               tol, debug)
    finally:
        _SHIPPED.clear()


def _gather_layouts(plans, got, workers, dtype, check, seed, lr, steps, train, tol, debug):
    """:func:`run_layouts`' result per plan from what the workers sent, each compared with
    its model's float64 single-device step when ``check``."""
    from explorer.engine.runtime.reference import compare
    outs, refs = [], {}
    for i, plan in enumerate(plans):
        res = {r: {k[1]: v for k, v in got.results[r].items() if k[0] == i}
               for r in got.results}
        out, main = _layout_result(plan, res, workers, got, dtype)
        if check:
            key = _model_key(plan)
            if key not in refs:               # one reference per model, the last one kept
                refs = {key: _reference(plan, seed, lr, steps, train)}
            ref = refs[key]
            got_params = {k: torch.from_numpy(v) for k, v in main["params"].items()}
            doc = compare(main["loss"], got_params, None, ref, None, tol)
            out.update(reference=doc, reference_ok=doc["ok"],
                       max_rel_error=doc["max_rel_error"], reference_loss=ref[0])
        if debug:
            out["debug"] = {r: v["debug"] for r, v in res.items() if "debug" in v}
        outs.append(out)
    return outs


#: the last reference computed in this process: ``(key, (loss, params, None))``
_LAST_REF: list = []


def _reference(plan, seed, lr, steps, train):
    """The float64 single-device step(s) of a plan's model (:func:`.reference.traced_step`).
    The last one is kept (its loss and parameters, not its activations): plans of one model
    for several worker counts - the same graph (``digest``), seed, rate and steps - share it
    instead of repeating minutes of float64 steps of a model one worker cannot hold."""
    key = (_model_key(plan), plan.get("digest"), seed, lr,
           max(1, int(steps)) if train else 1, bool(train))
    if _LAST_REF and _LAST_REF[0][0] == key:
        return _LAST_REF[0][1]
    ref = _reference_steps(plan, seed, lr, steps, train)
    _LAST_REF[:] = [(key, ref)]
    return ref


def float64_reference(spec: str, batch: int, model_args: dict | None, seed: int, lr: float,
                      digest: str | None = None) -> tuple:
    """``(loss, params_after, None)`` of one float64 single-device step of the model (seeded
    as the workers seed it): what an operator-level run is judged against, and a compiled
    placement that ran on GPUs, whose kernels round otherwise than this CPU's."""
    plan = {"spec": spec, "batch": batch, "model_args": dict(model_args or {}),
            "digest": digest}
    return _reference(plan, seed, lr, 1, False)


def _reference_steps(plan, seed, lr, steps, train):
    from explorer.engine.runtime.reference import traced_step
    g, params, buffers, x = _build(plan["spec"], plan["batch"], plan["model_args"], seed, lr)
    ref = traced_step(g, params, buffers, x)
    for _ in range(max(1, int(steps)) - 1 if train else 0):
        params = [ref[1][pn] for pn in g.param_names]
        ref = traced_step(g, params, buffers, x)
    return ref


def _layout_result(plan, res, workers, got, dtype):
    """One plan's result dict from what its workers sent (see :func:`run_layout`), and rank
    0's loss and parameters."""
    main = res.get(0, {}).get("main")
    stats = {r: v["stats"] for r, v in res.items() if "stats" in v}
    if main is None or len(stats) != workers:
        raise RunFailed("the workers finished without sending their results", 0, got.pids)
    mem = {r: res[r].get("memory", {}) for r in sorted(stats)}
    fallback: dict = {}
    local: dict = {}
    why: dict = {}
    for m in mem.values():
        for k, v in m.get("why", {}).items():
            why.setdefault(k, v)
        for k, v in m.get("fallback", {}).items():
            fallback[k] = max(fallback.get(k, 0), v)
        for k, v in m.get("local", {}).items():
            local[k] = max(local.get(k, 0), v)
    out = {"model": plan["spec"], "workers": workers, "loss": main["loss"],
           "timed_dtype": dtype,
           "measured_peak_memory_bytes": [int(m.get("peak_bytes", 0)) for m in mem.values()],
           "tile_local_ops": dict(sorted(local.items())),
           "fallback_ops": dict(sorted(fallback.items())),
           "fallback_reasons": dict(sorted(why.items())),
           "collectives": sum(m.get("collectives", 0) for m in mem.values()),
           "measured_comm_bytes": float(sum(v[0] - v[1] for v in stats.values())),
           "extra_bytes": float(sum(v[1] for v in stats.values())),
           "step_time_s": stats[0][2],
           "measured_step_time_s": max(v[2] for v in stats.values()),
           "compute_s": [stats[r][3] for r in sorted(stats)],
           # CPU time of each worker's main thread (median step): computing and the
           # interpreter's own work, not waiting for transfers
           "cpu_step_s": [float(m.get("cpu_s", 0.0)) for m in mem.values()],
           "compute_cpu_s": [float(m.get("compute_cpu_s", 0.0)) for m in mem.values()],
           # where each worker's step went, per aten target (timing hooks; per step)
           "step_profile": [step_breakdown(m.get("profile") or {}, float(stats[r][2]),
                                           float(m.get("cpu_s", 0.0)))
                            for r, m in mem.items()],
           # each step's wall time on the slowest worker (the first step includes warm-up)
           "step_times_s": [max(ts) for ts in zip(*(v[4] for v in stats.values()))],
           "launch_time_s": got.elapsed_s, "pids": got.pids, "backend": got.backend,
           "reference": None, "reference_ok": None, "max_rel_error": None,
           "reference_loss": None}
    alloc = [m.get("allocated_bytes") for m in mem.values()]
    out["measured_allocated_peak_bytes"] = alloc if all(a is not None for a in alloc) else None
    out.update(got.describe())
    if got.map is not None and got.map.shared:
        out.setdefault("warnings", []).append(got.map.note)
    return out, main


_PHASES = ("ops", "fetch_s", "fetch_cpu_s", "compute_s", "compute_cpu_s", "send_s",
           "send_cpu_s", "wait_s", "collective_s", "page_faults")


_RUSAGE_THREAD = getattr(resource, "RUSAGE_THREAD", None)


def _faults() -> int:
    """This thread's minor page faults so far (0 where ``RUSAGE_THREAD`` is missing); read
    four times per operator, so the lookups are done once."""
    return 0 if _RUSAGE_THREAD is None else resource.getrusage(_RUSAGE_THREAD).ru_minflt


def step_breakdown(prof: dict, step_s: float, cpu_s: float) -> dict:
    """"Where did the step go" for one worker: ``by_target`` (aten target -> the timing
    hooks' seconds per step: fetching input regions, computing, sending / combining the
    output - wall and CPU -, of which waiting in transfers and in collectives) and
    ``total`` (the same summed, plus ``step_s`` / ``cpu_s`` and ``other_s``: the step's
    wall time outside every operator, the interpreter's own loop and freeing tiles)."""
    by = {k: dict(zip(_PHASES, row)) for k, row in sorted(prof.items())}
    tot = {k: float(sum(r[k] for r in by.values())) for k in _PHASES}
    inside = tot["fetch_s"] + tot["compute_s"] + tot["send_s"]
    tot.update(step_s=step_s, cpu_s=cpu_s, other_s=max(0.0, step_s - inside))
    return {"by_target": by, "total": tot}


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


def _covering(g, spec: str, names) -> list:
    """``names`` as a list, or :class:`InfeasiblePlan` when it misses an operator of ``g``."""
    names = list(names)
    missing = [o for o in g.ops if o not in set(names)]
    if missing:
        raise InfeasiblePlan(f"the placement does not cover operator {missing[0]} of "
                             f"{spec} ({len(missing)} missing): was it made for another model "
                             f"or batch?")
    return names


def run_placements(spec: str, batch: int | None, model_args: dict | None, plans: list,
                   workers: int = 2, *, g=None, seed: int = 0, lr: float = 0.01,
                   timeout_s: float = 300.0, tol: float = 1e-4, steps: int = 3,
                   warmup: int = 1, check: bool = True) -> list:
    """Several placements of one model, ``plans`` = ``[(names, placement), ...]`` or
    ``[(names, placement, order), ...]``, compiled and run in one launch
    (:func:`.compiled.run_compiled_many`: the workers start and trace the step once, the
    reference is computed once).  One result per plan, as :func:`run_placement`'s."""
    from explorer.engine.core.capture_cache import op_graph
    from explorer.engine.core.opgraph import opgraph_digest
    from explorer.engine.runtime.compiled import run_compiled_many
    if g is None:
        g = op_graph(spec, batch, model_args)
    full = []
    for plan in plans:
        names, placement, order = (tuple(plan) + (None,))[:3]
        names = _covering(g, spec, names)
        full.append((names, placement, order))
    digest = opgraph_digest(g)
    outs = run_compiled_many(spec, batch, model_args, full, workers, g=g, digest=digest,
                             steps=steps, warmup=warmup, seed=seed, lr=lr,
                             timeout_s=timeout_s, tol=tol, check=check,
                             float64_ref=lambda: float64_reference(spec, batch, model_args,
                                                                   seed, lr, digest))
    for out, (names, placement, _) in zip(outs, full):
        out["predicted_comm_bytes"] = placement_comm_bytes(g, names, placement)
    return outs


def run_placement(spec: str, batch: int | None, model_args: dict | None, names, placement,
                  workers: int = 2, seed: int = 0, lr: float = 0.01, timeout_s: float = 300.0,
                  tol: float = 1e-4, steps: int = 3, fault: str | None = None, g=None,
                  check: bool = True, memory_limit: float | None = None, warmup: int = 1,
                  executor: str = "compiled", order=None, timeline: bool = False) -> dict:
    """Run a device placement (operator -> device) on ``workers`` gloo processes and compare
    the result with one device.  ``g``: the model's operator graph when the caller has it;
    ``memory_limit`` (bytes): stop a worker whose steps allocate more (:mod:`.memlimit`);
    ``order``: the plan's operators in its simulated schedule's order (the compiled programs
    follow it; default the traced step's order); ``timeline``: also each worker's traced
    step (:func:`.compiled.timeline`, compiled only).

    ``executor="compiled"`` (default): one fx program per device with send/recv
    (:func:`.compiled.run_compiled`, ``warmup`` + ``steps`` steps, float32): the step time
    can be held against the prediction.  ``"interpreted"``: this module's aten-call
    interpreter (float64, ``steps`` steps, the first its warm-up) - it checks the data
    movement of the placement's layout, not its speed.  Returns the executor's keys plus
    ``predicted_comm_bytes`` (the simulator's rule, :func:`placement_comm_bytes`; the compiled
    programs move less when a device computes a multi-output call whose other output it
    holds, instead of receiving that output)."""
    from explorer.engine.core.capture_cache import op_graph
    from explorer.engine.core.opgraph import opgraph_digest
    if executor not in ("compiled", "interpreted"):
        raise InfeasiblePlan(f"executor must be compiled or interpreted, not {executor!r}")
    if g is None:
        g = op_graph(spec, batch, model_args)
    names = _covering(g, spec, names)
    if executor == "compiled":
        from explorer.engine.runtime.compiled import run_compiled
        out = run_compiled(spec, batch, model_args, names, placement, workers, g=g,
                           digest=opgraph_digest(g), steps=steps, warmup=warmup, seed=seed,
                           lr=lr, timeout_s=timeout_s, tol=tol, fault=fault, check=check,
                           memory_limit=memory_limit, order=order, timeline=timeline,
                           float64_ref=lambda: float64_reference(spec, batch, model_args, seed,
                                                                 lr, opgraph_digest(g)))
        out["predicted_comm_bytes"] = placement_comm_bytes(g, names, placement)
        return out
    x = placement_xplan(g, names, placement, workers)
    out = run_layout(spec, batch, model_args, x, digest=opgraph_digest(g), steps=steps,
                     seed=seed, lr=lr, timeout_s=timeout_s, tol=tol, fault=fault, check=check,
                     memory_limit=memory_limit, dtype="float64")
    out["predicted_comm_bytes"] = placement_comm_bytes(g, names, placement)
    out["executor"] = "interpreted"
    return out

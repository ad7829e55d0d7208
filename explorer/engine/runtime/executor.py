"""One worker's share of a layer-wise plan: forward, backward, gradient sync and SGD update.

Every worker (rank ``r`` of ``N``; the plan's device ``d`` is rank ``d``) builds the same real
model with the same seed, the same :class:`~explorer.engine.core.layergraph.LayerGraph` and the same
static *schedule* from the plan and :mod:`explorer.engine.core.geometry` (the single source of
truth for tiles, regions and shards).  A training step then walks the layers:

Forward, in topological order, for layer ``L``:

1. *Fetch*: for each in-edge ``P -> L`` and each device ``d`` of ``L``'s configuration, the
   region ``edge_regions(P->L, box_d)`` of ``P``'s output is cut into pieces
   ``region ∩ box_s`` by the owners ``s`` of ``P``'s tiles.  Every rank posts ``irecv`` for the
   pieces it needs and ``isend`` for the pieces it owns (same global order and tags on both
   sides, empty pieces skipped on both), then waits on all of them; local pieces are copied.
   Because all ranks run the layers in the same order and post every send and receive of a
   layer before waiting, the exchange cannot deadlock.
2. The assembled region becomes a leaf tensor (``requires_grad`` when ``P`` depends on
   parameters); the edge's view ops are applied forward
   (:mod:`~explorer.engine.runtime.transforms`), and :func:`~explorer.engine.runtime.ops.compute`
   computes exactly the owned output box, folded BatchNorm/activations included.

A row-parallel layer (a ``k`` degree, :func:`~explorer.engine.core.geometry.compute_boxes`)
fetches its group's tile rows but only its slice of the input features, computes a partial
sum of the whole tile with its weight columns, and the ``k`` members reduce-scatter the
partials so each owns its part of the tile (along ``l``, else ``n``); the bias and the folded
nodes then run on the owned box.  Backward is the adjoint: the owned box's gradient is
all-gathered over the group into the tile's gradient, which the local matmul back-propagates
(:meth:`Executor._reduce_scatter`, :meth:`Executor._all_gather`).

Mode: the model is loaded and captured in train mode by :mod:`explorer.engine.core.capture` (the
search's own capture, so the graph digests agree) and computed with deterministic numerics -
dropout the identity, BatchNorm with its running statistics - as the reference check does.

Loss: ``Σ_outputs mean(out²)`` over the model's floating-point output layers (the rule of
:func:`~explorer.engine.core.capture.loss_of`; each worker adds its boxes' share); the gradient of
an owned output box is ``2·out/numel``.  A model file's own ``loss(output)`` is refused here
(it would need every output whole on one worker); operator-level plans run it.

Backward, in reverse topological order, for layer ``P``:

1. The gradient of ``P``'s owned box is the sum of the pieces of every consumer's region
   gradient (``leaf.grad`` of the fetched regions), sent back to the owners of ``P``'s tiles
   by the same exchange in reverse.
2. ``torch.autograd.backward`` of ``P``'s local output with that gradient fills the weight
   shards' and input regions' gradients.
3. Weight shards held by several devices (replica groups: identical shard boxes) are summed
   inside the group: ``sync="allreduce"`` (default with NCCL) makes one coalesced
   ``all_reduce`` per group and layer on a ``dist.new_group`` per distinct group (created in
   the same order on every rank); ``sync="p2p"`` (default with gloo, whose collectives cost
   ~1 ms even for a few bytes here) swaps gradients point-to-point, see
   :meth:`Executor._sync_grads`.  Since
   each worker back-propagates its part of the *global* loss, the sum is exactly the
   single-device gradient: no division is needed.
4. SGD (``p -= lr·grad``, no momentum) on the worker's shards.

Timing: per layer, forward fetch (comm), forward compute, gradient return (comm), backward
compute, sync (all-reduce) and update, per step.

Precision (the plan's ``dtype``, :mod:`explorer.engine.core.precision`): the step runs under
:func:`~explorer.engine.core.precision.autocast` - bf16 autocast with the float32 shards as
master weights (their gradients, the sync and the update stay float32), TF32 on or off on
CUDA.  A layer's output is whatever autocast made it (bfloat16 after a matmul or
convolution); what travels between workers is cast to the dtype the capture gave the
producer's output, so every receiver knows its buffers' dtype (a bfloat16 value is exact in
float32; the consumer's autocast casts it back).  Row-parallel partial sums travel in the
dtype they were computed in, the same on every member.
"""

from __future__ import annotations

import contextlib
import json
import math
from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.distributed as dist

from explorer.errors import InfeasiblePlan
from explorer.engine.core import geometry as G
from explorer.engine.core import precision as P
from explorer.engine.core.capture import capture, deterministic, load, loss_function
from explorer.engine.core.importer import import_model
from explorer.engine.layerwise.plan import Plan
from explorer.engine.runtime import comm as xfer
from explorer.engine.runtime import ops
from explorer.engine.runtime import transforms as T
from explorer.engine.runtime.timing import clock

#: Columns of the per-step timing array.
PHASES = ("fwd_comm", "fwd_compute", "bwd_comm", "bwd_compute", "sync", "update")


@dataclass
class Piece:
    """Part of a producer's output that moves from rank ``src`` to rank ``dst``."""

    src: int
    dst: int
    box: np.ndarray     # on the producer's output tensor
    edge: int           # index of the consumer's in-edge


@dataclass
class InEdge:
    """An in-edge of a layer, as seen by this worker."""

    edge: object
    src: str
    grad: bool                       # the producer needs a gradient
    region: np.ndarray | None = None  # box on the producer this worker fetches
    q_box: np.ndarray | None = None   # the same region in the op's input coordinates
    steps: list = field(default_factory=list)


#: element-wise layer functions whose value has no gradient with respect to their inputs
_COMPARISONS = {"lt", "le", "gt", "ge", "eq", "ne"}


@dataclass
class LayerState:
    name: str
    layer: object
    cfg: G.Config
    boxes: np.ndarray
    pos: int | None
    box: np.ndarray | None
    dtype: torch.dtype
    ins: list = field(default_factory=list)
    fwd_pieces: list = field(default_factory=list)
    bwd_pieces: list = field(default_factory=list)   # (consumer name, edge idx, Piece)
    fwd: dict = field(default_factory=dict)          # compiled forward exchange (this rank)
    bwd: dict = field(default_factory=dict)          # compiled gradient return (this rank)
    full: tuple | None = None                        # extents of my output box
    needs_grad: bool = False
    ctx: object = None
    trainable: list = field(default_factory=list)    # qualified names of my trainable shards
    sync: list = field(default_factory=list)         # [(ranks, [qualified names])]
    is_output: bool = False
    tile: np.ndarray | None = None                   # the box I compute (k: group's tile)
    kgroup: tuple | None = None                      # k: (ranks, my index, slices of parts)
    #: the plan's memory savings: recompute the output in the backward pass; ZeRO stage
    recompute: bool = False
    zero: int = 0
    zshards: list = field(default_factory=list)      # [ZeroShard] of my replicated shards
    last_use: int = -1                               # order index of the last consumer
    bwd_leaves: list = field(default_factory=list)   # consumers' regions my gradient reads


@dataclass
class ZeroShard:
    """A weight shard this worker holds with the other members ``ranks`` of its replica group,
    under ZeRO: member ``j`` owns elements ``bounds[j]:bounds[j + 1]`` of the flattened shard
    (its optimizer state, ZeRO-2 its gradient, ZeRO-3 its parameter)."""

    key: str
    ranks: tuple
    j: int
    bounds: list

    @property
    def mine(self) -> slice:
        return slice(self.bounds[self.j], self.bounds[self.j + 1])


@dataclass
class MicroBatch:
    """What one (micro-)batch's forward pass leaves for its backward pass: layer outputs,
    fetched regions (autograd leaves), loss gradients, row-parallel partials, a recomputed
    layer's input regions, and its share of the loss (the checked step)."""

    outs: dict = field(default_factory=dict)
    leaves: dict = field(default_factory=dict)
    loss_grads: dict = field(default_factory=dict)
    partials: dict = field(default_factory=dict)
    recomp_in: dict = field(default_factory=dict)
    inputs: list = field(default_factory=list)     # my boxes of its model input
    loss: object = None            # a float64 tensor of one element

    def tensors(self) -> list:
        """The activations it holds (for the memory meter)."""
        out = [t for t in self.outs.values() if t is not None]
        for leaf in self.leaves.values():
            out += [leaf, leaf.grad]
        for part, z in self.partials.values():
            out += [part, z, z.grad]
        out += list(self.loss_grads.values())
        for regions in self.recomp_in.values():
            out += list(regions)
        return out


def micro_batches_of(plan) -> int:
    """The plan's micro-batch count (1 without a pipeline)."""
    pipe = getattr(plan, "pipeline", None) or {}
    return max(1, int(pipe.get("micro_batches", 1) or 1))


def batch_axis(graph) -> int:
    """The model input's sample axis (``n``; 0 when the importer named none)."""
    for name in graph.names():
        layer = graph.layer(name)
        if layer.op == "input" and "n" in (layer.axes or ""):
            return list(layer.axes).index("n")
    return 0


#: this process's latest captures (:func:`_captured`): the plans of one launch are grouped by
#: model, so a worker captures each model once, not once per plan
_CAPTURES: OrderedDict = OrderedDict()
_CAPTURES_KEPT = 1


def _captured(plan, seed: int, device):
    """``(model, x, gm, graph)`` of the plan's model as a fresh worker builds it: seeded, in
    train mode on ``device``, traced with shapes (:func:`~explorer.engine.core.capture.capture`)
    and imported as the search's layer graph.

    A capture this process made for the same model, batch, arguments, seed and device is
    reused: its parameters and buffers are put back to their initial values and dtype (the
    float64 reference check converts the model in place) and the random generator to its state
    after the capture, so the executor starts exactly as from a fresh build."""
    key = (plan.spec, plan.batch, json.dumps(plan.model_args or {}, sort_keys=True, default=str),
           seed, str(device))
    hit = _CAPTURES.get(key)
    if hit is not None:
        model, x, gm, graph, state, rng = hit
        for name, value in model.state_dict(keep_vars=True).items():
            value.data = state[name].clone()           # values, dtype (the float64 reference
                                                        # converts the model in place) and device
        gm.__dict__.pop("_explorer_consts", None)      # constants evaluated by the last plan
        torch.manual_seed(seed)
        torch.set_rng_state(rng)
        return model, x, gm, graph
    torch.manual_seed(seed)
    model, x = load(plan.spec, plan.batch, plan.model_args, meta=False)   # train mode
    model = model.to(device)
    x = x.to(device)
    gm, source = capture(model, x, plan.model)
    # the search's graph, from this capture (same train-mode trace: same digest)
    graph = import_model(model, x, plan.model, captured=(gm, source))
    state = {name: value.detach().clone() for name, value in model.state_dict().items()}
    _CAPTURES.clear()                                   # one model's capture is kept
    _CAPTURES[key] = (model, x, gm, graph, state, torch.get_rng_state())
    return model, x, gm, graph


class Executor:
    """Executes a :class:`~explorer.engine.layerwise.plan.Plan` as rank ``rank`` of ``world``.

    Needs an initialised default process group when ``world > 1``.  ``lr`` is the SGD learning
    rate; ``seed`` seeds the model's initial weights and the input (every rank and the
    reference build the identical model).
    """

    def __init__(self, plan: Plan, rank: int, world: int, *, lr: float = 0.01, seed: int = 0,
                 device: str = "cpu", fault=None, sync: str = "auto"):
        if plan.n_devices != world:
            raise InfeasiblePlan(f"the plan is for {plan.n_devices} devices, {world} workers "
                                 f"were started")
        self.plan, self.rank, self.world = plan, rank, world
        self.lr, self.seed, self.device = float(lr), int(seed), torch.device(device)
        self.clock = clock(self.device)
        self.fault = fault
        if sync == "auto":
            sync = "allreduce" if self.device.type == "cuda" else "p2p"
        if sync not in ("p2p", "allreduce"):
            raise ValueError(f"sync mode {sync!r}: use p2p, allreduce or auto")
        self.sync_mode = sync
        #: the step's precision (fp32 | tf32 | bf16), the plan's
        self.dtype = P.check(getattr(plan, "dtype", None))
        self._bufs: dict = {}
        self.step_no = 0
        self.phase = "setup"
        torch.manual_seed(self.seed)
        if loss_function(plan.spec) is not None:
            raise InfeasiblePlan(f"{plan.spec}: the model file defines loss(output); the "
                                 f"layer-wise runtime trains with the default loss Σ mean(o²) "
                                 f"only: run a tofu or placement plan of it instead")
        self.model, self.x, self.gm, self.graph = _captured(plan, self.seed, self.device)
        if plan.graph_digest:
            from explorer.engine.core.layergraph import graph_digest
            if graph_digest(self.graph) != plan.graph_digest:
                raise InfeasiblePlan(f"the worker's capture of {plan.spec!r} differs from the "
                                     f"graph the plan was searched on (digest "
                                     f"{graph_digest(self.graph)} vs {plan.graph_digest})")
        #: pipelined plans (:attr:`Plan.pipeline`): the micro-batches of the step, each run
        #: on the layer graph captured at the micro-batch's size (the plan's configurations
        #: are for that graph); one micro-batch, the whole input, otherwise
        self.micro_batches = micro_batches_of(plan)
        self.micro_x = [self.x]
        pipe = plan.pipeline or {}
        self.stages = max(1, int(pipe.get("stages", 1) or 1))
        self.stage = rank // max(1, int(pipe.get("devices_per_stage", world) or world)) \
            if pipe else 0
        #: the order the micro-batches run in: 1F1B where the plan says so and the workers
        #: talk over gloo (NCCL serialises a rank's sends and receives on one stream, so a
        #: send not yet received would hold back the receive 1F1B needs next), else GPipe's
        self.schedule = "gpipe"
        if pipe.get("schedule") == "1f1b" and self.micro_batches > 1 and self.stages > 1 and \
                (self.device.type == "cpu" or xfer.staged()):
            self.schedule = "1f1b"
        #: a pipelined step's sends still in flight (``None``: sends are waited for at once)
        self._pending = None
        #: the full batch's element count of each output (the loss is their mean)
        self.loss_numel = {o: math.prod(self.graph.layer(o).out_shape)
                           for o in (self.graph.outputs or [self.graph.names()[-1]])}
        if self.micro_batches > 1:
            self._micro_capture()
        self.nodes = {n.name: n for n in self.gm.graph.nodes}
        self.tensors = dict(self.gm.named_parameters(remove_duplicate=False))
        # a tied parameter (an LM head sharing the embedding's table) has several names: each
        # name -> the first (the name the reference and the plan's gather use)
        first: dict = {}
        self.canon = {q: first.setdefault(id(t), q) for q, t in self.tensors.items()}
        self.param_names = set(self.tensors)
        self.tensors.update(dict(self.gm.named_buffers(remove_duplicate=False)))
        self.shards: dict = {}
        self._setup()

    def _micro_capture(self):
        """Split the input into the plan's micro-batches along its sample axis and capture
        the model on one of them: the layer graph the pipelined plan's configurations are
        for (the search rebatched the same graph, :mod:`~explorer.engine.layerwise.rebatch`,
        which equals a capture at that size).  An output that does not carry the batch (its
        mean over the whole batch is not the mean of the micro-batches' means) is refused."""
        M, B = self.micro_batches, self.plan.batch
        full = self.graph
        axis = batch_axis(full)
        b = B // M
        if B % M or self.x.shape[axis] != B:
            raise InfeasiblePlan(f"{M} micro-batches do not divide the batch {B}")
        self.micro_x = [c.contiguous() for c in self.x.split(b, dim=axis)]
        gm, source = capture(self.model, self.micro_x[0], self.plan.model)
        graph = import_model(self.model, self.micro_x[0], self.plan.model, captured=(gm, source))
        for o, n in self.loss_numel.items():
            if o not in graph or math.prod(graph.layer(o).out_shape) * M != n:
                raise InfeasiblePlan(f"output {o} does not split with the batch: a pipelined "
                                     f"plan of {M} micro-batches cannot compute its loss")
        self.gm, self.graph = gm, graph

    # ------------------------------------------------------------------------------------
    # static schedule
    # ------------------------------------------------------------------------------------
    def _setup(self):
        g, plan = self.graph, self.plan
        assign = plan.assignment()
        order = g.names()
        missing = [n for n in order if n not in assign]
        extra = [n for n in assign if n not in g]
        if missing or extra:
            raise InfeasiblePlan(
                f"the plan does not match model {plan.model!r} (batch {plan.batch}, args "
                f"{plan.model_args}): layers without a configuration {missing[:5]}, unknown "
                f"layers {extra[:5]}")
        self.order = order
        self.state: dict = {}
        self.outputs = set(g.outputs or [order[-1]])
        used_by: dict = {}      # parameter -> the shard keys of the layers using it
        groups_all: set = set()
        self.gather_plan = []   # (qual, logical shape, box, owner rank)
        self.tied: dict = {}    # shard key of a tied parameter -> (parameter, box, owner?)
        for name in order:
            layer = g.layer(name)
            cfg = assign[name]
            red_size = G.reduction_size(layer)
            bad = [k for k, v in cfg.degrees if v > 1 and k not in layer.dims
                   and not (k == G.REDUCE and red_size is not None)]
            if bad:
                raise InfeasiblePlan(f"layer {name}: the plan splits dimension(s) {bad}, the "
                                     f"layer has {list(layer.dims)}")
            for k, v in cfg.degrees:
                size = red_size if k == G.REDUCE else layer.size(k)
                if v > 1 and v > size:
                    raise InfeasiblePlan(f"layer {name}: degree {k}={v} exceeds the size "
                                         f"{size} of that dimension")
            boxes = G.output_boxes(layer, cfg)
            tiles, red = G.compute_boxes(layer, cfg)
            pos = cfg.devices.index(self.rank) if self.rank in cfg.devices else None
            node = self.nodes.get(name)
            if node is None:
                raise InfeasiblePlan(f"layer {name} has no node in the traced model")
            # the layer's value is its last folded node's (a comparison made 0/1 by a
            # folded ``where``: floating point, not the comparison's bool)
            dtype = self._dtype(self.nodes.get(layer.folded[-1], node) if layer.folded
                                else node)
            st = LayerState(name, layer, cfg, boxes, pos, None if pos is None else boxes[pos],
                            dtype, is_output=name in self.outputs)
            self.state[name] = st
            if pos is not None:
                st.tile = tiles[pos]
                for members in G.reduce_groups(cfg):
                    if pos in members:
                        ranks = tuple(cfg.devices[m] for m in members)
                        parts = [G.to_slices(boxes[m], tiles[pos]) for m in members]
                        st.kgroup = (ranks, members.index(pos), parts)
            for members in G.reduce_groups(cfg):
                groups_all.add(tuple(sorted(cfg.devices[m] for m in members)))
            if layer.op == "input":
                continue
            if layer.op == "lstm_cell" or any(t[0] == "item" for e in g.out_edges(name)
                                              for t in e.transforms):
                raise NotImplementedError(f"layer {name} ({layer.op}): multi-output layers "
                                          f"are not supported by the runtime yet")
            # inputs and the pieces to exchange
            for ei, e in enumerate(g.in_edges(name)):
                src = self.state[e.src]
                ie = InEdge(e, e.src, src.needs_grad)
                regions = G.edge_regions(g, e, tiles, red)
                for j, d in enumerate(cfg.devices):
                    r = regions[j]
                    if G.volume(r) == 0:
                        continue
                    for i, s in enumerate(src.cfg.devices):
                        p = G.intersect(src.boxes[i], r)
                        if G.volume(p) > 0:
                            st.fwd_pieces.append(Piece(s, d, p, ei))
                if pos is not None:
                    where = f"edge {e.src}->{name}#{e.index}"
                    chain, steps = T.plan_edge(layer, e.index, st.tile, e.transforms, where,
                                               None if red is None else red[pos])
                    if G.volume(chain[0]) > 0:
                        ie.region, ie.q_box, ie.steps = chain[-1], chain[0], steps
                        if not np.array_equal(ie.region, regions[pos]):
                            raise RuntimeError(f"{where}: transform chain and geometry "
                                               f"disagree on the region")
                st.ins.append(ie)
            # parameters
            mapping = self._resolve_params(layer, node)
            shards = G.param_shards(layer, tiles, red)
            shard_boxes, local = {}, {}
            for key, (logical, reg) in shards.items():
                seen = mapping[key]                      # the name this layer reads it by
                qual = self.canon.get(seen, seen)
                # weight tying: a later layer's shards are its own (key "param@layer"); the
                # gradients of all the layers' shards are summed after the backward pass
                skey = qual if qual not in used_by else f"{qual}@{name}"
                used_by.setdefault(qual, []).append((skey, tuple(logical)))
                trainable = qual in self.param_names
                keyed: dict = {}
                for k, row in enumerate(reg.reshape(cfg.total, -1).tolist()):
                    keyed.setdefault(tuple(row), []).append(k)
                distinct = [reg[m[0]] for m in keyed.values()]
                for a in range(len(distinct)):
                    for b in range(a + 1, len(distinct)):
                        if G.overlap(distinct[a], distinct[b]) > 0:
                            raise NotImplementedError(
                                f"layer {name}: shards of {qual} overlap without being equal "
                                f"({distinct[a].tolist()} vs {distinct[b].tolist()})")
                if trainable:
                    for members in keyed.values():
                        ranks = tuple(sorted(cfg.devices[m] for m in members))
                        if len(ranks) > 1:
                            groups_all.add(ranks)
                        if skey == qual:
                            self.gather_plan.append((qual, tuple(logical), reg[members[0]],
                                                     min(ranks)))
                if pos is None:
                    continue
                full = self.tensors[qual].detach()
                if tuple(full.shape) != tuple(logical):
                    full = full.reshape(logical)
                box = reg[pos]
                sh = full[tuple(slice(int(a), int(b)) for a, b in box)].clone()
                if trainable:
                    sh.requires_grad_(True)
                    st.trainable.append(skey)
                self.shards[skey] = sh
                local[seen] = sh
                shard_boxes[seen] = box
                if trainable:
                    members = keyed[tuple(box.reshape(-1).tolist())]
                    ranks = tuple(sorted(cfg.devices[m] for m in members))
                    self.tied[skey] = (qual, box, min(ranks) == self.rank)
                    if len(ranks) > 1:
                        for rr, quals in st.sync:
                            if rr == ranks:
                                quals.append(skey)
                                break
                        else:
                            st.sync.append((ranks, [skey]))
            st.sync.sort(key=lambda t: t[0])
            # a comparison passes no gradient to its inputs (only to folded parameters)
            flows = layer.op != "eltwise" or layer.attrs.get("fn") not in _COMPARISONS
            st.needs_grad = bool(any(mapping[k] in self.param_names for k in shards)
                                 or (flows and any(ie.grad for ie in st.ins)))
            st.needs_grad = st.needs_grad and dtype.is_floating_point
            if pos is not None:
                folded = []
                for fn in layer.folded:
                    fnode = self.nodes.get(fn)
                    if fnode is None and fn.rstrip("_0123456789") in ops.IDENTITY_OPS:
                        continue      # a no-op export elides on real tensors (contiguous)
                    if fnode is None:
                        raise NotImplementedError(f"layer {name}: folded node {fn} is not in "
                                                  f"the traced model")
                    folded.append(fnode)
                ctx = ops.LayerContext(layer, node, folded, self.gm, self.tensors, local,
                                       shard_boxes)
                ctx.weight_name = mapping.get("weight")
                ctx.bias_name = mapping.get("bias")
                if layer.op == "pool":
                    ctx.pool_opts = ops.pool_options(ctx)
                if layer.op == "adaptive_pool":
                    ctx.adaptive_kind = ops.adaptive_kind(ctx)
                st.ctx = ctx
        tied = {q: uses for q, uses in used_by.items() if len(uses) > 1 and q in self.param_names}
        for q, uses in tied.items():
            if len({logical for _, logical in uses}) > 1:
                raise NotImplementedError(
                    f"parameter {q} is used by {len(uses)} layers in different layouts "
                    f"{sorted({logical for _, logical in uses})} (weight tying): not supported "
                    f"by the runtime")
        self.tied_params = {q: uses[0][1] for q, uses in sorted(tied.items())}
        self.tied = {k: v for k, v in self.tied.items() if v[0] in tied}
        # backward pieces: for each producer, every consumer's pieces in consumer order
        for name in order:
            st = self.state[name]
            for ei, ie in enumerate(st.ins):
                for pc in st.fwd_pieces:
                    if pc.edge == ei:
                        self.state[ie.src].bwd_pieces.append((name, ei, pc))
        for name in order:
            self._compile(self.state[name])
        # process groups (same order on every rank)
        self.groups = {}
        for ranks in sorted(groups_all, key=lambda r: (len(r), r)):
            if len(ranks) == self.world or self.world == 1:
                self.groups[ranks] = None
            else:
                self.groups[ranks] = dist.new_group(list(ranks))
        self._setup_savings()

    def _setup_savings(self):
        """The plan's per-layer memory savings (``recompute``, ``zero``) on this worker.

        A recomputed layer's output is released after its last consumer's fetch
        (``last_use``).  Under ZeRO every replicated shard of the layer (a tied parameter's
        excepted: its gradient is summed across layers first) is cut into one contiguous
        slice of its flattened elements per member of its replica group; ZeRO-2/3 shards
        leave the plain gradient sync (a reduce-scatter replaces it), and a ZeRO-3 shard
        keeps only its slice between uses (the whole shard's storage is freed)."""
        opts = {la.name: (bool(la.recompute), int(la.zero)) for la in self.plan.layers}
        #: my slice of each ZeRO-3 shard (the parameter it keeps) and of each ZeRO-2/3 shard's
        #: summed gradient (from the reduce-scatter until the update)
        self.zslices: dict = {}
        self.gslices: dict = {}
        self._recomp_in: dict = {}       # recomputed layer -> the input regions it keeps
        self.meter = None                # a .memtrack.MemoryMeter during a measured step
        self._inputs: list = []          # my boxes of the model input in the current step
        self._live: list = []            # a pipelined step's micro-batches in flight
        #: forward index -> the recomputed layers whose output is released after it
        self._release: dict = {}
        pos = {n: i for i, n in enumerate(self.order)}
        for name in self.order:
            st = self.state[name]
            st.recompute, st.zero = opts.get(name, (False, 0))
            if st.layer.op == "input":
                st.recompute, st.zero = False, 0
            st.last_use = max((pos[e.dst] for e in self.graph.out_edges(name)), default=-1)
            if st.recompute and st.last_use >= 0 and name not in self.outputs:
                self._release.setdefault(st.last_use, []).append(name)
            if not st.zero or st.pos is None:
                continue
            keep = []
            for ranks, quals in st.sync:
                plain = []
                for q in quals:
                    if q in self.tied:
                        plain.append(q)
                        continue
                    n = self.shards[q].numel()
                    r = len(ranks)
                    st.zshards.append(ZeroShard(q, ranks, ranks.index(self.rank),
                                                [n * i // r for i in range(r + 1)]))
                    if st.zero == 1:
                        plain.append(q)          # ZeRO-1: the gradient is summed whole
                if plain:
                    keep.append((ranks, plain))
            st.sync = keep
            if st.zero >= 3:
                for zs in st.zshards:
                    p = self.shards[zs.key]
                    self.zslices[zs.key] = p.detach().reshape(-1)[zs.mine].clone()
                    p.untyped_storage().resize_(0)

    def _dtype(self, node):
        tm = node.meta.get("tensor_meta")
        if tm is not None and hasattr(tm, "dtype"):
            return tm.dtype
        v = node.meta.get("val")
        if isinstance(v, torch.Tensor):
            return v.dtype
        return torch.float32

    def _resolve_params(self, layer, node) -> dict:
        """Layer parameter key -> qualified parameter/buffer name in the model."""
        out, todo = {}, []
        for k in layer.params:
            if node.op == "call_module" and f"{node.target}.{k}" in self.tensors:
                out[k] = f"{node.target}.{k}"
            elif k in self.tensors:
                out[k] = k
            else:
                todo.append(k)
        if todo:
            attrs = []

            def walk(a):
                if isinstance(a, torch.fx.Node) and a.op == "get_attr":
                    attrs.append(str(a.target))
                elif isinstance(a, (list, tuple)):
                    for x in a:
                        walk(x)
            for a in list(node.args) + list(node.kwargs.values()):
                walk(a)
            attrs = [a for a in attrs if a not in out.values()]
            if len(attrs) < len(todo):
                raise NotImplementedError(
                    f"layer {layer.name}: cannot find the model parameters behind {todo}")
            for k, a in zip(todo, attrs):
                out[k] = a
        return out

    # ------------------------------------------------------------------------------------
    # exchange helpers
    # ------------------------------------------------------------------------------------
    @staticmethod
    def _wait(recvs, sends):
        works = []
        for peer, buf, tag in recvs:
            works.append(xfer.irecv(buf, peer, tag=tag))
        for peer, t, tag in sends:
            works.append(xfer.isend(t, peer, tag=tag))
        for w in works:
            w.wait()

    def _exchange(self, recvs, sends):
        """A layer's fetch or gradient return: :meth:`_wait`, except in a pipelined step,
        where only the receives are waited for and the sends complete in the background
        (kept until the step's end; nothing writes to what they send)."""
        if self._pending is None:
            self._wait(recvs, sends)
            return
        works = [xfer.irecv(buf, peer, tag=tag) for peer, buf, tag in recvs]
        for peer, t, tag in sends:
            self._pending.append((xfer.isend(t, peer, tag=tag), t))
        for w in works:
            w.wait()

    def _compile(self, st):
        """Precompute this rank's part of the layer's exchanges (no numpy in the step loop).

        Forward (``st.fwd``): per in-edge whose region is inside my own tile of the producer,
        a view of it (``direct``); otherwise the region buffer to allocate, the pieces to
        receive (into the buffer or a temporary), to copy locally and to send.  Backward
        (``st.bwd``): the pieces of consumers' region gradients to add into my output
        gradient, to send and to receive.
        """
        me = self.rank
        fwd = {"direct": [], "alloc": [], "recv": [], "local": [], "send": []}
        if st.pos is not None:
            for ei, ie in enumerate(st.ins):
                if ie.region is None:
                    continue
                src = self.state[ie.src]
                if src.pos is not None and src.cfg.devices[src.pos] == me and \
                        G.volume(G.intersect(src.box, ie.region)) == G.volume(ie.region):
                    sl = None if np.array_equal(src.box, ie.region) else \
                        G.to_slices(ie.region, src.box)
                    fwd["direct"].append((ei, ie.src, sl))
                else:
                    fwd["alloc"].append((ei, G.box_shape(ie.region), src.dtype))
        direct = {d[0] for d in fwd["direct"]}
        for tag, pc in enumerate(st.fwd_pieces):
            ie = st.ins[pc.edge]
            src = self.state[ie.src]
            if pc.dst == me:
                if pc.edge in direct:
                    continue
                if pc.src == me:
                    fwd["local"].append((pc.edge, ie.src, G.to_slices(pc.box, src.box),
                                         G.to_slices(pc.box, ie.region)))
                else:
                    whole = np.array_equal(pc.box, ie.region)
                    fwd["recv"].append((pc.edge, pc.src, tag, G.box_shape(pc.box),
                                        None if whole else G.to_slices(pc.box, ie.region)))
            elif pc.src == me:
                fwd["send"].append((ie.src, pc.dst, tag, G.to_slices(pc.box, src.box)))
        st.fwd = fwd
        bwd = {"local": [], "send": [], "recv": []}
        full = None if st.box is None else G.box_shape(st.box)
        for tag, (cname, ei, pc) in enumerate(st.bwd_pieces):
            if pc.dst != me and pc.src != me:
                continue
            cst = self.state[cname]
            if pc.dst == me:
                region = cst.ins[ei].region
                rsl = None if np.array_equal(pc.box, region) else G.to_slices(pc.box, region)
                if pc.src == me:
                    bsl = None if np.array_equal(pc.box, st.box) else G.to_slices(pc.box, st.box)
                    bwd["local"].append((cname, ei, G.box_shape(region), rsl, bsl))
                else:
                    bwd["send"].append((cname, ei, G.box_shape(region), rsl, pc.src, tag))
            else:
                bsl = None if np.array_equal(pc.box, st.box) else G.to_slices(pc.box, st.box)
                bwd["recv"].append((pc.dst, tag, G.box_shape(pc.box), bsl))
        st.bwd = bwd
        st.full = full
        st.bwd_leaves = sorted({(c[0], c[1]) for c in bwd["local"] + bwd["send"]})

    def participation(self) -> np.ndarray:
        """``[layers, 3]`` bool: does this rank exchange data in the layer's forward fetch,
        gradient return and gradient sync."""
        out = np.zeros((len(self.order), 3), dtype=bool)
        for i, name in enumerate(self.order):
            st = self.state[name]
            out[i, 0] = bool(st.fwd.get("recv") or st.fwd.get("send"))
            out[i, 1] = bool(st.bwd.get("recv") or st.bwd.get("send"))
            out[i, 2] = bool(st.sync or st.zshards)
        return out

    def _fetch(self, st, outs, leaves):
        """Forward exchange for layer ``st``: returns the region tensors (my inputs)."""
        f = st.fwd
        regions = [None] * len(st.ins)
        dev = self.device
        for ei, src, sl in f["direct"]:
            t = outs[src]
            regions[ei] = (t if sl is None else t[sl]).detach()
        for ei, ext, dtype in f["alloc"]:
            regions[ei] = torch.empty(ext, dtype=dtype, device=dev)
        if f["recv"] or f["send"]:
            recvs, sends, todo = [], [], []
            for ei, peer, tag, ext, rsl in f["recv"]:
                if rsl is None:
                    recvs.append((peer, regions[ei], tag))
                else:
                    buf = torch.empty(ext, dtype=regions[ei].dtype, device=dev)
                    recvs.append((peer, buf, tag))
                    todo.append((ei, rsl, buf))
            for src, peer, tag, ssl in f["send"]:
                # in the dtype the receiver allocated (autocast may have made it bf16)
                sends.append((peer, outs[src][ssl].detach().to(self.state[src].dtype)
                              .contiguous(), tag))
            self._exchange(recvs, sends)
            for ei, rsl, buf in todo:
                regions[ei][rsl] = buf
        for ei, src, ssl, rsl in f["local"]:
            regions[ei][rsl] = outs[src][ssl].detach()
        for ei, ie in enumerate(st.ins):
            r = regions[ei]
            if r is not None and ie.grad:
                r = r.detach().requires_grad_(True)
                regions[ei] = r
                leaves[(st.name, ei)] = r
        return regions

    def _grad_in(self, st, leaves, loss_grads):
        """Backward exchange for producer ``st``: the gradient of my output box.

        The first contribution that covers the whole box is used as the accumulator (no
        zero-filled buffer, no copy); the others are added into it.
        """
        b = st.bwd
        dev = self.device
        g = loss_grads.get(st.name) if st.pos is not None else None
        owned = g is None          # may g be modified in place?
        full = st.full

        def add(bsl, part):
            nonlocal g, owned
            if g is None:
                if bsl is None:
                    g, owned = part, True
                    return
                g, owned = torch.zeros(full, dtype=st.dtype, device=dev), True
            elif not owned:
                g, owned = g.clone(), True
            if bsl is None:
                g += part
            else:
                g[bsl] += part

        def region_grad(cname, ei, ext):
            leaf = leaves.get((cname, ei))
            gr = None if leaf is None else leaf.grad
            return torch.zeros(ext, dtype=st.dtype, device=dev) if gr is None else gr

        if b["send"] or b["recv"]:
            sends, recvs = [], []
            for cname, ei, ext, rsl, peer, tag in b["send"]:
                gr = region_grad(cname, ei, ext)
                part = gr if rsl is None else gr[rsl]
                sends.append((peer, part.contiguous(), tag))
            for peer, tag, ext, bsl in b["recv"]:
                recvs.append((peer, torch.empty(ext, dtype=st.dtype, device=dev), tag))
            self._exchange([(p, buf, t) for p, buf, t in recvs], sends)
            for (peer, tag, ext, bsl), (_, buf, _) in zip(b["recv"], recvs):
                add(bsl, buf)
        for cname, ei, ext, rsl, bsl in b["local"]:
            gr = region_grad(cname, ei, ext)
            add(bsl, gr if rsl is None else gr[rsl])
        if g is None and st.pos is not None:
            g = torch.zeros(full, dtype=st.dtype, device=dev)
        return g

    def _sync_grads(self, ranks, grads):
        """Sum ``grads`` over the replica group ``ranks`` (every member ends with the sum).

        ``sync="allreduce"``: one coalesced ``dist.all_reduce`` on the group's process group.
        ``sync="p2p"``: point-to-point — two replicas swap their gradients and add; larger
        groups send to the group's first rank, which adds them in rank order and sends the
        sum back (the parameter-server pattern of the cost model).  Gloo's collectives cost
        about 1 ms even for a few bytes on this machine, its send/recv ~0.1 ms, so p2p is the
        default on gloo.
        """
        if self.sync_mode == "allreduce":
            flat = grads[0] if len(grads) == 1 else torch.cat([x.reshape(-1) for x in grads])
            xfer.all_reduce(flat, group=self.groups[ranks])
            if len(grads) > 1:
                o = 0
                for x in grads:
                    x.copy_(flat[o:o + x.numel()].view_as(x))
                    o += x.numel()
            return
        me = self.rank
        if len(ranks) == 2:
            other = ranks[1] if ranks[0] == me else ranks[0]
            bufs = [self._buffer(("sync", i), x) for i, x in enumerate(grads)]
            self._wait([(other, b, i) for i, b in enumerate(bufs)],
                       [(other, x, i) for i, x in enumerate(grads)])
            for x, b in zip(grads, bufs):
                x.add_(b)        # a + b == b + a exactly: both replicas hold the same sum
            return
        leader = ranks[0]
        if me == leader:
            others = ranks[1:]
            bufs = {(r, i): self._buffer(("sync", r, i), x) for r in others
                    for i, x in enumerate(grads)}
            self._wait([(r, bufs[(r, i)], i) for r in others for i in range(len(grads))], [])
            for r in others:
                for i, x in enumerate(grads):
                    x.add_(bufs[(r, i)])
            self._wait([], [(r, x, len(grads) + i) for r in others
                            for i, x in enumerate(grads)])
        else:
            self._wait([], [(leader, x, i) for i, x in enumerate(grads)])
            self._wait([(leader, x, len(grads) + i) for i, x in enumerate(grads)], [])

    #: message tags of the row-parallel collectives (apart from the exchanges' piece tags)
    _RS_TAG, _AG_TAG = 1 << 20, (1 << 20) + 1

    def _reduce_scatter(self, st, part):
        """Sum the ``k`` group's partial tiles; return my part of the sum (a new tensor).

        ``p2p`` (gloo's default): each member sends every other member that member's part of
        its partial and adds the parts it receives, in member order.  ``allreduce``: one
        ``all_reduce`` of the tile on the group's process group, then my part (gloo and NCCL
        both have it; it moves the whole tile instead of ``(k-1)/k`` of it)."""
        ranks, j, parts = st.kgroup
        if self.sync_mode == "allreduce":
            full = part.clone()
            xfer.all_reduce(full, group=self.groups[tuple(sorted(ranks))])
            return full[parts[j]].clone()
        bufs = {i: torch.empty_like(part[parts[j]]) for i in range(len(ranks)) if i != j}
        self._wait([(ranks[i], b, self._RS_TAG) for i, b in bufs.items()],
                   [(ranks[i], part[parts[i]].contiguous(), self._RS_TAG)
                    for i in range(len(ranks)) if i != j])
        out = None
        for i in range(len(ranks)):
            piece = part[parts[j]] if i == j else bufs[i]
            out = piece.clone() if out is None else out.add_(piece)
        return out

    def _all_gather(self, st, grad):
        """The adjoint of :meth:`_reduce_scatter`: the whole tile's gradient from every
        member's part (``allreduce`` mode: an ``all_reduce`` of a zero tile holding mine)."""
        ranks, j, parts = st.kgroup
        full = torch.zeros(G.box_shape(st.tile), dtype=grad.dtype, device=grad.device)
        full[parts[j]] = grad
        if self.sync_mode == "allreduce":
            xfer.all_reduce(full, group=self.groups[tuple(sorted(ranks))])
            return full
        bufs = {i: torch.empty(full[parts[i]].shape, dtype=grad.dtype, device=grad.device)
                for i in range(len(ranks)) if i != j}
        self._wait([(ranks[i], b, self._AG_TAG) for i, b in bufs.items()],
                   [(ranks[i], grad.contiguous(), self._AG_TAG)
                    for i in range(len(ranks)) if i != j])
        for i, b in bufs.items():
            full[parts[i]] = b
        return full

    #: message tags of the ZeRO collectives
    _ZRS_TAG, _ZAG_TAG = (1 << 20) + 2, (1 << 20) + 3

    def _zero_reduce_scatter(self, zs, flat):
        """The sum over ``zs``'s replica group of my slice of ``flat`` (each member's
        flattened gradient of the shard; ``flat`` may be overwritten).  ``p2p``: each member
        sends every other member that member's slice and adds the slices it receives, in
        member order; ``allreduce``: one ``all_reduce`` of the whole, then my slice."""
        b, j = zs.bounds, zs.j
        if self.sync_mode == "allreduce":
            xfer.all_reduce(flat, group=self.groups[zs.ranks])
            return flat[zs.mine].clone()
        r = len(zs.ranks)
        mine = flat[zs.mine]
        bufs = {i: torch.empty_like(mine) for i in range(r) if i != j and mine.numel()}
        self._wait([(zs.ranks[i], buf, self._ZRS_TAG) for i, buf in bufs.items()],
                   [(zs.ranks[i], flat[b[i]:b[i + 1]].contiguous(), self._ZRS_TAG)
                    for i in range(r) if i != j and b[i + 1] > b[i]])
        out = None
        for i in range(r):
            piece = mine if i == j else bufs.get(i)
            if piece is not None:
                out = piece.clone() if out is None else out.add_(piece)
        return mine.clone() if out is None else out

    def _zero_all_gather(self, zs, flat):
        """Fill every member's slice of ``flat`` (the flattened shard, mine already in place)
        from its owner: ``p2p`` sends, ``allreduce`` sums a zero-filled whole."""
        b, j = zs.bounds, zs.j
        if self.sync_mode == "allreduce":
            mine = flat[zs.mine].clone()
            flat.zero_()
            flat[zs.mine] = mine
            xfer.all_reduce(flat, group=self.groups[zs.ranks])
            return flat
        r = len(zs.ranks)
        self._wait([(zs.ranks[i], flat[b[i]:b[i + 1]], self._ZAG_TAG) for i in range(r)
                    if i != j and b[i + 1] > b[i]],
                   [(zs.ranks[i], flat[zs.mine], self._ZAG_TAG) for i in range(r)
                    if i != j and b[j + 1] > b[j]])
        return flat

    def _zero_gather(self, st):
        """ZeRO-3: the layer's whole shards from the members' slices (before its forward
        and its backward)."""
        for zs in st.zshards:
            p = self.shards[zs.key]
            p.untyped_storage().resize_(p.numel() * p.element_size())
            flat = p.data.view(-1)          # .data: the saved tensors' version stays
            flat[zs.mine] = self.zslices[zs.key]
            self._zero_all_gather(zs, flat)

    def _zero_free(self, st):
        """ZeRO-3: release the layer's whole shards (their slices stay)."""
        for zs in st.zshards:
            self.shards[zs.key].untyped_storage().resize_(0)

    def _zero_sync(self, st):
        """ZeRO-2/3 after the layer's backward: reduce-scatter each shard's gradient; I keep
        my slice of the sum, the whole gradient is dropped."""
        for zs in st.zshards:
            p = self.shards[zs.key]
            g = torch.zeros_like(p) if p.grad is None else p.grad
            self.gslices[zs.key] = self._zero_reduce_scatter(zs, g.contiguous().view(-1))
            p.grad = None

    def _zero_update(self, st, grads: dict | None):
        """SGD under ZeRO: each member updates its slice of the shard with its slice of the
        summed gradient; ZeRO-1/2 then all-gather the updated shard, ZeRO-3 keeps the slice
        and frees the shard.  ``grads`` (the check step): each shard's whole summed gradient
        (ZeRO-2/3: all-gathered for the comparison only).  Returns the seconds spent in the
        all-gathers (the step's sync, not its update)."""
        comm = 0.0
        for zs in st.zshards:
            p = self.shards[zs.key]
            if st.zero == 1:
                g = torch.zeros_like(p) if p.grad is None else p.grad
                if grads is not None:
                    grads[zs.key] = g.clone()
                gs = g.contiguous().view(-1)[zs.mine]
                p.grad = None
            else:
                gs = self.gslices.pop(zs.key)
                if grads is not None:
                    full = torch.zeros(p.numel(), dtype=gs.dtype, device=gs.device)
                    full[zs.mine] = gs
                    grads[zs.key] = self._zero_all_gather(zs, full).view(p.shape)
            if st.zero >= 3:
                self.zslices[zs.key].add_(gs, alpha=-self.lr)
                continue
            flat = p.data.view(-1)
            flat[zs.mine].add_(gs, alpha=-self.lr)
            t0 = self.clock()
            self._zero_all_gather(zs, flat)
            comm += self.clock() - t0
        if st.zero >= 3:
            self._zero_free(st)
        return comm

    def _buffer(self, key, like):
        b = self._bufs.get(key)
        if b is None or b.shape != like.shape or b.dtype != like.dtype:
            b = torch.empty_like(like)
            self._bufs[key] = b
        return b

    def _check_fault(self, where: str):
        from explorer.engine.runtime.faults import inject_fault   # the one hook of all executors
        inject_fault(self.fault, self.rank, self.step_no, where)

    # ------------------------------------------------------------------------------------
    # a training step
    # ------------------------------------------------------------------------------------
    def step(self, check: bool = False, measure: bool = False):
        """One forward/backward/sync/SGD step of the train-mode graph under
        :class:`~explorer.engine.core.capture.deterministic` numerics (dropout the identity,
        BatchNorm with running statistics), as :func:`.reference.reference_step` computes it,
        in the plan's precision (:func:`~explorer.engine.core.precision.autocast`).
        ``measure``: count the step's live memory by category (:mod:`.memtrack`; slower),
        returned as ``extra["memory"]``.  See :meth:`_step`."""
        from explorer.engine.runtime.memtrack import MemoryMeter
        self.meter = MemoryMeter() if measure else None
        hooks = self.meter.hooks() if measure else contextlib.nullcontext()
        try:
            with deterministic(running_stats=True), P.autocast(self.dtype, self.device.type), \
                    hooks:
                tm, extra = self._step(check)
            if measure:
                extra["memory"] = self.meter.result()
            return tm, extra
        finally:
            self.meter = None

    def _compute(self, st, regions, partials):
        """``(y, comm seconds)``: my output box of layer ``st`` from its input regions
        (a row-parallel layer: the partial tile, the group's reduce-scatter, then the bias
        and folded ops; ``partials`` keeps the partial for the backward pass, ``None``: not
        kept, as under ``no_grad``)."""
        ins = [None if r is None else T.forward(r, ie.steps) for r, ie in zip(regions, st.ins)]
        q_boxes = [ie.q_box for ie in st.ins]
        if st.kgroup is None:
            return ops.compute(st.ctx, ins, q_boxes, st.box), 0.0
        part = ops.compute_partial(st.ctx, ins, q_boxes, st.tile)
        tr = self.clock()
        z = self._reduce_scatter(st, part.detach())
        comm = self.clock() - tr
        z.requires_grad_(part.requires_grad)
        y = ops.finish(st.ctx, z, st.box)
        if partials is not None:
            partials[st.name] = (part, z)
        return y, comm

    def _sample(self, where, outs, leaves, partials, loss_grads, g=None, transient=()):
        """One sample of the measured step's live memory (:class:`.memtrack.MemoryMeter`):
        my shards (a ZeRO-3 shard's slice; its whole shard while gathered is transient),
        their gradients and gradient slices, the activations the step holds (outputs, fetched
        regions and their gradients, partial tiles, loss gradients, the gradient in flight),
        autograd's saved tensors.  The model input is counted as my box of it (every worker
        builds the whole input), the whole model each worker builds to cut its shards from
        not at all."""
        with torch._C.DisableTorchFunction():   # bookkeeping, not the step: no mode sees it
            z3 = set(self.zslices)
            inputs = {id(t) for t in self._inputs}
            acts = [t for t in outs.values() if t is not None and id(t) not in inputs]
            for leaf in leaves.values():
                acts += [leaf, leaf.grad]
            for part, z in partials.values():
                acts += [part, z, z.grad]
            acts += list(loss_grads.values()) + [g]
            for regions in self._recomp_in.values():
                acts += list(regions)
            for other in self._live:       # the other micro-batches in flight (a pipeline)
                if other is not None and other.outs is not outs:
                    acts += other.tensors()
            self.meter.sample(where, {
                "params": [p for q, p in self.shards.items() if q not in z3]
                          + list(self.zslices.values()),
                "grads": [p.grad for p in self.shards.values()] + list(self.gslices.values()),
                "activations": acts,
                "transient": [self.shards[q] for q in z3] + list(transient)},
                skip=[self.x], sized={"activations": sum(t.numel() * t.element_size()
                                                         for t in self._inputs)})

    def _step(self, check: bool = False):
        """One forward/backward/sync/SGD step.

        Returns ``(timings [layers, len(PHASES)], extra)`` where ``extra`` holds, when
        ``check``, the loss (all-reduced) and a copy of each trainable shard's synchronised
        gradient.

        A pipelined plan (:attr:`micro_batches` > 1) runs its micro-batches' forward and
        backward passes in :meth:`pipeline_order` (GPipe's or 1F1B's; gradients accumulate
        in the shards' ``.grad``), then the sync and update of each layer once.  A stage's
        workers take part only in their layers' exchanges, so the stages overlap as the
        activations and their gradients arrive point to point.  Timings add up over the
        micro-batches.
        """
        tm = np.zeros((len(self.order), len(PHASES)))
        extra = {"grads": {}} if check else {}
        self._inputs = []
        if self.micro_batches == 1:
            mb = self._forward(self.x, tm, check, first=True)
            self._loss(extra, mb.loss, check)
            self._backward(mb, tm, extra, check, update=True)
        else:
            self._live = [None] * self.micro_batches
            self._pending = []
            loss = torch.zeros(1, dtype=torch.float64, device=self.device)
            for kind, m in self.pipeline_order():
                if kind == "F":
                    mb = self._forward(self.micro_x[m], tm, check, first=m == 0)
                    self._live[m] = mb
                    loss += mb.loss
                else:
                    mb, self._live[m] = self._live[m], None
                    self._backward(mb, tm, extra, check, update=False)
                    done = {id(t) for t in mb.inputs}     # no longer held for this one
                    self._inputs = [t for t in self._inputs if id(t) not in done]
                self._pending = [(w, t) for w, t in self._pending if not w.is_completed()]
            self.phase = "sends of the last micro-batches"
            t0 = self.clock()
            for w, _ in self._pending:
                w.wait()
            tm[0, 2] += self.clock() - t0
            self._pending = None
            self._live = []
            for li in range(len(self.order) - 1, -1, -1):
                st = self.state[self.order[li]]
                if st.needs_grad:
                    self.phase = f"sync and update of layer {st.name}"
                    self._sync_update(li, st, tm, extra, check)
            self._loss(extra, loss, check)
        if self.tied_params:
            self.phase = "tied parameters"
            t0 = self.clock()
            self._sync_tied(extra if check else None)
            tm[len(self.order) - 1, 4] += self.clock() - t0
        self.phase = "between steps"
        self.step_no += 1
        return tm, extra

    def pipeline_order(self) -> list:
        """This worker's ``[("F" | "B", micro-batch)]`` for one step: GPipe's (every forward,
        then every backward), or 1F1B's for my stage ``s`` of ``S``: ``min(S − s − 1, M)``
        warm-up forwards, then one forward and one backward in turn, then the remaining
        backwards.  Sends are not waited for until the step's end (:meth:`_exchange`), so
        a stage that sends an activation while its successor sends it a gradient cannot
        wait on it."""
        M = self.micro_batches
        if self.schedule != "1f1b":
            return [("F", m) for m in range(M)] + [("B", m) for m in range(M)]
        w = min(self.stages - self.stage - 1, M)
        order = [("F", m) for m in range(w)]
        for i in range(M - w):
            order += [("F", w + i), ("B", i)]
        return order + [("B", m) for m in range(M - w, M)]

    def _loss(self, extra, part, check):
        """The checked step's loss: every worker's share summed (all-reduce)."""
        if not check:
            return
        self.phase = "loss"
        if self.world > 1:
            xfer.all_reduce(part)
        extra["loss"] = float(part.item())

    def _forward(self, x, tm, check, first=True) -> "MicroBatch":
        """The forward pass of one (micro-)batch ``x`` (my boxes of it); its loss share and
        the loss gradients of my output boxes (scaled by the whole batch's element count, so
        that micro-batches' gradients add up to the batch's)."""
        mb = MicroBatch(loss=torch.zeros(1, dtype=torch.float64, device=self.device))
        outs, leaves, loss_grads, partials = mb.outs, mb.leaves, mb.loss_grads, mb.partials
        self._recomp_in = mb.recomp_in
        pc = self.clock               # on CUDA: synchronised, so phases time their kernels
        mid = len(self.order) // 2
        meter = self.meter
        for li, name in enumerate(self.order):
            st = self.state[name]
            self.phase = f"forward of layer {name}"
            if li == mid and first:
                self._check_fault(self.phase)
            if st.layer.op == "input":
                if st.pos is not None:
                    outs[name] = x[tuple(slice(int(a), int(b)) for a, b in st.box)]
                    self._inputs.append(outs[name])
                    mb.inputs.append(outs[name])
                continue
            t0 = pc()
            regions = self._fetch(st, outs, leaves)
            t1 = pc()
            comm = 0.0
            if st.pos is not None:
                if st.zero >= 3:
                    tr = pc()
                    self._zero_gather(st)
                    comm += pc() - tr
                if st.recompute:     # no graph: the backward pass computes it again
                    self._recomp_in[name] = regions
                    with torch.no_grad():
                        y, c = self._compute(st, regions, None)
                else:
                    y, c = self._compute(st, regions, partials)
                comm += c
                outs[name] = y
                if meter is not None:
                    self._sample(f"forward of {name}", outs, leaves, partials, loss_grads)
                if st.zero >= 3:
                    self._zero_free(st)
            for src in self._release.get(li, ()):
                outs[src] = None     # a recomputed layer's output, fetched by every consumer
            t2 = pc()
            tm[li, 0] += t1 - t0 + comm
            tm[li, 1] += t2 - t1 - comm
        self.phase = "loss"
        for o in sorted(self.outputs):
            st = self.state[o]
            if st.pos is None:
                continue
            y = outs[o]
            n = self.loss_numel.get(o) or math.prod(self.graph.layer(o).out_shape)
            loss_grads[o] = y.detach() * (2.0 / n)
            if check:
                mb.loss += y.detach().double().pow(2).sum() / n
        if meter is not None:
            from explorer.engine.runtime.memtrack import FORWARD_END
            self._sample(FORWARD_END, outs, leaves, partials, loss_grads)
        return mb

    def _backward(self, mb, tm, extra, check, update=True):
        """The backward pass of one (micro-)batch; ``update``: each layer's sync and SGD
        update right after its backward (one batch), else the gradients accumulate."""
        outs, leaves, loss_grads, partials = mb.outs, mb.leaves, mb.loss_grads, mb.partials
        self._recomp_in = mb.recomp_in
        pc = self.clock
        meter = self.meter
        for li in range(len(self.order) - 1, -1, -1):
            name = self.order[li]
            st = self.state[name]
            if not st.needs_grad:
                continue
            self.phase = f"backward of layer {name}"
            t0 = pc()
            g = self._grad_in(st, leaves, loss_grads)
            t1 = pc()
            comm = 0.0
            if st.pos is not None:
                if st.zero >= 3:
                    tr = pc()
                    self._zero_gather(st)
                    comm += pc() - tr
                if st.recompute:
                    if meter is not None:
                        meter.kind = "transient"
                    y, c = self._compute(st, self._recomp_in.pop(name), partials)
                    comm += c
                    if meter is not None:
                        meter.kind = "activations"
                else:
                    y = outs[name]
                if meter is not None:
                    self._sample(f"backward of {name}", outs, leaves, partials, loss_grads,
                                 g=g, transient=[y] if st.recompute else ())
                if y.requires_grad:
                    torch.autograd.backward(y, g)
                outs[name] = None
                if name in partials:       # row-parallel: gather the tile's gradient
                    part, z = partials.pop(name)
                    tr = pc()
                    gt = self._all_gather(st, z.grad if z.grad is not None
                                          else torch.zeros_like(z))
                    comm += pc() - tr
                    if part.requires_grad:
                        torch.autograd.backward(part, gt)
                if not update and st.zero >= 3:
                    self._zero_free(st)    # gathered again for the next micro-batch
            if meter is not None and st.pos is not None:
                self._sample(f"after the backward of {name}", outs, leaves, partials,
                             loss_grads, g=g)
            for key in st.bwd_leaves:
                leaves.pop(key, None)          # the region gradients are in g now
            t2 = pc()
            t1 += comm          # the gather counts as gradient communication
            tm[li, 2] += t1 - t0
            tm[li, 3] += t2 - t1
            if update:
                self._sync_update(li, st, tm, extra, check)

    def _sync_update(self, li, st, tm, extra, check):
        """Layer ``st``'s gradient sync over its replica groups (ZeRO-2/3: reduce-scatter)
        and SGD update of my shards (``extra["grads"]``: the synchronised gradients)."""
        pc = self.clock
        t2 = pc()
        for ranks, quals in st.sync:
            grads = []
            for q in quals:
                p = self.shards[q]
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
                grads.append(p.grad)
            self._sync_grads(ranks, grads)
        if st.zero >= 2:
            self._zero_sync(st)
        t3 = pc()
        with torch.no_grad():
            zkeys = {zs.key for zs in st.zshards}
            for q in st.trainable:
                p = self.shards[q]
                if p.grad is None or q in self.tied or q in zkeys:
                    continue        # a tied parameter's shards update after the sum
                if check:
                    extra["grads"][q] = p.grad.clone()
                p.add_(p.grad, alpha=-self.lr)
                p.grad = None
            zcomm = self._zero_update(st, extra["grads"] if check else None) \
                if st.zshards else 0.0
        t4 = pc()
        tm[li, 4] += t3 - t2 + zcomm
        tm[li, 5] += t4 - t3 - zcomm

    def _sync_tied(self, extra):
        """Weight tying: a parameter several layers use (an LM head sharing the embedding's
        table) gets the sum of their gradients.  Each layer's shards are already summed over
        their replicas; the first replica of each adds its shard's gradient into the whole
        parameter, one all-reduce over the workers sums the layers' parts, and every shard
        takes its box of the sum, then the SGD update (so the copies stay equal)."""
        for q, logical in self.tied_params.items():
            mine = [(k, box, owner) for k, (qq, box, owner) in self.tied.items()
                    if qq == q and k in self.shards]
            dtype = self.tensors[q].dtype
            total = torch.zeros(logical, dtype=dtype, device=self.device)
            for k, box, owner in mine:
                gr = self.shards[k].grad
                if owner and gr is not None:
                    total[tuple(slice(int(a), int(b)) for a, b in box)] += gr
            if self.world > 1:
                xfer.all_reduce(total)
            with torch.no_grad():
                for k, box, _ in mine:
                    p = self.shards[k]
                    p.grad = total[tuple(slice(int(a), int(b)) for a, b in box)].clone()
                    if extra is not None and k == q:
                        extra["grads"][q] = p.grad.clone()
                    p.add_(p.grad, alpha=-self.lr)
                    p.grad = None

    # ------------------------------------------------------------------------------------
    # assembling parameters on rank 0
    # ------------------------------------------------------------------------------------
    def gather(self, grads: dict | None = None):
        """Full parameters (and, given this rank's synchronised ``grads``, full gradients) on
        rank 0 assembled from the shards; other ranks return ``None``."""
        z3 = [st for st in self.state.values() if st.zero >= 3 and st.zshards]
        for st in z3:                  # ZeRO-3: whole shards, for the gather only
            self._zero_gather(st)
        try:
            return self._gather(grads)
        finally:
            for st in z3:
                self._zero_free(st)

    def _gather(self, grads):
        me = self.rank
        full: dict = {}
        recvs, sends, todo = [], [], []
        tag = 0
        for qual, logical, box, owner in self.gather_plan:
            for kind in ("param", "grad"):
                if kind == "grad" and grads is None:
                    continue
                tag += 1
                if owner == me:
                    t = self.shards[qual].detach() if kind == "param" else grads[qual]
                    if me == 0:
                        todo.append((qual, kind, logical, box, t))
                    else:
                        sends.append((0, t.contiguous(), tag))
                elif me == 0:
                    buf = torch.empty(G.box_shape(box), dtype=self.tensors[qual].dtype,
                                      device=self.device)
                    recvs.append((owner, buf, tag))
                    todo.append((qual, kind, logical, box, buf))
        if recvs or sends:
            self._wait(recvs, sends)
        if me != 0:
            return None
        covered: dict = {}
        for qual, kind, logical, box, t in todo:
            key = (qual, kind)
            if key not in full:
                full[key] = torch.zeros(logical, dtype=t.dtype, device=self.device)
                covered[key] = 0
            full[key][tuple(slice(int(a), int(b)) for a, b in box)] = t
            covered[key] += t.numel()
        params, gr = {}, {}
        for (qual, kind), t in full.items():
            if covered[(qual, kind)] != t.numel():
                raise RuntimeError(f"parameter {qual}: the shards cover {covered[(qual, kind)]} "
                                   f"of {t.numel()} elements")
            t = t.reshape(self.tensors[qual].shape)
            (params if kind == "param" else gr)[qual] = t
        return params, gr

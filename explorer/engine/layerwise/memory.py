"""Per-device memory by category, and the memory-saving choices of a layer (issue 28).

A layer's memory on a device, for a configuration ``c`` (:mod:`.costmodel`'s accounting,
split by category; ``P`` = the parameter elements of the device's shards, ``pb`` = 4 bytes of
a float32 master weight, ``cb`` = bf16's 2-byte working copy (0 in fp32/tf32), ``db`` = an
activation element):

* ``params``     ``(pb + cb) · P``
* ``grads``      ``pb · P``
* ``optimizer``  ``s · pb · P`` with ``s`` states per weight: ``sgd`` (momentum, what the
  runtime executes) 1, ``adam`` (first and second moments, fp32) 2
* ``activations`` ``db · (2·vol + in + 2·partial)``: the output box kept for backward and its
  gradient, the input regions the layer reads, a row-parallel device's partial tile and its
  gathered gradient.  Summed over every layer, as :mod:`.costmodel` does: an upper bound of a
  step's live activations (gradients of activations are not all alive at once).

With ``sgd`` and neither saving below, the total is :mod:`.costmodel`'s ``memory`` exactly.

Two memory-saving choices per layer, each an *option* ``(recompute, zero)`` of a candidate:

* **recompute** (Chen et al. 2016, activation checkpointing per layer): the layer keeps only
  the input regions it reads and computes its output again during backward: ``+ t_fwd`` (one
  forward of the layer: ``(t_C − t_update) / 3``, the roofline counting backward as two
  forwards, plus the forward half of its reduce-scatter ``t_R``), activations ``db · in``.
  The recomputed output and its gradient live only while that layer's backward runs: a
  transient added to the peak (the largest such layer, :func:`transient`).
* **ZeRO-z** (Rajbhandari et al. 2020) over the layer's replica group of ``r`` devices (those
  holding the same weight shard: the data-parallel group of its configuration), ring
  collectives over the group's slowest link ``b`` with latency ``α``:
  ``RS(s) = AG(s) = (r−1)/r · s/b + (r−1)·α``; ``g = pb·P`` (gradients), ``w`` = the working
  weights ``(cb or pb)·P``.

  ====== ========================= =========================== ============================
  stage  sharded over r            per micro-batch             once per step
  ====== ========================= =========================== ============================
  0      nothing                   –                           t_S (:mod:`.costmodel`)
  1      optimizer states          –                           RS(g) + AG(w)
  2      + gradients               RS(g)                       AG(w)
  3      + parameters (FSDP)       AG(w) forward, AG(w)        –
                                   backward, RS(g)
  ====== ========================= =========================== ============================

  The update touches ``1/r`` of the weights (``t_update / r``).  ZeRO-3's gathered working
  weights of one layer are a transient too.

Times are split into *per micro-batch* (forward, backward, transfers: repeated per micro-batch
of a pipeline) and *once per step* (synchronisation, update), so a pipeline weights them
differently (:mod:`.stages`).  Without a pipeline both count once: equation 1.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from explorer.engine.core import geometry as G
from explorer.engine.layerwise.costmodel import UPDATE_PASSES

__all__ = ["OPTIMIZER_STATES", "CATEGORIES", "MemorySettings", "LayerOptions", "layer_options",
           "options_of", "plan_memory", "transient"]

#: float32 states per weight kept by the optimizer
OPTIMIZER_STATES = {"sgd": 1, "adam": 2}
#: memory categories, in the order the plan reports them
CATEGORIES = ("params", "grads", "optimizer", "activations")


@dataclass(frozen=True)
class MemorySettings:
    """What the memory model assumes and which savings the search may use: ``optimizer``
    (``sgd``: momentum, 1 state; ``adam``: 2 states, float32), ``recompute`` (may a layer be
    recomputed), ``zero`` (the highest ZeRO stage a layer may use, 0–3)."""

    optimizer: str = "sgd"
    recompute: bool = True
    zero: int = 3

    def __post_init__(self):
        if self.optimizer not in OPTIMIZER_STATES:
            raise ValueError(f"optimizer must be one of {', '.join(OPTIMIZER_STATES)}, got "
                             f"{self.optimizer!r}")
        if int(self.zero) not in (0, 1, 2, 3):
            raise ValueError(f"zero must be a ZeRO stage 0, 1, 2 or 3, got {self.zero!r}")

    def options(self) -> list:
        """Every ``(recompute, zero)`` option allowed, the plain one first."""
        return [(rc, z) for rc in ((False, True) if self.recompute else (False,))
                for z in range(int(self.zero) + 1)]


@dataclass
class LayerOptions:
    """One layer's candidates × options ``[C, O]`` (``options[o] = (recompute, zero)``):

    ``t_mb`` seconds per micro-batch, ``t_once`` seconds once per step, ``static`` bytes
    (params + grads + optimizer) and ``act`` bytes (activations of one micro-batch) on the
    layer's fullest device, ``cats`` ``[C, O, 4]`` the categories on that device, ``trans``
    the transient bytes while the layer's backward runs (recomputed output, gathered
    weights), ``replicas`` ``[C]`` the replica group size r."""

    options: list
    t_mb: np.ndarray
    t_once: np.ndarray
    static: np.ndarray
    act: np.ndarray
    cats: np.ndarray
    trans: np.ndarray
    replicas: np.ndarray

    def pick(self, lam: float, weight: float = 1.0, act_mult: float = 1.0, mask=None):
        """``(cost [C], option [C])``: for each candidate the option minimising
        ``weight·t_mb + t_once + lam·(static + act_mult·act)`` (ties: the first, i.e. the
        plain option); ``mask`` ``[O]`` restricts the options."""
        tot = weight * self.t_mb + self.t_once + lam * (self.static + act_mult * self.act)
        if mask is not None:
            tot = np.where(mask[None, :], tot, np.inf)
        o = tot.argmin(axis=1)
        return tot[np.arange(len(o)), o], o


def _group_cost(devices, members: tuple, nbytes: float, links: dict | None = None) -> float:
    """A ring reduce-scatter (or all-gather) of ``nbytes`` over ``members``: ``(r−1)/r · s/b``
    over the slowest link of the group plus ``r−1`` latencies (``links`` memoises each
    group's slowest link and largest latency: the same groups recur in every layer)."""
    r = len(members)
    if r < 2 or nbytes <= 0:
        return 0.0
    hit = None if links is None else links.get(members)
    if hit is None:
        idx = np.asarray(members)
        bw = devices.bw[np.ix_(idx, idx)]
        lat = devices.latency[np.ix_(idx, idx)]
        off = ~np.eye(r, dtype=bool)
        hit = (float(bw[off].min()), float(lat[off].max()))
        if links is not None:
            links[members] = hit
    return (r - 1) / r * nbytes / hit[0] + (r - 1) * hit[1]


def layer_options(cost_model, tables, name: str, settings: MemorySettings,
                  _cache: dict | None = None) -> LayerOptions:
    """:class:`LayerOptions` of layer ``name`` over ``tables.candidates[name]`` (module
    docstring).  Layers of repeated blocks share one computation through ``_cache``."""
    from explorer.engine.layerwise.plan import layer_content_key
    graph, devices = cost_model.graph, cost_model.devices
    layer = graph.layer(name)
    cands = tables.candidates[name]
    arrays = (tables.t_compute[name], tables.t_sync[name], tables.t_reduce.get(name))
    key = (layer_content_key(layer), layer.flops, cost_model.candidates_key(cands), settings,
           cost_model.needs_grad(name),
           tuple(None if a is None else hash(np.ascontiguousarray(a).tobytes()) for a in arrays))
    if _cache is not None and key in _cache:
        return _cache[key]
    C = len(cands)
    opts = settings.options()
    O = len(opts)
    pb, cb, db = cost_model.param_bytes, cost_model.copy_bytes, cost_model.dtype_bytes
    states = OPTIMIZER_STATES[settings.optimizer]
    tiles, red, owned, used = cost_model._stacked_all(layer, cands)
    vol = np.where(used, G.volume(owned), 0).astype(float)
    if layer.op == "input":
        # the model input: nothing to recompute or shard, every other option is refused
        act = (2 * vol * db).max(axis=1)     # as the plan's memory counts it
        t_mb = np.full((C, O), np.inf)
        t_mb[:, 0] = 0.0
        cats = np.zeros((C, O, 4))
        cats[:, :, 3] = act[:, None]
        zero = np.zeros((C, O))
        out = LayerOptions(opts, t_mb, zero, zero, cats[:, :, 3].copy(), cats, zero,
                           np.ones(C))
        if _cache is not None:
            _cache[key] = out
        return out
    partial = 0.0 if red is None else np.where(
        used & (red[..., 1] - red[..., 0] < (G.reduction_size(layer) or 0)),
        G.volume(tiles), 0).astype(float)
    in_el = np.zeros(vol.shape)
    for j in range(len(layer.in_shapes)):
        in_el += np.where(used, G.volume(G.input_regions(layer, j, tiles, red)), 0)
    pel = np.zeros(vol.shape)
    shards = G.param_shards(layer, tiles, red)
    for _, reg in shards.values():
        pel += np.where(used, G.volume(reg), 0)
    dev = np.full(used.shape, 0, dtype=np.int64)
    for i, c in enumerate(cands):
        dev[i, : c.total] = c.devices
    mbw = np.array([d.mem_bw for d in devices.devices])[dev]
    upd = np.where(used, UPDATE_PASSES * pb * pel / mbw, 0.0).max(axis=1)      # [C]
    tc = np.asarray(tables.t_compute[name], dtype=float)
    ts = np.asarray(tables.t_sync[name], dtype=float)
    tr = np.asarray(tables.t_reduce.get(name, np.zeros(C)), dtype=float)
    passes = 2.0 if cost_model.needs_grad(name) else 1.0
    fb = np.maximum(tc - upd, 0.0)                                                # fwd + bwd
    t_fwd = fb / 3.0 + tr / passes
    # replica groups of the weight shards and their collectives
    r = np.ones(C)
    rs_g, ag_w = np.zeros(C), np.zeros(C)
    nodes = cost_model._node_structure() if layer.params else None
    if nodes is not None:
        r, rs_g, ag_w = replica_loads(shards, used, dev, nodes, pb, cb if cb else pb)
    elif layer.params:
        links = {} if _cache is None else _cache.setdefault("links", {})
        r, rs_g, ag_w = _replica_loads_each(layer, cands, devices, pb, cb if cb else pb, links)
    t_mb, t_once = np.zeros((C, O)), np.zeros((C, O))
    static, actb = np.zeros((C, O)), np.zeros((C, O))
    cats = np.zeros((C, O, 4))
    trans = np.zeros((C, O))
    act_keep = db * (2 * vol + in_el + 2 * partial)            # [C, Dm]
    act_rc = db * in_el
    transient_rc = (db * (2 * vol + 2 * partial)).max(axis=1)
    for o, (rc, z) in enumerate(opts):
        sh = r[:, None]
        p_ = (pb + cb) * pel / (sh if z >= 3 else 1.0)
        g_ = pb * pel / (sh if z >= 2 else 1.0)
        s_ = states * pb * pel / (sh if z >= 1 else 1.0)
        a_ = act_rc if rc else act_keep
        tot = p_ + g_ + s_ + a_
        slot = tot.argmax(axis=1)
        ix = np.arange(C)
        cats[:, o] = np.stack([p_[ix, slot], g_[ix, slot], s_[ix, slot], a_[ix, slot]], axis=1)
        static[:, o] = cats[:, o, :3].sum(axis=1)
        actb[:, o] = cats[:, o, 3]
        t_mb[:, o] = fb + tr + (t_fwd if rc else 0.0)
        if z == 0:
            t_once[:, o] = upd + ts
        else:
            t_once[:, o] = upd / r
            if z == 1:
                t_once[:, o] += rs_g + ag_w
            elif z == 2:
                t_mb[:, o] += rs_g
                t_once[:, o] += ag_w
            else:
                t_mb[:, o] += 2 * ag_w + rs_g
            # a replica group of one has nothing to shard: ZeRO is the plain option there
            same = r <= 1
            t_mb[same, o] = np.inf
        wb_ = cb if cb else pb
        trans[:, o] = np.maximum(transient_rc if rc else 0.0,
                                 (wb_ * pel).max(axis=1) if z >= 3 else 0.0)
    out = LayerOptions(opts, t_mb, t_once, static, actb, cats, trans, r)
    if _cache is not None:
        _cache[key] = out
    return out


def replica_loads(shards: dict, used: np.ndarray, dev: np.ndarray, nodes, pb: float,
                  wb: float):
    """``(r, rs, ag)`` ``[C]`` for every candidate at once, on a two-level device graph
    (``nodes``: :meth:`~.costmodel.CostModel._node_structure`): the largest replica group
    ``r`` (devices holding the same non-empty weight shard, of two or more), and the most any
    device spends as the first member of its groups in ring reduce-scatters of the gradients
    (``pb`` bytes per element) and all-gathers of the working weights (``wb``) -
    :func:`_group_cost` summed per first device, exactly as the per-candidate loop of
    :func:`layer_options` adds them (one group per first device per parameter, parameters in
    order), over the stacked shard regions (``shards``: :func:`.geometry.param_shards` of
    the stacked boxes; ``used``/``dev`` ``[C, Dm]``) instead of one candidate at a time.

    A group's slowest link and largest latency are those of the kinds of pair it has: two
    members on one node (intra-node) and members on two nodes (inter-node)."""
    node_of, bw_in, bw_out, lat_in, lat_out = nodes
    C = used.shape[0]
    ci, slot = np.nonzero(used)                   # rows by candidate, slots ascending
    drow = dev[ci, slot]
    nrow = np.asarray(node_of)[drow]
    n_nodes = int(nrow.max()) + 1 if len(nrow) else 1
    r = np.ones(C)
    keys, rs_c, ag_c = [], [], []
    for _, reg in shards.values():
        rows = reg[ci, slot].reshape(len(ci), -1)
        code, span = ci.astype(np.int64), C
        for col in rows.T:                        # exact: each column ranked densely
            lo = int(col.min())
            present = np.zeros(int(col.max()) - lo + 1, dtype=np.int64)
            present[col - lo] = 1
            rank = np.cumsum(present) - 1
            k = int(rank[-1]) + 1
            span *= k
            code = code * k + rank[col - lo]
        if span >= 2 ** 62:                       # too many combinations for one integer
            code = np.concatenate([ci[:, None], rows], axis=1)
            _, inv, cnt = np.unique(code, axis=0, return_inverse=True, return_counts=True)
        else:
            _, inv, cnt = np.unique(code, return_inverse=True, return_counts=True)
        inv = inv.reshape(-1)
        order = np.argsort(inv, kind="stable")    # each group's rows, first member first
        starts = np.concatenate([[0], np.cumsum(cnt)[:-1]])
        first = order[starts]
        e = G.volume(reg[ci[first], slot[first]]).astype(np.float64)
        # distinct nodes per group: a pair on one node exists when fewer nodes than members
        gn = np.unique(inv.astype(np.int64) * n_nodes + nrow)
        spread = np.bincount(gn // n_nodes, minlength=len(cnt))
        big = (cnt > 1) & (e > 0)
        if not big.any():
            continue
        cnt_b, e_b, spread_b, first_b = cnt[big], e[big], spread[big], first[big]
        intra, inter = spread_b < cnt_b, spread_b > 1
        bw = np.where(intra & inter, min(bw_in, bw_out), np.where(inter, bw_out, bw_in))
        lat = np.where(intra & inter, max(lat_in, lat_out), np.where(inter, lat_out, lat_in))
        rr = cnt_b.astype(np.float64)
        cand = ci[first_b]
        np.maximum.at(r, cand, rr)
        keys.append(cand * (int(dev.max()) + 1) + drow[first_b])
        rs_c.append((rr - 1) / rr * (pb * e_b) / bw + (rr - 1) * lat)
        ag_c.append((rr - 1) / rr * (wb * e_b) / bw + (rr - 1) * lat)
    rs, ag = np.zeros(C), np.zeros(C)
    if keys:
        k = np.concatenate(keys)
        uk, kinv = np.unique(k, return_inverse=True)
        kinv = kinv.reshape(-1)
        owner = uk // (int(dev.max()) + 1)
        np.maximum.at(rs, owner, np.bincount(kinv, weights=np.concatenate(rs_c)))
        np.maximum.at(ag, owner, np.bincount(kinv, weights=np.concatenate(ag_c)))
    return r, rs, ag


def _replica_loads_each(layer, cands: list, devices, pb: float, wb: float, links: dict):
    """:func:`replica_loads` one candidate at a time, from each one's own shards (any device
    graph: each group's slowest link read off the bandwidth matrix)."""
    C = len(cands)
    r = np.ones(C)
    rs_g, ag_w = np.zeros(C), np.zeros(C)
    for i, c in enumerate(cands):
        _, _, groups = G.shard_summary(layer, c)
        big = [(e, m) for e, m in groups if len(m) > 1 and e > 0]
        if not big:
            continue
        r[i] = max(len(m) for _, m in big)
        # the groups of one configuration run in parallel; a device's groups in turn
        load_rs: dict = {}
        load_ag: dict = {}
        for e, m in big:
            devs = tuple(c.devices[k] for k in m)
            load_rs[devs[0]] = load_rs.get(devs[0], 0.0) + _group_cost(devices, devs, pb * e,
                                                                       links)
            load_ag[devs[0]] = load_ag.get(devs[0], 0.0) + _group_cost(devices, devs, wb * e,
                                                                       links)
        rs_g[i], ag_w[i] = max(load_rs.values()), max(load_ag.values())
    return r, rs_g, ag_w


def options_of(cost_model, tables, settings: MemorySettings, cache: dict | None = None) -> dict:
    """:func:`layer_options` of every layer (repeated layers computed once; ``cache`` shares
    them with another call on the same cost model)."""
    from explorer.engine.layerwise.plan import layer_content_key
    cache = {} if cache is None else cache
    graph, out, reps = cost_model.graph, {}, {}
    for n in tables.names:
        # what layer_options' own key holds, less the tables' arrays, which follow from it
        # (a layer's costs depend on its content, candidates and gradient flags): the layers
        # of repeated blocks take their first one's options without hashing their arrays
        layer = graph.layer(n)
        key = (layer_content_key(layer), layer.flops,
               cost_model.candidates_key(tables.candidates[n]), cost_model.needs_grad(n),
               cost_model.input_grads(n))
        rep = reps.setdefault(key, n)
        out[n] = out[rep] if rep != n else layer_options(cost_model, tables, n, settings, cache)
    return out


def transient(opts: dict, choice: dict, option: dict) -> float:
    """The largest transient of the plan (bytes on one device): a recomputed layer's output
    and gradient, or a ZeRO-3 layer's gathered weights, while that layer's backward runs."""
    return max((float(opts[n].trans[choice[n], option[n]]) for n in choice), default=0.0)


def plan_memory(cost_model, tables, choice: dict, option: dict, settings: MemorySettings,
                n_devices: int, offsets: dict | None = None, act_mult: dict | None = None,
                opts: dict | None = None) -> dict:
    """Bytes per device by category (``{category: [n_devices]}``, plus ``transient``) for a
    plan: each layer's candidate ``choice[n]`` and option ``option[n]``; ``offsets[n]`` shifts
    a layer's devices (a pipeline stage's group), ``act_mult[n]`` multiplies its activations
    (micro-batches in flight).  Exact per device (every device's own shards and boxes), not
    the per-layer maximum the search adds up."""
    graph = cost_model.graph
    pb, cb, db = cost_model.param_bytes, cost_model.copy_bytes, cost_model.dtype_bytes
    states = OPTIMIZER_STATES[settings.optimizer]
    out = {k: np.zeros(n_devices) for k in CATEGORIES}
    trans = np.zeros(n_devices)
    seen: dict = {}
    from explorer.engine.layerwise.plan import layer_content_key
    for n in tables.names:
        layer = graph.layer(n)
        cfg = tables.candidates[n][choice[n]]
        rc, z = settings.options()[option[n]] if opts is None else opts[n].options[option[n]]
        key = (layer_content_key(layer), cfg, rc, z)
        per = seen.get(key)
        if per is None:
            _, pel, groups = G.shard_summary(layer, cfg)
            pel = pel.astype(float)
            r = np.ones(cfg.total)
            for _, m in groups:
                for k in m:
                    r[k] = max(r[k], len(m))
            tiles, red = G.compute_boxes(layer, cfg)
            boxes = G.output_boxes(layer, cfg)
            vol = G.volume(boxes).astype(float)
            in_el = sum(G.volume(G.input_regions(layer, j, tiles, red)).astype(float)
                        for j in range(len(layer.in_shapes))) if layer.in_shapes else 0.0
            # as :func:`.plan.memory_per_device` counts (the model input's box twice)
            partial = 0.0 if red is None else G.volume(tiles).astype(float)
            act = db * (in_el if rc else 2 * vol + in_el + 2 * partial)
            tr = np.maximum(db * (2 * vol + 2 * partial) if rc else 0.0,
                            (cb or pb) * pel if z >= 3 else 0.0)
            per = seen[key] = ((pb + cb) * pel / (r if z >= 3 else 1.0),
                               pb * pel / (r if z >= 2 else 1.0),
                               states * pb * pel / (r if z >= 1 else 1.0),
                               np.broadcast_to(act, (cfg.total,)).astype(float),
                               np.broadcast_to(tr, (cfg.total,)).astype(float))
        devs = np.asarray(cfg.devices) + (offsets or {}).get(n, 0)
        mult = (act_mult or {}).get(n, 1.0)
        for k, arr in zip(CATEGORIES, per[:4]):
            np.add.at(out[k], devs, arr * (mult if k == "activations" else 1.0))
        np.maximum.at(trans, devs, per[4])
    out["transient"] = trans
    return {k: v.tolist() for k, v in out.items()}

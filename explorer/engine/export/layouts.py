"""Per-layer layouts: each layer's configuration as DTensor placements on one device mesh.

The N processes form one ``DeviceMesh`` whose dimensions are N's prime factors (4 -> (2, 2),
8 -> (2, 2, 2), 6 -> (2, 3)).  Any configuration whose degrees multiply to N then maps onto it:
each dimension letter takes mesh dimensions whose sizes multiply to its degree (n2 c4 on 8
devices: n on mesh dim 0, c on dims 1 and 2), and becomes a placement per mesh dimension:

=============  ===========================================  ==================================
letter          the layer's output                          its parameters
=============  ===========================================  ==================================
``n`` ``l``     ``Shard(axis)`` (sample / sequence axis)     ``Replicate`` (gradient: Partial,
                                                              summed when the step reads it)
``c``           ``Shard(feature axis)``                      ``Shard(0)`` (linear, conv),
                                                              ``Shard(1)`` (embedding)
``k``           ``Partial()`` (input ``Shard(feature)``)     ``Shard(1)``; the bias added on
                                                              one coordinate of the k dims
``e``           ``Shard(1)`` (input ``Shard(1)``: an          ``Shard(0)``: each rank holds its
                experts layer's experts)                     experts' weights
=============  ===========================================  ==================================

An experts layer (``x [n, E, C, in] @ W [E, in, out]``) computes on local shards of both
operands (``args``: their placements): ``e`` splits both on the experts, ``c`` the weight on
its output features (``Shard(2)``, output ``Shard(3)``, input whole); its weight is stored as it
reads it (``weights``).  DTensor's matmul would propagate one mesh dimension on the experts,
but not two (e4 on a 2 x 2 mesh), which local shards compute alike.

The exported program traces the model with ``torch.fx`` and wraps every layer's node: its
inputs are redistributed to the layer's placements (the plan's redistribution on each edge),
then a module layer (linear, embedding, norm, conv, or any module split on the sample only)
computes on its local shards with its local parameter shards, element-wise ops, attention,
pooling and experts compute on local shards, and every other op computes through DTensor's sharding
propagation, its output placements checked against the plan when it runs.

A layer on a subset of the devices gets a mesh of its own: a ``DeviceMesh`` over exactly those
ranks, shaped by the prime factors of their count (``spec["ranks"]``, ``spec["mesh"]``), with
its placements there; the other ranks do not compute it.  A tensor crossing from one mesh to
another is gathered on its source mesh and broadcast, then placed on the destination mesh (DTensor
redistributes within one mesh only).  What the meshes cannot express - a split on ``h``/``w``
(halos), a letter no rule computes, degrees that do not factor onto the layer's mesh - is
listed with its reason and computed replicated on the mesh dimensions it cannot use.
"""

from __future__ import annotations

from dataclasses import dataclass, field

ORDER = "nlckhw"


@dataclass(frozen=True)
class Deviation:
    """A layer the exported program computes in another form than the plan gives it."""

    layer: str
    planned: str
    exported: str
    reason: str


@dataclass
class LayoutPlan:
    """The mesh and each layer's placements (``specs``: fx node name -> spec dict) and the
    layers not computed as planned."""

    mesh: tuple
    specs: dict = field(default_factory=dict)
    deviations: list = field(default_factory=list)
    layers: int = 0
    #: (plan, exported, reason) where the plan's pipeline is not followed
    pipeline_notes: list = field(default_factory=list)


def factors(n: int) -> tuple:
    """n's prime factors, ascending (the mesh's shape)."""
    out, p = [], 2
    while n > 1:
        while n % p == 0:
            out.append(p)
            n //= p
        p += 1
    return tuple(out) or (1,)


def assign(deg: dict, shape: tuple) -> dict | None:
    """letter -> mesh dims whose sizes multiply to its degree (letters in ``ORDER``, each
    taking the lowest free dims that fit), or None when no assignment exists."""
    letters = sorted(deg, key=lambda k: (ORDER.index(k) if k in ORDER else 99, k))

    def go(i, free):
        if i == len(letters):
            return {}
        want = deg[letters[i]]

        def pick(j, prod, chosen):
            if prod == want:
                rest = go(i + 1, [d for d in free if d not in chosen])
                if rest is not None:
                    return {letters[i]: tuple(chosen), **rest}
                return None
            for m in range(j, len(free)):
                d = free[m]
                if want % (prod * shape[d]) == 0:
                    got = pick(m + 1, prod * shape[d], chosen + [d])
                    if got is not None:
                        return got
            return None
        return pick(0, 1, [])
    return go(0, list(range(len(shape))))


def _label(deg: dict) -> str:
    return " ".join(f"{k}{v}" for k, v in deg.items()) or "1"


def _norm_types():
    from torch import nn
    return tuple(t for t in (getattr(nn, "LayerNorm", None), getattr(nn, "RMSNorm", None))
                 if t is not None)


def module_kinds(graph, model) -> dict:
    """layer -> (module path, style letters it can take: {letter: style}) or (path, {}) with
    a reason in the third item when its module cannot carry a style."""
    from torch import nn
    modules = dict(model.named_modules())
    uses: dict = {}
    for la in graph.layers():
        if la.op != "input" and la.module:
            uses[la.module] = uses.get(la.module, 0) + 1
    out = {}
    for la in graph.layers():
        mod = modules.get(la.module) if la.module else None
        letters, why = {}, ""
        if la.op == "input":
            why = ("the exported program splits the input on its sample dimension over dp "
                   "only, whole on the tp ranks")
        elif la.op == "sdpa":
            why = ("attention follows its inputs, and the exported program hands it whole "
                   "q/k/v (torch 2.13's DTensor attention on CPU gathers split heads anyway)")
        elif mod is None or not la.params:
            why = ("it has no parameters of its own (it computes on what its inputs bring, "
                   "and the exported program hands it whole tensors)")
        elif uses.get(la.module, 0) > 1:
            why = (f"its module {la.module} is called more than once, and a parallel style "
                   f"applies to a module, not to one call of it")
        elif not set(la.params) <= set(dict(mod.named_parameters(recurse=False))):
            other = sorted(set(la.params) - set(dict(mod.named_parameters(recurse=False))))
            why = (f"it uses parameter(s) {other} that are not module {la.module}'s own, and "
                   f"PyTorch's styles shard one module's parameters")
        elif isinstance(mod, nn.Linear) and la.op == "linear":
            letters = {"c": "colwise", "k": "rowwise", "l": "sequence"}
        elif isinstance(mod, nn.Embedding) and la.op == "embedding":
            letters = {"c": "colwise"}
        elif isinstance(mod, _norm_types()) and la.op == "norm":
            letters = {"l": "sequence"}
        else:
            why = (f"no style of torch.distributed.tensor.parallel computes a "
                   f"{type(mod).__name__} split this way (ColwiseParallel/RowwiseParallel: "
                   f"nn.Linear and nn.Embedding; SequenceParallel: norms and linears on l)")
        out[la.name] = (la.module, letters, why)
    return out


def fx_nodes(model) -> dict | None:
    """fx node name -> (op, target) of ``model`` traced as the program traces it, or None
    when ``torch.fx`` cannot trace it."""
    import torch.fx

    from explorer.engine.core import capture
    try:
        with capture.TRACE_LOCK:                       # fx tracing is not thread-safe
            gm = torch.fx.symbolic_trace(model)
    except Exception:                                     # noqa: BLE001 - any trace error
        return None
    return {nd.name: (nd.op, nd.target) for nd in gm.graph.nodes}


def _rules(la, mod, node, own: bool) -> tuple:
    """``(mode, {letter: (out placement, in placement or None, {param: placement})},
    {letter: reason})`` for layer ``la``: which letters the program computes as planned."""
    from torch import nn
    axes = list(la.axes)
    last = len(axes) - 1
    out_axis = {k: i for i, k in enumerate(axes) if k not in ("-",)}
    ok, why = {}, {}
    op, kind = la.op, node[0]
    if op in ("input", "param") or kind in ("placeholder", "get_attr"):
        for k, i in out_axis.items():
            ok[k] = (f"S{i}", None, {})
        return "value", ok, why
    if kind == "call_module" and mod is not None and own and la.params:
        if isinstance(mod, nn.Linear) and op == "linear":
            for k, i in out_axis.items():
                if k == "c" and i == last:
                    ok[k] = (f"S{i}", "R", {"weight": "S0", "bias": "S0"})
                elif k != "c":
                    ok[k] = (f"S{i}", f"S{i}", {})
            ok["k"] = ("P", f"S{last}", {"weight": "S1", "bias": "mask"})
            return "module", ok, why
        if isinstance(mod, nn.Embedding) and op == "embedding":
            for k, i in out_axis.items():
                ok[k] = ((f"S{i}", "R", {"weight": "S1"}) if k == "c" and i == last
                         else (f"S{i}", f"S{i}", {}))
            return "module", ok, why
        if isinstance(mod, _norm_types()) and op == "norm":
            for k, i in out_axis.items():
                if i != last:
                    ok[k] = (f"S{i}", f"S{i}", {})
            why["c"] = "a norm split on the axis it normalises needs its statistics reduced"
            return "module", ok, why
        if (isinstance(mod, (nn.Conv1d, nn.Conv2d)) and op in ("conv", "conv1d", "conv2d")
                and mod.groups == 1):
            for k, i in out_axis.items():
                if k == "n":
                    ok[k] = ("S0", "S0", {})
                elif k == "c" and i == 1:
                    ok[k] = ("S1", "R", {"weight": "S0", "bias": "S0"})
            ok["k"] = ("P", "S1", {"weight": "S1", "bias": "mask"})
            for k in ("h", "w"):
                why[k] = (f"a convolution split on {k} needs halos from its neighbours, which "
                          f"DTensor does not exchange")
            return "module", ok, why
        if "n" in out_axis:
            ok["n"] = (f"S{out_axis['n']}", f"S{out_axis['n']}", {})
        return "module", ok, why
    if la.params and not own:
        pass  # its parameters stay replicated: letters that would shard them are not rules
    if op == "eltwise":
        for k, i in out_axis.items():
            ok[k] = (f"S{i}", None, {})
        return ("follow" if la.params else "local"), ok, why
    if op == "sdpa":
        for k, i in out_axis.items():
            if i in (0, 1):
                ok[k] = (f"S{i}", None, {})
        why["l"] = "attention split on the sequence needs every key on every query shard"
        return "local", ok, why
    if op == "experts":
        # x [n, E, C, in] @ W [E, in, out] on local shards: the experts (e) split both
        # operands alike, so each rank multiplies its experts' tokens by its experts'
        # weights; c splits the weight's output features, n the samples (weight whole)
        rule = {"n": ("S0", "S0", {"weight": "R"}), "e": ("S1", "S1", {"weight": "S0"}),
                "c": ("S3", "R", {"weight": "S2"})}
        return "local", {k: v for k, v in rule.items() if k in out_axis}, why
    if op in ("pool", "adaptive_pool"):
        for k, i in out_axis.items():
            if i in (0, 1):
                ok[k] = (f"S{i}", None, {})
        for k in ("h", "w"):
            why[k] = f"pooling split on {k} needs halos from its neighbours"
        return "local", ok, why
    for k, i in out_axis.items():
        ok[k] = (f"S{i}", None, {})
    return "follow", ok, why


def zero_form(spec: dict, zero: int, planned: bool, has_params: bool,
              submeshes: bool = False) -> str | None:
    """How a layer's ZeRO stage is exported: ``None`` when ``fully_shard`` computes it as
    planned (``spec`` then carries ``fsdp``: 3 resharding after forward, 2 keeping the
    gathered weights until the backward, PyTorch's SHARD_GRAD_OP), else the reason it
    is not.  ``planned``: the layer's configuration itself is computed as planned;
    ``has_params``: the layer has parameters (without, there is nothing to shard);
    ``submeshes``: some layer of the program runs on a sub-mesh."""
    params = spec.get("params")
    if not zero or not has_params:
        return None                   # nothing to shard: as planned
    if zero == 1:
        return ("ZeRO-1 shards only the optimizer's state, which fully_shard has no mode for, "
                "and the program's SGD keeps none: its parameters and gradients are "
                "replicated, as ZeRO-1 keeps them")
    if spec["mode"] != "module" or params is None:
        return ("its parameters are not one module's own, and fully_shard shards a module's "
                "parameters: they stay replicated")
    if not planned:
        return "its configuration is not computed as planned, so its parameters stay replicated"
    if submeshes:
        return ("fully_shard's hooks communicate in the backward pass outside the order the "
                "program keeps between its meshes, so with sub-meshes its parameters stay "
                "replicated")
    if any(c != "R" for codes in params.values() for c in codes):
        return ("it also shards its parameters (tensor parallel), and fully_shard over the "
                "replicas of a sharded parameter is not expressed here: its shards stay "
                "replicated on their replica group")
    spec["fsdp"] = 3 if zero >= 3 else 2
    return None


def plan_layouts(graph, configs: dict, n: int, model,
                 savings: dict | None = None) -> LayoutPlan | None:
    """Each layer's placements on the prime-factor mesh of ``n`` devices, or None when the
    model cannot be traced by ``torch.fx`` into nodes named as the layers.  ``savings``:
    layer -> (recompute, ZeRO stage): a recomputed layer's spec carries ``recompute``
    (``torch.utils.checkpoint``), a ZeRO layer's ``fsdp`` where :func:`zero_form` allows."""
    nodes = fx_nodes(model)
    layers = graph.layers()
    if nodes is None or any(la.name not in nodes for la in layers):
        return None
    modules = dict(model.named_modules())
    uses: dict = {}
    for name, (kind, target) in nodes.items():
        if kind == "call_module":
            uses[target] = uses.get(target, 0) + 1
    shape = factors(n)
    lp = LayoutPlan(shape, layers=len(layers))
    everyone = list(range(n))
    submeshes = any(sorted(int(d) for d in configs[la.name][1]) != everyone for la in layers)
    readers: dict = {}                       # parameter -> how many layers read it
    for la in layers:
        for pname in la.params:
            readers[pname] = readers.get(pname, 0) + 1
    for la in layers:
        want, devices = configs[la.name]
        ranks = sorted(int(d) for d in devices)
        sub = ranks != everyone
        lshape = factors(len(ranks)) if sub else shape      # the layer's own mesh
        node = nodes[la.name]
        mod = modules.get(node[1]) if node[0] == "call_module" else None
        own = (mod is not None and uses.get(node[1], 0) == 1
               and set(la.params) <= {k for k, _ in mod.named_parameters()})
        mode, ok, why = _rules(la, mod, node, own)
        reasons, keep = [], {}
        for k, d in want.items():
            if k not in ok:
                reasons.append(why.get(k) or f"no rule computes a {la.op} split on {k} "
                                              f"(module {la.module or '-'})")
                continue
            keep[k] = d
        if keep and assign(keep, lshape) is None:
            reasons.append(f"its degrees ({_label(keep)}) do not factor onto the mesh "
                           f"{lshape}")
            keep = {}
        spec = {"mode": mode, "shape": list(la.out_shape), "out": ["R"] * len(lshape)}
        if sub:
            spec["ranks"], spec["mesh"] = ranks, list(lshape)
        dims = assign(keep, lshape) or {}
        if la.op == "experts" and mode == "local":
            spec["args"] = [["R"] * len(lshape), ["R"] * len(lshape)]     # x, its weight
        if mode == "module":
            spec["in"] = ["R"] * len(lshape)
            spec["params"] = {}
            if mod is not None:
                for pname, p in mod.named_parameters():
                    spec["params"][pname] = ["R"] * len(lshape)
        for k, mdims in dims.items():
            outp, inp, params = ok[k]
            for d in mdims:
                spec["out"][d] = outp
                if mode == "module":
                    spec["in"][d] = inp
                    for pname, pl in params.items():
                        if pname in spec["params"]:
                            spec["params"][pname][d] = pl
                elif "args" in spec:
                    spec["args"][0][d], spec["args"][1][d] = inp, params["weight"]
        if "args" in spec:
            # the weight is stored as the layer reads it (each rank holds its experts) when
            # no other layer reads it; otherwise it stays whole and is split when read
            for pname in la.params:
                if readers.get(pname) == 1:
                    spec["weights"] = {pname: list(spec["args"][1])}
        rc, zero = (savings or {}).get(la.name, (False, 0))
        if rc and submeshes:
            reasons.append("recomputation would run its communication again in the backward "
                           "pass, outside the order the program keeps between its meshes: "
                           "with sub-meshes it is computed once and kept")
        elif rc:
            spec["recompute"] = True
        why_zero = zero_form(spec, int(zero), not reasons, bool(la.params), submeshes)
        planned = _label(want) + (f" on {ranks}" if sub else "")
        where = f"ranks {ranks}" if sub else "every rank"
        if reasons:
            lp.deviations.append(Deviation(
                la.name, planned + (" recomputed" if rc and submeshes else "")
                + (f" ZeRO-{zero}" if why_zero else ""),
                (_label(keep) + (f" on {ranks}" if sub else "")
                 + ", replicated on the rest of the mesh" if keep
                 else f"whole on {where}"), "; ".join(reasons)))
        elif why_zero:
            lp.deviations.append(Deviation(la.name, f"{planned} ZeRO-{zero}",
                                           f"{planned}, parameters replicated", why_zero))
        lp.specs[la.name] = spec
    return lp

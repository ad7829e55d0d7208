"""The strategies practitioners use, OptCNN's baselines (Section 6): data, model and OWT.

* **data** – every layer split on the sample dimension over all devices.
* **model** – every layer's channels (so its parameters) split equally over all devices
  (Krizhevsky 2014); where a layer has fewer channels than devices, the largest degree that
  divides both.
* **owt** – "one weird trick": data parallelism for convolution/pooling layers and everything
  before the first fully-connected layer, model parallelism from there on.
* **megatron** – Megatron-LM's tensor parallelism (Shoeybi et al. 2019) with sequence
  parallelism (Korthikanti et al. 2022), tensor-parallel degree ``tp`` × data-parallel degree
  ``dp = devices / tp``: a linear layer that feeds (through element-wise layers or the
  attention) another linear layer or an attention is column-parallel (``n=dp, c=tp``:
  PyTorch's ``ColwiseParallel``), attention splits its heads (``c=tp``), and a linear fed by a
  column-parallel one is row-parallel (``n=dp, k=tp``: ``RowwiseParallel``, its partial sums
  reduce-scattered along the sequence); the other layers with a sequence axis (norms,
  residual adds, embeddings: ``SequenceParallel``) split it (``n=dp, l=tp``), the rest
  (pooled heads, classifiers) are data-parallel over all devices.  Column vs row is read off
  the graph's structure, not layer names.  Mixture-of-experts layers (an expert axis ``e``)
  use expert parallelism as Megatron-Core does with an expert tensor-parallel size of 1: the
  experts split over ``ep`` devices (:func:`default_ep`), the samples over the rest.

Each is costed with the same tables as the search, so objectives are comparable.  Pinned
layers keep their pin (cheapest candidate that meets it).
"""

from __future__ import annotations

import time

from explorer.errors import InfeasiblePlan
from explorer.engine.core import geometry as G
from explorer.engine.search.options import ClassicOptions, MegatronOptions, check_ep, check_tp
from explorer.engine.layerwise.result import layerwise_result
from explorer.engine.search.result import Result

STRATEGIES = ("data", "model", "owt", "megatron")


def search(problem, pins=None, options: ClassicOptions | None = None) -> Result:
    """Build the strategy named ``options.strategy`` (data | model | owt), or Megatron's
    given :class:`MegatronOptions`."""
    if isinstance(options, MegatronOptions):
        return megatron(problem, pins, options)
    strategy = (options or ClassicOptions()).strategy
    graph, cost_model = problem.layer_graph(), problem.cost_model()
    devices = cost_model.devices
    t0 = time.perf_counter()
    tables = cost_model.tables(pins)
    pinned = {p.layer for p in (pins or [])}
    n = devices.n
    names = tables.names
    first_fc = next((i for i, nm in enumerate(names)
                     if graph.layer(nm).op in ("linear", "lstm_cell", "embedding", "matmul",
                                               "sdpa")), len(names))
    choice = {}
    for idx, nm in enumerate(names):
        cands = tables.candidates[nm]
        if nm in pinned:
            cost = tables.node_cost(nm)
            choice[nm] = int(cost.argmin())
            continue
        mode = strategy
        if strategy == "owt":
            mode = "data" if idx < first_fc else "model"
        layer = graph.layer(nm)
        if mode == "data":
            want = [i for i, c in enumerate(cands) if c.deg("n") == n and c.total == n]
            if not want:
                if layer.op == "input" or "n" not in layer.dims:
                    want = [0]
                else:
                    raise InfeasiblePlan(
                        f"data parallelism needs the batch ({graph.batch}) split across {n} "
                        f"devices, but layer {nm} (output {list(layer.out_shape)}) cannot be: "
                        f"choose a batch divisible by {n}")
        else:
            # model parallelism: largest channel degree, no other dimension split
            only_c = [i for i, c in enumerate(cands)
                      if all(v == 1 for k, v in c.degrees if k != "c")]
            best = max(cands[i].deg("c") for i in only_c)
            want = [i for i in only_c if cands[i].deg("c") == best]
        choice[nm] = want[0]
    return layerwise_result(strategy, graph, devices, cost_model, tables, choice, [],
                            {"strategy": strategy}, time.perf_counter() - t0, pins)


# --------------------------------------------------------------------------------------------
# Megatron-LM: tensor x data (x sequence) parallelism
# --------------------------------------------------------------------------------------------

#: layers between a column-parallel linear and its row-parallel partner that keep the split
#: (activations, SwiGLU's product) and the attention's own ops, split by heads
_PASS = ("eltwise",)
_HEADS = ("sdpa", "matmul", "softmax")


def megatron_roles(graph) -> dict:
    """``{layer: "column" | "row" | "other"}`` read off the graph's structure.

    In topological order: a linear fed (directly or through element-wise / attention layers)
    by a column-split layer is ``row``; a linear whose output reaches, through such layers,
    another linear or an attention is ``column``; attention (``sdpa``) is ``column`` (its heads
    split), and the element-wise / attention layers fed by a column-split layer too.
    Everything else is ``other``.
    """
    def reaches(name):
        stack, seen = [e.dst for e in graph.out_edges(name)], set()
        while stack:
            d = stack.pop()
            if d in seen:
                continue
            seen.add(d)
            op = graph.layer(d).op
            if op in ("linear", "sdpa"):
                return True
            if op in _PASS + _HEADS:
                stack.extend(e.dst for e in graph.out_edges(d))
        return False

    roles, split = {}, set()
    for name in graph.names():
        layer = graph.layer(name)
        fed = any(e.src in split for e in graph.in_edges(name))
        role = "other"
        if layer.op == "linear":
            if fed and G.reduction_size(layer) is not None:
                role = "row"
            elif reaches(name):
                role = "column"
        elif layer.op == "sdpa" or (fed and layer.op in _PASS + _HEADS):
            role = "column"
        if role == "column":
            split.add(name)
        roles[name] = role
    return roles


def kv_heads(graph, layer) -> int:
    """How many key heads an attention layer reads: its heads, or fewer under grouped-query
    attention, where the key's edge repeats each key head over a group of query heads
    (``expand``, ``repeat_interleave``, ``enable_gqa``): the distinct regions of the key's
    producer that the attention's single heads need."""
    heads = layer.size("c")
    edge = next((e for e in graph.in_edges(layer.name) if e.index == 1), None)
    if edge is None:
        return heads
    ax = layer.axis_of("c")
    boxes = G.full_box(layer.out_shape, (heads,))
    boxes[:, ax, 0] = range(heads)
    boxes[:, ax, 1] = boxes[:, ax, 0] + 1
    regions = G.edge_regions(graph, edge, boxes)
    return len({r.tobytes() for r in regions})


def default_tp(graph, n_devices: int) -> int:
    """The largest divisor of the device count that divides every attention's head count
    and key/value head count (:func:`kv_heads`; Megatron-LM splits the key/value groups
    with the query heads), all devices when the model has no attention."""
    heads = [h for la in graph.layers() if la.op == "sdpa" and "c" in la.dims
             for h in (la.size("c"), kv_heads(graph, la))]
    return max(d for d in range(1, n_devices + 1)
               if n_devices % d == 0 and all(h % d == 0 for h in heads))


def default_ep(graph, n_devices: int) -> int:
    """Megatron's expert-parallel degree: the largest divisor of the device count that
    divides every experts layer's expert count (1 when the model has none)."""
    experts = [la.size("e") for la in graph.layers() if "e" in la.dims]
    return max(d for d in range(1, n_devices + 1)
               if n_devices % d == 0 and all(e % d == 0 for e in experts))


def _find(cands, want: dict, index: dict | None = None):
    """Index of the candidate with exactly the degrees ``want`` (the others 1), on as many
    devices as they multiply to, or ``None``.  ``index`` memoises each candidate list's
    ``{degrees other than 1: first index}`` (lists are shared by layers of one shape), so a
    model of thousands of layers looks each up in one step instead of a scan."""
    if index is None:
        index = {}
    hit = index.get(id(cands))
    if hit is None or hit[0] is not cands:
        table: dict = {}
        for i, c in enumerate(cands):
            table.setdefault(tuple(sorted((k, v) for k, v in c.degrees if v != 1)), i)
        hit = index[id(cands)] = (cands, table)
    return hit[1].get(tuple(sorted((k, v) for k, v in want.items() if v != 1)))


def megatron(problem, pins=None, options: MegatronOptions | None = None) -> Result:
    """Megatron-LM's plan for ``options.tp`` (see the module docstring).  A layer whose
    intended configuration does not exist (a dimension smaller than its degree, a batch
    ``dp`` does not divide) takes the next of: sequence-parallel, data-parallel over all
    devices, data-parallel over ``dp``, the cheapest candidate; ``info["fallback"]`` lists
    them.  Pinned layers keep the cheapest configuration that meets their pin."""
    options = options or MegatronOptions()
    graph, cost_model = problem.layer_graph(), problem.cost_model()
    devices = cost_model.devices
    t0 = time.perf_counter()
    _degrees(graph, devices.n, options)              # bad degrees refused before any table
    tables = cost_model.tables(pins)
    choice, info = megatron_choice(graph, tables, devices.n, options,
                                   {p.layer for p in (pins or [])})
    return layerwise_result("megatron", graph, devices, cost_model, tables, choice, [], info,
                            time.perf_counter() - t0, pins)


def megatron_choice(graph, tables, n: int, options: MegatronOptions, pinned=()) -> tuple:
    """``(choice, info)``: Megatron's candidate index per layer of ``tables`` (node costs are
    enough: :meth:`~.costmodel.CostModel.node_tables`) on ``n`` devices, and its ``info``
    (tp, dp, roles, fallbacks, ep)."""
    tp, ep = _degrees(graph, n, options)
    dp = n // tp
    roles = megatron_roles(graph)
    want_of = {"column": {"n": dp, "c": tp}, "row": {"n": dp, G.REDUCE: tp}}
    choice, fallback, index = {}, {}, {}
    for nm in tables.names:
        cands = tables.candidates[nm]
        if nm in pinned:
            choice[nm] = int(tables.node_cost(nm).argmin())
            continue
        layer = graph.layer(nm)
        if roles[nm] in want_of:
            intended = want_of[roles[nm]]
        elif "e" in layer.dims:         # experts (and their SwiGLU product): expert-parallel
            intended = {"n": n // ep, "e": ep}
        else:               # sequence-parallel where there is a sequence, else data-parallel
            intended = {"n": dp, "l": tp} if "l" in layer.dims else {"n": n}
        pick = None
        for want in (intended, {"n": dp, "l": tp}, {"n": n}, {"n": dp}):
            pick = _find(cands, want, index)
            if pick is not None:
                break
        if pick is None:
            pick = int(tables.node_cost(nm).argmin())
        if pick != _find(cands, intended, index):
            fallback[nm] = cands[pick].label()
        choice[nm] = pick
    counts = {r: sum(1 for v in roles.values() if v == r) for r in ("column", "row", "other")}
    info = {"strategy": "megatron", "tp": tp, "dp": dp, "roles": counts,
            "fallback": fallback}
    if any("e" in graph.layer(nm).dims for nm in tables.names):
        info["ep"] = ep
    return choice, info


def _degrees(graph, n: int, options: MegatronOptions) -> tuple:
    """``(tp, ep)`` for ``n`` devices: the options' or the defaults, checked."""
    tp = options.tp if options.tp is not None else default_tp(graph, n)
    check_tp(tp, n)
    if options.ep is not None:
        check_ep(options.ep, n, [la.size("e") for la in graph.layers() if "e" in la.dims])
    return tp, (options.ep if options.ep is not None else default_ep(graph, n))

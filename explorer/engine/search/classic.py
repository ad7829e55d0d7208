"""The strategies practitioners use, OptCNN's baselines (Section 6): data, model and OWT.

* **data** – every layer split on the sample dimension over all devices.
* **model** – every layer's channels (so its parameters) split equally over all devices
  (Krizhevsky 2014); where a layer has fewer channels than devices, the largest degree that
  divides both.
* **owt** – "one weird trick": data parallelism for convolution/pooling layers and everything
  before the first fully-connected layer, model parallelism from there on.

Each is costed with the same tables as the search, so objectives are comparable.  Pinned
layers keep their pin (cheapest candidate that meets it).
"""

from __future__ import annotations

import time

from ...errors import InfeasiblePlan
from .options import ClassicOptions
from .result import Result, layerwise_result

STRATEGIES = ("data", "model", "owt")


def search(problem, pins=None, options: ClassicOptions | None = None) -> Result:
    """Build the strategy named ``options.strategy`` (data | model | owt)."""
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

"""The Learn page's worked examples from the papers (:mod:`explorer.engine.lessons`), on the
request's model or on the small problems the page's controls describe."""

from __future__ import annotations

from explorer.engine.search.request import Request
from explorer.errors import ExplorerError
from explorer.service.captures import cost_model_for, graph_for, opgraph_for, placement_graph_for
from explorer.service.results import result

__all__ = ["learn_elimination", "learn_dense", "learn_conv1d", "learn_orders", "learn_recursion",
           "learn_pipeline"]


def learn_elimination(req: Request) -> dict:
    """OptCNN Figures 5-6 on the request's model: every node and edge elimination of the
    optimal search with equations 2 and 3 evaluated at the plan's configurations."""
    from explorer.engine.lessons import elimination_steps
    res = result(req, "optcnn")
    out = elimination_steps(res.tables, res.trace, res.choice)
    out["request"] = req.to_dict()
    return out


def learn_dense(req: Request, layer: str | None = None) -> dict:
    """OptCNN Section 3 (Figure 2): the request's first fully-connected layer (or ``layer``)
    under data against channel parallelism on ``req.devices`` devices."""
    from explorer.engine.lessons import dense_layer
    g = graph_for(req)
    if layer is None:
        layer = next((n for n in g.names() if g.layer(n).op == "linear"), None)
        if layer is None:
            raise ExplorerError(f"{req.model} has no fully-connected layer")
    try:
        return dense_layer(g, cost_model_for(req).tables(), layer, req.devices)
    except ValueError as exc:
        raise ExplorerError(str(exc)) from None


def learn_conv1d(batch: int, ci: int, co: int, length: int, window: int, workers: int) -> dict:
    """Tofu Figures 1-3: conv1d's strategies found by the interval analysis."""
    from explorer.engine.lessons import conv1d_strategies
    try:
        return conv1d_strategies(int(batch), int(ci), int(co), int(length), int(window),
                                 int(workers))
    except (ValueError, TypeError) as exc:
        raise ExplorerError(str(exc)) from None


def learn_orders(chains: int, length: int, devices: int) -> dict:
    """Celeritas Figure 3: M-TOPO, DFS-TOPO and CPD-TOPO on parallel chains, and fusion."""
    from explorer.engine.lessons import topo_orders
    try:
        return topo_orders(int(chains), int(length), int(devices))
    except (ValueError, TypeError) as exc:
        raise ExplorerError(str(exc)) from None



def learn_recursion(req: Request) -> dict:
    """Tofu Section 5.2 (Figure 6) on the request's model: Tofu's plan over ``req.devices``
    workers replayed step by step - each step's worker groups, the cut it chose and the bytes
    it added (the one result cache: the same plan as the Tofu page's)."""
    from explorer.engine.lessons import tofu_recursion
    res = result(req, "tofu")
    out = tofu_recursion(res.plan, opgraph_for(req))
    out["request"] = req.to_dict()
    return out


def learn_pipeline(req: Request) -> dict:
    """Celeritas Figure 2 on the request's model: Standard Evaluation, CPD-TOPO, Optimal
    Operation Fusion and Adjusting Placement, each with its numbers, from Celeritas as
    published (``celeritas-paper``), then our Celeritas' simulated refinement; both plans
    from the one result cache (the Tables tab's), on the operator graph the placer saw."""
    from explorer.engine.lessons import celeritas_pipeline
    out = celeritas_pipeline(placement_graph_for(req), result(req, "celeritas-paper").plan,
                             result(req, "celeritas").plan)
    out["request"] = req.to_dict()
    return out

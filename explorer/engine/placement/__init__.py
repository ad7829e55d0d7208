"""Device placement of operator graphs under memory limits (Celeritas, Xu et al.).

Pipeline: :mod:`.estimate` (Standard Evaluation) -> :class:`.placement_graph.PlacementGraph` ->
:mod:`.order` (m-TOPO / DFS-TOPO / CPD-TOPO) -> :mod:`.fusion` (optimal operation fusion) ->
:mod:`.place` (Order-Place, Adjusting Placement) -> :mod:`.refine` (simulated refinement,
``celeritas`` only) or :mod:`.heuristics` (m-TOPO, m-ETF, m-SCT, METIS, single) -> :mod:`.simulator` (one judge for all) -> :class:`.result.PlacementPlan`; :mod:`.memory` is the
one liveness rule behind the simulator's peak and every placer's memory budget.  The public entry point is
:func:`explorer.engine.placement.celeritas.search` (and
:func:`explorer.engine.placement.placers.search` for the other placers).
"""

from explorer.engine.placement.placement_graph import PlacementGraph, from_networkx
from explorer.engine.placement.result import PlacementPlan
from explorer.engine.placement.simulator import SimResult, simulate

__all__ = ["PlacementGraph", "PlacementPlan", "SimResult", "from_networkx", "simulate"]

"""Device placement of operator graphs under memory limits (Celeritas, Xu et al.).

Pipeline: :mod:`.estimate` (Standard Evaluation) -> :class:`.graph.PlacementGraph` ->
:mod:`.order` (m-TOPO / DFS-TOPO / CPD-TOPO) -> :mod:`.fusion` (optimal operation fusion) ->
:mod:`.place` (Order-Place, Adjusting Placement) -> :mod:`.refine` (simulated refinement,
``celeritas`` only) or :mod:`.baselines` -> :mod:`.simulator` (one judge for all) -> :class:`.result.PlacementResult`.  The public entry point is
:func:`explorer.engine.search.celeritas.search`.
"""

from .graph import PlacementGraph, from_networkx
from .result import PlacementResult
from .simulator import SimResult, simulate

__all__ = ["PlacementGraph", "PlacementResult", "SimResult", "from_networkx", "simulate"]

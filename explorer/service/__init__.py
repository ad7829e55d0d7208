"""The application service: what the app and the command line call.

Requests in, JSON-able results out, with caches.  Views never touch graphs or cost models
directly; they send a :class:`Request` (a plain dict in a ``dcc.Store``) and get dicts back.
Split by concern:

* :mod:`.cache` — the LRUs whose values are built once even when many callbacks ask;
* :mod:`.captures` — layer graph, cost model, operator graph, placers' graph, the Problem;
* :mod:`.results` — running a method, with the one result cache;
* :mod:`.layerwise`, :mod:`.partitions` (Tofu), :mod:`.placements` — what each family's page shows;
* :mod:`.learn` — the Learn page's worked examples;
* :mod:`.execution` — plan files, export, and the one run path;
* :mod:`.ranking` — one comparison across the families, and the ranking check: every method's
  plan run, predicted against measured;
* :mod:`.calibration` — which costs a plan rests on, calibrating ``local``.

Imported graphs and cost models are cached per request, so re-running a search after a pin
only recomputes the pinned layers' tables.
"""

from __future__ import annotations

from explorer.engine.search.request import Request
from explorer.service.cache import clear_all as clear_caches
from explorer.service.calibration import calibrate_local, cost_model_info
from explorer.service.captures import (
    cost_model_for,
    devices_for,
    graph_for,
    opgraph_for,
    parse_model_args,
    placement_graph_for,
    problem_for,
    summary,
)
from explorer.service.layerwise import (
    candidates,
    compare,
    comparison,
    comparison_baselines,
    keep_trace_steps,
    layer_info,
    plan_changes,
    scaling,
    search,
    tiles,
    trace_counts,
    trace_length,
    trace_of,
)
from explorer.service.learn import (
    learn_conv1d,
    learn_dense,
    learn_elimination,
    learn_orders,
    learn_pipeline,
    learn_recursion,
)
from explorer.service.placements import (
    placement,
    placement_compare,
    placement_pin_rows,
    placement_pins,
    placement_structure,
)
from explorer.service.ranking import DEFAULT_METHODS as RANK_METHODS
from explorer.service.ranking import all_methods, compare_all, rank, remeasure
from explorer.service.results import family, methods, result, run_method
from explorer.service.execution import (
    export,
    export_note,
    export_preview,
    placement_runs,
    plan_file,
    run_placement,
    run_plan,
    run_tofu,
    runs,
)
from explorer.service.partitions import tofu, tofu_compare, tofu_strip

__all__ = [
    "Request", "clear_caches", "calibrate_local", "cost_model_info", "cost_model_for",
    "devices_for", "graph_for", "opgraph_for", "parse_model_args", "placement_graph_for",
    "problem_for", "summary", "candidates", "compare", "comparison", "comparison_baselines",
    "keep_trace_steps", "layer_info", "plan_changes", "scaling", "search", "tiles",
    "trace_counts", "trace_length", "trace_of", "learn_conv1d", "learn_dense",
    "learn_elimination", "learn_orders", "learn_pipeline", "learn_recursion", "placement", "placement_compare",
    "placement_pin_rows", "placement_pins", "placement_structure", "family", "methods",
    "result", "run_method", "export", "export_note", "export_preview", "placement_runs", "plan_file",
    "run_placement", "run_plan", "run_tofu", "runs", "tofu", "tofu_compare", "tofu_strip",
    "rank",
    "RANK_METHODS",
    "compare_all",
    "remeasure",
    "all_methods",
]

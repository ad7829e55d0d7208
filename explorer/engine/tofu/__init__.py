"""Tofu (Wang et al., EuroSys 2019): every tensor of the training step partitioned across all
workers by recursive partitioning over operator descriptions.

:mod:`.tdl` (the Tensor Description Language, interval analysis, the aten descriptions) ->
:mod:`.coarsen` (coalesced tensor classes, operator groups, templates) -> :mod:`.partition`
(the recursive DP, link levels, the baselines) -> :class:`.plan.TofuPlan` (and its execution
plan); :func:`.search.search` is the registry's entry.
"""

"""Tofu: coarsening and recursive partitioning of the forward+backward graph (EuroSys 2019, §5).

Every tensor of a training step is partitioned across all workers to cut per-worker memory;
the objective is the total communication.  Pipeline:

1. **Describe** every operator of the joint graph (:mod:`explorer.engine.tofu.tdl.aten`); interval
   analysis of the description gives its partition-n-reduce strategies (split an output
   coordinate, or split a reduction variable and sum the partial outputs).
2. **Coarsen** (Section 5.1): tensors that must share a partition are *coalesced* into one
   class (input and output of element-wise ops, the same tensor across unrolled time steps of
   a module, a weight with its update); a forward op and its backward ops form an operator
   group, a tensor class and its gradient's class a tensor group.  Ops of different time steps
   of one module are merged into one *template* that must use one strategy.
3. **Recursive partitioning** (Section 5.2): factor k = k_1·k_2·… (k_i ≥ k_i+1); step i splits
   every worker group of the previous step into k_i, choosing for every tensor class one axis
   (the same choice for all groups, "apply the partition result to G1") and for every template
   one strategy, minimising the communication of the step with a dynamic program.  The DP is
   exact variable elimination over the tensor classes with each template's cost as a factor;
   on the coarsened chain of an MLP or CNN it is the chain DP of Jia et al. (ICML 2018).

**Cost accounting.**  At level i each worker group w holds box H_w of every tensor and
computes box O_w of every op output (whole partial outputs for a split reduction) from input
regions N_w (interval analysis).  The level's communication is

    F_i = Σ_ops Σ_inputs Σ_w |N_w \\ H_w|  +  Σ_ops Σ_w (Σ_w' |O_w' ∩ H_w| − |O_w ∩ H_w|)

(elements fetched, plus partial or misplaced outputs sent to their holders) times the element
size.  Data fetched by a group at level i is split among its children for free (Tofu's "extra
input tensors"), so step i adds δ_i = F_i − F_(i−1) bytes and F_m is the plan's total: the
same number a flat evaluation of the final tiling gives, so all algorithms are comparable.
δ_i crosses the links between sibling groups of level i (bandwidth from the device graph);
``objective_s`` = Σ_i δ_i / bandwidth_i.

**Link levels** (§5.3: recursion suits hierarchical interconnects).  On a device graph with
one bandwidth (``k80-pcie-8``, ``local``) every step's bytes cross the same links.  On one with
several (``p100-cluster``: NVLink inside a node, InfiniBand between) the bytes each pair of
sibling groups exchanges are counted (:func:`_pair_bytes`), δ_i is spread over the sibling
pairs in that proportion, and a pair costs the mean of 1/bandwidth over the device pairs that
carry it.  Which step splits along which link level is free: worker digits can be given to
device digits in any order, so every order of the steps is evaluated (:func:`level_order`) and
the one with the least time on the links is kept - the step moving the most bytes lands on the
fastest links.  Baselines use the same link model and the same matching; a one-step baseline
(EqualChop, Spartan) has nothing to match and pays for its pairs across the slow links.

Baselines (Section 7.3) under the same accounting: ``allrow-greedy`` (every tensor split on
its first axis at every step, each op its best strategy), ``spartan`` (one k-way step, largest
tensor first, greedy), ``equalchop`` (the DP with one k-way step: each tensor chopped along one
axis), ``icml18`` (the recursive DP without output reduction).

Example::

    >>> from explorer.engine.core.opgraph import build_opgraph
    >>> plan = partition(build_opgraph("mlp", 64), workers=4)
    >>> plan.comm_bytes, plan.coarse["ops_before"], plan.coarse["ops_after"]
    (6986408.0, 84, 26)
"""

from __future__ import annotations

from explorer.engine.search.options import TofuOptions, make
from explorer.engine.search.result import Result
from explorer.engine.tofu.coarsen import Coarse, coarsen, factorize  # noqa: F401 - re-exported
from explorer.engine.tofu.partition import (  # noqa: F401 - re-exported
    compute_seconds,
    level_order,
    partition,
    pin_steps,
    step_seconds,
)
from explorer.engine.tofu.plan import (  # noqa: F401 - re-exported
    StepTrace,
    TofuPlan,
    execution_plan,
    json_key,
    strip,
)

__all__ = ["TofuOptions", "TofuPlan", "coarsen", "partition", "search", "factorize", "pin_steps",
           "level_order", "step_seconds", "execution_plan", "strip", "compute_seconds"]


def search(problem, pins=None, options: TofuOptions | None = None, progress=None) -> Result:
    """Tofu (or a Section 7.3 baseline, ``options.algo``) on the problem's operator graph,
    over all of its devices; ``pins`` fix tensors' tilings (``TENSOR=grid=2x1``)."""
    options = make(TofuOptions, options)
    g, devices = problem.opgraph(), problem.devices
    plan = partition(g, devices.n, devices, pins, options, progress)
    dtype = getattr(problem, "dtype", "fp32")
    plan.compute_s = [float(x) for x in compute_seconds(g, execution_plan(plan, g), devices,
                                                        dtype)]
    step_s = plan.objective_s + max(plan.compute_s, default=0.0)
    cap = [float(d.memory) for d in devices.devices[:devices.n]]
    fits = all(m <= c for m, c in zip(plan.peak_memory_bytes, cap))
    info = {"factors": list(plan.factors), "coarsening": dict(plan.coarse),
            "capacity_bytes": cap, "links_digest": devices.links_digest()}
    return Result(options.algo, "tofu", problem.model or g.model, g.batch,
                  dict(problem.model_args or getattr(g, "model_args", {}) or {}),
                  devices.name, devices.n, plan.objective_s, step_s,
                  plan.search_time_s, [float(x) for x in plan.peak_memory_bytes],
                  plan.comm_bytes, fits, plan, [p.text() for p in (pins or [])],
                  [st.to_dict() for st in plan.steps], info, capture=g)

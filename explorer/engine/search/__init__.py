"""The one method registry: every search and baseline, its family, description and options.

Each method is registered once here with its family (``layerwise``, ``tofu``,
``placement``), a one-line description, its options dataclass and its module's one entry
point ``search(problem, pins, options) -> Result``.  The command line, the app and the
benchmarks list and call methods only through :data:`METHODS` and :func:`run`.

Example::

    >>> from explorer.engine.search import METHODS, names, run
    >>> from explorer.engine.search.problem import Problem, Request
    >>> names("layerwise")
    ['optcnn', 'data', 'model', 'owt', 'megatron', 'megatron-3d', 'fsdp', 'pipeline', 'exhaustive']
    >>> res = run("optcnn", Problem(Request("lenet5", 8, devices=2)))
    >>> res.family, res.devices, res.objective_s > 0
    ('layerwise', 2, True)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from explorer.engine.search.options import (
    CeleritasOptions,
    ClassicOptions,
    ExhaustiveOptions,
    FSDPOptions,
    Megatron3DOptions,
    MegatronOptions,
    OptCNNOptions,
    PipelineOptions,
    PlacementOptions,
    TofuOptions,
    make,
)
from explorer.engine.search.problem import Problem
from explorer.engine.search.request import Request

# ``Result`` and ``FAMILIES`` (from .result, which imports numpy and the cost model) load on
# first use, so listing the registry (``explorer --help``) imports neither.

__all__ = ["Method", "METHODS", "FAMILIES", "Problem", "Request", "Result", "run", "get", "names",
           "describe", "family_of", "comparison"]


@dataclass(frozen=True)
class Method:
    """A registered method: ``entry(problem, pins, options)`` with ``options`` built from
    :attr:`options_type` and the ``fixed`` fields that select this method in its module."""

    name: str
    family: str
    description: str
    options_type: type
    #: the module (dotted name) whose ``search(problem, pins, options)`` runs the method
    module: str
    fixed: dict = field(default_factory=dict, hash=False)
    #: "search" (a paper's method), "baseline" (what it is compared against) or
    #: "verification" (exhaustive: small graphs only, never in comparisons)
    role: str = "baseline"
    #: shown in its family's comparison (the memory-aware LLM methods are not: they search
    #: for minutes on CNNs' comparisons and answer another question, issue 28)
    in_comparison: bool = True

    def options(self, options=None):
        """The validated options dataclass for this method."""
        return make(self.options_type, options, **self.fixed)

    @property
    def entry(self) -> Callable:
        import importlib
        return importlib.import_module(self.module).search


METHODS: dict = {}


def _register(name, family, description, options_type, module, role="baseline",
              in_comparison=True, **fixed):
    if name in METHODS:
        raise ValueError(f"method {name!r} is registered twice")
    if role not in ("search", "baseline", "verification"):
        raise ValueError(f"method {name!r}: unknown role {role!r}")
    METHODS[name] = Method(name, family, description, options_type, module, fixed, role,
                           in_comparison)


_register("optcnn", "layerwise", "layer-wise parallelism: node/edge elimination "
          "(Jia et al., ICML 2018), under the devices' memory", OptCNNOptions,
          "explorer.engine.layerwise.constrained", role="search")
_register("data", "layerwise", "data parallelism: every layer split on the sample dimension",
          ClassicOptions, "explorer.engine.layerwise.classic", strategy="data")
_register("model", "layerwise", "model parallelism: every layer's channels split over all "
          "devices", ClassicOptions, "explorer.engine.layerwise.classic", strategy="model")
_register("owt", "layerwise", "one weird trick: data-parallel convolutions, model-parallel "
          "dense layers", ClassicOptions, "explorer.engine.layerwise.classic", strategy="owt")
_register("megatron", "layerwise", "Megatron-LM tensor x data parallelism: column- then "
          "row-parallel linears, attention heads split, sequence-parallel norms (option tp)",
          MegatronOptions, "explorer.engine.layerwise.classic")
_register("megatron-3d", "layerwise", "Megatron-LM tensor x pipeline x data parallelism: "
          "Megatron's layout in each of pp stages, 1F1B, full recomputation (options tp, pp, "
          "micro_batches)", Megatron3DOptions, "explorer.engine.layerwise.pipeline_megatron",
          in_comparison=False)
_register("fsdp", "layerwise", "ZeRO-3 / FSDP data parallelism: every layer split on the "
          "sample, optimizer state, gradients and parameters sharded", FSDPOptions,
          "explorer.engine.layerwise.pipeline_fsdp", in_comparison=False)
_register("pipeline", "layerwise", "two-level search: pipeline stages x micro-batches (outer "
          "DP, Alpa) over the memory-constrained elimination search with recomputation and "
          "ZeRO", PipelineOptions, "explorer.engine.layerwise.pipeline", role="search",
          in_comparison=False)
_register("exhaustive", "layerwise", "depth-first search over all strategies (small graphs; "
          "verification)", ExhaustiveOptions, "explorer.engine.layerwise.exhaustive", role="verification")
_register("tofu", "tofu", "recursive DP with output reduction (Wang et al., EuroSys 2019)",
          TofuOptions, "explorer.engine.tofu.search", role="search", algo="tofu")
_register("allrow-greedy", "tofu", "every tensor split on its first axis, ops pick their best "
          "strategy", TofuOptions, "explorer.engine.tofu.search", algo="allrow-greedy")
_register("spartan", "tofu", "largest tensor first, greedy, one k-way step (Spartan)",
          TofuOptions, "explorer.engine.tofu.search", algo="spartan")
_register("equalchop", "tofu", "the DP in one k-way step: every tensor chopped along one axis",
          TofuOptions, "explorer.engine.tofu.search", algo="equalchop")
_register("icml18", "tofu", "recursive DP without output reduction (Jia et al., ICML 2018)",
          TofuOptions, "explorer.engine.tofu.search", algo="icml18")
_register("celeritas", "placement", "Celeritas: CPD-TOPO, optimal operation fusion, Adjusting "
          "Placement, then simulated refinement of the cluster decisions", CeleritasOptions,
          "explorer.engine.placement.celeritas", algo="celeritas")
_register("celeritas-paper", "placement", "Celeritas as published: Adjusting Placement of the "
          "fused clusters, no simulated refinement", CeleritasOptions, "explorer.engine.placement.celeritas",
          role="search", algo="celeritas-paper")
_register("order-place", "placement", "fused clusters in CPD-TOPO order, one device filled "
          "after another", CeleritasOptions, "explorer.engine.placement.celeritas", algo="order-place")
_register("m-topo", "placement", "Baechi m-TOPO: BFS topological order, even memory share per "
          "device", PlacementOptions, "explorer.engine.placement.placers", algo="m-topo")
_register("m-etf", "placement", "Baechi m-ETF: earliest-start-time list scheduling under "
          "memory limits", PlacementOptions, "explorer.engine.placement.placers", algo="m-etf")
_register("m-sct", "placement", "Baechi m-SCT: m-ETF with LP favourite children (small "
          "communication time)", PlacementOptions, "explorer.engine.placement.placers", algo="m-sct")
_register("metis", "placement", "METIS k-way partition (pymetis) balancing memory, minimising "
          "bytes cut", PlacementOptions, "explorer.engine.placement.placers", algo="metis")
_register("single", "placement", "every operator on device 0", PlacementOptions, "explorer.engine.placement.placers",
          algo="single")


def __getattr__(name: str):
    if name in ("Result", "FAMILIES"):
        from explorer.engine.search import result
        return getattr(result, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def get(name: str) -> Method:
    """The method called ``name``; ``ValueError`` listing every method otherwise."""
    try:
        return METHODS[name]
    except KeyError:
        raise ValueError(f"unknown method {name!r}: choose one of "
                         f"{', '.join(METHODS)}") from None


def names(family: str | None = None) -> list:
    """Method names, in registration order, of one family or all."""
    families = dict.fromkeys(m.family for m in METHODS.values())
    if family is not None and family not in families:
        raise ValueError(f"unknown family {family!r}: one of {', '.join(families)}")
    return [m.name for m in METHODS.values() if family in (None, m.family)]


def comparison(family: str) -> list:
    """The methods a family's comparison shows: its baselines, then its searches (the
    papers' order: data, model, OWT, then layer-wise); verification methods are left out."""
    methods = [METHODS[n] for n in names(family) if METHODS[n].in_comparison]
    return [m.name for m in methods if m.role == "baseline"] + \
        [m.name for m in methods if m.role == "search"]


def family_of(name: str) -> str:
    return get(name).family


def describe(family: str | None = None) -> dict:
    """``{name: description}`` of one family or all."""
    return {n: METHODS[n].description for n in names(family)}


def run(name: str, problem: Problem, pins=None, options=None, progress=None) -> Result:
    """Run method ``name`` on ``problem`` honouring ``pins`` (strings or
    :class:`~explorer.engine.core.pins.Pin`); ``options`` a dict or the method's dataclass.

    Every pin is checked against the method's family first: a family that cannot honour a
    pin says exactly why (:func:`explorer.engine.core.pins.check`)."""
    from explorer.engine.core.pins import check
    method = get(name)
    opts = method.options(options)
    parsed = check(pins, method.family)
    if progress is not None and method.family == "tofu":
        res = method.entry(problem, parsed, opts, progress=progress)
    else:
        res = method.entry(problem, parsed, opts)
    res.dtype = problem.dtype              # the precision the costs assumed
    if getattr(res.plan, "dtype", None) is not None:
        res.plan.dtype = problem.dtype
    if method.family == "placement":       # which operator times the prediction rests on
        res.info.setdefault("cost", problem.cost)
    return res

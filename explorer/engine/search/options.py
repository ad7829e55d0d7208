"""Every method's options as a validated dataclass (checked once, ``ValueError`` with the numbers).

The registry builds them from plain dicts (command line, app, benchmarks) with
:func:`make`, which rejects unknown keys by name.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

__all__ = ["OptCNNOptions", "ExhaustiveOptions", "ClassicOptions", "MegatronOptions",
           "TofuOptions", "CeleritasOptions", "PlacementOptions", "PipelineOptions",
           "Megatron3DOptions", "FSDPOptions", "make"]

OPTIMIZERS = ("sgd", "adam")
SCHEDULES = ("1f1b", "gpipe")


def _bool(name, value) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"{name} must be true or false, got {value!r}")


def _int(name, value, lo=None, hi=None, none=False):
    if value is None and none:
        return None
    try:
        v = int(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be an integer, got {value!r}") from None
    if isinstance(value, float) and v != value or isinstance(value, bool):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if lo is not None and v < lo or hi is not None and v > hi:
        rng = f"{lo}..{hi}" if hi is not None else f"≥ {lo}"
        raise ValueError(f"{name} must be {rng}, got {v}")
    return v


@dataclass(frozen=True)
class MemoryOptions:
    """What the memory-aware layer-wise searches assume and may use (issue 28):
    ``optimizer`` (``sgd``: momentum, 1 float32 state per weight — what the runtime runs;
    ``adam``: 2), ``memory_limit_gib`` (per device; default the devices' capacity),
    ``recompute`` (may layers be recomputed), ``zero`` (highest ZeRO stage a layer may use,
    0–3), ``saving`` (``when-needed``: the paper's plan unless it does not fit;
    ``always``: search the savings even when it fits)."""

    optimizer: str = "sgd"
    memory_limit_gib: float | None = None
    recompute: bool = True
    zero: int = 3
    saving: str = "when-needed"

    def __post_init__(self):
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"optimizer must be sgd or adam, got {self.optimizer!r}")
        if self.memory_limit_gib is not None:
            try:
                v = float(self.memory_limit_gib)
            except (TypeError, ValueError):
                raise ValueError(f"memory_limit_gib must be a number of GiB, got "
                                 f"{self.memory_limit_gib!r}") from None
            if not v > 0:
                raise ValueError(f"memory_limit_gib must be > 0, got {v}")
            object.__setattr__(self, "memory_limit_gib", v)
        object.__setattr__(self, "recompute", _bool("recompute", self.recompute))
        object.__setattr__(self, "zero", _int("zero", self.zero, 0, 3))
        if self.saving not in ("when-needed", "always"):
            raise ValueError(f"saving must be when-needed or always, got {self.saving!r}")

    def settings(self):
        from explorer.engine.layerwise.memory import MemorySettings
        return MemorySettings(self.optimizer, self.recompute, self.zero)


@dataclass(frozen=True)
class OptCNNOptions(MemoryOptions):
    """OptCNN's elimination search is exact for equation 1; under a memory limit it is the
    Lagrangian search of :mod:`explorer.engine.layerwise.stages` (see
    :class:`MemoryOptions`)."""


@dataclass(frozen=True)
class ExhaustiveOptions(MemoryOptions):
    """``max_space``: refuse to enumerate more complete strategies than this; under a memory
    limit it enumerates every layer's candidates × memory options (:class:`MemoryOptions`)
    and is exact for the constrained problem (the check of the Lagrangian search)."""

    max_space: int = 10 ** 9

    def __post_init__(self):
        super().__post_init__()
        if int(self.max_space) < 1:
            raise ValueError(f"max_space must be ≥ 1, got {self.max_space}")


@dataclass(frozen=True)
class PipelineOptions(MemoryOptions):
    """The two-level pipeline search: ``stages`` (``None``: try 1, 2, 4, … ; or one count),
    ``micro_batches`` (``None``: 1 without stages, else 2·S, 4·S and 8·S that divide the
    batch; or one count), ``schedule`` (``1f1b`` or ``gpipe``), ``processes`` (``None``:
    two on searches of 64 devices or more where two cores are usable, else one; the same
    plan either way)."""

    stages: int | None = None
    micro_batches: int | None = None
    schedule: str = "1f1b"
    processes: int | None = None

    def __post_init__(self):
        super().__post_init__()
        object.__setattr__(self, "stages", _int("stages", self.stages, 1, none=True))
        object.__setattr__(self, "micro_batches",
                           _int("micro_batches", self.micro_batches, 1, none=True))
        object.__setattr__(self, "processes", _int("processes", self.processes, 1, none=True))
        if self.processes is not None and self.processes > 2:
            raise ValueError(f"processes must be 1 or 2, got {self.processes}")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"schedule must be 1f1b or gpipe, got {self.schedule!r}")


@dataclass(frozen=True)
class Megatron3DOptions:
    """Megatron-LM's ``tp × pp × dp``: ``tp`` (tensor-parallel degree, ``None``: the
    largest divisor of a node's devices that divides every head count), ``pp`` (pipeline
    stages, ``None``: the fewest that fit), ``micro_batches`` (``None``: 4·pp, or the batch's
    largest divisor below it), ``recompute`` (full recomputation of every layer),
    ``optimizer``, ``memory_limit_gib``, ``ep`` (expert-parallel degree within a stage's
    devices, as :class:`MegatronOptions`)."""

    tp: int | None = None
    pp: int | None = None
    micro_batches: int | None = None
    recompute: bool = True
    optimizer: str = "adam"
    memory_limit_gib: float | None = None
    ep: int | None = None

    def __post_init__(self):
        object.__setattr__(self, "tp", _int("tp", self.tp, 1, none=True))
        object.__setattr__(self, "ep", _int("ep", self.ep, 1, none=True))
        object.__setattr__(self, "pp", _int("pp", self.pp, 1, none=True))
        object.__setattr__(self, "micro_batches",
                           _int("micro_batches", self.micro_batches, 1, none=True))
        object.__setattr__(self, "recompute", _bool("recompute", self.recompute))
        MemoryOptions(self.optimizer, self.memory_limit_gib)      # the same checks


@dataclass(frozen=True)
class FSDPOptions:
    """ZeRO-3 / FSDP data parallelism: every layer split on the sample over all devices,
    optimizer state, gradients and parameters sharded over them; ``recompute`` (full
    recomputation), ``optimizer``, ``memory_limit_gib``."""

    recompute: bool = True
    optimizer: str = "adam"
    memory_limit_gib: float | None = None

    def __post_init__(self):
        object.__setattr__(self, "recompute", _bool("recompute", self.recompute))
        MemoryOptions(self.optimizer, self.memory_limit_gib)


@dataclass(frozen=True)
class ClassicOptions:
    """``strategy``: data | model | owt (set by the registry from the method's name)."""

    strategy: str = "data"

    def __post_init__(self):
        if self.strategy not in ("data", "model", "owt"):
            raise ValueError(f"unknown strategy {self.strategy!r}: data, model or owt")


@dataclass(frozen=True)
class MegatronOptions:
    """``tp``: the tensor-parallel degree (the data-parallel degree is devices / tp); ``None``
    picks the largest divisor of the device count that divides every attention's head count.
    That it divides the device count is checked by the search, which knows the devices
    (:func:`check_tp`).  ``ep``: the expert-parallel degree of experts layers (each expert on
    ``ep`` groups of devices, the samples over the rest); ``None`` picks the largest divisor
    of the device count dividing every expert count (:func:`check_ep`)."""

    tp: int | None = None
    ep: int | None = None

    def __post_init__(self):
        object.__setattr__(self, "ep", _int("ep", self.ep, 1, none=True))
        if self.tp is None:
            return
        try:
            tp = int(self.tp)
        except (TypeError, ValueError):
            raise ValueError(f"tp must be an integer, got {self.tp!r}") from None
        if tp != self.tp and str(tp) != str(self.tp).strip():
            raise ValueError(f"tp must be an integer, got {self.tp!r}")
        if tp < 1:
            raise ValueError(f"tp must be ≥ 1, got {tp}")
        object.__setattr__(self, "tp", tp)


def check_ep(ep: int, devices: int, experts: list) -> None:
    """``ValueError`` with the numbers unless the expert-parallel degree divides the devices
    and every experts layer's expert count (``experts``; empty: the model has none)."""
    if not experts:
        raise ValueError(f"ep={ep} applies to experts layers; this model has none")
    ok = [d for d in range(1, devices + 1)
          if devices % d == 0 and all(e % d == 0 for e in experts)]
    if ep not in ok:
        raise ValueError(f"ep={ep} must divide the {devices} devices and every expert count "
                         f"({', '.join(map(str, sorted(set(experts))))}); possible: "
                         f"{', '.join(map(str, ok))}")


def check_tp(tp: int, devices: int) -> None:
    """``ValueError`` with the numbers unless the tensor-parallel degree divides the devices."""
    if tp > devices or devices % tp:
        ok = [d for d in range(1, devices + 1) if devices % d == 0]
        raise ValueError(f"tp={tp} does not divide the {devices} devices (tensor-parallel x "
                         f"data-parallel = devices): choose tp in {ok}")


TOFU_ALGOS = ("tofu", "icml18", "equalchop", "spartan", "allrow-greedy")


@dataclass(frozen=True)
class TofuOptions:
    """``algo`` the Tofu-family method; ``coalesce`` the element-wise / time-step merging of
    the coarsening; ``max_factor`` the largest DP table (entries) before giving up."""

    algo: str = "tofu"
    coalesce: bool = True
    max_factor: int = 1 << 22

    def __post_init__(self):
        if self.algo not in TOFU_ALGOS:
            raise ValueError(f"unknown Tofu algorithm {self.algo!r}: choose one of "
                             f"{', '.join(TOFU_ALGOS)}")
        if self.max_factor < 16:
            raise ValueError(f"max_factor={self.max_factor} is too small (≥ 16)")


def _memory(value):
    if value is not None and not float(value) > 0:
        raise ValueError(f"memory_per_device must be > 0 bytes, got {value}")


@dataclass(frozen=True)
class PlacementOptions:
    """Options every placement method shares: ``algo``; ``memory_per_device`` (bytes;
    default the devices' capacity); ``contention`` of the simulator ("ports": one send and
    one receive at a time per device | "none")."""

    algo: str = "m-topo"
    memory_per_device: float | None = None
    contention: str = "ports"

    def __post_init__(self):
        _memory(self.memory_per_device)
        if self.contention not in ("ports", "none"):
            raise ValueError(f"contention must be ports or none, got {self.contention!r}")


@dataclass(frozen=True)
class CeleritasOptions(PlacementOptions):
    """Celeritas (Section 5.1.3 defaults): fusion window ``R`` (200 nodes), memory cap ``M``
    (bytes; default ``M_fraction`` 0.25 of the smallest capacity); ``refine`` the simulated
    refinement after Adjusting Placement (``celeritas`` only, not in the paper) with a budget
    of ``refine_evals`` simulations (default by graph size) keeping ``refine_memory``
    ("simulated": each device's simulated peak, the liveness rule ``oom`` is judged by |
    "budget": the stricter whole-step sum of every output and received tensor) and, between
    its cluster and boundary moves, the moves of a finer fusion's clusters (window
    ``split_R``, 0: none) that can split a block of parallel branches over devices;
    ``schedule`` the order each device runs its ready operators in (``celeritas`` only):
    "placed" (the default: by the placed graph's blevel, CPD-TOPO breaking ties, kept only
    where it simulates better than CPD-TOPO) | "cpd" (CPD-TOPO, as ``celeritas-paper``)."""

    algo: str = "celeritas"
    R: int = 200
    M: float | None = None
    M_fraction: float = 0.25
    refine: bool = True
    refine_evals: int | None = None
    refine_memory: str = "simulated"
    split_R: int = 10
    schedule: str = "placed"

    def __post_init__(self):
        super().__post_init__()
        if self.algo not in ("celeritas", "celeritas-paper", "order-place"):
            raise ValueError(f"Celeritas runs celeritas, celeritas-paper or order-place, "
                             f"not {self.algo!r}")
        if int(self.R) < 1:
            raise ValueError(f"R must be >= 1, got {self.R}")
        if self.M is not None and not float(self.M) > 0:
            raise ValueError(f"memory cap M must be > 0, got {self.M}")
        if not 0 < float(self.M_fraction) <= 1:
            raise ValueError(f"M_fraction must be in (0, 1], got {self.M_fraction}")
        if self.refine_evals is not None and int(self.refine_evals) < 0:
            raise ValueError(f"refine_evals must be ≥ 0, got {self.refine_evals}")
        if isinstance(self.split_R, bool) or not isinstance(self.split_R, int):
            raise ValueError(f"split_R must be a whole number of nodes (0: no split moves), "
                             f"got {self.split_R!r}")
        if self.split_R < 0:
            raise ValueError(f"split_R must be >= 0 (0: no split moves), got {self.split_R}")
        if self.refine_memory not in ("budget", "simulated"):
            raise ValueError(f"refine_memory must be budget or simulated, got "
                             f"{self.refine_memory!r}")
        if self.schedule not in ("placed", "cpd"):
            raise ValueError(f"schedule must be placed or cpd, got {self.schedule!r}")

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def make(cls, options=None, **fixed):
    """``cls`` from ``options`` (a dict, an instance or ``None``) with ``fixed`` fields set;
    an unknown key is a ``ValueError`` naming the valid ones."""
    if isinstance(options, cls):
        return dataclasses.replace(options, **fixed) if fixed else options
    if options is not None and not isinstance(options, dict):
        if dataclasses.is_dataclass(options):
            options = {f.name: getattr(options, f.name) for f in dataclasses.fields(options)}
        else:
            raise ValueError(f"options must be a dict or {cls.__name__}, got "
                             f"{type(options).__name__}")
    opts = {k: v for k, v in dict(options or {}).items()}
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(opts) - names)
    if unknown:
        raise ValueError(f"unknown option{'s' if len(unknown) > 1 else ''} "
                         f"{', '.join(unknown)} for {cls.__name__}: valid are "
                         f"{', '.join(sorted(names)) or 'none'}")
    opts.update(fixed)
    return cls(**opts)

"""Every method's options as a validated dataclass (checked once, ``ValueError`` with the numbers).

The registry builds them from plain dicts (command line, app, benchmarks) with
:func:`make`, which rejects unknown keys by name.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

__all__ = ["OptCNNOptions", "ExhaustiveOptions", "ClassicOptions", "MegatronOptions",
           "TofuOptions", "CeleritasOptions", "PlacementOptions", "make"]


@dataclass(frozen=True)
class OptCNNOptions:
    """OptCNN's elimination search has no knobs: it is exact."""


@dataclass(frozen=True)
class ExhaustiveOptions:
    """``max_space``: refuse to enumerate more complete strategies than this."""

    max_space: int = 10 ** 9

    def __post_init__(self):
        if int(self.max_space) < 1:
            raise ValueError(f"max_space must be ≥ 1, got {self.max_space}")


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
    (:func:`check_tp`)."""

    tp: int | None = None

    def __post_init__(self):
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
    "budget": the stricter whole-step sum of every output and received tensor)."""

    algo: str = "celeritas"
    R: int = 200
    M: float | None = None
    M_fraction: float = 0.25
    refine: bool = True
    refine_evals: int | None = None
    refine_memory: str = "simulated"

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
        if self.refine_memory not in ("budget", "simulated"):
            raise ValueError(f"refine_memory must be budget or simulated, got "
                             f"{self.refine_memory!r}")

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

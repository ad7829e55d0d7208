"""Pins: the user's constraints on a plan, one vocabulary for every method family.

A pin is written ``TARGET=SPEC`` (command line ``--pin``, the app, the URL) and parsed here
only.  The target names a layer (layer-wise methods), an operator or ``cluster:K``
(placement methods) or a tensor (Tofu); the spec fixes

* degrees of the target's parallel dimensions: ``n=2,c=2`` (letters n, c, h, w, l, and k:
  the reduction degree of a row-parallel matrix product);
* devices: ``@0,1`` (a placement pin names exactly one device: ``@3``);
* a tensor's tiling for Tofu: ``grid=2x1`` (tiles per axis; product = the worker count).

Degrees and devices combine (``n=2@0,1``).  Every family either honours a pin or raises
:class:`~explorer.errors.InfeasiblePlan` saying exactly why it cannot (:func:`check`).

Example::

    >>> p = parse("conv1=n=2@0,1")
    >>> p.target, p.degrees, p.devices, p.text()
    ('conv1', {'n': 2}, (0, 1), 'conv1=n=2@0,1')
    >>> parse("fc=grid=2x1").grid
    (2, 1)
    >>> check([parse("fc=n=2")], "tofu")
    Traceback (most recent call last):
    ...
    explorer.errors.InfeasiblePlan: pin fc=n=2: Tofu partitions every tensor over all workers, so it takes a tensor's tiling (TENSOR=grid=2x1), not degrees or devices
"""

from __future__ import annotations

from dataclasses import dataclass, field

from explorer.errors import InfeasiblePlan

__all__ = ["Pin", "parse", "parse_all", "check", "from_placement_ui", "to_placement_ui"]

_LETTERS = ("n", "c", "h", "w", "l", "e", "k")


@dataclass(frozen=True)
class Pin:
    """A constraint on one target: degrees and/or devices, or a tensor tiling (``grid``)."""

    target: str
    degrees: dict = field(default_factory=dict, hash=False)
    devices: tuple | None = None
    grid: tuple | None = None

    def __post_init__(self):
        if not self.target:
            raise ValueError("a pin needs a target: write TARGET=SPEC, e.g. conv1=n=2")
        if not self.degrees and self.devices is None and self.grid is None:
            raise ValueError(f"pin on {self.target!r} names neither degrees, devices nor a grid")
        if self.grid is not None and (self.degrees or self.devices is not None):
            raise ValueError(f"pin on {self.target!r}: a grid (Tofu tiling) does not combine "
                             f"with degrees or devices")

    @property
    def layer(self) -> str:
        """The target read as a layer name (layer-wise methods)."""
        return self.target

    def matches(self, cfg) -> bool:
        """Whether a layer configuration (:class:`~explorer.engine.core.geometry.Config`) meets it."""
        if self.devices is not None and tuple(self.devices) != cfg.devices:
            return False
        return all(cfg.deg(k) == v for k, v in self.degrees.items())

    def text(self) -> str:
        """The pin as written (``parse(p.text()) == p``)."""
        if self.grid is not None:
            return f"{self.target}=grid=" + "x".join(map(str, self.grid))
        s = ",".join(f"{k}={v}" for k, v in self.degrees.items())
        if self.devices is not None:
            s += "@" + ",".join(map(str, self.devices))
        return f"{self.target}={s}"

    @classmethod
    def parse(cls, text: str) -> "Pin":
        return parse(text)


def _degrees(text: str, whole: str) -> dict:
    out: dict = {}
    for part in text.split(","):
        k, eq, v = part.partition("=")
        if not eq or k not in _LETTERS:
            raise ValueError(
                f"cannot read {part!r} in pin {whole!r}: write degrees as n=2,c=1,h=2,w=1 "
                f"(letters n,c,h,w,l,k), devices after @ (@0,1), or a tiling as grid=2x1")
        try:
            out[k] = int(v)
        except ValueError:
            raise ValueError(f"degree {k}={v!r} in pin {whole!r} is not an integer") from None
        if out[k] < 1:
            raise ValueError(f"degree {k}={out[k]} in pin {whole!r} must be ≥ 1")
    return out


def parse(text: str) -> Pin:
    """``LAYER=n=2,c=2`` / ``TARGET=@0,1`` / ``LAYER=n=2@0,1`` / ``TENSOR=grid=2x1``."""
    text = str(text).strip()
    target, eq, rhs = text.partition("=")
    target, rhs = target.strip(), rhs.strip().strip("{}").replace(" ", "")
    if not eq or not target or not rhs:
        raise ValueError(f"cannot read pin {text!r}: write LAYER=n=2,c=1, TARGET=@0,1 or "
                         f"TENSOR=grid=2x1")
    if rhs.startswith("grid="):
        try:
            grid = tuple(int(x) for x in rhs[5:].lower().split("x"))
        except ValueError:
            raise ValueError(f"cannot read the grid in pin {text!r}: write TENSOR=grid=2x1 "
                             f"(tiles per axis)") from None
        if not grid or any(g < 1 for g in grid):
            raise ValueError(f"pin {text!r}: grid sizes must be ≥ 1")
        return Pin(target, {}, None, grid)
    degs_txt, _, dev_txt = rhs.partition("@")
    degrees = _degrees(degs_txt, text) if degs_txt else {}
    devices = None
    if dev_txt:
        try:
            devices = tuple(int(d) for d in dev_txt.split(","))
        except ValueError:
            raise ValueError(f"devices {dev_txt!r} in pin {text!r} must be integers like "
                             f"@0,1") from None
        if any(d < 0 for d in devices):
            raise ValueError(f"devices in pin {text!r} must be ≥ 0")
    return Pin(target, degrees, devices)


def parse_all(pins) -> list:
    """Pins from strings or :class:`Pin` objects; a target pinned twice is an error."""
    out, seen = [], set()
    for p in pins or ():
        pin = p if isinstance(p, Pin) else parse(p)
        if pin.target in seen:
            raise InfeasiblePlan(f"{pin.target} is pinned twice: keep one pin per target")
        seen.add(pin.target)
        out.append(pin)
    return out


def check(pins, family: str) -> list:
    """The pins a method family can honour, or :class:`InfeasiblePlan` saying why not.

    ``layerwise``: degrees and/or devices of a layer.  ``placement``: exactly one device of
    an operator or ``cluster:K``.  ``tofu``: a tensor's ``grid``."""
    pins = parse_all(pins)
    for p in pins:
        if family == "layerwise" and p.grid is not None:
            raise InfeasiblePlan(f"pin {p.text()}: layer-wise methods pin a layer's degrees "
                                 f"and devices (LAYER=n=2,c=2@0,1); a grid is a Tofu tiling")
        if family == "placement" and (p.degrees or p.grid is not None
                                      or p.devices is None or len(p.devices) != 1):
            raise InfeasiblePlan(f"pin {p.text()}: placement methods put whole operators on "
                                 f"one device; pin OP=@DEVICE or cluster:K=@DEVICE")
        if family == "placement" and p.target.startswith("cluster:") and \
                not p.target[len("cluster:"):].isdigit():
            raise InfeasiblePlan(f"pin {p.text()}: a cluster is named cluster:K with K its "
                                 f"number (0, 1, ...)")
        if family == "tofu" and p.grid is None:
            raise InfeasiblePlan(f"pin {p.text()}: Tofu partitions every tensor over all "
                                 f"workers, so it takes a tensor's tiling (TENSOR=grid=2x1), "
                                 f"not degrees or devices")
    return pins


def from_placement_ui(rows) -> list:
    """The Placement page's pins ``[{"target", "ops", "device"}]`` (a cluster pin lists its
    operators) as operator pins; the same operator on two devices is an error."""
    out: dict = {}
    for r in rows or ():
        d = int(r["device"])
        for op in r["ops"]:
            if op in out and out[op] != d:
                raise InfeasiblePlan(f"operator {op} is pinned to devices {out[op]} and {d} "
                                     f"({r['target']} overlaps an earlier pin): unpin one")
            out[op] = d
    return [Pin(op, {}, (d,)) for op, d in out.items()]


def to_placement_ui(pins, clusters=()) -> list:
    """Placement pins (text or :class:`Pin`) as the Placement page's rows; a
    ``cluster:K`` pin lists cluster K's operators (``clusters[K]["ops"]``)."""
    rows = []
    for p in check(pins, "placement"):
        ops = [p.target]
        if p.target.startswith("cluster:"):
            k = int(p.target.split(":", 1)[1])
            ops = list(clusters[k]["ops"]) if 0 <= k < len(clusters) else []
        rows.append({"target": p.target, "ops": ops, "device": int(p.devices[0])})
    return rows

"""Layer-wise configurations and the output box each of their devices owns.

A :class:`Config` (paper Section 4) gives a degree per dimension letter of a layer and the
devices that run it; device ``devices[k]`` owns tile ``k`` of the row-major tile grid (the
mixed-radix numbering of :mod:`.owners`).  :func:`enumerate_configs` lists a layer's candidate
configurations, :func:`output_boxes` / :func:`stacked_output_boxes` the boxes they own.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np

from ..graph import Layer
from .boxes import split_range
from .owners import tile_digits

# --------------------------------------------------------------------------------------------
# Configurations
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Config:
    """A parallelization configuration (paper Section 4) with the devices that run it.

    ``degrees`` lists ``(letter, degree)`` in the layer's axis order; the product of the
    degrees equals the number of ``devices``.  Device ``devices[k]`` owns tile ``k`` of the
    row-major tile grid (last letter fastest).

    >>> Config((("n", 2), ("c", 1), ("h", 2), ("w", 1)), (0, 1, 2, 3)).label()
    'n2 h2'
    """

    degrees: tuple
    devices: tuple

    def __post_init__(self):
        degs = tuple((str(k), int(v)) for k, v in self.degrees)
        object.__setattr__(self, "degrees", degs)
        object.__setattr__(self, "devices", tuple(int(d) for d in self.devices))
        for k, v in degs:
            if v < 1:
                raise ValueError(f"degree {k}={v} must be a positive integer")
        total = math.prod(v for _, v in degs)
        if total != len(self.devices):
            parts = " × ".join(f"{k}={v}" for k, v in degs if v > 1) or "1"
            raise ValueError(
                f"degrees {parts} = {total} need {total} devices, got {len(self.devices)} "
                f"({list(self.devices)})")
        if len(set(self.devices)) != len(self.devices):
            raise ValueError(f"devices {list(self.devices)} repeat a device")

    @property
    def total(self) -> int:
        return len(self.devices)

    def deg(self, letter: str) -> int:
        for k, v in self.degrees:
            if k == letter:
                return v
        return 1

    def as_dict(self) -> dict:
        return {k: v for k, v in self.degrees}

    def label(self) -> str:
        s = " ".join(f"{k}{v}" for k, v in self.degrees if v > 1)
        return s or "1"

    def key(self) -> str:
        """Text form used in pins and plan JSON: ``n=2,c=1,h=2,w=1@0,1,2,3``."""
        return ",".join(f"{k}={v}" for k, v in self.degrees) + "@" + ",".join(
            map(str, self.devices))


def _divisors(n: int) -> list:
    return [d for d in range(1, n + 1) if n % d == 0]


def enumerate_configs(layer: Layer, n_devices: int, devices: tuple | None = None,
                      max_total: int | None = None) -> list:
    """Every configuration of ``layer`` whose degrees multiply to a divisor of ``n_devices``.

    Degrees are divisors of the device count (so device blocks tile the machine evenly), no
    larger than the dimension they split; the sample dimension must divide the batch exactly
    (every device then trains on the same number of samples).  A configuration of total degree
    k runs on the first k devices of ``devices`` (default ``0..n_devices-1``; presets order
    devices so that the first k share a node).  Layers without parallelizable dimensions get the
    single configuration on device 0.
    """
    if n_devices < 1:
        raise ValueError(f"need at least 1 device, got {n_devices}")
    order = tuple(range(n_devices)) if devices is None else tuple(devices)
    cap = n_devices if max_total is None else max_total
    per_dim = []
    for letter in layer.dims:
        size = layer.size(letter)
        opts = []
        for d in _divisors(n_devices):
            if d > size or d > cap:
                continue
            if letter == "n" and size % d:
                continue
            opts.append(d)
        per_dim.append(opts)
    out = []
    for combo in itertools.product(*per_dim):
        total = math.prod(combo)
        if total > cap or n_devices % total:
            continue
        if devices is not None and total != len(order):
            continue
        out.append(Config(tuple(zip(layer.dims, combo)), order[:total]))
    out.sort(key=lambda c: (c.total, [-v for _, v in c.degrees]))
    return out


# --------------------------------------------------------------------------------------------
# Output ownership
# --------------------------------------------------------------------------------------------


def tile_indices(cfg: Config) -> np.ndarray:
    """``[k, len(degrees)]`` tile multi-index of each device position (row-major)."""
    return tile_digits([v for _, v in cfg.degrees], np.arange(cfg.total))


def output_boxes(layer: Layer, cfg: Config) -> np.ndarray:
    """``[k, ndim, 2]``: the output box owned by ``cfg.devices[k]``.

    Every element of the output is owned by exactly one device of the configuration.
    """
    nd = len(layer.out_shape)
    boxes = np.zeros((cfg.total, nd, 2), dtype=np.int64)
    boxes[:, :, 1] = np.asarray(layer.out_shape, dtype=np.int64)
    tiles = tile_indices(cfg)
    for j, (letter, deg) in enumerate(cfg.degrees):
        if deg == 1:
            continue
        ax = layer.axis_of(letter)
        lo, hi = split_range(layer.out_shape[ax], deg, tiles[:, j])
        boxes[:, ax, 0], boxes[:, ax, 1] = lo, hi
    return boxes


def stacked_output_boxes(layer: Layer, cfgs: list):
    """Output boxes of many configurations at once: ``([C, Dmax, nd, 2], used [C, Dmax])``.

    Row ``k`` of configuration ``i`` is the tile of ``cfgs[i].devices[k]`` (same tiling as
    :func:`output_boxes`); rows past a configuration's device count are empty and unused.
    """
    C = len(cfgs)
    Dm = max(c.total for c in cfgs)
    nd = len(layer.out_shape)
    boxes = np.zeros((C, Dm, nd, 2), dtype=np.int64)
    boxes[..., 1] = np.asarray(layer.out_shape, dtype=np.int64)
    total = np.array([c.total for c in cfgs])
    used = np.arange(Dm)[None, :] < total[:, None]
    rem = np.broadcast_to(np.arange(Dm)[None, :], (C, Dm)).copy()
    for letter in reversed(layer.dims):          # row-major: last letter varies fastest
        deg = np.array([c.deg(letter) for c in cfgs])[:, None]
        idx = rem % deg
        rem //= deg
        ax = layer.axis_of(letter)
        size = layer.out_shape[ax]
        boxes[:, :, ax, 0] = idx * size // deg
        boxes[:, :, ax, 1] = (idx + 1) * size // deg
    boxes[~used] = 0
    return boxes, used


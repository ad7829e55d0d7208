"""Layer-wise configurations and the output box each of their devices owns.

A :class:`Config` (paper Section 4) gives a degree per dimension letter of a layer and the
devices that run it; device ``devices[k]`` owns tile ``k`` of the row-major tile grid (the
mixed-radix numbering of :mod:`.owners`).  :func:`enumerate_configs` lists a layer's candidate
configurations, :func:`output_boxes` / :func:`stacked_output_boxes` the boxes they own.

Reduction (row-parallel) degree ``k``
-------------------------------------
Besides the output letters, a matrix product (``linear``, ``matmul``) may split its
reduction dimension (the input features) ``k`` ways, as Megatron-LM's row-parallel layers
do: the ``k`` devices of a *group* (the same tile of the other letters; ``k`` is always the
last, fastest digit, so a group is ``k`` consecutive devices) each multiply their ``1/k``
slice of the input features by the matching weight columns, giving a partial sum of the
group's whole tile (:func:`compute_boxes`: the tile and the feature range each device
computes).  The partials are then reduce-scattered so every output element is still owned
by exactly one device: member ``j`` owns part ``j`` of the tile along the *scatter axis* -
the sequence axis ``l`` when the output has one (Megatron's sequence parallelism, which
leaves the following norms and residual adds split by tokens), else the sample axis ``n``
(:func:`scatter_axis`).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np

from explorer.engine.core.layergraph import Layer
from explorer.engine.core.geometry.boxes import split_range
from explorer.engine.core.geometry.owners import tile_digits

# --------------------------------------------------------------------------------------------
# Configurations
# --------------------------------------------------------------------------------------------

#: The letter of the reduction (row-parallel) degree; not an axis of the output.
REDUCE = "k"


def reduction_size(layer: Layer) -> int | None:
    """Length of the reduction dimension a ``k`` degree may split (input features of a
    ``linear`` of rank ≤ 3, the inner dimension of a ``matmul``), or ``None``: the op has none
    (or the output has no scatter axis to keep every element owned by one device)."""
    if layer.op not in ("linear", "matmul") or not layer.in_shapes:
        return None
    if layer.op == "linear" and len(layer.out_shape) > 3:
        return None
    if layer.op == "matmul" and (len(layer.in_shapes) != 2 or len(layer.in_shapes[0]) < 2
                                 or len(layer.in_shapes[1]) < 2):
        return None
    if scatter_axis(layer) is None:
        return None
    return int(layer.in_shapes[0][-1])


def scatter_axis(layer: Layer) -> int | None:
    """The output axis a ``k`` group reduce-scatters its tile along: ``l`` if the output has
    one (sequence parallelism), else ``n``; ``None`` when it has neither."""
    for letter in ("l", "n"):
        if letter in layer.dims:
            return layer.axis_of(letter)
    return None


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
        degs = self._order(self.degrees)
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

    @staticmethod
    def _order(degrees) -> tuple:
        degs = tuple((str(k), int(v)) for k, v in degrees)
        # the reduction degree is always the last (fastest) digit: its groups are
        # consecutive devices, whatever order a plan file lists the degrees in
        return tuple(d for d in degs if d[0] != REDUCE) + tuple(d for d in degs
                                                                if d[0] == REDUCE)

    @classmethod
    def _enumerated(cls, degrees, devices: tuple) -> "Config":
        """A configuration :func:`enumerate_configs` made: ``devices`` a tuple of distinct
        ints as many as the degrees' product, so the per-device checks (a thousand
        devices, tens of thousands of candidates at scale) are skipped."""
        cfg = object.__new__(cls)
        object.__setattr__(cfg, "degrees", cls._order(degrees))
        object.__setattr__(cfg, "devices", devices)
        return cfg

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


#: Up to this many devices every divisor is a candidate degree ("auto"); beyond, powers of two.
ALL_DIVISORS_UP_TO = 16


def degree_values(spec, n_devices: int) -> tuple:
    """The degrees a dimension may take on ``n_devices`` under ``spec``, validated.

    ``"auto"`` (default): every divisor up to :data:`ALL_DIVISORS_UP_TO` devices, powers of two
    beyond (candidates then grow like ``log(n)^dims`` instead of ``divisors(n)^dims``);
    ``"divisors"``; ``"pow2"``; or explicit degrees (``"1,4,16"`` or a sequence of ints), each
    dividing ``n_devices`` (1 is always allowed).  Raises ``ValueError`` with the numbers.

    >>> degree_values("auto", 12), degree_values("pow2", 12), degree_values("1,4", 16)
    ((1, 2, 3, 4, 6, 12), (1, 2, 4), (1, 4))
    """
    divs = _divisors(n_devices)
    if spec is None or spec == "auto":
        spec = "divisors" if n_devices <= ALL_DIVISORS_UP_TO else "pow2"
    if spec == "divisors":
        return tuple(divs)
    if spec == "pow2":
        return tuple(d for d in divs if d & (d - 1) == 0)
    items = spec.replace(" ", "").split(",") if isinstance(spec, str) else list(spec)
    vals = set()
    for it in items:
        try:
            v = int(it)
        except (TypeError, ValueError):
            raise ValueError(f"degrees {spec!r}: {it!r} is not an integer; use auto, divisors, "
                             f"pow2 or a list such as 1,2,4,8") from None
        if isinstance(it, float) and it != v:
            raise ValueError(f"degrees {spec!r}: {it!r} is not an integer")
        if v < 1 or n_devices % v:
            raise ValueError(f"degree {v} does not divide the {n_devices} devices; the "
                             f"divisors are {', '.join(map(str, divs[:24]))}"
                             f"{' ...' if len(divs) > 24 else ''}")
        vals.add(v)
    return tuple(sorted(vals | {1}))


def enumerate_configs(layer: Layer, n_devices: int, devices: tuple | None = None,
                      max_total: int | None = None, degrees=None) -> list:
    """Every configuration of ``layer`` whose degrees multiply to a divisor of ``n_devices``.

    Degrees are divisors of the device count (so device blocks tile the machine evenly), no
    larger than the dimension they split; the sample dimension must divide the batch exactly
    (every device then trains on the same number of samples).  A configuration of total degree
    k runs on the first k devices of ``devices`` (default ``0..n_devices-1``; presets order
    devices so that the first k share a node).  Layers without parallelizable dimensions get the
    single configuration on device 0.  Matrix products also get a reduction degree ``k``
    (:func:`reduction_size`; at most the feature count) as long as the scatter axis has a part
    for every member of a group (and, for the sample axis, equal parts).  ``degrees`` restricts
    the degree of every dimension (:func:`degree_values`; default all divisors).
    """
    if n_devices < 1:
        raise ValueError(f"need at least 1 device, got {n_devices}")
    order = tuple(range(n_devices)) if devices is None else tuple(devices)
    want = None if devices is None else len(order)
    # device tuples shared per total; the checks only for devices given by the caller
    make = Config._enumerated if devices is None else Config
    prefix: dict = {}
    out = [make(tuple((k, v) for k, v in zip(letters, combo) if k != REDUCE or v > 1),
                prefix.get(total) or prefix.setdefault(total, order[:total]))
           for letters, combo, total in _combos(layer, n_devices, max_total, degrees, want)]
    out.sort(key=lambda c: (c.total, [-v for _, v in c.degrees]))
    return out


def count_configs(layer: Layer, n_devices: int, degrees=None) -> tuple:
    """``(count, Σ total degree, max total degree)`` of :func:`enumerate_configs` without
    building them (sizing a search before it starts)."""
    totals = [t for _, _, t in _combos(layer, n_devices, None, degrees, None)]
    return len(totals), sum(totals), max(totals)


def _combos(layer: Layer, n_devices: int, max_total, degrees, want):
    """``(letters, degrees, total)`` of every valid configuration (see
    :func:`enumerate_configs`); ``want``: only those of that total."""
    cap = n_devices if max_total is None else max_total
    allowed = _divisors(n_devices) if degrees is None else degree_values(degrees, n_devices)
    per_dim = []
    letters = layer.dims
    for letter in layer.dims:
        size = layer.size(letter)
        opts = []
        for d in allowed:
            if d > size or d > cap:
                continue
            if letter == "n" and size % d:
                continue
            opts.append(d)
        per_dim.append(opts)
    red = reduction_size(layer)
    if red is not None:        # row-parallel: the k devices of a group reduce-scatter a tile
        letters = layer.dims + (REDUCE,)
        per_dim.append([d for d in allowed if d <= red and d <= cap])
        s_ax = scatter_axis(layer)
        s_pos = layer.dims.index(layer.axes[s_ax])
        s_size = layer.out_shape[s_ax]
    for combo in itertools.product(*per_dim):
        total = math.prod(combo)
        if total > cap or n_devices % total:
            continue
        if want is not None and total != want:
            continue
        if red is not None and combo[-1] > 1:
            parts = combo[s_pos] * combo[-1]      # every device owns part of the tile
            if parts > s_size or (layer.axes[s_ax] == "n" and s_size % parts):
                continue
        # k=1 is left out (by the caller): a configuration without a reduction split reads
        # as it always did
        yield letters, combo, total


# --------------------------------------------------------------------------------------------
# Output ownership
# --------------------------------------------------------------------------------------------


def tile_indices(cfg: Config) -> np.ndarray:
    """``[k, len(degrees)]`` tile multi-index of each device position (row-major)."""
    return tile_digits([v for _, v in cfg.degrees], np.arange(cfg.total))


def _tiles(layer: Layer, cfg: Config):
    """``(tiles [k, nd, 2], tile index [k, len(degrees)])``: each device's box of the output
    letters' tiling (the group's whole tile when the configuration has a ``k`` degree)."""
    nd = len(layer.out_shape)
    boxes = np.zeros((cfg.total, nd, 2), dtype=np.int64)
    boxes[:, :, 1] = np.asarray(layer.out_shape, dtype=np.int64)
    tiles = tile_indices(cfg)
    for j, (letter, deg) in enumerate(cfg.degrees):
        if deg == 1 or letter == REDUCE:
            continue
        ax = layer.axis_of(letter)
        lo, hi = split_range(layer.out_shape[ax], deg, tiles[:, j])
        boxes[:, ax, 0], boxes[:, ax, 1] = lo, hi
    return boxes, tiles


def _reduce_range(layer: Layer, kdeg, kidx) -> np.ndarray:
    """``[..., 2]``: the reduction-feature range of part ``kidx`` of ``kdeg`` (vectorised)."""
    lo, hi = split_range(reduction_size(layer), kdeg, kidx)
    return np.stack([lo, hi], axis=-1).astype(np.int64)


def _scatter(layer: Layer, boxes: np.ndarray, kdeg, kidx) -> np.ndarray:
    """Each member's part ``kidx`` of ``kdeg`` of its tile along the scatter axis."""
    ax = scatter_axis(layer)
    lo, hi = boxes[..., ax, 0], boxes[..., ax, 1]
    ext = hi - lo
    out = boxes.copy()
    out[..., ax, 0] = lo + kidx * ext // kdeg
    out[..., ax, 1] = lo + (kidx + 1) * ext // kdeg
    return out


def output_boxes(layer: Layer, cfg: Config) -> np.ndarray:
    """``[k, ndim, 2]``: the output box owned by ``cfg.devices[k]``.

    Every element of the output is owned by exactly one device of the configuration (with a
    ``k`` degree: member ``j`` of a group owns part ``j`` of the group's tile along
    :func:`scatter_axis`).
    """
    boxes, tiles = _tiles(layer, cfg)
    kdeg = cfg.deg(REDUCE)
    if kdeg > 1:
        boxes = _scatter(layer, boxes, kdeg, tiles[:, -1])
    return boxes


def compute_boxes(layer: Layer, cfg: Config):
    """``(tiles [k, nd, 2], reduce [k, 2] or None)``: the box of the output each device
    computes and the range of the reduction features it sums over.

    Without a ``k`` degree these are the owned boxes and ``None`` (the whole reduction); with
    one, every member of a group computes a partial sum of the group's whole tile over its
    ``1/k`` of the features (see the module docstring).
    """
    boxes, tiles = _tiles(layer, cfg)
    kdeg = cfg.deg(REDUCE)
    if kdeg == 1:
        return boxes, None
    return boxes, _reduce_range(layer, kdeg, tiles[:, -1])


def reduce_groups(cfg: Config) -> list:
    """Device positions of each ``k`` group (consecutive: ``k`` is the fastest digit); empty
    without a ``k`` degree.  Member ``j`` of a group owns part ``j`` of its tile."""
    kdeg = cfg.deg(REDUCE)
    if kdeg == 1:
        return []
    return [list(range(g, g + kdeg)) for g in range(0, cfg.total, kdeg)]


def _stacked(layer: Layer, cfgs: list):
    """Tiles, reduction ranges and owned boxes of many configurations at once."""
    C = len(cfgs)
    Dm = max(c.total for c in cfgs)
    nd = len(layer.out_shape)
    # every slot written once (no zeroed array filled again, no mask pass): slots past a
    # configuration's device count come out of the per-pattern tables as empty boxes
    boxes = np.empty((C, Dm, nd, 2), dtype=np.int64)
    total = np.array([c.total for c in cfgs], dtype=np.int64)
    used = np.arange(Dm)[None, :] < total[:, None]
    slots = np.arange(Dm, dtype=np.int64)
    kd = np.array([c.deg(REDUCE) for c in cfgs], dtype=np.int64)
    kdeg = kd[:, None]
    ku, kinv = np.unique(kd, return_inverse=True)
    kidx = (slots[None, :] % ku[:, None])[kinv.reshape(-1)]    # k is the fastest digit
    stride = kd
    for letter in reversed(layer.dims):          # row-major: last letter varies fastest
        deg = np.array([c.deg(letter) for c in cfgs], dtype=np.int64)
        ax = layer.axis_of(letter)
        size = layer.out_shape[ax]
        # slot d's digit is (d // stride) % deg: computed once per distinct (stride, deg,
        # device count) over the slots (a few hundred rows), then gathered per candidate
        pats, inv = np.unique(np.stack([stride, deg, total], axis=1), axis=0,
                              return_inverse=True)
        st, dg, live = pats[:, :1], pats[:, 1:2], slots[None, :] < pats[:, 2:]
        idx = slots[None, :] // st % dg                                     # [P, Dm]
        inv = inv.reshape(-1)
        boxes[:, :, ax, 0] = np.where(live, idx * size // dg, 0)[inv]
        boxes[:, :, ax, 1] = np.where(live, (idx + 1) * size // dg, 0)[inv]
        stride = stride * deg
    covered = {layer.axis_of(letter) for letter in layer.dims}
    for ax in range(nd):
        if ax not in covered:                    # an axis no letter splits: whole
            boxes[:, :, ax, 0] = 0
            boxes[:, :, ax, 1] = np.where(used, layer.out_shape[ax], 0)
    if not (kdeg > 1).any():
        return boxes, None, boxes, used
    red = _reduce_range(layer, kdeg, kidx)
    owned = _scatter(layer, boxes, kdeg, kidx)
    owned[~used] = 0
    return boxes, red, owned, used


def stacked_live(layer: Layer, cfgs: list):
    """The used rows of :func:`stacked_boxes`, without the padding: ``(tiles [U, nd, 2],
    reduce [U, 2] or None, owned [U, nd, 2], ci [U], slot [U])`` for every configuration's
    devices in order (``U = Σ total``; row ``r`` is slot ``slot[r]`` of ``cfgs[ci[r]]``) -
    the same integers as ``stacked_boxes(...)[..][ci, slot]``.  At 1,024 devices a third of
    the padded rows are used, so this builds a third of the array and needs no gather."""
    C = len(cfgs)
    nd = len(layer.out_shape)
    total = np.array([c.total for c in cfgs], dtype=np.int64)
    ci = np.repeat(np.arange(C, dtype=np.int64), total)
    start = np.concatenate([[0], np.cumsum(total)[:-1]])
    slot = np.arange(len(ci), dtype=np.int64) - np.repeat(start, total)
    Dm = int(total.max()) if C else 0
    slots = np.arange(Dm, dtype=np.int64)
    tiles = np.empty((len(ci), nd, 2), dtype=np.int64)
    kd = np.array([c.deg(REDUCE) for c in cfgs], dtype=np.int64)
    stride = kd
    covered = set()
    for letter in reversed(layer.dims):          # as _stacked: per (stride, deg) pattern
        deg = np.array([c.deg(letter) for c in cfgs], dtype=np.int64)
        ax = layer.axis_of(letter)
        covered.add(ax)
        size = layer.out_shape[ax]
        pats, inv = np.unique(np.stack([stride, deg], axis=1), axis=0, return_inverse=True)
        st, dg = pats[:, :1], pats[:, 1:]
        idx = slots[None, :] // st % dg                                     # [P, Dm]
        row = inv.reshape(-1)[ci]
        tiles[:, ax, 0] = (idx * size // dg)[row, slot]
        tiles[:, ax, 1] = ((idx + 1) * size // dg)[row, slot]
        stride = stride * deg
    for ax in range(nd):
        if ax not in covered:
            tiles[:, ax, 0] = 0
            tiles[:, ax, 1] = layer.out_shape[ax]
    if not (kd > 1).any():
        return tiles, None, tiles, ci, slot
    kdeg = kd[ci]
    kidx = slot % kdeg
    return tiles, _reduce_range(layer, kdeg, kidx), _scatter(layer, tiles, kdeg, kidx), ci, slot


def stacked_boxes(layer: Layer, cfgs: list):
    """:func:`stacked_compute_boxes` and :func:`stacked_output_boxes` from one pass:
    ``(tiles, reduce, owned, used)``."""
    return _stacked(layer, cfgs)


def stacked_output_boxes(layer: Layer, cfgs: list):
    """Output boxes of many configurations at once: ``([C, Dmax, nd, 2], used [C, Dmax])``.

    Row ``k`` of configuration ``i`` is the tile of ``cfgs[i].devices[k]`` (same tiling as
    :func:`output_boxes`); rows past a configuration's device count are empty and unused.
    """
    _, _, owned, used = _stacked(layer, cfgs)
    return owned, used


def stacked_compute_boxes(layer: Layer, cfgs: list):
    """:func:`compute_boxes` of many configurations: ``(tiles [C, Dmax, nd, 2], reduce
    [C, Dmax, 2] or None, used [C, Dmax])``; ``reduce`` is ``None`` when no configuration has
    a ``k`` degree (rows of those without one span the whole reduction)."""
    tiles, red, _, used = _stacked(layer, cfgs)
    return tiles, red, used

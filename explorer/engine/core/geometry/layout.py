"""How tensors live on devices: one vocabulary for every kind of plan.

A :class:`TensorLayout` is a tensor's shape plus one box per device (int64
``[n_devices, ndim, 2]``; an empty box means the device holds nothing of it).  Each plan kind
makes one: a layer-wise configuration (:meth:`TensorLayout.from_config` - the output boxes
its devices own), a device placement (:meth:`TensorLayout.whole_on` - the whole tensor on one
device) and a Tofu tiling (:meth:`TensorLayout.from_boxes`).  A 0-d tensor is addressed as one
element: its boxes have one axis ``[0, 1)``.

An :class:`ExecutionLayout` is an operator-level plan as the runtime executes it: the layout
every tensor is held in and, per operator, the box each worker computes (:class:`OpLayout`).
Its JSON form (``to_json`` / ``from_json``, validated) lets a plan file carry it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from explorer.engine.core.geometry.boxes import full_box, is_empty, volume
from explorer.engine.core.geometry.config import output_boxes

REDUCERS = ("sum", "max", None)


def _as_boxes(boxes, what: str) -> np.ndarray:
    try:
        arr = np.asarray(boxes, dtype=np.int64)
    except (TypeError, ValueError):
        raise ValueError(f"{what}: boxes must be nested lists of integers "
                         f"[devices][axes][start, stop]") from None
    if arr.ndim == 2 and arr.shape[1] == 0:     # JSON of boxes without axes: [[], [], ...]
        arr = arr.reshape(len(arr), 0, 2)
    if arr.ndim != 3 or arr.shape[2] != 2:
        raise ValueError(f"{what}: boxes have shape {list(arr.shape)}, expected "
                         f"[devices, axes, 2]")
    return arr


def _check_inside(boxes: np.ndarray, shape: tuple, what: str):
    """Every non-empty box lies within ``shape`` and has its number of axes."""
    if boxes.shape[1] != len(shape):
        raise ValueError(f"{what}: boxes have {boxes.shape[1]} axes, the tensor {list(shape)} "
                         f"has {len(shape)}")
    size = np.asarray(shape, dtype=np.int64)
    bad = ~is_empty(boxes) & ((boxes[..., 0] < 0) | (boxes[..., 1] > size)).any(-1)
    if bad.any():
        w = int(np.flatnonzero(bad)[0])
        raise ValueError(f"{what}: device {w}'s box {boxes[w].tolist()} is outside the "
                         f"tensor's shape {list(shape)}")


def _one_element(n: int) -> np.ndarray:
    """``n`` boxes ``[[0, 1]]``: how a 0-d tensor is addressed (as one element)."""
    return np.tile(np.array([[[0, 1]]], dtype=np.int64), (n, 1, 1))


def _int(value, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{what} must be an integer, got {value!r}")
    return int(value)


@dataclass(frozen=True, eq=False)
class TensorLayout:
    """A tensor of ``shape`` held as ``boxes[d]`` on device ``d`` (empty box: not held)."""

    shape: tuple
    boxes: np.ndarray

    def __post_init__(self):
        shape = tuple(_int(s, "a tensor dimension") for s in self.shape)
        if any(s < 0 for s in shape):
            raise ValueError(f"tensor shape {list(shape)} has a negative dimension")
        boxes = _as_boxes(self.boxes, f"layout of a {list(shape)} tensor")
        if not shape and boxes.shape[1] == 0:       # 0-d boxes without axes: one element
            boxes = _one_element(boxes.shape[0])
        _check_inside(boxes, shape or (1,), f"layout of a {list(shape)} tensor")
        object.__setattr__(self, "shape", shape)
        object.__setattr__(self, "boxes", boxes)

    # -- constructors ----------------------------------------------------------------------
    @classmethod
    def from_boxes(cls, shape, boxes) -> "TensorLayout":
        """A Tofu tiling (or any explicit boxes, one per device)."""
        return cls(tuple(shape), boxes)

    @classmethod
    def whole_on(cls, shape, device, n_devices: int) -> "TensorLayout":
        """A device placement: the whole tensor on ``device`` (``None``: on every device)."""
        n = _int(n_devices, "n_devices")
        if n < 1:
            raise ValueError(f"n_devices must be ≥ 1, got {n}")
        shape = tuple(shape)
        boxes = np.zeros((n, max(len(shape), 1), 2), dtype=np.int64)
        whole = full_box(shape or (1,))
        if device is None:
            boxes[:] = whole
        else:
            d = _int(device, "device")
            if not 0 <= d < n:
                raise ValueError(f"device {d} is outside 0..{n - 1}")
            boxes[d] = whole
        return cls(shape, boxes)

    @classmethod
    def from_config(cls, layer, cfg, n_devices: int) -> "TensorLayout":
        """A layer-wise configuration: the output box of ``layer`` each device of ``cfg``
        owns (:func:`.config.output_boxes`); devices outside ``cfg`` hold nothing."""
        n = _int(n_devices, "n_devices")
        if max(cfg.devices) >= n:
            raise ValueError(f"configuration {cfg.key()} uses device {max(cfg.devices)}, "
                             f"outside 0..{n - 1}")
        boxes = np.zeros((n, len(layer.out_shape), 2), dtype=np.int64)
        boxes[list(cfg.devices)] = output_boxes(layer, cfg)
        return cls(tuple(layer.out_shape), boxes)

    # -- questions -------------------------------------------------------------------------
    @property
    def n_devices(self) -> int:
        return int(self.boxes.shape[0])

    def holders(self) -> list:
        """Devices that hold some of the tensor."""
        return [int(d) for d in np.flatnonzero(~is_empty(self.boxes))]

    def elements_per_device(self) -> np.ndarray:
        """``[n_devices]`` elements each device holds."""
        return volume(self.boxes).astype(np.int64)

    def bytes_per_device(self, dtype_bytes: int) -> np.ndarray:
        """``[n_devices]`` bytes each device holds at ``dtype_bytes`` per element."""
        return self.elements_per_device() * int(dtype_bytes)

    def replication(self) -> float:
        """Elements held over all devices per element of the tensor: 1.0 for a partition,
        ``n`` for a tensor every one of ``n`` devices holds whole."""
        total = int(np.prod(self.shape)) if self.shape else 1
        return float(self.elements_per_device().sum()) / max(total, 1)

    def __eq__(self, other):
        if not isinstance(other, TensorLayout):
            return NotImplemented
        return self.shape == other.shape and np.array_equal(self.boxes, other.boxes)

    __hash__ = None

    # -- JSON ------------------------------------------------------------------------------
    def to_json(self) -> dict:
        return {"shape": list(self.shape), "boxes": self.boxes.tolist()}

    @classmethod
    def from_json(cls, doc) -> "TensorLayout":
        if not isinstance(doc, dict) or not {"shape", "boxes"} <= set(doc):
            raise ValueError("a tensor layout is an object with \"shape\" and \"boxes\"")
        if not isinstance(doc["shape"], (list, tuple)):
            raise ValueError(f"tensor layout shape must be a list, got {doc['shape']!r}")
        return cls(tuple(doc["shape"]), doc["boxes"])


@dataclass(eq=False)
class OpLayout:
    """What every worker does for one operator.

    ``out[w]`` is the box of the output worker ``w`` computes; ``needs[t][w]`` the region of
    input ``t`` it reads; ``reducer`` how workers' partial outputs combine (``"sum"``,
    ``"max"`` or ``None`` - no reduction split); ``zero[t][w]`` marks inputs worker ``w`` must
    not add (terms outside a split sum, e.g. a bias, are added by one worker only).
    """

    out: np.ndarray
    needs: dict
    reducer: str | None = None
    zero: dict = field(default_factory=dict)


@dataclass(eq=False)
class ExecutionLayout:
    """An operator-level plan (a Tofu partition or a device placement) for ``workers``.

    ``held[t]`` is the :class:`TensorLayout` tensor ``t`` lives in, ``ops[o]`` the
    :class:`OpLayout` of operator ``o``; ``cache`` lets a worker keep pieces it received
    (a placement sends each tensor once to each device reading it).  Construction validates
    worker counts, box shapes (inside the held tensors) and reducers.
    """

    workers: int
    held: dict
    ops: dict
    cache: bool = False

    def __post_init__(self):
        K = self.workers = _int(self.workers, "workers")
        if K < 1:
            raise ValueError(f"workers must be ≥ 1, got {K}")
        for t, lay in self.held.items():
            if not isinstance(lay, TensorLayout):
                raise ValueError(f"held[{t!r}] must be a TensorLayout")
            if lay.n_devices != K:
                raise ValueError(f"tensor {t} has boxes for {lay.n_devices} workers, the plan "
                                 f"has {K}")
        for o, op in self.ops.items():
            where = f"operator {o}"
            op.out = _as_boxes(op.out, f"{where} output")
            if op.out.shape[1] == 0:                  # a 0-d output: one element
                op.out = _one_element(op.out.shape[0])
            if op.out.shape[0] != K:
                raise ValueError(f"{where}: output boxes for {op.out.shape[0]} workers, the "
                                 f"plan has {K}")
            if op.reducer not in REDUCERS:
                raise ValueError(f"{where}: reducer {op.reducer!r} is not one of "
                                 f"\"sum\", \"max\" or null")
            needs = {}
            for t, boxes in op.needs.items():
                if t not in self.held:
                    raise ValueError(f"{where} reads tensor {t}, which the plan does not hold")
                arr = _as_boxes(boxes, f"{where}, input {t}")
                if arr.shape[0] != K:
                    raise ValueError(f"{where}, input {t}: boxes for {arr.shape[0]} workers, "
                                     f"the plan has {K}")
                lay = self.held[t]
                if not lay.shape and arr.shape[1] == 0:
                    arr = _one_element(K)
                _check_inside(arr, lay.shape or (1,), f"{where}, input {t}")
                needs[t] = arr
            op.needs = needs
            zero = {}
            for t, flags in op.zero.items():
                if t not in needs:
                    raise ValueError(f"{where}: zero flags for {t}, which it does not read")
                arr = np.asarray(flags)
                if arr.shape != (K,) or arr.dtype != bool:
                    raise ValueError(f"{where}, input {t}: zero flags must be {K} booleans, "
                                     f"got {arr.tolist()!r}")
                zero[t] = arr
            op.zero = zero

    # -- the runtime's dict ----------------------------------------------------------------
    @classmethod
    def from_plan(cls, plan: dict, shapes: dict) -> "ExecutionLayout":
        """From the dict ``tofu.execution_plan`` / ``placement_xplan`` produce, with the shape
        of every held tensor (``{tensor: shape}``)."""
        missing = [t for t in plan["held"] if t not in shapes]
        if missing:
            raise ValueError(f"no shape for held tensor {missing[0]} ({len(missing)} missing)")
        held = {t: TensorLayout(tuple(shapes[t]), b) for t, b in plan["held"].items()}
        ops = {o: OpLayout(v["out"], dict(v["needs"]), v.get("reducer"), dict(v.get("zero", {})))
               for o, v in plan["ops"].items()}
        return cls(plan["workers"], held, ops, bool(plan.get("cache", False)))

    def to_plan(self) -> dict:
        """The dict the runtime's workers read: ``{"workers", "held": {t: boxes}, "ops": {o:
        {"out", "needs", "reducer", "zero"}}, "cache"}``."""
        return {"workers": self.workers, "cache": self.cache,
                "held": {t: lay.boxes for t, lay in self.held.items()},
                "ops": {o: {"out": op.out, "needs": dict(op.needs), "reducer": op.reducer,
                            "zero": dict(op.zero)} for o, op in self.ops.items()}}

    # -- JSON ------------------------------------------------------------------------------
    def to_json(self) -> dict:
        """Compact JSON (what a saved plan carries): boxes repeat a lot (every tensor of a
        shape tiled alike), so each distinct ``[K, nd, 2]`` box array is stored once in
        ``boxes`` and referred to by index; ``shapes`` gives every held tensor's shape;
        ``reducer`` and ``zero`` are left out where empty."""
        table: dict = {}
        boxes: list = []

        def ref(arr) -> int:
            a = np.asarray(arr, dtype=np.int64)
            key = (a.shape, a.tobytes())
            if key not in table:
                table[key] = len(boxes)
                boxes.append(a.tolist())
            return table[key]
        ops = {}
        for o, op in self.ops.items():
            d = {"out": ref(op.out), "needs": {t: ref(b) for t, b in op.needs.items()}}
            if op.reducer:
                d["reducer"] = op.reducer
            if op.zero:
                d["zero"] = {t: [bool(x) for x in z] for t, z in op.zero.items()}
            ops[o] = d
        held = {t: ref(lay.boxes) for t, lay in self.held.items()}
        out = {"workers": self.workers, "boxes": boxes,
               "shapes": {t: list(lay.shape) for t, lay in self.held.items()},
               "held": held, "ops": ops}
        if self.cache:
            out["cache"] = True
        return out

    @classmethod
    def from_json(cls, doc) -> "ExecutionLayout":
        """:meth:`to_json` read back and validated; ``ValueError`` naming what is wrong."""
        if not isinstance(doc, dict) or not {"workers", "boxes", "shapes", "held",
                                             "ops"} <= set(doc):
            raise ValueError("an execution layout is an object with \"workers\", \"boxes\", "
                             "\"shapes\", \"held\" and \"ops\"")
        for key in ("shapes", "held", "ops"):
            if not isinstance(doc[key], dict):
                raise ValueError(f"execution layout \"{key}\" must be an object")
        if not isinstance(doc["boxes"], list):
            raise ValueError("execution layout \"boxes\" must be a list")

        def box(i, where):
            if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < len(doc["boxes"]):
                raise ValueError(f"{where}: box index {i!r} is not one of the "
                                 f"{len(doc['boxes'])} boxes")
            return doc["boxes"][i]
        held = {}
        for t, i in doc["held"].items():
            boxes = box(i, f"tensor {t}")
            if t not in doc["shapes"]:
                raise ValueError(f"tensor {t} is held but has no shape")
            held[t] = TensorLayout(tuple(doc["shapes"][t]), boxes)
        ops = {}
        for o, v in doc["ops"].items():
            if not isinstance(v, dict) or not {"out", "needs"} <= set(v):
                raise ValueError(f"operator {o}: needs \"out\" and \"needs\"")
            zero = v.get("zero") or {}
            if not isinstance(v["needs"], dict) or not isinstance(zero, dict):
                raise ValueError(f"operator {o}: \"needs\" and \"zero\" must be objects")
            ops[o] = OpLayout(box(v["out"], f"operator {o}"),
                              {t: box(i, f"operator {o}, input {t}")
                               for t, i in v["needs"].items()},
                              v.get("reducer"), {t: np.asarray(z) for t, z in zero.items()})
        return cls(doc["workers"], held, ops, bool(doc.get("cache", False)))

"""Measured compute cost t_C: run one device's shard of a layer and time it (OptCNN Section 5.1).

The paper estimates t_C "by processing the layer under that configuration multiple times on the
device and measuring the average execution time".  :class:`Profiler` does exactly that for the
shard a device owns: it builds the shard's computation from real random tensors of the shapes
geometry gives (output box, input regions, parameter shards), runs forward and backward
``warmup + reps`` times on the local device and returns the median of the timed runs.

Results are cached in SQLite, keyed by ``(device_kind, signature, shape)``: the op with the
attributes that change its cost (and which inputs get no gradient, e.g. a layer fed by the
model input), and the shard's output/input shapes.  Equal shards of different layers (the 16
identical 3x3 convolutions of a ResNet stage) and the second search of the same model
therefore cost nothing.

Measurements taken elsewhere (other processes, other machines) go in with
:meth:`Profiler.record` / :meth:`Profiler.put_rows` and :func:`merge_caches` (the mean of the
caches' entries); ``Profiler(cold=True)`` evicts the caches before each timed run, as the layers
before it do in a training step.  A shard can also be stored for ``concurrency`` k > 1: its time
while k worker processes run their shards of the same layer in lockstep (``explorer
calibrate`` measures those; the cores share the memory system, and a step waits for the slowest
worker); :meth:`Profiler.measure` returns that entry when asked for it and present, else the
time of the shard alone.

Example
-------
>>> from explorer.engine.core.layergraph import Layer
>>> fc = Layer("fc", "linear", (4, 8), ("n", "c"), in_shapes=((4, 16),),
...            params={"weight": (8, 16)})
>>> with Profiler(":memory:", reps=1, warmup=0) as p:
...     p.measure(fc, (4, 8), [(4, 16)], "cpu") > 0
True
"""

from __future__ import annotations

import functools
import json
import math
import os
import sqlite3
import statistics
import threading
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from explorer.engine.core.layergraph import Layer
from explorer.engine.core.storage import connect, home

#: Attributes that change an op's cost, per op (the rest of the key is the shard's shapes).
_SIG_ATTRS = {
    "conv": ("kernel", "stride", "padding", "dilation", "groups"),
    "pool": ("kernel", "stride", "padding", "dilation"),
    "adaptive_pool": (),
    "linear": (),
    "matmul": (),
    "sdpa": (),
    "eltwise": ("fn",),
    "concat": ("dim",),
    "norm": ("full_axes",),
    "softmax": ("full_axes",),
    "cumsum": ("full_axes",),
    "experts": (),
    "reduce": ("dims", "keepdim"),
    "embedding": (),
    "lstm_cell": ("has_state",),
    "mha": ("batch_first", "heads"),
}

_RUN_LOCK = threading.Lock()

_SCHEMA = """CREATE TABLE IF NOT EXISTS profile (
    device_kind TEXT, signature TEXT, shape TEXT, seconds REAL, reps INTEGER,
    measured_at REAL, PRIMARY KEY(device_kind, signature, shape))"""


def default_cache_path() -> Path:
    """``$EXPLORER_HOME/profile.sqlite`` (``EXPLORER_HOME`` defaults to ``~/.plan-explorer``)."""
    return home(create=False) / "profile.sqlite"


# --------------------------------------------------------------------------------------------
# What a layer's shard computes
# --------------------------------------------------------------------------------------------


def _pool_kind(layer: Layer) -> str:
    """``"max"`` or ``"avg"``.

    The importer does not record which pooling a ``pool`` layer is; an explicit
    ``attrs["kind"]``/``attrs["mode"]`` wins, else a name or module path containing ``avg``
    means average pooling, else max pooling (the two cost about the same).
    """
    kind = str(layer.attrs.get("kind", layer.attrs.get("mode", ""))).lower()
    if kind.startswith(("avg", "mean")):
        return "avg"
    if kind.startswith("max"):
        return "max"
    return "avg" if "avg" in f"{layer.name} {layer.module}".lower() else "max"


def _has_bn(layer: Layer) -> bool:
    """Whether a BatchNorm (or another per-channel parameter op) was folded into ``layer``.

    Folded BatchNorm shows up as a folded node named like ``bn``/``batch_norm`` or as qualified
    1-D parameters (``layer1.0.downsample.1.weight``) next to the op's own ``weight``/``bias``.
    """
    if layer.op in ("norm", "lstm_cell", "embedding", "input"):
        return False
    if any(k in f.lower() for f in layer.folded for k in ("bn", "batch_norm", "batchnorm")):
        return True
    return any(k.endswith(("running_mean", "running_var")) or ("." in k and len(s) == 1)
               for k, s in layer.params.items())


def _canonical(v):
    """A layer attribute as the JSON value its signature holds (sequences as lists, numbers
    as ints, anything else as its text) - not a JSON encoder: it decides cache keys."""
    if isinstance(v, (list, tuple)):
        return [_canonical(x) for x in v]
    if isinstance(v, (bool, str)) or v is None:
        return v
    if isinstance(v, float):
        return v
    try:
        return int(v)
    except (TypeError, ValueError):
        return str(v)


def signature(layer: Layer, on: str = "", input_grads=None) -> str:
    """Canonical text of what, besides shapes, decides the cost of ``layer``'s shards.

    The op, the attributes that matter (kernel, stride, padding, dilation, groups, fn, dims,
    ...), parameter facts the shard computation depends on (bias, vocabulary, full hidden size,
    channel count for grouped convolutions), the folded element-wise epilogue and ``on`` (the
    device that measured).  Layer names are left out so equal layers share cache entries.
    ``input_grads`` (one bool per op input) marks the inputs that get no gradient; they are
    named in the signature (``"no_grad_in"``), all-``True`` leaves it unchanged.
    """
    op, a, p = layer.op, layer.attrs, layer.params
    sig = {"op": op}
    for k in _SIG_ATTRS.get(op, tuple(sorted(a))):
        if k in a:
            sig[k] = _canonical(a[k])
    if op in ("conv", "linear"):
        sig["bias"] = "bias" in p
        if op == "conv" and a.get("groups", 1) > 1:
            sig["cout"] = int(layer.out_shape[1])
    elif op == "conv_transpose":
        sig["bias"] = "bias" in p
        if a.get("groups", 1) > 1:
            sig["cout"] = int(layer.out_shape[1])
    elif op == "pool":
        sig["kind"] = _pool_kind(layer)
    elif op == "adaptive_pool" and a.get("kind") == "max":
        sig["kind"] = "max"
    elif op == "norm":
        sig["affine"] = [k for k in ("weight", "bias") if k in p]
    elif op == "embedding":
        sig["vocab"] = _vocab(layer)
    elif op == "lstm_cell":
        sig["hidden"] = _lstm_hidden(layer)
        sig["bias"] = sorted(k for k in p if k.startswith("bias"))
    sig["relu"] = bool(layer.folded)
    sig["bn"] = _has_bn(layer)
    if input_grads is not None and not all(input_grads):
        sig["no_grad_in"] = [i for i, g in enumerate(input_grads) if not g]
    if on:
        sig["on"] = on
    return json.dumps(sig, sort_keys=True, separators=(",", ":"))


def _vocab(layer: Layer) -> int:
    w = layer.params.get("weight")
    if w is None:
        w = next((s for s in layer.params.values() if len(s) == 2), None)
    if w is None:
        raise ValueError(f"cannot profile embedding layer {layer.name}: no weight table in "
                         f"its parameters {list(layer.params)}")
    return int(w[0])


def _lstm_hidden(layer: Layer) -> int:
    for k, s in layer.params.items():
        if k.startswith("weight_hh"):
            return int(s[1])
    return int(layer.out_shape[1])


class _Builder:
    """Random tensors for one shard on one device; remembers the ones gradients flow to.

    ``input_grads`` (one bool per op input, ``None``: all) says which inputs need a gradient;
    rules create op inputs with :meth:`input`."""

    def __init__(self, device: str, seed: int = 0, input_grads=None):
        self.device = device
        self.gen = torch.Generator(device=device)
        self.gen.manual_seed(seed)
        self.leaves: list = []
        self.input_grads = None if input_grads is None else [bool(g) for g in input_grads]

    def input(self, i: int, shape) -> torch.Tensor:
        """Op input ``i`` (a gradient leaf unless ``input_grads[i]`` is false)."""
        grad = self.input_grads is None or i >= len(self.input_grads) or self.input_grads[i]
        return self.rand(shape, grad)

    def rand(self, shape, grad: bool = True) -> torch.Tensor:
        t = torch.randn(tuple(int(s) for s in shape), generator=self.gen, device=self.device,
                        dtype=torch.float32)
        if grad:
            t.requires_grad_(True)
            self.leaves.append(t)
        return t

    def ids(self, shape, high: int) -> torch.Tensor:
        return torch.randint(0, max(int(high), 1), tuple(int(s) for s in shape),
                             generator=self.gen, device=self.device, dtype=torch.int64)


def _window_fit(out: int, region: int, k: int, s: int, d: int, max_pad: int | None = None):
    """``(input extent, symmetric padding)`` so a window op yields exactly ``out`` outputs.

    The rows the ``out`` windows read are ``needed = (out-1)·s + d·(k-1) + 1``; the region
    geometry gives lacks only the zero padding at the tensor's borders, so the shard pads it
    back (symmetrically, as conv/pool padding arguments do, one extra data row when the
    missing count is odd) or, if the region is larger, reads only ``needed`` rows.
    """
    needed = (out - 1) * s + d * (k - 1) + 1
    missing = needed - region
    pad = missing // 2 if missing > 0 else 0
    if max_pad is not None:
        pad = min(pad, max_pad)
    return needed - 2 * pad, pad


def _conv(layer, out_shape, in_shapes, b):
    a = layer.attrs
    nsp = len(out_shape) - 2
    x_shape = in_shapes[0]
    k, s = tuple(a["kernel"]), tuple(a["stride"])
    d = tuple(a.get("dilation", (1,) * nsp))
    ext, pad = zip(*(_window_fit(out_shape[2 + i], x_shape[2 + i], k[i], s[i], d[i])
                     for i in range(nsp)))
    cout, cin = int(out_shape[1]), int(x_shape[1])
    g = int(a.get("groups", 1))
    if g > 1:  # the shard's share of the groups, kept a divisor of both channel counts
        g = math.gcd(max(1, g * cout // layer.out_shape[1]), math.gcd(cin, cout))
    x = b.input(0, (x_shape[0], cin) + ext)
    w = b.rand((cout, cin // g) + k)
    bias = b.rand((cout,)) if "bias" in layer.params else None
    conv = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}[nsp]
    return lambda: [conv(x, w, bias, s, pad, d, g)]


def _conv_transpose(layer, out_shape, in_shapes, b):
    """The transposed convolution of the shard's input region without padding, cut (or zero
    padded) to the output box's extent, as the runtime computes it."""
    a = layer.attrs
    nsp = len(out_shape) - 2
    x_shape = in_shapes[0]
    k, s = tuple(a["kernel"]), tuple(a["stride"])
    d = tuple(a.get("dilation", (1,) * nsp))
    cout, cin = int(out_shape[1]), int(x_shape[1])
    g = int(a.get("groups", 1))
    if g > 1:  # the shard's share of the groups, kept a divisor of both channel counts
        g = math.gcd(max(1, g * cout // layer.out_shape[1]), math.gcd(cin, cout))
    x = b.input(0, (x_shape[0], cin) + tuple(max(1, int(e)) for e in x_shape[2:]))
    w = b.rand((cin, cout // g) + k)
    bias = b.rand((cout,)) if "bias" in layer.params else None
    conv = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}[nsp]
    fit = []                 # F.pad order: last axis first, (before, after) each
    for i in reversed(range(nsp)):
        made = (x.shape[2 + i] - 1) * s[i] + d[i] * (k[i] - 1) + 1
        fit += [0, int(out_shape[2 + i]) - made]

    def run():
        y = F.pad(conv(x, w, None, s, 0, 0, g, d), fit)
        if bias is not None:
            y = y + bias.reshape((1, -1) + (1,) * nsp)
        return [y]
    return run


def _pool(layer, out_shape, in_shapes, b):
    a = layer.attrs
    nsp = len(out_shape) - 2
    x_shape = in_shapes[0]
    k, s = tuple(a["kernel"]), tuple(a["stride"])
    kind = _pool_kind(layer)
    d = tuple(a.get("dilation", (1,) * nsp)) if kind == "max" else (1,) * nsp
    ext, pad = zip(*(_window_fit(out_shape[2 + i], x_shape[2 + i], k[i], s[i], d[i],
                                 max_pad=(d[i] * (k[i] - 1) + 1) // 2 if kind == "max"
                                 else k[i] // 2)
                     for i in range(nsp)))
    x = b.input(0, tuple(x_shape[:2]) + ext)
    if kind == "max":
        fn = {1: F.max_pool1d, 2: F.max_pool2d, 3: F.max_pool3d}[nsp]
        return lambda: [fn(x, k, s, pad, d)]
    fn = {1: F.avg_pool1d, 2: F.avg_pool2d, 3: F.avg_pool3d}[nsp]
    return lambda: [fn(x, k, s, pad)]


def _adaptive_pool(layer, out_shape, in_shapes, b):
    nsp = len(out_shape) - 2
    x = b.input(0, in_shapes[0])
    if layer.attrs.get("kind") == "max":
        fn = {1: F.adaptive_max_pool1d, 2: F.adaptive_max_pool2d, 3: F.adaptive_max_pool3d}[nsp]
    else:
        fn = {1: F.adaptive_avg_pool1d, 2: F.adaptive_avg_pool2d, 3: F.adaptive_avg_pool3d}[nsp]
    size = tuple(int(v) for v in out_shape[2:])
    return lambda: [fn(x, size)]


def _upsample(layer, out_shape, in_shapes, b):
    x = b.input(0, in_shapes[0])
    size = tuple(int(v) for v in out_shape[2:])
    mode = layer.attrs.get("mode", "nearest")
    if mode != "nearest":
        mode = {1: "linear", 2: "bilinear", 3: "trilinear"}[len(size)]
        return lambda: [F.interpolate(x, size=size, mode=mode, align_corners=False)]
    return lambda: [F.interpolate(x, size=size, mode="nearest")]


def _linear(layer, out_shape, in_shapes, b):
    x = b.input(0, in_shapes[0])
    w = b.rand((out_shape[-1], in_shapes[0][-1]))
    bias = b.rand((out_shape[-1],)) if "bias" in layer.params else None
    return lambda: [F.linear(x, w, bias)]


def _experts(layer, out_shape, in_shapes, b):
    """This device's experts: ``x [n, e, C, in] @ W [e, in, out]``."""
    x = b.input(0, in_shapes[0])
    w = b.rand((out_shape[1], in_shapes[0][-1], out_shape[-1]))
    return lambda: [torch.matmul(x, w)]


def _cumsum(layer, out_shape, in_shapes, b):
    x = b.input(0, in_shapes[0])
    dim = layer.attrs["full_axes"][0]
    return lambda: [torch.cumsum(x, dim)]


def _matmul(layer, out_shape, in_shapes, b):
    x, y = b.input(0, in_shapes[0]), b.input(1, in_shapes[1])
    return lambda: [torch.matmul(x, y)]


def _sdpa(layer, out_shape, in_shapes, b):
    q, k, v = (b.input(i, s) for i, s in enumerate(in_shapes[:3]))
    return lambda: [F.scaled_dot_product_attention(q, k, v)]


def _mha(layer, out_shape, in_shapes, b):
    """``nn.MultiheadAttention`` on the shard's samples and query rows (whole projections)."""
    q, k, v = (b.input(i, s) for i, s in enumerate(in_shapes[:3]))
    if layer.attrs.get("batch_first"):
        q, k, v = (t.transpose(0, 1) for t in (q, k, v))
    e, heads = int(out_shape[-1]), int(layer.attrs.get("heads", 1))
    w_in, b_in = b.rand((3 * e, e)), b.rand((3 * e,))
    w_out, b_out = b.rand((e, e)), b.rand((e,))
    return lambda: [F.multi_head_attention_forward(q, k, v, e, heads, w_in, b_in, None, None,
                                                   False, 0.0, w_out, b_out,
                                                   need_weights=False)[0]]


_ELTWISE = {"add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div,
            "max": torch.maximum, "min": torch.minimum}


def _eltwise(layer, out_shape, in_shapes, b):
    xs = [b.input(i, s) for i, s in enumerate(in_shapes)]
    fn = _ELTWISE.get(layer.attrs.get("fn", "add"), torch.add)  # pow etc.: an add's cost
    return lambda: [functools.reduce(fn, xs)]


def _concat(layer, out_shape, in_shapes, b):
    xs = [b.input(i, s) for i, s in enumerate(in_shapes)]
    dim = layer.attrs["dim"]
    return lambda: [torch.cat(xs, dim)]


def _norm(layer, out_shape, in_shapes, b):
    x = b.input(0, in_shapes[0])
    nshape = tuple(in_shapes[0][-len(layer.attrs["full_axes"]):])
    w = b.rand(nshape) if "weight" in layer.params else None
    bias = b.rand(nshape) if "bias" in layer.params else None
    return lambda: [F.layer_norm(x, nshape, w, bias)]


def _softmax(layer, out_shape, in_shapes, b):
    x = b.input(0, in_shapes[0])
    dim = layer.attrs["full_axes"][0]
    return lambda: [F.softmax(x, dim)]


def _reduce(layer, out_shape, in_shapes, b):
    x = b.input(0, in_shapes[0])
    dims, keep = tuple(layer.attrs["dims"]), bool(layer.attrs.get("keepdim", True))
    return lambda: [x.mean(dim=dims, keepdim=keep)]


def _embedding(layer, out_shape, in_shapes, b):
    vocab = _vocab(layer)
    ids = b.ids(in_shapes[0], vocab)
    table = b.rand((vocab, out_shape[-1]))
    return lambda: [F.embedding(ids, table)]


def _lstm_cell(layer, out_shape, in_shapes, b):
    """Gate rows of this device's hidden units: ``gates = x W_ih' + h W_hh' + b``."""
    n, hid = int(out_shape[0]), int(out_shape[1])
    full = _lstm_hidden(layer)
    x = b.input(0, in_shapes[0])
    if len(in_shapes) >= 3:
        h, c = b.input(1, in_shapes[1]), b.input(2, in_shapes[2])
    else:  # no state: nn.LSTMCell still multiplies a zero h
        h = torch.zeros((n, full), device=b.device)
        c = torch.zeros((n, hid), device=b.device)
    w_ih = b.rand((4 * hid, in_shapes[0][1]))
    w_hh = b.rand((4 * hid, h.shape[1]))
    biases = [b.rand((4 * hid,)) for k in ("bias_ih", "bias_hh") if k in layer.params]

    def run():
        gates = F.linear(x, w_ih) + F.linear(h, w_hh)
        for bb in biases:
            gates = gates + bb
        i, f, g, o = gates.chunk(4, 1)
        c2 = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        return [torch.sigmoid(o) * torch.tanh(c2), c2]
    return run


def _param(layer, out_shape, in_shapes, b):
    """A parameter read as an activation: its broadcast (the backward sums it back)."""
    shape = next(iter(layer.params.values()), out_shape)
    nd = len(out_shape)
    part = tuple(1 if s == 1 else o for s, o in zip(shape, tuple(out_shape)[nd - len(shape):]))
    p = b.rand(part, grad=bool(layer.params))
    return lambda: [p.expand(tuple(out_shape))]


_RULES = {"param": _param, "conv": _conv, "pool": _pool, "adaptive_pool": _adaptive_pool, "linear": _linear,
          "upsample": _upsample,
          "matmul": _matmul, "sdpa": _sdpa, "eltwise": _eltwise, "concat": _concat,
          "norm": _norm, "softmax": _softmax, "reduce": _reduce, "embedding": _embedding,
          "lstm_cell": _lstm_cell, "mha": _mha, "experts": _experts, "cumsum": _cumsum}
_RULES["conv_transpose"] = _conv_transpose


def build_shard(layer: Layer, out_shape, in_shapes, device: str = "cpu", seed: int = 0,
                input_grads=None):
    """``(run, leaves)``: a closure computing the shard's outputs, and its gradient leaves.

    ``run()`` returns a list of output tensors, the first of shape ``out_shape``; folded work
    is appended to it: a per-channel affine for a folded BatchNorm, then one ReLU for the
    folded element-wise ops.  ``leaves`` are the inputs and weight shards that need gradients;
    ``input_grads`` (one bool per op input, default all ``True``) leaves out the inputs that
    get no gradient (the model input: backward then skips the input gradient, as in a step).
    """
    rule = _RULES.get(layer.op)
    if rule is None:
        raise ValueError(f"cannot profile op {layer.op!r} (layer {layer.name})")
    if layer.op == "concat":
        keep = [i for i, s in enumerate(in_shapes) if all(v > 0 for v in s)]
        in_shapes = [in_shapes[i] for i in keep]
        if input_grads is not None:
            input_grads = [input_grads[i] for i in keep]
    b = _Builder(device, seed, input_grads)
    run = rule(layer, tuple(out_shape), [tuple(s) for s in in_shapes], b)
    affine = None
    if _has_bn(layer) and "c" in layer.axes:
        ax = layer.axes.index("c")
        shp = [1] * len(out_shape)
        shp[ax] = out_shape[ax]
        affine = (b.rand(shp), b.rand(shp))
    relu = bool(layer.folded)
    if affine is None and not relu:
        return run, b.leaves

    def run_with_epilogue():
        outs = run()
        y = outs[0]
        if affine is not None:
            y = y * affine[0] + affine[1]
        if relu:
            y = F.relu(y)
        return [y] + outs[1:]
    return run_with_epilogue, b.leaves


# --------------------------------------------------------------------------------------------
# The profiler
# --------------------------------------------------------------------------------------------


class Profiler:
    """Measures forward+backward time of one device's shard of a layer on the local device
    (CPU here, CUDA when present), caching results in SQLite so the second search is instant.

    Parameters
    ----------
    cache_path : path of the SQLite file; ``None`` means ``$EXPLORER_HOME/profile.sqlite``
        (``EXPLORER_HOME`` defaults to ``~/.plan-explorer``); ``":memory:"`` keeps nothing.
    reps : timed forward+backward runs; the median is the result.
    warmup : untimed runs before them (at least one always runs: it allocates the output
        gradients and warms the allocator and kernel caches).
    device : ``"cpu"`` or ``"cuda"``; ``None``: ``$EXPLORER_DEVICE``, else CUDA when available.
    budget_s : cap on the timed runs of one shard: when the first run shows that ``reps``
        runs would take longer, fewer (at least one) are timed and no further warm-up runs
        happen.  Long runs vary little, and this keeps a CPU profile of a large model from
        taking hours.  ``None`` always runs ``warmup + reps``.
    cold : write a buffer larger than the last-level cache (``flush_bytes``, default 8 MiB or
        ``$EXPLORER_PROFILE_FLUSH_MB``) before every run.  In a training step each layer finds
        its weights and inputs evicted by the layers before it; a hot loop over the same
        tensors underestimates small layers by 30–50 % on a 2-core VM.  Cold runs all do
        ``warmup + reps`` (within ``budget_s`` of timed time).

    Attributes
    ----------
    last_profile_s : wall time spent building and running shards in the most recent
        :meth:`measure` call (0.0 on a cache hit).
    hits, misses : cache hits and measurements so far.
    """

    def __init__(self, cache_path=None, reps: int = 5, warmup: int = 2,
                 device: str | None = None, budget_s: float | None = 5.0, cold: bool = False,
                 flush_bytes: int | None = None, dtype: str = "fp32"):
        from explorer.engine.core.precision import check
        self.dtype = check(dtype)
        if reps < 1:
            raise ValueError(f"reps must be ≥ 1, got {reps}")
        if warmup < 0:
            raise ValueError(f"warmup must be ≥ 0, got {warmup}")
        if budget_s is not None and not budget_s > 0:
            raise ValueError(f"budget_s must be > 0 or None, got {budget_s}")
        self.reps, self.warmup, self.budget_s = int(reps), int(warmup), budget_s
        self.cold = bool(cold)
        self.flush_bytes = int(flush_bytes if flush_bytes is not None else
                               int(os.environ.get("EXPLORER_PROFILE_FLUSH_MB", "8")) * 2 ** 20)
        if device is None:             # $EXPLORER_DEVICE (tests: cpu), else CUDA when there
            from explorer.engine.core.devices import worker_device_kind
            device = worker_device_kind()
        self.device = device
        dev_type = torch.device(self.device).type
        if dev_type == "cuda":
            if not torch.cuda.is_available():
                raise ValueError("device 'cuda' asked for but torch sees no CUDA device")
            self._on = "cuda:" + torch.cuda.get_device_name(torch.device(self.device))
        else:
            self._on = dev_type
        if self.dtype != "fp32":       # fp32 entries keep their keys (caches stay valid)
            self._on += f"|{self.dtype}"
        self._cuda = dev_type == "cuda"
        path = default_cache_path() if cache_path is None else cache_path
        if str(path) != ":memory:":
            path = Path(path).expanduser()
        self.cache_path = path
        self._lock = threading.Lock()
        self._conn = connect(path, _SCHEMA, timeout=60.0, check_same_thread=False)
        self.last_profile_s = 0.0
        self.hits = 0
        self.misses = 0

    # -- cache -------------------------------------------------------------------------------
    @staticmethod
    def _shape_key(out_shape, in_shapes) -> str:
        return json.dumps([[int(v) for v in out_shape], [[int(v) for v in s] for s in in_shapes]],
                          separators=(",", ":"))

    def _db(self) -> sqlite3.Connection:
        if self._conn is None:
            raise ValueError(f"this Profiler ({self.cache_path}) was closed")
        return self._conn

    def _key(self, layer: Layer, out_shape, in_shapes, device_kind: str,
             input_grads=None, concurrency: int = 1) -> tuple:
        on = self._on if int(concurrency) <= 1 else f"{self._on}|x{int(concurrency)}"
        return (str(device_kind), signature(layer, on, input_grads),
                self._shape_key(out_shape, in_shapes))

    def key(self, layer: Layer, out_shape, in_shapes, device_kind: str,
            input_grads=None, concurrency: int = 1) -> tuple:
        """The cache key ``(device_kind, signature, shape)`` of a shard (see :meth:`measure`)."""
        return self._key(layer, [int(v) for v in out_shape],
                         [[int(v) for v in s] for s in in_shapes], device_kind, input_grads,
                         concurrency)

    def _get(self, key: tuple) -> float | None:
        with self._lock:
            row = self._db().execute(
                "SELECT seconds FROM profile WHERE device_kind=? AND signature=? AND shape=?",
                key).fetchone()
        return None if row is None else float(row[0])

    def lookup(self, layer: Layer, out_shape, in_shapes, device_kind: str,
               input_grads=None, concurrency: int = 1) -> float | None:
        """The cached time of this shard, or ``None`` (counts neither a hit nor a miss)."""
        return self._get(self.key(layer, out_shape, in_shapes, device_kind, input_grads,
                                  concurrency))

    def record(self, layer: Layer, out_shape, in_shapes, device_kind: str, seconds: float,
               reps: int = 1, input_grads=None, concurrency: int = 1) -> tuple:
        """Store a measurement taken elsewhere under the shard's key; returns the key.
        ``concurrency`` k > 1: the time while k workers ran the layer's shards together."""
        key = self.key(layer, out_shape, in_shapes, device_kind, input_grads, concurrency)
        self.put_rows([key + (float(seconds), int(reps), time.time())])
        return key

    def rows(self) -> list:
        """Every cached entry: ``(device_kind, signature, shape, seconds, reps, measured_at)``."""
        with self._lock:
            return [tuple(r) for r in self._db().execute(
                "SELECT device_kind, signature, shape, seconds, reps, measured_at FROM profile")]

    def put_rows(self, rows) -> int:
        """Insert or replace entries given as :meth:`rows` returns them; returns the count."""
        rows = [tuple(r) for r in rows]
        for r in rows:
            if len(r) != 6:
                raise ValueError(f"a profile row has 6 fields (device_kind, signature, shape, "
                                 f"seconds, reps, measured_at), got {r!r}")
        conn = self._db()
        with self._lock, conn:
            conn.executemany("INSERT OR REPLACE INTO profile VALUES (?, ?, ?, ?, ?, ?)", rows)
        return len(rows)

    def clear(self) -> None:
        """Empty the cache table (every device kind, every op)."""
        conn = self._db()
        with self._lock, conn:
            conn.execute("DELETE FROM profile")

    def __len__(self) -> int:
        with self._lock:
            return int(self._db().execute("SELECT COUNT(*) FROM profile").fetchone()[0])

    def close(self) -> None:
        """Close the SQLite connection (measure() afterwards raises)."""
        conn, self._conn = getattr(self, "_conn", None), None
        if conn is not None:
            conn.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass

    # -- measuring ---------------------------------------------------------------------------
    def measure(self, layer: Layer, out_shape, in_shapes, device_kind: str,
                input_grads=None, concurrency: int = 1) -> float:
        """Seconds for forward+backward of ``layer``'s shard whose output box has shape
        ``out_shape`` and whose input regions have shapes ``in_shapes`` (one per op input, from
        geometry).  Cached by key ``(device_kind, op signature, shard shape)``.
        ``input_grads`` (one bool per input; default all ``True``): inputs whose gradient is
        not computed (their producer needs none); with no parameters and no such input, only
        the forward pass runs, as in a training step.  ``concurrency`` k > 1: the entry
        recorded for k workers computing at once when there is one (see :meth:`record`),
        otherwise the shard alone (one process cannot reproduce the others).

        Input layers and empty shards (a zero-length output axis) cost 0.0 and run nothing.
        Raises ``ValueError`` for an op without a profiling rule.
        """
        self.last_profile_s = 0.0
        out_shape = tuple(int(v) for v in out_shape)
        in_shapes = [tuple(int(v) for v in s) for s in in_shapes]
        if layer.op == "input":
            return 0.0
        if layer.op not in _RULES:
            raise ValueError(f"cannot profile op {layer.op!r} (layer {layer.name})")
        if len(in_shapes) != len(layer.in_shapes):
            raise ValueError(f"layer {layer.name} ({layer.op}) has {len(layer.in_shapes)} "
                             f"inputs, {len(in_shapes)} region shapes were given")
        if any(v == 0 for v in out_shape):
            return 0.0
        if input_grads is not None:
            input_grads = tuple(bool(g) for g in input_grads)
            if len(input_grads) != len(in_shapes):
                raise ValueError(f"layer {layer.name}: {len(input_grads)} input_grads flags for "
                                 f"{len(in_shapes)} inputs")
        if int(concurrency) > 1:
            cached = self._get(self._key(layer, out_shape, in_shapes, device_kind, input_grads,
                                         concurrency))
            if cached is not None:
                self.hits += 1
                return cached
        key = self._key(layer, out_shape, in_shapes, device_kind, input_grads)
        cached = self._get(key)
        if cached is not None:
            self.hits += 1
            return cached
        t0 = time.perf_counter()
        with _RUN_LOCK:  # one measurement at a time per process (threads would skew it)
            seconds, reps = self._run(layer, out_shape, in_shapes, input_grads)
        self.last_profile_s = time.perf_counter() - t0
        self.misses += 1
        conn = self._db()
        with self._lock, conn:
            conn.execute("INSERT OR REPLACE INTO profile VALUES (?, ?, ?, ?, ?, ?)",
                         key + (seconds, reps, time.time()))
        return seconds

    def _sync(self):
        if self._cuda:
            torch.cuda.synchronize(self.device)

    def _run(self, layer: Layer, out_shape, in_shapes, input_grads=None):
        """``(median seconds, timed runs)`` of forward+backward of the shard in the profiler's
        precision (:func:`~explorer.engine.core.precision.autocast`: fp32 with TF32 off on
        CUDA, tf32, or bf16 autocast)."""
        from explorer.engine.core.precision import autocast
        if self._cuda:
            torch.cuda.set_device(cuda_index(self.device))
        with autocast(self.dtype, "cuda" if self._cuda else "cpu"):
            return self._run_fp32(layer, out_shape, in_shapes, input_grads)

    def _run_fp32(self, layer: Layer, out_shape, in_shapes, input_grads=None):
        threads = torch.get_num_threads()
        if not self._cuda:
            torch.set_num_threads(1)  # a CPU worker process of the runtime uses one thread
        flush = torch.empty(max(self.flush_bytes // 4, 1), device=self.device) \
            if self.cold else None
        try:
            run, leaves = build_shard(layer, out_shape, in_shapes, self.device,
                                      input_grads=input_grads)
            grads = None
            backward = bool(leaves)     # nothing to differentiate: forward only

            def once():
                outs = run()
                if backward:
                    torch.autograd.backward(outs, grads)
                return outs

            # first untimed run: check the shape, allocate the output gradients
            self._sync()
            t = time.perf_counter()
            outs = run()
            if tuple(outs[0].shape) != out_shape:
                raise ValueError(
                    f"profiling {layer.name} ({layer.op}): the shard computed from input "
                    f"regions {in_shapes} has output {tuple(outs[0].shape)}, geometry says "
                    f"{out_shape}")
            if backward:
                grads = [torch.ones_like(o) for o in outs]
                torch.autograd.backward(outs, grads)
            del outs
            self._sync()
            first = time.perf_counter() - t
            if self._cuda:
                # the first call on a GPU pays library start-up and algorithm selection: time
                # the budget by a warm run, never by that one
                for x in leaves:
                    x.grad = None
                t = time.perf_counter()
                once()
                self._sync()
                first = time.perf_counter() - t
            if self.cold:
                times = []
                for i in range(self.warmup + self.reps):
                    for x in leaves:
                        x.grad = None
                    flush.fill_(float(i))
                    self._sync()
                    t = time.perf_counter()
                    once()
                    self._sync()
                    if i >= self.warmup:
                        times.append(time.perf_counter() - t)
                    if self.budget_s is not None and sum(times) > self.budget_s:
                        break
                return float(statistics.median(times or [first])), max(len(times), 1)
            reps, warmup = self.reps, self.warmup - 1
            if self.budget_s is not None and first * (self.reps + max(warmup, 0)) > self.budget_s:
                reps, warmup = max(1, min(self.reps, int(self.budget_s // max(first, 1e-9)))), 0
            for _ in range(max(warmup, 0)):
                for x in leaves:
                    x.grad = None
                once()
            times = []
            for _ in range(reps):
                for x in leaves:
                    x.grad = None
                self._sync()
                t = time.perf_counter()
                once()
                self._sync()
                times.append(time.perf_counter() - t)
            return float(statistics.median(times)), reps
        finally:
            if not self._cuda:
                torch.set_num_threads(threads)


def cuda_index(device) -> int:
    """The GPU a CUDA ``device`` names: its index, or the current GPU for a bare ``"cuda"``
    (``torch.cuda.set_device`` refuses a device without an index).

    >>> cuda_index("cuda:3")
    3
    """
    index = torch.device(device).index
    return torch.cuda.current_device() if index is None else int(index)


def merge_caches(paths, into, device_kind: str | None = None) -> int:
    """Merge the profile caches at ``paths`` into the cache ``into`` (created if missing).

    Entries with the same key are averaged (the mean of their seconds, the sum of their
    repetitions): several processes that measured the same shards at the same time give the
    time a shard takes while the others compute, as in a run.  ``device_kind`` keeps only that
    kind.  Returns the number of entries written.
    """
    rows: dict = {}
    for p in paths:
        with Profiler(p) as src:
            for kind, sig, shape, sec, reps, at in src.rows():
                if device_kind is None or kind == device_kind:
                    rows.setdefault((kind, sig, shape), []).append((sec, reps, at))
    merged = [key + (statistics.fmean(v[0] for v in vals), int(sum(v[1] for v in vals)),
                     max(v[2] for v in vals)) for key, vals in rows.items()]
    with Profiler(into) as dst:
        return dst.put_rows(merged)


# --------------------------------------------------------------------------------------------
# Per-operator times of the training step (the placers' measured costs)
# --------------------------------------------------------------------------------------------

_OP_SCHEMA = """CREATE TABLE IF NOT EXISTS op_profile (
    device_kind TEXT, signature TEXT, seconds REAL, reps INTEGER, measured_at REAL,
    PRIMARY KEY(device_kind, signature))"""


def _arg_key(a):
    """An aten call's argument as JSON: a tensor as ``["T", shape, dtype, stride]`` (from the
    trace's fake value), other values as themselves or their text."""
    if isinstance(a, torch.fx.Node):
        v = a.meta.get("val")
        if isinstance(v, torch.Tensor):
            return ["T", list(v.shape), str(v.dtype).replace("torch.", ""), list(v.stride())]
        return ["N", str(v)]
    if isinstance(a, (list, tuple)):
        return [_arg_key(x) for x in a]
    if isinstance(a, dict):
        return {str(k): _arg_key(v) for k, v in sorted(a.items())}
    if a is None or isinstance(a, (bool, int, float, str)):
        return a
    return str(a)


def op_signature(node) -> str:
    """The cache key of one aten call of a traced step: the overload and every argument
    (tensors by shape, dtype and stride)."""
    return json.dumps([str(node.target), _arg_key(tuple(node.args)), _arg_key(node.kwargs)],
                      separators=(",", ":"))


def step_op_times(og, reps: int = 7, warmup: int = 2, seed: int = 0) -> dict:
    """Seconds of every aten call of ``og``'s training step (its own graph, made runnable on
    real tensors by :func:`~explorer.engine.core.opgraph.runnable`), run in the step's order on real
    tensors in this process with one thread (as a worker runs), each intermediate freed after
    its last reader (so caches and the allocator see what a step does, not a hot loop over
    one op); each call's median over ``reps`` timed replays after ``warmup``, scaled so that
    they add up to the median replay.  The clock is this thread's CPU time: on a machine
    shared with other processes, wall time would charge an operator for the time others held
    the core (up to 4× here) - the prediction is of a worker that has its core, as on a quiet
    machine, and a run reports its workers' CPU time (``cpu_s``) beside their wall time.
    Dropout follows the deterministic numerics
    (:data:`~explorer.engine.core.capture.DETERMINISTIC_ATEN`).

    Returns ``{fx node name: seconds}`` for the calls that are operators of ``og``."""
    import operator

    from explorer.engine.core.capture import DETERMINISTIC_ATEN, load
    from explorer.engine.core.opgraph import DROPPED, aten_name, runnable, with_step
    og = with_step(og)
    torch.manual_seed(seed)
    model, x = load(og.model, og.batch, dict(og.model_args or {}), meta=False)
    gm = runnable(og.gm)                  # the very graph being placed, on real tensors
    nodes = list(gm.graph.nodes)
    flat = [p.detach() for n, p in model.named_parameters() if p.requires_grad] + \
        [b.detach() for _, b in model.named_buffers()] + [x]
    wanted = {o.node for o in og.ops.values()}
    last: dict = {}
    for i, n in enumerate(nodes):
        for a in n.all_input_nodes:
            last[a.name] = i
    calls = []
    for i, n in enumerate(nodes):
        if n.op == "call_function":
            name = aten_name(n)
            fn = DETERMINISTIC_ATEN.get(name, n.target) if n.target is not operator.getitem \
                else n.target
            calls.append((i, n, fn, n.name in wanted and name not in DROPPED))
        elif n.op == "get_attr":
            calls.append((i, n, None, False))
    dead = {}
    for i, n in enumerate(nodes):
        dead.setdefault(last.get(n.name, i), []).append(n.name)
    runs: dict = {n.name: [] for _, n, _, timed in calls if timed}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for rep in range(warmup + reps):
            env = {n.name: v for n, v in zip((n for n in nodes if n.op == "placeholder"),
                                              flat)}
            for i, n, fn, timed in calls:
                if fn is None:
                    env[n.name] = getattr(gm, n.target)
                    continue
                args = torch.fx.node.map_arg(n.args, lambda a: env[a.name])
                kwargs = torch.fx.node.map_arg(n.kwargs, lambda a: env[a.name])
                t0 = time.thread_time()
                env[n.name] = fn(*args, **kwargs)
                dt = time.thread_time() - t0
                if timed and rep >= warmup:
                    runs[n.name].append(dt)
                for d in dead.get(i, ()):
                    env.pop(d, None)
    finally:
        torch.set_num_threads(threads)
    med = {nm: float(statistics.median(ts)) for nm, ts in runs.items()}
    # a step pays its calls' occasional slow runs (a page fault, a preempted core), which
    # per-call medians drop: scale them so they add up to the median step
    total = statistics.median(sum(ts[k] for ts in runs.values()) for k in range(reps))
    scale = total / sum(med.values()) if sum(med.values()) > 0 else 1.0
    return {nm: v * scale for nm, v in med.items()}


def op_times(og, device_kind: str, cache_path=None, reps: int = 7, warmup: int = 2,
             progress=None, fresh: bool = False, in_step: int = 0, measure=None) -> dict:
    """``{operator name: seconds}`` for every operator of ``og`` on this machine, from the
    profile cache (table ``op_profile`` of ``$EXPLORER_HOME/profile.sqlite``, keyed by
    ``device_kind`` and :func:`op_signature`); when any call is missing the whole step is
    measured once (:func:`step_op_times`) and stored (``fresh``: measured and stored in any
    case).  A multi-output aten call's time goes
    to its first operator (its other outputs cost nothing more); placeholders cost 0.
    ``in_step`` = N > 0: the calls as N placement workers pay them, the step compiled and
    run side by side in N worker processes by ``measure(og, N, reps=, warmup=)`` (the runtime's
    :func:`explorer.engine.runtime.compiled.instep_op_times`: this store runs nothing), cached under
    ``device_kind + "/step×N"``; 0: each call replayed in this process
    (:func:`step_op_times`).
    Returns ``(times, info)``, ``info`` = ``{"measured": whether the step was timed now,
    "ops": n, "seconds": time spent}``."""
    import sqlite3
    path = default_cache_path() if cache_path is None else cache_path
    from explorer.engine.core.opgraph import with_step
    og = with_step(og)                    # signatures read the traced step's arguments
    if in_step:
        device_kind = f"{device_kind}/step×{int(in_step)}"
    conn = connect(path, _OP_SCHEMA, timeout=60.0)
    try:
        node_of = {n.name: n for n in og.gm.graph.nodes}
        sig = {o.node: op_signature(node_of[o.node]) for o in og.ops.values()}
        got = {}
        for s in set(sig.values()):
            row = conn.execute("SELECT seconds FROM op_profile WHERE device_kind=? AND "
                               "signature=?", (device_kind, s)).fetchone()
            if row is not None:
                got[s] = float(row[0])
        measured = fresh or len(got) < len(set(sig.values()))
        t0 = time.perf_counter()
        if measured:
            if progress:
                progress(f"timing the {len(sig)} aten calls of {og.model}'s step")
            if in_step:
                if measure is None:
                    raise ValueError("op_times(in_step=N) needs measure= to time the step")
                per_node = measure(og, int(in_step), reps=reps, warmup=warmup)
            else:
                per_node = step_op_times(og, reps=reps, warmup=warmup)
            by_sig: dict = {}
            for node, s in sig.items():
                if node in per_node:
                    by_sig.setdefault(s, []).append(per_node[node])
            rows = [(device_kind, s, statistics.fmean(v), reps, time.time())
                    for s, v in by_sig.items()]
            try:
                with conn:
                    conn.executemany("INSERT OR REPLACE INTO op_profile VALUES (?, ?, ?, ?, ?)",
                                     rows)
            except sqlite3.OperationalError:
                pass                          # a read-only cache: the times are still used
            got.update({s: statistics.fmean(v) for s, v in by_sig.items()})
    finally:
        conn.close()
    out: dict = {t.id: 0.0 for t in og.tensors.values() if t.producer is None}
    first: set = set()
    for o in og.ops.values():
        s = sig[o.node]
        out[o.name] = 0.0 if o.node in first else float(got.get(s, 0.0))
        first.add(o.node)
    return out, {"measured": measured, "ops": len(og.ops),
                 "seconds": time.perf_counter() - t0}


def _clear(table: str, schema: str, cache_path=None) -> None:
    """Delete every row of one profile table (``table`` is one of this module's names)."""
    conn = connect(default_cache_path() if cache_path is None else cache_path, schema)
    try:
        with conn:
            conn.execute(f"DELETE FROM {table}")
    finally:
        conn.close()


def clear_op_times(cache_path=None) -> None:
    """Forget every cached operator time (:func:`op_times` measures again)."""
    _clear("op_profile", _OP_SCHEMA, cache_path)


# --------------------------------------------------------------------------------------------
# Operator shards of an operator-level plan (:mod:`explorer.engine.runtime.shardtime`)
# --------------------------------------------------------------------------------------------

_SHARD_SCHEMA = """CREATE TABLE IF NOT EXISTS shard_profile (
    device_kind TEXT, signature TEXT, seconds REAL, exchanges INTEGER, reps INTEGER,
    measured_at REAL, PRIMARY KEY(device_kind, signature))"""


def shard_cache(device_kind: str, signatures, cache_path=None) -> dict:
    """``{signature: (seconds, exchanges)}`` of the operator shards in ``signatures`` already
    measured on this machine (table ``shard_profile``; a signature names the aten call, its
    shard boxes and the dtype it computes in; ``exchanges`` the transfers the shard takes part
    in)."""
    conn = connect(default_cache_path() if cache_path is None else cache_path, _SHARD_SCHEMA,
                   timeout=60.0)
    try:
        out = {}
        for s in signatures:
            row = conn.execute("SELECT seconds, exchanges FROM shard_profile WHERE "
                               "device_kind=? AND signature=?", (device_kind, s)).fetchone()
            if row is not None:
                out[s] = (float(row[0]), int(row[1]))
        return out
    finally:
        conn.close()


def store_shard_times(device_kind: str, times: dict, reps: int, cache_path=None) -> None:
    """Keep measured shards (``{signature: (seconds, exchanges)}``) for :func:`shard_cache`;
    a read-only cache is left as it is."""
    conn = connect(default_cache_path() if cache_path is None else cache_path, _SHARD_SCHEMA,
                   timeout=60.0)
    try:
        with conn:
            conn.executemany("INSERT OR REPLACE INTO shard_profile VALUES (?, ?, ?, ?, ?, ?)",
                             [(device_kind, s, float(v), int(e), int(reps), time.time())
                              for s, (v, e) in times.items()])
    except sqlite3.OperationalError:
        pass
    finally:
        conn.close()


def clear_shard_times(cache_path=None) -> None:
    """Forget every cached shard time (the next prediction measures again)."""
    _clear("shard_profile", _SHARD_SCHEMA, cache_path)

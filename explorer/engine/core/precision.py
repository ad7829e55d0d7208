"""Precision as part of a plan: ``fp32`` (default), ``tf32`` or ``bf16``.

One vocabulary for the search's costs and memory, the plan document, the runtime, the
reference check and the export:

* ``fp32`` - IEEE float32 everywhere; on CUDA, TF32 is switched *off* for matmuls and
  convolutions (PyTorch leaves cuDNN's on by default), so "fp32" means what it says.
* ``tf32`` - float32 storage, matmuls and convolutions on the tensor cores' TF32 path (10-bit
  mantissa): ``torch.backends.cuda.matmul.allow_tf32`` and ``cudnn.allow_tf32`` on.  On a CPU
  this is a no-op: the CPU computes float32, and the costs use the device's TF32 rate only
  where the preset has one (GPUs from Ampere on).
* ``bf16`` - automatic mixed precision (``torch.autocast(device_type, torch.bfloat16)``) with
  float32 *master weights*: parameters, their gradients and the optimizer state stay float32;
  autocast computes matmuls and convolutions in bfloat16 from a bfloat16 working copy of each
  weight it casts (kept for the backward pass).

Byte accounting (:func:`activation_bytes`, :data:`PARAM_BYTES`, :func:`working_copy_bytes`):
in bf16 every floating-point activation, its gradient and everything sent between devices
for them count 2 bytes; parameters, parameter gradients, momentum and the updated weights
count 4; the working copy adds 2 bytes per parameter element.  Autocast really keeps a few
activations in float32 (layer-norm and softmax outputs, the loss, the model input) - the
costs count them at 2 bytes all the same (a simplification, stated in ``docs/runtime.md``).

Nothing here imports torch at module level: the search runs without it.

>>> check("BF16"), activation_bytes("bf16"), activation_bytes("fp32"), tolerance("bf16")
('bf16', 2, 4, 0.02)
>>> check("fp16")
Traceback (most recent call last):
ValueError: dtype must be fp32, tf32 or bf16, got 'fp16'
"""

from __future__ import annotations

import contextlib

__all__ = ["DTYPES", "DEFAULT", "PARAM_BYTES", "TOLERANCE", "check", "of", "activation_bytes",
           "working_copy_bytes", "tolerance", "autocast", "bf16_supported", "require_supported",
           "at_precision"]

DTYPES = ("fp32", "tf32", "bf16")
DEFAULT = "fp32"
#: parameters, their gradients, momentum and updates: float32 master weights in every dtype
PARAM_BYTES = 4
#: The reference check's relative tolerance per dtype (the loss, every parameter and gradient
#: against the exact float64 step, ``explorer.engine.runtime.reference.compare``).
#: fp32: 1e-4, as before.  tf32: 10 mantissa bits, a rounding of 2^-11 ≈ 4.9e-4 per product
#: input; 5e-3 leaves about ten roundings of room.  bf16: 8 significant bits, 2^-9 ≈ 2e-3 per
#: rounding; every layer's output is rounded once more, and a plan's row-parallel partial
#: sums round before they are added, so a correct plan sits at a few 1e-3; 2e-2 is ten
#: roundings - while a wrong region, halo or shard still gives errors of order 1.  The check
#: also allows ``ROUNDING_FACTOR`` × the error the single-device run makes *in the same
#: precision*, so an ill-conditioned tensor is judged against what one device gets.
TOLERANCE = {"fp32": 1e-4, "tf32": 5e-3, "bf16": 2e-2}


def check(dtype) -> str:
    """``dtype`` as one of :data:`DTYPES` (case-insensitive; ``None``: the default);
    ``ValueError`` naming the value otherwise."""
    if dtype is None:
        return DEFAULT
    d = str(dtype).strip().lower()
    if d not in DTYPES:
        raise ValueError(f"dtype must be fp32, tf32 or bf16, got {dtype!r}")
    return d


def of(doc) -> str:
    """The precision of a plan document (or any dict): its ``dtype``, ``fp32`` when absent
    (documents written before precision was part of a plan)."""
    return check((doc or {}).get("dtype") or DEFAULT)


def activation_bytes(dtype: str) -> int:
    """Bytes of one activation element (and of its gradient, and on the wire) in ``dtype``."""
    return 2 if check(dtype) == "bf16" else 4


def working_copy_bytes(dtype: str) -> int:
    """Bytes per parameter element of the low-precision copy autocast keeps besides the
    float32 master (0 when there is none)."""
    return 2 if check(dtype) == "bf16" else 0


def tolerance(dtype: str) -> float:
    """The reference check's relative tolerance for a run in ``dtype``."""
    return TOLERANCE[check(dtype)]


@contextlib.contextmanager
def autocast(dtype: str, device_type: str = "cpu"):
    """The numerics of ``dtype`` on ``device_type`` for the ``with`` block: bf16 autocast;
    on CUDA TF32 on (tf32) or off (fp32 and bf16), restored afterwards.  fp32 and tf32 on a
    CPU change nothing."""
    import torch
    d = check(dtype)
    dev = str(device_type).split(":")[0]
    with contextlib.ExitStack() as stack:
        if dev == "cuda":
            mm, cd = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32

            def restore():
                torch.backends.cuda.matmul.allow_tf32 = mm
                torch.backends.cudnn.allow_tf32 = cd
            stack.callback(restore)
            torch.backends.cuda.matmul.allow_tf32 = d == "tf32"
            torch.backends.cudnn.allow_tf32 = d == "tf32"
        if d == "bf16":
            stack.enter_context(torch.autocast(dev, dtype=torch.bfloat16))
        yield


def bf16_supported(device_type: str = "cpu") -> bool:
    """Whether ``device_type`` computes bfloat16 natively: on a CPU, oneDNN's bf16 support
    (AVX-512 BF16 / AMX, or AVX-512 with emulation - ``torch.ops.mkldnn._is_mkldnn_bf16_
    supported``); on CUDA, ``torch.cuda.is_bf16_supported()``."""
    import torch
    dev = str(device_type).split(":")[0]
    try:
        if dev == "cuda":
            return bool(torch.cuda.is_available() and torch.cuda.is_bf16_supported())
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except Exception:  # noqa: BLE001 - an older torch without the query: not supported
        return False


#: set to 1 to run bf16 on a CPU without native support anyway (PyTorch emulates it, slowly:
#: the numerics are bf16's, the timing is not a prediction target; the tests use it)
EMULATED_ENV = "EXPLORER_BF16_EMULATED"


def require_supported(dtype: str, device_type: str = "cpu") -> None:
    """Refuse, in one line (:class:`~explorer.errors.ExplorerError`, exit 2), a ``dtype`` this
    machine's ``device_type`` cannot run (``$EXPLORER_BF16_EMULATED=1``: run bf16 on a CPU
    without it, emulated)."""
    import os
    from explorer.errors import ExplorerError
    emulated = os.environ.get(EMULATED_ENV, "") == "1" and \
        str(device_type).split(":")[0] != "cuda"
    if check(dtype) == "bf16" and not emulated and not bf16_supported(device_type):
        what = "this CPU has no bfloat16 support (oneDNN)" if \
            str(device_type).split(":")[0] != "cuda" else "this GPU has no bfloat16 support"
        raise ExplorerError(f"--dtype bf16: {what}; run in fp32 or on a machine that has it")


def at_precision(og, dtype: str):
    """An operator graph (:class:`~explorer.engine.core.opgraph.OpGraph`) whose tensors have
    the sizes ``dtype`` gives them, for the costs and memory of the operator-level families:
    in bf16 every floating-point activation and activation gradient takes 2 bytes; the model
    input, parameters, their gradients, buffers and the update stay as traced (float32).  The
    same graph for fp32 and tf32.  Shapes, names and the digest are unchanged (a shallow copy
    sharing everything but the tensors)."""
    import copy
    from dataclasses import replace
    if check(dtype) != "bf16" or og is None:
        return og
    keep = set(og.param_grads.values())
    out = copy.copy(og)
    out.tensors = {tid: (replace(t, itemsize=2)
                         if t.kind in ("activation", "grad") and tid not in keep
                         and str(t.dtype).startswith("float") and t.itemsize == 4 else t)
                   for tid, t in og.tensors.items()}
    out.precision = "bf16"
    return out

"""Loading a model from its name: a built-in example (``vgg16``), ``path/to/file.py:function``
(``function()`` returns ``(torch.nn.Module, example_input)``) or ``hf:NAME`` (a Hugging Face
architecture built from its config).  Every capture starts here; bad names are
:class:`~explorer.errors.UnknownModel`, builders that fail :class:`~explorer.errors.UnsupportedModel`.
"""

from __future__ import annotations

import importlib.util
import inspect
import sys
from pathlib import Path

import torch
import torch.nn as nn
from torch.overrides import TorchFunctionMode

from explorer.engine.core import hf
from explorer.errors import UnknownModel, UnsupportedModel

__all__ = ["load_model", "load_function", "resize_batch"]


def _examples():
    import example_models
    return example_models


def load_model(spec: str, batch: int | None = None, model_args: dict | None = None,
               meta: bool = True):
    """Build ``(module, example_input)`` for an example name, ``file.py:function`` or
    ``hf:NAME`` (a Hugging Face architecture from its config, see :mod:`.hf`).

    ``meta=True`` builds under ``torch.device("meta")`` (no memory, instant); the runtime
    passes ``meta=False`` to get real weights.  ``batch`` replaces the input's first dimension.
    """
    model_args = dict(model_args or {})
    ex = _examples()
    if hf.is_hf(spec):                 # hf:NAME, a Hugging Face architecture
        name = spec[len(hf.PREFIX):]
        model, x = _call_builder(lambda: hf.build(name, batch, model_args), meta, spec)
    elif spec in ex.MODELS:
        def build():
            return ex.build(spec, batch=batch, **model_args)
        model, x = _call_builder(build, meta, spec)
    elif ":" in spec:
        path, _, func = spec.rpartition(":")
        fn = load_function(path, func)
        try:
            sig = inspect.signature(fn)
        except (TypeError, ValueError):
            sig = None
        if model_args and sig is not None:
            unknown = [k for k in model_args if k not in sig.parameters]
            if unknown and not any(p.kind == p.VAR_KEYWORD for p in sig.parameters.values()):
                raise UnknownModel(
                    f"{spec}: {func}() takes no argument(s) {unknown}; it accepts "
                    f"{list(sig.parameters)}")
        model, x = _call_builder(lambda: fn(**model_args), meta, spec)
        if batch is not None and batch != x.shape[0]:
            x = resize_batch(x, batch)
    else:
        raise UnknownModel(
            f"unknown model {spec!r}: use one of the examples ({', '.join(ex.MODELS)}) or "
            f"path/to/file.py:function where function() returns (nn.Module, example_input), "
            f"or hf:NAME for a Hugging Face architecture (hf:gpt2)")
    return model, x


class _MetaRandom(TorchFunctionMode):
    """While a model is built on meta tensors: ``randn``/``rand``/``randint`` (and their
    ``_like`` forms) give an empty meta tensor of their shape and dtype directly, and in-place
    random fills of meta tensors (``normal_``, ``uniform_``: weight initialisation) do nothing.  Their meta
    kernels are torch's Python references, whose first call imports sympy (0.6 s of a first
    search's trace); a meta tensor holds no values either way."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func in _FILLS and args and isinstance(args[0], torch.Tensor) and \
                args[0].device.type == "meta":
            return args[0]              # a random initialisation: a meta tensor has no values
        if kwargs.get("device") is not None and torch.device(kwargs["device"]).type == "meta":
            out = _random_shape(func, args, kwargs)
            if out is not None:
                size, dtype = out
                return torch.empty(size, dtype=dtype, device="meta",
                                   requires_grad=bool(kwargs.get("requires_grad")))
        return func(*args, **kwargs)


#: in-place random fills (weight initialisation): on meta tensors they change nothing, and
#: their meta kernels are Python references too
_FILLS = frozenset(getattr(torch.Tensor, n) for n in (
    "normal_", "uniform_", "bernoulli_", "random_", "exponential_", "geometric_",
    "log_normal_", "cauchy_") if hasattr(torch.Tensor, n))


def _random_shape(func, args, kwargs):
    """``(size, dtype)`` of a random factory call, or ``None`` (not one, or unusual)."""
    if kwargs.get("out") is not None or kwargs.get("generator") is not None or \
            kwargs.get("names") is not None:
        return None
    if func in (torch.randn_like, torch.rand_like) and args and \
            isinstance(args[0], torch.Tensor) and len(args) == 1:
        return tuple(args[0].shape), kwargs.get("dtype") or args[0].dtype
    if func in (torch.randn, torch.rand):
        size = args[0] if len(args) == 1 and isinstance(args[0], (tuple, list, torch.Size)) \
            else args
        dtype = kwargs.get("dtype") or torch.get_default_dtype()
    elif func is torch.randint:
        if len(args) == 2:
            size = args[1]
        elif len(args) == 3:
            size = args[2]
        else:
            return None
        dtype = kwargs.get("dtype") or torch.int64
    else:
        return None
    if not all(isinstance(d, int) for d in size):
        return None
    return tuple(size), dtype


def _call_builder(build, meta, spec):
    def check(res):
        if (not isinstance(res, tuple) or len(res) != 2 or not isinstance(res[0], nn.Module)
                or not isinstance(res[1], torch.Tensor)):
            raise UnsupportedModel(
                f"{spec}: the function must return (torch.nn.Module, example_input_tensor), "
                f"got {type(res).__name__}")
        return res
    if meta:
        try:
            with _MetaRandom(), torch.device("meta"):
                return check(build())
        except (UnknownModel, UnsupportedModel):
            raise
        except ValueError:
            raise
        except Exception:  # noqa: BLE001 - builder not meta-friendly: build it for real
            pass
    try:
        return check(build())
    except (UnknownModel, UnsupportedModel, ValueError, KeyError):
        raise
    except Exception as exc:  # noqa: BLE001
        raise UnsupportedModel(f"{spec}: building the model failed: {type(exc).__name__}: "
                               f"{exc}") from exc


def load_function(path: str, func: str):
    p = Path(path)
    if not p.is_file():
        raise UnknownModel(f"model file {path!r} not found (give path/to/file.py:function)")
    name = f"_explorer_user_{abs(hash(str(p.resolve())))}"
    spec = importlib.util.spec_from_file_location(name, p)
    if spec is None or spec.loader is None:
        raise UnknownModel(f"{path!r} is not an importable Python file")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    try:
        spec.loader.exec_module(mod)
    except Exception as exc:  # noqa: BLE001
        raise UnsupportedModel(f"importing {path} failed: {type(exc).__name__}: {exc}") from exc
    fn = getattr(mod, func, None)
    if not callable(fn):
        funcs = [k for k, v in vars(mod).items() if inspect.isfunction(v)
                 and v.__module__ == name]
        raise UnknownModel(f"{path} does not define a function {func!r}; functions it "
                           f"defines: {funcs or 'none'}")
    return fn


def resize_batch(x: torch.Tensor, batch: int) -> torch.Tensor:
    """Example input with its first dimension changed to ``batch`` (rows repeated)."""
    if batch < 1:
        raise ValueError(f"batch must be ≥ 1, got {batch}")
    if x.device.type == "meta":
        return torch.empty((batch,) + tuple(x.shape[1:]), dtype=x.dtype, device="meta")
    idx = torch.arange(batch) % x.shape[0]
    return x[idx].clone()

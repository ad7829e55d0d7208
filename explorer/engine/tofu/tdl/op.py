"""An operator described in TDL (Tofu, Section 4.1): :class:`Op`, its inputs, output shape and
attributes; :meth:`Op.bind` evaluates it at concrete shapes with the interval analysis of
:mod:`.intervals`."""

from __future__ import annotations

from explorer.engine.tofu.tdl.intervals import bind
from explorer.engine.tofu.tdl.lang import TDLError, param_names

__all__ = ["Op"]


class Op:
    """An operator described in TDL: ``fn(*inputs)`` returns the output lambda.

    ``inputs`` defaults to ``fn``'s parameter names.  ``out_shape(*input_shapes)`` gives the
    output shape; without it the shape is inferred from the accesses (every output coordinate
    as large as every access allows - right for "valid" windows, e.g. Figure 1's conv1d).
    ``out_names`` names the output coordinates when the output lambda takes ``*idx``.
    ``attrs`` records the parameters the description was built with (shown in reports).
    """

    def __init__(self, name: str, fn, out_shape=None, inputs=None, out_names=None,
                 attrs=None, doc: str = ""):
        self.name, self.fn, self._out_shape = str(name), fn, out_shape
        if inputs is None:
            inputs = param_names(fn)
            if inputs is None:
                raise TDLError(f"operator {name}: pass inputs=[...] for a description taking "
                               f"*args")
        self.inputs = tuple(inputs)
        self.out_names = tuple(out_names) if out_names else None
        self.attrs = dict(attrs or {})
        self.doc = doc

    def __repr__(self):
        a = ", ".join(f"{k}={v}" for k, v in self.attrs.items())
        return f"Op({self.name}{', ' + a if a else ''})"

    def norm_shapes(self, shapes) -> dict:
        """``{input name: shape}`` from a dict or a sequence in input order."""
        if isinstance(shapes, dict):
            missing = [n for n in self.inputs if n not in shapes]
            if missing:
                raise TDLError(f"operator {self.name}: no shape for inputs {missing} "
                               f"(inputs are {list(self.inputs)})")
            return {n: tuple(int(s) for s in shapes[n]) for n in self.inputs}
        shapes = list(shapes)
        if len(shapes) != len(self.inputs):
            raise TDLError(f"operator {self.name} takes {len(self.inputs)} inputs "
                           f"{list(self.inputs)}, got {len(shapes)} shapes")
        return {n: tuple(int(s) for s in sh) for n, sh in zip(self.inputs, shapes)}

    def bind(self, shapes):
        """Build and check the expression tree at concrete shapes (see :mod:`.intervals`)."""
        return bind(self, shapes)

"""Tofu's operator descriptions and their analysis (Wang et al., EuroSys 2019, Sections 3-4).

* :mod:`.lang` - the Tensor Description Language (with :mod:`.op`: ``Op``), ``Sum/Max/Min/Prod``, ``Opaque``,
  ``Concat``; operators described once as lambdas over output indices (Section 4.1).
* :mod:`.intervals` - symbolic interval analysis (Section 4.2): the input region each output
  box (or each worker's share of a reduction) needs, numerically or as symbolic intervals.
* :mod:`.strategies` - partition-n-reduce strategy discovery (``strategies(op, shapes, k)``).
* :mod:`.library` - descriptions of the operators our models use (``describe(name, **attrs)``).
* :mod:`.oracle` - layers -> descriptions (``from_layer``) and region queries with the box
  conventions of :mod:`explorer.engine.core.geometry`: the test oracle geometry is checked against
  (imported explicitly, ``from explorer.engine.tofu.tdl import oracle``; not loaded with the package).

Example (paper Figure 3)::

    >>> conv1d = Op("conv1d", lambda data, filters: lambda b, co, x:
    ...             Sum(lambda ci, dx: data[b, ci, x + dx] * filters[ci, co, dx]))
    >>> [s.name for s in strategies(conv1d, {"data": (4, 4, 10), "filters": (4, 6, 3)})]
    ['split b', 'split co', 'split x', 'reduce ci', 'reduce dx']
"""

from explorer.engine.tofu.tdl.lang import (
    FULL,
    Concat,
    Ix,
    Max,
    Min,
    Opaque,
    Prod,
    Sum,
    TDLError,
    Var,
    reduce_over,
)
from explorer.engine.tofu.tdl.intervals import Bound, Sym, bind
from explorer.engine.tofu.tdl.op import Op
from explorer.engine.tofu.tdl.strategies import Strategy, classify, strategies
from explorer.engine.tofu.tdl.library import describe, names

__all__ = ["FULL", "Concat", "Ix", "Max", "Min", "Op", "Opaque", "Prod", "Sum", "TDLError", "Var",
           "reduce_over", "Bound", "Sym", "bind", "Strategy", "classify", "strategies",
           "describe", "names"]

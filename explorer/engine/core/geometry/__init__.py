"""Tiling geometry: the one place that knows which part of which tensor each device touches.

For a layer and a :class:`Config` (degrees per dimension letter + the devices used) the
package answers which box of the output each device owns (:func:`output_boxes`), which region
of each input - and through an edge's folded view ops, of the producer's output - it needs
(:func:`input_regions`, :func:`edge_regions`: halos for convolution and pooling windows, full
rows for matrix products, per-input slices for concat) and which part of each weight
(:func:`param_shards`).  The cost model, the searches, the views and the runtime all ask here.

Modules:

* :mod:`.boxes` - vectorised box arithmetic on int arrays ``[..., ndim, 2]`` of half-open
  ``(start, stop)`` ranges: volume, intersection, containment, slices, balanced splits;
* :mod:`.windows` - convolution / pooling window arithmetic and the pads a local computation
  of a window op needs (only at the tensor's true border);
* :mod:`.owners` - mixed-radix tile ownership (which worker owns each tile after splits);
* :mod:`.config` - :class:`Config`, :func:`enumerate_configs`, :func:`output_boxes`, and
  for row-parallel (``k``) configurations :func:`compute_boxes` (the tile and reduction
  features a device sums over before the reduce-scatter);
* :mod:`.regions` / :mod:`.edges` - input regions and parameter shards per op, edge view ops;
* :mod:`.layout` - :class:`TensorLayout` (how one tensor lives on devices, for every plan
  kind) and :class:`ExecutionLayout` (an operator-level plan for the runtime, JSON-able).

Geometry is the engine, TDL the oracle
--------------------------------------
Tofu's operator descriptions (:mod:`explorer.engine.tofu.tdl`) answer the same region questions by
interval analysis; :mod:`explorer.engine.tofu.tdl.oracle` wraps them with this package's box
conventions.  ``benchmarks/geometry.py`` (every layer and every candidate configuration of
lenet5, resnet50 and inception_v3 at 4 and 16 devices, batch 16, one thread; 2-core machine)
measured:

==============  ===  ========  =========  =========  =======  ========================
model           dev  geometry  TDL cold   TDL warm   agree    OptCNN cost tables geo/TDL
==============  ===  ========  =========  =========  =======  ========================
lenet5            4    0.1 ms     2 ms       1 ms      7/7      0.01 s / 0.01 s
lenet5           16    0.2 ms     2 ms       2 ms      7/7      0.05 s / 0.05 s
resnet50          4    2.0 ms    31 ms      20 ms     88/88     0.05 s / 0.08 s
resnet50         16    3.3 ms    41 ms      31 ms     88/88     0.47 s / 0.49 s
inception_v3      4    4.5 ms    63 ms      43 ms    159/159    0.10 s / 0.16 s
inception_v3     16    6.9 ms    83 ms      65 ms    159/159    0.93 s / 1.02 s
==============  ===  ========  =========  =========  =======  ========================

Identical regions everywhere (geometry is deliberately conservative in two places no
configuration of an example model reaches: attention value columns, which are never split,
and bilinear upsampling, one row wider; ``tests/test_tdl.py`` pins both); geometry is
about 13x faster cold and 9x warm, which costs the cost model 1.04x-1.60x when TDL is
swapped in.  Speed favours geometry but does not decide: the runtime's local computations
(window pads, grouped-convolution channel ranges, parameter shards) are written against these
closed-form rules, one readable rule per op, while TDL derives the same regions independently
from each operator's definition - which is what a test oracle should do.  So geometry stays
the engine and ``tests/test_tdl.py`` cross-checks it against the oracle on every layer of
several example models; nothing on the search or runtime path imports the oracle.
"""

from explorer.engine.core.geometry.boxes import (
    box_shape,
    common,
    extents,
    full_box,
    inside,
    intersect,
    is_empty,
    overlap,
    split,
    split_range,
    to_slices,
    volume,
)
from explorer.engine.core.geometry.config import (
    ALL_DIVISORS_UP_TO,
    REDUCE,
    Config,
    compute_boxes,
    degree_values,
    count_configs,
    enumerate_configs,
    output_boxes,
    reduce_groups,
    reduction_size,
    scatter_axis,
    stacked_boxes,
    stacked_compute_boxes,
    stacked_live,
    stacked_output_boxes,
    tile_indices,
)
from explorer.engine.core.geometry.edges import apply_transforms, edge_regions
from explorer.engine.core.geometry.layout import REDUCERS, ExecutionLayout, OpLayout, TensorLayout
from explorer.engine.core.geometry.owners import device_of, owner_grid, tile_digits, tile_owners
from explorer.engine.core.geometry.regions import input_regions, param_shards, shard_summary
from explorer.engine.core.geometry.windows import (
    adaptive_window,
    full_spatial,
    transpose_crop,
    transpose_window,
    window,
    window_pads,
)

__all__ = [
    "box_shape", "common", "extents", "full_box", "inside", "intersect", "is_empty", "overlap",
    "split", "split_range", "to_slices", "volume",
    "Config", "enumerate_configs", "output_boxes", "stacked_output_boxes", "degree_values",
    "ALL_DIVISORS_UP_TO", "count_configs",
    "tile_indices", "REDUCE", "compute_boxes", "reduce_groups", "reduction_size",
    "scatter_axis", "stacked_compute_boxes", "stacked_boxes", "stacked_live",
    "apply_transforms", "edge_regions",
    "REDUCERS", "ExecutionLayout", "OpLayout", "TensorLayout",
    "device_of", "owner_grid", "tile_digits", "tile_owners",
    "input_regions", "param_shards", "shard_summary",
    "adaptive_window", "full_spatial", "transpose_crop", "transpose_window", "window",
    "window_pads",
]

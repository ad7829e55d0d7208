"""Mixed-radix tile ownership: which worker owns each tile after a sequence of splits.

Both tilings in the code base number their workers the same way.  A layer-wise configuration
with degrees ``(d_1, …, d_m)`` gives device position ``k`` the tile whose multi-index is ``k``
written in mixed radix ``d_1 … d_m`` (first digit most significant, last letter fastest); a
Tofu recursion with step factors ``(k_1, …, k_s)`` numbers its groups the same way over the
steps.  :func:`tile_digits` goes from worker number to digits, :func:`owner_grid` from a
2-D grid of tiles (rows = some digits, columns = others) back to worker numbers, which is
what the pictures draw.
"""

from __future__ import annotations

import math

import numpy as np


def tile_digits(radices, index) -> np.ndarray:
    """``[len(index), len(radices)]``: the mixed-radix digits of each worker number.

    >>> tile_digits([2, 3], [0, 1, 5]).tolist()
    [[0, 0], [0, 1], [1, 2]]
    """
    radices = [int(r) for r in radices]
    index = np.asarray(index, dtype=np.int64)
    if not radices:
        return np.zeros((index.size, 0), dtype=np.int64)
    return np.stack(np.unravel_index(index, radices), axis=1).astype(np.int64)


def owner_grid(radices, rows, cols) -> np.ndarray:
    """``[R, C]`` worker numbers of a 2-D tile grid.

    ``rows`` / ``cols`` list digit positions (into ``radices``; most significant first) that
    make up the row / column index of a tile; digits in neither are 0 (the tile's first slice
    along the other split axes).  ``R`` and ``C`` are the products of their radices.

    >>> owner_grid([2, 2], [0], [1]).tolist()
    [[0, 1], [2, 3]]
    >>> owner_grid([2, 3], [], [1, 0]).tolist()
    [[0, 3, 1, 4, 2, 5]]
    """
    radices = [int(r) for r in radices]
    nr = math.prod(radices[i] for i in rows)
    nc = math.prod(radices[i] for i in cols)
    if not radices:
        return np.zeros((nr, nc), dtype=np.int64)
    digits = np.zeros((len(radices), nr, nc), dtype=np.int64)
    for pos, d in zip(rows, tile_digits([radices[i] for i in rows], np.arange(nr)).T):
        digits[pos] = d[:, None]
    for pos, d in zip(cols, tile_digits([radices[i] for i in cols], np.arange(nc)).T):
        digits[pos] = d[None, :]
    return np.ravel_multi_index(tuple(digits), radices).astype(np.int64)


def device_of(radices, order) -> np.ndarray:
    """``[K]``: the device of each worker (numbered in mixed radix, first digit most
    significant) when device numbers take the same digits in ``order`` (most significant
    first).  Tofu matches its recursion steps to link levels this way; the identity order is
    the recursion's own numbering.

    >>> device_of([2, 2], [0, 1]).tolist(), device_of([2, 2], [1, 0]).tolist()
    ([0, 1, 2, 3], [0, 2, 1, 3])
    """
    radices = [int(r) for r in radices]
    if not radices:
        return np.zeros(1, dtype=np.int64)
    digits = tile_digits(radices, np.arange(math.prod(radices)))
    return np.ravel_multi_index(tuple(digits[:, list(order)].T),
                                [radices[i] for i in order]).astype(np.int64)


def tile_owners(steps: list, factors: list, axes=(0, 1), upto: int | None = None,
                order=None) -> list:
    """Worker owning each tile of a tensor's ``axes`` after the first ``upto`` Tofu steps.

    ``steps[s]`` is the axis the tensor was split along at step s (−1: not split); worker ids
    are mixed-radix numbers over the steps (step 1 most significant), as the recursion numbers
    its groups.  Returns a 2-D list ``[rows][cols]`` (one row for 1-D tensors); tiles of other
    axes show the worker holding their first slice.

    ``order`` (see :func:`device_of`) names devices instead of workers when the steps were
    matched to link levels.

    >>> tile_owners([0, 1], [2, 2]), tile_owners([0, 1], [2, 2], order=[1, 0])
    ([[0, 1], [2, 3]], [[0, 2], [1, 3]])
    """
    m = len(factors) if upto is None else min(upto, len(factors))
    a0 = axes[0]
    a1 = axes[1] if len(axes) > 1 else None
    rows = [s for s in range(m) if steps[s] == a0]
    cols = [s for s in range(m) if a1 is not None and steps[s] == a1]
    owners = owner_grid(factors, rows, cols)
    if order is not None and list(order) != list(range(len(factors))):
        owners = device_of(factors, order)[owners]
    return owners.tolist()

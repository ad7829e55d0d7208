"""Tests for explorer.engine.tofu.tdl: Tofu's operator descriptions and interval analysis.

Paper: Wang et al., "Supporting Very Large Models using Automatic Dataflow Graph Partitioning",
EuroSys 2019 - Section 4.1 (TDL), Section 4.2 (symbolic interval analysis, partition-n-reduce
strategy discovery), Figures 1-3.  Expected regions are worked out by hand in the comments
(boxes are half-open [start, stop) per axis, as in explorer.engine.core.geometry).  The strongest
tests check the analysis against PyTorch autograd (the elements an output box really depends
on) and against the layer-wise engine's geometry on real imported models.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from explorer.engine.core import geometry as G
from explorer.engine.core.layergraph import Layer
from explorer.engine.core.importer import import_model, import_spec
from explorer.engine.tofu.tdl import Op, Opaque, Sum, Max, TDLError, describe, oracle, strategies
from explorer.engine.tofu.tdl import aten  # noqa: F401 - registers the aten-level descriptions
from explorer.engine.tofu.tdl.oracle import input_region


@pytest.fixture(autouse=True)
def _one_torch_thread():
    """Many tiny autograd runs: one intra-op thread avoids contention on a busy 2-core box."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def rows(arr, ax):
    """[(start, stop), ...] of one axis over the workers' boxes."""
    return [tuple(int(v) for v in b[ax]) for b in arr]


# Figure 3, verbatim modulo the decorator.
CONV1D = Op("conv1d", lambda data, filters: lambda b, co, x:
            Sum(lambda ci, dx: data[b, ci, x + dx] * filters[ci, co, dx]))
# B=4 samples, CI=4 input channels, 10 input pixels; CO=6 output channels, window K=3
# -> output (4, 6, 8): "valid" convolution, x + dx ≤ 9 so x ≤ 7.
CONV1D_SHAPES = {"data": (4, 4, 10), "filters": (4, 6, 3)}


# --------------------------------------------------------------------------------------------
# The paper's examples
# --------------------------------------------------------------------------------------------


def test_conv1d_yields_figure2_strategies_with_hand_computed_regions():
    b = CONV1D.bind(CONV1D_SHAPES)
    assert b.out_shape == (4, 6, 8)                      # inferred from the accesses
    assert {v.name: e for v, e in b.extent.items()} == {"ci": 4, "dx": 3}
    ss = strategies(CONV1D, CONV1D_SHAPES, k=2)
    by = {s.name: s for s in ss}
    # Figure 2(a) batch, Figure 2's output-channel split, 2(b) reduction over ci, plus x with
    # a halo; and dx - Section 4.2: "Similar analysis is also done for dimension dx".
    assert list(by) == ["split b", "split co", "split x", "reduce ci", "reduce dx"]

    s = by["split b"]                                    # Figure 2(a)
    assert not s.output_reduction
    assert rows(s.out_boxes, 0) == [(0, 2), (2, 4)]
    assert rows(s.regions["data"], 0) == [(0, 2), (2, 4)]        # half the batch each
    assert rows(s.regions["data"], 2) == [(0, 10), (0, 10)]
    assert s.layouts["data"] == {"layout": "partitioned", "axes": [0], "halo": {}}
    assert s.layouts["filters"]["layout"] == "replicated"         # every worker: all filters

    s = by["split co"]
    assert s.layouts["data"]["layout"] == "replicated"
    assert rows(s.regions["filters"], 1) == [(0, 3), (3, 6)]      # filters[:, co, :]
    assert s.layouts["filters"]["axes"] == [1]

    s = by["split x"]                                    # halo exchange
    # worker 0: x in [0, 3] reads x + dx in [0, 3 + 2] -> [0, 6); worker 1: x in [4, 7] -> [4, 10)
    assert rows(s.regions["data"], 2) == [(0, 6), (4, 10)]
    assert s.layouts["data"]["halo"] == {2: 2}                    # K - 1 = 2 shared columns
    assert s.layouts["filters"]["layout"] == "replicated"

    s = by["reduce ci"]                                  # Figure 2(b): output reduction
    assert s.output_reduction and s.reducer == "sum"
    assert (s.out_boxes[:, :, 1] == (4, 6, 8)).all()              # each worker: whole output
    assert rows(s.regions["data"], 1) == [(0, 2), (2, 4)]         # half of data on dim 2 (ci)
    assert rows(s.regions["filters"], 0) == [(0, 2), (2, 4)]      # half of filters on dim 1
    assert s.layouts["data"]["axes"] == [1] and s.layouts["filters"]["axes"] == [0]

    s = by["reduce dx"]  # dx in [0, 0] / [1, 2]: data columns [0, 7+0] and [1, 7+2]
    assert s.reducer == "sum"
    assert rows(s.regions["data"], 2) == [(0, 8), (1, 10)]
    assert rows(s.regions["filters"], 2) == [(0, 1), (1, 3)]


def test_conv1d_symbolic_intervals_follow_figure4():
    s = {x.name: x for x in strategies(CONV1D, CONV1D_SHAPES)}
    # output coordinate x has size symbol X, dx's extent (filters axis 2) symbol DX.
    lo, hi = s["split x"].symbolic["data"][0][2]
    assert (str(lo), str(hi)) == ("0", "X/2 + DX - 2")    # [0, X/2 - 1] + [0, DX - 1]
    lo, hi = s["split x"].symbolic["data"][1][2]
    assert (str(lo), str(hi)) == ("X/2", "X + DX - 2")
    assert [str(v) for v in s["split b"].symbolic["data"][1][0]] == ["B/2", "B - 1"]
    assert [str(v) for v in s["reduce ci"].symbolic["filters"][0][0]] == ["0", "CI/2 - 1"]
    # evaluated at the concrete sizes the symbolic bounds give the numeric regions (inclusive)
    sizes = {"X": 8, "DX": 3, "B": 4, "CI": 4, "CO": 6}
    assert hi.eval(sizes) == 9 and lo.eval(sizes) == 4


def test_shift_two_paper_example():
    # Section 4.2: B = lambda i: A[i + 2]; i in [0, 9] split in two -> A[2..6] and A[7..11].
    op = describe("shift_two")
    b = op.bind({"A": (12,)})
    assert b.out_shape == (10,)
    (s,) = strategies(op, {"A": (12,)})
    assert rows(s.regions["A"], 0) == [(2, 7), (7, 12)]
    assert s.layouts["A"] == {"layout": "partitioned", "axes": [0], "halo": {}}
    assert [tuple(map(str, w[0])) for w in s.symbolic["A"]] == [("2", "I/2 + 1"),
                                                                 ("I/2 + 2", "I + 1")]


def test_matmul_three_strategies():
    # C[i, j] = Σ_k A[i, k] B[k, j];  A (6, 4), B (4, 8)
    ss = {s.name: s for s in strategies("matmul", {"A": (6, 4), "B": (4, 8)})}
    assert list(ss) == ["split i", "split j", "reduce k"]
    s = ss["split i"]                   # A rows + B replicated
    assert rows(s.regions["A"], 0) == [(0, 3), (3, 6)] and rows(s.regions["A"], 1) == [(0, 4)] * 2
    assert s.layouts["B"]["layout"] == "replicated" and not s.output_reduction
    s = ss["split j"]                   # A replicated + B columns
    assert s.layouts["A"]["layout"] == "replicated"
    assert rows(s.regions["B"], 1) == [(0, 4), (4, 8)]
    s = ss["reduce k"]                  # output reduction: A columns, B rows, then sum
    assert s.reducer == "sum"
    assert rows(s.regions["A"], 1) == [(0, 2), (2, 4)]
    assert rows(s.regions["B"], 0) == [(0, 2), (2, 4)]
    assert s.layouts["A"]["axes"] == [1] and s.layouts["B"]["axes"] == [0]
    assert "sum the partial outputs" in s.describe()


def test_batch_cholesky_opaque_partitions_only_the_batch():
    op = describe("batch_cholesky")
    ss = {s.name: s for s in strategies(op, {"batch_mat": (4, 5, 5)})}
    assert ss["split b"].layouts["batch_mat"]["axes"] == [0]
    # Cholesky(batch_mat[b, :, :])[i, j]: any (i, j) needs the whole matrix of its sample
    assert ss["split i"].layouts["batch_mat"]["layout"] == "replicated"
    assert not any(s.output_reduction for s in ss.values())


def test_pooling_window_regions_with_stride_and_padding():
    # max pool 3x3, stride 2, padding 1 on 9x9: out = (9 + 2 - 2 - 1)//2 + 1 = 5.
    op = describe("max_pool2d", kernel=3, stride=2, padding=1)
    shapes = {"data": (2, 3, 9, 9)}
    assert op.bind(shapes).out_shape == (2, 3, 5, 5)
    ss = {s.name: s for s in strategies(op, shapes)}
    s = ss["split y"]
    # y in [0, 1] reads 2y - 1 + dy in [-1, 3] -> [0, 4) clipped; y in [2, 4] reads [3, 9]
    # -> [3, 9) clipped at the border; rows 3 is shared (halo 1).
    assert rows(s.regions["data"], 2) == [(0, 4), (3, 9)]
    assert s.layouts["data"]["halo"] == {2: 1}
    # pooling windows are Max reductions: splitting one is partition-n-reduce with max
    assert ss["reduce dy"].reducer == "max" and ss["reduce dx"].reducer == "max"
    # an arbitrary box: rows [1, 4) cols [4, 5) -> rows [1, 7] -> [1, 8); cols [7, 9] -> [7, 9)
    (reg,) = input_region(op, shapes, [(0, 1), (1, 2), (1, 4), (4, 5)])
    assert reg.tolist() == [[0, 1], [1, 2], [1, 8], [7, 9]]
    # average pooling divides the window sum by a constant: still a sum reduction
    avg = {s.name: s for s in strategies("avg_pool2d", shapes, kernel=2, stride=2)}
    assert avg["reduce dy"].reducer == "sum"
    assert rows(avg["split x"].regions["data"], 3) == [(0, 4), (4, 8)]   # out 4 cols, no halo


def test_output_reduction_is_flagged_only_where_partial_results_combine():
    conv = {s.name: s for s in strategies("conv2d", {"data": (2, 4, 6, 6), "weight": (8, 4, 3, 3),
                                                      "bias": (8,)}, padding=1, bias=True)}
    assert conv["reduce ci"].reducer == "sum"
    assert "one worker" in conv["reduce ci"].note         # the bias is added once
    assert [n for n in conv if n.startswith("split")] == ["split n", "split co", "split y",
                                                          "split x"]
    lin = {s.name: s.reducer for s in strategies("linear", {"x": (4, 6), "weight": (5, 6),
                                                             "bias": (5,)})}
    assert lin == {"split i0": None, "split i1": None, "reduce i": "sum"}
    # softmax's and layer norm's sums sit under an opaque/denominator: no output reduction
    assert not any(s.output_reduction for s in strategies("softmax", {"x": (4, 6)}))
    assert not any(s.output_reduction for s in strategies(
        "layer_norm", {"x": (4, 6), "weight": (6,), "bias": (6,)}))
    # attention: the outer sum over keys j is reducible, the score's inner sum over e is not
    att = strategies("sdpa", {"q": (2, 2, 4, 3), "k": (2, 2, 5, 3), "v": (2, 2, 5, 3)})
    assert [s.name for s in att if s.output_reduction] == ["reduce j"]
    assert {s.name: s.reducer for s in strategies("amax", {"x": (4, 6)}, dims=(1,))} == {
        "split i0": None, "reduce r1": "max"}


def test_three_way_split_is_balanced_like_geometry():
    (s,) = [s for s in strategies(CONV1D, CONV1D_SHAPES, k=3) if s.name == "split x"]
    assert rows(s.out_boxes, 2) == [(0, 2), (2, 5), (5, 8)]    # i*8//3
    assert rows(s.regions["data"], 2) == [(0, 4), (2, 7), (5, 10)]


# --------------------------------------------------------------------------------------------
# Language errors
# --------------------------------------------------------------------------------------------


def test_unknown_operator_raises_keyerror_naming_it():
    with pytest.raises(KeyError, match="frobnicate"):
        describe("frobnicate")
    with pytest.raises(KeyError, match="frobnicate"):
        strategies("frobnicate", {"x": (2, 2)})
    lay = Layer("f1", "frobnicate", (2, 3), ("n", "c"), in_shapes=((2, 3),))
    with pytest.raises(KeyError, match="frobnicate"):
        oracle.from_layer(lay)
    with pytest.raises(KeyError, match="frobnicate"):
        oracle.input_regions(lay, 0, G.full_box((2, 3), (1,)))
    with pytest.raises(ValueError, match="no inputs"):
        oracle.from_layer(Layer("x", "input", (2, 3), ("n", "c")))


def test_non_affine_and_unanalysable_descriptions_are_rejected():
    with pytest.raises(TDLError, match="not affine"):
        Op("sq", lambda A: lambda i, j: A[i * j]).bind({"A": (9,)})
    with pytest.raises(TDLError, match="extent of reduction variable r"):
        Op("win", lambda A: lambda i: Sum(lambda r: A[i + r])).bind({"A": (9,)})
    with pytest.raises(TDLError, match="2 indices on a rank-3"):
        Op("bad", lambda A: lambda i: A[i, 0]).bind({"A": (2, 2, 2)})
    # an explicit extent makes the window analysable: i + r, r in [0, 2] -> out size 7
    win = Op("win", lambda A: lambda i: Sum(lambda r: A[i + r], r=3))
    assert win.bind({"A": (9,)}).out_shape == (7,)
    assert input_region(win, {"A": (9,)}, [(2, 4)])[0].tolist() == [[2, 6]]


def test_strides_division_and_modulo_in_index_expressions():
    # every other element, reversed: B[i] = A[2*(N-1-i)] for A of 9 -> B of 5
    rev = Op("rev2", lambda A: lambda i: A[(4 - i) * 2], out_shape=lambda a: (5,))
    assert input_region(rev, [(9,)], [(1, 3)])[0].tolist() == [[4, 7]]   # i=1,2 -> 6, 4
    # i // 3 and i % 3 (an unflatten): rows [1, 2) -> A[0, 1:3)... via the reshape library
    op = describe("reshape", shape=(12,))
    assert input_region(op, [(4, 3)], [(4, 6)])[0].tolist() == [[1, 2], [1, 3]]
    assert input_region(op, [(4, 3)], [(2, 7)])[0].tolist() == [[0, 3], [0, 3]]


def test_user_written_opaque_and_max_descriptions():
    # an opaque function's arguments still count: relu(x[i, j + 1]) reads the next column
    op = Op("relu_next", lambda x: lambda i, j: Opaque("relu", x[i, j + 1]))
    assert op.bind({"x": (4, 6)}).out_shape == (4, 5)
    assert input_region(op, {"x": (4, 6)}, [(1, 2), (0, 3)])[0].tolist() == [[1, 2], [1, 4]]
    # row maximum: splitting the row is partition-n-reduce with max as the reducer
    rowmax = Op("rowmax", lambda x: lambda i: Max(lambda j: x[i, j]))
    ss = {s.name: s for s in strategies(rowmax, {"x": (4, 6)})}
    assert ss["reduce j"].reducer == "max"
    assert rows(ss["reduce j"].regions["x"], 1) == [(0, 3), (3, 6)]
    assert ss["split i"].layouts["x"]["axes"] == [0]


def test_elementwise_detection_for_coarsening():
    assert describe("relu").bind([(3, 4)]).is_elementwise()
    assert describe("add").bind([(3, 4), (4,)]).is_elementwise()        # broadcast operand
    assert not describe("softmax").bind([(3, 4)]).is_elementwise()
    assert not describe("permute", perm=(1, 0)).bind([(3, 4)]).is_elementwise()
    assert not CONV1D.bind(CONV1D_SHAPES).is_elementwise()


def test_gather_and_concat_special_forms():
    # embedding: the row of weight is data-dependent, so any row may be read
    (ids, w) = input_region(describe("embedding"), {"ids": (4, 7), "weight": (50, 8)},
                            [(1, 3), (2, 5), (4, 6)])
    assert ids.tolist() == [[1, 3], [2, 5]] and w.tolist() == [[0, 50], [4, 6]]
    # concat of widths 3, 5, 1 along axis 1: offsets 0, 3, 8
    op = describe("concat", dim=1, n_inputs=3)
    shapes = [(2, 3, 4), (2, 5, 4), (2, 1, 4)]
    r = input_region(op, shapes, [(0, 2), (2, 4), (0, 4)])        # columns 2, 3
    assert [x[1].tolist() for x in r] == [[2, 3], [0, 1], [0, 0]]  # input 2 not read
    assert G.volume(r[2]) == 0


# --------------------------------------------------------------------------------------------
# Autograd: regions are exactly (or contain) what an output box depends on
# --------------------------------------------------------------------------------------------

_rng = np.random.default_rng(7)


def _rand_box(shape, rng=_rng):
    b = []
    for s in shape:
        x, y = sorted(rng.integers(0, s, 2))
        b.append((int(x), int(y) + 1))
    return np.array(b, dtype=np.int64)


def _dependencies(fn, shapes, box, ints=()):
    """Bounding box of the nonzero gradient of each input w.r.t. out[box] (random weights)."""
    ts = [torch.randint(0, 5, s) if j in ints else
          (torch.rand(s, dtype=torch.float64) + 0.5).requires_grad_()
          for j, s in enumerate(shapes)]
    out = fn(*ts)
    sl = tuple(slice(a, b) for a, b in box)
    (out[sl] * (torch.rand_like(out[sl]) + 0.5)).sum().backward()
    res = []
    for j, t in enumerate(ts):
        if j in ints:
            res.append(None)
            continue
        nz = (t.grad != 0).nonzero() if t.grad is not None else torch.zeros(0, 1)
        if len(nz) == 0:
            res.append(np.zeros((len(shapes[j]), 2), dtype=np.int64))
        else:
            res.append(np.stack([nz.min(0).values.numpy(), nz.max(0).values.numpy() + 1], -1))
    return tuple(out.shape), res


def _contains(outer, inner):
    if (inner[:, 1] <= inner[:, 0]).any():
        return True
    return bool(((outer[:, 0] <= inner[:, 0]) & (outer[:, 1] >= inner[:, 1])).all())


def test_tiny_conv2d_region_is_exactly_what_autograd_depends_on():
    # stride 2, padding 1, 2 groups, bias: data region = bounding box of nonzero d out[box]/d x
    op = describe("conv2d", stride=2, padding=1, groups=2, bias=True)
    shapes = [(2, 4, 9, 9), (6, 2, 3, 3), (6,)]
    assert op.bind(shapes).out_shape == (2, 6, 5, 5)
    rng = np.random.default_rng(3)
    for _ in range(25):
        box = _rand_box((2, 6, 5, 5), rng)
        _, (dx, dw, db) = _dependencies(
            lambda x, w, b: F.conv2d(x, w, b, stride=2, padding=1, groups=2), shapes, box)
        rx, rw, rb = input_region(op, shapes, box)
        assert (rx == dx).all(), (box.tolist(), rx.tolist(), dx.tolist())
        assert (rb == db).all()
        # a filter tap that only meets zero padding has zero gradient but is still read
        assert _contains(rw, dw) and (rw[:2] == dw[:2]).all()


# (name, description, input shapes, torch function, inputs whose region must be exact)
_AUTOGRAD_CASES = [
    ("conv1d paper", describe("conv1d"), [(2, 4, 10), (4, 6, 3)],
     lambda d, f: F.conv1d(d, f.permute(1, 0, 2)), (0, 1)),
    ("conv1d stride 3", describe("conv", nsp=1, stride=3, padding=1), [(2, 3, 17), (4, 3, 4)],
     lambda x, w: F.conv1d(x, w, stride=3, padding=1), (0,)),
    ("conv2d dilation 2", describe("conv2d", padding=2, dilation=2), [(2, 3, 9, 9), (4, 3, 3, 3)],
     lambda x, w: F.conv2d(x, w, padding=2, dilation=2), ()),
    ("conv2d grad data", describe("conv2d_backward_data", stride=2, padding=1, groups=2,
                                  in_size=(9, 9)), [(2, 6, 5, 5), (6, 2, 3, 3)],
     lambda dy, w: torch.nn.grad.conv2d_input((2, 4, 9, 9), w, dy, stride=2, padding=1,
                                              groups=2), (0,)),
    ("conv2d grad filter", describe("conv2d_backward_filter", stride=2, padding=1, kernel=3),
     [(2, 4, 9, 9), (2, 6, 5, 5)],
     lambda x, dy: torch.nn.grad.conv2d_weight(x, (6, 4, 3, 3), dy, stride=2, padding=1), ()),
    ("avg pool", describe("avg_pool2d", kernel=3, stride=2, padding=1), [(2, 3, 9, 9)],
     lambda x: F.avg_pool2d(x, 3, 2, 1), (0,)),
    ("max pool", describe("max_pool2d", kernel=3, stride=2, padding=1), [(2, 3, 9, 9)],
     lambda x: F.max_pool2d(x, 3, 2, 1), ()),
    ("adaptive pool", describe("adaptive_pool", out_size=(3, 4)), [(2, 3, 7, 9)],
     lambda x: F.adaptive_avg_pool2d(x, (3, 4)), (0,)),
    ("upsample nearest", describe("upsample", out_size=(8, 12)), [(2, 3, 4, 6)],
     lambda x: F.interpolate(x, size=(8, 12), mode="nearest"), (0,)),
    ("adaptive pool grad, overlapping bins", describe("adaptive_avg_pool_backward"),
     [(2, 3, 6, 4), (2, 3, 3, 7)], lambda dy, x: torch.ops.aten._adaptive_avg_pool2d_backward(
         dy, x), (0,)),
    ("adaptive pool grad, global", describe("adaptive_avg_pool_backward"),
     [(2, 3, 1, 1), (2, 3, 5, 4)], lambda dy, x: torch.ops.aten._adaptive_avg_pool2d_backward(
         dy, x), (0,)),
    ("upsample nearest 3->7", describe("upsample", out_size=(7, 12)), [(2, 3, 3, 6)],
     lambda x: F.interpolate(x, size=(7, 12), mode="nearest"), (0,)),
    ("upsample nearest grad", describe("upsample_nearest_backward", in_size=(4, 3)),
     [(2, 3, 8, 7)], lambda dy: torch.ops.aten.upsample_nearest2d_backward(
         dy, [8, 7], [2, 3, 4, 3], None, None), (0,)),
    ("upsample bilinear", describe("upsample", out_size=(8, 12), mode="bilinear"),
     [(2, 3, 4, 6)], lambda x: F.interpolate(x, size=(8, 12), mode="bilinear"), (0,)),
    ("linear", describe("linear"), [(3, 5, 7), (4, 7), (4,)], F.linear, (0, 1, 2)),
    ("batched matmul", describe("batch_matmul"), [(3, 1, 4, 5), (2, 5, 6)], torch.matmul, (0, 1)),
    ("matmul grad A", describe("matmul_backward_a"), [(4, 6), (5, 6)],
     lambda dc, b: dc @ b.T, (0, 1)),
    ("matmul grad B", describe("matmul_backward_b"), [(4, 5), (4, 6)],
     lambda a, dc: a.T @ dc, (0, 1)),
    ("linear grad weight", describe("linear_backward_weight"), [(3, 4), (3, 7)],
     lambda dy, x: dy.T @ x, (0, 1)),
    ("softmax", describe("softmax", dim=1), [(3, 5, 4)], lambda x: torch.softmax(x, 1), (0,)),
    ("softmax grad", describe("softmax_backward"), [(3, 5), (3, 5)],
     lambda dy, y: y * (dy - (dy * y).sum(-1, keepdim=True)), (0, 1)),
    ("layer norm", describe("layer_norm", nnorm=2), [(3, 4, 5, 6), (5, 6), (5, 6)],
     lambda x, w, b: F.layer_norm(x, (5, 6), w, b), (0, 1, 2)),
    ("batch norm", describe("batch_norm"), [(3, 4, 5, 6), (4,), (4,)],
     lambda x, w, b: F.batch_norm(x, None, None, w, b, training=True), (0, 1, 2)),
    ("attention", describe("sdpa"), [(2, 3, 5, 4), (2, 3, 6, 4), (2, 3, 6, 7)],
     F.scaled_dot_product_attention, (0, 1, 2)),
    ("lstm cell", describe("lstm_cell"),
     [(3, 5), (3, 4), (3, 4), (4, 4, 5), (4, 4, 4), (4, 4), (4, 4)],
     lambda x, h, c, wi, wh, bi, bh: torch.lstm_cell(x, (h, c), wi.reshape(16, 5),
                                                     wh.reshape(16, 4), bi.reshape(16),
                                                     bh.reshape(16))[0], (0, 1, 2, 3, 4, 5, 6)),
    ("concat", describe("concat", dim=1, n_inputs=3), [(2, 3, 4), (2, 5, 4), (2, 1, 4)],
     lambda a, b, c: torch.cat([a, b, c], 1), ()),
    ("permute", describe("permute", perm=(2, 0, 1)), [(3, 4, 5)], lambda x: x.permute(2, 0, 1),
     (0,)),
    ("reshape", describe("reshape", shape=(6, 20)), [(2, 3, 4, 5)],
     lambda x: x.reshape(6, 20), (0,)),
    ("sum keepdim", describe("sum", dims=(1, 3), keepdim=True), [(3, 4, 5, 6)],
     lambda x: x.sum((1, 3), keepdim=True), (0,)),
    ("mean", describe("mean", dims=(0,)), [(3, 4, 5)], lambda x: x.mean(0), (0,)),
    ("broadcast mul", describe("mul", n_inputs=3), [(3, 4, 5), (5,), (3, 1, 1)],
     lambda a, b, c: a * b * c, (0, 1, 2)),
    ("select", describe("select", dim=1, index=2), [(3, 4, 5)], lambda x: x[:, 2], (0,)),
    ("slice", describe("slice", dim=2, start=1, stop=4), [(3, 4, 5)], lambda x: x[:, :, 1:4],
     (0,)),
    ("embedding", describe("embedding"), [(3, 4), (5, 6)], F.embedding, ()),
    # the operators of today's models (descriptions in tdl/aten.py)
    ("gather", describe("gather", dim=1), [(3, 6, 4), (3, 5, 4)],
     lambda x, i: torch.gather(x, 1, i), ()),
    ("index_select", describe("index_select", dim=1), [(3, 6, 4), (5,)],
     lambda x, i: torch.index_select(x, 1, i), ()),
    ("scatter_add", describe("scatter_add", dim=1), [(3, 6, 4), (3, 5, 4), (3, 5, 4)],
     lambda s, i, src: s.scatter_add(1, i, src), (0,)),
    ("index_put", describe("index_put", positions=(1,), accumulate=True),
     [(3, 6, 4), (5,), (3, 5, 4)],
     lambda s, i, v: torch.ops.aten.index_put(s, [None, i], v, True), (0,)),
    ("cumsum", describe("cumsum", dim=1), [(3, 5, 4)], lambda x: torch.cumsum(x, 1), (0,)),
    ("flip", describe("flip", dims=(0, 2)), [(3, 4, 5)], lambda x: x.flip(0, 2), (0,)),
    ("transposed conv", describe("conv_transpose", stride=2, padding=1, groups=2, bias=True,
                                 out_size=(10, 10)), [(2, 4, 5, 5), (4, 3, 3, 3), (6,)],
     lambda x, w, b: F.conv_transpose2d(x, w, b, stride=2, padding=1, output_padding=1,
                                        groups=2), (0, 2)),
    ("baddbmm", describe("baddbmm"), [(1, 4, 6), (3, 4, 5), (3, 5, 6)], torch.baddbmm,
     (0, 1, 2)),
    ("causal grouped-query attention", describe("flash_attention", causal=True),
     [(2, 4, 5, 3), (2, 2, 5, 3), (2, 2, 5, 3)],
     lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True),
     (2,)),                             # query 0 sees one key: its softmax has no gradient
    ("slice_scatter", describe("slice_scatter", dim=1, start=1, stop=3), [(3, 5, 4), (3, 2, 4)],
     lambda x, s: torch.slice_scatter(x, s, 1, 1, 3), ()),
]
#: integer (index) inputs of the cases above: random indices below 5, no gradient
_INTS = {"embedding": (0,), "gather": (1,), "index_select": (1,), "scatter_add": (1,),
         "index_put": (1,)}


@pytest.mark.parametrize("name, op, shapes, fn, exact", _AUTOGRAD_CASES,
                         ids=[c[0] for c in _AUTOGRAD_CASES])
def test_library_regions_against_autograd(name, op, shapes, fn, exact):
    """Every region contains what autograd says the box depends on; for the listed inputs it
    is exactly that bounding box (elsewhere a region may be larger for a structural reason:
    max/argmax picks, filter taps that only meet padding, data-dependent gather rows)."""
    ints = _INTS.get(name, ())
    b = op.bind(shapes)
    rng = np.random.default_rng(11)
    for _ in range(12):
        box = _rand_box(b.out_shape, rng)
        out_shape, deps = _dependencies(fn, shapes, box, ints)
        assert out_shape == b.out_shape
        regs = input_region(op, shapes, box)
        for j, (r, d) in enumerate(zip(regs, deps)):
            if d is None:
                continue
            assert _contains(r, d), (name, j, box.tolist(), r.tolist(), d.tolist())
            if j in exact:
                assert (r == d).all(), (name, j, box.tolist(), r.tolist(), d.tolist())


# --------------------------------------------------------------------------------------------
# One source of truth: TDL regions equal the engine's geometry on real layers
# --------------------------------------------------------------------------------------------

_MODELS = [("inception_v3", None), ("vgg16", None), ("resnet50", None),
           ("transformer", {"layers": 1, "hidden": 64, "heads": 4, "seq": 16}),
           ("unet", None), ("lstm", None)]


@pytest.fixture(scope="module")
def graphs():
    return {spec: import_spec(spec, batch=4, model_args=args) for spec, args in _MODELS}


def _random_boxes(shape, n, axes=None, rng=None):
    """n random non-empty boxes; axes marked '-' (not partitionable) stay whole if given."""
    rng = rng or np.random.default_rng(0)
    boxes = np.zeros((n, len(shape), 2), dtype=np.int64)
    for a, s in enumerate(shape):
        if axes is not None and axes[a] == "-":
            boxes[:, a, 1] = s
            continue
        x, y = rng.integers(0, s, n), rng.integers(0, s, n)
        boxes[:, a, 0], boxes[:, a, 1] = np.minimum(x, y), np.maximum(x, y) + 1
    return boxes


@pytest.mark.slow
@pytest.mark.parametrize("spec", [m for m, _ in _MODELS])
def test_tdl_regions_equal_geometry_on_real_layers(graphs, spec):
    g = graphs[spec]
    rng = np.random.default_rng(1)
    checked = 0
    for lay in g.layers():
        if lay.op == "input":
            continue
        # the description reproduces the layer's output shape (checked by layer_bound)
        assert oracle.layer_bound(lay).out_shape == lay.out_shape
        cfg_boxes = np.concatenate([G.output_boxes(lay, c) for c in G.enumerate_configs(lay, 4)])
        rand = _random_boxes(lay.out_shape, 40, lay.axes, rng)
        anyb = _random_boxes(lay.out_shape, 40, None, rng)
        for i in range(len(lay.in_shapes)):
            for boxes in (cfg_boxes, rand):
                want = G.input_regions(lay, i, boxes)
                got = oracle.input_regions(lay, i, boxes)
                assert (got == want).all(), (spec, lay.name, lay.op, i)
                checked += len(boxes)
            # boxes also cutting non-partitionable axes: the one known difference is sdpa's v,
            # where geometry keeps every column of the head dim; TDL is tighter (see below)
            want = G.input_regions(lay, i, anyb)
            got = oracle.input_regions(lay, i, anyb)
            if lay.op == "sdpa" and i == 2:
                assert all(_contains(w, t) for w, t in zip(want, got))
            else:
                assert (got == want).all(), (spec, lay.name, lay.op, i)
    assert checked > 0


def test_sdpa_value_columns_geometry_is_conservative_tdl_is_exact():
    # out[n, h, l, d] = Σ_j softmax(q k)[.., l, j] · v[n, h, j, d]: column d of the output reads
    # only column d of v.  geometry.input_regions keeps all of v's head dim (it is never split
    # by a configuration, axis letter '-'), the TDL analysis gives exactly the columns.
    lay = Layer("att", "sdpa", (2, 3, 5, 7), ("n", "c", "l", "-"),
                in_shapes=((2, 3, 5, 4), (2, 3, 6, 4), (2, 3, 6, 7)))
    box = np.array([[0, 1], [1, 3], [2, 4], [2, 5]])
    _, (dq, dk, dv) = _dependencies(F.scaled_dot_product_attention, list(lay.in_shapes), box)
    assert (oracle.input_regions(lay, 2, box) == dv).all()
    assert dv[3].tolist() == [2, 5]
    assert G.input_regions(lay, 2, box)[3].tolist() == [0, 7]
    for i, d in ((0, dq), (1, dk)):
        assert (oracle.input_regions(lay, i, box) == d).all()
        assert (G.input_regions(lay, i, box) == d).all()


def test_bilinear_upsample_geometry_is_one_row_conservative_tdl_is_exact():
    # align_corners=False: output row o reads rows i0 = ⌊((2o+1)·I - O) / 2O⌋ and i0 + 1.
    # 4 -> 8, output rows [3, 6): i0 = 1, 1, 2 -> input rows [1, 4).  geometry.input_regions
    # widens to ⌊3·4/8⌋ - 1 = 0.  (No example model uses bilinear: U-Net upsamples nearest.)
    lay = Layer("up", "upsample", (1, 2, 8, 8), ("n", "c", "h", "w"),
                in_shapes=((1, 2, 4, 4),), attrs={"mode": "bilinear"})
    box = np.array([[0, 1], [0, 2], [3, 6], [0, 8]])
    _, (dx,) = _dependencies(lambda x: F.interpolate(x, size=(8, 8), mode="bilinear"),
                             [(1, 2, 4, 4)], box)
    assert dx[2].tolist() == [1, 4]
    assert (oracle.input_regions(lay, 0, box) == dx).all()
    assert G.input_regions(lay, 0, box)[2].tolist() == [0, 4]


def test_param_regions_equal_geometry_param_shards(graphs):
    diffs = set()
    for spec in ("inception_v3", "resnet50", "transformer", "lstm"):
        for lay in graphs[spec].layers():
            if lay.op == "input" or not lay.params:
                continue
            boxes = np.concatenate([G.output_boxes(lay, c)
                                    for c in G.enumerate_configs(lay, 4)])
            want, got = G.param_shards(lay, boxes), oracle.param_regions(lay, boxes)
            assert set(want) == set(got)
            for p, (shape, reg) in want.items():
                assert tuple(got[p][0]) == tuple(shape), (lay.name, p)
                if not (got[p][1] == reg).all():
                    diffs.add((lay.op, p))
                    assert all(_contains(w, t) for w, t in zip(reg, got[p][1]))
    # the folded positional embedding pos[0, l, c] is added element-wise: a device needs only
    # its own (l, c) block; geometry replicates it whole.  Everything else agrees.
    assert diffs == {("embedding", "pos")}


def test_edge_view_transforms_equal_geometry(graphs):
    n = 0
    rng = np.random.default_rng(5)
    for spec in ("transformer", "inception_v3", "lstm"):
        g = graphs[spec]
        for e in g.edges():
            if not [t for t in e.transforms if t[0] != "item"]:
                continue
            cons = g.layer(e.dst).in_shapes[e.index]
            boxes = _random_boxes(cons, 60, None, rng)
            want = G.apply_transforms(boxes, e.transforms)
            got = oracle.transform_regions(e.transforms, boxes, g.layer(e.src).out_shape, cons)
            assert (got == want).all(), (spec, e)
            n += 1
    assert n >= 5


class _TinyAttention(nn.Module):
    """Matrix products with broadcasting, softmax, reductions and view edges."""

    def __init__(self):
        super().__init__()
        self.q, self.k, self.v = nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 6)

    def forward(self, x):
        n = x.shape[0]
        a = self.q(x).view(n, 4, 2, 4).transpose(1, 2)
        b = self.k(x).view(n, 4, 2, 4).transpose(1, 2)
        w = torch.softmax(torch.matmul(a, b.transpose(-1, -2)), -1)
        r = torch.matmul(w, self.v(x).view(n, 1, 4, 6))    # broadcast over heads
        return r.sum(-1).mean(1)


def test_matmul_softmax_reduce_layers_of_a_tiny_model_equal_geometry():
    g = import_model(_TinyAttention(), torch.randn(4, 4, 8))
    ops = {lay.op for lay in g.layers()}
    assert {"matmul", "softmax", "reduce", "linear"} <= ops
    rng = np.random.default_rng(2)
    for lay in g.layers():
        if lay.op == "input":
            continue
        boxes = np.concatenate([_random_boxes(lay.out_shape, 50, None, rng)] +
                               [G.output_boxes(lay, c) for c in G.enumerate_configs(lay, 4)])
        for i in range(len(lay.in_shapes)):
            assert (oracle.input_regions(lay, i, boxes) == G.input_regions(lay, i, boxes)).all(), \
                (lay.name, i)
    for e in g.edges():
        if e.transforms:
            cons = g.layer(e.dst).in_shapes[e.index]
            boxes = _random_boxes(cons, 50, None, rng)
            assert (oracle.transform_regions(e.transforms, boxes, g.layer(e.src).out_shape, cons)
                    == G.apply_transforms(boxes, e.transforms)).all(), e


def test_strategies_of_an_imported_conv_layer():
    # a real conv layer (folded BatchNorm scale/shift) through from_layer: the strategies are
    # those of conv2d, the per-channel BN parameters follow the output channel
    lay = Layer("c", "conv", (2, 8, 6, 6), ("n", "c", "h", "w"), in_shapes=((2, 4, 6, 6),),
                params={"weight": (8, 4, 3, 3), "bn.weight": (8,), "bn.bias": (8,)},
                attrs={"kernel": (3, 3), "stride": (1, 1), "padding": (1, 1),
                       "dilation": (1, 1), "groups": 1})
    desc, shapes = oracle.from_layer(lay)
    assert list(shapes) == ["data", "weight", "bn.weight", "bn.bias"]
    ss = {s.name: s for s in strategies(desc, shapes)}
    assert ss["split co"].layouts["bn.weight"]["axes"] == [0]
    assert ss["split n"].layouts["bn.weight"]["layout"] == "replicated"
    assert ss["reduce ci"].reducer == "sum"
    assert rows(ss["split y"].regions["data"], 2) == [(0, 4), (2, 6)]   # 1-row halo each side

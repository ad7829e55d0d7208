"""Tofu plans executed tile-local: each worker holds only its boxes and computes each
operator on local shapes (:mod:`explorer.engine.runtime.tiles`).

The first tests check the tile rules against the whole-tensor op in this process (no
workers); the others run saved plans on 2 and 4 gloo workers against the float64 reference:
bytes moved equal the plan's, no operator falls back to full-size buffers, the measured
per-worker peak is within 10 % of the plan's ``peak_memory_bytes`` and well below one
device's.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from _helpers import explorer_cli
from explorer.engine.core.geometry import window
from explorer.engine.core.geometry.windows import transpose_window
from explorer.engine.runtime import tiles
from explorer.engine.runtime.dispatch import run_document
from explorer.engine.search import Problem, Request, run
from explorer.engine.tofu import search as tofu

aten = torch.ops.aten


def _tiles(pairs):
    """``tile_of`` for the tests: {id(tensor): (box, whole shape)}."""
    table = {id(t): (np.asarray(box), tuple(shape)) for t, box, shape in pairs}
    return lambda v: table.get(id(v), (None, None))


def _rows(box_rows, shape, axis=2):
    box = np.array([[0, s] for s in shape])
    box[axis] = box_rows
    return box


def test_nearest_upsampling_and_its_gradient_run_on_row_tiles():
    """U-Net's 2x nearest upsampling: output rows from the input rows they repeat, and the
    input rows' gradient from exactly the output rows that repeat them."""
    torch.manual_seed(0)
    x = torch.randn(2, 3, 5, 4, dtype=torch.float64)
    y = aten.upsample_nearest2d(x, [10, 8], 2.0, 2.0)
    go = torch.randn_like(y)
    gx = aten.upsample_nearest2d_backward(go, [10, 8], list(x.shape), 2.0, 2.0)
    for lo, hi in [(0, 3), (3, 8), (8, 10)]:
        a, z = lo // 2, (hi - 1) // 2 + 1
        xt = x[:, :, a:z].clone()
        got = tiles.compute("upsample_nearest2d", aten.upsample_nearest2d,
                            (xt, [10, 8], 2.0, 2.0), {}, 0,
                            _tiles([(xt, _rows((a, z), x.shape), x.shape)]),
                            _rows((lo, hi), y.shape), y.shape)
        assert torch.equal(got, y[:, :, lo:hi]), (lo, hi)
    for lo, hi in [(0, 2), (2, 5)]:
        gt = go[:, :, 2 * lo:2 * hi].clone()
        got = tiles.compute("upsample_nearest2d_backward", aten.upsample_nearest2d_backward,
                            (gt, [10, 8], list(x.shape), 2.0, 2.0), {}, 0,
                            _tiles([(gt, _rows((2 * lo, 2 * hi), y.shape), y.shape)]),
                            _rows((lo, hi), x.shape), x.shape)
        assert torch.allclose(got, gx[:, :, lo:hi], atol=1e-12), (lo, hi)


def test_convolution_and_its_backward_run_on_tiles_with_halos():
    """Output rows of a strided, dilated, padded convolution from the input rows of their
    window only (padding at the true border), and both gradients from tiles, equal the
    whole-tensor op's."""
    torch.manual_seed(0)
    x = torch.randn(2, 3, 11, 9, dtype=torch.float64)
    w = torch.randn(4, 3, 3, 3, dtype=torch.float64)
    b = torch.randn(4, dtype=torch.float64)
    s, p, d = [2, 1], [1, 1], [2, 1]
    y = aten.convolution(x, w, b, s, p, d, False, [0, 0], 1)
    go = torch.randn_like(y)
    gx, gw, gb = aten.convolution_backward(go, x, w, [4], s, p, d, False, [0, 0], 1,
                                           [True, True, True])
    H, Ho = x.shape[2], y.shape[2]
    pw = torch.zeros_like(gw)
    for lo, hi in [(0, 2), (2, 4), (4, Ho)]:
        a, z = (int(v) for v in window(lo, hi, H, 3, s[0], p[0], d[0]))
        xt = x[:, :, a:z].clone()
        out = _rows((lo, hi), y.shape)
        got = tiles.compute("convolution", aten.convolution,
                            (xt, w, b, s, p, d, False, [0, 0], 1), {}, 0,
                            _tiles([(xt, _rows((a, z), x.shape), x.shape),
                                    (w, [[0, n] for n in w.shape], w.shape)]),
                            out, y.shape)
        assert torch.allclose(got, y[:, :, lo:hi], atol=1e-12), (lo, hi)
        # the weight gradient of these output rows: a partial sum over the row tiles
        gt = go[:, :, lo:hi].clone()
        args = (gt, xt, None, [4], s, p, d, False, [0, 0], 1, [False, True, False])
        pw += tiles.compute("convolution_backward", aten.convolution_backward, args, {}, 1,
                            _tiles([(gt, out, y.shape), (xt, _rows((a, z), x.shape),
                                                         x.shape)]),
                            np.array([[0, n] for n in w.shape]), w.shape)
    assert torch.allclose(pw, gw, atol=1e-10)
    for lo, hi in [(0, 4), (4, 7), (7, H)]:
        a, z = (int(v) for v in transpose_window(lo, hi, Ho, 3, s[0], p[0], d[0]))
        gt = go[:, :, a:z].clone()
        args = (gt, None, w, [4], s, p, d, False, [0, 0], 1, [True, False, False])
        got = tiles.compute("convolution_backward", aten.convolution_backward, args, {}, 0,
                            _tiles([(gt, _rows((a, z), y.shape), y.shape),
                                    (w, [[0, n] for n in w.shape], w.shape)]),
                            _rows((lo, hi), x.shape), x.shape)
        assert torch.allclose(got, gx[:, :, lo:hi], atol=1e-10), (lo, hi)


def test_a_depthwise_convolution_split_by_channel_runs_one_group_per_channel():
    torch.manual_seed(4)
    x = torch.randn(2, 6, 7, 7, dtype=torch.float64)
    w = torch.randn(6, 1, 3, 3, dtype=torch.float64)
    args = ([1, 1], [1, 1], [1, 1], False, [0, 0], 6)
    y = aten.convolution(x, w, None, *args)
    go = torch.randn_like(y)
    gx, gw, _ = aten.convolution_backward(go, x, w, None, *args, [True, True, False])
    for c0, c1 in [(0, 2), (2, 6)]:
        xt, wt, gt = x[:, c0:c1].clone(), w[c0:c1].clone(), go[:, c0:c1].clone()
        xb = np.array([[0, 2], [c0, c1], [0, 7], [0, 7]])
        wb = np.array([[c0, c1], [0, 1], [0, 3], [0, 3]])
        tile_of = _tiles([(xt, xb, x.shape), (wt, wb, w.shape), (gt, xb, y.shape)])
        got = tiles.compute("convolution", aten.convolution, (xt, wt, None, *args), {}, 0,
                            tile_of, xb, y.shape)
        assert torch.allclose(got, y[:, c0:c1], atol=1e-12)
        got = tiles.compute("convolution_backward", aten.convolution_backward,
                            (gt, xt, wt, None, *args, [True, True, False]), {}, 1, tile_of,
                            wb, w.shape)
        assert torch.allclose(got, gw[c0:c1], atol=1e-12)
        got = tiles.compute("convolution_backward", aten.convolution_backward,
                            (gt, None, wt, None, *args, [True, True, False]), {}, 0, tile_of,
                            xb, x.shape)
        assert torch.allclose(got, gx[:, c0:c1], atol=1e-12)


def test_max_pooling_on_tiles_keeps_the_whole_tensor_s_indices():
    torch.manual_seed(1)
    x = torch.randn(2, 2, 9, 8, dtype=torch.float64)
    k, s, p = [3, 3], [2, 2], [1, 1]
    val, idx = aten.max_pool2d_with_indices(x, k, s, p, [1, 1], False)
    go = torch.randn_like(val)
    gx = aten.max_pool2d_with_indices_backward(go, x, k, s, p, [1, 1], False, idx)
    Ho = val.shape[2]
    for lo, hi in [(0, 2), (2, Ho)]:
        a, z = (int(v) for v in window(lo, hi, x.shape[2], 3, 2, 1))
        xt = x[:, :, a:z].clone()
        tile_of = _tiles([(xt, _rows((a, z), x.shape), x.shape)])
        out = _rows((lo, hi), val.shape)
        args = (xt, k, s, p, [1, 1], False)
        got_v = tiles.compute("max_pool2d_with_indices", aten.max_pool2d_with_indices, args,
                              {}, 0, tile_of, out, val.shape)
        got_i = tiles.compute("max_pool2d_with_indices", aten.max_pool2d_with_indices, args,
                              {}, 1, tile_of, out, val.shape)
        assert torch.equal(got_v, val[:, :, lo:hi]) and torch.equal(got_i, idx[:, :, lo:hi])
    # the input gradient of rows [3, 9) from the pooled rows that reach them
    gt, it = go[:, :, 1:].clone(), idx[:, :, 1:].clone()
    got = tiles.compute("max_pool2d_with_indices_backward",
                        aten.max_pool2d_with_indices_backward,
                        (gt, None, k, s, p, [1, 1], False, it), {}, 0,
                        _tiles([(gt, _rows((1, Ho), val.shape), val.shape),
                                (it, _rows((1, Ho), val.shape), val.shape)]),
                        _rows((3, 9), x.shape), x.shape)
    assert torch.equal(got, gx[:, :, 3:9])


def test_average_pooling_and_its_gradient_on_tiles():
    torch.manual_seed(2)
    x = torch.randn(2, 3, 10, 7, dtype=torch.float64)
    k, s, p = [3, 3], [2, 2], [1, 1]
    y = aten.avg_pool2d(x, k, s, p, False, True, None)
    go = torch.randn_like(y)
    gx = aten.avg_pool2d_backward(go, x, k, s, p, False, True, None)
    Ho, H = y.shape[2], x.shape[2]
    for lo, hi in [(0, 2), (2, Ho)]:
        a, z = (int(v) for v in window(lo, hi, H, 3, 2, 1))
        xt = x[:, :, a:z].clone()
        got = tiles.compute("avg_pool2d", aten.avg_pool2d, (xt, k, s, p, False, True, None),
                            {}, 0, _tiles([(xt, _rows((a, z), x.shape), x.shape)]),
                            _rows((lo, hi), y.shape), y.shape)
        assert torch.allclose(got, y[:, :, lo:hi], atol=1e-12)
    for lo, hi in [(0, 3), (3, H)]:
        a, z = (int(v) for v in transpose_window(lo, hi, Ho, 3, 2, 1))
        gt = go[:, :, a:z].clone()
        got = tiles.compute("avg_pool2d_backward", aten.avg_pool2d_backward,
                            (gt, None, k, s, p, False, True, None), {}, 0,
                            _tiles([(gt, _rows((a, z), y.shape), y.shape)]),
                            _rows((lo, hi), x.shape), x.shape)
        assert torch.allclose(got, gx[:, :, lo:hi], atol=1e-12)


def test_adaptive_pooling_of_whole_images_runs_on_channel_blocks_and_a_split_image_falls_back():
    torch.manual_seed(5)
    x = torch.randn(2, 4, 9, 7, dtype=torch.float64)
    y = aten._adaptive_avg_pool2d(x, [3, 2])
    go = torch.randn_like(y)
    gx = aten._adaptive_avg_pool2d_backward(go, x)
    xt, gt = x[:, 1:3].clone(), go[:, 1:3].clone()
    xb, yb = np.array([[0, 2], [1, 3], [0, 9], [0, 7]]), np.array([[0, 2], [1, 3], [0, 3], [0, 2]])
    tile_of = _tiles([(xt, xb, x.shape), (gt, yb, y.shape)])
    got = tiles.compute("_adaptive_avg_pool2d", aten._adaptive_avg_pool2d, (xt, [3, 2]), {}, 0,
                        tile_of, yb, y.shape)
    assert torch.allclose(got, y[:, 1:3])
    got = tiles.compute("_adaptive_avg_pool2d_backward", aten._adaptive_avg_pool2d_backward,
                        (gt, None), {}, 0, tile_of, xb, x.shape)
    assert torch.allclose(got, gx[:, 1:3])
    half = x[:, :, :5].clone()
    with pytest.raises(tiles.Fallback, match="image is split"):
        tiles.compute("_adaptive_avg_pool2d", aten._adaptive_avg_pool2d, (half, [3, 2]), {},
                      0, _tiles([(half, [[0, 2], [0, 4], [0, 5], [0, 7]], x.shape)]),
                      np.array([[0, 2], [0, 4], [0, 2], [0, 2]]), y.shape)


def test_embedding_gradient_rows_on_tiles():
    torch.manual_seed(3)
    idx = torch.tensor([[1, 5, 5, 0], [7, 2, 1, 5]])
    go = torch.randn(2, 4, 6, dtype=torch.float64)
    whole = aten.embedding_dense_backward(go, idx, 8, -1, False)
    for v0, v1 in [(0, 3), (3, 8)]:
        got = tiles.compute("embedding_dense_backward", aten.embedding_dense_backward,
                            (go, idx, 8, -1, False), {}, 0, _tiles([]),
                            np.array([[v0, v1], [0, 6]]), (8, 6))
        assert torch.allclose(got, whole[v0:v1])


def test_mean_of_a_tile_is_a_partial_sum_of_the_whole_mean_and_unknown_ops_fall_back():
    x = torch.arange(24, dtype=torch.float64).reshape(4, 6)
    parts = []
    for r in ((0, 1), (1, 4)):
        xt = x[r[0]:r[1]].clone()
        parts.append(tiles.compute("mean", aten.mean.default, (xt,), {}, 0,
                                   _tiles([(xt, [r, (0, 6)], x.shape)]), np.array([[0, 1]]),
                                   ()))
    assert torch.allclose(sum(parts), x.mean())
    with pytest.raises(tiles.Fallback, match="no tile rule for aten.cumsum"):
        tiles.compute("cumsum", aten.cumsum, (x, 0), {}, 0, _tiles([]),
                      np.array([[0, 4], [0, 6]]), (4, 6))
    with pytest.raises(tiles.Fallback, match="preimage"):
        tiles.compute("view", aten.view, (x[:, :3].clone(), [24]), {}, 0, _tiles([]),
                      np.array([[0, 6]]), (24,))


# --------------------------------------------------------------------------------------------
# plans on workers
# --------------------------------------------------------------------------------------------

#: bottlenecks 2, 2, 2, 2: every rule ResNet-50 needs (strided and 1x1 convolutions, BatchNorm,
#: residual sums, pooling) at half its depth
RESNET = {"depth": 26, "width": 1, "image_size": 32, "num_classes": 10}
FOUR = [("mlp", 16, {"layers": 2, "hidden": 64}), ("lenet5", 8, {}), ("wresnet", 2, RESNET),
        ("lstm", 4, {"layers": 1, "hidden": 32, "steps": 3})]


def _doc(spec, batch, args, k, algo="tofu"):
    res = run(algo, Problem(Request(spec, batch, dict(args), preset="local", devices=k)))
    return res, res.document()


def _one_device_peak(res) -> int:
    """The same step's peak on one worker by the plan's memory model (nothing split)."""
    return int(tofu.partition(res.capture, 1).peak_memory_bytes[0])


def _check(r, doc, err=1e-10):
    assert r["reference_ok"], (r["max_rel_error"], r["reference"]["worst_param"])
    assert r["max_rel_error"] < err and r["reference"]["params_compared"] > 0
    assert r["measured_comm_bytes"] == pytest.approx(r["predicted_comm_bytes"])
    assert r["predicted_comm_bytes"] > 0 and r["extra_bytes"] == 0
    assert r["fallback_ops"] == {}, r["fallback_reasons"]
    assert r["peak_memory_bytes"] == doc["peak_memory_bytes"]
    assert r["steps"] == 3 and len(r["step_times_s"]) == 3


@pytest.mark.multiprocess
@pytest.mark.parametrize("spec,batch,args", FOUR, ids=[m[0] for m in FOUR])
def test_tofu_runs_tile_local_and_its_memory_is_the_plan_s(spec, batch, args):
    """At 2 workers: every operator on tiles, three training steps against the reference,
    the predicted bytes, and each worker's measured peak within 10 % of the plan's and at
    most 70 % of one device's."""
    res, doc = _doc(spec, batch, args, 2)
    r = run_document(doc, steps=3, timeout_s=600)
    # BatchNorm over two values per channel in the last stage: rounding shows at 1e-8
    _check(r, doc, 1e-6 if spec == "wresnet" else 1e-10)
    one = _one_device_peak(res)
    for got, want in zip(r["measured_peak_memory_bytes"], doc["peak_memory_bytes"]):
        assert abs(got - want) <= 0.10 * want, (got, want)
        assert got <= 0.70 * one, (got, one)
    assert r["predicted_step_time_s"] == pytest.approx(
        doc["objective_s"] + max(doc["predicted_compute_s"]))
    assert r["measured_step_time_s"] > 0


@pytest.mark.multiprocess
@pytest.mark.parametrize("spec,batch,args,k,algo", [
    ("mlp", 16, {"layers": 2, "hidden": 64}, 4, "tofu"),
    ("lenet5", 8, {}, 4, "tofu"),
    ("lstm", 4, {"layers": 1, "hidden": 32, "steps": 3}, 4, "tofu"),
    ("wresnet", 2, RESNET, 4, "tofu"),
    ("mlp", 16, {"layers": 2, "hidden": 64}, 2, "allrow-greedy"),
    ("mlp", 16, {"layers": 2, "hidden": 64}, 4, "equalchop"),
    ("lenet5", 8, {}, 2, "equalchop"),
    ("lenet5", 8, {}, 4, "allrow-greedy"),
    ("lenet5", 8, {}, 2, "icml18"),
    ("mlp", 16, {"layers": 2, "hidden": 64}, 4, "icml18"),
])
def test_tofu_and_baseline_plans_run_tile_local_on_2_and_4_workers(spec, batch, args, k, algo):
    _, doc = _doc(spec, batch, args, k, algo)
    r = run_document(doc, steps=3, timeout_s=600)
    _check(r, doc, 1e-6 if spec == "wresnet" else 1e-10)
    assert len(r["measured_peak_memory_bytes"]) == k


@pytest.mark.multiprocess
def test_a_model_that_does_not_fit_one_worker_trains_across_2_and_4():
    """A limit below one worker's peak for the step: split over 2 and then 4 workers every
    worker stays under it while three training steps match the reference."""
    spec, batch, args = "mlp", 64, {"layers": 3, "hidden": 256}
    res, _ = _doc(spec, batch, args, 2)
    one = _one_device_peak(res)
    limit = 0.6 * one
    assert one > limit
    for k in (2, 4):
        res, doc = _doc(spec, batch, args, k)
        r = run_document(doc, steps=3, timeout_s=600, train=True)
        _check(r, doc)
        assert r["train"]
        assert max(r["measured_peak_memory_bytes"]) < limit, (k, r["measured_peak_memory_bytes"])


@pytest.mark.multiprocess
def test_explorer_run_of_the_issue_s_mlp_reports_measured_against_predicted(tmp_path):
    """The issue's command: `explorer search mlp --batch 256 -a layers=6 -a hidden=2048
    --devices 2 --preset local --algo tofu`, then `explorer run --json`."""
    plan = tmp_path / "t.json"
    out = explorer_cli("search", "mlp", "--batch", "256", "-a", "layers=6", "-a",
                       "hidden=2048", "--devices", "2", "--preset", "local", "--algo", "tofu",
                       "--out", str(plan), timeout=900)
    assert out.returncode == 0, out.stderr
    out = explorer_cli("run", str(plan), "--json", timeout=1200)
    assert out.returncode == 0, out.stderr
    d = json.loads(out.stdout)
    assert d["reference_ok"] and d["fallback_ops"] == {}
    res = run("tofu", Problem(Request("mlp", 256, {"layers": 6, "hidden": 2048},
                                      preset="local", devices=2)))
    one = _one_device_peak(res)
    for got, want in zip(d["measured_peak_memory_bytes"], d["peak_memory_bytes"]):
        assert abs(got - want) <= 0.10 * want and got <= 0.70 * one, (got, want, one)
    assert d["predicted_step_time_s"] > 0 and d["measured_step_time_s"] > 0


def test_layer_norm_gradients_on_row_blocks_without_the_inputs_their_descriptions_skip():
    """A worker computing a layer norm's mean / rstd holds no weight or bias, one computing
    the weight's (bias's) gradient no weight and bias (nothing but the output gradient):
    aten wants them all, the tile rules run without them - on row blocks, partial sums of
    the parameter gradients - and match the whole op."""
    torch.manual_seed(5)
    x, go = torch.randn(6, 4, 8, dtype=torch.float64), torch.randn(6, 4, 8, dtype=torch.float64)
    w, b = torch.randn(8, dtype=torch.float64), torch.randn(8, dtype=torch.float64)
    out, mean, rstd = aten.native_layer_norm(x, [8], w, b, 1e-5)
    whole = aten.native_layer_norm_backward(go, x, [8], mean, rstd, w, b, [True] * 3)
    gw = gb = 0
    for r0, r1 in [(0, 2), (2, 6)]:
        xs, gs, ms, rs = x[r0:r1], go[r0:r1], mean[r0:r1], rstd[r0:r1]
        box = np.array([[r0, r1], [0, 4], [0, 1]])
        got = tiles.compute("native_layer_norm", aten.native_layer_norm,
                            (xs, [8], None, None, 1e-5), {}, 2, _tiles([]), box, (6, 4, 1))
        assert torch.allclose(got, rstd[r0:r1])
        gi = tiles.compute("native_layer_norm_backward", aten.native_layer_norm_backward,
                           (gs, xs, [8], ms, rs, w, None, [True] * 3), {}, 0, _tiles([]),
                           np.array([[r0, r1], [0, 4], [0, 8]]), (6, 4, 8))
        assert torch.allclose(gi, whole[0][r0:r1])
        gw = gw + tiles.compute("native_layer_norm_backward", aten.native_layer_norm_backward,
                                (gs, xs, [8], ms, rs, None, None, [True] * 3), {}, 1,
                                _tiles([]), np.array([[0, 8]]), (8,))
        gb = gb + tiles.compute("native_layer_norm_backward", aten.native_layer_norm_backward,
                                (gs, None, [8], None, None, None, None, [True] * 3), {}, 2,
                                _tiles([]), np.array([[0, 8]]), (8,))
    assert torch.allclose(gw, whole[1]) and torch.allclose(gb, whole[2])
    with pytest.raises(tiles.Fallback):                 # the input's gradient needs the weight
        tiles.compute("native_layer_norm_backward", aten.native_layer_norm_backward,
                      (go, x, [8], mean, rstd, None, None, [True] * 3), {}, 0, _tiles([]),
                      np.array([[0, 6], [0, 4], [0, 8]]), (6, 4, 8))


# --------------------------------------------------------------------------------------------
# causal masks, slice gradients, transposed convolutions (each rule against the whole op)
# --------------------------------------------------------------------------------------------


def _random_cuts(rng, n, parts):
    """``parts`` consecutive ranges covering ``[0, n)`` at random cut points."""
    cuts = sorted(rng.choice(np.arange(1, n), size=parts - 1, replace=False).tolist())
    edges = [0] + cuts + [n]
    return list(zip(edges[:-1], edges[1:]))


@pytest.mark.parametrize("op", ["tril", "triu"])
def test_tril_and_triu_on_tiles_move_the_diagonal_by_the_tile_s_offset(op):
    """A tile at rows ``r0`` and columns ``c0`` of the last two axes is the whole op's when
    the diagonal moves by ``r0 - c0``; the unmoved diagonal is wrong off the main blocks."""
    rng = np.random.default_rng(0)
    fn = getattr(aten, op)
    x = torch.randn(3, 9, 11, dtype=torch.float64)
    unmoved_wrong = 0
    for diag in (-3, -1, 0, 2, 5):
        whole = fn(x, diag)
        for _ in range(6):
            rows, cols = _random_cuts(rng, 9, 3), _random_cuts(rng, 11, 3)
            b0, b1 = sorted(rng.choice(4, size=2, replace=False).tolist())
            for r0, r1 in rows:
                for c0, c1 in cols:
                    box = np.array([[b0, b1], [r0, r1], [c0, c1]])
                    # the region may be larger than the box (an element-wise op's is the box)
                    reg = np.array([[0, 3], [max(r0 - 1, 0), r1], [c0, min(c1 + 2, 11)]])
                    xt = x[:, reg[1, 0]:reg[1, 1], reg[2, 0]:reg[2, 1]].clone()
                    got = tiles.compute(op, fn, (xt, diag), {}, 0,
                                        _tiles([(xt, reg, x.shape)]), box, x.shape)
                    assert torch.equal(got, whole[b0:b1, r0:r1, c0:c1]), (diag, box.tolist())
                    tile = x[b0:b1, r0:r1, c0:c1]
                    unmoved_wrong += not torch.equal(fn(tile, diag), whole[b0:b1, r0:r1, c0:c1])
    assert unmoved_wrong > 0          # the test tells the moved diagonal from the unmoved one
    with pytest.raises(tiles.Fallback, match="does not cover"):
        xt = x[:, :4].clone()
        tiles.compute(op, fn, (xt, 0), {}, 0, _tiles([(xt, [[0, 3], [0, 4], [0, 11]],
                                                       x.shape)]),
                      np.array([[0, 3], [2, 6], [0, 11]]), x.shape)


@pytest.mark.parametrize("start,end,step", [(2, 9, 1), (1, 12, 3), (-7, 100, 2), (0, 5, 1)])
def test_slice_backward_on_tiles_places_the_rows_that_land_in_the_box(start, end, step):
    rng = np.random.default_rng(1)
    size, dim = 12, 1
    shape = (2, size, 4)
    ref = torch.zeros(shape, dtype=torch.float64)
    sl = ref[:, slice(start, end, step)]
    grad = torch.randn(sl.shape, dtype=torch.float64)
    whole = aten.slice_backward(grad, list(shape), dim, start, end, step)
    n = grad.shape[dim]
    s0 = 0 if start is None else (start + size if start < 0 else start)
    for _ in range(8):
        for o0, o1 in _random_cuts(rng, size, 3):
            # the gradient rows landing in [o0, o1), widened by one row where there is one
            ks = [k for k in range(n) if o0 <= s0 + k * step < o1]
            lo = max((ks[0] if ks else 0) - 1, 0)
            hi = min((ks[-1] + 1 if ks else 0) + 1, n)
            gt = grad[:, lo:hi].clone()
            box = np.array([[0, 2], [o0, o1], [0, 4]])
            got = tiles.compute("slice_backward", aten.slice_backward,
                                (gt, list(shape), dim, start, end, step), {}, 0,
                                _tiles([(gt, [[0, 2], [lo, hi], [0, 4]], grad.shape)]), box,
                                shape)
            assert torch.equal(got, whole[:, o0:o1]), (o0, o1, lo, hi)
    if n > 2:                                          # a region missing a landing row
        gt = grad[:, 1:].clone()
        with pytest.raises(tiles.Fallback, match="misses rows"):
            tiles.compute("slice_backward", aten.slice_backward,
                          (gt, list(shape), dim, start, end, step), {}, 0,
                          _tiles([(gt, [[0, 2], [1, n], [0, 4]], grad.shape)]),
                          np.array([[0, 2], [0, size], [0, 4]]), shape)


@pytest.mark.parametrize("s,p,d,op,groups", [(2, 0, 1, 0, 1), (2, 1, 1, 1, 1), (3, 2, 2, 2, 1),
                                             (1, 1, 1, 0, 2), (2, 1, 2, 1, 2)])
def test_a_transposed_convolution_and_its_gradients_run_on_row_tiles(s, p, d, op, groups):
    """U-Net's up-convolutions: output rows from the input rows whose taps reach them
    (:func:`transpose_window`, cut by :func:`transpose_crop`), the input's gradient as the
    convolution of the output gradient's window, the filter gradient as partial sums over
    input-row tiles - each equal to the whole op's, at random row cuts."""
    rng = np.random.default_rng(2 + s + p + d + op + groups)
    torch.manual_seed(int(rng.integers(1000)))
    k = 3
    x = torch.randn(2, 4, 7, 5, dtype=torch.float64)
    w = torch.randn(4, 6 // groups, k, 2, dtype=torch.float64)
    b = torch.randn(6, dtype=torch.float64)
    S, P, D, OP = [s, 1], [p, 0], [d, 1], [op, 0]
    args = (S, P, D, True, OP, groups)
    y = aten.convolution(x, w, b, *args)
    go = torch.randn_like(y)
    gx, gw, gb = aten.convolution_backward(go, x, w, [6], *args, [True, True, True])
    H, Ho = x.shape[2], y.shape[2]
    whole_w = np.array([[0, n] for n in w.shape])
    for _ in range(3):
        for lo, hi in _random_cuts(rng, Ho, 3):
            a, z = (int(v) for v in transpose_window(lo, hi, H, k, s, p, d))
            xt = x[:, :, a:z].clone()
            out = _rows((lo, hi), y.shape)
            got = tiles.compute("convolution", aten.convolution, (xt, w, b, *args), {}, 0,
                                _tiles([(xt, _rows((a, z), x.shape), x.shape),
                                        (w, whole_w, w.shape)]), out, y.shape)
            assert torch.allclose(got, y[:, :, lo:hi], atol=1e-12), (lo, hi, a, z)
        # the input's gradient: rows of x from the output-gradient rows they reach
        for lo, hi in _random_cuts(rng, H, 3):
            a, z = (int(v) for v in window(lo, hi, Ho, k, s, p, d))
            gt = go[:, :, a:z].clone()
            got = tiles.compute("convolution_backward", aten.convolution_backward,
                                (gt, None, w, [6], *args, [True, False, False]), {}, 0,
                                _tiles([(gt, _rows((a, z), y.shape), y.shape),
                                        (w, whole_w, w.shape)]),
                                _rows((lo, hi), x.shape), x.shape)
            assert torch.allclose(got, gx[:, :, lo:hi], atol=1e-12), (lo, hi)
        # the filter gradient: a partial sum over input-row tiles
        pw = torch.zeros_like(gw)
        for lo, hi in _random_cuts(rng, H, 3):
            a, z = (int(v) for v in window(lo, hi, Ho, k, s, p, d))
            xt, gt = x[:, :, lo:hi].clone(), go[:, :, a:z].clone()
            pw += tiles.compute("convolution_backward", aten.convolution_backward,
                                (gt, xt, None, [6], *args, [False, True, False]), {}, 1,
                                _tiles([(gt, _rows((a, z), y.shape), y.shape),
                                        (xt, _rows((lo, hi), x.shape), x.shape)]),
                                whole_w, w.shape)
        assert torch.allclose(pw, gw, atol=1e-10)
    # channel blocks of the output (whole groups) with the weight's columns, and the bias's
    # gradient
    c0, c1 = (0, 3) if groups == 1 else (3, 6)
    wt = w[:, c0:c1].clone() if groups == 1 else w[2:4].clone()
    xt = x if groups == 1 else x[:, 2:4].clone()
    xb = np.array([[0, 2], [0, 4] if groups == 1 else [2, 4], [0, H], [0, 5]])
    wb = np.array([[0, 4], [c0, c1], [0, k], [0, 2]]) if groups == 1 else \
        np.array([[2, 4], [0, 3], [0, k], [0, 2]])
    out = np.array([[0, 2], [c0, c1], [0, Ho], [0, y.shape[3]]])
    got = tiles.compute("convolution", aten.convolution, (xt, wt, b[c0:c1], *args), {}, 0,
                        _tiles([(xt, xb, x.shape), (wt, wb, w.shape)]), out, y.shape)
    assert torch.allclose(got, y[:, c0:c1], atol=1e-12)
    got = tiles.compute("convolution_backward", aten.convolution_backward,
                        (go, x, w, [6], *args, [False, False, True]), {}, 2,
                        _tiles([(go, _rows((0, Ho), y.shape), y.shape)]), np.array([[0, 6]]),
                        (6,))
    assert torch.allclose(got, gb)
    with pytest.raises(tiles.Fallback, match="disagree"):      # a region missing a tap
        xt = x[:, :, 1:].clone()
        tiles.compute("convolution", aten.convolution, (xt, w, b, *args), {}, 0,
                      _tiles([(xt, _rows((1, H), x.shape), x.shape), (w, whole_w, w.shape)]),
                      _rows((0, Ho), y.shape), y.shape)


def test_a_convolution_whose_kernel_taps_are_split_runs_on_its_taps():
    """A plan may split a convolution's reduction over the kernel window (ViT's 8x8 patch
    embedding on 4 workers): each worker's taps ``[j0, j1)`` with the rows they read are a
    convolution of their own (padding ``p - d·j0``); the partial sums, and the data and
    filter gradients of the taps, add up to the whole op's."""
    rng = np.random.default_rng(7)
    torch.manual_seed(7)
    x = torch.randn(2, 3, 13, 6, dtype=torch.float64)
    w = torch.randn(4, 3, 5, 3, dtype=torch.float64)
    S, P, D = [2, 1], [1, 1], [2, 1]
    args = (S, P, D, False, [0, 0], 1)
    y = aten.convolution(x, w, None, *args)
    go = torch.randn_like(y)
    gx, gw, _ = aten.convolution_backward(go, x, w, None, *args, [True, True, False])
    H, Ho = x.shape[2], y.shape[2]
    for _ in range(4):
        taps = _random_cuts(rng, 5, 2)
        for lo, hi in _random_cuts(rng, Ho, 2):
            part = 0
            for j0, j1 in taps:
                # the rows output rows [lo, hi) read through taps [j0, j1)
                a, z = (int(v) for v in window(lo, hi, H, j1 - j0, S[0], P[0] - D[0] * j0,
                                               D[0]))
                xt, wt = x[:, :, a:z].clone(), w[:, :, j0:j1].clone()
                wb = np.array([[0, 4], [0, 3], [j0, j1], [0, 3]])
                part = part + tiles.compute(
                    "convolution", aten.convolution, (xt, wt, None, *args), {}, 0,
                    _tiles([(xt, _rows((a, z), x.shape), x.shape), (wt, wb, w.shape)]),
                    _rows((lo, hi), y.shape), y.shape)
            assert torch.allclose(part, y[:, :, lo:hi], atol=1e-12), (taps, lo, hi)
        # the filter gradient of taps [j0, j1): from the rows go's rows read through them
        for j0, j1 in taps:
            a, z = (int(v) for v in window(0, Ho, H, j1 - j0, S[0], P[0] - D[0] * j0, D[0]))
            xt = x[:, :, a:z].clone()
            wb = np.array([[0, 4], [0, 3], [j0, j1], [0, 3]])
            got = tiles.compute("convolution_backward", aten.convolution_backward,
                                (go, xt, None, None, *args, [False, True, False]), {}, 1,
                                _tiles([(go, _rows((0, Ho), y.shape), y.shape),
                                        (xt, _rows((a, z), x.shape), x.shape)]), wb, w.shape)
            assert torch.allclose(got, gw[:, :, j0:j1], atol=1e-10), (j0, j1)
        # the data gradient through taps [j0, j1): partial sums over the taps
        for lo, hi in _random_cuts(rng, H, 2):
            part = 0
            for j0, j1 in taps:
                a, z = (int(v) for v in transpose_window(lo, hi, Ho, j1 - j0, S[0],
                                                         P[0] - D[0] * j0, D[0]))
                gt, wt = go[:, :, a:z].clone(), w[:, :, j0:j1].clone()
                wb = np.array([[0, 4], [0, 3], [j0, j1], [0, 3]])
                part = part + tiles.compute(
                    "convolution_backward", aten.convolution_backward,
                    (gt, None, wt, None, *args, [True, False, False]), {}, 0,
                    _tiles([(gt, _rows((a, z), y.shape), y.shape), (wt, wb, w.shape)]),
                    _rows((lo, hi), x.shape), x.shape)
            assert torch.allclose(part, gx[:, :, lo:hi], atol=1e-10), (taps, lo, hi)


def test_a_view_whose_box_s_preimage_is_not_a_box_gathers_it_from_the_region():
    """Rows ``[r0, r1)`` of a ``(5, 2, 16)`` tensor viewed as ``(10, 16)`` come from the hull
    of their preimage (a box larger than it); a region missing part of it falls back."""
    rng = np.random.default_rng(8)
    x = torch.randn(5, 2, 16, dtype=torch.float64)
    whole = x.reshape(10, 16)
    for _ in range(6):
        for r0, r1 in _random_cuts(rng, 10, 3):
            for c0, c1 in _random_cuts(rng, 16, 2):
                a, z = r0 // 2, (r1 - 1) // 2 + 1
                reg = np.array([[a, z], [0, 2], [c0, c1]])
                xt = x[a:z, :, c0:c1].clone()
                got = tiles.compute("_unsafe_view", aten._unsafe_view, (xt, [10, 16]), {}, 0,
                                    _tiles([(xt, reg, x.shape)]),
                                    np.array([[r0, r1], [c0, c1]]), (10, 16))
                assert torch.equal(got, whole[r0:r1, c0:c1]), (r0, r1, c0, c1)
    xt = x[1:3].clone()
    with pytest.raises(tiles.Fallback, match="misses part"):
        tiles.compute("view", aten.view, (xt, [10, 16]), {}, 0,
                      _tiles([(xt, [[1, 3], [0, 2], [0, 16]], x.shape)]),
                      np.array([[1, 6], [0, 16]]), (10, 16))


def test_a_layer_norm_weight_gradient_on_column_blocks_of_the_normalised_axis():
    """At batch 1 on 4 workers a Transformer's plan splits the normalised axis of a layer
    norm's weight gradient: each column block is the sum of ``go · (x − mean) · rstd`` over
    the leading axes on the tiles (aten wants whole rows)."""
    rng = np.random.default_rng(9)
    torch.manual_seed(9)
    x, go = torch.randn(3, 5, 16, dtype=torch.float64), torch.randn(3, 5, 16, dtype=torch.float64)
    w, b = torch.randn(16, dtype=torch.float64), torch.randn(16, dtype=torch.float64)
    _, mean, rstd = aten.native_layer_norm(x, [16], w, b, 1e-5)
    whole = aten.native_layer_norm_backward(go, x, [16], mean, rstd, w, b, [True] * 3)[1]
    for _ in range(4):
        for c0, c1 in _random_cuts(rng, 16, 3):
            part = 0
            for r0, r1 in _random_cuts(rng, 3, 2):
                xs, gs = x[r0:r1, :, c0:c1].clone(), go[r0:r1, :, c0:c1].clone()
                part = part + tiles.compute(
                    "native_layer_norm_backward", aten.native_layer_norm_backward,
                    (gs, xs, [16], mean[r0:r1], rstd[r0:r1], None, None, [True] * 3), {}, 1,
                    _tiles([]), np.array([[c0, c1]]), (16,))
            assert torch.allclose(part, whole[c0:c1], atol=1e-12), (c0, c1)


#: models whose plans use the rules above, at the sizes of benchmarks/tofu_fallbacks.py:
#: (spec, batch, arguments, workers, targets that must run tile-local)
RULE_MODELS = [
    ("gpt2", 2, {"layers": 1, "hidden": 16, "heads": 2, "seq_len": 8, "vocab": 20}, 2,
     {"tril"}),
    ("llama", 2, {"layers": 1, "hidden": 16, "heads": 2, "intermediate": 24, "seq_len": 8,
                  "vocab": 20}, 2, {"tril", "slice_backward"}),
    ("unet", 2, {"depth": 2, "base": 4, "image_size": 16, "num_classes": 3,
                 "up": "transpose"}, 2, {"convolution", "convolution_backward"}),
    ("llama", 2, {"layers": 1, "hidden": 16, "heads": 2, "intermediate": 24, "seq_len": 8,
                  "vocab": 20}, 4, {"tril", "slice_backward"}),
    ("unet", 2, {"depth": 2, "base": 4, "image_size": 16, "num_classes": 3,
                 "up": "transpose"}, 4, {"convolution", "convolution_backward"}),
    ("vit", 2, {"image_size": 16, "patch": 8, "layers": 1, "hidden": 16, "heads": 2,
                "mlp": 32, "num_classes": 10}, 4,
     {"convolution", "convolution_backward", "_unsafe_view"}),
    ("transformer", 1, {"layers": 1, "seq": 8, "hidden": 16, "heads": 2, "vocab": 20}, 4,
     {"native_layer_norm_backward"}),
]


@pytest.mark.multiprocess
@pytest.mark.parametrize("workers", [2, 4])
def test_models_using_the_new_rules_run_tile_local_with_the_predicted_bytes(workers):
    """GPT-2 and Llama (causal masks by ``tril``, Llama's rotary halves' ``slice_backward``),
    U-Net with transposed up-convolutions, ViT on 4 workers (kernel taps split, a view of a
    non-box preimage), a Transformer at batch 1 on 4 (a layer norm's weight gradient on
    column blocks): nothing falls back, the result is the reference's and the bytes the
    plan's."""
    from explorer.engine.runtime.dispatch import run_tofu_documents
    cases = [c for c in RULE_MODELS if c[3] == workers]
    docs = [_doc(spec, batch, args, k)[1] for spec, batch, args, k, _ in cases]
    for (spec, _, _, _, used), doc, r in zip(cases, docs,
                                             run_tofu_documents(docs, timeout_s=900)):
        assert r["reference_ok"] and r["max_rel_error"] < 1e-8, (spec, r["max_rel_error"])
        assert r["fallback_ops"] == {}, (spec, r["fallback_reasons"])
        assert used <= set(r["tile_local_ops"]), (spec, sorted(r["tile_local_ops"]))
        assert r["measured_comm_bytes"] == pytest.approx(r["predicted_comm_bytes"],
                                                         rel=1e-12)
        assert r["predicted_comm_bytes"] > 0


@pytest.mark.multiprocess
def test_replicated_partial_sums_are_added_once():
    """BERT at batch 1 on 4 workers: the loss's mean is split in 2 along the classes and
    replicated twice (workers 0, 1 compute one partial sum, 2, 3 the other).  Each distinct
    partial is added once (before, every copy was: the loss came out twice the reference's
    while every gradient was right); each worker keeps its own copy and receives the other
    one, so the scalar costs 4 transfers where the recursion charges each group once."""
    from explorer.engine.runtime.opexec import partial_copies
    from explorer.engine.runtime.dispatch import _tofu_layout, run_tofu_documents
    args = {"layers": 1, "hidden": 16, "heads": 2, "seq_len": 8, "vocab": 20,
            "num_classes": 3}
    _, doc = _doc("bert", 1, args, 4)
    xplan = _tofu_layout(doc, {})["xplan"]
    copied = [o for o, v in xplan["ops"].items() if v["reducer"] == "sum" and
              (partial_copies(v, 4) != np.arange(4)).any()]
    assert copied, "the plan no longer replicates a split sum: pick another case"
    r = run_tofu_documents([doc], timeout_s=900)[0]
    assert r["reference_ok"] and r["loss"] == pytest.approx(r["reference_loss"], rel=1e-12)
    assert r["fallback_ops"] == {}
    # the plan's bytes, plus one copy per replica of each replicated scalar partial sum
    assert 0 <= r["measured_comm_bytes"] - r["predicted_comm_bytes"] <= 16 * len(copied)

"""Tests for explorer.engine.core.geometry: configurations, ownership, input regions, shards.

Expected numbers are worked out by hand in the comments.  The strongest tests at the end
check geometry against PyTorch itself: each device computes its output tile from *only* the
input region geometry says it needs, and the result must equal that slice of the full op.
"""

from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from explorer.engine.core import geometry as G
from explorer.engine.core.geometry import Config
from explorer.engine.core.layergraph import Layer
from explorer.engine.core.importer import import_model


# --------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def _one_torch_thread():
    """Thousands of tiny ops: one intra-op thread avoids contention on a busy 2-core box."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def cfg(devices=None, **degrees):
    """Config from keyword degrees in n,c,h,w,l order; devices default 0..k-1."""
    order = [k for k in ("n", "c", "h", "w", "l") if k in degrees]
    degs = tuple((k, degrees[k]) for k in order)
    total = math.prod(v for _, v in degs)
    return Config(degs, tuple(range(total)) if devices is None else tuple(devices))


def conv_layer(n=1, cin=4, cout=8, size=32, k=3, s=1, p=1, d=1, groups=1, name="conv"):
    out = (size + 2 * p - d * (k - 1) - 1) // s + 1
    return Layer(name, "conv", (n, cout, out, out), ("n", "c", "h", "w"),
                 in_shapes=((n, cin, size, size),),
                 params={"weight": (cout, cin // groups, k, k), "bias": (cout,)},
                 attrs={"kernel": (k, k), "stride": (s, s), "padding": (p, p),
                        "dilation": (d, d), "groups": groups})


def pool_layer(n=1, c=4, size=32, k=2, s=2, p=0, d=1):
    out = (size + 2 * p - d * (k - 1) - 1) // s + 1
    return Layer("pool", "pool", (n, c, out, out), ("n", "c", "h", "w"),
                 in_shapes=((n, c, size, size),),
                 attrs={"kernel": (k, k), "stride": (s, s), "padding": (p, p),
                        "dilation": (d, d)})


def rows(boxes, ax):
    """[(start, stop), ...] of one axis over the device boxes."""
    return [tuple(int(v) for v in b[ax]) for b in boxes]


# --------------------------------------------------------------------------------------------
# Config
# --------------------------------------------------------------------------------------------


def test_config_degree_product_must_match_device_count():
    # n=2 × c=2 = 4 but only 3 devices given
    with pytest.raises(ValueError) as ei:
        Config((("n", 2), ("c", 2)), (0, 1, 2))
    msg = str(ei.value)
    assert "4" in msg and "3" in msg and "n=2" in msg and "c=2" in msg


def test_config_rejects_repeated_devices():
    with pytest.raises(ValueError, match=r"repeat") as ei:
        Config((("n", 2),), (1, 1))
    assert "[1, 1]" in str(ei.value)


def test_config_rejects_degree_zero():
    with pytest.raises(ValueError, match=r"n=0") as ei:
        Config((("n", 0), ("c", 1)), ())
    assert "positive" in str(ei.value)


def test_config_label_and_key():
    c = Config((("n", 2), ("c", 1), ("h", 2), ("w", 1)), (0, 1, 2, 3))
    assert c.label() == "n2 h2"
    assert c.key() == "n=2,c=1,h=2,w=1@0,1,2,3"
    assert c.total == 4 and c.deg("h") == 2 and c.deg("c") == 1
    assert c.deg("l") == 1  # letters the layer lacks count as degree 1
    assert c.as_dict() == {"n": 2, "c": 1, "h": 2, "w": 1}
    one = Config((("n", 1), ("c", 1)), (3,))
    assert one.label() == "1"
    assert one.key() == "n=1,c=1@3"
    # degrees and devices are normalised to ints, so equal configs compare/hash equal
    assert Config((("n", "2"),), ("0", 1)) == Config((("n", 2),), (0, 1))


def test_config_without_dimensions_runs_on_one_device():
    c = Config((), (0,))
    assert c.total == 1 and c.label() == "1" and c.key() == "@0"
    with pytest.raises(ValueError, match=r"need 1 devices, got 2"):
        Config((), (0, 1))




# --------------------------------------------------------------------------------------------
# enumerate_configs
# --------------------------------------------------------------------------------------------


def test_enumerate_conv_on_4_devices_hand_count():
    # Degrees from {1,2,4} for (n,c,h,w) whose product divides 4:
    #   product 1: 1;  product 2: one dim = 2 -> 4;  product 4: one dim = 4 -> 4,
    #   two dims = 2 -> C(4,2) = 6.   Total 1 + 4 + 4 + 6 = 15.
    layer = Layer("conv", "conv", (8, 16, 32, 32), ("n", "c", "h", "w"))
    cs = G.enumerate_configs(layer, 4)
    assert len(cs) == 15
    tuples = {tuple(v for _, v in c.degrees) for c in cs}
    assert len(tuples) == 15
    expected = {t for t in itertools.product((1, 2, 4), repeat=4) if 4 % math.prod(t) == 0}
    assert tuples == expected
    for c in cs:  # a config of total k runs on the first k devices
        assert c.devices == tuple(range(c.total))
        assert [k for k, _ in c.degrees] == ["n", "c", "h", "w"]
    assert cs[0].total == 1  # sorted by total


def test_enumerate_sample_degree_divides_batch():
    # batch 6 on 4 devices: n=4 would give 1.5 samples per device -> excluded; n=2 allowed.
    layer = Layer("fc", "linear", (6, 16), ("n", "c"))
    cs = G.enumerate_configs(layer, 4)
    ns = {c.deg("n") for c in cs}
    assert ns == {1, 2}
    assert {c.deg("c") for c in cs} == {1, 2, 4}
    # (n,c) in {(1,1),(2,1),(1,2),(2,2),(1,4)} -> 5
    assert len(cs) == 5


def test_enumerate_degree_never_exceeds_dimension():
    # c has 3 channels: 2 is allowed (uneven 1+2 split), 4 is not; h, w of size 1: only 1.
    layer = Layer("conv", "conv", (4, 3, 1, 1), ("n", "c", "h", "w"))
    cs = G.enumerate_configs(layer, 4)
    assert {c.deg("c") for c in cs} == {1, 2}
    assert {c.deg("h") for c in cs} == {1}
    assert {c.deg("w") for c in cs} == {1}
    for c in cs:
        for letter, v in c.degrees:
            assert v <= layer.size(letter)


def test_enumerate_layer_without_parallel_dims():
    scalar = Layer("loss", "reduce", (), ())
    cs = G.enumerate_configs(scalar, 8)
    assert cs == [Config((), (0,))]
    unsplittable = Layer("sm", "softmax", (5,), ("-",))
    assert G.enumerate_configs(unsplittable, 4) == [Config((), (0,))]


def test_enumerate_with_device_list_and_cap():
    layer = Layer("conv", "conv", (8, 16, 32, 32), ("n", "c", "h", "w"))
    cs = G.enumerate_configs(layer, 4, devices=(2, 3))
    # only total-2 configs, all on devices (2, 3): one of the 4 dims split in 2
    assert len(cs) == 4
    assert all(c.devices == (2, 3) and c.total == 2 for c in cs)
    capped = G.enumerate_configs(layer, 4, max_total=2)
    assert len(capped) == 5 and max(c.total for c in capped) == 2
    # 3 devices: degrees are divisors of 3
    assert {c.total for c in G.enumerate_configs(layer, 3)} == {1, 3}


def test_enumerate_rejects_zero_devices():
    layer = Layer("fc", "linear", (6, 16), ("n", "c"))
    with pytest.raises(ValueError, match=r"at least 1 device, got 0"):
        G.enumerate_configs(layer, 0)


# --------------------------------------------------------------------------------------------
# ownership
# --------------------------------------------------------------------------------------------


def test_split_range_uneven():
    # 7 split 2 ways -> [0,3) and [3,7); 10 split 3 ways -> 3, 3, 4
    lo, hi = G.split_range(7, 2, np.arange(2))
    assert list(zip(lo.tolist(), hi.tolist())) == [(0, 3), (3, 7)]
    lo, hi = G.split_range(10, 3, np.arange(3))
    assert list(zip(lo.tolist(), hi.tolist())) == [(0, 3), (3, 6), (6, 10)]


def test_output_boxes_row_major_last_letter_fastest():
    layer = Layer("conv", "conv", (8, 16, 32, 32), ("n", "c", "h", "w"))
    boxes = G.output_boxes(layer, cfg(n=2, c=1, h=2, w=1))
    # position k -> (n index, h index) = (k // 2, k % 2)
    assert rows(boxes, 0) == [(0, 4), (0, 4), (4, 8), (4, 8)]
    assert rows(boxes, 2) == [(0, 16), (16, 32), (0, 16), (16, 32)]
    assert rows(boxes, 1) == [(0, 16)] * 4 and rows(boxes, 3) == [(0, 32)] * 4


def test_output_boxes_uneven_split():
    layer = Layer("fc", "linear", (7, 5), ("n", "c"))
    boxes = G.output_boxes(layer, cfg(n=1, c=2))
    assert rows(boxes, 1) == [(0, 2), (2, 5)]
    boxes = G.output_boxes(Layer("x", "input", (7,), ("n",)), cfg(n=2))
    assert rows(boxes, 0) == [(0, 3), (3, 7)]


def test_output_boxes_of_dimensionless_layer_is_whole_tensor():
    layer = Layer("sm", "softmax", (3, 5), ("-", "-"))
    boxes = G.output_boxes(layer, Config((), (0,)))
    assert boxes.tolist() == [[[0, 3], [0, 5]]]
    assert G.volume(boxes).tolist() == [15]


def test_output_boxes_tile_exactly_once_random():
    rng = np.random.default_rng(1234)
    checked = 0
    for _ in range(150):
        rank = int(rng.integers(1, 6))
        shape = tuple(int(s) for s in rng.integers(1, 10, size=rank))
        letters = list(rng.permutation(["n", "c", "h", "w", "l"])[:rank])
        # some axes unpartitionable
        axes = tuple(a if rng.random() < 0.8 else "-" for a in letters)
        layer = Layer("L", "eltwise", shape, axes)
        degs = tuple((a, int(rng.integers(1, min(shape[i], 5) + 1)))
                     for i, a in enumerate(axes) if a != "-")
        total = math.prod(v for _, v in degs)
        devs = tuple(int(d) for d in rng.permutation(total))
        c = Config(degs, devs)
        boxes = G.output_boxes(layer, c)
        assert boxes.shape == (total, rank, 2)
        vol = G.volume(boxes)
        assert (vol > 0).all()                      # degree ≤ size: nobody idle
        assert int(vol.sum()) == math.prod(shape)   # covers the output once in total ...
        if total > 1:                               # ... and no two boxes intersect
            ov = G.overlap(boxes[:, None], boxes[None, :])
            ov[np.arange(total), np.arange(total)] = 0
            assert ov.max() == 0
        count = np.zeros(shape, dtype=int)          # brute force: every element owned once
        for b in boxes:
            count[tuple(slice(lo, hi) for lo, hi in b)] += 1
        assert (count == 1).all()
        checked += 1
    assert checked == 150


def test_volume_overlap_intersect_small():
    a = np.array([[0, 4], [2, 6]])       # 4 x 4
    b = np.array([[3, 8], [0, 3]])       # rows 3..4, cols 2..3 overlap -> 1 x 1
    assert int(G.volume(a)) == 16
    assert float(G.overlap(a, b)) == 1.0
    assert G.intersect(a, b).tolist() == [[3, 4], [2, 3]]
    c = np.array([[5, 8], [0, 3]])       # disjoint from a
    assert float(G.overlap(a, c)) == 0.0
    assert int(G.volume(G.intersect(a, c))) == 0
    assert int(G.volume(np.array([[3, 1], [0, 2]]))) == 0  # start > stop counts 0


# --------------------------------------------------------------------------------------------
# halos: conv and pooling windows
# --------------------------------------------------------------------------------------------


def test_conv3x3_halo_one_row_each_side_clipped_at_border():
    layer = conv_layer(k=3, s=1, p=1, size=32)
    boxes = G.output_boxes(layer, cfg(n=1, c=1, h=2, w=1))
    reg = G.input_regions(layer, 0, boxes)
    # output rows [0,16): input rows -1..16 -> clipped [0,17); rows [16,32): 15..32 -> [15,32)
    assert rows(reg, 2) == [(0, 17), (15, 32)]
    assert rows(reg, 3) == [(0, 32), (0, 32)]
    assert rows(reg, 1) == [(0, 4), (0, 4)]   # every input channel
    assert rows(reg, 0) == [(0, 1), (0, 1)]


def test_conv5x5_stride2_pad2_halo():
    layer = conv_layer(k=5, s=2, p=2, size=32)
    assert layer.out_shape[2] == 16  # (32 + 4 - 5) // 2 + 1
    boxes = G.output_boxes(layer, cfg(n=1, c=1, h=2, w=2))
    reg = G.input_regions(layer, 0, boxes)
    # out rows [0,8): 0*2-2=-2 .. 7*2-2+4=16 -> [0,17);  [8,16): 14 .. 30-2+4=32 -> [14,32)
    assert rows(reg, 2) == [(0, 17), (0, 17), (14, 32), (14, 32)]
    assert rows(reg, 3) == [(0, 17), (14, 32), (0, 17), (14, 32)]


def test_pool2x2_stride2_needs_no_halo():
    layer = pool_layer(k=2, s=2, size=32)
    boxes = G.output_boxes(layer, cfg(n=1, c=2, h=2, w=1))
    reg = G.input_regions(layer, 0, boxes)
    # out rows [0,8) read input rows 0..15; [8,16) read 16..31: exact halves, no overlap
    assert rows(reg, 2) == [(0, 16), (16, 32), (0, 16), (16, 32)]
    # pooling is per channel: the channel range follows the output's
    assert rows(reg, 1) == [(0, 2), (0, 2), (2, 4), (2, 4)]


def test_dilated_conv_halo():
    # k=3, dilation 2 spans 5 rows; pad 2 keeps 32 -> 32
    layer = conv_layer(k=3, s=1, p=2, d=2, size=32)
    assert layer.out_shape[2] == 32
    reg = G.input_regions(layer, 0, G.output_boxes(layer, cfg(n=1, c=1, h=2, w=1)))
    # [0,16): -2 .. 15-2+4=17 -> [0,18);  [16,32): 14 .. 31-2+4=33 -> [14,32)
    assert rows(reg, 2) == [(0, 18), (14, 32)]


def test_grouped_conv_channel_ranges():
    # groups=4, cin 8, cout 16: 4 output / 2 input channels per group
    layer = conv_layer(cin=8, cout=16, groups=4)
    reg = G.input_regions(layer, 0, G.output_boxes(layer, cfg(n=1, c=4)))
    assert rows(reg, 1) == [(0, 2), (2, 4), (4, 6), (6, 8)]
    reg = G.input_regions(layer, 0, G.output_boxes(layer, cfg(n=1, c=2)))
    assert rows(reg, 1) == [(0, 4), (4, 8)]
    # depthwise: groups = cin = cout
    dw = conv_layer(cin=8, cout=8, groups=8)
    reg = G.input_regions(dw, 0, G.output_boxes(dw, cfg(n=1, c=2)))
    assert rows(reg, 1) == [(0, 4), (4, 8)]
    # a range straddling groups: groups 3, cout 6 (2 per group), cin 3 (1 per group).
    # c=2 -> out [0,3) = groups 0,1 -> in [0,2);  out [3,6) = groups 1,2 -> in [1,3)
    st = conv_layer(cin=3, cout=6, groups=3)
    reg = G.input_regions(st, 0, G.output_boxes(st, cfg(n=1, c=2)))
    assert rows(reg, 1) == [(0, 2), (1, 3)]
    # ungrouped conv: every device reads every input channel
    plain = conv_layer(cin=8, cout=16)
    reg = G.input_regions(plain, 0, G.output_boxes(plain, cfg(n=1, c=4)))
    assert rows(reg, 1) == [(0, 8)] * 4


def test_adaptive_pool_windows():
    # 7 -> 3: out i reads [floor(7i/3), ceil(7(i+1)/3)) = [0,3), [2,5), [4,7)
    layer = Layer("ap", "adaptive_pool", (1, 1, 3, 3), ("n", "c", "h", "w"),
                  in_shapes=((1, 1, 7, 7),))
    reg = G.input_regions(layer, 0, G.output_boxes(layer, Config((("h", 3),), (0, 1, 2))))
    assert rows(reg, 2) == [(0, 3), (2, 5), (4, 7)]


# --------------------------------------------------------------------------------------------
# matrix products, attention, concat, others
# --------------------------------------------------------------------------------------------


def test_linear_c_split_needs_full_input_rows():
    layer = Layer("fc", "linear", (8, 16), ("n", "c"), in_shapes=((8, 32),),
                  params={"weight": (16, 32), "bias": (16,)})
    reg = G.input_regions(layer, 0, G.output_boxes(layer, cfg(n=1, c=2)))
    assert reg.tolist() == [[[0, 8], [0, 32]]] * 2     # all samples, all 32 features
    reg = G.input_regions(layer, 0, G.output_boxes(layer, cfg(n=2, c=1)))
    assert reg.tolist() == [[[0, 4], [0, 32]], [[4, 8], [0, 32]]]
    # 3-D linear [N, L, C]: an l-split reads its own positions, every feature
    l3 = Layer("fc", "linear", (2, 6, 16), ("n", "l", "c"), in_shapes=((2, 6, 32),))
    reg = G.input_regions(l3, 0, G.output_boxes(l3, cfg(n=1, l=2)))
    assert reg.tolist() == [[[0, 2], [0, 3], [0, 32]], [[0, 2], [3, 6], [0, 32]]]


def test_matmul_regions():
    # a [2, 8, 6] @ b [2, 6, 10] -> [2, 8, 10] with axes (n, l, c)
    layer = Layer("mm", "matmul", (2, 8, 10), ("n", "l", "c"),
                  in_shapes=((2, 8, 6), (2, 6, 10)))
    boxes = G.output_boxes(layer, cfg(n=1, l=2))          # split the M rows
    assert G.input_regions(layer, 0, boxes).tolist() == [
        [[0, 2], [0, 4], [0, 6]], [[0, 2], [4, 8], [0, 6]]]   # own rows, every K
    assert G.input_regions(layer, 1, boxes).tolist() == [[[0, 2], [0, 6], [0, 10]]] * 2
    boxes = G.output_boxes(layer, cfg(n=1, c=2))          # split the N columns
    assert G.input_regions(layer, 0, boxes).tolist() == [[[0, 2], [0, 8], [0, 6]]] * 2
    assert G.input_regions(layer, 1, boxes).tolist() == [
        [[0, 2], [0, 6], [0, 5]], [[0, 2], [0, 6], [5, 10]]]
    boxes = G.output_boxes(layer, cfg(n=2))
    assert G.input_regions(layer, 1, boxes).tolist() == [
        [[0, 1], [0, 6], [0, 10]], [[1, 2], [0, 6], [0, 10]]]
    # b broadcast over the batch: [1, 6, 10] -> every device reads batch row 0
    bl = Layer("mm", "matmul", (2, 8, 10), ("n", "l", "c"), in_shapes=((2, 8, 6), (1, 6, 10)))
    assert G.input_regions(bl, 1, G.output_boxes(bl, cfg(n=2))).tolist() == [
        [[0, 1], [0, 6], [0, 10]]] * 2


def test_sdpa_key_value_need_every_key_row():
    # q, k, v [N=2, H=4, L=16, D=8]; output axes (n, c=heads, l, -)
    shp = (2, 4, 16, 8)
    layer = Layer("att", "sdpa", shp, ("n", "c", "l", "-"), in_shapes=(shp, shp, shp))
    boxes = G.output_boxes(layer, cfg(n=1, c=2, l=2))
    q = G.input_regions(layer, 0, boxes)
    k = G.input_regions(layer, 1, boxes)
    v = G.input_regions(layer, 2, boxes)
    assert rows(q, 2) == [(0, 8), (8, 16), (0, 8), (8, 16)]   # own query rows
    assert rows(k, 2) == [(0, 16)] * 4 and rows(v, 2) == [(0, 16)] * 4
    for r in (q, k, v):
        assert rows(r, 1) == [(0, 2), (0, 2), (2, 4), (2, 4)]  # own heads
        assert rows(r, 3) == [(0, 8)] * 4


def test_concat_regions_per_input():
    # concat of 3 + 5 channels; output c-split in 2 -> channels [0,4) and [4,8)
    layer = Layer("cat", "concat", (2, 8, 4, 4), ("n", "c", "h", "w"),
                  in_shapes=((2, 3, 4, 4), (2, 5, 4, 4)),
                  attrs={"dim": 1, "offsets": (0, 3)})
    boxes = G.output_boxes(layer, cfg(n=1, c=2))
    r0 = G.input_regions(layer, 0, boxes)
    r1 = G.input_regions(layer, 1, boxes)
    assert rows(r0, 1)[0] == (0, 3)           # device 0: all of input 0 ...
    assert rows(r1, 1)[0] == (0, 1)           # ... and channel 3 of the output = 0 of input 1
    assert G.volume(r0[1]) == 0               # device 1: nothing of input 0
    assert rows(r1, 1)[1] == (1, 5)           # ... and channels 4..7 = [1,5) of input 1
    assert G.volume(r0).tolist() == [2 * 3 * 16, 0]
    assert G.volume(r1).tolist() == [2 * 1 * 16, 2 * 4 * 16]


def test_eltwise_broadcast_operand():
    # x [2, 4, 8, 8] + b [4, 1, 1]: the bias operand follows the channel range, index 0 of 1s
    layer = Layer("add", "eltwise", (2, 4, 8, 8), ("n", "c", "h", "w"),
                  in_shapes=((2, 4, 8, 8), (4, 1, 1)))
    boxes = G.output_boxes(layer, cfg(n=1, c=2, h=2))
    assert G.input_regions(layer, 1, boxes).tolist()[3] == [[2, 4], [0, 1], [0, 1]]
    assert G.input_regions(layer, 0, boxes).tolist()[3] == [[0, 2], [2, 4], [4, 8], [0, 8]]


def test_norm_softmax_reduce_regions():
    ln = Layer("ln", "norm", (2, 6, 16), ("n", "l", "-"), in_shapes=((2, 6, 16),),
               attrs={"full_axes": (2,)})
    reg = G.input_regions(ln, 0, G.output_boxes(ln, cfg(n=2, l=2)))
    assert reg.tolist()[1] == [[0, 1], [3, 6], [0, 16]]
    red = Layer("mean", "reduce", (2, 16), ("n", "c"), in_shapes=((2, 6, 16),),
                attrs={"dims": (1,), "keepdim": False})
    reg = G.input_regions(red, 0, G.output_boxes(red, cfg(n=1, c=2)))
    assert reg.tolist() == [[[0, 2], [0, 6], [0, 8]], [[0, 2], [0, 6], [8, 16]]]
    redk = Layer("mean", "reduce", (2, 1, 16), ("n", "-", "c"), in_shapes=((2, 6, 16),),
                 attrs={"dims": (1,), "keepdim": True})
    reg = G.input_regions(redk, 0, G.output_boxes(redk, cfg(n=2, c=1)))
    assert reg.tolist() == [[[0, 1], [0, 6], [0, 16]], [[1, 2], [0, 6], [0, 16]]]


def test_lstm_cell_and_embedding_regions():
    cell = Layer("cell", "lstm_cell", (4, 8), ("n", "c"), in_shapes=((4, 5), (4, 8), (4, 8)))
    boxes = G.output_boxes(cell, cfg(n=2, c=2))
    assert G.input_regions(cell, 0, boxes).tolist()[1] == [[0, 2], [0, 5]]   # all features
    assert G.input_regions(cell, 1, boxes).tolist()[1] == [[0, 2], [0, 8]]   # all of h
    assert G.input_regions(cell, 2, boxes).tolist()[1] == [[0, 2], [4, 8]]   # own units of c
    emb = Layer("emb", "embedding", (2, 6, 16), ("n", "l", "c"), in_shapes=((2, 6),))
    reg = G.input_regions(emb, 0, G.output_boxes(emb, cfg(n=1, l=2, c=2)))
    assert reg.tolist()[3] == [[0, 2], [3, 6]]


def test_input_regions_of_input_layer_says_it_has_no_inputs():
    x = Layer("x", "input", (2, 3), ("n", "c"))
    with pytest.raises(ValueError, match=r"input layer x has no inputs"):
        G.input_regions(x, 0, G.output_boxes(x, cfg(n=1)))


def test_input_regions_unknown_op_names_op_and_layer():
    odd = Layer("fft", "fft", (2, 3), ("n", "c"), in_shapes=((2, 3),))
    with pytest.raises(ValueError, match=r"no geometry rule for op 'fft' \(layer fft\)"):
        G.input_regions(odd, 0, G.output_boxes(odd, cfg(n=1)))


# --------------------------------------------------------------------------------------------
# edge transforms
# --------------------------------------------------------------------------------------------


def test_flatten_maps_sample_range_and_everything_else():
    t = [("reshape", (8, 4, 3, 3), (8, 36))]
    box = np.array([[[4, 8], [0, 36]]])
    assert G.apply_transforms(box, t).tolist() == [[[4, 8], [0, 4], [0, 3], [0, 3]]]
    # columns [9, 18) are exactly channel 1 (9 elements per channel)
    box = np.array([[[0, 8], [9, 18]]])
    assert G.apply_transforms(box, t).tolist() == [[[0, 8], [1, 2], [0, 3], [0, 3]]]
    # columns [0, 10): channel 0 and the first element of channel 1 -> bounding box c [0,2)
    box = np.array([[[0, 8], [0, 10]]])
    assert G.apply_transforms(box, t).tolist() == [[[0, 8], [0, 2], [0, 3], [0, 3]]]


def test_reshape_head_split_maps_to_column_range():
    # [N, L, E=64] viewed as [N, L, H=4, D=16]: heads [1, 3) are columns [16, 48)
    t = [("reshape", (2, 16, 64), (2, 16, 4, 16))]
    box = np.array([[[0, 2], [0, 16], [1, 3], [0, 16]]])
    assert G.apply_transforms(box, t).tolist() == [[[0, 2], [0, 16], [16, 48]]]
    # with the transpose to [N, H, L, D] in front (consumer side first)
    t2 = [("permute", (0, 2, 1, 3))] + t
    box = np.array([[[0, 2], [2, 4], [0, 16], [0, 16]]])   # heads 2, 3 in [N, H, L, D]
    assert G.apply_transforms(box, t2).tolist() == [[[0, 2], [0, 16], [32, 64]]]


def test_permute_transform_matches_torch():
    src = torch.arange(2 * 3 * 4).reshape(2, 3, 4)
    dst = src.permute(2, 0, 1)                                # [4, 2, 3]
    box = np.array([[[1, 3], [0, 1], [1, 3]]])
    got = G.apply_transforms(box, [("permute", (2, 0, 1))])[0]
    assert got.tolist() == [[0, 1], [1, 3], [1, 3]]
    want = set(dst[1:3, 0:1, 1:3].flatten().tolist())
    have = set(src[0:1, 1:3, 1:3].flatten().tolist())
    assert want == have


def test_select_and_slice_transforms():
    # x[:, t] on [N, T, H] with t = 2: a consumer box [n, h] reads row t = 2 only
    box = np.array([[[0, 4], [5, 16]]])
    assert G.apply_transforms(box, [("select", 1, 2)]).tolist() == [[[0, 4], [2, 3], [5, 16]]]
    # x[:, 5:] on dim 1: consumer columns shift by 5
    box = np.array([[[0, 2], [0, 3]]])
    assert G.apply_transforms(box, [("slice", 1, 5)]).tolist() == [[[0, 2], [5, 8]]]
    # tuple items do nothing
    assert G.apply_transforms(box, [("item", 1)]).tolist() == box.tolist()
    with pytest.raises(ValueError, match=r"unknown edge transform 'gather'"):
        G.apply_transforms(box, [("gather", 0)])


@pytest.mark.parametrize("src, dst", [
    ((2, 16, 64), (2, 16, 4, 16)), ((2, 16, 4, 16), (2, 16, 64)), ((8, 4, 3, 3), (8, 36)),
    ((6, 4), (24,)), ((2, 3, 4), (6, 4)), ((2, 3, 4), (4, 6)), ((4, 6), (2, 3, 4)),
    ((2, 1, 6), (2, 6)), ((2, 6), (2, 1, 6)), ((12,), (3, 4)), ((6, 1, 4), (2, 3, 4)),
])
def test_reshape_region_covers_every_element_it_reads(src, dst):
    # brute force: the producer elements a consumer box reads must lie in the mapped box
    rng = np.random.default_rng(7)
    flat = np.arange(math.prod(src)).reshape(dst)
    for _ in range(60):
        box = []
        for s in dst:
            a = int(rng.integers(0, s))
            box.append((a, int(rng.integers(a + 1, s + 1))))
        box = np.array(box)
        got = G.apply_transforms(box[None], [("reshape", src, dst)])[0]
        idx = np.unravel_index(flat[tuple(slice(a, b) for a, b in box)].ravel(), src)
        for ax, ix in enumerate(idx):
            assert got[ax, 0] <= ix.min() and ix.max() < got[ax, 1], (box.tolist(), got.tolist())
    # a full consumer box must map to the full producer tensor, nothing more
    full = G.apply_transforms(G.full_box(dst)[None], [("reshape", src, dst)])[0]
    assert full.tolist() == G.full_box(src).tolist()


def test_edge_regions_through_real_attention_edges():
    from explorer.engine.core.importer import import_spec
    g = import_spec("transformer", batch=2,
                    model_args={"seq": 16, "hidden": 64, "heads": 4, "vocab": 50, "layers": 1})
    att = next(l for l in g.layers() if l.op == "sdpa")
    es = g.in_edges(att.name)
    assert [e.index for e in es] == [0, 1, 2]
    # heads split in 2 and queries split in 2: q's producer (a Linear [2,16,64]) must give
    # the device its 16 positions and its heads' 32 columns; k and v every position.
    boxes = G.output_boxes(att, cfg(n=1, c=2, l=2))
    q = G.edge_regions(g, es[0], boxes)
    k = G.edge_regions(g, es[1], boxes)
    assert q.shape == (4, 3, 2)
    assert q.tolist()[1] == [[0, 2], [8, 16], [0, 32]]
    assert q.tolist()[2] == [[0, 2], [0, 8], [32, 64]]
    assert k.tolist()[2] == [[0, 2], [0, 16], [32, 64]]
    # the LSTM's x[:, t] edge: the cell at step t reads column t of the input sequence
    g2 = import_spec("lstm", batch=4, model_args={"layers": 1, "steps": 3, "hidden": 8})
    cell_t2 = [l for l in g2.layers() if l.op == "lstm_cell"][2]
    e = next(e for e in g2.in_edges(cell_t2.name) if e.index == 0)
    reg = G.edge_regions(g2, e, G.output_boxes(cell_t2, cfg(n=2, c=1)))
    assert reg.tolist() == [[[0, 2], [2, 3], [0, 8]], [[2, 4], [2, 3], [0, 8]]]


# --------------------------------------------------------------------------------------------
# parameter shards
# --------------------------------------------------------------------------------------------


def test_param_shards_conv_c_split_and_n_split():
    layer = conv_layer(cin=8, cout=16, k=3)          # weight (16, 8, 3, 3), bias (16,)
    sh = G.param_shards(layer, G.output_boxes(layer, cfg(n=1, c=4)))
    shape, reg = sh["weight"]
    assert shape == (16, 8, 3, 3)
    assert rows(reg, 0) == [(0, 4), (4, 8), (8, 12), (12, 16)]
    assert rows(reg, 1) == [(0, 8)] * 4
    assert rows(sh["bias"][1], 0) == [(0, 4), (4, 8), (8, 12), (12, 16)]
    # data parallel: every device holds the whole weight
    sh = G.param_shards(layer, G.output_boxes(layer, cfg(n=4)))
    assert G.volume(sh["weight"][1]).tolist() == [16 * 8 * 9] * 4
    assert sh["weight"][1].tolist() == [G.full_box((16, 8, 3, 3)).tolist()] * 4
    # spatial split replicates too
    sh = G.param_shards(layer, G.output_boxes(layer, cfg(n=1, h=2, w=2)))
    assert G.volume(sh["bias"][1]).tolist() == [16] * 4


def test_param_shards_linear_embedding_lstm_norm():
    fc = Layer("fc", "linear", (8, 6), ("n", "c"), in_shapes=((8, 10),),
               params={"weight": (6, 10), "bias": (6,)})
    sh = G.param_shards(fc, G.output_boxes(fc, cfg(n=1, c=2)))
    assert sh["weight"][1].tolist() == [[[0, 3], [0, 10]], [[3, 6], [0, 10]]]
    emb = Layer("emb", "embedding", (2, 6, 16), ("n", "l", "c"), in_shapes=((2, 6),),
                params={"weight": (50, 16)})
    sh = G.param_shards(emb, G.output_boxes(emb, cfg(n=1, l=1, c=2)))
    assert sh["weight"][1].tolist() == [[[0, 50], [0, 8]], [[0, 50], [8, 16]]]  # columns
    # LSTM weights are 4 gate blocks of `hidden` rows: a c-split takes its rows of each gate
    cell = Layer("cell", "lstm_cell", (4, 8), ("n", "c"), in_shapes=((4, 5),),
                 params={"weight_ih": (32, 5), "bias_ih": (32,)})
    sh = G.param_shards(cell, G.output_boxes(cell, cfg(n=1, c=2)))
    logical, reg = sh["weight_ih"]
    assert logical == (4, 8, 5)
    assert reg.tolist()[1] == [[0, 4], [4, 8], [0, 5]]
    assert sh["bias_ih"][0] == (4, 8)
    ln = Layer("ln", "norm", (2, 6, 16), ("n", "l", "-"), in_shapes=((2, 6, 16),),
               params={"weight": (16,)}, attrs={"full_axes": (2,)})
    sh = G.param_shards(ln, G.output_boxes(ln, cfg(n=2, l=1)))
    assert G.volume(sh["weight"][1]).tolist() == [16, 16]


def test_shard_summary_replica_groups():
    layer = conv_layer(cin=8, cout=16, k=3)    # weight 16*8*9 = 1152 elements, bias 16
    boxes, elems, groups = G.shard_summary(layer, cfg(n=4))
    # data parallel on 4: one group of all 4 devices per parameter
    assert sorted(groups) == sorted([(1152, [0, 1, 2, 3]), (16, [0, 1, 2, 3])])
    assert elems.tolist() == [1168] * 4
    assert boxes.shape == (4, 4, 2)
    # model parallel on 4: every device its own quarter, no replication
    _, elems, groups = G.shard_summary(layer, cfg(n=1, c=4))
    assert elems.tolist() == [292] * 4           # 288 weight + 4 bias
    assert all(len(m) == 1 for _, m in groups) and len(groups) == 8
    # n2 c2: positions (n,c) = 0:(0,0) 1:(0,1) 2:(1,0) 3:(1,1); same c -> same shard
    _, elems, groups = G.shard_summary(layer, cfg(n=2, c=2))
    assert sorted(groups) == sorted([(576, [0, 2]), (576, [1, 3]), (8, [0, 2]), (8, [1, 3])])
    # a layer without parameters has no groups
    _, elems, groups = G.shard_summary(pool_layer(), cfg(n=1, h=2))
    assert groups == [] and elems.tolist() == [0, 0]


# --------------------------------------------------------------------------------------------
# geometry against PyTorch
# --------------------------------------------------------------------------------------------


def _sl(box):
    return tuple(slice(int(a), int(b)) for a, b in box)


def _local_window(x, region, box, layer, compute, pad_value):
    """Compute a device's output tile from only ``x[region]``.

    Pads each spatial side by the layer's padding only where the region touches the tensor
    border, runs the window op without padding, and cuts the device's rows out of the
    result using the window arithmetic out_row = (first input row + pad) / stride.
    """
    a = layer.attrs
    xs = x[_sl(region)]
    pads, offs = [], []
    for i in range(2):
        ax = 2 + i
        size, p, s = x.shape[ax], a["padding"][i], a["stride"][i]
        r0, r1 = int(region[ax, 0]), int(region[ax, 1])
        pt = p if r0 == 0 else 0
        pb = p if r1 == size else 0
        assert (r0 - pt + p) % s == 0, f"region start {r0} is not on a window start"
        offs.append((r0 - pt + p) // s)
        pads.append((pt, pb))
    xp = F.pad(xs, (pads[1][0], pads[1][1], pads[0][0], pads[0][1]), value=pad_value)
    y = compute(xp)
    sel = [slice(None), slice(None)]
    for i in range(2):
        lo, hi = int(box[2 + i, 0]) - offs[i], int(box[2 + i, 1]) - offs[i]
        assert 0 <= lo and hi <= y.shape[2 + i], (
            f"axis {2 + i}: region {region[2 + i].tolist()} cannot produce rows "
            f"{box[2 + i].tolist()}")
        sel.append(slice(lo, hi))
    return y[tuple(sel)]


CONVS = [
    dict(k=3, s=1, p=1),
    dict(k=5, s=2, p=2),
    dict(k=3, s=1, p=2, d=2),
    dict(k=3, s=2, p=0),
    dict(k=4, s=3, p=1),
    dict(k=3, s=1, p=1, groups=2),   # 6 out / 4 in: 3 out, 2 in channels per group
    dict(k=3, s=2, p=1, groups=4),   # depthwise: 4 in, 4 out channels
]


@pytest.mark.parametrize("spec", CONVS, ids=lambda s: ",".join(f"{k}{v}" for k, v in s.items()))
def test_conv_tiles_from_input_regions_equal_full_conv(spec):
    torch.manual_seed(0)
    groups = spec.get("groups", 1)
    cout = 4 if groups == 4 else 6
    conv = nn.Conv2d(4, cout, spec["k"], stride=spec["s"], padding=spec["p"],
                     dilation=spec.get("d", 1), groups=groups)
    x = torch.randn(4, 4, 11, 13)
    g = import_model(conv, x, "conv")
    layer = next(l for l in g.layers() if l.op == "conv")
    with torch.no_grad():
        full = conv(x)
    assert tuple(full.shape) == layer.out_shape
    W, B = conv.weight.detach(), conv.bias.detach()
    cin_g, cout_g = 4 // groups, cout // groups
    configs = G.enumerate_configs(layer, 4) + G.enumerate_configs(layer, 6)
    configs.append(Config((("n", 1), ("c", 1), ("h", 2), ("w", 2)), (0, 1, 2, 3)))
    assert len(configs) > 20
    for c in configs:
        boxes = G.output_boxes(layer, c)
        reg = G.input_regions(layer, 0, boxes)
        shards = G.param_shards(layer, boxes)
        for k in range(c.total):
            box, region = boxes[k], reg[k]
            assert region[0].tolist() == box[0].tolist()  # own samples only
            w_box = shards["weight"][1][k]
            b_box = shards["bias"][1][k]
            w_local, b_local = W[_sl(w_box)], B[_sl(b_box)]
            tiles = []
            o0, o1 = int(box[1, 0]), int(box[1, 1])
            for grp in range(o0 // cout_g, (o1 - 1) // cout_g + 1):
                # this device's output channels in group grp, and the input channels they read
                lo, hi = max(o0, grp * cout_g), min(o1, (grp + 1) * cout_g)
                ci0, ci1 = grp * cin_g, (grp + 1) * cin_g
                assert region[1, 0] <= ci0 and ci1 <= region[1, 1], "missing input channels"
                assert w_box[0, 0] <= lo and hi <= w_box[0, 1], "missing weight rows"

                def compute(xp, lo=lo, hi=hi, ci0=ci0, ci1=ci1):
                    chans = slice(ci0 - int(region[1, 0]), ci1 - int(region[1, 0]))
                    rows_ = slice(lo - int(w_box[0, 0]), hi - int(w_box[0, 0]))
                    return F.conv2d(xp[:, chans], w_local[rows_],
                                    b_local[lo - int(b_box[0, 0]):hi - int(b_box[0, 0])],
                                    stride=spec["s"], dilation=spec.get("d", 1))
                tiles.append(_local_window(x, region, box, layer, compute, 0.0))
            got = torch.cat(tiles, dim=1)
            want = full[_sl(box)]
            assert got.shape == want.shape
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5,
                                       msg=f"{c.key()} device {k}")
            # the region is no larger than the window arithmetic allows
            for i in range(2):
                ax, kk = 2 + i, spec["k"]
                n_out = int(box[ax, 1] - box[ax, 0])
                span = (n_out - 1) * spec["s"] + spec.get("d", 1) * (kk - 1) + 1
                assert region[ax, 1] - region[ax, 0] <= span


POOLS = [
    ("max", dict(kernel_size=2, stride=2)),
    ("max", dict(kernel_size=3, stride=2, padding=1)),
    ("max", dict(kernel_size=3, stride=1, padding=1)),
    ("max", dict(kernel_size=3, stride=2, padding=1, dilation=2)),
    ("avg", dict(kernel_size=3, stride=2, padding=1)),      # count_include_pad: zero pad
]


@pytest.mark.parametrize("kind, kw", POOLS, ids=lambda v: str(v))
def test_pool_tiles_from_input_regions_equal_full_pool(kind, kw):
    torch.manual_seed(0)
    mod = nn.MaxPool2d(**kw) if kind == "max" else nn.AvgPool2d(**kw)
    x = torch.randn(2, 4, 13, 11)
    g = import_model(mod, x, "pool")
    layer = next(l for l in g.layers() if l.op == "pool")
    full = mod(x)
    assert tuple(full.shape) == layer.out_shape
    pad_value = float("-inf") if kind == "max" else 0.0

    def compute(xp):
        if kind == "max":
            return F.max_pool2d(xp, kw["kernel_size"], kw["stride"], 0,
                                dilation=kw.get("dilation", 1))
        return F.avg_pool2d(xp, kw["kernel_size"], kw["stride"], 0)

    configs = G.enumerate_configs(layer, 4) + G.enumerate_configs(layer, 6)
    for c in configs:
        boxes = G.output_boxes(layer, c)
        reg = G.input_regions(layer, 0, boxes)
        for k in range(c.total):
            box, region = boxes[k], reg[k]
            assert region[:2].tolist() == box[:2].tolist()   # own samples and channels
            got = _local_window(x, region, box, layer, compute, pad_value)
            torch.testing.assert_close(got, full[_sl(box)], msg=f"{c.key()} device {k}")


# Regions must equal the bounding box of the input elements the output box depends on
# (found with autograd on random data): nothing missing, nothing fetched for nothing.

def _dependency_boxes(fn, inputs, out_box):
    xs = [t.clone().requires_grad_(True) for t in inputs]
    y = fn(*xs)
    mask = torch.zeros_like(y)
    # random weights: a plain sum can have zero gradient (the rows of a LayerNorm sum to 0)
    mask[_sl(out_box)] = torch.rand(mask[_sl(out_box)].shape) + 0.5
    (y * mask).sum().backward()
    out = []
    for t in xs:
        nz = torch.nonzero(t.grad)
        if nz.numel() == 0:
            out.append(None)
        else:
            out.append([[int(nz[:, a].min()), int(nz[:, a].max()) + 1]
                        for a in range(t.dim())])
    return out


def _check_dependencies(layer, fn, inputs, configs):
    n = 0
    for c in configs:
        boxes = G.output_boxes(layer, c)
        regs = [G.input_regions(layer, i, boxes) for i in range(len(inputs))]
        for k in range(c.total):
            deps = _dependency_boxes(fn, inputs, boxes[k])
            for i, dep in enumerate(deps):
                r = regs[i][k]
                if dep is None:
                    assert G.volume(r) == 0, f"{c.key()} dev {k} input {i}: {r.tolist()}"
                else:
                    assert r.tolist() == dep, f"{c.key()} dev {k} input {i}"
                n += 1
    assert n > 0


def test_regions_equal_true_dependencies_linear_matmul_sdpa():
    torch.manual_seed(0)
    fc = nn.Linear(10, 6)
    lin = Layer("fc", "linear", (4, 5, 6), ("n", "l", "c"), in_shapes=((4, 5, 10),))
    _check_dependencies(lin, fc, [torch.randn(4, 5, 10)], G.enumerate_configs(lin, 4))

    mm = Layer("mm", "matmul", (2, 6, 5), ("n", "l", "c"), in_shapes=((2, 6, 4), (2, 4, 5)))
    _check_dependencies(mm, torch.matmul, [torch.randn(2, 6, 4), torch.randn(2, 4, 5)],
                        G.enumerate_configs(mm, 4))

    shp = (2, 4, 6, 3)
    att = Layer("att", "sdpa", shp, ("n", "c", "l", "-"), in_shapes=(shp, shp, shp))
    _check_dependencies(att, F.scaled_dot_product_attention,
                        [torch.randn(shp), torch.randn(shp), torch.randn(shp)],
                        G.enumerate_configs(att, 4))


def test_regions_equal_true_dependencies_concat_adaptive_norm_lstm():
    torch.manual_seed(0)
    cat = Layer("cat", "concat", (2, 8, 3, 3), ("n", "c", "h", "w"),
                in_shapes=((2, 3, 3, 3), (2, 5, 3, 3)), attrs={"dim": 1, "offsets": (0, 3)})
    _check_dependencies(cat, lambda a, b: torch.cat([a, b], 1),
                        [torch.randn(2, 3, 3, 3), torch.randn(2, 5, 3, 3)],
                        G.enumerate_configs(cat, 4) + G.enumerate_configs(cat, 8))

    ap = Layer("ap", "adaptive_pool", (2, 3, 3, 4), ("n", "c", "h", "w"),
               in_shapes=((2, 3, 7, 10),))
    _check_dependencies(ap, lambda t: F.adaptive_avg_pool2d(t, (3, 4)),
                        [torch.randn(2, 3, 7, 10)], G.enumerate_configs(ap, 6))

    ln_mod = nn.LayerNorm(8)
    ln = Layer("ln", "norm", (2, 4, 8), ("n", "l", "-"), in_shapes=((2, 4, 8),),
               attrs={"full_axes": (2,)})
    _check_dependencies(ln, ln_mod, [torch.randn(2, 4, 8)], G.enumerate_configs(ln, 4))

    cell_mod = nn.LSTMCell(5, 8)
    cell = Layer("cell", "lstm_cell", (4, 8), ("n", "c"), in_shapes=((4, 5), (4, 8), (4, 8)))
    _check_dependencies(cell, lambda x, h, c: cell_mod(x, (h, c))[0],
                        [torch.randn(4, 5), torch.randn(4, 8), torch.randn(4, 8)],
                        G.enumerate_configs(cell, 4))


@pytest.mark.parametrize("mod, shape", [
    (nn.Conv1d(4, 6, 3, stride=2, padding=1), (2, 4, 11)),
    (nn.Conv1d(4, 6, 3, padding=2, dilation=2, groups=2), (2, 4, 9)),
    (nn.AvgPool1d(3, stride=2, padding=1), (2, 4, 11)),
    (nn.Conv3d(2, 4, 3, stride=(1, 2, 1), padding=1), (2, 2, 3, 7, 6)),
], ids=["conv1d", "conv1d-dilated-grouped", "avgpool1d", "conv3d"])
def test_imported_1d_3d_window_regions_equal_true_dependencies(mod, shape):
    torch.manual_seed(0)
    x = torch.randn(shape)
    g = import_model(mod, x)
    layer = next(l for l in g.layers() if l.op in ("conv", "pool"))
    assert layer.out_shape == tuple(mod(x).shape)
    _check_dependencies(layer, mod, [x], G.enumerate_configs(layer, 4)
                        + G.enumerate_configs(layer, 3))


# --------------------------------------------------------------------------------------------
# boxes: the vectorised arithmetic everything else uses
# --------------------------------------------------------------------------------------------


def test_box_extents_emptiness_containment_and_common_part():
    a = np.array([[0, 4], [2, 6]])
    b = np.array([[3, 8], [0, 3]])
    assert G.extents(a).tolist() == [4, 4] and G.box_shape(a) == (4, 4)
    assert G.extents(np.array([[3, 1], [0, 2]])).tolist() == [0, 2]   # reversed counts 0
    assert G.is_empty(np.stack([a, np.array([[3, 3], [0, 2]])])).tolist() == [False, True]
    assert G.common(a, b).tolist() == [[3, 4], [2, 3]]
    assert G.common(a, np.array([[4, 8], [0, 9]])) is None             # touching, not sharing
    assert bool(G.inside(np.array([[1, 2], [3, 6]]), a))
    assert not bool(G.inside(b, a))
    # vectorised: every box of a tiling lies inside the whole tensor, and not inside another
    tiles = G.split(G.full_box((6, 4), (1,)), 0, 3)
    assert G.inside(tiles, G.full_box((6, 4))).all()
    assert G.inside(tiles[:, None], tiles[None, :]).tolist() == np.eye(3, dtype=bool).tolist()


def test_to_slices_absolute_and_relative_to_a_held_box():
    x = torch.arange(48).reshape(6, 8)
    piece = np.array([[2, 4], [3, 7]])
    held = np.array([[1, 6], [2, 8]])          # a worker holds x[1:6, 2:8] as its local tensor
    local = x[G.to_slices(held)]
    assert torch.equal(local[G.to_slices(piece, held)], x[G.to_slices(piece)])
    assert G.to_slices(piece) == (slice(2, 4), slice(3, 7))
    assert G.to_slices(piece, held) == (slice(1, 3), slice(1, 5))


def test_split_is_balanced_group_major_and_replicates_on_negative_axis():
    boxes = np.array([[[0, 5], [0, 2]], [[10, 17], [0, 2]]])
    parts = G.split(boxes, 0, 2)
    assert parts.tolist() == [[[0, 2], [0, 2]], [[2, 5], [0, 2]],
                              [[10, 13], [0, 2]], [[13, 17], [0, 2]]]
    assert G.split(boxes, -1, 3).tolist() == np.repeat(boxes, 3, axis=0).tolist()
    assert G.split(boxes, None, 2).shape == (4, 2, 2)
    # random: the k parts of each box are disjoint and cover it (volumes add up)
    rng = np.random.default_rng(0)
    for _ in range(50):
        lo = rng.integers(0, 5, (3, 3))
        box = np.stack([lo, lo + rng.integers(0, 9, (3, 3))], -1)
        k, ax = int(rng.integers(1, 5)), int(rng.integers(0, 3))
        p = G.split(box, ax, k).reshape(3, k, 3, 2)
        assert (G.volume(p).sum(1) == G.volume(box)).all()
        ov = G.overlap(p[:, :, None], p[:, None, :])
        assert (ov[:, ~np.eye(k, dtype=bool)] == 0).all()
        assert G.inside(p, box[:, None]).all()
        # same balanced ranges as a configuration's split of the same extent
        ext = box[:, ax, 1] - box[:, ax, 0]
        for j in range(3):
            s0, s1 = G.split_range(int(ext[j]), k, np.arange(k))
            assert (p[j, :, ax, 0] - box[j, ax, 0]).tolist() == s0.tolist()
            assert (p[j, :, ax, 1] - box[j, ax, 0]).tolist() == s1.tolist()


def test_overlap_equals_volume_of_intersection_broadcast_and_0d():
    rng = np.random.default_rng(3)
    lo = rng.integers(0, 6, (5, 1, 4, 1))
    a = np.concatenate([lo, lo + rng.integers(0, 6, lo.shape)], -1)
    lo = rng.integers(0, 6, (1, 7, 4, 1))
    b = np.concatenate([lo, lo + rng.integers(0, 6, lo.shape)], -1)
    assert G.overlap(a, b).shape == (5, 7)
    assert (G.overlap(a, b) == G.volume(G.intersect(a, b))).all()
    # boxes without axes (0-d tensors) hold their one element
    assert G.overlap(np.zeros((3, 0, 2), np.int64), np.zeros((3, 0, 2), np.int64)).tolist() == [1] * 3
    assert G.volume(np.zeros((2, 0, 2), np.int64)).tolist() == [1, 1]


# --------------------------------------------------------------------------------------------
# windows: conv / pool arithmetic and the pads of a local computation
# --------------------------------------------------------------------------------------------


def test_window_rows_clipped_and_unclipped():
    # k5 s2 p2 on 32 rows: outputs [0, 8) read -2 .. 16 -> clipped [0, 17)
    assert [int(v) for v in G.window(0, 8, 32, 5, 2, 2, 1, clip=False)] == [-2, 17]
    assert [int(v) for v in G.window(0, 8, 32, 5, 2, 2, 1)] == [0, 17]
    lo, hi = G.window(np.array([0, 8]), np.array([8, 16]), 32, 5, 2, 2, 1)
    assert lo.tolist() == [0, 14] and hi.tolist() == [17, 32]
    # adaptive 7 -> 3: [floor(7i/3), ceil(7(i+1)/3))
    lo, hi = G.adaptive_window(np.arange(3), np.arange(1, 4), 7, 3)
    assert list(zip(lo.tolist(), hi.tolist())) == [(0, 3), (2, 5), (4, 7)]


def test_window_pads_only_at_the_tensors_true_border():
    layer = conv_layer(k=3, s=1, p=1, size=32)
    boxes = G.output_boxes(layer, cfg(n=1, c=1, h=2, w=1))
    reg = G.input_regions(layer, 0, boxes)
    a = layer.attrs
    pads = [G.window_pads(boxes[k], reg[k], layer.in_shapes[0], a["kernel"], a["stride"],
                          a["padding"], a["dilation"]) for k in range(2)]
    # top half pads above (border) not below (a neighbour's rows); bottom half the reverse
    assert pads == [[(1, 0), (1, 1)], [(0, 1), (1, 1)]]
    assert G.full_spatial(boxes[0], reg[0], layer.out_shape, layer.in_shapes[0]) is False
    whole = G.output_boxes(layer, cfg(n=2, c=1, h=1, w=1))
    wreg = G.input_regions(layer, 0, whole)
    assert G.full_spatial(whole[1], wreg[1], layer.out_shape, layer.in_shapes[0]) is True


def test_window_pads_reject_a_region_that_is_not_the_window():
    layer = conv_layer(k=3, s=1, p=1, size=32)
    box = G.output_boxes(layer, cfg(n=1, c=1, h=2, w=1))[1]
    region = G.input_regions(layer, 0, box[None])[0].copy()
    region[2, 0] += 1                                  # one halo row short
    a = layer.attrs
    with pytest.raises(ValueError, match=r"axis 2 is \[16, 32\).*reads \[15, 33\)"):
        G.window_pads(box, region, layer.in_shapes[0], a["kernel"], a["stride"], a["padding"],
                      a["dilation"])


@pytest.mark.parametrize("spec", CONVS[:5], ids=lambda s: ",".join(f"{k}{v}" for k, v in s.items()))
def test_window_pads_tile_conv_equals_full_conv(spec):
    """What the runtime does: the input region, padded by window_pads (only at the border),
    convolved without padding with the device's weight shard = that tile of the full conv."""
    torch.manual_seed(0)
    conv = nn.Conv2d(4, 6, spec["k"], stride=spec["s"], padding=spec["p"],
                     dilation=spec.get("d", 1))
    x = torch.randn(2, 4, 11, 13)
    layer = next(l for l in import_model(conv, x, "conv").layers() if l.op == "conv")
    a = layer.attrs
    with torch.no_grad():
        full = conv(x)
        for c in G.enumerate_configs(layer, 4) + G.enumerate_configs(layer, 6):
            boxes = G.output_boxes(layer, c)
            reg = G.input_regions(layer, 0, boxes)
            shards = G.param_shards(layer, boxes)
            for k in range(c.total):
                pads = G.window_pads(boxes[k], reg[k], layer.in_shapes[0], a["kernel"],
                                     a["stride"], a["padding"], a["dilation"])
                for ax, (before, after) in zip((2, 3), pads):   # padding only at the border
                    assert before == 0 or reg[k][ax, 0] == 0
                    assert after == 0 or reg[k][ax, 1] == x.shape[ax]
                xp = F.pad(x[G.to_slices(reg[k])],
                           (pads[1][0], pads[1][1], pads[0][0], pads[0][1]))
                w = conv.weight[G.to_slices(shards["weight"][1][k])]
                b = conv.bias[G.to_slices(shards["bias"][1][k])]
                got = F.conv2d(xp, w, b, stride=spec["s"], dilation=spec.get("d", 1))
                torch.testing.assert_close(got, full[G.to_slices(boxes[k])], rtol=1e-5,
                                           atol=1e-5, msg=f"{c.key()} device {k}")


def test_window_pads_tile_max_pool_equals_full_pool():
    torch.manual_seed(0)
    mod = nn.MaxPool2d(3, stride=2, padding=1)
    x = torch.randn(2, 3, 13, 11)
    layer = next(l for l in import_model(mod, x, "pool").layers() if l.op == "pool")
    a = layer.attrs
    full = mod(x)
    for c in G.enumerate_configs(layer, 6):
        boxes = G.output_boxes(layer, c)
        reg = G.input_regions(layer, 0, boxes)
        for k in range(c.total):
            pads = G.window_pads(boxes[k], reg[k], layer.in_shapes[0], a["kernel"], a["stride"],
                                 a["padding"], a["dilation"])
            xp = F.pad(x[G.to_slices(reg[k])], (pads[1][0], pads[1][1], pads[0][0], pads[0][1]),
                       value=float("-inf"))
            got = F.max_pool2d(xp, 3, 2, 0)
            torch.testing.assert_close(got, full[G.to_slices(boxes[k])],
                                       msg=f"{c.key()} device {k}")


# --------------------------------------------------------------------------------------------
# owners: mixed-radix tile ownership
# --------------------------------------------------------------------------------------------


def test_tile_digits_and_owner_grid_small():
    assert G.tile_digits([2, 3], [0, 1, 5]).tolist() == [[0, 0], [0, 1], [1, 2]]
    assert G.tile_digits([], [0]).shape == (1, 0)
    assert G.owner_grid([2, 2], [0], [1]).tolist() == [[0, 1], [2, 3]]
    assert G.owner_grid([2, 2], [1], [0]).tolist() == [[0, 2], [1, 3]]
    assert G.owner_grid([2, 3], [], [1, 0]).tolist() == [[0, 3, 1, 4, 2, 5]]
    assert G.owner_grid([2, 3], [], []).tolist() == [[0]]        # other digits are 0
    assert G.owner_grid([], [], []).tolist() == [[0]]


def test_owner_grid_agrees_with_configuration_tiles():
    # the device owning tile (row, col) of a layer's n x c grid is the one whose output box
    # has those n and c ranges (h split too: the grid shows the first h slice)
    layer = conv_layer(n=4, cin=4, cout=6, size=8)
    c = cfg(n=2, c=3, h=2, w=1)
    boxes = G.output_boxes(layer, c)
    grid = G.owner_grid([v for _, v in c.degrees], [0], [1])
    assert grid.shape == (2, 3)
    for r in range(2):
        for col in range(3):
            k = int(grid[r, col])
            assert boxes[k][0].tolist() == [2 * r, 2 * r + 2]
            assert boxes[k][1].tolist() == [2 * col, 2 * col + 2]
            assert boxes[k][2].tolist() == [0, 4]
    # every device's digits are its tile index
    assert G.owner_grid([2, 3, 2, 1], [0, 1, 2, 3], []).ravel().tolist() == list(range(12))
    assert G.tile_indices(c).tolist() == G.tile_digits([2, 3, 2, 1], range(12)).tolist()


def test_tile_owners_tofu_steps():
    assert G.tile_owners([0, 1], [2, 2]) == [[0, 1], [2, 3]]
    assert G.tile_owners([1, 0], [2, 2]) == [[0, 2], [1, 3]]
    assert G.tile_owners([0, -1], [2, 2]) == [[0], [2]]        # step 2 not split: its digit 0
    assert G.tile_owners([0, 0], [2, 2], upto=1) == [[0], [2]]  # after one step only
    assert G.tile_owners([0, 0], [2, 2]) == [[0], [1], [2], [3]]
    assert G.tile_owners([0], [4], axes=(0,)) == [[0], [1], [2], [3]]


# --------------------------------------------------------------------------------------------
# layout: one vocabulary for how a tensor lives on devices
# --------------------------------------------------------------------------------------------


def test_tensor_layout_from_config_whole_on_and_from_boxes():
    layer = conv_layer(n=2, cout=8, size=8)          # out (2, 8, 8, 8)
    c = cfg(devices=(2, 3), n=1, c=2)
    lay = G.TensorLayout.from_config(layer, c, 4)
    assert lay.shape == (2, 8, 8, 8) and lay.boxes.shape == (4, 4, 2)
    assert lay.holders() == [2, 3]
    assert lay.bytes_per_device(4).tolist() == [0, 0, 2 * 4 * 64 * 4, 2 * 4 * 64 * 4]
    assert lay.replication() == 1.0
    assert lay.boxes[3].tolist() == G.output_boxes(layer, c)[1].tolist()
    one = G.TensorLayout.whole_on((3, 5), 1, 3)
    assert one.holders() == [1] and one.replication() == 1.0
    assert one.bytes_per_device(2).tolist() == [0, 30, 0]
    every = G.TensorLayout.whole_on((3, 5), None, 3)
    assert every.holders() == [0, 1, 2] and every.replication() == 3.0
    scalar = G.TensorLayout.whole_on((), 0, 2)      # 0-d: addressed as one element
    assert scalar.boxes.tolist() == [[[0, 1]], [[0, 0]]] and scalar.holders() == [0]
    tiled = G.TensorLayout.from_boxes((6, 4), G.split(G.full_box((6, 4), (1,)), 1, 2))
    assert tiled.holders() == [0, 1] and tiled.replication() == 1.0
    assert G.TensorLayout.from_boxes((), np.zeros((2, 0, 2), np.int64)).replication() == 2.0


def test_tensor_layout_rejects_bad_boxes_with_the_numbers():
    with pytest.raises(ValueError, match=r"device 1's box \[\[0, 3\], \[2, 6\]\] is outside "
                                         r"the tensor's shape \[3, 5\]"):
        G.TensorLayout((3, 5), [[[0, 3], [0, 5]], [[0, 3], [2, 6]]])
    with pytest.raises(ValueError, match=r"boxes have 1 axes, the tensor \[3, 5\] has 2"):
        G.TensorLayout((3, 5), [[[0, 3]]])
    with pytest.raises(ValueError, match=r"boxes have shape \[2, 3\], expected"):
        G.TensorLayout((3, 5), [[0, 3, 1], [0, 5, 1]])
    with pytest.raises(ValueError, match="device 3 is outside 0..2"):
        G.TensorLayout.whole_on((3,), 3, 3)
    with pytest.raises(ValueError, match="uses device 3, outside 0..1"):
        G.TensorLayout.from_config(conv_layer(), cfg(devices=(2, 3), n=1, h=2), 2)
    # an empty box anywhere is fine: the device holds nothing
    assert G.TensorLayout((3, 5), [[[0, 0], [9, 9]]]).holders() == []


def test_tensor_layout_json_round_trip_and_validation():
    lay = G.TensorLayout.from_config(conv_layer(), cfg(n=1, h=2, w=2), 4)
    doc = json.loads(json.dumps(lay.to_json()))
    assert G.TensorLayout.from_json(doc) == lay
    assert G.TensorLayout.from_json(doc) != G.TensorLayout.whole_on(lay.shape, 0, 4)
    for bad, msg in [([1, 2], "an object with"), ({"shape": 3, "boxes": []}, "must be a list"),
                     ({"shape": [2], "boxes": [[[0, "x"]]]}, "nested lists of integers"),
                     ({"shape": [2.5], "boxes": [[[0, 1]]]}, "must be an integer")]:
        with pytest.raises(ValueError, match=msg):
            G.TensorLayout.from_json(bad)


@pytest.fixture(scope="module")
def mlp_graph():
    from explorer.engine.core.opgraph import build_opgraph
    return build_opgraph("mlp", 8, {"layers": 2, "hidden": 16})


def _plans_equal(a, b):
    def same(x, y):        # boxes without axes (a 0-d tensor) are one element [[0, 1]]
        x = np.tile([[[0, 1]]], (len(x), 1, 1)) if np.shape(x)[1] == 0 else x
        return np.array_equal(x, y)
    assert a["workers"] == b["workers"]
    assert set(a["held"]) == set(b["held"])
    for t in a["held"]:
        assert same(a["held"][t], b["held"][t]), t
    assert set(a["ops"]) == set(b["ops"])
    for o, x in a["ops"].items():
        y = b["ops"][o]
        assert same(x["out"], y["out"]) and x["reducer"] == y["reducer"]
        assert set(x["needs"]) == set(y["needs"]) and set(x["zero"]) == set(y["zero"])
        assert all(same(x["needs"][t], y["needs"][t]) for t in x["needs"])
        assert all(np.array_equal(x["zero"][t], y["zero"][t]) for t in x["zero"])


def test_execution_layout_round_trips_tofu_and_placement_plans(mlp_graph):
    from explorer.engine.runtime.opexec import placement_xplan
    from explorer.engine.tofu import search as tofu
    g = mlp_graph
    shapes = {t: ten.shape for t, ten in g.tensors.items()}
    res = tofu.partition(g, 4)
    for plan in (tofu.execution_plan(res, g),
                 placement_xplan(g, list(g.ops), [i % 3 for i in range(len(g.ops))], 3)):
        x = G.ExecutionLayout.from_plan(plan, shapes)
        text = json.dumps(x.to_json(), separators=(",", ":"))
        back = G.ExecutionLayout.from_json(json.loads(text))
        assert back.workers == plan["workers"] and back.cache == plan.get("cache", False)
        _plans_equal(plan, back.to_plan())
        assert all(isinstance(v, G.TensorLayout) for v in back.held.values())
        if plan.get("cache"):
            continue
        # Tofu at 4 workers splits reductions: reducers and per-worker zero flags survive
        red = [op for op in back.ops.values() if op.reducer == "sum" and op.zero]
        assert red and all(z.dtype == bool and z.shape == (4,) for op in red
                           for z in op.zero.values())
        # 0-d tensors (the loss) are held as one element
        assert any(not lay.shape and lay.boxes.shape == (4, 1, 2) for lay in back.held.values())


def test_placement_boxes_are_whole_tensors_on_their_device(mlp_graph):
    from explorer.engine.runtime.opexec import placement_xplan
    g = mlp_graph
    names = list(g.ops)
    x = placement_xplan(g, names, [1] * len(names), 2)
    for t, boxes in x["held"].items():
        ten = g.tensors[t]
        lay = G.TensorLayout(ten.shape, boxes)
        if ten.producer:                                 # produced on device 1
            assert lay.holders() == [1] and lay.replication() == 1.0
        assert lay.holders() in ([1], [0, 1])            # placeholders no op places: everywhere


def test_execution_layout_validation_names_what_is_wrong():
    held = {"a": G.TensorLayout.whole_on((4, 2), 0, 2)}
    good = G.ExecutionLayout(2, held, {"mm": G.OpLayout(
        [[[0, 4], [0, 2]], [[0, 0], [0, 0]]], {"a": held["a"].boxes})}).to_json()
    assert G.ExecutionLayout.from_json(good).ops["mm"].reducer is None
    one_worker = len(good["boxes"])                 # extra boxes a broken file might point at
    outside = one_worker + 1
    boxes = good["boxes"] + [[[[0, 4], [0, 2]]], [[[0, 5], [0, 2]], [[0, 0], [0, 0]]]]
    op = good["ops"]["mm"]
    cases = [
        ({"reducer": "mean"}, r"operator mm: reducer 'mean' is not one of"),
        ({"out": one_worker}, r"operator mm: output boxes for 1 workers, the plan has 2"),
        ({"needs": {"b": op["needs"]["a"]}}, r"reads tensor b, which the plan does not hold"),
        ({"needs": {"a": outside}},
         r"input a: device 0's box \[\[0, 5\], \[0, 2\]\] is outside the tensor's shape \[4, 2\]"),
        ({"zero": {"a": [True]}}, r"zero flags must be 2 booleans"),
        ({"zero": {"c": [True, False]}}, r"zero flags for c, which it does not read"),
        ({"out": 99}, r"operator mm: box index 99 is not one of the"),
    ]
    for change, msg in cases:
        with pytest.raises(ValueError, match=msg):
            G.ExecutionLayout.from_json({**good, "boxes": boxes,
                                         "ops": {"mm": {**op, **change}}})
    with pytest.raises(ValueError, match=r"tensor a has boxes for 2 workers, the plan has 3"):
        G.ExecutionLayout.from_json({**good, "workers": 3})
    with pytest.raises(ValueError, match="workers must be ≥ 1"):
        G.ExecutionLayout.from_json({**good, "workers": 0, "held": {}, "ops": {}})
    with pytest.raises(ValueError, match="held but has no shape"):
        G.ExecutionLayout.from_json({**good, "shapes": {}})
    with pytest.raises(ValueError, match="an object with"):
        G.ExecutionLayout.from_json({"held": {}})


@pytest.mark.multiprocess
def test_engine_paths_do_not_import_the_tdl_oracle():
    # geometry is the engine; TDL's layer oracle is for tests and the benchmark only
    import subprocess
    import sys
    code = ("import sys; import explorer.engine.tofu.search, explorer.engine.layerwise.costmodel, "
            "explorer.engine.runtime.opexec, explorer.engine.runtime.executor; "
            "print('explorer.engine.tofu.tdl.oracle' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"

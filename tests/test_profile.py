"""Tests for the measured compute cost (explorer/engine/core/profile.py)."""

from __future__ import annotations

import sqlite3

import pytest

from explorer.engine.core import geometry as G
from explorer.engine.core.layergraph import Layer
from explorer.engine.core.importer import import_spec
from explorer.engine.core.profile import Profiler


def conv_layer(cin=8, cout=16, size=16, batch=2):
    return Layer("conv", "conv", (batch, cout, size, size), ("n", "c", "h", "w"),
                 in_shapes=((batch, cin, size, size),),
                 params={"weight": (cout, cin, 3, 3), "bias": (cout,)},
                 attrs={"kernel": (3, 3), "stride": (1, 1), "padding": (1, 1),
                        "dilation": (1, 1), "groups": 1}, folded=["relu"])


def shard_shapes(layer, cfg):
    """Per device: (output box shape, input region shapes), as the cost model computes them."""
    boxes = G.output_boxes(layer, cfg)
    regions = [G.input_regions(layer, i, boxes) for i in range(len(layer.in_shapes))]
    return [(tuple(int(v) for v in boxes[k, :, 1] - boxes[k, :, 0]),
             [tuple(int(v) for v in r[k, :, 1] - r[k, :, 0]) for r in regions])
            for k in range(cfg.total)]


def test_second_call_is_a_cache_hit_and_survives_a_new_profiler(tmp_path):
    path = tmp_path / "profile.sqlite"
    lay = conv_layer()
    out, ins = lay.out_shape, list(lay.in_shapes)
    with Profiler(path, reps=2, warmup=1) as p:
        t1 = p.measure(lay, out, ins, "cpu")
        assert t1 > 0 and p.misses == 1 and p.hits == 0 and p.last_profile_s > 0
        t2 = p.measure(lay, out, ins, "cpu")
        assert t2 == t1 and p.hits == 1 and p.misses == 1 and p.last_profile_s == 0.0
        # another device kind is another key
        p.measure(lay, out, ins, "P100")
        assert p.misses == 2
    with Profiler(path, reps=2, warmup=1) as q:
        assert q.measure(lay, out, ins, "cpu") == t1
        assert q.hits == 1 and q.misses == 0 and q.last_profile_s == 0.0
        # an equal layer under another name shares the entry
        twin = conv_layer()
        twin.name = "other_conv"
        assert q.measure(twin, out, ins, "cpu") == t1 and q.hits == 2
        q.clear()
        assert len(q) == 0
        q.measure(lay, out, ins, "cpu")
        assert q.misses == 1
    rows = sqlite3.connect(path).execute(
        "SELECT device_kind, signature, shape, seconds, reps FROM profile").fetchall()
    assert len(rows) == 1 and rows[0][0] == "cpu" and '"op":"conv"' in rows[0][1]
    assert rows[0][4] == 2


def test_default_cache_path_uses_explorer_home(tmp_path, monkeypatch):
    monkeypatch.setenv("EXPLORER_HOME", str(tmp_path / "home"))
    with Profiler(reps=1, warmup=0) as p:
        assert p.cache_path == tmp_path / "home" / "profile.sqlite"
        assert p.cache_path.is_file()


def test_bigger_shard_measures_slower(tmp_path):
    lay = conv_layer(cin=16, cout=32, size=32, batch=4)
    cfg = G.Config((("n", 4), ("c", 1), ("h", 4), ("w", 1)), tuple(range(16)))
    (small_out, small_in), = shard_shapes(lay, cfg)[:1]   # 1/16 of the work (+ halo)
    with Profiler(tmp_path / "p.sqlite", reps=5, warmup=1) as p:
        big = p.measure(lay, lay.out_shape, list(lay.in_shapes), "cpu")
        small = p.measure(lay, small_out, small_in, "cpu")
    assert small_out == (1, 32, 8, 32)
    assert big > 2 * small > 0


def test_empty_shard_and_input_cost_nothing(tmp_path):
    lay = conv_layer()
    with Profiler(tmp_path / "p.sqlite") as p:
        assert p.measure(lay, (0, 16, 16, 16), [(0, 8, 16, 16)], "cpu") == 0.0
        x = Layer("x", "input", (2, 8, 16, 16), ("n", "c", "h", "w"))
        assert p.measure(x, x.out_shape, [], "cpu") == 0.0
        assert p.hits == p.misses == 0 and len(p) == 0


def test_unknown_op_raises(tmp_path):
    lay = Layer("weird", "fft", (2, 4), ("n", "c"), in_shapes=((2, 4),))
    with Profiler(tmp_path / "p.sqlite") as p:
        with pytest.raises(ValueError, match=r"cannot profile op 'fft' \(layer weird\)"):
            p.measure(lay, (2, 4), [(2, 4)], "cpu")


def test_restores_thread_count(tmp_path):
    import torch
    before = torch.get_num_threads()
    with Profiler(tmp_path / "p.sqlite", reps=1, warmup=0, device="cpu") as p:
        p.measure(conv_layer(), (2, 16, 16, 16), [(2, 8, 16, 16)], "cpu")
    assert torch.get_num_threads() == before


MODELS = [
    ("lenet5", 4, {}),
    ("transformer", 2, {"layers": 1, "hidden": 32, "heads": 4, "seq": 8}),
    ("lstm", 2, {"layers": 1, "hidden": 16, "steps": 2}),
    ("resnet50", 2, {"image_size": 64}),
]


@pytest.mark.parametrize("spec,batch,args", MODELS, ids=[m[0] for m in MODELS])
def test_every_layer_of_a_model_can_be_measured(tmp_path, spec, batch, args):
    g = import_spec(spec, batch=batch, model_args=args)
    ops = set()
    with Profiler(tmp_path / "p.sqlite", reps=1, warmup=0) as p:
        for layer in g.layers():
            if layer.op == "input":
                continue
            cfg = G.enumerate_configs(layer, 1)[0]
            (out, ins), = shard_shapes(layer, cfg)
            assert out == layer.out_shape
            assert p.measure(layer, out, ins, "cpu") > 0, layer.name
            ops.add(layer.op)
    assert ops  # something was measured


def test_split_shards_of_every_op_match_geometry(tmp_path):
    """Shards of uneven 3-way splits (halos, partial groups of concat) run and have the
    output box's shape (measure raises otherwise)."""
    g = import_spec("transformer", batch=3, model_args={"layers": 1, "hidden": 24, "heads": 3,
                                                          "seq": 6})
    g2 = import_spec("lenet5", batch=3)
    with Profiler(tmp_path / "p.sqlite", reps=1, warmup=0) as p:
        for layer in g.layers() + g2.layers():
            if layer.op == "input":
                continue
            for cfg in G.enumerate_configs(layer, 3):
                for out, ins in shard_shapes(layer, cfg):
                    p.measure(layer, out, ins, "cpu")
        assert p.misses > 20


def test_two_profilers_share_one_file(tmp_path):
    """Two connections (as two search processes would hold) read each other's entries."""
    path = tmp_path / "shared.sqlite"
    a, b = Profiler(path, reps=1, warmup=0), Profiler(path, reps=1, warmup=0)
    try:
        for c in (4, 8):
            lay = Layer("fc", "linear", (2, c), ("n", "c"), in_shapes=((2, 8),),
                        params={"weight": (c, 8)})
            ta = a.measure(lay, (2, c), [(2, 8)], "cpu")
            assert b.measure(lay, (2, c), [(2, 8)], "cpu") == ta
        assert a.misses == 2 and b.hits == 2 and b.misses == 0
    finally:
        a.close()
        b.close()
    with pytest.raises(ValueError, match="closed"):
        a.measure(lay, (2, 4), [(2, 8)], "cpu")


def test_inputs_without_gradient_are_a_separate_faster_entry(tmp_path):
    """A layer fed by the model input computes no input gradient (as the runtime does): its own
    cache entry, whose shard has the weight as its only gradient leaf.  (That it is also
    cheaper is a timing, which a shared machine can invert: not asserted here.)"""
    from explorer.engine.core.profile import build_shard, signature
    lay = Layer("conv1", "conv", (8, 64, 32, 32), ("n", "c", "h", "w"),
                in_shapes=((8, 3, 64, 64),), params={"weight": (64, 3, 7, 7)},
                attrs={"kernel": (7, 7), "stride": (2, 2), "padding": (3, 3),
                       "dilation": (1, 1), "groups": 1}, folded=["relu"])
    assert signature(lay, "cpu", (True,)) == signature(lay, "cpu")
    assert '"no_grad_in":[0]' in signature(lay, "cpu", (False,))
    run, leaves = build_shard(lay, lay.out_shape, [(8, 3, 69, 69)], input_grads=(False,))
    assert len(leaves) == 1 and tuple(leaves[0].shape) == (64, 3, 7, 7)     # the weight only
    ins = [(8, 3, 64, 64)]
    with Profiler(tmp_path / "p.sqlite", reps=5, warmup=1) as p:
        with_dx = p.measure(lay, lay.out_shape, ins, "cpu")
        without = p.measure(lay, lay.out_shape, ins, "cpu", input_grads=(False,))
        assert p.misses == 2 and len(p) == 2
        assert p.lookup(lay, lay.out_shape, ins, "cpu", input_grads=(False,)) == without
        with pytest.raises(ValueError, match="input_grads"):
            p.measure(lay, lay.out_shape, ins, "cpu", input_grads=(False, True))
    assert without > 0 and with_dx > 0


def test_forward_only_when_nothing_needs_a_gradient(tmp_path):
    pool = Layer("pool", "pool", (2, 4, 8, 8), ("n", "c", "h", "w"), in_shapes=((2, 4, 16, 16),),
                 attrs={"kernel": (2, 2), "stride": (2, 2), "padding": (0, 0),
                        "dilation": (1, 1)})
    with Profiler(tmp_path / "p.sqlite", reps=2, warmup=0) as p:
        assert p.measure(pool, pool.out_shape, [(2, 4, 16, 16)], "cpu",
                         input_grads=(False,)) > 0


def test_record_rows_put_rows_and_merge_caches(tmp_path):
    from explorer.engine.core.profile import merge_caches
    lay = conv_layer()
    out, ins = lay.out_shape, list(lay.in_shapes)
    paths = [tmp_path / "a.sqlite", tmp_path / "b.sqlite"]
    for path, sec in zip(paths, (1.0, 3.0)):
        with Profiler(path) as p:
            key = p.record(lay, out, ins, "cpu", sec, reps=4)
            p.record(lay, out, ins, "cpu", 7.0, input_grads=(False,))
            assert key == p.key(lay, out, ins, "cpu")
    into = tmp_path / "into.sqlite"
    assert merge_caches(paths, into) == 2
    with Profiler(into, reps=1, warmup=0) as p:
        assert p.measure(lay, out, ins, "cpu") == pytest.approx(2.0)   # mean, not measured
        assert p.hits == 1 and p.misses == 0
        assert p.lookup(lay, out, ins, "cpu", input_grads=(False,)) == pytest.approx(7.0)
        rows = {r[:3]: r for r in p.rows()}
        assert rows[key][4] == 8                                         # repetitions add up
        with pytest.raises(ValueError, match="6 fields"):
            p.put_rows([("cpu", "sig", "shape")])
    # merging into an existing cache replaces only the merged keys
    assert merge_caches([paths[0]], into, device_kind="P100") == 0


def test_cold_profiler_evicts_caches_and_measures(tmp_path):
    lay = conv_layer()
    with Profiler(tmp_path / "p.sqlite", reps=3, warmup=1, cold=True, flush_bytes=2 ** 20) as p:
        assert p.cold and p.flush_bytes == 2 ** 20
        assert p.measure(lay, lay.out_shape, list(lay.in_shapes), "cpu") > 0
        assert p.rows()[0][4] == 3


def test_concurrent_entry_is_used_when_recorded_else_the_shard_alone(tmp_path):
    lay = conv_layer()
    out, ins = lay.out_shape, list(lay.in_shapes)
    with Profiler(tmp_path / "p.sqlite", reps=2, warmup=0) as p:
        alone = p.measure(lay, out, ins, "cpu", concurrency=2)      # nothing for 2 workers yet
        assert p.misses == 1 and p.lookup(lay, out, ins, "cpu", concurrency=2) is None
        assert p.key(lay, out, ins, "cpu", concurrency=2) != p.key(lay, out, ins, "cpu")
        p.record(lay, out, ins, "cpu", 1.5, reps=3, concurrency=2)
        assert p.measure(lay, out, ins, "cpu", concurrency=2) == 1.5
        assert p.measure(lay, out, ins, "cpu") == alone
        assert p.hits == 2 and p.misses == 1

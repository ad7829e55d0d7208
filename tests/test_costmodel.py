"""Cost model: hand-checked t_X, t_S and t_C; the vectorised paths equal the general ones."""

import numpy as np
import pytest

from explorer.engine.core import geometry as G
from explorer.engine.layerwise.costmodel import (
    CostModel,
    LAUNCH_OVERHEAD_S,
    EFFICIENCY,
    UPDATE_PASSES,
)
from explorer.engine.core.devices import Device, DeviceGraph, preset
from explorer.engine.core.layergraph import Edge, Layer, LayerGraph
from explorer.engine.core.importer import import_spec
from explorer.errors import InfeasiblePlan

BW = 10e9


def flat_devices(n, bw=BW, lat=0.0, memory=16e9):
    devs = [Device(f"d{i}", "toy", 1e12, 100e9, memory, 0) for i in range(n)]
    return DeviceGraph("toy", devs, np.full((n, n), bw), np.full((n, n), lat))


def two_convs(N=4, C=8, H=16, W=16):
    g = LayerGraph("toy", N)
    g.add_layer(Layer("x", "input", (N, C, H, W), ("n", "c", "h", "w")))
    conv = dict(kernel=(3, 3), stride=(1, 1), padding=(1, 1), dilation=(1, 1), groups=1)
    g.add_layer(Layer("a", "conv", (N, C, H, W), ("n", "c", "h", "w"), ((N, C, H, W),),
                      {"weight": (C, C, 3, 3)}, dict(conv), flops=2.0 * N * C * H * W * C * 9))
    g.add_layer(Layer("b", "conv", (N, C, H, W), ("n", "c", "h", "w"), ((N, C, H, W),),
                      {"weight": (C, C, 3, 3)}, dict(conv), flops=2.0 * N * C * H * W * C * 9))
    g.add_edge(Edge("x", "a", 0))
    g.add_edge(Edge("a", "b", 0))
    return g


def cfg(layer, **deg):
    degrees = tuple((d, deg.get(d, 1)) for d in layer.dims)
    total = int(np.prod([v for _, v in degrees]))
    return G.Config(degrees, tuple(range(total)))


def test_halo_exchange_bytes_and_time():
    g = two_convs()
    cm = CostModel(g, flat_devices(2))
    a, b = g.layer("a"), g.layer("b")
    e = g.in_edges("b")[0]
    same = cfg(a, h=2)
    t, nbytes = cm.xfer(e, [same, cfg(a, n=2)], [cfg(b, h=2), cfg(b, n=2)])
    # h=2 -> h=2 with a 3x3 window: each device fetches one row of the other's half:
    # N*C*1*W floats = 4*8*16 = 512 floats = 2048 bytes, forward and backward.
    row = 4 * 8 * 1 * 16 * 4
    assert nbytes[0, 0] == pytest.approx(2 * 2 * row)
    assert t[0, 0] == pytest.approx(2 * row / BW)
    # n=2 -> n=2: nothing moves
    assert t[1, 1] == 0 and nbytes[1, 1] == 0
    # h=2 -> n=2: each device needs the other half of its samples' rows: N/2*C*(H/2)*W floats
    half = 2 * 8 * 8 * 16 * 4
    assert nbytes[0, 1] == pytest.approx(2 * 2 * half)
    assert t[0, 1] == pytest.approx(2 * half / BW)


def test_single_device_configs_never_transfer():
    g = two_convs()
    cm = CostModel(g, flat_devices(4))
    a, b = g.layer("a"), g.layer("b")
    t, nb = cm.xfer(g.in_edges("b")[0], [cfg(a)], [cfg(b)])
    assert t[0, 0] == 0 and nb[0, 0] == 0


def test_parameter_server_sync_time():
    g = two_convs()
    n = 4
    cm = CostModel(g, flat_devices(n))
    a = g.layer("a")
    cands = [cfg(a), cfg(a, n=4), cfg(a, c=4), cfg(a, n=2, c=2)]
    _, ts, _ = cm.layer_costs("a", cands)
    w = 8 * 8 * 9 * 4  # weight bytes
    assert ts[0] == 0                                     # one device: nothing to sync
    assert ts[1] == pytest.approx(2 * 3 * w / BW)         # 4 replicas: 2 (r-1) s / b
    assert ts[2] == 0                                     # disjoint shards
    # two shards of w/2, each replicated twice, on different servers in parallel
    assert ts[3] == pytest.approx(2 * 1 * (w / 2) / BW)
    ring = CostModel(g, flat_devices(n), sync="ring")
    _, tr, _ = ring.layer_costs("a", cands)
    assert tr[1] == pytest.approx(2 * 3 / 4 * w / BW)


def test_sync_latency_counts_the_exchanges_the_runtime_makes():
    # parameter server: gradients in, parameters out = 2 exchanges; with 2 replicas the two
    # swap in one exchange (same 2 s / b of data); ring: 2 (r-1) steps of the replica group
    lat = 1e-3
    g = two_convs()
    w = 8 * 8 * 9 * 4
    a = g.layer("a")
    cm = CostModel(g, flat_devices(4, lat=lat))
    cands = [cfg(a, n=2), cfg(a, n=4), cfg(a, n=2, c=2)]
    _, ts, _ = cm.layer_costs("a", cands)
    assert ts[0] == pytest.approx(2 * w / BW + 1 * lat)
    assert ts[1] == pytest.approx(2 * 3 * w / BW + 2 * lat)
    assert ts[2] == pytest.approx(2 * (w / 2) / BW + 1 * lat)     # two groups of 2, parallel
    ring = CostModel(g, flat_devices(4, lat=lat), sync="ring")
    _, tr, _ = ring.layer_costs("a", cands)
    assert tr[0] == pytest.approx(w / BW + 2 * lat)
    assert tr[1] == pytest.approx(2 * 3 / 4 * w / BW + 6 * lat)
    assert tr[2] == pytest.approx((w / 2) / BW + 2 * lat)         # groups of 2, not 4 devices
    # the general (pairwise) path gives the same numbers
    for model in (cm, ring):
        slow = CostModel(g, flat_devices(4, lat=lat), sync=model.sync)
        slow._nodes = None
        np.testing.assert_allclose(slow.layer_costs("a", cands)[1],
                                   model.layer_costs("a", cands)[1], rtol=1e-12)


def swap_devices(n, lat, msg, add_s, add_bw):
    """A flat graph whose ``meta["swap"]`` is what ``explorer calibrate`` gives local CPU
    workers: the runtime's per-tensor messages and in-place adds are costed."""
    d = flat_devices(n, lat=lat)
    d.meta["swap"] = {"message_s": msg, "add_s": add_s, "add_bw": add_bw}
    return d


def conv_bn():
    """One 3x3 conv with its BatchNorm folded in: three tensors (weight, bn weight and
    bias), as ResNet's layers are imported."""
    g = LayerGraph("toy", 4)
    g.add_layer(Layer("x", "input", (4, 8, 16, 16), ("n", "c", "h", "w")))
    g.add_layer(Layer("a", "conv", (4, 8, 16, 16), ("n", "c", "h", "w"), ((4, 8, 16, 16),),
                      {"weight": (8, 8, 3, 3), "bn.weight": (8,), "bn.bias": (8,)},
                      dict(kernel=(3, 3), stride=(1, 1), padding=(1, 1), dilation=(1, 1),
                           groups=1), flops=2.0 * 4 * 8 * 16 * 16 * 8 * 9))
    g.add_edge(Edge("x", "a", 0))
    return g


def test_swap_sync_costs_one_message_per_tensor_and_the_adds():
    # The runtime's data-parallel sync on gloo (Executor._sync_grads, p2p): after a layer's
    # backward the two replicas post one irecv and one isend per parameter tensor, wait for
    # all, then each adds the other's gradient (g.add_(received)).  Hand-worked for the
    # conv + folded BN (576 + 8 + 8 float32 elements, 3 tensors) on 2 devices:
    #   bytes both ways      2 * 592 * 4 / BW            (as before)
    #   one exchange          lat                        (as before: a 1-message exchange)
    #   2 more messages       2 * msg
    #   3 adds                3 * add_s + 3 passes * 4 B * 592 / add_bw
    lat, msg, add_s, add_bw = 1e-3, 2e-4, 1e-6, 50e9
    g = conv_bn()
    a = g.layer("a")
    cm = CostModel(g, swap_devices(2, lat, msg, add_s, add_bw))
    _, ts, _ = cm.layer_costs("a", [cfg(a), cfg(a, n=2), cfg(a, c=2)])
    el = 576 + 8 + 8
    want = 2 * el * 4 / BW + lat + 2 * msg + 3 * add_s + UPDATE_PASSES * 4 * el / add_bw
    assert ts[0] == 0 and ts[2] == 0                # one device; disjoint shards
    assert ts[1] == pytest.approx(want, rel=1e-12)
    # 4 replicas: the first member receives 3 gradients of each tensor and sends the sum
    # back 3 times (2 exchanges: 18 messages, 2 of them in the latencies), adds 3 times
    cm4 = CostModel(g, swap_devices(4, lat, msg, add_s, add_bw))
    _, t4, _ = cm4.layer_costs("a", [cfg(a, n=4)])
    want4 = 2 * 3 * el * 4 / BW + 2 * lat + 16 * msg + \
        3 * (3 * add_s + UPDATE_PASSES * 4 * el / add_bw)
    assert t4[0] == pytest.approx(want4, rel=1e-12)
    # the vectorised (node-structured) path and the general one agree
    for model in (cm, cm4):
        slow = CostModel(g, model.devices)
        slow._nodes = None
        cands = [cfg(a), cfg(a, n=2), cfg(a, c=2)] if model is cm else [cfg(a, n=4)]
        np.testing.assert_allclose(slow.layer_costs("a", cands)[1],
                                   model.layer_costs("a", cands)[1], rtol=1e-12)
    # without the calibrated figures (presets) nothing changes: the paper's t_S
    plain = CostModel(g, flat_devices(2, lat=lat))
    assert plain.layer_costs("a", [cfg(a, n=2)])[1][0] == pytest.approx(
        2 * el * 4 / BW + lat)


def test_update_is_one_add_per_shard_at_the_calibrated_rate_and_in_the_breakdown():
    # SGD update p.add_(g, alpha=-lr) per shard: 3 calls and 3 passes over 592 elements on
    # each of 2 data-parallel replicas; with the output channels split each device updates
    # its 4 of the 8 channels of all 3 tensors (3 calls, 296 elements)
    lat, msg, add_s, add_bw = 1e-3, 2e-4, 1e-6, 50e9
    g = conv_bn()
    a = g.layer("a")
    cm = CostModel(g, swap_devices(2, lat, msg, add_s, add_bw))
    u = cm.update_costs("a", [cfg(a, n=2), cfg(a, c=2)])
    assert u[0] == pytest.approx(3 * add_s + UPDATE_PASSES * 4 * 592 / add_bw, rel=1e-12)
    assert u[1] == pytest.approx(3 * add_s + UPDATE_PASSES * 4 * 296 / add_bw, rel=1e-12)
    tc, _, _ = cm.layer_costs("a", [cfg(a, n=2)])
    assert tc[0] > u[0]                             # t_C holds it (equation 1 unchanged)
    tables = cm.tables()
    choice = {n: next(i for i, c in enumerate(tables.candidates[n]) if c.deg("n") == 2)
              if n == "a" else 0 for n in tables.names}
    bd = tables.breakdown(choice)
    assert bd["update_s"] == pytest.approx(u[0], rel=1e-12)
    assert bd["total_s"] == pytest.approx(bd["compute_s"] + bd["sync_s"] + bd["reduce_s"]
                                          + bd["transfer_s"])


def test_no_gradient_flows_back_into_the_model_input():
    # x -> a: a needs x's region forward, but nothing goes back (x needs no gradient);
    # a -> b: activations forward and their gradients backward
    lat = 1e-4
    g = two_convs()
    cm = CostModel(g, flat_devices(2, lat=lat))
    x, a, b = g.layer("x"), g.layer("a"), g.layer("b")
    assert not cm.needs_grad("x") and cm.needs_grad("a") and cm.needs_grad("b")
    assert cm.input_grads("a") == (False,) and cm.input_grads("b") == (True,)
    row = 4 * 8 * 1 * 16 * 4                     # one halo row, as in the test above
    t_in, b_in = cm.xfer(g.in_edges("a")[0], [cfg(x, h=2)], [cfg(a, h=2)])
    assert b_in[0, 0] == pytest.approx(2 * row)                   # forward only
    assert t_in[0, 0] == pytest.approx(row / BW + lat)
    t_ab, b_ab = cm.xfer(g.in_edges("b")[0], [cfg(a, h=2)], [cfg(b, h=2)])
    assert b_ab[0, 0] == pytest.approx(2 * 2 * row)
    assert t_ab[0, 0] == pytest.approx(2 * (row / BW + lat))
    # a layer without parameters fed only by the input needs no gradient either
    g2 = LayerGraph("toy", 4)
    g2.add_layer(Layer("x", "input", (4, 8, 16, 16), ("n", "c", "h", "w")))
    g2.add_layer(Layer("p", "pool", (4, 8, 8, 8), ("n", "c", "h", "w"), ((4, 8, 16, 16),), {},
                       dict(kernel=(2, 2), stride=(2, 2), padding=(0, 0), dilation=(1, 1)),
                       flops=4.0 * 4 * 8 * 8 * 8))
    g2.add_layer(Layer("c", "conv", (4, 8, 8, 8), ("n", "c", "h", "w"), ((4, 8, 8, 8),),
                       {"weight": (8, 8, 3, 3)}, dict(kernel=(3, 3), stride=(1, 1),
                       padding=(1, 1), dilation=(1, 1), groups=1), flops=1.0))
    g2.add_edge(Edge("x", "p", 0))
    g2.add_edge(Edge("p", "c", 0))
    cm2 = CostModel(g2, flat_devices(2))
    assert not cm2.needs_grad("p") and cm2.needs_grad("c")
    assert cm2.input_grads("c") == (False,)


def test_sgd_update_is_in_t_compute_of_layers_with_parameters():
    g = two_convs()
    d = flat_devices(2)
    cm = CostModel(g, d)
    a = g.layer("a")
    whole, split = cfg(a), cfg(a, c=2)
    tc, _, _ = cm.layer_costs("a", [whole, split])
    upd = UPDATE_PASSES * 4 * 576 / 100e9
    flops = 3 * a.flops
    assert tc[0] == pytest.approx(flops / (1e12 * EFFICIENCY["conv"]) + LAUNCH_OVERHEAD_S + upd)
    # each device updates its half of the weights
    assert tc[1] == pytest.approx(flops / 2 / (1e12 * EFFICIENCY["conv"]) + LAUNCH_OVERHEAD_S
                                  + upd / 2)


def test_measured_compute_adds_the_update_and_skips_the_input_gradient(tmp_path):
    from explorer.engine.core.profile import Profiler
    g = two_convs()
    d = flat_devices(2)
    cache = tmp_path / "p.sqlite"
    cm = CostModel(g, d, compute="measured", profile_cache=cache)
    a = g.layer("a")
    c = cfg(a)
    tc, _, _ = cm.layer_costs("a", [c])
    with Profiler(cache) as p:
        shard = cm.shard_shapes(a, c)[0]
        t_no_in = p.lookup(a, shard[0], shard[1], "toy", input_grads=(False,))
        assert p.lookup(a, shard[0], shard[1], "toy") is None    # never asked with dx
    upd = UPDATE_PASSES * 4 * 576 / 100e9
    assert t_no_in is not None and tc[0] == pytest.approx(t_no_in + upd)


def test_analytic_compute_is_the_roofline_of_the_shard():
    g = two_convs()
    cm = CostModel(g, flat_devices(4))
    a = g.layer("a")
    tc, _, _ = cm.layer_costs("a", [cfg(a), cfg(a, n=4)])
    # forward + backward = 3x forward FLOPs = 3.54 MFLOP at 60% of 1 TFLOP/s = 5.9 us; memory
    # traffic 3 x 4 B x (8192 input + 576 weight + 8192 output) = 204 KB at 100 GB/s = 2 us:
    # compute bound, plus the fixed launch overhead and the SGD update of the 576 weights
    # (read weights and gradients, write weights: 3 x 2304 B at 100 GB/s).
    flops = 3 * a.flops
    assert flops == 3 * 2 * 4 * 8 * 16 * 16 * 8 * 9
    update = UPDATE_PASSES * 576 * 4 / 100e9
    assert tc[0] == pytest.approx(flops / (1e12 * EFFICIENCY["conv"]) + LAUNCH_OVERHEAD_S
                                  + update)
    assert tc[0] > tc[1] > tc[0] / 8        # 4-way split: about 4x faster, never 8x


@pytest.mark.slow
def test_node_structured_paths_equal_pairwise_paths():
    for model, kw in [("inception_v3", {}), ("transformer", {}), ("lstm", {"steps": 3})]:
        g = import_spec(model, batch=32, model_args=kw)
        for n in (4, 8):
            d = preset("p100-cluster", n)
            fast = CostModel(g, d).tables()
            slow_cm = CostModel(g, d)
            slow_cm._nodes = None                    # force the general, pairwise code
            slow = slow_cm.tables()
            for name in fast.names:
                np.testing.assert_allclose(fast.t_sync[name], slow.t_sync[name], rtol=1e-12)
            for (e1, m1), (e2, m2) in zip(fast.edges, slow.edges):
                np.testing.assert_allclose(m1, m2, rtol=1e-9, atol=1e-15)


def test_layers_that_do_not_fit_are_rejected_with_the_numbers():
    g = two_convs(N=64, C=256, H=64, W=64)
    cm = CostModel(g, flat_devices(2, memory=1e6))
    with pytest.raises(InfeasiblePlan, match="does not fit in device memory"):
        cm.tables()


def test_candidates_that_do_not_fit_are_dropped():
    # 4 devices: the unsplit conv output (4·8·16·16 floats ×2) does not fit in 40 KB, the
    # 4-way split does
    g = two_convs()
    cm = CostModel(g, flat_devices(4, memory=40_000))
    t = cm.tables()
    assert all(c.total > 1 for c in t.candidates["a"])


def test_unknown_modes_raise():
    g = two_convs()
    with pytest.raises(ValueError, match="analytic"):
        CostModel(g, flat_devices(2), compute="guess")
    with pytest.raises(ValueError, match="ring"):
        CostModel(g, flat_devices(2), sync="gossip")


def test_measured_costs_are_cached_so_the_second_search_measures_nothing(tmp_path):
    g = import_spec("lenet5", batch=128)
    d = preset("local", 2)
    cache = tmp_path / "profile.sqlite"
    from explorer.engine.core.profile import Profiler
    first = CostModel(g, d, compute="measured", profile_cache=cache)
    t1 = first.tables()
    with Profiler(cache) as p:
        measured = sorted(p.rows())
    assert measured                                    # the first search measured its shards
    second = CostModel(g, d, compute="measured", profile_cache=cache)
    t2 = second.tables()
    with Profiler(cache) as p:
        assert sorted(p.rows()) == measured            # the second one measured nothing again
    for n in t1.names:
        np.testing.assert_array_equal(t1.t_compute[n], t2.t_compute[n])
    # a measured conv shard split 2 ways is cheaper than the whole layer
    conv = t1.candidates["conv2"]
    whole = next(i for i, c in enumerate(conv) if c.total == 1)
    split = next(i for i, c in enumerate(conv) if c.deg("n") == 2)
    assert t1.t_compute["conv2"][split] < t1.t_compute["conv2"][whole]


def test_measured_compute_of_multi_device_configs_uses_the_lockstep_entry(tmp_path):
    """A configuration on k devices is costed with the time recorded for k workers computing
    at once (explorer calibrate), a single-device one with the shard alone."""
    from explorer.engine.core.profile import Profiler
    g = two_convs()
    d = flat_devices(2)
    cache = tmp_path / "p.sqlite"
    b = g.layer("b")
    whole, split = cfg(b), cfg(b, n=2)
    with Profiler(cache) as p:
        for c, sec in ((whole, 0.010), (split, 0.004)):
            out, ins = CostModel(g, d).shard_shapes(b, c)[0]
            p.record(b, out, ins, "toy", sec)                       # alone
            p.record(b, out, ins, "toy", 2 * sec, concurrency=2)    # two workers at once
        recorded = sorted(p.rows())
    cm = CostModel(g, d, compute="measured", profile_cache=cache)
    tc, _, _ = cm.layer_costs("b", [whole, split])
    upd = UPDATE_PASSES * 4 * 576 / 100e9
    assert tc[0] == pytest.approx(0.010 + upd)
    assert tc[1] == pytest.approx(0.008 + upd)
    with Profiler(cache) as p:
        assert sorted(p.rows()) == recorded            # costed from the cache: nothing measured


@pytest.mark.parametrize("model,n", [("gpt2", 8), ("inception_v3", 16)])
def test_kept_tables_are_the_full_tables_entries(model, n):
    """A baseline's tables between the candidates it keeps are the rows and columns of the
    search's tables: the same node costs, the same transfer times and bytes."""
    g = import_spec(model, batch=32)
    cm = CostModel(g, preset("p100-cluster", n), degrees="pow2")
    full = cm.tables()
    rng = np.random.default_rng(n)
    keep = {nm: sorted(rng.choice(len(full.candidates[nm]),
                                  size=min(3, len(full.candidates[nm])), replace=False).tolist())
            for nm in full.names if rng.random() < 0.8}      # a layer not named keeps all
    part = CostModel(g, preset("p100-cluster", n), degrees="pow2").kept_tables(keep)
    idx = {nm: keep.get(nm, list(range(len(full.candidates[nm])))) for nm in full.names}
    for nm in full.names:
        assert part.candidates[nm] == [full.candidates[nm][i] for i in idx[nm]]
        assert np.array_equal(part.node_cost(nm), full.node_cost(nm)[idx[nm]])
        assert np.array_equal(part.memory[nm], full.memory[nm][idx[nm]])
    assert len(part.edges) == len(full.edges)
    for (e1, m1), (e2, m2), b1, b2 in zip(full.edges, part.edges, full.bytes_xfer,
                                          part.bytes_xfer):
        assert (e1.src, e1.dst, e1.index) == (e2.src, e2.dst, e2.index)
        ix = np.ix_(idx[e1.src], idx[e1.dst])
        np.testing.assert_allclose(m2, m1[ix], rtol=1e-12, atol=1e-18)
        np.testing.assert_allclose(b2, b1[ix], rtol=1e-12)

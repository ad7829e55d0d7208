"""Cost tables at scale: the fast tables equal a straightforward reference, degrees beyond 16
devices, the estimate made before building, and a request too big for the machine refused
in one line."""

import os
import subprocess
import sys

import numpy as np
import pytest

from explorer.engine.core import geometry as G
from explorer.engine.layerwise.costmodel import CostModel
from explorer.engine.core.devices import Device, DeviceGraph, preset
from explorer.engine.core.importer import import_spec
from explorer.engine.search import Problem, run
from explorer.engine.layerwise.optcnn import _min_plus
from explorer.errors import InfeasiblePlan

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# -- a straightforward reference: one configuration pair and one device pair at a time ------

def ref_xfer(cm: CostModel, edge, cs: G.Config, cd: G.Config):
    """Equation of :meth:`CostModel.xfer` for one pair, device by device, any links."""
    g, d = cm.graph, cm.devices
    src, dst = g.layer(edge.src), g.layer(edge.dst)
    own = G.output_boxes(src, cs)
    tiles, red = G.compute_boxes(dst, cd)
    need = G.edge_regions(g, edge, tiles, red)
    worst, moved = 0.0, 0.0
    for k, dv in enumerate(cd.devices):
        t, lat = 0.0, 0.0
        for s, sv in enumerate(cs.devices):
            if sv == dv:
                continue
            v = float(G.overlap(own[s], need[k])) * cm.dtype_bytes
            if v > 0:
                t += v / d.bw[sv, dv]
                lat = max(lat, float(d.latency[sv, dv]))
                moved += v
        worst = max(worst, t + lat)
    passes = 2.0 if cm.needs_grad(edge.src) else 1.0
    return passes * worst, passes * moved


def ref_sync(cm: CostModel, layer, cfg: G.Config) -> float:
    """t_S of one configuration from :func:`geometry.shard_summary`'s replica groups."""
    _, _, groups = G.shard_summary(layer, cfg)
    load, rmax = {}, 0
    for elems, members in groups:
        r = len(members)
        if r < 2 or elems == 0:
            continue
        rmax = max(rmax, r)
        devs = [cfg.devices[m] for m in members]
        bw = float(cm.devices.bw[np.ix_(devs, devs)].min())
        s = elems * cm.dtype_bytes
        cost = 2.0 * (r - 1) * s / bw if cm.sync == "ps" else 2.0 * (r - 1) / r * s / bw
        load[devs[0]] = load.get(devs[0], 0.0) + cost
    if not load:
        return 0.0
    steps = (1 if rmax == 2 else 2) if cm.sync == "ps" else 2 * (rmax - 1)
    lat = float(cm.devices.latency[np.ix_(cfg.devices, cfg.devices)].max())
    return max(load.values()) + steps * lat


def check_against_reference(cm: CostModel, pairs_per_edge: int = 40, seed: int = 0):
    rng = np.random.default_rng(seed)
    t = cm.tables()
    for (e, m), nb in zip(t.edges, t.bytes_xfer):
        cs, cd = t.candidates[e.src], t.candidates[e.dst]
        idx = [(i, j) for i in range(len(cs)) for j in range(len(cd))]
        for p in rng.permutation(len(idx))[:pairs_per_edge]:
            i, j = idx[p]
            want_t, want_b = ref_xfer(cm, e, cs[i], cd[j])
            assert nb[i, j] == want_b, (e, cs[i].key(), cd[j].key())
            assert m[i, j] == pytest.approx(want_t, rel=1e-12, abs=1e-18), (e, cs[i].key(),
                                                                            cd[j].key())
    for n in t.names:
        layer = cm.graph.layer(n)
        for i, c in enumerate(t.candidates[n]):
            assert t.t_sync[n][i] == pytest.approx(ref_sync(cm, layer, c), rel=1e-12,
                                                   abs=1e-18), (n, c.key())
        for i, c in enumerate(t.candidates[n]):
            k = c.deg(G.REDUCE)
            if k == 1:
                continue
            tiles, _ = G.compute_boxes(layer, c)
            want = 0.0
            for members in G.reduce_groups(c):
                devs = [c.devices[x] for x in members]
                s = float(G.volume(tiles[members[0]])) * cm.dtype_bytes
                bw = float(cm.devices.bw[np.ix_(devs, devs)].min())
                lat = float(cm.devices.latency[np.ix_(devs, devs)].max())
                want = max(want, (2.0 if cm.needs_grad(n) else 1.0)
                           * ((k - 1) / k * s / bw + (k - 1) * lat))
            assert t.t_reduce[n][i] == pytest.approx(want, rel=1e-12), (n, c.key())
    return t


@pytest.mark.slow
@pytest.mark.parametrize("model,n,pre", [("lenet5", 16, "p100-cluster"),
                                         ("resnet50", 8, "p100-cluster"),
                                         ("inception_v3", 4, "p100-nvlink-4"),
                                         ("transformer", 8, "k80-pcie-8"),
                                         ("lstm", 4, "p100-cluster")])
def test_tables_equal_the_reference(model, n, pre):
    g = import_spec(model)
    check_against_reference(CostModel(g, preset(pre, n)))


def test_tables_equal_the_reference_on_irregular_links_and_pins():
    # links that are not two-level take the pairwise path; a pin gives other device orders
    from explorer.engine.core.pins import Pin
    n = 6
    rng = np.random.default_rng(3)
    bw = rng.uniform(5e9, 50e9, (n, n))
    bw = (bw + bw.T) / 2
    np.fill_diagonal(bw, np.inf)
    lat = rng.uniform(1e-6, 9e-6, (n, n))
    np.fill_diagonal(lat, 0.0)
    devs = [Device(f"d{i}", "toy", 10e12, 500e9, 16e9, i // 2) for i in range(n)]
    g = import_spec("lenet5")
    cm = CostModel(g, DeviceGraph("irregular", devs, bw, lat), sync="ring")
    t = check_against_reference(cm)
    cm2 = CostModel(g, preset("p100-cluster", 8))
    pins = [Pin.parse("conv2=@5,2"), Pin.parse("fc1=@7,6,1,0")]
    t2 = cm2.tables(pins)
    assert [c.devices for c in t2.candidates["fc1"]][0] == (7, 6, 1, 0)
    for (e, m), nb in zip(t2.edges, t2.bytes_xfer):
        for i, cs in enumerate(t2.candidates[e.src][:6]):
            for j, cd in enumerate(t2.candidates[e.dst][:6]):
                want_t, want_b = ref_xfer(cm2, e, cs, cd)
                assert nb[i, j] == want_b
                assert m[i, j] == pytest.approx(want_t, rel=1e-12, abs=1e-18)
    assert t.estimate["candidates_max"] == max(len(c) for c in t.candidates.values())


def test_layer_costs_by_total_degree_equal_all_at_once():
    g = import_spec("resnet50")
    grouped = CostModel(g, preset("p100-cluster", 64))
    grouped.GROUP_ROWS = 0
    whole = CostModel(g, preset("p100-cluster", 64))
    whole.GROUP_ROWS = 10 ** 12
    for name in g.names()[:20]:
        cs = grouped.candidates(name)
        for a, b in zip(grouped.layer_costs(name, cs), whole.layer_costs(name, cs)):
            assert np.array_equal(a, b), name


def test_replica_groups_sorted_by_one_integer_equal_the_lexicographic_sort():
    g = import_spec("gpt2")
    coded, lex = (CostModel(g, preset("p100-cluster", 64), degrees="pow2") for _ in range(2))
    lex._slot_code = lambda ci, C, flat: None          # the multi-key sort throughout
    ci = np.array([2, 0, 2, 0, 1])
    flat = np.array([[5, 7, 1], [5, 9, 3], [5, 7, 0], [5, 9, 3], [5, 8, -4]])  # column 0 fixed
    code = coded._slot_code(ci, 3, flat)
    keys = np.column_stack([ci, flat[:, 1:]])
    assert np.array_equal(np.argsort(code, kind="stable"), np.lexsort(keys.T[::-1]))
    assert coded._slot_code(ci, 3, np.array([[0, 2**40]] * 4 + [[2**40, 0]])) is None
    for name in g.names():
        for a, b in zip(coded.layer_costs(name, coded.candidates(name)),
                        lex.layer_costs(name, lex.candidates(name))):
            assert np.array_equal(a, b), name


def test_min_plus_matches_the_cubic_temporary_with_ties():
    rng = np.random.default_rng(1)
    a = np.round(rng.random((9, 7)), 1)
    b = np.round(rng.random((7, 5)), 1)       # rounding makes ties
    m, arg = _min_plus(a, b)
    tot = a[:, :, None] + b[None]
    assert np.array_equal(m, tot.min(axis=1)) and np.array_equal(arg, tot.argmin(axis=1))


def test_min_plus_in_many_blocks_with_ties_and_infinities(monkeypatch):
    import explorer.engine.layerwise.optcnn as oc
    rng = np.random.default_rng(2)
    a = np.round(rng.random((23, 17)), 1)
    b = np.round(rng.random((17, 11)), 1)
    a[3, :] = np.inf                         # a row with no finite choice: argmin 0
    b[:, 4] = np.inf
    a[5, 2] = np.inf
    want = None
    for block in (1, 17 * 11 * 3, 1 << 20):  # one row per block, a few rows, all at once
        monkeypatch.setattr(oc, "MIN_PLUS_BLOCK", block)
        m, arg = _min_plus(a, b)
        tot = a[:, :, None] + b[None]
        assert np.array_equal(m, tot.min(axis=1)) and np.array_equal(arg, tot.argmin(axis=1))
        want = want or (m, arg)
        assert np.array_equal(m, want[0]) and np.array_equal(arg, want[1])


@pytest.mark.parametrize("block", [1, 40, 1 << 20])
def test_min_plus_skipping_useless_middle_candidates_changes_nothing(monkeypatch, block):
    import explorer.engine.layerwise.optcnn as oc
    rng = np.random.default_rng(3)
    # transfer-like tables: cheap near the diagonal, costly far from it, with ties
    i = np.arange(40)
    a = np.round(np.abs(i[:, None] - i[None, :30]) * 0.3 + rng.random((40, 30)), 1)
    b = np.round(np.abs(i[:30, None] - i[None, :25]) * 0.3 + rng.random((30, 25)), 1)
    keep, _ = oc._useful_middle(a, b)
    assert not keep.all() and keep.any(axis=1).all()    # it does skip some, never a whole row
    monkeypatch.setattr(oc, "MIN_PLUS_PRUNE", 0)
    monkeypatch.setattr(oc, "MIN_PLUS_BLOCK", block)
    m, arg = _min_plus(a, b)
    tot = a[:, :, None] + b[None]
    assert np.array_equal(m, tot.min(axis=1)) and np.array_equal(arg, tot.argmin(axis=1))
    a[2, 3] = np.inf                                  # not finite: no skipping, same answer
    assert oc._useful_middle(a, b) is None
    m, arg = _min_plus(a, b)
    tot = a[:, :, None] + b[None]
    assert np.array_equal(m, tot.min(axis=1)) and np.array_equal(arg, tot.argmin(axis=1))


def test_compiled_min_plus_equals_numpy_with_ties(monkeypatch):
    import explorer.engine.layerwise.optcnn as oc
    rng = np.random.default_rng(4)
    i = np.arange(60)
    a = np.round(np.abs(i[:, None] - i[None, :45]) * 0.3 + rng.random((60, 45)), 1)
    b = np.round(np.abs(i[:45, None] - i[None, :35]) * 0.3 + rng.random((45, 35)), 1)
    monkeypatch.setattr(oc, "MIN_PLUS_PRUNE", 0)
    want = _min_plus(a, b)                              # numpy, useful columns only
    monkeypatch.setattr(oc, "MIN_PLUS_JIT", 0)
    m, arg = _min_plus(a, b)
    tot = a[:, :, None] + b[None]
    assert np.array_equal(m, tot.min(axis=1)) and np.array_equal(arg, tot.argmin(axis=1))
    assert np.array_equal(m, want[0]) and np.array_equal(arg, want[1])


def test_compiled_pruning_of_the_middle_candidates_equals_numpy(monkeypatch):
    # the fused, compiled test of which middle candidates can attain a row's minimum keeps
    # exactly what the numpy passes keep (and so the min-plus answers are the same)
    import explorer.engine.layerwise.optcnn as oc
    rng = np.random.default_rng(7)
    i = np.arange(70)
    a = np.round(np.abs(i[:, None] - i[None, :50]) * 0.3 + rng.random((70, 50)), 1)
    b = np.round(np.abs(i[:50, None] - i[None, :40]) * 0.3 + rng.random((50, 40)), 1)
    monkeypatch.setattr(oc, "MIN_PLUS_JIT", 1 << 62)
    k0, r0 = oc._useful_middle(a, b)
    monkeypatch.setattr(oc, "MIN_PLUS_JIT", 0)
    k1, r1 = oc._useful_middle(a, b)
    assert 0 < k0.sum() < k0.size
    assert np.array_equal(k0, k1) and np.array_equal(r0, r1)


@pytest.mark.slow
def test_by_node_transfer_tables_do_not_depend_on_the_block_size():
    g = import_spec("resnet50")
    small, large, per_k = (CostModel(g, preset("p100-cluster", 16)) for _ in range(3))
    small.NODE_BLOCK, large.NODE_BLOCK = 64, 1 << 22
    per_k.PAD_LIMIT = 0       # one kernel call per device count, not all padded at once
    assert small._node_structure() is not None          # the two-level kernel is used
    ts, tl, tk = small.tables(), large.tables(), per_k.tables()
    for (e, ms), (_, ml), (_, mk), bs, bl, bk in zip(ts.edges, tl.edges, tk.edges,
                                                     ts.bytes_xfer, tl.bytes_xfer,
                                                     tk.bytes_xfer):
        assert np.array_equal(ms, ml) and np.array_equal(bs, bl), (e.src, e.dst)
        assert np.array_equal(ms, mk) and np.array_equal(bs, bk), (e.src, e.dst)


@pytest.mark.slow
@pytest.mark.parametrize("model,n,pre,degrees,pins", [
    ("resnet50", 32, "p100-cluster", "pow2", ()),                  # two-level, 8 nodes
    ("resnet50", 16, "p100-cluster", "auto",
     ("layer1_0_conv1=@5,2", "layer1_0_conv2=@7,6,1,0", "conv1=@9,8")),  # pinned devices
    ("gpt2", 64, "p100-cluster", "pow2", ()),                      # row-parallel (k) layers
    ("inception_v3", 16, "p100-ib-16", "auto", ()),
    ("resnet50", 4, "p100-nvlink-4", "auto", ("conv1=@3,1",)),     # one node: single level
    ("transformer", 8, "k80-pcie-8", "auto", ()),
])
def test_compiled_transfer_kernel_equals_the_numpy_kernel(model, n, pre, degrees, pins):
    # every by-node table through the compiled kernel (JIT_WORK 0) and through numpy
    from explorer.engine.core.pins import Pin
    g = import_spec(model)
    jit, ref = (CostModel(g, preset(pre, n), degrees=degrees) for _ in range(2))
    jit.JIT_WORK, ref.JIT_WORK = 0, 1 << 62
    jit.PAD_LIMIT = 0           # (small unpinned edges would take the padded numpy call)
    assert jit._node_structure() is not None
    pins = [Pin.parse(p) for p in pins]
    tj, tr = jit.tables(pins), ref.tables(pins)
    for (e, mj), (_, mr), bj, br in zip(tj.edges, tr.edges, tj.bytes_xfer, tr.bytes_xfer):
        assert np.array_equal(mj, mr) and np.array_equal(bj, br), (e.src, e.dst)
    if pins:       # pinned candidates (other device orders) against the reference too
        for (e, m), nb in zip(tj.edges, tj.bytes_xfer):
            if {e.src, e.dst} & {p.layer for p in pins}:
                for i, cs in enumerate(tj.candidates[e.src][:5]):
                    for j, cd in enumerate(tj.candidates[e.dst][:5]):
                        want_t, want_b = ref_xfer(jit, e, cs, cd)
                        assert nb[i, j] == want_b
                        assert m[i, j] == pytest.approx(want_t, rel=1e-12, abs=1e-18)


def test_a_search_with_enough_transfer_work_runs_its_edges_compiled(monkeypatch):
    # the search-wide rule: above JIT_SEARCH kernel elements every edge above JIT_EDGE goes
    # through the compiled kernel (loaded once), and the tables are the numpy path's
    from explorer.engine.layerwise import xkernel
    g = import_spec("mlp")
    calls = []
    real = xkernel.by_node
    monkeypatch.setattr(xkernel, "by_node", lambda *a: calls.append(1) or real(*a))
    jit, ref = (CostModel(g, preset("p100-cluster", 8), degrees="pow2") for _ in range(2))
    jit.PAD_LIMIT = ref.PAD_LIMIT = 0
    jit.JIT_SEARCH, jit.JIT_EDGE = 0.0, 0
    ref.JIT_SEARCH = float("inf")
    est = ref.estimate()
    assert est["xfer_work"] > 0
    tr = ref.tables()
    assert not calls
    tj = jit.tables()
    assert calls
    for (e, mj), (_, mr), bj, br in zip(tj.edges, tr.edges, tj.bytes_xfer, tr.bytes_xfer):
        assert np.array_equal(mj, mr) and np.array_equal(bj, br), (e.src, e.dst)


def test_kernel_cache_is_shared_by_every_home_unless_numba_cache_dir_is_set(monkeypatch, tmp_path):
    from explorer.engine.core.storage import kernel_cache
    monkeypatch.delenv("NUMBA_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("EXPLORER_HOME", str(tmp_path / "home-a"))
    assert kernel_cache() == str(tmp_path / "cache" / "plan-explorer" / "numba")
    monkeypatch.setenv("EXPLORER_HOME", str(tmp_path / "home-b"))
    assert kernel_cache() == str(tmp_path / "cache" / "plan-explorer" / "numba")
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path / "mine"))
    assert kernel_cache() == str(tmp_path / "mine")


@pytest.mark.slow
def test_tables_built_on_two_threads_equal_one_thread(monkeypatch):
    import explorer.engine.layerwise.costmodel as cmod
    g = import_spec("inception_v3")
    one, two = (CostModel(g, preset("p100-cluster", 64), degrees="pow2") for _ in range(2))
    two.JIT_WORK = 1 << 16              # some edges through the compiled kernel as well
    monkeypatch.setattr(cmod, "THREAD_WORK", 1e12)
    t1 = one.tables()
    monkeypatch.setattr(cmod, "THREAD_WORK", 0)
    t2 = two.tables()
    assert t1.names == t2.names
    for n in t1.names:
        assert t1.candidates[n] == t2.candidates[n]
        for a, b in ((t1.t_compute, t2.t_compute), (t1.t_sync, t2.t_sync),
                     (t1.memory, t2.memory)):
            assert np.array_equal(a[n], b[n]), n
    for (e, m1), (_, m2), b1, b2 in zip(t1.edges, t2.edges, t1.bytes_xfer, t2.bytes_xfer):
        assert np.array_equal(m1, m2) and np.array_equal(b1, b2), (e.src, e.dst)


# -- degrees --------------------------------------------------------------------------------

def test_degree_values():
    assert G.degree_values("auto", 16) == (1, 2, 4, 8, 16)
    assert G.degree_values("auto", 12) == (1, 2, 3, 4, 6, 12)
    assert G.degree_values("auto", 48) == (1, 2, 4, 8, 16)
    assert G.degree_values("divisors", 48)[-3:] == (16, 24, 48)
    assert G.degree_values("4, 16", 64) == (1, 4, 16)
    assert G.degree_values([2, 8], 64) == (1, 2, 8)
    with pytest.raises(ValueError, match="degree 3 does not divide the 64 devices"):
        G.degree_values("1,3", 64)
    with pytest.raises(ValueError, match="'x' is not an integer"):
        G.degree_values("2,x", 64)
    with pytest.raises(ValueError, match="degree 0 does not divide"):
        G.degree_values([0], 8)


def test_up_to_16_devices_every_divisor_so_plans_do_not_change():
    g = import_spec("lenet5")
    for n in (6, 12, 16):
        cm = CostModel(g, preset("p100-cluster", n))
        for name in g.names():
            assert cm.candidates(name) == G.enumerate_configs(g.layer(name), n)


def test_beyond_16_devices_powers_of_two_bounded_by_the_dimension():
    g = import_spec("lenet5")
    cm = CostModel(g, preset("p100-cluster", 48))
    assert cm.degrees == (1, 2, 4, 8, 16)
    for name in g.names():
        layer = g.layer(name)
        for c in cm.candidates(name):
            for letter, v in c.degrees:
                assert v in cm.degrees and v <= (layer.size(letter) if letter != G.REDUCE
                                                 else G.reduction_size(layer))
    # a pin is the user's explicit choice: any divisor
    from explorer.engine.core.pins import Pin
    assert CostModel(g, preset("p100-cluster", 48)).candidates(
        "fc1", Pin.parse("fc1=c=3"))[0].deg("c") == 3
    # explicit sets are honoured and validated
    assert CostModel(g, preset("p100-cluster", 64), degrees="1,8,64").degrees == (1, 8, 64)
    with pytest.raises(ValueError, match="does not divide the 64 devices"):
        CostModel(g, preset("p100-cluster", 64), degrees="1,6")


@pytest.mark.slow
def test_auto_degrees_are_powers_of_two_unless_those_would_be_refused():
    from explorer.engine.layerwise.costmodel import AUTO_WORK, MAX_WORK
    pow2 = tuple(2 ** i for i in range(11))
    for model in ("resnet50", "inception_v3"):
        cm = CostModel(import_spec(model), preset("p100-cluster", 1024))
        assert cm.degrees == pow2
        assert cm.estimate()["work"] <= AUTO_WORK <= MAX_WORK
    g = import_spec("inception_v3")
    cm = CostModel(g, preset("p100-cluster", 4096))     # powers of two would be refused
    assert cm.degrees == (1, 4, 16, 64, 256, 1024, 4096)
    full = CostModel(g, preset("p100-cluster", 4096), degrees="pow2").estimate()
    assert cm.estimate()["work"] <= AUTO_WORK < full["work"]
    assert cm.estimate()["candidates_max"] < full["candidates_max"]


@pytest.mark.parametrize("n", [4, 8])
def test_objectives_at_small_counts_equal_exhaustive(n):
    g = import_spec("lenet5")
    d = preset("p100-cluster", n)
    fast = run("optcnn", Problem.of(g, d, CostModel(g, d)))
    slow = run("exhaustive", Problem.of(g, d, CostModel(g, d)),
               options={"max_space": 10 ** 12})
    assert fast.objective_s == pytest.approx(slow.objective_s, rel=1e-12)


# -- the estimate and the refusal -------------------------------------------------------------

def test_estimate_is_what_gets_built():
    g = import_spec("resnet50")
    cm = CostModel(g, preset("p100-cluster", 32))
    est = cm.estimate()
    t = cm.tables()
    sizes = [len(t.candidates[n]) for n in t.names]
    assert est["candidates_max"] == max(sizes)
    assert est["candidates_mean"] == pytest.approx(np.mean(sizes))
    # edges of repeated blocks share one table: distinct arrays are what memory holds
    arrays = {id(a): a for (_, m), nb in zip(t.edges, t.bytes_xfer) for a in (m, nb)}
    # (the estimate shares tables by edge signature; building also shares those whose
    # regions turn out equal, so it is an upper bound below the every-edge count)
    built = sum(a.nbytes for a in arrays.values())
    every = sum(m.nbytes + nb.nbytes for (_, m), nb in zip(t.edges, t.bytes_xfer))
    assert len(arrays) < 2 * len(t.edges)     # ResNet's bottlenecks repeat
    assert built <= est["table_bytes"] < every
    assert t.estimate == est


def test_estimate_counts_the_tables_of_repeated_blocks_once():
    from explorer.engine.layerwise.costmodel import MAX_WORK
    g = import_spec("gpt2")
    cm = CostModel(g, preset("p100-cluster", 1024), degrees="pow2")
    est = cm.estimate()
    tok = {n: cm._ckey(cm.candidates(n)) for n in g.names()}
    distinct = cm._distinct_edges(tok)
    assert len(distinct) < len(g.edges()) / 3          # 12 transformer blocks share tables
    every = sum(float(len(cm.candidates(e.src))) * float(cm._cinfo(cm.candidates(e.dst))[0]
                                                         .sum()) for e in g.edges())
    assert est["work"] < every
    assert est["work"] <= MAX_WORK                     # so this search is not refused


def test_too_little_memory_is_refused_before_building(monkeypatch):
    import psutil

    class Mem:
        available = 64 * 2 ** 20

    monkeypatch.setattr(psutil, "virtual_memory", lambda: Mem())
    g = import_spec("resnet50")
    cm = CostModel(g, preset("p100-cluster", 64))
    built = []
    monkeypatch.setattr(cm, "layer_costs", lambda *a: built.append(a))
    with pytest.raises(InfeasiblePlan, match=r"GiB at peak .* but 0\.1 GiB is available"):
        cm.tables()
    assert not built


@pytest.mark.multiprocess
def test_cli_refuses_a_search_too_big_in_one_line():
    env = dict(os.environ, PYTHONPATH=ROOT)
    proc = subprocess.run([sys.executable, "-m", "explorer", "search", "resnet50", "--devices",
                           "4096", "--degrees", "pow2"], capture_output=True, text=True,
                          timeout=600, env=env, cwd=ROOT)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr
    assert "candidates per layer" in lines[0] and "work" in lines[0]
    assert "--degrees 1,4,16,64,256,1024,4096" in lines[0]


def test_service_request_carries_the_degrees():
    from explorer import service
    req = service.Request(model="lenet5", preset="p100-cluster", devices=32, degrees=[4, 16])
    assert req.degrees == "4,16"
    res = service.run_method(req, "optcnn")
    assert res.info["degrees"] == [1, 4, 16]
    assert all(v in (1, 4, 16) for la in res.plan.layers for _, v in la.config.degrees)
    with pytest.raises(ValueError, match="degree 5 does not divide the 32 devices"):
        service.Request(model="lenet5", devices=32, degrees="5")


@pytest.mark.slow
@pytest.mark.parametrize("model,n,degrees", [("gpt2", 64, "pow2"), ("inception_v3", 48, None)])
def test_stacked_boxes_equal_each_configuration_alone(model, n, degrees):
    """The stacked tiles, reduction ranges and owned boxes (digits computed once per
    distinct (stride, degree) pair, then gathered) equal each configuration's own boxes;
    padding rows are empty."""
    g = import_spec(model)
    cm = CostModel(g, preset("p100-cluster", n), **({"degrees": degrees} if degrees else {}))
    seen_k = 0
    for name in g.names():
        layer = g.layer(name)
        cands = cm.candidates(name)
        tiles, red, owned, used = G.stacked_boxes(layer, cands)
        for i, c in enumerate(cands):
            t, r = G.compute_boxes(layer, c)
            assert np.array_equal(tiles[i, : c.total], t), (name, c)
            assert np.array_equal(owned[i, : c.total], G.output_boxes(layer, c)), (name, c)
            assert used[i, : c.total].all() and not used[i, c.total:].any()
            assert not owned[i, c.total:].any() and not tiles[i, c.total:].any()
            if r is not None:
                seen_k += 1
                assert np.array_equal(red[i, : c.total], r), (name, c)
    assert seen_k > 0 or model != "gpt2"


@pytest.mark.parametrize("model,n,degrees", [("resnet50", 32, "pow2"), ("gpt2", 64, "pow2"),
                                             ("inception_v3", 16, None)])
def test_node_side_per_axis_equals_the_source_side_of_the_node_tiles(model, n, degrees):
    """What the compiled kernel reads of a source layout, built per axis from the stacked
    boxes, equals :func:`xkernel.source_side` of the ``[Cs, N, nd, 2]`` node tiles (the
    numpy kernel's input), array for array, dtype included."""
    from explorer.engine.layerwise import xkernel
    g = import_spec(model)
    cm = CostModel(g, preset("p100-cluster", n), **({"degrees": degrees} if degrees else {}))
    node_of = cm._node_structure()[0]
    for name in g.names():
        layer, cands = g.layer(name), cm.candidates(name)
        tiles = cm._node_tiles(layer, cands, node_of)
        side = cm._node_side(layer, cands, node_of)
        assert (tiles is None) == (side is None), name
        if tiles is None:
            continue
        want = xkernel.source_side(*tiles, node_of, layer.out_shape)
        for a, b in zip(side, want):
            assert a.dtype == b.dtype and np.array_equal(a, b), name


def test_node_side_refuses_node_tiles_that_are_not_a_box():
    """A node whose tiles do not form a box (here: a device of node 0 left out) is refused
    by both builders (the pairwise kernel is used then)."""
    g = import_spec("resnet50")
    cm = CostModel(g, preset("p100-cluster", 8))
    node_of = cm._node_structure()[0]
    layer = g.layer("conv1")
    cands = [c for c in cm.candidates("conv1") if c.deg("h") == 4 and c.total == 4]
    bad = cands[:1]
    assert cm._node_side(layer, bad, node_of) is not None
    tiles, _, owned, used = G.stacked_boxes(layer, bad)
    owned = owned.copy()
    owned[0, 1] = 0                                        # device 1 owns nothing: a hole
    cm._tile_cache.clear()
    cm._stack_cache[cm._layout_key(layer, bad)] = (tiles, None, owned, used)
    lt, lr, lo, ci, sl = G.stacked_live(layer, bad)          # the used rows alike
    lo = lo.copy()
    lo[1] = 0
    cm._live_cache[cm._layout_key(layer, bad)] = (lt, lr, lo, ci, sl)
    assert cm._node_tiles(layer, bad, node_of) is None
    assert cm._node_side(layer, bad, node_of) is None


@pytest.mark.parametrize("model,n,degrees", [("gpt2", 16, "pow2"), ("inception_v3", 48, None),
                                             ("moe", 8, None)])
def test_stacked_live_rows_equal_the_used_rows_of_the_padded_boxes(model, n, degrees):
    """:func:`.geometry.stacked_live` (no padding) gives, row for row, the used slots of
    :func:`.geometry.stacked_boxes` - tiles, reduction ranges (row-parallel layers) and
    owned boxes - in candidate-major order."""
    g = import_spec(model)
    cm = CostModel(g, preset("p100-cluster", n), degrees=degrees)
    reduced = 0
    for name in g.names():
        layer, cands = g.layer(name), cm.candidates(name)
        tiles, red, owned, used = G.stacked_boxes(layer, cands)
        lt, lr, lo, ci, sl = G.stacked_live(layer, cands)
        assert np.array_equal(np.stack([ci, sl]), np.stack(np.nonzero(used))), name
        assert np.array_equal(lt, tiles[ci, sl]) and np.array_equal(lo, owned[ci, sl]), name
        assert (lr is None) == (red is None), name
        if red is not None:
            reduced += 1
            assert np.array_equal(lr, red[ci, sl]), name
    assert reduced or model == "inception_v3"     # row-parallel layers were covered


def test_regions_per_axis_round_trip_and_hide_unused_slots():
    from explorer.engine.layerwise.costmodel import _aos_regions, _soa_regions
    rng = np.random.default_rng(0)
    need = np.sort(rng.integers(0, 50, (5, 7, 3, 2)), axis=-1)
    live = rng.random((5, 7)) < 0.7
    lo, hi = _soa_regions(need, live)
    assert lo.dtype == hi.dtype == np.int32 and lo.shape == (5, 3, 7)
    assert np.array_equal(_aos_regions((lo, hi)), need * live[:, :, None, None])


def test_enumerated_configurations_equal_checked_ones():
    """Configurations made without the per-device checks equal checked ones (same degrees
    order, devices, hash), and a caller's devices are still checked."""
    g = import_spec("gpt2")
    for name in g.names()[:20]:
        for c in G.enumerate_configs(g.layer(name), 64, degrees=G.degree_values("pow2", 64)):
            ref = G.Config(c.degrees, list(c.devices))
            assert ref == c and hash(ref) == hash(c) and ref.degrees == c.degrees
    with pytest.raises(ValueError, match="repeat a device"):
        G.enumerate_configs(g.layer(g.names()[1]), 4, devices=(0, 0, 1, 2))


@pytest.mark.parametrize("model,n", [("gpt2", 64), ("inception_v3", 32), ("resnet50", 16)])
def test_edge_regions_over_live_slots_equal_the_padded_ones(model, n):
    """An edge's needed regions computed over the live slots only and scattered equal the
    regions of every padded slot, masked (row-parallel consumers, view transforms and
    concatenations included)."""
    from explorer.engine.layerwise.costmodel import _soa_regions
    from explorer.engine.layerwise.xkernel import coord_dtype
    g = import_spec(model)
    cm = CostModel(g, preset("p100-cluster", n), degrees="pow2")
    sparse = 0
    for e in g.edges():
        dst, cands = g.layer(e.dst), cm.candidates(e.dst)
        boxes, red, _ = cm._stacked_compute(dst, cands)
        live = cm._cinfo(cands)[1] >= 0
        want = _soa_regions(G.edge_regions(g, e, boxes, red), live,
                            coord_dtype(g.layer(e.src).out_shape))
        got = cm._edge_need(e, dst, cands, live)
        sparse += live.sum() <= 0.75 * live.size
        for a, b in zip(got, want):
            assert a.dtype == b.dtype and np.array_equal(a, b), (e.src, e.dst)
    assert sparse > 0                     # the live-slot path was taken

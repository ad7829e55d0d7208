"""Issue 28, search speed and output: micro-batch graphs rebatched from one capture (checked
against real captures), repeated blocks reduced once, the pipeline's configuration bound,
the λ schedule, and what ``explorer search`` prints for constrained and pipelined plans."""

from __future__ import annotations

import re
import sys

import numpy as np
import pytest

from explorer.engine.core.capture_cache import layer_graph
from explorer.engine.layerwise import stages
from explorer.engine.layerwise.memory import MemorySettings
from explorer.engine.layerwise.pipeline import step_bound
from explorer.engine.layerwise.rebatch import rebatch
from explorer.engine.search import Problem, Request, run

sys.path.insert(0, __file__.rpartition("/")[0])
from _helpers import explorer_cli  # noqa: E402

TINY = dict(layers=2, hidden=64, heads=4, kv_heads=2, intermediate=128, seq_len=16, vocab=100)


def _same(a, b) -> str | None:
    """``None`` when two layer graphs are equal (layers, order, edges and their views)."""
    if a.batch != b.batch or a.names() != b.names():
        return "names or batch"
    for n in a.names():
        if a.layer(n).to_dict() != b.layer(n).to_dict():
            return f"layer {n}"
    ea = sorted((e.src, e.dst, e.index, repr(e.transforms)) for e in a.edges())
    eb = sorted((e.src, e.dst, e.index, repr(e.transforms)) for e in b.edges())
    return None if ea == eb else "edges"


# -- rebatching against real captures ------------------------------------------------------

@pytest.mark.parametrize("args", [
    dict(TINY),                                          # grouped-query, expand
    dict(TINY, repeat_kv="interleave"),
    dict(TINY, kv_heads=1, tie_embeddings=True),
])
def test_rebatched_llama_equals_its_capture(args):
    full = layer_graph("llama", 6, dict(args))
    for b in (1, 2, 3):
        got = rebatch(full, b)
        assert got is not None
        assert _same(got, layer_graph("llama", b, dict(args))) is None
    assert full.batch == 6 and full.layer("tokens").out_shape[0] == 6      # not modified


@pytest.mark.slow
def test_rebatched_examples_equal_their_captures():
    """Every example model (small sizes) at two micro-batch sizes."""
    import example_models
    for name, args in example_models.SMALL.items():
        full = layer_graph(name, 6, dict(args))
        for b in (2, 3):
            got = rebatch(full, b)
            assert got is not None, name
            assert _same(got, layer_graph(name, b, dict(args))) is None, name


def test_rebatch_to_a_size_that_does_not_divide_the_batch():
    """Batch 6 to 4: every batch-carrying size is a multiple of 6, so it still scales."""
    full = layer_graph("llama", 6, dict(TINY))
    assert _same(rebatch(full, 4), layer_graph("llama", 4, dict(TINY))) is None


def test_rebatch_refuses_what_it_cannot_follow():
    """A slice along the samples cannot be rebatched (the caller captures instead)."""
    g = layer_graph("mlp", 4, {"hidden": 16, "layers": 1})
    e = next(iter(g.edges()))
    g2 = rebatch(g, 2)
    assert g2 is not None
    e.transforms = (("slice", 0, 1),) + tuple(e.transforms)     # a slice of the samples
    try:
        assert rebatch(g, 2) is None
    finally:
        e.transforms = tuple(e.transforms[1:])


# -- repeated blocks, bound, λ ---------------------------------------------------------------

def test_repeated_blocks_are_reduced_once():
    """Blocks that differ only by their parameters' names share one segment reduction."""
    p = Problem(Request("llama", 8, dict(TINY, layers=6), preset="h100-cluster", devices=4))
    cm = p.cost_model()
    ev = stages.Evaluator(cm, cm.tables(), MemorySettings("adam"), 1e30)
    assert len(ev.chain.segments) >= 12
    assert len(set(ev.seg_keys)) <= 6
    e = ev.evaluate(0.0)
    assert set(e.choice) == set(cm.tables().names)


def test_pipeline_bound_is_below_every_configuration_it_tries():
    """The configuration bound never exceeds the step time the search finds for it, and a
    skipped configuration's bound is at least the plan returned."""
    p = Problem(Request("llama", 8, dict(TINY), preset="h100-cluster", devices=4,
                        dtype="bf16"))
    res = run("pipeline", p, options=dict(optimizer="adam"))
    tried = res.info["tried"]
    assert tried and all("bound_s" in t for t in tried if "error" not in t)
    for t in tried:
        if t.get("time_s") is not None:
            assert t["bound_s"] <= t["time_s"] * (1 + 1e-9)
        if t.get("skipped") and "memory_bound_bytes" not in t:
            assert t["bound_s"] >= res.objective_s * (1 - 1e-9)
    settings = MemorySettings("adam")
    assert step_bound(p, 2, 4, settings, {}) > 0


def test_configurations_whose_memory_bound_is_over_the_limit_are_costed_only_if_none_fits(
        monkeypatch):
    """A stage/micro-batch count whose least memory (:func:`memory_bound`) exceeds the limit
    holds no fitting plan: the search skips it once a plan fits, and finds what it finds
    when it costs every configuration; under a limit nothing meets, it is costed (the
    least-memory plan is reported)."""
    from explorer.engine.layerwise import pipeline as PL

    def search(limit, bound=None):
        if bound is not None:             # every configuration costed: no bound skips one
            monkeypatch.setattr(PL, "memory_bound", bound)
            monkeypatch.setattr(PL, "dual_bound", bound)
        p = Problem(Request("llama", 8, dict(TINY), preset="h100-cluster", devices=4,
                            dtype="bf16"))
        return run("pipeline", p, options=dict(optimizer="adam", memory_limit_gib=limit))
    limit = 0.6 / 1024                                  # 0.6 MiB: one stage needs ≥ 0.64
    res = search(limit)
    skipped = [t for t in res.info["tried"] if "memory_bound_bytes" in t]
    assert [(t["stages"], t["micro_batches"]) for t in skipped] == [(1, 1)]
    assert skipped[0]["memory_bound_bytes"] > limit * 2**30
    assert "over the" in skipped[0]["skipped"] and res.fits_memory
    every = search(limit, lambda *a: 0.0)
    assert every.objective_s == res.objective_s and every.plan.layers == res.plan.layers
    costed = {(t["stages"], t["micro_batches"]): t for t in every.info["tried"]}
    assert costed[(1, 1)]["time_s"] is None                 # it held no fitting plan
    assert costed[(1, 1)]["peak_bytes"] >= skipped[0]["memory_bound_bytes"]
    monkeypatch.undo()
    none = search(1e-9)
    assert not none.fits_memory
    assert not any("memory_bound_bytes" in t for t in none.info["tried"])


def test_nothing_fits_is_found_in_few_multipliers():
    """Under an impossible limit the search stops once λ has the least-memory plan."""
    p = Problem(Request("llama", 8, dict(TINY), preset="h100-cluster", devices=2))
    res = run("optcnn", p, options=dict(memory_limit_gib=1e-6, optimizer="adam"))
    assert not res.fits_memory
    assert res.info["memory"]["lambdas"] <= 25
    assert "smallest footprint" in res.info["memory"]["why"]


# -- what explorer search prints -------------------------------------------------------------

def _peak(p) -> float:
    return max(run("optcnn", p, options=dict(optimizer="adam")).memory_per_device_bytes)


@pytest.mark.multiprocess
@pytest.mark.slow
def test_cli_says_what_a_constrained_plan_minimises():
    args = dict(TINY)
    p = Problem(Request("llama", 8, dict(args), preset="h100-cluster", devices=4))
    limit = 0.6 * _peak(p) / 2**30
    base = ["search", "llama", "-b", 8, "-n", 4, "--preset", "h100-cluster", "--algo",
            "optcnn", "--opt", "optimizer=adam"]
    for k, v in args.items():
        base += ["-a", f"{k}={v}"]
    out = explorer_cli(*base, "--opt", f"memory_limit_gib={limit:.6f}")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert not any(line.startswith("objective (eq. 1)") for line in lines)
    head = next(line for line in lines if line.startswith("objective:"))
    assert re.search(r"objective: fastest step time found under [0-9.]+ GiB per device "
                     r"\(memory-constrained search, optcnn\): [0-9.]+ ms", head), head
    assert any(line.strip().startswith("= per micro-batch") and "once per step" in line
               for line in lines)
    assert any(line.strip().startswith("lower bound") and "gap" in line for line in lines)
    assert any(line.startswith("memory on device") for line in lines)

    plain = explorer_cli(*base)
    assert plain.returncode == 0, plain.stderr
    assert any(line.startswith("objective (eq. 1)") for line in plain.stdout.splitlines())


@pytest.mark.multiprocess
@pytest.mark.slow
def test_cli_shows_the_pipeline_stage_by_stage():
    cmd = ["search", "llama", "-b", 8, "-n", 4, "--preset", "h100-cluster", "--algo",
           "pipeline", "--opt", "stages=2", "--opt", "micro_batches=4",
           "--opt", "optimizer=adam"]
    for k, v in TINY.items():
        cmd += ["-a", f"{k}={v}"]
    out = explorer_cli(*cmd)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert any(line.startswith("objective: fastest pipelined step time found under")
               for line in lines)
    assert any("(4 − 1) × slowest stage" in line for line in lines)
    assert any(line.startswith("pipeline: 2 stages × 2 devices, 4 micro-batches of 2 "
                               "(schedule 1f1b), bubble 20.0 %") for line in lines)
    stage_lines = [line.strip() for line in lines if line.strip().startswith("stage ")]
    assert [s.split(":")[0] for s in stage_lines] == ["stage 0", "stage 1"]
    for s, line in enumerate(stage_lines):
        assert f"on devices {2 * s}-{2 * s + 1}" in line
        assert "ms per micro-batch" in line and "once per step" in line
        assert re.search(r"memory on device \d \(GiB\): params [0-9.]+, grads [0-9.]+, "
                         r"optimizer [0-9.]+, activations [0-9.]+, transient [0-9.]+", line)
    assert "2 micro-batches in flight" in stage_lines[0]
    assert "1 micro-batches in flight" in stage_lines[1]
    assert np.isfinite(float(re.search(r"\): ([0-9.]+) ms", next(
        line for line in lines if line.startswith("objective:"))).group(1)))


def test_outer_dp_equals_brute_force_over_stage_splits():
    """The vectorised outer DP (slowest stage minimised, each stage's memory within the cap)
    against every split of a small chain into S stages."""
    import itertools
    import math

    class _Ev:                      # what _outer_dp reads of an Evaluator
        pass

    rng = np.random.default_rng(3)
    for trial in range(30):
        K, S = int(rng.integers(3, 8)), int(rng.integers(2, 4))
        if S > K:
            continue
        ev = _Ev()
        ev.boundary = list(rng.uniform(0, 0.2, K + 1))
        ev.cap = float(rng.uniform(2.0, 6.0))
        ev.S, ev.M, ev.schedule = S, 2 * S, "1f1b"
        ev.inflight = lambda s, ev=ev: float(min(ev.S - s, ev.M))
        best = {}
        best_q = np.full((4, K + 1, K + 1), np.nan)    # as _ranges gives it: [i + 1, j]
        for i in [-1] + list(range(1, K)):
            for j in range((i + 1) if i >= 0 else 1, K + 1):
                best[(i, j)] = (0.0, list(rng.uniform(0, 1, 4)))
                best_q[:, i + 1, j] = best[(i, j)][1]
        W = float(ev.M + S - 1)
        back = stages.Evaluator._outer_dp(ev, best_q, K, S, W, True)

        def cost(i, j, s):
            A, B, Ms, Ma = best[(i, j)][1]
            A = A + (ev.boundary[j] if j < K else 0.0)
            return W * A + B, Ms + ev.inflight(s) * Ma

        brute = math.inf
        for cuts in itertools.combinations(range(1, K), S - 1):
            ends = list(cuts) + [K]
            starts = [-1] + list(cuts)
            vals = [cost(i, j, s) for s, (i, j) in enumerate(zip(starts, ends))]
            if all(m <= ev.cap for _, m in vals):
                brute = min(brute, max(c for c, _ in vals))
        if not math.isfinite(brute):
            assert back is None
            continue
        assert back is not None
        j, got, ranges = K, [], []
        for s in range(S, 0, -1):
            i = int(back[s][j])
            ranges.append((i, j))
            j = i
        assert j == -1
        vals = [cost(i, j, s) for s, (i, j) in enumerate(reversed(ranges))]
        assert all(m <= ev.cap for _, m in vals)
        assert max(c for c, _ in vals) == pytest.approx(brute, rel=1e-12)


def test_objective_lines_only_for_memory_aware_plans():
    """Equation 1's plan keeps its own summary; a constrained plan and a baseline layout say
    what they are."""
    p = Problem(Request("llama", 8, dict(TINY), preset="h100-cluster", devices=2))
    plain = run("optcnn", p, options=dict(optimizer="adam"))
    assert plain.plan.objective_lines() is None
    peak = max(plain.memory_per_device_bytes)
    tight = run("optcnn", p, options=dict(optimizer="adam",
                                          memory_limit_gib=0.6 * peak / 2**30))
    lines = tight.plan.objective_lines()
    assert lines[0].startswith("objective: fastest step time found under")
    fsdp = run("fsdp", p)
    assert fsdp.plan.objective_lines()[0].startswith("objective: step time of the fsdp layout")


def test_repeated_chain_tells_transformers_from_cnns():
    """The chain search goes first on repeated blocks only; other graphs keep Algorithm 1
    first (and the constrained search's plan of a fitting request is Algorithm 1's)."""
    llama = Problem(Request("llama", 8, dict(TINY, layers=6), preset="h100-cluster",
                            devices=4)).cost_model().tables()
    vgg = Problem(Request("vgg16", 8, {"image_size": 32, "num_classes": 10, "fc": 32},
                          preset="h100-cluster", devices=2)).cost_model().tables()
    assert stages.repeated_chain(llama)
    assert not stages.repeated_chain(vgg)


@pytest.mark.slow
def test_compiled_stage_ranges_equal_the_numpy_ranges_bit_for_bit(monkeypatch):
    """The stage ranges (every stage start × end, with its tracked sums) from the compiled
    kernel are the numpy path's numbers exactly, NaN where no stage is, for one stage and
    for every start, on a 12-block Llama at two multipliers."""
    from explorer.engine.layerwise import pipeline as P
    pr = Problem(Request("llama", 64, dict(layers=12, hidden=256, heads=8, kv_heads=2,
                                           intermediate=512, vocab=1000, seq_len=64),
                         preset="h100-cluster", devices=16))
    opt = P.PipelineOptions()
    cm, tables, bw, lat = P._stage_setup(pr, 4, 16, {})
    ev = stages.Evaluator(cm, tables, opt.settings(), 80 * 2 ** 30, 4, 16, "1f1b", bw, lat)
    K = len(ev.chain.segments)
    from explorer.engine.layerwise.xkernel import shift_agreement
    shifted = []
    real = shift_agreement
    monkeypatch.setattr("explorer.engine.layerwise.xkernel.shift_agreement",
                        lambda *a: shifted.append(real(*a)) or shifted[-1])
    for lam, share in ((0.0, False), (3e-10, False), (3e-10, True)):
        unary, parts, _ = ev._parts(lam)
        reduced = [stages._reduce(seg, tables, dict(unary), ev.weight, parts)
                   for seg in ev.chain.segments]
        if share:         # as evaluate() does: identical blocks share one reduction, so the
            one = {}      # kernel copies the stages of repeated blocks instead of computing
            reduced = [one.setdefault(k, r) for k, r in zip(ev.seg_keys, reduced)]
        for every in (True, False):
            monkeypatch.setattr(stages.Evaluator, "JIT_RANGES", 10 ** 18)
            monkeypatch.setattr("explorer.engine.layerwise.xkernel._RANGES", None)
            v0, q0 = ev._ranges(K, every, unary, parts, reduced)
            monkeypatch.setattr(stages.Evaluator, "JIT_RANGES", 0)
            v1, q1 = ev._ranges(K, every, unary, parts, reduced)
            assert np.array_equal(v0, v1, equal_nan=True)
            assert np.array_equal(q0, q1, equal_nan=True)
            assert np.isfinite(v0[0, 1:]).all()
            assert np.isfinite(v0[2:, -1]).all() == every
            base, lcp, _, nh = shifted[-1]
            assert (lcp.max() >= K // 2 and nh >= 1) == share, shifted[-1]


def test_the_memory_priced_bound_is_below_every_fitting_plan_it_bounds(monkeypatch):
    """Under a limit that binds, :func:`dual_bound` (and :func:`step_bound`) of each
    stage/micro-batch count is at most the step of the fitting plan the search finds for it,
    and above the plain bound where fitting costs time (so counts are skipped that the plain
    bound would cost)."""
    from explorer.engine.layerwise import pipeline as PL
    p = Problem(Request("llama", 8, dict(TINY), preset="h100-cluster", devices=4,
                        dtype="bf16"))
    free = run("pipeline", p, options=dict(optimizer="adam"))
    limit = 0.2 * max(free.memory_per_device_bytes) / 2**30     # one stage must save memory
    seen = {}
    real, realw = PL.dual_bound, PL._weighted_bound

    def record(problem, S, M, *a, **k):
        if k or len(a) > 4:                          # the weighted bounds' own calls
            return real(problem, S, M, *a, **k)
        seen[(S, M)] = (max(real(problem, S, M, *a),
                            realw(problem, S, M, *a, np.inf) if S > 1 else 0.0),
                        PL.step_bound(problem, S, M, a[0], a[1]))
        return 0.0                                   # cost every count
    monkeypatch.setattr(PL, "dual_bound", record)
    monkeypatch.setattr(PL, "_weighted_bound", lambda *a: 0.0)
    monkeypatch.setattr(PL, "memory_bound", lambda *a: 0.0)
    p = Problem(Request("llama", 8, dict(TINY), preset="h100-cluster", devices=4,
                        dtype="bf16"))
    res = run("pipeline", p, options=dict(optimizer="adam", memory_limit_gib=limit))
    assert res.fits_memory
    fitted = [t for t in res.info["tried"] if t.get("time_s") is not None]
    assert fitted
    for t in fitted:
        dual, plain = seen[(t["stages"], t["micro_batches"])]
        assert max(dual, plain) <= t["time_s"] * (1 + 1e-9)
    dual, plain = seen[(1, 1)]             # one stage: the plain bound is the layers' mean
    assert dual > plain * (1 + 1e-6)


def test_the_partition_bound_by_hand(monkeypatch):
    """Three segments of 1, 1 and 4 (per micro-batch) over two stages, 4 micro-batches: the
    best split is {1, 1} | {4}, so the step is at least 6 + 3·4 = 18 (the mean would say
    6 + 3·3 = 15), plus the once-per-step times' share."""
    from types import SimpleNamespace

    from explorer.engine.layerwise import pipeline as PL
    from explorer.engine.layerwise.stages import Chain, Segment

    cuts = ["x0", "c1", "c2", "c3"]
    chain = Chain(cuts, [Segment("x0", "c1", ["a"], []), Segment("c1", "c2", [], []),
                         Segment("c2", "c3", ["b"], [])])
    t = {"x0": 0.0, "a": 1.0, "c1": 0.0, "c2": 1.0, "b": 3.0, "c3": 1.0}
    opts = {n: SimpleNamespace(t_mb=np.array([[v, v + 5]]), t_once=np.array([[0.5, 0.0]]))
            for n, v in t.items()}
    monkeypatch.setattr(Chain, "of", classmethod(lambda cls, g: chain))
    got = PL._partition_bound(None, {n: n for n in t}, opts, 2, 4)
    # a: [1, 1, 4]; u (least once-per-step, 0 per layer): 0
    assert got == pytest.approx(6 + 3 * 4 + 0.0)


def test_the_compiled_split_gives_the_bound_numpy_gives(monkeypatch):
    """The memory-priced bound's split of segments into stages, compiled
    (:func:`.xkernel.split_dp_kernel`, used once a large search has loaded it), gives the
    numpy loop's bounds to the bit, for every stage/micro-batch count and weighting."""
    pytest.importorskip("numba")
    from explorer.engine.layerwise import pipeline as PL, xkernel
    from explorer.engine.layerwise.stages import Chain
    from explorer.engine.search.options import PipelineOptions

    p = Problem(Request("llama", 64, dict(TINY), preset="h100-cluster", devices=32,
                        dtype="bf16"))
    settings = PipelineOptions(optimizer="adam").settings()
    cap = 200e3                     # 200 kB: binds (μ is bisected), every count fits
    K = len(Chain.of(p.layer_graph()).segments)

    def bounds(compiled):
        monkeypatch.setattr(xkernel, "split_dp_loaded", lambda: compiled)
        how, out = {}, []
        for S in (2, 4):
            for M in (2 * S, 4 * S):
                PL.step_bound(p, S, M, settings, how)
                out.append(PL.dual_bound(p, S, M, settings, how, "1f1b", cap))
                out.append(PL._weighted_bound(p, S, M, settings, how, "1f1b", cap, np.inf))
        return out
    assert K >= 4
    plain, compiled = bounds(False), bounds(True)
    assert compiled == plain
    assert all(np.isfinite(b) and b > 0 for b in plain)

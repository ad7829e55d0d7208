"""Issue 28, runs: layer-wise plans with per-layer recomputation and ZeRO-1/2/3 on 2 workers
against one device, and the live memory the runtime measures by category (recomputation
lowering it on a hand-worked example)."""

from __future__ import annotations

import copy

import pytest

from explorer import service as session
from explorer.engine.runtime import launch_many

pytestmark = [pytest.mark.slow, pytest.mark.multiprocess]

MLP = {"hidden": 16, "layers": 2}
GPT2 = {"layers": 1, "hidden": 16, "heads": 2, "seq_len": 8, "vocab": 20}
#: the hand-worked plan: body_0 splits the samples, body_2 the features (it fetches the
#: whole batch), head the samples again (it fetches body_2's columns)
MIXED = ["body_0=n=2", "body_2=c=2", "head=n=2"]


def _plan(model, args, algo="optcnn", pins=None, batch=8, **flags):
    """A searched plan for 2 local workers, with ``flags`` (layer -> {recompute, zero})
    set by hand (``"*"``: every layer but the input)."""
    req = session.Request(model=model, preset="local", devices=2, batch=batch, algo=algo,
                          model_args=dict(args))
    doc = session.search(req, pins)
    doc.pop("trace", None)
    doc = copy.deepcopy(doc)
    for la in doc["layers"]:
        want = flags.get(la["name"], flags.get("*")) if la["op"] != "input" else None
        if want is not None:
            la.pop("recompute", None)
            la.pop("zero", None)
            la.update({k: v for k, v in want.items() if v})
    return doc


CASES = {
    # every layer recomputed, sample- and feature-split layers (the fetched regions kept)
    "mlp-recompute": lambda: _plan("mlp", MLP, pins=MIXED, **{"*": {"recompute": True}}),
    # a row-parallel (k) layer recomputed: its reduce-scatter runs again in the backward
    "mlp-recompute-k": lambda: _plan("mlp", MLP, pins=["body_0=n=2", "body_2=k=2",
                                                       "head=n=2"],
                                     **{"*": {"recompute": True}}),
    "mlp-zero1": lambda: _plan("mlp", MLP, "data", **{"*": {"zero": 1}}),
    "mlp-zero2": lambda: _plan("mlp", MLP, "data", **{"*": {"zero": 2}}),
    "mlp-zero3": lambda: _plan("mlp", MLP, "data", **{"*": {"zero": 3}}),
    # the fsdp baseline as searched: ZeRO-3 and recomputation on every layer
    "gpt2-fsdp": lambda: _plan("gpt2", GPT2, "fsdp", batch=4),
    "lenet5-zero2-recompute": lambda: _plan("lenet5", {}, "data",
                                            **{"*": {"zero": 2, "recompute": True}}),
    # the hand-worked plan, plain and with body_0 and body_2 recomputed
    "mixed-plain": lambda: _plan("mlp", MLP, pins=MIXED),
    "mixed-recompute": lambda: _plan("mlp", MLP, pins=MIXED, body_0={"recompute": True},
                                     body_2={"recompute": True}),
}


@pytest.fixture(scope="module")
def runs():
    """Every case's plan and result, from one launch of 2 workers."""
    plans = {k: make() for k, make in CASES.items()}
    results = launch_many(list(plans.values()), steps=1, warmup=0, timeout_s=600,
                          store=False)
    return {k: (p, r) for (k, p), r in zip(plans.items(), results)}


@pytest.mark.parametrize("case", list(CASES))
def test_matches_one_device(runs, case):
    plan, res = runs[case]
    ref = res["reference"]
    assert res["reference_ok"], (case, ref["worst_grad"], ref["max_grad_rel_err"],
                                 ref["worst_param"], ref["max_param_rel_err"],
                                 ref["problems"])
    assert ref["loss_rel_err"] < 1e-5
    flags = {(bool(la.get("recompute")), int(la.get("zero", 0))) for la in plan["layers"]}
    assert flags != {(False, 0)} or case == "mixed-plain"


def test_zero_shards_parameters_and_gradients(runs):
    """Measured on each worker (bytes; fp32): the MLP's 714 parameters (2,856 B) stay whole
    under ZeRO-1/2 and are halved under ZeRO-3; ZeRO-3 gathers one layer's weights at a
    time (transient).  Gradients: the runtime updates each layer right after its backward,
    so at most one layer's whole gradient (body_0/2: 272 elements, 1,088 B) is alive."""
    mem = {k: runs[k][1]["measured_memory_by_category"] for k in
           ("mlp-zero1", "mlp-zero2", "mlp-zero3")}
    for k in ("mlp-zero1", "mlp-zero2"):
        assert mem[k]["params"] == [2856, 2856]
        assert mem[k]["transient"] == [0, 0]
    assert mem["mlp-zero3"]["params"] == [1428, 1428]
    assert mem["mlp-zero3"]["transient"] == [1088, 1088]
    for m in mem.values():
        assert m["grads"] == [1088, 1088]
        assert m["optimizer"] == [0, 0]          # the runtime's SGD keeps no momentum
    pred = runs["gpt2-fsdp"][1]["predicted_memory_by_category"]
    got = runs["gpt2-fsdp"][1]["measured_memory_by_category"]
    assert got["params"] == [int(v) for v in pred["params"]]     # ZeRO-3: P / 2 each


def test_recomputation_lowers_activations_by_hand(runs):
    """The hand-worked plan on each worker (batch 8, hidden 16, fp32: a 4 × 16 tile is
    256 B).  At the end of the forward pass the plain plan holds my box of the input (256),
    body_0's output (256, saved by its ReLU), body_2's fetched input (the whole batch: 512)
    and output (8 × 8: 256), head's fetched input (256), its output (4 × 10: 160) and the
    loss gradient (160): 1,856 B.  Recomputing body_0 and body_2 drops their outputs once
    their consumers have fetched them (256 + 256): 1,344 B; they keep only their input
    regions (body_0's is a view of the input).  The cost model predicts a saving of
    2 · vol per recomputed layer (output and its gradient, 512 B each), an upper bound."""
    plain = runs["mixed-plain"][1]
    rc = runs["mixed-recompute"][1]
    assert [m["activations"] for m in plain["measured_memory_forward_end"]] == [1856, 1856]
    assert [m["activations"] for m in rc["measured_memory_forward_end"]] == [1344, 1344]
    # the cost model's activations of the same two plans: 1,024 B less per worker
    pred = {k: _predicted_activations(runs[k][0]) for k in ("mixed-plain", "mixed-recompute")}
    assert [a - b for a, b in zip(pred["mixed-plain"], pred["mixed-recompute"])] == [1024, 1024]
    # over the whole step too: the recomputed output is a transient of its backward
    for w in range(2):
        assert rc["measured_memory_by_category"]["activations"][w] < \
            plain["measured_memory_by_category"]["activations"][w]
        assert rc["measured_memory_by_category"]["peak"][w] < \
            plain["measured_memory_by_category"]["peak"][w]
        assert rc["measured_memory_by_category"]["transient"][w] > 0


def _predicted_activations(doc) -> list:
    """The cost model's activation bytes per device for the plan document ``doc``
    (:func:`explorer.engine.layerwise.memory.plan_memory`, its options as the plan sets them)."""
    from explorer.engine.core import geometry as G
    from explorer.engine.layerwise.memory import MemorySettings, plan_memory
    from explorer.engine.search import Problem, Request
    cm = Problem(Request("mlp", doc["batch"], MLP, preset="local", devices=2)).cost_model()
    tables = cm.tables()
    settings = MemorySettings()
    choice, option = {}, {}
    for la in doc["layers"]:
        cfg = G.Config(tuple(la["config"].items()), tuple(la["devices"]))
        choice[la["name"]] = tables.candidates[la["name"]].index(cfg)
        option[la["name"]] = settings.options().index((bool(la.get("recompute")),
                                                      int(la.get("zero", 0))))
    return plan_memory(cm, tables, choice, option, settings, 2)["activations"]


def test_report_shows_predicted_beside_measured(runs):
    from explorer.engine.runtime.report import format_report
    text = format_report(runs["gpt2-fsdp"][1])
    line = next(ln for ln in text.splitlines() if ln.startswith("memory on worker 0"))
    for cat in ("params", "grads", "optimizer", "activations", "transient", "peak"):
        assert cat in line


def test_zero_with_allreduce_collectives():
    """``--sync allreduce``: the ZeRO reduce-scatter and all-gather as all-reduces on the
    replica group's process group; the same step as one device."""
    plans = [CASES["mlp-zero2"](), CASES["mlp-zero3"]()]
    results = launch_many(plans, steps=1, warmup=0, timeout_s=300, store=False,
                          sync="allreduce")
    assert all(r["reference_ok"] and r["sync"] == "allreduce" for r in results)


def test_explorer_run_executes_a_zero3_recomputed_plan(tmp_path, capsys):
    """`explorer run` of the fsdp baseline's plan (ZeRO-3, every layer recomputed): no
    refusal, the reference check passes, memory measured beside predicted per worker."""
    from explorer.cli import main
    plan = tmp_path / "fsdp.json"
    assert main(["search", "mlp", "-n", "2", "--preset", "local", "--algo", "fsdp", "-a",
                 "hidden=16", "-a", "layers=2", "-b", "8", "-o", str(plan)]) == 0
    capsys.readouterr()
    assert main(["run", str(plan), "--steps", "1", "--warmup", "0"]) == 0
    out = capsys.readouterr().out
    assert "reference check: OK" in out
    mem = [ln for ln in out.splitlines() if ln.startswith("memory on worker")]
    assert len(mem) == 2 and "measured / predicted" in mem[0] and "params 1.4 / 1.4" in mem[0]


def test_four_workers_replica_subgroups_and_uneven_slices():
    """4 workers: LeNet-5 data-parallel under ZeRO-3 (groups of 4; shards whose size 4 does
    not divide: uneven slices), and a mixed plan (n×h, c×w, c4, n×c) under ZeRO-2 with
    recomputation (replica groups of 2 among the 4, each with its own slices)."""
    def plan(algo, pins, flags):
        req = session.Request(model="lenet5", preset="local", devices=4, batch=8, algo=algo)
        doc = session.search(req, pins)
        doc.pop("trace", None)
        for la in doc["layers"]:
            if la["op"] != "input":
                la.update(flags)
        return doc
    plans = [plan("data", None, {"zero": 3}),
             plan("optcnn", ["conv1=n=2,h=2", "pool1=c=2,w=2", "conv2=c=4", "fc1=n=2,c=2",
                             "fc2=n=2,c=2", "fc3=n=4"], {"zero": 2, "recompute": True})]
    with pytest.warns(RuntimeWarning, match="4 CPU workers"):
        results = launch_many(plans, steps=1, warmup=0, timeout_s=300, store=False)
    for r in results:
        assert r["reference_ok"], (r["reference"]["worst_grad"],
                                   r["reference"]["max_grad_rel_err"])
    params = results[0]["measured_memory_by_category"]["params"]
    assert len(set(params)) == 2 and sum(params) == 177704     # all 44,426 weights: uneven

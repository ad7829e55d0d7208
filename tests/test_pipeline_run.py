"""Issue 28, runs: pipelined layer-wise plans (stages on disjoint groups of workers,
micro-batches along the batch, GPipe's order) executed on local workers and checked against
one device; the pipelines the runtime refuses, in one line before any worker starts."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from example_models import SMALL
from explorer.engine.core.plandoc import seal
from explorer.engine.layerwise.plan import unsupported
from explorer.engine.runtime import launch_many
from explorer.engine.search import Problem, Request, run

MLP = {"hidden": 16, "layers": 1}
#: a convolution, BatchNorm and a linear head (tests/_pipeline_models.py)
BN_MODEL = f"{Path(__file__).parent / '_pipeline_models.py'}:conv_bn"


def _pipeline(model, batch, devices, stages, micro, schedule="gpipe", algo="pipeline",
              **opts) -> dict:
    """A searched pipelined plan's sealed document (SMALL arguments of ``model``)."""
    p = Problem(Request(model, batch, dict(SMALL.get(model, {})), preset="p100-nvlink-4",
                        devices=devices))
    if algo == "pipeline":
        opts = dict(stages=stages, micro_batches=micro, schedule=schedule, **opts)
    res = run(algo, p, options=opts)
    pipe = res.plan.pipeline
    assert pipe["stages"] == stages and pipe["micro_batches"] == micro
    return res.document()


def _within_stages(doc: dict) -> dict:
    """``doc`` with every layer that has a sample axis split over its stage's whole group
    (``n`` = the group's size: data parallelism inside each stage), resealed."""
    doc = copy.deepcopy(doc)
    G = doc["pipeline"]["devices_per_stage"]
    for la in doc["layers"]:
        s = int(la.get("stage", 0))
        if "n" in la["config"]:
            la["config"] = {k: (G if k == "n" else 1) for k in la["config"]}
            la["devices"] = list(range(s * G, (s + 1) * G))
        else:
            la["devices"] = [s * G]
    return _reseal(doc)


def _reseal(doc: dict) -> dict:
    doc = {k: v for k, v in doc.items() if k != "checksum"}
    return seal(doc, "layerwise")


def _hand(micro: int, batch: int = 4, schedule: str = "gpipe") -> dict:
    """The hand-built plan: the MLP (x [B, 16] -> body_0 linear+ReLU 16 -> head linear 10)
    in two stages, x and body_0 on worker 0, head on worker 1, ``micro`` micro-batches."""
    p = Problem(Request("mlp", batch, MLP, preset="p100-nvlink-4", devices=2))
    doc = copy.deepcopy(run("optcnn", p).document())
    for la in doc["layers"]:
        s = 1 if la["name"] == "head" else 0
        la["config"] = {k: 1 for k in la["config"]}
        la["devices"] = [s]
        la.pop("stage", None)
        if s:
            la["stage"] = s
    doc["pipeline"] = {"stages": 2, "micro_batches": micro, "schedule": schedule,
                       "devices_per_stage": 1, "micro_batch": batch // micro,
                       "bubble_fraction": 1 / (micro + 1),
                       "stage_layers": [["x", "body_0", 2], ["head", "head", 1]],
                       "stage_time_per_microbatch_s": [1e-4, 1e-4],
                       "stage_time_once_s": [0.0, 0.0]}
    return _reseal(doc)


# -- the pipelines the runtime refuses (no worker) -----------------------------------------

def _edited(doc, **pipe) -> dict:
    doc = copy.deepcopy(doc)
    doc["pipeline"].update(pipe)
    return doc


@pytest.mark.parametrize("edit, words", [
    (dict(stages=4, devices_per_stage=1), "4 pipeline stages but 2 devices: more stages than "
                                          "workers"),
    (dict(micro_batches=3), "3 micro-batches do not divide the batch 4"),
    (dict(micro_batch=1), "micro-batch 1 is not the batch 4 over 2 micro-batches"),
    (dict(schedule="interleaved"), "pipeline schedule 'interleaved'"),
    (dict(devices_per_stage=2), "2 pipeline stages x 2 devices per stage do not cover its 2"),
])
def test_unsupported_names_a_bad_pipeline(edit, words):
    why = unsupported(_edited(_hand(2), **edit))
    assert why and words in why and "\n" not in why


def test_unsupported_layer_outside_its_stage():
    doc = copy.deepcopy(_hand(2))
    head = next(la for la in doc["layers"] if la["name"] == "head")
    head["devices"] = [0]
    assert "layer head of stage 1 runs on devices [0] outside its stage's group 1-1" in \
        unsupported(doc)
    assert unsupported(_hand(2)) is None and unsupported(_hand(1)) is None


def test_explorer_run_refuses_a_bad_pipeline_in_one_line(tmp_path, capsys):
    """Exit 2, one line, before any worker (the document is resealed after the edit)."""
    from explorer.cli import main
    from explorer.engine.core.plandoc import dumps
    path = tmp_path / "plan.json"
    path.write_text(dumps(_reseal(_edited(_hand(2), micro_batches=3)), indent=1))
    assert main(["run", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "3 micro-batches do not divide the batch 4" in err[0]


def test_launcher_refuses_a_bad_pipeline():
    from explorer.errors import InfeasiblePlan
    with pytest.raises(InfeasiblePlan, match="more stages than workers"):
        launch_many([_edited(_hand(2), stages=4, devices_per_stage=1)], steps=1, warmup=0)


# -- runs against one device ---------------------------------------------------------------

TWO = {
    # 2 stages x 1 worker, GPipe over 2 micro-batches
    "llama-gpipe-m2": lambda: _pipeline("llama", 4, 2, 2, 2),
    # 1F1B: stage 0 runs one forward ahead, then forwards and backwards in turn
    "gpt2-1f1b-m4": lambda: _pipeline("gpt2", 8, 2, 2, 4, schedule="1f1b"),
    "transformer-m2": lambda: _pipeline("transformer", 4, 2, 2, 2),
    "mlp-m4": lambda: _pipeline("mlp", 8, 2, 2, 4),
    # BatchNorm: the layer-wise runs compute it with its running statistics (the reference
    # too), so a micro-batch's samples are normalised as the whole batch's are
    "conv-bn-m2": lambda: _pipeline(BN_MODEL, 4, 2, 2, 2),
    "hand-m1": lambda: _hand(1),
    "hand-m2": lambda: _hand(2),
    "hand-gpipe-m4": lambda: _hand(4, batch=8),
    "hand-1f1b-m4": lambda: _hand(4, batch=8, schedule="1f1b"),
}
FOUR = {
    # 2 stages x 2 workers: Megatron's tensor parallelism inside each stage, recomputation
    "llama-megatron3d-m2": lambda: _pipeline("llama", 4, 4, 2, 2, algo="megatron-3d", tp=2,
                                             pp=2, micro_batches=2),
    # 2 stages x 2 workers, data parallelism inside each stage, 4 micro-batches of 2
    "gpt2-2x2-m4": lambda: _within_stages(_pipeline("gpt2", 8, 4, 2, 4)),
}


def _launch(cases: dict) -> dict:
    plans = {k: make() for k, make in cases.items()}
    results = launch_many(list(plans.values()), steps=1, warmup=0, timeout_s=600,
                          store=False)
    return {k: (p, r) for (k, p), r in zip(plans.items(), results)}


@pytest.fixture(scope="module")
def two():
    """Every 2-worker case's plan and result, from one launch."""
    return _launch(TWO)


@pytest.fixture(scope="module")
def four():
    """Every 4-worker case's plan and result, from one launch."""
    return _launch(FOUR)


def _matches(plan, res, case):
    ref = res["reference"]
    assert res["reference_ok"], (case, ref["worst_grad"], ref["max_grad_rel_err"],
                                 ref["worst_param"], ref["max_param_rel_err"],
                                 ref["problems"])
    assert ref["loss_rel_err"] < 1e-5
    pipe = res.get("pipeline")
    if plan["pipeline"]["micro_batches"] > 1 or plan["pipeline"]["stages"] > 1:
        assert pipe["stages"] == plan["pipeline"]["stages"]
        assert pipe["micro_batches"] == plan["pipeline"]["micro_batches"]
        assert pipe["executed_schedule"] == plan["pipeline"]["schedule"]     # CPU: gloo
        assert len(pipe["measured_stage_time_per_microbatch_s"]) == pipe["stages"]
        assert 0.0 <= pipe["measured_bubble_fraction"] < 1.0
    assert res["predicted_step_time_s"] == plan["predicted_step_time_s"]
    assert res["measured_step_time_s"] > 0


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.parametrize("case", list(TWO))
def test_two_workers_match_one_device(two, case):
    _matches(*two[case], case)


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.parametrize("case", list(FOUR))
def test_two_stages_of_two_workers_match_one_device(four, case):
    plan, res = four[case]
    _matches(plan, res, case)
    # each stage's layers really run on both of its workers
    for s in range(2):
        devs = {d for la in plan["layers"] if la.get("stage", 0) == s for d in la["devices"]}
        assert devs == {2 * s, 2 * s + 1}


@pytest.mark.slow
@pytest.mark.multiprocess
def test_hand_plan_holds_every_micro_batch(two):
    """The hand-built plan, worked by hand (fp32, bytes).  Worker 1 (stage 1: head) holds
    per micro-batch of b samples the fetched body_0 output (b x 16 x 4), head's output and
    its loss gradient (b x 10 x 4 each): 144·b.  GPipe runs every forward before any
    backward, so at the end of the forward pass all micro-batches are in flight: 144 · B =
    576 B at batch 4, with 2 micro-batches as with 1.  Worker 0 (stage 0) holds its box of
    the input and body_0's output (b x 16 x 4 each): 128 · B = 512 B."""
    for case in ("hand-m1", "hand-m2"):
        _, res = two[case]
        fe = [m["activations"] for m in res["measured_memory_forward_end"]]
        assert fe == [512, 576], (case, fe)
    # the same step: the loss and the updated parameters agree with the unpipelined plan's
    a, b = two["hand-m1"][1]["reference"], two["hand-m2"][1]["reference"]
    assert a["loss"] == pytest.approx(b["loss"], rel=1e-6)
    assert two["hand-m2"][1]["pipeline"]["predicted_bubble_fraction"] == pytest.approx(1 / 3)


@pytest.mark.slow
@pytest.mark.multiprocess
def test_hand_plan_1f1b_holds_fewer_micro_batches(two):
    """The hand-built plan at batch 8 in 4 micro-batches of 2 (fp32, bytes; the largest
    activations of the step).  A micro-batch in flight holds 256 B on stage 0 (its input box
    and body_0's output, 2 x 16 x 4 each) and 288 B on stage 1 (the fetched body_0 output,
    head's output and its loss gradient, 128 + 80 + 80).  GPipe holds all 4 on both stages:
    stage 0 4 x 256 plus body_0's output gradient arriving (128) = 1,152 B.  1F1B runs a
    micro-batch's backward right after its forward where it can: stage 0 holds
    min(S, M) = 2 (640 B), stage 1 one (3 x 288 B fewer than GPipe).  Both match one
    device."""
    g = two["hand-gpipe-m4"][1]["measured_memory_by_category"]["activations"]
    f = two["hand-1f1b-m4"][1]["measured_memory_by_category"]["activations"]
    assert two["hand-1f1b-m4"][1]["pipeline"]["executed_schedule"] == "1f1b"
    assert g[0] == 4 * 256 + 128 and f[0] == 2 * 256 + 128
    assert g[1] - f[1] == 3 * 288

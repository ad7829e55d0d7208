"""Runtime tests: plans executed on 2 local CPU workers (gloo) against the single-device step.

The reference checks of every (model, strategy) case run in ONE launch (the workers start
once and run the plans one after the other), so the file stays within a few minutes on 2
cores.  Each case is still reported as its own test.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from argparse import Namespace
from pathlib import Path

import psutil
import pytest
import torch
from _helpers import spawned_workers

from explorer import service as session
from explorer.engine.core import plandoc
from explorer.engine.runtime import RunFailed, launch, launch_many, validate
from explorer.errors import ExplorerError, InfeasiblePlan

pytestmark = pytest.mark.multiprocess   # every test here starts worker processes

REPO = Path(__file__).resolve().parents[1]
SMALL = {"image_size": 32, "num_classes": 10}


def make_plan(model, algo="data", batch=8, model_args=None, pins=None, devices=2):
    req = session.Request(model=model, preset="local", devices=devices, batch=batch,
                          algo=algo, model_args=dict(model_args or {}))
    doc = session.search(req, pins)
    doc.pop("trace", None)
    return doc


def spatial_pins(model, batch, model_args, letter):
    """Pin every conv / pool / element-wise / concat layer with that axis ≥ 2 to ``letter``=2."""
    req = session.Request(model=model, preset="local", devices=2, batch=batch,
                          model_args=dict(model_args or {}))
    g = session.graph_for(req)
    return [f"{l.name}={letter}=2" for l in g.layers()
            if l.op in ("conv", "pool", "adaptive_pool", "eltwise", "concat")
            and letter in l.dims and l.size(letter) >= 2]


# (case id, model, batch, model args, algo, spatial letter or pins).  Every example CNN
# under data, model, OWT, a spatial (h or w) plan and the searched plan; LeNet-5 also under
# both spatial letters and a hand-mixed plan.
CNNS = [
    ("lenet5", 8, {}),
    # the classifiers at width 32 (torchvision's 4096 adds minutes of float64 steps, not rules)
    ("alexnet", 4, {"image_size": 63, "num_classes": 10, "fc": 32}),
    ("vgg16", 4, {**SMALL, "fc": 32}),
    ("resnet50", 4, SMALL),
    ("inception_v3", 4, {"image_size": 75, "num_classes": 10}),
    # bottlenecks 2, 2, 2, 2 at twice ResNet's width (depth 50 at width 2 is ResNet-50's
    # structure four times over: the same rules, minutes more of float64 reference steps)
    ("wresnet", 4, {"depth": 26, "width": 2, "image_size": 32, "num_classes": 10}),
    ("densenet", 4, {"block": 2, "blocks": 2, "growth": 8, "image_size": 32,
                     "num_classes": 10}),
    ("unet", 2, {"depth": 2, "base": 8, "image_size": 32}),
]
SPATIAL = {"lenet5": "h", "alexnet": "h", "vgg16": "w", "resnet50": "h", "inception_v3": "w",
           "wresnet": "w", "densenet": "h", "unet": "w"}
# One model's cases side by side: the workers compute a model's single-device reference once
# and reuse it for the plans of that model that follow.
CASES = []
for _m, _b, _args in CNNS:
    CASES += [(f"{_m}-{a}", _m, _b, _args, a, None) for a in ("data", "model", "owt", "optcnn")]
    CASES.append((f"{_m}-spatial-{SPATIAL[_m]}", _m, _b, _args, "optcnn", SPATIAL[_m]))
    if _m == "lenet5":
        CASES += [
            ("lenet5-spatial-w", "lenet5", 8, {}, "optcnn", "w"),
            ("lenet5-mixed", "lenet5", 8, {}, "optcnn",
             ["conv1=c=2", "pool1=h=2", "conv2=n=2", "pool2=w=2", "fc1=c=2", "fc2=n=2"]),
        ]


def _case_plan(model, batch, args, algo, spatial):
    pins = None
    if isinstance(spatial, str):
        pins = spatial_pins(model, batch, args, spatial)
    elif spatial:
        pins = list(spatial)
    return make_plan(model, algo, batch, args, pins)


@pytest.fixture(scope="module")
def checked():
    """Every case's plan and result, from a single launch of 2 workers."""
    plans = [_case_plan(*c[1:]) for c in CASES]
    results = launch_many(plans, steps=0, warmup=0, timeout_s=900, store=False)
    return {c[0]: (p, r) for c, p, r in zip(CASES, plans, results)}


_children = spawned_workers


def _dead(pids):
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                return False
        except psutil.NoSuchProcess:
            pass
    return True


# --------------------------------------------------------------------------------------------
# reference checks
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", [c[0] for c in CASES])
def test_reference_check(checked, case):
    plan, res = checked[case]
    ref = res["reference"]
    assert ref is not None
    assert res["reference_ok"], (
        f"{case}: loss err {ref['loss_rel_err']:.2e}, worst grad {ref['worst_grad']} "
        f"{ref['max_grad_rel_err']:.2e}, worst param {ref['worst_param']} "
        f"{ref['max_param_rel_err']:.2e}, problems {ref['problems']}")
    # every trainable tensor of the model was compared, and the run agrees with a float32
    # single device as closely as float32 rounding allows
    model_params = dict(_model_params(plan))
    assert ref["params_compared"] == len(model_params)
    assert ref["vs_float32_max_grad_rel_err"] < 1e-3
    assert ref["loss_rel_err"] < 1e-5


def _model_params(plan):
    from explorer.engine.core.importer import load_model
    with torch.device("meta"):
        m, _ = load_model(plan["spec"], plan["batch"], plan["model_args"], meta=True)
    return list(m.named_parameters())


def test_cases_split_as_intended(checked):
    """The spatial plans really split height/width, the model plans channels."""
    labels = {case: {la["config_label"] for la in p["layers"]} for case, (p, _) in checked.items()}
    for case in labels:
        if "spatial-h" in case:
            assert "h2" in labels[case], case
        if "spatial-w" in case:
            assert "w2" in labels[case], case
        if case.endswith("-model"):
            assert "c2" in labels[case], case
        if case.endswith("-data"):
            assert labels[case] <= {"n2"}, case
        if case.endswith("-owt"):
            assert labels[case] <= {"n2", "c2"} and "n2" in labels[case], case


def test_four_workers_two_dimensional_configs():
    """4 workers (more than the cores: warned): n×h, c×w, c4 and n×c tiles, replica groups of
    2 and 4 (point-to-point sums through the group's first rank)."""
    plans = [
        make_plan("lenet5", "data", 8, devices=4),
        make_plan("lenet5", "optcnn", 8, devices=4, pins=[
            "conv1=n=2,h=2", "pool1=c=2,w=2", "conv2=c=4", "fc1=n=2,c=2"]),
        make_plan("resnet50", "optcnn", 4, SMALL, devices=4, pins=[
            "layer1_0_conv2=n=2,h=2", "layer2_0_conv1=c=2,w=2", "fc=c=2"]),
    ]
    with pytest.warns(RuntimeWarning, match="4 CPU workers"):
        results = launch_many(plans, steps=1, warmup=0, timeout_s=300, store=False, sync="p2p")
    for p, r in zip(plans, results):
        assert r["reference_ok"], (p["algo"], r["reference"]["worst_grad"],
                                   r["reference"]["max_grad_rel_err"])
    labels = {la["config_label"] for p in plans for la in p["layers"]}
    assert {"n2 h2", "c2 w2", "c4", "n2 c2", "n4"} <= labels


def test_allreduce_sync_mode():
    plans = [make_plan("lenet5", "data", 8),
             make_plan("lenet5", "optcnn", 8, pins=spatial_pins("lenet5", 8, {}, "w"))]
    results = launch_many(plans, steps=1, warmup=0, timeout_s=120, store=False,
                          sync="allreduce")
    assert all(r["reference_ok"] and r["sync"] == "allreduce" for r in results)


# --------------------------------------------------------------------------------------------
# measurement, CLI, store
# --------------------------------------------------------------------------------------------


def test_cli_run_json_measures(tmp_path, capsys):
    from explorer.engine.runtime.commands import cmd_run
    from explorer.engine.runtime.store import RunStore
    plan = make_plan("lenet5", "optcnn", 8, pins=["conv1=h=2", "fc1=c=2"])
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plandoc.seal(plan, "layerwise")))          # as the tool saves it
    code = cmd_run(Namespace(plan=str(path), steps=3, warmup=1, json=True, timeout=120.0))
    out = json.loads(capsys.readouterr().out)
    assert code == 0
    assert out["reference_ok"] is True
    assert out["predicted_step_time_s"] == pytest.approx(plan["predicted_step_time_s"])
    assert out["measured_step_time_s"] > 0 and len(out["step_times_s"]) == 3
    assert [la["name"] for la in out["layers"]] == [la["name"] for la in plan["layers"]]
    for la in out["layers"]:
        assert {"name", "predicted_s", "measured_s"} <= set(la)
        assert la["measured_s"] >= 0
    assert sum(la["predicted_s"] for la in out["layers"]) == pytest.approx(
        plan["predicted_step_time_s"], rel=1e-6)
    assert out["rel_error"] == pytest.approx(
        (out["predicted_step_time_s"] - out["measured_step_time_s"])
        / out["measured_step_time_s"])
    runs = RunStore().list()
    assert runs and runs[0]["model"] == "lenet5" and runs[0]["reference_ok"] == 1
    # text report
    code = cmd_run(Namespace(plan=str(path), steps=1, warmup=0, json=False, timeout=120.0,
                             no_check=True))
    text = capsys.readouterr().out
    assert code == 0 and "reference check: skipped" in text and "predicted" in text


def test_cli_run_missing_plan_is_user_error(tmp_path):
    from explorer.engine.runtime.commands import cmd_run
    with pytest.raises(ExplorerError, match="not found"):
        cmd_run(Namespace(plan=str(tmp_path / "nope.json"), steps=1, warmup=0, json=True,
                          timeout=10.0))
    bad = tmp_path / "bad.json"
    bad.write_text('{"hello": 1}')
    with pytest.raises(ExplorerError, match="not a plan"):
        cmd_run(Namespace(plan=str(bad), steps=1, warmup=0, json=True, timeout=10.0))


def test_a_saved_layerwise_plan_runs_without_any_search(tmp_path, capsys, monkeypatch):
    """`explorer search --out` seals the plan; `explorer run` executes it as saved, stores the
    run under the same digest as the app's plan, and refuses the file once it is edited."""
    from _helpers import forbid_search

    from explorer.cli import main
    from explorer.engine.core import plandoc
    from explorer.engine.core.history import digest
    from explorer.engine.runtime.store import RunStore, run_key
    path = tmp_path / "plan.json"
    assert main(["search", "lenet5", "-n", "2", "--batch", "8", "--preset", "local",
                 "--pin", "conv1=h=2", "--out", str(path)]) == 0
    capsys.readouterr()
    saved = json.loads(path.read_text())
    assert plandoc.open_document(saved) == "layerwise" and saved["version"] == 2
    app = make_plan("lenet5", "optcnn", 8, pins=["conv1=h=2"])      # the app's same plan
    forbid_search(monkeypatch)
    code = main(["run", str(path), "--json", "--steps", "1", "--warmup", "0"])
    out, err = capsys.readouterr()
    assert code == 0, err
    d = json.loads(out)
    assert d["reference_ok"] is True and d["kind"] == "layerwise" and d["devices"] == 2
    assert [r["id"] for r in RunStore().list(digest(run_key(app)))] == [d["run_id"]]
    path.write_text(json.dumps(dict(saved, batch=16)))
    code = main(["run", str(path)])
    err = capsys.readouterr().err
    assert code == 2 and "edited after it was saved" in err and err.count("\n") == 1


# --------------------------------------------------------------------------------------------
# rejection before launch
# --------------------------------------------------------------------------------------------


def test_plan_for_other_model_or_devices_rejected_before_launch():
    plan = make_plan("lenet5", "data", 8)
    before = {c.pid for c in psutil.Process().children(recursive=True)}
    with pytest.raises(InfeasiblePlan, match="resnet50"):
        launch(plan, expect={"model": "resnet50"})
    with pytest.raises(InfeasiblePlan, match="4 devices"):
        launch(plan, expect={"devices": 4})
    with pytest.raises(InfeasiblePlan, match="batch 8"):
        launch(plan, expect={"batch": 16})
    # a plan whose layers are not the model's
    other = dict(plan, model="mlp", spec="mlp")
    with pytest.raises(InfeasiblePlan, match="does not fit model 'mlp'"):
        launch(other)
    # a layer name the model does not have
    broken = json.loads(json.dumps(plan))
    broken["layers"][1]["name"] = "no_such_layer"
    with pytest.raises(InfeasiblePlan, match="no_such_layer"):
        launch(broken)
    # a configuration that splits a dimension the layer does not have
    bad_cfg = json.loads(json.dumps(plan))
    fc = next(la for la in bad_cfg["layers"] if la["op"] == "linear")
    fc["config"] = {"n": 1, "c": 1, "h": 2}
    with pytest.raises(InfeasiblePlan):
        launch(bad_cfg)
    with pytest.raises(InfeasiblePlan, match="not a runnable plan"):
        launch({"schema": "something else"})
    after = {c.pid for c in psutil.Process().children(recursive=True)}
    assert after <= before, "nothing may be launched for a rejected plan"


def test_plan_for_other_model_args_rejected_by_graph_digest():
    """The plan records a digest of the graph it was searched on; a plan file whose model
    arguments or batch were edited (same layer names, other shapes) is refused before launch."""
    from explorer.engine.core.importer import digest_for
    from explorer.engine.core.layergraph import graph_digest
    from explorer.engine.layerwise.plan import Plan
    from explorer.engine.core.importer import import_spec
    plan = make_plan("mlp", "data", 8, {"hidden": 64})
    assert plan["graph_digest"] == graph_digest(import_spec("mlp", 8, {"hidden": 64}))
    assert plan["graph_digest"] == digest_for("mlp", 8, {"hidden": 64})
    assert plan["graph_digest"] != digest_for("mlp", 8, {"hidden": 32})
    assert Plan.from_dict(plan).to_dict()["graph_digest"] == plan["graph_digest"]
    validate(plan)                                                   # the plan as searched
    before = {c.pid for c in psutil.Process().children(recursive=True)}
    for edit in ({"model_args": {"hidden": 32}}, {"batch": 4}):
        with pytest.raises(InfeasiblePlan, match="another graph"):
            launch(dict(plan, **edit))
    after = {c.pid for c in psutil.Process().children(recursive=True)}
    assert after <= before, "nothing may be launched for a rejected plan"
    # the same edit is still caught when the caller states what it expects
    with pytest.raises(InfeasiblePlan, match="model arguments"):
        validate(plan, {"model_args": {"hidden": 32}})
    # plans written before the digest existed still validate (nothing to compare)
    old = {k: v for k, v in plan.items() if k != "graph_digest"}
    assert Plan.from_dict(old).graph_digest == ""
    validate(dict(old, model_args={"hidden": 32}))


def test_more_workers_than_cores_warns():
    cores = len(os.sched_getaffinity(0))
    n = cores + 1
    plan = make_plan("lenet5", "data", 4 * n, devices=n)
    _, warns = validate(plan)
    if not torch.cuda.is_available():
        assert any(f"{n} CPU workers on {cores} cores" in w for w in warns), warns


# --------------------------------------------------------------------------------------------
# failures: clear message, bounded time, nothing left behind
# --------------------------------------------------------------------------------------------


def test_worker_raising_mid_step_fails_cleanly():
    plan = make_plan("lenet5", "data", 8)
    with pytest.raises(RunFailed) as info:
        launch(plan, steps=3, warmup=1, timeout_s=60, fault="1:2:raise", store=False)
    msg = str(info.value)
    # the fault itself is reported (not the 60 s timeout): the launch stopped at the failure
    assert "rank 1" in msg and "injected fault" in msg and "step 2" in msg, msg
    assert "did not finish" not in msg
    assert info.value.rank == 1
    assert _dead(info.value.pids)
    assert not _children()


def test_worker_dying_mid_step_fails_cleanly(monkeypatch):
    """Fault injected through the environment (test hook of the worker entry point)."""
    monkeypatch.setenv("EXPLORER_RUNTIME_FAULT", "0:1:exit")
    plan = make_plan("lenet5", "model", 8)
    with pytest.raises(RunFailed) as info:
        launch(plan, steps=3, warmup=1, timeout_s=60, store=False)
    msg = str(info.value)
    assert "rank 0 died" in msg and "exit code 3" in msg, msg
    assert "did not finish" not in msg
    assert _dead(info.value.pids)
    assert not _children()


def test_hanging_worker_hits_the_timeout():
    plan = make_plan("lenet5", "data", 8)
    with pytest.raises(RunFailed) as info:
        launch(plan, steps=3, warmup=1, timeout_s=12, fault="1:1:hang", store=False)
    msg = str(info.value)
    # either the parent's watchdog fired or rank 0's gloo timeout did
    assert "did not finish within 12" in msg or "rank 0" in msg, msg
    assert _dead(info.value.pids)
    assert not _children()


# --------------------------------------------------------------------------------------------
# torchrun
# --------------------------------------------------------------------------------------------


def _torchrun_setup(tmp_path):
    """A sealed LeNet-5 plan for 2 ranks, where its result goes, and the agents' environment."""
    plan = make_plan("lenet5", "optcnn", 8, pins=["conv1=w=2", "fc1=c=2"])
    path, out = tmp_path / "plan.json", tmp_path / "result.json"
    path.write_text(json.dumps(plandoc.seal(plan, "layerwise")))
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
               OMP_NUM_THREADS="1")
    env.pop("EXPLORER_RUNTIME_FAULT", None)
    return path, out, env


@pytest.mark.skipif(shutil.which("torchrun") is None,
                    reason="torchrun (installed with torch) is not on PATH")
def test_torchrun_runs_the_worker_entry_point(tmp_path):
    path, out, env = _torchrun_setup(tmp_path)
    proc = subprocess.run(
        ["torchrun", "--standalone", "--nproc_per_node", "2", "-m",
         "explorer.engine.runtime.torchrun", str(path), "--steps", "2", "--warmup", "1",
         "--out", str(out), "--timeout", "120"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(out.read_text())
    assert res["reference_ok"] is True and res["world"] == 2 and res["backend"] == "gloo"
    assert "reference check: OK" in proc.stdout
    assert len(res["step_times_s"]) == 2


@pytest.mark.skipif(shutil.which("torchrun") is None,
                    reason="torchrun (installed with torch) is not on PATH")
def test_torchrun_runs_a_plan_across_two_nodes_with_a_c10d_rendezvous(tmp_path):
    """Two ``torchrun`` agents as two machines (``--nnodes 2``, one rank each, rendezvous at
    one endpoint), as the docs show for several machines: the plan runs and checks."""
    import socket
    path, out, env = _torchrun_setup(tmp_path)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    agents = [subprocess.Popen(
        ["torchrun", "--nnodes", "2", "--nproc_per_node", "1", "--node_rank", str(rank),
         "--rdzv_backend", "c10d", "--rdzv_endpoint", f"127.0.0.1:{port}",
         "--rdzv_id", "plan-explorer-test", "-m", "explorer.engine.runtime.torchrun",
         str(path), "--steps", "2", "--warmup", "1", "--out", str(out), "--timeout", "120"],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for rank in (0, 1)]
    try:
        outs = [a.communicate(timeout=240) for a in agents]
    finally:
        for a in agents:
            if a.poll() is None:
                a.kill()
                a.wait()
    assert [a.returncode for a in agents] == [0, 0], outs[0][1][-2000:] + outs[1][1][-2000:]
    res = json.loads(out.read_text())
    assert res["reference_ok"] is True and res["world"] == 2
    assert "reference check: OK" in outs[0][0] + outs[1][0]


# --------------------------------------------------------------------------------------------
# calibration
# --------------------------------------------------------------------------------------------


def test_calibrate_writes_local_json(tmp_path, capsys):
    from explorer.engine.core.devices import local
    from explorer.engine.core.profile import Profiler
    from explorer.engine.runtime.commands import cmd_calibrate
    home = Path(os.environ["EXPLORER_HOME"])
    code = cmd_calibrate(Namespace(devices=2, model="lenet5", batch=8, model_arg=[],
                                   quick=True, json=True))
    assert code == 0
    cal = json.loads(capsys.readouterr().out)
    doc = json.loads((home / "local.json").read_text())
    for key in ("peak_flops", "mem_bw", "link_bw", "latency"):
        assert doc[key] > 0 and doc[key] == pytest.approx(cal[key])
    d = local(2)
    assert d.devices[0].peak_flops == pytest.approx(doc["peak_flops"])
    assert d.bandwidth(0, 1) == pytest.approx(doc["link_bw"])
    assert d.meta["calibrated"]
    # the gradient swap's extra message and the in-place add, as the cost model reads them
    assert doc["swap_message_s"] >= 0 and doc["add_s"] > 0 and doc["add_bw"] > 0
    assert d.meta["swap"] == {"message_s": doc["swap_message_s"], "add_s": doc["add_s"],
                              "add_bw": doc["add_bw"]}
    assert cal["profiled"]["layers"] == 8 and cal["profiled"]["shards"] > 0
    # how noisy the calibration was is recorded with it
    assert doc["noise"]["canary_before_s"] > 0 and "noisy" in doc["noise"]
    with Profiler() as p:
        assert len(p) >= cal["profiled"]["shards"]


# --------------------------------------------------------------------------------------------
# pieces without processes
# --------------------------------------------------------------------------------------------


def test_compare_flags_a_wrong_gradient():
    from explorer.engine.runtime.reference import compare
    g = {"w": torch.randn(4, 4, dtype=torch.float64)}
    p = {"w": torch.randn(4, 4, dtype=torch.float64)}
    ref = (1.0, p, g)
    ref32 = (1.0, {k: v.float() for k, v in p.items()}, {k: v.float() for k, v in g.items()})
    good = compare(1.0, {k: v.float() for k, v in p.items()},
                   {k: v.float() for k, v in g.items()}, ref, ref32)
    assert good["ok"]
    wrong = {"w": g["w"].float().clone()}
    wrong["w"][0, 0] += 0.01 * g["w"].abs().max().float()
    bad = compare(1.0, {k: v.float() for k, v in p.items()}, wrong, ref, ref32)
    assert not bad["ok"] and bad["worst_grad"] == "w"
    missing = compare(1.0, {}, {}, ref, ref32)
    assert not missing["ok"] and missing["problems"]


def test_reshape_forward_matches_indexing():
    """Forward replay of a reshape/permute chain on a region equals slicing the full view."""
    import numpy as np

    from explorer.engine.core.layergraph import Layer
    from explorer.engine.runtime import transforms as T
    src = torch.arange(2 * 6 * 4, dtype=torch.float32).reshape(2, 6, 4)   # producer (N, L, H*D)
    # consumer sees q = src.view(2, 6, 2, 2).transpose(1, 2)
    trans = (("permute", (0, 2, 1, 3)), ("reshape", (2, 6, 4), (2, 6, 2, 2)))
    lay = Layer("attn", "sdpa", (2, 2, 6, 2), ("n", "c", "l", "-"),
                in_shapes=((2, 2, 6, 2),) * 3)
    full_view = src.view(2, 6, 2, 2).permute(0, 2, 1, 3)
    for box in (np.array([[0, 2], [1, 2], [0, 6], [0, 2]]),
                np.array([[1, 2], [0, 2], [0, 6], [0, 2]])):
        boxes, steps = T.plan_edge(lay, 0, box, trans)
        region = boxes[-1]
        t = src[tuple(slice(a, b) for a, b in region)]
        got = T.forward(t, steps)
        q = boxes[0]
        want = full_view[tuple(slice(a, b) for a, b in q)]
        assert torch.equal(got, want)


def test_class_token_and_buffer_indexed_embedding_run_against_the_reference(tmp_path):
    """A tiny ViT (class token concatenated, position embedding indexed by a buffer, dropout
    and a train-only node) under data, model and the searched plan on 2 workers: the class
    token's gradient reaches it, and the workers capture the search's train-mode graph."""
    from test_importer import TINY_VIT
    p = tmp_path / "tinyvit.py"
    p.write_text(TINY_VIT)
    spec = f"{p}:build"
    plans = [make_plan(spec, algo, 4) for algo in ("data", "model", "optcnn")]
    results = launch_many(plans, steps=0, warmup=0, timeout_s=300, store=False)
    for plan, res in zip(plans, results):
        assert res["reference_ok"], (plan["algo"], res["reference"]["problems"],
                                     res["reference"]["worst_grad"])
        assert res["reference"]["params_compared"] == 8        # cls included

"""The one method registry, the one result type and the one pin vocabulary."""

from __future__ import annotations

import dataclasses
import json

import pytest

from _helpers import explorer_cli
from explorer.engine.core import pins as P
from explorer.engine.search import METHODS, Problem, Request, Result, describe, get, names, run
from explorer.errors import InfeasiblePlan

ISSUE_METHODS = ["optcnn", "data", "model", "owt", "megatron", "exhaustive", "tofu", "allrow-greedy",
                 "spartan", "equalchop", "icml18", "celeritas", "celeritas-paper",
                 "order-place", "m-topo", "m-etf", "m-sct", "metis", "single",
                 "megatron-3d", "fsdp", "pipeline"]          # issue 28


def test_every_method_is_registered_once_with_family_description_and_options():
    assert sorted(METHODS) == sorted(ISSUE_METHODS)
    assert sum(len(names(f)) for f in ("layerwise", "tofu", "placement")) == len(METHODS)
    for name, m in METHODS.items():
        assert m.name == name and m.family in ("layerwise", "tofu", "placement")
        assert m.description and "\n" not in m.description
        assert dataclasses.is_dataclass(m.options_type)
        assert dataclasses.is_dataclass(m.options())           # defaults validate
        assert callable(m.entry)
    assert describe("tofu") == {n: METHODS[n].description for n in names("tofu")}


def test_unknown_method_family_and_option_are_named():
    with pytest.raises(ValueError, match="unknown method 'nope'.*optcnn"):
        get("nope")
    with pytest.raises(ValueError, match="unknown family"):
        names("quantum")
    with pytest.raises(ValueError, match="unknown option R for PlacementOptions"):
        get("metis").options({"R": 3})
    with pytest.raises(ValueError, match="R must be >= 1, got 0"):
        get("celeritas").options({"R": 0})
    with pytest.raises(ValueError, match="memory_per_device must be > 0"):
        get("m-topo").options({"memory_per_device": -1})


@pytest.fixture(scope="module")
def problem():
    return Problem(Request("lenet5", 8, preset="p100-nvlink-4", devices=2))


@pytest.mark.parametrize("name", ISSUE_METHODS)
def test_every_method_returns_the_one_result_type(problem, name):
    res = run(name, problem)
    assert isinstance(res, Result) and res.algo == name and res.family == get(name).family
    assert res.devices == 2 and res.model == "lenet5" and res.batch == 8
    assert res.objective_s > 0 and res.predicted_step_time_s > 0 and res.search_time_s >= 0
    assert len(res.memory_per_device_bytes) == 2 and max(res.memory_per_device_bytes) > 0
    assert res.comm_bytes >= 0 and isinstance(res.fits_memory, bool)
    doc = json.loads(json.dumps(res.to_dict(trace=True)))
    assert doc["schema"] == f"plan-explorer/{res.kind}" and doc["version"] == 2
    for key in ("algo", "family", "model", "batch", "devices", "preset", "objective_s",
                "predicted_step_time_s", "search_time_s", "memory_per_device_bytes",
                "comm_bytes", "fits_memory", "pins", "info", "trace"):
        assert key in doc, key
    sealed = res.document()
    from explorer.engine.core.plandoc import open_document
    assert open_document(sealed) == res.kind


def test_pins_parse_once_and_round_trip():
    for text in ["conv1=n=2,c=2", "fc=@0,1", "fc=n=2@2,3", "cluster:3=@1", "t_5=grid=2x1"]:
        assert P.parse(text).text() == text
    assert P.parse("conv1={n=2}").degrees == {"n": 2}
    for bad, words in [("conv1", "cannot read pin"), ("conv1=x=2", "letters n,c,h,w,l"),
                       ("conv1=n=0", "≥ 1"), ("conv1=@a", "integers"),
                       ("t=grid=2xq", "grid"), ("t=grid=0x1", "≥ 1")]:
        with pytest.raises(ValueError, match=words):
            P.parse(bad)
    with pytest.raises(InfeasiblePlan, match="pinned twice"):
        P.parse_all(["a=n=2", "a=@0"])


@pytest.mark.parametrize("family,pin,words", [
    ("layerwise", "conv1=grid=2x1", "Tofu tiling"),
    ("placement", "conv1=n=2", "one device"),
    ("placement", "conv1=@0,1", "one device"),
    ("tofu", "conv1=@0", "tensor's tiling"),
])
def test_each_family_says_why_it_cannot_honour_a_pin(family, pin, words):
    with pytest.raises(InfeasiblePlan, match=words):
        P.check([pin], family)


def test_tofu_honours_a_tensor_tiling_pin():
    from explorer.engine.tofu import search as tofu
    prob = Problem(Request("mlp", 16, {"layers": 2, "hidden": 64}, preset="k80-pcie-8", devices=4))
    free = run("tofu", prob)
    big = max(free.plan.tilings, key=lambda t: prob.opgraph().tensors[t].bytes)
    shape = free.plan.tilings[big]["shape"]
    other = [1] * len(shape)
    # pin the other tiling than the free optimum chose (a 1-D split along a different axis)
    chosen = free.plan.tilings[big]["grid"]
    axis = next(a for a in range(len(shape)) if chosen[a] != 4 and shape[a] >= 4)
    other[axis] = 4
    pin = f"{big}=grid=" + "x".join(map(str, other))
    pinned = run("tofu", prob, [pin])
    assert pinned.plan.tilings[big]["grid"] == other
    assert pinned.comm_bytes >= free.comm_bytes - 1e-6          # the optimum was free
    assert pinned.pins == [pin]
    with pytest.raises(InfeasiblePlan, match="cannot be made"):
        run("tofu", prob, [f"{big}=grid=" + "x".join(["3"] + ["1"] * (len(shape) - 1))])
    with pytest.raises(InfeasiblePlan, match="no tensor"):
        run("tofu", prob, ["nope=grid=2x2"])
    assert tofu.pin_steps((1, 1), (4, 4), [2, 2]) == [-1, -1]


def test_placement_pins_through_the_registry(problem):
    res = run("metis", problem)
    op = res.plan.names[3]
    other = 1 - res.plan.device_of(op)
    pinned = run("metis", problem, [f"{op}=@{other}"])
    assert pinned.plan.device_of(op) == other
    with pytest.raises(InfeasiblePlan, match="only 2 devices"):
        run("celeritas", problem, [f"{op}=@5"])


@pytest.mark.multiprocess
def test_cli_pins_for_every_family(tmp_path):
    bad = explorer_cli("search", "lenet5", "-n", "2", "--algo", "tofu", "--pin", "conv1=n=2")
    assert bad.returncode == 2 and "tensor's tiling" in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1
    bad = explorer_cli("search", "lenet5", "-n", "2", "--algo", "metis", "--pin", "x=n=2")
    assert bad.returncode == 2 and "one device" in bad.stderr
    bad = explorer_cli("search", "lenet5", "-n", "2", "--pin", "conv1=grid=2x1")
    assert bad.returncode == 2 and "Tofu tiling" in bad.stderr


@pytest.mark.parametrize("name", ["optcnn", "tofu", "celeritas"])
def test_every_plan_kind_speaks_the_one_layout_vocabulary(problem, name):
    """A layer-wise configuration, a Tofu tiling and a placement all say which box of each
    tensor each device holds (geometry's TensorLayout)."""
    import numpy as np

    from explorer.engine.core.geometry import TensorLayout, volume
    res = run(name, problem)
    lay = res.layouts(problem)
    assert lay and all(isinstance(v, TensorLayout) and v.n_devices == 2 for v in lay.values())
    for t, v in lay.items():
        held = volume(v.boxes)
        total = int(np.prod(v.shape or (1,)))
        assert held.max() <= total and held.sum() >= total, t     # every element somewhere
    if name == "celeritas":                                       # each output on one device
        assert all(len(v.holders()) == 1 for v in lay.values())
    if name == "optcnn":
        conv1 = res.plan.config_of("conv1")
        assert lay["conv1"].holders() == sorted(conv1.devices)
    if name == "tofu":            # at 2 workers a tensor is halved (disjoint) or replicated
        for t, v in lay.items():
            total, vols = int(np.prod(v.shape or (1,))), volume(v.boxes)
            assert vols.sum() == total or (vols == total).all(), t
        assert any(volume(v.boxes).sum() == int(np.prod(v.shape)) for v in lay.values())


def test_comparisons_come_from_the_registry():
    from explorer.engine.search import comparison
    # the papers' order, with Megatron-LM after the papers' baselines
    assert comparison("layerwise") == ["data", "model", "owt", "megatron", "optcnn"]
    assert comparison("tofu")[-1] == "tofu" and len(comparison("tofu")) == 5
    assert set(comparison("placement")) == set(names("placement"))
    assert all(get(n).role in ("search", "baseline", "verification") for n in METHODS)
    assert get("exhaustive").role == "verification"


@pytest.mark.parametrize("text, degrees, devices", [
    ("n=2,h=2@0,1,2,3", {"n": 2, "h": 2}, (0, 1, 2, 3)),
    ("@2,3", {}, (2, 3)),
    ("c=4", {"c": 4}, None),
    (" { n=2 , c=1 } ", {"n": 2, "c": 1}, None),
    ("l=2@1,0", {"l": 2}, (1, 0)),
    ])
def test_pin_spec_good(text, degrees, devices):
    """A layer pin's right-hand side: degrees and/or devices (once geometry's parse_config)."""
    pin = P.parse("conv1=" + text)
    assert (pin.degrees, pin.devices) == (degrees, devices)


@pytest.mark.parametrize("text, needle", [
    ("x=2", "'x=2'"),            # unknown letter
    ("n2", "'n2'"),              # no '='
    ("n=two", "n='two'"),        # not an integer
    ("n=0", "n=0"),              # degree < 1
    ("c=-2", "c=-2"),
    ("n=2@a,b", "'a,b'"),        # devices not integers
])
def test_pin_spec_bad(text, needle):
    with pytest.raises(ValueError) as ei:
        P.parse("conv1=" + text)
    assert needle in str(ei.value)


@pytest.mark.multiprocess
def test_cli_family_flags_work_and_others_are_refused(tmp_path):
    out = explorer_cli("search", "mlp", "-n", "2", "-a", "layers=1", "-a", "hidden=16",
                       "--batch", "8", "--algo", "tofu", "--compare", "--json")
    assert out.returncode == 0, out.stderr
    assert sorted(json.loads(out.stdout)["compare"]) == sorted(names("tofu"))
    graph = tmp_path / "g.json"
    out = explorer_cli("search", "mlp", "-n", "2", "-a", "layers=1", "-a", "hidden=16",
                       "--batch", "8", "--algo", "metis", "--dump-graph", str(graph),
                       "--memory-per-device", "4")
    assert out.returncode == 0, out.stderr
    assert json.loads(graph.read_text())["nodes"]
    for argv, words in [(["--algo", "tofu", "--dump-costs", "x.json"], "--dump-costs does not"),
                        (["--algo", "metis", "--compare"], "--compare does not"),
                        (["--memory-per-device", "4"], "--memory-per-device does not"),
                        (["--algo", "metis", "--refine-memory", "budget"], "celeritas only")]:
        bad = explorer_cli("search", "lenet5", "-n", "2", *argv)
        assert bad.returncode == 2 and words in bad.stderr, bad.stderr
        assert len(bad.stderr.strip().splitlines()) == 1

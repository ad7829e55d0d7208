"""Placements run as compiled code (one fx program per device with send/recv) and the
placers' measured per-operator costs (``--cost measured``)."""

from __future__ import annotations

import json
import sqlite3

import numpy as np
import pytest
import torch

from _helpers import explorer_cli
from explorer.engine.core.devices import local, preset
from explorer.engine.core.opgraph import build_opgraph
from explorer.engine.placement.estimate import VIEW_OPS
from explorer.engine.runtime.compiled import _real_step, device_program, transfers
from explorer.engine.runtime.opexec import placement_comm_bytes, run_placement, run_placements
from explorer.engine.runtime.reference import compare, traced_step
from explorer.engine.search import Problem, Request, run as run_method
from explorer.errors import InfeasiblePlan, NotCalibrated

#: small models the placement methods are run on (model, batch, arguments)
MODELS = [("lenet5", 8, {}),
          ("transformer", 4, {"layers": 1, "hidden": 32, "heads": 2, "seq": 8, "vocab": 50,
                              "num_classes": 5}),
          ("mlp", 8, {"layers": 3, "hidden": 32})]
METHODS = ["celeritas", "celeritas-paper", "m-topo", "m-etf", "m-sct", "metis",
           "order-place", "single"]

_RUNS: dict = {}          # (model, placement) -> run result: equal placements run once


def _run(model, batch, args, names, devs, **kw):
    key = (model, tuple(names), tuple(int(d) for d in devs), tuple(sorted(kw.items())))
    if key not in _RUNS:
        _RUNS[key] = run_placement(model, batch, args, names, devs, 2, steps=1, warmup=0,
                                   timeout_s=300, **kw)
    return _RUNS[key]


def _moves_the_planned_bytes(og, names, devs, r):
    """The workers send exactly the transfers' bytes: the simulator's rule (each tensor once
    to each other device reading it), less the outputs of a multi-output call that the
    reading device computes itself because it holds another of its outputs."""
    plan = transfers(og, dict(zip(names, (int(d) for d in devs))), 2)
    assert r["measured_comm_bytes"] == sum(og.tensors[t].bytes for t, *_ in plan)
    assert r["measured_comm_bytes"] <= r["predicted_comm_bytes"] == pytest.approx(
        placement_comm_bytes(og, names, devs))


@pytest.fixture(scope="module")
def graphs():
    return {m: build_opgraph(m, b, a) for m, b, a in MODELS}


def _alternating(og):
    """Every other operator (and parameter) on the other device."""
    names = [t.id for t in og.tensors.values() if t.producer is None] + list(og.ops)
    return names, [i % 2 for i in range(len(names))]


class _Batched:
    """model -> {case: result}: each model's placements (every method's, the alternating
    one) run in one launch (:func:`run_placements`: the workers start and trace once), when
    the first of its tests asks; a failed launch runs each placement alone, so the failing
    test names its method."""

    def __init__(self, graphs):
        self.graphs, self.out = graphs, {}

    def __call__(self, model, case):
        if model not in self.out:
            self.out[model] = self._launch(model)
        r = self.out[model][case]
        if isinstance(r, BaseException):
            raise r
        return r

    def _launch(self, model):
        batch, args = next((b, a) for m, b, a in MODELS if m == model)
        og = self.graphs[model]
        plans, out = {"alternating": _alternating(og)}, {}
        if model in (m for m, *_ in MODELS[:2]):
            for algo in METHODS:
                try:
                    res = run_method(algo, Problem(
                        Request(model, batch, dict(args), preset="local", devices=2),
                        opgraph_=og), options={"memory_per_device": 2 ** 30})
                    plans[algo] = (res.plan.names, res.plan.placement)
                except Exception as exc:  # noqa: BLE001 - reported by the method's test
                    out[algo] = exc
        kw = dict(g=og, steps=1, warmup=0, timeout_s=300)
        try:
            out.update(zip(plans, run_placements(model, batch, args, list(plans.values()),
                                                 2, **kw)))
        except Exception:  # noqa: BLE001 - each alone: the failure names its placement
            for case, plan in plans.items():
                try:
                    out[case] = run_placements(model, batch, args, [plan], 2, **kw)[0]
                except Exception as exc:  # noqa: BLE001
                    out[case] = exc
        out["plans"] = plans
        return out


@pytest.fixture(scope="module")
def batched(graphs):
    return _Batched(graphs)


@pytest.mark.multiprocess
@pytest.mark.parametrize("algo", METHODS)
@pytest.mark.parametrize("model,batch,args", MODELS[:2], ids=[m for m, *_ in MODELS[:2]])
def test_every_placement_method_runs_compiled_and_matches_one_device(graphs, batched, model,
                                                                     batch, args, algo):
    og = graphs[model]
    r = batched(model, algo)
    names, devs = batched.out[model]["plans"][algo]
    assert r["executor"] == "compiled"
    assert r["reference_ok"], r["reference"]
    assert r["max_rel_error"] < 1e-5
    _moves_the_planned_bytes(og, names, devs, r)
    assert r["measured_step_time_s"] > 0 and len(r["compute_s"]) == 2


@pytest.mark.multiprocess
@pytest.mark.parametrize("model,batch,args", MODELS, ids=[m for m, *_ in MODELS])
def test_an_alternating_placement_sends_every_crossing_tensor_and_matches(graphs, batched,
                                                                          model, batch, args):
    """Every other operator (and parameter) on the other device: most tensors cross, and
    multi-output calls, views and parameters read on the other device all go through
    send/recv; the result is still the single-device step."""
    og = graphs[model]
    names, devs = _alternating(og)
    r = batched(model, "alternating")
    assert r["reference_ok"], r["reference"]
    assert r["transfers"] == len(transfers(og, dict(zip(names, devs)), 2)) > 20
    _moves_the_planned_bytes(og, names, devs, r)
    assert min(r["compute_s"]) > 0 and all(w >= 0 for w in r["wait_s"])
    assert all(p > 0 for p in r["peak_memory_bytes"])


@pytest.mark.multiprocess
def test_placements_launched_together_each_match_what_they_give_alone(graphs):
    """Two placements in one launch report what each reports alone: the second starts from
    the same parameters and buffers (not the first's updated ones) and moves its own bytes."""
    model, batch, args = MODELS[2]
    og = graphs[model]
    alt = _alternating(og)
    whole = (alt[0], [0] * len(alt[0]))
    both = run_placements(model, batch, args, [alt, whole], 2, g=og, steps=2, warmup=0)
    alone = run_placements(model, batch, args, [whole], 2, g=og, steps=2, warmup=0)[0]
    assert both[0]["transfers"] > 20 and both[1]["transfers"] == alone["transfers"] == 0
    assert both[1]["loss"] == alone["loss"] and both[1]["reference_ok"]
    assert both[1]["max_rel_error"] == alone["max_rel_error"]
    assert both[0]["measured_comm_bytes"] > both[1]["measured_comm_bytes"] == 0


def test_a_one_device_program_is_the_whole_step(graphs):
    """All on device 0: its program (no communication) computes exactly the traced step, and
    device 1's program computes nothing and returns nothing."""
    og = graphs["lenet5"]
    g, gm, params, buffers, x = _real_step("lenet5", 8, {}, 0, 0.01)
    g.gm = gm
    dev = {nm: 0 for nm in list(og.ops) + [t.id for t in og.tensors.values()
                                            if t.producer is None]}
    p0, p1 = device_program(g, dev, 0, 2), device_program(g, dev, 1, 2)
    assert p0.meta["transfers"] == [] and "isend" not in p0.code and "irecv" not in p0.code
    (outs, _), flat = p0(*params, *buffers, x), params + buffers + [x]
    got = dict(zip(p0.meta["finals"], outs))
    ref = traced_step(g, params, buffers, x)
    doc = compare(float(got.pop("loss")), got, None, ref, None, 1e-6)
    assert doc["ok"] and doc["max_rel_error"] == 0.0 and len(got) == len(g.param_names)
    outs1, _ = p1(*flat)
    assert outs1 == () and p1.meta["finals"] == []
    assert not any(n.op == "call_function" and str(n.target).startswith("aten.")
                   for n in p1.graph.nodes)


def test_transfers_send_each_tensor_once_to_each_reading_device(graphs):
    """Hand-checked on the MLP: the input x (device 0) read on device 1 only crosses once
    however many device-1 operators read it; a tensor read only where it is made never
    crosses; tags are the list's indices."""
    og = graphs["mlp"]
    names = [t.id for t in og.tensors.values() if t.producer is None] + list(og.ops)
    dev = {nm: 1 for nm in names}
    x = og.inputs[0]
    dev[x] = 0
    plan = transfers(og, dev, 2)
    assert [(t, s, d) for t, s, d, _ in plan] == [(x, 0, 1)]
    assert [tag for *_, tag in plan] == list(range(len(plan)))
    everything_on_0 = {nm: 0 for nm in names}
    assert transfers(og, everything_on_0, 2) == []


@pytest.mark.multiprocess
def test_a_placement_on_more_devices_than_workers_is_refused(graphs):
    og = graphs["lenet5"]
    names = list(og.ops)
    with pytest.raises(InfeasiblePlan, match="devices"):
        run_placement("lenet5", 8, {}, names, [5] * len(names), 2, g=og)
    with pytest.raises(InfeasiblePlan, match="executor"):
        run_placement("lenet5", 8, {}, names, [0] * len(names), 2, g=og, executor="jit")


def test_a_random_op_is_refused_before_it_runs(tmp_path):
    f = tmp_path / "noisy.py"
    f.write_text("import torch\nfrom torch import nn\n"
                 "class M(nn.Module):\n"
                 "    def __init__(self):\n        super().__init__()\n"
                 "        self.l = nn.Linear(4, 4)\n"
                 "    def forward(self, x):\n        return self.l(x) * torch.rand_like(x)\n"
                 "def build(batch=2):\n    return M(), torch.randn(batch, 4)\n")
    og = build_opgraph(f"{f}:build", 2)
    dev = {nm: 0 for nm in list(og.ops) + [t.id for t in og.tensors.values()
                                            if t.producer is None]}
    with pytest.raises(InfeasiblePlan, match="random"):
        device_program(og, dev, 0, 2)


@pytest.mark.multiprocess
def test_a_dropout_traced_as_bernoulli_runs_compiled_and_matches_one_device(tmp_path):
    """A dropout that traces to ``bernoulli_`` + ``div_`` (as VGG-16's classifier does) runs
    in the deterministic numerics - the mask's expected value, so the identity - and the
    compiled placement matches the single-device step; ``calibrate`` can time it."""
    f = tmp_path / "dropped.py"
    f.write_text("import torch\nfrom torch import nn\n"
                 "def build(batch=4):\n"
                 "    m = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Dropout(0.5),\n"
                 "                      nn.Linear(16, 4))\n"
                 "    return m, torch.randn(batch, 8)\n")
    spec = f"{f}:build"
    og = build_opgraph(spec, 4)
    assert any(o.target.startswith("bernoulli") for o in og.ops.values()), \
        "the test model must trace its dropout to bernoulli"
    names = [t.id for t in og.tensors.values() if t.producer is None] + list(og.ops)
    devs = [i % 2 for i in range(len(names))]
    r = run_placement(spec, 4, {}, names, devs, 2, steps=1, warmup=0, timeout_s=300)
    assert r["reference_ok"], r["reference"]


# --------------------------------------------------------------------------------------------
# Measured per-operator costs
# --------------------------------------------------------------------------------------------

def test_op_times_are_measured_once_then_read_from_the_profile_cache(graphs, tmp_path):
    from explorer.engine.core.profile import op_signature, op_times
    og = graphs["lenet5"]
    cache = tmp_path / "profile.sqlite"
    t1, info1 = op_times(og, "cpu-worker", cache, reps=2, warmup=1)
    t2, info2 = op_times(og, "cpu-worker", cache, reps=2, warmup=1)
    assert info1["measured"] and not info2["measured"]
    assert t1 == t2                                     # the second came from the cache
    ph = {t.id for t in og.tensors.values() if t.producer is None}
    assert set(t1) == set(og.ops) | ph
    assert all(t1[p] == 0.0 for p in ph)
    assert sum(t1.values()) > 0 and all(v >= 0 for v in t1.values())
    # a multi-output call is timed once: its later outputs cost nothing more
    seen = set()
    for o in og.ops.values():
        if o.node in seen:
            assert t1[o.name] == 0.0
        seen.add(o.node)
    rows = sqlite3.connect(cache).execute("SELECT COUNT(*) FROM op_profile").fetchone()[0]
    node = {n.name: n for n in og.gm.graph.nodes}
    assert rows == len({op_signature(node[o.node]) for o in og.ops.values()})
    # another device kind is measured apart
    assert op_times(og, "other-kind", cache, reps=1, warmup=0)[1]["measured"]


def test_op_signatures_tell_shapes_apart():
    from explorer.engine.core.profile import op_signature
    a, b = build_opgraph("mlp", 8, {"hidden": 16}), build_opgraph("mlp", 16, {"hidden": 16})
    def first(g):                # the first call reading the input (a batch-sized tensor)
        x = next(n for n in g.gm.graph.nodes if n.op == "placeholder" and
                 n.name.startswith("x"))
        return next(iter(x.users))
    assert op_signature(first(a)) == op_signature(first(build_opgraph("mlp", 8,
                                                                      {"hidden": 16})))
    assert op_signature(first(a)) != op_signature(first(b))


def _calibrated(home):
    (home / "local.json").write_text(json.dumps({"peak_flops": 5e10, "mem_bw": 1e10,
                                                 "link_bw": 1e9, "latency": 1e-3}))


@pytest.mark.slow
def test_measured_costs_reach_the_placers_graph(_isolated_home):
    _calibrated(_isolated_home)
    dev = local(2)
    prob = Problem(Request("lenet5", 8, cost="measured", devices=dev.n), dev)
    pg = prob.placement_graph()
    from explorer.engine.core.profile import op_times
    times, info = op_times(prob.opgraph(), dev.devices[0].kind,
                           in_step=min(2, dev.meta["cores"]))   # workers busy at once
    assert not info["measured"]                 # the placers' graph filled the cache
    idx = pg.index()
    assert all(pg.w[idx[nm], 0] == pytest.approx(s) for nm, s in times.items())
    res = run_method("celeritas", prob)
    assert res.info["cost"] == "measured" and res.predicted_step_time_s > 0
    analytic = Problem(Request("lenet5", 8, devices=dev.n), dev).placement_graph()
    assert not np.allclose(analytic.w, pg.w)


def test_measured_costs_need_the_calibrated_local_preset(_isolated_home):
    from explorer.engine.placement.estimate import measured_times
    og = build_opgraph("lenet5", 8)
    with pytest.raises(NotCalibrated, match="--preset local"):
        measured_times(og, preset("p100-cluster", 2))
    with pytest.raises(NotCalibrated, match="explorer calibrate"):
        measured_times(og, local(2))            # this home has no calibration


@pytest.mark.multiprocess
@pytest.mark.parametrize("extra,message", [
    (["--preset", "p100-cluster"], "needs --preset local"),
    (["--preset", "local"], "run `explorer calibrate` first")])
def test_cli_measured_placement_errors_are_one_line(extra, message):
    out = explorer_cli("search", "lenet5", "-n", "2", "--batch", "8", "--algo", "m-etf",
                       "--cost", "measured", *extra)
    assert out.returncode == 2
    assert message in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr


@pytest.mark.multiprocess
def test_cli_search_measured_then_run_reports_both(_isolated_home, tmp_path):
    """``explorer search --cost measured`` on a calibrated home, then ``explorer run``: the
    report names the compiled executor and the measured costs, with memory per worker."""
    _calibrated(_isolated_home)
    plan = tmp_path / "place.json"
    out = explorer_cli("search", "lenet5", "-n", "2", "--batch", "8", "--preset", "local",
                       "--algo", "celeritas", "--cost", "measured", "--out", str(plan))
    assert out.returncode == 0, out.stderr
    assert json.loads(plan.read_text())["info"]["cost"] == "measured"
    out = explorer_cli("run", str(plan), "--steps", "2", "--warmup", "1")
    assert out.returncode == 0, out.stderr
    assert "compiled fx program per device" in out.stdout
    assert "measured operator costs" in out.stdout
    assert "peak memory per worker" in out.stdout and "passed" in out.stdout


@pytest.mark.slow
def test_calibrate_times_a_models_operators_for_the_placers(graphs):
    """``explorer calibrate --model`` also times the step's operators (afresh) as its
    ``devices`` workers run them, so the placers' measured costs then need no measuring."""
    from explorer.engine.core.profile import op_times
    from explorer.engine.runtime.calibrate import profile_ops
    got = profile_ops("lenet5", 8, {}, quick=True, devices=2)
    assert got["ops"] == len(graphs["lenet5"].ops) and got["step_s"] > 0
    from explorer.engine.runtime.calibrate import _cores
    times, info = op_times(graphs["lenet5"], local(1).devices[0].kind,
                           in_step=min(2, _cores()))
    assert not info["measured"] and sum(times.values()) == pytest.approx(got["step_s"])
    assert op_times(graphs["lenet5"], local(1).devices[0].kind, reps=1, warmup=0,
                    fresh=True)[1]["measured"]


def test_device_program_refuses_an_incomplete_or_out_of_range_placement(graphs):
    og = graphs["mlp"]
    names = [t.id for t in og.tensors.values() if t.producer is None] + list(og.ops)
    with pytest.raises(InfeasiblePlan, match="does not place operator"):
        device_program(og, {nm: 0 for nm in names[:-1]}, 0, 2)
    with pytest.raises(InfeasiblePlan, match=r"devices \[2\]"):
        transfers(og, {nm: 2 for nm in names}, 2)


@pytest.mark.multiprocess
def test_a_hanging_worker_ends_the_compiled_run_with_one_error_and_no_orphans(graphs):
    from _helpers import spawned_workers
    from explorer.engine.runtime.launcher import RunFailed
    og = graphs["lenet5"]
    names = [t.id for t in og.tensors.values() if t.producer is None] + list(og.ops)
    devs = [i % 2 for i in range(len(names))]
    before = {c.pid for c in spawned_workers()}
    with pytest.raises(RunFailed, match="did not finish within|timed out|Timed out"):
        run_placement("lenet5", 8, {}, names, devs, 2, steps=1, warmup=0, g=og,
                      fault="1:1:hang", timeout_s=12)
    assert not {c.pid for c in spawned_workers()} - before


# --------------------------------------------------------------------------------------------
# The prediction's model of the run: schedule order, timeline, shared cores, p2p links
# --------------------------------------------------------------------------------------------

def _planned(graphs, model, batch, args):
    og = graphs[model]
    res = run_method("celeritas", Problem(Request(model, batch, dict(args), preset="local", devices=2),
                                          opgraph_=og), options={"memory_per_device": 2 ** 30})
    return og, res


@pytest.mark.multiprocess
def test_device_programs_follow_the_simulated_schedule_and_still_match(graphs):
    """With the plan's ``order`` each device runs its operators in the order of the
    simulated schedule (not the trace's), still matches one device, and the traced step's
    timeline holds every operator placed on the worker exactly once, in that order."""
    model, batch, args = MODELS[1]
    og, res = _planned(graphs, model, batch, args)
    names, devs = res.plan.names, res.plan.placement
    order = res.document()["order"]
    assert sorted(order) == sorted(names)
    pos = {nm: i for i, nm in enumerate(order)}
    start = dict(zip(names, res.plan.sim.start))
    assert all(start[a] <= start[b] for a, b in zip(order, order[1:]))
    r = _run(model, batch, args, names, devs, order=tuple(order), timeline=True)
    assert r["reference_ok"], r["reference"]
    dev = dict(zip(names, (int(d) for d in devs)))
    for w, line in enumerate(r["timeline"]):
        ops = [o for kind, what, *_ in line if kind == "op" for o in what]
        assert sorted(ops) == sorted(o for o in og.ops if dev[o] == w)
        firsts = [pos[what[0]] for kind, what, *_ in line if kind == "op"]
        assert firsts == sorted(firsts)
        assert all(a <= b for _, _, a, b, _ in line)
        assert all(p[3] <= q[2] for p, q in zip(line, line[1:]))
        recv = sorted(what for kind, what, *_ in line if kind == "recv")
        plan = transfers(og, dev, 2)
        assert recv == sorted(tag for _, _, d, tag in plan if d == w)


@pytest.mark.multiprocess
def test_an_order_against_the_trace_runs_without_deadlock(graphs):
    """Alternating devices and an order that puts every operator as late as its readers
    allow (a reversed topological sort of the reversed graph): each device's calls and its
    sends follow it, and the step still matches one device."""
    import networkx as nx
    model, batch, args = MODELS[0]
    og = graphs[model]
    names = [t.id for t in og.tensors.values() if t.producer is None] + list(og.ops)
    devs = [i % 2 for i in range(len(names))]
    dag = nx.DiGraph()
    dag.add_nodes_from(names)
    prod = {t.id: t.producer for t in og.tensors.values() if t.producer}
    for o in og.ops.values():
        for t in o.inputs:
            dag.add_edge(prod.get(t, t), o.name)
    late = list(reversed(list(nx.lexicographical_topological_sort(dag.reverse()))))
    assert late != names
    r = _run(model, batch, args, names, devs, order=tuple(late))
    assert r["reference_ok"], r["reference"]
    _moves_the_planned_bytes(og, names, devs, r)


@pytest.mark.multiprocess
def test_a_bad_order_in_the_plan_is_one_error(graphs, tmp_path):
    from explorer.engine.runtime.dispatch import run_document
    from explorer.errors import PlanFileError
    model, batch, args = MODELS[0]
    _, res = _planned(graphs, model, batch, args)
    doc = json.loads(json.dumps(res.document()))
    for bad in (doc["order"][:-1], doc["order"][:-1] + doc["order"][:1], "abc",
                [1] * len(doc["order"])):
        with pytest.raises(PlanFileError, match="'order'"):
            run_document(dict(doc, order=bad), steps=1, warmup=0, verify=False)


def _two_ops(cores, p2p=None):
    """Two independent operators (1 s and 2 s of their own time) on two devices."""
    from explorer.engine.core.devices import Device, DeviceGraph
    from explorer.engine.placement.placement_graph import PlacementGraph
    meta = {"cores": cores}
    if p2p:
        meta["p2p"] = p2p
    dg = DeviceGraph("t", [Device(f"d{k}", "t", 1e12, 1e12, 1e12) for k in range(2)],
                     np.full((2, 2), 1e9), np.full((2, 2), 1e-3), "", meta)
    return PlacementGraph(["a", "b"], np.array([1.0, 2.0]), np.zeros(2), np.zeros(2),
                          np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64), dg)


def test_more_devices_than_cores_share_the_cores_in_the_simulator():
    """Worked by hand: on one core both run at half speed until ``a`` is done (its 1 s of
    work at t = 2), then ``b`` alone does its last second (t = 3); on two cores they
    overlap (t = 2).  Busy time stays each operator's own time."""
    from explorer.engine.placement.simulator import simulate
    one = simulate(_two_ops(1), [0, 1])
    assert one.makespan == pytest.approx(3.0)
    assert one.finish.tolist() == pytest.approx([2.0, 3.0])
    assert one.busy.tolist() == pytest.approx([1.0, 2.0])
    two = simulate(_two_ops(2), [0, 1])
    assert two.makespan == pytest.approx(2.0) and two.finish.tolist() == pytest.approx([1, 2])
    assert simulate(_two_ops(1), [0, 0]).makespan == pytest.approx(3.0)   # one device


def test_a_calibrated_point_to_point_link_is_what_placements_pay():
    """The placers' graph takes a transfer's ``k`` and ``b`` from the calibrated
    point-to-point figures when the device graph has them (local CPU workers)."""
    pg = _two_ops(2, {"latency": 2e-4, "bw": 4e9})
    assert pg.b[0, 1] == pytest.approx(2e-4) and pg.k[0, 1] == pytest.approx(1 / 4e9)
    assert pg.b[0, 0] == 0 and pg.k[1, 1] == 0
    plain = _two_ops(2)
    assert plain.b[0, 1] == pytest.approx(1e-3) and plain.k[0, 1] == pytest.approx(1e-9)


def test_calibrated_local_devices_carry_the_point_to_point_link(_isolated_home):
    (_isolated_home / "local.json").write_text(json.dumps(
        {"peak_flops": 1e11, "mem_bw": 1e10, "link_bw": 1e9, "latency": 3e-3,
         "p2p_latency_s": 1e-4, "p2p_bw": 3e9, "cores": 2}))
    dg = local(2)
    assert dg.meta["p2p"] == {"latency": 1e-4, "bw": 3e9} and dg.meta["cores"] == 2
    assert dg.latency[0, 1] == pytest.approx(3e-3)       # the layer-wise figure unchanged


def test_the_senders_isend_calls_take_its_time_in_the_simulator():
    """Worked by hand: ``a`` (1 s, device 0) is read by ``b`` on device 1 and by ``c`` on
    device 0.  The calibrated send call (0.25 s + 1 MB at 4 MB/s = 0.5 s) holds device 0
    until t = 1.5, so ``c`` runs 1.5–2.5; the transfer itself (latency 0.1 s + 1 MB at
    2 MB/s) starts at a's finish and ``b`` runs 1.6–2.6.  Busy counts the call."""
    from explorer.engine.core.devices import Device, DeviceGraph
    from explorer.engine.placement.placement_graph import PlacementGraph
    from explorer.engine.placement.simulator import simulate
    mb = 2 ** 20
    dg = DeviceGraph("t", [Device(f"d{k}", "t", 1e12, 1e12, 1e12) for k in range(2)],
                     np.full((2, 2), 1e9), np.full((2, 2), 1e-3), "",
                     {"cores": 2, "p2p": {"latency": 0.1, "bw": 2.0 * mb, "send_s": 0.25,
                                          "send_bw": 4.0 * mb}})
    pg = PlacementGraph(["a", "b", "c"], np.array([1.0, 1.0, 1.0]), np.zeros(3),
                        np.array([mb, 0, 0]), np.array([0, 0]), np.array([1, 2]), dg)
    sim = simulate(pg, [0, 1, 0])
    assert sim.start.tolist() == pytest.approx([0.0, 1.6, 1.5])
    assert sim.finish.tolist() == pytest.approx([1.0, 2.6, 2.5])
    assert sim.busy.tolist() == pytest.approx([2.5, 1.0])
    one_core = DeviceGraph("t", dg.devices, dg.bw, dg.latency, "", dict(dg.meta, cores=1))
    shared = simulate(PlacementGraph(["a", "b", "c"], np.ones(3), np.zeros(3),
                                     np.array([mb, 0, 0]), np.array([0, 0]),
                                     np.array([1, 2]), one_core), [0, 1, 0])
    # one core: the call (0.5 s of work) and b (from 1.6) share it, then c and b
    assert shared.makespan == pytest.approx(3.5) and shared.busy.sum() == pytest.approx(3.5)


def test_the_receivers_calls_take_its_time_in_the_simulator():
    """Worked by hand: ``a`` (1 s, device 0) is read by ``b`` on device 1, and ``x`` (2 s,
    device 1) runs there meanwhile.  The transfer (latency 0.1 s + 1 MB at 2 MB/s) lands at
    t = 1.6 while device 1 computes ``x``; the receive calls (0.2 s + 1 MB at 2 MB/s =
    0.7 s) follow ``x`` (2.0-2.7), so ``b`` runs 2.7-3.7.  Idle at arrival, the receiver
    pays them at once: without ``x``, ``b`` runs 2.3-3.3.  Busy counts the calls."""
    from explorer.engine.core.devices import Device, DeviceGraph
    from explorer.engine.placement.placement_graph import PlacementGraph
    from explorer.engine.placement.simulator import receive_cost, simulate
    mb = 2 ** 20
    dg = DeviceGraph("t", [Device(f"d{k}", "t", 1e12, 1e12, 1e12) for k in range(2)],
                     np.full((2, 2), 1e9), np.full((2, 2), 1e-3), "",
                     {"cores": 2, "p2p": {"latency": 0.1, "bw": 2.0 * mb, "recv_s": 0.2,
                                          "recv_bw": 2.0 * mb}})
    pg = PlacementGraph(["a", "b", "x"], np.array([1.0, 1.0, 2.0]), np.zeros(3),
                        np.array([mb, 0, 0]), np.array([0]), np.array([1]), dg)
    assert receive_cost(pg) == pytest.approx((0.2, 1 / (2.0 * mb)))
    sim = simulate(pg, [0, 1, 1])
    assert sim.start.tolist() == pytest.approx([0.0, 2.7, 0.0])
    assert sim.makespan == pytest.approx(3.7)
    assert sim.busy.tolist() == pytest.approx([1.0, 3.7])
    alone = simulate(PlacementGraph(["a", "b"], np.ones(2), np.zeros(2), np.array([mb, 0]),
                                    np.array([0]), np.array([1]), dg), [0, 1])
    assert alone.start.tolist() == pytest.approx([0.0, 2.3])
    assert alone.busy.tolist() == pytest.approx([1.0, 1.7])
    plain = DeviceGraph("t", dg.devices, dg.bw, dg.latency, "", {"cores": 2})
    assert receive_cost(PlacementGraph(["a"], np.ones(1), np.zeros(1), np.zeros(1),
                                       np.array([], dtype=int), np.array([], dtype=int),
                                       plain)) == (0.0, 0.0)


def test_a_transfer_waits_for_its_receive_to_be_posted():
    """Worked by hand (gloo moves a message once the receiver posted its irecv, which its
    program does after the operators that start before the producer): ``x`` (3 s) starts
    on device 1 at 0, before ``a`` (node 1, 1 s on device 0; ties go by node), so the
    receive for a's output is posted when x finishes at 3: the transfer takes the notice's
    latency and its own (0.1 + 0.1 + 1 MB at 2 MB/s) from 3 to 3.7 and ``b`` runs 3.7-4.7.
    Had ``x`` started after ``a`` (node 2 against a's node 0), the receive is posted first
    and the transfer runs 1.0-1.6 during x; b follows x at 3."""
    from explorer.engine.core.devices import Device, DeviceGraph
    from explorer.engine.placement.placement_graph import PlacementGraph
    from explorer.engine.placement.simulator import simulate
    mb = 2 ** 20
    dg = DeviceGraph("t", [Device(f"d{k}", "t", 1e12, 1e12, 1e12) for k in range(2)],
                     np.full((2, 2), 1e9), np.full((2, 2), 1e-3), "",
                     {"cores": 2, "p2p": {"latency": 0.1, "bw": 2.0 * mb}})
    late = simulate(PlacementGraph(["x", "a", "b"], np.array([3.0, 1.0, 1.0]), np.zeros(3),
                                   np.array([0, mb, 0]), np.array([1]), np.array([2]), dg),
                    [1, 0, 1])
    assert late.transfers[0][3:5] == pytest.approx((3.0, 3.7))
    assert late.start.tolist() == pytest.approx([0.0, 0.0, 3.7])
    early = simulate(PlacementGraph(["a", "b", "x"], np.array([1.0, 1.0, 3.0]), np.zeros(3),
                                    np.array([mb, 0, 0]), np.array([0]), np.array([1]), dg),
                     [0, 1, 1])
    assert early.transfers[0][3:5] == pytest.approx((1.0, 1.6))
    assert early.start.tolist() == pytest.approx([0.0, 3.0, 0.0])


@pytest.mark.multiprocess
def test_in_step_operator_times_are_the_compiled_steps_calls(graphs):
    """``--cost measured``'s operator times come from the step compiled as a worker runs it,
    in as many worker processes side by side as the placement has: every operator that
    computes has a time, the calls add up to a step, and they are cached apart from the
    isolated replay's (``device_kind/step×N``) so a second search does not measure."""
    from explorer.engine.core.profile import op_times
    from explorer.engine.runtime.compiled import instep_op_times
    og = graphs["lenet5"]
    per_node = instep_op_times(og, 2, reps=2, warmup=1)
    computing = {o.node for o in og.ops.values() if o.target not in VIEW_OPS
                 and o.target != "getitem"}
    assert computing <= set(per_node) and all(v >= 0 for v in per_node.values())
    assert sum(per_node.values()) > 0
    kind = local(1).devices[0].kind
    times, info = op_times(og, kind, reps=2, warmup=1, fresh=True, in_step=2,
                          measure=instep_op_times)
    assert info["measured"] and sum(times.values()) > 0
    again, info = op_times(og, kind, in_step=2)
    assert not info["measured"] and again == times


@pytest.mark.slow
def test_calibration_measures_the_point_to_point_figures_placements_use(_isolated_home):
    """``measure_link`` adds the one-way isend/irecv latency and bandwidth and the send
    call's cost; written to ``local.json`` they reach the placers' graph."""
    from explorer.engine.runtime.calibrate import measure_link
    link = measure_link(2, quick=True)
    for key in ("p2p_latency_s", "p2p_bw", "p2p_send_s", "p2p_send_bw",
                "p2p_recv_s", "p2p_recv_bw", "p2p_latency_mean_s", "p2p_1mb_s"):
        assert link[key] > 0, key
    (_isolated_home / "local.json").write_text(json.dumps(
        {"peak_flops": 1e11, "mem_bw": 1e10, "link_bw": link["link_bw"],
         "latency": link["latency"], **{k: link[k] for k in
                                        ("p2p_latency_s", "p2p_bw", "p2p_send_s",
                                         "p2p_send_bw", "p2p_recv_s", "p2p_recv_bw")}}))
    pg = Problem(Request("mlp", 8, {"layers": 2, "hidden": 16}, devices=2), local(2)).placement_graph()
    assert pg.b[0, 1] == pytest.approx(link["p2p_latency_s"])
    assert pg.k[0, 1] == pytest.approx(1 / link["p2p_bw"])
    assert pg.send_b == pytest.approx(link["p2p_send_s"])
    from explorer.engine.placement.simulator import receive_cost
    assert receive_cost(pg)[0] == pytest.approx(link["p2p_recv_s"])

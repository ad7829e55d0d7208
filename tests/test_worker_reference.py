"""The single-device reference a worker checks a plan against is computed once per model:
plans of one model launched together share it (it depends on the model's values, the input,
the rate and the precision, never on the plan)."""

from __future__ import annotations

import pytest
import torch

from explorer import service
from explorer.engine.runtime import reference, worker


def _plan(algo: str) -> dict:
    req = service.Request(model="lenet5", preset="local", devices=1, batch=4, algo=algo)
    doc = service.search(req)
    doc.pop("trace", None)
    return doc


def test_fingerprint_tells_models_and_inputs_apart():
    torch.manual_seed(0)
    a = torch.nn.Linear(3, 2)
    torch.manual_seed(0)
    b = torch.nn.Linear(3, 2)
    x = torch.ones(4, 3)
    assert worker.fingerprint(a, x) == worker.fingerprint(b, x)
    with torch.no_grad():
        b.weight[0, 0] += 1e-6
    assert worker.fingerprint(a, x) != worker.fingerprint(b, x)
    assert worker.fingerprint(a, x) != worker.fingerprint(a, 2 * x)


@pytest.mark.slow
def test_plans_of_one_model_share_its_reference_steps(monkeypatch):
    calls = []
    real = reference.reference_step

    def counted(*args, **kwargs):
        calls.append(args[3] if len(args) > 3 else kwargs.get("dtype"))
        return real(*args, **kwargs)

    monkeypatch.setattr(reference, "reference_step", counted)
    monkeypatch.setattr(worker, "_LAST_REF", [])
    job = {"steps": 0, "warmup": 0, "check": True, "lr": 0.01, "seed": 0}
    first = worker.run_job({**job, "plan": _plan("data")}, 0, 1)
    assert calls == [torch.float32, torch.float64]
    second = worker.run_job({**job, "plan": _plan("optcnn")}, 0, 1)
    assert len(calls) == 2                               # the same model: reused
    assert first["reference_ok"] and second["reference_ok"]
    assert second["reference"]["max_param_rel_err"] < 1e-5
    worker.run_job({**job, "lr": 0.02, "plan": _plan("data")}, 0, 1)
    assert len(calls) == 4                               # another rate: computed again


def _layer(name, t_compute, t_sync):
    from types import SimpleNamespace
    cfg = SimpleNamespace(label=lambda: "n2", devices=(0, 1))
    return SimpleNamespace(name=name, op="linear", config=cfg, t_compute_s=t_compute,
                           t_sync_s=t_sync)


def test_a_run_report_shows_each_workers_computing_and_the_waiting_it_caused():
    """Two workers, two steps, two layers: worker 1 computes layer b 10 ms longer, so worker 0
    waits 10 ms in b's gradient exchange; the report gives each worker's computing and that
    wait (the imbalance a prediction of equal workers misses), worked by hand."""
    from types import SimpleNamespace

    from explorer.engine.runtime.executor import PHASES
    from explorer.engine.runtime.report import format_report
    ph = {p: i for i, p in enumerate(PHASES)}

    def timings(b_compute, b_sync):
        t = [[0.0] * len(PHASES) for _ in range(2)]          # layers a, b
        t[0][ph["fwd_compute"]], t[0][ph["bwd_compute"]] = 0.010, 0.020
        t[1][ph["fwd_compute"]], t[1][ph["bwd_compute"]] = b_compute / 3, 2 * b_compute / 3
        t[1][ph["sync"]] = b_sync
        return [v for row in t for v in row]

    part = [[False, False, False], [False, False, True]]     # b's gradient is exchanged
    per_rank = [([0.075, 0.075], timings(0.030, 0.015) + timings(0.030, 0.015), part),
                ([0.075, 0.075], timings(0.040, 0.005) + timings(0.040, 0.005), part)]
    plan = SimpleNamespace(model="m", spec="m", batch=2, model_args={}, algo="data",
                           preset="local", n_devices=2, predicted_step_time_s=0.06,
                           breakdown={"compute_s": 0.06}, edges=[], pipeline=None,
                           layers=[_layer("a", 0.03, 0.0), _layer("b", 0.03, 0.005)])
    out = worker.summarize(plan, ["a", "b"], per_rank, PHASES)
    assert out["measured_worker_compute_s"] == pytest.approx([0.060, 0.070])
    assert out["measured_wait_s"] == pytest.approx(0.010)
    b = out["layers"][1]
    assert b["measured_comm_s"] == pytest.approx(0.005) and \
        b["measured_wait_s"] == pytest.approx(0.010)
    assert "per worker computing: 60.0, 70.0 ms; waiting for slower workers in exchanges " \
           "10.0 ms per step" in format_report(out)

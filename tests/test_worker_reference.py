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

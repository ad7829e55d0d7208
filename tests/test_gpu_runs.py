"""Every plan kind on CUDA, checked against one device: what ``explorer run`` does on a GPU
machine.  All tests here are marked ``gpu`` and skip where torch sees no CUDA GPU (CI); on a GPU
machine they run the layer-wise executor, Tofu's tile-local executor, compiled placements, the
exported ``torchrun`` program and calibration on the GPU, one worker per GPU (NCCL) and two
workers sharing one GPU (gloo, host-staged transfers)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.multiprocess]

MLP = dict(layers=2, hidden=32)
GPT = dict(layers=1, hidden=32, heads=2, seq_len=8, vocab=64)


def _doc(model, algo, batch, devices, dtype="fp32", **margs):
    from explorer import service
    req = service.Request(model=model, preset="local", devices=devices, batch=batch,
                          algo=algo, model_args=margs, dtype=dtype)
    return service.run_method(req).document()


def _gpus() -> int:
    import torch
    return torch.cuda.device_count()


def _run(doc, **kw):
    from explorer.engine.runtime.dispatch import run_document
    return run_document(doc, steps=2, warmup=1, timeout_s=300, device="cuda", **kw)


def _on_cuda(res, workers):
    assert res["reference_ok"], res.get("reference")
    assert res["device_kind"] == "cuda", res.get("worker_devices")
    assert all(str(d).startswith("cuda") for d in res["worker_devices"])
    assert res["measured_step_time_s"] > 0
    assert res["shared"] == (workers > _gpus())
    if res["shared"]:
        assert res["backend"] == "gloo" and "not a prediction target" in res["timing_note"]
    else:
        assert res["backend"] == "nccl"


@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize("model,algo,margs", [
    ("lenet5", "data", {}), ("lenet5", "model", {}), ("lenet5", "optcnn", {}),
    ("mlp", "megatron", MLP), ("gpt2", "optcnn", GPT),
    ("resnet50", "data", dict(image_size=32, num_classes=10)),
])
def test_layerwise_plans_run_on_cuda(model, algo, margs, workers):
    res = _run(_doc(model, algo, 4, workers, **margs))
    _on_cuda(res, workers)
    peak = res.get("measured_peak_memory_bytes")
    assert peak and max(p for p in peak if p) > 0           # torch.cuda.max_memory_allocated


@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize("model,margs", [("mlp", MLP), ("lenet5", {}), ("gpt2", GPT)])
def test_tofu_plans_run_on_cuda(model, margs, workers):
    res = _run(_doc(model, "tofu", 4, workers, **margs))
    _on_cuda(res, workers)
    assert all(p > 0 for p in res["measured_peak_memory_bytes"])


@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize("algo", ["m-topo", "celeritas", "m-etf"])
def test_placements_run_on_cuda(algo, workers):
    res = _run(_doc("mlp", algo, 4, workers, **MLP))
    _on_cuda(res, workers)


@pytest.mark.parametrize("dtype", ["tf32", "bf16"])
def test_precisions_run_on_cuda(dtype):
    res = _run(_doc("lenet5", "data", 4, 1, dtype=dtype))
    _on_cuda(res, 1)
    assert res["dtype"] == dtype


def test_explorer_run_on_the_gpu_from_the_command_line(tmp_path, capsys):
    """The issue's report: search on ``local`` with ``--devices 1 --cost measured``, run."""
    from explorer.cli import main
    plan = tmp_path / "p.json"
    assert main(["search", "lenet5", "--batch", "8", "--preset", "local", "--devices", "1",
                 "--out", str(plan)]) == 0
    assert main(["run", str(plan), "--steps", "3", "--json"]) == 0
    out = capsys.readouterr().out
    import json
    res = json.loads(out[out.index("{"):])
    assert res["reference_ok"] and res["device_kind"] == "cuda"


def test_local_is_the_gpu():
    import torch

    from explorer.engine.core import devices as D
    g = D.local(1)
    assert g.devices[0].kind == torch.cuda.get_device_name(0)
    assert g.devices[0].memory == torch.cuda.get_device_properties(0).total_memory


def test_calibrate_measures_the_gpu():
    from explorer.engine.runtime.calibrate import calibrate
    cal = calibrate(None, quick=True)
    assert cal["device_kind"] == "cuda" and cal["backend"] in ("cuda", "nccl")
    by = cal["matmul_flops_by_dtype"]
    assert by["bf16"] > by["fp32"] > 1e12                 # a GPU, not one CPU thread
    assert cal["mem_bw"] > 1e11


def test_calibrate_with_a_model_profiles_on_the_gpu():
    import torch

    from explorer.engine.core.profile import Profiler
    from explorer.engine.runtime.calibrate import calibrate
    calibrate(None, model="lenet5", batch=8, quick=True)
    prof = Profiler()
    try:
        rows = prof.rows()
    finally:
        prof.close()
    name = torch.cuda.get_device_name(0)
    assert rows and all(name in r[0] or "cuda" in r[0] for r in rows), {r[0] for r in rows}
    assert min(r[3] for r in rows) < 1e-3         # kernels, not first-call start-up


@pytest.mark.parametrize("nproc", [1, 2])
def test_exported_program_runs_on_the_gpu(tmp_path, capsys, nproc):
    from explorer.cli import main
    plan, prog = tmp_path / "p.json", tmp_path / "prog.py"
    assert main(["search", "mlp", "-a", "layers=2", "-a", "hidden=16", "-b", "8", "-n",
                 str(nproc), "--preset", "local", "--algo", "megatron" if nproc > 1 else "data",
                 "-o", str(plan)]) == 0
    assert main(["export", str(plan), "--to", "torch", "-o", str(prog)]) == 0
    capsys.readouterr()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           "--nproc_per_node", str(nproc), str(prog), "--steps", "3", "--check"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "check: passed" in proc.stdout

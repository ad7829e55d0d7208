"""``benchmarks/gpu.py``: its CPU-safe parts (arguments, the table, memory figures) and its
refusal without a GPU.  The benchmark itself needs CUDA and is not run here."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PATH = ROOT / "benchmarks" / "gpu.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("gpu_benchmark", PATH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _cuda() -> bool:
    import torch
    return torch.cuda.is_available()


@pytest.mark.multiprocess
@pytest.mark.skipif(_cuda(), reason="this machine has a GPU: the benchmark would run")
def test_without_a_gpu_it_says_so_in_one_line_and_exits_2():
    p = subprocess.run([sys.executable, str(PATH), "--quick"], capture_output=True, text=True,
                       timeout=120, cwd=ROOT)
    assert p.returncode == 2
    assert p.stderr == "no CUDA GPU: benchmarks/gpu.py needs one\n" and p.stdout == ""


def test_arguments(bench):
    a = bench.parse_args([])
    assert a.models == ["resnet50", "vgg16", "inception_v3", "gpt2"]
    assert a.kinds == ["layerwise", "layerwise-bf16", "roofline-bf16", "tofu", "placement"]
    assert a.workers == 1 and a.truth == ["fp32", "tf32", "bf16"]
    assert bench.KINDS["layerwise-bf16"] == ("optcnn", "measured", "bf16")
    assert bench.KINDS["roofline-bf16"] == ("optcnn", "analytic", "bf16")
    assert bench.MODELS["inception_v3"][0] == 32 and bench.MODELS["gpt2"][0] == 8
    a = bench.parse_args(["--models", "gpt2", "--kinds", "tofu", "--workers", "2"])
    assert a.models == ["gpt2"] and a.kinds == ["tofu"] and a.workers == 2
    with pytest.raises(SystemExit) as info:
        bench.parse_args(["--models", "gpt3"])
    assert info.value.code == 2


def test_table(bench):
    rows = [{"model": "vgg16", "batch": 64, "dtype": "fp32", "kind": "plain PyTorch",
             "truth_s": 0.1168, "measured_s": 0.1168, "mem_measured": 7.18 * 2 ** 30},
            {"model": "vgg16", "batch": 64, "dtype": "fp32", "kind": "layerwise (optcnn)",
             "truth_s": 0.1168, "predicted_s": 0.121, "measured_s": 0.110,
             "mem_predicted": 8 * 2 ** 30, "mem_measured": 7.5 * 2 ** 30},
            {"model": "gpt2", "batch": 8, "kind": "tofu (tofu)", "note": "failed: X"}]
    text = bench.format_table(rows)
    lines = text.splitlines()
    assert len(lines) == 5 and lines[0].startswith("| model")
    assert "| 116.8 " in lines[2] and "| 7.18 " in lines[2]
    assert "+10 %" in lines[3] and "| 8.00 " in lines[3] and "| 7.50 " in lines[3]
    assert "failed: X" in lines[4] and lines[4].count("—") >= 5
    assert len({len(ln) for ln in lines}) == 1                   # aligned


def test_figures(bench):
    assert bench.rel_error(1.1, 1.0) == pytest.approx(0.1)
    assert bench.rel_error(None, 1.0) is None and bench.rel_error(1.0, 0) is None
    assert bench.plan_memory({"peak_memory_bytes": [3.0, 5.0]}) == 5.0
    assert bench.plan_memory({"memory_per_device_bytes": 7}) == 7.0
    assert bench.plan_memory({}) is None
    assert bench.run_memory({"measured_peak_memory_bytes": [1, 4]}) == 4.0
    assert bench.run_memory({"measured_allocated_peak_bytes": [2, 3]}) == 3.0
    assert bench.run_memory({"measured_allocated_peak_bytes": None}) is None


def test_step_spread(bench):
    assert bench.step_spread([1.0, 1.0, 1.0]) is None            # too few to say
    assert bench.step_spread([1.0, 1.0, 1.0, 1.0]) == 0.0
    s = bench.step_spread([0.9, 1.0, 1.0, 1.1, 1.0])
    assert 0 < s < 0.1
    assert bench.step_spread(None) is None


def test_run_memory_is_the_allocators(bench):
    """A Tofu run reports its tile accounting as ``measured_peak_memory_bytes``: the
    benchmark's measured column is the allocator's peak."""
    res = {"measured_peak_memory_bytes": [100, 200], "measured_allocated_peak_bytes": [150, 260]}
    assert bench.run_memory(res) == 260
    assert bench.run_memory({"measured_peak_memory_bytes": [5, 7]}) == 7
    assert bench.run_memory({"measured_allocated_peak_bytes": [None, 3]}) is None

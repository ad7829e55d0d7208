"""Running plans on GPUs, what can be checked without one: the suite's CPU default, the choice
of worker devices and backends, device plumbing in the executors, GPU presets, ``local`` and
calibration on a (simulated) GPU machine.  Tests that need CUDA are marked ``gpu``."""

from __future__ import annotations

import os

import pytest

from explorer.engine.core import devices as D


# --------------------------------------------------------------------------------------------
# the suite runs its plans on CPU workers, on every machine
# --------------------------------------------------------------------------------------------

def test_tests_ask_for_cpu_workers_explicitly():
    assert os.environ["EXPLORER_DEVICE"] == "cpu"
    assert D.worker_device_kind() == "cpu"
    assert D.worker_device_kind(gpus=8) == "cpu"        # even where there are GPUs
    g = D.local(2)
    assert g.kind == "cpu-worker" and g.meta["backend"] == "gloo"


def test_worker_device_kind():
    assert D.worker_device_kind("auto", gpus=0) == "cpu"
    assert D.worker_device_kind("auto", gpus=2) == "cuda"
    assert D.worker_device_kind("CPU", gpus=2) == "cpu"
    with pytest.raises(D.DeviceRequestError, match="no CUDA GPU"):
        D.worker_device_kind("cuda", gpus=0)
    with pytest.raises(D.DeviceRequestError, match="use cpu, cuda or auto"):
        D.worker_device_kind("tpu", gpus=0)


def test_device_env_is_read(monkeypatch):
    monkeypatch.setenv("EXPLORER_DEVICE", "auto")
    assert D.worker_device_kind(gpus=0) == "cpu"
    assert D.worker_device_kind(gpus=1) == "cuda"
    monkeypatch.setenv("EXPLORER_DEVICE", "gpu")
    with pytest.raises(D.DeviceRequestError, match="EXPLORER_DEVICE"):
        D.worker_device_kind(gpus=1)


@pytest.mark.gpu
def test_gpu_marked_tests_see_the_gpus():
    """Skipped without CUDA (the conftest hook); on a GPU machine the marker keeps ``auto``."""
    import torch
    assert torch.cuda.is_available()
    assert D.worker_device_kind() == "cuda"

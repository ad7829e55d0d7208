"""Tests for explorer.engine.core.devices: presets, custom clusters, the local machine."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from explorer.engine.core import devices as D
from explorer.engine.core.devices import Device, DeviceGraph, GB, GiB, from_json, local, preset
from explorer.errors import ExplorerError, UnknownPreset


def off_diagonal(g):
    return g.bw[~np.eye(g.n, dtype=bool)]


# --------------------------------------------------------------------------------------------
# presets
# --------------------------------------------------------------------------------------------


def test_p100_nvlink_4_figures():
    g = preset("p100-nvlink-4")
    assert g.n == 4 and g.kind == "P100"
    for d in g.devices:
        assert d.peak_flops == pytest.approx(10.6e12)
        assert d.memory == 16 * GiB
        assert d.mem_bw == pytest.approx(732e9)
        assert d.node == 0
    assert (off_diagonal(g) == 40e9).all()           # NVLink inside the node
    assert np.isinf(np.diag(g.bw)).all()             # never send to yourself
    assert (np.diag(g.latency) == 0).all()


def test_k80_pcie_8_links():
    g = preset("k80-pcie-8")
    assert g.n == 8 and g.kind == "K80"
    assert (off_diagonal(g) == 21e9).all()           # 21 GB/s peer to peer everywhere
    assert g.devices[0].peak_flops == pytest.approx(4.37e12)


def test_p100_ib_16_nvlink_inside_infiniband_between():
    g = preset("p100-ib-16")
    assert g.n == 16
    assert [d.node for d in g.devices] == [i // 4 for i in range(16)]
    assert g.bandwidth(0, 1) == 40e9 and g.bandwidth(0, 3) == 40e9   # same node
    assert g.bandwidth(0, 4) == 12.5e9 and g.bandwidth(15, 0) == 12.5e9  # EDR IB 100 Gb/s
    assert g.bandwidth(0, 1) > g.bandwidth(0, 4)
    assert g.latency[0, 4] > g.latency[0, 1] > 0


def test_v100_pcie_4():
    g = preset("v100-pcie-4")
    assert g.n == 4 and g.devices[0].peak_flops == pytest.approx(14e12)
    assert (off_diagonal(g) == 16e9).all()
    # Celeritas Section 6.1: "4 NVIDIA Tesla V100 GPUs (each has 32GB memory)"
    assert all(d.memory == 32 * 1024 ** 3 for d in g.devices)


@pytest.mark.parametrize("n, nodes", [(1, [0]), (4, [0] * 4), (6, [0] * 4 + [1] * 2),
                                      (8, [0] * 4 + [1] * 4)])
def test_p100_cluster_sized_to_devices(n, nodes):
    g = preset("p100-cluster", n)
    assert g.n == n
    assert [d.node for d in g.devices] == nodes
    if n == 8:  # 2 nodes of 4
        assert g.bandwidth(3, 4) == 12.5e9 and g.bandwidth(4, 7) == 40e9
    assert preset("p100-cluster").n == 4   # default size


def test_preset_subset_keeps_first_devices():
    g = preset("p100-ib-16", 8)
    assert g.n == 8 and [d.name for d in g.devices] == [f"p100:{i}" for i in range(8)]
    assert g.bw.shape == (8, 8) and g.bandwidth(0, 5) == 12.5e9


def test_asking_more_devices_than_preset_has():
    with pytest.raises(ValueError) as ei:
        preset("p100-nvlink-4", 5)
    msg = str(ei.value)
    assert "p100-nvlink-4" in msg and "4 devices" in msg and "5" in msg


@pytest.mark.parametrize("name", ["k80-pcie-8", "p100-nvlink-4", "p100-cluster", "local"])
def test_asking_zero_devices_is_an_error(name, tmp_path, monkeypatch):
    monkeypatch.setenv("EXPLORER_HOME", str(tmp_path))
    with pytest.raises(ValueError, match=r"≥ 1, got 0"):
        preset(name, 0)


def test_unknown_preset_lists_names():
    with pytest.raises(UnknownPreset) as ei:
        preset("tpu-v9")
    msg = str(ei.value)
    assert "'tpu-v9'" in msg
    for name in D.PRESETS:
        assert name in msg
    assert isinstance(ei.value, ExplorerError)


def test_list_presets():
    ps = D.list_presets()
    names = [p["name"] for p in ps]
    assert names == list(D.PRESETS)
    by = {p["name"]: p for p in ps}
    assert by["k80-pcie-8"]["devices"] == 8 and by["p100-cluster"]["devices"] is None
    assert all(p["description"] for p in ps)


def test_to_dict_round_numbers():
    d = preset("p100-nvlink-4").to_dict()
    assert d["name"] == "p100-nvlink-4" and len(d["devices"]) == 4
    assert d["bandwidth"][0][0] == 0 and d["bandwidth"][0][1] == 40e9   # JSON-safe diagonal
    json.dumps(d)


# --------------------------------------------------------------------------------------------
# validation of hand-built graphs
# --------------------------------------------------------------------------------------------


def _dev(i, **kw):
    base = dict(name=f"d{i}", kind="X", peak_flops=1e12, mem_bw=1e11, memory=1e9)
    base.update(kw)
    return Device(**base)


def test_device_figures_must_be_positive():
    with pytest.raises(ValueError, match=r"device d0: peak_flops=0"):
        _dev(0, peak_flops=0)
    with pytest.raises(ValueError, match=r"memory=-1"):
        _dev(0, memory=-1)


def test_device_graph_validation():
    devs = [_dev(0), _dev(1)]
    with pytest.raises(ValueError, match=r"at least one device"):
        DeviceGraph("g", [], np.zeros((0, 0)), np.zeros((0, 0)))
    with pytest.raises(ValueError, match=r"must be 2×2 for 2 devices"):
        DeviceGraph("g", devs, np.ones((3, 3)), np.ones((2, 2)))
    with pytest.raises(ValueError, match=r"positive bandwidth"):
        DeviceGraph("g", devs, np.array([[0, 0], [1e9, 0]]), np.zeros((2, 2)))


# --------------------------------------------------------------------------------------------
# custom clusters from JSON
# --------------------------------------------------------------------------------------------


CLUSTER = {
    "name": "my-box",
    "devices": [{"name": f"gpu{i}", "kind": "A100", "peak_flops": 19.5e12, "mem_bw": 1.5e12,
                 "memory": 40e9, "node": i // 2} for i in range(4)],
    "intra_node_bw": 300e9, "inter_node_bw": 25e9, "latency": 5e-6,
}


def test_custom_cluster_json(tmp_path):
    p = tmp_path / "box.json"
    p.write_text(json.dumps(CLUSTER))
    g = from_json(str(p))
    assert g.name == "my-box" and g.n == 4 and g.kind == "A100"
    assert g.bandwidth(0, 1) == 300e9 and g.bandwidth(1, 2) == 25e9
    assert g.latency[0, 3] == 5e-6 and g.latency[2, 2] == 0
    assert g.devices[3].memory == 40e9 and g.devices[3].node == 1
    # preset() accepts the path too, and restricts it to n devices
    g2 = preset(str(p), 2)
    assert g2.n == 2 and g2.bandwidth(0, 1) == 300e9


def test_custom_cluster_with_bandwidth_matrix(tmp_path):
    spec = {"devices": CLUSTER["devices"][:2], "bandwidth": [[0, 7e9], [9e9, 0]],
            "latency": [[0, 1e-6], [2e-6, 0]]}
    p = tmp_path / "pair.json"
    p.write_text(json.dumps(spec))
    g = from_json(str(p))
    assert g.name == "pair"                       # defaults to the file's stem
    assert g.bandwidth(0, 1) == 7e9 and g.bandwidth(1, 0) == 9e9
    assert g.latency[1, 0] == 2e-6


@pytest.mark.parametrize("text, needle", [
    ('{"devices": [{"name": "a", "mem_bw": 1, "memory": 1}], "intra_node_bw": 1}',
     "peak_flops"),                                           # missing field
    ("{not json", "box.json"),                                # syntax error
    ('{"devices": [{"name": "a", "peak_flops": -5, "mem_bw": 1, "memory": 1}], '
     '"intra_node_bw": 1}', "peak_flops=-5"),                  # bad value
    ('{"devices": [{"name": "a", "peak_flops": 1, "mem_bw": 1, "memory": 1}, '
     '{"name": "b", "peak_flops": 1, "mem_bw": 1, "memory": 1}], '
     '"bandwidth": [[0, 1, 1], [1, 0, 1], [1, 1, 0]]}', "2×2"),  # wrong matrix size
    ('{"devices": [{"name": "a", "peak_flops": 1, "mem_bw": 1, "memory": 1}]}',
     "intra_node_bw"),                                        # no bandwidth at all
])
def test_malformed_cluster_json(tmp_path, text, needle):
    p = tmp_path / "box.json"
    p.write_text(text)
    with pytest.raises(UnknownPreset) as ei:
        from_json(str(p))
    msg = str(ei.value)
    assert needle in msg
    assert "box.json" in msg and "explorer presets" in msg


def test_missing_cluster_file(tmp_path):
    with pytest.raises(UnknownPreset, match=r"not found"):
        preset(str(tmp_path / "none.json"))


# --------------------------------------------------------------------------------------------
# the local machine
# --------------------------------------------------------------------------------------------


@pytest.fixture
def no_calibration(tmp_path, monkeypatch):
    monkeypatch.setenv("EXPLORER_HOME", str(tmp_path))
    import torch
    if torch.cuda.device_count():
        pytest.skip("this machine has CUDA GPUs; the CPU-worker path is not used")
    return tmp_path


def test_local_gives_cpu_workers(no_calibration):
    g = local(2)
    assert g.n == 2 and g.kind == "cpu-worker"
    assert g.meta["backend"] == "gloo" and g.meta["calibrated"] is False
    assert g.meta["cores"] == (os.cpu_count() or 1)
    assert [d.name for d in g.devices] == ["cpu:0", "cpu:1"]
    assert g.bandwidth(0, 1) == 4 * GB
    if (os.cpu_count() or 1) >= 2:
        assert "warning" not in g.meta
    assert preset("local", 2).n == 2
    assert local().n == (os.cpu_count() or 1)   # default: one worker per core


def test_local_warns_when_more_workers_than_cores(no_calibration):
    cores = os.cpu_count() or 1
    g = local(cores + 2)
    assert g.n == cores + 2
    assert f"{cores + 2} CPU workers on {cores} cores" in g.meta["warning"]


def test_local_uses_calibration_file(no_calibration):
    (no_calibration / "local.json").write_text(json.dumps(
        {"peak_flops": 1.25e11, "mem_bw": 2e10, "link_bw": 3e9, "latency": 4e-5}))
    g = local(2)
    assert g.meta["calibrated"] is True
    assert g.devices[0].peak_flops == 1.25e11 and g.devices[1].mem_bw == 2e10
    assert g.bandwidth(0, 1) == 3e9 and g.latency[0, 1] == 4e-5


def test_local_carries_the_calibrated_gradient_swap(no_calibration):
    # uncalibrated: the add at the copy bandwidth, no per-message cost
    g = local(2)
    assert g.meta["swap"] == {"message_s": 0.0, "add_s": 0.0, "add_bw": 8 * GB}
    (no_calibration / "local.json").write_text(json.dumps(
        {"mem_bw": 2e10, "swap_message_s": 2.5e-4, "add_s": 1.3e-6, "add_bw": 2.6e10}))
    assert local(2).meta["swap"] == {"message_s": 2.5e-4, "add_s": 1.3e-6, "add_bw": 2.6e10}


def test_an_absurd_device_count_is_refused_before_anything_is_built():
    import pytest

    from explorer.engine.core.devices import preset
    with pytest.raises(ValueError, match="100000000 devices need .* GiB"):
        preset("p100-cluster", 100_000_000)

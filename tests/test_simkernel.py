"""The compiled simulator loop (explorer/engine/placement/simkernel.py) gives the very same
schedule as the Python loop of explorer/engine/placement/simulator.py, on random graphs and
every kind of device graph: port contention or none, rendezvous with send and receive calls
(local CPU workers), shared cores, co-located transfers."""

import numpy as np
import pytest

from explorer.engine.core.devices import Device, DeviceGraph
from explorer.engine.placement import simkernel, simulator
from explorer.engine.placement.placement_graph import from_networkx
from tests._helpers import random_dag

pytest.importorskip("numba")


def _devices(nd, meta):
    devs = [Device(f"d{i}", "test", 1e12, 1e12, 1e12) for i in range(nd)]
    rng = np.random.default_rng(nd)
    bw = rng.uniform(1e9, 8e9, (nd, nd))
    return DeviceGraph("rand", devs, bw, np.full((nd, nd), 2e-5), "", meta)


P2P = {"bw": 3e9, "latency": 4e-5, "send_s": 3e-5, "send_bw": 5e9, "recv_s": 2e-5,
       "recv_bw": 6e9}
KINDS = {
    "ports": ({}, "ports"),
    "no-contention": ({}, "none"),
    "rendezvous-calls": ({"p2p": P2P}, "ports"),
    "shared-cores": ({"cores": 2}, "ports"),
    "shared-rendezvous": ({"cores": 1, "p2p": P2P}, "ports"),
}


def _both(pg, placement, contention, priority=None, monkeypatch=None):
    monkeypatch.setattr(simkernel, "MIN_NODES", 0)
    fast = simulator.simulate(pg, placement, priority=priority, contention=contention)
    monkeypatch.setenv("EXPLORER_SIM_KERNEL", "0")
    slow = simulator.simulate(pg, placement, priority=priority, contention=contention)
    monkeypatch.delenv("EXPLORER_SIM_KERNEL")
    return fast, slow


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("seed", range(4))
def test_the_compiled_loop_gives_the_same_schedule(kind, seed, monkeypatch):
    meta, contention = KINDS[kind]
    g, _ = random_dag(seed, n=90, ndev=4)
    pg = from_networkx(g, _devices(4, meta))
    rng = np.random.default_rng(seed)
    placement = rng.integers(0, 4, pg.n)
    prio = rng.permutation(pg.n).astype(float) if seed % 2 else None
    fast, slow = _both(pg, placement, contention, prio, monkeypatch)
    assert np.array_equal(fast.start, slow.start) and np.array_equal(fast.finish, slow.finish)
    assert fast.makespan == slow.makespan and fast.comm_bytes == slow.comm_bytes
    assert np.array_equal(np.asarray(fast.busy), np.asarray(slow.busy))
    assert fast.transfers == slow.transfers
    assert np.array_equal(fast.peak_memory, slow.peak_memory)


@pytest.fixture(scope="module")
def aot_cache(tmp_path_factory):
    """The loop compiled ahead of time into a cache folder of its own (seconds, once)."""
    cache = tmp_path_factory.mktemp("kernels")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("NUMBA_CACHE_DIR", str(cache))
        try:
            path = simkernel.build()
        except Exception as exc:                 # noqa: BLE001 - no compiler here
            pytest.skip(f"no ahead-of-time build on this machine: {exc}")
    return cache, path


@pytest.mark.parametrize("kind", list(KINDS))
def test_the_ahead_of_time_module_gives_the_same_schedule(kind, aot_cache, monkeypatch):
    cache, path = aot_cache
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(cache))
    assert simkernel.aot_path() == path
    fn = simkernel._load_aot()
    assert fn is not None and not hasattr(fn, "py_func")        # not a numba dispatcher
    monkeypatch.setattr(simkernel, "_KERNEL", fn)
    meta, contention = KINDS[kind]
    g, _ = random_dag(7, n=120, ndev=4)
    pg = from_networkx(g, _devices(4, meta))
    placement = np.random.default_rng(7).integers(0, 4, pg.n)
    fast, slow = _both(pg, placement, contention, None, monkeypatch)
    assert np.array_equal(fast.start, slow.start) and np.array_equal(fast.finish, slow.finish)
    assert fast.transfers == slow.transfers and fast.makespan == slow.makespan


def test_a_placement_with_the_module_built_never_loads_numba(aot_cache, tmp_path):
    import os
    import subprocess
    import sys
    cache, _ = aot_cache
    code = ("import sys, numpy as np\n"
            "from tests._helpers import random_dag\n"
            "from explorer.engine.placement import simkernel, simulator\n"
            "from explorer.engine.placement.placement_graph import from_networkx\n"
            "g, devs = random_dag(3, n=simkernel.MIN_NODES + 50, ndev=4)\n"
            "pg = from_networkx(g, devs)\n"
            "r = simulator.simulate(pg, np.arange(pg.n) % 4)\n"
            "print(simkernel.kind(), 'numba' in sys.modules, r.makespan > 0)\n")
    env = dict(os.environ, NUMBA_CACHE_DIR=str(cache), EXPLORER_HOME=str(tmp_path))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=120, cwd=os.path.dirname(os.path.dirname(__file__)))
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["aot", "False", "True"]


def test_a_damaged_module_falls_back_to_numbas_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path))
    path = simkernel.aot_path()
    path.parent.mkdir(parents=True)
    path.write_bytes(b"not a shared object")
    assert simkernel._load_aot() is None
    monkeypatch.setattr(simkernel, "_KERNEL", None)
    monkeypatch.setattr(simkernel, "_KIND", "")
    assert simkernel.warm() and simkernel.kind() == "jit"

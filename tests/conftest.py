"""Shared fixtures: every test runs with its own EXPLORER_HOME (profile cache, plan history,
background-callback cache), so tests never touch the user's files or each other's.

Two caches are shared by the whole session instead, because what they hold is keyed by content
and costs seconds to make: traced models (``EXPLORER_CAPTURE_CACHE``, keyed by the code's
digest) and numba's compiled kernels (``NUMBA_CACHE_DIR``).  The tests of the capture cache and
of damaged stores keep the home's own file (:data:`OWN_CAPTURE_CACHE`).

Tests run their plans on CPU worker processes on every machine: ``EXPLORER_DEVICE=cpu`` (the
local preset, the launcher and the profiler all read it), so the suite passes the same on a
machine with a GPU.  A test that needs CUDA is marked ``gpu`` (it keeps ``auto``: the GPUs)
and is skipped where torch sees no CUDA GPU."""

import os

import pytest


def _has_cuda() -> bool:
    try:
        import torch
        return bool(torch.cuda.is_available())
    except Exception:  # noqa: BLE001 - no usable torch build is no GPU
        return False


def pytest_collection_modifyitems(config, items):
    """Skip the tests marked ``gpu`` when torch sees no CUDA GPU."""
    gpu_items = [item for item in items if item.get_closest_marker("gpu") is not None]
    if not gpu_items or _has_cuda():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (torch.cuda.is_available() is False)")
    for item in gpu_items:
        item.add_marker(skip)


#: test modules that test the capture cache file in the home itself
OWN_CAPTURE_CACHE = {"test_capture_cache", "test_storage"}


@pytest.fixture(scope="session")
def _shared_caches(tmp_path_factory):
    # under pytest-xdist the workers share them too (beside their own base folders; SQLite
    # and numba's cache take concurrent writers)
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = tmp_path_factory.getbasetemp().parent / "shared-caches"
        root.mkdir(exist_ok=True)
    else:
        root = tmp_path_factory.mktemp("shared-caches")
    return {"EXPLORER_CAPTURE_CACHE": str(root / "captures.sqlite"),
            "NUMBA_CACHE_DIR": str(root / "numba")}


@pytest.fixture(scope="session", autouse=True)
def _session_home(tmp_path_factory, _shared_caches):
    """The environment module- and session-scoped fixtures see: they are set up before any
    test's own home, and must not read or write the user's ``~/.explorer`` (a calibration
    there would change what they predict) - a home of the session's own, the shared caches,
    CPU workers."""
    env = {"EXPLORER_HOME": str(tmp_path_factory.mktemp("session-home")),
           "EXPLORER_DEVICE": "cpu", **_shared_caches}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    yield
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.fixture(autouse=True)
def _isolated_home(request, tmp_path_factory, monkeypatch, _shared_caches):
    home = tmp_path_factory.mktemp("explorer-home")
    monkeypatch.setenv("EXPLORER_HOME", str(home))
    monkeypatch.setenv("NUMBA_CACHE_DIR", _shared_caches["NUMBA_CACHE_DIR"])
    if request.module.__name__.rpartition(".")[2] in OWN_CAPTURE_CACHE:
        monkeypatch.delenv("EXPLORER_CAPTURE_CACHE", raising=False)
    else:
        monkeypatch.setenv("EXPLORER_CAPTURE_CACHE", _shared_caches["EXPLORER_CAPTURE_CACHE"])
    yield home


@pytest.fixture(autouse=True)
def _cpu_workers(request, monkeypatch):
    """CPU workers unless the test is marked ``gpu`` (then the machine's choice: CUDA)."""
    if request.node.get_closest_marker("gpu") is None:
        monkeypatch.setenv("EXPLORER_DEVICE", "cpu")
    else:
        monkeypatch.setenv("EXPLORER_DEVICE", "auto")
    yield


class _InFlight:
    """Requests the test servers are serving now (Flask's signals, every app)."""

    def __init__(self):
        import threading
        self.n, self.lock = 0, threading.Lock()

    def started(self, *_a, **_k):
        with self.lock:
            self.n += 1

    def ended(self, *_a, **_k):
        with self.lock:
            self.n -= 1


_IN_FLIGHT = None


@pytest.fixture(autouse=True)
def _callbacks_finish_before_the_server_stops(request):
    """A browser test may pass while a callback still computes (a search, a trace): dash's
    thread runner then stops the server by raising into that thread, and an exception landing
    inside torch's tracer aborted the whole test process.  Before the server stops, wait
    (at most two minutes) for the requests in flight to end."""
    global _IN_FLIGHT
    if "dash_thread_server" not in request.fixturenames:
        yield
        return
    import time

    import flask
    if _IN_FLIGHT is None:
        _IN_FLIGHT = _InFlight()
        flask.request_started.connect(_IN_FLIGHT.started)
        flask.request_tearing_down.connect(_IN_FLIGHT.ended)
    request.getfixturevalue("dash_thread_server")     # set up first, so stopped after this
    yield
    end = time.monotonic() + 120
    while _IN_FLIGHT.n > 0 and time.monotonic() < end:
        time.sleep(0.1)


@pytest.fixture(autouse=True)
def _free_dash_port(request):
    """A browser test's Dash server takes a port the OS says is free, not dash's counter
    from 58050 (which every pytest process starts alike: two runs at once would collide)."""
    if request.node.get_closest_marker("browser") is not None:
        import socket

        from dash.testing.application_runners import BaseDashRunner
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            BaseDashRunner._next_port = sock.getsockname()[1]
    yield

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


class _Chromium:
    """The session's one headless Chromium (dash.testing's :class:`Browser`), started by the
    first browser test and quit at the end of the session: starting a browser costs about
    two seconds, more than many browser tests' own clicks.  Each test still gets its own
    server (a new port: a new origin, so no storage is shared), its own download folder,
    window size, wait timeout and console log; a browser a test left broken is replaced."""

    def __init__(self, config):
        self.config = config
        self.browser = None
        self.size = None

    def get(self, download: str):
        from dash.testing.browser import Browser
        if self.browser is not None:
            try:
                self.browser.driver.window_handles       # alive?
            except Exception:  # noqa: BLE001 - whatever broke it, start another
                self.close()
        if self.browser is None:
            cfg = self.config
            self.browser = Browser(
                browser=cfg.getoption("webdriver"), remote=cfg.getoption("remote"),
                remote_url=cfg.getoption("remote_url"), headless=cfg.getoption("headless"),
                options=cfg.hook.pytest_setup_options(), download_path=download,
                percy_assets_root=cfg.getoption("percy_assets"),
                percy_finalize=cfg.getoption("nopercyfinalize"), pause=cfg.getoption("pause"))
            self.size = self.browser.driver.get_window_size()
        return self.browser

    def reset(self):
        """After a test: its extra windows closed, a blank page, the first size again."""
        try:
            drv = self.browser.driver
            handles = drv.window_handles
            for h in handles[1:]:
                drv.switch_to.window(h)
                drv.close()
            drv.switch_to.window(handles[0])
            drv.get("about:blank")
            drv.set_window_size(self.size["width"], self.size["height"])
        except Exception:  # noqa: BLE001 - the next test gets a fresh browser
            self.close()

    def close(self):
        if self.browser is not None:
            try:
                self.browser.driver.quit()
            except Exception:  # noqa: BLE001 - already gone
                pass
            self.browser = None


@pytest.fixture(scope="session")
def _chromium(request):
    shared = _Chromium(request.config)
    yield shared
    shared.close()


@pytest.fixture
def dash_duo(dash_thread_server, _chromium, tmp_path):
    """dash.testing's ``dash_duo`` (a server and a browser for one test) on the session's
    shared Chromium (:class:`_Chromium`)."""
    from dash.testing.composite import DashComposite
    download = tmp_path / "download"
    download.mkdir()
    browser = _chromium.get(str(download))
    duo = DashComposite.__new__(DashComposite)
    duo.__dict__.update(browser.__dict__)
    duo.server = dash_thread_server
    duo._download_path = str(download)
    duo._url = ""
    duo._window_idx = 0
    duo.wait_timeout = browser.wait_timeout          # a wait of its own (tests change it)
    try:
        duo.driver.execute_cdp_cmd("Page.setDownloadBehavior",
                                   {"behavior": "allow", "downloadPath": str(download)})
    except Exception:  # noqa: BLE001 - a driver without CDP keeps its first folder
        pass
    duo.reset_log_timestamp()                        # earlier tests' console is not this one's
    try:
        yield duo
    finally:
        _chromium.reset()

"""The launcher's fork server (explorer/engine/runtime/launcher.py): workers are forked from a
server that imported torch once, they take the launcher's environment as it is now, and a
process forked from a launcher (the app's background callbacks are) can launch workers too."""

from __future__ import annotations

import multiprocessing
import os

import pytest

from explorer.engine.runtime import launcher

pytestmark = pytest.mark.multiprocess


def _report(rank, world, device, payload, send):
    send("result", "pid", os.getpid())
    send("result", "marker", os.environ.get("EXPLORER_TEST_MARKER"))


def _launch_in_forked_child(out):
    """Runs in a process forked (not spawned) from the test process."""
    try:
        got = launcher.start_workers(2, _report, None, timeout_s=60)
        out.put(("ok", sorted(v["marker"] for v in got.results.values())))
    except BaseException as exc:  # noqa: BLE001 - report whatever it was to the test
        out.put(("error", f"{type(exc).__name__}: {exc}"))


def test_workers_take_the_launchers_environment_as_it_is_now(monkeypatch):
    monkeypatch.setenv("EXPLORER_TEST_MARKER", "first")
    first = launcher.start_workers(2, _report, None, timeout_s=60)
    monkeypatch.setenv("EXPLORER_TEST_MARKER", "second")      # after the server started
    second = launcher.start_workers(2, _report, None, timeout_s=60)
    assert [v["marker"] for v in first.results.values()] == ["first", "first"]
    assert [v["marker"] for v in second.results.values()] == ["second", "second"]
    assert not set(first.pids) & {os.getpid()}


def test_a_process_forked_from_a_launcher_launches_workers(monkeypatch):
    """The fork server this process started is not the forked child's child: without
    forgetting it the child's first launch failed with ``ChildProcessError``."""
    monkeypatch.setenv("EXPLORER_TEST_MARKER", "forked")
    launcher.start_workers(2, _report, None, timeout_s=60)      # this process's fork server
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    child = ctx.Process(target=_launch_in_forked_child, args=(out,))
    child.start()
    try:
        status, what = out.get(timeout=120)
    finally:
        child.join(timeout=30)
        if child.is_alive():
            child.kill()
    assert status == "ok", what
    assert what == ["forked", "forked"]

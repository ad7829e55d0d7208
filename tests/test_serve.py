"""Serving beyond this machine safely: loopback detection, the exposure warning, host and port
errors, the model-file switch (unit tests, and through ``explorer serve``)."""

import socket

import dash
import pytest

from explorer import app as A
from explorer.cli import main
from explorer.views import state

pytestmark = pytest.mark.multiprocess   # every test here starts worker processes


@pytest.mark.parametrize("host, loop", [
    ("127.0.0.1", True), ("::1", True), ("[::1]", True), ("localhost", True),
    ("LOCALHOST", True), ("127.1.2.3", True), ("0.0.0.0", False), ("::", False),
    ("192.168.1.5", False), ("example.org", False), ("", False)])
def test_loopback_hosts(host, loop):
    assert A.is_loopback(host) is loop


def test_exposure_warning_only_beyond_loopback():
    for host in ("127.0.0.1", "::1", "localhost"):
        assert A.exposure_warning(host) is None
    text = A.exposure_warning("0.0.0.0")
    assert "anyone who can reach" in text and "127.0.0.1" in text and "\n" not in text
    assert "model file" not in text
    assert "model file" in A.exposure_warning("0.0.0.0", allow_model_files=True)


@pytest.mark.parametrize("host, port, message", [
    ("127.0.0.1", 0, "out of range"), ("127.0.0.1", 65536, "out of range"),
    ("127.0.0.1", -5, "out of range"), ("", 8050, "--host"),
    ("999.999.1.1", 8050, "cannot serve on host")])
def test_bad_host_or_port_is_one_line_exit_2(host, port, message, capsys):
    assert A.check_address(host, port).startswith("error:")
    assert A.serve(host, port) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_debug_beyond_loopback_is_refused(capsys):
    assert A.serve("0.0.0.0", 8050, debug=True) == 2
    err = capsys.readouterr().err
    assert "--debug" in err and err.count("\n") == 1
    assert A.check_address("127.0.0.1", 8050) is None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def no_run(monkeypatch):
    """``Dash.run`` recorded instead of serving; the model-file policy restored afterwards."""
    calls = []
    monkeypatch.setattr(dash.Dash, "run", lambda self, **kw: calls.append(kw))
    monkeypatch.setitem(state._POLICY, "model_files", state._POLICY["model_files"])
    return calls


def test_cli_serve_warns_on_a_public_host(no_run, capsys):
    port = _free_port()
    assert main(["serve", "--host", "0.0.0.0", "--port", str(port)]) == 0
    out = capsys.readouterr()
    assert out.err.startswith("warning: serving on 0.0.0.0") and "anyone" in out.err
    assert no_run == [{"host": "0.0.0.0", "port": port, "debug": False}]
    assert not state.model_files_allowed()
    assert main(["serve", "--port", str(port)]) == 0           # loopback: no warning
    assert capsys.readouterr().err == ""


def test_cli_serve_allow_model_files_switch(no_run, capsys):
    assert main(["serve", "--port", str(_free_port()), "--allow-model-files"]) == 0
    assert state.model_files_allowed()
    assert "model files allowed" in capsys.readouterr().out
    assert main(["serve", "--port", str(_free_port())]) == 0
    assert not state.model_files_allowed()


@pytest.mark.parametrize("argv, message", [
    (["serve", "--port", "70000"], "out of range"),
    (["serve", "--port", "0"], "out of range"),
    (["serve", "--host", "999.999.1.1"], "cannot serve on host"),
    (["serve", "--host", "0.0.0.0", "--debug"], "--debug"),
    (["serve", "--model", "models/mine.py:build"], "--allow-model-files"),
    (["serve", "--algo", "nonsense"], "unknown method")])
def test_cli_serve_errors_are_one_line(argv, message, no_run, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and "Traceback" not in err
    assert no_run == []

"""Start the app as a real server and drive it in headless Chromium (for benchmarks/ui.py and
scripts/screenshots.py).  The server binds 127.0.0.1 and is always stopped on exit."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

TAP = """
const cy = document.getElementById('graph')._cyreg.cy;
const n = cy.getElementById(arguments[0]);
if (n.empty()) { return false; }
n.emit('tap'); return true;
"""
NODES = """
const el = document.getElementById('graph');
const cy = el && el._cyreg && el._cyreg.cy;
if (!cy) { return null; }
return cy.nodes().map(n => [n.id(), n.data('config') || '', n.classes().join(' ')]);
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def server(*serve_args: str, timeout: float = 120.0):
    """``explorer serve`` in a subprocess; yields its URL once it answers.  Its output (a log
    line per request) goes to a temporary file, not a pipe nobody reads: a full pipe would
    block the server after a few hundred callbacks."""
    port = free_port()
    env = dict(os.environ)
    env.setdefault("EXPLORER_HOME", tempfile.mkdtemp(prefix="explorer-bench-"))
    log = tempfile.TemporaryFile()
    proc = subprocess.Popen([sys.executable, "-m", "explorer", "serve", "--port", str(port),
                             *serve_args], cwd=ROOT, env=env, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}/"
    try:
        end = time.time() + timeout
        while time.time() < end:
            if proc.poll() is not None:
                log.seek(0)
                raise RuntimeError(f"server exited: {log.read().decode()[-2000:]}")
            try:
                urllib.request.urlopen(url, timeout=1)
                break
            except OSError:
                time.sleep(0.2)
        else:
            raise RuntimeError("server did not start in time")
        yield url
    finally:
        os.killpg(proc.pid, 15)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
        log.close()


@contextlib.contextmanager
def browser(width=1400, height=1100):
    from selenium import webdriver
    opts = webdriver.ChromeOptions()
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync",
                 f"--window-size={width},{height}"):
        opts.add_argument(flag)
    opts.add_argument(f"--user-data-dir={tempfile.mkdtemp(prefix='explorer-chrome-')}")
    drv = webdriver.Chrome(options=opts)
    try:
        yield drv
    finally:
        drv.quit()


def wait(drv, predicate, timeout=60.0, poll=0.02):
    end = time.time() + timeout
    while time.time() < end:
        try:
            v = predicate()
        except Exception:  # noqa: BLE001 - page still loading
            v = None
        if v:
            return v
        time.sleep(poll)
    raise TimeoutError("condition not met in time")


def nodes(drv):
    res = drv.execute_script(NODES)
    return None if res is None else {n: (cfg, cls) for n, cfg, cls in res}


def text(drv, css):
    els = drv.find_elements("css selector", css)
    return els[0].text if els else ""


def tap(drv, node):
    return wait(drv, lambda: drv.execute_script(TAP, node), 20)


def select(drv, css, label, timeout=10):
    """Pick the option labelled ``label`` in a dcc.Dropdown (Dash 4 markup)."""
    from selenium.webdriver.common.by import By
    drv.find_element(By.CSS_SELECTOR, css).click()
    menu = wait(drv, lambda: drv.find_element(By.CSS_SELECTOR, ".dash-dropdown-options"),
                timeout)
    for opt in menu.find_elements(By.CSS_SELECTOR, ".dash-dropdown-option"):
        if opt.text == label:
            opt.click()
            return
    raise ValueError(f"no option {label!r} in {css}")

"""Helpers shared by tests: worker processes left behind, the command line in a subprocess,
random operator DAGs for the placers, a tap on a graph node in the browser tests."""

import os
import subprocess
import sys
import time

import networkx as nx
import numpy as np
import psutil


def spawned_workers() -> list:
    """Worker processes still alive under this process: spawned ones (``spawn_main``) and
    those forked from the fork server (whose command line they share; the server itself,
    kept for the next launch, is not a worker)."""
    out = []
    for c in psutil.Process().children(recursive=True):
        try:
            if c.status() == psutil.STATUS_ZOMBIE:
                continue
            cmd = " ".join(c.cmdline())
            parent = c.parent()
            forked = "forkserver" in cmd and parent is not None and \
                "forkserver" in " ".join(parent.cmdline())
            if "spawn_main" in cmd or forked:
                out.append(c)
        except psutil.NoSuchProcess:
            pass
    return out


def explorer_cli(*args, timeout: float = 300) -> subprocess.CompletedProcess:
    """``explorer ARGS`` in a fresh interpreter, output captured as text."""
    return subprocess.run([sys.executable, "-m", "explorer.cli", *map(str, args)],
                          capture_output=True, text=True, timeout=timeout)


def random_dag(seed, n=60, p=0.08, ndev=3, mem_scale=1.0, window=12, gb=(0.05, 1.0)):
    """A random DAG (edges only within ``window`` nodes, probability ``3p``) with per-node
    time 0.1-1 s, memory 1-10 x ``mem_scale`` and outputs of ``gb`` GB; and ``ndev`` devices
    at 4 GB/s, 10 µs latency.  Returns ``(networkx graph, DeviceGraph)``."""
    from explorer.engine.core.devices import Device, DeviceGraph
    rng = np.random.default_rng(seed)
    g = nx.DiGraph()
    for i in range(n):
        g.add_node(i, time=float(rng.uniform(0.1, 1.0)), mem=float(rng.uniform(1, 10) * mem_scale),
                   out_bytes=float(rng.uniform(*gb) * 1e9))
    for i in range(n):
        for j in range(i + 1, min(n, i + window)):
            if rng.random() < p * 3:
                g.add_edge(i, j)
    devs = [Device(f"d{i}", "test", 1e12, 1e12, 1e12) for i in range(ndev)]
    dg = DeviceGraph("rand", devs, np.full((ndev, ndev), 4e9), np.full((ndev, ndev), 1e-5))
    return g, dg


def place(algo, pg, dg, options=None):
    """Placement method ``algo`` on a prebuilt placer graph through the method registry: its
    :class:`PlacementPlan`.  ``options["pins"]`` is ``{op: device}``; options the method does
    not take (Celeritas's ``R`` for a baseline) are left out, so one loop covers them all."""
    from dataclasses import fields

    from explorer.engine.search import METHODS, Problem, run
    opts = dict(options or {})
    pins = [f"{k}=@{v}" for k, v in opts.pop("pins", {}).items()]
    known = {f.name for f in fields(METHODS[algo].options_type)}
    return run(algo, Problem.of(pg, dg), pins,
               {k: v for k, v in opts.items() if k in known}).plan


def forbid_search(monkeypatch) -> None:
    """Make every search entry point raise: a test that then runs a saved plan proves the
    runtime executes it without searching again."""
    import importlib

    def searched(*_a, **_k):
        raise AssertionError("a search ran while executing a saved plan")
    for mod, names in {
            "explorer.engine.search": ["run"],
            "explorer.engine.tofu.search": ["search", "partition", "execution_plan"],
            "explorer.engine.placement.celeritas": ["search", "place", "placement_graph"],
            "explorer.engine.placement.placers": ["search", "place"],
            "explorer.engine.layerwise.optcnn": ["search", "solve"],
            "explorer.engine.layerwise.classic": ["search"],
            "explorer.engine.layerwise.exhaustive": ["search", "solve"]}.items():
        m = importlib.import_module(mod)
        for name in names:
            monkeypatch.setattr(m, name, searched)


#: browser tests: tap node ``arguments[1]`` of the cytoscape graph ``arguments[0]`` through
#: cytoscape's own API (nodes are drawn on a canvas); returns 'ok', 'no-cy' or 'no-node'
TAP = """
const el = document.getElementById(arguments[0]);
const cy = el && el._cyreg && el._cyreg.cy;
if (!cy) { return 'no-cy'; }
const n = cy.getElementById(arguments[1]);
if (n.empty()) { return 'no-node'; }
n.emit('tap');
return 'ok';
"""


#: browser tests: the header's link and a mark of each page of the app
PAGES = {"Layer-wise": ("nav-layerwise", ".layerwise-page"), "Tofu": ("nav-tofu", ".tofu-page"),
         "Placement": ("nav-placement", ".placement-page"), "Plans": ("nav-plans", ".plans-page"),
         "Learn": ("nav-learn", ".learn-page")}


def open_page(duo, name: str, timeout: float = 90) -> None:
    """Browser tests: click the header's link to page ``name`` ("Layer-wise", "Tofu",
    "Placement", "Plans") and wait until that page is shown."""
    import time
    link, mark = PAGES[name]
    end = time.time() + 15
    while name != "Learn" and time.time() < end and "model=" not in (
            duo.find_element(f"#{link}").get_attribute("href") or ""):
        time.sleep(0.2)                      # the link carries the request once it is shared
    duo.find_element(f"#{link}").click()
    duo.wait_for_element(mark, timeout=timeout)
    end = time.time() + 15                   # settled: the page's request reached the shell
    while name != "Learn" and time.time() < end and "model=" not in (
            duo.find_element(f"#{link}").get_attribute("href") or ""):
        time.sleep(0.2)
    time.sleep(0.3)
    duo.wait_for_element(mark, timeout=timeout)


def page_path(duo) -> str:
    """Browser tests: the path of the page shown ("/", "/tofu", ...)."""
    return duo.driver.execute_script("return window.location.pathname;")


def until(pred, timeout: float, what: str):
    """Poll ``pred`` until it returns something truthy (returned) or ``timeout`` seconds pass
    (an AssertionError naming ``what``); exceptions count as not yet (a page still rendering)."""
    end = time.time() + timeout
    while time.time() < end:
        try:
            got = pred()
            if got:
                return got
        except Exception:                      # noqa: BLE001 - the page is still rendering
            pass
        time.sleep(0.3)
    raise AssertionError(f"{what} not met in {timeout} s")


def tagged(tag: str) -> list:
    """Processes other than this one that inherited the environment variable ``tag`` (the
    app's background jobs and the workers they start, even once re-parented)."""
    out = []
    for p in psutil.process_iter(["pid"]):
        if p.pid == os.getpid():
            continue
        try:
            if p.environ().get("EXPLORER_TEST_TAG") == tag:
                out.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, OSError):
            pass
    return out


def mp_workers(procs) -> list:
    """The torch.multiprocessing workers among ``procs`` (spawned, or forked from the fork
    server - the server counted too: it must go with its launcher)."""
    import psutil
    out = []
    for p in procs:
        try:
            cmd = " ".join(p.cmdline())
            if "spawn_main" in cmd or "forkserver" in cmd:
                out.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            pass
    return out


def leftover(tag: str, earlier: set) -> dict:
    """pid -> command line of what is still running of a job that was stopped: children of
    this process (not Chromium, not the ``earlier`` ones) and processes that inherited
    ``tag`` (:func:`tagged`), zombies excepted."""
    kids = [p for p in psutil.Process().children(recursive=True)
            if "chrom" not in p.name().lower() and p.pid not in earlier]
    out = {}
    for p in kids + tagged(tag):
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                out[p.pid] = " ".join(p.cmdline())[:160]
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return out

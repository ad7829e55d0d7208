"""Helpers shared by tests: worker processes left behind, the command line in a subprocess."""

import subprocess
import sys

import psutil


def spawned_workers() -> list:
    """Worker processes (multiprocessing spawn children) still alive under this process."""
    out = []
    for c in psutil.Process().children(recursive=True):
        try:
            if c.status() != psutil.STATUS_ZOMBIE and "spawn_main" in " ".join(c.cmdline()):
                out.append(c)
        except psutil.NoSuchProcess:
            pass
    return out


def explorer_cli(*args, timeout: float = 300) -> subprocess.CompletedProcess:
    """``explorer ARGS`` in a fresh interpreter, output captured as text."""
    return subprocess.run([sys.executable, "-m", "explorer.cli", *map(str, args)],
                          capture_output=True, text=True, timeout=timeout)

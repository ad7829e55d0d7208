"""The README is for a newcomer: short, and every command it shows works as written.

Each fenced ``bash`` block runs in a fresh temporary directory, as one shell script with
``set -e`` (so files a block writes are read by its later lines), with ``explorer`` on the
path as ``scripts/setup.sh`` leaves it.  ``sh`` blocks (starting the app, the whole suite,
long measurements) and ``text`` blocks (example output) are not run.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"


def bash_blocks(text: str) -> list:
    """The bodies of the fenced ```bash blocks of ``text``, in order."""
    return [m.group(1) for m in re.finditer(r"^```bash\n(.*?)^```", text, re.S | re.M)]


def test_bash_blocks_are_found():
    assert bash_blocks("a\n```bash\necho 1\n```\n```sh\nno\n```\n```bash\necho 2\n```\n") == [
        "echo 1\n", "echo 2\n"]


def test_readme_is_short_and_links_resolve():
    text = README.read_text()
    assert len(text.splitlines()) <= 300
    missing = [link for link in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", text)
               if not (ROOT / link).exists()]
    assert not missing, f"README links to missing files: {missing}"


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.parametrize("index", range(len(bash_blocks(README.read_text()))))
def test_readme_command_block_runs_as_written(index, tmp_path):
    block = bash_blocks(README.read_text())[index]
    shim = tmp_path / "bin"
    shim.mkdir()
    (shim / "explorer").write_text(f'#!/bin/sh\nexec "{sys.executable}" -m explorer "$@"\n')
    (shim / "explorer").chmod(0o755)
    env = dict(os.environ, PATH=f"{shim}{os.pathsep}{os.environ.get('PATH', '')}",
               PYTHONPATH=str(ROOT))
    work = tmp_path / "work"
    work.mkdir()
    res = subprocess.run(["bash", "-c", "set -euo pipefail\n" + block], cwd=work, env=env,
                         capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, (f"README block {index} failed (exit {res.returncode}):\n"
                                 f"{block}\n--- stderr ---\n{res.stderr[-3000:]}")

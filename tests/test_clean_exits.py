"""Every error path ends in our one line: for a list of bad inputs and failures of
`explorer search`, `run`, `calibrate`, `compare` and `serve` (each in a fresh interpreter, as
a user runs them), the exit status is 2, stderr is exactly one ``error:`` line - no
``Traceback``, no torch or Transformers log lines, no graph dumps, and no multiprocessing
``leaked semaphore`` warning at exit (a worker that failed releases what it made)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap

import pytest

from explorer.engine.search import Problem, Request, run

pytestmark = pytest.mark.multiprocess

#: a model whose forward branches on a tensor's value: no method can plan it
BRANCHY = textwrap.dedent("""
    import torch
    from torch import nn

    class Branchy(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(8, 8)

        def forward(self, x):
            y = self.fc(x)
            if y.sum() > 0:
                return y * 2
            return y

    def make():
        return Branchy(), torch.randn(4, 8)
""")


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("clean-exits")
    (d / "branchy.py").write_text(BRANCHY)
    mlp = Request("mlp", 8, {"hidden": 16, "layers": 1}, preset="local", devices=2)
    for algo in ("data", "tofu", "celeritas"):
        doc = run(algo, Problem(mlp.replace(algo=algo))).document()
        (d / f"{algo}.json").write_text(json.dumps(doc))
    (d / "notjson.json").write_text("{ not json")
    return d


# (id, arguments, environment, words the line must have); {d} is the files' folder
CASES = [
    ("unknown-model", ["search", "nosuchmodel"], {}, "nosuchmodel"),
    ("absurd-devices", ["search", "lenet5", "--devices", "100000000"], {}, "devices"),
    ("impossible-pin", ["search", "lenet5", "--devices", "4", "--pin", "conv1=n=3"], {}, "conv1"),
    ("branchy-optcnn", ["search", "{d}/branchy.py:make", "-n", "2"], {},
     "data-dependent control flow"),
    ("branchy-tofu", ["search", "{d}/branchy.py:make", "-n", "2", "--algo", "tofu"], {},
     "data-dependent control flow"),
    ("branchy-celeritas", ["search", "{d}/branchy.py:make", "-n", "2", "--algo", "celeritas"],
     {}, "data-dependent control flow"),
    ("run-missing-file", ["run", "{d}/nosuch.json"], {}, "nosuch.json"),
    ("run-not-json", ["run", "{d}/notjson.json"], {}, "notjson.json"),
    ("layerwise-worker-dies", ["run", "{d}/data.json", "--timeout", "60"],
     {"EXPLORER_RUNTIME_FAULT": "0:1:exit"}, "rank 0 died"),
    ("layerwise-worker-raises", ["run", "{d}/data.json", "--timeout", "60"],
     {"EXPLORER_RUNTIME_FAULT": "1:1:raise"}, "injected fault"),
    ("tofu-worker-raises", ["run", "{d}/tofu.json", "--timeout", "60"],
     {"EXPLORER_RUNTIME_FAULT": "1:1:raise"}, "injected fault"),
    ("placement-worker-dies", ["run", "{d}/celeritas.json", "--timeout", "60"],
     {"EXPLORER_RUNTIME_FAULT": "0:1:exit"}, "died"),
    ("calibrate-unknown-model", ["calibrate", "--model", "nosuchmodel"], {}, "nosuchmodel"),
    ("compare-unknown-method", ["compare", "mlp", "--methods", "nosuch"], {}, "nosuch"),
    ("serve-port-out-of-range", ["serve", "--port", "70000"], {}, "out of range"),
]

_NOISE = [re.compile(p) for p in (r"Traceback", r"leaked semaphore", r"^[WEI]\d{4} ",
                                  r"def forward\(", r"UserWarning", r"resource_tracker")]


@pytest.mark.parametrize("args,env,words", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_the_error_is_one_line_and_nothing_else(files, args, env, words):
    argv = [a.replace("{d}", str(files)) for a in args]
    got = subprocess.run([sys.executable, "-m", "explorer", *argv], capture_output=True,
                         text=True, timeout=600, env={**os.environ, **env})
    err = got.stderr
    assert got.returncode == 2, (got.returncode, err[-2000:])
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err[-3000:]
    assert words in lines[0], lines[0]
    for pattern in _NOISE:
        assert not any(pattern.search(line) for line in err.splitlines()), err[-3000:]

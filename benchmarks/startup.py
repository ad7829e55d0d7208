"""Start-up benchmark: wall time of whole ``explorer`` processes, as a user waits for them.

    python benchmarks/startup.py [--repeat 3] [--json]

Every command runs in a fresh interpreter with its own empty ``EXPLORER_HOME``.  Listing
commands (``--help``, ``models``, ``presets``) import no torch.  ``search`` rows give the first
run (the model is traced and stored in the capture cache) and the best later run (read back
from the cache: no trace, no torch).  ``python -c pass`` and ``import torch`` are the floor
and what a capture costs before tracing starts.  Targets on a 2-core machine:
Inception-v3 at 16 devices ≤ 2.5 s end to end on a second run (its cost tables are most of
it).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")

COMMANDS = [
    ("python -c pass", [sys.executable, "-c", "pass"], False),
    ("python -c 'import torch'", [sys.executable, "-c", "import torch"], False),
    ("explorer --help", ["--help"], False),
    ("explorer models", ["models"], False),
    ("explorer presets", ["presets"], False),
    ("explorer search lenet5 -n 4", ["search", "lenet5", "-n", "4"], True),
    ("explorer search inception_v3 -n 16", ["search", "inception_v3", "-n", "16"], True),
    ("explorer search gpt2 -n 8", ["search", "gpt2", "-n", "8"], True),
    ("explorer search resnet50 -n 8 --algo tofu",
     ["search", "resnet50", "-n", "8", "--batch", "32", "--algo", "tofu"], True),
]


def _time(cmd: list, env: dict) -> float:
    t0 = time.perf_counter()
    r = subprocess.run(cmd, env=env, capture_output=True, text=True)
    dt = time.perf_counter() - t0
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed: {r.stderr.strip()}")
    return dt


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3, help="runs after the first (best kept)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    rows = []
    for label, argv_, cached in COMMANDS:
        cmd = argv_ if argv_[0] == sys.executable else [sys.executable, "-m", "explorer",
                                                        *argv_]
        with tempfile.TemporaryDirectory(prefix="explorer-startup-") as home:
            env = dict(os.environ, EXPLORER_HOME=home,
                       PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
            first = _time(cmd, env)
            later = min(_time(cmd, env) for _ in range(max(args.repeat, 1)))
        rows.append({"command": label, "first_s": first, "best_s": later,
                     "capture_cached": cached})
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    print(f"wall time of the whole process, fresh EXPLORER_HOME; best of {args.repeat} later "
          f"runs")
    print(f"{'command':<46}{'1st run s':>10}{'later s':>9}")
    for r in rows:
        print(f"{r['command']:<46}{r['first_s']:>10.2f}{r['best_s']:>9.2f}"
              + ("   (later runs read the capture cache)" if r["capture_cached"] else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Tofu plans run tile-local: measured against predicted memory per worker and step time.

    python benchmarks/tofu_run.py [--workers 2,4] [--steps 3] [--big] [--json]

Each row searches a Tofu plan on the ``local`` preset, saves it as a document and runs it with
``explorer run``'s executor (every worker holds only its tiles; 3 steps, the first a warm-up):
the plan's per-worker ``peak_memory_bytes`` against the measured peak (live tiles plus the
operator in flight's buffers, floating point at 4 bytes an element), ``predicted_step_time_s``
(roofline compute of each worker's shards + Tofu's communication time) against the measured
step time (median of the steps after the first, slowest worker).  The workers compute in
float64 so that the reference check is exact: measured step times are those of float64
kernels.  "one device" is the same step's peak on one worker by the plan's memory model.

Models sized for a 2-core machine: a Wide-ResNet (depth 50, width 2, 64x64 images) and a
2-layer LSTM (1024 hidden, 10 steps).  ``--big`` adds an MLP whose step needs 1.5 GiB on one
worker by the plan (8 layers of 4096, batch 1024): it runs across 2 and 4 workers each under
half of that (the parent's float64 reference step needs about 5 GiB more).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

MODELS = [
    ("WResNet-50-2 (64 px)", "wresnet", 4, {"depth": 50, "width": 2, "image_size": 64,
                                            "num_classes": 10}),
    ("LSTM-2-1024 (10 steps)", "lstm", 16, {"layers": 2, "hidden": 1024, "steps": 10}),
]
BIG = [("MLP-8-4096 (too big for one)", "mlp", 1024, {"layers": 8, "hidden": 4096})]


def row(name, spec, batch, args, k, steps):
    from explorer.engine.devices import preset
    from explorer.engine.runtime.run import run_document
    from explorer.engine.search import Problem, run, tofu
    res = run("tofu", Problem(preset("local", k), spec, batch, dict(args)))
    doc = res.document()
    one = int(tofu.partition(res.capture, 1).peak_memory_bytes[0])
    r = run_document(doc, steps=steps, timeout_s=3600)
    return {"model": name, "workers": k, "reference_ok": r["reference_ok"],
            "predicted_peak_bytes": doc["peak_memory_bytes"],
            "measured_peak_bytes": r["measured_peak_memory_bytes"],
            "one_device_peak_bytes": one,
            "predicted_step_s": r["predicted_step_time_s"],
            "predicted_compute_s": max(doc["predicted_compute_s"]),
            "predicted_comm_s": doc["objective_s"],
            "measured_step_s": r["measured_step_time_s"],
            "comm_bytes": r["measured_comm_bytes"],
            "comm_bytes_ok": r["measured_comm_bytes"] == r["predicted_comm_bytes"],
            "fallback_ops": r["fallback_ops"]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", default="2,4")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--big", action="store_true", help="add the MLP one worker cannot hold")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    ks = [int(x) for x in a.workers.split(",")]
    rows = []
    for name, spec, batch, args in MODELS + (BIG if a.big else []):
        for k in ks:
            rows.append(row(name, spec, batch, args, k, a.steps))
            if not a.json:
                _print(rows[-1], header=len(rows) == 1)
    if a.json:
        print(json.dumps(rows, indent=2))
    return 0 if all(r["reference_ok"] and r["comm_bytes_ok"] for r in rows) else 1


def _print(r, header=False):
    mib = 2 ** 20
    if header:
        print(f"{'model':30s} {'k':>2s} {'pred MiB/worker':>16s} {'measured MiB':>13s} "
              f"{'err':>6s} {'one dev':>8s} {'pred s':>8s} {'(comp+comm)':>15s} "
              f"{'meas s':>8s} ref")
    worst = max(abs(m - p) / p for m, p in zip(r["measured_peak_bytes"],
                                                 r["predicted_peak_bytes"]))
    print(f"{r['model']:30s} {r['workers']:2d} {max(r['predicted_peak_bytes']) / mib:16.1f} "
          f"{max(r['measured_peak_bytes']) / mib:13.1f} {worst * 100:5.1f}% "
          f"{r['one_device_peak_bytes'] / mib:8.1f} {r['predicted_step_s']:8.3f} "
          f"{r['predicted_compute_s']:7.3f}+{r['predicted_comm_s']:.3f} "
          f"{r['measured_step_s']:8.3f} {'ok' if r['reference_ok'] else 'FAIL'}"
          + (f"  fallback {r['fallback_ops']}" if r["fallback_ops"] else ""), flush=True)


if __name__ == "__main__":
    sys.exit(main())

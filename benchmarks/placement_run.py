"""Placement run benchmark: predicted vs measured step time of placements run as compiled code.

For each model and placement method: calibrate the machine once (``explorer calibrate``;
``--keep-calibration`` reuses ``$EXPLORER_HOME/local.json``), search the placement for
2 local CPU workers with ``--cost measured`` (every aten call of the step timed on this
machine, cached in the profile SQLite), save it as a plan document, run it with ``explorer
run``'s entry (one fx program per device with send/recv, reference check against one
device) and print predicted and measured step time, their error, the reference verdict,
transfers, per worker the simulator's busy time next to the worker thread's CPU time in a
step (operator times are CPU times too: on a shared machine the wall time also holds the time
other processes took the core), and peak memory per worker (measured live bytes / simulated).

    python benchmarks/placement_run.py [--models resnet50,transformer] [--algos celeritas]
                                       [--steps 10] [--warmup 3] [--json]

Target (issue 14): ``reference_ok`` and the measured step within 15 % of the predicted one
for ResNet-50 and the Transformer.  On a shared machine the error follows the load; the
``canary`` columns (one thread's convolutions per second before the search and after the run)
show how much the machine's speed moved in between.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from benchmarks.runtime import canary  # noqa: E402

#: Small enough to finish in a minute or two each on 2 cores.
CONFIGS = {
    "resnet50": {"batch": 8, "model_args": {"image_size": 64, "num_classes": 10}},
    "transformer": {"batch": 8, "model_args": {"layers": 2, "hidden": 256, "seq": 64}},
    "lenet5": {"batch": 64, "model_args": {}},
    "mobilenet_v2": {"batch": 8, "model_args": {"image_size": 64, "num_classes": 10}},
}


def bench(model: str, algo: str, devices: int, steps: int, warmup: int) -> dict:
    """Search ``model`` with ``algo`` (measured costs, ``local`` preset) and run the plan."""
    from explorer import service
    from explorer.engine.runtime.run import run_document
    cfg = CONFIGS.get(model, {"batch": None, "model_args": {}})
    req = service.Request(model=model, batch=cfg["batch"], model_args=dict(cfg["model_args"]),
                          preset="local", devices=devices, algo=algo, cost="measured")
    before = canary(0.5)
    t0 = time.perf_counter()
    res = service.run_method(req, algo)
    search_s = time.perf_counter() - t0
    doc = json.loads(json.dumps(res.document()))
    run = run_document(doc, steps=steps, warmup=warmup, verify=False)
    after = canary(0.5)
    pred, meas = run["predicted_step_time_s"], run["measured_step_time_s"]
    per_dev = [0] * devices
    for d in doc["placement"].values():
        per_dev[int(d)] += 1
    return {"model": model, "algo": algo, "ops_per_device": per_dev,
            "transfers": run["transfers"], "predicted_s": pred, "measured_s": meas,
            "error": (meas - pred) / pred if pred else None,
            "reference_ok": run["reference_ok"], "max_rel_error": run["max_rel_error"],
            "peak_measured_bytes": run["peak_memory_bytes"],
            "peak_predicted_bytes": run.get("predicted_peak_memory_bytes"),
            "compute_s": run["compute_s"], "wait_s": run["wait_s"], "cpu_s": run["cpu_s"],
            "predicted_busy_s": run.get("predicted_busy_s"),
            "step_times_s": run["step_times_s"], "search_s": search_s,
            "canary_before": before, "canary_after": after}


def table(rows: list) -> str:
    head = (f"{'model':<13} {'algo':<15} {'ops/dev':<11} {'xfers':>5} {'pred ms':>9} "
            f"{'meas ms':>9} {'error':>7} {'ref':>5} {'busy/cpu ms per worker':<22} "
            f"{'peak MiB meas/pred':<18} {'canary':>13}")
    out = [head, "-" * len(head)]
    for r in rows:
        if "error_text" in r:
            out.append(f"{r['model']:<13} {r['algo']:<15} failed: {r['error_text']}")
            continue
        mem = " ".join(f"{m / 2**20:.0f}/{(p or 0) / 2**20:.0f}" for m, p in
                       zip(r["peak_measured_bytes"], r["peak_predicted_bytes"] or
                           [None] * len(r["peak_measured_bytes"])))
        err = f"{100 * r['error']:+.1f}%" if r["error"] is not None else "-"
        busy = " ".join(f"{b * 1e3:.0f}/{c * 1e3:.0f}" for b, c in
                        zip(r["predicted_busy_s"] or [0.0] * len(r["cpu_s"]), r["cpu_s"]))
        out.append(f"{r['model']:<13} {r['algo']:<15} {'/'.join(map(str, r['ops_per_device'])):<11}"
                   f" {r['transfers']:>5} {r['predicted_s'] * 1e3:>9.1f} "
                   f"{r['measured_s'] * 1e3:>9.1f} {err:>7} {str(r['reference_ok']):>5} "
                   f"{busy:<22} {mem:<18} {r['canary_before']:>6.0f}/{r['canary_after']:<6.0f}")
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="resnet50,transformer")
    ap.add_argument("--algos", default="celeritas")
    ap.add_argument("--devices", type=int, default=2)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--keep-calibration", action="store_true",
                    help="use $EXPLORER_HOME/local.json when present instead of calibrating "
                         "again (the links' latency decides where placements cut)")
    ap.add_argument("--keep-profile", action="store_true",
                    help="reuse operator times cached by earlier runs (default: time every "
                         "operator again, so the prediction is of the machine as it is now)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    from explorer.engine.storage import home
    from explorer.errors import ExplorerError
    if not (home() / "local.json").exists() or not args.keep_calibration:
        from explorer.engine.runtime.calibrate import calibrate
        print("calibrating this machine (explorer calibrate) ...", file=sys.stderr)
        calibrate(args.devices)
    if not args.keep_profile:
        from explorer.engine.profile import clear_op_times
        clear_op_times()
    rows = []
    for model in args.models.split(","):
        for algo in args.algos.split(","):
            print(f"{model} {algo} ...", file=sys.stderr)
            try:
                rows.append(bench(model, algo, args.devices, args.steps, args.warmup))
            except (ExplorerError, ValueError) as exc:
                rows.append({"model": model, "algo": algo, "error_text": str(exc)})
    print(json.dumps(rows, indent=1) if args.json else table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())

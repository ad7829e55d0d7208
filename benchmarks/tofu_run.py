"""Tofu plans run tile-local: measured against predicted memory per worker and step time.

    python benchmarks/tofu_run.py [--workers 2,4] [--steps 4] [--big] [--profile] [--json]

Each row searches a Tofu plan on the ``local`` preset, saves it as a document and runs it with
``explorer run``'s executor (every worker holds only its tiles; 4 steps, the first a warm-up,
the second still page-faulting while the workers' allocators settle: ``run.TOFU_STEPS``):
the plan's per-worker ``peak_memory_bytes`` against the measured peak (live tiles plus the
operator in flight's buffers, floating point at 4 bytes an element), and the predicted step
time against the measured one (median of the steps after the first, slowest worker).

The timed steps compute in float32; a separate float64 step checks the result against one
device.  The prediction needs ``explorer calibrate`` (run here, quick, when this machine has
none): every operator is then rehearsed at its shard boxes as the workers run it (cached in
the profile database) and the step simulated through the executor's own transfers and
collectives at the calibrated gloo costs (``shardtime.simulate_step``; compute × workers /
cores when they outnumber the cores, ``share``).  Each row sets the prediction's terms for
the slowest worker beside the measured ones: ``CPU`` (predicted: rehearsed compute + send /
receive calls; measured: the worker's main-thread CPU per step - robust on a busy machine)
and ``wait`` (the rest of the step: on peers, links, collectives - and, on a busy machine,
on the cores).  ``--profile`` adds where each step went per aten target (the executor's
timing hooks: CPU in the operator, fetch / send wall time, transfer and collective waits,
page faults) beside the rehearsal.  "one dev" is the same step's peak on one worker by the
plan's memory model.

Models sized for a 2-core machine: a Wide-ResNet (depth 50, width 2, 64x64 images) and a
2-layer LSTM (1024 hidden, 10 steps), plus the MLP and ResNet of the step-time target.
``--big``: a Transformer encoder whose step needs 4.0 GiB on one worker by the plan (2 layers,
hidden 256, 8 heads, 512 tokens, batch 96).  With ``--memory-per-worker`` at 75 % of that
the one-worker plan is refused before launch, while the plans for 2 and 4 workers train three steps with every worker under the
limit (watched while it runs) and match the float64 reference.  What is checked: the three
float32 timed steps give the step time, bytes and peak; a float64 pass of the same three
training steps (the guard counting it at twice the limit) is what is compared, loss and every
updated parameter, with three float64 single-device steps - computed once for both worker
counts (same model, seed and steps).  ``wall_s`` is each launch; the reference is in the
first.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

MODELS = [
    ("MLP-6-2048 (batch 256)", "mlp", 256, {"layers": 6, "hidden": 2048}),
    ("ResNet-50 (32 px)", "wresnet", 8, {"depth": 50, "width": 1, "image_size": 32,
                                         "num_classes": 10}),
    ("WResNet-50-2 (64 px)", "wresnet", 4, {"depth": 50, "width": 2, "image_size": 64,
                                            "num_classes": 10}),
    ("LSTM-2-1024 (10 steps)", "lstm", 16, {"layers": 2, "hidden": 1024, "steps": 10}),
]
#: one worker would need 4.0 GiB by the plan (float32, mostly activations: attention scores
#: of 512 tokens over 8 heads hold many bytes per FLOP, and float64 matrix products - the check
#: steps and the reference - run at half the float32 rate; a conv net's float64 steps run
#: without oneDNN, ~10x slower: Tensor-Holography at batch 1, 0.8 GiB, took 6 minutes)
BIG = ("Transformer-2-256 (seq 512, batch 96)", "transformer", 96,
       {"layers": 2, "hidden": 256, "heads": 8, "seq": 512})
if os.environ.get("TB_BIG"):              # another model for --big: '[name, spec, batch, args]'
    BIG = tuple(json.loads(os.environ["TB_BIG"]))


def _calibrated(k: int) -> bool:
    from explorer.engine.core.devices import local
    return bool(local(k).meta.get("calibrated"))


def row(name, spec, batch, args, k, steps):
    from explorer.engine.runtime.dispatch import run_document
    from explorer.engine.search import Problem, Request, run
    from explorer.engine.tofu import search as tofu
    res = run("tofu", Problem(Request(spec, batch, dict(args), preset="local", devices=k)))
    doc = res.document()
    one = int(tofu.partition(res.capture, 1).peak_memory_bytes[0])
    r = run_document(doc, steps=steps, timeout_s=3600)
    return {"model": name, "workers": k, "reference_ok": r["reference_ok"],
            "max_rel_error": r["max_rel_error"],
            "predicted_peak_bytes": doc["peak_memory_bytes"],
            "measured_peak_bytes": r["measured_peak_memory_bytes"],
            "one_device_peak_bytes": one,
            "predicted_step_s": r["predicted_step_time_s"],
            "predicted_compute_s": r.get("predicted_compute_step_s") or 0.0,
            "predicted_comm_s": r.get("predicted_comm_s") or 0.0,
            "predicted_latency_s": r.get("predicted_latency_s") or 0.0,
            "compute_source": r.get("compute_source"),
            # the prediction's terms for its slowest worker (compute = rehearsed shards,
            # calls = send / receive calls, wait = on peers, links and collectives)
            "predicted_terms": r.get("predicted_terms"),
            "predicted_share": r.get("predicted_share"),
            "predicted_by_target": r.get("predicted_by_target"),
            "step_profile": r.get("step_profile"),
            "measured_step_s": r["measured_step_time_s"],
            "cpu_step_s": max(r.get("cpu_step_s") or [0.0]),
            "timed_dtype": r.get("timed_dtype"),
            "comm_bytes": r["measured_comm_bytes"],
            "comm_bytes_ok": r["measured_comm_bytes"] == r["predicted_comm_bytes"],
            "fallback_ops": r["fallback_ops"]}


def big(ks, steps) -> list:
    """The run one worker cannot hold (see the module): rows per worker count."""
    from explorer.engine.runtime.memlimit import GiB, check_predicted
    from explorer.engine.runtime.dispatch import run_document
    from explorer.engine.search import Problem, Request, run
    from explorer.errors import InfeasiblePlan
    name, spec, batch, args = BIG
    one = run("tofu", Problem(Request(spec, batch, dict(args), preset="local", devices=1))).document()
    need = max(one["peak_memory_bytes"])
    limit = 0.75 * need
    try:
        check_predicted(one, limit)
        refused = "NOT refused"
    except InfeasiblePlan as exc:
        refused = str(exc)
    print(f"{name}: one worker needs {need / GiB:.2f} GiB by the plan; --memory-per-worker "
          f"{limit / GiB:.2f} GiB; one worker: {refused}", flush=True)
    rows = []
    for k in ks:
        doc = run("tofu", Problem(Request(spec, batch, dict(args), preset="local", devices=k))).document()
        t0 = time.perf_counter()
        r = run_document(doc, steps=steps, train=True, memory_per_worker=limit,
                         timeout_s=3600)
        rows.append({"model": name, "workers": k, "one_worker_need_bytes": need,
                     "limit_bytes": limit, "one_worker_refused": refused != "NOT refused",
                     "reference_ok": r["reference_ok"], "max_rel_error": r["max_rel_error"],
                     "predicted_peak_bytes": doc["peak_memory_bytes"],
                     "measured_peak_bytes": r["measured_peak_memory_bytes"],
                     "predicted_step_s": r["predicted_step_time_s"],
                     "measured_step_s": r["measured_step_time_s"],
                     "cpu_step_s": max(r.get("cpu_step_s") or [0.0]),
                     "wall_s": time.perf_counter() - t0,
                     "fallback_ops": r["fallback_ops"],
                     "comm_bytes_ok": r["measured_comm_bytes"] == r["predicted_comm_bytes"]})
        x = rows[-1]
        print(f"  {k} workers: predicted peak {max(x['predicted_peak_bytes']) / GiB:.2f} GiB, "
              f"measured {max(x['measured_peak_bytes']) / GiB:.2f} GiB per worker (limit "
              f"{limit / GiB:.2f}); step predicted {x['predicted_step_s']:.2f} s, measured "
              f"{x['measured_step_s']:.2f} s (cpu {x['cpu_step_s']:.2f} s); {steps} training steps "
              f"vs float64 reference: {'ok' if x['reference_ok'] else 'FAIL'} "
              f"({x['max_rel_error']:.1e}); run {x['wall_s']:.0f} s"
              + (f"; fallback {x['fallback_ops']}" if x["fallback_ops"] else "; every op on tiles"),
              flush=True)
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", default="2,4")
    ap.add_argument("--steps", type=int, default=4,
                    help="steps per row (the first a warm-up; median of the rest)")
    ap.add_argument("--big-steps", type=int, default=3, help="training steps of --big")
    ap.add_argument("--models", default="", help="comma-separated names (substrings) to run")
    ap.add_argument("--big", action="store_true", help="add the model one worker cannot hold")
    ap.add_argument("--only-big", action="store_true", help="only the --big run")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--profile", action="store_true",
                    help="also print where each row's step went, per aten target: rehearsed "
                         "against measured CPU, and the measured waits")
    a = ap.parse_args(argv)
    ks = [int(x) for x in a.workers.split(",")]
    if not _calibrated(max(ks)):
        from explorer.engine.runtime.calibrate import calibrate
        print("this machine has no calibration: running `explorer calibrate --quick`",
              file=sys.stderr, flush=True)
        calibrate(max(ks), quick=True)
    rows = []
    models = [] if a.only_big else [m for m in MODELS if not a.models or any(
        s.strip().lower() in m[0].lower() for s in a.models.split(","))]
    for name, spec, batch, args in models:
        for k in ks:
            rows.append(row(name, spec, batch, args, k, a.steps))
            if not a.json:
                _print(rows[-1], header=len(rows) == 1)
                if a.profile:
                    _print_profile(rows[-1])
    if a.big or a.only_big:
        rows += big(ks, a.big_steps)
    if a.json:
        print(json.dumps(rows, indent=2))
    return 0 if all(r["reference_ok"] and r["comm_bytes_ok"] for r in rows) else 1


def _terms(r) -> tuple:
    """``(predicted CPU, measured CPU, predicted wait, measured wait)`` of the slowest worker
    per step: CPU = compute + send / receive calls (the predicted compute without the
    time-sharing stretch: a thread's CPU clock does not run while it waits for a core);
    wait = the step's wall time beyond it."""
    pt = r.get("predicted_terms") or {}
    pc = pt.get("compute", r["predicted_compute_s"]) / (r.get("predicted_share") or 1.0) + \
        pt.get("calls", 0.0)
    pw = r["predicted_step_s"] - pc
    mc = r["cpu_step_s"]
    return pc, mc, pw, max(0.0, r["measured_step_s"] - mc)


def _print(r, header=False):
    mib = 2 ** 20
    if header:
        print(f"{'model':24s} {'k':>2s} {'pred MiB/w':>10s} {'meas MiB':>9s} {'err':>6s} "
              f"{'one dev':>8s} | {'pred ms':>8s} {'meas ms':>8s} {'err':>5s} | "
              f"{'CPU pred':>8s} {'meas':>7s} {'err':>5s} | {'wait pred':>9s} {'meas':>7s} "
              f"| share ref")
    worst = max(abs(m - p) / p for m, p in zip(r["measured_peak_bytes"],
                                                 r["predicted_peak_bytes"]))
    terr = (r["predicted_step_s"] - r["measured_step_s"]) / r["measured_step_s"]
    pc, mc, pw, mw = _terms(r)
    cerr = (pc - mc) / mc if mc else float("nan")
    print(f"{r['model'][:24]:24s} {r['workers']:2d} {max(r['predicted_peak_bytes']) / mib:10.1f} "
          f"{max(r['measured_peak_bytes']) / mib:9.1f} {worst * 100:5.1f}% "
          f"{r['one_device_peak_bytes'] / mib:8.1f} | {r['predicted_step_s'] * 1e3:8.1f} "
          f"{r['measured_step_s'] * 1e3:8.1f} {terr * 100:+4.0f}% | {pc * 1e3:8.1f} "
          f"{mc * 1e3:7.1f} {cerr * 100:+4.0f}% | {pw * 1e3:9.1f} {mw * 1e3:7.1f} | "
          f"{r.get('predicted_share') or 1:5.2f} {'ok' if r['reference_ok'] else 'FAIL'}"
          + (f"  fallback {r['fallback_ops']}" if r["fallback_ops"] else ""), flush=True)


def _print_profile(r, top: int = 8):
    """Where the slowest worker's step went, per aten target (the run's timing hooks) beside
    the rehearsal (``predicted_by_target``)."""
    prof = r.get("step_profile") or []
    if not prof:
        return
    w = max(range(len(prof)), key=lambda i: prof[i]["total"]["step_s"])
    by, pred = prof[w]["by_target"], r.get("predicted_by_target") or {}
    print(f"  worker {w}: {'target':28s} {'ops':>4s} {'rehearsed':>9s} {'op CPU':>7s} "
          f"{'fetch':>7s} {'send':>7s} {'waits':>7s} {'coll.':>7s} {'faults':>7s}  (ms / step)")
    rows = sorted(by.items(), key=lambda kv: -(kv[1]["fetch_s"] + kv[1]["compute_s"] +
                                               kv[1]["send_s"]))
    for k, v in rows[:top]:
        cpu = v["fetch_cpu_s"] + v["compute_cpu_s"] + v["send_cpu_s"]
        p = (pred.get(k) or [0.0] * (w + 1))[w]
        print(f"            {k[:28]:28s} {v['ops']:4.0f} {p * 1e3:9.1f} {cpu * 1e3:7.1f} "
              f"{v['fetch_s'] * 1e3:7.1f} {v['send_s'] * 1e3:7.1f} {v['wait_s'] * 1e3:7.1f} "
              f"{v['collective_s'] * 1e3:7.1f} {v.get('page_faults', 0):7.0f}")
    t = prof[w]["total"]
    print(f"            step {t['step_s'] * 1e3:.1f} ms, CPU {t['cpu_s'] * 1e3:.1f} ms, outside "
          f"the operators {t['other_s'] * 1e3:.1f} ms", flush=True)


if __name__ == "__main__":
    sys.exit(main())

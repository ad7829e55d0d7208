"""GPU benchmark: every plan kind on this machine's GPU(s) against a plain PyTorch step.

One command that checks the claims about GPUs (predictions within 10 % of the measured step
and of ``torch.cuda.max_memory_allocated``):

1. ``explorer calibrate`` on the GPUs (matmul / convolution per precision, HBM, host copies,
   NCCL between GPUs when there are two or more);
2. for ResNet-50 b64, VGG-16 b64, Inception-v3 b32 and the GPT-2 example b8: the **truth** - a
   plain PyTorch training step (forward, backward, SGD) on one GPU, median of 20 after 5
   warm-ups, in fp32 with TF32 off (and, as reference rows, with TF32 on and in bf16
   autocast) - and its peak allocated memory;
3. per model, a plan of each kind searched on ``--preset local`` (layer-wise ``optcnn`` and the
   placement ``m-topo`` with ``--cost measured``, Tofu analytic) for ``--workers`` workers
   (default 1: one GPU), run with ``explorer run``'s machinery on the GPU(s): predicted vs
   measured step time and memory;
4. one table: model, dtype, kind, truth, predicted, measured, error (predicted vs measured),
   memory predicted / measured; ``--out FILE`` also writes it as Markdown with the GPU's name
   and the date (for ``benchmarks/results/``).

    python benchmarks/gpu.py [--quick] [--models resnet50,vgg16,inception_v3,gpt2]
                             [--kinds layerwise,layerwise-bf16,roofline-bf16,tofu,placement]
                             [--truth fp32,tf32,bf16] [--no-calibrate] [--workers 1] [--out FILE]

Without a CUDA GPU it prints one line and exits with status 2.  Runs with more workers than
GPUs share them (gloo, host-staged transfers): their times are reported but are not
prediction targets.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

NO_GPU = "no CUDA GPU: benchmarks/gpu.py needs one"

#: model -> (batch, model arguments): the issue's models at their batch sizes
MODELS = {
    "resnet50": (64, {}),
    "vgg16": (64, {}),
    "inception_v3": (32, {}),
    "gpt2": (8, {}),
}

#: plan kind -> (method, cost model it is searched with)
#: plan kind -> (method, cost model it is searched with, precision): the layer-wise plan on
#: its shards profiled in fp32 and in bf16, and on the calibrated bf16 roofline (which the
#: first GPU run found 50-95 % low on launch-bound models)
KINDS = {"layerwise": ("optcnn", "measured", "fp32"),
         "layerwise-bf16": ("optcnn", "measured", "bf16"),
         "roofline-bf16": ("optcnn", "analytic", "bf16"),
         "tofu": ("tofu", "analytic", "fp32"),
         "placement": ("m-topo", "measured", "fp32")}

TRUTH_DTYPES = ("fp32", "tf32", "bf16")


# --------------------------------------------------------------------------------------------
# CPU-safe helpers (unit-tested without a GPU)
# --------------------------------------------------------------------------------------------

def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="benchmarks/gpu.py", description=__doc__.split("\n")[0])
    p.add_argument("--models", default=",".join(MODELS),
                   help=f"comma-separated, of {', '.join(MODELS)}")
    p.add_argument("--truth", default=",".join(TRUTH_DTYPES),
                   help="precisions of the plain PyTorch step (default fp32,tf32,bf16)")
    p.add_argument("--kinds", default=",".join(KINDS),
                   help=f"plan kinds to run, of {', '.join(KINDS)}")
    p.add_argument("--workers", type=int, default=1,
                   help="workers per plan (default 1; more than GPUs: shared, not a target)")
    p.add_argument("--steps", type=int, default=20, help="timed steps (default 20)")
    p.add_argument("--warmup", type=int, default=5, help="warm-up steps (default 5)")
    p.add_argument("--quick", action="store_true", help="quicker calibration, fewer steps")
    p.add_argument("--no-calibrate", action="store_true",
                   help="use the calibration already in $EXPLORER_HOME")
    p.add_argument("--out", default=None, help="also write the table as Markdown here")
    args = p.parse_args(argv)
    args.models = [m for m in args.models.split(",") if m]
    args.kinds = [k for k in args.kinds.split(",") if k]
    args.truth = [d for d in args.truth.split(",") if d]
    bad = [m for m in args.models if m not in MODELS] + [k for k in args.kinds if k not in KINDS]
    bad += [d for d in args.truth if d not in TRUTH_DTYPES]
    if bad:
        p.error(f"unknown {', '.join(bad)}: models are {', '.join(MODELS)}, kinds "
                f"{', '.join(KINDS)}")
    if args.workers < 1 or args.steps < 1 or args.warmup < 0:
        p.error("--workers and --steps must be ≥ 1, --warmup ≥ 0")
    return args


def rel_error(predicted, measured):
    """``(predicted − measured) / measured``, or None when either is missing."""
    if predicted is None or not measured:
        return None
    return (float(predicted) - float(measured)) / float(measured)


def _ms(v) -> str:
    return "—" if v is None else f"{float(v) * 1e3:.1f}"


def _gib(v) -> str:
    return "—" if v is None else f"{float(v) / 2 ** 30:.2f}"


def _pct(v) -> str:
    return "—" if v is None else f"{float(v) * 100:+.0f} %"


COLUMNS = ("model", "batch", "dtype", "kind", "truth ms", "predicted ms", "measured ms",
           "error", "mem pred GiB", "mem meas GiB", "note")


def step_spread(times):
    """Half the interquartile range of the step times over their median (None for < 4)."""
    try:
        ts = sorted(float(t) for t in (times or []))
    except (TypeError, ValueError):
        return None
    if len(ts) < 4:
        return None
    q = statistics.quantiles(ts, n=4)
    med = statistics.median(ts)
    return (q[2] - q[0]) / 2 / med if med > 0 else None


def row_cells(r: dict) -> list:
    """One table row's cells from a result dict (missing figures as —)."""
    return [r["model"], str(r.get("batch", "")), r.get("dtype", "fp32"), r.get("kind", ""),
            _ms(r.get("truth_s")), _ms(r.get("predicted_s")), _ms(r.get("measured_s")),
            _pct(rel_error(r.get("predicted_s"), r.get("measured_s"))),
            _gib(r.get("mem_predicted")), _gib(r.get("mem_measured")), r.get("note", "")]


def format_table(rows: list) -> str:
    """The rows as one Markdown table (aligned for the terminal too)."""
    cells = [list(COLUMNS)] + [row_cells(r) for r in rows]
    width = [max(len(c[i]) for c in cells) for i in range(len(COLUMNS))]
    line = lambda c: "| " + " | ".join(x.ljust(w) for x, w in zip(c, width)) + " |"  # noqa: E731
    out = [line(cells[0]), "|" + "|".join("-" * (w + 2) for w in width) + "|"]
    out += [line(c) for c in cells[1:]]
    return "\n".join(out)


def plan_memory(doc: dict):
    """The predicted peak bytes of a plan document (the largest device's)."""
    for key in ("peak_memory_bytes", "memory_per_device_bytes"):
        v = doc.get(key)
        if isinstance(v, list) and v:
            return float(max(v))
        if isinstance(v, (int, float)) and v:
            return float(v)
    return None


def run_memory(res: dict):
    """The measured peak bytes of a run: the allocator's ``max_memory_allocated`` (largest
    worker).  A Tofu run's ``measured_peak_memory_bytes`` is its own count of live tiles, the
    plan's accounting, so the allocator's figure comes first."""
    for key in ("measured_allocated_peak_bytes", "measured_peak_memory_bytes"):
        v = res.get(key)
        if isinstance(v, list) and v and all(x is not None for x in v):
            return float(max(v))
    return None


def require_cuda() -> None:
    """Exit 2 with one line unless torch sees a CUDA GPU."""
    try:
        import torch
        ok = torch.cuda.is_available() and torch.cuda.device_count() > 0
    except Exception:  # noqa: BLE001 - no torch, no GPU
        ok = False
    if not ok:
        print(NO_GPU, file=sys.stderr)
        raise SystemExit(2)


# --------------------------------------------------------------------------------------------
# On the GPU
# --------------------------------------------------------------------------------------------

def truth_step(model: str, batch: int, margs: dict, dtype: str, steps: int = 20,
               warmup: int = 5) -> tuple:
    """``(median step seconds, peak allocated bytes, step seconds)`` of a plain PyTorch training step of
    the model on cuda:0 (forward, loss, backward, SGD), ``dtype`` ``fp32`` (TF32 off),
    ``tf32`` or ``bf16`` (autocast, fp32 master weights)."""
    import torch

    from explorer.engine.core.capture import load, loss_function, loss_of
    dev = torch.device("cuda:0")
    torch.cuda.set_device(dev)
    torch.manual_seed(0)
    net, x = load(model, batch, margs, meta=False)
    net, x = net.to(dev).train(), x.to(dev)
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    loss_fn = loss_function(model)
    saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = dtype == "tf32"
    try:
        def step():
            opt.zero_grad(set_to_none=True)
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=dtype == "bf16"):
                loss = loss_of(net(x), loss_fn)
            loss.backward()
            opt.step()
        for _ in range(warmup):
            step()
        torch.cuda.synchronize(dev)
        torch.cuda.reset_peak_memory_stats(dev)
        times = []
        for _ in range(steps):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            step()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b) / 1e3)
        return statistics.median(times), int(torch.cuda.max_memory_allocated(dev)), times
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def plan_row(model: str, batch: int, margs: dict, kind: str, workers: int, steps: int,
             warmup: int, truth) -> dict:
    """Search a plan of ``kind`` on the local preset, run it on the GPU(s), its row."""
    from explorer import service
    from explorer.engine.runtime.dispatch import run_document
    algo, cost, dtype = KINDS[kind]
    row = {"model": model, "batch": batch, "dtype": dtype,
           "kind": f"{kind if kind in ('tofu', 'placement') else 'layerwise'} ({algo}, {cost})",
           "truth_s": truth.get(dtype)}
    try:
        req = service.Request(model=model, batch=batch, model_args=dict(margs), preset="local",
                              devices=workers, algo=algo, cost=cost, dtype=dtype)
        doc = service.run_method(req).document()
        res = run_document(doc, steps=steps, warmup=warmup, timeout_s=600.0, device="cuda")
    except Exception as exc:  # noqa: BLE001 - one failing plan is one row, not the end
        if os.environ.get("EXPLORER_DEBUG"):
            import traceback
            traceback.print_exc()
        row["note"] = f"failed: {type(exc).__name__}: {str(exc).splitlines()[0][:100]}"
        return row
    row.update(predicted_s=res.get("predicted_step_time_s"),
               measured_s=res.get("measured_step_time_s"),
               mem_predicted=plan_memory(doc), mem_measured=run_memory(res))
    notes = []
    spread = step_spread(res.get("step_times_s"))
    if spread is not None:
        notes.append(f"steps ±{spread * 100:.0f} %")
    if res.get("shared"):
        notes.append("shared GPU: not a prediction target")
    if res.get("reference_ok") is False:
        ref = res.get("reference") or {}
        worst = ref.get("max_rel_error", res.get("max_rel_error"))
        notes.append("REFERENCE CHECK FAILED" + (f" (max rel. error {worst:.2g})"
                                                 if isinstance(worst, (int, float)) else ""))
    row["note"] = "; ".join(notes)
    return row


_T0 = time.perf_counter()


def say(msg: str) -> None:
    """A progress line on stderr, with the seconds since the benchmark started."""
    print(f"[{time.perf_counter() - _T0:6.1f} s] {msg}", file=sys.stderr, flush=True)


def main(argv=None) -> int:
    args = parse_args(argv)
    require_cuda()
    import torch
    os.environ.setdefault("EXPLORER_DEVICE", "cuda")
    from explorer.engine.runtime.calibrate import calibrate
    from explorer.engine.runtime.commands import format_gpu_calibration
    name = torch.cuda.get_device_name(0)
    t0 = time.perf_counter()
    steps, warmup = (5, 2) if args.quick else (args.steps, args.warmup)
    if not args.no_calibrate:
        say(f"calibrating {name} ...")
        cal = calibrate(None, quick=args.quick)
        print(format_gpu_calibration(cal), file=sys.stderr)
    rows = []
    for model in args.models:
        batch, margs = MODELS[model]
        truth = {}
        for dt in args.truth:
            say(f"{model} b{batch}: plain PyTorch step in {dt} ...")
            t, mem, times = truth_step(model, batch, margs, dt, steps, warmup)
            truth[dt] = t
            torch.cuda.empty_cache()
            rows.append({"model": model, "batch": batch, "dtype": dt, "kind": "plain PyTorch",
                         "truth_s": t, "measured_s": t, "mem_measured": mem,
                         "note": f"steps ±{(step_spread(times) or 0) * 100:.0f} %"})
            say(" | ".join(row_cells(rows[-1])))
        for kind in args.kinds:
            say(f"{model} b{batch}: {kind} plan on {args.workers} worker(s) ...")
            rows.append(plan_row(model, batch, margs, kind, args.workers, steps, warmup,
                                 truth))
            say(" | ".join(row_cells(rows[-1])))
    table = format_table(rows)
    took = time.perf_counter() - t0
    head = (f"{name} × {torch.cuda.device_count()}, torch {torch.__version__}, "
            f"{time.strftime('%Y-%m-%d')}, {took / 60:.1f} min")
    print(head)
    print(table)
    if args.out:
        with open(args.out, "w") as fh:
            fh.write(f"# GPU benchmark ({head})\n\n`python benchmarks/gpu.py "
                     f"{' '.join(argv if argv is not None else sys.argv[1:])}`\n\n{table}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

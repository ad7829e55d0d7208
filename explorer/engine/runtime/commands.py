"""What ``explorer run`` and ``explorer calibrate`` do with their parsed arguments (the parsers
are in ``explorer/cli.py``): run options, printing a run, calibrating.

Both commands take an ``argparse.Namespace`` and return an exit code; errors the user can fix
raise :class:`explorer.errors.ExplorerError` subclasses (``main`` prints them, exit 2).

``explorer run PLAN.json [--steps K] [--warmup W] [--timeout S] [--json] [--devices N]
[--model M] [--dtype fp32|tf32|bf16] [--no-check] [--sync auto|p2p|allreduce]
[--memory-per-worker GIB]`` — exit code 0 when the reference check
passes (or is skipped), 1 when it fails.

``explorer calibrate [--devices N] [--model M [--batch B] [--model-arg K=V]...] [--quick]
[--json]``.
"""

from __future__ import annotations

import argparse
import os
import sys

from explorer.errors import ExplorerError
from explorer.engine.core.plandoc import dumps
from explorer.engine.runtime.memlimit import parse_gib


def _kv(text: str) -> tuple:
    k, eq, v = text.partition("=")
    if not eq or not k:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return k, v


def run_options(args) -> dict:
    """:func:`~explorer.engine.runtime.dispatch.run_document` keywords from ``explorer run``'s
    arguments (absent ones take their defaults)."""
    quiet = bool(getattr(args, "json", False))

    def progress(i, done, total):
        if not quiet and sys.stderr.isatty():
            print(f"\rstep {done}/{total}", end="", file=sys.stderr, flush=True)
    return {"steps": int(getattr(args, "steps", 20)), "warmup": int(getattr(args, "warmup", 5)),
            "timeout_s": float(getattr(args, "timeout", 600.0)),
            "check": not getattr(args, "no_check", False),
            "expect": {"devices": getattr(args, "devices", None),
                       "model": getattr(args, "model", None),
                       "dtype": _dtype(getattr(args, "dtype", None))},
            "sync": getattr(args, "sync", "auto"), "progress": progress,
            "memory_per_worker": parse_gib(getattr(args, "memory_per_worker", None)),
            **_device_options(args)}


def _dtype(value):
    """``--dtype`` checked (one line naming the value when it is not fp32, tf32 or bf16)."""
    if value is None:
        return None
    from explorer.engine.core.precision import check
    try:
        return check(value)
    except ValueError as exc:
        raise ExplorerError(f"--{exc}") from None


def _device_options(args) -> dict:
    """``--device`` / ``--backend`` / ``--gpus`` as :func:`run_document` keywords (only those
    given: the defaults come from the environment, :mod:`.devicemap`)."""
    out = {}
    for key in ("device", "backend", "gpus"):
        v = getattr(args, key, None)
        if v is not None and v != "auto":
            out[key] = v
    return out


def print_run(res: dict, args) -> int:
    """Print a run result (JSON with ``--json``, else the report); the exit code: 0 when the
    reference check passed or was skipped, 1 when it failed."""
    from explorer.engine.runtime.report import format_run
    if getattr(args, "json", False):
        print(dumps(res, indent=2))
    else:
        if sys.stderr.isatty():
            print("\r", end="", file=sys.stderr)
        print(format_run(res))
    return 0 if res.get("reference_ok") in (True, None) else 1


def cmd_run(args) -> int:
    """``explorer run PLAN.json``: any plan kind, stored in the run store."""
    from explorer.engine.runtime.dispatch import read_document, run_document
    from explorer.engine.runtime.store import RunStore, run_key
    doc = read_document(args.plan)
    res = run_document(doc, **run_options(args))
    RunStore().add_safely(run_key(doc), res)
    return print_run(res, args)


def cmd_calibrate(args) -> int:
    from explorer.engine.runtime.devicemap import requested
    with requested(getattr(args, "device", None)):
        return _calibrate(args)


def _calibrate(args) -> int:
    from explorer.engine.core.devices import gpu_count, worker_device_kind
    from explorer.engine.runtime.calibrate import calibrate
    devices = getattr(args, "devices", None)
    gpu = worker_device_kind() == "cuda"
    if devices is None:
        if gpu:
            devices = gpu_count()
        else:
            try:
                devices = len(os.sched_getaffinity(0))
            except AttributeError:
                devices = os.cpu_count() or 1
    if devices < 1:
        raise ExplorerError(f"--devices must be ≥ 1, got {devices}")
    model_args = dict(getattr(args, "model_arg", []) or [])
    from explorer.engine.core import precision as P
    try:
        dtype = P.check(getattr(args, "dtype", None) or "fp32")
    except ValueError as exc:
        raise ExplorerError(f"--dtype: {exc}") from None
    if dtype != "fp32":
        if not getattr(args, "model", None):
            raise ExplorerError(f"--dtype {dtype} profiles a model's shards: give --model "
                                f"(the machine's figures are measured in every precision)")
        P.require_supported(dtype, worker_device_kind())
    if getattr(args, "model", None):
        # an unknown or untraceable model fails in one line before anything is measured
        from explorer.engine.core.capture_cache import layer_graph
        layer_graph(args.model, getattr(args, "batch", None), model_args)
    quiet = bool(getattr(args, "json", False))
    say = None if quiet else (lambda msg: print(f"measuring {msg} ...", file=sys.stderr))
    cal = calibrate(devices, model=getattr(args, "model", None),
                    batch=getattr(args, "batch", None), model_args=model_args,
                    quick=bool(getattr(args, "quick", False)), progress=say, dtype=dtype)
    if quiet:
        print(dumps(cal, indent=2))
        return 0
    print(f"wrote {cal['path']}")
    if cal.get("device_kind") == "cuda":
        print(format_gpu_calibration(cal))
        _print_profiled(cal)
        return 0
    print(f"  compute  {cal['peak_flops'] / 1e9:8.1f} GFLOP/s per worker thread (matmul "
          f"{cal['matmul_flops'] / 1e9:.1f}, conv {cal['conv_flops'] / 1e9:.1f})")
    print(f"  memory   {cal['mem_bw'] / 1e9:8.1f} GB/s (copy, one thread)")
    print(f"  link     {cal['link_bw'] / 1e9:8.2f} GB/s point-to-point ({cal['backend']})")
    print(f"  latency  {cal['latency'] * 1e3:8.3f} ms per exchange between computing workers "
          f"(ping-pong alone {cal['pingpong_latency_s'] * 1e3:.3f} ms)")
    if cal.get("allreduce_1k_s") is not None:
        print(f"  all-reduce 1 KB {cal['allreduce_1k_s'] * 1e3:.3f} ms, "
              f"{cal['allreduce_big_bytes'] / 2 ** 20:.0f} MB "
              f"{cal['allreduce_big_s'] * 1e3:.1f} ms")
    nz = cal.get("noise") or {}
    if nz.get("steal") is not None:
        print(f"  noise    {nz['steal'] * 100:.1f} % of the CPU stolen by other tenants, "
              f"machine speed change {nz['canary_change'] * 100:+.0f} %")
    if nz.get("note"):
        print(nz["note"].replace("timing", "calibration", 1))
    _print_profiled(cal)
    return 0


def format_gpu_calibration(cal: dict) -> str:
    """The lines ``explorer calibrate`` prints for a GPU calibration."""
    mm, cv = cal["matmul_flops_by_dtype"], cal["conv_flops_by_dtype"]
    lines = [f"  GPU      {cal.get('gpu_name') or '?'} × {cal.get('gpus', 1)} "
             f"({cal['backend']})"]
    for k in mm:
        lines.append(f"  {k:8s} matmul {mm[k] / 1e12:8.1f} TFLOP/s, conv "
                     f"{cv.get(k, 0.0) / 1e12:8.1f} TFLOP/s")
    lines.append(f"  memory   {cal['mem_bw'] / 1e9:8.1f} GB/s (device copy)")
    lines.append(f"  host     {cal['h2d_bw'] / 1e9:8.1f} GB/s to the GPU, "
                 f"{cal['d2h_bw'] / 1e9:.1f} GB/s back")
    if cal.get("backend") == "nccl":
        lines.append(f"  link     {cal['link_bw'] / 1e9:8.1f} GB/s NCCL point-to-point, "
                     f"latency {cal['latency'] * 1e6:.1f} µs")
        if cal.get("allreduce_1k_s") is not None:
            lines.append(f"  all-reduce 1 KB {cal['allreduce_1k_s'] * 1e6:.1f} µs, "
                         f"{cal['allreduce_big_bytes'] / 2 ** 20:.0f} MB "
                         f"{cal['allreduce_big_s'] * 1e3:.2f} ms")
    else:
        lines.append("  link     one GPU: workers sharing it go through host memory "
                     f"(~{cal['link_bw'] / 1e9:.1f} GB/s)")
    return "\n".join(lines)


def _print_profiled(cal: dict) -> None:
    if cal.get("profiled"):
        p = cal["profiled"]
        print(f"  profiled {p['model']}: {p['layers']} layers, {p['candidates']} candidate "
              f"configurations ({p['shards']} shard shapes) in {cal['profile_time_s']:.1f} s")
    if cal.get("op_profile"):
        o = cal["op_profile"]
        print(f"  timed {o['ops']} operators of the step ({o['step_s'] * 1e3:.1f} ms in all) "
              f"in {o['seconds']:.1f} s")

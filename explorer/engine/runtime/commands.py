"""What ``explorer run`` and ``explorer calibrate`` do with their parsed arguments (the parsers
are in ``explorer/cli.py``): run options, printing a run, calibrating.

Both commands take an ``argparse.Namespace`` and return an exit code; errors the user can fix
raise :class:`explorer.errors.ExplorerError` subclasses (``main`` prints them, exit 2).

``explorer run PLAN.json [--steps K] [--warmup W] [--timeout S] [--json] [--devices N]
[--model M] [--no-check] [--sync auto|p2p|allreduce] [--memory-per-worker GIB]`` — exit code 0 when the reference check
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
                       "model": getattr(args, "model", None)},
            "sync": getattr(args, "sync", "auto"), "progress": progress,
            "memory_per_worker": parse_gib(getattr(args, "memory_per_worker", None))}


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
    from explorer.engine.runtime.calibrate import calibrate
    devices = getattr(args, "devices", None)
    if devices is None:
        try:
            import torch
            devices = torch.cuda.device_count() or len(os.sched_getaffinity(0))
        except (AttributeError, ImportError):
            devices = os.cpu_count() or 1
    if devices < 1:
        raise ExplorerError(f"--devices must be ≥ 1, got {devices}")
    model_args = dict(getattr(args, "model_arg", []) or [])
    quiet = bool(getattr(args, "json", False))
    say = None if quiet else (lambda msg: print(f"measuring {msg} ...", file=sys.stderr))
    cal = calibrate(devices, model=getattr(args, "model", None),
                    batch=getattr(args, "batch", None), model_args=model_args,
                    quick=bool(getattr(args, "quick", False)), progress=say)
    if quiet:
        print(dumps(cal, indent=2))
        return 0
    print(f"wrote {cal['path']}")
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
    if cal.get("profiled"):
        p = cal["profiled"]
        print(f"  profiled {p['model']}: {p['layers']} layers, {p['candidates']} candidate "
              f"configurations ({p['shards']} shard shapes) in {cal['profile_time_s']:.1f} s")
    if cal.get("op_profile"):
        o = cal["op_profile"]
        print(f"  timed {o['ops']} operators of the step ({o['step_s'] * 1e3:.1f} ms in all) "
              f"in {o['seconds']:.1f} s")
    return 0

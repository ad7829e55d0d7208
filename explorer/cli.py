"""The ``explorer`` command line.

    explorer search MODEL --devices N [--preset NAME] [--algo NAME] [--pin LAYER=CONFIG]...
                    [--batch B] [--model-arg KEY=VALUE]... [--json] [--dump-costs FILE]
    explorer run PLAN.json [--steps K] [--json]
    explorer export PLAN.json --to torch -o FILE.py
    explorer calibrate [--devices N] [--model MODEL] [--quick]
    explorer models | presets | graph MODEL
    explorer cache [info | clear]
    explorer serve [--host 127.0.0.1] [--port 8050] [--allow-model-files]

Errors the user can fix print one line on stderr and exit with status 2.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from explorer.errors import ExplorerError, InfeasiblePlan


def _kv(text: str) -> tuple:
    k, eq, v = text.partition("=")
    if not eq or not k:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return k, v


def _methods_help() -> str:
    from explorer.engine.search import describe
    fam = {"layerwise": "layer-wise (OptCNN and baselines)",
           "tofu": "operator partitioning (Tofu, Section 7.3 baselines)",
           "placement": "device placement (Celeritas, baselines)"}
    return "; ".join(f"{label}: {', '.join(describe(f))}" for f, label in fam.items())


def build_parser() -> argparse.ArgumentParser:
    from explorer.engine.search import METHODS
    p = argparse.ArgumentParser(prog="explorer", description=__doc__.splitlines()[0])
    p.add_argument("--verbose", action="store_true",
                   help="let torch's and Transformers' own log lines through while tracing a "
                        "model (they are silenced: an error is one line)")
    sub = p.add_subparsers(dest="cmd", required=True)

    s = sub.add_parser("search", help="find a parallelization plan for a model")
    s.add_argument("model", help="example name (see `explorer models`), path/to/file.py:function "
                   "or hf:NAME (a Hugging Face architecture)")
    s.add_argument("--devices", "-n", type=int, default=4, help="number of devices (default 4)")
    s.add_argument("--preset", default=None,
                   help="device preset or cluster JSON (default: P100 cluster sized to --devices)")
    s.add_argument("--algo", default=DEFAULT_ALGO, choices=list(METHODS), metavar="METHOD",
                   help=_methods_help())
    s.add_argument("--memory-per-device", type=float, default=None, metavar="GIB",
                   help="placement algorithms: memory limit per device in GiB (default: the "
                        "preset's capacity)")
    s.add_argument("--refine-memory", choices=["budget", "simulated"], default="simulated",
                   help="celeritas: what the simulated refinement keeps within capacity - each "
                        "device's simulated peak by liveness (default; the rule oom is judged "
                        "by) or the stricter whole-step sum of every output")
    s.add_argument("--dump-graph", metavar="FILE",
                   help="placement algorithms: write the operator graph the placers saw "
                        "(node-link JSON with times, memory, bytes and the device graph)")
    s.add_argument("--opt", action="append", default=[], type=_kv, metavar="KEY=VALUE",
                   help="an option of the method, e.g. --algo megatron --opt tp=2 "
                        "(repeatable; unknown keys are rejected with the valid ones)")
    s.add_argument("--pin", action="append", default=[], metavar="TARGET=SPEC",
                   help="pin a layer (LAYER=n=2,c=2 and/or LAYER=@0,1), an operator or "
                        "cluster (OP=@2, cluster:K=@1) or a tensor's Tofu tiling "
                        "(TENSOR=grid=2x1); repeatable")
    s.add_argument("--batch", "-b", type=int, default=None, help="global batch size")
    s.add_argument("--model-arg", "-a", action="append", default=[], type=_kv,
                   metavar="KEY=VALUE", help="model keyword argument; repeatable")
    s.add_argument("--cost", default="analytic", choices=["analytic", "measured"],
                   help="t_C from a roofline of the device (analytic) or by running shards "
                        "on the local device (measured, cached in SQLite)")
    s.add_argument("--sync", default="ps", choices=["ps", "ring"],
                   help="parameter synchronisation model: parameter server (paper) or ring")
    s.add_argument("--degrees", default="auto", metavar="SPEC",
                   help="degrees a layer's dimensions may take: auto (every divisor up to 16 "
                        "devices; beyond, powers of two, or of 4, 8... only when powers of "
                        "two would be refused as too large), divisors, pow2, or a list such as "
                        "1,4,16,64")
    s.add_argument("--dtype", default="fp32", metavar="fp32|tf32|bf16",
                   help="the step's precision the costs, memory and the plan assume: fp32 "
                        "(default), tf32 (tensor cores), bf16 (autocast, fp32 master weights)")
    s.add_argument("--json", action="store_true", help="print the plan as JSON")
    s.add_argument("--dump-costs", metavar="FILE", help="write the cost tables as JSON")
    s.add_argument("--out", "-o", metavar="PLAN.json", help="also save the plan JSON to a file")
    s.add_argument("--trace", action="store_true", help="include the search trace in --json")
    s.add_argument("--compare", action="store_true",
                   help="also cost the data/model/OWT baselines and print them side by side")
    s.add_argument("--ignore-memory", action="store_true",
                   help="return a plan even if it exceeds device memory")

    r = sub.add_parser("run", help="execute a saved plan on the local devices and check it")
    r.add_argument("plan", metavar="PLAN.json", help="a plan from `explorer search --out`")
    r.add_argument("--steps", type=int, default=20, help="measured steps (default 20)")
    r.add_argument("--warmup", type=int, default=5, help="discarded warm-up steps (default 5)")
    r.add_argument("--timeout", type=float, default=600.0,
                   help="seconds before a stuck run is stopped (default 600)")
    r.add_argument("--no-check", action="store_true", help="skip the single-device check")
    r.add_argument("--json", action="store_true", help="print the result as JSON")
    r.add_argument("--devices", "-n", type=int, default=None,
                   help="refuse the plan before launching unless it is for this many devices")
    r.add_argument("--model", default=None,
                   help="refuse the plan before launching unless it is for this model")
    r.add_argument("--memory-per-worker", type=float, default=None, metavar="GIB",
                   help="per-worker memory limit (Tofu plans, placements): a plan predicted "
                        "over it is refused before launch, a worker going over it stops the run")
    r.add_argument("--dtype", default=None, metavar="fp32|tf32|bf16",
                   help="refuse a plan made for another precision (the plan's own is used)")
    r.add_argument("--sync", default="auto", choices=["auto", "p2p", "allreduce"],
                   help="gradient sums of replicated shards: point-to-point or all-reduce "
                        "(auto: p2p on gloo, all-reduce on NCCL)")
    r.add_argument("--device", default=None, choices=["auto", "cpu", "cuda"],
                   help="what the workers compute on (default $EXPLORER_DEVICE, else auto: "
                        "the GPUs when there are any)")
    r.add_argument("--backend", default=None, choices=["auto", "gloo", "nccl"],
                   help="process group backend (auto: NCCL with a GPU per worker, else gloo)")
    r.add_argument("--gpus", type=int, default=None, metavar="K",
                   help="use K of this machine's GPUs (workers beyond K share them)")

    q = sub.add_parser("rank", help="search several methods, run every plan here, and check "
                       "the predicted order against the measured one")
    q.add_argument("model", help="example name, path/to/file.py:function or hf:NAME")
    q.add_argument("--devices", "-n", type=int, default=2, help="local workers (default 2)")
    q.add_argument("--preset", default="local", help="must be local: the plans run here")
    q.add_argument("--batch", "-b", type=int, default=None, help="global batch size")
    q.add_argument("--model-arg", "-a", action="append", default=[], type=_kv,
                   metavar="KEY=VALUE", help="model keyword argument; repeatable")
    q.add_argument("--methods", default=None, metavar="A,B,...",
                   help="methods to rank (default: data, model, owt, megatron, optcnn, tofu, "
                        "celeritas, m-etf, metis)")
    q.add_argument("--cost", default="analytic", choices=["analytic", "measured"],
                   help="every family's costs (measured: after `explorer calibrate "
                        "--model`)")
    q.add_argument("--rounds", type=int, default=3,
                   help="runs of every plan, interleaved (default 3)")
    q.add_argument("--steps", type=int, default=5, help="measured steps per run (default 5)")
    q.add_argument("--warmup", type=int, default=2, help="warm-up steps per run (default 2)")
    q.add_argument("--json", action="store_true", help="print the report as JSON")

    c = sub.add_parser("compare", help="search every family's methods on one model and "
                       "devices and rank their predicted steps in one table")
    c.add_argument("model", help="example name, path/to/file.py:function or hf:NAME")
    c.add_argument("--devices", "-n", type=int, default=4, help="number of devices (default 4)")
    c.add_argument("--preset", default=None,
                   help="device preset or cluster JSON (default: P100 cluster sized to "
                        "--devices)")
    c.add_argument("--batch", "-b", type=int, default=None, help="global batch size")
    c.add_argument("--model-arg", "-a", action="append", default=[], type=_kv,
                   metavar="KEY=VALUE", help="model keyword argument; repeatable")
    c.add_argument("--methods", default=None, metavar="A,B,...",
                   help="methods to compare (default: every family's comparison: the "
                        "layer-wise baselines and optcnn, Tofu and its baselines, Celeritas "
                        "and its baselines)")
    c.add_argument("--cost", default="analytic", choices=["analytic", "measured"],
                   help="every family's costs (measured: after `explorer calibrate "
                        "--model`)")
    c.add_argument("--dtype", default="fp32", metavar="fp32|tf32|bf16",
                   help="the step's precision every method assumes")
    c.add_argument("--json", action="store_true", help="print the table as JSON")

    x = sub.add_parser("export", help="write a layer-wise plan as a PyTorch program using "
                                      "PyTorch's parallel APIs (run it with torchrun)")
    x.add_argument("plan", metavar="PLAN.json", help="a layer-wise plan from `explorer search "
                                                     "--out`")
    x.add_argument("--to", default="torch", metavar="TARGET",
                   help="what to export to: torch (DeviceMesh, parallelize_module, FSDP2)")
    x.add_argument("--out", "-o", metavar="FILE.py", default=None,
                   help="where to write the program (default: a name from the plan, here)")
    x.add_argument("--strict", action="store_true",
                   help="write nothing (exit 1) when a layer would depart from the plan")

    c = sub.add_parser("calibrate", help="measure this machine for the `local` preset")
    c.add_argument("--devices", "-n", type=int, default=None,
                   help="worker processes to measure links between (default: cores)")
    c.add_argument("--model", default=None,
                   help="also profile every layer configuration of this model")
    c.add_argument("--batch", "-b", type=int, default=None)
    c.add_argument("--model-arg", "-a", action="append", default=[], type=_kv,
                   metavar="KEY=VALUE", help="model keyword argument for --model; repeatable")
    c.add_argument("--quick", action="store_true",
                   help="fewer repetitions: seconds instead of minutes, noisier numbers")
    c.add_argument("--device", default=None, choices=["auto", "cpu", "cuda"],
                   help="measure the GPUs (cuda) or CPU worker processes (cpu); default "
                        "$EXPLORER_DEVICE, else the GPUs when there are any")
    c.add_argument("--dtype", default="fp32", metavar="fp32|tf32|bf16",
                   help="profile --model's shards in this precision (what `search --cost "
                        "measured --dtype` reads; default fp32)")
    c.add_argument("--json", action="store_true")

    sub.add_parser("models", help="list the built-in example models")
    sub.add_parser("presets", help="list the device presets")

    k = sub.add_parser("cache", help="show or clear the capture cache (traced models kept "
                                     "across runs)")
    k.add_argument("action", nargs="?", default="info", choices=["info", "clear"],
                   help="info (default): where it is, entries and size; clear: remove every "
                        "entry (the next search traces its model again)")

    g = sub.add_parser("graph", help="print a model's layer graph")
    g.add_argument("model")
    g.add_argument("--batch", "-b", type=int, default=None)
    g.add_argument("--model-arg", "-a", action="append", default=[], type=_kv)
    g.add_argument("--json", action="store_true")

    v = sub.add_parser("serve", help="start the web app")
    v.add_argument("--host", default="127.0.0.1",
                   help="address to bind (default 127.0.0.1: this machine only; any other "
                        "address lets everyone who reaches it use the app)")
    v.add_argument("--port", type=int, default=8050, help="port, 1-65535 (default 8050)")
    v.add_argument("--debug", action="store_true",
                   help="Dash debug mode (this machine only: the debugger runs code)")
    v.add_argument("--allow-model-files", action="store_true",
                   help="let the page load path.py:function models (the model box, a plan or "
                        "a URL naming one), which runs their code on this machine")
    v.add_argument("--model", default="vgg16", help="model the page opens on")
    v.add_argument("--devices", "-n", type=int, default=4)
    v.add_argument("--preset", default="p100-nvlink-4")
    v.add_argument("--batch", "-b", type=int, default=None)
    v.add_argument("--model-arg", "-a", action="append", default=[], type=_kv)
    v.add_argument("--algo", default="optcnn",
                   help="method the page opens with: a layer-wise search, a Tofu method or a "
                        "placement method (see `explorer search --help`)")
    return p


def _trace_early(argv: list) -> None:
    """``explorer search MODEL …`` with the default layer-wise method: start tracing MODEL in
    a child process (:func:`~explorer.engine.core.capture_cache.start_layer_graph`) before the
    parser and the method registry are imported - its first search waits 0.3 s less.  Reads
    only ``MODEL``, ``--batch`` and ``--model-arg``; anything it cannot read plainly starts
    nothing (:func:`cmd_search` then starts the child as usual)."""
    if len(argv) < 2 or argv[0] != "search" or argv[1].startswith("-"):
        return
    batch, margs, rest = None, {}, argv[2:]
    for i, a in enumerate(rest):
        flag, eq, val = a.partition("=")
        if flag in ("--batch", "-b", "--model-arg", "-a", "--algo"):
            if not eq:
                if i + 1 >= len(rest):
                    return
                val = rest[i + 1]
            if flag in ("--batch", "-b"):
                if not val.isdigit() or int(val) < 1:
                    return
                batch = int(val)
            elif flag == "--algo":
                if val != DEFAULT_ALGO:
                    return
            else:
                k, kv_eq, v = val.partition("=")
                if not kv_eq or not k:
                    return
                margs[k] = v
    from explorer.engine.core import capture_cache
    capture_cache.TRACE_IN_CHILD = True
    capture_cache.start_layer_graph(argv[1], batch, margs)


#: the method ``explorer search`` runs when none is given
DEFAULT_ALGO = "optcnn"


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    _trace_early(argv)
    args = build_parser().parse_args(argv)
    if args.verbose:
        import os

        from explorer.engine.core.capture import VERBOSE_ENV
        os.environ[VERBOSE_ENV] = "1"
    try:
        return {"search": cmd_search, "models": cmd_models, "presets": cmd_presets,
                "graph": cmd_graph, "serve": cmd_serve, "run": cmd_run,
                "calibrate": cmd_calibrate, "export": cmd_export,
                "cache": cmd_cache, "rank": cmd_rank,
                "compare": cmd_compare}[args.cmd](args)
    except (ExplorerError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except MemoryError as exc:         # numpy's _ArrayMemoryError says how much it wanted
        devices = getattr(args, "devices", None)
        print(f"error: this machine has not enough memory for the request"
              + (f" at {devices} devices" if devices else "") + f" ({exc}); ask for fewer "
              f"devices or a smaller model", file=sys.stderr)
        return 2
    except BrokenPipeError:            # `explorer graph big | head`: the reader left
        import os
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except OSError as exc:             # an output file that cannot be written
        where = f" {exc.filename}" if getattr(exc, "filename", None) else ""
        print(f"error: cannot write{where}: {exc.strerror or exc}", file=sys.stderr)
        return 2


# --------------------------------------------------------------------------------------------


def _request(args):
    """The command line's model and device arguments as the service's request."""
    from explorer.service import Request
    if args.batch is not None and args.batch < 1:
        raise ValueError(f"--batch must be ≥ 1, got {args.batch}")
    if args.devices < 1:
        raise ValueError(f"--devices must be ≥ 1, got {args.devices}")
    return Request(model=args.model, batch=args.batch, model_args=dict(args.model_arg),
                   preset=args.preset or "p100-cluster", devices=args.devices, algo=args.algo,
                   cost=getattr(args, "cost", "analytic"), sync=getattr(args, "sync", "ps"),
                   degrees=getattr(args, "degrees", "auto"),
                   dtype=getattr(args, "dtype", None) or "fp32")


def _check_flags(args, family: str) -> None:
    """A flag the chosen method does not use is an error, not silently ignored."""
    only = [("--dump-costs", args.dump_costs, ("layerwise",)),
            ("--cost measured", args.cost != "analytic", ("layerwise", "placement", "tofu")),
            ("--sync ring", args.sync != "ps", ("layerwise",)),
            ("--degrees", args.degrees != "auto", ("layerwise",)),
            ("--dump-graph", args.dump_graph, ("placement",)),
            ("--memory-per-device", args.memory_per_device is not None, ("placement",)),
            ("--compare", args.compare, ("layerwise", "tofu"))]
    for flag, given, families in only:
        if given and family not in families:
            raise ValueError(f"{flag} does not apply to {args.algo} (a {family} method); it "
                             f"is for {' and '.join(families)} methods")
    if args.refine_memory != "simulated" and args.algo != "celeritas":
        raise ValueError(f"--refine-memory applies to celeritas only, not {args.algo}")


def _opt_value(text: str):
    """A ``--opt`` value as the int, float or bool it spells, else the text."""
    low = text.strip().lower()
    if low in ("true", "false"):
        return low == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def _options(args, family: str) -> dict:
    given = {k: _opt_value(v) for k, v in getattr(args, "opt", None) or []}
    if family != "placement":
        return given
    opts = given
    if args.memory_per_device is not None:
        if args.memory_per_device <= 0:
            raise ValueError(f"--memory-per-device must be > 0 GiB, got "
                             f"{args.memory_per_device}")
        opts["memory_per_device"] = args.memory_per_device * 2 ** 30
    if args.algo == "celeritas":
        opts["refine_memory"] = args.refine_memory
    return opts


def _write(path: str, doc: dict) -> None:
    """Write a sealed plan document (schema, version, checksum: ``explorer run`` refuses an
    edited file)."""
    from explorer.engine.core.plandoc import dumps
    with open(path, "w") as fh:
        fh.write(dumps(doc, indent=1))


#: From this many devices a layer-wise search loads the compiled kernels while its model is
#: traced (in a child process): it will need them, and the wait costs nothing then
PRELOAD_DEVICES = 64


def cmd_search(args) -> int:
    """``explorer search``: any registered method, through the service."""
    from explorer import service
    from explorer.engine.search import family_of
    req = _request(args)
    family = family_of(args.algo)
    _check_flags(args, family)
    if req.preset == "local":          # the plan runs here: this machine must compute it
        from explorer.engine.core.devices import worker_device_kind
        from explorer.engine.core.precision import require_supported
        require_supported(req.dtype, worker_device_kind())
    if args.cost == "measured" and family in ("layerwise", "placement") and \
            req.preset != "local":
        what = "shards" if family == "layerwise" else "operators"
        raise ValueError(f"--cost measured times {what} on this machine, so it needs --preset "
                         f"local; the {req.preset} preset's devices are not here and use the "
                         f"analytic roofline")
    if family == "layerwise":     # a search needs no torch here: trace in a child (if at all)
        from explorer.engine.core import capture_cache
        capture_cache.TRACE_IN_CHILD = True
        started = capture_cache.start_layer_graph(req.model, req.batch, dict(req.model_args))
        if (started or capture_cache.tracing(req.model, req.batch, dict(req.model_args))) \
                and req.devices >= PRELOAD_DEVICES:
            from explorer.engine.layerwise import xkernel
            xkernel.preload()          # while the child traces, on the other core
    t0 = time.perf_counter()
    capture = {"layerwise": service.graph_for, "tofu": service.opgraph_for,
               "placement": service.opgraph_for}[family](req)
    import_s = time.perf_counter() - t0
    res = service.run_method(req, args.algo, args.pin, _options(args, family))
    res.info["import_time_s"] = import_s
    if not res.fits_memory and not args.ignore_memory:
        raise InfeasiblePlan(_does_not_fit(res, service.devices_for(req)))
    return {"layerwise": _search_layerwise, "tofu": _search_tofu,
            "placement": _search_placement}[family](args, req, res, capture)


def _does_not_fit(res, devices) -> str:
    """One line: which device the plan overfills, by how much, and what to do."""
    why = (res.info.get("memory") or {}).get("why")
    if why:                   # the memory-aware searches say what they found, in one line
        return why
    mem = res.memory_per_device_bytes
    worst = max(range(len(mem)), key=lambda d: mem[d] - devices.devices[d].memory)
    what = "placement" if res.family == "placement" else "plan"
    return (f"the {res.algo} {what} needs {mem[worst] / 2**30:.2f} GiB on device {worst} "
            f"({devices.devices[worst].name}, {devices.devices[worst].memory / 2**30:.2f} GiB)"
            + (" (best effort)" if res.family == "placement" and res.info.get("best_effort")
               else "")
            + ": use more devices, a smaller --batch, or --ignore-memory to see it anyway")


def _search_layerwise(args, req, res, graph) -> int:
    from explorer import service
    plan, devices = res.plan, service.devices_for(req)
    if args.dump_costs:
        with open(args.dump_costs, "w") as fh:
            json.dump(res.tables.dump(), fh)
    compare = {}
    if args.compare:
        for algo in service.comparison("layerwise"):
            if algo == args.algo:
                compare[algo] = plan
                continue
            try:
                compare[algo] = service.run_method(req, algo, args.pin).plan
            except InfeasiblePlan as exc:
                compare[algo] = str(exc)
    doc = res.to_dict(trace=args.trace)
    if compare:
        doc["compare"] = {k: (v.to_dict() if not isinstance(v, str) else {"error": v})
                          for k, v in compare.items()}
    if args.out:
        _write(args.out, res.document())
    if args.json:
        print(json.dumps(doc, indent=2))
    else:
        print_plan(plan, devices, compare)
    return 0


def _search_tofu(args, req, res, g) -> int:
    """Tofu (EuroSys 2019) or a Section 7.3 baseline: every tensor of the joint
    forward+backward operator graph partitioned over all workers."""
    from explorer import service
    from explorer.engine.search import names
    plan, devices = res.plan, service.devices_for(req)
    cap = min(d.memory for d in devices.devices[:args.devices])
    worst = max(res.memory_per_device_bytes, default=0)
    out = res.to_dict()
    out["trace_time_s"] = res.info["import_time_s"]
    compare = {}
    if args.compare:
        for algo in names("tofu"):
            r = res if algo == args.algo else service.run_method(req, algo, args.pin)
            compare[algo] = r.summary()
        out["compare"] = compare
    if args.out:
        _write(args.out, res.document())
    if args.json:
        print(json.dumps(out, indent=1))
    else:
        c = plan.coarse
        print(f"{args.model} batch {g.batch}: {c['ops_before']} ops, {c['tensors_before']} "
              f"tensors -> coarsened {c['ops_after']} op groups, {c['tensors_after']} tensor "
              f"groups ({c['classes']} partition classes)  [captured in "
              f"{res.info['import_time_s']:.2f} s]")
        print(f"{args.algo} on {args.devices} workers of {devices.name}: k = "
              f"{' x '.join(map(str, plan.factors)) or '1'}, searched in "
              f"{res.search_time_s:.2f} s")
        for i, s_ in enumerate(plan.steps):
            print(f"  step {i + 1}: {s_.groups} group(s) -> x{s_.k}: +{s_.delta_bytes / 1e9:.3f} GB"
                  f"  ({s_.seconds * 1e3:.1f} ms at {s_.bandwidth / 1e9:.1f} GB/s)")
        if plan.levels and plan.levels != sorted(plan.levels):
            print(f"  steps matched to link levels: device numbers take the steps' digits in "
                  f"the order {'-'.join(str(i + 1) for i in plan.levels)} (slowest links "
                  f"first)")
        print(f"communication {res.comm_bytes / 1e9:.3f} GB per step, {res.objective_s * 1e3:.1f}"
              f" ms; peak memory per worker {worst / 2**30:.2f} GiB (capacity {cap / 2**30:.0f}"
              f" GiB)")
        print(f"predicted step {res.predicted_step_time_s * 1e3:.1f} ms ("
              f"{res.info.get('prediction') or 'links + slowest compute, roofline'})")
        big = sorted(plan.tilings.items(), key=lambda kv: -g.tensors[kv[0]].bytes)[:8]
        print("largest tensors' tilings (grid per axis):")
        for t, v in big:
            print(f"  {t:<40} {str(tuple(v['shape'])):<24} grid {'x'.join(map(str, v['grid']))}")
        for algo, r in compare.items():
            print(f"  {algo:<14} {r['comm_bytes'] / 1e9:9.3f} GB  {r['objective_s'] * 1e3:9.1f} ms"
                  f"  search {r['search_time_s']:.2f} s  peak {r['peak_bytes'] / 2**30:.2f}"
                  f" GiB")
    return 0


def _search_placement(args, req, res, og) -> int:
    """Celeritas or a placement baseline: a device per operator of the forward+backward
    operator graph."""
    from explorer import service
    devices = service.devices_for(req)
    if args.dump_graph:
        opts = _options(args, "placement")
        pg = service.problem_for(req).placement_graph(opts.get("memory_per_device"))
        with open(args.dump_graph, "w") as fh:
            json.dump(pg.to_node_link(), fh)
    doc = res.to_dict(trace=args.trace, schedule=args.trace)
    if args.out:
        _write(args.out, res.document())
    if args.json:
        print(json.dumps(doc, indent=2))
    else:
        print(f"{og.model} batch {og.batch} on {devices.n}x {devices.devices[0].kind}: "
              f"{args.algo}")
        print(f"ops {doc['ops']}, clusters {len(doc['clusters'])}, predicted step "
              f"{doc['predicted_step_time_s']:.4f} s, search {doc['search_time_s']:.3f} s, "
              f"oom {doc['oom']}")
        print("peak GiB per device: " + " / ".join(f"{b / 2**30:.1f}"
                                                    for b in doc["peak_memory_bytes"]))
        st = doc["stats"]
        if st.get("refine"):
            print(f"Adjusting Placement {st['step_before_refine_s']:.4f} s, after simulated "
                  f"refinement {doc['predicted_step_time_s']:.4f} s ({st['refine_moves']} "
                  f"moves, {st['refine_evals']} simulations, {st['refine_s']:.2f} s"
                  + ("; budget spent" if st.get("refine_exhausted") else "") + ")")
    return 0


def _ms(s: float) -> str:
    return f"{s * 1e3:9.3f}"


def print_plan(plan, devices, compare=None):
    print(f"{plan.model}  batch {plan.batch}  on {devices.n}× {devices.devices[0].kind} "
          f"({plan.preset})  algo {plan.algo}")
    print(f"{'layer':32s} {'op':13s} {'config':14s} {'devices':14s} {'t_C ms':>9s} "
          f"{'t_S ms':>9s} {'mem MiB':>9s}")
    for la in plan.layers:
        devs = la.config.devices
        dv = f"{devs[0]}" if len(devs) == 1 else (
            f"{devs[0]}-{devs[-1]}" if list(devs) == list(range(devs[0], devs[-1] + 1))
            else ",".join(map(str, devs)))
        print(f"{la.name[:32]:32s} {la.op:13s} {la.config.label():14s} {dv:14s} "
              f"{_ms(la.t_compute_s)} {_ms(la.t_sync_s)} {la.memory_bytes / 2**20:9.1f}")
    b = plan.breakdown
    summary = plan.objective_lines() if hasattr(plan, "objective_lines") else None
    if summary:                 # a memory-constrained or pipelined plan says what it minimised
        print("\n" + "\n".join(summary))
    else:
        print(f"\nobjective (eq. 1) {plan.objective_s * 1e3:.3f} ms  = compute "
              f"{b['compute_s'] * 1e3:.3f} + transfer {b['transfer_s'] * 1e3:.3f} + sync "
              f"{b['sync_s'] * 1e3:.3f}"
              + (f" + reduce-scatter {b['reduce_s'] * 1e3:.3f}" if b.get("reduce_s") else "")
              + " ms")
    print(f"communication {plan.comm_bytes / 2**20:.1f} MiB/step; peak memory "
          f"{max(plan.memory_per_device_bytes) / 2**30:.2f} GiB/device; search "
          f"{plan.search_time_s * 1e3:.1f} ms", end="")
    if plan.info.get("processes", 1) > 1:
        print(f" on {plan.info['processes']} processes", end="")
    if "residual_nodes" in plan.info:
        print(f"; final graph {plan.info['residual_nodes']} nodes "
              f"({plan.info['residual_method']})", end="")
    print()
    cats = getattr(plan, "memory_by_category", None) or {}
    if cats.get("params"):
        tot = plan.memory_per_device_bytes
        d = max(range(len(tot)), key=tot.__getitem__)
        parts = ", ".join(f"{k} {cats[k][d] / 2**30:.2f}" for k in
                          ("params", "grads", "optimizer", "activations", "transient")
                          if k in cats)
        rc = sum(1 for la in plan.layers if getattr(la, "recompute", False))
        zs = {}
        for la in plan.layers:
            if getattr(la, "zero", 0):
                zs[la.zero] = zs.get(la.zero, 0) + 1
        print(f"memory on device {d} (GiB, optimizer {cats.get('optimizer_kind', 'sgd')}): "
              f"{parts}" + (f"; {rc} layers recomputed" if rc else "")
              + "".join(f"; ZeRO-{z} on {k} layers" for z, k in sorted(zs.items())))
    pipe = getattr(plan, "pipeline", None)
    if pipe and not summary:
        print(f"pipeline: {pipe['stages']} stages of {pipe['devices_per_stage']} devices, "
              f"{pipe['micro_batches']} micro-batches of {pipe['micro_batch']} ({pipe['schedule']}), "
              f"bubble {pipe['bubble_fraction'] * 100:.0f} %")
    if compare:
        print(f"\n{'strategy':10s} {'step ms':>10s} {'compute':>10s} {'transfer':>10s} "
              f"{'sync':>10s} {'reduce':>10s} {'comm MiB':>10s}")
        for k, v in compare.items():
            if isinstance(v, str):
                print(f"{k:10s} infeasible: {v}")
                continue
            b = v.breakdown
            print(f"{k:10s} {_ms(v.objective_s):>10s} {_ms(b['compute_s']):>10s} "
                  f"{_ms(b['transfer_s']):>10s} {_ms(b['sync_s']):>10s} "
                  f"{_ms(b.get('reduce_s', 0.0)):>10s} {v.comm_bytes / 2**20:10.1f}")


def cmd_models(args) -> int:
    import example_models as ex
    for name, m in ex.MODELS.items():
        params = ", ".join(f"{k}={v}" for k, v in ex.model_params(name).items())
        print(f"{name:14s} batch {m.default_batch:<4d} {m.description}")
        if params:
            print(f"{'':14s} args: {params}")
    from explorer.engine.core.hf import USAGE
    print(f"\n  {USAGE}")             # indented: the first column lists the examples only
    return 0


def cmd_presets(args) -> int:
    from explorer.engine.core.devices import list_presets
    for p in list_presets():
        n = p["devices"] if p["devices"] else "any"
        print(f"{p['name']:14s} devices {str(n):4s} {p['description']}")
    print("\nA custom cluster: --preset path/to/cluster.json with "
          '{"devices": [{"name", "kind", "peak_flops", "mem_bw", "memory", "node"}], '
          '"intra_node_bw", "inter_node_bw", "latency"} (bytes/s, bytes, seconds)')
    return 0


def cmd_cache(args) -> int:
    """``explorer cache [info|clear]``: the capture cache (layer and operator graphs kept in
    ``$EXPLORER_HOME/captures.sqlite``, reused while the model and our code are unchanged)."""
    from explorer.engine.core import capture_cache
    if args.action == "clear":
        n = capture_cache.clear()
        print(f"removed {n} cached capture{'s' if n != 1 else ''} from {capture_cache.path()}")
        return 0
    i = capture_cache.info()
    kinds = {"layers": "layer graph", "ops": "operator graph"}
    what = ", ".join(f"{n} {kinds.get(k, k)}{'s' if n != 1 else ''}"
                     for k, n in sorted(i["entries"].items()))
    print(f"{i['path']}: {what or 'empty'}, {i['bytes'] / 2**20:.2f} MiB "
          f"(`explorer cache clear` empties it)")
    return 0


def cmd_graph(args) -> int:
    from explorer import service
    if args.batch is not None and args.batch < 1:
        raise ValueError(f"--batch must be ≥ 1, got {args.batch}")
    req = service.Request(model=args.model, batch=args.batch, model_args=dict(args.model_arg))
    g = service.graph_for(req)
    if args.json:
        # parameters: the layer graph's count (each parameter once), checked on import to
        # equal the model's, as is the operator graph's (its counts beside)
        og = service.opgraph_for(req)
        print(json.dumps({**g.to_dict(), "parameters": g.parameters,
                          "unused_parameters": sum(g.unused_parameters.values()),
                          "opgraph": og.counts()}, indent=2))
        return 0
    s = g.summary()
    print(f"{g.model}: {s['layers']} layers, {s['edges']} edges, {s['parameters'] / 1e6:.2f} M "
          f"parameters, {s['flops_forward'] / 1e9:.2f} GFLOP forward (batch {g.batch}, "
          f"captured with {g.source})")
    for lay in g.layers():
        ins = ", ".join(e.src for e in g.in_edges(lay.name))
        print(f"{lay.name[:30]:30s} {lay.op:13s} {str(list(lay.out_shape)):22s} "
              f"dims {''.join(lay.dims):5s} <- {ins}")
    return 0


def cmd_run(args) -> int:
    """``explorer run PLAN.json``: execute a saved plan of any kind (the executor is chosen by
    the document's schema; nothing is searched) and store the run."""
    from explorer import service
    from explorer.engine.runtime.commands import print_run, run_options
    from explorer.engine.runtime.dispatch import read_document
    doc = read_document(args.plan)
    if str(doc.get("schema", "")).endswith("/layerwise"):
        # a pipeline the runtime cannot execute (more stages than workers, micro-batches
        # that do not divide the batch, ...) is one line before any worker starts
        from explorer.engine.layerwise.plan import unsupported
        why = unsupported(doc)
        if why:
            raise InfeasiblePlan(why)
    return print_run(service.run_plan(doc, **run_options(args)), args)


def cmd_rank(args) -> int:
    """``explorer rank``: every method's plan run here, predicted against measured."""
    from explorer import service
    from explorer.engine.core.plandoc import dumps
    args.algo = "optcnn"
    req = _request(args)
    methods = [m.strip() for m in args.methods.split(",") if m.strip()] if args.methods \
        else None
    say = None if args.json else (lambda msg: print(f"{msg} ...", file=sys.stderr, flush=True))
    rep = service.rank(req, methods, rounds=args.rounds, steps=args.steps, warmup=args.warmup,
                       progress=say or (lambda msg: None))
    if args.json:
        print(dumps(rep, indent=1))
        return 0
    print(format_ranking(rep))
    return 0


def format_ranking(rep: dict) -> str:
    """The ranking report: one row per method, then τ, regret and noise."""
    def ms(v):
        return "-" if v is None else f"{v * 1e3:.2f}"
    r = rep["request"]
    lines = [f"{r['model']} (batch {r['batch']}) on {r['devices']} local workers: "
             f"{rep['rounds']} interleaved rounds of {rep['steps']} steps per plan",
             f"{'method':14s} {'family':10s} {'predicted ms':>12s} {'measured ms':>11s} "
             f"{'min ms':>8s} {'error':>7s} {'rank p/m':>8s}  check  basis"]
    for row in rep["rows"]:
        if "failed" in row:
            lines.append(f"{row['method']:14s} {row['family']:10s} {row['failed']}")
            continue
        if "measured_step_s" not in row:
            continue
        ok = {True: "ok", False: "FAILED", None: "-"}[row.get("reference_ok")]
        lines.append(f"{row['method']:14s} {row['family']:10s} "
                     f"{ms(row['predicted_step_s']):>12s} {ms(row['measured_step_s']):>11s} "
                     f"{ms(row['measured_min_s']):>8s} {row['error'] * 100:+6.0f}% "
                     f"{row['predicted_rank']:>3d}/{row['measured_rank']:<4d}  {ok:5s}  "
                     f"{row['basis']}" + ("  (noisy)" if row["noisy"] else ""))
    tau, reg = rep["kendall_tau"], rep["regret"]
    lines.append(f"Kendall tau {'-' if tau is None else f'{tau:+.2f}'} between the predicted "
                 f"and measured orders; regret "
                 f"{'-' if reg is None else f'{reg * 100:.0f} %'} (the plan predicted fastest "
                 f"against the fastest measured)")
    if rep.get("max_steal") is not None:
        lines.append(f"CPU stolen by other tenants: up to {rep['max_steal'] * 100:.1f} % "
                     f"in a run")
    if rep.get("noise_note"):
        lines.append(rep["noise_note"])
    return "\n".join(lines)


def cmd_compare(args) -> int:
    """``explorer compare``: every family's methods on one request, ranked by predicted step."""
    from explorer import service
    from explorer.engine.core.plandoc import dumps
    args.algo = "optcnn"
    req = _request(args)
    methods = [m.strip() for m in args.methods.split(",") if m.strip()] if args.methods \
        else None
    say = None if args.json else (lambda msg: print(f"{msg} ...", file=sys.stderr, flush=True))
    rep = service.compare_all(req, methods, progress=say or (lambda msg: None))
    print(dumps(rep, indent=1) if args.json else format_comparison(rep))
    return 0


def format_comparison(rep: dict) -> str:
    """The comparison across families: one row per method, fastest predicted first."""
    def ms(v):
        return "-" if v is None else f"{v * 1e3:.3f}"
    r = rep["request"]
    lines = [f"{r['model']} (batch {r['batch']}) on {r['devices']} devices of "
             f"{r['preset']}: every method's predicted step on the same devices",
             f"{'method':15s} {'family':10s} {'predicted ms':>12s} {'peak MiB':>9s} "
             f"{'moved MiB':>10s} {'search s':>8s} {'fits':4s} {'measured ms':>11s}  basis"]
    for row in rep["rows"]:
        if "failed" in row:
            lines.append(f"{row['method']:15s} {row['family']:10s} cannot plan: "
                         f"{row['failed']}")
            continue
        meas = ms(row.get("measured_step_s"))
        if row.get("error") is not None:
            meas += f" ({row['error'] * 100:+.0f}%)"
        lines.append(f"{row['method']:15s} {row['family']:10s} "
                     f"{ms(row['predicted_step_s']):>12s} {row['peak_bytes'] / 2**20:9.1f} "
                     f"{row['comm_bytes'] / 2**20:10.2f} {row['search_time_s']:8.2f} "
                     f"{'yes' if row['fits_memory'] else 'NO':4s} {meas:>11s}  {row['basis']}")
    best = rep.get("best")
    lines.append(f"fastest predicted that fits: {best}" if best else
                 "no method's plan fits the devices' memory")
    if not any(row.get("measured_step_s") for row in rep["rows"]):
        lines.append("measured: none of these plans has run here yet (`explorer rank` "
                     "runs them on --preset local)")
    return "\n".join(lines)


def cmd_export(args) -> int:
    """``explorer export PLAN.json --to torch -o FILE.py``: the plan as a program using
    PyTorch's own parallel APIs (layer-wise plans only; nothing is searched)."""
    from explorer import service
    from explorer.engine.runtime.dispatch import read_document
    doc = read_document(args.plan)
    name, text = service.export(doc, to=args.to)
    path = args.out or name
    from explorer.engine.export import deviation_lines, summary
    line, devs = summary(text, len(doc.get("layers") or [])), deviation_lines(text)
    if getattr(args, "strict", False) and devs:
        print(f"error: --strict: not written, {line.split(';')[0]}:", file=sys.stderr)
        print("\n".join(devs), file=sys.stderr)
        return 1
    with open(path, "w") as fh:
        fh.write(text)
    n = doc.get("devices")
    print(f"wrote {path}: {line.split(';')[0]}")
    if devs:
        print("not as planned:")
        print("\n".join(devs))
    print(f"run it with `torchrun --standalone --nproc_per_node {n} {path} --steps 3 --check`")
    return 0


def cmd_calibrate(args) -> int:
    from explorer.engine.runtime.commands import cmd_calibrate as calibrate
    return calibrate(args)


def cmd_serve(args) -> int:
    from explorer.app import serve
    from explorer.service import Request
    from explorer.views import state
    from explorer.engine.search import get
    get(args.algo)                     # an unknown method is one line naming every method
    if state.is_model_file(args.model) and not args.allow_model_files:
        raise ValueError(f"--model {args.model} is a model file: the page would run its code "
                         f"for every visitor; add --allow-model-files to serve it")
    req = Request(model=args.model, batch=args.batch, model_args=dict(args.model_arg),
                  preset=args.preset, devices=args.devices, algo=args.algo)
    return serve(args.host, args.port, debug=args.debug, request=req,
                 allow_model_files=args.allow_model_files)


if __name__ == "__main__":
    sys.exit(main())

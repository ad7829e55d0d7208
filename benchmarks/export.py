"""The export table: searched layer-wise plans exported to PyTorch, how many layers as planned,
and whether the program's ``--check`` passes under torchrun on CPU processes.

    python benchmarks/export.py                    # 4 and 8 devices, then --check on 2 and 4
    python benchmarks/export.py --models gpt2 --devices 4 --run 2
    python benchmarks/export.py --small --run         # example_models.SMALL sizes, export only

Each model is searched (``optcnn`` on the default preset, the model's default size: the plans
the app and the CLI make) and exported; "as planned" is the export's own count.  A program of a
full-size model is too heavy to train on this machine's CPUs, so ``--check`` runs the searched
plan's configurations on a small instance of the same model (``RUN_ARGS``: same layer names,
each layer taking the configuration of the full model's layer of that name), searched at the
number of processes it runs on.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import subprocess
import sys
import tempfile
import time

MODELS = ["gpt2", "bert", "llama", "vit", "vgg16", "moe"]
#: small instances for --check: every split of the searched plans divides their axes
RUN_ARGS = {
    "gpt2": {"layers": 2, "hidden": 64, "heads": 8, "seq_len": 16, "vocab": 64},
    "bert": {"layers": 2, "hidden": 64, "heads": 8, "seq_len": 16, "vocab": 64,
             "num_classes": 8},
    "llama": {"layers": 2, "hidden": 64, "heads": 8, "intermediate": 96, "seq_len": 16,
              "vocab": 64},
    "vit": {"image_size": 32, "patch": 8, "layers": 2, "hidden": 64, "heads": 8, "mlp": 128,
            "num_classes": 8},
    "vgg16": {"image_size": 32, "num_classes": 8, "fc": 64},
    "moe": {"layers": 2, "hidden": 64, "heads": 8, "intermediate": 96, "experts": 8, "top_k": 2,
            "seq_len": 16, "vocab": 64},
}
RUN_BATCH = 8


def search(model: str, n: int, out: str, args=(), algo: str = "optcnn",
           tag: str = "") -> dict:
    from explorer.cli import main
    path = os.path.join(out, f"{model}-{n}-{algo}{tag}.json")
    if not os.path.exists(path):
        with contextlib.redirect_stdout(io.StringIO()):
            code = main(["search", model, "-n", str(n), "--algo", algo, *args, "-o", path])
        if code:
            raise SystemExit(f"search {model} -n {n} failed")
    with open(path) as fh:
        return json.load(fh)


def as_planned(doc: dict) -> tuple:
    """``(layers as planned, layers, the deviations, export seconds)`` of ``doc``."""
    from explorer.engine.export import export_torch, not_as_planned
    t = time.perf_counter()
    _name, text = export_torch(doc)
    off = not_as_planned(text)
    return len(doc["layers"]) - len(off), len(doc["layers"]), off, time.perf_counter() - t


def transplant(doc: dict, model: str, n: int) -> tuple:
    """``(configs, planned layers)``: the small instance's layers with the configurations of
    the searched plan's layers of the same name (the rest: the plan's most common
    configuration of the same op)."""
    from collections import Counter

    from explorer.engine.core.capture_cache import layer_graph
    by_name = {la["name"]: la for la in doc["layers"]}
    common: dict = {}
    for op in {la["op"] for la in doc["layers"]}:
        common[op] = Counter(json.dumps([la["config"], la["devices"]])
                             for la in doc["layers"] if la["op"] == op).most_common(1)[0][0]
    g = layer_graph(model, RUN_BATCH, RUN_ARGS[model])
    configs = {}
    for la in g.layers():
        src = by_name.get(la.name)
        cfg, devs = ((src["config"], src["devices"]) if src and src["op"] == la.op
                     else json.loads(common.get(la.op, json.dumps([{}, list(range(n))]))))
        configs[la.name] = ({k: int(v) for k, v in cfg.items() if int(v) > 1}, tuple(devs))
    return configs, len(configs)


def run_check(model: str, n: int, out: str) -> tuple:
    """``(passed, layers as planned, layers, seconds)``: the searched n-device plan's
    configurations on the small instance, run for 3 steps on n gloo processes with --check."""
    from explorer.engine.export import not_as_planned, program
    doc = search(model, n, out)
    configs, m = transplant(doc, model, n)
    name, text = program(model, RUN_BATCH, RUN_ARGS[model], n, configs, algo="optcnn")
    prog = os.path.join(out, f"run_{name}")
    with open(prog, "w") as fh:
        fh.write(text)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(OMP_NUM_THREADS="1", TORCH_CPP_LOG_LEVEL="ERROR")
    t = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           "--nproc_per_node", str(n), prog, "--steps", "3", "--check"],
                          cwd=out, env=env, capture_output=True, text=True, timeout=900)
    ok = proc.returncode == 0 and "check: passed" in proc.stdout
    if not ok:
        print(proc.stdout[-3000:], proc.stderr[-3000:], file=sys.stderr)
    return ok, m - len(not_as_planned(text)), m, time.perf_counter() - t


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=MODELS)
    ap.add_argument("--devices", nargs="+", type=int, default=[4, 8])
    ap.add_argument("--run", nargs="*", type=int, default=[2, 4],
                    help="process counts to run --check on (none: export only)")
    ap.add_argument("--out", default=None, help="folder for plans and programs")
    ap.add_argument("--small", action="store_true",
                    help="search at example_models.SMALL sizes (the app's small examples)")
    args = ap.parse_args(argv)
    small = ()
    out = args.out or tempfile.mkdtemp(prefix="export-bench-")
    os.makedirs(out, exist_ok=True)
    print("| model | devices | layers as planned | share | export s |")
    print("|---|---:|---:|---:|---:|")
    for model in args.models:
        if args.small:
            from example_models import SMALL
            small = [x for k, v in SMALL[model].items() for x in ("-a", f"{k}={v}")]
        for n in args.devices:
            doc = search(model, n, out, small, tag="-small" if args.small else "")
            done, m, off, secs = as_planned(doc)
            print(f"| {model} | {n} | {done} of {m} | {100 * done / m:.0f} % | {secs:.2f} |")
            for d in off:
                print(f"|  | | {d[0]}: {d[1]} -> {d[2]} | {d[3][:100]} | |")
            sys.stdout.flush()
    if args.run:
        print("\n| model | processes | layers as planned (small instance) | --check | wall s |")
        print("|---|---:|---:|---|---:|")
        for model in args.models:
            for n in args.run:
                ok, done, m, secs = run_check(model, n, out)
                print(f"| {model} | {n} | {done} of {m} | {'passed' if ok else 'FAILED'} "
                      f"| {secs:.0f} |")
                sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())

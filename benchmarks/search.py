"""Search benchmark: every example model at 4, 8 and 16 devices on the P100 cluster preset.

Prints, per (model, devices): layers, candidates per layer (mean / max), the final graph left
by node/edge elimination, the optcnn search time (cost tables + search, fresh cost model, best
of --repeat runs) and the objective (equation 1) of optcnn against data / model / OWT.

    python benchmarks/search.py [--models inception_v3,vgg16] [--devices 4,8,16] [--repeat 3]

Targets on a 2-core machine: Inception-v3 at 4 devices ≤ 0.2 s, at 16 devices ≤ 2 s.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from explorer.engine.costmodel import CostModel  # noqa: E402
from explorer.engine.devices import preset  # noqa: E402
from explorer.engine.importer import import_spec  # noqa: E402
from explorer.engine.search import Problem, comparison, run  # noqa: E402
from explorer.errors import InfeasiblePlan  # noqa: E402

DEFAULT_MODELS = ["lenet5", "alexnet", "vgg16", "inception_v3", "resnet50", "wresnet", "mlp",
                  "lstm", "transformer", "densenet", "unet"]


def bench(model: str, n: int, repeat: int, cost: str):
    g = import_spec(model)
    d = preset("p100-cluster", n)
    best, res = float("inf"), None
    for _ in range(repeat):
        cm = CostModel(g, d, compute=cost)
        t0 = time.perf_counter()
        r = run("optcnn", Problem.of(g, d, cm))
        el = time.perf_counter() - t0
        if el < best:
            best, res = el, r
    objs = {}
    for algo in [n for n in comparison("layerwise") if n != "optcnn"]:
        try:
            objs[algo] = run(algo, Problem.of(g, d, cm)).objective_s
        except InfeasiblePlan:
            objs[algo] = float("nan")
    info = res.info
    return {
        "model": model, "devices": n, "layers": len(g), "edges": info["edges"],
        "cand_mean": info["candidates_per_layer"]["mean"],
        "cand_max": info["candidates_per_layer"]["max"],
        "residual": f"{info['residual_nodes']}n/{info['residual_edges']}e"
                    + ("" if info["residual_method"] == "enumeration"
                       else f" {info['residual_method'][:3]}"),
        "method": info["residual_method"], "tables_s": info["tables_time_s"],
        "search_s": best, "optcnn_ms": res.objective_s * 1e3,
        **{f"{k}_ms": v * 1e3 for k, v in objs.items()},
    }


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(DEFAULT_MODELS))
    ap.add_argument("--devices", default="4,8,16")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--cost", default="analytic", choices=["analytic", "measured"])
    ap.add_argument("--markdown", action="store_true", help="print a Markdown table")
    args = ap.parse_args(argv)
    rows = []
    cols = ["model", "devices", "layers", "edges", "cand_mean", "cand_max", "residual",
            "tables_s", "search_s", "optcnn_ms", "data_ms", "model_ms", "owt_ms"]
    if args.markdown:
        print("| " + " | ".join(cols) + " |")
        print("|" + "---|" * len(cols))
    else:
        print(" ".join(f"{c:>12s}" for c in cols))
    for m in args.models.split(","):
        for n in (int(x) for x in args.devices.split(",")):
            r = bench(m, n, args.repeat, args.cost)
            rows.append(r)
            cells = []
            for c in cols:
                v = r[c]
                if isinstance(v, float):
                    v = f"{v:.3f}" if c.endswith("_s") else f"{v:.2f}" if c.endswith("_ms") \
                        else f"{v:.1f}"
                cells.append(str(v))
            if args.markdown:
                print("| " + " | ".join(cells) + " |", flush=True)
            else:
                print(" ".join(f"{c:>12s}" for c in cells), flush=True)
    return rows


if __name__ == "__main__":
    main()

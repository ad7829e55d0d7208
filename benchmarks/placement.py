"""Celeritas placement benchmark: the paper's four models and five of today's on 4 x V100 32 GB.

    python3 benchmarks/placement.py [--quick] [--models a,b] [--no-large] [--estimate] [--json OUT]

For each model (joint forward + backward + SGD graph traced with fake tensors): operators ->
clusters and CCR before/after fusion (Table 2), every placement method's predicted step time
from the one simulator (Table 3), placement time (Table 4) and simulated peak memory per
device (the liveness rule of ``explorer/engine/placement/memory.py``); then the placement
time of a >= 30,000-operator graph (a 160-layer Transformer).  ``--estimate`` adds the
Standard Evaluation error (Table 5).

Devices: the ``v100-pcie-4`` preset, the paper's machine (Celeritas Section 6.1: 4 V100 with
32 GB each on PCIe).  Every model is placed at that capacity - no per-model capacity.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from explorer.engine.core.devices import preset  # noqa: E402
from explorer.engine.core.opgraph import build_opgraph  # noqa: E402
from explorer.engine.placement.estimate import from_opgraph  # noqa: E402
from explorer.engine.search import Problem, names, run as run_method  # noqa: E402

PLACEMENT_ALGORITHMS = names("placement")


def run(algo, pg, devices, options=None):
    """Placement method ``algo`` on the prebuilt placer graph ``pg`` through the registry."""
    return run_method(algo, Problem.of(pg, devices), None, options).plan

GiB = 2 ** 30

MODELS = [
    ("Inception_V3", "inception_v3", 512, {}),
    ("NMT (seq2seq)", "seq2seq", 512, {"layers": 4, "hidden": 2048, "src_steps": 16,
                                       "tgt_steps": 16}),
    ("Transformer", "transformer", 256, {"layers": 12, "heads": 16, "hidden": 2048,
                                         "seq": 128}),
    ("Tensor Holography", "holography", 32, {"layers": 30, "filters": 24}),
    # today's models (not in the paper)
    ("GPT-2", "gpt2", 16, {}),
    ("BERT", "bert", 16, {}),
    ("ViT-B/16", "vit", 32, {}),
    ("MobileNetV2", "mobilenet_v2", 32, {}),
    ("U-Net (transposed conv)", "unet", 8, {"up": "transpose"}),
]

#: Celeritas paper, Table 2 (nodes, CCR before / after merging)
PAPER_T2 = {"Inception_V3": (6332, 33.118, 59, 8.137), "NMT (seq2seq)": (25463, 18.630, 154, 6.372),
            "Transformer": (36352, 111.957, 220, 11.10),
            "Tensor Holography": (3810, 49.147, 37, 7.438)}
#: Table 3: single-step time (s) on 4 V100; None = OOM
PAPER_T3 = {
    "Inception_V3": {"metis": None, "m-topo": 3.100, "m-etf": 10.548, "m-sct": 7.610,
                     "order-place": 2.931, "celeritas": 2.859},
    "NMT (seq2seq)": {"metis": None, "m-topo": None, "m-etf": None, "m-sct": None,
                      "order-place": 9.117, "celeritas": 9.099},
    "Transformer": {"metis": None, "m-topo": None, "m-etf": 8.613, "m-sct": 8.411,
                    "order-place": 6.935, "celeritas": 6.536},
    "Tensor Holography": {"metis": 6.591, "m-topo": 2.220, "m-etf": 6.376, "m-sct": 6.013,
                          "order-place": 1.520, "celeritas": 1.461},
}
#: Table 4: placement generation time (s)
PAPER_T4 = {"Inception_V3": {"m-sct": 8.591, "order-place": 5.439, "celeritas": 7.183},
            "NMT (seq2seq)": {"m-sct": None, "order-place": 54.695, "celeritas": 59.418},
            "Transformer": {"m-sct": 129.498, "order-place": 92.639, "celeritas": 95.304},
            "Tensor Holography": {"m-sct": 2.968, "order-place": 2.711, "celeritas": 3.586}}


LARGE_ALGOS = ("celeritas", "celeritas-paper", "order-place", "m-topo", "metis")


def bench_model(label, spec, batch, args, devices, algos):
    t0 = time.perf_counter()
    og = build_opgraph(spec, batch, args)
    trace_s = time.perf_counter() - t0
    pg = from_opgraph(og, devices)
    rows = {algo: run(algo, pg, devices) for algo in algos}
    cel = rows["celeritas"]
    ref = {k: cel.stats.get(k) for k in ("step_before_refine_s", "refine_moves", "refine_evals",
                                          "refine_s", "refine_exhausted", "schedule",
                                          "schedule_steps_s")}
    return {"label": label, "spec": spec, "batch": batch, "args": args, "ops": len(og.ops),
            "nodes": pg.n, "edges": pg.n_edges, "trace_s": trace_s,
            "capacity_gib": float(pg.capacity[0]) / GiB,
            "total_gib": pg.total_memory() / GiB, "ccr_before": cel.stats["ccr_before"],
            "nodes_after": cel.stats["nodes_after"], "ccr_after": cel.stats["ccr_after"],
            "refinement": ref,
            "results": {a: {"step_s": r.predicted_step_time_s, "search_s": r.search_time_s,
                            "common_step_s": r.stats.get("common_order_step_s",
                                                         r.predicted_step_time_s),
                            "schedule": r.stats.get("schedule", ""),
                            "peak_gib": [x / GiB for x in r.peak_memory_bytes],
                            "oom": r.oom, "best_effort": len(r.best_effort),
                            "comm_gb": r.sim.comm_bytes / 1e9}
                        for a, r in rows.items()}}


def fmt(x, nd=3):
    return "OOM" if x is None else (f"{x:.{nd}f}" if isinstance(x, float) else str(x))


def print_model(m):
    label = m["label"]
    p2 = PAPER_T2.get(label)
    print(f"\n## {label}  ({m['spec']}, batch {m['batch']}; traced in {m['trace_s']:.1f} s)")
    print(f"graph: {m['ops']} aten ops + {m['nodes'] - m['ops']} parameter/input nodes = "
          f"{m['nodes']} nodes, {m['edges']} edges; sum of all outputs {m['total_gib']:.1f} "
          f"GiB, memory per device {m['capacity_gib']:.0f} GiB")
    print(f"fusion (R=200, M=0.25*capacity): nodes {m['nodes']} -> {m['nodes_after']}, "
          f"CCR {m['ccr_before']:.3f} -> {m['ccr_after']:.3f}"
          + (f"   [paper: {p2[0]} -> {p2[2]}, CCR {p2[1]} -> {p2[3]}]" if p2 else ""))
    print("step: in the placer's own schedule (m-ETF/m-SCT event order, m-TOPO's BFS order; "
          "celeritas: CPD-TOPO or the placed blevel, whichever runs its placement faster; "
          "celeritas-paper, Order-Place and METIS: CPD-TOPO); common: every placement in "
          "CPD-TOPO, for reference")
    print(f"{'method':15s} {'step s':>9s} {'common s':>9s} {'paper s':>8s} {'place s':>9s} "
          f"{'paper s':>8s} {'peak GiB per device':>26s} {'comm GB':>8s} oom")
    for algo, r in m["results"].items():
        key = "celeritas" if algo == "celeritas-paper" else algo
        pt3 = PAPER_T3.get(label, {}).get(key, "-")
        pt4 = PAPER_T4.get(label, {}).get(key, "-")
        peak = "/".join(f"{x:.1f}" for x in r["peak_gib"])
        print(f"{algo:15s} {r['step_s']:9.4f} {r['common_step_s']:9.4f} {fmt(pt3):>8s} "
              f"{r['search_s']:9.4f} "
              f"{fmt(pt4):>8s} {peak:>26s} {r['comm_gb']:8.1f} {'OOM' if r['oom'] else 'ok'}"
              + (f" (best effort for {r['best_effort']})" if r["best_effort"] else ""))
    rf = m["refinement"]
    print(f"celeritas = celeritas-paper + simulated refinement: {rf['refine_moves']} moves in "
          f"{rf['refine_evals']} simulations, {rf['refine_s']:.2f} s"
          + (" (budget spent)" if rf["refine_exhausted"] else ""))
    if rf.get("schedule_steps_s"):
        print(f"celeritas schedule: {rf['schedule']} ("
              + ", ".join(f"{k} {v:.4f} s" for k, v in rf["schedule_steps_s"].items()) + ")")
    ok = {a: r for a, r in m["results"].items() if not r["oom"]}
    if ok:
        best = min(ok, key=lambda a: ok[a]["step_s"])
        cel = m["results"]["celeritas"]
        worse = [a for a, r in ok.items() if r["step_s"] < cel["step_s"] * (1 - 1e-9)]
        print(f"best without OOM: {best}; celeritas "
              + ("OOM" if cel["oom"] else "beaten by " + ", ".join(worse) if worse
                 else "no worse than every baseline without OOM"))


def bench_large(devices, layers=160):
    t0 = time.perf_counter()
    og = build_opgraph("transformer", 8, {"layers": layers, "heads": 16, "hidden": 1024,
                                          "seq": 128})
    trace_s = time.perf_counter() - t0
    pg = from_opgraph(og, devices)
    out = {"ops": len(og.ops), "nodes": pg.n, "edges": pg.n_edges, "trace_s": trace_s}
    for algo in LARGE_ALGOS:
        res = run(algo, pg, devices)
        out[algo] = {"search_s": res.search_time_s, "step_s": res.predicted_step_time_s,
                     "oom": res.oom, "nodes_after": res.stats.get("nodes_after")}
    return out


def bench_estimate():
    from explorer.engine.placement.estimate import memory_regression, time_regression
    out = {}
    for spec, target, args in (("holography", 32, {"res": 64}), ("inception_v3", 32, {}),
                               ("mlp", 512, {"layers": 4, "hidden": 1024})):
        t0 = time.perf_counter()
        mr = memory_regression(spec, target, args, (1, 2, 4, 8), measured=True)
        tr = time_regression(spec, (1, 2, 4), 8, args)
        out[spec] = {"memory": mr["deviation"], "time": tr["deviation"],
                     "time_total": (tr["total_estimated_s"], tr["total_measured_s"]),
                     "seconds": time.perf_counter() - t0}
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="Inception and Holography only")
    ap.add_argument("--models", help="comma-separated example names to run (e.g. unet,vit)")
    ap.add_argument("--no-large", action="store_true", help="skip the 30,000-op graph")
    ap.add_argument("--estimate", action="store_true", help="Standard Evaluation error")
    ap.add_argument("--json", metavar="OUT", help="write the numbers as JSON")
    a = ap.parse_args(argv)
    devices = preset("v100-pcie-4")
    algos = list(PLACEMENT_ALGORITHMS)
    models = [m for m in MODELS if not a.quick or m[1] in ("inception_v3", "holography")]
    if a.models:
        want = a.models.split(",")
        unknown = sorted(set(want) - {m[1] for m in MODELS})
        if unknown:
            ap.error(f"unknown model(s) {', '.join(unknown)}: choose from "
                     f"{', '.join(m[1] for m in MODELS)}")
        models = [m for m in models if m[1] in want]
    doc = {"devices": "v100-pcie-4", "models": []}
    print(f"# Celeritas placement benchmark - 4 x V100 PCIe 32 GB (preset), "
          f"{os.cpu_count()} CPU cores")
    for label, spec, batch, args in models:
        m = bench_model(label, spec, batch, args, devices, algos)
        doc["models"].append(m)
        print_model(m)
        sys.stdout.flush()
    if not a.no_large:
        big = bench_large(devices)
        doc["large"] = big
        print(f"\n## Large graph: 160-layer Transformer, {big['ops']} aten ops, {big['nodes']} "
              f"nodes, {big['edges']} edges (traced in {big['trace_s']:.1f} s)")
        for algo in LARGE_ALGOS:
            r = big[algo]
            print(f"{algo:15s} placement {r['search_s']:7.3f} s   step {r['step_s']:.3f} s   "
                  f"{'OOM' if r['oom'] else 'ok'}"
                  + (f"   clusters {r['nodes_after']}" if r["nodes_after"] else ""))
        from explorer.engine.placement.refine import default_evals
        print(f"target: <= 5 s for Celeritas (paper: 95.3 s for its 36,352-node Transformer); "
              f"the refinement's budget here is {default_evals(big['nodes'])} simulations")
    if a.estimate:
        est = bench_estimate()
        doc["estimate"] = est
        print("\n## Standard Evaluation error (Table 5: memory 1.5-6 %, time 8-14 %)")
        for spec, e in est.items():
            print(f"{spec:14s} memory mean dev {e['memory']['mean'] * 100:5.2f} % "
                  f"(exact {e['memory']['exact_fraction'] * 100:.0f} % of ops)   time mean dev "
                  f"{e['time']['mean'] * 100:5.1f} % (p90 {e['time']['p90'] * 100:.0f} %); "
                  f"total time est/measured {e['time_total'][0]:.3f}/{e['time_total'][1]:.3f} s")
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(doc, fh, indent=1, default=float)
    return 0


if __name__ == "__main__":
    sys.exit(main())

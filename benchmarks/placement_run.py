"""Placement run benchmark: predicted vs measured step time of placements run as compiled code.

For each model and placement method: calibrate the machine once (``explorer calibrate``;
``--keep-calibration`` reuses ``$EXPLORER_HOME/local.json``), search the placement for
``--devices`` (2) local CPU workers with ``--cost measured`` (every aten call of the step
timed on this machine as that many workers run it side by side, cached in the profile
SQLite), save it as a plan document, run it with ``explorer run``'s entry (one fx program per device with send/recv, reference check against one
device) and print predicted and measured step time, their error, the reference verdict,
transfers, per worker the simulator's busy time next to the worker thread's CPU time in a
step (operator times are CPU times too: on a shared machine the wall time also holds the time
other processes took the core), and peak memory per worker (measured live bytes / simulated);
then, from one traced step per run, where each worker's time went next to the simulated
schedule (:func:`breakdown`) and the memory rule replayed on the run's schedule
(:func:`replayed_peaks`).  ``--repeat N`` runs each plan N times and reports the median run.

    python benchmarks/placement_run.py [--models resnet50,transformer] [--algos celeritas]
                                       [--devices 2] [--steps 10] [--warmup 3]
                                       [--repeat 3] [--json]

Target: ``reference_ok`` and the measured step within 15 % of the predicted one
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
    # NMT's structure (4 stacked LSTM layers, encoder and decoder unrolled) at a CPU size
    "seq2seq": {"batch": 16, "model_args": {"layers": 4, "hidden": 256, "src_steps": 8,
                                            "tgt_steps": 8, "vocab": 1000}},
}


def bench(model: str, algo: str, devices: int, steps: int, warmup: int,
          repeat: int = 1) -> dict:
    """Search ``model`` with ``algo`` (measured costs, ``local`` preset) and run the plan
    ``repeat`` times: the row is the run with the median measured step (``runs_s`` lists
    every run's)."""
    from explorer import service
    from explorer.engine.runtime.dispatch import run_document
    cfg = CONFIGS.get(model, {"batch": None, "model_args": {}})
    req = service.Request(model=model, batch=cfg["batch"], model_args=dict(cfg["model_args"]),
                          preset="local", devices=devices, algo=algo, cost="measured")
    before = canary(0.5)
    t0 = time.perf_counter()
    res = service.run_method(req, algo)
    search_s = time.perf_counter() - t0
    doc = json.loads(json.dumps(res.document()))
    runs = [run_document(doc, steps=steps, warmup=warmup, verify=False, timeline=True)
            for _ in range(max(1, repeat))]
    runs.sort(key=lambda r: r["measured_step_time_s"])
    run = runs[len(runs) // 2]
    after = canary(0.5)
    pred, meas = run["predicted_step_time_s"], run["measured_step_time_s"]
    per_dev = [0] * devices
    for d in doc["placement"].values():
        per_dev[int(d)] += 1
    return {"model": model, "algo": algo, "devices": devices, "ops_per_device": per_dev,
            "breakdown": breakdown(res.plan, run, service.problem_for(req).placement_graph()),
            "peak_replayed_bytes": replayed_peaks(req, res.plan, run),
            "transfers": run["transfers"], "predicted_s": pred, "measured_s": meas,
            "error": (meas - pred) / pred if pred else None,
            "reference_ok": run["reference_ok"], "max_rel_error": run["max_rel_error"],
            "peak_measured_bytes": run["peak_memory_bytes"],
            "peak_predicted_bytes": run.get("predicted_peak_memory_bytes"),
            "compute_s": run["compute_s"], "wait_s": run["wait_s"], "cpu_s": run["cpu_s"],
            "predicted_busy_s": run.get("predicted_busy_s"),
            "step_times_s": run["step_times_s"], "search_s": search_s,
            "runs_s": [r["measured_step_time_s"] for r in runs], "load": os.getloadavg(),
            "canary_before": before, "canary_after": after}


def breakdown(plan, run: dict, pg=None) -> list:
    """Per worker, where the traced step's time went next to the simulated schedule.

    The run's traced step (:func:`explorer.engine.runtime.compiled.timeline`: wall and CPU
    clocks around every call of each device program) is split into its operators' wall time
    (their CPU time, and ``off_cpu``: the wall time the worker thread did not run - other
    processes or workers on its core), ``again`` (a multi-output call computed again for an
    output another device owns: no plan operator), the isend / irecv calls, waiting for
    received tensors and for the step's own sends; beside them the simulator's busy time
    for the device, split into its operators' own times and its send and receive calls
    (``pred_calls``; ``calls_cpu``: the traced calls' CPU time), its idle time (makespan −
    busy), and the
    operator kinds whose CPU time is furthest above their predicted time.  Transfers: the
    measured one-way time of every transfer the receiver was already waiting for (send call
    → receive done) against the link model's ``k·bytes + b``."""
    import numpy as np
    idx = {n: i for i, n in enumerate(plan.names)}
    sim = plan.sim
    w = sim.finish - sim.start                 # each operator's own time (cores not shared)
    if pg is not None:                         # shared cores stretch intervals: own times
        gi = pg.index()
        own = pg.w[[gi[n] for n in plan.names], :]
        w = own[np.arange(len(plan.names)), np.asarray(plan.placement, dtype=np.int64)]
    busy = sim.busy if sim.busy is not None else np.zeros(int(sim.placement.max()) + 1)
    sends, recvs = {}, {}
    out = []
    for r, line in enumerate(run.get("timeline") or []):
        part = {"op": 0.0, "cpu": 0.0, "again": 0.0, "send": 0.0, "post": 0.0, "recv": 0.0,
                "sends": 0.0, "other": 0.0, "call_cpu": 0.0}
        kinds: dict = {}
        for kind, what, a, b, c in line:
            part[kind] = part.get(kind, 0.0) + (b - a)
            if kind in ("send", "post", "recv", "sends"):
                part["call_cpu"] += c
            if kind == "op":
                part["cpu"] += c
                k = kinds.setdefault(what[0].rstrip("0123456789_") if what else "?", [0.0, 0.0])
                k[0] += c
                k[1] += sum(float(w[idx[o]]) for o in what if o in idx)
            elif kind == "send":
                sends[what] = (a, b)
            elif kind == "recv":
                recvs[what] = (a, b)
        worst = sorted(kinds.items(), key=lambda kv: kv[1][1] - kv[1][0])[:3]
        mine = sim.placement == r
        out.append({"worker": r, "step": line[-1][3] - line[0][2] if line else 0.0,
                    "pred_busy": float(busy[r]) if r < len(busy) else 0.0,
                    "pred_calls": max(0.0, (float(busy[r]) if r < len(busy) else 0.0)
                                      - float(w[mine].sum())) if sim.busy is not None else 0.0,
                    "calls_cpu": part["call_cpu"],
                    "pred_idle": float(sim.makespan - (busy[r] if r < len(busy) else 0.0)),
                    "ops": part["op"], "ops_cpu": part["cpu"],
                    "off_cpu": part["op"] - part["cpu"], "again": part["again"],
                    "send_calls": part["send"] + part["post"], "recv_wait": part["recv"],
                    "sends_wait": part["sends"],
                    "worst_ops": [(k, v[0], v[1]) for k, v in worst if v[0] > v[1]]})
    # transfers the receiver waited for: time from the send call to the receive's end
    pred_xfer = {}
    for u, a, b, st, en, nb in sim.transfers:
        pred_xfer.setdefault((a, b), []).append(en - st)
    lat = [recvs[t][1] - sends[t][0] for t in sends if t in recvs and recvs[t][0] < sends[t][0]]
    if out:
        allp = [x for v in pred_xfer.values() for x in v]
        out[0]["xfer_measured"] = float(np.median(lat)) if lat else None
        out[0]["xfer_predicted"] = float(np.median(allp)) if allp else None
        out[0]["xfer_n"] = len(sends)
    return out


def replayed_peaks(req, plan, run: dict) -> dict:
    """The liveness rule (:mod:`explorer.engine.placement.memory`) applied to the run's own
    schedule - each operator's interval and each transfer (send call → receive done) from
    the traced step - as written (``rule``: parameter gradients persist, as a framework's
    ``.grad`` does until the next step) and with every gradient freed after its last reader
    (``grads_freed``: what the compiled step does, its update being the gradient's last
    use).  Per worker, bytes; beside the simulated and the measured peaks they show which
    part of the difference is the schedule and which the rule.  ``sim_with_run_cpu_s``: the
    simulator on the same placement and order with each operator costing the CPU time it
    took in the traced step - near the prediction when the operators cost what was
    planned, so that the rest of a measured step is time the workers did not run."""
    import numpy as np
    from explorer import service
    from explorer.engine.placement.memory import schedule_peak
    from explorer.engine.runtime.compiled import transfers
    prob = service.problem_for(req)
    pg, og = prob.placement_graph(), prob.opgraph()
    idx = pg.index()
    start, finish = np.zeros(pg.n), np.zeros(pg.n)
    sends, recvs = {}, {}
    for line in run.get("timeline") or []:
        for kind, what, a, b, _ in line:
            if kind == "op":
                for o in what:
                    start[idx[o]], finish[idx[o]] = a, b
            elif kind == "send":
                sends[what] = a
            elif kind == "recv":
                recvs[what] = b
    dev = {nm: int(d) for nm, d in zip(plan.names, plan.placement.tolist())}
    place = np.array([dev[nm] for nm in pg.names])
    prod = {t.id: t.producer or t.id for t in og.tensors.values()}
    tr = [(idx[prod[t]], s, d, sends.get(tag, 0.0), recvs.get(tag, 0.0),
           pg.out_bytes[idx[prod[t]]]) for t, s, d, tag in transfers(og, dev, pg.ndev)]
    rule = schedule_peak(pg, place, start, finish, tr)
    grads = {o.name for o in og.ops.values() if o.output in set(og.param_grads.values())}
    pg.persistent = pg.persistent & ~np.array([nm in grads for nm in pg.names])
    freed = schedule_peak(pg, place, start, finish, tr)
    # the simulator again, each operator costing the CPU time it took in the traced step
    from explorer.engine.placement.simulator import simulate
    prio = np.empty(pg.n)                        # the plan's own order, from the planned costs
    prio[[idx[nm] for nm in plan.schedule_order()]] = -np.arange(pg.n, dtype=np.float64)
    w = pg.w.copy()
    for line in run.get("timeline") or []:
        for kind, what, a, b, c in line:
            if kind == "op" and what:
                w[[idx[o] for o in what], :] = 0.0
                w[idx[what[0]], :] = c
    pg.w = w
    return {"rule": rule.tolist(), "grads_freed": freed.tolist(),
            "sim_with_run_cpu_s": simulate(pg, place, prio).makespan}


def _table(cols: list, rows: list) -> str:
    """One text table: ``cols`` = ``[(title, width)]`` (a negative width aligns left),
    ``rows`` = lists of cell texts, or a string: a note line printed as it is."""
    def line(cells):
        return " ".join(f"{c:<{-w}}" if w < 0 else f"{c:>{w}}"
                        for c, (_, w) in zip(cells, cols)).rstrip()
    head = line([t for t, _ in cols])
    return "\n".join([head, "-" * len(head)] +
                     [r if isinstance(r, str) else line(r) for r in rows])


def _ms(x) -> str:
    return f"{x * 1e3:.1f}"


def breakdown_table(rows: list) -> str:
    """The per-worker breakdown of every row, in ms: predicted operators, calls (isend and
    receive) and idle time beside the traced step's operators (wall, CPU, off-CPU), calls
    computed again, the isend/irecv calls (wall and CPU), waiting for receives and sends."""
    cols = [("model", -12), ("w", 2), ("pred ops", 8), ("calls", 6), ("idle", 6), ("|", 1),
            ("traced", 7), ("ops", 6), ("(cpu", 6), ("off)", 6), ("again", 5),
            ("s/r call", 8), ("(cpu)", 6), ("recv wait", 9), ("sends", 6),
            ("CPU above predicted (kind cpu/pred)", -1)]
    out = []
    for r in rows:
        for b in r.get("breakdown") or []:
            worst = ", ".join(f"{k} {c * 1e3:.1f}/{p * 1e3:.1f}" for k, c, p in b["worst_ops"])
            out.append([r["model"], b["worker"], _ms(b["pred_busy"] - b["pred_calls"]),
                        _ms(b["pred_calls"]), _ms(b["pred_idle"]), "|", _ms(b["step"]),
                        _ms(b["ops"]), _ms(b["ops_cpu"]), _ms(b["off_cpu"]), _ms(b["again"]),
                        _ms(b["send_calls"]), _ms(b["calls_cpu"]), _ms(b["recv_wait"]),
                        _ms(b["sends_wait"]), worst])
        pad = " " * 16
        rp = r.get("peak_replayed_bytes")
        if rp:
            mib = lambda xs: " / ".join(f"{x / 2 ** 20:.0f}" for x in xs)  # noqa: E731
            out.append(f"{pad}peak MiB per worker: measured {mib(r['peak_measured_bytes'])}"
                       f"; simulated {mib(r['peak_predicted_bytes'] or [])}; the rule on "
                       f"the run's schedule {mib(rp['rule'])}, with gradients freed after "
                       f"their update {mib(rp['grads_freed'])}")
        if rp and rp.get("sim_with_run_cpu_s"):
            out.append(f"{pad}simulated with the traced step's own CPU time per operator: "
                       f"{_ms(rp['sim_with_run_cpu_s'])} ms (predicted "
                       f"{_ms(r['predicted_s'])}, measured {_ms(r['measured_s'])})")
        b0 = (r.get("breakdown") or [{}])[0]
        if b0.get("xfer_n"):
            m, p = b0.get("xfer_measured"), b0.get("xfer_predicted")
            out.append(f"{pad}transfers: {b0['xfer_n']}; median one-way time when "
                       f"the receiver waited {m * 1e3 if m else float('nan'):.2f} ms, "
                       f"the link model's median {p * 1e3 if p else float('nan'):.2f} ms")
    return _table(cols, out)


def table(rows: list) -> str:
    """One line per plan: prediction, measured step, error, reference check, per worker the
    predicted busy time beside the measured CPU time and the peaks, canary and load."""
    cols = [("model", -13), ("algo", -15), ("ops/dev", -15), ("xfers", 5), ("pred ms", 9),
            ("meas ms", 9), ("error", 7), ("ref", 5), ("busy/cpu ms per worker", -30),
            ("peak MiB meas/pred", -26), ("canary", 13), ("load", 5), ("runs ms", -1)]
    out = []
    for r in rows:
        if "error_text" in r:
            out.append(f"{r['model']:<13} {r['algo']:<15} failed: {r['error_text']}")
            continue
        mem = " ".join(f"{m / 2**20:.0f}/{(p or 0) / 2**20:.0f}" for m, p in
                       zip(r["peak_measured_bytes"], r["peak_predicted_bytes"] or
                           [None] * len(r["peak_measured_bytes"])))
        busy = " ".join(f"{b * 1e3:.0f}/{c * 1e3:.0f}" for b, c in
                        zip(r["predicted_busy_s"] or [0.0] * len(r["cpu_s"]), r["cpu_s"]))
        out.append([r["model"], r["algo"], "/".join(map(str, r["ops_per_device"])),
                    r["transfers"], _ms(r["predicted_s"]), _ms(r["measured_s"]),
                    f"{100 * r['error']:+.1f}%" if r["error"] is not None else "-",
                    str(r["reference_ok"]), busy, mem,
                    f"{r['canary_before']:.0f}/{r['canary_after']:.0f}",
                    f"{r.get('load', [0])[0]:.1f}",
                    " ".join(f"{x * 1e3:.0f}" for x in r.get("runs_s", []))])
    return _table(cols, out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="resnet50,transformer")
    ap.add_argument("--algos", default="celeritas")
    ap.add_argument("--devices", type=int, default=2)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=1,
                    help="run each plan this many times and report the median run")
    ap.add_argument("--keep-calibration", action="store_true",
                    help="use $EXPLORER_HOME/local.json when present instead of calibrating "
                         "again (the links' latency decides where placements cut)")
    ap.add_argument("--keep-profile", action="store_true",
                    help="reuse operator times cached by earlier runs (default: time every "
                         "operator again, so the prediction is of the machine as it is now)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    from explorer.engine.core.storage import home
    from explorer.errors import ExplorerError
    if not (home() / "local.json").exists() or not args.keep_calibration:
        from explorer.engine.runtime.calibrate import calibrate
        print("calibrating this machine (explorer calibrate) ...", file=sys.stderr)
        calibrate(args.devices)
    if not args.keep_profile:
        from explorer.engine.core.profile import clear_op_times
        clear_op_times()
    rows = []
    for model in args.models.split(","):
        for algo in args.algos.split(","):
            print(f"{model} {algo} ...", file=sys.stderr)
            try:
                rows.append(bench(model, algo, args.devices, args.steps, args.warmup,
                                  args.repeat))
            except (ExplorerError, ValueError) as exc:
                rows.append({"model": model, "algo": algo, "error_text": str(exc)})
    print(json.dumps(rows, indent=1) if args.json else
          table(rows) + "\n\nWhere the time goes (the traced step, ms):\n" +
          breakdown_table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Text report of a run result (``explorer run`` without ``--json``): :func:`format_run` for
any plan kind, :func:`format_report` for a layer-wise run."""

from __future__ import annotations


def _ms(v) -> str:
    return "-" if v is None else f"{v * 1e3:9.3f}"


def _where(res: dict) -> str:
    """`` on cuda:0, cuda:1`` for GPU workers (nothing for CPU workers)."""
    devs = res.get("worker_devices") or []
    if not any(str(d).startswith("cuda") for d in devs):
        return ""
    return " on " + ", ".join(map(str, devs)) + (" (shared)" if res.get("shared") else "")


def memory_lines(res: dict) -> list:
    """Per worker, the live memory the first step held by category (each category's
    largest value; ``peak`` the largest total) beside the plan's prediction."""
    got = res.get("measured_memory_by_category")
    if not got:
        return []
    pred = res.get("predicted_memory_by_category") or {}
    out = []
    for w in range(len(got["peak"])):
        parts = []
        for k in ("params", "grads", "optimizer", "activations", "transient", "peak"):
            p = pred.get(k)
            parts.append(f"{k} {got[k][w] / 2 ** 10:.1f}" +
                         (f" / {p[w] / 2 ** 10:.1f}" if p else ""))
        out.append(f"memory on worker {w} (KiB, measured{' / predicted' if pred else ''}): "
                   + ", ".join(parts))
    return out


def format_report(res: dict, top: int = 12) -> str:
    lines = []
    ref = res.get("reference")
    head = (f"{res.get('model')} (batch {res.get('batch')}, {res.get('algo')} plan) on "
            f"{res.get('devices')} workers, backend {res.get('backend')}{_where(res)}")
    lines.append(head)
    if res.get("measured_peak_memory_bytes"):
        lines.append("peak allocated per worker: " + ", ".join(
            f"{b / 2 ** 30:.2f} GiB" for b in res["measured_peak_memory_bytes"]))
    lines += memory_lines(res)
    if ref is None:
        lines.append("reference check: skipped")
    else:
        verdict = "OK" if ref["ok"] else "FAILED"
        lines.append(
            f"reference check: {verdict}  (loss {ref['loss']:.6g} vs {ref['loss_ref']:.6g}, "
            f"max rel. error: loss {ref['loss_rel_err']:.2e}, parameters "
            f"{ref['max_param_rel_err']:.2e}, gradients {ref['max_grad_rel_err']:.2e}; "
            f"tolerance {ref['tolerance']:.0e}, {ref['params_compared']} tensors)")
        for p in ref.get("problems", []):
            lines.append(f"  problem: {p}")
        if not ref["ok"] and ref.get("worst_grad"):
            lines.append(f"  worst gradient: {ref['worst_grad']}; worst parameter: "
                         f"{ref['worst_param']}")
    pred, meas = res.get("predicted_step_time_s"), res.get("measured_step_time_s")
    err = res.get("rel_error")
    lines.append(f"step time: predicted {_ms(pred).strip()} ms, measured {_ms(meas).strip()} ms "
                 f"(median of {res.get('steps')} steps after {res.get('warmup')} warm-up), "
                 f"error {'-' if err is None else f'{err * 100:+.1f}%'}")
    pipe = res.get("pipeline")
    if pipe:
        bub = pipe.get("measured_bubble_fraction")
        lines.append(
            f"pipeline: {pipe['stages']} stages x {pipe['devices_per_stage']} workers, "
            f"{pipe['micro_batches']} micro-batches (plan's schedule {pipe['schedule']}, run in "
            f"{pipe['executed_schedule']} order); bubble predicted "
            f"{pipe['predicted_bubble_fraction'] * 100:.1f} %, measured "
            f"{'-' if bub is None else f'{bub * 100:.1f} %'} (the busiest stage's idle time)")
        for s, (p, m) in enumerate(zip(pipe["predicted_stage_time_per_microbatch_s"] or
                                       [None] * pipe["stages"],
                                       pipe["measured_stage_time_per_microbatch_s"])):
            idle = (pipe.get("measured_idle_fraction") or [None] * pipe["stages"])[s]
            lines.append(f"  stage {s}: per micro-batch predicted {_ms(p).strip()} ms, "
                         f"measured compute {_ms(m).strip()} ms; idle "
                         f"{'-' if idle is None else f'{idle * 100:.0f} %'} of the step")
    bd = res.get("measured_breakdown_s") or {}
    if bd:
        lines.append("measured per step (slowest worker): " + ", ".join(
            f"{k} {v * 1e3:.2f} ms" for k, v in bd.items()))
    wc = res.get("measured_worker_compute_s") or []
    if len(wc) > 1:
        lines.append("per worker computing: " + ", ".join(f"{v * 1e3:.1f}" for v in wc) +
                     f" ms; waiting for slower workers in exchanges "
                     f"{res.get('measured_wait_s', 0.0) * 1e3:.1f} ms per step (the plan's "
                     f"prediction assumes equal workers)")
    layers = sorted(res.get("layers", []), key=lambda r: -max(r["measured_s"], r["predicted_s"]))
    if layers:
        lines.append(f"{'layer':28s} {'config':10s} {'pred ms':>9s} {'meas ms':>9s} "
                     f"{'pred comm':>9s} {'meas comm':>9s}")
        for r in layers[:top]:
            lines.append(f"{r['name'][:28]:28s} {r['config'][:10]:10s} {_ms(r['predicted_s'])} "
                         f"{_ms(r['measured_s'])} {_ms(r['predicted_comm_s'])} "
                         f"{_ms(r['measured_comm_s'])}")
        if len(layers) > top:
            lines.append(f"... {len(layers) - top} more layers (--json lists all)")
    for w in res.get("warnings", []):
        lines.append(f"warning: {w}")
    lines.extend(noise_lines(res))
    return "\n".join(lines)


def noise_lines(res: dict) -> list:
    """The run's noise: the steps' median and minimum, the CPU stolen, and the one-line
    verdict when the timing is noisy (:mod:`.noise`)."""
    nz = res.get("noise") or {}
    if not nz:
        return []
    sp = nz.get("spread") or {}
    parts = []
    if sp.get("steps"):
        parts.append(f"steps: median {sp['median_s'] * 1e3:.2f} ms, min {sp['min_s'] * 1e3:.2f} "
                     f"ms, max {sp['max_s'] * 1e3:.2f} ms over {sp['steps']}")
    if nz.get("steal") is not None:
        parts.append(f"CPU stolen by other tenants {nz['steal'] * 100:.1f} %")
    if nz.get("canary_change") is not None:
        parts.append(f"machine speed change {nz['canary_change'] * 100:+.0f} %")
    out = ["noise: " + "; ".join(parts)] if parts else []
    if nz.get("note"):
        out.append(nz["note"])
    return out


def format_run(res: dict) -> str:
    """The report of a :func:`~explorer.engine.runtime.dispatch.run_document` result, by kind."""
    if res.get("kind", "layerwise") == "layerwise":
        return format_report(res)
    n = res.get("devices") or res.get("workers")
    what = f"{res.get('model')} placement" if res["kind"] == "placement" else \
        f"{res.get('model')} {res.get('algo')} plan"
    ok = res.get("reference_ok")
    check = "skipped" if ok is None else (
        f"{'passed' if ok else 'FAILED'} (max relative error {res['max_rel_error']:.1e}, "
        f"{res.get('dtype', 'float64')})")
    lines = [f"{what} on {n} local workers ({res.get('backend', 'gloo')}{_where(res)}): "
             f"reference check {check}",
             f"communication: predicted {res['predicted_comm_bytes'] / 1e6:.3f} MB, measured "
             f"{res['measured_comm_bytes'] / 1e6:.3f} MB per step"]
    for p in ((res.get("reference") or {}).get("problems") or []):
        lines.append(f"  problem: {p}")
    if res["kind"] == "tofu":
        mib = 2 ** 20
        pred = res.get("peak_memory_bytes") or []
        for w, got in enumerate(res.get("measured_peak_memory_bytes") or []):
            want = pred[w] if w < len(pred) else None
            lines.append(f"worker {w} peak memory: measured {got / mib:.1f} MiB" +
                         (f", predicted {want / mib:.1f} MiB ({(got - want) / want * 100:+.1f} %)"
                          if want else ""))
        dt = res.get("timed_dtype", "float64")
        if res.get("predicted_step_time_s"):
            pred, meas = res["predicted_step_time_s"], res["measured_step_time_s"]
            terms = res.get("predicted_terms")
            if terms:                     # the executor's own transfers, simulated
                parts = [f"compute {terms['compute'] * 1e3:.1f}",
                         f"send/receive calls {terms['calls'] * 1e3:.1f}",
                         f"waiting on peers, links and collectives {terms['wait'] * 1e3:.1f}"]
                if (res.get("predicted_share") or 1.0) > 1.0:
                    parts[0] += (f" (×{res['predicted_share']:.2f}: more workers than cores "
                                 f"share them)")
            else:
                parts = [f"compute {(res.get('predicted_compute_step_s') or 0) * 1e3:.1f}",
                         f"links {(res.get('predicted_comm_s') or 0) * 1e3:.1f}"]
                if res.get("predicted_latency_s"):
                    parts.append(f"latency {res['predicted_latency_s'] * 1e3:.1f}")
            lines.append(f"step time: predicted {pred * 1e3:.2f} ms ({' + '.join(parts)}; "
                         f"{res.get('compute_source', 'roofline')}), measured "
                         f"{meas * 1e3:.2f} ms ({(pred - meas) / meas * 100:+.0f} %; {dt}, op "
                         f"by op in Python)")
        else:
            lines.append(f"step time: measured {res['measured_step_time_s'] * 1e3:.2f} ms "
                         f"({dt})")
        if res.get("cpu_step_s"):
            busy = max(res["cpu_step_s"]) < 0.6 * res["measured_step_time_s"]
            lines.append("worker CPU per step (main thread, not waiting): " + ", ".join(
                f"{c * 1e3:.1f} ms" for c in res["cpu_step_s"]) +
                (" - well below the measured step: other processes held the cores, or the "
                 "workers waited on the links" if busy else ""))
        for w, p in enumerate(res.get("step_profile") or []):
            t = p["total"]
            cpu = t["fetch_cpu_s"] + t["compute_cpu_s"] + t["send_cpu_s"]
            lines.append(
                f"worker {w} where the step went: {t['step_s'] * 1e3:.1f} ms = operators' CPU "
                f"{cpu * 1e3:.1f} (computing {t['compute_cpu_s'] * 1e3:.1f}, fetching "
                f"{t['fetch_cpu_s'] * 1e3:.1f}, sending / combining {t['send_cpu_s'] * 1e3:.1f})"
                f" + waiting {max(0.0, t['fetch_s'] + t['compute_s'] + t['send_s'] - cpu) * 1e3:.1f}"
                f" (in transfers "
                f"{t['wait_s'] * 1e3:.1f}, collectives {t['collective_s'] * 1e3:.1f}) + outside "
                f"the operators {t['other_s'] * 1e3:.1f}; {t['page_faults']:.0f} page faults")
        if res.get("fallback_ops"):
            lines.append("on full-size buffers (no tile rule): " + ", ".join(
                f"{k} ×{v}" for k, v in res["fallback_ops"].items()))
    elif res.get("predicted_step_time_s"):
        pred, meas = res["predicted_step_time_s"], res["measured_step_time_s"]
        how = ("one compiled fx program per device" if res.get("executor") == "compiled"
               else "the runtime interprets the step op by op in Python")
        lines.append(f"step time: predicted {pred * 1e3:.2f} ms, measured {meas * 1e3:.2f} ms "
                     f"({res['rel_error'] * 100:+.0f} %; {how}; "
                     f"{res.get('cost') or 'analytic'} operator costs)")
    if res.get("peak_memory_bytes") and res.get("predicted_peak_memory_bytes"):
        lines.append("peak memory per worker (MiB, measured live tensors / simulated): " +
                     "  ".join(f"{d}: {m / 2**20:.1f} / {p / 2**20:.1f}" for d, (m, p) in
                               enumerate(zip(res["peak_memory_bytes"],
                                             res["predicted_peak_memory_bytes"]))))
    for w in res.get("warnings", []):
        lines.append(f"warning: {w}")
    lines.extend(noise_lines(res))
    return "\n".join(lines)

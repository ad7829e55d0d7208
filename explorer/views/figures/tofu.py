"""Tofu figures: drawn from the plain dicts ``session.tofu_compare`` and ``session.run_tofu``
return (a run's per-worker fields are read when the runtime reports them)."""

from __future__ import annotations

import plotly.graph_objects as go

from explorer.views import fmt
from explorer.views import palette as P
from explorer.views.figures import PARTITION_FIRST, RUN_FIRST, empty_figure


def compare_figure(cmp: dict) -> go.Figure:
    """Communication per step of each algorithm (one unit picked by magnitude), Tofu
    highlighted (Figure 10); each bar also says its time on the links (one link model for
    every algorithm)."""
    algos = list(cmp)
    unit, div = fmt.scale(max([cmp[a]["comm_bytes"] for a in algos] + [0.0]))
    fig = go.Figure([go.Bar(x=algos, y=[cmp[a]["comm_bytes"] / div for a in algos],
                            text=[fmt.bytes_(cmp[a]["comm_bytes"]) +
                                  (f" · {fmt.seconds(cmp[a]['objective_s'])}"
                                   if cmp[a].get("objective_s") is not None else "")
                                  for a in algos],
                            marker_color=[P.HIGHLIGHT if a == "tofu" else P.PREDICTED
                                          for a in algos])])
    fig.update_layout(title="Communication per step by algorithm (Tofu Figure 10)",
                      yaxis_title=unit, margin=dict(l=50, r=20, t=40, b=40))
    return fig


def measured_peaks(res: dict | None) -> list | None:
    """The run's measured per-worker peak bytes, when the runtime reports them."""
    if not res:
        return None
    m = res.get("measured_peak_memory_bytes")
    if isinstance(m, dict):                    # {rank: bytes}
        m = [m[k] for k in sorted(m, key=int)]
    if isinstance(m, (int, float)):
        m = [m]
    return [float(x) for x in m] if isinstance(m, list) and m else None


def predicted_step(res: dict | None, doc: dict | None) -> tuple:
    """``(seconds, what)``: the runtime's predicted step time (compute + links) when the run
    reports one, else the plan's own (time on the links only)."""
    if res and res.get("predicted_step_time_s"):
        src = res.get("compute_source")
        return float(res["predicted_step_time_s"]), "compute + links" + (f"; {src}" if src
                                                                         else "")
    if doc and doc.get("predicted_step_time_s") is not None:
        return float(doc["predicted_step_time_s"]), "links only"
    return None, ""


def run_memory_figure(res: dict | None, doc: dict | None) -> go.Figure:
    """Per worker: the plan's predicted peak against the run's measured peak (one unit
    picked by magnitude)."""
    pred = [float(x) for x in (doc or {}).get("peak_memory_bytes") or []]
    meas = measured_peaks(res)
    if not pred and not meas:
        return empty_figure(PARTITION_FIRST if not doc else RUN_FIRST, "Memory per worker")
    fig = go.Figure()
    limit = (res or {}).get("memory_per_worker_bytes")
    unit, div = fmt.scale(max(pred + list(meas or []) + [float(limit or 0.0)]))
    workers = [f"worker {i}" for i in range(max(len(pred), len(meas or [])))]
    if pred:
        fig.add_bar(name="predicted peak", x=workers[:len(pred)], y=[p / div for p in pred],
                    marker_color=P.PREDICTED, text=[fmt.bytes_(p) for p in pred])
    if meas:
        fig.add_bar(name="measured peak", x=workers[:len(meas)], y=[m / div for m in meas],
                    marker_color=P.MEASURED, text=[fmt.bytes_(m) for m in meas])
    if limit:          # its label under the line's right end, never over the title
        fig.add_hline(y=float(limit) / div, line_dash="dash", line_color=P.ERROR,
                      annotation_text=f"limit {fmt.bytes_(limit)}",
                      annotation_position="bottom right")
    title = "Memory per worker: predicted vs measured" if meas else \
        "Memory per worker: predicted (this run reports no per-worker measurement)"
    fig.update_layout(barmode="group", title=dict(text=title, y=0.97, yanchor="top"),
                      yaxis_title=unit, margin=dict(l=50, r=20, t=70, b=40),
                      legend=dict(orientation="h", yanchor="bottom", y=1.0, x=0))
    return fig


def run_time_figure(res: dict | None, doc: dict | None) -> go.Figure:
    """Step time: predicted against measured (median of the run's steps), ms."""
    pred, what = predicted_step(res, doc)
    meas = (res or {}).get("measured_step_time_s")
    if pred is None and meas is None:
        return empty_figure(PARTITION_FIRST if not doc else RUN_FIRST, "Step time")
    x, y, c, t = [], [], [], []
    if pred is not None:
        x.append(f"predicted ({what})")
        y.append(pred * 1e3)
        c.append(P.PREDICTED)
    if meas is not None:
        x.append("measured")
        y.append(float(meas) * 1e3)
        c.append(P.MEASURED)
    t = [f"{v:.2f} ms" for v in y]
    fig = go.Figure([go.Bar(x=x, y=y, marker_color=c, text=t)])
    fig.update_layout(title="Step time", yaxis_title="ms", margin=dict(l=50, r=20, t=40, b=40))
    return fig


__all__ = ["compare_figure", "measured_peaks", "predicted_step", "run_memory_figure",
           "run_time_figure"]

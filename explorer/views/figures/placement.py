"""Placement figures: the simulator's schedule, peak memory, the methods compared and a run.

Every function takes the plain placement document (``session.placement``), the rows of
``session.placement_compare`` or a run result (``session.run_placement``) and returns a
plotly figure; ``None`` gives an empty, titled figure.
"""

from __future__ import annotations

import plotly.graph_objects as go

from explorer.views import fmt
from explorer.views import palette as P
from explorer.views.figures import PLACE_FIRST, RUN_FIRST, empty_figure
from explorer.views.figures.run import series_figure

#: above this many operators the Gantt chart draws one bar per run of a cluster on a device
MAX_GANTT_BARS = 4000

device_color = P.device_color


def _gantt_ops(doc: dict) -> list:
    """Schedule ops, merged into one bar per consecutive run of a cluster on a device when
    there are more than :data:`MAX_GANTT_BARS` of them."""
    ops = doc.get("schedule", {}).get("ops", [])
    if len(ops) <= MAX_GANTT_BARS:
        return [dict(o, label=o["op"], n=1) for o in ops]
    cl = {op: k for k, c in enumerate(doc["clusters"]) for op in c["ops"]}
    runs: list = []
    last: dict = {}
    for o in sorted(ops, key=lambda o: (o["device"], o["start"])):
        k = cl.get(o["op"], -1)
        r = last.get(o["device"])
        if r is not None and r["cluster"] == k:
            r["end"] = max(r["end"], o["end"])
            r["n"] += 1
            continue
        r = {"device": o["device"], "start": o["start"], "end": o["end"], "cluster": k, "n": 1}
        last[o["device"]] = r
        runs.append(r)
    for r in runs:
        r["label"] = f"cluster {r['cluster']} ({r['n']} ops)"
    return runs


def gantt_figure(doc: dict | None) -> go.Figure:
    """The simulator's schedule: per device a compute row and a receive row (transfers into
    that device, coloured by the sending device). Times in ms."""
    if not doc:
        return empty_figure(PLACE_FIRST, "Predicted schedule")
    fig = go.Figure()
    ndev = len(doc["capacity_bytes"])
    rows = []
    for d in range(ndev):
        rows += [f"dev {d}", f"dev {d} ← recv"]
    ops = _gantt_ops(doc)
    for d in range(ndev):
        mine = [o for o in ops if o["device"] == d]
        if not mine:
            continue
        fig.add_trace(go.Bar(
            name=f"device {d}", orientation="h", y=[f"dev {d}"] * len(mine),
            base=[o["start"] * 1e3 for o in mine],
            x=[max((o["end"] - o["start"]) * 1e3, 1e-6) for o in mine],
            marker=dict(color=device_color(d), line=dict(color="#fff", width=0.5)),
            customdata=[o["label"] for o in mine],
            hovertemplate="%{customdata}<br>%{base:.3f} → %{x:.3f} ms long<extra></extra>"))
    tr = doc.get("schedule", {}).get("transfers", [])
    if tr:
        fig.add_trace(go.Bar(
            name="transfers", orientation="h", y=[f"dev {t['dst']} ← recv" for t in tr],
            base=[t["start"] * 1e3 for t in tr],
            x=[max((t["end"] - t["start"]) * 1e3, 1e-6) for t in tr],
            marker=dict(color=[device_color(t["src"]) for t in tr], opacity=0.75,
                        pattern=dict(shape="/"), line=dict(color="#333", width=0.5)),
            customdata=[[t["tensor_of"], t["src"], t["dst"], t["bytes"] / 2 ** 20] for t in tr],
            hovertemplate=("%{customdata[0]}: dev %{customdata[1]} → %{customdata[2]}, "
                           "%{customdata[3]:.2f} MiB<br>%{base:.3f} ms, %{x:.3f} ms long"
                           "<extra></extra>")))
    step = doc["predicted_step_time_s"] * 1e3
    fig.add_vline(x=step, line_dash="dash", line_color="#333",
                  annotation_text=f"step {step:.1f} ms")
    fig.update_layout(
        barmode="overlay", title=dict(text=f"Predicted schedule ({doc['algo']}): compute and "
                                      f"received transfers per device", font=dict(size=14)),
        xaxis_title="ms", margin=dict(l=90, r=20, t=70, b=40), bargap=0.25,
        legend=dict(orientation="h", y=1.0, yanchor="bottom", x=0),
        yaxis=dict(categoryorder="array", categoryarray=rows[::-1], type="category",
                   range=[-0.5, len(rows) - 0.5]))
    return fig


def memory_figure(doc: dict | None) -> go.Figure:
    """Peak memory per device as a percentage of its capacity (bars, red when over; the
    capacity is the 100 % line), each bar labelled with its bytes in their own unit - the
    same numbers the summary's OOM text is judged by, readable for a 3 MiB model on 16 GiB
    devices as for a model that fills them."""
    if not doc:
        return empty_figure(PLACE_FIRST, "Peak memory per device")
    fig = go.Figure()
    peak_b, cap_b = doc["peak_memory_bytes"], doc["capacity_bytes"]
    pct = [100.0 * p / c if c else 0.0 for p, c in zip(peak_b, cap_b)]
    xs = [f"dev {d}" for d in range(len(pct))]
    over = [p > c * (1 + 1e-9) for p, c in zip(peak_b, cap_b)]
    fig.add_trace(go.Bar(name="peak", x=xs, y=pct,
                         marker=dict(color=[(P.ERROR if o else device_color(d))
                                            for d, o in enumerate(over)]),
                         text=[f"{fmt.bytes_(p)} ({fmt.percent(p, c)})"
                               for p, c in zip(peak_b, cap_b)],
                         customdata=[fmt.of(p, c) for p, c in zip(peak_b, cap_b)],
                         hovertemplate="%{x}: %{customdata}<extra></extra>",
                         textposition="outside"))
    fig.add_trace(go.Scatter(name="capacity", x=xs, y=[100.0] * len(xs), mode="markers+lines",
                             line=dict(color="#111", dash="dash", shape="hvh"),
                             customdata=[fmt.bytes_(c) for c in cap_b],
                             hovertemplate="%{x} capacity %{customdata}<extra></extra>",
                             marker=dict(symbol="line-ew", size=30,
                                         line=dict(width=3, color="#111"))))
    fig.update_layout(title=dict(text="Peak memory per device vs capacity",
                                 font=dict(size=14)), yaxis_title="% of device memory",
                      margin=dict(l=50, r=20, t=70, b=40), showlegend=True,
                      legend=dict(orientation="h", y=1.0, yanchor="bottom", x=0),
                      yaxis=dict(range=[0, 1.15 * max(pct + [100.0])], ticksuffix=" %"))
    return fig


def compare_figure(rows: list) -> go.Figure:
    """Predicted step time of every method (``session.placement_compare`` rows); Celeritas
    highlighted, out-of-memory placements in the error colour."""
    good = [r for r in rows if "error" not in r]
    if not rows:
        return empty_figure("No comparison yet: press Compare all.",
                            "Predicted step time of every method")
    fig = go.Figure([go.Bar(
        x=[r["algo"] for r in good], y=[r["step_time_s"] for r in good],
        text=[f"{r['step_time_s']:.3f} s" + (" OOM" if r["oom"] else "") for r in good],
        textposition="outside",
        marker=dict(color=[P.HIGHLIGHT if r["algo"] == "celeritas" else
                           (P.ERROR if r["oom"] else P.PREDICTED) for r in good]))])
    unit, div = fmt.scale(max([r["step_time_s"] for r in good] + [0.0]), fmt.TIME_UNITS)
    fig.data[0].y = [r["step_time_s"] / div for r in good]
    fig.data[0].text = [fmt.seconds(r["step_time_s"]) + (" OOM" if r["oom"] else "")
                        for r in good]
    fig.update_layout(title="Predicted step time by method (same graph, same simulator)",
                      yaxis_title=unit, margin=dict(l=50, r=20, t=40, b=40))
    return fig


def run_figure(res: dict | None) -> go.Figure:
    """Per device: the simulator's busy time next to the measured compute time (``res`` from
    ``session.run_placement``; no bars without one)."""
    if not res:
        return empty_figure(RUN_FIRST, "Busy time per device")
    fig = go.Figure()
    if res:
        n = len(res.get("compute_s") or [])
        xs = [f"device {d}" for d in range(n)]
        colors = [device_color(d) for d in range(n)]
        fig.add_bar(name="predicted busy (simulator)", x=xs,
                    y=[t * 1e3 for t in (res.get("predicted_busy_s") or [0.0] * n)[:n]],
                    marker=dict(color=[P.rgba(c, 0.35) for c in colors],
                                line=dict(color=colors, width=1.5), pattern=dict(shape="/")))
        fig.add_bar(name="measured compute", x=xs, y=[t * 1e3 for t in res["compute_s"]],
                    marker=dict(color=colors))
    fig.update_layout(barmode="group", title="Per device: predicted busy vs measured compute "
                      "(ms per step)", yaxis_title="ms", margin=dict(l=50, r=20, t=40, b=60),
                      legend=dict(orientation="h", y=-0.12, yanchor="top"))
    return fig


def run_series(res: dict | None) -> go.Figure:
    """Each measured step's wall time (slowest worker) with the simulator's prediction; an
    empty titled figure without a run."""
    if res:
        return series_figure(res)
    return empty_figure(RUN_FIRST, "Step time per measured step")


__all__ = ["MAX_GANTT_BARS", "device_color", "gantt_figure", "memory_figure", "compare_figure",
           "run_figure", "run_series"]

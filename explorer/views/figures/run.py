"""Run figures: measured against predicted times of one run (per layer, and per step).

Both take the plain result dict ``session.run`` / ``session.run_placement`` return.
"""

from __future__ import annotations

import plotly.graph_objects as go

from explorer.views import palette as P


def layers_figure(res: dict, top: int = 25) -> go.Figure:
    """Predicted vs measured time per layer (compute + communication), largest first."""
    rows = sorted(res.get("layers", []), key=lambda r: -max(r["predicted_s"], r["measured_s"]))
    rows = rows[:top]
    names = [r["name"] for r in rows]
    fig = go.Figure([
        go.Bar(name="predicted", x=names, y=[r["predicted_s"] * 1e3 for r in rows],
               marker_color=P.PREDICTED),
        go.Bar(name="measured", x=names, y=[r["measured_s"] * 1e3 for r in rows],
               marker_color=P.MEASURED),
    ])
    # the legend sits under the title, right-aligned above the plot: it never covers either
    fig.update_layout(barmode="group",
                      title=dict(text=f"Per layer: predicted vs measured (ms, top {top})",
                                 x=0, xanchor="left", y=0.97, yanchor="top"),
                      yaxis_title="ms", margin=dict(l=50, r=20, t=80, b=90),
                      legend=dict(orientation="h", x=1, xanchor="right", y=1.0,
                                  yanchor="bottom"))
    return fig


def series_figure(res: dict) -> go.Figure:
    """Each measured step's time with the predicted (dashed) and median (dotted) lines."""
    steps = res.get("step_times_s") or []
    fig = go.Figure([go.Scatter(x=list(range(1, len(steps) + 1)), y=[s * 1e3 for s in steps],
                                mode="lines+markers", name="measured step")])
    pred = res.get("predicted_step_time_s")
    if pred:
        fig.add_hline(y=pred * 1e3, line_dash="dash", line_color=P.ERROR,
                      annotation_text=f"predicted {pred * 1e3:.2f} ms")
    med = res.get("measured_step_time_s")
    if med:
        fig.add_hline(y=med * 1e3, line_dash="dot", line_color=P.MEASURED,
                      annotation_text=f"median {med * 1e3:.2f} ms",
                      annotation_position="bottom right")
    fig.update_layout(title="Step time per measured step", xaxis_title="step", xaxis_dtick=1,
                      yaxis_title="ms", margin=dict(l=50, r=20, t=40, b=40), showlegend=False)
    return fig


__all__ = ["layers_figure", "series_figure"]

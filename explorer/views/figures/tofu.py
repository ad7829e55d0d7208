"""Tofu figures: drawn from the plain dicts ``session.tofu_compare`` returns."""

from __future__ import annotations

import plotly.graph_objects as go

from .. import fmt
from .. import palette as P


def compare_figure(cmp: dict) -> go.Figure:
    """Communication per step of each algorithm (one unit picked by magnitude), Tofu
    highlighted (Figure 10)."""
    algos = list(cmp)
    unit, div = fmt.scale(max([cmp[a]["comm_bytes"] for a in algos] + [0.0]))
    fig = go.Figure([go.Bar(x=algos, y=[cmp[a]["comm_bytes"] / div for a in algos],
                            text=[fmt.bytes_(cmp[a]["comm_bytes"]) for a in algos],
                            marker_color=[P.HIGHLIGHT if a == "tofu" else P.PREDICTED
                                          for a in algos])])
    fig.update_layout(title="Communication per step by algorithm (Tofu Figure 10)",
                      yaxis_title=unit, margin=dict(l=50, r=20, t=40, b=40))
    return fig


__all__ = ["compare_figure"]

"""The ranking check's figure: each plan's predicted step against its measured one.

:func:`ranking_figure` takes the report ``service.rank`` returns (``{"request", "rounds",
"steps", "rows", "kendall_tau", "regret", ...}``) and puts one point per plan that ran at
(predicted step, median measured step), coloured by family, with a bar down to its fastest
round and the dashed line y = x: a point on the line was predicted exactly, above it the plan
ran slower than predicted.  Both axes share one unit and one range, so the line is the
diagonal; they turn logarithmic when the steps span orders of magnitude.
"""

from __future__ import annotations

import math

import plotly.graph_objects as go

from explorer.views import fmt
from explorer.views import palette as P
from explorer.views.figures import empty_figure
from explorer.views.figures.families import FAMILIES, family_name, legend_name

TITLE = "Predicted against measured step"
#: what the figure says before the first ranking
FIRST = "Nothing ranked yet: press Rank by running."
HEIGHT = 460
MARGIN = dict(l=70, r=30, t=80, b=110)
LEGEND_PX = 62          # the legend's top, under the plot (below the axis title)
#: the axes turn logarithmic when the steps span more than this factor
LOG_SPREAD = 20.0
IDEAL_NAME = "y = x: predicted exactly"


def ran(report: dict | None) -> list:
    """The rows of ``report`` that have a measured step (not failed)."""
    return [r for r in (report or {}).get("rows") or []
            if "failed" not in r and r.get("measured_step_s") is not None]


def tau_text(tau) -> str:
    """Kendall's τ as the app writes it (``–`` below two plans)."""
    return "–" if tau is None else f"{tau:+.2f}"


def regret_text(regret) -> str:
    """The regret as a percentage (``–`` without a ranking)."""
    return "–" if regret is None else f"{regret * 100:.0f} %"


def log_ticks(lo: float, hi: float) -> dict:
    """Ticks of a log axis over ``10**lo .. 10**hi``: 1, 2 and 5 of each decade, each
    labelled in full (plotly's own labels every digit, or only the digit: "2" for 20)."""
    vals = [m * 10.0 ** k for k in range(math.floor(lo), math.ceil(hi) + 1) for m in (1, 2, 5)
            if lo <= math.log10(m * 10.0 ** k) <= hi]
    return dict(tickvals=vals, ticktext=[f"{v:g}" for v in vals])


def _request_line(report: dict) -> str:
    req = report.get("request") or {}
    return (f"{req.get('model')} · batch {req.get('batch') or 'default'} · "
            f"{req.get('devices')} local workers · {report.get('rounds')} round(s) of "
            f"{report.get('steps')} steps")


def ranking_figure(report: dict | None) -> go.Figure:
    """The scatter of ``report`` (``service.rank``); an empty, titled figure when no plan
    has a measured step."""
    rows = ran(report)
    if not rows:
        return empty_figure(FIRST, TITLE, height=300)
    values = [float(v) for r in rows
              for v in (r["predicted_step_s"], r["measured_step_s"], r.get("measured_min_s"))
              if v]
    unit, div = fmt.scale(max(values), fmt.TIME_UNITS)
    lo, hi = min(values) / div, max(values) / div
    log = lo > 0 and hi / lo > LOG_SPREAD
    fig = go.Figure()
    for fam in FAMILIES:
        mine = [r for r in rows if r["family"] == fam]
        if not mine:
            continue
        meas = [r["measured_step_s"] / div for r in mine]
        fig.add_trace(go.Scatter(
            x=[r["predicted_step_s"] / div for r in mine], y=meas,
            mode="markers+text", text=[r["method"] for r in mine],
            textposition="middle right", textfont=dict(size=11), cliponaxis=False,
            name=legend_name(fam, mine[0]["basis"]),
            marker=dict(color=P.FAMILY_COLORS[fam], size=11, line=dict(color="#fff", width=1)),
            # down to the fastest round: how far the rounds reached below their median
            error_y=dict(type="data", symmetric=False, array=[0.0] * len(mine),
                         arrayminus=[m - (r.get("measured_min_s") or r["measured_step_s"]) / div
                                     for m, r in zip(meas, mine)],
                         color=P.FAMILY_COLORS[fam], thickness=1.5, width=4),
            customdata=[[family_name(fam), fmt.seconds(r["predicted_step_s"]),
                         fmt.seconds(r["measured_step_s"]),
                         fmt.seconds(r.get("measured_min_s")),
                         f"{r['error'] * 100:+.0f} %" if r.get("error") is not None else "–"]
                        for r in mine],
            hovertemplate=("%{text} (%{customdata[0]})<br>predicted %{customdata[1]}"
                           "<br>measured %{customdata[2]} (median), min %{customdata[3]}"
                           "<br>error %{customdata[4]}<extra></extra>")))
    if log:
        lo_r, hi_r = math.log10(lo) - 0.15, math.log10(hi) + 0.25
        line = [10 ** lo_r, 10 ** hi_r]
    else:
        lo_r, hi_r = 0.0, hi * 1.2
        line = [lo_r, hi_r]
    fig.add_trace(go.Scatter(x=line, y=line, mode="lines", name=IDEAL_NAME,
                             line=dict(color=P.IDEAL, dash="dash", width=1.5),
                             hoverinfo="skip"))
    scale = "log" if log else "linear"
    ticks = log_ticks(lo_r, hi_r) if log else {}
    fig.update_xaxes(type=scale, range=[lo_r, hi_r], zeroline=False, **ticks,
                     title_text=f"predicted step ({unit}{', log scale' if log else ''})",
                     title_font=dict(size=12))
    fig.update_yaxes(type=scale, range=[lo_r, hi_r], zeroline=False, **ticks,
                     title_text=f"measured step ({unit}): median, bar to the min",
                     title_font=dict(size=12))
    report = report or {}
    sub = (f"Kendall τ {tau_text(report.get('kendall_tau'))} · regret "
           f"{regret_text(report.get('regret'))} · above the line: slower than predicted")
    fig.update_layout(
        title=dict(text=f"{TITLE}: {_request_line(report)}<br><sup>{sub}</sup>", x=0,
                   xanchor="left", xref="paper", y=1.0, yref="paper", yanchor="bottom",
                   pad=dict(b=14), font=dict(size=15)),
        template="plotly_white", height=HEIGHT, margin=MARGIN,
        legend=dict(orientation="h", x=0, xanchor="left",
                    y=-LEGEND_PX / (HEIGHT - MARGIN["t"] - MARGIN["b"]), yanchor="top",
                    font=dict(size=12)),
        hoverlabel=dict(align="left"))
    return fig


__all__ = ["TITLE", "FIRST", "IDEAL_NAME", "ran", "tau_text", "regret_text", "log_ticks",
           "ranking_figure"]

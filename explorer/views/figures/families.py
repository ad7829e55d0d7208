"""The comparison across families: every method of every family on one request, in one chart.

:func:`families_figure` takes the report ``service.compare_all`` returns (``{"request",
"rows", "best"}``) and draws three panels side by side that share one row per method, fastest
predicted at the top: the predicted step (with a stored run's measured step as a diamond beside
it), the peak memory on the fullest device, and the bytes moved per step.  Bars are coloured
by family, and each family's legend entry names what its prediction rests on (its ``basis``:
equation 1, the links plus the slowest compute, the simulated schedule), so bars of different
families are not read as one currency.  A plan that does not fit the devices' memory is
hatched; a method that cannot plan the model keeps its row with the reason.
"""

from __future__ import annotations

import math
import textwrap

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from explorer.views import fmt
from explorer.views import palette as P
from explorer.views.figures import empty_figure

#: the families in the order the chart's legend lists them, and their names there
FAMILIES = ("layerwise", "tofu", "placement")
FAMILY_NAMES = {"layerwise": "layer-wise", "tofu": "Tofu", "placement": "placement"}
TITLE = "Every family on one request"
#: what the figure says before the first comparison
FIRST = "Nothing compared yet: press Compare across families."
#: the three panels: (title, the row's field, the units its axis scales among)
PANELS = (("predicted step", "predicted_step_s", fmt.TIME_UNITS),
          ("peak memory per device", "peak_bytes", fmt.BYTE_UNITS),
          ("moved per step", "comm_bytes", fmt.BYTE_UNITS))
ROW_PX = 24
PLOT_PX = 20
LEGEND_PX = 62          # the legend's top, under the plot (below the axis titles)
MARGIN = dict(l=110, r=30, t=80, b=110)
#: the step panel turns logarithmic when its steps span more than this factor
LOG_SPREAD = 20.0


def family_name(fam: str) -> str:
    return FAMILY_NAMES.get(fam, fam)


def legend_name(fam: str, basis: str) -> str:
    """``"Tofu · links + slowest compute"``: a family and what its predictions rest on."""
    return f"{family_name(fam)} · {basis}"


def _axis_unit(rows: list, key: str, units) -> tuple:
    top = max([float(r.get(key) or 0.0) for r in rows]
              + [float(r.get("measured_step_s") or 0.0) for r in rows
                 if key == "predicted_step_s"] + [0.0])
    return fmt.scale(top, units)


def _request_line(req: dict) -> str:
    return (f"{req.get('model')} · batch {req.get('batch') or 'default'} · "
            f"{req.get('devices')} × {req.get('preset')}")


def families_figure(report: dict | None) -> go.Figure:
    """The chart of ``report`` (``service.compare_all``); an empty, titled figure without
    one."""
    rows = list((report or {}).get("rows") or [])
    if not rows:
        return empty_figure(FIRST, TITLE, height=260)
    ok = [r for r in rows if "failed" not in r]
    # one category per method, in the report's order (fastest predicted first) from the top
    cats = [r["method"] for r in rows]
    fig = make_subplots(rows=1, cols=3, shared_yaxes=True, horizontal_spacing=0.035,
                        column_widths=[0.42, 0.29, 0.29])
    scales = [_axis_unit(ok, key, units) for _, key, units in PANELS]
    for fam in FAMILIES:
        mine = [r for r in ok if r["family"] == fam]
        if not mine:
            continue
        color = P.FAMILY_COLORS[fam]
        name = legend_name(fam, mine[0]["basis"])
        for col, ((title, key, _), (unit, div)) in enumerate(zip(PANELS, scales), 1):
            xs = [float(r[key]) / div for r in mine]
            fig.add_trace(go.Bar(
                orientation="h", y=[r["method"] for r in mine], x=xs, name=name,
                legendgroup=fam, showlegend=col == 1,
                marker=dict(color=color, line=dict(color=color, width=1),
                            pattern=dict(shape=["x" if not r["fits_memory"] else ""
                                                for r in mine],
                                         fgcolor="#fff", solidity=0.3)),
                text=[fmt.seconds(r[key]) if key.endswith("_s") else fmt.bytes_(r[key])
                      for r in mine] if col == 1 else None,
                textposition="outside", cliponaxis=False, textfont=dict(size=11),
                customdata=[[family_name(fam), r["basis"],
                             "fits" if r["fits_memory"] else "does NOT fit memory"]
                            for r in mine],
                hovertemplate=(f"%{{y}} (%{{customdata[0]}})<br>{title}: %{{x:.3g}} {unit}"
                               + ("<br>predicted by %{customdata[1]}" if col == 1 else "")
                               + "<br>%{customdata[2]}<extra></extra>")),
                row=1, col=col)
    measured = [r for r in ok if r.get("measured_step_s")]
    if measured:
        unit, div = scales[0]
        fig.add_trace(go.Scatter(
            x=[r["measured_step_s"] / div for r in measured], y=[r["method"] for r in measured],
            mode="markers", name="measured step (stored run)",
            marker=dict(symbol="diamond", size=11, color=P.MEASURED,
                        line=dict(color="#fff", width=1)),
            customdata=[[fmt.seconds(r["predicted_step_s"]),
                         f"{r['error'] * 100:+.0f} %" if r.get("error") is not None else ""]
                        for r in measured],
            hovertemplate=(f"%{{y}}: measured %{{x:.3g}} {unit}<br>predicted "
                           "%{customdata[0]} (%{customdata[1]})<extra></extra>")),
            row=1, col=1)
    if any(not r["fits_memory"] for r in ok):     # the hatching, named once in the legend
        fig.add_trace(go.Bar(x=[None], y=[None], orientation="h", name="does not fit memory",
                             marker=dict(color="#bbb", pattern=dict(shape="x", fgcolor="#fff",
                                                                    solidity=0.3)),
                             hoverinfo="skip"), row=1, col=1)
    # the step panel: log when the steps (predicted and measured) span orders of magnitude
    steps = [float(v) / scales[0][1] for r in ok
             for v in (r["predicted_step_s"], r.get("measured_step_s")) if v]
    log = len(steps) > 1 and max(steps) / min(steps) > LOG_SPREAD
    if log:
        lo, hi = math.log10(min(steps)) - 0.15, math.log10(max(steps)) + 0.35
        fig.update_xaxes(type="log", range=[lo, hi], row=1, col=1)
    else:   # room on the right of the step bars for their labels
        lo = 0.0
        fig.update_xaxes(range=[0, (max(steps, default=0.0) or 1.0) * 1.3], row=1, col=1)
    failed = [r for r in rows if "failed" in r]
    if failed:                  # their rows exist on the axis (an annotation alone adds none)
        fig.add_trace(go.Scatter(x=[10 ** lo if log else 0] * len(failed),
                                 y=[r["method"] for r in failed], mode="markers",
                                 marker=dict(opacity=0), showlegend=False, hoverinfo="skip"),
                      row=1, col=1)
    for r in failed:
        fig.add_annotation(x=lo, xref="x", y=r["method"], yref="y", xanchor="left",
                           showarrow=False, font=dict(size=11, color=P.ERROR),
                           text="cannot plan: " + textwrap.shorten(str(r["failed"]), 70))
    for col, ((title, _, _), (unit, _)) in enumerate(zip(PANELS, scales), 1):
        fig.update_xaxes(title_text=f"{title} ({unit}{', log scale' if log and col == 1 else ''})",
                         title_font=dict(size=12), title_standoff=6, row=1, col=col)
        if col > 1:
            fig.update_xaxes(rangemode="tozero", row=1, col=col)
    fig.update_yaxes(type="category", categoryorder="array", categoryarray=cats[::-1],
                     tickfont=dict(size=12), row=1, col=1)
    req = (report or {}).get("request") or {}
    best = (report or {}).get("best")
    sub = ("bars: each family's own prediction (the legend says what it rests on); "
           "◆ a stored run's measured step"
           + (f" · fastest predicted that fits: {best}" if best else ""))
    fig.update_layout(
        # above the plot, inside the top margin: the toolbar (top right) is above the
        # plot's right end, the title's lines end before it
        title=dict(text=f"{TITLE}: {_request_line(req)}<br><sup>{sub}</sup>", x=0,
                   xanchor="left", xref="paper", y=1.0, yref="paper", yanchor="bottom",
                   pad=dict(b=14), font=dict(size=15)),
        template="plotly_white", barmode="overlay", bargap=0.25,
        height=PLOT_PX + MARGIN["t"] + MARGIN["b"] + ROW_PX * len(cats), margin=MARGIN,
        # under the axis titles, whatever the number of rows (``y`` is in plot heights)
        legend=dict(orientation="h", x=0, xanchor="left",
                    y=-LEGEND_PX / (PLOT_PX + ROW_PX * len(cats)), yanchor="top",
                    font=dict(size=12)),
        hoverlabel=dict(align="left"))
    return fig


__all__ = ["FAMILIES", "FAMILY_NAMES", "TITLE", "FIRST", "PANELS", "family_name",
           "legend_name", "families_figure"]

"""Compare figures: data / model / OWT / Megatron / layer-wise plans side by side (OptCNN
Section 6).

* :func:`time_figure` – predicted step time per strategy, stacked compute / transfer / sync (ms);
  transfer includes the reduce-scatters of row-parallel (``k``) layers;
* :func:`bytes_figure` – bytes communicated per step (MiB), transfer / sync (the paper's Fig. 8);
* :func:`scaling_figure` – throughput against device count with the linear ideal (Fig. 7).

Each takes the plain dicts ``session.compare`` / ``session.scaling`` return and an optional
``order`` (the service's comparison list, so the strategies appear in the paper's order).
"""

from __future__ import annotations

import math
import textwrap

import plotly.graph_objects as go

from explorer.views import palette as P

# what each strategy is, then the name the engine and ``explorer search --algo`` use
LABELS = {"data": "data parallel", "model": "model parallel", "owt": "one weird trick",
          "megatron": "Megatron-LM", "optcnn": "layer-wise"}
STRATEGY_COLORS = P.STRATEGY_COLORS
PART_COLORS = P.PART_COLORS
IDEAL_COLOR = P.IDEAL
MIB = 2.0 ** 20


def _order(results: dict, order: list | None = None) -> list:
    """Strategies in ``order`` (the paper's, from the service), then any others the engine
    returned; without ``order``, the results' own order."""
    order = list(results) if order is None else list(order)
    return [a for a in order if a in results] + [a for a in results if a not in order]


def label(algo: str, sep: str = "<br>") -> str:
    """``"layer-wise<br>(optcnn)"``: the strategy and its algorithm name (axis categories)."""
    return f"{LABELS[algo]}{sep}({algo})" if algo in LABELS else algo


def _wrap(msg: str, width: int = 28) -> str:
    return "<br>".join(textwrap.wrap(str(msg), width)) or "infeasible"


def _num(v: float) -> str:
    """A total for a bar label: 554.8, 12.35, 0.158."""
    if abs(v) >= 100:
        return f"{v:,.1f}"
    if abs(v) >= 1:
        return f"{v:.2f}"
    return f"{v:.3g}"


def _title(text: str) -> dict:
    """A title at the figure's top left; its second line (``<br><sup>…</sup>``) keeps it short
    enough that Plotly's toolbar, at the top right, never covers it."""
    return dict(text=text, x=0, xanchor="left", xref="paper", y=0.97, yanchor="top",
                font=dict(size=15))


def _base_layout(fig: go.Figure, title: str, ytitle: str, categories: list) -> go.Figure:
    fig.update_layout(title=_title(title), barmode="stack", template="plotly_white",
                      margin=dict(l=60, r=20, t=90, b=60), height=440,
                      legend=dict(orientation="h", yanchor="bottom", y=1.0, x=1, xanchor="right"),
                      yaxis_title=ytitle)
    fig.update_xaxes(type="category", categoryorder="array", categoryarray=categories,
                     range=[-0.5, len(categories) - 0.5])
    return fig


def _stacked(results: dict, parts: list, title: str, ytitle: str, unit: str, fmt: str,
             log_spread: float | None = None, order: list | None = None):
    """Stacked bars of ``parts`` [(name, color, fn(plan) -> value)] per strategy; infeasible
    strategies get an annotation with the engine's message instead of a bar."""
    algos = _order(results, order)
    cats = [label(a) for a in algos]
    ok = [a for a in algos if "error" not in results[a]]
    fig = go.Figure()
    for name, color, fn in parts:
        ys = [fn(results[a]) for a in ok]
        fig.add_trace(go.Bar(name=name, x=[label(a) for a in ok], y=ys, marker_color=color,
                             hovertemplate=f"%{{x}}<br>{name}: %{{y:{fmt}}} {unit}"
                                           "<extra></extra>"))
    totals = {a: sum(fn(results[a]) for _, _, fn in parts) for a in ok}
    top = max(totals.values(), default=0.0) or 1.0
    for a in algos:
        if a in totals:
            fig.add_annotation(x=label(a), y=totals[a], text=f"{_num(totals[a])} {unit}",
                               showarrow=False, yanchor="bottom", font=dict(size=12))
        else:
            fig.add_annotation(x=label(a), y=top * 0.5, text="infeasible:<br>"
                               + _wrap(results[a]["error"]), showarrow=False,
                               font=dict(size=10, color="#a33"), bgcolor="#fff4f4",
                               bordercolor="#e0b4b4", borderwidth=1, align="center")
    _base_layout(fig, title, ytitle, cats)
    fig.update_yaxes(range=[0, top * 1.15])
    positive = [v for v in totals.values() if v > 0]
    if log_spread and len(positive) > 1 and max(positive) / min(positive) > log_spread:
        _log_axis(fig, ytitle, min(positive), max(positive), top)
    return fig


def _log_axis(fig: go.Figure, ytitle: str, lo_v: float, hi_v: float, top: float) -> None:
    """Totals spanning orders of magnitude (model parallelism's activations): a log y axis by
    default, with buttons to switch to linear and back.  Annotations on a log axis are placed
    in log10 units, so each button moves them too."""
    lo, hi = math.log10(lo_v) - 0.3, math.log10(hi_v) + 0.3
    lin_y, log_y = [], []
    for an in fig.layout.annotations:
        lin_y.append(an.y)
        if an.text.startswith("infeasible"):
            log_y.append((lo + hi) / 2)
        else:
            log_y.append(math.log10(an.y) if an.y > 0 else lo)
    for an, y in zip(fig.layout.annotations, log_y):
        an.y = y

    def mode(kind, rng, ys, title):
        args = {"yaxis.type": kind, "yaxis.range": rng, "yaxis.title.text": title}
        args.update({f"annotations[{i}].y": y for i, y in enumerate(ys)})
        return dict(label=kind, method="relayout", args=[args])

    fig.update_yaxes(type="log", range=[lo, hi], title=ytitle + " (log scale)")
    fig.update_layout(updatemenus=[dict(
        type="buttons", direction="right", x=0, xanchor="left", y=1.0, yanchor="bottom",
        pad=dict(t=0, b=2, l=0, r=0), showactive=True, active=0, font=dict(size=11),
        buttons=[mode("log", [lo, hi], log_y, ytitle + " (log scale)"),
                 mode("linear", [0, top * 1.15], lin_y, ytitle)])])


def time_figure(results: dict, order: list | None = None) -> go.Figure:
    """Predicted step time (ms) per strategy from ``session.compare`` results, stacked compute /
    transfer (between layers, and the reduce-scatters of row-parallel layers) / sync with the
    total on top."""
    def part(*keys):
        return lambda p: sum(float((p.get("breakdown") or {}).get(k, 0.0)) for k in keys) * 1e3

    return _stacked(results, [("compute", PART_COLORS["compute"], part("compute_s")),
                              ("transfer", PART_COLORS["transfer"],
                               part("transfer_s", "reduce_s")),
                              ("sync", PART_COLORS["sync"], part("sync_s"))],
                    "Predicted step time per strategy<br><sup>lower is better</sup>", "step time (ms)",
                    "ms", ".3f", order=order)


def _xfer_bytes(p: dict) -> float:
    info = p.get("info") or {}
    if "transfer_bytes" in info:
        return float(info["transfer_bytes"]) + float(info.get("reduce_bytes", 0.0))
    return float(p.get("comm_bytes", 0.0)) - float(info.get("sync_bytes", 0.0))


def bytes_figure(results: dict, order: list | None = None) -> go.Figure:
    """Bytes communicated per step (MiB) per strategy, stacked transfer (t_X, between layers,
    and t_R, row-parallel reduce-scatters) and parameter synchronisation (t_S) – the paper's
    Figure 8."""
    return _stacked(results,
                    [("transfer", PART_COLORS["transfer"], lambda p: _xfer_bytes(p) / MIB),
                     ("sync", PART_COLORS["sync"],
                      lambda p: float((p.get("info") or {}).get("sync_bytes", 0.0)) / MIB)],
                    "Data communicated per step<br><sup>lower is better</sup>", "MiB per step", "MiB",
                    ",.1f", log_spread=20.0, order=order)


def scaling_figure(scaling: dict, order: list | None = None) -> go.Figure:
    """Throughput (samples/s) against device count for each strategy, with the linear ideal as
    a dashed red line – the paper's Figure 7.  ``None`` points (infeasible) are gaps.  Both
    axes are logarithmic, so the ideal is straight and the strategies' distance from it
    reads as a ratio."""
    xs = list(scaling.get("devices") or [])
    fig = go.Figure()
    for a in _order({k: v for k, v in scaling.items()
                     if k not in ("devices", "ideal", "per_device_batch") and isinstance(v, list)},
                    order):
        ys = scaling[a]
        missing = [n for n, y in zip(xs, ys) if y is None]
        name = label(a, " ")
        if missing:
            name += f" – infeasible at {', '.join(map(str, missing))}"
        fig.add_trace(go.Scatter(x=xs, y=ys, name=name, mode="lines+markers",
                                 line=dict(color=STRATEGY_COLORS.get(a)), connectgaps=False,
                                 hovertemplate=f"{label(a, ' ')}<br>%{{x}} devices: "
                                               "%{y:,.1f} samples/s<extra></extra>"))
    if scaling.get("ideal"):
        fig.add_trace(go.Scatter(x=xs, y=scaling["ideal"], name="linear ideal", mode="lines",
                                 line=dict(color=IDEAL_COLOR, dash="dash"),
                                 hovertemplate="ideal<br>%{x} devices: %{y:,.1f} samples/s"
                                               "<extra></extra>"))
    per = scaling.get("per_device_batch")
    title = "Predicted throughput vs devices (higher is better)"
    if per:
        title += f" – {per} sample{'s' if per != 1 else ''} per device"
    fig.update_layout(title=_title(title), template="plotly_white", height=440,
                      margin=dict(l=60, r=20, t=90, b=60),
                      legend=dict(orientation="h", yanchor="bottom", y=1.0, x=1, xanchor="right"),
                      yaxis_title="throughput (samples/s)", xaxis_title="devices")
    # log on both axes: the linear ideal (throughput ∝ devices) is a straight line
    fig.update_xaxes(type="log", tickvals=xs, ticktext=[str(x) for x in xs])
    fig.update_yaxes(type="log")
    return fig


def message_figure(text: str) -> go.Figure:
    """An empty figure carrying one centred message (before the first comparison, on errors)."""
    fig = go.Figure()
    fig.add_annotation(text=text, x=0.5, y=0.5, xref="paper", yref="paper", showarrow=False,
                       font=dict(size=14, color="#666"))
    fig.update_layout(template="plotly_white", height=420, xaxis_visible=False,
                      yaxis_visible=False, margin=dict(l=20, r=20, t=40, b=20))
    return fig


# ---- logic behind the callback (plain functions, called by tests) ---------------------------


__all__ = ["LABELS", "STRATEGY_COLORS", "PART_COLORS", "IDEAL_COLOR", "label", "time_figure",
           "bytes_figure", "scaling_figure", "message_figure"]

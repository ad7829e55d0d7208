"""Learn page figures: the papers' figures redrawn from the plain dicts the service computes
(``session.candidates``, ``tiles``, ``learn_*``, ``tofu_compare``, ``placement_compare``)."""

from __future__ import annotations

import math

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from explorer.views import palette as P

MIB = 2.0 ** 20                 # sizes in MiB, as everywhere in the app
#: legend under the plot, for figures whose subplot titles sit where a top legend would
_BOTTOM_LEGEND = dict(orientation="h", y=-0.18, x=0.5, xanchor="center")
#: the title on the figure's first line, the legend on its own line under it (a long title -
#: "Equation 2: eliminating mixed_5b_branch3x3dbl_2" - never runs under the legend)
_LAYOUT = dict(template="plotly_white", margin=dict(l=60, r=20, t=92, b=50), height=400,
               title=dict(x=0.01, xanchor="left", y=0.98, yanchor="top"),
               legend=dict(orientation="h", yanchor="bottom", y=1.02, x=0, xanchor="left"))


def config_label(config) -> str:
    """A configuration as the app writes it (``"c4"``, ``"n2 c2"``, ``"1"``), from a
    ``{dim: degree}`` dict or a label already; never a raw dict in a title.

    >>> config_label({"n": 1, "c": 4, "h": 1, "w": 1})
    'c4'
    """
    if isinstance(config, dict):
        return " ".join(f"{k}{v}" for k, v in config.items() if int(v) > 1) or "1"
    return str(config)


def _titled(fig: go.Figure, text: str, **layout) -> go.Figure:
    """``fig`` with the learn layout and ``text`` as its title (the layout's title place)."""
    fig.update_layout(**{**_LAYOUT, **layout})
    fig.update_layout(title_text=text)
    return fig


def _volume(box) -> int:
    v = 1
    for lo, hi in box:
        v *= max(int(hi) - int(lo), 0)
    return v


def config_times_figure(rows: list, selected: str | None = None) -> go.Figure:
    """OptCNN Figure 1: per-step time of one layer under each configuration on all the
    devices: t_C (compute) and t_S (parameter synchronisation), the selected one outlined."""
    rows = [r for r in rows if r.get("t_compute_ms") is not None]
    xs = [r["config"] for r in rows]
    line = [3 if x == selected else 0 for x in xs]
    fig = go.Figure([
        go.Bar(x=xs, y=[r["t_compute_ms"] for r in rows], name="t_C compute",
               marker=dict(color=P.PART_COLORS["compute"], line=dict(width=line, color="#111"))),
        go.Bar(x=xs, y=[r["t_sync_ms"] for r in rows], name="t_S parameter sync",
               marker=dict(color=P.PART_COLORS["sync"], line=dict(width=line, color="#111"))),
    ])
    _titled(fig, "Time of this layer per configuration (Figure 1)", barmode="stack",
            yaxis_title="ms per step", xaxis_title="configuration")
    fig.update_xaxes(type="category")       # configurations are names ("1", "n2"), not numbers
    return fig


def _fetched(inp: dict, i: int, k: int) -> int:
    """Elements of device ``i``'s input region that a data-parallel producer on the same ``k``
    devices (device ``i`` holding samples ``[i·N/k, (i+1)·N/k)``) does not hold there."""
    region = inp["regions"][i]
    if "n" not in inp["axes"]:
        return _volume(region)
    a = inp["axes"].index("n")
    n = inp["shape"][a]
    own = [list(r) for r in region]
    lo, hi = max(region[a][0], i * n // k), min(region[a][1], (i + 1) * n // k)
    own[a] = [lo, max(lo, hi)]
    return _volume(region) - _volume(own)


def device_reads_figure(tiles: dict) -> go.Figure:
    """OptCNN Figures 2 and 4: per device, the output elements it computes, the input
    elements it reads (its region of each input, halos included), the part of them it must
    fetch from other devices when the layer before is data-parallel, and its parameters."""
    devs = list(tiles["devices"])
    k = len(devs)
    names = [f"device {d}" for d in devs]
    out = [_volume(b) for b in tiles["boxes"]]
    reads = [sum(_volume(inp["regions"][i]) for inp in tiles["inputs"]) for i in range(k)]
    fetch = [sum(_fetched(inp, i, k) for inp in tiles["inputs"]) for i in range(k)]
    params = [sum(_volume(p["boxes"][i]) for p in tiles["params"].values()) for i in range(k)]
    fig = go.Figure()
    for label, ys, pattern in (("output tile it computes", out, ""),
                               ("input region it reads", reads, "/"),
                               ("of which it fetches (producer data-parallel)", fetch, "x"),
                               ("parameters it holds", params, ".")):
        fig.add_trace(go.Bar(x=names, y=ys, name=label,
                             marker=dict(color=[P.device_color(d) for d in devs],
                                         pattern_shape=pattern),
                             hovertemplate="%{x}: %{y:,} elements<extra>" + label + "</extra>"))
    _titled(fig, f"What each device computes and reads under {config_label(tiles['config'])}"
                 " (Figure 4)", barmode="group", yaxis_title="elements (float32: ×4 bytes)")
    return fig


def tile_map_figure(tiles: dict) -> go.Figure:
    """OptCNN Figure 4: how the output tensor is cut, one rectangle per device, drawn on the
    (sample, channel) plane and on the (height, width) plane of one sample."""
    axes = list(tiles["axes"])
    fig = make_subplots(rows=1, cols=2, subplot_titles=(
        "samples n × channels c", "height h × width w of sample 0, channel 0"))
    planes = ((("n", "c"), 1), (("h", "w"), 2))
    for (ya, xa), col in planes:
        if ya not in axes or xa not in axes:
            continue
        iy, ix = axes.index(ya), axes.index(xa)
        for k, (d, box) in enumerate(zip(tiles["devices"], tiles["boxes"])):
            if col == 2 and any(a in axes and box[axes.index(a)][0] != 0 for a in ("n", "c")):
                continue
            (y0, y1), (x0, x1) = box[iy], box[ix]
            fig.add_trace(go.Scatter(
                x=[x0, x1, x1, x0, x0], y=[y0, y0, y1, y1, y0], fill="toself", mode="lines",
                fillcolor=P.rgba(P.device_color(d), 0.55), line=dict(color="#333", width=1),
                name=f"device {d}", legendgroup=f"d{d}", showlegend=col == 1,
                hovertemplate=f"device {d}<br>{ya} {y0}:{y1}, {xa} {x0}:{x1}<extra></extra>"),
                row=1, col=col)
        fig.update_yaxes(title_text=ya, autorange="reversed", row=1, col=col)
        fig.update_xaxes(title_text=xa, row=1, col=col)
    fig.update_layout(**{**_LAYOUT, "height": 360, "margin": dict(l=60, r=20, t=40, b=50),
                         "legend": _BOTTOM_LEGEND})
    return fig


def dense_figure(doc: dict) -> go.Figure:
    """OptCNN Figure 2: bytes one fully-connected layer moves per step under data and under
    channel parallelism: gradient synchronisation against input transfers."""
    xs = [s["strategy"] + f" ({s['config']})" for s in doc["strategies"]]
    fig = go.Figure([
        go.Bar(x=xs, y=[s["sync_bytes"] / MIB for s in doc["strategies"]],
               name="parameter synchronisation", marker_color=P.PART_COLORS["sync"],
               texttemplate="%{y:,.1f} MiB", textposition="auto"),
        go.Bar(x=xs, y=[s["xfer_bytes"] / MIB for s in doc["strategies"]],
               name="input transfer", marker_color=P.PART_COLORS["transfer"],
               texttemplate="%{y:,.1f} MiB", textposition="auto"),
    ])
    _titled(fig, f"{doc['layer']} on {doc['devices']} devices: data moved per step",
            barmode="stack", yaxis_title="MiB per step")
    return fig


def elimination_figure(step: dict) -> go.Figure:
    """OptCNN equation 2 (node elimination: every c_j's four terms, the minimum marked) or
    equation 3 (edge elimination: the two merged edges and their sum), in microseconds."""
    us = 1e6
    if step["kind"] == "node":
        rows = step["rows"]
        xs = [r["config"] for r in rows]
        fig = go.Figure()
        for key, name, color in (("t_compute_s", "t_C(l_j, c_j)", P.PART_COLORS["compute"]),
                                 ("t_sync_s", "t_S(l_j, c_j)", P.PART_COLORS["sync"]),
                                 ("t_reduce_s", "t_R(l_j, c_j)", P.PREDICTED),
                                 ("t_x_in_s", "t_X(e1, c_i, c_j)", P.PART_COLORS["transfer"]),
                                 ("t_x_out_s", "t_X(e2, c_j, c_k)", "#f2c14e")):
            fig.add_trace(go.Bar(x=xs, y=[r[key] * us for r in rows], name=name,
                                 marker_color=color))
        best = rows[step["best"]]
        # x is the bar's position, not its name: on a categorical axis Plotly still reads an
        # annotation's x "1" as position 1 (the second bar), so the arrow missed configuration 1
        fig.add_annotation(x=step["best"], y=best["total_s"] * us, text="min: c_j*",
                           showarrow=True, arrowhead=2, ay=-40)
        _titled(fig, f"Equation 2: eliminating {step['node']}", barmode="stack",
                xaxis_title=f"c_j: configuration of {step['node']}", yaxis_title="µs")
        fig.update_xaxes(type="category")   # a configuration named "1" is a name, not x = 1
        return fig
    xs = ["t_X(e1, c_i, c_j)", "t_X(e2, c_i, c_j)", "t_X(e', c_i, c_j)"]
    ys = [step["t_x1_s"] * us, step["t_x2_s"] * us, step["value_s"] * us]
    fig = go.Figure(go.Bar(x=xs, y=ys, marker_color=[P.PART_COLORS["transfer"], "#f2c14e",
                                                     P.HIGHLIGHT],
                           texttemplate="%{y:,.2f} µs", textposition="auto"))
    _titled(fig, f"Equation 3: merging two edges {step['src']} → {step['dst']}",
            yaxis_title="µs", showlegend=False)
    return fig


def _short(name: str, n: int = 22) -> str:
    return name if len(name) <= n else "…" + name[-(n - 1):]


def elimination_diagram(step: dict) -> go.Figure:
    """OptCNN Figure 5: the step's part of the graph before and after - a node elimination
    replaces l_i → l_j → l_k by one edge e' = (l_i, l_k); an edge elimination merges two
    edges (l_i, l_j) into one.  Nodes carry the plan's configurations."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=("before", "after"),
                        horizontal_spacing=0.08)
    if step["kind"] == "node":
        before = [(step["src"], step["c_i"]), (step["node"], step["chosen"]),
                  (step["dst"], step["c_k"])]
        edges_b = [(0, 1, "e1", 0.0), (1, 2, "e2", 0.0)]
        after = [before[0], None, before[2]]
        edges_a = [(0, 2, "e'", 0.0)]
    else:
        before = [(step["src"], step["c_i"]), None, (step["dst"], step["c_j"])]
        edges_b = [(0, 2, "e1", 0.35), (0, 2, "e2", -0.35)]
        after = before
        edges_a = [(0, 2, "e'", 0.0)]
    for col, nodes, edges in ((1, before, edges_b), (2, after, edges_a)):
        xref, yref = ("x", "y") if col == 1 else ("x2", "y2")
        for a, b, label, bend in edges:
            xs = [a, (a + b) / 2, b]
            ys = [0, bend, 0]
            new = label == "e'"
            fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", line_shape="spline",
                                     line=dict(color=P.HIGHLIGHT if new else "#888",
                                               width=3 if new else 2,
                                               dash="dash" if new else "solid"),
                                     hoverinfo="skip", showlegend=False), row=1, col=col)
            fig.add_annotation(x=(a + b) / 2, y=bend + 0.12, text=label, showarrow=False,
                               xref=xref, yref=yref, font=dict(size=13))
        pts = [(i, n) for i, n in enumerate(nodes) if n is not None]
        colors = [P.ERROR if (step["kind"] == "node" and i == 1) else "#e8eef9" for i, _ in pts]
        fig.add_trace(go.Scatter(
            x=[i for i, _ in pts], y=[0] * len(pts), mode="markers+text",
            marker=dict(size=34, color=colors, line=dict(color="#333", width=1)),
            text=[c for _, (n, c) in pts], textfont=dict(size=10, color=[P.ink(c) for c in colors]),
            hovertext=[n for _, (n, c) in pts], hoverinfo="text", showlegend=False),
            row=1, col=col)
        for i, (n, _) in pts:
            fig.add_annotation(x=i, y=-0.42, text=_short(n), showarrow=False, xref=xref,
                               yref=yref, font=dict(size=11))
        fig.update_xaxes(visible=False, range=[-0.5, 2.5], row=1, col=col)
        fig.update_yaxes(visible=False, range=[-0.6, 0.6], row=1, col=col)
    fig.update_layout(**{**_LAYOUT, "height": 200, "margin": dict(l=20, r=20, t=30, b=10)})
    return fig


def intervals_figure(strategy: dict, shapes: dict) -> go.Figure:
    """Tofu Figures 1-2: the interval of every axis of each input a worker reads under one
    strategy (one row per worker and axis, the tensor's full extent in grey)."""
    inputs = list(strategy["reads"])
    fig = make_subplots(rows=1, cols=len(inputs), subplot_titles=[
        f"{n} {tuple(shapes[n])}" for n in inputs], horizontal_spacing=0.12)
    axes_names = {"data": ("b", "ci", "x+dx"), "filters": ("ci", "co", "dx")}
    for col, name in enumerate(inputs, 1):
        regs = strategy["reads"][name]["regions"]
        shape = shapes[name]
        labels = axes_names.get(name, tuple(f"axis {a}" for a in range(len(shape))))
        for w, box in enumerate(regs):
            for a, (lo, hi) in enumerate(box):
                y = f"worker {w} · {labels[a]}"
                fig.add_trace(go.Bar(y=[y], x=[shape[a]], base=[0], orientation="h",
                                     marker_color=P.UNOWNED_FILL, showlegend=False,
                                     hoverinfo="skip"), row=1, col=col)
                fig.add_trace(go.Bar(y=[y], x=[hi - lo], base=[lo], orientation="h",
                                     marker_color=P.device_color(w), name=f"worker {w}",
                                     legendgroup=f"w{w}", showlegend=(col == 1 and a == 0),
                                     hovertemplate=f"worker {w} reads {name}"
                                                   f"[{labels[a]}] {lo}:{hi}<extra></extra>"),
                              row=1, col=col)
        fig.update_yaxes(autorange="reversed", row=1, col=col)
        fig.update_xaxes(title_text="index", row=1, col=col)
    title = (f"split output {strategy['dim']}: workers concatenate" if strategy["kind"] == "split"
             else f"split reduction {strategy['dim']}: workers {strategy['reducer']} "
                  "partial outputs")
    _titled(fig, title, barmode="overlay", height=440, legend=_BOTTOM_LEGEND)
    return fig


def _cut_title(name: str, cut: int) -> str:
    return f"{name}: {cut} edge{'' if cut == 1 else 's'} cut"


def orders_figure(doc: dict) -> go.Figure:
    """Celeritas Figure 3: the DAG drawn chain by chain; in the first two panels nodes are
    coloured by the device each topological order sends them to, in the third by the
    cluster Optimal Operation Fusion puts them in; cut edges (communication) in red.  Node
    labels are positions in the order (CPD-TOPO for fusion)."""
    names = doc["names"]
    panels = []
    for k in ("M-TOPO", "DFS-TOPO"):
        if k in doc["orders"]:
            o = doc["orders"][k]
            panels.append((_cut_title(k, o["cut_edges"]), o["device"], o["order"],
                           P.device_color, "device"))
    if "fusion" in doc and "CPD-TOPO" in doc["orders"]:
        cluster = [0] * len(names)
        for c, members in enumerate(doc["fusion"]["clusters"]):
            for v in members:
                cluster[v] = c
        cut = sum(1 for a, b in zip(doc["src"], doc["dst"]) if cluster[a] != cluster[b])
        panels.append((_cut_title(f"fusion: {len(doc['fusion']['clusters'])} clusters", cut),
                       cluster, doc["orders"]["CPD-TOPO"]["order"],
                       lambda c: P.CONFIG_COLORS[c % len(P.CONFIG_COLORS)], "cluster"))
    fig = make_subplots(rows=1, cols=len(panels), subplot_titles=[p[0] for p in panels])
    rowname = [n.rstrip("0123456789") for n in names]
    chains = list(dict.fromkeys(rowname))
    pos = {}
    count: dict = {}
    for i, r in enumerate(rowname):
        pos[i] = (count.get(r, 0), chains.index(r))
        count[r] = count.get(r, 0) + 1
    for col, (_, group, order, color, what) in enumerate(panels, 1):
        rank = {v: i for i, v in enumerate(order)}
        for s, t in zip(doc["src"], doc["dst"]):
            cut = group[s] != group[t]
            fig.add_trace(go.Scatter(x=[pos[s][0], pos[t][0]], y=[pos[s][1], pos[t][1]],
                                     mode="lines", showlegend=False, hoverinfo="skip",
                                     line=dict(color=P.ERROR if cut else "#999",
                                               width=3 if cut else 1.5,
                                               dash="dash" if cut else "solid")),
                          row=1, col=col)
        for d in sorted(set(group)):
            idx = [i for i in range(len(names)) if group[i] == d]
            fig.add_trace(go.Scatter(
                x=[pos[i][0] for i in idx], y=[pos[i][1] for i in idx], mode="markers+text",
                marker=dict(size=26, color=color(d), line=dict(color="#333", width=1)),
                text=[str(rank[i] + 1) for i in idx], textfont=dict(color=P.ink(color(d))),
                name=f"{what} {d}", legendgroup=f"{what}{d}",
                showlegend=what == "device" and col == 1, customdata=[names[i] for i in idx],
                hovertemplate="%{customdata}: position %{text} in the order<extra>"
                              f"{what} {d}</extra>"), row=1, col=col)
        fig.update_xaxes(visible=False, row=1, col=col)
        fig.update_yaxes(visible=False, autorange="reversed", row=1, col=col)
    fig.update_layout(**{**_LAYOUT, "height": 340, "legend": _BOTTOM_LEGEND})
    return fig


def tofu_algorithms_figure(cmp: dict) -> go.Figure:
    """Tofu Figure 10: predicted time per step and bytes moved per step of each partition
    algorithm on the same model and devices (Tofu highlighted)."""
    algos = [a for a in cmp if "error" not in cmp[a]]
    fig = make_subplots(rows=1, cols=2, subplot_titles=("time per step (ms)",
                                                        "communication per step (MiB)"))
    colors = [P.HIGHLIGHT if a == "tofu" else P.PREDICTED for a in algos]
    fig.add_trace(go.Bar(x=algos, y=[cmp[a]["predicted_step_time_s"] * 1e3 for a in algos],
                         marker_color=colors, texttemplate="%{y:,.2f}", textposition="auto",
                         showlegend=False), row=1, col=1)
    fig.add_trace(go.Bar(x=algos, y=[cmp[a]["comm_bytes"] / MIB for a in algos],
                         marker_color=colors, texttemplate="%{y:,.1f}", textposition="auto",
                         showlegend=False), row=1, col=2)
    fig.update_layout(**_LAYOUT)
    return fig


def placement_algorithms_figure(rows: list) -> go.Figure:
    """Celeritas Tables 3-4 as bars: simulated step time and placement time per algorithm."""
    ok = [r for r in rows if "error" not in r]
    algos = [r["algo"] for r in ok]
    colors = [P.HIGHLIGHT if a == "celeritas" else (P.ERROR if r.get("oom") else P.PREDICTED)
              for a, r in zip(algos, ok)]
    fig = make_subplots(rows=1, cols=2, subplot_titles=("step time (ms) – Table 3",
                                                        "placement time (s) – Table 4"))
    fig.add_trace(go.Bar(x=algos, y=[r["step_time_s"] * 1e3 for r in ok], marker_color=colors,
                         texttemplate="%{y:,.2f}", textposition="auto", showlegend=False),
                  row=1, col=1)
    fig.add_trace(go.Bar(x=algos, y=[r["search_time_s"] for r in ok], marker_color=colors,
                         texttemplate="%{y:,.3f}", textposition="auto", showlegend=False),
                  row=1, col=2)
    fig.update_layout(**_LAYOUT)
    return fig


def _cut_text(step: dict) -> str:
    """One step's cut in words: the tensors' axes and the operators' strategies."""
    parts = []
    for kind, axes in step["tensors"].items():
        parts.append(f"{kind}: " + ", ".join(f"{n} {a}" for a, n in axes.items()))
    ops = ", ".join(f"{n} {k}" for k, n in step["ops"].items())
    return "<br>".join(parts + [f"operators: {ops}"])


def recursion_tree_figure(doc: dict) -> go.Figure:
    """Tofu Section 5.2 / Figure 6 as a tree: the workers (top) halved step by step, one row
    per recursion step, each group's devices written in it; the hover says the cut the step
    chose (one choice for every group) and the bytes it added."""
    from explorer.views import fmt
    steps = {s["step"]: s for s in doc["steps"]}
    colors = [P.rgba(P.HIGHLIGHT, 0.18)] + [P.rgba(P.FAMILY_COLORS["tofu"], 0.25 + 0.6 * i / 3)
                                            for i in range(1, 4)]
    labels, hover, fill = [], [], []
    for n in doc["tree"]:
        i = n["step"]
        if i == 0:
            labels.append(f"{doc['workers']} workers: {fmt.bytes_(doc['total_bytes'])}")
            hover.append(f"the whole graph on devices {n['devices']}<br>communication of the "
                         f"plan: {fmt.bytes_(doc['total_bytes'])} (Σ of the steps' bytes)")
        else:
            s = steps[i]
            one = n["workers"] == 1
            labels.append(f"{'device' if one else 'devices'} {n['devices']}<br>step {i}")
            hover.append(f"step {i} (×{s['k']}): {s['groups_before']} group(s) → "
                         f"{s['groups_after']}<br>adds {fmt.bytes_(s['delta_bytes'])} "
                         f"({fmt.bytes_(s['bytes_per_group'])} per parent group)<br>"
                         + _cut_text(s))
        fill.append(colors[min(i, len(colors) - 1)])
    fig = go.Figure(go.Icicle(
        ids=[n["id"] for n in doc["tree"]], parents=[n["parent"] for n in doc["tree"]],
        labels=labels, values=[n["workers"] for n in doc["tree"]], branchvalues="total",
        tiling=dict(orientation="v"), marker=dict(colors=fill, line=dict(color="#fff", width=2)),
        customdata=hover, hovertemplate="%{customdata}<extra></extra>",
        textinfo="label", insidetextfont=dict(size=13), maxdepth=-1, sort=False))
    rows = ", ".join(f"step {s['step']}: ×{s['k']}" for s in doc["steps"]) or "no step"
    _titled(fig, f"Recursion tree: {doc['workers']} workers, {rows}", height=360,
            margin=dict(l=10, r=10, t=50, b=10))
    return fig


def recursion_steps_figure(doc: dict) -> go.Figure:
    """The bytes each recursion step adds (bars, δ_i) and the total so far (line, the plan's
    communication at the last step), in the unit the largest calls for."""
    from explorer.views import fmt
    xs = [f"step {s['step']} (×{s['k']})" for s in doc["steps"]]
    unit, div = fmt.scale(max([doc["total_bytes"]] + [s["total_bytes"] for s in doc["steps"]]))
    fig = go.Figure([
        go.Bar(x=xs, y=[s["delta_bytes"] / div for s in doc["steps"]], name="bytes the step adds",
               marker_color=P.FAMILY_COLORS["tofu"], texttemplate="%{y:,.3g}",
               textposition="auto"),
        go.Scatter(x=xs, y=[s["total_bytes"] / div for s in doc["steps"]], name="total so far",
                   mode="lines+markers", line=dict(color=P.HIGHLIGHT)),
    ])
    _titled(fig, f"Bytes per step: total {fmt.bytes_(doc['total_bytes'])}",
            yaxis_title=f"{unit} per training step", height=360)
    return fig


def pipeline_figure(doc: dict) -> go.Figure:
    """Celeritas Figure 2 in numbers: the graph each stage works on (operators, then fused
    clusters, then the devices used) and the step time known after it (one device, the
    critical path, the placer's estimate, the simulated step)."""
    from explorer.views import fmt
    st = {s["stage"]: s for s in doc["stages"]}
    fig = make_subplots(rows=1, cols=2, column_widths=[0.5, 0.5], horizontal_spacing=0.26,
                        subplot_titles=("nodes each stage works on (log scale)",
                                        "step time (ms)"))
    stages = [s["stage"] for s in doc["stages"]]
    nodes = [s["nodes"] for s in doc["stages"]]
    what = {"Standard Evaluation": ("operator", "operators"),
            "CPD-TOPO": ("operator in order", "operators in order"),
            "Optimal Operation Fusion": ("cluster", "clusters"),
            "Adjusting Placement": ("device used", "devices used"),
            "refinement": ("device used", "devices used")}
    fig.add_trace(go.Bar(y=stages, x=nodes, orientation="h",
                         text=[f"{n:,} {what[s][n != 1]}" for s, n in zip(stages, nodes)],
                         textposition="auto", cliponaxis=False,
                         marker_color=P.FAMILY_COLORS["placement"],
                         hovertemplate="%{y}: %{text}<extra></extra>", showlegend=False),
                  row=1, col=1)
    fig.update_xaxes(type="log", range=[-0.1, 1.15 * math.log10(max(nodes + [10]))],
                     row=1, col=1)
    fig.update_yaxes(autorange="reversed", row=1, col=1)
    times = [("one device (Σ operators)", st["Standard Evaluation"]["time_s"]),
             ("critical path (edges cut)", st["CPD-TOPO"]["critical_path_s"]),
             ("placer's estimate", st["Adjusting Placement"]["placer_step_s"]),
             ("simulated: Adjusting Placement", st["Adjusting Placement"]["step_s"])]
    if "refinement" in st:
        times.append(("simulated: after refinement", st["refinement"]["step_s"]))
    fig.add_trace(go.Bar(y=[t[0] for t in times], x=[t[1] * 1e3 for t in times],
                         orientation="h", marker_color=[P.PREDICTED] * 3 + [P.HIGHLIGHT] *
                         (len(times) - 3), text=[fmt.seconds(t[1]) for t in times],
                         textposition="auto", hovertemplate="%{y}: %{text}<extra></extra>",
                         showlegend=False), row=1, col=2)
    fig.update_yaxes(autorange="reversed", row=1, col=2)
    _titled(fig, f"The Celeritas pipeline on {doc['model']}, {doc['devices']} devices",
            height=380, margin=dict(l=10, r=20, t=80, b=40))
    return fig


__all__ = ["config_times_figure", "device_reads_figure", "tile_map_figure", "dense_figure",
           "elimination_figure", "elimination_diagram", "intervals_figure", "orders_figure",
           "tofu_algorithms_figure", "placement_algorithms_figure", "recursion_tree_figure",
           "recursion_steps_figure", "pipeline_figure"]

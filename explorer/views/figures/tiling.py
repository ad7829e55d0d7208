"""Tiling figures: how one layer's tensors are tiled across devices, and all layers side by side.

Two figures, both drawn from plain dicts so they can be tested without a browser:

* :func:`tiling_figure` takes the geometry ``session.tiles(...)`` returns for one layer under
  its planned configuration and draws

  - the layer's **output** tensor, one grid per pair of axes (``n × c`` and ``h × w`` for a
    4-D activation, ``n × c`` for a 2-D one, ``n × l`` and ``l × c`` for ``[N, L, C]``), every
    tile filled with the colour of the device that owns it (paper Section 4, Figure 4).  A
    4-D tile grid seen through a 2-D pair of axes may put several devices on one cell (an
    ``h2 w2`` layer: every device holds all of ``n × c``); such cells are grey with a chip per
    owning device along their top edge and the devices in the label;
  - each **input** tensor, on the producer's tensor and under the producer's own tiling, with
    the region the selected device needs drawn as a dashed rectangle in its colour (or every
    device's region when the device is ``"all"``): a convolution's halo is the band of the
    dashed rectangle that reaches over the neighbour's tile.  When the input has the output's
    shape the layer's own tile boundaries are dotted over it, so the halo shows even when the
    producer did not split those axes;
  - each **weight** as a matrix ``[out, in]`` (first dimension against the product of the
    others); a shard several devices hold is labelled with its holders and replica count
    (``d0,d2 ×2``); vectors (bias, folded BatchNorm) with identical shards share one panel.

* :func:`strip_figure` takes the plan dict and draws every layer's output tiling as one small
  grid in plan order, like Tofu's Figure 11 (EuroSys 2019): rows/columns are the layer's two
  most-partitioned dimensions (a third partitioned dimension nests inside the columns, so every
  device still has exactly one cell), consecutive layers with the same op and configuration
  are folded into one block labelled ``×N``.  It is a handful of traces whatever the model
  size (one filled trace per device), so Inception's 125 layers draw in milliseconds.
"""

from __future__ import annotations

import math

import numpy as np
import plotly.graph_objects as go

from explorer.engine.core import geometry as G
from explorer.views import palette as P

# --------------------------------------------------------------------------------------------
# Colours (one palette for the whole app)
# --------------------------------------------------------------------------------------------

DEVICE_COLORS = P.DEVICE_COLORS
SHARED_FILL = P.SHARED_FILL
UNOWNED_FILL = P.UNOWNED_FILL
device_color = P.device_color
_ink = P.ink
_rgba = P.rgba
_FONT = "Segoe UI, Roboto, Helvetica, Arial, sans-serif"


# Plotly's per-property validation dominates building figures with hundreds of traces/shapes
# (64 devices × several panels); the dicts here are fixed by this module and checked with
# validation on in the tests, so figures are built without it.
VALIDATE = False


def _figure(data, layout) -> go.Figure:
    return go.Figure(data=data, layout=layout, _validate=VALIDATE)


def format_devices(devs, prefix: str = "d") -> str:
    """``[0, 2]`` -> ``"d0,d2"``; runs of three or more compress: ``[0..3, 6]`` -> ``"d0-3,d6"``."""
    devs = sorted(int(d) for d in devs)
    parts, i = [], 0
    while i < len(devs):
        j = i
        while j + 1 < len(devs) and devs[j + 1] == devs[j] + 1:
            j += 1
        if j - i >= 2:
            parts.append(f"{prefix}{devs[i]}-{devs[j]}")
            i = j + 1
        else:
            parts.append(f"{prefix}{devs[i]}")
            i += 1
    return ",".join(parts)


def _owners_label(owners, limit: int = 36) -> str:
    """Tile label for several owners: their ids, or just how many when that is too long."""
    text = format_devices(owners)
    return text if len(text) <= limit else f"{len(owners)} devices"


# --------------------------------------------------------------------------------------------
# Plan helpers (pure)
# --------------------------------------------------------------------------------------------


def plan_ok(plan) -> bool:
    return bool(plan) and isinstance(plan, dict) and not plan.get("error") and bool(
        plan.get("layers"))


def plan_message(plan) -> str:
    """Why there is nothing to draw (``""`` when the plan can be drawn)."""
    if not plan:
        return "No plan yet: choose a model and devices, then run a search."
    if isinstance(plan, dict) and plan.get("error"):
        return f"The search did not produce a plan: {plan['error']}"
    if not isinstance(plan, dict) or not plan.get("layers"):
        return "The plan has no layers to draw."
    return ""


# --------------------------------------------------------------------------------------------
# Geometry → 2-D panels (pure presentation)
# --------------------------------------------------------------------------------------------


def axis_pairs(rank: int) -> list:
    """Pairs of axes (row axis, column axis) that together show every axis of a tensor.

    ``4 -> [(0, 1), (2, 3)]``, ``3 -> [(0, 1), (1, 2)]``, ``2 -> [(0, 1)]``, ``1 -> [(0, None)]``.
    """
    if rank <= 0:
        return [(None, None)]
    if rank == 1:
        return [(0, None)]
    pairs = [(i, i + 1) for i in range(0, rank - 1, 2)]
    if rank % 2:
        pairs.append((rank - 2, rank - 1))
    return pairs


def _axis_name(axes, i) -> str:
    if i is None:
        return ""
    a = axes[i] if i < len(axes) else "-"
    return a if a != "-" else f"dim{i}"


def _range(box, i):
    if i is None:
        return (0, 1)
    return (int(box[i][0]), int(box[i][1]))


def _project(boxes, devices, pair):
    """Group devices whose boxes coincide on the pair of axes: [(rows, cols, [devices])]."""
    i, j = pair
    groups: dict = {}
    for box, d in zip(boxes, devices):
        key = (_range(box, i), _range(box, j))
        groups.setdefault(key, []).append(int(d))
    return [(r, c, owners) for (r, c), owners in groups.items()]


def _fmt_range(r) -> str:
    return f"[{r[0]}:{r[1]})"


def _box_text(box, axes) -> str:
    return " ".join(f"{_axis_name(axes, i)}{_fmt_range(box[i])}" for i in range(len(box)))


class _Panel:
    """One 2-D grid: tiles (rects with owners), dashed regions and outlines, axis sizes."""

    def __init__(self, title, ytitle, xtitle, ysize, xsize, section):
        self.title, self.ytitle, self.xtitle = title, ytitle, xtitle
        self.ysize, self.xsize = max(int(ysize), 1), max(int(xsize), 1)
        self.section = section
        self.tiles = []      # (rows, cols, owners, label, hover, replicated)
        self.regions = []    # (rows, cols, device, hover)
        self.outlines = []   # (rows, cols, color, dash, width)


def _tensor_panels(shape, axes, boxes, devices, section, head):
    """Panels for one tensor tiled by ``boxes`` (one per device in ``devices``)."""
    shape = list(shape) or [1]
    axes = list(axes) if axes else ["-"] * len(shape)
    panels = []
    for pair in axis_pairs(len(shape)):
        i, j = pair
        yname, xname = _axis_name(axes, i), _axis_name(axes, j)
        ysize = shape[i] if i is not None else 1
        xsize = shape[j] if j is not None else 1
        pair_txt = f"{yname} × {xname}" if xname else yname
        p = _Panel(f"{head} · {pair_txt}", f"{yname} ({ysize})" if yname else "",
                   f"{xname} ({xsize})" if xname else "", ysize, xsize, section)
        p.pair = pair
        p.pair_txt = pair_txt
        if boxes is None:
            p.tiles.append(((0, ysize), (0, xsize), [], "", "producer not in the plan", False))
        else:
            other = [_axis_name(axes, a) for a in range(len(shape)) if a not in pair]
            for rows, cols, owners in _project(boxes, devices, pair):
                if len(owners) == 1:
                    label = f"d{owners[0]}"
                    hover = f"device {owners[0]}"
                else:
                    label = _owners_label(owners)
                    hover = (f"devices {format_devices(owners, '')} each hold a part of this "
                             f"{pair_txt} range, split along {', '.join(other) or 'other axes'}")
                hover += f"<br>{yname}{_fmt_range(rows)}" + (
                    f" {xname}{_fmt_range(cols)}" if xname else "")
                p.tiles.append((rows, cols, owners, label, hover, False))
        panels.append(p)
    return panels


def _flat_cols(box, shape):
    """Column range of a box on a tensor drawn as ``[shape[0], prod(shape[1:])]`` (row-major
    bounding range; exact for the contiguous shards param_shards produces)."""
    if len(shape) <= 1:
        return (0, 1)
    rest = shape[1:]
    starts = [int(b[0]) for b in box[1:]]
    lasts = [int(b[1]) - 1 for b in box[1:]]
    if any(l < s for s, l in zip(starts, lasts)):
        return None
    lo = hi = 0
    for s, l, n in zip(starts, lasts, rest):
        lo, hi = lo * n + s, hi * n + l
    return (lo, hi + 1)


def _param_panels(params: dict, devices):
    """Weight panels: matrices [out, in] per parameter; identical vector params share one."""
    panels = []
    vectors: dict = {}
    for name, doc in params.items():
        shape = [int(s) for s in doc.get("shape", [])] or [1]
        boxes = doc.get("boxes", [])
        if not doc.get("shape"):
            boxes = [[[0, 1]] for _ in boxes]
        if len(shape) == 1:
            key = (tuple(shape), str(boxes))
            vectors.setdefault(key, {"names": [], "shape": shape, "boxes": boxes})
            vectors[key]["names"].append(name)
            continue
        panels.append(_weight_panel([name], shape, boxes, devices))
    for v in vectors.values():
        panels.append(_weight_panel(v["names"], v["shape"], v["boxes"], devices))
    return panels


def _short_param(name: str) -> str:
    return name if len(name) <= 22 else "…" + name[-21:]


def _weight_panel(names, shape, boxes, devices):
    out = shape[0]
    inn = math.prod(shape[1:]) if len(shape) > 1 else 1
    label_names = ", ".join(_short_param(n) for n in names[:3]) + (
        f" +{len(names) - 3}" if len(names) > 3 else "")
    dims = "·".join(map(str, shape[1:]))
    if len(shape) == 1:
        title = f"<b>weights</b> {label_names} [{out}]"
        xtitle = ""
    else:
        title = f"<b>weights</b> {label_names} [{out} × {dims}]"
        xtitle = f"in ({inn}{' = ' + dims if len(shape) > 2 else ''})"
    p = _Panel(title, f"out ({out})", xtitle, out, inn, "weights")
    p.pair_txt = "out × in"
    groups: dict = {}
    for box, d in zip(boxes, devices):
        rows = (int(box[0][0]), int(box[0][1]))
        cols = _flat_cols(box, shape)
        if cols is None or rows[1] <= rows[0]:
            continue
        groups.setdefault((rows, cols), []).append(int(d))
    for (rows, cols), owners in groups.items():
        if len(owners) == 1:
            label = f"d{owners[0]}"
            hover = f"device {owners[0]} holds this shard alone"
        else:
            label = f"{_owners_label(owners)} ×{len(owners)}"
            hover = (f"replicated ×{len(owners)} on devices {format_devices(owners, '')}: "
                     f"their gradients are synchronised (t_S)")
        hover += f"<br>out{_fmt_range(rows)}" + (f" in{_fmt_range(cols)}" if len(shape) > 1
                                                 else "")
        p.tiles.append((rows, cols, owners, label, hover, len(owners) > 1))
    return p


# --------------------------------------------------------------------------------------------
# Panels → figure
# --------------------------------------------------------------------------------------------


def _rect_path(xs, ys, x0, x1, y0, y1):
    xs.extend((x0, x1, x1, x0, x0, None))
    ys.extend((y0, y0, y1, y1, y0, None))


def _assemble(panels, title, selected, legend_devices):
    """Lay the panels out in a grid (sections start new rows) and build the figure."""
    sections = []
    for p in panels:
        if not sections or sections[-1][0] != p.section:
            sections.append((p.section, []))
        sections[-1][1].append(p)
    ncols = max(1, min(4, max(len(ps) for _, ps in sections)))
    slots = []   # (row, col) per panel, in order
    row = 0
    for _, ps in sections:
        for k, p in enumerate(ps):
            slots.append((row + k // ncols, k % ncols))
        row += math.ceil(len(ps) / ncols)
    nrows = row
    row_px, top_px, bottom_px = 250, 70, 20
    height = top_px + bottom_px + nrows * row_px
    hgap = 0.07 if ncols > 1 else 0.0
    col_w = (1.0 - hgap * (ncols - 1)) / ncols
    plot_h = nrows * row_px
    gap_frac = 90 / plot_h   # room for the next row's title and this row's x axis title
    row_h = 1.0 / nrows

    data, shapes, annotations = [], [], []
    layout = {}
    for n, (p, (r, c)) in enumerate(zip(panels, slots)):
        ax = "" if n == 0 else str(n + 1)
        xref, yref = f"x{ax}", f"y{ax}"
        x0 = c * (col_w + hgap)
        y_top = 1.0 - r * row_h
        dom_y = [max(y_top - row_h + gap_frac * 0.55, 0.0), y_top - gap_frac * 0.45]
        dom_x = [x0, x0 + col_w]
        p.xref, p.yref = xref, yref
        xt = sorted({v for t in p.tiles for v in t[1]} | {0, p.xsize})
        yt = sorted({v for t in p.tiles for v in t[0]} | {0, p.ysize})
        layout[f"xaxis{ax}"] = dict(
            domain=dom_x, anchor=yref, range=[0, p.xsize], showgrid=False, zeroline=False,
            title=dict(text=p.xtitle, font=dict(size=11), standoff=2), fixedrange=True,
            tickvals=xt if len(xt) <= 9 else None, tickfont=dict(size=9), tickformat="d",
            showticklabels=bool(p.xtitle), ticks="outside" if p.xtitle else "",
            mirror=True, showline=True, linecolor="#889")
        layout[f"yaxis{ax}"] = dict(
            domain=dom_y, anchor=xref, range=[p.ysize, 0], showgrid=False, zeroline=False,
            title=dict(text=p.ytitle, font=dict(size=11), standoff=2), fixedrange=True,
            tickvals=yt if len(yt) <= 9 else None, tickfont=dict(size=9), tickformat="d",
            mirror=True, showline=True, linecolor="#889")
        annotations.append(dict(text=p.title, xref="paper", yref="paper",
                                x=(dom_x[0] + dom_x[1]) / 2, y=dom_y[1], yanchor="bottom",
                                xanchor="center", showarrow=False, font=dict(size=12)))

        # tiles: one filled trace per (panel, colour); shared cells grey with owner chips
        paths: dict = {}
        tx, ty, tt, th = [], [], [], []
        for rows, cols, owners, label, hover, replicated in p.tiles:
            y0, y1 = rows
            xa, xb = cols
            dim = selected is not None and selected not in owners
            if len(owners) == 1:
                key = (owners[0], dim)
                _rect_path(*paths.setdefault(key, ([], [])), xa, xb, y0, y1)
            else:
                key = ("shared", dim)
                _rect_path(*paths.setdefault(key, ([], [])), xa, xb, y0, y1)
                if owners:
                    chip_h = (y1 - y0) * 0.14
                    w = (xb - xa) / len(owners)
                    for m, d in enumerate(owners):
                        chip_dim = selected is not None and d != selected
                        _rect_path(*paths.setdefault((d, chip_dim), ([], [])),
                                   xa + m * w, xa + (m + 1) * w, y0, y0 + chip_h)
            tx.append((xa + xb) / 2)
            ty.append((y0 + y1) / 2)
            tt.append(label)
            th.append(hover)
        # grey shared cells first, so the owner chips are drawn on top of them
        for (who, dim), (xs, ys) in sorted(paths.items(), key=lambda kv: (
                kv[0][0] != "shared", -1 if kv[0][0] == "shared" else kv[0][0], kv[0][1])):
            color = SHARED_FILL if who == "shared" else device_color(who)
            if who == "shared" and p.tiles and not p.tiles[0][2]:
                color = UNOWNED_FILL
            alpha = 0.28 if dim else 0.9
            lg = f"d{who}" if who != "shared" else "shared"
            data.append(dict(
                type="scatter", x=xs, y=ys, xaxis=xref, yaxis=yref, mode="lines",
                fill="toself", fillcolor=_rgba(color, alpha), line=dict(color="#fff", width=1),
                hoverinfo="skip", name=f"device {who}" if who != "shared" else "shared",
                legendgroup=lg, showlegend=False))
        n_tiles = len(tt)
        size = 12 if n_tiles <= 8 else 10 if n_tiles <= 24 else 8
        colors = []
        for rows, cols, owners, *_ in p.tiles:
            if len(owners) == 1 and (selected is None or selected in owners):
                colors.append(_ink(device_color(owners[0])))
            else:
                colors.append("#222")
        data.append(dict(type="scatter", x=tx, y=ty, xaxis=xref, yaxis=yref, mode="text",
                         text=tt if n_tiles <= 64 else [""] * n_tiles, hovertext=th,
                         hoverinfo="text", textfont=dict(size=size, color=colors),
                         showlegend=False, name="tiles", meta="tile-labels"))

        for rows, cols, color, dash_, width in p.outlines:
            shapes.append(dict(type="rect", xref=xref, yref=yref, x0=cols[0], x1=cols[1],
                               y0=rows[0], y1=rows[1], line=dict(color=color, dash=dash_,
                                                                 width=width),
                               fillcolor="rgba(0,0,0,0)", layer="above", name="outline"))
        # the regions each device reads: dashed outline (a shape), lightly shaded, with the
        # whole shaded box as the hover target (not a corner marker) and a label while few
        many = len(p.regions) > 4
        for rows, cols, d, hover in p.regions:
            color = device_color(d)
            shapes.append(dict(type="rect", xref=xref, yref=yref, x0=cols[0], x1=cols[1],
                               y0=rows[0], y1=rows[1],
                               line=dict(color=color, dash="dash", width=1.2 if many else 2.5),
                               fillcolor="rgba(0,0,0,0)", layer="above", name=f"region d{d}"))
            data.append(dict(type="scatter", xaxis=xref, yaxis=yref, mode="lines",
                             x=[cols[0], cols[1], cols[1], cols[0], cols[0]],
                             y=[rows[0], rows[0], rows[1], rows[1], rows[0]],
                             fill="toself", fillcolor=_rgba(color, 0.06 if many else 0.16),
                             line=dict(width=0), hoveron="fills", hoverinfo="name",
                             name=hover, showlegend=False, legendgroup=f"d{d}",
                             meta="needed region"))
            if not many:
                annotations.append(dict(
                    text=f"d{d} reads (halo: beyond its tile)", xref=xref, yref=yref,
                    x=cols[0], y=rows[0], xanchor="left", yanchor="top", showarrow=False,
                    font=dict(size=9, color=color), bgcolor="rgba(255,255,255,0.75)"))

    few = len(legend_devices) <= 8    # a short legend sits top-right, a long one on the right
    for d in sorted(legend_devices):  # legend entries in full colour (click: hide a device)
        data.append(dict(type="scatter", x=[None], y=[None], mode="markers",
                         marker=dict(symbol="square", size=11, color=device_color(d)),
                         name=f"device {d}", legendgroup=f"d{d}", showlegend=True,
                         hoverinfo="skip"))
    layout.update(
        title=dict(text=title, x=0.01, xanchor="left", font=dict(size=15)),
        height=height, margin=dict(l=55, r=20 if few else 100, t=top_px, b=bottom_px),
        shapes=shapes, annotations=annotations, plot_bgcolor="#fff", paper_bgcolor="#fff",
        font=dict(family=_FONT, size=11), hovermode="closest",
        legend=(dict(orientation="h", yanchor="bottom", y=1.0 + 8 / plot_h, x=1,
                     xanchor="right", font=dict(size=10), itemclick="toggle") if few else
                dict(orientation="v", yanchor="top", y=1.0, x=1.01, xanchor="left",
                     font=dict(size=10), itemclick="toggle", tracegroupgap=0)),
        meta={"panels": [{"section": p.section, "title": p.title, "pair": p.pair_txt,
                          "xaxis": p.xref, "yaxis": p.yref} for p in panels]})
    return _figure(data, layout)


def tiling_figure(geom: dict, device="all", producers: dict | None = None) -> go.Figure:
    """The tiles of one layer (``session.tiles`` output) under its configuration.

    ``device`` is ``"all"`` or a device id: that device's tiles stay bright, the others fade,
    its output tile and weight shards get a black outline and only its input regions are drawn.
    ``producers`` maps an input's source layer to ``{"boxes", "devices", "config_label"}``
    (its own output tiling, from ``session.tiles`` on the producer) so input regions are drawn
    over the producer's tiles; without it the input tensor is drawn untiled.
    ``fig.layout.meta["panels"]`` lists the panels (section, pair, axis ids) for callers/tests.
    """
    producers = producers or {}
    devices = [int(d) for d in geom.get("devices", [])] or [0]
    sel = None
    if device not in (None, "all", ""):
        try:
            sel = int(device)
        except (TypeError, ValueError):
            sel = None
    if sel is not None and sel not in devices:
        sel = None
    boxes = geom.get("boxes") or [[[0, s] for s in geom.get("shape", [])]]
    shape = geom.get("shape", [])
    axes = geom.get("axes", [])
    cfg = geom.get("config", {})
    cfg_label = " ".join(f"{k}{v}" for k, v in cfg.items() if v > 1) or "1"
    by_dev = {d: b for d, b in zip(devices, boxes)}

    panels = _tensor_panels(shape, axes, boxes, devices, "output",
                            f"<b>output</b> {list(shape)}")
    if sel is not None:
        for p in panels:
            b = by_dev[sel]
            p.outlines.append((_range(b, p.pair[0]), _range(b, p.pair[1]), "#111", "solid", 3))

    for inp in geom.get("inputs", []):
        src = inp["src"]
        prod = producers.get(src)
        pboxes = prod.get("boxes") if prod else None
        pdevs = prod.get("devices") if prod else []
        plabel = prod.get("config_label", "") if prod else "not in plan"
        head = f"<b>input</b> ← {src} ({plabel})"
        ipanels = _tensor_panels(inp["shape"], inp.get("axes", []), pboxes, pdevs, "inputs",
                                 head)
        same = list(inp["shape"]) == list(shape) and list(inp.get("axes", [])) == list(axes)
        held = {int(d): b for d, b in zip(pdevs or [], pboxes or [])}
        for p in ipanels:
            i, j = p.pair
            if same:  # this layer's own tile boundaries, so a halo shows as a band across them
                for b in boxes:
                    rows, cols = _range(b, i), _range(b, j)
                    if (rows, cols) != ((0, p.ysize), (0, p.xsize)):
                        p.outlines.append((rows, cols, "#555", "dot", 1))
            for d, reg in zip(devices, inp.get("regions", [])):
                if sel is not None and d != sel:
                    continue
                rows, cols = _range(reg, i), _range(reg, j)
                if rows[1] <= rows[0] or cols[1] <= cols[0]:
                    continue
                vol = int(G.volume(np.asarray(reg)))
                hover = (f"device {d} needs {_box_text(reg, inp.get('axes', []))}"
                         f"<br>{vol:,} elements")
                if d in held:
                    own = int(G.overlap(np.asarray(reg), np.asarray(held[d])))
                    hover += f", {own:,} already on device {d}, {vol - own:,} received"
                p.regions.append((rows, cols, d, hover))
        panels.extend(ipanels)

    wpanels = _param_panels(geom.get("params", {}), devices)
    if sel is not None:
        for p in wpanels:
            for rows, cols, owners, *_ in p.tiles:
                if sel in owners:
                    p.outlines.append((rows, cols, "#111", "solid", 3))
    panels.extend(wpanels)

    name = geom.get("layer", "?")
    title = (f"{name} ({geom.get('op', '?')}) · {cfg_label} on devices "
             f"{format_devices(devices, '')}")
    if sel is not None:
        title += f" · device {sel}: solid = its tiles, dashed = input it needs"
    elif geom.get("inputs"):
        title += " · dashed = input each device needs"
    legend = set(devices) | {int(d) for prod in producers.values()
                             for d in (prod.get("devices") or [])}
    return _assemble(panels, title, sel, legend)


# --------------------------------------------------------------------------------------------
# Strip of all layers (Tofu Figure 11 style)
# --------------------------------------------------------------------------------------------


def strip_blocks(plan) -> list:
    """Plan layers folded into blocks: consecutive layers with the same op, configuration and
    devices become one block ``{"names", "op", "config", "config_label", "devices", "count"}``."""
    if not plan_ok(plan):
        return []
    blocks = []
    for la in plan["layers"]:
        cfg = {k: int(v) for k, v in la.get("config", {}).items()}
        devs = [int(d) for d in la.get("devices", [])]
        op = la.get("op", "?")
        if blocks and blocks[-1]["op"] == op and blocks[-1]["config"] == cfg and \
                blocks[-1]["devices"] == devs and list(blocks[-1]["config"]) == list(cfg):
            blocks[-1]["names"].append(la["name"])
            blocks[-1]["count"] += 1
            blocks[-1]["t_compute_s"] += float(la.get("t_compute_s", 0.0) or 0.0)
            continue
        blocks.append({"names": [la["name"]], "op": op, "config": cfg,
                       "config_label": la.get("config_label") or (
                           " ".join(f"{k}{v}" for k, v in cfg.items() if v > 1) or "1"),
                       "devices": devs, "count": 1,
                       "t_compute_s": float(la.get("t_compute_s", 0.0) or 0.0)})
    return blocks


def strip_grid(config: dict, devices: list):
    """The small grid of one layer: ``(row_letters, col_letters, cells)`` where ``cells[r][c]``
    is the device owning that tile.

    Rows and columns are the two most-partitioned dimensions (ties: axis order; the earlier
    axis goes on the rows, as Tofu draws batch vertically and channels horizontally).  A single
    partitioned ``n`` or ``h`` goes on the rows, any other on the columns.  Further partitioned
    dimensions nest inside the columns, so each device has exactly one cell.  Tile ``k`` of the
    configuration (row-major over the axis order, last letter fastest — geometry.Config) belongs
    to ``devices[k]``.
    """
    letters = list(config)
    parted = [k for k in letters if int(config[k]) > 1]
    ranked = sorted(parted, key=lambda k: (-int(config[k]), letters.index(k)))
    top = sorted(ranked[:2], key=letters.index)
    if len(top) == 2:
        rows, cols = [top[0]], [top[1]]
    elif len(top) == 1:
        rows, cols = ([top[0]], []) if top[0] in ("n", "h") else ([], [top[0]])
    else:
        rows, cols = [], []
    cols += [k for k in ranked[2:]]
    tiles = G.owner_grid([int(config[k]) for k in letters], [letters.index(k) for k in rows],
                         [letters.index(k) for k in cols])
    cells = [[int(devices[k]) if k < len(devices) else None for k in line]
             for line in tiles.tolist()]
    return rows, cols, cells


def _short(name: str, n: int = 15) -> str:
    return name if len(name) <= n else name[: n - 1] + "…"


def message_figure(text: str, height: int = 140) -> go.Figure:
    return go.Figure(layout=dict(
        height=height, xaxis=dict(visible=False), yaxis=dict(visible=False),
        plot_bgcolor="#fff", paper_bgcolor="#fff", margin=dict(l=10, r=10, t=10, b=10),
        annotations=[dict(text=text, x=0.5, y=0.5, xref="paper", yref="paper",
                          showarrow=False, font=dict(size=13, color="#667"))]))


def strip_figure(plan: dict, selected: str | None = None, per_row: int = 12) -> go.Figure:
    """Every layer's output tiling as a small grid, in plan order, repeats folded (``×N``).

    One filled trace per device colour (cells of all blocks), one line trace for block
    borders, one text trace for the labels and one invisible marker per block carrying the
    block's first layer name as ``customdata`` (so a click selects it).  ``selected`` (a layer
    name) gets a thick outline around its block.
    """
    if not plan_ok(plan):
        return message_figure(plan_message(plan))
    blocks = strip_blocks(plan)
    per_row = max(1, min(per_row, len(blocks)))
    pitch_x, pitch_y, size = 1.55, 1.95, 1.0
    paths: dict = {}
    bx_, by_ = [], []
    lx, ly, lt, cx, cy, cd, ch = [], [], [], [], [], [], []
    ex, ey, et = [], [], []     # the dimension letters along each thumbnail's edges
    shapes = []
    for b_i, blk in enumerate(blocks):
        r_i, c_i = divmod(b_i, per_row)
        x0, y0 = c_i * pitch_x, r_i * pitch_y
        rows, cols, cells = strip_grid(blk["config"], blk["devices"])
        nr, nc = len(cells), len(cells[0]) if cells else 1
        h, w = size / nr, size / nc
        for r, line in enumerate(cells):
            for c, d in enumerate(line):
                _rect_path(*paths.setdefault(d, ([], [])), x0 + c * w, x0 + (c + 1) * w,
                           y0 + r * h, y0 + (r + 1) * h)
        _rect_path(bx_, by_, x0, x0 + size, y0, y0 + size)
        # which dimensions the rows and columns split: n4 c4 and h4 w4 draw the same 4×4
        # grid, the letters on the edges tell them apart
        if rows:
            ex.append(x0 - 0.1)
            ey.append(y0 + size / 2)
            et.append("×".join(rows))
        if cols:
            ex.append(x0 + size / 2)
            ey.append(y0 - 0.09)
            et.append("×".join(cols))
        first = blk["names"][0]
        name = _short(first)
        extra = f" ×{blk['count']}" if blk["count"] > 1 else ""
        lx.append(x0 + size / 2)
        ly.append(y0 + size + 0.09)
        lt.append(f"{name}<br>{blk['op']} · <b>{blk['config_label']}{extra}</b>")
        cx.append(x0 + size / 2)
        cy.append(y0 + size / 2)
        cd.append(first)
        names = blk["names"]
        span = names[0] if len(names) == 1 else f"{names[0]} … {names[-1]} ({len(names)} layers)"
        ch.append(f"<b>{span}</b><br>{blk['op']} · {blk['config_label']} on devices "
                  f"{format_devices(blk['devices'], '')}<br>rows: {'×'.join(rows) or '—'}, "
                  f"columns: {'×'.join(cols) or '—'}<br>t_C {blk['t_compute_s'] * 1e3:.3f} ms"
                  f"<br>click to show its tiles")
        if selected is not None and selected in names:
            shapes.append(dict(type="rect", x0=x0 - 0.06, x1=x0 + size + 0.06, y0=y0 - 0.06,
                               y1=y0 + size + 0.05, line=dict(color="#111", width=3),
                               fillcolor="rgba(0,0,0,0)", layer="above"))
    data = []
    for d in sorted(paths, key=lambda v: (v is None, v if v is not None else 0)):
        xs, ys = paths[d]
        color = SHARED_FILL if d is None else device_color(d)
        data.append(dict(type="scatter", x=xs, y=ys, mode="lines", fill="toself",
                         fillcolor=color, line=dict(color="#fff", width=0.8), hoverinfo="skip",
                         name=f"device {d}", legendgroup=f"d{d}", showlegend=len(paths) <= 8))
    data.append(dict(type="scatter", x=bx_, y=by_, mode="lines", hoverinfo="skip",
                     line=dict(color="#445", width=1), showlegend=False, name="blocks"))
    data.append(dict(type="scatter", x=lx, y=ly, mode="text", text=lt,
                     textposition="bottom center", textfont=dict(size=10, color="#223"),
                     hoverinfo="skip", showlegend=False, name="labels", meta="strip-labels"))
    data.append(dict(type="scatter", x=ex, y=ey, mode="text", text=et,
                     textfont=dict(size=9, color="#556"), hoverinfo="skip", showlegend=False,
                     name="dimensions", meta="strip-dimensions"))
    data.append(dict(type="scatter", x=cx, y=cy, mode="markers", customdata=cd,
                     hovertext=ch, hoverinfo="text", showlegend=False, name="blocks-hover",
                     marker=dict(size=30, symbol="square", color="rgba(0,0,0,0)")))
    nrows = math.ceil(len(blocks) / per_row)
    width_u = per_row * pitch_x
    height_u = nrows * pitch_y
    n_layers = len(plan["layers"])
    title = (f"All {n_layers} layers in plan order ({len(blocks)} blocks; consecutive layers with "
             f"the same op and configuration folded as ×N)")
    layout = dict(
        title=dict(text=title, x=0.01, xanchor="left", font=dict(size=13)),
        height=int(60 + nrows * 150), margin=dict(l=10, r=10, t=50, b=10),
        xaxis=dict(visible=False, range=[-0.3, width_u - pitch_x + size + 0.3], fixedrange=True),
        yaxis=dict(visible=False, range=[height_u - 0.2, -0.15], fixedrange=True,
                   scaleanchor="x", scaleratio=1),
        plot_bgcolor="#fff", paper_bgcolor="#fff", shapes=shapes, hovermode="closest",
        font=dict(family=_FONT, size=10), dragmode=False,
        legend=dict(orientation="h", yanchor="bottom", y=1.0, x=1, xanchor="right",
                    font=dict(size=10)),
        meta={"blocks": len(blocks)})
    return _figure(data, layout)


# --------------------------------------------------------------------------------------------
# Layout and callbacks
# --------------------------------------------------------------------------------------------


__all__ = ["DEVICE_COLORS", "device_color", "format_devices", "plan_ok", "plan_message",
           "axis_pairs", "tiling_figure", "strip_blocks", "strip_grid", "strip_figure",
           "message_figure"]

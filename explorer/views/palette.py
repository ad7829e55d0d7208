"""Every colour the app draws with, in one place.

Device ``d`` has one colour everywhere (:func:`device_color`): the layer-wise tiling grids,
Tofu's worker strips, the placement graph, Gantt chart and memory bars, and the run charts.
Layer configurations (the layer-wise graph's node colours) come from a separate, lighter
family (:data:`CONFIG_COLORS`) that shares no colour with the devices, so a configuration is
never mistaken for a device.  Colours that carry a meaning of their own (predicted against
measured, the compare page's strategies, errors) are named constants here too.
"""

from __future__ import annotations

import zlib

import plotly.express as px


def _hex(color: str) -> str:
    """``"rgb(1, 2, 3)"`` or ``"#ABCDEF"`` -> ``"#abcdef"``."""
    c = color.strip().lower()
    if c.startswith("rgb"):
        r, g, b = (int(float(v)) for v in c[c.index("(") + 1:c.index(")")].split(",")[:3])
        return f"#{r:02x}{g:02x}{b:02x}"
    return c


def _grey(h: str) -> bool:
    r, g, b = (int(h[i:i + 2], 16) for i in (1, 3, 5))
    return max(r, g, b) - min(r, g, b) < 24


def _unique(*families, exclude=(), n=None) -> tuple:
    """Distinct, non-grey colours of ``families`` in order, none of them in ``exclude``."""
    out, seen = [], {_hex(c) for c in exclude}
    for fam in families:
        for c in fam:
            h = _hex(c)
            if h not in seen and not _grey(h):
                seen.add(h)
                out.append(h)
    return tuple(out[:n] if n else out)


def distance(a: str, b: str) -> float:
    """Euclidean distance of two colours in RGB (0-441): how far apart they look, roughly."""
    x, y = _hex(a).lstrip("#"), _hex(b).lstrip("#")
    return sum((int(x[i:i + 2], 16) - int(y[i:i + 2], 16)) ** 2 for i in (0, 2, 4)) ** 0.5


_Q = px.colors.qualitative
#: Tableau 10 first, then distinct saturated colours (64 in all)
DEVICE_COLORS = _unique(("#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f",
                         "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#86bcb6"),
                        _Q.Dark24, _Q.Alphabet, _Q.D3, _Q.G10, _Q.Light24, _Q.Plotly, n=64)
def _spread(colors, apart: float) -> tuple:
    """``colors`` in order, dropping each within ``apart`` (RGB distance) of one kept."""
    out: list = []
    for c in colors:
        if all(distance(c, k) >= apart for k in out):
            out.append(c)
    return tuple(out)


#: light colours for layer configurations, none of them a device colour, no two alike
CONFIG_COLORS = _spread(_unique(_Q.Set3, _Q.Pastel1, _Q.Pastel2, _Q.Pastel,
                                exclude=DEVICE_COLORS), 40)
#: two configurations of one plan are drawn at least this far apart (RGB) while colours allow
CONFIG_APART = 60.0

SHARED_FILL = "#d9dce1"     # a tile several devices hold (replica, or split along other axes)
UNOWNED_FILL = "#f1f2f4"    # an input tensor whose producer is not in the plan
UNKNOWN = "#cccccc"         # a node without a configuration
PREDICTED = "#9aabbb"       # the model's prediction next to a measurement
MEASURED = "#2563eb"        # a measurement
HIGHLIGHT = "#2563eb"       # the method a comparison is about
ERROR = "#d62728"           # over capacity, OOM, an impossible pin
IDEAL = "#d62728"           # linear-scaling ideal
#: the elimination stepper's highlights (borders and halos on the graph): dark, saturated
#: colours far from every light configuration colour, each named in the steps legend
STEP_COLORS = {"current": "#8e0038", "nbr": "#6b3fa0", "residual": "#00524a",
               "assigned": "#0b3d91"}
STRATEGY_COLORS = {"data": "#4c78a8", "model": "#f58518", "owt": "#54a24b", "megatron": "#9d755d",
                   "optcnn": "#b279a2"}
PART_COLORS = {"compute": "#4c78a8", "transfer": "#f58518", "sync": "#54a24b"}
#: one colour per method family in the comparison across families (none of them a part colour
#: of the layer-wise comparison drawn in the same tab)
FAMILY_COLORS = {"layerwise": "#7b5ea7", "tofu": "#c98a12", "placement": "#2a9d8f"}


def device_color(d: int) -> str:
    """The colour of device (worker) ``d``, the same in every figure and graph."""
    return DEVICE_COLORS[int(d) % len(DEVICE_COLORS)]


def config_colors(labels) -> dict:
    """A colour per configuration label, stable across plans (a pin does not repaint the rest
    of the graph): the label's hash picks the slot, collisions take the next free one."""
    labels = sorted(set(labels), key=lambda s: (s.count(" "), s))
    n = len(CONFIG_COLORS)
    used: set = set()
    out = {}
    for lab in labels:
        slot = zlib.crc32(lab.encode()) % n
        ring = [(slot + k) % n for k in range(n)]
        free = [i for i in ring if i not in used]
        apart = [i for i in free
                 if all(distance(CONFIG_COLORS[i], CONFIG_COLORS[u]) >= CONFIG_APART
                        for u in used)]
        if apart:
            cand = apart[0]
        elif free:      # none far enough: the free colour farthest from those used
            cand = max(free, key=lambda i: min((distance(CONFIG_COLORS[i], CONFIG_COLORS[u])
                                                for u in used), default=0.0))
        else:
            cand = slot
        used.add(cand)
        out[lab] = CONFIG_COLORS[cand]
    return out


def ink(color: str) -> str:
    """Black or white text, whichever reads better on ``color``."""
    c = _hex(color).lstrip("#")
    if len(c) != 6:
        return "#111"
    r, g, b = (int(c[i:i + 2], 16) for i in (0, 2, 4))
    return "#111" if 0.299 * r + 0.587 * g + 0.114 * b > 150 else "#fff"


def rgba(color: str, alpha: float) -> str:
    """``color`` with opacity ``alpha`` as a CSS ``rgba(...)``."""
    c = _hex(color).lstrip("#")
    r, g, b = (int(c[i:i + 2], 16) for i in (0, 2, 4))
    return f"rgba({r},{g},{b},{alpha:.2f})"


__all__ = ["DEVICE_COLORS", "CONFIG_COLORS", "device_color", "config_colors", "ink", "rgba",
           "SHARED_FILL", "UNOWNED_FILL", "UNKNOWN", "PREDICTED", "MEASURED", "HIGHLIGHT",
           "ERROR", "IDEAL", "STRATEGY_COLORS", "PART_COLORS", "FAMILY_COLORS", "STEP_COLORS",
           "distance"]

"""The frame every Learn scenario shares: a few sentences, controls, our figure computed live,
the paper's numbers beside ours, and a link opening the scenario in the explorer."""

from __future__ import annotations

from dash import dcc, html

from explorer.views import glossary as G
from explorer.views import ids, state
from explorer.views.figures.compare import message_figure


def table(header: tuple, rows: list, class_name: str = "learn-table") -> html.Table:
    """A small HTML table (header row, then rows of cells)."""
    return html.Table(className=class_name, children=[
        html.Thead(html.Tr([html.Th(h) for h in header])),
        html.Tbody([html.Tr([html.Td(str(c)) for c in r]) for r in rows])])


def control(label: str, component, wide: bool = False) -> html.Label:
    return html.Label(className="learn-control" + (" learn-wide" if wide else ""),
                      children=[html.Span(label), component])


def number(key: str, part: str, value: int, lo: int, hi: int, step: int = 1):
    return dcc.Input(id=ids.learn(key, part), type="number", value=value, min=lo, max=hi,
                     step=step, debounce=True, className="learn-number")


def choice(key: str, part: str, options, value, clearable: bool = False):
    opts = [o if isinstance(o, dict) else {"label": str(o), "value": o} for o in options]
    return dcc.Dropdown(id=ids.learn(key, part), options=opts, value=value,
                        clearable=clearable, className="learn-dropdown")


def graph(key: str, part: str = "fig", modebar: bool = True):
    return dcc.Graph(id=ids.learn(key, part), figure=message_figure("computing…"),
                     config={"displaylogo": False, "displayModeBar": "hover" if modebar
                             else False},
                     className="learn-figure")


def frame(key: str, title: str, text: list, controls: list, figures: list, paper) -> html.Section:
    """One scenario: ``text`` paragraphs, ``controls``, ``figures`` with our numbers under them
    (``learn-<key>-ours``, filled by the scenario's callback) and the paper's numbers
    (``paper``, static: what the paper reports)."""
    return html.Section(className="learn-scenario", id=ids.learn(key, "section"), children=[
        html.H2(title),
        *[html.P(G.explain(t) if isinstance(t, str) else t, className="learn-text")
          for t in text],
        html.Div(className="learn-controls", children=controls),
        html.Div(className="learn-columns", children=[
            html.Div(className="learn-ours", children=[
                html.H3("Our engine, computed now"),
                dcc.Loading(children=[*figures,
                                      html.Div(id=ids.learn(key, "ours"),
                                               className="learn-numbers")]),
            ]),
            html.Aside(className="learn-paper", id=ids.learn(key, "paper"), children=[
                html.H3("The paper"), *paper]),
        ]),
        html.Div(id=ids.learn(key, "error"), className="learn-error"),
        dcc.Link("Open this scenario in the explorer →", id=ids.learn(key, "link"), href="/",
                 className="learn-link"),
    ])


def explorer_href(model: str, devices: int, preset: str, algo: str, batch=None,
                  model_args: dict | None = None, pins: list | None = None) -> str:
    """The main page's URL for this request (the explorer opens exactly that state)."""
    doc = {"model": model, "devices": devices, "preset": preset, "algo": algo,
           "batch": batch, "model_args": dict(model_args or {}), "pins": list(pins or [])}
    return "/" + state.query_string(doc)


def fmt_bytes(b: float) -> str:
    """Bytes in the app's one unit system (KiB, MiB, GiB: :func:`explorer.views.fmt.bytes_`),
    so the Learn page and the explorer say the same number the same way."""
    from explorer.views import fmt
    return fmt.bytes_(b)


def fmt_time(s: float) -> str:
    if s is None:
        return "–"
    if abs(s) >= 1:
        return f"{s:,.3f} s"
    if abs(s) >= 1e-3:
        return f"{s * 1e3:,.3f} ms"
    return f"{s * 1e6:,.2f} µs"

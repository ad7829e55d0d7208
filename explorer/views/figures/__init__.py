"""Figures of the app's panels: one module per panel that draws plotly figures.

Every public function here is pure: plain data in (the dicts and lists ``explorer.service``
returns), a ``plotly.graph_objects.Figure`` out.  Colours come only from
:mod:`explorer.views.palette`, so device 3 has one colour in every figure.  Nothing here
registers a Dash callback, names a component id or calls the service: the panel modules
(``explorer/views/<panel>.py``) fetch the data in their thin callbacks and hand it over,
and tests build figures without a browser or a session.
"""

import plotly.graph_objects as go


def empty_figure(text: str, title: str | None = None, height: int | None = None) -> go.Figure:
    """A figure with nothing to plot yet: no axes (empty axes read as data - a zero, a unit -
    where there is none), one centred line saying what to press, and the figure's ``title``
    so the panel still says what will be drawn there."""
    fig = go.Figure()
    fig.add_annotation(text=text, x=0.5, y=0.5, xref="paper", yref="paper", showarrow=False,
                       font=dict(size=14, color="#666"))
    fig.update_layout(template="plotly_white", xaxis_visible=False, yaxis_visible=False,
                      margin=dict(l=20, r=20, t=40 if title else 20, b=20),
                      **({"title": title} if title else {}),
                      **({"height": height} if height else {}))
    return fig


#: what the placement and Tofu figures say before anything ran
PLACE_FIRST = "Nothing placed yet: press Place (or Search with a placement method)."
PARTITION_FIRST = "Nothing partitioned yet: press Partition (or Search with a Tofu method)."
RUN_FIRST = "No run yet: press Run on local workers."

__all__ = ["empty_figure", "PLACE_FIRST", "PARTITION_FIRST", "RUN_FIRST"]

"""Figures of the app's panels: one module per panel that draws plotly figures.

Every public function here is pure: plain data in (the dicts and lists ``explorer.service``
returns), a ``plotly.graph_objects.Figure`` out.  Colours come only from
:mod:`explorer.views.palette`, so device 3 has one colour in every figure.  Nothing here
registers a Dash callback, names a component id or calls the service: the panel modules
(``explorer/views/<panel>.py``) fetch the data in their thin callbacks and hand it over,
and tests build figures without a browser or a session.
"""

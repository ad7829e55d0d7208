"""The Plans page (``/plans``): every plan found, of every family, kept in the history
(:mod:`explorer.views.plans`).  Loading or uploading a plan opens the page of its family on
the plan's request; *Download current plan* saves the layer-wise plan of the page's request
(the request in the URL, which the header's links carry here)."""

from __future__ import annotations

import dash
from dash import Input, Output, html

from explorer.views import ids, pages, plans, state

PATH = pages.PATHS["plans"]


def layout(**query):
    """The page for the query parameters ``query`` (the request loading replaces)."""
    doc, _errors = pages.open_request(query)
    return html.Div(className="page plans-page", children=[
        *pages.stores("plans", doc),
        plans.layout(),
    ])


def register(app: dash.Dash) -> None:
    """Register the page (``/plans``) and its context line on ``app``."""
    dash.register_page("explorer.views.plans_page", path=PATH, name=pages.NAMES["plans"],
                       title="Plan Explorer · plans", layout=layout, order=3)

    @app.callback(Output(ids.CONTEXT + "plans", "children"), Input(ids.STORE_REQUEST, "data"))
    def _context(doc):
        return state.context_line("plans", doc, None)


__all__ = ["layout", "register"]

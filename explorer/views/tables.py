"""Every table of the app, one way: an AG Grid (``dash-ag-grid``; ``dash_table`` is
deprecated) with sortable, resizable columns, and its rows downloadable as CSV.

:func:`grid` builds the component from ``(field, header)`` pairs; :func:`csv_button` and
:func:`register_csv` add a "Download CSV" button that writes the rows the table holds (pandas,
the columns in the table's order and with its headers), so the file says what the screen says.
"""

from __future__ import annotations

import re

import dash
import dash_ag_grid as dag
import pandas as pd
from dash import Input, Output, State, dcc, html

#: a row whose ``chosen`` field is ✔ (the plan's choice) is highlighted
CHOSEN_ROW = {"styleConditions": [
    {"condition": "params.data && params.data.chosen === '✔'",
     "style": {"backgroundColor": "#e3f1e3", "fontWeight": "bold"}}]}


def columns(pairs, widths: dict | None = None, tooltips: dict | None = None,
            wrap: tuple = ()) -> list:
    """AG Grid ``columnDefs`` for ``(field, header)`` pairs; ``widths`` fixes some widths,
    ``tooltips`` gives a header tooltip (the glossary), ``wrap`` lists fields whose text wraps
    inside the column instead of running past it."""
    out = []
    for field, header in pairs:
        col = {"field": field, "headerName": header}
        if widths and field in widths:      # also the least width: autoSize never cuts it
            col["width"] = col["minWidth"] = widths[field]
        if tooltips and field in tooltips:
            col["headerTooltip"] = tooltips[field]
        if field in wrap:
            col.update(wrapText=True, autoHeight=True, flex=1,
                       minWidth=(widths or {}).get(field, 220),
                       cellStyle={"whiteSpace": "normal", "lineHeight": "1.3"})
        out.append(col)
    return out


def grid(table_id: str, pairs, height: int | None = None, selectable: bool = False,
         row_style: dict | None = None, row_id: str | None = None, **kw) -> dag.AgGrid:
    """An AG Grid with ``columns(pairs, **kw)``; without ``height`` it grows with its rows
    (``autoHeight``), with it it scrolls inside ``height`` pixels.  Columns size to their
    content unless ``column_size=None`` (then ``widths`` hold, for a narrow panel)."""
    col_kw = {k: kw.pop(k) for k in ("widths", "tooltips", "wrap") if k in kw}
    column_size = kw.pop("column_size", "autoSize")   # None: the widths given, as given
    options = {"domLayout": "autoHeight" if height is None else "normal",
               "tooltipShowDelay": 200, "enableCellTextSelection": True,
               "suppressColumnVirtualisation": True}
    if selectable:
        options["rowSelection"] = {"mode": "singleRow", "enableClickSelection": True,
                                   "checkboxes": False}
    if row_id:      # dash-ag-grid's own prop (an expression), not an AG Grid option
        kw["getRowId"] = f"params.data.{row_id}"
    return dag.AgGrid(
        id=table_id, rowData=[], columnDefs=columns(pairs, **col_kw),
        defaultColDef={"sortable": True, "resizable": True, "filter": False,
                       "minWidth": 60, "cellStyle": {"fontSize": "12px"}},
        columnSize=column_size, dashGridOptions=options, getRowStyle=row_style,
        className="ag-theme-alpine explorer-grid",
        style={"height": f"{height}px" if height else None, "width": "100%"}, **kw)


def csv_text(rows: list, pairs) -> str:
    """The CSV of ``rows`` with the table's columns and headers (pandas does the quoting)."""
    pairs = list(pairs)
    frame = pd.DataFrame([{f: r.get(f) for f, _ in pairs} for r in rows or []],
                         columns=[f for f, _ in pairs])
    frame.columns = [h or f for f, h in pairs]
    return frame.to_csv(index=False)


def csv_name(what: str, doc: dict | None = None) -> str:
    """``<model>-<algo>-<what>.csv`` (letters, digits, ``._-`` only)."""
    doc = doc or {}
    parts = [str(doc.get("model") or ""), str(doc.get("algo") or ""), what]
    return "-".join(re.sub(r"[^A-Za-z0-9_.-]+", "_", p).strip("_.") for p in parts if p) + ".csv"


def csv_button(button_id: str, download_id: str, label: str = "Download CSV") -> list:
    """The button and its ``dcc.Download``."""
    return [html.Button(label, id=button_id, className="small",
                        title="the rows of this table as a CSV file"),
            dcc.Download(id=download_id)]


def register_csv(app, button_id: str, download_id: str, table_id: str, pairs, what: str,
                 doc_store: str | None = None) -> None:
    """The button's callback: the table's rows as ``<model>-<algo>-<what>.csv``."""
    pairs = list(pairs)
    states = [State(table_id, "rowData")]
    if doc_store:
        states.append(State(doc_store, "data"))

    @app.callback(Output(download_id, "data"), Input(button_id, "n_clicks"), *states,
                  prevent_initial_call=True)
    def _csv(_n, rows, doc=None):
        if not rows:
            raise dash.exceptions.PreventUpdate
        return dcc.send_string(csv_text(rows, pairs), csv_name(what, doc), type="text/csv")


__all__ = ["CHOSEN_ROW", "columns", "grid", "csv_text", "csv_name", "csv_button",
           "register_csv"]

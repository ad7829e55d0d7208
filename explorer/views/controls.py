"""Controls shared by the panels: the start / cancel / progress / status quartet of a
background job (a search, a partition, a run, a comparison), the one line that says what a tab
operates on, and a plan's download."""

from __future__ import annotations

import dash
from dash import Input, Output, State, dcc, html

from explorer.views import ids

#: the progress bar is shown only while its job runs, so it never sticks at 10-60 % after an
#: error or a cancel
PROGRESS_SHOWN = {"visibility": "visible"}
PROGRESS_HIDDEN = {"visibility": "hidden"}


def job_controls(label: str, start_id: str, cancel_id: str, progress_id: str, status_id: str,
                 cancel_label: str = "Cancel", primary: bool = True) -> list:
    """The start button, the cancel button (disabled until the job runs), a progress bar
    (hidden until the job runs) and a status text, to put in a row.  The job's callback drives
    them through Dash's ``running`` (see :func:`running`) / ``progress`` / ``cancel``."""
    return [
        html.Button(label, id=start_id, className="primary" if primary else None),
        html.Button(cancel_label, id=cancel_id, disabled=True),
        html.Progress(id=progress_id, value="0", max="100", style=PROGRESS_HIDDEN),
        html.Span(id=status_id, className="muted"),
    ]


def running(start_id: str, cancel_id: str, progress_id: str, status_id: str | None = None,
            text: str | None = None) -> list:
    """Dash ``running=`` for :func:`job_controls`: while the job runs the start button is
    disabled, cancel enabled, the progress bar shown and the status says ``text``;
    afterwards - done, failed or cancelled - all of it goes back."""
    out = [(Output(start_id, "disabled"), True, False),
           (Output(cancel_id, "disabled"), False, True),
           (Output(progress_id, "style"), PROGRESS_SHOWN, PROGRESS_HIDDEN)]
    if status_id is not None and text is not None:
        out.append((Output(status_id, "children"), text, ""))
    return out


def context(tab: str):
    """The line saying what ``tab`` operates on (filled by ``app.register``)."""
    return html.Div(id=ids.CONTEXT + tab, className="context-line muted")


def download_controls(button_id: str, download_id: str, what: str) -> list:
    """A "Download plan" button and its ``dcc.Download``."""
    return [html.Button("Download plan", id=button_id,
                        title=f"the {what} as a file `explorer run` executes"),
            dcc.Download(id=download_id)]


def register_download(app, button_id: str, download_id: str, store_id: str,
                      error_id: str) -> None:
    """The download's callback: the sealed plan document of the plan in ``store_id``
    (:func:`explorer.views.plan_files.download_payload`), or its error next to the tab's others."""
    from explorer.errors import ExplorerError

    @app.callback(Output(download_id, "data"), Output(error_id, "children", allow_duplicate=True),
                  Input(button_id, "n_clicks"), State(store_id, "data"),
                  prevent_initial_call=True)
    def download(_n, doc):
        from explorer.views.plan_files import download_payload
        try:
            return download_payload(doc), ""
        except (ExplorerError, ValueError) as exc:
            return dash.no_update, str(exc)


def export_controls(button_id: str, download_id: str, error_id: str) -> list:
    """An "Export to PyTorch" button, its ``dcc.Download`` and its error text."""
    return [html.Button("Export to PyTorch", id=button_id,
                        title="the plan as a program using PyTorch's parallel APIs "
                              "(DeviceMesh, DTensor placements per layer); run it with "
                              "torchrun"),
            dcc.Download(id=download_id),
            html.Span(id=error_id, className="error")]


def export_preview(preview: dict | None):
    """The export preview shown beside the button: "Export: N of M layers as planned", and
    the layers the program computes in another form, each with that form and why."""
    if not preview:
        return ""
    head = (f"Export: {preview['planned']} of {preview['layers']} layers as planned"
            f"{preview.get('pipeline') or ''} ({preview['file']})")
    off = preview.get("not_as_planned") or []
    if not off:
        return html.Span(head, className="muted")
    return html.Details([
        html.Summary(f"{head}; {len(off)} not as planned"),
        html.Ul([html.Li(f"{d['layer']}: plan {d['plan']} → {d['exported']}: {d['reason']}")
                 for d in off])], className="export-deviations")


def register_export(app, button_id: str, download_id: str, store_id: str,
                    error_id: str, preview_id: str | None = None) -> None:
    """The export's callbacks: the program :func:`explorer.service.export` writes for the
    layer-wise plan in ``store_id`` (or one line saying why there is none) and, with
    ``preview_id``, what that program follows, shown whenever the plan changes - before
    anything is downloaded."""
    from explorer.errors import ExplorerError

    def _exportable(doc) -> bool:
        return isinstance(doc, dict) and "layers" in doc and "error" not in doc

    @app.callback(Output(download_id, "data"), Output(error_id, "children"),
                  Input(button_id, "n_clicks"), State(store_id, "data"),
                  prevent_initial_call=True)
    def export(_n, doc):
        from explorer import service
        if not _exportable(doc):
            return dash.no_update, "there is no layer-wise plan to export: run a search first"
        try:
            name, text = service.export(doc)
        except (ExplorerError, ValueError) as exc:
            return dash.no_update, str(exc)
        note = "" if preview_id else service.export_note(text, len(doc["layers"]))
        return dcc.send_string(text, name, type="text/x-python"), note

    if preview_id is None:
        return

    @app.callback(Output(preview_id, "children"), Output(error_id, "children",
                                                         allow_duplicate=True),
                  Input(store_id, "data"), prevent_initial_call="initial_duplicate")
    def preview(doc):
        from explorer import service
        if not _exportable(doc):
            return "", ""
        try:
            return export_preview(service.export_preview(doc)), ""
        except (ExplorerError, ValueError) as exc:
            return "", str(exc)


def register_local_run(app, *, button_id: str, cancel_id: str, progress_id: str, status_id: str,
                       error_id: str, store_id: str, states: list, job, done,
                       start_progress: str | None = "0", interval: int = 300) -> None:
    """The "run on local workers" background callback of a panel (:func:`job_controls`): on a
    click, ``job(*values of states, progress)`` runs the shown plan and its result goes to
    ``store_id``; ``done(result, *values)`` is the status line after it.  A bad plan or input
    (ExplorerError / ValueError) is one line in ``error_id``; cancel stops the job and its
    workers.  ``start_progress=None`` keeps the bar indeterminate until ``job`` reports."""
    from dash import no_update

    from explorer.errors import ExplorerError

    @app.callback(
        Output(store_id, "data"), Output(error_id, "children"), Output(status_id, "children"),
        Input(button_id, "n_clicks"), *[State(c, prop) for c, prop in states],
        background=True, interval=interval,
        progress=[Output(progress_id, "value")],
        running=running(button_id, cancel_id, progress_id, status_id,
                        "running on local workers…"),
        cancel=[Input(cancel_id, "n_clicks")],
        prevent_initial_call=True,
    )
    def run_on_local_workers(set_progress, _n, *values):
        set_progress([start_progress])
        try:
            res = job(*values, lambda v: set_progress([str(v)]))
        except (ExplorerError, ValueError) as exc:
            return no_update, str(exc), ""
        set_progress(["100"])
        return res, "", done(res, *values)

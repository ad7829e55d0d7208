"""Controls shared by the panels: the start / cancel / progress / status quartet of a
background job (a search, a partition, a run, a comparison)."""

from __future__ import annotations

from dash import html


def job_controls(label: str, start_id: str, cancel_id: str, progress_id: str, status_id: str,
                 cancel_label: str = "Cancel", primary: bool = True) -> list:
    """The start button, the cancel button (disabled until the job runs), a progress bar and
    a status text, to put in a row.  The job's callback drives them through Dash's
    ``running`` / ``progress`` / ``cancel`` arguments."""
    return [
        html.Button(label, id=start_id, className="primary" if primary else None),
        html.Button(cancel_label, id=cancel_id, disabled=True),
        html.Progress(id=progress_id, value="0", max="100"),
        html.Span(id=status_id, className="muted"),
    ]

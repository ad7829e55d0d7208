"""Plans as files and as runs: the sealed document of a plan the app shows, its export to
PyTorch's parallel APIs, and the one path every run takes — a memory check before launching,
:func:`explorer.engine.runtime.dispatch.run_document` (which never searches), and the run
store (``$EXPLORER_HOME/runs.sqlite``)."""

from __future__ import annotations

from explorer.engine.search.request import Request
from explorer.errors import ExplorerError
from explorer.service.cache import Cache
from explorer.service.captures import memory_bytes
from explorer.service.placements import placement_pin_rows, placement_result
from explorer.service.results import result

__all__ = ["plan_file", "export", "export_note", "export_preview", "run_plan", "run_tofu", "run_placement",
           "runs", "placement_runs", "memory_needed"]


def plan_file(doc: dict) -> dict:
    """The saved form of a plan the app shows, of any kind: a sealed plan document that
    ``explorer run`` executes without searching (a Tofu plan with its execution layout, a
    placement with its operator graph's digest).  Tofu and placement documents are rebuilt
    from the method's cached result for the document's request (the searches are
    deterministic)."""
    from explorer.engine.core.plandoc import kind_of, seal
    kind = kind_of(doc) if isinstance(doc, dict) and "error" not in doc else None
    if kind is None:
        raise ExplorerError("there is no plan to download: run a search first")
    if kind == "layerwise":
        return seal({k: v for k, v in doc.items()
                     if k not in ("trace", "trace_ref", "history_id", "checksum",
                                  "previous")}, kind)
    if not isinstance(doc.get("request"), dict):
        raise ExplorerError("this plan has no request to rebuild it from: search again")
    req = Request.from_dict(doc["request"])
    if kind == "tofu":
        res = result(req, doc["algo"], tuple(doc.get("pins") or ()))
    else:
        res = placement_result(req, doc["algo"], doc.get("memory_gib"),
                               placement_pin_rows(doc))
    return res.document()


_EXPORTS = Cache("exports", size=16)     # sealed plan's checksum -> (file name, program)


def export(doc: dict, to: str = "torch") -> tuple:
    """``(file name, text)`` of a layer-wise plan exported as a program using PyTorch's own
    parallel APIs (:func:`explorer.engine.export.export_torch`).  ``doc``: a sealed document
    read from a file, or the app's plan (sealed here first).  A plan exported once is not
    exported again (the app previews the export, then downloads the same program)."""
    from explorer.engine.export import TARGETS, export_torch
    from explorer.engine.core.plandoc import kind_of
    if to not in TARGETS:
        raise ExplorerError(f"cannot export to {to!r}: --to {' or '.join(TARGETS)}")
    if isinstance(doc, dict) and "checksum" not in doc and kind_of(doc) == "layerwise":
        doc = plan_file(doc)
    key = doc.get("checksum") if isinstance(doc, dict) else None
    if not isinstance(key, str):
        return export_torch(doc)
    return _EXPORTS.get((key, to), lambda: export_torch(doc))


def export_preview(doc: dict) -> dict:
    """What exporting the layer-wise plan ``doc`` would write, before anything is downloaded:
    ``{"file", "layers", "planned", "pipeline", "not_as_planned": [{layer, plan, exported,
    reason}]}``; ``pipeline``: for a pipelined plan, whether the program runs its pipeline
    (", in the plan's pipeline (...)" or ", the plan's pipeline not: ..."), else ""; a
    departure from the pipeline is listed first, as layer "the pipeline"."""
    from explorer.engine.export import not_as_planned, pipeline_not_as_planned, summary
    name, text = export(doc)
    off = not_as_planned(text)
    layers = len(doc.get("layers") or ())
    head = f"{layers - len(off)} of {layers} layers as planned"
    line = summary(text, layers).split(";")[0]
    return {"file": name, "layers": layers, "planned": layers - len(off),
            "pipeline": line[len(head):] if line.startswith(head) else "",
            "not_as_planned": [dict(zip(("layer", "plan", "exported", "reason"),
                                        ("the pipeline", *d)))
                               for d in pipeline_not_as_planned(text)]
            + [dict(zip(("layer", "plan", "exported", "reason"), d)) for d in off]}


def export_note(text: str, layers: int) -> str:
    """What the app shows with an export: "N of M layers as planned", then each layer that
    is not, with the form it is computed in and why."""
    from explorer.engine.export import deviation_lines, summary
    devs = deviation_lines(text)
    return summary(text, layers).split(";")[0] + (
        ". Not as planned:\n" + "\n".join(d.strip() for d in devs) if devs else "")


def memory_needed(doc: dict) -> tuple | None:
    """``(bytes, what they hold)`` that running ``doc`` needs on this machine, from the
    plan's own peaks: a Tofu plan runs in float64 (twice its float32 bytes) on every worker,
    with full-size buffers in the worst case, plus the single-device reference; a placement
    holds its devices' simulated peaks plus the reference step.  ``None`` for a layer-wise
    plan (its workers hold their shards; the runtime limits them)."""
    from explorer.engine.core.plandoc import kind_of
    peaks = sum(float(x) for x in doc.get("peak_memory_bytes") or [])
    kind = kind_of(doc)
    if kind == "tofu":
        n = int(doc.get("devices") or 1)
        return 2.0 * (n + 1) * peaks, f"float64, {n} workers and the reference"
    if kind == "placement":
        n = len(doc.get("capacity_bytes") or []) or (max(map(int, doc["placement"].values())) + 1)
        return 2.0 * peaks, f"{n} workers and the reference"
    return None


def _check_free_memory(doc: dict) -> None:
    """Refuse, before launching, a run that needs over 70 % of this machine's free memory."""
    import psutil
    need = memory_needed(doc)
    if not need:
        return
    free = float(psutil.virtual_memory().available)
    if need[0] > 0.7 * free:
        from explorer.engine.core.plandoc import kind_of
        what = {"tofu": "this Tofu plan", "placement": "this placement"}[kind_of(doc)]
        raise ExplorerError(
            f"running {what} needs up to {need[0] / 2**30:.1f} GiB here ({need[1]}) but "
            f"{free / 2**30:.1f} GiB is free: choose a smaller batch or model to execute it on "
            f"this machine")


def run_plan(doc: dict, **opts) -> dict:
    """Execute a plan document of any kind, the one way every run goes: refused before
    launching when it would not fit in this machine's free memory (:func:`memory_needed`),
    run by :func:`explorer.engine.runtime.dispatch.run_document` (which never searches), and
    stored with its plan (``$EXPLORER_HOME/runs.sqlite``): its ``run_id`` is in the result."""
    from explorer.engine.runtime.dispatch import run_document
    from explorer.engine.runtime.store import RunStore, run_key
    _check_free_memory(doc)
    out = run_document(doc, **opts)
    RunStore().add_safely(run_key(doc), out)
    return out


def run_tofu(doc: dict, timeout_s: float = 600.0, memory_gib=None,
             progress=lambda v: None) -> dict:
    """Execute the Tofu plan the Tofu page shows (:func:`explorer.service.partitions.tofu`) on local
    gloo workers, one per worker of the plan: :func:`run_plan` on its sealed document
    (:func:`plan_file`), 3 steps, the reference check in float64.  ``memory_gib``: the
    per-worker limit (``--memory-per-worker``).  The result carries
    ``plan_predicted_step_time_s`` (the plan's own prediction: time on the links) and
    ``plan_peak_memory_bytes`` next to the runtime's fields."""
    from explorer.engine.core.plandoc import kind_of
    if not isinstance(doc, dict) or kind_of(doc) != "tofu" or "request" not in doc:
        raise ExplorerError("partition the model first, then run the Tofu plan")
    _check_free_memory(doc)                       # before the plan is rebuilt and sealed
    progress(5)
    sealed = plan_file(doc)
    progress(20)
    out = run_plan(sealed, steps=3, timeout_s=timeout_s, verify=False,
                   memory_per_worker=memory_bytes(memory_gib))
    out["plan_predicted_step_time_s"] = float(doc.get("predicted_step_time_s") or 0.0)
    out["plan_peak_memory_bytes"] = [float(x) for x in doc.get("peak_memory_bytes") or []]
    progress(95)
    return out


def run_placement(doc: dict, steps: int = 3, timeout_s: float = 600.0,
                  progress=lambda v: None) -> dict:
    """Execute a placement document (:func:`explorer.service.placements.placement`) on local
    gloo workers, one per device of the placement (:func:`run_plan`, one compiled program
    per device): the reference check against one device, the bytes moved, and the measured
    step time next to the simulator's (per device: predicted busy time vs measured
    compute)."""
    if not doc or "placement" not in doc or "request" not in doc:
        raise ExplorerError("place the model first, then run the placement")
    progress(5)
    # the app's document lives in memory (no checksum to verify)
    out = run_plan(doc, steps=max(1, int(steps)), timeout_s=timeout_s, verify=False)
    progress(95)
    return out


def runs(doc: dict, limit: int = 50) -> list:
    """Stored runs of this plan, of any kind (command line or app), newest first: when,
    workers, predicted and measured step time, their error and the reference verdict."""
    from explorer.engine.core.plandoc import kind_of
    from explorer.engine.runtime.store import RunStore, run_digests
    if not isinstance(doc, dict) or "error" in doc or kind_of(doc) is None:
        return []
    doc = {k: v for k, v in doc.items()
           if k not in ("trace", "trace_ref", "previous", "history_id")}
    # runs stored under the plan's current key, and under its earlier key formats
    first, *legacy = run_digests(doc)
    return RunStore().rows(first, limit, legacy=legacy, preset=doc.get("preset"))


def placement_runs(doc: dict, limit: int = 50) -> list:
    """Stored runs of this placement (:func:`runs`)."""
    if not doc or "placement" not in doc:
        return []
    return runs(doc, limit)


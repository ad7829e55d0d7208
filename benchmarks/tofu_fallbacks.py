"""Which aten targets of the example models' Tofu plans still run on full-size buffers.

    python benchmarks/tofu_fallbacks.py [--workers 2,4] [--batch 2] [--models a,b] [--json]

For every built-in example model (``explorer models``) at a small size (``SIZES``: the
arguments the example tests use, so every model runs on a 2-core machine in seconds), the
Tofu plan on the ``local`` preset is searched, saved as a document and run with ``explorer
run``'s executor (:func:`explorer.engine.runtime.dispatch.run_tofu_documents`, float64, one step,
checked against one device).  The table gives, per model and worker count, the targets the
run lists in ``fallback_ops`` (computed on full-size zero-padded buffers, not tile-local)
with the reason the run gives, whether the result matched the reference and whether the
bytes moved equal the plan's.  The plans of one worker count run in one launch; when that
launch fails, each plan runs alone so the failing row names its model.

No model is skipped at these sizes; ``--models`` picks some.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import example_models  # noqa: E402 - from the checkout, as the tests import it

#: the example models at the example tests' small sizes, plus U-Net with transposed convolutions
SIZES = {**example_models.SMALL,
         "unet-transpose": {**example_models.SMALL["unet"], "up": "transpose"}}


def _spec(row: str) -> str:
    """The model spec of a row (``unet-transpose`` is U-Net with ``up=transpose``)."""
    return row.split("-")[0]


def _document(row: str, workers: int, batch: int) -> dict:
    from explorer.engine.search import Problem, Request, run
    return run("tofu", Problem(Request(_spec(row), batch, dict(SIZES[row]),
                                       preset="local", devices=workers))).document()


def survey(rows, workers_list, batch: int, timeout_s: float = 1800.0) -> list:
    """One dict per (model, workers): fallback targets and reasons, reference and bytes."""
    from explorer.engine.runtime.dispatch import run_tofu_documents
    out = []
    for k in workers_list:
        docs, failed = {}, {}
        for row in rows:
            try:
                docs[row] = _document(row, k, batch)
            except Exception as exc:  # noqa: BLE001 - reported in the row
                failed[row] = f"search: {exc}"
        got = {}
        t0 = time.perf_counter()
        try:
            got = dict(zip(docs, run_tofu_documents(list(docs.values()), steps=1,
                                                    timeout_s=timeout_s)))
        except Exception:  # noqa: BLE001 - run each alone: the failure names its plan
            for row, doc in docs.items():
                try:
                    got[row] = run_tofu_documents([doc], steps=1, timeout_s=timeout_s)[0]
                except Exception as exc:  # noqa: BLE001
                    failed[row] = f"run: {str(exc).splitlines()[0][:200]}"
        wall = time.perf_counter() - t0
        for row in rows:
            if row in failed:
                out.append({"model": row, "workers": k, "error": failed[row]})
                continue
            r = got[row]
            out.append({"model": row, "workers": k, "fallback_ops": r["fallback_ops"],
                        "fallback_reasons": r["fallback_reasons"],
                        "tile_local_targets": len(r["tile_local_ops"]),
                        "reference_ok": r["reference_ok"],
                        "bytes_as_predicted": abs(r["measured_comm_bytes"] -
                                                  r["predicted_comm_bytes"]) <=
                        1e-9 * max(1.0, r["predicted_comm_bytes"]),
                        "launch_s": round(wall, 1)})
    return out


def _table(rows: list) -> str:
    lines = [f"{'model':<16}{'w':>2}  {'ref':<4}{'bytes':<6}fallback targets (ops/worker): reason"]
    for r in rows:
        head = f"{r['model']:<16}{r['workers']:>2}  "
        if "error" in r:
            lines.append(head + "ERROR " + r["error"])
            continue
        head += f"{'ok' if r['reference_ok'] else 'BAD':<4}" \
                f"{'ok' if r['bytes_as_predicted'] else 'BAD':<6}"
        if not r["fallback_ops"]:
            lines.append(head + "none")
            continue
        for i, (t, n) in enumerate(r["fallback_ops"].items()):
            lines.append((head if i == 0 else " " * len(head)) +
                         f"{t} x{n}: {r['fallback_reasons'].get(t, '')}")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", default="2,4")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--models", default=",".join(SIZES),
                    help="comma-separated rows of SIZES (default all)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    rows = [m for m in a.models.split(",") if m]
    bad = [m for m in rows if m not in SIZES]
    if bad:
        print(f"error: unknown model row {bad[0]!r}; rows: {', '.join(SIZES)}",
              file=sys.stderr)
        return 2
    try:
        workers = [int(w) for w in a.workers.split(",")]
    except ValueError:
        print(f"error: --workers takes comma-separated integers, not {a.workers!r}",
              file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    res = survey(rows, workers, a.batch)
    if a.json:
        print(json.dumps(res, indent=1))
    else:
        print(_table(res))
        print(f"\n{len(rows)} models x {len(workers)} worker counts, batch {a.batch}: "
              f"{time.perf_counter() - t0:.0f} s wall")
    return 0 if all("error" not in r and not r["fallback_ops"] and r["reference_ok"]
                    and r["bytes_as_predicted"] for r in res) else 1


if __name__ == "__main__":
    sys.exit(main())

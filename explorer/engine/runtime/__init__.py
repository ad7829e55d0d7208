"""Executing saved plans on local worker processes (``torch.distributed``).

* :func:`run_document` – the entry point for a plan document of any kind (layer-wise, Tofu,
  placement): checks the document and dispatches on its schema; nothing is searched
  (:mod:`.dispatch`).  Tofu plans and placements run on the operator-level executor
  (:mod:`.opexec`), layer-wise plans on the layer executor below; both start their workers
  with :func:`start_workers` and check against one device through :mod:`.reference`.
* :func:`launch` / :func:`launch_many` – validate a plan against the model (and an optional
  request) *before* starting anything, start one process per device (``torch.multiprocessing``
  spawn, one thread each, pinned to its own core; gloo on CPU, NCCL when there are enough
  GPUs), run a reference-checked step, warm-up steps and timed steps, and return predicted vs
  measured times; a worker that raises, dies or hangs fails the launch with a message naming
  the rank, within seconds (or ``timeout_s``), and every worker is killed (:mod:`.launcher`).
* :class:`Executor` – one worker's share of the plan: region fetches with point-to-point
  exchanges (halos for h/w splits, gathers for channel splits), exact local ops on the owned
  output box with the layer's folded BatchNorm/activations, gradient return to the owners,
  summation of replicated weight-shard gradients, SGD (:mod:`.executor`, :mod:`.ops`,
  :mod:`.transforms`).  All geometry comes from :mod:`explorer.engine.core.geometry`.
* Semantics: training in **eval mode** (dropout off, BatchNorm with its running statistics),
  loss ``Σ_outputs mean(out²)``, plain SGD (``lr = 0.01``).  The reference check compares the
  loss, every gradient and every parameter after one step with the same model run on one
  process in float64, allowing ``max(1e-4, 10 × the float32 single-device error)``
  (:mod:`.reference`).
* :func:`calibrate` – measure compute, memory, point-to-point bandwidth and the latency of an
  exchange between computing workers, write ``$EXPLORER_HOME/local.json``; with a model, fill
  the profile cache under the run's conditions (:mod:`.calibrate`).
* ``python -m explorer.engine.runtime.torchrun PLAN.json`` – the worker entry point, also under
  ``torchrun`` for several machines (:mod:`.torchrun`); ``explorer run`` / ``explorer
  calibrate`` (:mod:`.commands`); runs are stored in ``$EXPLORER_HOME/runs.sqlite``
  (:mod:`.store`).

Not supported yet: multi-output layers (``lstm_cell``), weight tying across layers, pooling
with ``ceil_mode`` or ``count_include_pad=False`` on a height/width split, bilinear upsampling
on a height/width split — each raises ``NotImplementedError`` naming the layer.
"""

from explorer.engine.runtime.launcher import (
    RunFailed,
    launch,
    launch_many,
    start_workers,
    validate,
)

__all__ = ["RunFailed", "launch", "launch_many", "start_workers", "validate", "run_document",
           "calibrate", "Executor"]


def __getattr__(name):
    if name == "run_document":
        from explorer.engine.runtime.dispatch import run_document
        return run_document
    if name == "calibrate":
        from explorer.engine.runtime.calibrate import calibrate
        return calibrate
    if name == "Executor":
        from explorer.engine.runtime.executor import Executor
        return Executor
    raise AttributeError(name)

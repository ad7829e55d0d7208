"""Executing a layer-wise plan on local worker processes (``torch.distributed``).

* :func:`launch` / :func:`launch_many` – validate a plan, start one process per device
  (gloo on CPU, NCCL on GPUs), run a reference-checked step and timed steps, return
  predicted vs measured times (:mod:`.launcher`);
* :class:`Executor` – one worker's share of the plan: region fetches, exact local ops,
  gradient return and replica all-reduce, SGD (:mod:`.executor`, :mod:`.ops`,
  :mod:`.transforms`);
* :func:`calibrate` – measure this machine and write ``$EXPLORER_HOME/local.json``
  (:mod:`.calibrate`);
* ``python -m explorer.engine.runtime.worker PLAN.json`` – the worker entry point, also
  under ``torchrun`` (:mod:`.worker`).
"""

from .launcher import RunFailed, launch, launch_many, validate

__all__ = ["RunFailed", "launch", "launch_many", "validate", "calibrate", "Executor"]


def __getattr__(name):
    if name == "calibrate":
        from .calibrate import calibrate
        return calibrate
    if name == "Executor":
        from .executor import Executor
        return Executor
    raise AttributeError(name)

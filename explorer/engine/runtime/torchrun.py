"""``python -m explorer.engine.runtime.torchrun PLAN.json``: a saved plan from the command line.
Outside ``torchrun`` it launches the plan on this machine like ``explorer run``; under
``torchrun`` (``RANK`` and ``WORLD_SIZE`` set, any number of nodes) this process is one rank of
a layer-wise plan."""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch.distributed as dist

from explorer.engine.runtime.worker import destroy_group, join_group, run_job

# --------------------------------------------------------------------------------------------
# torchrun / command line
# --------------------------------------------------------------------------------------------


def _parser():
    p = argparse.ArgumentParser(prog="python -m explorer.engine.runtime.torchrun",
                                description="run a saved plan (under torchrun: as one rank)")
    p.add_argument("plan", help="PLAN.json written by `explorer search --out`")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--timeout", type=float, default=600.0)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--no-check", action="store_true", help="skip the reference check")
    p.add_argument("--json", action="store_true")
    p.add_argument("--out", help="write the result JSON here (rank 0)")
    return p


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    from explorer.errors import ExplorerError
    from explorer.engine.runtime.report import format_run
    try:
        from explorer.engine.runtime.dispatch import read_document
        doc = read_document(args.plan)
        if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
            from explorer.engine.runtime.dispatch import run_document
            res = run_document(doc, steps=args.steps, warmup=args.warmup,
                               timeout_s=args.timeout, check=not args.no_check)
        else:
            res = _torchrun_rank(doc, args)
            if res is None:
                return 0
    except ExplorerError as exc:
        rank = os.environ.get("RANK")
        print(f"error{'' if rank is None else f' (rank {rank})'}: {exc}", file=sys.stderr)
        return 2
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(res, fh, indent=2)
    print(json.dumps(res, indent=2) if args.json else format_run(res))
    return 0 if res.get("reference_ok") in (True, None) else 1


def _rank_device(local_rank: int) -> tuple:
    """``(backend, device)`` of this torchrun rank: this node's ``LOCAL_WORLD_SIZE``
    processes on its GPUs as local workers are mapped (:func:`.devicemap.torchrun_device`;
    ``$EXPLORER_DEVICE`` chooses the kind, ``$EXPLORER_BACKEND`` may force gloo or nccl)."""
    from explorer.engine.core.devices import gpu_count, worker_device_kind
    from explorer.engine.runtime.devicemap import BACKEND_ENV, torchrun_device
    kind = worker_device_kind()
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE") or os.environ.get("WORLD_SIZE") or 1)
    return torchrun_device(local_rank, local_world, gpu_count() if kind == "cuda" else 0,
                           backend=os.environ.get(BACKEND_ENV) or "auto", kind=kind)


def _torchrun_rank(doc: dict, args):
    """This process as one rank of a layer-wise plan under torchrun (rendezvous, ranks and
    world size from its environment); rank 0 returns the result, the others ``None``."""
    from explorer.errors import InfeasiblePlan
    from explorer.engine.core.plandoc import open_document
    from explorer.engine.runtime.launcher import validate
    if open_document(doc) != "layerwise":
        raise InfeasiblePlan("under torchrun the worker runs layer-wise plans; run Tofu plans "
                             "and placements with `explorer run`")
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", rank))
    plan_dict = doc
    validate(plan_dict, {"devices": world}, check_local=False)
    backend, device = _rank_device(local)
    device = join_group(rank, world, backend, args.timeout, local, device=device)
    try:
        job = {"plan": plan_dict, "steps": args.steps, "warmup": args.warmup,
               "check": not args.no_check, "lr": args.lr}
        res = run_job(job, rank, world, device)
        if world > 1:
            dist.barrier()       # every rank is done, rank 0's reference check included
    except BaseException:
        destroy_group()
        raise
    if not _LEAVE_GROUP:
        destroy_group()
    if res is not None:
        res["kind"] = "layerwise"
    return res


#: end the process without tearing the process group down (set when run as a program): with
#: gloo on a loaded CPU, destroying it after a run that passed can abort a rank ("terminate
#: called without an active exception"); every rank has passed the barrier by then
_LEAVE_GROUP = False


if __name__ == "__main__":
    if "RANK" not in os.environ:           # a local launch: the usual exit (its workers and
        sys.exit(main())                   # queues are released by multiprocessing's hooks)
    _LEAVE_GROUP = True
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


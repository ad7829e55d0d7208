"""Exported pipelined plans: the program runs the plan's stages, micro-batches and schedule
with ``torch.distributed.pipelining`` (stages cut from the fx trace, ``PipelineStage``,
``Schedule1F1B`` / ``ScheduleGPipe``; data-parallel replicas and tensor-parallel styles inside
a stage), lists what it does otherwise, and run under torchrun on 2 and 4 gloo processes
matches one process (--check).

Tiny models and 2 steps: every torchrun costs seconds on the shared cores.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from explorer.engine.export import (deviation_lines, not_as_planned, pipeline_not_as_planned,
                                    program, summary)
from tests.test_export import cli

MLP_ARGS = {"hidden": 16, "layers": 2}
MLP_STAGES = {"x": 0, "body_0": 0, "body_2": 1, "head": 1}


def pipe(stages=2, micro=4, schedule="1f1b", group=1):
    return {"stages": stages, "micro_batches": micro, "schedule": schedule,
            "devices_per_stage": group}


def mlp_configs(group=1, deg=None):
    """Every mlp layer on its stage's group of ``group`` devices, split ``deg`` (default: on
    the samples over the group, nothing on one device)."""
    deg = deg if deg is not None else ({"n": group} if group > 1 else {})
    return {name: (dict(deg), tuple(range(s * group, (s + 1) * group)))
            for name, s in MLP_STAGES.items()}


def pipeline_of(text):
    """The program's PIPELINE dict."""
    import ast
    start = text.index("\nPIPELINE = ") + len("\nPIPELINE = ")
    return ast.literal_eval(text[start:text.index("\n\n", start)])


def run(prog, n, steps=2):
    """``torchrun --standalone --nproc_per_node n prog --steps 2 --check`` outside the repo."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(OMP_NUM_THREADS="1", TORCH_CPP_LOG_LEVEL="ERROR")
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           "--nproc_per_node", str(n), str(prog), "--steps", str(steps),
                           "--check"], cwd=prog.parent, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "check: passed" in proc.stdout
    return proc.stdout


def test_a_pipelined_plan_runs_its_stages_and_schedule():
    """Two stages of one device, 4 micro-batches, 1F1B: the program's PIPELINE has them,
    its header says so, every layer is as planned and the summary names the pipeline."""
    _, text = program("mlp", 8, MLP_ARGS, 2, mlp_configs(), stages=MLP_STAGES, pipeline=pipe())
    assert pipeline_of(text) == {"stages": 2, "micro_batches": 4, "schedule": "1f1b",
                                 "group": 1, "dp": 1, "tp": 1, "split": False,
                                 "recompute": [], "styles": {}, "fsdp": {},
                                 "stage_of": MLP_STAGES}
    assert "Schedule1F1B over 4 micro-batches" in text
    assert not_as_planned(text) == [] and pipeline_not_as_planned(text) == []
    assert summary(text, 4) == ("4 of 4 layers as planned, in the plan's pipeline (2 stages, "
                                "4 micro-batches, 1f1b)")
    compile(text, "p.py", "exec")


def test_stage_replicas_split_the_micro_batches_and_tensor_splits_are_listed():
    """Two stages of two devices: layers split on the samples over their group are the
    stage's data-parallel replicas (as planned); a column split inside a stage is listed,
    computed data parallel, with its reason."""
    cfg = mlp_configs(group=2)
    _, text = program("mlp", 8, MLP_ARGS, 4, cfg, stages=MLP_STAGES, pipeline=pipe(group=2))
    assert pipeline_of(text)["group"] == 2 and pipeline_of(text)["split"]
    assert not_as_planned(text) == []
    cfg["body_2"] = ({"c": 2}, (2, 3))
    _, text = program("mlp", 8, MLP_ARGS, 4, cfg, stages=MLP_STAGES, pipeline=pipe(group=2))
    [(layer, planned, exported, reason)] = not_as_planned(text)
    assert (layer, planned, exported) == ("body_2", "c2 on [2, 3]", "n2 on [2, 3]")
    assert "no tensor-parallel ranks" in reason
    assert summary(text, 4).startswith("3 of 4 layers as planned, in the plan's pipeline")


def megatron_mlp():
    """The mlp in 2 stages of 2 tensor-parallel ranks: column, row and column splits."""
    return {"x": ({}, (0, 1)), "body_0": ({"c": 2}, (0, 1)), "body_2": ({"k": 2}, (2, 3)),
            "head": ({"c": 2}, (2, 3))}


def test_tensor_parallel_inside_stages_takes_parallel_styles():
    """Linears split on c / k by the stage's whole group: the group is 2 tensor-parallel
    ranks, the linears ColwiseParallel / RowwiseParallel on them: all as planned."""
    _, text = program("mlp", 8, MLP_ARGS, 4, megatron_mlp(), stages=MLP_STAGES,
                      pipeline=pipe(group=2))
    got = pipeline_of(text)
    assert (got["dp"], got["tp"], got["split"]) == (1, 2, False)
    assert got["styles"] == {"body.0": "colwise", "body.2": "rowwise", "head": "colwise"}
    assert not_as_planned(text) == []
    _, text = program("mlp", 8, MLP_ARGS, 4, megatron_mlp(), stages=MLP_STAGES,
                      pipeline=pipe(group=2), savings={"head": (False, 3), "body_0": (False, 1)})
    off = {d[0]: d[3] for d in not_as_planned(text)}
    assert "no data-parallel replicas" in off["head"] and "ZeRO-1" in off["body_0"]


def test_what_the_pipeline_cannot_follow_is_said():
    """1F1B with fewer micro-batches than stages runs GPipe (torch's Schedule1F1B refuses
    it), said as such; stages that are not contiguous in the graph cannot be cut: the
    layers run without the pipeline, and the summary and header say so."""
    _, text = program("mlp", 8, MLP_ARGS, 2, mlp_configs(), stages=MLP_STAGES,
                      pipeline=pipe(micro=1))
    [(planned, exported, reason)] = pipeline_not_as_planned(text)
    assert exported == "ScheduleGPipe" and pipeline_of(text)["schedule"] == "gpipe"
    assert "the plan's pipeline not" in summary(text, 4)
    mixed = dict(MLP_STAGES, body_0=1, body_2=0)             # stage 1 before stage 0
    _, text = program("mlp", 8, MLP_ARGS, 2, mlp_configs(), stages=mixed, pipeline=pipe())
    [(planned, exported, reason)] = pipeline_not_as_planned(text)
    assert planned == "2 stages x 1 device, 4 micro-batches, 1f1b"
    assert "no micro-batches and no schedule" in exported and "later stage" in reason
    assert "\nPIPELINE = {'" not in text and "# NOT AS PLANNED: the pipeline" in text
    assert deviation_lines(text)[0].startswith("  the pipeline: plan 2 stages")
    assert "the plan's pipeline not" in summary(text, 4)


CHUNKY = """
import torch
from torch import nn


class Chunky(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b, self.c = nn.Linear(8, 16), nn.Linear(8, 8), nn.Linear(8, 8)

    def forward(self, x):
        p, q = self.a(x).chunk(2, dim=-1)
        return self.b(p) + self.c(q)


def build():
    return Chunky(), torch.randn(8, 8)
"""


def test_a_boundary_carrying_no_tensor_is_not_pipelined(tmp_path):
    """A cut between the two halves of a ``chunk`` would send the pair (a tuple) to the
    next stage, which a PipelineStage cannot: the program runs without the pipeline and
    says so, with that reason."""
    (tmp_path / "chunky.py").write_text(CHUNKY)
    stages = {"x": 0, "a": 0, "b": 0, "c": 1, "add": 1}
    cfg = {name: ({}, (s,)) for name, s in stages.items()}
    _, text = program(f"{tmp_path / 'chunky.py'}:build", 8, {}, 2, cfg, stages=stages,
                      pipeline=pipe(micro=2, schedule="gpipe"))
    [(_, exported, reason)] = pipeline_not_as_planned(text)
    assert reason == ("stage 1 would receive chunk, which is not a tensor, and a "
                      "PipelineStage sends tensors only")
    assert summary(text, 5).startswith("5 of 5 layers as planned, the plan's pipeline not")


@pytest.mark.multiprocess
def test_searched_mlp_pipeline_matches_one_process(capsys, tmp_path):
    """`explorer search mlp --algo pipeline` on 2 devices (2 stages), exported: the program
    runs 2 stages under 1F1B on 2 gloo processes and matches one process."""
    plan, prog = tmp_path / "p.json", tmp_path / "p.py"
    code, _, err = cli(capsys, "search", "mlp", "-a", "hidden=16", "-a", "layers=2", "-b", 8,
                       "-n", 2, "--preset", "local", "--algo", "pipeline", "--opt", "stages=2",
                       "-o", plan)
    assert code == 0, err
    code, out, err = cli(capsys, "export", plan, "-o", prog)
    assert code == 0, err
    assert "layers as planned, in the plan's pipeline (2 stages" in out
    assert "mesh pp=2 x dp=1 x tp=1 (1f1b" in run(prog, 2)


@pytest.mark.multiprocess
def test_llama_four_stages_matches_one_process(tmp_path):
    """A tiny llama in 4 stages of one process each (a cut in every block boundary), 8
    micro-batches under 1F1B: loss and updates match one process."""
    args = {"layers": 4, "hidden": 16, "heads": 2, "kv_heads": 1, "intermediate": 32,
            "seq_len": 8, "vocab": 32}
    from explorer.engine.core.capture_cache import layer_graph
    names = layer_graph("llama", 8, args).names()
    # block b's first layer (its input norm's pow) starts stage b
    starts = [names.index(f"pow_{2 * b + 1}") for b in range(1, 4)]
    stages = {nm: sum(i >= s for s in starts) for i, nm in enumerate(names)}
    cfg = {nm: ({}, (s,)) for nm, s in stages.items()}
    name, text = program("llama", 8, args, 4, cfg, stages=stages,
                         pipeline=pipe(stages=4, micro=8))
    assert not_as_planned(text) == [] and pipeline_not_as_planned(text) == []
    prog = tmp_path / name
    prog.write_text(text)
    assert "mesh pp=4 x dp=1 x tp=1 (1f1b, 8 micro-batches)" in run(prog, 4)


@pytest.mark.multiprocess
def test_stage_replicas_match_one_process(tmp_path):
    """2 stages x 2 data-parallel replicas, GPipe over 2 micro-batches, one layer planned
    tensor parallel inside its stage (listed), one recomputed and ZeRO-3 (under checkpoint
    and fully_shard over its replicas, as planned), one ZeRO-2: matches one process on 4
    gloo processes."""
    cfg = mlp_configs(group=2)
    cfg["body_2"] = ({"c": 2}, (2, 3))
    name, text = program("mlp", 8, MLP_ARGS, 4, cfg, stages=MLP_STAGES,
                         pipeline=pipe(micro=2, schedule="gpipe", group=2),
                         savings={"body_0": (True, 3), "head": (False, 2)})
    assert pipeline_of(text)["recompute"] == ["body_0"]
    assert pipeline_of(text)["fsdp"] == {"body.0": 3, "head": 2}
    assert [d[0] for d in not_as_planned(text)] == ["body_2"]
    prog = tmp_path / name
    prog.write_text(text)
    out = run(prog, 4)
    assert "mesh pp=2 x dp=2 x tp=1 (gpipe, 2 micro-batches)" in out
    assert "3 of 4 layers as planned" in out and "not as planned: body_2" in out


@pytest.mark.multiprocess
def test_tensor_parallel_stages_match_one_process(tmp_path):
    """2 stages of 2 tensor-parallel ranks (ColwiseParallel / RowwiseParallel inside each
    stage, a (2, 1, 2) mesh), 1F1B over 4 micro-batches: matches one process."""
    name, text = program("mlp", 8, MLP_ARGS, 4, megatron_mlp(), stages=MLP_STAGES,
                         pipeline=pipe(group=2))
    prog = tmp_path / name
    prog.write_text(text)
    out = run(prog, 4)
    assert "mesh pp=2 x dp=1 x tp=2 (1f1b, 4 micro-batches)" in out
    assert "4 of 4 layers as planned" in out

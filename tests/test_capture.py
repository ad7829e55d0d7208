import pytest


def test_every_trace_holds_the_one_trace_lock():
    """torch.fx, torch.export and make_fx keep tracing state in module globals: the app traces
    in callback threads, and two traces at once aborted the process (a slow-tier run here).
    A layer capture and an operator-graph trace both wait for the one lock."""
    import threading

    from explorer.engine.core import capture as C
    from explorer.engine.core.importer import import_spec
    from explorer.engine.core.opgraph import build_opgraph
    done = []
    jobs = [threading.Thread(target=lambda: done.append(import_spec("mlp", 4, {"layers": 1}))),
            threading.Thread(target=lambda: done.append(build_opgraph("mlp", 4, {"layers": 1})))]
    with C.TRACE_LOCK:
        for j in jobs:
            j.start()
        for j in jobs:
            j.join(timeout=2.0)
        assert all(j.is_alive() for j in jobs) and not done       # both wait for the lock
    for j in jobs:
        j.join(timeout=120)
    assert len(done) == 2


@pytest.mark.parametrize("spec", ["inception_v3", "resnet50", "vgg16", "gpt2", "bert", "vit",
                                  "mobilenet_v2", "densenet", "transformer", "llama"])
def test_shapes_given_directly_on_meta_tensors_are_torchs(spec):
    """Every node's shape and dtype from the capture's shape propagation (outputs of ReLU,
    GELU, dropout, ``cat``, adaptive pools, linear layers and batch norms given directly on
    meta tensors: their meta kernels are Python references whose first call imports
    ``torch._dynamo``) equal those of torch's own ``ShapeProp``, on the examples (small)."""
    import example_models
    from torch.fx.passes.shape_prop import ShapeProp

    from explorer.engine.core import capture as C
    model, x = C.load(spec, 4, dict(example_models.SMALL.get(spec, {})))
    gm = C._fx_trace(model, spec, False)

    def shapes():          # every node's whole record (shape, dtype, strides, memory format)
        return {n.name: (n.meta.get("tensor_meta"), n.meta.get("type"))
                for n in gm.graph.nodes}
    C._shape_prop_class()(gm).propagate(x)
    ours = shapes()
    for n in gm.graph.nodes:
        n.meta.pop("tensor_meta", None)
    ShapeProp(gm).propagate(x)
    assert any(m is not None for m, _ in ours.values()) and ours == shapes()


@pytest.mark.parametrize("spec,args", [("inception_v3", {"image_size": "96"}),
                                       ("resnet50", {"image_size": "64"})])
def test_a_first_capture_imports_neither_dynamo_nor_sympy(tmp_path, spec, args):
    """torch._dynamo (0.6 s of a first search's trace) is imported by the first call of any of
    torch's Python meta references, sympy (0.5 s) by ``torch._check``; Inception-v3's and
    ResNet-50's captures call none of them."""
    import subprocess
    import sys
    code = ("import sys\n"
            "from explorer.engine.core.importer import import_spec\n"
            f"import_spec({spec!r}, 8, {args!r})\n"
            "print('torch._dynamo' in sys.modules or 'sympy' in sys.modules)\n")
    import os
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300, env={**os.environ, "EXPLORER_HOME": str(tmp_path)})
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "False"


def test_batch_norm_shapes_on_meta_tensors_skip_torchs_decomposition(monkeypatch):
    """On meta tensors a batch norm's output is its input's shape, given directly: torch's
    meta kernel for it is a Python decomposition (its first call imports torch._dynamo, about a
    second of a first capture).  The capture never calls it, and the shapes are right."""
    import torch
    from torch import nn

    from explorer.engine.core import capture as C

    def refuse(*a, **k):
        raise AssertionError("batch_norm ran")
    monkeypatch.setattr(torch, "batch_norm", refuse)
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.Flatten(),
                          nn.Linear(8 * 6 * 6, 5), nn.BatchNorm1d(5)).to("meta")
    x = torch.empty(4, 3, 8, 8, device="meta")
    gm, how = C.capture(model, x, "bn")
    assert how == "fx"
    shapes = {n.target: tuple(n.meta["tensor_meta"].shape) for n in gm.graph.nodes
              if n.op == "call_module"}
    assert shapes == {"0": (4, 8, 6, 6), "1": (4, 8, 6, 6), "2": (4, 8, 6, 6),
                      "3": (4, 288), "4": (4, 5), "5": (4, 5)}

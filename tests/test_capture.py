

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

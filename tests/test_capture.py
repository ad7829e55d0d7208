

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

"""The trace a launcher ships to its workers (explorer/engine/runtime/traces.py): it comes
back node for node and computes the same step; what does not come back is traced again."""

from __future__ import annotations

import torch

from explorer.engine.core.opgraph import opgraph_digest
from explorer.engine.runtime import opexec, traces
from explorer.engine.runtime.reference import traced_step


def test_a_shipped_trace_comes_back_node_for_node_and_computes_the_same_step():
    g, params, buffers, x = opexec._build("lenet5", 2, {}, 0, 0.01, fresh=True)
    back = traces.unpickle_trace(traces.pickle_trace(g))
    assert back is not None
    assert [(n.name, n.op, str(n.target)) for n in back.gm.graph.nodes] == \
        [(n.name, n.op, str(n.target)) for n in g.gm.graph.nodes]
    assert opgraph_digest(back) == opgraph_digest(g)
    assert back.loss == g.loss and back.param_names == g.param_names
    loss, new = traced_step(g, params, buffers, x)[:2]
    loss2, new2 = traced_step(back, params, buffers, x)[:2]
    assert loss == loss2
    assert all(torch.equal(new[k], new2[k]) for k in new)


def test_a_damaged_shipment_is_traced_again_not_run():
    g = opexec._build("lenet5", 2, {}, 0, 0.01, fresh=True)[0]
    fields, module, names = traces.pickle_trace(g)
    assert traces.unpickle_trace((fields, module[: len(module) // 2], names)) is None
    assert traces.unpickle_trace((fields, module, "another graph")) is None
    # a worker given a damaged shipment traces the step itself
    key = opexec._trace_key("lenet5", 2, {}, 0, 0.01, torch.float64)
    opexec._SHIPPED[key] = (fields, b"", names)
    opexec._TRACES.clear()
    try:
        again = opexec._build("lenet5", 2, {}, 0, 0.01)[0]
    finally:
        opexec._SHIPPED.clear()
    assert opgraph_digest(again) == opgraph_digest(g)


def test_the_compiled_placement_ships_the_meta_step_traced_once(monkeypatch):
    """The compiled placement's workers get the plan's meta-device step from the launcher
    (kept in the capture cache), the same graph as a fresh trace; a second launch reads it
    back without tracing."""
    from unittest import mock

    from explorer.engine.core import opgraph
    from explorer.engine.runtime import compiled
    monkeypatch.delenv("EXPLORER_CAPTURE_CACHE", raising=False)   # this test's home's own
    real = opgraph.build_opgraph
    spy = mock.Mock(wraps=real)
    monkeypatch.setattr(opgraph, "build_opgraph", spy)
    blob = compiled._meta_step("lenet5", 4, {}, 0.01)
    assert compiled._meta_step("lenet5", 4, {}, 0.01) == blob
    assert [c.args[0] for c in spy.call_args_list] == ["lenet5"]
    g = compiled._shipped_step(blob)
    assert g is not None and g.gm is not None
    assert opgraph_digest(g) == opgraph_digest(real("lenet5", 4, {}, 0.01))

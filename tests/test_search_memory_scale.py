"""Issue 30's memory and table-building changes: the undo records' compact indices, each
layout stacked once while the tables are built, and the layouts dropped afterwards - the
tables, choices and objectives stay those of the unchanged paths (small device counts)."""

import numpy as np
import pytest

from explorer.engine.core import geometry as G
from explorer.engine.core.devices import preset
from explorer.engine.core.importer import import_spec
from explorer.engine.layerwise import optcnn
from explorer.engine.layerwise.costmodel import CostModel


def test_compact_index_keeps_the_values_in_the_smallest_type():
    arg = np.array([[0, 5], [32767, 2]], dtype=np.int64)
    small = optcnn.compact_index(arg, 32768)
    assert small.dtype == np.int16 and np.array_equal(small, arg)
    wide = optcnn.compact_index(arg + 1, 32769)
    assert wide.dtype == np.int32 and np.array_equal(wide, arg + 1)
    huge = np.array([[1 << 40]], dtype=np.int64)
    assert optcnn.compact_index(huge, (1 << 40) + 1) is huge


@pytest.mark.parametrize("model", ["inception_v3", "resnet50"])
def test_solve_with_compact_undo_records_equals_int64(model, monkeypatch):
    g = import_spec(model)
    tables = CostModel(g, preset("p100-cluster", 16), degrees="pow2").tables()
    choice, trace, info = optcnn.solve(tables)
    monkeypatch.setattr(optcnn, "compact_index", lambda arg, n: arg)
    choice64, trace64, info64 = optcnn.solve(tables)
    assert choice == choice64 and trace == trace64 and info == info64
    assert all(type(v) is int for v in choice.values())


def _stack_counter(monkeypatch):
    made = []
    real = G.stacked_boxes

    def counted(layer, cfgs):
        made.append((layer.out_shape, layer.axes, len(cfgs)))
        return real(layer, cfgs)

    monkeypatch.setattr(G, "stacked_boxes", counted)
    return made


def test_layer_groups_do_not_evict_the_layouts_edges_read(monkeypatch):
    # every layer's costs by total degree (GROUP_ROWS 0): the groups' boxes were put in the
    # layouts' LRU and evicted the whole lists, which the edges then stacked again
    g = import_spec("inception_v3")
    cm = CostModel(g, preset("p100-cluster", 64), degrees="pow2")
    cm.GROUP_ROWS = 0
    made = _stack_counter(monkeypatch)
    tables = cm.tables()
    wanted = {(g.layer(n).out_shape, g.layer(n).axes, G.reduction_size(g.layer(n)),
               cm.candidates_key(tables.candidates[n])) for n in g.names()}
    # at most twice per layout the tables read: once for the layer costs, once more for the
    # edges after the LRU (12) let it go (85 stackings for these 30 layouts before)
    assert len(made) <= 2 * len(wanted), (len(made), len(wanted))
    assert not cm._group_stacks and not cm._stack_cache and not cm._tile_cache

    ref = CostModel(g, preset("p100-cluster", 64), degrees="pow2")
    ref.GROUP_ROWS = 10 ** 12
    rt = ref.tables()
    for n in g.names():
        assert np.array_equal(tables.t_compute[n], rt.t_compute[n]), n
        assert np.array_equal(tables.t_sync[n], rt.t_sync[n]), n
        assert np.array_equal(tables.memory[n], rt.memory[n]), n
    for (e, m), (_, mr), nb, nbr in zip(tables.edges, rt.edges, tables.bytes_xfer,
                                        rt.bytes_xfer):
        assert np.array_equal(m, mr) and np.array_equal(nb, nbr), (e.src, e.dst)


def test_layouts_are_rebuilt_after_the_tables_dropped_them():
    g = import_spec("resnet50")
    cm = CostModel(g, preset("p100-cluster", 32), degrees="pow2")
    tables = cm.tables()
    assert not cm._stack_cache and not cm._tile_cache
    # a later reader (the views, another pin set) stacks them again: the same boxes
    name = g.names()[3]
    cs = tables.candidates[name]
    tiles, red, owned, used = cm._stacked_all(g.layer(name), cs)
    want = G.stacked_boxes(g.layer(name), cs)
    assert np.array_equal(tiles, want[0]) and np.array_equal(owned, want[2])
    assert np.array_equal(used, want[3])
    again = CostModel(g, preset("p100-cluster", 32), degrees="pow2")
    assert optcnn.solve(again.tables())[0] == optcnn.solve(tables)[0]

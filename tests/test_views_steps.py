"""The Elimination steps tab and the collapsed graph as pure functions: the stepper's controls,
the groups a step opens and closes, the nested layout of opened groups, a group's
configuration mix, and elements whose classes always say what to show."""

import pytest
from dash import no_update

from explorer import service as session
from explorer.views import graph, ids, steps
from explorer.views import graph_layout as L


def test_step_box_slider_and_buttons_agree():
    assert steps.step_control(ids.STEP_INPUT, 17, 3, 282) == (17, no_update)
    assert steps.step_control(ids.STEP_INPUT, 900, 3, 282) == (282, 282)   # kept in range
    assert steps.step_control(ids.STEP_INPUT, 0, 3, 282) == (1, 1)
    assert steps.step_control(ids.STEP_INPUT, None, 3, 282) == (no_update, no_update)
    assert steps.step_control(ids.STEP_NEXT, None, None, 282) == (1, 1)
    assert steps.step_control(ids.STEP_NEXT, None, 282, 282) == (282, 282)
    assert steps.step_control(ids.STEP_PREV, None, 5, 282) == (4, 4)
    assert steps.step_control(ids.STEP_SLIDER, 4, 40, 282) == (no_update, 40)


def _overlaps(boxes):
    return [(a, b) for i, a in enumerate(boxes) for b in boxes[i + 1:]
            if a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]]


def test_opened_groups_get_boxes_that_cover_nothing_else():
    # a chain of 30 units, every third an opened group of 5 members in a diamond
    tops, edges, boxes = [], [], {}
    for i in range(30):
        u = f"g{i}" if i % 3 == 0 else f"u{i}"
        tops.append(u)
        if i:
            edges.append((tops[i - 1], u))
        if u.startswith("g"):
            ms = [f"{u}.{k}" for k in range(5)]
            boxes[u] = (ms, [(ms[0], ms[1]), (ms[0], ms[2]), (ms[1], ms[3]), (ms[2], ms[3]),
                             (ms[3], ms[4])])
    pos = L.nested_positions(tops, edges, boxes)
    assert set(pos) == {u for u in tops if u not in boxes} | {m for ms, _ in boxes.values()
                                                              for m in ms}
    rects = []
    for gid, (ms, _) in boxes.items():
        xs, ys = [pos[m][0] for m in ms], [pos[m][1] for m in ms]
        rects.append((min(xs) - 30, min(ys) - 30, max(xs) + 30, max(ys) + 30))
    assert _overlaps(rects) == []
    for u in tops:
        if u not in boxes:
            x, y = pos[u]
            assert not any(r[0] <= x <= r[2] and r[1] <= y <= r[3] for r in rects), u
    # without boxes it is the plain layered layout
    assert L.nested_positions(["a", "b"], [("a", "b")], {}) == \
        L.layered_positions(["a", "b"], [("a", "b")])


def test_a_group_shows_its_configuration_mix():
    labels = ["n2"] * 9 + ["n2 c2"] * 3
    colors = {"n2": "#111111", "n2 c2": "#222222"}
    assert graph.mix_text(labels) == "9×n2, 3×n2 c2"
    pie = graph.pie_data(labels, colors)
    assert (pie["pie1c"], pie["pie1s"], pie["pie2c"], pie["pie2s"]) == \
        ("#111111", 75.0, "#222222", 25.0)
    assert sum(pie[f"pie{i}s"] for i in range(1, graph.PIE_SLICES + 1)) == 100.0
    # more configurations than slices: the rest share one grey slice
    many = [f"n{k}" for k in range(10)]
    pie = graph.pie_data(many, {})
    assert round(sum(pie[f"pie{i}s"] for i in range(1, graph.PIE_SLICES + 1)), 6) == 100.0


@pytest.mark.slow
def test_steps_open_only_their_groups_and_every_element_says_its_classes():
    req = session.Request(model="inception_v3", preset="p100-nvlink-4", devices=2, batch=8)
    plan = session.search(req, [], keep_trace=True)
    doc = dict(req.to_dict(), pins=[])
    trace = session.trace_of(plan)
    first = next(i for i, s in enumerate(trace) if s["kind"] == "node"
                 and steps.groups_needed(i, plan, doc, []))
    expanded, mine = steps.step_groups(first, plan, doc, ["group:Mixed_7c"], [])
    assert mine and set(mine) <= set(expanded) and "group:Mixed_7c" in expanded
    # the next step in other groups closes the former step's groups, not the user's
    later = next(i for i in range(first + 1, len(trace))
                 if steps.groups_needed(i, plan, doc, []) - set(mine))
    again, mine2 = steps.step_groups(later, plan, doc, expanded, mine)
    assert "group:Mixed_7c" in again and not (set(mine) - set(mine2)) & set(again)
    # leaving the tab closes what the stepper opened
    assert steps.step_groups(None, plan, doc, again, mine2) == (["group:Mixed_7c"], [])
    els, _ = graph.build_elements(req, plan, again, later)
    assert all("classes" in e for e in els)         # an update never keeps a former ring
    groups = [e["data"] for e in els if e["data"].get("kind") == "group"]
    assert groups and all(e["mix"] for e in groups)

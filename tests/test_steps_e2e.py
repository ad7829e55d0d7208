"""End-to-end (headless Chromium): the Elimination steps tab on a collapsed graph
(Inception-v3, 11 module groups) as a person steps through it.

Rings mark only the current step's layers, never a group a former step ringed; the groups a
step opens close again when the step moves on, and opened groups never cover one another; the
step box jumps on Enter; the stepper and the graph it highlights fit one 1400×900 window; a
collapsed group shows its members' configuration mix.
"""

import os
import re
import time

import pytest
from selenium.webdriver.common.keys import Keys

from explorer.app import create_app
from explorer.service import Request
from explorer.views import ids

pytestmark = [pytest.mark.browser, pytest.mark.slow]

INCEPTION = Request(model="inception_v3", preset="p100-nvlink-4", devices=2, batch=8)
RINGS = ("current", "nbr", "residual", "assigned")

NODES = """
const cy = document.getElementById(arguments[0])._cyreg.cy;
return cy.nodes().map(n => [n.id(), n.classes().join(' '), n.data('kind') || '']);
"""
BOXES = """
const cy = document.getElementById(arguments[0])._cyreg.cy;
return cy.nodes('[kind = "parent"]').map(g => {
    const b = g.boundingBox({includeLabels: false}); return [g.id(), b.x1, b.y1, b.x2, b.y2];
});
"""
RECT = """
const e = document.getElementById(arguments[0]); if (!e) { return null; }
const r = e.getBoundingClientRect(); return [r.top, r.bottom, window.innerHeight];
"""


def until(pred, timeout=30, what="condition"):
    end = time.time() + timeout
    last = None
    while time.time() < end:
        try:
            last = pred()
        except Exception as exc:               # noqa: BLE001 - the page is still rendering
            last = exc
        if last and not isinstance(last, Exception):
            return last
        time.sleep(0.25)
    raise AssertionError(f"timed out waiting for {what} (last: {last!r})")


def start(duo, width=1500, height=1100):
    duo.driver.set_window_size(width, height)
    duo.start_server(create_app(INCEPTION))
    duo.wait_for_contains_text("#objective-value", "ms", timeout=120)


def open_steps(duo):
    duo.driver.execute_script(
        "[...document.querySelectorAll('#tabs .tab')]"
        ".find(t => t.textContent.trim() === 'Elimination steps').click()")
    duo.wait_for_contains_text(f"#{ids.STEP_TEXT}", "node eliminations", timeout=30)


def go_to(duo, step: int) -> str:
    """Type ``step`` in the step box, press Enter; the step's text once shown."""
    box = duo.find_element(f"#{ids.STEP_INPUT}")
    box.send_keys(Keys.CONTROL, "a")
    box.send_keys(str(step), Keys.ENTER)
    duo.wait_for_contains_text(f"#{ids.STEP_TEXT}", f"Step {step}/", timeout=20)
    return duo.find_element(f"#{ids.STEP_TEXT}").text


def names_in(text: str) -> set:
    """The layers a step's text names (the layer, its neighbours)."""
    m = re.search(r"node elimination: (\S+) has one in-edge \(from (\S+)\) and one "
                  r"out-edge \(to (\S+)\)", text)
    if m:
        return set(m.groups())
    m = re.search(r"edge elimination: two edges (\S+) → (\S+) merge", text)
    if m:
        return set(m.groups())
    m = re.search(r"undo: (\S+) gets the configuration", text)
    return {m.group(1)} if m else set()


def ringed(duo) -> dict:
    return {n: cls for n, cls, _ in duo.driver.execute_script(NODES, ids.GRAPH)
            if any(r in cls.split() for r in RINGS)}


def overlapping(boxes) -> list:
    return [(a[0], b[0]) for i, a in enumerate(boxes) for b in boxes[i + 1:]
            if a[1] < b[3] and b[1] < a[3] and a[2] < b[4] and b[2] < a[4]]


def test_rings_clear_at_every_later_step(dash_duo):
    start(dash_duo)
    open_steps(dash_duo)
    for step in (1, 2, 30, 120, 200, 250):
        text = go_to(dash_duo, step)
        want = names_in(text)
        if not want:                            # the final graph rings its own nodes
            continue
        until(lambda: set(ringed(dash_duo)) <= want and ringed(dash_duo), 20,
              f"only {sorted(want)} ringed at step {step}, not {ringed(dash_duo)}")


def test_step_box_jumps_on_enter(dash_duo):
    start(dash_duo)
    open_steps(dash_duo)
    text = go_to(dash_duo, 17)
    assert text.startswith("Step 17/")
    slider = dash_duo.driver.execute_script(
        "return document.querySelector('#' + arguments[0] + ' [role=slider]')"
        ".getAttribute('aria-valuenow');", ids.STEP_SLIDER)
    assert slider == "17"


def test_groups_a_step_opens_close_again_and_never_overlap(dash_duo):
    start(dash_duo)
    open_steps(dash_duo)
    opened_by = {}
    for step in (1, 40, 80, 120, 160, 200):
        want = names_in(go_to(dash_duo, step))
        until(lambda: want <= {n for n, _, k in dash_duo.driver.execute_script(NODES, ids.GRAPH)
                               if k == "layer"}, 20, f"the layers of step {step} shown")
        time.sleep(0.5)
        boxes = dash_duo.driver.execute_script(BOXES, ids.GRAPH)
        opened_by[step] = [b[0] for b in boxes]
        assert len(boxes) <= 3, f"step {step}: groups pile up: {opened_by}"
        assert overlapping(boxes) == [], f"step {step}: {overlapping(boxes)}"
    snap(dash_duo, "inception-steps.png")


def test_stepper_and_graph_fit_a_1400x900_window(dash_duo):
    start(dash_duo, 1400, 900)
    open_steps(dash_duo)
    dash_duo.find_element(f"#{ids.STEP_NEXT}").click()
    dash_duo.wait_for_contains_text(f"#{ids.STEP_TEXT}", "Step 1/", timeout=20)
    time.sleep(1.0)

    def visible(elem_id):
        top, bottom, height = dash_duo.driver.execute_script(RECT, elem_id)
        return top >= 0 and bottom <= height
    assert visible(ids.STEP_NEXT) and visible(ids.STEP_SLIDER) and visible(ids.STEP_TEXT)
    assert visible(ids.GRAPH)
    snap(dash_duo, "steps-beside-graph.png")


def test_a_collapsed_group_shows_its_configuration_mix(dash_duo):
    start(dash_duo)
    mixed = dash_duo.driver.execute_script("""
        const cy = document.getElementById(arguments[0])._cyreg.cy;
        return cy.nodes('[kind = "group"]').filter(n => n.data('mix').includes(','))
            .map(n => [n.id(), n.data('mix'), n.style('pie-1-background-color'),
                       n.style('pie-2-background-color'), n.style('pie-1-background-size')]);
        """, ids.GRAPH)
    assert mixed, "no group with mixed configurations"
    gid, mix, c1, c2, size = mixed[0]
    assert re.fullmatch(r"\d+×[^,]+(, \d+×[^,]+)+", mix), mix
    assert c1 != c2 and float(size.rstrip("%")) < 100


def snap(duo, name):
    """Save a screenshot to ``$EXPLORER_SCREENSHOTS/name`` when that folder is set."""
    folder = os.environ.get("EXPLORER_SCREENSHOTS")
    if folder:
        duo.driver.save_screenshot(os.path.join(folder, name))

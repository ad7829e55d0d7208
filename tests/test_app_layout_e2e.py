"""End-to-end (headless Chromium): what a page looks like before and after its first result -
figures with nothing to show say what to press instead of drawing empty axes, and a result
appears next to the button that asked for it."""

import time

import pytest

from explorer.app import create_app
from explorer.views import ids

pytestmark = [pytest.mark.browser, pytest.mark.slow]

LENET = "model=lenet5&devices=2&preset=local&batch=8"

#: every plotly figure shown on the page: its id, whether it draws axis ticks, its text
FIGURES = """
return [...document.querySelectorAll('.js-plotly-plot')]
    .filter(g => g.offsetParent !== null)
    .map(g => [g.parentElement.id || g.id, g.querySelectorAll('.xtick, .ytick').length,
               g.textContent]);
"""
RECT = "const r = document.getElementById(arguments[0]).getBoundingClientRect();" \
       "return [r.top, r.bottom];"


def until(pred, timeout=30, what="condition"):
    end = time.time() + timeout
    while time.time() < end:
        try:
            got = pred()
        except Exception:                      # noqa: BLE001 - the page is still rendering
            got = None
        if got:
            return got
        time.sleep(0.25)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.mark.parametrize("page,mark", [("tofu", ".tofu-page"),
                                       ("placement", ".placement-page")])
def test_figures_before_anything_ran_say_what_to_press(dash_duo, page, mark):
    dash_duo.start_server(create_app())
    dash_duo.driver.get(f"{dash_duo.server_url.rstrip('/')}/{page}?{LENET}&algo=optcnn")
    dash_duo.wait_for_element(mark, timeout=60)
    figs = until(lambda: dash_duo.driver.execute_script(FIGURES), 30, "the figures")
    time.sleep(1.0)
    figs = dash_duo.driver.execute_script(FIGURES)
    assert figs
    for fid, ticks, text in figs:
        assert ticks == 0, f"{fid} draws empty axes"
        assert "press" in text, f"{fid} does not say what to press: {text!r}"
        assert " ns" not in text


def test_tofu_compare_appears_right_under_its_button(dash_duo):
    dash_duo.driver.set_window_size(1400, 1000)
    dash_duo.start_server(create_app())
    dash_duo.driver.get(f"{dash_duo.server_url.rstrip('/')}/tofu?{LENET}&algo=icml18")
    dash_duo.wait_for_contains_text("#tofu-headline", "icml18", timeout=120)
    dash_duo.find_element(f"#{ids.TOFU_COMPARE_BUTTON}").click()
    until(lambda: dash_duo.driver.execute_script(
        "const g = document.getElementById(arguments[0]);"
        "return g && g.offsetParent !== null && g.querySelectorAll('.bars, .trace').length;",
        ids.TOFU_COMPARE), 180, "the comparison")
    button = dash_duo.driver.execute_script(RECT, ids.TOFU_COMPARE_BUTTON)
    figure = dash_duo.driver.execute_script(RECT, ids.TOFU_COMPARE)
    assert 0 <= figure[0] - button[1] < 150, (button, figure)

"""End-to-end (headless Chromium): what a page shows always says which request it answers.

Results made before the form changed carry a banner until Search runs again; a status line
never announces a figure that is already drawn; the address keeps what a person would share
(tab, selected layer, elimination step), so a reload opens the same view.
"""

import time

import pytest

from _helpers import TAP
from explorer.app import create_app
from explorer.service import Request
from explorer.views import ids

pytestmark = [pytest.mark.browser, pytest.mark.slow]

LENET = Request(model="lenet5", preset="local", devices=2, batch=8)


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


def banner(duo, family):
    """The stale banner's text when it is shown, else ``None``."""
    return duo.driver.execute_script(
        "const e = document.getElementById(arguments[0]);"
        "return e && !e.hidden && e.offsetParent !== null ? e.textContent : null;",
        ids.STALE + family)


def pick(duo, selector, text, timeout=10):
    """Choose the dropdown option whose label is ``text`` or starts with ``text + " "``."""
    from selenium.webdriver.common.by import By
    duo.find_element(selector).click()
    end = time.time() + timeout
    while time.time() < end:
        for opt in duo.driver.find_elements(By.CSS_SELECTOR, ".dash-dropdown-option"):
            label = opt.text.strip()
            if label == text or label.startswith(text + " ") or label.endswith(" " + text):
                opt.click()
                return
        time.sleep(0.2)
    raise AssertionError(f"no option {text!r} in {selector}")


def tab(duo, label):
    duo.driver.execute_script(
        "[...document.querySelectorAll('#tabs .tab')]"
        ".find(t => t.textContent.trim() === arguments[0]).click()", label)


def test_a_changed_form_marks_the_shown_results_stale_until_search(dash_duo):
    dash_duo.start_server(create_app(LENET))
    dash_duo.wait_for_contains_text("#objective-value", "ms", timeout=90)
    assert banner(dash_duo, "layerwise") is None
    pick(dash_duo, f"#{ids.MODEL_DROPDOWN}", "mlp")
    text = until(lambda: banner(dash_duo, "layerwise"), 15, "the stale banner")
    assert "lenet5" in text and "mlp" in text and "press Search" in text
    assert "stale" in dash_duo.find_element(f"#{ids.RESULTS}layerwise").get_attribute("class")
    dash_duo.find_element(f"#{ids.SEARCH_BUTTON}").click()
    dash_duo.wait_for_contains_text(f"#{ids.PLAN_SUMMARY}", "mlp", timeout=120)
    until(lambda: banner(dash_duo, "layerwise") is None, 15, "the banner to go")
    assert "stale" not in dash_duo.find_element(f"#{ids.RESULTS}layerwise") \
        .get_attribute("class")
    # the Tofu page: a partition shown, then another device count in the form
    base = dash_duo.server_url.rstrip("/")
    dash_duo.driver.get(f"{base}/tofu?model=lenet5&devices=2&preset=local&algo=icml18&batch=8")
    dash_duo.wait_for_contains_text("#tofu-headline", "icml18", timeout=120)
    assert banner(dash_duo, "tofu") is None
    dev = dash_duo.find_element(f"#{ids.DEVICES_INPUT}")
    dev.clear()
    dev.send_keys("4")
    text = until(lambda: banner(dash_duo, "tofu"), 15, "the Tofu page's stale banner")
    assert "2 × local" in text and "4 × local" in text


def test_compare_status_does_not_say_scaling_next_once_it_is_drawn(dash_duo):
    dash_duo.start_server(create_app(LENET))
    dash_duo.wait_for_contains_text("#objective-value", "ms", timeout=90)
    tab(dash_duo, "Compare")
    dash_duo.wait_for_contains_text(f"#{ids.COMPARE_STATUS}", "fastest", timeout=120)
    # the scaling figure is drawn in a second step: then the status gives its time
    until(lambda: dash_duo.driver.execute_script(
        "const g = document.getElementById(arguments[0]);"
        "return g && g.querySelectorAll('.scatterlayer .trace').length > 0;",
        ids.COMPARE_SCALING), 120, "the scaling figure")
    until(lambda: "scaling next" not in dash_duo.find_element(f"#{ids.COMPARE_STATUS}").text,
          15, "the status to give the scaling time")
    assert "scaling" in dash_duo.find_element(f"#{ids.COMPARE_STATUS}").text


def test_the_url_keeps_tab_layer_and_step_and_a_reload_restores_them(dash_duo):
    dash_duo.start_server(create_app(LENET))
    dash_duo.wait_for_contains_text("#objective-value", "ms", timeout=90)
    until(lambda: dash_duo.driver.execute_script(TAP, ids.GRAPH, "conv2") == "ok", 15,
          "a tap on conv2")
    dash_duo.wait_for_contains_text(f"#{ids.DETAILS}", "conv2", timeout=20)
    tab(dash_duo, "Elimination steps")
    dash_duo.wait_for_contains_text(f"#{ids.STEP_TEXT}", "node eliminations", timeout=30)
    for _ in range(3):
        dash_duo.find_element(f"#{ids.STEP_NEXT}").click()
    dash_duo.wait_for_contains_text(f"#{ids.STEP_TEXT}", "Step 3/", timeout=20)
    until(lambda: all(p in dash_duo.driver.current_url
                      for p in ("tab=steps", "layer=conv2", "step=3")), 15,
          "the address to keep the view")
    url = dash_duo.driver.current_url
    assert "model=lenet5" in url
    dash_duo.driver.refresh()
    dash_duo.wait_for_contains_text(f"#{ids.STEP_TEXT}", "Step 3/", timeout=90)
    assert dash_duo.driver.current_url == url
    active = dash_duo.driver.execute_script(
        "return document.querySelector('#tabs .tab--selected').textContent.trim();")
    assert active == "Elimination steps"
    dash_duo.wait_for_contains_text(f"#{ids.DETAILS}", "conv2", timeout=20)
    # the Learn page keeps its tab the same way
    base = dash_duo.server_url.rstrip("/")
    dash_duo.driver.get(f"{base}/learn")
    dash_duo.wait_for_element(".learn-page", timeout=30)
    dash_duo.driver.execute_script(
        "[...document.querySelectorAll('#learn-tabs .tab')]"
        ".find(t => t.textContent.includes('Tofu Fig. 1')).click()")
    until(lambda: "s=tofu-" in dash_duo.driver.current_url, 15, "the Learn tab in the URL")
    url = dash_duo.driver.current_url
    dash_duo.driver.refresh()
    dash_duo.wait_for_element(".learn-page", timeout=30)
    active = dash_duo.driver.execute_script(
        "return document.querySelector('#learn-tabs .tab--selected').textContent.trim();")
    assert "Tofu Fig. 1" in active and dash_duo.driver.current_url == url


@pytest.mark.parametrize("pin", ["nosuchlayer=n=2", "garbage"])
def test_a_bad_pin_in_the_url_keeps_the_page_and_names_the_layers(dash_duo, pin):
    """A shared link whose pin cannot apply: the (valid) model's graph, summary and plan are
    still shown, unpinned, and one line under the form names the pin, the reason and - for a
    layer that does not exist - the model's layers, on the page (not "see the command line")."""
    from urllib.parse import quote
    dash_duo.start_server(create_app(LENET))
    dash_duo.wait_for_contains_text("#objective-value", "ms", timeout=90)
    base = dash_duo.server_url.rstrip("/")
    dash_duo.driver.get(f"{base}/?model=lenet5&devices=2&preset=local&pin={quote(pin)}")
    dash_duo.wait_for_contains_text(f"#{ids.REQUEST_ERROR}", f"URL: pins {pin} ignored",
                                    timeout=90)
    dash_duo.wait_for_contains_text("#objective-value", "ms", timeout=30)
    layers = until(lambda: dash_duo.driver.execute_script(
        "const el = document.getElementById(arguments[0]);"
        "const cy = el && el._cyreg && el._cyreg.cy;"
        "return cy ? cy.nodes().map(n => n.id()) : null;", ids.GRAPH), 30, "the graph")
    assert "conv1" in layers and "fc3" in layers
    error = dash_duo.find_element(f"#{ids.REQUEST_ERROR}").text
    assert "command line" not in error and "\n" not in error.strip()
    if pin.startswith("nosuchlayer"):
        assert "conv1" in error and "fc3" in error
    assert dash_duo.find_element(f"#{ids.PIN_LIST}").text == ""

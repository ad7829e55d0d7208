"""End-to-end (headless Chromium): the app's pages - layer-wise (``/``), Tofu (``/tofu``),
placement (``/placement``), Plans (``/plans``) - share the request: the header's links carry
it from page to page, and each page's address opens the same state again on reload."""

import time

import pytest

from _helpers import open_page, page_path
from explorer.app import create_app
from explorer.service import Request
from explorer.views import ids

pytestmark = pytest.mark.browser

LENET = Request(model="lenet5", preset="local", devices=2, batch=8)


def _form(duo):
    """What the form shows: model, devices, preset, batch and method."""
    return {"model": duo.find_element(f"#{ids.MODEL_DROPDOWN}").text,
            "devices": duo.find_element(f"#{ids.DEVICES_INPUT}").get_attribute("value"),
            "batch": duo.find_element(f"#{ids.BATCH_INPUT}").get_attribute("value"),
            "preset": duo.find_element(f"#{ids.PRESET_DROPDOWN}").text,
            "algo": duo.find_element(f"#{ids.ALGO_DROPDOWN}").text}


def _until(pred, timeout=30, what="condition"):
    end = time.time() + timeout
    while time.time() < end:
        try:
            if pred():
                return
        except Exception:                      # noqa: BLE001 - the page is still rendering
            pass
        time.sleep(0.2)
    raise AssertionError(f"{what} not met in {timeout} s")


def test_navigating_between_family_pages_keeps_the_request(dash_duo):
    dash_duo.start_server(create_app())
    dash_duo.wait_for_contains_text("#objective-value", "ms", timeout=90)
    # the request changes on the layer-wise page: another model and device count
    dev = dash_duo.find_element(f"#{ids.DEVICES_INPUT}")
    dev.clear()
    dev.send_keys("2")
    dash_duo.select_dcc_dropdown(f"#{ids.PRESET_DROPDOWN}", value="local")
    _until(lambda: "devices=2" in dash_duo.driver.current_url
           and "preset=local" in dash_duo.driver.current_url, 15, "URL follows the form")
    open_page(dash_duo, "Tofu")
    assert page_path(dash_duo) == "/tofu"
    got = _form(dash_duo)
    assert "vgg16" in got["model"] and got["devices"] == "2" and "local" in got["preset"]
    assert "devices=2" in dash_duo.driver.current_url
    dash_duo.wait_for_contains_text(f"#{ids.CONTEXT}tofu", "vgg16 · batch", timeout=15)
    assert "2 × local" in dash_duo.find_element(f"#{ids.CONTEXT}tofu").text
    # a change on the Tofu page goes on to the placement page, then back to layer-wise
    dash_duo.find_element(f"#{ids.BATCH_INPUT}").send_keys("8")
    _until(lambda: "batch=8" in dash_duo.driver.current_url, 15, "URL has the batch")
    open_page(dash_duo, "Placement")
    assert page_path(dash_duo) == "/placement"
    got = _form(dash_duo)
    assert "vgg16" in got["model"] and got["devices"] == "2" and got["batch"] == "8"
    dash_duo.wait_for_contains_text(f"#{ids.CONTEXT}placement", "vgg16 · batch 8 · 2 × local",
                                    timeout=15)
    open_page(dash_duo, "Plans")
    dash_duo.wait_for_contains_text(f"#{ids.CONTEXT}plans", "vgg16 · batch 8 · 2 × local",
                                    timeout=15)
    open_page(dash_duo, "Layer-wise")
    dash_duo.wait_for_contains_text(f"#{ids.PLAN_SUMMARY}", "vgg16 · batch 8", timeout=90)
    assert _form(dash_duo)["devices"] == "2"
    assert dash_duo.get_logs() == []


def _pick_method(duo, name, timeout=10):
    """Choose method ``name`` in the form (its option reads "tensor partitioning · NAME")."""
    duo.find_element(f"#{ids.ALGO_DROPDOWN}").click()
    end = time.time() + timeout
    while time.time() < end:
        for opt in duo.driver.find_elements("css selector", ".dash-dropdown-option"):
            if opt.text.strip().endswith(" " + name):
                opt.click()
                return
        time.sleep(0.2)
    raise AssertionError(f"no method {name}")


def test_search_with_another_family_s_method_opens_its_page(dash_duo):
    dash_duo.start_server(create_app(LENET))
    dash_duo.wait_for_contains_text("#objective-value", "ms", timeout=90)
    _pick_method(dash_duo, "icml18")
    _until(lambda: "algo=icml18" in dash_duo.driver.current_url, 15, "URL has the method")
    dash_duo.find_element(f"#{ids.SEARCH_BUTTON}").click()
    dash_duo.wait_for_contains_text("#tofu-headline", "icml18", timeout=120)
    assert page_path(dash_duo) == "/tofu" and "algo=icml18" in dash_duo.driver.current_url
    assert "icml18" in _form(dash_duo)["algo"]


def test_a_tofu_url_opens_the_same_state_on_reload(dash_duo):
    dash_duo.start_server(create_app())
    base = dash_duo.server_url.rstrip("/")
    dash_duo.driver.get(f"{base}/tofu?model=lenet5&devices=2&preset=local&algo=icml18&batch=8")
    dash_duo.wait_for_contains_text("#tofu-headline", "icml18", timeout=120)
    first = (dash_duo.find_element("#tofu-headline").text, _form(dash_duo))
    url = dash_duo.driver.current_url
    dash_duo.driver.refresh()
    dash_duo.wait_for_contains_text("#tofu-headline", "icml18", timeout=120)
    assert dash_duo.driver.current_url == url and page_path(dash_duo) == "/tofu"
    assert (dash_duo.find_element("#tofu-headline").text, _form(dash_duo)) == first
    got = first[1]
    assert "lenet5" in got["model"] and got["devices"] == "2" and got["batch"] == "8"
    assert "icml18" in got["algo"]
    dash_duo.wait_for_contains_text(f"#{ids.CONTEXT}tofu", "lenet5 · batch 8 · 2 × local · "
                                                           "icml18", timeout=15)


def test_a_placement_url_opens_the_same_state_on_reload(dash_duo):
    dash_duo.start_server(create_app())
    base = dash_duo.server_url.rstrip("/")
    dash_duo.driver.get(f"{base}/placement?model=lenet5&devices=2&preset=local&algo=metis"
                        f"&batch=8")
    dash_duo.wait_for_contains_text("#place-headline", "metis", timeout=120)
    first = (dash_duo.find_element("#place-headline").text, _form(dash_duo))
    url = dash_duo.driver.current_url
    dash_duo.driver.refresh()
    dash_duo.wait_for_contains_text("#place-headline", "metis", timeout=120)
    assert dash_duo.driver.current_url == url and page_path(dash_duo) == "/placement"
    assert (dash_duo.find_element("#place-headline").text, _form(dash_duo)) == first
    got = first[1]
    assert "lenet5" in got["model"] and got["devices"] == "2" and "metis" in got["algo"]
    assert "metis" in dash_duo.find_element(f"#{ids.PLACE_ALGO}").text
    # the address of / with a placement method: the layer-wise page links to this one
    dash_duo.driver.get(url.replace("/placement?", "/?"))
    dash_duo.wait_for_contains_text(f"#{ids.FAMILY_HINT}", "metis", timeout=120)
    assert page_path(dash_duo) == "/"
    assert dash_duo.get_logs() == []


def test_a_partition_made_on_the_tofu_page_reopens_on_reload(dash_duo):
    dash_duo.start_server(create_app(LENET))
    dash_duo.wait_for_contains_text("#objective-value", "ms", timeout=90)
    open_page(dash_duo, "Tofu")
    assert "algo=optcnn" in dash_duo.driver.current_url       # the form's method, unchanged
    dash_duo.find_element(f"#{ids.TOFU_BUTTON}").click()
    dash_duo.wait_for_contains_text("#tofu-headline", "communicated", timeout=120)
    # the shown partition's method becomes the request's: the form and the URL follow
    _until(lambda: "algo=tofu" in dash_duo.driver.current_url, 15, "URL has the method")
    assert "tofu" in _form(dash_duo)["algo"]
    headline = dash_duo.find_element("#tofu-headline").text
    dash_duo.driver.refresh()
    dash_duo.wait_for_contains_text("#tofu-headline", "communicated", timeout=120)
    assert dash_duo.find_element("#tofu-headline").text.split(", searched")[0] == \
        headline.split(", searched")[0]

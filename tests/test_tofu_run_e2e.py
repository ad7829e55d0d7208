"""End-to-end (headless Chromium): run a small Tofu plan from the Tofu page, read the numbers
it shows, find it in the plan history; a per-worker memory limit below the plan's peak is
refused with one line."""

import re

import pytest

from _helpers import open_page
from explorer.app import create_app
from explorer.views import ids

pytestmark = pytest.mark.browser


def _open_tofu(dash_duo):
    from explorer.service import Request
    dash_duo.start_server(create_app(Request(model="mlp", preset="local", devices=2, batch=16,
                                             model_args={"layers": "2", "hidden": "64"})))
    dash_duo.wait_for_contains_text("#objective-value", "ms", timeout=60)
    open_page(dash_duo, "Tofu")
    dash_duo.find_element(f"#{ids.TOFU_BUTTON}").click()
    dash_duo.wait_for_contains_text("#tofu-headline", "B communicated", timeout=120)


def _text(dash_duo, selector):
    return dash_duo.find_element(selector).get_attribute("innerText")


def _number(text, pattern):
    m = re.search(pattern, text)
    assert m, text
    return float(m.group(1))


def test_run_a_tofu_plan_from_its_page(dash_duo):
    _open_tofu(dash_duo)
    mem = dash_duo.find_element(f"#{ids.TOFU_RUN_MEMORY}")
    mem.send_keys("1")
    dash_duo.find_element(f"#{ids.TOFU_RUN_BUTTON}").click()
    dash_duo.wait_for_contains_text("#tofu-run-reference", "passed", timeout=180)
    dash_duo.wait_for_contains_text("#tofu-run-peak", "predicted peak", timeout=30)
    memory = _text(dash_duo, "#tofu-run-peak")
    assert _number(memory, r"predicted peak ([\d.]+) (?:B|KiB|MiB|GiB)") > 0
    assert "limit 1.00 GiB" in memory                 # units by magnitude (views/fmt.py)
    times = _text(dash_duo, "#tofu-run-times")
    assert _number(times, r"measured ([\d.]+) ms") > 0
    assert _number(times, r"predicted ([\d.]+) ms") >= 0
    bytes_ = _text(dash_duo, "#tofu-run-bytes")
    pred = _number(bytes_, r"predicted ([\d.]+) MB")
    assert _number(bytes_, r"measured ([\d.]+) MB") == pytest.approx(pred, rel=1e-3)
    dash_duo.wait_for_contains_text(f"#{ids.TOFU_RUN_HISTORY}", "ok", timeout=30)
    # the plan history keeps the Tofu plan
    open_page(dash_duo, "Plans")
    dash_duo.find_element(f"#{ids.PLANS_REFRESH}").click()
    dash_duo.wait_for_contains_text(f"#{ids.PLANS_TABLE}", "tofu", timeout=30)


def test_a_limit_below_the_plan_s_peak_is_refused(dash_duo):
    _open_tofu(dash_duo)
    dash_duo.find_element(f"#{ids.TOFU_RUN_MEMORY}").send_keys("0.000001")
    dash_duo.find_element(f"#{ids.TOFU_RUN_BUTTON}").click()
    dash_duo.wait_for_contains_text(f"#{ids.TOFU_RUN_ERROR}", "over --memory-per-worker",
                                    timeout=120)

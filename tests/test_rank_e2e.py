"""End-to-end (headless Chromium): the Compare tab's "Rank by running" searches the ticked
methods, runs every plan on local workers and shows τ, the regret, the noise seen and a row
per plan - kept tiny: LeNet-5 on 2 workers, 2 methods, 1 round of 1 step."""

import time

import pytest

from _helpers import until

from explorer.app import create_app
from explorer.views import ids

pytestmark = [pytest.mark.browser, pytest.mark.slow]

QUERY = "?model=lenet5&devices=2&preset=local&algo=optcnn&batch=8&tab=compare"
KEEP = {"data", "celeritas"}
SCREENSHOT = "/tmp/rank-button.png"

ROWS = """
return [...document.querySelectorAll('#rank-table .ag-center-cols-container .ag-row')]
  .map(r => Object.fromEntries(['measured_rank', 'method', 'family', 'predicted', 'median',
      'min', 'error', 'predicted_rank', 'check'].map(id => {
        const c = r.querySelector('.ag-cell[col-id="' + id + '"]');
        return [id, c ? c.textContent.trim() : null]; })));
"""
#: untick every method but those in arguments[0] (the label's text is the method)
UNTICK = """
const keep = arguments[0];
for (const label of document.querySelectorAll('.rank-methods label')) {
  const box = label.querySelector('input[type=checkbox]');
  if (box && box.checked && !keep.includes(label.textContent.trim())) box.click();
}
return [...document.querySelectorAll('.rank-methods label')]
  .filter(l => l.querySelector('input').checked).map(l => l.textContent.trim());
"""


def _type(duo, cid, text):
    box = duo.find_element(f"#{cid}")
    box.clear()
    box.send_keys(text)


def test_rank_by_running_shows_tau_regret_noise_and_a_row_per_plan(dash_duo):
    dash_duo.driver.set_window_size(1400, 1300)
    dash_duo.start_server(create_app())
    base = dash_duo.server_url.rstrip("/") + "/"
    # another preset: the button is off, and one line says why
    dash_duo.driver.get(base + QUERY.replace("preset=local", "preset=p100-cluster"))
    dash_duo.wait_for_contains_text(f"#{ids.RANK_GATE}", "choose the 'local' devices preset",
                                    timeout=90)
    assert not dash_duo.find_element(f"#{ids.RANK_BUTTON}").is_enabled()
    dash_duo.driver.get(base + QUERY)
    dash_duo.wait_for_contains_text(f"#{ids.CONTEXT}compare", "local", timeout=90)
    button = dash_duo.find_element(f"#{ids.RANK_BUTTON}")
    until(lambda: button.is_enabled(), 30, "the button on for the local preset")
    assert dash_duo.find_element(f"#{ids.RANK_GATE}").text == ""
    assert not dash_duo.find_element(f"#{ids.RANK_RESULTS}").is_displayed()
    # a bad count is one line on the page, and nothing runs
    _type(dash_duo, ids.RANK_ROUNDS, "0")
    button.click()
    dash_duo.wait_for_contains_text(f"#{ids.RANK_ERROR}", "rounds: enter a whole number",
                                    timeout=60)
    assert "\n" not in dash_duo.find_element(f"#{ids.RANK_ERROR}").text
    # two methods, one round of one step
    assert set(dash_duo.driver.execute_script(UNTICK, sorted(KEEP))) == KEEP
    _type(dash_duo, ids.RANK_ROUNDS, "1")
    _type(dash_duo, ids.RANK_STEPS, "1")
    until(lambda: button.is_enabled(), 30, "the button back after the refused job")
    button.click()
    rows = until(lambda: [r for r in dash_duo.driver.execute_script(ROWS) if r["method"]]
                  or None, 300, "the ranking's table")
    assert {r["method"] for r in rows} == KEEP, rows
    assert dash_duo.find_element(f"#{ids.RANK_ERROR}").text == ""
    for r in rows:
        assert r["measured_rank"] in ("1", "2") and r["predicted_rank"] in ("1", "2")
        assert r["predicted"].endswith("s") and r["median"].endswith("s"), r
        assert r["min"] == r["median"]                      # one round: its median is its min
        assert r["error"].endswith("%") and r["check"] == "ok"
    assert [r["measured_rank"] for r in rows] == ["1", "2"]      # fastest measured first
    summary = dash_duo.find_element(f"#{ids.RANK_SUMMARY}").text
    assert "Kendall τ +1.00" in summary or "Kendall τ -1.00" in summary, summary
    assert "regret " in summary and "noise over 2 runs: " in summary
    assert "canary changed up to" in summary
    assert ("noisy ranking" in summary) != ("none above the noise thresholds" in summary)
    fig = dash_duo.find_element(f"#{ids.RANK_FIG}").text
    assert "Predicted against measured step" in fig and "y = x" in fig
    status = dash_duo.find_element(f"#{ids.RANK_STATUS}").text
    assert status.startswith("lenet5, batch 8, 2 local workers · 2 plans × 1 round(s) of 1 "
                             "steps"), status
    dash_duo.driver.execute_script(
        "document.querySelector('.rank-section').scrollIntoView();")
    time.sleep(0.5)
    dash_duo.driver.save_screenshot(SCREENSHOT)
    assert dash_duo.get_logs() == []


def test_cancelling_a_ranking_stops_its_workers_and_says_so(dash_duo, monkeypatch):
    """Rank by running, Cancel while the plans' workers run: the page says the ranking was
    cancelled, the button comes back, no table appears, and within a bounded wait no process
    of the job is left (found by an environment variable each inherits)."""
    import uuid

    import psutil

    from _helpers import leftover, mp_workers, tagged
    from explorer.views.ranking import CANCELLED
    tag = uuid.uuid4().hex
    monkeypatch.setenv("EXPLORER_TEST_TAG", tag)
    dash_duo.driver.set_window_size(1400, 1300)
    dash_duo.start_server(create_app())
    dash_duo.driver.get(dash_duo.server_url.rstrip("/") + "/" + QUERY)
    dash_duo.wait_for_contains_text(f"#{ids.CONTEXT}compare", "local", timeout=90)
    button = dash_duo.find_element(f"#{ids.RANK_BUTTON}")
    until(lambda: button.is_enabled(), 30, "the button on for the local preset")
    assert set(dash_duo.driver.execute_script(UNTICK, ["data"])) == {"data"}
    _type(dash_duo, ids.RANK_ROUNDS, "3")
    _type(dash_duo, ids.RANK_STEPS, "50")
    earlier = {p.pid for p in psutil.Process().children(recursive=True)}
    button.click()
    seen = until(lambda: mp_workers(tagged(tag)) or None, 180, "the ranking's workers")
    dash_duo.find_element(f"#{ids.RANK_CANCEL}").click()
    dash_duo.wait_for_contains_text(f"#{ids.RANK_STATUS}", CANCELLED, timeout=30)
    dash_duo.wait_for_element_by_css_selector(f"#{ids.RANK_BUTTON}:not([disabled])",
                                              timeout=30)
    end = time.time() + 30
    while time.time() < end and leftover(tag, earlier):
        time.sleep(0.5)
    assert not leftover(tag, earlier), f"processes left after Cancel: {leftover(tag, earlier)}"
    assert not any(psutil.pid_exists(p.pid) and p.status() != psutil.STATUS_ZOMBIE
                   for p in seen if p.is_running())
    assert not dash_duo.find_element(f"#{ids.RANK_RESULTS}").is_displayed()

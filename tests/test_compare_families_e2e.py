"""End-to-end (headless Chromium): the Compare tab's "Across families" section puts every
family's methods on the form's model and devices in one chart and one table - each row with
what its prediction rests on - and a row's link opens that plan on its family's page."""

import time

import pytest

from _helpers import until

from explorer.app import create_app
from explorer.views import ids

pytestmark = [pytest.mark.browser, pytest.mark.slow]

QUERY = ("?model=mlp&devices=2&preset=p100-cluster&algo=optcnn&batch=8&arg=hidden=16"
         "&arg=layers=1&tab=compare")

ROWS = """
return [...document.querySelectorAll('#families-table .ag-center-cols-container .ag-row')]
  .map(r => {
    const cell = id => { const c = r.querySelector('.ag-cell[col-id="' + id + '"]');
                         return c ? c.textContent.trim() : null; };
    const a = r.querySelector('.ag-cell[col-id="open"] a');
    return {method: cell('method'), family: cell('family'), basis: cell('basis'),
            predicted: cell('predicted'), measured: cell('measured'), rank: cell('rank'),
            href: a ? a.getAttribute('href') : null};
  });
"""


#: the families chart's title, legend, toolbar and annotations as boxes (left, top, right,
#: bottom), as tests/test_app_layout_e2e.py reads every figure's
PARTS = """
const g = document.querySelector('#families-fig .js-plotly-plot');
const box = s => [...g.querySelectorAll(s)].map(e => {
    const r = e.getBoundingClientRect(); return [r.left, r.top, r.right, r.bottom]; })
    .filter(r => r[2] > r[0] && r[3] > r[1]);
return {titles: box('.gtitle'), legends: box('.legend .bg'),
        xtitles: box('.xtitle, .x2title, .x3title'), modebar: box('.modebar-container .modebar'),
        notes: box('.annotation-text-g .annotation')};
"""


def _hit(a, b) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


@pytest.mark.slow
def test_compare_across_families_reads_rows_of_all_three_families(dash_duo):
    dash_duo.start_server(create_app())
    dash_duo.driver.get(dash_duo.server_url.rstrip("/") + "/" + QUERY)
    dash_duo.wait_for_element(f"#{ids.FAMILIES_BUTTON}", timeout=90)
    # nothing is searched before the button: the section is only its bar
    assert not dash_duo.find_element(f"#{ids.FAMILIES_RESULTS}").is_displayed()
    dash_duo.find_element(f"#{ids.FAMILIES_BUTTON}").click()
    rows = until(lambda: [r for r in dash_duo.driver.execute_script(ROWS)
                           if r["method"]] or None, 240, "the cross-family table")
    fams = {r["family"] for r in rows}
    assert fams == {"layer-wise", "Tofu", "placement"}, rows
    by = {r["method"]: r for r in rows}
    for m in ("data", "model", "owt", "megatron", "optcnn", "tofu", "icml18", "equalchop",
              "celeritas", "m-etf", "metis"):
        assert m in by, sorted(by)
    # each row says what its prediction rests on, one basis per family
    assert {r["basis"] for r in rows if r["family"] == "layer-wise"} == {"equation 1"}
    assert {r["basis"] for r in rows if r["family"] == "Tofu"} == {"links + slowest compute"}
    assert {r["basis"] for r in rows if r["family"] == "placement"} == {"simulated schedule"}
    assert all(r["measured"] == "not run" for r in rows)      # a fresh home: no stored runs
    assert by["optcnn"]["predicted"].endswith("s") and by["optcnn"]["rank"].isdigit()
    # the chart, its legend naming each family's basis, and the note on currencies
    fig = dash_duo.find_element(f"#{ids.FAMILIES_FIG}").text
    for words in ("layer-wise · equation 1", "Tofu · links + slowest compute",
                  "placement · simulated schedule", "predicted step"):
        assert words in fig, fig
    assert "not one currency" in dash_duo.find_element(f"#{ids.FAMILIES_NOTE}").text
    # nothing over the title (the toolbar shows on hover), the legend off the axis titles
    from selenium.webdriver.common.action_chains import ActionChains
    ActionChains(dash_duo.driver).move_to_element(
        dash_duo.find_element(f"#{ids.FAMILIES_FIG}")).perform()
    time.sleep(0.5)
    parts = dash_duo.driver.execute_script(PARTS)
    assert parts["titles"] and parts["modebar"] and len(parts["xtitles"]) == 3
    for t in parts["titles"]:
        assert not [r for w in ("legends", "modebar", "notes") for r in parts[w] if _hit(t, r)]
    for x in parts["xtitles"]:
        assert not [r for r in parts["legends"] if _hit(x, r)], parts
    status = dash_duo.find_element(f"#{ids.FAMILIES_STATUS}").text
    assert "mlp, batch 8, 2 × p100-cluster" in status and "3 families" in status
    # a run stored since (as a Run from the data plan's page would): pressed again, the
    # comparison keeps its plans and reads the runs again, without searching
    from explorer import service
    from explorer.engine.runtime.store import RunStore, run_key
    req = service.Request(model="mlp", preset="p100-cluster", devices=2, batch=8,
                          model_args={"hidden": 16, "layers": 1})
    doc = service.result(req.replace(algo="data"), "data").document()
    RunStore().add(run_key(doc), {"model": "mlp", "algo": "data", "devices": 2,
                                  "preset": "p100-cluster", "measured_step_time_s": 0.5,
                                  "predicted_step_time_s": doc["predicted_step_time_s"],
                                  "reference_ok": True})
    t0 = time.time()
    dash_duo.find_element(f"#{ids.FAMILIES_BUTTON}").click()
    again = until(lambda: {r["method"]: r for r in dash_duo.driver.execute_script(ROWS)
                            if r["method"] == "data" and r["measured"].startswith("500 ms")},
                   60, "the data plan's measured step")
    assert time.time() - t0 < 20
    dash_duo.wait_for_contains_text(f"#{ids.FAMILIES_STATUS}", "runs read again", timeout=10)
    assert "(" in again["data"]["measured"] and "%" in again["data"]["measured"]
    assert "1 of" in dash_duo.find_element(f"#{ids.FAMILIES_NOTE}").text
    # a row opens its plan on its family's page: the Tofu row on /tofu with that method
    href = by["equalchop"]["href"]
    assert href.startswith("/tofu?") and "algo=equalchop" in href and "devices=2" in href
    assert by["celeritas"]["href"].startswith("/placement?")
    assert by["data"]["href"].startswith("/?") and "algo=data" in by["data"]["href"]
    dash_duo.driver.execute_script(
        "document.querySelector('#families-table .ag-row[row-id=\"equalchop\"] "
        ".ag-cell[col-id=\"open\"] a').click();")
    dash_duo.wait_for_contains_text("#tofu-headline", "equalchop", timeout=120)
    assert dash_duo.driver.execute_script("return window.location.pathname;") == "/tofu"
    assert dash_duo.get_logs() == []

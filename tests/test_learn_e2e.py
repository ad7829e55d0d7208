"""The Learn page (/learn) in headless Chromium (dash_duo): every scenario renders its live
figure with the paper's numbers beside ours, a control changes the figure, the guided tour
opens, closes and is remembered, and "open in the explorer" opens the scenario's state."""

import socket
import time
from urllib.parse import parse_qs, urlparse

import pytest

from explorer.app import create_app
from explorer.views import ids
from explorer.views.learn import SCENARIOS

pytestmark = pytest.mark.browser

#: per scenario, a number of the paper the aside must show
PAPER_MARK = {"optcnn-dims": "Conv8 of VGG-16", "optcnn-dense": "12×",
              "optcnn-elim": "K = 2", "optcnn-scale": "14.8×",
              "tofu-conv1d": "Figure 2(b)", "tofu-recursion": "8.3 seconds",
              "tofu-algos": "7% slower", "celeritas-pipeline": "25463",
              "celeritas-orders": "cuts 4 edges", "celeritas-tables": "2.859"}

TRACES = """
const el = document.querySelector('#' + arguments[0] + ' .js-plotly-plot');
if (!el || !el.data) { return -1; }
return el.data.length;
"""
FIG_TEXT = """
const el = document.querySelector('#' + arguments[0] + ' .js-plotly-plot');
if (!el || !el.data) { return ''; }
const lay = el.layout || {};
return JSON.stringify([el.data, lay.annotations || [], lay.title || '']);
"""


def until(fn, timeout=120, poll=0.2):
    end = time.time() + timeout
    while time.time() < end:
        try:
            v = fn()
        except Exception:  # noqa: BLE001 - the page is still rendering
            v = None
        if v:
            return v
        time.sleep(poll)
    raise AssertionError("condition not met in time")


def figure(duo, key, part="fig"):
    return duo.driver.execute_script(FIG_TEXT, ids.learn(key, part))


def drawn(duo, key, part="fig"):
    """Wait until the scenario's figure holds data traces (not the "computing…" message)."""
    return until(lambda: duo.driver.execute_script(TRACES, ids.learn(key, part)) > 0
                 and "computing" not in figure(duo, key, part))


def open_learn(duo, close_tour=True):
    duo.wait_for_page(url=duo.server_url + "/learn")
    duo.wait_for_element("#" + ids.LEARN_TABS, timeout=90)
    if close_tour:
        until(lambda: duo.driver.find_element("id", ids.LEARN_TOUR_CLOSE).is_displayed())
        duo.find_element("#" + ids.LEARN_TOUR_CLOSE).click()
        until(lambda: not duo.driver.find_element("id", ids.LEARN_TOUR).is_displayed())


def show(duo, key):
    n = list(SCENARIOS).index(key) + 1
    duo.find_element(f"#{ids.LEARN_TABS} .tab:nth-child({n})").click()
    duo.wait_for_element("#" + ids.learn(key, "section"), timeout=30)


@pytest.fixture
def learn_duo(dash_duo):
    with socket.socket() as sock:           # a free port: other apps may hold Dash's default
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    dash_duo.start_server(create_app(), port=port)
    return dash_duo


def test_every_scenario_renders_with_the_papers_numbers_beside_ours(learn_duo):
    duo = learn_duo
    open_learn(duo)
    assert "Learn" in duo.find_element(".header .pages").text     # linked from the header
    for key in SCENARIOS:
        show(duo, key)
        drawn(duo, key)
        ours = until(lambda: duo.find_element("#" + ids.learn(key, "ours")).text.strip())
        assert ours, key
        paper = duo.find_element("#" + ids.learn(key, "paper")).text
        assert "The paper" in paper and PAPER_MARK[key] in paper, (key, paper)
        href = duo.find_element("#" + ids.learn(key, "link")).get_attribute("href")
        assert urlparse(href).path == "/" and "model=" in href, (key, href)
        assert not duo.find_element("#" + ids.learn(key, "error")).text, key


def test_controls_change_the_figures(learn_duo):
    duo = learn_duo
    open_learn(duo)
    # Tofu conv1d: 2 workers -> 4 workers: four workers' intervals are drawn
    show(duo, "tofu-conv1d")
    drawn(duo, "tofu-conv1d")
    before = figure(duo, "tofu-conv1d")
    assert "worker 1" in before and "worker 3" not in before
    duo.select_dcc_dropdown("#" + ids.learn("tofu-conv1d", "workers"), value="4")
    until(lambda: "worker 3" in figure(duo, "tofu-conv1d"))
    # bad sizes: one line saying why, no traceback
    box = duo.find_element("#" + ids.learn("tofu-conv1d", "window"))
    box.clear()
    box.send_keys("20\n")
    until(lambda: "longer than the data" in duo.find_element(
        "#" + ids.learn("tofu-conv1d", "error")).text)
    assert "Traceback" not in duo.driver.page_source
    # Celeritas Figure 3: the paper's 4 cut edges; five chains cut five
    show(duo, "celeritas-orders")
    drawn(duo, "celeritas-orders")
    assert "M-TOPO: 4 edges cut" in figure(duo, "celeritas-orders")
    assert "DFS-TOPO: 0 edges cut" in figure(duo, "celeritas-orders")
    box = duo.find_element("#" + ids.learn("celeritas-orders", "chains"))
    box.clear()
    box.send_keys("5\n")
    until(lambda: "M-TOPO: 5 edges cut" in figure(duo, "celeritas-orders"))
    assert "DFS-TOPO: 1 edge cut" in figure(duo, "celeritas-orders")
    # OptCNN §3: 2 -> 4 devices changes the configurations compared and the bytes
    show(duo, "optcnn-dense")
    drawn(duo, "optcnn-dense")
    assert "(n2)" in figure(duo, "optcnn-dense")
    duo.select_dcc_dropdown("#" + ids.learn("optcnn-dense", "devices"), value="4")
    until(lambda: "(n4)" in figure(duo, "optcnn-dense"))
    # OptCNN elimination: the step slider moves to another step's equation
    show(duo, "optcnn-elim")
    drawn(duo, "optcnn-elim")
    first = duo.find_element("#" + ids.learn("optcnn-elim", "equation")).text
    assert "Elimination 1 of" in first and "t_X(e'" in first
    duo.select_dcc_dropdown("#" + ids.learn("optcnn-elim", "kind"), index=1)
    until(lambda: "merged" in duo.find_element("#" + ids.learn("optcnn-elim",
                                                               "equation")).text)
    assert "Equation 3" in figure(duo, "optcnn-elim")


def test_guided_tour_opens_closes_and_is_remembered(learn_duo):
    duo = learn_duo
    open_learn(duo, close_tour=False)
    tour = until(lambda: duo.driver.find_element("id", ids.LEARN_TOUR))
    until(tour.is_displayed)                                   # first visit: it opens
    assert "1 / 4" in duo.find_element("#" + ids.LEARN_TOUR_STEP).text
    duo.find_element("#" + ids.LEARN_TOUR_NEXT).click()
    until(lambda: "2 / 4" in duo.find_element("#" + ids.LEARN_TOUR_STEP).text)
    duo.find_element("#" + ids.LEARN_TOUR_BACK).click()
    until(lambda: "1 / 4" in duo.find_element("#" + ids.LEARN_TOUR_STEP).text)
    duo.find_element("#" + ids.LEARN_TOUR_CLOSE).click()
    until(lambda: not duo.driver.find_element("id", ids.LEARN_TOUR).is_displayed())
    duo.driver.refresh()                                       # dismissal is remembered
    duo.wait_for_element("#" + ids.LEARN_TABS, timeout=90)
    time.sleep(1.5)
    assert not duo.driver.find_element("id", ids.LEARN_TOUR).is_displayed()
    duo.find_element("#" + ids.LEARN_TOUR_OPEN).click()        # and it can be taken again
    until(lambda: duo.driver.find_element("id", ids.LEARN_TOUR).is_displayed())
    for _ in range(4):                                         # Next on the last step ends it
        duo.find_element("#" + ids.LEARN_TOUR_NEXT).click()
        time.sleep(0.3)
    until(lambda: not duo.driver.find_element("id", ids.LEARN_TOUR).is_displayed())


def test_open_in_explorer_link_opens_the_scenario_state(learn_duo):
    duo = learn_duo
    open_learn(duo)
    show(duo, "optcnn-dense")
    drawn(duo, "optcnn-dense")
    link = duo.find_element("#" + ids.learn("optcnn-dense", "link"))
    query = parse_qs(urlparse(link.get_attribute("href")).query)
    assert query["model"] == ["vgg16"] and query["devices"] == ["2"]
    assert query["pin"] == ["classifier_0=c=2@0,1"]
    duo.driver.execute_script("arguments[0].scrollIntoView({block: 'center'})", link)
    time.sleep(0.5)
    link.click()
    duo.wait_for_contains_text("#objective-value", "ms", timeout=120)
    url = urlparse(duo.driver.current_url)
    assert url.path == "/"
    got = parse_qs(url.query)
    assert got["model"] == ["vgg16"] and got["devices"] == ["2"] and got["batch"] == ["128"]
    until(lambda: "classifier_0" in duo.find_element("#" + ids.PIN_LIST).text)


def test_figure8_and_table5_say_why_layerwise_moves_more_bytes(learn_duo):
    """Figures 7-8 / Table 5 on VGG-16: the page explains, in the plans' numbers, why the
    layer-wise optimum moves more bytes than OWT, and sets the paper's Table 5 plan (our
    costs) beside ours and OWT."""
    duo = learn_duo
    open_learn(duo)
    key = "optcnn-scale"
    show(duo, key)
    drawn(duo, key)
    why = until(lambda: duo.find_element("#" + ids.learn(key, "why-bytes")).text)
    assert "minimises time, not bytes" in why and "GB/s" in why
    t5 = until(lambda: duo.find_element("#" + ids.learn(key, "why-table5")).text)
    assert "the paper's Table 5, our costs" in t5 and "h2 w2" in t5 and "n2 c2" in t5


#: the glossary terms of the shown scenario: {term text: its tooltip}
TERMS = """
const s = document.querySelector('.learn-scenario');
return s ? Object.fromEntries([...s.querySelectorAll('abbr.term')]
    .map(a => [a.textContent, a.title])) : null;
"""


def test_recursion_and_pipeline_follow_their_controls_and_define_their_terms(learn_duo):
    """Tofu's recursion: 8, 2 and 4 workers take 3, 1 and 2 recursion steps (the tree holds
    every worker group); the Celeritas pipeline shows its four stages with their numbers and
    follows the devices; every term of both carries its definition."""
    duo = learn_duo
    open_learn(duo)
    key = "tofu-recursion"
    show(duo, key)
    drawn(duo, key)
    drawn(duo, key, "steps")
    count = "#" + ids.learn(key, "count")
    until(lambda: "3 recursion steps for 8 workers" in duo.find_element(count).text)
    assert figure(duo, key).count('"s3g') == 8                   # 8 groups after step 3
    assert "step 3 (×2)" in figure(duo, key, "steps")
    for workers, text in (("2", "1 recursion step for 2 workers"),
                          ("4", "2 recursion steps for 4 workers")):
        duo.select_dcc_dropdown("#" + ids.learn(key, "workers"), value=workers)
        until(lambda: text in duo.find_element(count).text)
    until(lambda: '"s2g3"' in figure(duo, key) and '"s3g' not in figure(duo, key))
    terms = duo.driver.execute_script(TERMS)
    for term in ("recursion step", "partition-n-reduce", "coarsened graph"):
        assert len(terms.get(term, "")) > 30, (term, sorted(terms))
    ours = duo.find_element("#" + ids.learn(key, "ours")).text
    assert "MiB" in ours and " MB" not in ours
    assert not duo.find_element("#" + ids.learn(key, "error")).text

    key = "celeritas-pipeline"
    show(duo, key)
    drawn(duo, key)
    stages = "#" + ids.learn(key, "stages")
    table = until(lambda: duo.find_element(stages).text)
    for stage in ("Standard Evaluation", "CPD-TOPO", "Optimal Operation Fusion",
                  "Adjusting Placement"):
        assert stage in table
    assert "operators" in table and "clusters" in table and ", 4 devices" in figure(duo, key)
    terms = duo.driver.execute_script(TERMS)
    for term in ("Standard Evaluation", "CPD-TOPO", "Optimal Operation Fusion", "CCR",
                 "Adjusting Placement"):
        assert len(terms.get(term, "")) > 30, (term, sorted(terms))
    duo.select_dcc_dropdown("#" + ids.learn(key, "devices"), value="2")
    until(lambda: ", 2 devices" in figure(duo, key))
    assert not duo.find_element("#" + ids.learn(key, "error")).text


def test_elimination_step_starts_again_when_the_model_changes(learn_duo):
    """Figures 5-6: a step past the new model's last (Inception-v3's 150 of 158, then
    LeNet-5 with 6) was kept by the slider and its box while the text said another step; a
    new model, device count or kind of step starts again at step 1."""
    from selenium.webdriver.common.keys import Keys
    duo, key = learn_duo, "optcnn-elim"
    open_learn(duo)
    show(duo, key)
    drawn(duo, key)
    equation = "#" + ids.learn(key, "equation")
    duo.wait_for_contains_text(equation, "Elimination 1 of 158", timeout=60)
    box = duo.find_element(f"#{ids.learn(key, 'step')} input")
    box.send_keys(Keys.CONTROL, "a")
    box.send_keys("150", Keys.ENTER)      # Enter moves it (a blur did, only)
    duo.wait_for_contains_text(equation, "Elimination 150 of 158", timeout=30)
    duo.select_dcc_dropdown("#" + ids.learn(key, "model"), value="LeNet-5")
    duo.wait_for_contains_text(equation, "Elimination 1 of 6", timeout=60)

    def slider():
        return duo.driver.execute_script(
            "const s = document.querySelector('#' + arguments[0] + ' [role=slider]');"
            "const b = document.querySelector('#' + arguments[0] + ' input');"
            "return [s.getAttribute('aria-valuenow'), s.getAttribute('aria-valuemax'),"
            "        b.value];", ids.learn(key, "step"))
    until(lambda: slider() == ["1", "6", "1"], 15)
    box = duo.find_element(f"#{ids.learn(key, 'step')} input")
    box.send_keys(Keys.CONTROL, "a")
    box.send_keys("4", Keys.ENTER)
    duo.wait_for_contains_text(equation, "Elimination 4 of 6", timeout=30)
    assert slider() == ["4", "6", "4"]


ARROW = """
const el = document.querySelector('#fig .js-plotly-plot');
if (!el || !el.data) { return null; }
const heads = el.querySelectorAll('.annotation-arrow-g path');
const bars = el.querySelectorAll('.trace.bars')[0].querySelectorAll('.point path');
if (heads.length < 2 || bars.length < 3) { return null; }
const h = heads[heads.length - 1].getBoundingClientRect();
return [(h.left + h.right) / 2, [...bars].map(b => {
    const r = b.getBoundingClientRect(); return [r.left, r.right]; })];
"""


def test_the_minimum_arrow_sits_on_the_bar_of_configuration_1(dash_duo):
    """Equation 2's figure drawn by Chromium: Plotly read an x value "1" as the number 1 (the
    second category), so the "min: c_j*" arrow pointed at the wrong bar when the chosen
    configuration was ``1``.  Here ``1`` is the third bar: the arrow's head is over it."""
    import dash
    from dash import dcc, html
    from explorer.views.figures.learn import elimination_figure
    rows = [{"config": c, "t_compute_s": t, "t_sync_s": 0.0, "t_reduce_s": 0.0,
             "t_x_in_s": 0.0, "t_x_out_s": 0.0, "total_s": t}
            for c, t in (("n2", 3e-6), ("c2", 2e-6), ("1", 1e-6), ("n4", 4e-6))]
    fig = elimination_figure({"kind": "node", "node": "fc1", "rows": rows, "best": 2})
    app = dash.Dash(__name__)
    app.layout = html.Div([dcc.Graph(id="fig", figure=fig)])
    dash_duo.start_server(app)
    head, bars = until(lambda: dash_duo.driver.execute_script(ARROW), 30)
    left, right = bars[2]
    assert left <= head <= right, (head, bars)

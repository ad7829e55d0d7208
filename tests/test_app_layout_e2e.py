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


#: cells of column ``arguments[0]`` whose text runs past the cell (cut with "…")
CUT = """
return [...document.querySelectorAll('.ag-cell[col-id="' + arguments[0] + '"]')]
    .filter(c => c.offsetParent !== null && c.textContent.trim())
    .map(c => [c.textContent.trim(), [c, c.querySelector('.ag-cell-value') || c].some(
        e => e.scrollWidth > e.clientWidth + 1) || c.getBoundingClientRect().right >
        c.closest('.ag-root-wrapper').getBoundingClientRect().right + 1]);
"""


def test_why_column_dates_and_objectives_are_shown_whole(dash_duo):
    from _helpers import TAP, open_page
    from explorer.service import Request
    dash_duo.driver.set_window_size(1400, 1000)
    dash_duo.start_server(create_app(Request(model="lenet5", preset="local", devices=2,
                                             batch=8)))
    dash_duo.wait_for_contains_text("#objective-value", "ms", timeout=90)
    until(lambda: dash_duo.driver.execute_script(TAP, ids.GRAPH, "conv2") == "ok", 15, "tap")
    why = until(lambda: dash_duo.driver.execute_script(CUT, "why"), 20, "the why cells")
    assert any("vs chosen" in t for t, _ in why)
    snap(dash_duo, "candidates-why.png")
    assert [t for t, cut in why if cut] == []
    # the history: whole dates, and Tofu's link time in a column of its own
    open_page(dash_duo, "Tofu")
    dash_duo.find_element(f"#{ids.TOFU_BUTTON}").click()
    dash_duo.wait_for_contains_text("#tofu-headline", "communicated", timeout=120)
    open_page(dash_duo, "Plans")
    dates = until(lambda: dash_duo.driver.execute_script(CUT, "time"), 30, "the dates")
    assert len(dates) >= 2 and [t for t, cut in dates if cut] == []
    headers = dash_duo.driver.execute_script(
        "return [...document.querySelectorAll('.ag-header-cell-text')].map(h => h.textContent);")
    assert "step objective (ms)" in headers and "Tofu link time (ms)" in headers
    rows = dash_duo.driver.execute_script("""
        return [...document.querySelectorAll('.ag-center-cols-container .ag-row')].map(r =>
            ['kind', 'step_ms', 'link_ms'].map(c =>
                (r.querySelector('[col-id="' + c + '"]') || {}).textContent || ''));""")
    tofu = [r for r in rows if r[0] == "Tofu"]
    layer = [r for r in rows if r[0] == "layer-wise"]
    assert tofu and all(r[1] == "" and r[2] for r in tofu)
    assert layer and all(r[1] and r[2] == "" for r in layer)


def snap(duo, name):
    """Save a screenshot to ``$EXPLORER_SCREENSHOTS/name`` when that folder is set."""
    import os
    folder = os.environ.get("EXPLORER_SCREENSHOTS")
    if folder:
        duo.driver.save_screenshot(os.path.join(folder, name))


#: every drawn figure's title, legend, toolbar and annotations as boxes (left, top, right,
#: bottom), with the title's text
PARTS = """
return [...document.querySelectorAll('.js-plotly-plot')].filter(g => g.offsetParent !== null)
    .map(g => {
        const box = s => [...g.querySelectorAll(s)].map(e => {
            const r = e.getBoundingClientRect(); return [r.left, r.top, r.right, r.bottom]; })
            .filter(r => r[2] > r[0] && r[3] > r[1]);
        const t = g.querySelector('.gtitle');
        return {id: g.parentElement.id || g.id, title: t ? t.textContent : '',
                titles: box('.gtitle'), legends: box('.legend .bg'),
                modebar: box('.modebar-container .modebar'),
                notes: box('.annotation-text-g .annotation')};
    });
"""


def _hit(a, b) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def _clashes(parts) -> list:
    """Figures whose title runs under their legend, toolbar or a line's label."""
    out = []
    for p in parts:
        for t in p["titles"]:
            for what in ("legends", "modebar", "notes"):
                out += [(p["id"], what) for r in p[what] if _hit(t, r)]
    return out


def _hover_all(duo):
    """Hover every figure, so Plotly shows its toolbar (it covers titles only then)."""
    from selenium.webdriver.common.action_chains import ActionChains
    for g in duo.driver.find_elements("css selector", ".js-plotly-plot"):
        if g.is_displayed():
            ActionChains(duo.driver).move_to_element(g).perform()
            time.sleep(0.3)
            yield g


def test_titles_are_never_covered_nor_raw_data(dash_duo):
    dash_duo.driver.set_window_size(1400, 1000)
    dash_duo.start_server(create_app())
    base = dash_duo.server_url.rstrip("/")
    # Learn: Figures 1-4 name the configuration as the app writes it, never a dict; the
    # Equation 2 title is not under its legend
    for scenario, wait in (("optcnn-dims", "Figure 4"), ("optcnn-elim", "Equation")):
        dash_duo.driver.get(f"{base}/learn?s={scenario}")
        until(lambda: any(wait in p["title"] for p in
                          dash_duo.driver.execute_script(PARTS)), 90, f"{scenario}'s figures")
        time.sleep(1.0)
        parts = dash_duo.driver.execute_script(PARTS)
        assert not [p["title"] for p in parts if "{" in p["title"]]
        assert _clashes(parts) == [], scenario
    # Compare: the toolbar never covers "lower is better"
    dash_duo.driver.get(f"{base}/?{LENET}&algo=optcnn&tab=compare")
    until(lambda: any("lower is better" in p["title"]
                      for p in dash_duo.driver.execute_script(PARTS)), 120, "the bars")
    for g in _hover_all(dash_duo):
        assert _clashes(dash_duo.driver.execute_script(PARTS)) == []
    # Tofu: the memory figure's legend and limit line stay off its title
    dash_duo.driver.get(f"{base}/tofu?{LENET}&algo=icml18")
    dash_duo.wait_for_contains_text("#tofu-headline", "icml18", timeout=120)
    time.sleep(1.0)
    parts = [p for p in dash_duo.driver.execute_script(PARTS) if "Memory" in p["title"]]
    assert parts and _clashes(parts) == []


#: the glossary terms in a Learn scenario: {term text: its tooltip}
TERMS = """
const s = document.querySelector('.learn-scenario');
return s ? Object.fromEntries([...s.querySelectorAll('abbr.term')]
    .map(a => [a.textContent, a.title])) : null;
"""


@pytest.mark.parametrize("scenario,terms", [
    ("optcnn-elim", {"t_R", "equation 2", "Theorem 1"}),
    ("tofu-algos", {"coarsened graph"}),
    ("celeritas-tables", {"Standard Evaluation", "CPD-TOPO", "Adjusting Placement", "Baechi"}),
])
def test_learn_defines_its_terms_where_they_are_used(dash_duo, scenario, terms):
    dash_duo.start_server(create_app())
    dash_duo.driver.get(f"{dash_duo.server_url.rstrip('/')}/learn?s={scenario}")
    dash_duo.wait_for_element(".learn-scenario .learn-text", timeout=60)
    got = dash_duo.driver.execute_script(TERMS)
    missing = terms - set(got)
    assert not missing, f"{scenario}: no tooltip on {missing}"
    assert all(len(got[t]) > 30 for t in terms)
    if scenario == "optcnn-elim":
        # the equation written out names t_R, as the figure's legend does, and a
        # configuration "1" is defined where the step shows it
        dash_duo.wait_for_contains_text(f"#learn-{scenario}-equation", "t_R", timeout=90)


BOX = "const r = arguments[0].getBoundingClientRect(); return [r.left, r.top, r.right, r.bottom];"


def test_slider_handles_and_bubbles_cover_no_text(dash_duo):
    from selenium.webdriver.common.action_chains import ActionChains
    dash_duo.driver.set_window_size(1400, 1000)
    dash_duo.start_server(create_app())
    base = dash_duo.server_url.rstrip("/")
    # Tofu: the recursion-step slider below the summary, not over its last line
    dash_duo.driver.get(f"{base}/tofu?{LENET}&algo=icml18")
    dash_duo.wait_for_contains_text("#tofu-headline", "icml18", timeout=120)
    time.sleep(1.0)
    summary = dash_duo.driver.execute_script(BOX, dash_duo.find_element(f"#{ids.TOFU_SUMMARY}"))
    handle = dash_duo.find_element(f"#{ids.TOFU_STEP} [role=slider]")
    assert not _hit(dash_duo.driver.execute_script(BOX, handle), summary)
    # Learn: hovering or dragging the step slider shows no bubble over the heading below
    dash_duo.driver.get(f"{base}/learn?s=optcnn-elim")
    dash_duo.wait_for_contains_text("#learn-optcnn-elim-equation", "Elimination", timeout=120)
    handle = dash_duo.find_element("#learn-optcnn-elim-step [role=slider]")
    ActionChains(dash_duo.driver).move_to_element(handle).click_and_hold().perform()
    time.sleep(0.5)
    heads = [dash_duo.driver.execute_script(BOX, h) for h in
             dash_duo.driver.find_elements("css selector", ".learn-scenario h3")]
    tips = [dash_duo.driver.execute_script(BOX, t) for t in dash_duo.driver.find_elements(
        "css selector", "#learn-optcnn-elim-step [class*=tooltip]") if t.is_displayed()]
    ActionChains(dash_duo.driver).release().perform()
    assert not [(t, h) for t in tips for h in heads if _hit(t, h)]

"""The app's explanations in headless Chromium: tooltips, units and labels where people look,
and the defects once found in them, each checked as a person would see it.

Every test drives the real app (``dash_duo``) at 1500×1100 and reads what a person sees:
tooltips, texts, element boxes (one thing covering another is a box intersection), node
classes and colours on the cytoscape canvas, files downloaded.
"""

import csv
import glob
import os
import time

import pytest

from _helpers import TAP, leftover, mp_workers, open_page, page_path, tagged
from explorer.app import create_app
from explorer.service import Request
from explorer.views import ids, palette

pytestmark = pytest.mark.browser

NODES = """
const cy = document.getElementById(arguments[0])._cyreg.cy;
return cy.nodes().map(n => [n.id(), n.classes().join(' '), n.data('label') || '',
                            n.style('border-color'), n.data('kind') || '']);
"""
RECT = "const r = arguments[0].getBoundingClientRect(); return [r.left, r.top, r.right, r.bottom];"


def rect(duo, el):
    return duo.driver.execute_script(RECT, el)


def overlap(a, b) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def until(pred, timeout=30, what="condition"):
    end = time.time() + timeout
    while time.time() < end:
        got = pred()
        if got:
            return got
        time.sleep(0.25)
    raise AssertionError(f"timed out waiting for {what() if callable(what) else what}")


def tap(duo, node):
    until(lambda: duo.driver.execute_script(TAP, ids.GRAPH, node) == "ok", 15, f"node {node}")


def nodes(duo):
    return {n[0]: n[1:] for n in duo.driver.execute_script(NODES, ids.GRAPH)}


def tab(duo, label):
    duo.driver.execute_script(
        "[...document.querySelectorAll('#tabs .tab')]"
        ".find(t => t.textContent.trim() === arguments[0]).click()", label)


def start(duo, request=None, width=1500, height=1100):
    duo.driver.set_window_size(width, height)
    duo.start_server(create_app(request))
    duo.wait_for_contains_text("#objective-value", "ms", timeout=90)


def shown(duo, elem_id) -> bool:
    """Whether the element with ``elem_id`` is on the page and displayed (by id, so a
    re-rendered element is never stale)."""
    return bool(duo.driver.execute_script(
        "const e = document.getElementById(arguments[0]);"
        "return !!e && e.offsetParent !== null && getComputedStyle(e).display !== 'none';",
        elem_id))


def rgb_hex(css: str) -> str:
    nums = [int(float(v)) for v in css[css.index("(") + 1:css.index(")")].split(",")[:3]]
    return "#" + "".join(f"{v:02x}" for v in nums)


def downloaded(duo, pattern, timeout=20):
    return until(lambda: glob.glob(os.path.join(duo.download_path, pattern)), timeout,
                 f"a download {pattern}")[0]


def test_glossary_candidates_why_transfer_and_table_fit(dash_duo):
    start(dash_duo)
    legend = dash_duo.find_element(f"#{ids.GRAPH_LEGEND}")
    titles = [a.get_attribute("title") for a in legend.find_elements("css selector", "abbr")]
    assert any("sample" in t for t in titles) and any("t_X" in t for t in titles)
    tap(dash_duo, "features_24")
    dash_duo.wait_for_contains_text(f"#{ids.CANDIDATE_TABLE}", "chosen:", timeout=20)
    dims = dash_duo.find_elements(f"#{ids.DETAILS} abbr.term")
    assert {d.text for d in dims} >= {"n", "c", "h", "w"}
    table = dash_duo.find_element(f"#{ids.CANDIDATE_TABLE}")
    heads = {h.text: h for h in table.find_elements("css selector", ".ag-header-cell")
             if h.text}
    assert {"t_C ms", "t_X in ms", "t_X out ms", "total ms", "MiB"} <= set(heads)
    # the symbol headers explain themselves (AG Grid header tooltips from the glossary)
    tip = dash_duo.driver.execute_script(
        "return dash_ag_grid.getApi(arguments[0]).getColumnDef('t_xin_ms').headerTooltip",
        ids.CANDIDATE_TABLE)
    assert tip.startswith("t_X(e, c_i, c_j)")
    # MiB is not pushed off screen by the device column: devices as ranges, MiB in the panel
    panel = rect(dash_duo, dash_duo.find_element(".details-panel"))
    assert rect(dash_duo, heads["MiB"])[2] <= panel[2] + 1
    assert rect(dash_duo, heads["total ms"])[2] <= panel[2] + 1
    assert "0–3" in table.text and "0,1,2,3" not in table.text
    # the chosen row is in view, with its reason; another row says why it lost
    chosen = until(lambda: [r for r in table.find_elements("css selector", ".ag-row")
                            if "chosen:" in r.text], 10, "the chosen row")[0]
    body = rect(dash_duo, table.find_element("css selector", ".ag-body-viewport"))
    row = rect(dash_duo, chosen)
    assert body[1] - 1 <= row[1] and row[3] <= body[3] + 1
    assert "vs chosen" in table.text


def test_steps_legend_equations_one_based_slider_and_colours(dash_duo):
    start(dash_duo)
    tab(dash_duo, "Elimination steps")
    dash_duo.wait_for_contains_text(f"#{ids.STEP_TEXT}", "node eliminations")
    legend = dash_duo.find_element(f"#{ids.STEP_LEGEND}").text
    assert "eliminated" in legend and "neighbours" in legend and "final graph" in legend
    for k in (1, 2, 3):
        dash_duo.find_element(f"#{ids.STEP_NEXT}").click()
        dash_duo.wait_for_contains_text(f"#{ids.STEP_TEXT}", f"Step {k}/")
    handle = dash_duo.find_element(f"#{ids.STEP_SLIDER} [role=slider]")
    assert handle.get_attribute("aria-valuenow") == "3"           # slider and text agree
    eq = dash_duo.find_element(f"#{ids.STEP_EQUATIONS}")
    assert "equation 2" in eq.text and "t_C" in eq.text and " = " in eq.text
    assert any("node elimination" in a.get_attribute("title")
               for a in eq.find_elements("css selector", "abbr"))
    time.sleep(0.5)
    shown = nodes(dash_duo)
    cur = [v for v in shown.values() if "current" in v[0]]
    assert cur, "no node highlighted"
    ring = rgb_hex(cur[0][2])
    assert ring == palette.STEP_COLORS["current"]
    assert min(palette.distance(ring, c) for c in palette.CONFIG_COLORS) > 100
    # the slider's tooltip never covers the step text
    text = rect(dash_duo, dash_duo.find_element(f"#{ids.STEP_TEXT}"))
    for tip in dash_duo.driver.find_elements("css selector",
                                             f"#{ids.STEP_SLIDER} [class*=tooltip]"):
        if tip.is_displayed():
            assert not overlap(rect(dash_duo, tip), text)
    # the final graph writes equation 1 with the plan's objective
    dash_duo.driver.execute_script(
        "document.querySelector('#step-slider [role=slider]').focus()")
    from selenium.webdriver.common.keys import Keys
    total = int(handle.get_attribute("aria-valuemax"))
    trace_final = None
    for _ in range(total):
        if "final graph" in dash_duo.find_element(f"#{ids.STEP_TEXT}").text:
            trace_final = True
            break
        handle.send_keys(Keys.ARROW_RIGHT)
        time.sleep(0.15)
    assert trace_final
    dash_duo.wait_for_contains_text(f"#{ids.STEP_EQUATIONS}", "objective")


def test_pinned_marker_csv_and_refit_on_resize(dash_duo):
    start(dash_duo)
    tap(dash_duo, "features_24")
    dash_duo.wait_for_contains_text(f"#{ids.DETAILS}", "features_24")
    dash_duo.select_dcc_dropdown(f"#{ids.PIN_CONFIG}", value="n=1 c=1 h=2 w=2")
    dash_duo.find_element(f"#{ids.PIN_BUTTON}").click()
    dash_duo.wait_for_contains_text("#objective-delta", "ms", timeout=60)
    until(lambda: "pinned" in nodes(dash_duo)["features_24"][0], 15, "the pinned marker")
    assert "★ pinned" in dash_duo.find_element(f"#{ids.GRAPH_LEGEND}").text
    # the plan's table as CSV: one row per layer, the pinned layer's configuration in it
    dash_duo.find_element(f"#{ids.PLAN_CSV_BUTTON}").click()
    path = downloaded(dash_duo, "*-layers.csv")
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 23 and rows[0].keys() >= {"layer", "configuration", "t_C ms"}
    assert next(r for r in rows if r["layer"] == "features_24")["configuration"] == "h2 w2"
    # resizing the window refits the graph: every node inside the visible extent
    inside = """
    const cy = document.getElementById(arguments[0])._cyreg.cy;
    const bb = cy.elements().boundingBox(), ex = cy.extent();
    return bb.x1 >= ex.x1 - 1 && bb.y1 >= ex.y1 - 1 && bb.x2 <= ex.x2 + 1 && bb.y2 <= ex.y2 + 1;
    """
    dash_duo.driver.set_window_size(1024, 768)
    until(lambda: dash_duo.driver.execute_script(inside, ids.GRAPH), 10, "refit at 1024")
    dash_duo.driver.set_window_size(1920, 1080)
    until(lambda: dash_duo.driver.execute_script(inside, ids.GRAPH), 10, "refit at 1920")


def test_compare_scaling_ideal_is_straight(dash_duo):
    start(dash_duo, Request(model="lenet5", preset="p100-nvlink-4", devices=4))
    tab(dash_duo, "Compare")
    axis = """
    const g = [...document.querySelectorAll('.js-plotly-plot')].find(
        p => p.layout && p.data && p.data.some(t => t.name === 'linear ideal'));
    return g ? [g.layout.xaxis.type, g.layout.yaxis.type] : null;
    """
    got = until(lambda: dash_duo.driver.execute_script(axis), 120, "the scaling figure")
    assert got == ["log", "log"]


def test_small_model_units_labels_history_of_every_kind(dash_duo):
    start(dash_duo, Request(model="lenet5", preset="p100-nvlink-4", devices=4))
    summary = dash_duo.find_element(f"#{ids.MODEL_SUMMARY}").text
    assert "0.00 GFLOP" not in summary and " 0 MiB" not in summary and "FLOP" in summary
    plan_line = dash_duo.find_element(f"#{ids.PLAN_SUMMARY}").text
    assert "0.00 GiB" not in plan_line and "0.0 MiB" not in plan_line
    # the model list: seq2seq's label whole; the args hint follows the model
    assert dash_duo.find_element(f"#{ids.MODEL_ARGS}").get_attribute("placeholder") == \
        "none for this model" or "depth" not in \
        dash_duo.find_element(f"#{ids.MODEL_ARGS}").get_attribute("placeholder")
    dash_duo.find_element(f"#{ids.MODEL_DROPDOWN}").click()
    opts = until(lambda: [o.text for o in dash_duo.driver.find_elements(
        "css selector", ".dash-dropdown-option")], 10, "model options")
    assert any("LSTM seq2seq (NMT-style, Wu et al. 2016)" in o for o in opts)
    dash_duo.driver.find_element("css selector", "body").click()
    # Tofu: units by magnitude, its steps downloadable
    open_page(dash_duo, "Tofu")
    dash_duo.find_element(f"#{ids.TOFU_BUTTON}").click()
    dash_duo.wait_for_contains_text("#tofu-headline", "communicated", timeout=120)
    head = dash_duo.find_element("#tofu-headline").text
    assert "KiB communicated" in head and "0.00" not in head
    # Placement: plain introduction, units, OOM text only with a device over capacity
    open_page(dash_duo, "Placement")
    intro = dash_duo.find_element(".placement-intro").text
    assert "CPD-TOPO" not in intro and "device" in intro
    dash_duo.find_element(f"#{ids.PLACE_BUTTON}").click()
    dash_duo.wait_for_contains_text("#place-headline", "predicted step", timeout=120)
    head = dash_duo.find_element("#place-headline").text
    assert "0.00 GiB" not in head and "MiB of 16.0 GiB" in head and "OOM" not in head
    axis = """
    const g = document.getElementById(arguments[0]).querySelector('.js-plotly-plot');
    return g && g.layout && g.layout.yaxis.title ? g.layout.yaxis.title.text : null;
    """
    assert until(lambda: dash_duo.driver.execute_script(axis, ids.PLACE_MEMORY_FIG), 20,
                 "memory axis") == "% of device memory"         # no "800μ" GiB axis
    # Compare all: the description column wraps inside the panel
    dash_duo.find_element(f"#{ids.PLACE_COMPARE_BUTTON}").click()
    dash_duo.wait_for_contains_text(f"#{ids.PLACE_COMPARE_TABLE}", "m-topo", timeout=180)
    grid = dash_duo.find_element(f"#{ids.PLACE_COMPARE_TABLE}")
    panel = rect(dash_duo, dash_duo.find_element(".placement-panel"))
    cells = grid.find_elements("css selector", ".ag-cell[col-id=note]")
    assert cells and all(rect(dash_duo, c)[2] <= panel[2] + 1 for c in cells)
    assert any(rect(dash_duo, c)[3] - rect(dash_duo, c)[1] > 30 for c in cells)  # wrapped
    # placers without clusters show a blank, not the grid's "Invalid Number"
    clusters = dash_duo.driver.execute_script(
        "const out = {}; dash_ag_grid.getApi(arguments[0]).forEachNode(n => {"
        "  const c = document.querySelector('#' + arguments[0] + ' .ag-row[row-id=\"' +"
        "    n.id + '\"] .ag-cell[col-id=clusters]');"
        "  out[n.data.algo] = c ? c.textContent : null; }); return out;",
        ids.PLACE_COMPARE_TABLE)
    assert "Invalid Number" not in grid.text
    assert clusters.get("m-topo") == "" and clusters.get("single") == "", clusters
    assert clusters.get("celeritas", "").strip().isdigit(), clusters
    # the history keeps every plan kind; a placement loads back into its page
    open_page(dash_duo, "Plans")
    dash_duo.find_element(f"#{ids.PLANS_REFRESH}").click()
    kinds = """
    const rows = [];
    dash_ag_grid.getApi(arguments[0]).forEachNode(n => rows.push(n.data.kind));
    return rows;
    """
    got = until(lambda: (lambda k: k if {"layer-wise", "Tofu", "placement"} <= set(k) else None)(
        dash_duo.driver.execute_script(kinds, ids.PLANS_TABLE)), 20,
        lambda: f"every kind in the history: {dash_duo.driver.execute_script(kinds, ids.PLANS_TABLE)} "
                + dash_duo.driver.execute_script(
                    "return document.getElementById(arguments[0]).textContent", ids.PLANS_STATUS))
    assert got
    # select the placement's row as a user does, by clicking it once the table has settled
    # (dash-ag-grid does not report a selection made while it is still applying new rows)
    time.sleep(1.5)
    row = dash_duo.driver.execute_script(
        "let id = null; dash_ag_grid.getApi(arguments[0]).forEachNode(n => {"
        " if (id === null && n.data.kind === 'placement') { id = n.id; } }); return id;",
        ids.PLANS_TABLE)
    dash_duo.find_element(f"#{ids.PLANS_TABLE} .ag-center-cols-container "
                          f".ag-row[row-id='{row}'] .ag-cell").click()
    time.sleep(1.0)
    # a refresh (new rowData) keeps the selection: rows carry the plan's id as their row id
    dash_duo.find_element(f"#{ids.PLANS_REFRESH}").click()
    sel = "return dash_ag_grid.getApi(arguments[0]).getSelectedRows().map(r => r.kind);"
    time.sleep(1.0)
    assert until(lambda: dash_duo.driver.execute_script(sel, ids.PLANS_TABLE), 10,
                 "selection after refresh") == ["placement"]
    dash_duo.find_element(f"#{ids.PLANS_CSV_BUTTON}").click()
    with open(downloaded(dash_duo, "plan-history.csv"), newline="") as f:
        assert {r["kind"] for r in csv.DictReader(f)} == {"layer-wise", "Tofu", "placement"}
    # Load opens the placement page; the grid's selection reaches the server a moment after the
    # click that made it, so a Load pressed before it says "select a plan" and is pressed again
    for _ in range(4):
        dash_duo.find_element(f"#{ids.PLAN_LOAD}").click()
        try:
            until(lambda: page_path(dash_duo) == "/placement", 5)
            break
        except AssertionError:
            status = dash_duo.driver.execute_script(
                "return document.getElementById(arguments[0]).textContent", ids.PLANS_STATUS)
            assert "select a plan" in status, f"Load did not open the placement page: {status}"
    assert page_path(dash_duo) == "/placement"
    dash_duo.wait_for_contains_text("#place-headline", "celeritas", timeout=30)


def test_run_says_its_cost_model_moves_its_bar_and_calibrates(dash_duo):
    start(dash_duo, Request(model="lenet5", preset="p100-nvlink-4", devices=2, batch=16))
    tab(dash_duo, "Run")
    line = dash_duo.find_element("#cost-model-text").text
    assert "roofline" in line and "not this machine" in line
    # no empty charts before a run
    assert not shown(dash_duo, ids.RUN_LAYERS) and not shown(dash_duo, ids.RUN_SERIES)
    steps = dash_duo.find_element(f"#{ids.RUN_STEPS}")
    steps.clear()
    steps.send_keys("30")
    dash_duo.find_element(f"#{ids.RUN_BUTTON}").click()
    seen = set()
    end = time.time() + 180
    while time.time() < end and not shown(dash_duo, ids.RUN_LAYERS):
        v = dash_duo.driver.execute_script(
            "const p = document.getElementById(arguments[0]);"
            "return p && getComputedStyle(p).visibility === 'visible' ? "
            "(p.hasAttribute('value') ? p.getAttribute('value') : 'moving') : null;",
            ids.RUN_PROGRESS)
        if v is not None:
            seen.add(v)
        time.sleep(0.1)
    assert shown(dash_duo, ids.RUN_LAYERS) and shown(dash_duo, ids.RUN_SERIES)
    assert len(seen) >= 2, f"the progress bar did not move: {seen}"
    dash_duo.wait_for_contains_text("#run-times", "measured")
    warnings = dash_duo.find_element(f"#{ids.RUN_RESULT}").text
    assert "--" not in warnings
    # the per-layer chart's legend does not cover its title
    time.sleep(0.5)
    fig = dash_duo.find_element(f"#{ids.RUN_LAYERS}")
    title = rect(dash_duo, fig.find_element("css selector", ".gtitle"))
    legend = rect(dash_duo, fig.find_element("css selector", ".legend"))
    assert not overlap(title, legend)
    # calibrate from the app: measured costs for local, said where the prediction is shown
    dash_duo.find_element(f"#{ids.CALIB_BUTTON}").click()
    dash_duo.wait_for_contains_text(f"#{ids.CALIB_STATUS}", "calibrated", timeout=600)
    dash_duo.wait_for_contains_text("#cost-model-text", "measured", timeout=30)
    assert dash_duo.find_element(f"#{ids.CALIB_ERROR}").text == ""
    assert "local" in dash_duo.find_element(f"#{ids.PRESET_DROPDOWN}").text


def test_a_step_inside_a_collapsed_group_opens_it(dash_duo):
    start(dash_duo, Request(model="inception_v3", preset="p100-nvlink-4", devices=2, batch=8))
    before = nodes(dash_duo)
    assert any(v[3] == "group" for v in before.values())           # opens collapsed
    tab(dash_duo, "Elimination steps")
    dash_duo.wait_for_contains_text(f"#{ids.STEP_TEXT}", "node eliminations")
    dash_duo.find_element(f"#{ids.STEP_NEXT}").click()
    dash_duo.wait_for_contains_text(f"#{ids.STEP_TEXT}", "Step 1/")
    name = dash_duo.find_element(f"#{ids.STEP_TEXT}").text.split("node elimination: ")[1] \
        .split(" ")[0]
    shown = until(lambda: (lambda n: n if name in n and "current" in n[name][0] else None)(
        nodes(dash_duo)), 20, f"{name} shown on its own")
    # labels inside an opened group are not cut to one identical prefix
    members = [v[1] for v in shown.values() if v[3] == "layer"]
    assert len(set(members)) == len(members)
    # an opened group's box holds only its own layers
    strays = """
    const cy = document.getElementById(arguments[0])._cyreg.cy;
    const out = [];
    cy.nodes('[kind = "parent"]').forEach(g => {
        const bb = g.boundingBox({includeLabels: false});
        cy.nodes().forEach(n => {
            if (n.isParent() || n.data('parent') === g.id()) { return; }
            const p = n.position();
            if (p.x > bb.x1 && p.x < bb.x2 && p.y > bb.y1 && p.y < bb.y2) { out.push(n.id()); }
        });
    });
    return out;
    """
    time.sleep(0.5)
    assert dash_duo.driver.execute_script(strays, ids.GRAPH) == []


def test_tiling_halo_is_shaded_labelled_and_hoverable(dash_duo):
    start(dash_duo)
    tap(dash_duo, "features_24")
    dash_duo.wait_for_contains_text(f"#{ids.DETAILS}", "features_24")
    tab(dash_duo, "Tiling")
    info = """
    const g = document.getElementById(arguments[0]);
    const p = g && g.querySelector('.js-plotly-plot');
    if (!p || !p.data) { return null; }
    const regions = p.data.filter(t => t.meta === 'needed region');
    if (!regions.length) { return null; }
    return [regions.length, regions.every(t => t.fill === 'toself' && t.hoveron === 'fills'),
            (p.layout.annotations || []).some(a => (a.text || '').includes('halo'))];
    """
    n, filled, labelled = until(lambda: dash_duo.driver.execute_script(
        info, ids.TILING_FIGURE), 60, "the tiling figure's regions")
    assert n >= 1 and filled and labelled
    # the shaded region is the hover target: its fill is drawn on the page
    assert dash_duo.driver.execute_script(
        "return document.getElementById(arguments[0]).querySelectorAll('.js-fill').length",
        ids.TILING_FIGURE) >= n
    # the strip's thumbnails say which dimensions their rows and columns split
    letters = """
    const p = document.getElementById(arguments[0]).querySelector('.js-plotly-plot');
    const t = p && p.data && p.data.find(d => d.meta === 'strip-dimensions');
    return t ? t.text : null;
    """
    got = until(lambda: dash_duo.driver.execute_script(letters, ids.TILING_STRIP), 30,
                "the strip's dimension letters")
    assert {"n", "c", "h×w"} & set(got) and "n" in got
    # "all devices": every device's region shaded in its own colour
    dash_duo.select_dcc_dropdown(f"#{ids.TILING_DEVICE}", value="all devices")
    colours = """
    const p = document.getElementById(arguments[0]).querySelector('.js-plotly-plot');
    return p ? [...new Set(p.data.filter(t => t.meta === 'needed region')
                                 .map(t => t.fillcolor))].length : 0;
    """
    until(lambda: dash_duo.driver.execute_script(colours, ids.TILING_FIGURE) == 4, 30,
          "four devices' regions")


def test_cancelling_calibration_leaves_no_process(dash_duo, monkeypatch):
    """Calibrate from the Run tab, Cancel while its workers run: the page says it was
    cancelled, and within a bounded wait neither a child of the server process nor any
    process that came from the calibration (found by an environment variable every one of
    them inherits, so a worker re-parented after its launcher died is found too) is left."""
    import uuid

    import psutil
    tag = uuid.uuid4().hex
    monkeypatch.setenv("EXPLORER_TEST_TAG", tag)
    start(dash_duo, Request(model="lenet5", preset="p100-nvlink-4", devices=2, batch=16))
    tab(dash_duo, "Run")
    before = dash_duo.find_element("#cost-model-text").text
    # children this test process already had (e.g. multiprocessing's resource tracker, started
    # by an earlier test and alive until pytest exits) are not the calibration's
    earlier = {p.pid for p in psutil.Process().children(recursive=True)}
    dash_duo.find_element(f"#{ids.CALIB_BUTTON}").click()
    seen = until(lambda: mp_workers(tagged(tag)), 180, "calibration workers running")
    pids = {p.pid for p in seen}
    dash_duo.find_element(f"#{ids.CALIB_CANCEL}").click()
    dash_duo.wait_for_contains_text(f"#{ids.CALIB_STATUS}", "cancelled", timeout=30)
    dash_duo.wait_for_element_by_css_selector(f"#{ids.CALIB_BUTTON}:not([disabled])",
                                              timeout=30)

    def left():
        return leftover(tag, earlier)
    end = time.time() + 30
    while time.time() < end and left():
        time.sleep(0.5)
    assert not left(), f"processes left after Cancel: {left()}"
    assert not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE
                   for p in pids)
    # nothing changed on the page: the same plan, its costs from the same model
    assert dash_duo.find_element("#cost-model-text").text == before
    assert "cancelled" in dash_duo.find_element(f"#{ids.CALIB_STATUS}").text

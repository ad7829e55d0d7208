"""Take the README's screenshots from the running app (headless Chromium).

    python scripts/screenshots.py [--out docs/screenshots]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import browser as B  # noqa: E402


def tab(drv, n):
    drv.find_element("css selector", f"#tabs .tab:nth-child({n})").click()
    time.sleep(1.0)


def page(drv, key):
    """Open the header's page ``key`` ("tofu", "placement", "plans", "layerwise")."""
    drv.find_element("id", f"nav-{key}").click()
    B.wait(drv, lambda: drv.find_elements("css selector", f".{key}-page"), 120)
    time.sleep(1.0)


def pages_shots(out):
    """The Tofu and placement pages, whole (header and form included), on WResNet-50 (width
    1) at batch 8 on 4 K80s."""
    with B.browser(1400, 1250) as drv, B.server(
            "--model", "wresnet", "--model-arg", "depth=50", "--model-arg", "width=1",
            "--model-arg", "image_size=32", "--batch", "8", "--preset", "k80-pcie-8",
            "--devices", "4") as url:
        drv.get(url)
        B.wait(drv, lambda: B.nodes(drv), 120)
        page(drv, "tofu")
        drv.find_element("id", "tofu-button").click()
        B.wait(drv, lambda: "communicated" in B.text(drv, "#tofu-headline"), 180)
        B.wait(drv, lambda: drv.execute_script(
            "return document.querySelectorAll('.tofu-tile').length"), 60)
        time.sleep(1.5)
        shot(drv, out, "page-tofu.png")
        page(drv, "placement")
        drv.find_element("id", "place-button").click()
        B.wait(drv, lambda: "predicted step" in B.text(drv, "#place-headline"), 180)
        time.sleep(2.5)
        shot(drv, out, "page-placement.png")
        page(drv, "plans")
        time.sleep(1.5)
        shot(drv, out, "page-plans.png")


def families_shot(out):
    """Compare across families on LeNet-5 (batch 8) on 2 local workers, after three of its
    plans (one per family) ran here, so their measured steps stand beside the predictions."""
    home = tempfile.mkdtemp(prefix="explorer-shots-families-")
    env = dict(os.environ, EXPLORER_HOME=home)
    for algo in ("optcnn", "tofu", "celeritas"):
        plan = os.path.join(home, f"lenet5-{algo}.json")
        for cmd in (["search", "lenet5", "--devices", "2", "--preset", "local", "--batch", "8",
                     "--algo", algo, "--out", plan],
                    ["run", plan, "--steps", "5", "--warmup", "2", "--no-check"]):
            subprocess.run([sys.executable, "-m", "explorer", *cmd], cwd=ROOT, env=env,
                           check=True, stdout=subprocess.DEVNULL)
    old = os.environ.get("EXPLORER_HOME")
    os.environ["EXPLORER_HOME"] = home                # the server reads the same run store
    try:
        with B.browser(1400, 1800) as drv, B.server() as url:
            drv.get(url + "?model=lenet5&devices=2&preset=local&algo=optcnn&batch=8"
                          "&tab=compare")
            B.wait(drv, lambda: drv.find_elements("id", "families-button"), 120)
            drv.find_element("id", "families-button").click()
            B.wait(drv, lambda: "families" in B.text(drv, "#families-status")
                   and drv.find_elements("css selector", "#families-table .ag-row"), 300)
            time.sleep(2.0)
            drv.execute_script("document.getElementById('families-status').scrollIntoView()")
            drv.execute_script("window.scrollBy(0, -60)")
            time.sleep(0.5)
            shot(drv, out, "compare-families.png")
    finally:
        if old is None:
            os.environ.pop("EXPLORER_HOME", None)
        else:
            os.environ["EXPLORER_HOME"] = old


def shot(drv, out, name):
    path = os.path.join(out, name)
    drv.save_screenshot(path)
    print("wrote", path)


def learn_shots(out):
    """The Learn page (/learn) at 1500×1100 and 1024×768: the first scenario (OptCNN Figures
    1-4) once its figures are drawn, the elimination scenario (equations 2 and 3),
    Figures 7-8 / Table 5 with why layer-wise moves more bytes than OWT, Tofu's recursion and
    the Celeritas pipeline (their sections)."""
    for (w, h), name in (((1500, 1100), "learn.png"), ((1024, 768), "learn-1024.png")):
        with B.browser(w, h) as drv, B.server() as url:
            drv.get(url + "learn")
            B.wait(drv, lambda: drv.execute_script(
                "return document.querySelectorAll('#learn-optcnn-dims-times .bar').length"
                " || document.querySelectorAll('#learn-optcnn-dims-times .point').length"), 120)
            # a first visit opens the guided tour: close it for the picture
            B.wait(drv, lambda: drv.find_element("id", "learn-tour-close").is_displayed(), 30)
            drv.find_element("id", "learn-tour-close").click()
            time.sleep(1.5)
            shot(drv, out, name)
            if w == 1500:
                drv.find_element("css selector", "#learn-tabs .tab:nth-child(3)").click()
                B.wait(drv, lambda: "Equation" in B.text(drv, "#learn-optcnn-elim-fig"), 120)
                time.sleep(1.5)
                shot(drv, out, "learn-elimination.png")
                # LeNet-5's first elimination chooses configuration "1": the arrow on its bar
                drv.find_element("id", "learn-optcnn-elim-model").click()
                B.wait(drv, lambda: [o.click() for o in drv.find_elements(
                    "css selector", ".dash-dropdown-option") if "LeNet" in o.text], 10)
                B.wait(drv, lambda: "Elimination 1 of 6" in B.text(
                    drv, "#learn-optcnn-elim-equation"), 120)
                time.sleep(2)
                drv.execute_script("document.getElementById('learn-optcnn-elim-fig')"
                                   ".scrollIntoView({block: 'center'})")
                shot(drv, out, "learn-elimination-arrow.png")
                # Figures 7-8 and Table 5: why layer-wise moves more bytes than OWT here
                drv.find_element("css selector", "#learn-tabs .tab:nth-child(4)").click()
                B.wait(drv, lambda: "not bytes" in B.text(drv, "#learn-optcnn-scale-why-bytes"),
                       300)
                B.wait(drv, lambda: "Table 5" in B.text(drv, "#learn-optcnn-scale-why-table5"),
                       300)
                drv.execute_script("document.getElementById('learn-optcnn-scale-why-bytes')"
                                   ".scrollIntoView({block: 'start'})")
                time.sleep(1.5)
                shot(drv, out, "learn-fig8.png")
                # Tofu's recursion (RNN, 8 workers) and the Celeritas pipeline (NMT, 4
                # devices): the scenario's section once its figures are drawn, in a window
                # tall enough to hold the whole section
                drv.set_window_size(1400, 1600)
                for key, figs in (("tofu-recursion", ("fig", "steps")),
                                  ("celeritas-pipeline", ("fig",))):
                    drv.get(url + "learn?s=" + key)
                    B.wait(drv, lambda: all(drv.execute_script(
                        "const e = document.querySelector('#' + arguments[0] + "
                        "' .js-plotly-plot'); return e && e.data && e.data.length",
                        f"learn-{key}-{f}") for f in figs), 300)
                    B.wait(drv, lambda: B.text(drv, f"#learn-{key}-ours"), 60)
                    time.sleep(1.5)
                    path = os.path.join(out, f"learn-{key}.png")
                    drv.find_element("id", f"learn-{key}-section").screenshot(path)
                    print("wrote", path)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(ROOT, "docs", "screenshots"))
    ap.add_argument("--only", choices=("learn", "pages", "families"), default=None,
                    help="take only the Learn page's, the family pages', or Compare across "
                         "families' screenshots")
    args = ap.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    if args.only in (None, "families"):
        families_shot(args.out)
    if args.only == "families":
        return
    if args.only in (None, "pages"):
        pages_shots(args.out)
    if args.only == "pages":
        return
    learn_shots(args.out)
    if args.only == "learn":
        return
    with B.browser(1400, 1250) as drv:
        with B.server() as url:                       # VGG-16 on 4×P100 NVLink
            drv.get(url)
            B.wait(drv, lambda: B.nodes(drv), 60)
            B.tap(drv, "features_24")
            B.wait(drv, lambda: "features_24" in B.text(drv, "#details"), 20)
            time.sleep(1)
            shot(drv, args.out, "overview.png")
            B.select(drv, "#pin-config", "n=1 c=1 h=2 w=2")
            drv.find_element("id", "pin-button").click()
            B.wait(drv, lambda: "ms" in B.text(drv, "#objective-delta"), 60)
            time.sleep(1)
            tab(drv, 1)
            drv.execute_script("window.scrollTo(0, document.body.scrollHeight)")
            time.sleep(0.5)
            shot(drv, args.out, "pinned.png")
            tab(drv, 3)
            B.wait(drv, lambda: "features_24" in B.text(drv, "#tiling-figure"), 30)
            time.sleep(1.5)
            drv.execute_script(
                "document.getElementById('tiling-figure').scrollIntoView()")
            shot(drv, args.out, "tiling.png")
            tab(drv, 4)
            drv.find_element("id", "compare-button").click()
            B.wait(drv, lambda: "(owt)" in B.text(drv, "#compare-time"), 60)
            time.sleep(2)
            drv.execute_script("document.getElementById('compare-time').scrollIntoView()")
            shot(drv, args.out, "compare.png")
        with B.server("--model", "inception_v3", "--preset", "p100-cluster",
                      "--devices", "4") as url:
            drv.get(url)
            B.wait(drv, lambda: B.nodes(drv), 60)
            B.tap(drv, "group:Mixed_5b")
            B.wait(drv, lambda: "mixed_5b_branch1x1_conv" in (B.nodes(drv) or {}), 30)
            tab(drv, 2)
            for _ in range(9):
                drv.find_element("id", "step-next").click()
                time.sleep(0.15)
            time.sleep(1.5)
            drv.execute_script("window.scrollTo(0, 0)")
            shot(drv, args.out, "inception-steps.png")
        with B.server("--model", "wresnet", "--model-arg", "depth=50", "--model-arg", "width=4",
                      "--batch", "8", "--preset", "k80-pcie-8", "--devices", "8") as url:
            drv.get(url)
            B.wait(drv, lambda: B.nodes(drv), 120)
            page(drv, "tofu")
            drv.find_element("id", "tofu-button").click()
            B.wait(drv, lambda: "communicated" in B.text(drv, "#tofu-headline"), 180)
            B.wait(drv, lambda: drv.execute_script(
                "return document.querySelectorAll('.tofu-tile').length"), 60)
            time.sleep(1.5)
            drv.execute_script("document.getElementById('tofu-steps').scrollIntoView()")
            shot(drv, args.out, "tofu.png")
            page(drv, "placement")
            drv.find_element("id", "place-button").click()
            B.wait(drv, lambda: "predicted step" in B.text(drv, "#place-headline"), 180)
            time.sleep(2.5)
            drv.execute_script("document.getElementById('place-headline').scrollIntoView()")
            shot(drv, args.out, "placement.png")
        # a saved Tofu plan uploaded on the Plans page opens the Tofu page on its request
        plan = os.path.join(tempfile.mkdtemp(prefix="explorer-shots-"), "lenet5-tofu.json")
        subprocess.run([sys.executable, "-m", "explorer", "search", "lenet5", "--devices", "4",
                        "--preset", "p100-cluster", "--batch", "16", "--algo", "tofu",
                        "--out", plan], cwd=ROOT, check=False, stdout=subprocess.DEVNULL)
        with B.server() as url:
            drv.get(url + "?model=alexnet&devices=4&preset=p100-cluster&batch=64")
            B.wait(drv, lambda: B.nodes(drv), 60)
            page(drv, "plans")
            drv.find_element("css selector", "#plan-upload input[type=file]").send_keys(plan)
            B.wait(drv, lambda: drv.execute_script(
                "return document.querySelectorAll('.tofu-tile').length"), 90)
            time.sleep(1.5)
            shot(drv, args.out, "tofu-plan-loaded.png")


if __name__ == "__main__":
    main()

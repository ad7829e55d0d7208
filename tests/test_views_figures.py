"""Figures are pure functions: ``explorer/views/figures/*`` never registers a Dash callback,
names a component id or calls the service (their source is read with ``ast``, not imported)."""

import ast
import importlib
import inspect
import pkgutil
from pathlib import Path

import pytest

import explorer.views.figures as figures

FIGURES = sorted(Path(figures.__file__).parent.glob("*.py"))
#: what a figure module may not import: Dash (callbacks, ids, components), the panels' ids
#: module and the application service
FORBIDDEN = ("dash", "explorer.service", "explorer.views.ids", "explorer.app")
PANELS = ("compare", "tiling", "placement", "run", "tofu", "ranking")


ROOT = Path(figures.__file__).parents[3]      # the directory holding the explorer package


def _imports(path: Path) -> set:
    """Absolute names of every module ``path`` imports (relative imports resolved against the
    file's own package)."""
    package = ".".join(path.resolve().parent.relative_to(ROOT.resolve()).parts)
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([node.module] if node.module else []))
            out.add(base)
            out.update(f"{base}.{a.name}" for a in node.names)
    return out


def test_one_figures_module_per_panel_with_figures():
    names = {m.name for m in pkgutil.iter_modules(figures.__path__)}
    assert set(PANELS) <= names
    assert figures.__doc__ and "pure" in figures.__doc__


@pytest.mark.parametrize("path", FIGURES, ids=lambda p: p.name)
def test_figure_modules_import_no_dash_ids_or_service(path):
    bad = {name for name in _imports(path)
           if any(name == f or name.startswith(f + ".") for f in FORBIDDEN)}
    assert not bad, f"{path.name} imports {sorted(bad)}"


def test_relative_imports_are_resolved():
    src = Path(figures.__file__).parent / "tiling.py"
    got = _imports(src)
    assert "explorer.engine.core.geometry" in got and "explorer.views.palette" in got
    # the check sees what a panel imports (it would flag a figure module doing the same)
    panel = _imports(Path(figures.__file__).parent.parent / "compare.py")
    assert {"dash", "explorer.service", "explorer.views.ids"} <= panel


@pytest.mark.parametrize("name", PANELS)
def test_public_functions_call_no_session_or_service(name):
    mod = importlib.import_module(f"explorer.views.figures.{name}")
    funcs = [f for n, f in inspect.getmembers(mod, inspect.isfunction)
             if f.__module__ == mod.__name__]      # public ones and their private helpers
    assert any(not f.__name__.startswith("_") for f in funcs), f"figures.{name} is empty"
    for f in funcs:
        for node in ast.walk(ast.parse(inspect.getsource(f))):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
                assert node.value.id not in ("session", "service", "ids", "dash"), \
                    f"figures.{name}.{f.__name__} uses {node.value.id}.{node.attr}"


def test_every_figure_colour_helper_is_the_palette():
    from explorer.views import palette
    from explorer.views.figures import placement, tiling
    assert tiling.device_color is placement.device_color is palette.device_color


def test_run_and_tofu_figures_from_plain_dicts():
    from explorer.views import palette
    from explorer.views.figures import run, tofu
    res = {"layers": [{"name": "a", "predicted_s": 1e-3, "measured_s": 2e-3},
                      {"name": "b", "predicted_s": 5e-3, "measured_s": 1e-3}],
           "step_times_s": [0.010, 0.012], "predicted_step_time_s": 0.011,
           "measured_step_time_s": 0.011}
    fig = run.layers_figure(res, top=1)
    assert [t.name for t in fig.data] == ["predicted", "measured"]
    assert list(fig.data[0].x) == ["b"] and fig.data[1].marker.color == palette.MEASURED
    series = run.series_figure(res)
    assert list(series.data[0].y) == pytest.approx([10.0, 12.0])
    assert len(series.layout.shapes) == 2          # predicted and median lines
    cmp = tofu.compare_figure({"tofu": {"comm_bytes": 1e9}, "spartan": {"comm_bytes": 3e9}})
    assert list(cmp.data[0].marker.color) == [palette.HIGHLIGHT, palette.PREDICTED]


def test_tiling_plan_messages():
    from explorer.views.figures import tiling
    assert tiling.plan_message(None).startswith("No plan yet")
    assert "boom" in tiling.plan_message({"error": "boom"})
    assert tiling.plan_message({"layers": []}) == "The plan has no layers to draw."
    assert tiling.plan_message({"layers": [{"name": "x"}]}) == ""
    fig = tiling.strip_figure({"layers": []})
    assert fig.layout.annotations[0].text == "The plan has no layers to draw."


def test_figures_with_nothing_to_show_say_what_to_press_instead_of_empty_axes():
    from explorer.views.figures import placement as PF
    from explorer.views.figures import tofu as TF
    empty = {"gantt": PF.gantt_figure(None), "memory": PF.memory_figure(None),
             "run": PF.run_figure(None), "series": PF.run_series(None),
             "compare": PF.compare_figure([]), "tofu memory": TF.run_memory_figure(None, None),
             "tofu time": TF.run_time_figure(None, None)}
    for name, fig in empty.items():
        lay = fig.layout
        assert fig.data == (), name
        assert lay.xaxis.visible is False and lay.yaxis.visible is False, name
        assert any("press" in a.text for a in lay.annotations), name
        assert lay.title.text, name                    # still says what will be drawn there

"""The import rules that keep data flowing one way (capture -> graph -> costs -> method -> plan
-> views / runtime / export), checked on the source with ``ast``.

* the engine (``explorer/engine/**``) never imports the application service, the app or the
  views;
* the runtime (``explorer/engine/runtime/**``) never imports a search method, so executing a
  plan does not depend on how it was found;
* the views (``explorer/views/**``) reach methods and runs only through the service;
* the plan model (``engine/plan.py``, ``engine/plandoc.py``) does not capture models, and the
  geometry package asks nothing downstream of it.

Every import counts: absolute and relative, at module level or inside a function, and
``importlib.import_module("...")`` with a literal name.  A violation names the file and line.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "explorer"

#: (rule id, directory the rule applies to, module prefixes it may not import)
RULES = [
    ("engine", "explorer/engine", ("explorer.service", "explorer.app", "explorer.views")),
    ("runtime", "explorer/engine/runtime", ("explorer.engine.search",)),
    ("views", "explorer/views", ("explorer.engine.search", "explorer.engine.runtime")),
    ("plan", "explorer/engine/plan.py", ("explorer.engine.importer", "explorer.engine.opgraph")),
    ("plandoc", "explorer/engine/plandoc.py", ("explorer.engine.importer",
                                               "explorer.engine.opgraph")),
    ("geometry", "explorer/engine/geometry", ("explorer.engine.search", "explorer.engine.runtime",
                                              "explorer.engine.costmodel",
                                              "explorer.engine.placement")),
]


def module_name(path: Path, root: Path = ROOT) -> str:
    """Dotted name of the module at ``path`` (a package's ``__init__.py`` is the package)."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported_modules(source: str, module: str, is_package: bool = False):
    """``(line, absolute module name)`` for every import in ``source`` of ``module``.

    ``from X import a`` yields both ``X`` and ``X.a`` (``a`` may be a submodule); relative
    imports are resolved against the module's package, as Python does.
    """
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".") if package else []
                if node.level - 1 > len(parts):
                    raise ValueError(f"{module}:{node.lineno}: relative import beyond the "
                                     f"top-level package")
                base = ".".join(parts[:len(parts) - (node.level - 1)])
                target = ".".join(p for p in (base, node.module) if p)
            else:
                target = node.module or ""
            yield node.lineno, target
            for alias in node.names:
                if alias.name != "*":
                    yield node.lineno, f"{target}.{alias.name}"
        elif (isinstance(node, ast.Call) and node.args
              and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)
              and ((isinstance(node.func, ast.Attribute) and node.func.attr == "import_module")
                   or (isinstance(node.func, ast.Name)
                       and node.func.id in ("import_module", "__import__")))):
            yield node.lineno, node.args[0].value


def violations(directory: Path, forbidden, root: Path = ROOT) -> list[str]:
    """``file:line: imports X`` for every import under ``directory`` of a forbidden module."""
    found = []
    for path in [directory] if directory.is_file() else sorted(directory.rglob("*.py")):
        module = module_name(path, root)
        for line, name in imported_modules(path.read_text(), module,
                                           path.name == "__init__.py"):
            if any(name == f or name.startswith(f + ".") for f in forbidden):
                found.append(f"{path.relative_to(root)}:{line}: imports {name}")
    return sorted(set(found))


@pytest.mark.parametrize("rule, directory, forbidden", [
    pytest.param(*RULES[0], id="engine-imports-no-app"),
    pytest.param(*RULES[1], id="runtime-imports-no-method"),
    pytest.param(*RULES[2], id="views-use-the-service"),
    pytest.param(*RULES[3], id="plan-captures-nothing"),
    pytest.param(*RULES[4], id="plandoc-captures-nothing"),
    pytest.param(*RULES[5], id="geometry-is-upstream"),
])
def test_import_rule(rule, directory, forbidden):
    assert (ROOT / directory).exists()
    bad = violations(ROOT / directory, forbidden)
    assert not bad, f"{rule} rule broken:\n" + "\n".join(bad)


def test_resolver_sees_relative_and_function_level_imports(tmp_path):
    """The rule checker itself: relative imports resolve like Python's, imports inside
    functions and ``importlib.import_module`` count, and harmless imports pass."""
    pkg = tmp_path / "explorer" / "engine" / "runtime"
    pkg.mkdir(parents=True)
    (tmp_path / "explorer" / "__init__.py").write_text("")
    (tmp_path / "explorer" / "engine" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("from ..search import tofu\n")
    (pkg / "ok.py").write_text("import numpy\nfrom . import ops\nfrom ..graph import Layer\n"
                               "from ... import errors\n")
    (pkg / "late.py").write_text("def f():\n    from ...engine import search\n"
                                 "    return search\n")
    (pkg / "dyn.py").write_text("import importlib\n\n"
                                "m = importlib.import_module('explorer.views.graph')\n")
    (pkg / "up.py").write_text("from ... import service as session\n")

    assert violations(pkg, ("explorer.engine.search",), tmp_path) == [
        "explorer/engine/runtime/__init__.py:1: imports explorer.engine.search",
        "explorer/engine/runtime/__init__.py:1: imports explorer.engine.search.tofu",
        "explorer/engine/runtime/late.py:2: imports explorer.engine.search",
    ]
    assert violations(pkg, ("explorer.service", "explorer.views"), tmp_path) == [
        "explorer/engine/runtime/dyn.py:3: imports explorer.views.graph",
        "explorer/engine/runtime/up.py:1: imports explorer.service",
    ]
    assert violations(pkg, ("explorer.engine.searchers",), tmp_path) == []
    assert list(imported_modules("from ... import errors\n", "explorer.engine.runtime.ok")) == [
        (1, "explorer"), (1, "explorer.errors")]


def test_no_module_cites_the_design_document():
    """Code explains itself: no module refers the reader to a document outside the repo."""
    needle = "DESIGN" + ".md"
    me = Path(__file__).resolve()
    cited = [f"{p.relative_to(ROOT)}:{i}"
             for d in ("explorer", "tests", "benchmarks", "scripts") if (ROOT / d).is_dir()
             for p in sorted((ROOT / d).rglob("*.py")) if p.resolve() != me
             for i, line in enumerate(p.read_text().splitlines(), 1) if needle in line]
    assert not cited, "modules cite " + needle + ": " + ", ".join(cited)

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
import functools
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "explorer"

E = "explorer.engine."
#: the search methods' own modules: what a saved plan must run without
METHOD_MODULES = (E + "search", E + "layerwise.optcnn", E + "layerwise.classic",
                  E + "layerwise.exhaustive", E + "tofu.search", E + "placement.celeritas",
                  E + "placement.placers")

#: (rule id, directory the rule applies to, module prefixes it may not import)
RULES = [
    ("engine", "explorer/engine", ("explorer.service", "explorer.app", "explorer.views")),
    ("runtime", "explorer/engine/runtime", METHOD_MODULES),
    ("views", "explorer/views", METHOD_MODULES + (E + "runtime",)),
    ("plan", "explorer/engine/layerwise/plan.py", (E + "core.importer", E + "core.opgraph",
                                                   E + "core.capture")),
    ("plandoc", "explorer/engine/core/plandoc.py", (E + "core.importer", E + "core.opgraph",
                                                    E + "core.capture")),
    ("geometry", "explorer/engine/core/geometry", (E + "search", E + "runtime", E + "layerwise",
                                                   E + "tofu", E + "placement", E + "export")),
    ("core", "explorer/engine/core", (E + "layerwise", E + "tofu", E + "placement",
                                      E + "search", E + "runtime", E + "export")),
    ("layerwise", "explorer/engine/layerwise", (E + "tofu", E + "placement", E + "runtime",
                                                E + "export")),
    ("tofu", "explorer/engine/tofu", (E + "layerwise", E + "placement", E + "runtime",
                                      E + "export")),
    ("placement", "explorer/engine/placement", (E + "layerwise", E + "tofu", E + "export")),
    ("search", "explorer/engine/search", (E + "runtime", E + "export")),
    ("export", "explorer/engine/export", METHOD_MODULES),
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
    pytest.param(*RULES[6], id="core-knows-no-family"),
    pytest.param(*RULES[7], id="layerwise-is-its-own-family"),
    pytest.param(*RULES[8], id="tofu-is-its-own-family"),
    pytest.param(*RULES[9], id="placement-is-its-own-family"),
    pytest.param(*RULES[10], id="search-registry-runs-nothing"),
    pytest.param(*RULES[11], id="export-imports-no-method"),
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


# ------------------------------------------------------------------------------------------
# No import cycles, no private cross-imports
# ------------------------------------------------------------------------------------------


def import_graph(package: Path = PACKAGE, root: Path = ROOT):
    """``(modules, edges, private)`` of every module under ``package``: ``edges`` maps a module
    to the set of modules it imports (lazy imports inside functions included); ``from pkg
    import sub`` of a submodule is an edge to ``pkg.sub`` alone.  ``private`` lists
    ``file:line: imports M._name`` for every import of another module's private name."""
    modules = {module_name(p, root): p for p in sorted(package.rglob("*.py"))}
    edges: dict = {m: set() for m in modules}
    private = []
    for m, path in modules.items():
        items = list(imported_modules(path.read_text(), m, path.name == "__init__.py"))
        by_line: dict = {}
        for line, name in items:
            by_line.setdefault(line, []).append(name)
        for line, names in by_line.items():
            for name in names:
                subs = [n for n in names if n.rpartition(".")[0] == name]
                if subs and all(n in modules for n in subs):
                    continue                # `from pkg import sub, sub2`: not pkg itself
                if name in modules and name != m:
                    edges[m].add(name)
                owner, _, leaf = name.rpartition(".")
                if (owner in modules and owner != m and name not in modules
                        and leaf.startswith("_") and not leaf.startswith("__")):
                    private.append(f"{path.relative_to(root)}:{line}: imports {name}")
        private += [f"{path.relative_to(root)}:{line}: imports {name}"
                    for line, name in _private_attributes(path.read_text(), m, modules)]
    return modules, edges, sorted(set(private))


def _private_attributes(source: str, module: str, modules) -> list:
    """``(line, M._name)`` for every ``alias._name`` where ``alias`` names another module of
    ours (``import a.b as alias``, ``from a import b as alias``)."""
    package = module.rpartition(".")[0] if module in modules else module
    tree = ast.parse(source)
    alias_of = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.asname and a.name in modules:
                    alias_of[a.asname] = a.name
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(p for p in (".".join(parts[:len(parts) - (node.level - 1)]),
                                            node.module) if p)
            for a in node.names:
                if f"{base}.{a.name}" in modules:
                    alias_of[a.asname or a.name] = f"{base}.{a.name}"
    return [(node.lineno, f"{alias_of[node.value.id]}.{node.attr}")
            for node in ast.walk(tree)
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
            and node.value.id in alias_of and alias_of[node.value.id] != module
            and node.attr.startswith("_") and not node.attr.startswith("__")]


def cycles(edges: dict) -> list:
    """Every import cycle as a sorted list of modules (strongly connected components of more
    than one module, and modules importing themselves)."""
    import networkx as nx
    g = nx.DiGraph()
    g.add_nodes_from(edges)
    g.add_edges_from((a, b) for a, bs in edges.items() for b in bs)
    return sorted(sorted(c) for c in nx.strongly_connected_components(g)
                  if len(c) > 1 or any(g.has_edge(n, n) for n in c))


@functools.cache
def _package_graph():
    return import_graph()


def test_no_import_cycles():
    """Data flows one way: no two modules import each other, directly or around a loop, even
    through imports inside functions."""
    _, edges, _ = _package_graph()
    found = cycles(edges)
    assert not found, "import cycles:\n" + "\n".join(" -> ".join(c) for c in found)


def test_no_module_imports_another_modules_private_names():
    """A name with a leading underscore belongs to its module: others import public names."""
    _, _, private = _package_graph()
    assert not private, "private names imported:\n" + "\n".join(private)


def _package(tmp_path, files: dict) -> Path:
    for rel, text in files.items():
        f = tmp_path / rel
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(text)
    return tmp_path / "explorer"


def test_cycle_checker_finds_a_planted_cycle_through_a_lazy_import(tmp_path):
    """The cycle test itself: a loop closed by an import inside a function is found; the
    same modules without it pass; a package importing its submodules is no cycle."""
    files = {"explorer/__init__.py": "", "explorer/a.py": "from explorer import b\n",
             "explorer/b.py": "def f():\n    from .c import g\n    return g\n",
             "explorer/c.py": "import explorer.a\n\ndef g():\n    return 1\n",
             "explorer/p/__init__.py": "from explorer.p import q\n",
             "explorer/p/q.py": "from explorer.p import r\n", "explorer/p/r.py": ""}
    _, edges, _ = import_graph(_package(tmp_path, files), tmp_path)
    assert cycles(edges) == [["explorer.a", "explorer.b", "explorer.c"]]
    files["explorer/c.py"] = "def g():\n    return 1\n"
    _, edges, _ = import_graph(_package(tmp_path, files), tmp_path)
    assert cycles(edges) == []


def test_private_import_checker_finds_a_planted_private_import(tmp_path):
    """The private-import test itself: ``from m import _x`` (also lazily, also relative) of
    another module is found; a module's own private names and dunders are not."""
    files = {"explorer/__init__.py": "", "explorer/m.py": "_x = 1\n__all__ = []\n",
             "explorer/n.py": "def f():\n    from .m import _x\n    return _x\n",
             "explorer/o.py": "from explorer.m import __all__\n_y = 2\n",
             "explorer/p.py": "from explorer import m as M\n\nv = M._x\n"}
    _, _, private = import_graph(_package(tmp_path, files), tmp_path)
    assert private == ["explorer/n.py:2: imports explorer.m._x",
                       "explorer/p.py:3: imports explorer.m._x"]

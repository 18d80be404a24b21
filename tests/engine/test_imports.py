"""Import structure of ``datamask_pipeline``: no import circles between its modules, and the
engine and the reporting code never load Dagster.

The graph comes from the source (``ast``), not from running it, so a circle hidden in a
function-level import is found as well as one at the top of a module.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import datamask_pipeline


def _modules(package_dir: Path) -> dict[str, tuple[Path, bool]]:
    """Dotted module name -> (file, is a package's ``__init__``) for every .py under it."""
    out = {}
    for path in sorted(package_dir.rglob("*.py")):
        parts = list(path.relative_to(package_dir.parent).with_suffix("").parts)
        is_pkg = parts[-1] == "__init__"
        if is_pkg:
            parts = parts[:-1]
        out[".".join(parts)] = (path, is_pkg)
    return out


def _known_prefix(name: str, modules) -> str | None:
    """The longest leading part of ``name`` that is one of ``modules`` (``a.b.func`` -> ``a.b``)."""
    parts = name.split(".")
    for n in range(len(parts), 0, -1):
        candidate = ".".join(parts[:n])
        if candidate in modules:
            return candidate
    return None


def import_graph(package_dir: Path) -> dict[str, dict[str, list[int]]]:
    """module -> {imported module of the same package -> line numbers of the imports}.

    Counts every ``import`` / ``from ... import`` anywhere in a file (module level, functions,
    ``if TYPE_CHECKING``), with relative imports resolved; ``from pkg import name`` is an edge
    to ``pkg.name`` when that is a module or package, else to ``pkg``."""
    modules = _modules(package_dir)
    graph: dict[str, dict[str, list[int]]] = {name: {} for name in modules}
    for name, (path, is_pkg) in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            targets = []
            if isinstance(node, ast.Import):
                targets = [_known_prefix(alias.name, modules) for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    # the package the relative import starts from: the module's own package,
                    # one level up per extra dot
                    base = name.split(".") if is_pkg else name.split(".")[:-1]
                    base = base[: len(base) - (node.level - 1)]
                    if node.module:
                        base = base + node.module.split(".")
                    base_name = ".".join(base)
                else:
                    base_name = node.module or ""
                for alias in node.names:
                    sub = f"{base_name}.{alias.name}"
                    targets.append(sub if sub in modules else _known_prefix(base_name, modules))
            for target in targets:
                if target is not None and target != name:
                    graph[name].setdefault(target, []).append(node.lineno)
    return graph


def find_cycles(graph) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                components.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(components)


def _describe(cycle, graph) -> str:
    edges = [f"  {a} -> {b} (line {', '.join(map(str, graph[a][b]))})"
             for a in cycle for b in sorted(graph[a]) if b in cycle]
    return " <-> ".join(cycle) + "\n" + "\n".join(edges)


# ------------------------------------------------------------------ the checker itself
def _write_package(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(textwrap.dedent(text), encoding="utf-8")
    return root / "pkg"


def test_the_graph_resolves_every_import_form_and_finds_a_function_level_cycle(tmp_path):
    pkg = _write_package(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/sub/__init__.py": "from .uris import thing\n",
        "pkg/sub/uris.py": "import os\nimport pkg.errors\n",
        "pkg/sub/subset.py": "from . import uris\nfrom ..errors import E\n",
        "pkg/errors.py": "E = 1\n",
        "pkg/data.py": "from pkg import sub\nfrom pkg.sub.subset import x\n",
        "pkg/learner.py": "def f():\n    from .polish import g\n",
        "pkg/polish.py": "from pkg.learner import f\n",
    })
    graph = import_graph(pkg)
    assert {m: sorted(t) for m, t in graph.items()} == {
        "pkg": [],
        "pkg.sub": ["pkg.sub.uris"],
        "pkg.sub.uris": ["pkg.errors"],
        "pkg.sub.subset": ["pkg.errors", "pkg.sub.uris"],
        "pkg.errors": [],
        "pkg.data": ["pkg.sub", "pkg.sub.subset"],
        "pkg.learner": ["pkg.polish"],
        "pkg.polish": ["pkg.learner"],
    }
    assert graph["pkg.learner"]["pkg.polish"] == [2]
    assert find_cycles(graph) == [["pkg.learner", "pkg.polish"]]


def test_a_cycle_through_a_package_init_is_found(tmp_path):
    pkg = _write_package(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/data.py": "from . import storage\n",
        "pkg/storage/__init__.py": "from .subset import write\n",
        "pkg/storage/subset.py": "def write():\n    from ..data import Err\n",
    })
    assert find_cycles(import_graph(pkg)) == [
        ["pkg.data", "pkg.storage", "pkg.storage.subset"]]


# ------------------------------------------------------------------ the real package
def test_datamask_pipeline_has_no_import_cycles():
    graph = import_graph(Path(datamask_pipeline.__file__).parent)
    assert "datamask_pipeline.engine.data" in graph  # the walk found the package
    cycles = find_cycles(graph)
    report = "\n".join(_describe(c, graph) for c in cycles) or "none"
    print(f"import cycles found:\n{report}")
    assert not cycles, f"import cycles:\n{report}"


_IMPORT_ALL = """
import importlib, json, pkgutil, sys
pkg = importlib.import_module(sys.argv[1])
names = [pkg.__name__] + sorted(m.name for m in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + "."))
culprit = None
for name in names:
    importlib.import_module(name)
    if culprit is None and any(m.split(".")[0].startswith("dagster") for m in sys.modules):
        culprit = name
print(json.dumps({"imported": names, "first_to_load_dagster": culprit,
                  "dagster_modules": sorted(m for m in sys.modules
                                            if m.split(".")[0].startswith("dagster"))[:10]}))
"""


@pytest.mark.parametrize("package", ["datamask_pipeline.engine", "datamask_pipeline.reporting"])
def test_package_never_imports_dagster(package):
    # A fresh interpreter: this test process has Dagster loaded by other tests.
    proc = subprocess.run([sys.executable, "-c", _IMPORT_ALL, package],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert len(result["imported"]) > 1, result  # the walk found the submodules
    assert result["first_to_load_dagster"] is None, (
        f"importing {result['first_to_load_dagster']} loads Dagster "
        f"({result['dagster_modules']}); {package} must stay Dagster-free")

"""Where things live: the layers of the package, no import circle between its modules (imports
inside functions included), and the whole cost model in hetopt.cost behind the evaluate façade.

Each module belongs to the first layer in LAYERS whose prefix names it, and imports only modules of
its own layer or of the layers below. Package `__init__` modules import nothing of hetopt, so that
importing a module never imports more than what it names.
"""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx
from conftest import REPO

LAYERS = [
    (
        "infrastructure",
        [
            "hetopt",
            "hetopt.errors",
            "hetopt.outputs",
            "hetopt.progress",
            "hetopt.lifeline",
            "hetopt.executors",
        ],
    ),
    ("instances", ["hetopt.spec", "hetopt.bundled"]),
    ("plans", ["hetopt.plan", "hetopt.layout", "hetopt.placement", "hetopt.verify"]),
    ("cost model", ["hetopt.cost", "hetopt.evaluate"]),
    (
        "search, simulator, launchers",
        ["hetopt.search", "hetopt.formulations", "hetopt.sim", "hetopt.export"],
    ),
    ("baselines", ["hetopt.baselines"]),
    ("planners", ["hetopt.planners"]),
    ("re-planning", ["hetopt.replan"]),
    (
        "drivers",
        ["hetopt.simulate", "hetopt.cheapest", "hetopt.pareto", "hetopt.solve", "hetopt.bench"],
    ),
    ("calibration and reports", ["hetopt.calibrate", "hetopt.report", "hetopt.summary"]),
    ("commands", ["hetopt.commands"]),
    ("command line", ["hetopt.cli", "hetopt.__main__"]),
]
"""Lowest first. A layer may import its own modules and every layer above it in this list."""

FOLDERS = {"hetopt": "hetopt", "formulations": "hetopt.formulations", "instances": "hetopt.bundled"}
"""Where each shipped package lives in the repository (formulations/ and instances/ ship inside
hetopt, as setup.py maps them)."""


def modules() -> dict[str, Path]:
    """Every module the wheel ships, by its import name."""
    found = {}
    for folder, package in FOLDERS.items():
        for path in (REPO / folder).rglob("*.py"):
            parts = list(path.relative_to(REPO / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join([package, *parts])] = path
    return found


def imports_of(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The hetopt modules `name` imports anywhere in its body (inside functions too): for
    `from X import y`, X and, where y is a module, X.y."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*up, base] if base else up)
            targets = [base] + [f"{base}.{alias.name}" for alias in node.names]
        else:
            continue
        out |= {t for t in targets if t in known and t != name}
    return out


def graph() -> nx.DiGraph:
    known = modules()
    g = nx.DiGraph()
    for name, path in known.items():
        g.add_node(name)
        for target in imports_of(name, path, known):
            g.add_edge(name, target)
    return g


def layer_of(name: str) -> int:
    """The index in LAYERS of the most specific prefix that names the module."""
    best, rank = -1, -1
    for i, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if (name == prefix or name.startswith(prefix + ".")) and len(prefix) > best:
                best, rank = len(prefix), i
    return rank


def test_every_module_has_a_layer():
    assert not [name for name in modules() if layer_of(name) < 0]


def test_no_module_imports_a_layer_above_its_own():
    g = graph()
    upward = sorted(
        f"{a} ({LAYERS[layer_of(a)][0]}) imports {b} ({LAYERS[layer_of(b)][0]})"
        for a, b in g.edges
        if layer_of(b) > layer_of(a)
    )
    assert not upward, "\n".join(upward)


def test_no_import_circle_lazy_imports_included():
    circles = [sorted(c) for c in nx.strongly_connected_components(graph()) if len(c) > 1]
    assert not circles, circles


def test_package_inits_import_nothing_of_hetopt():
    known = modules()
    inits = {name: path for name, path in known.items() if path.name == "__init__.py"}
    assert not {
        name: sorted(imports_of(name, path, known))
        for name, path in inits.items()
        if imports_of(name, path, known)
    }


def test_the_architecture_check_sees_a_circle_hidden_in_a_function(tmp_path, monkeypatch):
    """The check itself: a lazy import that closes a circle is found."""
    (tmp_path / "hetopt").mkdir()
    (tmp_path / "hetopt" / "a.py").write_text("import hetopt.b\n")
    (tmp_path / "hetopt" / "b.py").write_text("def f():\n    from hetopt import a\n")
    monkeypatch.setattr(__import__(__name__), "REPO", tmp_path)
    monkeypatch.setattr(__import__(__name__), "FOLDERS", {"hetopt": "hetopt"})
    circles = [sorted(c) for c in nx.strongly_connected_components(graph()) if len(c) > 1]
    assert circles == [["hetopt.a", "hetopt.b"]]


def test_nothing_in_the_cost_model_imports_the_evaluate_facade():
    known = modules()
    offenders = {
        name
        for name, path in known.items()
        if name.startswith("hetopt.cost") and "hetopt.evaluate" in imports_of(name, path, known)
    }
    assert not offenders


def test_evaluate_is_a_facade_that_defines_no_cost_function():
    tree = ast.parse((REPO / "hetopt" / "evaluate.py").read_text(encoding="utf-8"))
    assert not [n.name for n in tree.body if isinstance(n, ast.FunctionDef | ast.ClassDef)]


def test_the_architecture_page_names_every_layer():
    """docs/architecture.md states these layers in its own words: each layer has its row."""
    page = (REPO / "docs" / "architecture.md").read_text(encoding="utf-8")
    rows = {line.split("|")[1].strip() for line in page.splitlines() if line.startswith("| ")}
    assert not [name for name, _ in LAYERS if name not in rows]

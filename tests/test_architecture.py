"""Where things live (issue 11): the whole cost model in hetopt/cost, evaluate.py a façade over
it."""

from __future__ import annotations

import ast

from conftest import REPO


def _imports(path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
    return found


def test_nothing_in_the_cost_model_imports_the_evaluate_facade():
    offenders = {
        p.name for p in (REPO / "hetopt" / "cost").glob("*.py") if "hetopt.evaluate" in _imports(p)
    }
    assert not offenders


def test_evaluate_is_a_facade_that_defines_no_cost_function():
    tree = ast.parse((REPO / "hetopt" / "evaluate.py").read_text(encoding="utf-8"))
    assert not [n.name for n in tree.body if isinstance(n, ast.FunctionDef | ast.ClassDef)]

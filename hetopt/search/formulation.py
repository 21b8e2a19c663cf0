"""What a formulation is, and which backends exist.

The status vocabulary, solve options and solutions live with the backends (hetopt/search/backends/);
they are re-exported here, where formulations and the search have always imported them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from hetopt.search.backends.base import (
    Attempt,
    SolveOptions,
    SolveStatus,
    SplitSolution,
    clock,
    quiet_stdout,
)
from hetopt.search.backends.registry import REGISTRY, available

__all__ = [
    "BACKENDS",
    "Attempt",
    "Formulation",
    "SolveOptions",
    "SolveStatus",
    "SplitSolution",
    "backend_available",
    "clock",
    "quiet_stdout",
]


@dataclass(frozen=True)
class Formulation:
    name: str
    summary: str
    backends: tuple[str, ...]
    solve: Callable[..., SplitSolution]
    doc: str = ""


BACKENDS = {name: (b.package, b.summary) for name, b in REGISTRY.items()}
"""name → (Python package, what it is): the registry of hetopt.search.backends, in its order."""


def backend_available(name: str) -> tuple[bool, str]:
    """(usable here, why not) for a backend of BACKENDS."""
    return available(name)

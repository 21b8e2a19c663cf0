"""What a formulation is, which backends exist, and how they are discovered.

The status vocabulary, solve options and solutions live with the backends (hetopt/search/backends/);
they are re-exported here, where formulations and the search have always imported them.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from importlib.metadata import entry_points

from hetopt.errors import InputError, Problem, did_you_mean
from hetopt.search.backends import REGISTRY, available
from hetopt.search.backends.base import (
    Attempt,
    SolveOptions,
    SolveStatus,
    SplitSolution,
    clock,
    quiet_stdout,
)

__all__ = [
    "BACKENDS",
    "Attempt",
    "Formulation",
    "SolveOptions",
    "SolveStatus",
    "SplitSolution",
    "backend_available",
    "clock",
    "formulations",
    "pick",
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


@cache
def formulations() -> dict[str, Formulation]:
    import hetopt.formulations as pkg

    found: dict[str, Formulation] = {}
    for info in pkgutil.iter_modules(pkg.__path__):
        module = importlib.import_module(f"hetopt.formulations.{info.name}")
        if hasattr(module, "FORMULATION"):
            found[module.FORMULATION.name] = module.FORMULATION
    # discovered once per process: the search asks for its formulation on every skeleton
    for ep in entry_points(group="hetopt.formulations"):
        f = ep.load()
        found[f.name] = f
    return dict(sorted(found.items()))


def pick(formulation: str | None, backend: str) -> Formulation:
    """The formulation to use for a backend; a clear error when the pair cannot work."""
    if backend not in BACKENDS:
        raise InputError(
            "--backend",
            [
                Problem(
                    "--backend",
                    f"unknown backend{did_you_mean(backend, BACKENDS)}; choose one of "
                    f"{', '.join(BACKENDS)}",
                    backend,
                    True,
                )
            ],
        )
    ok, why = backend_available(backend)
    if not ok:
        raise InputError(
            "--backend",
            [Problem("--backend", f"{backend} cannot be used here: {why}", backend, True)],
        )
    known = formulations()
    if formulation is None:
        for f in known.values():
            if backend in f.backends:
                return f
        raise InputError(
            "--backend", [Problem("--backend", f"no formulation serves {backend}", backend, True)]
        )
    if formulation not in known:
        raise InputError(
            "--formulation",
            [
                Problem(
                    "--formulation",
                    f"unknown formulation{did_you_mean(formulation, known)}; known: "
                    f"{', '.join(known)}",
                    formulation,
                    True,
                )
            ],
        )
    f = known[formulation]
    if backend not in f.backends:
        raise InputError(
            "--backend",
            [
                Problem(
                    "--backend",
                    f"formulation {f.name} is written for {', '.join(f.backends)}, not {backend}",
                    backend,
                    True,
                )
            ],
        )
    return f

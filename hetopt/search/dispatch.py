"""Which formulation solves a skeleton on which backend: the plug-ins found (`formulations`), the
pair checked (`pick`), and a skeleton run with fallbacks (`solve_skeleton`).

`solve_skeleton` is what the search calls: the requested formulation on the requested backend, and
when that backend fails (ERROR: the solver could not solve, not a time-out) the next available
backend of FALLBACK_ORDER takes the skeleton over with a formulation written for it. The failures
travel with the solution (`SplitSolution.attempts`) so that the search can say so; when every
backend fails the answer is ERROR with each solver's words.
"""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import replace
from functools import cache
from importlib.metadata import entry_points

import hetopt.formulations
from hetopt.errors import InputError, Problem, did_you_mean
from hetopt.search.backends.base import Attempt, SolveOptions, SolveStatus, SplitSolution, clock
from hetopt.search.backends.registry import FALLBACK_ORDER, available
from hetopt.search.formulation import BACKENDS, Formulation, backend_available


@cache
def formulations() -> dict[str, Formulation]:
    found: dict[str, Formulation] = {}
    for info in pkgutil.iter_modules(hetopt.formulations.__path__):
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


def solve_skeleton(
    problem, formulation: str | None, backend: str, options: SolveOptions
) -> SplitSolution:
    """Solve one skeleton's program, falling back to other backends when a backend fails.

    Parameters: problem — the skeleton's PlanProblem; formulation — the formulation asked for (None:
    the backend's default); backend — the backend asked for; options — time limit (shared by every
    attempt), seed, warm start.
    Returns: the first answer that is not ERROR, with `attempts` naming the backends that failed
    before it, or ERROR with every backend's detail when none could solve.
    """
    start = clock()
    attempts: list[Attempt] = []
    last: SplitSolution | None = None
    for name in (backend, *(b for b in FALLBACK_ORDER if b != backend)):
        if attempts and not available(name)[0]:
            continue
        left = options.time_limit_s - (clock() - start)
        if attempts and left <= 0:
            break
        form = pick(formulation if not attempts or _serves(formulation, name) else None, name)
        last = form.solve(
            problem, name, replace(options, time_limit_s=left) if attempts else options
        )
        if last.status != SolveStatus.ERROR:
            last.attempts = attempts
            return last
        attempts.append(Attempt(name, form.name, last.detail))
    detail = "; ".join(f"{a.backend} ({a.formulation}): {a.detail}" for a in attempts)
    return SplitSolution(
        SolveStatus.ERROR,
        None,
        float("inf"),
        0.0,
        clock() - start,
        backend,
        f"every backend failed: {detail}",
        extra=last.extra if last else {},
        attempts=attempts,
    )


def _serves(formulation: str | None, backend: str) -> bool:
    """Whether the formulation asked for is written for `backend` too."""
    known = formulations()
    return formulation in known and backend in known[formulation].backends

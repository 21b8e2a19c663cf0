"""Solver backends (DESIGN 4), one module each, in the style of PuLP's `apis/` and cvxpy's solver
interfaces: a backend declares its capabilities and availability, runs a model a formulation built
for it, and maps its solver's own status to `SolveStatus` (the map is in each module's docstring).

`solve_skeleton` is what the search calls: the requested formulation on the requested backend, and
when that backend fails (ERROR: the solver could not solve, not a time-out) the next available
backend of FALLBACK_ORDER takes the skeleton over with a formulation written for it. The failures
travel with the solution (`SplitSolution.attempts`) so that the search can say so; when every
backend fails the answer is ERROR with each solver's words.
"""

from __future__ import annotations

import functools
from dataclasses import replace

from hetopt.search.backends.base import (
    Attempt,
    Backend,
    Capabilities,
    RunResult,
    SolveOptions,
    SolveStatus,
    SplitSolution,
    clock,
)
from hetopt.search.backends.cbc import CbcBackend
from hetopt.search.backends.cpsat import CpSatBackend
from hetopt.search.backends.highs import HighsBackend

REGISTRY: dict[str, Backend] = {b.name: b for b in (CpSatBackend(), CbcBackend(), HighsBackend())}
"""Every backend hetopt knows, usable here or not (`available`)."""
FALLBACK_ORDER = ("highs", "cbc", "cpsat")
"""Who takes a skeleton over when its backend fails: the fastest MILP first, CP-SAT (another kind of
solver altogether, so unlikely to fail the same way) last."""

__all__ = [
    "FALLBACK_ORDER",
    "REGISTRY",
    "Attempt",
    "Backend",
    "Capabilities",
    "RunResult",
    "SolveOptions",
    "SolveStatus",
    "SplitSolution",
    "available",
    "get",
    "solve_skeleton",
]


def get(name: str) -> Backend:
    """The backend called `name` (KeyError for an unknown one: `pick` words the user's error)."""
    return REGISTRY[name]


@functools.cache
def available(name: str) -> tuple[bool, str]:
    """(usable here, why not); cached: the answer cannot change within a process."""
    return REGISTRY[name].available()


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
    from hetopt.search.formulation import pick

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
    from hetopt.search.formulation import formulations

    known = formulations()
    return formulation in known and backend in known[formulation].backends

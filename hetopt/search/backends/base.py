"""What every solver backend shares: the status vocabulary, the options of a solve, what one solve
returns, and the `Backend` interface with its capability flags.

A backend runs a model that a formulation built for it and translates the solver's own words into
`SolveStatus`. The translation is strict: OPTIMAL only when the solver says it proved optimality,
TIMEOUT only when the time limit stopped it, ERROR (with the solver's words in `detail`) when it
could not solve at all — never a guess from a solution that happens to be there.
"""

from __future__ import annotations

import contextlib
import importlib
import math
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any


class SolveStatus(str, Enum):
    """Outcome of a solve; a plan never travels without it."""

    OPTIMAL = "optimal"
    """Proven optimal (gap 0 up to the stated tolerance)."""
    FEASIBLE = "feasible"
    """A plan, without proof of optimality."""
    INFEASIBLE = "infeasible"
    """No plan exists in the plan space; the diagnosis says which constraint binds."""
    TIMEOUT = "timeout"
    """The time limit ended the search; the best plan found and its gap are reported."""
    ERROR = "error"
    """The solver failed."""


@dataclass(frozen=True)
class SolveOptions:
    time_limit_s: float = 60.0
    """Wall-clock budget of this call."""
    seed: int = 0
    """Solver random seed (reported with every result)."""
    hint: tuple[int, ...] | None = None
    """A split to start from (CP-SAT hint, MIP start)."""
    export_path: str | None = None
    """Write the model here (LP/MPS for PuLP, protobuf text for CP-SAT)."""


@dataclass(frozen=True)
class Attempt:
    """A backend that failed on a skeleton before another one took it over."""

    backend: str
    formulation: str
    detail: str
    """The solver's own words (its status, or the exception it raised)."""


@dataclass
class SplitSolution:
    """One skeleton's answer. `objective_s` is the evaluator's time of `layers` (never a model's
    approximation of it) and `bound_s` a bound no split of the skeleton beats."""

    status: SolveStatus
    layers: list[int] | None
    objective_s: float
    bound_s: float
    wall_s: float
    backend: str
    detail: str = ""
    extra: dict = field(default_factory=dict)
    attempts: list[Attempt] = field(default_factory=list)
    """Backends that failed on this skeleton before `backend` (fallbacks, in order)."""
    recompute: list[str] | None = None
    """Each stage's recompute mode, flat like `layers`, where the skeleton lets each stage pick
    (per-stage recompute); None: every stage runs the skeleton's mode."""


@dataclass(frozen=True)
class Capabilities:
    """What a backend can do; a formulation asks for what it needs."""

    model: str
    """The kind of model it runs: "pulp" (an LpProblem) or "cp-sat" (a CpModel)."""
    integer_models: bool
    """Integer variables are solved as such (not relaxed)."""
    mip_start: bool
    """A starting split is passed to the solver (MIP start, CP-SAT hint)."""
    reports_bound: bool
    """A time-limited solve reports the solver's best bound (else the bound is 0)."""


@dataclass
class RunResult:
    """What a backend read back from its solver, in the model's own objective units."""

    status: SolveStatus
    objective: float | None
    """The model's objective at the solution (None without a solution)."""
    bound: float | None
    """The solver's best bound (None when it did not give one: never guessed)."""
    detail: str
    """The solver's own status words."""
    value: Callable[[Any], float] | None = None
    """Reads a variable of the model at the solution (None without a solution)."""

    @property
    def has_solution(self) -> bool:
        return self.value is not None


class Backend:
    """A solver behind one interface (cvxpy's solver interfaces, PuLP's `apis/`): availability,
    capabilities, and `run`, which solves a model built for it and maps the solver's status."""

    name: str = ""
    package: str = ""
    """The Python package it needs (imported only when the backend is used)."""
    summary: str = ""
    capabilities: Capabilities
    pulp_solver: tuple[str, str] | None = None
    """(PuLP solver class, why it cannot run): a PuLP backend is usable when that class says it is
    available."""

    def __init_subclass__(
        cls,
        *,
        name: str = "",
        package: str = "",
        summary: str = "",
        capabilities: Capabilities | None = None,
        pulp_solver: tuple[str, str] | None = None,
        **kwargs,
    ) -> None:
        """A backend declares itself in its class statement: `class X(Backend, name=..., ...)`."""
        super().__init_subclass__(**kwargs)
        cls.name, cls.package, cls.summary, cls.pulp_solver = name, package, summary, pulp_solver
        if capabilities is not None:
            cls.capabilities = capabilities

    def available(self) -> tuple[bool, str]:
        """(usable here, why not): the package imports and the solver binary or library works."""
        try:
            importlib.import_module(self.package)
        except ImportError as exc:
            return False, f"{self.package} is not installed ({exc})"
        why_not = self.unusable()
        return (False, why_not) if why_not else (True, "available")

    def unusable(self) -> str | None:
        """Why the solver cannot run although its package imports (None: it can)."""
        if self.pulp_solver is None:
            return None
        import pulp

        solver, why = self.pulp_solver
        return None if getattr(pulp, solver)(msg=False).available() else why

    def run(self, model: Any, options: SolveOptions, start: dict | None = None) -> RunResult:
        """Solve `model` within `options.time_limit_s`.

        Parameters: model — a model of the kind `capabilities.model` names; options — time limit and
        seed; start — {variable: value} to start from (ignored without `capabilities.mip_start`).
        Returns: the mapped status, objective, best bound and a reader of variable values.
        """
        raise NotImplementedError


def clock() -> float:
    return time.perf_counter()


def finite_or_none(x: float | None) -> float | None:
    return x if x is not None and math.isfinite(x) else None


def objective_constant(model) -> float:
    """The constant term of a PuLP objective: PuLP hands solvers the objective without it."""
    import pulp

    return model.objective.constant if isinstance(model.objective, pulp.LpAffineExpression) else 0.0


@contextlib.contextmanager
def quiet_stdout():
    """Silence what native solver libraries write to file descriptor 1 (they bypass sys.stdout)."""
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 1)
            yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)

"""What a formulation is, which backends exist, and how they are discovered."""

from __future__ import annotations

import contextlib
import functools
import importlib
import os
import pkgutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from importlib.metadata import entry_points

from hetopt.errors import InputError, Problem, did_you_mean


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


@dataclass
class SplitSolution:
    status: SolveStatus
    layers: list[int] | None
    objective_s: float
    bound_s: float
    wall_s: float
    backend: str
    detail: str = ""
    extra: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Formulation:
    name: str
    summary: str
    backends: tuple[str, ...]
    solve: Callable[..., SplitSolution]
    doc: str = ""


BACKENDS = {
    "cpsat": ("ortools", "OR-Tools CP-SAT (integer model; seconds scaled to integer units)"),
    "cbc": ("pulp", "COIN-OR CBC through PuLP (the binary ships inside the pulp wheel)"),
    "highs": ("highspy", "HiGHS through PuLP"),
}


@functools.cache
def backend_available(name: str) -> tuple[bool, str]:
    module = BACKENDS[name][0]
    try:
        importlib.import_module(module)
    except ImportError as exc:
        return False, f"{module} is not installed ({exc})"
    if name == "cbc":
        import pulp

        if not pulp.PULP_CBC_CMD(msg=False).available():
            return False, "PuLP's bundled CBC binary is not available on this platform"
    if name == "highs":
        import pulp

        if not pulp.HiGHS(msg=False).available():
            return False, "PuLP cannot use highspy"
    return True, "available"


@functools.cache
def formulations() -> dict[str, Formulation]:
    import formulations as pkg

    found: dict[str, Formulation] = {}
    for info in pkgutil.iter_modules(pkg.__path__):
        module = importlib.import_module(f"formulations.{info.name}")
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
        raise InputError("--backend", [Problem("--backend", f"unknown backend{did_you_mean(backend, BACKENDS)}; "
                                                            f"choose one of {', '.join(BACKENDS)}", backend, True)])
    ok, why = backend_available(backend)
    if not ok:
        raise InputError("--backend", [Problem("--backend", f"{backend} cannot be used here: {why}", backend, True)])
    known = formulations()
    if formulation is None:
        for f in known.values():
            if backend in f.backends:
                return f
        raise InputError("--backend", [Problem("--backend", f"no formulation serves {backend}", backend, True)])
    if formulation not in known:
        raise InputError("--formulation", [Problem("--formulation", f"unknown formulation"
                                                                    f"{did_you_mean(formulation, known)}; known: "
                                                                    f"{', '.join(known)}", formulation, True)])
    f = known[formulation]
    if backend not in f.backends:
        raise InputError("--backend", [Problem("--backend", f"formulation {f.name} is written for "
                                                            f"{', '.join(f.backends)}, not {backend}", backend, True)])
    return f


def clock() -> float:
    return time.perf_counter()


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

"""OR-Tools CP-SAT: integer models, solved with one worker (the search runs skeletons side by side).

Status map (CpSolverStatus → SolveStatus); the only limit set is the time limit, so a search that
stopped without a proof stopped on it:
  OPTIMAL        → OPTIMAL (of the integer model; the formulation says what it proves in seconds)
  FEASIBLE       → TIMEOUT with the incumbent and CP-SAT's best bound
  INFEASIBLE     → INFEASIBLE
  UNKNOWN        → TIMEOUT without a solution when the time limit was reached, else ERROR
  MODEL_INVALID  → ERROR with CP-SAT's validation message
Objective and bound are the integer model's (`ObjectiveValue`, `BestObjectiveBound`).
"""

from __future__ import annotations

import math
from typing import Any

from hetopt.search.backends.base import Backend, Capabilities, RunResult, SolveOptions, SolveStatus

WORKERS = 1
"""One search worker: parallelism comes from solving several skeletons at once (orchestrate.py)."""


class CpSatBackend(
    Backend,
    name="cpsat",
    package="ortools",
    summary="OR-Tools CP-SAT (integer model; seconds scaled to integer units)",
    capabilities=Capabilities(
        model="cp-sat", integer_models=True, mip_start=True, reports_bound=True
    ),
):
    def run(self, model: Any, options: SolveOptions, start: dict | None = None) -> RunResult:
        from ortools.sat.python import cp_model

        for var, value in (start or {}).items():
            model.AddHint(var, value)
        solver = cp_model.CpSolver()
        limit = max(0.0, options.time_limit_s)
        solver.parameters.max_time_in_seconds = limit
        solver.parameters.num_workers = WORKERS
        solver.parameters.random_seed = options.seed
        try:
            code = solver.Solve(model)
        except Exception as exc:  # any solver failure is an ERROR with its words
            return RunResult(
                SolveStatus.ERROR, None, None, f"CP-SAT raised {type(exc).__name__}: {exc}"
            )
        words = f"CP-SAT: {solver.StatusName(code)}"
        if code in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            status = SolveStatus.OPTIMAL if code == cp_model.OPTIMAL else SolveStatus.TIMEOUT
            return RunResult(
                status, solver.ObjectiveValue(), solver.BestObjectiveBound(), words, solver.Value
            )
        if code == cp_model.INFEASIBLE:
            return RunResult(SolveStatus.INFEASIBLE, None, None, words)
        if code == cp_model.MODEL_INVALID:
            return RunResult(SolveStatus.ERROR, None, None, f"{words}: {model.Validate()}")
        if solver.WallTime() >= 0.9 * limit:
            return RunResult(SolveStatus.TIMEOUT, None, _bound(solver), f"{words} (time limit)")
        return RunResult(SolveStatus.ERROR, None, None, f"{words}: {solver.SolutionInfo()}")


def _bound(solver) -> float | None:
    """CP-SAT's bound without a solution: its best bound when it has one."""
    bound = solver.BestObjectiveBound()
    return bound if math.isfinite(bound) else None

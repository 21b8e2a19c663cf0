"""HiGHS through PuLP's model and highspy's own status words.

PuLP's HiGHS interface reports "Optimal" for a solve that its time limit stopped (only `sol_status`
says otherwise) and has no entry for some model statuses of newer HiGHS releases. This backend lets
PuLP build the highspy model and reads the answer from highspy itself: the model status, whether a
primal solution exists, the objective and the MIP dual bound (`getInfo().mip_dual_bound`). PuLP
hands HiGHS the objective without its constant term, so the constant is added back to both numbers.

No MIP start: HiGHS 1.16 given a partial solution (`setSolution` with the layer counts only)
answered "Optimal" on a worst-case skeleton of wan-flapping-a100-v100 with an objective and a dual
bound 32% below the value of the very solution it returned. For the same reason HiGHS's objective is
checked against its own solution: when they disagree, neither the objective nor the bound is trusted
(OPTIMAL becomes FEASIBLE, no bound).

Status map (HighsModelStatus → SolveStatus):
  kOptimal                                   → OPTIMAL (HiGHS proved the gap within mip_rel_gap)
  kInfeasible, kUnboundedOrInfeasible        → INFEASIBLE (a planner's model is bounded below)
  kTimeLimit                                 → TIMEOUT, with the incumbent when there is one
  kIterationLimit, kSolutionLimit, kInterrupt, kHighsInterrupt, kObjectiveBound, kObjectiveTarget
                                             → FEASIBLE with a solution, else ERROR
  anything else (kNotset, kLoadError, kModelError, kPresolveError, kSolveError, kPostsolveError,
  kModelEmpty, kUnbounded, kMemoryLimit, kUnknown)  → ERROR, with HiGHS's words
"""

from __future__ import annotations

from typing import Any

from hetopt.search.backends.base import (
    Backend,
    Capabilities,
    RunResult,
    SolveOptions,
    SolveStatus,
    finite_or_none,
    objective_constant,
    quiet_stdout,
)

GAP = 1e-9
"""Relative MIP gap: solvers default to 1e-4, which would leave milliseconds on the table."""

_PRIMAL_FEASIBLE = 2
"""highspy's SolutionStatus.kSolutionStatusFeasible."""
_STOPPED_WITH_SOLUTION = (
    "kIterationLimit",
    "kSolutionLimit",
    "kInterrupt",
    "kHighsInterrupt",
    "kObjectiveBound",
    "kObjectiveTarget",
)


class HighsBackend(
    Backend,
    name="highs",
    package="highspy",
    summary="HiGHS through PuLP",
    capabilities=Capabilities(
        model="pulp", integer_models=True, mip_start=False, reports_bound=True
    ),
    pulp_solver=("HiGHS", "PuLP cannot use highspy"),
):
    def run(self, model: Any, options: SolveOptions, start: dict | None = None) -> RunResult:
        import pulp

        del start  # no MIP start (module docstring)
        solver = _solver_class()(
            msg=False,
            timeLimit=max(0.0, options.time_limit_s),
            gapRel=GAP,
            random_seed=options.seed,
        )
        try:
            with quiet_stdout():
                model.solve(solver)
        except Exception as exc:  # any solver failure is an ERROR with its words
            return RunResult(
                SolveStatus.ERROR, None, None, f"HiGHS raised {type(exc).__name__}: {exc}"
            )
        h = model.solverModel
        status = h.getModelStatus()
        words = f"HiGHS model status: {h.modelStatusToString(status)}"
        info = h.getInfo()
        has_solution = int(info.primal_solution_status) == _PRIMAL_FEASIBLE
        constant = objective_constant(model)
        objective = info.objective_function_value + constant if has_solution else None
        bound = finite_or_none(info.mip_dual_bound)
        bound = bound + constant if bound is not None else None
        reader = (lambda var: var.varValue) if has_solution else None
        if has_solution and not _agrees(objective, pulp.value(model.objective)):
            recomputed = pulp.value(model.objective)
            words += f"; its objective {objective!r} is not its solution's {recomputed!r}"
            return RunResult(SolveStatus.FEASIBLE, recomputed, None, words, reader)
        name = status.name
        if name == "kOptimal" and has_solution:
            return RunResult(SolveStatus.OPTIMAL, objective, bound, words, reader)
        if name in ("kInfeasible", "kUnboundedOrInfeasible"):
            return RunResult(SolveStatus.INFEASIBLE, None, None, words)
        if name == "kTimeLimit":
            return RunResult(SolveStatus.TIMEOUT, objective, bound, words, reader)
        if name in _STOPPED_WITH_SOLUTION and has_solution:
            return RunResult(SolveStatus.FEASIBLE, objective, bound, words, reader)
        return RunResult(SolveStatus.ERROR, None, None, words)


def _agrees(reported: float, recomputed: float) -> bool:
    """HiGHS's objective and PuLP's value of it at HiGHS's solution agree (to its tolerances)."""
    return abs(reported - recomputed) <= 1e-6 * max(1.0, abs(recomputed))


_SOLVER: type | None = None


def _solver_class() -> type:
    """PuLP's HiGHS without PuLP's status table (this module reads highspy's)."""
    global _SOLVER
    if _SOLVER is None:
        import pulp

        class _HiGHS(pulp.HiGHS):
            def findSolutionValues(self, lp) -> tuple[int, int]:
                h = lp.solverModel
                if int(h.getInfo().primal_solution_status) == _PRIMAL_FEASIBLE:
                    values = list(h.getSolution().col_value)
                    for var in lp.variables():
                        var.varValue = values[var.index]
                    # PuLP's own pair, for readers of model.status; run() reads highspy instead
                    proven = h.getModelStatus().name == "kOptimal"
                    return pulp.LpStatusOptimal, (
                        pulp.LpSolutionOptimal if proven else pulp.LpSolutionIntegerFeasible
                    )
                for var in lp.variables():
                    var.varValue = None
                return pulp.LpStatusNotSolved, pulp.LpSolutionNoSolutionFound

        _SOLVER = _HiGHS
    return _SOLVER

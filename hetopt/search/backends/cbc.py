"""COIN-OR CBC through PuLP (the binary ships inside the pulp wheel).

PuLP reads CBC's solution file: `model.status` is "Optimal" for a solve its time limit stopped as
well, and only `model.sol_status` tells a proof (LpSolutionOptimal) from an incumbent
(LpSolutionIntegerFeasible). The solution file carries eight significant digits; CBC's log has the
objective to eight decimals and, for a stopped search, its best bound ("Lower bound:", three
decimals). This backend keeps the log and reads both from it; neither includes the objective's
constant term, which is added back (and checked against PuLP's value of the objective, so a log that
does not match is not trusted).

Status map (PuLP status, sol_status, CBC's "Result -" line → SolveStatus):
  Optimal, LpSolutionOptimal                      → OPTIMAL (gap within GAP)
  Infeasible                                      → INFEASIBLE
  a solution, "Stopped on time" (or killed late)  → TIMEOUT with the incumbent and the log's bound
  no solution, "Stopped on time" (or killed late) → TIMEOUT, bound from the log if it has one
  a solution, stopped otherwise                   → FEASIBLE
  anything else (Unbounded, Undefined, Not Solved, an exception)  → ERROR, with CBC's words
"""

from __future__ import annotations

import os
import re
import tempfile
from typing import Any

from hetopt.lifeline import children_die_with_me
from hetopt.search.backends.base import (
    Backend,
    Capabilities,
    RunResult,
    SolveOptions,
    SolveStatus,
    objective_constant,
    quiet_stdout,
)
from hetopt.search.watchdog import deadline_for_children

GAP = 1e-9
"""Relative MIP gap (CBC's ratioGap): the default 1e-4 would leave milliseconds on the table."""
LOG_BOUND_DIGITS = 3
"""CBC prints its lower bound with three decimals: half of the last digit is taken off (valid)."""


class CbcBackend(
    Backend,
    name="cbc",
    package="pulp",
    summary="COIN-OR CBC through PuLP (the binary ships inside the pulp wheel)",
    capabilities=Capabilities(
        model="pulp", integer_models=True, mip_start=True, reports_bound=True
    ),
    pulp_solver=("PULP_CBC_CMD", "PuLP's bundled CBC binary is not available on this platform"),
):
    def run(self, model: Any, options: SolveOptions, start: dict | None = None) -> RunResult:
        import pulp
        from pulp.apis import coin_api

        limit = max(0.0, options.time_limit_s)
        for var, value in (start or {}).items():
            var.setInitialValue(value)
        fd, log_path = tempfile.mkstemp(prefix="hetopt-cbc-", suffix=".log")
        os.close(fd)
        solver = pulp.PULP_CBC_CMD(
            msg=False,
            timeLimit=limit,
            warmStart=bool(start),
            gapRel=GAP,
            logPath=log_path,
            options=[f"randomSeed {options.seed}"],
        )
        # CBC may overrun its own limit (presolve): it is stopped from outside a little after it.
        grace_s = max(1.0, 0.1 * limit)
        try:
            try:
                # CBC dies with this process (lifeline), and is stopped at once when the solve is
                # left by an interrupt
                with (
                    quiet_stdout(),
                    children_die_with_me(coin_api),
                    deadline_for_children(limit + grace_s) as watchdog,
                ):
                    model.solve(solver)
            except Exception as exc:  # any failure is reported with its words
                if watchdog["killed"]:
                    return RunResult(
                        SolveStatus.TIMEOUT,
                        None,
                        None,
                        "CBC stopped from outside after its time limit",
                    )
                return RunResult(
                    SolveStatus.ERROR, None, None, f"CBC failed: {type(exc).__name__}: {exc}"
                )
            with open(log_path, encoding="utf-8", errors="replace") as f:
                log = f.read()
        finally:
            os.unlink(log_path)
        return _result(model, log)


def _result(model, log: str) -> RunResult:
    import pulp

    result_line = next((ln.strip() for ln in log.splitlines() if ln.startswith("Result - ")), "")
    words = f"CBC: {pulp.LpStatus[model.status]}, {pulp.LpSolution[model.sol_status]}" + (
        f" ({result_line})" if result_line else ""
    )
    has_solution = model.sol_status in (pulp.LpSolutionOptimal, pulp.LpSolutionIntegerFeasible)
    stopped_on_time = "Stopped on time" in result_line
    if model.status == pulp.LpStatusInfeasible:
        return RunResult(SolveStatus.INFEASIBLE, None, None, words)
    objective, bound = _log_numbers(model, log, has_solution)
    reader = (lambda var: var.varValue) if has_solution else None
    if model.status == pulp.LpStatusOptimal and model.sol_status == pulp.LpSolutionOptimal:
        # CBC stops when the gap is within GAP: that much below the objective is proven
        proven = objective - GAP * abs(objective) if objective is not None else None
        return RunResult(SolveStatus.OPTIMAL, objective, proven, words, reader)
    if stopped_on_time:
        return RunResult(SolveStatus.TIMEOUT, objective, bound, words, reader)
    if has_solution:
        return RunResult(SolveStatus.FEASIBLE, objective, bound, words, reader)
    return RunResult(SolveStatus.ERROR, None, None, words)


_NUMBER = r"(-?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)"


def _log_numbers(model, log: str, has_solution: bool) -> tuple[float | None, float | None]:
    """(objective, bound) in the model's units from CBC's log, its constant term added back.

    The log's objective must agree with PuLP's value of the objective (from the eight-digit solution
    file) once the constant is added; if it does not, the log is not trusted: the objective is
    PuLP's and
    no bound is claimed."""
    import pulp

    constant = objective_constant(model)
    logged = re.search(r"^Objective value:\s*" + _NUMBER, log, re.M)
    lower = re.search(r"^Lower bound:\s*" + _NUMBER, log, re.M)
    pulp_value = float(pulp.value(model.objective)) if has_solution else None
    offset: float | None = constant
    if has_solution and logged is not None:
        log_value = float(logged.group(1))
        close = 1e-6 * max(1.0, abs(pulp_value))
        if abs(log_value + constant - pulp_value) <= close:
            offset = constant
        elif abs(log_value - pulp_value) <= close:
            offset = 0.0  # this CBC counted the constant itself
        else:
            offset = None
    objective = pulp_value
    if has_solution and logged is not None and offset is not None:
        objective = float(logged.group(1)) + offset
    bound = None
    if lower is not None and offset is not None:
        bound = float(lower.group(1)) - 0.5 * 10.0**-LOG_BOUND_DIGITS + offset
    return objective, bound

"""split-cpsat: the layer split of one skeleton for OR-Tools CP-SAT (integers only).

The mathematics is split-milp's, (C1)–(C7), with every time in integer units of 1/SCALE seconds (0.1 µs):
each affine coefficient is rounded to the nearest unit, and the fractional overlap factors s_i and o_i are
applied with the constraint multiplied by Q = 1000 and the factor rounded to 1/Q. The rounding changes an
iteration time by far less than TOLERANCE_S = 1 ms, the stated tolerance within which CP-SAT's optimum
equals the MILP's (the plan it returns is re-timed exactly by the evaluator).

  (C1) Σ L_i = N                        (C2) y ≥ h + s·d, y ≥ d + s·h per pass
  (C3) τ̂ ≥ y^f_i + y^b_i + c_i          (C4) T_sync ≥ (m − 1)·τ̂ + Σ_i τ_i
  (C5) T_dp ≥ T_sync, T_dp ≥ T_sync − Σ_{k<i}(y^b_k + e_k) − e_i − o_i·y^b_i + D_i(L_i)
  (C6) T_opt ≥ O_i(L_i)                 (C7) M_i(L_i) ≤ M̄_i (as an upper bound on L_i)
Objective: min T_dp + T_opt.
"""

from __future__ import annotations

from ortools.sat.python import cp_model

from hetopt.search.formulation import Formulation, SolveOptions, SolveStatus, SplitSolution, clock
from hetopt.search.linear import SplitProblem

SCALE = 10_000_000
"""Integer units per second."""
Q = 1000
"""Denominator of the rounded overlap factors."""
TOLERANCE_S = 1e-3


def _u(seconds: float) -> int:
    return round(seconds * SCALE)


def solve(pr: SplitProblem, backend: str, options: SolveOptions) -> SplitSolution:
    start = clock()
    p = pr.depth
    model = cp_model.CpModel()
    max_layers = pr.max_layers()
    L = [model.NewIntVar(1, max(1, max_layers[i]), f"L_{i}") for i in range(p)]
    worst = (pr.micro_batches + 1) * sum(
        abs(a.at(pr.layers)) + abs(b.at(pr.layers)) + abs(c.at(pr.layers)) + abs(d.at(pr.layers)) + cc
        for a, b, c, d, cc in zip(pr.host_fwd, pr.dev_fwd, pr.host_bwd, pr.dev_bwd, pr.p2p, strict=True))
    worst += sum(abs(x.at(pr.layers)) for x in (*pr.dp, *pr.opt))
    ub = _u(worst) + 1
    yf = [model.NewIntVar(0, ub, f"yf_{i}") for i in range(p)]
    yb = [model.NewIntVar(0, ub, f"yb_{i}") for i in range(p)]
    tau_max, t_sync, t_dp, t_opt = (model.NewIntVar(0, ub, n) for n in ("tau_max", "T_sync", "T_dp", "T_opt"))

    model.Add(sum(L) == pr.layers)  # (C1)
    for i in range(p):  # (C2)
        s = pr.serial[i]
        for y, h, d in ((yf[i], pr.host_fwd[i], pr.dev_fwd[i]), (yb[i], pr.host_bwd[i], pr.dev_bwd[i])):
            model.Add(y >= _u(h.slope + s * d.slope) * L[i] + _u(h.intercept + s * d.intercept))
            model.Add(y >= _u(d.slope + s * h.slope) * L[i] + _u(d.intercept + s * h.intercept))
    tau = [yf[i] + yb[i] + _u(pr.p2p[i]) for i in range(p)]
    for i in range(p):  # (C3)
        model.Add(tau_max >= tau[i])
    model.Add(t_sync >= (pr.micro_batches - 1) * tau_max + sum(tau))  # (C4)
    model.Add(t_dp >= t_sync)  # (C5)
    chain = 0
    for i in range(p):
        send = _u(0.5 * pr.p2p[i]) if i > 0 else 0
        o = round(pr.dp_overlap[i] * Q)
        model.Add(Q * t_dp >= Q * t_sync - Q * chain - Q * send - o * yb[i]
                  + Q * (_u(pr.dp[i].slope) * L[i] + _u(pr.dp[i].intercept)))
        chain = chain + yb[i] + send
    for i in range(p):  # (C6)
        model.Add(t_opt >= _u(pr.opt[i].slope) * L[i] + _u(pr.opt[i].intercept))
    model.Minimize(t_dp + t_opt)
    # Branch on the few layer counts first: once they are fixed every time variable follows by propagation.
    model.AddDecisionStrategy(L, cp_model.CHOOSE_MIN_DOMAIN_SIZE, cp_model.SELECT_MIN_VALUE)
    if options.hint is not None:
        for var, value in zip(L, options.hint, strict=True):
            model.AddHint(var, value)
    if options.export_path:
        model.ExportToFile(options.export_path)
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = max(0.1, options.time_limit_s)
    solver.parameters.num_workers = 1
    solver.parameters.search_branching = cp_model.FIXED_SEARCH
    solver.parameters.random_seed = options.seed
    code = solver.Solve(model)
    wall = clock() - start
    if code == cp_model.INFEASIBLE:
        return SplitSolution(SolveStatus.INFEASIBLE, None, float("inf"), float("inf"), wall, backend)
    if code not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return SplitSolution(SolveStatus.ERROR if code == cp_model.MODEL_INVALID else SolveStatus.TIMEOUT, None,
                             float("inf"), solver.BestObjectiveBound() / SCALE, wall, backend,
                             solver.StatusName(code))
    layers = [solver.Value(v) for v in L]
    status = SolveStatus.OPTIMAL if code == cp_model.OPTIMAL else SolveStatus.TIMEOUT
    return SplitSolution(status, layers, solver.ObjectiveValue() / SCALE, solver.BestObjectiveBound() / SCALE, wall,
                         backend, extra={"scale_units_per_s": SCALE, "tolerance_s": TOLERANCE_S})


FORMULATION = Formulation("split-cpsat", "layer split of a skeleton for CP-SAT (scaled integers)", ("cpsat",),
                          solve, __doc__ or "")

"""split-cpsat: the layer split of one skeleton for OR-Tools CP-SAT, written the constraint-programming way.

The mathematics is split-milp's, (C1)–(C7); only the encoding differs. A stage's layer count L_i has a
small domain (1 … the most its memory holds), so every quantity that depends on it alone is tabulated over
that domain and linked with an element constraint — exactly, with no epigraph: the pass times
y^f_i(L) = max(h, d) + s·min(h, d) and y^b_i(L), the gradient all-reduce D_i(L), the overlapped part
o_i·y^b_i(L), the optimizer step O_i(L). Times are integers in units of 1/SCALE s (1 µs); each table entry
is rounded once, so an iteration time moves by at most a few µs — far inside TOLERANCE_S = 1 ms, the stated
tolerance within which CP-SAT's optimum equals the MILP's (the plan it returns is re-timed exactly by the
evaluator).

  (C1) Σ L_i = N                        (C2) y^f_i = table_f(L_i), y^b_i = table_b(L_i)   (element)
  (C3) τ̂ = max_i (y^f_i + y^b_i + c_i)   (C4) T_sync = (m − 1)·τ̂ + Σ_i τ_i
  (C5) T_dp = max(T_sync, max_i [T_sync − Σ_{k<i}(y^b_k + e_k) − e_i − o_i·y^b_i + D_i(L_i)])
  (C6) T_opt = max_i O_i(L_i)           (C7) M_i(L_i) ≤ M̄_i (the domain of L_i)
Objective: min T_dp + T_opt. Search branches on the layer counts first. Robust objectives copy
(C3)–(C5) per scenario and combine the scenario times as split-milp's (R), probabilities rounded to 1/P.
"""

from __future__ import annotations

from ortools.sat.python import cp_model

from hetopt.evaluate import overlap_host_device
from hetopt.search.formulation import Formulation, SolveOptions, SolveStatus, SplitSolution, clock
from hetopt.search.linear import PlanProblem

SCALE = 1_000_000
"""Integer units per second (1 µs)."""
TOLERANCE_S = 1e-3


def _u(seconds: float) -> int:
    return round(seconds * SCALE)


def solve(problem: PlanProblem, backend: str, options: SolveOptions) -> SplitSolution:
    start = clock()
    pr = problem.base
    p = pr.depth
    model = cp_model.CpModel()
    max_layers = [max(1, min(m, pr.layers - (p - 1))) for m in pr.max_layers()]
    L = [model.NewIntVar(1, max_layers[i], f"L_{i}") for i in range(p)]
    model.Add(sum(L) == pr.layers)  # (C1)

    index = []
    for i in range(p):
        k = model.NewIntVar(0, max_layers[i] - 1, f"k_{i}")
        model.Add(k == L[i] - 1)
        index.append(k)
    top: dict[str, int] = {}

    def table(name: str, i: int, values: list[int]) -> cp_model.IntVar:
        var = model.NewIntVar(min(values), max(values), name)
        model.AddElement(index[i], values, var)
        top[name] = max(values)
        return var

    yf, yb, ob, opt = [], [], [], []
    for i in range(p):  # (C2) and the per-stage tables of (C5), (C6)
        layers = range(1, max_layers[i] + 1)
        s = pr.serial[i]
        f_vals = [_u(overlap_host_device(pr.host_fwd[i].at(n), pr.dev_fwd[i].at(n), s)) for n in layers]
        b_secs = [overlap_host_device(pr.host_bwd[i].at(n), pr.dev_bwd[i].at(n), s) for n in layers]
        yf.append(table(f"yf_{i}", i, f_vals))
        yb.append(table(f"yb_{i}", i, [_u(x) for x in b_secs]))
        ob.append(table(f"ob_{i}", i, [_u(pr.dp_overlap[i] * x) for x in b_secs]))
        opt.append(table(f"opt_{i}", i, [_u(pr.opt[i].at(n)) for n in layers]))
    t_opt = model.NewIntVar(0, max(top[f"opt_{i}"] for i in range(p)), "T_opt")
    model.AddMaxEquality(t_opt, opt)  # (C6)
    totals = []
    for sc_index, sc in enumerate(problem.scenarios):  # one copy of the communication terms per scenario
        tag = f"_s{sc_index}"
        dp = [table(f"dp_{i}{tag}", i, [_u(sc.dp[i].at(n)) for n in range(1, max_layers[i] + 1)]) for i in range(p)]
        tau = [yf[i] + yb[i] + _u(sc.p2p[i]) for i in range(p)]
        hi = sum(top[f"yf_{i}"] + top[f"yb_{i}"] for i in range(p)) + sum(_u(c) for c in sc.p2p)
        tau_vars = []
        for i in range(p):
            t = model.NewIntVar(0, hi, f"tau_{i}{tag}")
            model.Add(t == tau[i])
            tau_vars.append(t)
        tau_max = model.NewIntVar(0, hi, f"tau_max{tag}")
        model.AddMaxEquality(tau_max, tau_vars)  # (C3)
        ub = pr.micro_batches * hi + sum(top[f"dp_{i}{tag}"] + top[f"opt_{i}"] for i in range(p)) + 1
        t_sync = model.NewIntVar(0, ub, f"T_sync{tag}")
        model.Add(t_sync == (pr.micro_batches - 1) * tau_max + sum(tau_vars))  # (C4)
        ends, chain = [t_sync], 0
        for i in range(p):  # (C5)
            send = _u(0.5 * sc.p2p[i]) if i > 0 else 0
            end = model.NewIntVar(-ub, ub, f"dp_end_{i}{tag}")
            model.Add(end == t_sync - chain - send - ob[i] + dp[i])
            ends.append(end)
            chain = chain + yb[i] + send
        t_dp = model.NewIntVar(0, ub, f"T_dp{tag}")
        model.AddMaxEquality(t_dp, ends)
        total = model.NewIntVar(0, 2 * ub, f"T{tag}")
        top[f"T{tag}"] = 2 * ub
        model.Add(total == t_dp + t_opt)
        totals.append(total)
    divisor = _objective(model, problem, totals, max(top[f"T_s{k}"] for k in range(len(totals))))
    model.AddDecisionStrategy(L, cp_model.CHOOSE_MIN_DOMAIN_SIZE, cp_model.SELECT_MIN_VALUE)
    if options.hint is not None and sum(options.hint) == pr.layers:
        for var, value, top_layers in zip(L, options.hint, max_layers, strict=True):
            model.AddHint(var, min(value, top_layers))
    if options.export_path:
        model.ExportToFile(options.export_path)
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = max(0.1, options.time_limit_s)
    solver.parameters.num_workers = 1
    solver.parameters.random_seed = options.seed
    code = solver.Solve(model)
    wall = clock() - start
    if code == cp_model.INFEASIBLE:
        return SplitSolution(SolveStatus.INFEASIBLE, None, float("inf"), float("inf"), wall, backend)
    if code not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return SplitSolution(SolveStatus.ERROR if code == cp_model.MODEL_INVALID else SolveStatus.TIMEOUT, None,
                             float("inf"), solver.BestObjectiveBound() / SCALE / divisor, wall, backend,
                             solver.StatusName(code))
    layers = [solver.Value(v) for v in L]
    status = SolveStatus.OPTIMAL if code == cp_model.OPTIMAL else SolveStatus.TIMEOUT
    return SplitSolution(status, layers, solver.ObjectiveValue() / SCALE / divisor,
                         solver.BestObjectiveBound() / SCALE / divisor, wall, backend,
                         extra={"scale_units_per_s": SCALE, "tolerance_s": TOLERANCE_S})


P = 10_000
"""Probabilities are rounded to 1/P in the integer objective."""


def _objective(model: cp_model.CpModel, problem: PlanProblem, totals: list, hi: int) -> int:
    """(R): set the objective; returns the factor it is scaled by (seconds = value / SCALE / factor)."""
    probs = [round(p * P) for p in problem.probabilities]
    if problem.objective == "stable":
        model.Minimize(totals[0])
        return 1
    if problem.objective == "expected":
        model.Minimize(sum(w * t for w, t in zip(probs, totals, strict=True)))
        return sum(probs)
    if problem.objective == "worst":
        z = model.NewIntVar(0, hi, "worst")
        model.AddMaxEquality(z, totals)
        model.Minimize(z)
        return 1
    eta = model.NewIntVar(0, hi, "eta")
    u = [model.NewIntVar(0, hi, f"u_{s}") for s in range(len(totals))]
    for us, t in zip(u, totals, strict=True):
        model.Add(us >= t - eta)
    scale = round(P * (1 - problem.alpha))
    model.Minimize(scale * eta + sum(w * us for w, us in zip(probs, u, strict=True)))
    return scale


FORMULATION = Formulation("split-cpsat", "layer split of a skeleton for CP-SAT (element tables, integer µs)",
                          ("cpsat",), solve, __doc__ or "")

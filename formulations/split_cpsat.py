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
Objective: min T_dp + T_opt. Several templates: (C1)–(C7) per template, T_sync = max_j T_pipe_j, T_dp the
max over every template's stages, plus their split-independent gradient exchange X (split-milp's docstring).
Search branches on the layer counts first. Robust objectives copy
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
    model = cp_model.CpModel()
    top: dict[str, int] = {}
    flat: list[cp_model.IntVar] = []
    flat_max: list[int] = []
    templates = []
    for j, pr in enumerate(problem.base.templates):
        vars_j = _template(model, pr, f"_t{j}", top)
        templates.append(vars_j)
        flat += vars_j["L"]
        flat_max += vars_j["max_layers"]
    opt = [v for t in templates for v in t["opt"]]
    top["T_opt"] = max(top[v.Name()] for v in opt)
    t_opt = model.NewIntVar(0, top["T_opt"], "T_opt")
    model.AddMaxEquality(t_opt, opt)  # (C6)
    totals = []
    for sc_index, sc in enumerate(problem.scenarios):  # one copy of the communication terms per scenario
        tag = f"_s{sc_index}"
        ub = 1 + sum(pr.micro_batches * (sum(top[v.Name()] for v in t["yf"] + t["yb"]) + sum(_u(c) for c in pr.p2p))
                     + sum(_u(max(pr.dp[i].at(n) for n in (1, pr.layers))) for i in range(pr.depth))
                     for pr, t in zip(sc.templates, templates, strict=True)) + top["T_opt"]
        pipes, ends = [], []
        for j, (pr, t) in enumerate(zip(sc.templates, templates, strict=True)):
            pipe, dp_terms = _pipeline(model, pr, t, f"_t{j}{tag}", ub)
            pipes.append(pipe)
            ends += dp_terms
        t_sync = model.NewIntVar(0, ub, f"T_sync{tag}")
        model.AddMaxEquality(t_sync, pipes)  # (C4): the slowest template
        end_vars = [t_sync]
        for k, term in enumerate(ends):  # (C5): every stage of every template, from the shared T_sync
            end = model.NewIntVar(-ub, ub, f"dp_end_{k}{tag}")
            model.Add(end == t_sync + term)
            end_vars.append(end)
        t_dp = model.NewIntVar(0, ub, f"T_dp{tag}")
        model.AddMaxEquality(t_dp, end_vars)
        total = model.NewIntVar(0, 2 * ub, f"T{tag}")
        top[f"T{tag}"] = 2 * ub
        model.Add(total == t_dp + _u(sc.cross_s) + t_opt)
        totals.append(total)
    divisor = _objective(model, problem, totals, max(top[f"T_s{k}"] for k in range(len(totals))))
    model.AddDecisionStrategy(flat, cp_model.CHOOSE_MIN_DOMAIN_SIZE, cp_model.SELECT_MIN_VALUE)
    if options.hint is not None and len(options.hint) == len(flat):
        for var, value, top_layers in zip(flat, options.hint, flat_max, strict=True):
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
    layers = [solver.Value(v) for v in flat]
    status = SolveStatus.OPTIMAL if code == cp_model.OPTIMAL else SolveStatus.TIMEOUT
    return SplitSolution(status, layers, solver.ObjectiveValue() / SCALE / divisor,
                         solver.BestObjectiveBound() / SCALE / divisor, wall, backend,
                         extra={"scale_units_per_s": SCALE, "tolerance_s": TOLERANCE_S})


def _template(model: cp_model.CpModel, pr, tag: str, top: dict[str, int]) -> dict:
    """(C1), (C2), (C7) and the per-stage tables of (C5), (C6) for one template."""
    p = pr.depth
    max_layers = [max(1, min(m, pr.layers - (p - 1))) for m in pr.max_layers()]
    L = [model.NewIntVar(1, max_layers[i], f"L{tag}_{i}") for i in range(p)]
    model.Add(sum(L) == pr.layers)  # (C1)
    index = []
    for i in range(p):
        k = model.NewIntVar(0, max_layers[i] - 1, f"k{tag}_{i}")
        model.Add(k == L[i] - 1)
        index.append(k)

    def table(name: str, i: int, values: list[int]) -> cp_model.IntVar:
        var = model.NewIntVar(min(values), max(values), name)
        model.AddElement(index[i], values, var)
        top[name] = max(values)
        return var

    out = {"L": L, "max_layers": max_layers, "index": index, "yf": [], "yb": [], "ob": [], "opt": [], "table": table}
    for i in range(p):
        layers = range(1, max_layers[i] + 1)
        s = pr.serial[i]
        f_vals = [_u(overlap_host_device(pr.host_fwd[i].at(n), pr.dev_fwd[i].at(n), s)) for n in layers]
        b_secs = [overlap_host_device(pr.host_bwd[i].at(n), pr.dev_bwd[i].at(n), s) for n in layers]
        out["yf"].append(table(f"yf{tag}_{i}", i, f_vals))
        out["yb"].append(table(f"yb{tag}_{i}", i, [_u(x) for x in b_secs]))
        out["ob"].append(table(f"ob{tag}_{i}", i, [_u(pr.dp_overlap[i] * x) for x in b_secs]))
        out["opt"].append(table(f"opt{tag}_{i}", i, [_u(pr.opt[i].at(n)) for n in layers]))
    return out


def _pipeline(model: cp_model.CpModel, pr, t: dict, tag: str, ub: int):
    """(C3), (C4) of one template under one scenario: its pipeline time, and for (C5) each stage's
    all-reduce end relative to T_sync."""
    p = pr.depth
    dp = [t["table"](f"dp{tag}_{i}", i, [_u(pr.dp[i].at(n)) for n in range(1, t["max_layers"][i] + 1)])
          for i in range(p)]
    tau_vars = []
    for i in range(p):
        tau = model.NewIntVar(0, ub, f"tau{tag}_{i}")
        model.Add(tau == t["yf"][i] + t["yb"][i] + _u(pr.p2p[i]))
        tau_vars.append(tau)
    tau_max = model.NewIntVar(0, ub, f"tau_max{tag}")
    model.AddMaxEquality(tau_max, tau_vars)  # (C3)
    pipe = model.NewIntVar(0, ub, f"T_pipe{tag}")
    model.Add(pipe == (pr.micro_batches - 1) * tau_max + sum(tau_vars))  # (C4)
    terms, chain = [], 0
    for i in range(p):
        send = _u(0.5 * pr.p2p[i]) if i > 0 else 0
        terms.append(-chain - send - t["ob"][i] + dp[i])
        chain = chain + t["yb"][i] + send
    return pipe, terms


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

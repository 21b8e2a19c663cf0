"""split-milp: the layer split of one skeleton as a mixed-integer linear program (PuLP: CBC or HiGHS).

Data (hetopt.search.linear.SplitProblem): for stage i of p, affine functions of its layer count L_i —
host and device time of the forward pass h^f_i(L), d^f_i(L) and of the backward pass h^b_i(L), d^b_i(L)
(device time includes the TP collectives and any recompute), the gradient all-reduce D_i(L), the optimizer
step O_i(L) and the memory M_i(L); constants: point-to-point time c_i, overlap fraction s_i, DP overlap o_i,
micro-batches per replica m, memory limit M̄_i, layers N.

Variables: L_i ∈ ℤ (layers), y^f_i, y^b_i ≥ 0 (pass times), τ̂ ≥ 0 (bottleneck stage), T_sync, T_dp,
T_opt ≥ 0.

  (C1) Σ_i L_i = N,  1 ≤ L_i                                                    layer sum
  (C2) y^f_i ≥ h^f_i(L_i) + s_i·d^f_i(L_i),  y^f_i ≥ d^f_i(L_i) + s_i·h^f_i(L_i)     host/device overlap
       (same for y^b_i): the epigraph of max(h, d) + s·min(h, d), exact under minimisation
  (C3) τ̂ ≥ y^f_i + y^b_i + c_i                                                  bottleneck stage
  (C4) T_sync ≥ (m − 1)·τ̂ + Σ_i (y^f_i + y^b_i + c_i)                          1F1B pipeline
  (C5) T_dp ≥ T_sync,  T_dp ≥ T_sync − Σ_{k<i}(y^b_k + e_k) − e_i − o_i·y^b_i + D_i(L_i)
       with e_i = c_i/2 the gradient send of stage i > 0 (e_0 = 0)               gradient all-reduce
  (C6) T_opt ≥ O_i(L_i)                                                         optimizer step
  (C7) M_i(L_i) ≤ M̄_i                                                           memory

Objective: min T_dp + T_opt — for every integer split exactly the evaluator's iteration time.

Several templates j (each with its own m_j, replicas and stages; DESIGN 4's non-uniform shares): (C1),
(C2), (C6), (C7) hold per template; each template's (C3)–(C4) has its own τ̂_j but bounds the one shared
T_sync (the iteration waits for the slowest pipeline), and every template's (C5) bounds the one T_dp; the
templates' gradient exchange X (evaluate.cross_template_exchange) does not depend on the split:
min T_dp + X + T_opt.
Scenario-robust objectives (hetopt/search/robust.py) copy (C3)–(C5) per scenario s with its
communication terms c^s_i, D^s_i and combine the T^s_dp + T_opt:  (R) expected Σ_s p_s·T_s; worst z ≥ T_s;
CVaR_α η + Σ_s p_s·u_s/(1 − α) with u_s ≥ T_s − η, u_s ≥ 0.
(C5) is monotone as well: raising y^b_k raises T_sync by at least as much, so no slack can be gained.
"""

from __future__ import annotations

import pulp

from hetopt.search.formulation import Formulation, SolveOptions, SolveStatus, SplitSolution, clock, quiet_stdout
from hetopt.search.linear import PlanProblem
from hetopt.search.watchdog import deadline_for_children

GAP = 1e-9
"""Relative MIP gap: solvers default to 1e-4, which would leave milliseconds on the table."""
UNIT_PER_S = 1e3
"""Times enter the program in milliseconds: per-layer terms of 1e-4 s next to iteration times of 10 s left
HiGHS with 1e-6 primal infeasibilities it reports as a solve error; in ms the rows are well scaled."""


def build(problem: PlanProblem) -> tuple[pulp.LpProblem, list[pulp.LpVariable]]:
    model = pulp.LpProblem("split", pulp.LpMinimize)
    t_opt = pulp.LpVariable("T_opt", 0)
    flat, per_template = [], []
    for j, pr in enumerate(problem.base.templates):
        tag = f"_t{j}"
        max_layers = pr.max_layers()
        L = [pulp.LpVariable(f"L{tag}_{i}", 1, max(1, max_layers[i]), cat="Integer") for i in range(pr.depth)]
        yf = [pulp.LpVariable(f"yf{tag}_{i}", 0) for i in range(pr.depth)]
        yb = [pulp.LpVariable(f"yb{tag}_{i}", 0) for i in range(pr.depth)]
        add_layer_sum(model, pr, L, tag)
        add_pass_overlap(model, pr, L, yf, yb, tag)
        add_optimizer(model, pr, L, t_opt, tag)
        add_memory(model, pr, L, tag)
        flat += L
        per_template.append((L, yf, yb))
    totals = []
    for s, sc in enumerate(problem.scenarios):  # one copy of the communication terms per scenario
        t_sync, t_end = pulp.LpVariable(f"T_sync_s{s}", 0), pulp.LpVariable(f"T_dp_s{s}", 0)
        model += t_end >= t_sync, f"C5_drain_s{s}"
        for j, (pr, (L, yf, yb)) in enumerate(zip(sc.templates, per_template, strict=True)):
            tag = f"_t{j}_s{s}"
            tau_max = pulp.LpVariable(f"tau_max{tag}", 0)
            add_pipeline(model, pr, yf, yb, tau_max, t_sync, tag)
            add_gradient_allreduce(model, pr, L, yb, t_sync, t_end, tag)
        totals.append(t_end + sc.cross_s + t_opt)
    add_objective(model, problem, totals)
    return model, flat


def add_objective(model, problem: PlanProblem, totals) -> None:  # (R) robust.py
    probs = problem.probabilities
    if problem.objective in ("stable", "expected"):
        model += pulp.lpSum(p * t for p, t in zip(probs, totals, strict=True))
    elif problem.objective == "worst":
        z = pulp.LpVariable("worst", 0)
        for s, t in enumerate(totals):
            model += z >= t, f"R_worst_s{s}"
        model += z
    else:  # CVaR_α: η + Σ p_s·u_s/(1 − α), u_s ≥ T_s − η, u_s ≥ 0
        eta = pulp.LpVariable("eta")
        u = [pulp.LpVariable(f"u_s{s}", 0) for s in range(len(totals))]
        for s, t in enumerate(totals):
            model += u[s] >= t - eta, f"R_cvar_s{s}"
        model += eta + pulp.lpSum(p * us for p, us in zip(probs, u, strict=True)) / (1 - problem.alpha)


def add_layer_sum(model, pr, L, tag: str) -> None:  # (C1)
    model += pulp.lpSum(L) == pr.layers, f"C1_layers{tag}"


def add_pass_overlap(model, pr, L, yf, yb, tag: str) -> None:  # (C2)
    for i in range(pr.depth):
        s = pr.serial[i]
        for y, h, d, kind in ((yf[i], pr.host_fwd[i], pr.dev_fwd[i], "f"), (yb[i], pr.host_bwd[i], pr.dev_bwd[i], "b")):
            model += y >= (h.slope + s * d.slope) * L[i] + h.intercept + s * d.intercept, f"C2_host_{kind}{i}{tag}"
            model += y >= (d.slope + s * h.slope) * L[i] + d.intercept + s * h.intercept, f"C2_dev_{kind}{i}{tag}"


def add_pipeline(model, pr, yf, yb, tau_max, t_sync, tag: str) -> None:  # (C3), (C4)
    for i in range(pr.depth):
        model += tau_max >= yf[i] + yb[i] + pr.p2p[i], f"C3_bottleneck{i}{tag}"
    model += t_sync >= (pr.micro_batches - 1) * tau_max + pulp.lpSum(
        yf[i] + yb[i] + pr.p2p[i] for i in range(pr.depth)), f"C4_pipeline{tag}"


def add_gradient_allreduce(model, pr, L, yb, t_sync, t_dp, tag: str) -> None:  # (C5)
    chain = 0
    for i in range(pr.depth):
        send = 0.5 * pr.p2p[i] if i > 0 else 0.0
        model += t_dp >= t_sync - chain - send - pr.dp_overlap[i] * yb[i] + pr.dp[i].slope * L[i] + \
            pr.dp[i].intercept, f"C5_dp{i}{tag}"
        chain = chain + yb[i] + send


def add_optimizer(model, pr, L, t_opt, tag: str) -> None:  # (C6)
    for i in range(pr.depth):
        model += t_opt >= pr.opt[i].slope * L[i] + pr.opt[i].intercept, f"C6_opt{i}{tag}"


def add_memory(model, pr, L, tag: str) -> None:  # (C7)
    for i in range(pr.depth):
        model += pr.mem_gib[i].slope * L[i] + pr.mem_gib[i].intercept <= pr.mem_limit_gib[i], f"C7_memory{i}{tag}"


def solve(problem: PlanProblem, backend: str, options: SolveOptions) -> SplitSolution:
    start = clock()
    model, L = build(problem.scaled(UNIT_PER_S))
    if options.hint is not None and len(options.hint) == len(L):
        for var, value in zip(L, options.hint, strict=True):
            var.setInitialValue(value)
    if options.export_path:
        (model.writeMPS if options.export_path.endswith(".mps") else model.writeLP)(options.export_path)
    limit = max(1, int(options.time_limit_s + 0.999))
    if backend == "cbc":
        solver = pulp.PULP_CBC_CMD(msg=False, timeLimit=limit, warmStart=options.hint is not None, gapRel=GAP,
                                   options=[f"randomSeed {options.seed}"])
    else:
        solver = pulp.HiGHS(msg=False, timeLimit=limit, gapRel=GAP, random_seed=options.seed)
    # CBC may overrun its own limit (presolve): it is stopped from outside a little after the deadline.
    grace_s = max(1.0, 0.1 * limit)
    try:
        with quiet_stdout(), deadline_for_children(limit + grace_s) as watchdog:
            model.solve(solver)
    except pulp.PulpSolverError as exc:
        if watchdog["killed"]:
            return SplitSolution(SolveStatus.TIMEOUT, None, float("inf"), 0.0, clock() - start, backend,
                                 "CBC stopped from outside after its time limit")
        return SplitSolution(SolveStatus.ERROR, None, float("inf"), 0.0, clock() - start, backend, str(exc))
    status = pulp.LpStatus[model.status]
    wall = clock() - start
    if status == "Infeasible":
        return SplitSolution(SolveStatus.INFEASIBLE, None, float("inf"), float("inf"), wall, backend)
    if status != "Optimal" or any(v.varValue is None for v in L):
        got = [round(v.varValue) for v in L] if all(v.varValue is not None for v in L) else None
        return SplitSolution(SolveStatus.TIMEOUT if got else SolveStatus.ERROR, got,
                             pulp.value(model.objective) / UNIT_PER_S if got else float("inf"), 0.0, wall, backend,
                             status)
    layers = [round(v.varValue) for v in L]
    objective = float(pulp.value(model.objective)) / UNIT_PER_S
    return SplitSolution(SolveStatus.OPTIMAL, layers, objective, objective, wall, backend)


FORMULATION = Formulation("split-milp", "layer split of a skeleton as a MILP (PuLP)", ("cbc", "highs"), solve,
                          __doc__ or "")

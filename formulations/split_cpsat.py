"""split-cpsat: the layer split of one skeleton for OR-Tools CP-SAT, the constraint-programming way.

The mathematics is split-milp's, (C1)–(C7); only the encoding differs. A stage's layer count L_i has
a small domain (1 … U_i, the most its memory holds), so every quantity that depends on it alone is
tabulated over that domain and linked with an element constraint — exactly, with no epigraph: both
passes y^{fb}_i(L) = y^f_i(L) + y^b_i(L) (a pass takes max(h, d) + s·min(h, d), and under ZeRO-2/3
waits for its collectives: SplitProblem.pass_s), the backward pass y^b_i(L), the overlapped part
o_i·y^b_i(L), the gradient all-reduce D_i(L), the optimizer step O_i(L) — for a stage with shards
each the stage's as pricing.by_stage takes it from its rows (SplitProblem.pass_s, hidden_s, dp_s,
opt_s).

  (C1) Σ L_i = N                  (C2) y^{fb}_i = table_fb(L_i), y^b_i = table_b(L_i)   (element)
  (C3) τ̂ = max_i τ_i, τ_i = y^{fb}_i + c_i                (C4) T_sync = (m − 1)·τ̂ + Σ_i τ_i
  (C5) T_dp = max(T_sync, max_i [T_sync − Σ_{k<i}(y^b_k + e_k) − e_i − o_i·y^b_i + D_i(L_i)])
  (C6) T_opt = max_i O_i(L_i)     (C7) M_i(L_i) ≤ M̄_i (the domain of L_i)
Per-stage recompute (SplitProblem.modes): a stage's passes and memory depend on its mode r too, so
its tables range over its options (n, r) that fit in memory: an option index k_i with L_i =
element(k_i, n), every table element(k_i, ·), and the mode read off k_i.
Objective: min T_dp + T_opt. Several templates: (C1)–(C7) per template ((C1t) ties their splits in
lockstep), T_sync = max_j T_pipe_j,
T_dp the max over every template's stages, plus their split-independent gradient exchange X
(split-milp's docstring). Search branches on the layer counts first. Robust objectives copy
(C3)–(C5) per scenario and combine the scenario times as split-milp's (R) with integer weights
w_s = round(p_s·P).

Rounding, and what OPTIMAL means. Times are integers in units of 1/S s, S a power of ten chosen per
problem: the least that keeps the rounding error below FINE_ENOUGH of REL_TOLERANCE of a lower bound
on the objective (PlanProblem.lower_bound_s, search.bounds.placed_bound), and never so large that an
objective value reaches 2^53 (exact in the doubles of CP-SAT's LP); MIN_SCALE … MAX_SCALE. Finer
than needed only slows CP-SAT, by orders of magnitude on small robust problems (an example:
docs/benchmarks.md, figures behind constants). Each table entry
and constant is rounded once (error ≤ ½ unit), so for every split the integer scenario time T̃_s
differs from the evaluator's T_s by at most (units)

    E_s = max_j (m_j − 1 + p_j) + max_j p_j + 1

— τ_i sums two rounded terms (y^{fb}_i and c_i: one unit) and (C4) counts m_j − 1 + p_j of them
(with v chunks per stage, (C1v) L_i = v·K_i and (C4) v·T_pipe = (v·m − 1)·τ̂ + Σ τ_i: (v·m − 1 +
p)/v ≤ m − 1 + p units, and one more for rounding T_pipe down to a whole unit, added to E_s); the
(C5) row of stage i rounds y^b_k and e_k of the stages before it, e_i, o_i·y^b_i and D_i (2i + 2
halves, at most p_j units); X and T_opt one half each. The objective's weights add a relative error:
with q_s the integer model's weight of scenario s and c_s the true one (p_s, or p_s/(1 − α) for
CVaR), κ = max(1, max_s q_s/c_s). So for every split F ≥ (G̃ − Σ_s q_s·E_s)/κ (G̃ the integer
model's objective in seconds; max_s E_s for `worst`), and the bound reported is CP-SAT's bound put
through the same map: a bound no split beats. The split CP-SAT returns is re-timed by the evaluator
(`objective_s`), and the status is OPTIMAL only when CP-SAT proved its integer optimum and the
evaluator's time is within REL_TOLERANCE of that valid bound; otherwise FEASIBLE (proved, but the
rounding leaves more than the tolerance) or TIMEOUT, with the honest bound.
"""

from __future__ import annotations

import math

from ortools.sat.python import cp_model

from hetopt.outputs import atomic_path
from hetopt.search.backends import registry
from hetopt.search.formulation import Formulation, SolveOptions, SolveStatus, SplitSolution, clock
from hetopt.search.linear import PlanProblem

MAX_SCALE = 10**12
"""The finest time unit (1 ps): finer buys no accuracy the evaluator's doubles have."""
MIN_SCALE = 10**3
"""The coarsest (1 ms), for problems so long that 2^53 would not hold them finer."""
FINE_ENOUGH = 0.1
"""The rounding error aimed for, as a fraction of REL_TOLERANCE of the objective's lower bound."""
EXACT_INT = 2**53
"""Objective values stay below this: CP-SAT's LP relaxation computes them in doubles."""
P = 1_000_000
"""Probabilities become integer weights round(p·P)."""
REL_TOLERANCE = 1e-5
"""OPTIMAL means: the evaluator's time of the returned split is within this (relative) of the valid
bound. The rounding error E_s above is a few units of 1/S s per micro-batch; the weights' relative
error is at most 0.5/(p_s·P)."""


def solve(problem: PlanProblem, backend: str, options: SolveOptions) -> SplitSolution:
    """Solve one skeleton's split on CP-SAT.

    Parameters: problem — the skeleton in seconds; backend — "cpsat"; options — time limit, seed, a
    split to hint, a path to export the model to (protobuf text).
    Returns: the split with the evaluator's time, a valid bound in seconds and the status (module
    docstring: OPTIMAL only within REL_TOLERANCE of a bound that accounts for the rounding)."""
    start = clock()
    weights, divisor, true_weights = _weights(problem)
    scale = _scale(problem, sum(weights) + (divisor if problem.objective == "cvar" else 0))
    model = cp_model.CpModel()
    flat, flat_max, choices = _build(model, problem, weights, divisor, scale)
    hint = None
    if options.hint is not None and len(options.hint) == len(flat):
        hint = {
            var: min(value, top)
            for var, value, top in zip(flat, options.hint, flat_max, strict=True)
        }
    if options.export_path:  # the exported model carries the hint, as the solved one does
        for var, value in (hint or {}).items():
            model.AddHint(var, value)
        # a .txt name is written as text, else binary
        with atomic_path(options.export_path) as temp:
            model.ExportToFile(str(temp))
        hint = None
    run = registry.get(backend).run(model, options, hint)
    wall = clock() - start
    if run.status == SolveStatus.INFEASIBLE:
        return SplitSolution(
            SolveStatus.INFEASIBLE, None, math.inf, math.inf, wall, backend, run.detail
        )
    errors = [e / scale for e in rounding_error_units(problem)]
    valid = _valid_bound(problem, run.bound, scale, divisor, errors, weights, true_weights)
    model_s = run.objective / divisor / scale if run.objective is not None else None
    extra = {
        "scale_units_per_s": scale,
        "rounding_error_s": max(errors),
        "rel_tolerance": REL_TOLERANCE,
        "model_objective_s": model_s,
    }
    if run.value is None:
        status = SolveStatus.TIMEOUT if run.status == SolveStatus.TIMEOUT else SolveStatus.ERROR
        kept = valid if status == SolveStatus.TIMEOUT else 0.0
        return SplitSolution(status, None, math.inf, kept, wall, backend, run.detail, extra)
    layers = [run.value(v) for v in flat]
    modes = _modes(choices, run) if any(pr.mixed for pr in problem.base.templates) else None
    objective_s = problem.iteration_time(layers, modes)
    valid = min(valid, objective_s)
    status, detail = run.status, run.detail
    if status == SolveStatus.OPTIMAL and objective_s - valid > REL_TOLERANCE * objective_s:
        status = SolveStatus.FEASIBLE
        gap = (objective_s - valid) / objective_s
        detail += (
            "; proven for the integer model, but its rounding leaves the evaluator's "
            f"{objective_s:.9g} s {gap:.2e} above the valid bound {valid:.9g} s (more than "
            f"{REL_TOLERANCE:g})"
        )
    return SplitSolution(
        status, layers, objective_s, valid, wall, backend, detail, extra, recompute=modes
    )


def _modes(choices: list, run) -> list[str]:
    """Each stage's recompute mode, flat, from its option index k_i (per-stage recompute)."""
    return [pr.modes[options[run.value(k)][1]] for pr, options, k in choices]


def rounding_error_units(problem: PlanProblem) -> list[float]:
    """E_s for each scenario: the most the integer model's time of any split can differ from the
    evaluator's, in units of the scale (module docstring)."""
    return [
        max(t.micro_batches - 1 + t.depth for t in sc.templates)
        + max(t.depth for t in sc.templates)
        + 1.0
        + (1.0 if any(t.virtual_stages > 1 for t in sc.templates) else 0.0)
        for sc in problem.scenarios
    ]


def _weights(problem: PlanProblem) -> tuple[list[int], int, list[float]]:
    """(integer weights q_s·divisor, divisor, true weights c_s) of the scenario times."""
    probs = list(problem.probabilities)
    if problem.objective == "stable":
        return [1], 1, [1.0]
    if problem.objective == "worst":
        return [1] * len(probs), 1, [1.0] * len(probs)
    weights = [round(p * P) for p in probs]
    if problem.objective == "expected":
        return weights, sum(weights), probs
    return weights, round(P * (1 - problem.alpha)), [p / (1 - problem.alpha) for p in probs]


def _valid_bound(
    problem: PlanProblem,
    bound: float | None,
    scale: int,
    divisor: int,
    errors: list[float],
    weights: list[int],
    true_weights: list[float],
) -> float:
    """A bound (seconds) no split beats, from CP-SAT's bound on its integer objective: take off the
    rounding, then divide by the weights' distortion κ (module docstring)."""
    if bound is None or not math.isfinite(bound):
        return 0.0
    g = bound / divisor / scale
    if problem.objective == "worst":
        return max(0.0, g - max(errors))
    q = [w / divisor for w in weights]
    kappa = max([1.0] + [qs / cs for qs, cs in zip(q, true_weights, strict=True) if cs > 0])
    return max(0.0, (g - sum(qs * e for qs, e in zip(q, errors, strict=True))) / kappa)


def _scale(problem: PlanProblem, weight: int) -> int:
    """S: the least power of ten whose rounding error E/S is below FINE_ENOUGH·REL_TOLERANCE of a
    lower bound on the objective, within MIN_SCALE … the largest with weight · ub · S < 2^53 (≤
    MAX_SCALE)."""
    ub = max(upper_bound_s(sc) for sc in problem.scenarios)
    errors = rounding_error_units(problem)
    margin = 2 * max(errors) + 4  # what _build adds to the domains
    top = MAX_SCALE
    while top > MIN_SCALE and weight * (ub * top + margin) >= EXACT_INT:
        top //= 10
    low = problem.lower_bound_s
    if not (math.isfinite(low) and low > 0):
        return top
    scale = MIN_SCALE
    while scale < top and sum(errors) / scale > FINE_ENOUGH * REL_TOLERANCE * low:
        scale *= 10
    return scale


def upper_bound_s(sc) -> float:
    """No split makes a scenario's time exceed this (seconds): the slowest template with every stage
    at its slowest (a pass time is convex in L, so at an end of the domain; under ZeRO-2/3 the
    largest over every L), then the slowest all-reduce, the exchange and the slowest optimizer
    step."""
    sync, dp, opt = 0.0, 0.0, 0.0
    for pr in sc.templates:
        top = _top(pr)
        # a pass is convex in L, so at an end of the domain — under ZeRO-2/3 not: every L (and with
        # per-stage recompute in every mode)
        ends = [range(1, top[i] + 1) if pr.tabulated else (1, top[i]) for i in range(pr.depth)]
        tau = [
            max(
                _pass(pr, i, n, "f", r) + _pass(pr, i, n, "b", r)
                for n in ends[i]
                for r in range(len(pr.variants()))
            )
            + pr.p2p[i]
            for i in range(pr.depth)
        ]
        sync = max(sync, (pr.micro_batches - 1) * max(tau) + sum(tau))
        dp = max([dp] + [pr.dp_s(i, n) for i in range(pr.depth) for n in ends[i]])
        opt = max([opt] + [pr.opt_s(i, n) for i in range(pr.depth) for n in ends[i]])
    return sync + dp + max(sc.cross_s, 0.0) + opt


def _top(pr) -> list[int]:
    return [max(1, min(m, pr.layers - (pr.depth - 1))) for m in pr.max_layers()]


def _pass(pr, i: int, n: int, kind: str, mode: int = 0) -> float:
    return pr.pass_s(i, n, kind, mode)


def _build(
    model: cp_model.CpModel, problem: PlanProblem, weights: list[int], divisor: int, scale: int
) -> tuple[list, list[int], list]:
    """Variables, (C1)–(C7) and (R); returns the layer variables, their upper bounds and, per stage
    (flat), (its template, its options (n, mode index), its option index k_i)."""

    def u(seconds: float) -> int:
        return round(seconds * scale)

    errors = rounding_error_units(problem)
    top: dict[str, int] = {}
    flat: list[cp_model.IntVar] = []
    flat_max: list[int] = []
    templates, choices = [], []
    for j, pr in enumerate(problem.base.templates):
        vars_j = _template(model, pr, f"_t{j}", top, u)
        templates.append(vars_j)
        flat += vars_j["L"]
        flat_max += vars_j["max_layers"]
        choices += [
            (pr, options, k) for options, k in zip(vars_j["options"], vars_j["index"], strict=True)
        ]
    if problem.lockstep:  # (C1t): every template runs the first one's split
        for t in templates[1:]:
            for mine, first in zip(t["L"], templates[0]["L"], strict=True):
                model.Add(mine == first)
    opt = [v for t in templates for v in t["opt"]]
    top["T_opt"] = max(top[v.Name()] for v in opt)
    t_opt = model.NewIntVar(0, top["T_opt"], "T_opt")
    model.AddMaxEquality(t_opt, opt)  # (C6)
    totals = []
    for sc_index, sc in enumerate(problem.scenarios):  # a copy of the communication per scenario
        tag = f"_s{sc_index}"
        # every integer quantity of this scenario lies in [−ub, ub]: the real bound plus rounding
        ub = math.ceil(upper_bound_s(sc) * scale) + math.ceil(errors[sc_index]) + 2
        pipes, ends = [], []
        for j, (pr, t) in enumerate(zip(sc.templates, templates, strict=True)):
            pipe, dp_terms = _pipeline(model, pr, t, f"_t{j}{tag}", ub, u)
            pipes.append(pipe)
            ends += dp_terms
        t_sync = model.NewIntVar(0, ub, f"T_sync{tag}")
        model.AddMaxEquality(t_sync, pipes)  # (C4): the slowest template
        end_vars = [t_sync]
        for k, term in enumerate(ends):  # (C5): every stage of every template, from T_sync
            end = model.NewIntVar(-ub, ub, f"dp_end_{k}{tag}")
            model.Add(end == t_sync + term)
            end_vars.append(end)
        t_dp = model.NewIntVar(0, ub, f"T_dp{tag}")
        model.AddMaxEquality(t_dp, end_vars)
        total = model.NewIntVar(0, ub, f"T{tag}")
        top[f"T{tag}"] = ub
        model.Add(total == t_dp + u(sc.cross_s) + t_opt)
        totals.append(total)
    hi = max(top[f"T_s{k}"] for k in range(len(totals)))
    _objective(model, problem, totals, hi, weights, divisor)
    model.AddDecisionStrategy(flat, cp_model.CHOOSE_MIN_DOMAIN_SIZE, cp_model.SELECT_MIN_VALUE)
    return flat, flat_max, choices


def _template(model: cp_model.CpModel, pr, tag: str, top: dict[str, int], u) -> dict:
    """(C1), (C2), (C7) and the per-stage tables of (C5), (C6) for one template. Tables range over a
    stage's options (SplitProblem.options): its layer counts L = 1 … U_i, index k_i = L_i − 1; with
    per-stage recompute the (n, mode) that fit, index k_i and L_i = element(k_i, n)."""
    p = pr.depth
    max_layers = _top(pr)
    L = [model.NewIntVar(1, max_layers[i], f"L{tag}_{i}") for i in range(p)]
    model.Add(sum(L) == pr.layers)  # (C1)
    v = pr.virtual_stages
    if v > 1:  # (C1v) interleaved: v model chunks of K_i layers each
        for i in range(p):
            chunks = model.NewIntVar(1, max(1, max_layers[i] // v), f"K{tag}_{i}")
            model.Add(L[i] == v * chunks)
    options = [
        pr.options(i, max_layers[i]) if pr.mixed else [(n, 0) for n in range(1, max_layers[i] + 1)]
        for i in range(p)
    ]
    index = []
    for i, cap in enumerate(pr.max_layers()):
        if cap < 1:  # (C7): the stage cannot hold one layer (its domain starts at 1): no split fits
            model.Add(L[i] < 1)
    for i in range(p):
        k = model.NewIntVar(0, max(0, len(options[i]) - 1), f"k{tag}_{i}")
        if pr.mixed:  # (C7) per mode: only the options that fit
            if not options[i]:  # no layer count fits in any mode: infeasible (a placeholder table)
                options[i] = [(1, 0)]
                model.Add(L[i] < 1)
            model.AddElement(k, [n for n, _ in options[i]], L[i])
        else:
            model.Add(k == L[i] - 1)
        index.append(k)

    def table(name: str, i: int, values: list[int]) -> cp_model.IntVar:
        var = model.NewIntVar(min(values), max(values), name)
        model.AddElement(index[i], values, var)
        top[name] = max(values)
        return var

    out = {
        "L": L,
        "max_layers": max_layers,
        "index": index,
        "options": options,
        "opt": [],
        "table": table,
    }
    if not pr.tabulated:  # ZeRO-2/3 passes hold collectives, which differ per scenario: `_pipeline`
        out.update(_pass_tables(pr, out, tag, u))
    for i in range(p):
        out["opt"].append(table(f"opt{tag}_{i}", i, [u(pr.opt_s(i, n)) for n, _ in options[i]]))
    return out


def _pass_tables(pr, t: dict, tag: str, u) -> dict:
    """(C2): both passes, the backward pass and its overlapped part, tabulated over each L_i."""
    out = {"yfb": [], "yb": [], "ob": []}
    for i in range(pr.depth):
        options = t["options"][i]
        b_secs = [_pass(pr, i, n, "b", r) for n, r in options]
        # both passes in one table: τ_i then carries two roundings, not three (E_s counts them)
        fb_secs = [_pass(pr, i, n, "f", r) + x for (n, r), x in zip(options, b_secs, strict=True)]
        out["yfb"].append(t["table"](f"yfb{tag}_{i}", i, [u(x) for x in fb_secs]))
        out["yb"].append(t["table"](f"yb{tag}_{i}", i, [u(x) for x in b_secs]))
        out["ob"].append(
            t["table"](f"ob{tag}_{i}", i, [u(pr.hidden_s(i, n, r)) for n, r in options])
        )
    return out


def _pipeline(model: cp_model.CpModel, pr, t: dict, tag: str, ub: int, u):
    """(C3), (C4) of one template under one scenario: its pipeline time, and for (C5) each stage's
    all-reduce end relative to T_sync."""
    p = pr.depth
    if pr.tabulated:  # this scenario's ZeRO-2/3 collectives in the passes
        t = {**t, **_pass_tables(pr, t, tag, u)}
    dp = [
        t["table"](f"dp{tag}_{i}", i, [u(pr.dp_s(i, n)) for n, _ in t["options"][i]])
        for i in range(p)
    ]
    tau_vars = []
    for i in range(p):
        tau = model.NewIntVar(0, ub, f"tau{tag}_{i}")
        model.Add(tau == t["yfb"][i] + u(pr.p2p[i]))
        tau_vars.append(tau)
    tau_max = model.NewIntVar(0, ub, f"tau_max{tag}")
    model.AddMaxEquality(tau_max, tau_vars)  # (C3)
    pipe = model.NewIntVar(0, ub, f"T_pipe{tag}")
    v = pr.virtual_stages
    if v == 1:
        model.Add(pipe == (pr.micro_batches - 1) * tau_max + sum(tau_vars))  # (C4)
    else:  # (C4) interleaved: v·T_pipe = (v·m − 1)·τ̂ + Σ τ_i, rounded down to a whole unit
        scaled = model.NewIntVar(0, v * ub, f"T_pipe_v{tag}")
        model.Add(scaled == (v * pr.micro_batches - 1) * tau_max + sum(tau_vars))
        model.AddDivisionEquality(pipe, scaled, v)
    terms, chain = [], 0
    for i in range(p):
        send = u(0.5 * pr.p2p[i]) if i > 0 else 0
        terms.append(-chain - send - t["ob"][i] + dp[i])
        chain = chain + t["yb"][i] + send
    return pipe, terms


def _objective(
    model: cp_model.CpModel,
    problem: PlanProblem,
    totals: list,
    hi: int,
    weights: list[int],
    divisor: int,
) -> None:
    """(R) with integer weights: seconds = objective / S / divisor."""
    if problem.objective == "stable":
        model.Minimize(totals[0])
    elif problem.objective == "expected":
        model.Minimize(sum(w * t for w, t in zip(weights, totals, strict=True)))
    elif problem.objective == "worst":
        z = model.NewIntVar(0, hi, "worst")
        model.AddMaxEquality(z, totals)
        model.Minimize(z)
    else:  # CVaR: divisor·η + Σ w_s·u_s, u_s ≥ T_s − η (η ≥ 0: its minimiser is one of the T_s)
        eta = model.NewIntVar(0, hi, "eta")
        u = [model.NewIntVar(0, hi, f"u_{s}") for s in range(len(totals))]
        for us, t in zip(u, totals, strict=True):
            model.Add(us >= t - eta)
        model.Minimize(divisor * eta + sum(w * us for w, us in zip(weights, u, strict=True)))


FORMULATION = Formulation(
    "split-cpsat",
    "layer split of a skeleton for CP-SAT (element tables, integer time)",
    ("cpsat",),
    solve,
    __doc__ or "",
)

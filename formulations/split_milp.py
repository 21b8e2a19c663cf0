"""split-milp: the layer split of one skeleton as a mixed-integer linear program (CBC or HiGHS).

Data (hetopt.search.linear.SplitProblem): for stage i of p, affine functions of its layer count L_i
— host and device time of the forward pass h^f_i(L), d^f_i(L) and of the backward pass h^b_i(L),
d^b_i(L) (device time includes the TP collectives and any recompute), the gradient all-reduce
D_i(L), the optimizer step O_i(L) and the memory M_i(L); constants: point-to-point time c_i, overlap
fraction s_i ∈ [0, 1], DP overlap o_i ∈ [0, 1], micro-batches per replica m, memory limit M̄_i,
layers N. U_i = min(the most layers stage i holds in memory, N − p + 1) is the top of L_i's domain.

A pass takes max(h, d) + s·min(h, d) = max(P^h, P^d) with the two affine pieces P^h = h + s·d and
P^d = d + s·h (their difference (1 − s)(h − d) is affine in L, so on [1, U_i] one piece dominates or
they cross once).

Variables: L_i ∈ ℤ (layers), y^f_i, y^b_i ≥ 0 (pass times), z_i ∈ {0, 1} (which backward piece is
active, only where the pieces cross inside [1, U_i]), τ̂ ≥ 0 (bottleneck stage), T_sync, T_dp, T_opt
≥ 0.

Each constraint with why it is tight — for every integer split the program's optimum is exactly the
evaluator's iteration time (PlanProblem.iteration_time), not a bound on it:

  (C1)  Σ_i L_i = N,  1 ≤ L_i ≤ U_i                                          layer sum
  (C1v) L_i = v·K_i, K_i ∈ ℤ, K_i ≥ 1  (interleaved 1F1B with v model chunks per stage)
  (C1t) L_{j,i} = L_{0,i} for every template j  (a uniform layout's templates in lockstep, one
        split: PlanProblem.lockstep, hetopt.search.uniform)
  (C2f) y^f_i ≥ P^{f,h}_i(L_i),  y^f_i ≥ P^{f,d}_i(L_i)                        forward pass
        tight: y^f enters only (C3) and (C4), with a positive sign, so lowering it to the larger
        piece never hurts — the epigraph is exact under minimisation.
  (C2b) y^b_i ≥ P^{b,h}_i(L_i),  y^b_i ≥ P^{b,d}_i(L_i),                       backward pass
        y^b_i ≤ P^{b,h}_i(L_i) + M^h_i·(1 − z_i),  y^b_i ≤ P^{b,d}_i(L_i) + M^d_i·z_i
        with M^h_i = max_{L∈[1,U_i]} (P^{b,d} − P^{b,h})(L) and M^d_i the same the other way round
        (the difference is affine: its maximum is at L = 1 or L = U_i, so these are the smallest
        constants that leave the inactive piece's row slack on the whole domain). Where one piece
        dominates on [1, U_i] there is no z_i: y^b_i equals that piece. Why exact and not an
        epigraph: y^b enters (C5) with a negative sign. With one template a larger y^b_k raises
        T_sync by at least as much ((C4) holds it), so no slack could be gained; but with two
        templates T_sync is set by the slower pipeline, and the other template's y^b could be raised
        freely to loosen its (C5) — the MILP then sat up to 4.5% below the evaluator
        (a100-t4-gpt3-1.3b; tests/test_conformance.py). The two upper rows make y^b_i = max(P^{b,h},
        P^{b,d}) for every feasible z_i.
  (C2z) ZeRO-2/3, where a pass waits for its collectives and its time is not affine in L
        (SplitProblem.pass_s): one binary w_{i,n} per layer count n of stage i's domain,
        Σ_n w_{i,n} = 1, L_i = Σ_n n·w_{i,n}, y^f_i = Σ_n pass^f_i(n)·w_{i,n} and the same for
        y^b_i — equalities, so exact in every position (C5 included), in place of (C2f) and (C2b).
        The collectives cross the network, so under robust objectives y^f, y^b are one pair per
        scenario. Where every table of a stage is convex over its counts n_1 < n_2 < … (each step
        no smaller than the one before) and no all-reduce follows (ZeRO-2/3 have none: D_i = 0, so
        (C5) is T_dp ≥ T_sync and y^b enters the program only through (C3)–(C4), positively), the
        stage needs no binaries: y ≥ pass(n_k) + (pass(n_{k+1}) − pass(n_k))·(L − n_k)/(n_{k+1} −
        n_k) for each pair of neighbouring counts — a convex function on integers is the largest of
        its chords, so the epigraph is exact under minimisation, as in (C2f).
  (C2r) Per-stage recompute (SplitProblem.modes): stage i's passes and memory depend on its mode r
        too, so the binaries of (C2z) range over its options (n, r) that fit in memory
        (M^r_i(n) ≤ M̄_i, in place of (C7)): Σ w_{i,n,r} = 1, L_i = Σ n·w_{i,n,r},
        y = Σ pass^r_i(n)·w_{i,n,r} — equalities, exact as (C2z). The mode is read off the binary
        that is 1. No chords: the lower envelope of several modes' tables need not be convex, and it
        would not say which mode holds.
  (C2s) Stages with shards (SplitProblem.rows): a stage takes each part from the row where it is
        longest and its all-reduce starts once every rank r has run (1 − o_r) of its pass
        (pricing.by_stage), none of it affine in L: the binaries of (C2z) also give the all-reduce
        D_i = Σ D_i(n)·w_{i,n}, its overlapped part o_i·y^b_i = Σ hidden_i(n)·w_{i,n} in (C5), the
        optimizer step in (C6), and the options are the counts every row holds in memory (for
        (C7)) — equalities, exact as (C2z); never chords (an all-reduce follows).
  (C3)  τ̂ ≥ y^f_i + y^b_i + c_i                                              bottleneck stage
        tight: τ̂ enters (C4) only, positively.
  (C4)  T_sync ≥ (m − 1/v)·τ̂ + Σ_i (y^f_i + y^b_i + c_i)/v                  1F1B pipeline
        (v = 1; interleaved, v chunks per stage: m·τ̂ + (Σ τ − τ̂)/v)
        tight: T_sync enters (C5) with a positive sign only.
  (C5)  T_dp ≥ T_sync,  T_dp ≥ T_sync − Σ_{k<i}(y^b_k + e_k) − e_i − o_i·y^b_i + D_i(L_i)
        with e_i = c_i/2 the gradient send of stage i > 0 (e_0 = 0)          gradient all-reduce
        tight: T_dp enters the objective with a positive sign; every y^b in it is exact by (C2b).
  (C6)  T_opt ≥ O_i(L_i)                                                      optimizer step
        tight: T_opt enters the objective with a positive sign.
  (C7)  M_i(L_i) ≤ M̄_i                                                        memory (also in U_i)

Objective: min T_dp + T_opt.

Several templates j (each with its own m_j, replicas and stages; the non-uniform shares of
docs/planner.md): (C1), (C2), (C6), (C7) hold per template; each template's (C3)–(C4) has its own
τ̂_j but bounds the one shared T_sync (the iteration waits for the slowest pipeline), and every
template's (C5) bounds the one T_dp; the templates' gradient exchange X
(evaluate.cross_template_exchange) does not depend on the split: min T_dp + X + T_opt.
Scenario-robust objectives (hetopt/search/robust.py) copy (C3)–(C5) per scenario s with its
communication terms c^s_i, D^s_i (the pass times and z are the scenario-independent compute) and
combine the T^s = T^s_dp + X^s + T_opt:
  (R) stable/expected Σ_s p_s·T^s;  worst z ≥ T^s;
      CVaR_α η + Σ_s p_s·u_s/(1 − α) with u_s ≥ T^s − η, u_s ≥ 0 (Rockafellar–Uryasev, whose minimum
      over η is robust.aggregate's CVaR). Tight: each combination is non-decreasing in every T^s.

Solving: times enter the program in milliseconds (UNIT_PER_S). The split the solver returns is
re-timed by the evaluator: `objective_s` is that exact time, the solver's own objective is kept in
extra["model_objective_s"]. OPTIMAL is reported only when the solver proved optimality (its own
status, not PuLP's "Optimal", which a time limit also gives) and its bound is within REL_TOLERANCE
of the evaluator's time; otherwise the solver's bound is reported with FEASIBLE or TIMEOUT.
"""

from __future__ import annotations

import itertools
import math

import pulp

from hetopt.outputs import atomic_path
from hetopt.search.backends import registry
from hetopt.search.formulation import Formulation, SolveOptions, SolveStatus, SplitSolution, clock
from hetopt.search.linear import PlanProblem

UNIT_PER_S = 1e3
"""Times enter the program in milliseconds: per-layer terms of 1e-4 s next to iteration times of
10 s left HiGHS with 1e-6 primal infeasibilities it reports as a solve error; in ms the rows are
well scaled."""
REL_TOLERANCE = 1e-7
"""OPTIMAL means: the evaluator's time of the returned split is within this (relative) of the
solver's proven bound. The solvers stop at a relative gap of 1e-9; what is left is their
integrality and feasibility tolerances (1e-6 on an integer variable moves a time by 1e-6 of a
per-layer slope)."""


def build(problem: PlanProblem) -> tuple[pulp.LpProblem, list[pulp.LpVariable], list]:
    """The program of (C1)–(C7) and (R) for a problem whose times are in the program's unit.

    Returns: the PuLP model, the layer variables L (template after template) and, per stage (flat
    the same way), its options (n, mode index) and their binaries w — None where the stage has
    none."""
    model = pulp.LpProblem("split", pulp.LpMinimize)
    t_opt = pulp.LpVariable("T_opt", 0)
    flat, per_template, choices = [], [], []
    for j, pr in enumerate(problem.base.templates):
        tag = f"_t{j}"
        top = domain_top(pr)
        L = [pulp.LpVariable(f"L{tag}_{i}", 1, top[i], cat="Integer") for i in range(pr.depth)]
        add_layer_sum(model, pr, L, tag)
        one_hot = None
        if pr.tabulated or pr.mixed:  # (C2z), (C2r): the passes are read off per scenario below
            one_hot = add_layer_choice(model, problem, j, L, top, tag)
            yf = yb = None
        else:
            yf, yb = pass_variables(pr, tag)
            add_forward_pass(model, pr, L, yf, tag)
            add_backward_pass(model, pr, L, yb, top, tag)
        add_optimizer(model, pr, L, t_opt, tag, one_hot)
        if not pr.mixed and pr.rows is None:  # (C2r), (C2s): the memory is in the options
            add_memory(model, pr, L, tag)
        flat += L
        choices += (
            [(options, w) for options, w, _ in one_hot]
            if one_hot is not None
            else [None] * pr.depth
        )
        per_template.append((L, yf, yb, one_hot))
    if problem.lockstep:  # (C1t)
        for j, (L, *_) in enumerate(per_template[1:], start=1):
            for i, (mine, first) in enumerate(zip(L, per_template[0][0], strict=True)):
                model += mine == first, f"C1t_{j}_{i}"
    totals = []
    for s, sc in enumerate(problem.scenarios):  # one copy of the communication terms per scenario
        t_sync, t_end = pulp.LpVariable(f"T_sync_s{s}", 0), pulp.LpVariable(f"T_dp_s{s}", 0)
        model += t_end >= t_sync, f"C5_drain_s{s}"
        for j, (pr, (L, yf, yb, one_hot)) in enumerate(
            zip(sc.templates, per_template, strict=True)
        ):
            tag = f"_t{j}_s{s}"
            if one_hot is not None:
                yf, yb = pass_variables(pr, tag)
                add_tabulated_passes(model, one_hot, s, L, yf, yb, tag)
            tau_max = pulp.LpVariable(f"tau_max{tag}", 0)
            add_pipeline(model, pr, yf, yb, tau_max, t_sync, tag)
            add_gradient_allreduce(model, pr, L, yb, t_sync, t_end, tag, one_hot, s)
        totals.append(t_end + sc.cross_s + t_opt)
    add_objective(model, problem, totals)
    return model, flat, choices


def domain_top(pr) -> list[int]:
    """U_i: the most layers stage i can hold (memory, and one layer for each other stage)."""
    return [max(1, min(m, pr.layers - (pr.depth - 1))) for m in pr.max_layers()]


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
        tail = pulp.lpSum(p * us for p, us in zip(probs, u, strict=True))
        model += eta + tail / (1 - problem.alpha)


def add_layer_sum(model, pr, L, tag: str) -> None:  # (C1), (C1v)
    model += pulp.lpSum(L) == pr.layers, f"C1_layers{tag}"
    v = pr.virtual_stages
    if v > 1:  # interleaved: v model chunks of K_i layers each
        for i, layers in enumerate(L):
            k = pulp.LpVariable(f"K{tag}_{i}", 1, max(1, int(layers.upBound) // v), cat="Integer")
            model += layers == v * k, f"C1v_chunks{i}{tag}"


def _pieces(pr, i: int, kind: str):
    """(slope, intercept) of P^h = h + s·d and P^d = d + s·h of stage i's pass ("f" or "b")."""
    s = pr.serial[i]
    h, d = (pr.host_fwd[i], pr.dev_fwd[i]) if kind == "f" else (pr.host_bwd[i], pr.dev_bwd[i])
    return (
        (h.slope + s * d.slope, h.intercept + s * d.intercept),
        (d.slope + s * h.slope, d.intercept + s * h.intercept),
    )


def add_forward_pass(model, pr, L, yf, tag: str) -> None:  # (C2f)
    for i in range(pr.depth):
        for (a, b), piece in zip(_pieces(pr, i, "f"), ("host", "dev"), strict=True):
            model += yf[i] >= a * L[i] + b, f"C2f_{piece}{i}{tag}"


def add_backward_pass(model, pr, L, yb, top: list[int], tag: str) -> None:  # (C2b)
    for i in range(pr.depth):
        (ah, bh), (ad, bd) = _pieces(pr, i, "b")
        model += yb[i] >= ah * L[i] + bh, f"C2b_host{i}{tag}"
        model += yb[i] >= ad * L[i] + bd, f"C2b_dev{i}{tag}"
        # P^h − P^d at both ends of the domain: where it keeps its sign, that piece is y^b
        ends = [(ah - ad) * n + (bh - bd) for n in (1, top[i])]
        if min(ends) >= 0:
            model += yb[i] <= ah * L[i] + bh, f"C2b_exact_host{i}{tag}"
        elif max(ends) <= 0:
            model += yb[i] <= ad * L[i] + bd, f"C2b_exact_dev{i}{tag}"
        else:
            z = pulp.LpVariable(f"z{tag}_{i}", cat="Binary")
            big_h, big_d = -min(ends), max(ends)  # the most each piece lies below the other
            model += yb[i] <= ah * L[i] + bh + big_h * (1 - z), f"C2b_active_host{i}{tag}"
            model += yb[i] <= ad * L[i] + bd + big_d * z, f"C2b_active_dev{i}{tag}"


def pass_variables(pr, tag: str) -> tuple[list, list]:
    """y^f_i and y^b_i of every stage."""
    return (
        [pulp.LpVariable(f"yf{tag}_{i}", 0) for i in range(pr.depth)],
        [pulp.LpVariable(f"yb{tag}_{i}", 0) for i in range(pr.depth)],
    )


def add_layer_choice(
    model, problem: PlanProblem, j: int, L, top: list[int], tag: str
) -> list[tuple]:
    """(C2z), (C2r) per stage of template j: its options (layer count, mode index) and whether they
    take binaries w_{i,n,r} (which the stage holds) — per-stage recompute, stages with shards,
    tables not all convex, or an all-reduce after; returns [(options, [w] or None, each scenario's
    {"f": pass table, "b": …, with shards also "dp" and "hidden"; the first scenario's also
    "opt"})]."""
    pr = problem.base.templates[j]
    out = []
    for i in range(pr.depth):
        options = pr.options(i, top[i])
        counts = [n for n, _ in options]
        tables = [
            {kind: [sc.templates[j].pass_s(i, n, kind, r) for n, r in options] for kind in "fb"}
            for sc in problem.scenarios
        ]
        if pr.rows is not None:  # (C2s): the all-reduce, its overlap and the optimizer step too
            for sc, t in zip(problem.scenarios, tables, strict=True):
                t["dp"] = [sc.templates[j].dp_s(i, n) for n, _ in options]
                t["hidden"] = [sc.templates[j].hidden_s(i, n) for n, _ in options]
            tables[0]["opt"] = [pr.opt_s(i, n) for n, _ in options]
        # no option at all (memory holds fewer than v layers): the binaries' Σ = 1 makes it
        # infeasible
        chords = (
            bool(counts)
            and not pr.mixed
            and pr.rows is None
            and len(problem.base.templates) == 1
            and all(
                sc.templates[j].dp[i].slope == 0
                and sc.templates[j].dp[i].intercept == 0
                and convex(table)
                for sc, t in zip(problem.scenarios, tables, strict=True)
                for table in t.values()
            )
        )
        if chords:
            out.append((options, None, tables))
            continue
        w = [pulp.LpVariable(f"w{tag}_{i}_{n}_r{r}", cat="Binary") for n, r in options]
        model += pulp.lpSum(w) == 1, f"C2z_one{i}{tag}"
        model += (
            L[i] == pulp.lpSum(n * x for n, x in zip(counts, w, strict=True)),
            f"C2z_layers{i}{tag}",
        )
        out.append((options, w, tables))
    return out


def convex(values: list[float]) -> bool:
    """Whether each step of `values` (at neighbouring counts) is at least the one before, up to
    rounding."""
    steps = [b - a for a, b in itertools.pairwise(values)]
    scale = max(map(abs, values), default=0.0)
    return all(b >= a - 1e-12 * scale for a, b in itertools.pairwise(steps))


def add_tabulated_passes(model, one_hot, scenario: int, L, yf, yb, tag: str) -> None:  # (C2z)
    for i, (options, w, tables) in enumerate(one_hot):
        counts = [n for n, _ in options]
        for y, kind in ((yf, "f"), (yb, "b")):
            table = tables[scenario][kind]
            if w is not None:
                model += (
                    y[i] == pulp.lpSum(t * x for t, x in zip(table, w, strict=True)),
                    f"C2z_{kind}{i}{tag}",
                )
                continue
            # the least of the table: its only entry, or below every chord (a convex table may
            # fall first: ZeRO's exposed collectives shrink as a stage's layers grow)
            model += y[i] >= min(table), f"C2z_{kind}{i}_first{tag}"
            for k in range(len(counts) - 1):  # the chords of a convex table
                slope = (table[k + 1] - table[k]) / (counts[k + 1] - counts[k])
                model += y[i] >= table[k] + slope * (L[i] - counts[k]), f"C2z_{kind}{i}_{k}{tag}"


def add_pipeline(model, pr, yf, yb, tau_max, t_sync, tag: str) -> None:  # (C3), (C4)
    for i in range(pr.depth):
        model += tau_max >= yf[i] + yb[i] + pr.p2p[i], f"C3_bottleneck{i}{tag}"
    v = pr.virtual_stages  # interleaved: the fill-and-drain term divided by v (pricing.pipe_times)
    model += (
        t_sync
        >= (pr.micro_batches - 1 / v) * tau_max
        + (1 / v) * pulp.lpSum(yf[i] + yb[i] + pr.p2p[i] for i in range(pr.depth)),
        f"C4_pipeline{tag}",
    )


# (C5), (C2s)
def add_gradient_allreduce(
    model, pr, L, yb, t_sync, t_dp, tag: str, one_hot=None, scenario: int = 0
) -> None:
    chain = 0
    for i in range(pr.depth):
        send = 0.5 * pr.p2p[i] if i > 0 else 0.0
        # stages with shards: the all-reduce and its overlap read off the binaries
        if pr.rows is not None:
            _, w, tables = one_hot[i]
            allreduce = pulp.lpSum(t * x for t, x in zip(tables[scenario]["dp"], w, strict=True))
            hidden = pulp.lpSum(t * x for t, x in zip(tables[scenario]["hidden"], w, strict=True))
        else:
            allreduce = pr.dp[i].slope * L[i] + pr.dp[i].intercept
            hidden = pr.dp_overlap[i] * yb[i]
        model += t_dp >= t_sync - chain - send - hidden + allreduce, f"C5_dp{i}{tag}"
        chain = chain + yb[i] + send


def add_optimizer(model, pr, L, t_opt, tag: str, one_hot=None) -> None:  # (C6), (C2s)
    for i in range(pr.depth):
        if pr.rows is not None:
            _, w, tables = one_hot[i]
            model += (
                t_opt >= pulp.lpSum(t * x for t, x in zip(tables[0]["opt"], w, strict=True)),
                f"C6_opt{i}{tag}",
            )
            continue
        model += t_opt >= pr.opt[i].slope * L[i] + pr.opt[i].intercept, f"C6_opt{i}{tag}"


def add_memory(model, pr, L, tag: str) -> None:  # (C7)
    for i in range(pr.depth):
        mem = pr.mem_gib[i]
        model += mem.slope * L[i] + mem.intercept <= pr.mem_limit_gib[i], f"C7_memory{i}{tag}"


def solve(problem: PlanProblem, backend: str, options: SolveOptions) -> SplitSolution:
    """Solve one skeleton's split on CBC or HiGHS.

    Parameters: problem — the skeleton in seconds; backend — "cbc" or "highs"; options — time limit,
    seed, a split to start from, a path to export the model to (.mps, else LP format).
    Returns: the split with the evaluator's time, the solver's bound in seconds and the status the
    solver proved (module docstring)."""
    start = clock()
    model, L, choices = build(problem.scaled(UNIT_PER_S))
    if options.export_path:
        write = model.writeMPS if options.export_path.endswith(".mps") else model.writeLP
        with atomic_path(options.export_path) as temp:
            write(str(temp))
    hint = None
    if options.hint is not None and len(options.hint) == len(L):
        hint = {
            var: min(max(value, var.lowBound), var.upBound)
            for var, value in zip(L, options.hint, strict=True)
        }
    run = registry.get(backend).run(model, options, hint)
    wall = clock() - start
    if run.status == SolveStatus.INFEASIBLE:
        return SplitSolution(
            SolveStatus.INFEASIBLE, None, math.inf, math.inf, wall, backend, run.detail
        )
    bound_s = max(0.0, run.bound / UNIT_PER_S) if run.bound is not None else 0.0
    layers = _split(problem, L, run)
    if layers is None:
        status = SolveStatus.TIMEOUT if run.status == SolveStatus.TIMEOUT else SolveStatus.ERROR
        detail = (
            run.detail
            if run.value is None or status == SolveStatus.TIMEOUT
            else f"{run.detail}; the solution is not a split of the layers"
        )
        kept = bound_s if status == SolveStatus.TIMEOUT else 0.0
        return SplitSolution(status, None, math.inf, kept, wall, backend, detail)
    modes = _modes(problem, choices, run)
    if modes is None and any(pr.mixed for pr in problem.base.templates):
        return SplitSolution(
            SolveStatus.ERROR,
            None,
            math.inf,
            0.0,
            wall,
            backend,
            f"{run.detail}; the solution picks no single recompute mode for a stage",
        )
    objective_s = problem.iteration_time(layers, modes)
    bound_s = min(bound_s, objective_s)  # no split beats one that exists
    status, detail = run.status, run.detail
    if status == SolveStatus.OPTIMAL and objective_s - bound_s > REL_TOLERANCE * objective_s:
        status = SolveStatus.FEASIBLE
        gap = (objective_s - bound_s) / objective_s
        detail += (
            f"; the solver's bound {bound_s:.9g} s is {gap:.2e} below the evaluator's "
            f"{objective_s:.9g} s (more than {REL_TOLERANCE:g})"
        )
    model_s = run.objective / UNIT_PER_S if run.objective is not None else None
    extra = {"unit_per_s": UNIT_PER_S, "rel_tolerance": REL_TOLERANCE, "model_objective_s": model_s}
    return SplitSolution(
        status, layers, objective_s, bound_s, wall, backend, detail, extra, recompute=modes
    )


def _modes(problem: PlanProblem, choices: list, run) -> list[str] | None:
    """Each stage's recompute mode from its binaries (C2r), flat; None without per-stage recompute,
    or where a stage's binaries do not pick one option."""
    if not any(pr.mixed for pr in problem.base.templates):
        return None
    stages = [(pr, i) for pr in problem.base.templates for i in range(pr.depth)]
    modes = []
    for (pr, _), choice in zip(stages, choices, strict=True):
        if choice is None or choice[1] is None:
            return None
        picked = [r for (_, r), x in zip(*choice, strict=True) if (run.value(x) or 0.0) > 0.5]
        if len(picked) != 1:
            return None
        modes.append(pr.modes[picked[0]])
    return modes


def _split(problem: PlanProblem, L: list[pulp.LpVariable], run) -> list[int] | None:
    """The solver's layer counts, rounded, when they are a split of every template (else None)."""
    if run.value is None:
        return None
    values = [run.value(v) for v in L]
    if any(x is None for x in values):
        return None
    layers = [round(x) for x in values]
    start = 0
    for pr, top in ((pr, domain_top(pr)) for pr in problem.base.templates):
        part = layers[start : start + pr.depth]
        if sum(part) != pr.layers or any(not 1 <= n <= t for n, t in zip(part, top, strict=True)):
            return None
        start += pr.depth
    return layers


FORMULATION = Formulation(
    "split-milp",
    "layer split of a skeleton as a MILP (PuLP)",
    ("cbc", "highs"),
    solve,
    __doc__ or "",
)

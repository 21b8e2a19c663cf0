"""The cost objective: the plan of least dollars per token (`solve --objective cost`;
docs/planner.md, "Budgets and the Pareto front").

Dollars per token are P·T / tokens for a plan that rents P per hour and takes T per iteration. The
cheapest plan lies on the front of (P, T), which the budgeted search walks down exactly:

1. B₀ = ∞ (or `--max-usd-per-hour`); the search's fastest plan r under Bᵢ, with P_r and T_r.
2. Bᵢ₊₁ = P_r·(1 − 10⁻⁶): the next plan of the front is strictly cheaper.

Where step i is proven, every plan with P in (P_r, Bᵢ] takes T ≥ T_r, so costs more than r: the
step's region holds nothing cheaper per token than r. Every plan below Bᵢ₊₁ takes at least the
step's bound on T, and rents at least `least_rent` (a bound on any plan's rent): so once the best
cost so far is at most least_rent × bound_T, or a budget has no plan, no cheaper plan is left — the
best is proven optimal. An unproven step leaves its region open at least_rent × its bound on T; the
gap is then against the least of those.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace

from hetopt.evaluate import evaluate
from hetopt.planners import solve_ilp
from hetopt.search.budget import Budget, capped, check_prices, least_rent
from hetopt.search.formulation import SolveStatus
from hetopt.search.run import SearchResult
from hetopt.search.types import SearchOptions, SearchRequest, SearchStats

STEP = 1e-6
"""Relative: the next budget just below the last plan's dollars per hour."""


@dataclass
class CostResult:
    """The cheapest plan per token found, and what is proven about it."""

    result: SearchResult
    """The search's answer whose plan it is (its status and gap are the cost objective's)."""
    usd_per_million_tokens: float
    bound_usd_per_million_tokens: float
    steps: int
    """Budgeted searches run."""


def cheapest_per_token(
    request: SearchRequest,
    max_usd_per_hour: float | None = None,
    min_tokens_per_s: float | None = None,
    progress=None,
) -> CostResult:
    """Walk the front of (dollars per hour, time) down from the fastest plan (module docstring).

    Parameters: request — the instance, the space and the search's settings; its time_limit_s holds
    for the whole walk; max_usd_per_hour — the first budget (None: none); min_tokens_per_s — plans
    below it are no answer (the walk ends where a proven step falls below it); progress — each
    step's search's (hetopt.planners.solve_ilp).
    Returns: the CostResult (its result's plan None where no plan was found).
    Raises: InputError (exit 2) where some node has no price."""
    inst = request.inst
    check_prices(inst, "--objective cost")
    space = request.options or SearchOptions.from_instance(inst)
    tokens = inst.global_batch * inst.seq_len
    least, _ = least_rent(inst)
    deadline = time.time() + request.time_limit_s
    stats = SearchStats()
    best: tuple[float, SearchResult] | None = None
    lows: list[float] = []  # $/Mtok bounds of the regions left open
    budget, steps, proven = max_usd_per_hour, 0, True
    r = None
    while True:
        left_s = deadline - time.time()
        if left_s <= 0:
            proven = False
            break
        steps += 1
        searched = inst if budget is None else capped(inst, Budget.of(inst, budget))
        opts = space if budget is None else replace(space, max_usd_per_hour=budget)
        r = solve_ilp(
            replace(request, inst=searched, options=opts, time_limit_s=left_s, objective="stable"),
            progress,
        )
        stats.add(r.stats)
        done = r.status in (SolveStatus.OPTIMAL, SolveStatus.INFEASIBLE)
        bound_s = r.objective_s if r.status == SolveStatus.OPTIMAL else r.bound_s
        # every plan left (within this budget, cheaper than this step's) rents ≥ least and takes
        # ≥ bound_s: its dollars per token are at least this
        floor = per_million(least, bound_s, tokens) if math.isfinite(bound_s) else math.inf
        if r.plan is None:
            if not done:
                lows.append(floor)
                proven = False
            break
        ev = evaluate(inst, r.plan)
        slow = min_tokens_per_s is not None and ev.tokens_per_s < min_tokens_per_s * (1 - 1e-9)
        if not slow and (best is None or ev.usd_per_million_tokens < best[0]):
            best = (ev.usd_per_million_tokens, r)
        if not done:  # this step's region stays open at its bound
            lows.append(floor)
            proven = False
        if slow and done:
            break  # every cheaper plan is slower still
        if best is not None and best[0] <= floor * (1 + 1e-9):
            break  # nothing left can be cheaper per token
        budget = ev.usd_per_hour * (1 - STEP)
        if budget <= 0:
            break
    if best is None:
        empty = SearchResult(
            SolveStatus.INFEASIBLE if proven else SolveStatus.TIMEOUT,
            None,
            math.inf,
            math.inf,
            request.time_limit_s - max(0.0, deadline - time.time()),
            r.formulation if r is not None else "split-milp",
            r.backend if r is not None else request.backend,
            request.time_limit_s,
            request.seed,
            stats,
        )
        return CostResult(empty, math.inf, min(lows, default=math.inf), steps)
    cost, r = best
    final = SolveStatus.OPTIMAL if proven else SolveStatus.TIMEOUT
    bound = cost if proven else min([cost, *lows])
    answer = replace(
        r,
        status=final,
        stats=stats,
        solve_time_s=request.time_limit_s - max(0.0, deadline - time.time()),
        time_limit_s=request.time_limit_s,
    )
    return CostResult(answer, cost, bound, steps)


def per_million(usd_per_hour: float, iteration_time_s: float, tokens: float) -> float:
    """Dollars per million tokens of a plan renting `usd_per_hour` at this iteration time."""
    return usd_per_hour * iteration_time_s / 3600 / tokens * 1e6


def cheapest_plan(
    request: SearchRequest, above: float, deadline: float
) -> tuple[float, bool] | None:
    """The dollars per hour of the cheapest plan of the space, where a budget of `above` has none
    (the message of an infeasible budget): budgets doubled from `above` until one has a plan, then
    the front walked down (each next budget just below the last plan's dollars) until a budget has
    none.

    Returns: (its US$ per hour, whether proven the cheapest: the walk ended at a budget proven to
    have no plan), or None where no plan was found before `deadline` (a time.time())."""
    inst = request.inst
    space = request.options or SearchOptions.from_instance(inst)

    def fastest(budget: float | None):
        left_s = deadline - time.time()
        if left_s <= 1:
            return None
        searched = inst if budget is None else capped(inst, Budget.of(inst, budget))
        opts = replace(space, max_usd_per_hour=budget)
        return solve_ilp(
            replace(request, inst=searched, options=opts, time_limit_s=left_s, objective="stable")
        )

    everything = sum(n.usd_per_hour or 0.0 for n in inst.cluster.nodes.values())
    budget, r = max(above, 1e-6), None
    while r is None or r.plan is None:
        budget = min(2 * budget, everything)
        r = fastest(budget)
        if r is None or (r.plan is None and budget >= everything):
            return None
    usd = evaluate(inst, r.plan).usd_per_hour
    while True:
        r = fastest(usd * (1 - STEP))
        if r is None:
            return usd, False
        if r.plan is None:
            return usd, r.status == SolveStatus.INFEASIBLE
        usd = evaluate(inst, r.plan).usd_per_hour

"""`hetopt solve`: plan, verify the plan independently, replay it under every scenario (its JSON:
docs/cli-output.md)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from hetopt.baselines.exhaustive import COST, exhaustive
from hetopt.baselines.registry import PLANNERS as BASELINES
from hetopt.cheapest import CostResult, cheapest_per_token, cheapest_plan
from hetopt.cost.profiles import Profiles
from hetopt.errors import InputError, Problem, check_time_limit, did_you_mean
from hetopt.evaluate import evaluate
from hetopt.executors import check_executor
from hetopt.export.runnable import runnable_instance
from hetopt.placement import place
from hetopt.plan import Plan, PlannedFor, plan_json
from hetopt.planners import ALIASES, solve_ilp
from hetopt.search.budget import Budget, capped, check_prices, least_rent
from hetopt.search.formulation import SolveStatus, clock
from hetopt.search.robust import OBJECTIVES, plan_objective, planning_scenarios
from hetopt.search.run import SearchResult
from hetopt.search.types import Progress, SearchOptions, SearchRequest
from hetopt.simulate import simulate
from hetopt.spec.instance import Instance
from hetopt.verify import check_plan

HEURISTICS = ("megatron", "fastest-subset", "proportional", "amp-like", "metis-like", "random")
"""The baseline planners `solve` runs by name (hetopt.baselines): a plan, no proof."""
PLANNERS = ("ilp", "exhaustive", *HEURISTICS)

REPLAY_SHARE = 0.1
REPLAY_MOST_S = 10.0
"""Of `--time-limit`, what the search leaves for placing, verifying and replaying the plan: a tenth,
at most 10 s. The replay stops starting iterations when the limit is reached (hetopt.sim.engine)."""


def search_time_limit_s(time_limit_s: float) -> float:
    """The search's part of a command's time limit (REPLAY_SHARE)."""
    return time_limit_s - min(REPLAY_MOST_S, REPLAY_SHARE * time_limit_s)


def solve(
    request: SearchRequest,
    planner: str = "ilp",
    simulate_iterations: int | None = None,
    warm_start: bool = True,
    runnable: str | None = None,
    progress: Progress | None = None,
    replay_progress: Callable[[int, int], None] | None = None,
    max_usd_per_hour: float | None = None,
    min_tokens_per_s: float | None = None,
) -> dict[str, Any]:
    """Plan the instance, verify the plan and replay it under every scenario: `hetopt solve --json`.

    Parameters: request — the instance and how to search it (SearchRequest); its `time_limit_s`
    bounds the whole call: the search gets search_time_limit_s of it, the replay what is left (at
    least one iteration per scenario); planner — `ilp` (the exact search), `exhaustive`, or a
    heuristic of HEURISTICS (status `feasible`: a plan without a bound); simulate_iterations —
    iterations per scenario in the replay (default: the instance's horizon); warm_start — as
    hetopt.planners.solve_ilp takes it; runnable — megatron or deepspeed: search only the plans that
    launcher runs as they are (hetopt.export.runnable), then the free space with the other half of
    the search's time, for what the restriction costs; progress — progress(SearchProgress), on each
    new incumbent and solved skeleton; replay_progress — replay_progress(scenarios replayed,
    scenarios); max_usd_per_hour — a budget: only plans whose dollars per hour stay within it
    (hetopt.search.budget); min_tokens_per_s — a floor: a plan below it is no answer (the search's
    best is the fastest plan, so none is when it falls short).
    Returns: the solve JSON object of docs/cli-output.md (plus `executor`; with runnable,
    `runnable`: the launcher, the free space's status and objective, and the cost, objective ÷ free
    − 1).
    Raises: InputError for a bad planner, objective, time limit or executor."""
    planner = ALIASES.get(planner, planner)  # `hetopt`: bench's former name of the exact planner
    _check(planner, request)
    profiles = request.weights
    request = replace(request, profiles=profiles)
    free_inst, inst = request.inst, request.inst
    if runnable is not None:
        inst = runnable_instance(inst, runnable)
    deadline = time.time() + request.time_limit_s
    compare = runnable is not None and planner not in HEURISTICS and planner != "exhaustive"
    search_s = search_time_limit_s(request.time_limit_s) / (2 if compare else 1)
    space, searched = SearchOptions.from_instance(inst), inst
    if max_usd_per_hour is not None:
        # bad input (no prices, a bad number) before any work; the nodes no plan within the
        # budget can rent are left out of the search (hetopt.search.budget.capped)
        searched = capped(inst, Budget.of(inst, max_usd_per_hour))
        space = replace(space, max_usd_per_hour=max_usd_per_hour)
    if min_tokens_per_s is not None:
        check_floor(min_tokens_per_s)
    search = replace(request, inst=searched, time_limit_s=search_s, options=space)
    per_token = None
    if request.objective == COST and planner == "ilp":
        per_token = cheapest_per_token(
            replace(search, inst=inst), max_usd_per_hour, min_tokens_per_s, progress
        )
        result = per_token.result
    else:
        result = _plan(search, planner, warm_start, progress)
    result = _with_budget_reason(replace(search, inst=inst), result, max_usd_per_hour, deadline)
    if min_tokens_per_s is not None and request.objective != COST:
        result = throughput_floor(inst, result, min_tokens_per_s)
    free = None
    if compare:  # the free space, for what running the plan as it is costs
        free = solve_ilp(
            replace(search, inst=free_inst, options=None, export_model=None), warm_start=warm_start
        )
    result = replace(result, time_limit_s=request.time_limit_s)
    out = report(
        inst,
        planner,
        result,
        request.objective,
        simulate_iterations,
        profiles,
        deadline,
        replay_progress,
    )
    if runnable is not None:
        out["runnable"] = _runnable_cost(runnable, result, free)
    if request.objective == COST:
        _cost_fields(out, result, per_token)
    return out


def _cost_fields(out: dict[str, Any], result: SearchResult, per_token: CostResult | None) -> None:
    """The cost objective's figures in the solve JSON: `objective_s` stays the plan's iteration
    time; the proof is in dollars per million tokens (`bound_s` null: no bound on time is
    proven)."""
    cost = out["usd_per_million_tokens"]
    if per_token is not None:
        bound = per_token.bound_usd_per_million_tokens
    else:  # exhaustive enumeration: its plan is the optimum
        bound = cost if result.status == SolveStatus.OPTIMAL else None
    out["bound_s"] = None
    out["objective_usd_per_million_tokens"] = cost
    out["bound_usd_per_million_tokens"] = (
        bound if bound is not None and math.isfinite(bound) else None
    )
    out["gap"] = (
        (cost - bound) / cost if cost and bound is not None and math.isfinite(bound) else None
    )


def check_floor(min_tokens_per_s: float) -> None:
    if not (math.isfinite(min_tokens_per_s) and min_tokens_per_s > 0):
        raise InputError(
            "--min-tokens-per-s",
            [
                Problem(
                    "--min-tokens-per-s", "give tokens per second, above 0", min_tokens_per_s, True
                )
            ],
        )


def throughput_floor(inst: Instance, r: SearchResult, min_tokens_per_s: float) -> SearchResult:
    """The answer under a throughput floor: the search minimises time, so its plan is the fastest
    of the space (proven, or the best found); below the floor it is no answer, and where the bound
    is below the floor's time too, nothing is proven (status timeout, no plan)."""
    if r.plan is None:
        return r
    tokens = inst.global_batch * inst.seq_len
    most_s = tokens / min_tokens_per_s  # the slowest iteration the floor allows
    if r.objective_s <= most_s * (1 + 1e-9):
        return r
    best = f"{tokens / r.objective_s:,.0f} tokens/s ({r.objective_s:.4g} s per iteration)"
    if r.status == SolveStatus.OPTIMAL or r.bound_s > most_s:
        why = (
            "the fastest plan of the space trains"
            if r.status == SolveStatus.OPTIMAL
            else (
                "no plan can: the proven bound allows at most "
                f"{tokens / r.bound_s:,.0f} tokens/s; the best plan found trains"
            )
        )
        return replace(
            r,
            status=SolveStatus.INFEASIBLE,
            plan=None,
            reason=f"--min-tokens-per-s {min_tokens_per_s:g}: {why} {best}",
        )
    return replace(
        r,
        status=SolveStatus.TIMEOUT,
        plan=None,
        reason=(
            f"--min-tokens-per-s {min_tokens_per_s:g}: the best plan found trains {best}; a faster "
            f"one is not ruled out (bound {r.bound_s:.4g} s): give the search more time"
        ),
    )


def _with_budget_reason(
    request: SearchRequest, r: SearchResult, max_usd_per_hour: float | None, deadline: float
) -> SearchResult:
    """Under a budget with no plan found: say that the budget binds, with the cheapest plan's
    dollars (found in the command's time left: hetopt.cheapest.cheapest_plan), else a lower bound
    on any plan's rent."""
    if max_usd_per_hour is None or r.plan is not None:
        return r
    over = f"no plan of the space costs at most ${max_usd_per_hour:,.2f}/h (--max-usd-per-hour)"
    if r.status != SolveStatus.INFEASIBLE:
        over = f"no plan found within ${max_usd_per_hour:,.2f}/h (--max-usd-per-hour) in time"
    cheapest = cheapest_plan(request, max_usd_per_hour, deadline - 1.0)
    if cheapest is not None:
        usd, proven = cheapest
        which = "the cheapest plan" if proven else "the cheapest plan found"
        text = f"{over}; {which} costs ${usd:,.2f}/h"
    else:
        text = f"{over}; any plan that holds the model rents {least_rent(request.inst)[1]}"
    # the search's own diagnosis (memory) saw only the nodes the budget leaves: not the reason
    return replace(r, reason=text)


def _check(planner: str, request: SearchRequest) -> None:
    """Bad input before any work: an unknown planner or objective, a time limit that is no number
    of seconds, an unknown executor (InputError, exit 2)."""
    if planner not in PLANNERS:
        raise InputError(
            "--planner",
            [
                Problem(
                    "--planner",
                    f"unknown planner{did_you_mean(planner, PLANNERS)}; available: "
                    f"{', '.join(PLANNERS)}",
                    planner,
                    True,
                )
            ],
        )
    if request.objective == COST:
        if planner not in ("ilp", "exhaustive"):
            raise InputError(
                "--objective",
                [
                    Problem(
                        "--objective",
                        "cost is searched by --planner ilp or exhaustive: a heuristic's plan is "
                        "priced in dollars in every answer anyway",
                        planner,
                        True,
                    )
                ],
            )
        check_prices(request.inst, "--objective cost")
    elif request.objective not in OBJECTIVES:
        hint = did_you_mean(request.objective, (*OBJECTIVES, COST))
        raise InputError(
            "--objective",
            [
                Problem(
                    "--objective",
                    f"unknown objective{hint}; choose one of {', '.join((*OBJECTIVES, COST))}",
                    request.objective,
                    True,
                )
            ],
        )
    check_time_limit(request.time_limit_s)
    check_executor(request.executor, request.address)


def _plan(
    request: SearchRequest, planner: str, warm_start: bool, progress: Progress | None
) -> SearchResult:
    """The chosen planner's answer: the exact search, exhaustive enumeration or a heuristic."""
    if planner == "exhaustive":
        start = clock()
        ex = exhaustive(request.inst, request.options, request.weights, objective=request.objective)
        status = SolveStatus.OPTIMAL if ex.plan is not None else SolveStatus.INFEASIBLE
        return SearchResult(
            status,
            ex.plan,
            ex.objective_s,
            ex.objective_s,
            clock() - start,
            "enumeration",
            "none",
            request.time_limit_s,
            request.seed,
            ex.stats,
        )
    if planner in HEURISTICS:
        return run_heuristic(
            request.inst,
            planner,
            request.time_limit_s,
            request.seed,
            request.weights,
            request.objective,
        )
    return solve_ilp(request, progress, warm_start)


def _runnable_cost(
    launcher: str, result: SearchResult, free: SearchResult | None
) -> dict[str, Any]:
    """What keeping to the launcher's plans costs: the free space's best against the runnable plan.
    The runnable plan is a point of the free space, so the free space's best is never worse than it
    (a free search stopped by the time limit may not have reached it: the runnable plan stands
    in)."""
    mine = result.objective_s if result.plan is not None else math.inf
    if free is None:
        return {"launcher": launcher, "free_status": None, "free_objective_s": None, "cost": None}
    best = min(free.objective_s, mine)
    return {
        "launcher": launcher,
        "free_status": free.status.value,
        "free_objective_s": best if math.isfinite(best) else None,
        "cost": mine / best - 1 if math.isfinite(mine) and math.isfinite(best) else None,
    }


def run_heuristic(
    inst: Instance, planner: str, time_limit_s: float, seed: int, profiles: Profiles, objective: str
) -> SearchResult:
    """A baseline planner's plan as a search result: `feasible` with its objective and no bound
    (nothing is proven), or `infeasible` with the planner's reason when it found no plan that
    fits."""
    found = BASELINES[planner](inst, time_limit_s, profiles, seed)
    if found.plan is None:
        return SearchResult(
            SolveStatus.INFEASIBLE,
            None,
            math.inf,
            math.nan,
            found.search_time_s,
            "heuristic",
            "none",
            time_limit_s,
            seed,
            reason=f"{planner} found no plan that fits{': ' + found.note if found.note else ''}",
        )
    value = plan_objective(
        inst, found.plan, profiles, planning_scenarios(inst, objective), objective
    )
    return SearchResult(
        SolveStatus.FEASIBLE,
        found.plan,
        value,
        math.nan,
        found.search_time_s,
        "heuristic",
        "none",
        time_limit_s,
        seed,
    )


def finished_plan(inst: Instance, plan: Plan) -> Plan:
    """A planner's plan as `solve` hands it out: placed on the cluster, with the instance it was
    planned for, and passed by the independent verifier (a failure there is a planner bug:
    AssertionError)."""
    plan = place(plan, inst.cluster).model_copy(
        update={"instance": PlannedFor(name=inst.name, **inst.fingerprint())}
    )
    problems = check_plan(inst, plan)
    if problems:
        raise AssertionError(f"the verifier rejected the planner's plan: {problems}")
    return plan


def report(
    inst: Instance,
    planner: str,
    r: SearchResult,
    objective: str,
    iterations: int | None,
    profiles: Profiles,
    deadline: float | None = None,
    replay_progress: Callable[[int, int], None] | None = None,
    runnable: str | None = None,
) -> dict[str, Any]:
    out: dict[str, Any] = {
        "status": r.status.value,
        "objective_s": r.objective_s if math.isfinite(r.objective_s) else None,
        "bound_s": r.bound_s if math.isfinite(r.bound_s) else None,
        "gap": r.gap if math.isfinite(r.gap) else None,
        "solve_time_s": r.solve_time_s,
        "planner": planner,
        "formulation": r.formulation,
        "backend": r.backend,
        "objective": objective,
        "time_limit_s": r.time_limit_s,
        "seed": r.seed,
        "executor": r.executor,
        "usd_per_hour": None,
        "usd_per_million_tokens": None,
        "plan": None,
        "predicted": None,
        "verified": None,
        "search": r.stats.to_json(),
    }
    if r.reason:
        out["reason"] = r.reason
    if r.warm_start is not None:
        out["warm_start"] = {k: v for k, v in r.warm_start.items() if k != "plan"}
    if r.plan is None:
        return out

    plan = finished_plan(inst, r.plan)
    predicted = evaluate(inst, plan, profiles)
    if not predicted.fits:
        raise AssertionError("the planner returned a plan that does not fit in memory")
    out["plan"] = plan_json(plan)
    out["predicted"] = predicted.to_json()
    out["usd_per_hour"] = predicted.usd_per_hour
    out["usd_per_million_tokens"] = predicted.usd_per_million_tokens
    out["verified"], _ = simulate(
        inst, plan, "all", iterations, profiles, deadline=deadline, progress=replay_progress
    )
    return out

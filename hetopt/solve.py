"""`hetopt solve`: plan, verify the plan independently, replay it under every scenario (its JSON:
docs/cli-output.md)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from hetopt.baselines.exhaustive import exhaustive
from hetopt.baselines.registry import PLANNERS as BASELINES
from hetopt.cost.profiles import Profiles
from hetopt.errors import InputError, Problem, check_time_limit, did_you_mean
from hetopt.evaluate import evaluate
from hetopt.executors import check_executor
from hetopt.export.runnable import runnable_instance
from hetopt.placement import place
from hetopt.plan import Plan, PlannedFor, plan_json
from hetopt.planners import ALIASES, solve_ilp
from hetopt.search.formulation import SolveStatus, clock
from hetopt.search.robust import OBJECTIVES, plan_objective, planning_scenarios
from hetopt.search.run import SearchResult
from hetopt.search.types import SearchOptions, SearchRequest
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
    inst: Instance,
    planner: str = "ilp",
    formulation: str | None = None,
    backend: str = "highs",
    time_limit_s: float = 60.0,
    objective: str = "stable",
    seed: int = 0,
    export_model: str | None = None,
    simulate_iterations: int | None = None,
    profiles: Profiles | None = None,
    progress=None,
    warm_start: bool = True,
    executor: str = "process",
    address: str | None = None,
    replay_progress: Callable[[int, int], None] | None = None,
    runnable: str | None = None,
) -> dict[str, Any]:
    """Plan the instance, verify the plan and replay it under every scenario: `hetopt solve --json`.

    Parameters: inst — the instance; planner — `ilp` (the exact search), `exhaustive`, or a
    heuristic of HEURISTICS (status `feasible`: a plan without a bound); formulation, backend,
    time_limit_s, objective, seed, export_model, warm_start — as solve_exact takes them;
    simulate_iterations — iterations per scenario in the replay (default: the instance's horizon);
    profiles — calibrated weights; progress — progress(skeletons solved, incumbent s); executor,
    address — where the search solves skeletons side by side (`process` or `ray`,
    hetopt/executors.py);
    replay_progress — replay_progress(scenarios replayed, scenarios); runnable — megatron or
    deepspeed: search only the plans that launcher runs as they are (hetopt.export.runnable), then
    the free space with the other half of the search's time, for what the restriction costs. The
    whole call keeps to time_limit_s: the search gets search_time_limit_s of it, the replay what is
    left (at least one iteration per scenario).
    Returns: the solve JSON object of docs/cli-output.md (plus `executor`; with runnable,
    `runnable`: the launcher, the free space's status and objective, and the cost, objective ÷ free
    − 1).
    Raises: InputError for a bad planner, objective, time limit or executor."""
    planner = ALIASES.get(planner, planner)  # `hetopt`: bench's former name of the exact planner
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
    if objective not in OBJECTIVES:
        hint = did_you_mean(objective, OBJECTIVES)
        raise InputError(
            "--objective",
            [
                Problem(
                    "--objective",
                    f"unknown objective{hint}; choose one of {', '.join(OBJECTIVES)}",
                    objective,
                    True,
                )
            ],
        )
    check_time_limit(time_limit_s)
    executor = check_executor(executor, address)
    profiles = profiles or Profiles()
    free_inst = inst
    if runnable is not None:
        inst = runnable_instance(inst, runnable)
    options = SearchOptions.from_instance(inst)
    deadline = time.time() + time_limit_s
    compare = runnable is not None and planner not in HEURISTICS and planner != "exhaustive"
    search_s = search_time_limit_s(time_limit_s) / (2 if compare else 1)
    start = clock()
    if planner == "exhaustive":
        ex = exhaustive(inst, options, profiles, objective=objective)
        status = SolveStatus.OPTIMAL if ex.plan is not None else SolveStatus.INFEASIBLE
        result = SearchResult(
            status,
            ex.plan,
            ex.objective_s,
            ex.objective_s,
            clock() - start,
            "enumeration",
            "none",
            time_limit_s,
            seed,
            ex.stats,
        )
    elif planner in HEURISTICS:
        result = run_heuristic(inst, planner, search_s, seed, profiles, objective)
    else:
        request = SearchRequest(
            inst,
            formulation,
            backend,
            search_s,
            seed,
            options,
            profiles,
            objective,
            executor=executor,
            address=address,
            export_model=export_model,
        )
        result = solve_ilp(request, progress, warm_start)
    free = None
    if compare:  # the free space, for what running the plan as it is costs
        request = SearchRequest(
            free_inst,
            formulation,
            backend,
            search_s,
            seed,
            None,
            profiles,
            objective,
            executor=executor,
            address=address,
        )
        free = solve_ilp(request, warm_start=warm_start)
    result = replace(result, time_limit_s=time_limit_s)
    out = report(
        inst, planner, result, objective, simulate_iterations, profiles, deadline, replay_progress
    )
    if runnable is not None:
        out["runnable"] = _runnable_cost(runnable, result, free)
    return out


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
    out["verified"], _ = simulate(
        inst, plan, "all", iterations, profiles, deadline=deadline, progress=replay_progress
    )
    return out

"""Every planner by name, and the exact planner as the commands run it.

The exact planner (`ilp`) starts from the best plan of cheap heuristics: their plans are its first
incumbent, so its bound prunes from the start and its answer is never worse than theirs. The
heuristics live in hetopt.baselines, the search in hetopt.search; this module, above both, joins
them. `solve`, `bench` and `replan` plan through it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import replace

from hetopt.baselines.common import PlannerResult
from hetopt.baselines.data_parallel import data_parallel
from hetopt.baselines.registry import PLANNERS as BASELINES
from hetopt.baselines.shares import shares
from hetopt.cost.profiles import Profiles
from hetopt.search.formulation import clock
from hetopt.search.orchestrate import solve_exact
from hetopt.search.robust import plan_objective, planning_scenarios
from hetopt.search.run import SearchResult
from hetopt.search.types import Progress, SearchRequest, Seed
from hetopt.spec.instance import Instance

EXACT = "ilp"
"""The exact planner's name, in `bench` as in `solve --planner`."""
ALIASES = {"hetopt": EXACT}
"""Names `--planners` still takes: `hetopt` named the exact planner in bench results before
2026-12."""

WARM_START_PLANNERS: dict[str, Callable[..., PlannerResult]] = {
    "data-parallel": data_parallel,
    "shares": shares,
    "amp-like": BASELINES["amp-like"],
    "proportional": BASELINES["proportional"],
}
"""Cheap heuristics whose best plan starts the search, so the answer is never worse than theirs:
the plans a user writes first (pure data parallelism and shallow pipelines over each island, GPU
type and the fastest GPUs), data parallelism per class with the micro-batches shared out by a small
integer program where the batch does not divide, uniform layouts over every GPU with a
heterogeneity-aware split, and pipelines cut in proportion to speed. Every plan they keep is a
point of the space (baselines.common.Candidates). `megatron`'s plans are among amp-like's
candidates (the same layouts, even split)."""
WARM_SHARE = 0.05
"""The share of the time limit each warm-start heuristic gets on average, at most WARM_MOST_S."""
WARM_MOST_S = 0.75
"""The most seconds a warm-start heuristic gets on average, whatever the limit: the first incumbent
comes within seconds, and a long search proves more than a longer heuristic finds (at 4,096 GPUs
three heuristics at 5% each took 11.5 s of a 120 s limit for a plan 1.7% off the optimum). On the
stress suite (benchmarks/stress, 2026-12-06) the four at 0.75 s each find the plan they find at
1.5 s on all but a few instances, `data-parallel` the one that gains most from more."""
WARM_ORDER = {"proportional": 1.0, "amp-like": 1.0, "shares": 1.5, "data-parallel": 2.5}
"""The order the warm starts run in, and each one's weight in the budget: the ones that often end
early first, so that what they leave goes to the later ones; `data-parallel` last and with most, as
it gains most from more time (stress suite, the planner alone: wan5-03 15.62 s at 1.5 s against
17.69 s at 0.75 s; scale1024-halls-00 3.57 s at 0.75 s against 3.90 s at 0.5 s)."""
POLISH_SHARE = 0.5
"""The seconds the search climbs from the heuristics' plans to better ones near them
(hetopt.search.polish), as a share of the heuristics' own budget: 1.5 s by default."""


def heuristic_seeds(
    inst: Instance, profiles: Profiles, objective: str, budget_s: float
) -> list[Seed]:
    """The plans of WARM_START_PLANNERS, each priced under the objective, in the planners' order
    (the first is kept on a tie), then each one's runners-up (`PlannerResult.runners_up`, for the
    polish to climb from); none where a heuristic finds no plan that fits. `budget_s` is
    each planner's on average: they run in WARM_ORDER, each with its weight's part of what is left
    of all of theirs."""
    scenarios = planning_scenarios(inst, objective)
    found_by: dict[str, Seed] = {}
    runners: dict[str, list[Seed]] = {}
    deadline = clock() + budget_s * len(WARM_ORDER)
    weight_left = sum(WARM_ORDER.values())
    for name, weight in WARM_ORDER.items():
        share_s = max(0.0, deadline - clock()) * weight / weight_left
        weight_left -= weight
        found = WARM_START_PLANNERS[name](inst, share_s, profiles)
        if found.plan is not None:
            value = plan_objective(inst, found.plan, profiles, scenarios, objective)
            found_by[name] = Seed(name, value, found.plan)
            runners[name] = [
                Seed(name, plan_objective(inst, plan, profiles, scenarios, objective), plan)
                for _, plan in found.runners_up
                if clock() < deadline  # priced within the heuristics' budget only
            ]
    # each planner's best first (the first is kept on a tie), then the runners-up
    return [found_by[name] for name in WARM_START_PLANNERS if name in found_by] + [
        seed for name in WARM_START_PLANNERS for seed in runners.get(name, [])
    ]


def solve_ilp(
    request: SearchRequest,
    progress: Progress | None = None,
    warm_start: bool = True,
    known: Sequence[Seed] = (),
) -> SearchResult:
    """The exact search of hetopt.search.orchestrate.solve_exact, started from heuristic plans.

    Parameters: request — what to search (its time limit holds for the heuristics and the search
    together); progress — progress(SearchProgress), on each new incumbent and solved skeleton;
    warm_start — start from the heuristics' best plan and search the default subspace first
    (SearchRequest.narrow_first); False: the search alone; known — plans known already (`hetopt
    replan`: the running plan re-split).
    Returns: the search's result, its solve time counted from the heuristics' start.
    """
    start = clock()
    seeds = list(known)
    if warm_start:
        budget_s = min(WARM_SHARE * request.time_limit_s, WARM_MOST_S)
        seeds += heuristic_seeds(request.inst, request.weights, request.objective, budget_s)
        request = replace(request, polish_s=POLISH_SHARE * budget_s * len(WARM_ORDER))
    else:
        request = replace(request, narrow_first=False)
    left_s = max(0.0, request.time_limit_s - (clock() - start))
    result = solve_exact(replace(request, time_limit_s=left_s), seeds, progress)
    return replace(result, solve_time_s=clock() - start, time_limit_s=request.time_limit_s)


def run_ilp(
    inst: Instance,
    time_limit_s: float = 60.0,
    profiles: Profiles | None = None,
    seed: int = 0,
    objective: str = "stable",
) -> PlannerResult:
    """The exact planner with the baselines' signature (`bench`)."""
    r = solve_ilp(
        SearchRequest(
            inst, time_limit_s=time_limit_s, seed=seed, profiles=profiles, objective=objective
        )
    )
    status = (
        r.status.value
        if r.plan is not None
        else ("timeout" if r.status.value == "timeout" else "infeasible")
    )
    # its warm starts are points of the instance's space (`Candidates`), so a plan it keeps is one
    # too
    name = EXACT if objective == "stable" else f"{EXACT}-{objective}"
    return PlannerResult(
        name,
        r.plan,
        r.objective_s,
        r.solve_time_s,
        status,
        r.gap if math.isfinite(r.gap) else None,
        r.stats.solved,
        r.reason,
        {"skeletons_enumerated": r.stats.enumerated},
    )


PLANNERS: dict[str, Callable[..., PlannerResult]] = {EXACT: run_ilp, **BASELINES}
"""`ilp` is the exact planner (`hetopt solve`); the others are the baselines and exhaustive
enumeration (hetopt.baselines.registry)."""

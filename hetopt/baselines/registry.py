"""Every planner by name, with one signature: (instance, time limit, profiles, seed) →
PlannerResult."""

from __future__ import annotations

import math
from collections.abc import Callable

from hetopt.baselines.common import PlannerResult
from hetopt.baselines.metis import metis_like
from hetopt.baselines.proportional import proportional
from hetopt.baselines.random_search import random_search
from hetopt.baselines.uniform import amp_like, fastest_subset, megatron
from hetopt.cost.profiles import Profiles
from hetopt.errors import InputError
from hetopt.search.formulation import clock
from hetopt.spec.instance import Instance


def run_hetopt(
    inst: Instance,
    time_limit_s: float = 60.0,
    profiles: Profiles | None = None,
    seed: int = 0,
    objective: str = "stable",
) -> PlannerResult:
    from hetopt.search.orchestrate import solve_exact

    r = solve_exact(
        inst, time_limit_s=time_limit_s, seed=seed, profiles=profiles, objective=objective
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


def run_exhaustive(
    inst: Instance, time_limit_s: float = 60.0, profiles: Profiles | None = None, seed: int = 0
) -> PlannerResult:
    from hetopt.baselines.exhaustive import exhaustive

    start = clock()
    try:
        ex = exhaustive(
            inst, profiles=profiles, workers=1
        )  # one process, as every planner of a sweep
    except InputError as exc:  # over its budget: refused, which the bench reports as such
        return PlannerResult(
            "exhaustive", None, math.inf, clock() - start, "refused", note=exc.problems[0].message
        )
    status = "optimal" if ex.plan is not None else "infeasible"
    return PlannerResult(
        "exhaustive",
        ex.plan,
        ex.objective_s,
        clock() - start,
        status,
        0.0 if ex.plan is not None else None,
        ex.plans_evaluated,
    )


EXACT = "ilp"
"""The exact planner's name, in `bench` as in `solve --planner`."""
ALIASES = {"hetopt": EXACT}
"""Names `--planners` still takes: `hetopt` named the exact planner in bench results before
2026-12."""

PLANNERS: dict[str, Callable[..., PlannerResult]] = {
    EXACT: run_hetopt,
    "megatron": megatron,
    "fastest-subset": fastest_subset,
    "proportional": proportional,
    "amp-like": amp_like,
    "metis-like": metis_like,
    "random": random_search,
    "exhaustive": run_exhaustive,
}
"""`ilp` is the exact planner (`hetopt solve`); the others are the baselines of DESIGN 7."""

"""The baseline planners by name, with one signature: (instance, time limit, profiles, seed) →
PlannerResult."""

from __future__ import annotations

import math
from collections.abc import Callable

from hetopt.baselines.common import PlannerResult
from hetopt.baselines.exhaustive import exhaustive
from hetopt.baselines.metis import metis_like
from hetopt.baselines.proportional import proportional
from hetopt.baselines.random_search import random_search
from hetopt.baselines.uniform import amp_like, fastest_subset, megatron
from hetopt.cost.profiles import Profiles
from hetopt.errors import InputError
from hetopt.search.formulation import clock
from hetopt.spec.instance import Instance


def run_exhaustive(
    inst: Instance, time_limit_s: float = 60.0, profiles: Profiles | None = None, seed: int = 0
) -> PlannerResult:
    start = clock()
    try:
        # one process, as every planner of a sweep
        ex = exhaustive(inst, profiles=profiles, workers=1)
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


PLANNERS: dict[str, Callable[..., PlannerResult]] = {
    "megatron": megatron,
    "fastest-subset": fastest_subset,
    "proportional": proportional,
    "amp-like": amp_like,
    "metis-like": metis_like,
    "random": random_search,
    "exhaustive": run_exhaustive,
}
"""The baselines, and exhaustive enumeration (small instances: the ground truth the exact planner
must match); hetopt.planners adds the exact planner."""

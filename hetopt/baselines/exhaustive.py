"""The exhaustive planner: every plan of the plan space, timed by the evaluator — the ground truth the
exact planner must match on small instances.

It shares the plan space (hetopt.search.space) but nothing of the search: no bounds, no linearisation,
no integer programs. Every skeleton is placed; every split of the layers into the stages of each of its
templates (each ≥ 1) — and, with per-stage recompute, every assignment of modes to its stages — is built as a
plan and priced by the evaluator's own features; plans that do not fit are skipped.
Refused beyond `budget` plans, with a message saying how many it would take.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

from hetopt.cost.profiles import Profiles
from hetopt.errors import InfeasibleError, InputError, Problem
from hetopt.evaluate import plan_features, price
from hetopt.plan import Plan
from hetopt.search.robust import aggregate, planning_scenarios
from hetopt.search.space import SearchOptions, SearchStats, enumerate_skeletons
from hetopt.spec.instance import Instance

DEFAULT_BUDGET = 200_000


@dataclass
class ExhaustiveResult:
    plan: Plan | None
    objective_s: float
    plans_evaluated: int
    stats: SearchStats


def compositions(total: int, parts: int):
    """All ways to write `total` as an ordered sum of `parts` positive integers."""
    for cuts in itertools.combinations(range(1, total), parts - 1):
        yield [b - a for a, b in zip((0, *cuts), (*cuts, total), strict=True)]


def exhaustive(inst: Instance, options: SearchOptions | None = None, profiles: Profiles | None = None,
               budget: int = DEFAULT_BUDGET, objective: str = "stable") -> ExhaustiveResult:
    options = options or SearchOptions.from_instance(inst)
    scenarios = planning_scenarios(inst, objective)
    probabilities = [sc.probability for sc in scenarios]
    profiles = profiles or Profiles()
    stats = SearchStats()
    skeletons, size = [], 0
    for sk in enumerate_skeletons(inst, options, stats):
        skeletons.append(sk)
        size += math.prod(math.comb(inst.model.layers - 1, d - 1) for d in sk.depths) \
            * max(1, len(sk.modes)) ** sk.depth
        if size > budget:  # counting the rest would take as long as the refusal saves
            raise InputError("--planner exhaustive", [Problem(
                "planner", f"the plan space has more than {budget:,} plans (the exhaustive budget) — "
                           f"{size:,} in its first {len(skeletons):,} skeletons alone; use --planner ilp, or "
                           f"narrow the instance's search section", size, True)])
    best, best_t, evaluated = None, math.inf, 0
    for sk in skeletons:
        try:
            placement = sk.placed([1] * sk.depth, inst.cluster).placement
        except InfeasibleError:
            stats.pruned["placement"] += 1
            continue
        mixes = list(itertools.product(sk.modes, repeat=sk.depth)) if sk.modes else [None]
        for split in itertools.product(*(compositions(inst.model.layers, d) for d in sk.depths)):
            layers = [n for t in split for n in t]
            if any(n % sk.virtual_stages for n in layers):
                continue  # interleaved: every stage holds whole model chunks
            for modes in mixes:
                plan = sk.plan(layers, modes).model_copy(update={"placement": placement})
                evs = [price(inst, plan, plan_features(inst, plan, sc.cluster), profiles) for sc in scenarios]
                evaluated += 1
                t = aggregate([ev.iteration_time_s for ev in evs], probabilities, objective)
                if evs[0].fits and t < best_t:
                    best, best_t = plan, t
    stats.solved = evaluated
    return ExhaustiveResult(best, best_t, evaluated, stats)

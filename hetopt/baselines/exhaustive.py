"""The exhaustive planner: every plan of the plan space, timed by the evaluator — the ground truth
the exact planner must match on small instances.

It shares the plan space (hetopt.search.space) but nothing of the search: no bounds, no
linearisation, no integer programs. Every skeleton is placed; every split of the layers into the
stages of each of its templates (each ≥ 1; one for all of them in lockstep) — and, with per-stage
recompute, every assignment of modes to its stages — is built as a plan and priced by the
evaluator's own features; plans that do not fit are skipped. Refused beyond `budget` plans, with a
message saying how many it would take.
"""

from __future__ import annotations

import itertools
import math
import multiprocessing
import os
from dataclasses import dataclass

from hetopt.cost.dollars import plan_cost
from hetopt.cost.profiles import Profiles
from hetopt.errors import InfeasibleError, InputError, Problem
from hetopt.evaluate import plan_features, price
from hetopt.lifeline import worker_pool
from hetopt.plan import Plan
from hetopt.search.budget import Budget
from hetopt.search.robust import aggregate, planning_scenarios, pricing
from hetopt.search.roots import enumerate_skeletons
from hetopt.search.types import SearchOptions, SearchStats
from hetopt.spec.instance import Instance

DEFAULT_BUDGET = 200_000
COST = "cost"
"""The objective of dollars per token (`solve --objective cost`)."""


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


def exhaustive(
    inst: Instance,
    options: SearchOptions | None = None,
    profiles: Profiles | None = None,
    budget: int = DEFAULT_BUDGET,
    objective: str = "stable",
    workers: int | None = None,
) -> ExhaustiveResult:
    """Every plan of the space priced by the evaluator; the best that fits.

    Parameters: inst — the instance; options — the plan space (default: the instance's search
    section);
    profiles — calibrated weights; budget — refuse spaces of more plans than this; objective — one
    of hetopt.search.robust.OBJECTIVES; workers — processes to price in (default: up to 4 from
    PARALLEL_FROM_PRICINGS on, else 1).
    Returns: the best plan (None if none fits), its objective, and how many plans were priced.
    Raises: InputError when the space exceeds the budget."""
    if objective == COST:  # dollars per token, on the stable network
        found = exhaustive_objectives(inst, ("stable",), options, profiles, budget, workers, True)
        return found["stable"]
    return exhaustive_objectives(inst, (objective,), options, profiles, budget, workers)[objective]


def exhaustive_objectives(
    inst: Instance,
    objectives: tuple[str, ...],
    options: SearchOptions | None = None,
    profiles: Profiles | None = None,
    budget: int = DEFAULT_BUDGET,
    workers: int | None = None,
    per_token: bool = False,
) -> dict[str, ExhaustiveResult]:
    """`exhaustive` for several objectives that price the same planning scenarios (expected and
    cvar), in one pass: each plan is priced once and aggregated per objective.

    per_token: rank plans by dollars per million tokens at their objective's time, not by time
    (`--objective cost`; the result's objective_s is then that plan's time).
    Returns: objective → its ExhaustiveResult. Raises: InputError when the space exceeds the budget;
    ValueError for objectives that price different scenarios."""
    options = options or SearchOptions.from_instance(inst)
    if len({pricing(o) for o in objectives}) > 1:
        raise ValueError(f"{', '.join(objectives)} price different scenarios: enumerate them apart")
    scenarios = planning_scenarios(inst, objectives[0])
    probabilities = [sc.probability for sc in scenarios]
    profiles = profiles or Profiles()
    stats = SearchStats()
    skeletons, size = [], 0
    for sk in enumerate_skeletons(inst, options, stats, profiles):
        skeletons.append(sk)
        size += (
            math.prod(math.comb(inst.model.layers - 1, d - 1) for d in sk.split_depths)
            * max(1, len(sk.modes)) ** sk.depth
        )
        if size > budget:  # counting the rest would take as long as the refusal saves
            raise InputError(
                "--planner exhaustive",
                [
                    Problem(
                        "planner",
                        f"the plan space has more than {budget:,} plans (the exhaustive budget) "
                        f"— {size:,} in its first {len(skeletons):,} skeletons alone; use "
                        "--planner ilp, or narrow the instance's search section",
                        size,
                        True,
                    )
                ],
            )
    n = max(1, min(_workers(size * len(scenarios), workers), len(skeletons)))
    # dealt round-robin, as skeletons' plan counts differ widely; each keeps its skeletons' order
    # a budget (solve --max-usd-per-hour): every plan over it is left out, as the search leaves it
    cap = (
        Budget.of(inst, options.max_usd_per_hour) if options.max_usd_per_hour is not None else None
    )
    jobs = [
        (
            inst,
            list(enumerate(skeletons))[k::n],
            scenarios,
            probabilities,
            objectives,
            profiles,
            cap,
            per_token,
        )
        for k in range(n)
    ]
    if len(jobs) > 1:
        with worker_pool(len(jobs)) as pool:
            found = list(pool.map(_best_of, jobs))
    else:
        found = [_best_of(job) for job in jobs]
    evaluated = sum(f[1] for f in found)
    stats.pruned["placement"] += sum(f[2] for f in found)
    stats.solved = evaluated
    out = {}
    for i, objective in enumerate(objectives):
        # the first skeleton's among equal plans, as a serial pass finds it
        _, best_t, best, _ = min((f[0][i] for f in found), key=lambda b: (b[3], b[0]))
        out[objective] = ExhaustiveResult(best, best_t, evaluated, stats)
    return out


PARALLEL_FROM_PRICINGS = 30_000
"""From this many evaluator calls (plans × scenarios) the space is priced in worker processes,
each taking every n-th skeleton; below it, starting the workers costs more than they save (the
timings it was set from: docs/benchmarks.md, figures behind constants)."""


def _workers(pricings: int, workers: int | None) -> int:
    if workers is not None:
        return max(1, workers)
    if multiprocessing.parent_process() is not None:
        return 1  # already a worker (a bench or test sweep): its siblings hold the other cores
    return min(os.cpu_count() or 1, 4) if pricings >= PARALLEL_FROM_PRICINGS else 1


def _best_of(job) -> tuple[list[tuple[float, float, Plan | None, float]], int, int]:
    """The best fitting plan of some numbered skeletons per objective: ([(its skeleton's number,
    objective s, plan, its rank: s or $/Mtok) per objective], plans priced, skeletons not
    placed)."""
    inst, skeletons, scenarios, probabilities, objectives, profiles, cap, per_token = job
    # (skeleton number, objective s, plan, what ranks it: s, or $/Mtok with per_token)
    best: list[tuple[float, float, Plan | None, float]] = [
        (math.inf, math.inf, None, math.inf)
    ] * len(objectives)
    evaluated, unplaced = 0, 0
    for k, sk in skeletons:
        try:
            placement = sk.placed([1] * sk.depth, inst.cluster).placement
        except InfeasibleError:
            unplaced += 1
            continue
        mixes = list(itertools.product(sk.modes, repeat=sk.depth)) if sk.modes else [None]
        for split in itertools.product(
            *(compositions(inst.model.layers, d) for d in sk.split_depths)
        ):
            layers = sk.joined(split)
            if any(n % sk.virtual_stages for n in layers):
                continue  # interleaved: every stage holds whole model chunks
            for modes in mixes:
                plan = sk.plan(layers, modes).model_copy(update={"placement": placement})
                evs = [
                    price(sc.instance, plan, plan_features(sc.instance, plan), profiles)
                    for sc in scenarios
                ]
                evaluated += 1
                if not evs[0].fits:
                    continue
                if cap is not None and cap.exceeds(
                    plan_cost(inst, plan, evs[0].iteration_time_s).usd_per_hour
                ):
                    continue  # over the budget, its transfers priced at this split's time
                times = [ev.iteration_time_s for ev in evs]
                for i, objective in enumerate(objectives):
                    t = aggregate(times, probabilities, objective)
                    key = plan_cost(inst, plan, t).usd_per_million_tokens if per_token else t
                    if key < best[i][3]:
                        best[i] = (k, t, plan, key)
    return best, evaluated, unplaced

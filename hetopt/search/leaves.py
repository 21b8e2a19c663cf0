"""The search tree's leaves: one skeleton placed, linearised and solved by a formulation, within the
time left (`solve_leaf`, run in-process or by a worker), with a warm-start split."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from hetopt.cost.profiles import Profiles
from hetopt.errors import InfeasibleError
from hetopt.search.budget import TRANSFER_RULE, Budget
from hetopt.search.dispatch import solve_skeleton
from hetopt.search.formulation import SolveOptions, SolveStatus, SplitSolution
from hetopt.search.linear import PlanProblem, split_problem
from hetopt.search.robust import CVAR_ALPHA
from hetopt.search.run import OPTIMALITY_TOLERANCE
from hetopt.search.tree.base import BUDGET_RULE, MEMORY_RULE
from hetopt.search.types import SearchOptions, Skeleton
from hetopt.spec.instance import Instance

PLACED_BOUND_RULE = "bound: placed skeleton's bound (communication included) ≥ incumbent"


@dataclass(frozen=True)
class LeafContext:
    """What solving a skeleton needs; sent once to each worker (process or Ray actor)."""

    inst: Instance
    profiles: Profiles
    scenarios: list
    objective: str
    formulation: str
    backend: str
    seed: int
    options: SearchOptions | None = None
    """The space the search's tree holds (its `beyond_narrow` too): the workers expand subtrees of
    it (hetopt.search.subtrees); None: they only solve leaves."""
    budget: Budget | None = None
    """The budget in dollars per hour every leaf is checked against (the tree's), or None."""


def solve_leaf(
    ctx: LeafContext, sk: Skeleton, limit: tuple[float, float], incumbent: float = math.inf
):
    """Place, linearise and solve one skeleton within `limit` — (deadline as a time.time(), seconds
    left when sent), whichever ends first: ("solved", solution, exact time) or (prune rule, None,
    inf) — pruned by its bound once placed (`placed_bound`, communication included) when that
    reaches `incumbent`. Past the limit once its model is built, it is not solved: a TIMEOUT with
    its placed bound, which stays open."""
    started = time.time()
    budget = ctx.budget
    try:
        placed = sk.placed([1] * sk.depth, ctx.inst.cluster)
    except InfeasibleError:
        return "placement: TP groups do not pack onto the nodes", None, math.inf
    # its rented nodes are its placement's: over the budget, pruned before its program is built
    if budget is not None and budget.exceeds(budget.rented(ctx.inst, placed)):
        return BUDGET_RULE, None, math.inf
    pr = plan_problem(ctx.inst, sk, ctx.profiles, ctx.scenarios, ctx.objective, placed.placement)
    if any(
        min(c) < 1 or sum(c) < ctx.inst.model.layers
        for c in split_caps(pr.base.templates, sk.lockstep)
    ):
        return MEMORY_RULE, None, math.inf
    if pr.lower_bound_s >= incumbent * (1 - OPTIMALITY_TOLERANCE):
        return PLACED_BOUND_RULE, None, math.inf
    # a backend that fails hands the skeleton to the next one; sol.attempts says which failed
    hint = tuple(
        sk.joined([lockstep_split(pr.base.templates)])
        if sk.lockstep
        else [x for t in pr.base.templates for x in speed_split(t)]
    )
    deadline, sent_left_s = limit
    left_s = min(deadline, started + sent_left_s) - time.time()
    if left_s <= 0:
        return (
            "solved",
            SplitSolution(
                SolveStatus.TIMEOUT,
                None,
                math.inf,
                pr.lower_bound_s,
                0.0,
                ctx.backend,
                "the time limit came before its solve",
            ),
            math.inf,
        )
    sol = solve_skeleton(
        pr,
        ctx.formulation,
        ctx.backend,
        SolveOptions(time_limit_s=left_s, seed=ctx.seed, hint=hint),
    )
    t = pr.iteration_time(sol.layers, sol.recompute) if sol.layers is not None else math.inf
    if budget is not None and budget.transfers and sol.layers is not None:
        plan = sk.placed(list(sol.layers), ctx.inst.cluster, sol.recompute)
        if not budget.within(ctx.inst, plan, pr.base.iteration_time(sol.layers, sol.recompute)):
            # the split of least time moves too many dollars over priced links: the leaf's best
            # split within the budget is not known, its time bounds it (module hetopt.search.budget)
            return "solved", over_budget(sol), math.inf
    return "solved", sol, t


def over_budget(sol: SplitSolution) -> SplitSolution:
    """A leaf whose split of least time is over the budget by its transfers: no plan, not proven,
    its time a bound on any split within the budget."""
    return SplitSolution(
        SolveStatus.FEASIBLE,
        None,
        math.inf,
        sol.objective_s if sol.status == SolveStatus.OPTIMAL else sol.bound_s,
        sol.wall_s,
        sol.backend,
        TRANSFER_RULE,
    )


def speed_split(pr) -> list[int]:
    """A warm start: layers in proportion to each stage's speed (its device seconds per layer; with
    shards its priced passes' between one and two layers), within what its memory holds."""
    return proportional_split(_per_layer_s(pr), [max(1, m) for m in pr.max_layers()], pr.layers)


def lockstep_split(templates) -> list[int]:
    """`speed_split` of templates in lockstep (one split): each stage at its slowest template's
    seconds per layer, within what every template's holds."""
    per_layer = [max(x) for x in zip(*(_per_layer_s(t) for t in templates), strict=True)]
    (caps,) = split_caps(templates, lockstep=True)
    return proportional_split(per_layer, [max(1, c) for c in caps], templates[0].layers)


def split_caps(templates, lockstep: bool) -> list[list[int]]:
    """The most layers each stage of each free split holds in memory: one list per template, or in
    lockstep one, each stage at the least any template's holds."""
    caps = [t.max_layers() for t in templates]
    return [[min(c) for c in zip(*caps, strict=True)]] if lockstep else caps


def _per_layer_s(pr) -> list[float]:
    if pr.rows is not None:
        return [
            sum(pr.pass_s(i, 2, kind) - pr.pass_s(i, 1, kind) for kind in "fb")
            for i in range(pr.depth)
        ]
    return [f.slope + b.slope for f, b in zip(pr.dev_fwd, pr.dev_bwd, strict=True)]


def proportional_split(per_layer: list[float], cap: list[int], total: int) -> list[int]:
    """`total` layers in proportion to each stage's speed 1/per_layer, each within [1, cap]."""
    speed = [1.0 / max(a, 1e-12) for a in per_layer]
    layers = [
        max(1, min(c, round(total * v / sum(speed)))) for v, c in zip(speed, cap, strict=True)
    ]
    while sum(layers) != total:  # fix the rounding one layer at a time, fastest stage first
        order = sorted(range(len(layers)), key=lambda i: -speed[i])
        step = 1 if sum(layers) < total else -1
        for i in order if step > 0 else reversed(order):
            if (step > 0 and layers[i] < cap[i]) or (step < 0 and layers[i] > 1):
                layers[i] += step
                break
        else:
            break
    return layers


def plan_problem(
    inst: Instance,
    sk: Skeleton,
    profiles: Profiles,
    scenarios,
    objective: str,
    placement: list | None = None,
) -> PlanProblem:
    """The skeleton's integer-program data under every planning scenario: placed once, on the file's
    network (`placement`, where the caller placed it already), and linearised on each scenario's
    (raises InfeasibleError where it cannot be placed)."""
    if placement is None:
        placement = sk.placed([1] * sk.depth, inst.cluster).placement
    return PlanProblem(
        tuple(split_problem(sc.instance, sk, profiles, placement) for sc in scenarios),
        tuple(sc.probability for sc in scenarios),
        objective,
        CVAR_ALPHA,
        sk.lockstep,
    )

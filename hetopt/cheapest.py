"""The cost objective: the plan of least dollars per token (`solve --objective cost`;
docs/dollars.md).

Dollars per token are P·T / tokens for a plan that rents P per hour and takes T per iteration. Let
T*(b) be the least time of any plan within a budget b (the budgeted search, `max_usd_per_hour`). A
plan with P in (b₁, b₂] is within b₂, so T ≥ T*(b₂), and P > b₁: its P·T exceeds b₁·T*(b₂). So the
budgets searched cut the dollars per hour into intervals, each with a proven lower bound on the
cost of the plans in it — branch and bound over budgets:

1. T* at the budget cap (none: every plan) and on a geometric grid of budgets down to a lower
   bound on any plan's rent (`least_rent`); below the lowest budget with no plan, proven, nothing.
2. The best plan found so far (each search's plan, priced) is the incumbent.
3. An interval whose bound is below the incumbent is split: just below the dollars of a plan found
   inside it (the plan's cheaper neighbour on the front), else at its geometric middle.
4. When no interval's bound is below the incumbent, it is proven optimal. A search stopped by the
   time limit lends its interval only its bound on T (not T*): the gap is then against the least
   interval bound.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace

from hetopt.cost.dollars import per_million_tokens
from hetopt.evaluate import evaluate
from hetopt.planners import solve_ilp
from hetopt.search.budget import Budget, capped, check_prices, least_rent
from hetopt.search.formulation import SolveStatus
from hetopt.search.run import SearchResult
from hetopt.search.types import SearchOptions, SearchRequest, SearchStats, Seed

STEP = 1e-7
"""Relative: the budget just below a plan's dollars per hour (its cheaper neighbour); above the
budget's own tolerance (hetopt.search.budget.TOLERANCE), so the plan itself is left out."""
GRID = 6
"""Budget levels of the first pass, geometric from the top to the least any plan can rent."""
SLICE = 0.3
SLICE_LEAST_S = 3.0
"""Each budgeted search gets SLICE of the time left, at least SLICE_LEAST_S (or what is left): a
search stopped early still lends its interval a bound."""
TOLERANCE = 1e-6
"""Relative: the proof's tolerance. The interval just below a plan found bounds its plans at
(1 − STEP) of that plan's dollars per token, so a proof holds to STEP < TOLERANCE."""


@dataclass
class CostResult:
    """The cheapest plan per token found, and what is proven about it."""

    result: SearchResult
    """The search's answer whose plan it is (its status is the cost objective's)."""
    usd_per_million_tokens: float
    bound_usd_per_million_tokens: float
    steps: int
    """Budgeted searches run."""


@dataclass
class Level:
    """One budget searched: the least time within it (proven, else a bound) and its plan."""

    budget: float
    time_bound_s: float
    """T*(budget) where proven, else the search's bound on it (inf: no plan within it, proven)."""
    proven: bool
    result: SearchResult
    usd_per_hour: float | None = None
    """The plan's dollars per hour (None: no plan)."""
    usd_per_million_tokens: float = math.inf


def cheapest_per_token(
    request: SearchRequest,
    max_usd_per_hour: float | None = None,
    min_tokens_per_s: float | None = None,
    progress=None,
) -> CostResult:
    """The plan of least dollars per token, by branch and bound over budgets (module docstring).

    Parameters: request — the instance, the space and the search's settings; its time_limit_s holds
    for all the searches; max_usd_per_hour — a cap on the dollars per hour (None: none);
    min_tokens_per_s — plans below it are no answer; progress — each search's
    (hetopt.planners.solve_ilp).
    Returns: the CostResult (its result's plan None where no plan was found).
    Raises: InputError (exit 2) where some node has no price."""
    inst = request.inst
    check_prices(inst, "--objective cost")
    space = request.options or SearchOptions.from_instance(inst)
    tokens = inst.global_batch * inst.seq_len
    deadline = time.time() + request.time_limit_s
    stats = SearchStats()
    levels: dict[float, Level] = {}
    top = max_usd_per_hour if max_usd_per_hour is not None else math.inf
    last: SearchResult | None = None

    def search(budget: float) -> Level | None:
        nonlocal last
        left_s = deadline - time.time()
        if left_s <= 0:
            return None
        # it starts from the plans found at the levels it holds
        known = [
            Seed("cost", lv.result.objective_s, lv.result.plan)
            for lv in levels.values()
            if lv.usd_per_hour is not None and lv.usd_per_hour <= budget
        ]
        # a slice of the time left: one hard budget does not take all of it
        slice_s = min(left_s, max(SLICE * left_s, SLICE_LEAST_S))
        r = fastest_within(
            replace(request, options=space, time_limit_s=slice_s),
            None if math.isinf(budget) else budget,
            known,
            progress,
        )
        last = r
        stats.add(r.stats)
        proven = r.status in (SolveStatus.OPTIMAL, SolveStatus.INFEASIBLE)
        bound = r.objective_s if r.status == SolveStatus.OPTIMAL else r.bound_s
        if r.status == SolveStatus.INFEASIBLE:
            bound = math.inf
        level = Level(budget, bound if math.isfinite(bound) or proven else 0.0, proven, r)
        if r.plan is not None:
            ev = evaluate(inst, r.plan)
            level.usd_per_hour = ev.usd_per_hour
            slow = min_tokens_per_s is not None and ev.tokens_per_s < min_tokens_per_s * (
                1 - TOLERANCE
            )
            level.usd_per_million_tokens = math.inf if slow else ev.usd_per_million_tokens
        levels[budget] = level
        return level

    first = search(top)
    if first is not None and first.usd_per_hour is not None:
        high = first.usd_per_hour
        low = max(least_rent(inst)[0], 1e-9)
        for k in range(1, GRID):
            budget = high * (low / high) ** (k / (GRID - 1))
            below = min((lv for lv in levels.values() if lv.budget >= budget), key=_key)
            if below.usd_per_hour is not None and below.usd_per_hour <= budget and below.proven:
                # the plan of the level above is within this one: T* is its time here too
                levels[budget] = replace(below, budget=budget)
                continue
            if search(budget) is None:
                break
    floor = work_floor(request, space)  # every interval's bound is at least this
    bound, best = _bounds(levels, tokens, top, floor)
    while best is not None and bound < best.usd_per_million_tokens * (1 - TOLERANCE):
        split = _split(levels, tokens, top, best.usd_per_million_tokens, floor)
        if split is None or search(split) is None:
            break
        bound, best = _bounds(levels, tokens, top, floor)
    return _answer(request, levels, bound, best, last, stats, deadline)


def work_floor(request: SearchRequest, space: SearchOptions) -> float:
    """A lower bound on any plan's dollars per million tokens from its compute alone: a stage of
    class k at TP t and CP c holds its GPUs ≥ a_k·L seconds per micro-batch (`per_layer_s`), so an
    iteration keeps GPUs busy ≥ t·c·a_k·N·M GPU-seconds, each costing at least the class's least
    price per GPU-second; the least over classes, degrees, micro-batch sizes and the least-work
    recompute mode."""
    from hetopt.search.bounds.run import Bounds
    from hetopt.search.space import tp_options
    from hetopt.search.types import least_work

    inst = request.inst
    templates = Bounds(inst, request.weights).templates
    rc = least_work(space.recompute)
    tokens = inst.global_batch * inst.seq_len
    best = math.inf
    for dc in inst.cluster.device_classes.values():
        per_gpu_hour = min(n.usd_per_hour / n.gpus for n in dc.nodes)
        for mb in space.micro_batch:
            micro_batches = inst.micro_batches(mb)
            if not micro_batches:
                continue
            for cp in space.cp:
                for tp in tp_options(inst, dc, space, cp):
                    a = templates.per_layer_s(dc.gpu, tp, mb, rc, cp)
                    gpu_s = tp * cp * max(a, 0.0) * inst.model.layers * micro_batches
                    best = min(best, per_million_tokens(per_gpu_hour, gpu_s, tokens))
    return 0.0 if math.isinf(best) else best


def _key(level: Level) -> float:
    return level.budget


def _intervals(levels: dict[float, Level], tokens: float, top: float, floor: float = 0.0):
    """(lower budget, upper budget, the interval's bound in $/Mtok) for each interval between two
    budgets searched, and the one below the lowest (lower budget 0); each bound at least `floor`
    (`work_floor`) where the interval holds any plan."""
    budgets = sorted(levels)
    out = []
    for low, high in zip([0.0, *budgets[:-1]], budgets, strict=True):
        t = levels[high].time_bound_s
        bound = max(per_million_tokens(low, t, tokens), floor) if math.isfinite(t) else math.inf
        out.append((low, high, bound))
    return out


def _bounds(levels: dict[float, Level], tokens: float, top: float, floor: float = 0.0):
    """(the least interval bound, the best level's plan) so far."""
    # plans below the throughput floor (dollars per token inf) are no answer
    found = [lv for lv in levels.values() if math.isfinite(lv.usd_per_million_tokens)]
    best = min(found, key=lambda lv: lv.usd_per_million_tokens, default=None)
    least = min((b for _, _, b in _intervals(levels, tokens, top, floor)), default=math.inf)
    if best is not None:
        least = min(least, best.usd_per_million_tokens)
    return least, best


def _split(
    levels: dict[float, Level], tokens: float, top: float, best: float, floor: float = 0.0
) -> float | None:
    """The next budget to search: in the open interval of least bound, just below the dollars of a
    plan found inside it, else its geometric middle (its arithmetic one above 0); None where the
    intervals are as fine as the prices allow."""
    open_ = [iv for iv in _intervals(levels, tokens, top, floor) if iv[2] < best * (1 - TOLERANCE)]
    for low, high, _ in sorted(open_, key=lambda iv: iv[2]):
        inside = [
            lv.usd_per_hour
            for lv in levels.values()
            if lv.usd_per_hour is not None and low < lv.usd_per_hour * (1 - STEP) <= high
        ]
        candidates = [p * (1 - STEP) for p in inside if p * (1 - STEP) not in levels]
        if candidates:
            return min(candidates)
        if math.isinf(high):
            continue
        middle = math.sqrt(low * high) if low > 0 else high / 2
        if high - middle > STEP * high and middle not in levels:
            return middle
    return None


def _answer(request, levels, bound, best, last, stats, deadline) -> CostResult:
    """The CostResult of the levels searched: optimal where no interval's bound is below the
    best plan's dollars per token."""
    spent = request.time_limit_s - max(0.0, deadline - time.time())
    proven = all(lv.proven for lv in levels.values())
    if best is None:
        status = SolveStatus.INFEASIBLE if proven and levels else SolveStatus.TIMEOUT
        empty = SearchResult(
            status,
            None,
            math.inf,
            math.inf,
            spent,
            last.formulation if last is not None else "split-milp",
            last.backend if last is not None else request.backend,
            request.time_limit_s,
            request.seed,
            stats,
        )
        return CostResult(empty, math.inf, bound, len(levels))
    cost = best.usd_per_million_tokens
    # every interval's bound (a proven T*, or a search's bound on it) is at least the best's cost
    optimal = bound >= cost * (1 - TOLERANCE)
    answer = replace(
        best.result,
        status=SolveStatus.OPTIMAL if optimal else SolveStatus.TIMEOUT,
        stats=stats,
        solve_time_s=spent,
        time_limit_s=request.time_limit_s,
    )
    return CostResult(answer, cost, cost if optimal else min(bound, cost), len(levels))


def fastest_within(
    request: SearchRequest, budget: float | None, known: Sequence[Seed] = (), progress=None
) -> SearchResult:
    """The budgeted search: the fastest plan of the request's space whose dollars per hour stay
    within `budget` (None: any), on the nodes a plan within it can rent (`capped`), started from
    the `known` plans (the warm-start heuristics, which plan on every GPU, only where there are
    none); the request's time limit, on the instance's own network."""
    inst = request.inst
    space = request.options or SearchOptions.from_instance(inst)
    searched = inst if budget is None else capped(inst, Budget.of(inst, budget))
    return solve_ilp(
        replace(
            request,
            inst=searched,
            options=replace(space, max_usd_per_hour=budget),
            objective="stable",
        ),
        progress,
        warm_start=not known,
        known=list(known),
    )


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

    def fastest(budget: float):
        left_s = deadline - time.time()
        return (
            None if left_s <= 1 else fastest_within(replace(request, time_limit_s=left_s), budget)
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

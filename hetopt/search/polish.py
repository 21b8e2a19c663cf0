"""Polishing the first incumbents: a local search over skeletons near the heuristics' plans.

The warm-start heuristics (hetopt.planners) find plans a user writes first, each with a layer split
of its own rules. The best plan near them is often one step away: the other placement order, the
device classes in the other order, one stage more or less of a class, the next replica count or
micro-batch size. Such a neighbour is a skeleton of the search space, and its best split is one
small integer program (hetopt.search.leaves.solve_leaf): tenths of a second on the stress suite's
shapes, where the tree may expand for seconds before its first leaf.

`polish` climbs from every heuristic plan that is a skeleton's plan, best first: it solves a
skeleton's neighbours until one beats it, climbs on from that one at once (the rest of the
neighbours wait their turn), and so on until the budget is spent or nothing beats where it
stands. The search climbs so from its seeds before it plants its tree, and from each skeleton
the tree makes the incumbent. It proves nothing; each plan it keeps is a point of the space
(`outside_space`), so the search's proof covers it.
"""

from __future__ import annotations

import heapq
import itertools
import math
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import replace

from hetopt.placement import ORDERS
from hetopt.plan import Plan
from hetopt.search.leaves import LeafContext, solve_leaf
from hetopt.search.roots import outside_space
from hetopt.search.space import tp_options
from hetopt.search.types import (
    SearchOptions,
    Seed,
    Segment,
    Skeleton,
    Template,
    orders,
    segments_of,
)

POLISH = "polish"
"""The planner name of a polished seed."""


def skeleton_of(plan: Plan, order: str = "replica") -> Skeleton | None:
    """The skeleton whose plan `plan` is, in placement `order`: one recompute mode for every stage,
    no shards; None for any other plan (a uniform layout's lockstep split, stages with shards)."""
    modes = {st.recompute for pipe in plan.pipelines for st in pipe.stages}
    if len(modes) != 1 or any(st.shards for pipe in plan.pipelines for st in pipe.stages):
        return None
    templates = tuple(
        Template(segments_of(pipe), pipe.replicas, pipe.micro_batches) for pipe in plan.pipelines
    )
    return Skeleton(
        plan.micro_batch,
        modes.pop(),
        templates,
        order=order,
        virtual_stages=plan.virtual_stages,
        zero=plan.zero,
    )


def polish(
    ctx: LeafContext, opts: SearchOptions, seeds: Sequence[Seed], budget_s: float
) -> list[Seed]:
    """Plans near the seeds' that beat them, found within `budget_s` (module docstring).

    Parameters: ctx — what a leaf solve needs (instance, weights, scenarios, objective, formulation,
    backend); opts — the search space, which every neighbour stays in; seeds — the heuristics'
    plans with their objectives; budget_s — seconds, wall clock.
    Returns: [] where no neighbour beats the best seed, else one Seed (planner `polish`), the best
    plan found, its objective as the search's objective prices it.
    """
    deadline = time.time() + budget_s
    best = min((s.objective_s for s in seeds), default=math.inf)
    found: Seed | None = None
    tie = itertools.count()
    # skeletons to climb from, least objective first; each with the value its neighbours must beat
    frontier: list[tuple[float, int, Skeleton]] = []
    seen: set[Skeleton] = set()
    for seed in seeds:
        for order in ("replica", "stage"):
            sk = skeleton_of(seed.plan, order)
            if sk is not None and _ordered(opts, sk):
                heapq.heappush(frontier, (seed.objective_s, next(tie), sk))
    while frontier and time.time() < deadline:
        value, _, here = heapq.heappop(frontier)
        # a seed's skeleton, in either order, is solved first: its split may beat the seed's
        steps = neighbours(ctx, opts, here)
        if here not in seen:
            steps = itertools.chain((here,), steps)
        for nb in steps:
            if time.time() >= deadline:
                break
            if nb in seen or not _ordered(opts, nb):
                continue
            seen.add(nb)
            if outside_space(
                ctx.inst, nb.plan(_even(nb, ctx.inst.model.layers)), opts, ctx.profiles
            ):
                continue
            kind, sol, t = solve_leaf(ctx, nb, (deadline, deadline - time.time()), value)
            if kind != "solved" or sol.layers is None or not t < value * (1 - 1e-9):
                continue
            plan = nb.placed(list(sol.layers), ctx.inst.cluster, sol.recompute)
            if outside_space(ctx.inst, plan, opts, ctx.profiles):
                continue
            if t < best:
                best, found = t, Seed(POLISH, t, plan, nb)
            # climb on from the better one at once; the rest of here's neighbours wait their turn
            heapq.heappush(frontier, (t, next(tie), nb))
            if nb is not here:
                heapq.heappush(frontier, (value, next(tie), here))
            break
    return [found] if found is not None else []


def neighbours(ctx: LeafContext, opts: SearchOptions, sk: Skeleton) -> Iterator[Skeleton]:
    """The skeletons one step from `sk` that the space may hold: the other placement order; per
    template, its classes reversed or two neighbours swapped, a class with one stage more or less,
    at twice or half its TP degree over the same GPUs, left out; the micro-batches shared out
    otherwise (`_share_moves`); one template: the next replica counts and micro-batch sizes. Each
    within the GPUs of every class and the space's depth;
    the rest of the space's rules are the caller's (`outside_space`)."""
    yield replace(sk, order="stage" if sk.order == "replica" else "replica")
    ts = sk.templates
    for j, t in enumerate(ts):
        for segs in _segment_moves(ctx, opts, t.segments):
            yield from _fitting(ctx, opts, sk, (*ts[:j], replace(t, segments=segs), *ts[j + 1 :]))
    for templates in _share_moves(ctx, opts, sk):
        yield from _fitting(ctx, opts, sk, templates)
    if len(ts) == 1:
        (t,) = ts
        total = t.replicas * t.micro_batches
        for r in _next_divisors(total, t.replicas):
            yield from _fitting(ctx, opts, sk, (Template(t.segments, r, total // r),))
        for b in (sk.micro_batch * 2, sk.micro_batch // 2):
            m_total = ctx.inst.micro_batches(b) if b in opts.micro_batch else None
            if m_total is None or m_total % t.replicas:
                continue
            yield from _fitting(
                ctx,
                opts,
                replace(sk, micro_batch=b),
                (Template(t.segments, t.replicas, m_total // t.replicas),),
            )


def _share_moves(
    ctx: LeafContext, opts: SearchOptions, sk: Skeleton
) -> Iterator[tuple[Template, ...]]:
    """The templates with their micro-batches shared out otherwise, Σ R·m kept: one replica's
    worth moved between two templates (R_i·Δ_i = R_j·Δ_j, the least such), a template left out
    (its micro-batches to another that divides them), one replica of a template made a template of
    its own, or a template's GPUs left idle put to work by a second template of its segments (one
    replica, or as many as fit, the micro-batches as even as they divide)."""
    ts = sk.templates
    for i, j in itertools.permutations(range(len(ts)), 2):
        a, b = ts[i], ts[j]
        g = math.gcd(a.replicas, b.replicas)
        more, less = b.replicas // g, a.replicas // g
        if b.micro_batches - less >= 1:
            moved = list(ts)
            moved[i] = replace(a, micro_batches=a.micro_batches + more)
            moved[j] = replace(b, micro_batches=b.micro_batches - less)
            yield tuple(moved)
        work = b.replicas * b.micro_batches
        if work % a.replicas == 0:
            rest = [
                replace(a, micro_batches=a.micro_batches + work // a.replicas) if k == i else x
                for k, x in enumerate(ts)
                if k != j
            ]
            yield tuple(rest)
    if len(ts) >= opts.max_templates:
        return
    free = Counter({k: dc.gpus for k, dc in ctx.inst.cluster.device_classes.items()})
    for t in ts:
        for seg in t.segments:
            free[seg.gpu, seg.island] -= t.replicas * seg.stages * seg.width
    for j, t in enumerate(ts):
        if t.replicas > 1:  # one replica its own template: the two may then split layers apart
            yield (
                *ts[:j],
                replace(t, replicas=t.replicas - 1),
                *ts[j + 1 :],
                replace(t, replicas=1),
            )
        extra = min(free[seg.gpu, seg.island] // (seg.stages * seg.width) for seg in t.segments)
        work = t.replicas * t.micro_batches
        for k in sorted({1, extra}):
            if k < 1:
                continue
            even = work // (t.replicas + k)
            for m in range(max(1, even - 2), even + 3):
                if (work - t.replicas * m) % k == 0 and work - t.replicas * m >= k:
                    second = Template(t.segments, k, (work - t.replicas * m) // k)
                    yield (*ts[:j], replace(t, micro_batches=m), *ts[j + 1 :], second)


def _segment_moves(
    ctx: LeafContext, opts: SearchOptions, segs: tuple[Segment, ...]
) -> Iterator[tuple[Segment, ...]]:
    """A template's segments one step away (`neighbours`)."""
    if len(segs) > 1:
        yield segs[::-1]
        for i in range(len(segs) - 1):
            if len(segs) > 2:
                yield (*segs[:i], segs[i + 1], segs[i], *segs[i + 2 :])
        for i in range(len(segs)):
            yield segs[:i] + segs[i + 1 :]
    for i, seg in enumerate(segs):
        dc = ctx.inst.cluster.device_classes[seg.gpu, seg.island]
        tps = tp_options(ctx.inst, dc, opts, seg.cp)
        moved = [replace(seg, stages=seg.stages + 1)]
        if seg.stages > 1:
            moved.append(replace(seg, stages=seg.stages - 1))
        if seg.tp * 2 in tps and seg.stages % 2 == 0:
            moved.append(replace(seg, tp=seg.tp * 2, stages=seg.stages // 2))
        if seg.tp // 2 in tps and seg.tp > 1:
            moved.append(replace(seg, tp=seg.tp // 2, stages=seg.stages * 2))
        for m in moved:
            yield (*segs[:i], m, *segs[i + 1 :])


def _fitting(
    ctx: LeafContext, opts: SearchOptions, sk: Skeleton, templates: tuple[Template, ...]
) -> Iterator[Skeleton]:
    """`sk` with `templates`, where each template's classes are distinct runs (at most the space's
    classes), its depth within the space's stages, the layers and its micro-batches, every class
    holds the GPUs its templates take, and (Σ R·m) the templates run every micro-batch."""
    for t in templates:
        classes = [(seg.gpu, seg.island) for seg in t.segments]
        if len(set(classes)) < len(classes) or len(classes) > opts.max_classes:
            return
        if t.depth > min(opts.max_stages, ctx.inst.model.layers, t.micro_batches):
            return
    if sum(t.replicas * t.micro_batches for t in templates) != ctx.inst.micro_batches(
        sk.micro_batch
    ):
        return
    used: Counter = Counter()
    for t in templates:
        for seg in t.segments:
            used[seg.gpu, seg.island] += t.replicas * seg.stages * seg.width
    have = ctx.inst.cluster.device_classes
    if all(k in have and n <= have[k].gpus for k, n in used.items()):
        yield replace(sk, templates=templates)


def _ordered(opts: SearchOptions, sk: Skeleton) -> bool:
    """Whether the space places `sk` in its order: one template in search.placement's orders (one
    replica: replica-major only, as both place alike), several in either (`orders`)."""
    placements = opts.placements if len(sk.templates) == 1 else ORDERS
    return sk.order in orders(max(t.replicas for t in sk.templates), placements)


def _even(sk: Skeleton, layers: int) -> list[int]:
    """A flat layer vector of `sk`: each template's `layers` as even as its stages take them."""
    flat = []
    for t in sk.templates:
        flat += [layers // t.depth + (i < layers % t.depth) for i in range(t.depth)]
    return flat


def _next_divisors(total: int, r: int) -> list[int]:
    """The divisors of `total` next below and above r (those that exist)."""
    divisors = [d for d in range(1, total + 1) if total % d == 0]
    below = [d for d in divisors if d < r]
    above = [d for d in divisors if d > r]
    return below[-1:] + above[:1]

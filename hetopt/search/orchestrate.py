"""Best-first search over skeletons with a proven bound (DESIGN 4).

1. Enumerate the skeletons (divisibility, depth and resource rules prune while enumerating).
2. Give each a compute lower bound (no placement needed) and visit them in increasing bound order. The
   bound holds under every scenario, hence for every robust objective (each is at least the smallest T_s).
3. For each: place it (else pruned: placement), linearise the evaluator, drop it if a stage cannot hold a
   layer or the stages cannot hold the model (pruned: memory), and solve its integer program exactly.
4. Stop when the next bound is no better than the incumbent: every skeleton left is proven no better
   (pruned: bound). The best bound is then the incumbent itself — the plan is optimal.
With a time limit the search stops early and reports the best plan, the smallest bound of what it did not
finish, and the gap between them. On large plan spaces the next few skeletons by bound are solved side by
side in worker processes (both cores); the best-first order and the proof are unchanged.
"""

from __future__ import annotations

import heapq
import itertools
import math
import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field

from hetopt.cost.flops import total_params
from hetopt.cost.memory import GIB, GRAD_BYTES, OPTIMIZER_BYTES, WEIGHT_BYTES
from hetopt.cost.profiles import Profiles
from hetopt.errors import InfeasibleError
from hetopt.plan import Plan
from hetopt.search.formulation import SolveOptions, SolveStatus, clock, pick
from hetopt.search.linear import PlanProblem, compute_lower_bound, split_problem
from hetopt.search.robust import CVAR_ALPHA, planning_scenarios
from hetopt.search.space import SearchOptions, SearchStats, Skeleton, SkeletonGroup, enumerate_groups
from hetopt.spec.instance import Instance

PARALLEL_FROM_SKELETONS = 100_000
"""Plan spaces at least this large are searched with worker processes by default."""
OPTIMALITY_TOLERANCE = 1e-9
"""Relative: a bound within this of the incumbent proves optimality (CP-SAT adds its own scaling tolerance)."""


@dataclass
class SearchResult:
    status: SolveStatus
    plan: Plan | None
    objective_s: float
    bound_s: float
    solve_time_s: float
    formulation: str
    backend: str
    time_limit_s: float
    seed: int
    stats: SearchStats = field(default_factory=SearchStats)
    skeleton: Skeleton | None = None
    reason: str = ""

    @property
    def gap(self) -> float:
        if self.plan is None or not math.isfinite(self.objective_s):
            return math.inf
        return max(0.0, (self.objective_s - self.bound_s) / self.objective_s)


def solve_exact(inst: Instance, formulation: str | None = None, backend: str = "highs", time_limit_s: float = 60.0,
                seed: int = 0, options: SearchOptions | None = None, profiles: Profiles | None = None,
                export_model: str | None = None, progress=None, objective: str = "stable",
                workers: int | None = None) -> SearchResult:
    form = pick(formulation, backend)
    scenarios = planning_scenarios(inst, objective)
    options = options or SearchOptions.from_instance(inst)
    profiles = profiles or Profiles()
    start = clock()
    stats = SearchStats()
    # Best-first over a heap of groups (keyed by their smallest bound: the most replicated skeleton) and
    # skeletons (keyed by their own bound); a group is expanded only when it reaches the top.
    heap: list[tuple[float, int, object]] = []
    tie = itertools.count()
    for group in enumerate_groups(inst, options, stats):
        key = min(compute_lower_bound(inst, sk, profiles) for sk in group.most_replicated())
        heap.append((key, next(tie), group))
    heapq.heapify(heap)
    incumbent, best, best_sk = math.inf, None, None
    open_bound = math.inf  # the smallest bound among skeletons not finished
    timed_out = False
    ctx = _Context(inst, profiles, scenarios, objective, form.name, backend, seed)
    if workers is None:  # both cores on large plan spaces; starting processes costs more than small ones take
        workers = min(2, os.cpu_count() or 1) if stats.enumerated > PARALLEL_FROM_SKELETONS else 1
    pool = _pool(ctx, workers)
    try:
        while heap:
            key = heap[0][0]
            if key >= incumbent * (1 - OPTIMALITY_TOLERANCE):
                stats.pruned["bound: compute lower bound ≥ incumbent"] += sum(
                    it.size if isinstance(it, SkeletonGroup) else 1 for _, _, it in heap)
                break
            left = time_limit_s - (clock() - start)
            if left <= 0:
                timed_out = True
                open_bound = min(open_bound, key)
                break
            # The next few skeletons by bound (groups on the way are expanded), solved side by side.
            batch: list[tuple[float, Skeleton]] = []
            while heap and len(batch) < max(1, 2 * workers) and heap[0][0] < incumbent * (1 - OPTIMALITY_TOLERANCE):
                key, _, item = heapq.heappop(heap)
                if isinstance(item, SkeletonGroup):
                    for sk in item.skeletons():
                        heapq.heappush(heap, (compute_lower_bound(inst, sk, profiles), next(tie), sk))
                else:
                    batch.append((key, item))
            jobs = [(sk, left) for _, sk in batch]
            outcomes = list(pool.map(_solve_one, jobs)) if pool is not None and len(jobs) > 1 else \
                [_solve_with(ctx, sk, t) for sk, t in jobs]
            for (key, sk), (kind, sol, t) in zip(batch, outcomes, strict=True):
                if kind != "solved":
                    stats.pruned[kind] += 1
                    continue
                stats.solved += 1
                if progress is not None:
                    progress(stats.solved, incumbent)
                if sol.status == SolveStatus.INFEASIBLE:
                    continue
                if sol.status != SolveStatus.OPTIMAL:
                    timed_out = True
                    open_bound = min(open_bound, max(key, sol.bound_s))
                if sol.layers is not None and t < incumbent:
                    incumbent, best, best_sk = t, sk.plan(sol.layers), sk
    finally:
        if pool is not None:
            pool.shutdown()
    wall = clock() - start
    if best is None:
        status = SolveStatus.TIMEOUT if timed_out else SolveStatus.INFEASIBLE
        return SearchResult(status, None, math.inf, open_bound if timed_out else math.inf, wall, form.name, backend,
                            time_limit_s, seed, stats, reason="" if timed_out else diagnose(inst, stats))
    if export_model:
        form.solve(plan_problem(inst, best_sk, profiles, scenarios, objective), backend,
                   SolveOptions(time_limit_s=time_limit_s, seed=seed, export_path=export_model))
    bound = min(incumbent, open_bound)
    status = SolveStatus.OPTIMAL if bound >= incumbent * (1 - OPTIMALITY_TOLERANCE) else SolveStatus.TIMEOUT
    return SearchResult(status, best, incumbent, bound, wall, form.name, backend, time_limit_s, seed, stats, best_sk)


@dataclass(frozen=True)
class _Context:
    """What solving a skeleton needs; sent once to each worker process."""

    inst: Instance
    profiles: Profiles
    scenarios: list
    objective: str
    formulation: str
    backend: str
    seed: int


_WORKER: _Context | None = None


def _init_worker(ctx: _Context) -> None:
    global _WORKER
    _WORKER = ctx


def _solve_one(job: tuple[Skeleton, float]):
    assert _WORKER is not None
    return _solve_with(_WORKER, *job)


def _pool(ctx: _Context, workers: int) -> ProcessPoolExecutor | None:
    if workers <= 1:
        return None
    # spawn, not fork: the solver libraries keep thread pools that a forked child would inherit half-locked
    return ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn"),
                               initializer=_init_worker, initargs=(ctx,))


def _solve_with(ctx: _Context, sk: Skeleton, left_s: float):
    """Place, linearise and solve one skeleton: ("solved", solution, exact time) or (prune rule, None, inf)."""
    try:
        pr = plan_problem(ctx.inst, sk, ctx.profiles, ctx.scenarios, ctx.objective)
    except InfeasibleError:
        return "placement: TP groups do not pack onto the nodes", None, math.inf
    max_layers = pr.base.max_layers()
    if min(max_layers) < 1 or sum(max_layers) < ctx.inst.model.layers:
        return "memory: the stages cannot hold the model", None, math.inf
    form = pick(ctx.formulation, ctx.backend)
    sol = form.solve(pr, ctx.backend, SolveOptions(time_limit_s=left_s, seed=ctx.seed,
                                                   hint=tuple(speed_split(pr.base))))
    return "solved", sol, (pr.iteration_time(sol.layers) if sol.layers is not None else math.inf)


def speed_split(pr) -> list[int]:
    """A warm start: layers in proportion to each stage's speed, within what its memory holds."""
    speed = [1.0 / max(f.slope + b.slope, 1e-12) for f, b in zip(pr.dev_fwd, pr.dev_bwd, strict=True)]
    cap = [max(1, m) for m in pr.max_layers()]
    layers = [max(1, min(c, round(pr.layers * v / sum(speed)))) for v, c in zip(speed, cap, strict=True)]
    while sum(layers) != pr.layers:  # fix the rounding one layer at a time, fastest stage first
        order = sorted(range(len(layers)), key=lambda i: -speed[i])
        step = 1 if sum(layers) < pr.layers else -1
        for i in order if step > 0 else reversed(order):
            if (step > 0 and layers[i] < cap[i]) or (step < 0 and layers[i] > 1):
                layers[i] += step
                break
        else:
            break
    return layers


def plan_problem(inst: Instance, sk: Skeleton, profiles: Profiles, scenarios, objective: str) -> PlanProblem:
    return PlanProblem(tuple(split_problem(inst, sk, profiles, sc.cluster) for sc in scenarios),
                       tuple(sc.probability for sc in scenarios), objective, CVAR_ALPHA)


def diagnose(inst: Instance, stats: SearchStats) -> str:
    """Say which constraint binds when no plan exists."""
    params = total_params(inst.model)
    need_gib = params * (WEIGHT_BYTES + GRAD_BYTES + OPTIMIZER_BYTES) / GIB
    have_gib = inst.cluster.total_memory_gib
    if need_gib > have_gib:
        return (f"{inst.model.name} ({params / 1e9:.1f} B parameters) needs at least {need_gib / 1024:.2f} TiB for "
                f"weights, gradients and optimizer states (18 bytes per parameter, held once across the cluster); "
                f"the cluster has {have_gib / 1024:.2f} TiB of GPU memory")
    rules = ", ".join(f"{rule} ({n})" for rule, n in stats.pruned.items()) or "none"
    return (f"no skeleton of the plan space holds the model in memory: even the largest TP and PP the search "
            f"allows leave some stage over its GPU memory (skeletons enumerated {stats.enumerated}; pruned: "
            f"{rules}); allow recompute, more stages (search.max_stages) or smaller micro-batches")

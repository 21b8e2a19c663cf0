"""Best-first search over skeletons with a proven bound (DESIGN 4).

1. Enumerate the skeletons (divisibility, depth and resource rules prune while enumerating).
2. Give each a compute lower bound (no placement needed) and visit them in increasing bound order. The
   bound holds under every scenario, hence for every robust objective (each is at least the smallest T_s).
3. For each: place it (else pruned: placement), linearise the evaluator, drop it if a stage cannot hold a
   layer or the stages cannot hold the model (pruned: memory), and solve its integer program exactly.
4. Stop when the next bound is no better than the incumbent: every skeleton left is proven no better
   (pruned: bound). The best bound is then the incumbent itself — the plan is optimal.
With a time limit the search stops early and reports the best plan, the smallest bound of what it did not
finish, and the gap between them.
"""

from __future__ import annotations

import heapq
import itertools
import math
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
                export_model: str | None = None, progress=None, objective: str = "stable") -> SearchResult:
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
    while heap:
        key, _, item = heap[0]
        if key >= incumbent * (1 - OPTIMALITY_TOLERANCE):
            stats.pruned["bound: compute lower bound ≥ incumbent"] += sum(
                it.size if isinstance(it, SkeletonGroup) else 1 for _, _, it in heap)
            break
        if time_limit_s - (clock() - start) <= 0:
            timed_out = True
            open_bound = min(open_bound, key)
            break
        heapq.heappop(heap)
        if isinstance(item, SkeletonGroup):
            for sk in item.skeletons():
                heapq.heappush(heap, (compute_lower_bound(inst, sk, profiles), next(tie), sk))
            continue
        sk = item
        try:
            pr = plan_problem(inst, sk, profiles, scenarios, objective)
        except InfeasibleError:
            stats.pruned["placement: TP groups do not pack onto the nodes"] += 1
            continue
        max_layers = pr.base.max_layers()
        if min(max_layers) < 1 or sum(max_layers) < inst.model.layers:
            stats.pruned["memory: the stages cannot hold the model"] += 1
            continue
        left = time_limit_s - (clock() - start)
        sol = form.solve(pr, backend, SolveOptions(time_limit_s=left, seed=seed))
        stats.solved += 1
        if progress is not None:
            progress(stats.solved, incumbent)
        if sol.status == SolveStatus.INFEASIBLE:
            continue
        if sol.status != SolveStatus.OPTIMAL:
            timed_out = True
            open_bound = min(open_bound, max(key, sol.bound_s))
        if sol.layers is not None:
            t = pr.iteration_time(sol.layers)
            if t < incumbent:
                incumbent, best, best_sk = t, sk.plan(sol.layers), sk
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

"""Best-first search over skeletons with a proven bound (DESIGN 4).

1. Enumerate the skeletons in groups (divisibility, depth and resource rules prune while enumerating;
   identical GPUs are counts, so no two skeletons differ only by which GPUs they name).
2. Key each group by a compute lower bound on every skeleton in it (no placement needed) and visit them in
   increasing bound order, expanding a group only when it reaches the top: one-template groups into
   skeletons, two-template groups into replica counts and recompute, then into micro-batch shares. What a
   group holds that cannot fit in memory even at its most ZeRO sharding is dropped on expansion (pruned:
   memory). Bounds hold under every scenario, hence for every robust objective (each is at least the
   smallest T_s).
3. For each skeleton: place it (else pruned: placement), linearise the evaluator, drop it if a stage cannot
   hold a layer or the stages cannot hold the model (pruned: memory), and solve its integer program.
4. Stop when the next bound is no better than the incumbent: every skeleton left is proven no better
   (pruned: bound). The best bound is then the incumbent itself — the plan is optimal.
With a time limit the search stops early and reports the best plan, the smallest bound of what it did not
finish, and the gap between them. A search still solving after PARALLEL_AFTER_S solves the next few
skeletons by bound side by side in worker processes (both cores); the best-first order and the proof are
unchanged.
"""

from __future__ import annotations

import heapq
import itertools
import math
import multiprocessing
import os
import sys
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field

from hetopt.cost.flops import total_params
from hetopt.cost.memory import GIB, GRAD_BYTES, OPTIMIZER_BYTES, WEIGHT_BYTES
from hetopt.cost.profiles import Profiles
from hetopt.errors import InfeasibleError
from hetopt.plan import Plan
from hetopt.search.backends import solve_skeleton
from hetopt.search.formulation import SolveOptions, SolveStatus, SplitSolution, clock, pick
from hetopt.search.linear import (
    PlanProblem,
    bucket_bound,
    compute_lower_bound,
    family_bound,
    group_bound,
    pair_bound,
    split_problem,
    template_fits,
    throughput_bound,
)
from hetopt.search.robust import CVAR_ALPHA, planning_scenarios
from hetopt.search.space import (
    DEFAULT_RECOMPUTE,
    Family,
    PairGroup,
    SearchOptions,
    SearchStats,
    Skeleton,
    SkeletonGroup,
    enumerate_families,
    least_work,
    orders,
)
from hetopt.spec.instance import Instance

PARALLEL_AFTER_S = 2.0
"""By default worker processes start once skeletons have been solved for this long: starting them (spawn,
imports) costs about a second, more than solving a small instance takes in all."""
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
    warm_start: dict | None = None
    """The best heuristic plan the search started from: its planner and time, and whether it stood."""

    @property
    def gap(self) -> float:
        if self.plan is None or not math.isfinite(self.objective_s):
            return math.inf
        return max(0.0, (self.objective_s - self.bound_s) / self.objective_s)


def solve_exact(inst: Instance, formulation: str | None = None, backend: str = "highs", time_limit_s: float = 60.0,
                seed: int = 0, options: SearchOptions | None = None, profiles: Profiles | None = None,
                export_model: str | None = None, progress=None, objective: str = "stable",
                workers: int | None = None, warm_start: bool = True) -> SearchResult:
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
    bounds = _Bounds(inst, profiles, options, stats)
    for family in enumerate_families(inst, options, stats):
        heap.append((family_bound(inst, profiles, family), next(tie), family))
    heapq.heapify(heap)
    incumbent, best, best_sk = math.inf, None, None
    seeded = None
    if warm_start:  # heuristic plans as the first incumbent: the bound prunes from the start
        seeded = seed_incumbent(inst, profiles, scenarios, objective, 0.05 * time_limit_s)
        if seeded is not None:
            incumbent, best = seeded["objective_s"], seeded.pop("plan")
    open_bound = math.inf  # the smallest bound among skeletons not finished
    timed_out = False
    out_of_time = False  # the clock stopped the search (not only a skeleton no backend could solve)
    errors: list[str] = []  # skeletons every backend failed on, with the solvers' words
    ctx = _Context(inst, profiles, scenarios, objective, form.name, backend, seed)
    lazy = workers is None
    workers = min(2, os.cpu_count() or 1) if lazy else workers
    pool = None if lazy else _pool(ctx, workers)
    solving_since = clock()
    try:
        while heap:
            if pool is None and lazy and workers > 1 and clock() - solving_since > PARALLEL_AFTER_S:
                pool = _pool(ctx, workers)
            key = heap[0][0]
            if key >= incumbent * (1 - OPTIMALITY_TOLERANCE):
                for _, _, it in heap:
                    _count_bound_pruned(stats, it)
                break
            left = time_limit_s - (clock() - start)
            if left <= 0:
                timed_out = out_of_time = True
                open_bound = min(open_bound, key)
                break
            # The next few skeletons by bound (groups on the way are expanded), solved side by side.
            batch: list[tuple[float, Skeleton]] = []
            size = 2 * workers if pool is not None else 1
            while heap and len(batch) < size and heap[0][0] < incumbent * (1 - OPTIMALITY_TOLERANCE):
                key, _, item = heapq.heappop(heap)
                if isinstance(item, Skeleton):
                    batch.append((key, item))
                else:
                    for child_key, child in bounds.expand(item):
                        heapq.heappush(heap, (max(key, child_key), next(tie), child))
            jobs = [(sk, left) for _, sk in batch]
            outcomes = list(pool.map(_solve_one, jobs)) if pool is not None and len(jobs) > 1 else \
                [_solve_with(ctx, sk, t) for sk, t in jobs]
            for (key, sk), (kind, sol, t) in zip(batch, outcomes, strict=True):
                if kind != "solved":
                    stats.pruned[kind] += 1
                    continue
                stats.solved += 1
                _record_fallbacks(stats, sk, sol, errors)
                if progress is not None:
                    progress(stats.solved, incumbent)
                if sol.status == SolveStatus.INFEASIBLE:
                    continue
                if sol.status != SolveStatus.OPTIMAL:
                    timed_out = True
                    out_of_time = out_of_time or sol.status == SolveStatus.TIMEOUT
                    open_bound = min(open_bound, max(key, sol.bound_s))
                # a tie with a heuristic seed goes to the search's plan: it is in the space the bound covers
                if sol.layers is not None and (t < incumbent or (best_sk is None and t <= incumbent * (1 + 1e-12))):
                    incumbent, best, best_sk = t, sk.placed(sol.layers, inst.cluster), sk
    finally:
        if pool is not None:
            pool.shutdown()
    wall = clock() - start
    if best is None:
        status = SolveStatus.ERROR if errors else \
            SolveStatus.TIMEOUT if timed_out else SolveStatus.INFEASIBLE
        reason = _errors_reason(errors) if errors else "" if timed_out else diagnose(inst, stats)
        return SearchResult(status, None, math.inf, open_bound if timed_out else math.inf, wall, form.name, backend,
                            time_limit_s, seed, stats, reason=reason)
    if export_model and best_sk is not None:
        form.solve(plan_problem(inst, best_sk, profiles, scenarios, objective), backend,
                   SolveOptions(time_limit_s=time_limit_s, seed=seed, export_path=export_model))
    bound = min(incumbent, open_bound)
    # unproven for want of time: TIMEOUT; for a skeleton no backend could prove: FEASIBLE
    status = SolveStatus.OPTIMAL if bound >= incumbent * (1 - OPTIMALITY_TOLERANCE) else \
        SolveStatus.TIMEOUT if out_of_time else SolveStatus.FEASIBLE
    if seeded is not None:
        seeded["kept"] = best_sk is None
    return SearchResult(status, best, incumbent, bound, wall, form.name, backend, time_limit_s, seed, stats, best_sk,
                        reason=_errors_reason(errors), warm_start=seeded)


WARM_START_PLANNERS = ("amp-like", "proportional")
"""Cheap heuristics whose best plan starts the search; they also reach plans outside the search's space
(uniform layouts across every device class, templates over more classes than max_classes), so the answer is
never worse than theirs. `megatron`'s plans are among amp-like's candidates (the same layouts, even split)."""


def seed_incumbent(inst: Instance, profiles: Profiles, scenarios, objective: str, budget_s: float) -> dict | None:
    """The best heuristic plan under the objective (each planner gets `budget_s`), or None."""
    from hetopt.baselines.registry import PLANNERS
    from hetopt.evaluate import evaluate
    from hetopt.search.robust import aggregate

    best = None
    for name in WARM_START_PLANNERS:
        found = PLANNERS[name](inst, budget_s, profiles)
        if found.plan is None:
            continue
        times = [evaluate(inst, found.plan, profiles, cluster=sc.cluster).iteration_time_s for sc in scenarios]
        t = aggregate(times, [sc.probability for sc in scenarios], objective, CVAR_ALPHA)
        if best is None or t < best["objective_s"]:
            best = {"planner": name, "objective_s": t, "plan": found.plan}
    return best


@dataclass(frozen=True)
class PairSubgroup:
    """A pair group at fixed replica counts and recompute mode; its skeletons differ in the shares."""

    group: PairGroup
    ra: int
    rb: int
    recompute: str

    @property
    def size(self) -> int:
        return len(self.group.shares(self.ra, self.rb)) * len(orders(max(self.ra, self.rb)))


@dataclass(frozen=True)
class PairRange:
    """The replica counts of a pair group not yet expanded: (ra, r) for every r ≤ rb — and with `rows`
    also every ra' < ra with any rb. The throughput bound falls with every replica count, so its value at
    (ra, rb) bounds the whole range; expanding peels off the top row or the top cell."""

    group: PairGroup
    ra: int
    rb: int
    rows: bool
    modes: tuple[str, ...]


@dataclass(frozen=True)
class Bucket:
    """A one-template family at one replica count R (its groups differ in stages per class)."""

    family: Family
    replicas: int


class _Bounds:
    """Lower bounds and memory pruning for the heap's items, from compute and memory alone (no placement):
    every item is keyed by a bound on all the skeletons in it and expanded only when it reaches the top."""

    def __init__(self, inst: Instance, profiles: Profiles, options: SearchOptions, stats: SearchStats) -> None:
        self.inst, self.profiles, self.options, self.stats = inst, profiles, options, stats

    def _fits(self, b: int, rc: str, segments: tuple, replicas_total: int) -> bool:
        return template_fits(self.inst, self.profiles, b, rc, segments, replicas_total)

    def _group_key(self, group) -> float | None:
        """A bound on a group at its largest replica counts (the most ZeRO sharding: least memory, and the
        smallest compute bound) and the least-work recompute mode that fits (recompute only adds work);
        None when no mode fits, so no skeleton of it can hold the model."""
        inst, prof = self.inst, self.profiles
        if isinstance(group, SkeletonGroup):
            top = max(group.replica_options)
            # by increasing work: the first mode that fits bounds every mode that does
            rc = next((rc for rc in sorted(group.recompute_options, key=DEFAULT_RECOMPUTE.index)
                       if self._fits(group.micro_batch, rc, group.segments, top)), None)
            if rc is None:
                self.stats.pruned[MEMORY_RULE] += group.size
                return None
            return group_bound(inst, prof, group.micro_batch, rc, group.segments,
                               group.total_micro_batches // top)
        modes = self._pair_modes(group, group.recompute_options, max(group.a_replicas) + max(group.b_replicas))
        if not modes:
            self.stats.pruned[MEMORY_GROUPS_RULE] += 1
            return None
        return throughput_bound(inst, prof, group.micro_batch, least_work(modes), [(group.a,), (group.b,)],
                                [max(group.a_replicas), max(group.b_replicas)], group.total_micro_batches)

    def _pair_modes(self, group: PairGroup, modes, replicas_total: int) -> tuple[str, ...]:
        """The recompute modes in which both templates can hold the model, ZeRO over `replicas_total`."""
        return tuple(rc for rc in modes if self._fits(group.micro_batch, rc, (group.a,), replicas_total)
                     and self._fits(group.micro_batch, rc, (group.b,), replicas_total))

    def _range(self, r: PairRange) -> tuple[float, PairRange]:
        g = r.group
        return throughput_bound(self.inst, self.profiles, g.micro_batch, least_work(r.modes), [(g.a,), (g.b,)],
                                [r.ra, r.rb], g.total_micro_batches), r

    def expand(self, item) -> list[tuple[float, object]]:
        inst, prof = self.inst, self.profiles
        out: list[tuple[float, object]] = []
        if isinstance(item, Family) and not item.pair:
            for r in item.replica_counts(self.stats):
                out.append((bucket_bound(inst, prof, item, r, self.options.max_stages), Bucket(item, r)))
        elif isinstance(item, (Family, Bucket)):
            family, r = (item, None) if isinstance(item, Family) else (item.family, item.replicas)
            for group in family.groups(inst, self.options, self.stats, r):
                key = self._group_key(group)
                if key is not None:
                    out.append((key, group))
        elif isinstance(item, SkeletonGroup):
            for sk in item.skeletons():
                if self._fits(sk.micro_batch, sk.recompute, item.segments, sk.templates[0].replicas):
                    out.append((compute_lower_bound(inst, sk, prof), sk))
                else:
                    self.stats.pruned[MEMORY_RULE] += 1
        elif isinstance(item, PairGroup):
            modes = self._pair_modes(item, item.recompute_options, max(item.a_replicas) + max(item.b_replicas))
            if modes:
                out.append(self._range(PairRange(item, max(item.a_replicas), max(item.b_replicas), True, modes)))
        elif isinstance(item, PairRange):
            g = item.group
            if item.rows:  # the top row as a range of its own, and the rows below
                out.append(self._range(PairRange(g, item.ra, item.rb, False, item.modes)))
                if item.ra > 1:
                    out.append(self._range(PairRange(g, item.ra - 1, item.rb, True, item.modes)))
            else:  # the top cell's subgroups, and the rest of the row
                if item.rb > 1:
                    out.append(self._range(PairRange(g, item.ra, item.rb - 1, False, item.modes)))
                if g.shares(item.ra, item.rb):
                    fitting = self._pair_modes(g, item.modes, item.ra + item.rb)
                    for rc in item.modes:
                        sub = PairSubgroup(g, item.ra, item.rb, rc)
                        self.stats.enumerated += sub.size
                        if rc in fitting:
                            out.append((pair_bound(inst, prof, g.micro_batch, rc, [(g.a,), (g.b,)],
                                                   [item.ra, item.rb], g.total_micro_batches), sub))
                        else:
                            self.stats.pruned[MEMORY_RULE] += sub.size
        else:
            for sk in item.group.skeletons_of(item.ra, item.rb, item.recompute):
                out.append((compute_lower_bound(inst, sk, prof), sk))
        return out


def _count_bound_pruned(stats: SearchStats, item) -> None:
    """What the bound proves no better, counted in skeletons where they are known without generating."""
    if isinstance(item, Family):
        stats.pruned["bound: whole families never generated (device classes × TP degrees)"] += 1
    elif isinstance(item, Bucket):
        stats.pruned["bound: families at one replica count never generated"] += 1
    elif isinstance(item, PairGroup):
        stats.pruned["bound: two-template groups never expanded"] += 1
    elif isinstance(item, PairRange):
        stats.pruned["bound: two-template replica-count ranges never expanded"] += 1
    else:
        stats.pruned[BOUND_RULE] += 1 if isinstance(item, Skeleton) else item.size


BOUND_RULE = "bound: compute lower bound ≥ incumbent"
MEMORY_GROUPS_RULE = "memory: two-template groups whose stages cannot hold the model"
MEMORY_RULE = "memory: a stage cannot hold a layer or the stages cannot hold the model"


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
    main_file = getattr(sys.modules["__main__"], "__file__", None)
    if workers <= 1 or (main_file is not None and not os.path.exists(main_file)):
        return None  # a spawned worker re-imports __main__, which a script read from stdin cannot be
    # spawn, not fork: the solver libraries keep thread pools that a forked child would inherit half-locked
    return ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn"),
                               initializer=_init_worker, initargs=(ctx,))


def _solve_with(ctx: _Context, sk: Skeleton, left_s: float):
    """Place, linearise and solve one skeleton: ("solved", solution, exact time) or (prune rule, None, inf)."""
    try:
        pr = plan_problem(ctx.inst, sk, ctx.profiles, ctx.scenarios, ctx.objective)
    except InfeasibleError:
        return "placement: TP groups do not pack onto the nodes", None, math.inf
    for template in pr.base.templates:
        max_layers = template.max_layers()
        if min(max_layers) < 1 or sum(max_layers) < ctx.inst.model.layers:
            return MEMORY_RULE, None, math.inf
    # a backend that fails hands the skeleton to the next one; sol.attempts says which failed
    hint = tuple(x for t in pr.base.templates for x in speed_split(t))
    sol = solve_skeleton(pr, ctx.formulation, ctx.backend,
                         SolveOptions(time_limit_s=left_s, seed=ctx.seed, hint=hint))
    return "solved", sol, (pr.iteration_time(sol.layers) if sol.layers is not None else math.inf)


def _record_fallbacks(stats: SearchStats, sk: Skeleton, sol: SplitSolution,
                      errors: list[str]) -> None:
    """Count the backends that failed on a skeleton and who took it over ("none": all failed)."""
    for attempt in sol.attempts:
        taker = sol.backend if sol.status != SolveStatus.ERROR else "none"
        stats.fallbacks[(attempt.backend, taker, attempt.detail)] += 1
    if sol.status == SolveStatus.ERROR:
        errors.append(f"{sk.describe()}: {sol.detail}")


def _errors_reason(errors: list[str], shown: int = 3) -> str:
    if not errors:
        return ""
    more = f" (and {len(errors) - shown} more)" if len(errors) > shown else ""
    return f"every backend failed on {len(errors)} skeleton(s): " + "; ".join(errors[:shown]) + more


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

"""Best-first search over skeletons with a proven bound (docs/planner.md).

The plan space is a tree (hetopt.search.tree): families of device classes and TP degrees at the
root, then replica counts, groups and two-template ranges, then skeletons as leaves; every node
carries a lower bound on all the skeletons under it (hetopt.search.bounds) and is expanded only
when it reaches the top of the heap. For each leaf the skeleton is placed (else pruned: placement),
the evaluator is linearised (hetopt.search.linear), a stage that cannot hold a layer drops it
(pruned: memory), and its integer program is solved. The search stops when the next bound is no
better than the incumbent: every node left is proven no better (pruned: bound), and the plan is
optimal. Bounds before placement price sends at the fastest planning cluster, so they hold under
every scenario and for every robust objective (each is at least the smallest T_s); a placed
skeleton's bound prices each scenario and combines them as the objective.

`solve_exact` runs a `SearchRun` (hetopt.search.run): `seed` the best plan known (the caller's
seeds: heuristic plans, a running plan), `plant` the roots, then `select` leaves, solve them
(hetopt.search.leaves), `absorb` each result, and `answer`. With a time limit the search stops early
and reports the best plan, the smallest bound of what it did not finish, and the gap between them. A
search still solving after PARALLEL_AFTER_S solves the next few skeletons by bound side by side
(hetopt.executors): in worker processes on both cores, or with `executor="ray"` on Ray actors,
locally or across a cluster's machines, while the search absorbs the batch before and selects the
next. Either way a batch's outcomes are absorbed in the best-first order they were selected in, each
batch selected with the incumbent of two batches before, so the order, the proof and the answer are
the same. With SearchRequest.subtrees (by default from subtrees.SUBTREE_WORKERS workers) the
workers also expand the tree's inner nodes (hetopt.search.subtrees) while the search dives.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence

from hetopt.executors import check_executor, open_pool
from hetopt.lifeline import Terminated
from hetopt.search.bounds.run import Bounds
from hetopt.search.budget import Budget
from hetopt.search.dispatch import pick
from hetopt.search.formulation import Formulation, SolveOptions, clock
from hetopt.search.leaves import LeafContext, plan_problem
from hetopt.search.polish import polish
from hetopt.search.robust import planning_scenarios
from hetopt.search.run import SearchResult, SearchRun
from hetopt.search.subtrees import (
    LEAF,
    SUBTREE,
    SUBTREE_NODES,
    SUBTREE_ROOTS,
    SUBTREE_WORKERS,
    work,
)
from hetopt.search.tree.base import Expanded, Node, Tree
from hetopt.search.types import (
    Progress,
    SearchOptions,
    SearchRequest,
    Seed,
    on_searched_gpus,
)

PARALLEL_AFTER_S = 2.0
"""By default workers start once skeletons have been solved for this long: starting worker
processes (spawn, imports) costs more than solving a small instance takes (benchmarks page)."""

NARROW_SHARE = 0.5
"""With search.pair_classes > 1 or search.tp_per_stage, the share of the time limit the default
space (pairs of single-class templates, one TP per class) is searched in first. The tree then holds
only the rest of the space (SearchOptions.beyond_narrow), from the subspace's optimum as incumbent,
and the subspace's bound stays open beside the rest's (`SearchRun.subspace`). The wider space's
pairs keep weak bounds, and best-first over the whole space can spend the limit before it solves a
skeleton; tp_per_stage multiplies the families. Searching the subspace first, then only the rest,
searches each skeleton once."""

POLISH_SEARCH_SHARE = 0.1
"""The most of the time limit the search spends climbing from the incumbents its tree finds
(`_Loop._polish`), while the workers solve the next batch."""


RUNNERS_UP_SHARE = 0.5
"""The part of the climbing time (POLISH_SEARCH_SHARE) that climbs from runners-up may take; the
rest is kept for incumbents."""


def solve_exact(
    request: SearchRequest, seeds: Sequence[Seed] = (), progress: Progress | None = None
) -> SearchResult:
    """The best plan of the instance's plan space, proven optimal unless the time limit ends the
    search.

    Parameters: request — the instance, the plan space, the formulation and backend, the time limit
    and where skeletons are solved (SearchRequest); seeds — plans known already (heuristic plans,
    the running plan re-split), the best of them the first incumbent; progress — called after each
    solved skeleton.
    Returns: a SearchResult — status optimal (bound = objective), timeout (best plan, smallest open
    bound and gap) or infeasible (with the binding constraint in `reason`).
    Raises: InputError for an unknown executor, an address without `ray`, or `ray` not installed.
    """
    start = clock()  # the time limit holds from here: the formulations' imports count too
    executor = check_executor(request.executor, request.address)  # bad input: before any work
    form = pick(request.formulation, request.backend)
    inst, options, profiles = request.inst, request.space, request.weights
    scenarios = planning_scenarios(inst, request.objective)
    run = SearchRun(inst, options, request.time_limit_s, profiles, start)
    # search.pair_classes > 1 or tp_per_stage: the narrowed subspace is searched first, then this
    # tree holds only the rest of the space
    narrow_first = request.narrow_first and _has_subspace(options)
    budget = (
        Budget.of(inst, options.max_usd_per_hour) if options.max_usd_per_hour is not None else None
    )
    tree = Tree(
        inst,
        dataclasses.replace(options, beyond_narrow=narrow_first),
        run.stats,
        Bounds(inst, profiles, [sc.instance.cluster for sc in scenarios]),
        budget,
    )
    ctx = LeafContext(
        inst,
        profiles,
        scenarios,
        request.objective,
        form.name,
        request.backend,
        request.seed,
        tree.options,
        tree.budget,
    )
    loop = _Loop(run, ctx, executor, request.workers, request.address, progress)
    loop.subtrees = request.subtrees
    loop.polishing(options, request.polish_s)
    # a plan with stages on GPU types search.gpus leaves out is no point of this space
    seeds = [s for s in seeds if on_searched_gpus(s.plan, options)]
    if tree.budget is not None:  # a plan over the budget is no point of this space either
        seeds = [s for s in seeds if tree.budget.admits(inst, s.plan)]
    best = min(seeds, key=lambda s: s.objective_s, default=None)
    try:
        if narrow_first:
            best = _narrow_first(request, options, best, seeds, progress, run)
        run.seed(best)
        if progress is not None and best is not None:  # the first incumbent, before the roots
            progress(run.standing())
        if request.polish_s > 0 and seeds and not narrow_first:  # else the subspace's search did
            polished = polish(ctx, options, seeds, min(request.polish_s, run.left_s()))
            if polished and (best is None or polished[0].objective_s < best.objective_s):
                best = polished[0]
                run.seed(best)
                loop.polished.add(best.skeleton)  # the climb ended there
                if progress is not None:
                    progress(run.standing())
        run.plant(tree)  # after the seeds: within what time they leave
        if progress is not None:
            progress(run.standing())
        loop.solve()
    except BaseException as stop:
        loop.abort()  # Ctrl-C, SIGTERM or an error: the workers stop now, not after their jobs
        if isinstance(stop, (KeyboardInterrupt, Terminated)):  # the best plan so far, gap proven
            _keep_best_so_far(stop, run, best, loop.in_flight())
            stop.best_so_far = run.answer(form.name, request.backend, request.seed)
        raise
    finally:
        loop.close()
    result = run.answer(form.name, request.backend, request.seed)
    result.executor = executor
    if request.export_model and result.skeleton is not None:
        _export_model(request, form, result, scenarios)
    return result


class _Loop:
    """Select leaves, solve them and absorb the outcomes until the search ends: in this process,
    or by workers (processes or Ray actors) once the search has run for PARALLEL_AFTER_S (at once
    when `workers` is given). The workers solve one batch while the search absorbs the last and
    selects the next, with the incumbent of one batch before: it prunes less, never wrongly."""

    def __init__(
        self,
        run: SearchRun,
        ctx: LeafContext,
        executor: str,
        workers: int | None,
        address: str | None,
        progress: Progress | None,
    ) -> None:
        self.run, self.ctx, self.executor, self.address = run, ctx, executor, address
        self.workers, self.progress = workers, progress
        self.subtrees: bool | None = None  # SearchRequest.subtrees
        self.pool = None
        # one try: a pool that cannot start (one CPU, a script from stdin) is not retried
        self.opened = workers is not None
        # the batch selected last: leaves alone, and chunks of subtrees, one per worker
        self.batch: list[tuple[Node, ...]] = []
        # a batch the workers are working on: (its units, the wait for them)
        self.pending = None
        self.options: SearchOptions | None = None
        self.polish_s = 0.0
        self.polished: set = set()  # skeletons climbed from
        self.polishing_s = 0.0  # spent climbing, in all

    def polishing(self, options: SearchOptions, polish_s: float) -> None:
        """Climb from each skeleton that becomes the incumbent for up to `polish_s` seconds
        (hetopt.search.polish), in all at most POLISH_SEARCH_SHARE of the time limit; 0: never."""
        self.options, self.polish_s = options, polish_s

    def solve(self) -> None:
        if self.workers is not None:
            self.pool = open_pool(self.executor, self.ctx, work, self.workers, self.address)
        since = clock()
        while True:
            if not self.opened and clock() - since > PARALLEL_AFTER_S:
                self.pool = open_pool(self.executor, self.ctx, work, None, self.address)
                self.opened = True
            if self.pool is None:
                self.batch = [(leaf,) for leaf in self.run.select(1)]
            elif not self._subtrees():
                self.batch = [(leaf,) for leaf in self.run.select(2 * self.pool.workers)]
            else:  # the workers expand subtrees too
                workers = self.pool.workers
                picked = self.run.select(2 * workers, SUBTREE_ROOTS * workers)
                inner = [node for node in picked if not node.is_leaf]
                chunks = [tuple(inner[w::workers]) for w in range(workers)]
                self.batch = [*((n,) for n in picked if n.is_leaf), *(c for c in chunks if c)]
            # a deadline: a job may wait in a worker's queue behind another (and the seconds
            # left, which a Ray worker whose clock runs behind this machine's still keeps to)
            left_s = self.run.left_s()
            limit = (time.time() + left_s, left_s)
            cutoff = self.run.next_key()  # best-first: what the search expands next
            jobs = [
                (LEAF, unit[0].skeleton, limit, self.run.incumbent)
                if unit[0].is_leaf
                else (SUBTREE, unit, limit, self.run.incumbent, SUBTREE_NODES, cutoff)
                for unit in self.batch
            ]
            if self.pool is None:  # in-process: solve and absorb at once
                if not self.batch:
                    return
                self._absorb(self.batch, [work(self.ctx, *job) for job in jobs])
                self._polish()
                continue
            launched = (self.batch, self.pool.submit(jobs)) if self.batch else None
            if self.pending is not None:
                self._absorb(self.pending[0], self.pending[1]())
                self._polish()
            if launched is None and self.pending is None:
                return
            self.pending = launched

    def _subtrees(self) -> bool:
        """Whether the workers expand subtrees besides solving leaves: as asked
        (SearchRequest.subtrees), else with SUBTREE_WORKERS workers or more."""
        assert self.pool is not None
        if self.subtrees is not None:
            return self.subtrees
        return self.pool.workers >= SUBTREE_WORKERS

    def _absorb(self, units: list[tuple[Node, ...]], outcomes: list) -> None:
        """Take in a batch's outcomes in the order it was selected in: a leaf's solve, or what a
        worker made of a chunk of subtrees."""
        for k, (unit, outcome) in enumerate(zip(units, outcomes, strict=True)):
            if isinstance(outcome, Expanded):
                self.run.absorb_subtree(outcome)
                continue
            self.run.absorb(unit[0], *outcome)
            if self.progress is not None and outcome[0] == "solved":
                # the nodes still open: the rest of this batch and any other in flight
                rest = [n for u in units[k + 1 :] for n in u]
                others = [n for n in self.in_flight() if all(n is not b for u in units for b in u)]
                self.progress(self.run.standing([*rest, *others]))

    def _polish(self) -> None:
        """Climb from the incumbent where the tree found it and it was not climbed from, else from
        the best runner-up (`SearchRun.runner_up`): the climb's best plan, where it beats the
        incumbent, is the incumbent."""
        run = self.run
        if self.polish_s <= 0 or self.options is None:
            return
        left_s = min(self.polish_s, POLISH_SEARCH_SHARE * run.time_limit_s - self.polishing_s)
        if left_s <= 0 or run.left_s() <= 0:
            return
        sk = run.best_sk
        if sk is not None and sk not in self.polished:
            seed = Seed("search", run.incumbent, run.best, sk)
        elif self.polishing_s >= RUNNERS_UP_SHARE * POLISH_SEARCH_SHARE * run.time_limit_s:
            return  # the rest is kept for the incumbents the tree finds later
        elif (seed := run.runner_up(self.polished)) is None:
            return
        self.polished.add(seed.skeleton)
        began = clock()
        found = polish(self.ctx, self.options, [seed], min(left_s, run.left_s()))
        self.polishing_s += clock() - began
        if found:
            run.adopt(found[0])
            self.polished.add(found[0].skeleton)
            if self.progress is not None:
                self.progress(run.standing(self.in_flight()))

    def in_flight(self) -> list[Node]:
        """The nodes selected and not absorbed (leaves being solved, subtrees being expanded):
        their bounds stay open."""
        units = [*(self.pending[0] if self.pending else []), *self.batch]
        return [node for unit in units for node in unit]

    def abort(self) -> None:
        if self.pool is not None:
            self.pool.abort()
            self.pool = None

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()
            self.pool = None


def _has_subspace(options: SearchOptions) -> bool:
    """Whether the space is wider than the default subspace searched first (NARROW_SHARE)."""
    return (options.pair_classes > 1 and options.max_templates >= 2) or options.tp_per_stage


def _narrow_first(
    request: SearchRequest,
    options: SearchOptions,
    best: Seed | None,
    seeds: Sequence[Seed],
    progress: Progress | None,
    run: SearchRun,
) -> Seed | None:
    """The space with pair_classes 1 and one TP per class (its subspace), searched for
    NARROW_SHARE of the time limit from `seeds` (the polish climbs from them there), its result
    taken into `run` (its bound covers the subspace).
    Returns: the better of `best` and the subspace's plan (with its skeleton), the rest's first
    incumbent."""
    narrowed = {"pair_classes": 1, "tp_per_stage": False}
    keys = [f"{k} {str(v).lower()}" for k, v in narrowed.items() if getattr(options, k) != v]
    narrow = solve_exact(
        dataclasses.replace(
            request,
            options=dataclasses.replace(options, **narrowed),
            time_limit_s=NARROW_SHARE * request.time_limit_s,
            export_model=None,
        ),
        list(seeds),
        progress,
    )
    run.subspace(narrow)
    if narrow.plan is None or (best is not None and best.objective_s <= narrow.objective_s):
        return best
    return Seed("ilp, search." + ", ".join(keys), narrow.objective_s, narrow.plan, narrow.skeleton)


def _keep_best_so_far(
    stop: BaseException, run: SearchRun, best: Seed | None, in_flight: list[Node]
) -> None:
    """An interrupted search's answer: the plan found so far (the subspace search's, interrupted
    inside it, or the best seed), with every bound not finished kept open."""
    inner = getattr(stop, "best_so_far", None)  # the narrow-first search's, interrupted inside
    if inner is not None:
        run.stats.add(inner.stats)
    if run.best is None and inner is not None and inner.plan is not None:
        run.seed(Seed("ilp (interrupted)", inner.objective_s, inner.plan, inner.skeleton))
    elif run.best is None and best is not None:
        run.seed(best)
    run.interrupt(in_flight)


def _export_model(
    request: SearchRequest, form: Formulation, result: SearchResult, scenarios: list
) -> None:
    """The best skeleton's solver model, written to request.export_model (--export-model)."""
    problem = plan_problem(
        request.inst, result.skeleton, request.weights, scenarios, request.objective
    )
    form.solve(
        problem,
        request.backend,
        SolveOptions(
            time_limit_s=request.time_limit_s, seed=request.seed, export_path=request.export_model
        ),
    )

"""Best-first search over skeletons with a proven bound (DESIGN 4).

The plan space is a tree (hetopt/search/tree.py): families of device classes and TP degrees at the
root, then replica counts, groups and two-template ranges, then skeletons as leaves; every node
carries a lower bound on all the skeletons under it (hetopt/search/bounds.py) and is expanded only
when it reaches the top of the heap. For each leaf the skeleton is placed (else pruned: placement),
the evaluator is linearised (hetopt/search/linear.py), a stage that cannot hold a layer drops it
(pruned: memory), and its integer program is solved. The search stops when the next bound is no
better than the incumbent: every node left is proven no better (pruned: bound), and the plan is
optimal. Bounds before placement price sends at the fastest planning cluster, so they hold under
every scenario and for every robust objective (each is at least the smallest T_s); a placed
skeleton's bound prices each scenario and combines them as the objective.

`solve_exact` runs `_Run`: `plant` the roots, `seed` a heuristic incumbent, then `select` leaves,
solve them, `absorb` each result, and `answer`. With a time limit the search stops early and reports
the best plan, the smallest bound of what it did not finish, and the gap between them. A search
still solving after PARALLEL_AFTER_S solves the next few skeletons by bound side by side
(hetopt/executors.py): in worker processes on both cores, or with `executor="ray"` on Ray actors,
locally or across a cluster's machines, while the search absorbs the batch before and selects the
next. Either way a batch's outcomes are absorbed in the best-first order they were selected in, each
batch selected with the incumbent of two batches before, so the order, the proof and the answer are
the same.
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import math
import time
from dataclasses import dataclass, field

from hetopt.cost.flops import total_params
from hetopt.cost.memory import GIB, GRAD_BYTES, OPTIMIZER_BYTES, WEIGHT_BYTES
from hetopt.cost.profiles import Profiles
from hetopt.errors import InfeasibleError
from hetopt.executors import check_executor, open_pool
from hetopt.lifeline import Terminated
from hetopt.placement import place
from hetopt.plan import Plan
from hetopt.search.backends import solve_skeleton
from hetopt.search.bounds import Bounds
from hetopt.search.formulation import SolveOptions, SolveStatus, SplitSolution, clock, pick
from hetopt.search.linear import PlanProblem, split_problem
from hetopt.search.robust import CVAR_ALPHA, planning_scenarios
from hetopt.search.space import SearchOptions, SearchStats, Skeleton, outside_space
from hetopt.search.tree import MEMORY_RULE, Node, SkeletonNode, Tree
from hetopt.spec.instance import Instance

PARALLEL_AFTER_S = 2.0
"""By default workers start once skeletons have been solved for this long: starting worker processes
(spawn, imports) costs about a second, a local Ray about four, more than solving a small instance
takes."""
PLACED_BOUND_RULE = "bound: placed skeleton's bound (communication included) ≥ incumbent"
OPTIMALITY_TOLERANCE = 1e-9
"""Relative: a bound within this of the incumbent proves optimality (CP-SAT adds its own scaling
tolerance)."""


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
    """The best heuristic plan the search started from: its planner and time, and whether it
    stood."""
    executor: str = "process"
    """Where skeletons were solved side by side: `process` or `ray` (hetopt/executors.py)."""
    errors: list[str] = field(default_factory=list)
    """The skeletons every backend failed on, with the solvers' words (`reason` sums them up)."""
    proof_tolerance: float = 0.0
    """Relative: the largest tolerance a skeleton's proof carried (its formulation's)."""

    @property
    def gap(self) -> float:
        if (
            self.plan is None
            or not math.isfinite(self.objective_s)
            or not math.isfinite(self.bound_s)
        ):
            return math.inf  # no bound proven (a heuristic's plan): no gap to report
        return max(0.0, (self.objective_s - self.bound_s) / self.objective_s)


def solve_exact(
    inst: Instance,
    formulation: str | None = None,
    backend: str = "highs",
    time_limit_s: float = 60.0,
    seed: int = 0,
    options: SearchOptions | None = None,
    profiles: Profiles | None = None,
    export_model: str | None = None,
    progress=None,
    objective: str = "stable",
    workers: int | None = None,
    warm_start: bool = True,
    executor: str = "process",
    address: str | None = None,
    incumbent: dict | None = None,
) -> SearchResult:
    """The best plan of the instance's plan space, proven optimal unless the time limit ends the
    search.

    Parameters: inst — the instance; formulation, backend — how each skeleton is solved (`hetopt
    formulations`); time_limit_s — wall-clock budget; seed — solver seed; options — the plan space
    (default: the instance's `search:` section); profiles — calibrated weights (default: shipped);
    export_model — write the best skeleton's model here; progress — called as progress(skeletons
    solved, incumbent s); objective — stable, expected, worst or cvar over the instance's scenarios;
    workers — workers solving skeletons side by side (default: up to 2 on this machine, one per CPU
    of a Ray cluster at `address`, started after PARALLEL_AFTER_S; given, they start at once);
    warm_start — start from the best heuristic plan (WARM_START_PLANNERS); executor — `process`
    (worker processes here) or `ray` (Ray actors; a local Ray started on demand and shut down
    afterwards, or the cluster at `address`), with the same answer;
    incumbent — a plan known already, {"planner": its source, "objective_s": its objective, "plan":
    the plan} (`hetopt replan`: the running plan re-split), the first incumbent where it beats the
    warm start.
    Returns: a SearchResult — status optimal (bound = objective), timeout (best plan, smallest open
    bound and gap) or infeasible (with the binding constraint in `reason`).
    Raises: InputError for an unknown executor, an address without `ray`, or `ray` not installed."""
    executor = check_executor(executor, address)  # before any work: bad input is reported at once
    form = pick(formulation, backend)
    scenarios = planning_scenarios(inst, objective)
    options = options or SearchOptions.from_instance(inst)
    profiles = profiles or Profiles()
    run = _Run(inst, options, time_limit_s, profiles)
    # search.pair_classes > 1 or tp_per_stage: the narrowed subspace is searched first
    # (_narrow_first), then this tree holds only the rest of the space
    narrow_first = warm_start and (
        (options.pair_classes > 1 and options.max_templates >= 2) or options.tp_per_stage
    )
    tree = Tree(
        inst,
        dataclasses.replace(options, beyond_narrow=narrow_first),
        run.stats,
        Bounds(inst, profiles, [sc.instance.cluster for sc in scenarios]),
    )
    ctx = _Context(inst, profiles, scenarios, objective, form.name, backend, seed)
    lazy = workers is None
    pool = None
    opened = (
        not lazy
    )  # one try: a pool that cannot start (one CPU, a script from stdin) is not retried
    batch: list = []
    pending = (
        None  # a batch the workers are solving: (its leaves, the call that waits for its outcomes)
    )
    seeded = None  # the heuristic seed, kept for an interrupt during the narrow-first search

    def absorb(batch, outcomes) -> None:
        for node, outcome in zip(batch, outcomes, strict=True):
            run.absorb(node, *outcome)
            if progress is not None and outcome[0] == "solved":
                progress(run.stats.solved, run.incumbent)

    try:
        if warm_start:  # heuristic plans as the first incumbent: the bound prunes from the start
            seeded = seed_incumbent(inst, profiles, scenarios, objective, 0.05 * time_limit_s)
            if narrow_first:
                seeded, narrow = _narrow_first(
                    inst,
                    form.name,
                    backend,
                    NARROW_SHARE * time_limit_s,
                    seed,
                    options,
                    profiles,
                    progress,
                    objective,
                    workers,
                    executor,
                    address,
                    seeded,
                )
                run.subspace(narrow)
            run.seed(seeded)
        if incumbent is not None and (
            run.seeded is None or incumbent["objective_s"] < run.incumbent
        ):
            run.seed(dict(incumbent))
        run.plant(tree)  # after the seeds: within what time they leave
        if not lazy:
            pool = open_pool(executor, ctx, _solve_with, workers, address)
        solving_since = clock()
        while True:
            if not opened and clock() - solving_since > PARALLEL_AFTER_S:
                pool, opened = open_pool(executor, ctx, _solve_with, None, address), True
            batch = run.select(2 * pool.workers if pool is not None else 1)
            # a deadline: a job may wait in a worker's queue behind another (and the seconds left,
            # which a Ray worker whose clock runs behind this machine's still keeps to)
            left_s = run.left_s()
            jobs = [
                (node.skeleton, (time.time() + left_s, left_s), run.incumbent) for node in batch
            ]
            if pool is None:  # in-process: solve and absorb at once
                if not batch:
                    break
                absorb(batch, [_solve_with(ctx, *job) for job in jobs])
                continue
            # the workers solve this batch while the search absorbs the last one and selects the
            # next (with the incumbent of one batch before: it prunes less, never wrongly)
            launched = (batch, pool.submit(jobs)) if batch else None
            if pending is not None:
                absorb(pending[0], pending[1]())
            if launched is None and pending is None:
                break
            pending = launched
    except BaseException as stop:
        if (
            pool is not None
        ):  # Ctrl-C, SIGTERM or an error: the workers stop now, not after their jobs
            pool.abort()
            pool = None
        if isinstance(
            stop, (KeyboardInterrupt, Terminated)
        ):  # the best plan so far, with the gap proven
            in_flight = [*(pending[0] if pending else []), *batch]
            inner = getattr(
                stop, "best_so_far", None
            )  # the narrow-first search's, interrupted inside it
            if inner is not None:
                run.stats.add(inner.stats)
            if run.best is None and inner is not None and inner.plan is not None:
                run.seed(
                    {
                        "planner": "ilp (interrupted)",
                        "objective_s": inner.objective_s,
                        "plan": inner.plan,
                        "skeleton": inner.skeleton,
                    }
                )
            elif run.best is None and seeded is not None:
                run.seed(seeded)
            stop.best_so_far = run.interrupt(in_flight).answer(form.name, backend, seed)
        raise
    finally:
        if pool is not None:
            pool.close()
    result = run.answer(form.name, backend, seed)
    result.executor = executor
    if export_model and result.skeleton is not None:
        form.solve(
            plan_problem(inst, result.skeleton, profiles, scenarios, objective),
            backend,
            SolveOptions(time_limit_s=time_limit_s, seed=seed, export_path=export_model),
        )
    return result


class _Run:
    """The state of one best-first search: the open nodes, the incumbent and what is proven.

    `plant` the tree's roots, `seed` a heuristic incumbent, `select` the next leaves to solve
    (expanding the nodes above them), `absorb` each solved leaf, and `answer` with the result."""

    def __init__(
        self,
        inst: Instance,
        options: SearchOptions,
        time_limit_s: float,
        profiles: Profiles | None = None,
    ) -> None:
        self.inst, self.options, self.time_limit_s, self.start = (
            inst,
            options,
            time_limit_s,
            clock(),
        )
        self.profiles = profiles  # the speeds that lay out the space's stages with shards
        self.stats = SearchStats()
        self.heap: list[tuple[float, int, Node]] = []
        self.tie = itertools.count()
        self.tree: Tree | None = None
        self.incumbent, self.best, self.best_sk = math.inf, None, None
        self.seeded: dict | None = None
        self.seed_plan = None  # the seed's plan, while no skeleton beats it
        self.open_bound = math.inf  # the smallest bound among skeletons not finished
        self.timed_out = False  # something is left unproven
        self.selecting = (
            math.inf
        )  # the least bound of the nodes `select` has taken out of the heap so far
        self.out_of_time = (
            False  # the clock stopped the search (not only a skeleton no backend could solve)
        )
        self.errors: list[str] = []  # skeletons every backend failed on, with the solvers' words
        self.proof_tolerance = OPTIMALITY_TOLERANCE
        """Relative: the largest tolerance a skeleton's proof carries (its formulation's
        rel_tolerance)."""
        self.planted = (
            False  # every root of the tree is in the heap (else nothing is proven about the rest)
        )

    def plant(self, tree: Tree) -> None:
        """The tree's roots in the heap, within the time limit: a space of millions of families
        takes minutes to list, and the families not listed in time are not searched, so nothing is
        proven about them (the open bound 0: the answer is the incumbent with its gap unproven)."""
        self.tree = tree
        tree.tolerance = OPTIMALITY_TOLERANCE
        tree.incumbent = self.incumbent
        for n in tree.roots():
            self.heap.append((n.bound, next(self.tie), n))
            if len(self.heap) % 1024 == 0 and self.left_s() <= 0:
                self.timed_out = self.out_of_time = True
                self.open_bound = 0.0
                break
        else:
            self.planted = True
        heapq.heapify(self.heap)

    def subspace(self, narrow: SearchResult) -> None:
        """What the search of a subspace the tree leaves out proved: its bound stays open beside the
        tree's (unproven where it timed out or a skeleton's proof failed), within the tolerance of
        its proofs; its failed skeletons and its counts are the answer's too."""
        self.stats.add(narrow.stats)
        self.open_bound = min(self.open_bound, narrow.bound_s)
        self.proof_tolerance = max(self.proof_tolerance, narrow.proof_tolerance)
        self.errors += narrow.errors
        if narrow.status not in (SolveStatus.OPTIMAL, SolveStatus.INFEASIBLE):
            self.timed_out = True
            self.out_of_time = self.out_of_time or narrow.status == SolveStatus.TIMEOUT

    def seed(self, seeded: dict | None) -> None:
        if seeded is not None:
            self.seeded = seeded
            self.incumbent, self.best = seeded["objective_s"], seeded.pop("plan")
            self.best_sk = seeded.pop(
                "skeleton", None
            )  # a plan of a subspace's search comes with its own
            self.seed_plan = self.best
            if self.tree is not None:
                self.tree.incumbent = self.incumbent

    def left_s(self) -> float:
        return self.time_limit_s - (clock() - self.start)

    def _open(self, bound: float) -> bool:
        """Whether a node of this bound may still hold a better plan than the incumbent."""
        return bound < self.incumbent * (1 - OPTIMALITY_TOLERANCE)

    def select(self, size: int) -> list[SkeletonNode]:
        """Up to `size` leaves of smallest bound, expanding the nodes on the way; [] when the search
        ends: every open node is proven no better (counted as pruned), or the time is up (its bound
        kept open)."""
        assert self.tree is not None
        if not self.heap:
            return []
        if not self._open(self.heap[0][0]):
            return self._prune_rest()
        if self.left_s() <= 0:
            self.timed_out = self.out_of_time = True
            self.open_bound = min(self.open_bound, self.heap[0][0])
            return []
        batch: list[SkeletonNode] = []
        while self.heap and len(batch) < size and self._open(self.heap[0][0]):
            if self.left_s() <= 0:  # expanding a large tree takes seconds: the limit holds here too
                self.timed_out = self.out_of_time = True
                self.open_bound = min(self.open_bound, self.heap[0][0])
                break
            self.selecting = min(
                self.selecting, self.heap[0][0]
            )  # held by no heap while it is selected
            _, _, node = heapq.heappop(self.heap)
            if (
                node.is_leaf and not node.refined
            ):  # its own bound first: back in the heap if it rose
                node = self.tree.refine(node)
                if not self._open(node.bound):
                    node.count_pruned(self.stats)
                    continue
                if self.heap and node.bound > self.heap[0][0]:
                    heapq.heappush(self.heap, (node.bound, next(self.tie), node))
                    continue
            if node.is_leaf:
                batch.append(node)
            else:
                for child in node.expand(self.tree):
                    heapq.heappush(self.heap, (child.bound, next(self.tie), child))
        self.selecting = math.inf  # the batch goes to the caller, who holds it until it is absorbed
        if not batch and self.heap and not self._open(self.heap[0][0]):
            return (
                self._prune_rest()
            )  # expanding made only nodes the incumbent beats: the search ends here
        return batch

    def _prune_rest(self) -> list[SkeletonNode]:
        """Every open node is proven no better: counted as pruned, the heap emptied; no leaves
        ([])."""
        for _, _, node in self.heap:
            node.count_pruned(self.stats)
        self.heap.clear()
        return []

    def absorb(self, node: SkeletonNode, kind: str, sol, t: float) -> None:
        """Take in one leaf's outcome: a prune rule, or a solution and its exact (evaluator)
        time."""
        if kind != "solved":
            self.stats.pruned[kind] += 1
            return
        self.stats.solved += 1
        _record_fallbacks(self.stats, node.skeleton, sol, self.errors)
        if sol.status == SolveStatus.INFEASIBLE:
            return
        if sol.status != SolveStatus.OPTIMAL:  # not proven: its bound stays open
            self.timed_out = True
            self.out_of_time = self.out_of_time or sol.status == SolveStatus.TIMEOUT
        # a proof holds up to its formulation's tolerance: its bound joins the search's
        self.proof_tolerance = max(self.proof_tolerance, float(sol.extra.get("rel_tolerance", 0.0)))
        self.open_bound = min(self.open_bound, max(node.bound, sol.bound_s))
        # a tie with a heuristic seed goes to the search's plan: it is in the space the bound covers
        if sol.layers is not None and (
            t < self.incumbent or (self.best_sk is None and t <= self.incumbent * (1 + 1e-12))
        ):
            sk = node.skeleton
            self.incumbent, self.best_sk = t, sk
            self.best = sk.placed(sol.layers, self.inst.cluster, sol.recompute)
            if self.tree is not None:
                self.tree.incumbent = t

    def interrupt(self, in_flight: list) -> _Run:
        """Ctrl-C or SIGTERM mid-search: the skeletons not finished (in the heap or being solved)
        keep their bounds open, as at a time-out, so the answer's gap is one the search proved."""
        self.timed_out = self.out_of_time = True
        heapq.heapify(self.heap)  # an interrupt may come while the roots are being listed
        self.open_bound = min(
            [
                self.open_bound,
                self.selecting,
                *(self.heap[0][:1] if self.heap else []),
                *(node.bound for node in in_flight),
            ]
        )
        if not self.planted:  # roots not listed yet: nothing is proven about them
            self.open_bound = 0.0
        return self

    def answer(self, formulation: str, backend: str, seed: int) -> SearchResult:
        wall = clock() - self.start
        if self.best is None:
            status = (
                SolveStatus.ERROR
                if self.errors
                else SolveStatus.TIMEOUT
                if self.timed_out
                else SolveStatus.INFEASIBLE
            )
            reason = (
                _errors_reason(self.errors)
                if self.errors
                else ""
                if self.timed_out
                else diagnose(self.inst, self.stats)
            )
            return SearchResult(
                status,
                None,
                math.inf,
                self.open_bound if self.timed_out else math.inf,
                wall,
                formulation,
                backend,
                self.time_limit_s,
                seed,
                self.stats,
                reason=reason,
                errors=self.errors,
                proof_tolerance=self.proof_tolerance,
            )
        bound = min(self.incumbent, self.open_bound)
        proven = bound >= self.incumbent * (1 - self.proof_tolerance)
        if self.seeded is not None:
            self.seeded["kept"] = self.best is self.seed_plan
            if self.seeded["kept"]:  # the answer is the seed's plan: say whether the space holds it
                self.seeded["outside_space"] = outside_space(
                    self.inst, self.best, self.options, self.profiles
                )
        # unproven for want of time: TIMEOUT; for a skeleton no backend could prove, or a plan that
        # no plan of the space beats but that the space does not hold (a heuristic's, kept):
        # FEASIBLE — "optimal" is a promise about a point of the searched space
        outside = bool(self.seeded is not None and self.seeded.get("outside_space"))
        status = (
            SolveStatus.OPTIMAL
            if proven and not outside
            else SolveStatus.TIMEOUT
            if not proven and self.out_of_time
            else SolveStatus.FEASIBLE
        )
        return SearchResult(
            status,
            self.best,
            self.incumbent,
            bound,
            wall,
            formulation,
            backend,
            self.time_limit_s,
            seed,
            self.stats,
            self.best_sk,
            reason=_errors_reason(self.errors),
            warm_start=self.seeded,
            errors=self.errors,
            proof_tolerance=self.proof_tolerance,
        )


WARM_START_PLANNERS = ("amp-like", "proportional")
"""Cheap heuristics whose best plan starts the search; they also reach plans outside the search's
space (uniform layouts across every device class, templates over more classes than max_classes), so
the answer is never worse than theirs. `megatron`'s plans are among amp-like's candidates (the same
layouts, even split)."""


def plan_objective(inst: Instance, plan, profiles: Profiles, scenarios, objective: str) -> float:
    """A plan's objective, seconds: the evaluator's iteration time in each planning scenario,
    aggregated as the objective says (stable, expected, worst or cvar; hetopt.search.robust)."""
    from hetopt.evaluate import evaluate
    from hetopt.search.robust import aggregate

    plan = place(
        plan, inst.cluster
    )  # one placement, on the file's network, priced on each scenario's
    times = [evaluate(sc.instance, plan, profiles).iteration_time_s for sc in scenarios]
    return aggregate(times, [sc.probability for sc in scenarios], objective, CVAR_ALPHA)


NARROW_SHARE = 0.5
"""With search.pair_classes > 1 or search.tp_per_stage, the share of the time limit the default
space (pairs of single-class templates, one TP per class) is searched in first; then the tree holds
only the rest of the space (SearchOptions.beyond_narrow), from the subspace's optimum as incumbent,
and the subspace's bound stays open beside the rest's (`_Run.subspace`). The wider space's pairs
keep weak bounds, and best-first over the whole space can spend the limit before it solves a
skeleton (scale-4096: 9% open, the warm start kept, worse than the default space's optimum;
benchmarks/results.md); tp_per_stage multiplies the families (cloud-mix: 3.3 million with a split
for every class, and no skeleton beat the warm start in 120 s). Searching the subspace first, then
only the rest, searches each skeleton once."""


def _narrow_first(
    inst: Instance,
    formulation: str,
    backend: str,
    time_limit_s: float,
    seed: int,
    options: SearchOptions,
    profiles: Profiles,
    progress,
    objective: str,
    workers,
    executor: str,
    address,
    seeded: dict | None,
) -> tuple[dict | None, SearchResult]:
    """The space with pair_classes 1 and one TP per class (its subspace), searched for
    `time_limit_s`: (the better of the heuristic seed and its best plan, with its skeleton, as the
    rest's first incumbent; its result, whose bound covers the subspace)."""
    narrowed = {"pair_classes": 1, "tp_per_stage": False}
    keys = [
        f"{key} {str(value).lower()}"
        for key, value in narrowed.items()
        if getattr(options, key) != value
    ]
    narrow = solve_exact(
        inst,
        formulation,
        backend,
        time_limit_s,
        seed,
        dataclasses.replace(options, **narrowed),
        profiles,
        progress=progress,
        objective=objective,
        workers=workers,
        executor=executor,
        address=address,
    )
    if narrow.plan is None or (seeded is not None and seeded["objective_s"] <= narrow.objective_s):
        return seeded, narrow
    return {
        "planner": "ilp, search." + ", ".join(keys),
        "objective_s": narrow.objective_s,
        "plan": narrow.plan,
        "skeleton": narrow.skeleton,
    }, narrow


def seed_incumbent(
    inst: Instance, profiles: Profiles, scenarios, objective: str, budget_s: float
) -> dict | None:
    """The best heuristic plan under the objective (each planner gets `budget_s`), or None."""
    from hetopt.baselines.registry import PLANNERS

    best = None
    for name in WARM_START_PLANNERS:
        found = PLANNERS[name](inst, budget_s, profiles)
        if found.plan is None:
            continue
        t = plan_objective(inst, found.plan, profiles, scenarios, objective)
        if best is None or t < best["objective_s"]:
            best = {"planner": name, "objective_s": t, "plan": found.plan}
    return best


@dataclass(frozen=True)
class _Context:
    """What solving a skeleton needs; sent once to each worker (process or Ray actor)."""

    inst: Instance
    profiles: Profiles
    scenarios: list
    objective: str
    formulation: str
    backend: str
    seed: int


def _solve_with(
    ctx: _Context, sk: Skeleton, limit: tuple[float, float], incumbent: float = math.inf
):
    """Place, linearise and solve one skeleton within `limit` — (deadline as a time.time(), seconds
    left when sent), whichever ends first: ("solved", solution, exact time) or (prune rule, None,
    inf) — pruned by its bound once placed (`placed_bound`, communication included) when that
    reaches `incumbent`. Past the limit once its model is built, it is not solved: a TIMEOUT with
    its placed bound, which stays open."""
    started = time.time()
    try:
        pr = plan_problem(ctx.inst, sk, ctx.profiles, ctx.scenarios, ctx.objective)
    except InfeasibleError:
        return "placement: TP groups do not pack onto the nodes", None, math.inf
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
    return (
        "solved",
        sol,
        (pr.iteration_time(sol.layers, sol.recompute) if sol.layers is not None else math.inf),
    )


def _record_fallbacks(
    stats: SearchStats, sk: Skeleton, sol: SplitSolution, errors: list[str]
) -> None:
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
    inst: Instance, sk: Skeleton, profiles: Profiles, scenarios, objective: str
) -> PlanProblem:
    """The skeleton's integer-program data under every planning scenario: placed once, on the file's
    network, and linearised on each scenario's (raises InfeasibleError where it cannot be
    placed)."""
    placement = sk.placed([1] * sk.depth, inst.cluster).placement
    return PlanProblem(
        tuple(split_problem(sc.instance, sk, profiles, placement) for sc in scenarios),
        tuple(sc.probability for sc in scenarios),
        objective,
        CVAR_ALPHA,
        sk.lockstep,
    )


def diagnose(inst: Instance, stats: SearchStats) -> str:
    """Say which constraint binds when no plan exists."""
    params = total_params(inst.model)
    need_gib = params * (WEIGHT_BYTES + GRAD_BYTES + OPTIMIZER_BYTES) / GIB
    have_gib = inst.cluster.total_memory_gib
    if need_gib > have_gib:
        return (
            f"{inst.model.name} ({params / 1e9:.1f} B parameters) needs at least "
            f"{need_gib / 1024:.2f} TiB for weights, gradients and optimizer states (18 bytes per "
            f"parameter, held once across the cluster); the cluster has {have_gib / 1024:.2f} TiB "
            "of GPU memory"
        )
    rules = ", ".join(f"{rule} ({n})" for rule, n in stats.pruned.items()) or "none"
    return (
        "no skeleton of the plan space holds the model in memory: even the largest TP and PP "
        "the search allows leave some stage over its GPU memory (skeletons enumerated "
        f"{stats.enumerated}; pruned: {rules}); allow recompute, more stages (search.max_stages) "
        "or smaller micro-batches"
    )

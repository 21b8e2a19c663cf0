"""The state of one best-first search (`SearchRun`): the open nodes, the incumbent and what is
proven; and its answer (`SearchResult`)."""

from __future__ import annotations

import heapq
import itertools
import math
from dataclasses import dataclass, field

from hetopt.cost.flops import total_params
from hetopt.cost.memory import GIB
from hetopt.cost.profiles import Profiles
from hetopt.plan import Plan
from hetopt.search.formulation import SolveStatus, SplitSolution, clock
from hetopt.search.roots import outside_space
from hetopt.search.tree.base import Expanded, Node, SkeletonNode, Tree
from hetopt.search.tree.roots import roots
from hetopt.search.types import SearchOptions, SearchProgress, SearchStats, Seed, Skeleton
from hetopt.spec.instance import Instance

OPTIMALITY_TOLERANCE = 1e-9
"""Relative: a bound within this of the incumbent proves optimality (CP-SAT adds its own scaling
tolerance)."""

RUNNER_UP = 0.05
"""Relative: a solved leaf within this much above the incumbent is a runner-up, a skeleton the
search climbs from once the incumbent's climb is done (hetopt.search.orchestrate): a climb ends
at the first skeleton none of whose neighbours beats it, and another start can end lower. The
figures it was set from: docs/planner.md, "Runners-up"."""

DIVE_AFTER = 200
"""A dive starts when best-first selection has made this many nodes since it last handed out a
leaf: on a wide tree whose inner bounds sit below every leaf's, best-first alone expands for
minutes before its first leaf, and the incumbent stays the warm start's. Counted in nodes made,
not seconds, so that the order of the search, and so its answer, is the same on every machine."""
DIVE_SHARE = 0.3
"""The most of the nodes made that dives make: the rest go to best-first, which raises the
bound."""
DIVE_MOST = 4_000
"""A dive that has made this many nodes without an open leaf stops; what it has not expanded goes
back in the heap."""
HAND_OVER = 500
"""Selection hands the leaves it has to the workers once it has made this many nodes since its
first."""
STARVED = 4_000
"""Selection that has made this many nodes without a leaf hands the workers the open leaves of
least key wherever they are in the heap (`_steal`): on a tree whose inner keys sit below its
leaves', best-first expands for seconds between leaves while the workers wait. About a second of
expanding, so that the workers' last batch is solved by then; counted in nodes, as DIVE_AFTER."""


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


class SearchRun:
    """The state of one best-first search: the open nodes, the incumbent and what is proven.

    `plant` the tree's roots, `seed` a heuristic incumbent, `select` the next leaves to solve
    (expanding the nodes above them), `absorb` each solved leaf, and `answer` with the result."""

    def __init__(
        self,
        inst: Instance,
        options: SearchOptions,
        time_limit_s: float,
        profiles: Profiles | None = None,
        start: float | None = None,
    ) -> None:
        self.inst, self.options, self.time_limit_s = inst, options, time_limit_s
        self.start = clock() if start is None else start
        """When the search began (its clock.clock()): the time limit counts from it."""
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
        # the least bound of the nodes `select` has taken out of the heap so far
        self.selecting = math.inf
        # the clock stopped the search (not only a skeleton no backend could solve)
        self.out_of_time = False
        self.errors: list[str] = []  # skeletons every backend failed on, with the solvers' words
        self.proof_tolerance = OPTIMALITY_TOLERANCE
        """Relative: the largest tolerance a skeleton's proof carries (its formulation's
        rel_tolerance)."""
        # every root of the tree is in the heap (else nothing is proven about the rest)
        self.planted = False
        self.made = 0  # nodes made by expanding, in all
        self.last_leaf = 0  # `made` when selection last handed out a leaf
        self.dived = 0  # nodes made by dives
        # the heap's leaves again, by key, for `_steal`; an entry is live in both or in neither:
        # its tie is in `gone` once taken from one, while the other still holds it
        self.leaves: list[tuple[float, int, Node]] = []
        self.gone: set[int] = set()
        self.stale = 0  # entries of `leaves` the heap took already
        # solved leaves near the incumbent, least time first: (time, tie, skeleton, layers, modes)
        self.runners_up: list[tuple[float, int, Skeleton, tuple, object]] = []

    def plant(self, tree: Tree) -> None:
        """The tree's roots in the heap, within the time limit: a space of millions of families
        takes minutes to list, and the families not listed in time are not searched, so nothing is
        proven about them (the open bound 0: the answer is the incumbent with its gap unproven)."""
        self.tree = tree
        tree.tolerance = OPTIMALITY_TOLERANCE
        tree.incumbent = self.incumbent
        for n in roots(tree):
            if not tree.keeps(n):
                continue
            self.heap.append((n.bound, next(self.tie), n))
            if n.is_leaf:
                self.leaves.append(self.heap[-1])
            if len(self.heap) % 1024 == 0 and self.left_s() <= 0:
                self.timed_out = self.out_of_time = True
                self.open_bound = 0.0
                break
        else:
            self.planted = True
        heapq.heapify(self.heap)
        heapq.heapify(self.leaves)

    def _push(self, node: Node) -> None:
        if self.tree is not None and not self.tree.keeps(node):
            return
        entry = (node.bound, next(self.tie), node)
        heapq.heappush(self.heap, entry)
        if node.is_leaf:
            heapq.heappush(self.leaves, entry)

    def _pop(self) -> Node:
        """The heap's open node of least key (entries `_steal` took are dropped on the way)."""
        while True:
            _, tie, node = heapq.heappop(self.heap)
            if tie in self.gone:
                self.gone.discard(tie)  # taken from both now
                continue
            if node.is_leaf:
                self.gone.add(tie)
                self.stale += 1
                if self.stale > max(4096, len(self.leaves) // 2):
                    self._compact()
            return node

    def _compact(self) -> None:
        """`leaves` without the entries the heap took (they keep solved leaves alive)."""
        taken = {tie for _, tie, _ in self.leaves if tie in self.gone}
        self.leaves = [e for e in self.leaves if e[1] not in taken]
        heapq.heapify(self.leaves)
        self.gone -= taken
        self.stale = 0

    def _drop_gone(self) -> None:
        while self.heap and self.heap[0][1] in self.gone:
            self.gone.discard(heapq.heappop(self.heap)[1])

    def _steal(self, size: int) -> list[SkeletonNode]:
        """Up to `size` open leaves of least key from anywhere in the heap, each keyed by its own
        bound (those the incumbent beats counted as pruned): the workers' next batch while
        best-first expands the inner nodes below them. Their keys hold for them (the search's
        bound counts them while they are solved), so taking them early loses nothing."""
        assert self.tree is not None
        out: list[SkeletonNode] = []
        while self.leaves and len(out) < size:
            _, tie, node = heapq.heappop(self.leaves)
            if tie in self.gone:  # the heap took it already
                self.gone.discard(tie)
                self.stale -= 1
                continue
            self.gone.add(tie)
            if not node.refined:
                node = self.tree.refine(node)
            if self._open(node.bound):
                out.append(node)
            else:
                node.count_pruned(self.stats)
        self._drop_gone()
        return out

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

    def seed(self, seed: Seed | None) -> None:
        """Start from a plan known already: its objective is the incumbent (none: nothing)."""
        if seed is None:
            return
        self.seeded = {"planner": seed.planner, "objective_s": seed.objective_s}
        self.incumbent, self.best = seed.objective_s, seed.plan
        self.best_sk = seed.skeleton  # a plan of a subspace's search comes with its own
        self.seed_plan = self.best
        if self.tree is not None:
            self.tree.incumbent = self.incumbent

    def adopt(self, found: Seed) -> None:
        """A better plan found beside the tree (hetopt.search.polish: a point of the space, with its
        skeleton) is the incumbent."""
        if found.objective_s < self.incumbent:
            self.incumbent, self.best, self.best_sk = found.objective_s, found.plan, found.skeleton
            if self.tree is not None:
                self.tree.incumbent = self.incumbent

    def left_s(self) -> float:
        return self.time_limit_s - (clock() - self.start)

    def _open(self, bound: float) -> bool:
        """Whether a node of this bound may still hold a better plan than the incumbent."""
        return bound < self.incumbent * (1 - OPTIMALITY_TOLERANCE)

    def select(self, size: int, subtrees: int = 0) -> list[Node]:
        """Up to `size` leaves of smallest bound, expanding the nodes on the way; [] when the search
        ends: every open node is proven no better (counted as pruned), or the time is up (its bound
        kept open). `subtrees` > 0: the inner nodes best-first pops are handed out too, up to that
        many, for workers to expand (hetopt.search.subtrees; what they make comes back through
        `absorb_subtree`), and this process dives once; the batch ends when either count is
        reached."""
        assert self.tree is not None
        if not self.heap:
            return []
        if not self._open(self.heap[0][0]):
            return self._prune_rest()
        if self.left_s() <= 0:
            self.timed_out = self.out_of_time = True
            self.open_bound = min(self.open_bound, self.heap[0][0])
            return []
        batch: list[Node] = []
        inner = 0  # of the batch's nodes, those not leaves
        first_leaf = math.inf  # `made` when the batch took its first leaf
        began = self.made
        while (
            self.heap
            and len(batch) - inner < size
            and inner < max(subtrees, 1)
            and self._open(self.heap[0][0])
        ):
            if self.left_s() <= 0:  # expanding a large tree takes seconds: the limit holds here too
                self.timed_out = self.out_of_time = True
                self.open_bound = min(self.open_bound, self.heap[0][0])
                break
            if self.made - first_leaf >= HAND_OVER:
                break  # the workers start on these while the next batch is selected
            if not batch and self.made - began >= STARVED and (stolen := self._steal(size)):
                batch, first_leaf = stolen, self.made
                self.last_leaf = self.made
                break
            if self.made - self.last_leaf >= DIVE_AFTER and self.dived <= DIVE_SHARE * self.made:
                if (leaf := self._dive()) is not None:
                    batch.append(leaf)
                    first_leaf = min(first_leaf, self.made)
                continue
            # held by no heap while it is selected
            self.selecting = min(self.selecting, self.heap[0][0])
            node = self._pop()
            self._drop_gone()
            # its own bound first: back in the heap if it rose
            if node.is_leaf and not node.refined:
                node = self.tree.refine(node)
                if not self._open(node.bound):
                    node.count_pruned(self.stats)
                    continue
                if self.heap and node.bound > self.heap[0][0]:
                    self._push(node)
                    continue
            if node.is_leaf:
                batch.append(node)
                first_leaf = min(first_leaf, self.made)
                self.last_leaf = self.made
            elif subtrees:
                batch.append(node)
                inner += 1
            else:
                kids = node.expand(self.tree)
                self.made += 1 + len(kids)
                for child in kids:
                    self._push(child)
        # with subtrees the workers expand best-first's nodes meanwhile: this process dives
        diving = subtrees and self.heap and self.dived <= DIVE_SHARE * self.made
        if diving and self.left_s() > 0 and (leaf := self._dive()) is not None:
            batch.append(leaf)
        self.selecting = math.inf  # the batch goes to the caller, who holds it until it is absorbed
        if not batch and self.heap and not self._open(self.heap[0][0]):
            # expanding made only nodes the incumbent beats: the search ends here
            return self._prune_rest()
        return batch

    def _dive(self) -> SkeletonNode | None:
        """From the open node of least bound down to one open leaf, depth first: at each level the
        child of least bound (a leaf first on a tie), backtracking where a path ends in nothing
        open; every node it leaves unexpanded goes back in the heap. A plan of the most promising
        region now, not after every node below the incumbent is expanded. None where nothing open
        is found within DIVE_MOST nodes made."""
        assert self.tree is not None
        began = self.made
        self.selecting = min(self.selecting, self.heap[0][0])
        # each level's nodes by falling bound: the least is popped first
        levels: list[list[Node]] = [[self._pop()]]
        self._drop_gone()
        try:
            while levels:
                if not levels[-1]:
                    levels.pop()
                    continue
                if self.made - began >= DIVE_MOST or self.left_s() <= 0:
                    return None
                node = levels[-1].pop()
                if not self._open(node.bound):
                    node.count_pruned(self.stats)
                    continue
                if not node.is_leaf:
                    kids = [kid for kid in node.expand(self.tree) if self.tree.keeps(kid)]
                    self.made += 1 + len(kids)
                    levels.append(sorted(kids, key=_dive_order, reverse=True))
                    continue
                if not node.refined:
                    node = self.tree.refine(node)
                if self._open(node.bound):
                    return node
                node.count_pruned(self.stats)
            return None
        finally:
            for level in levels:
                for node in level:
                    self._push(node)
            self.dived += self.made - began
            self.last_leaf = self.made

    def _prune_rest(self) -> list[SkeletonNode]:
        """Every open node is proven no better: counted as pruned, the heap emptied; no leaves
        ([])."""
        for _, tie, node in self.heap:
            if tie not in self.gone:
                node.count_pruned(self.stats)
        self.heap.clear()
        self.leaves.clear()
        self.gone.clear()
        self.stale = 0
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
        elif sol.layers is not None and t <= self.incumbent * (1 + RUNNER_UP):
            entry = (t, next(self.tie), node.skeleton, tuple(sol.layers), sol.recompute)
            heapq.heappush(self.runners_up, entry)

    def runner_up(self, climbed: set) -> Seed | None:
        """The best solved leaf within RUNNER_UP of the incumbent that no climb started or ended
        at, as a seed to climb from (taken off the list); None where there is none."""
        while self.runners_up:
            t, _, sk, layers, modes = heapq.heappop(self.runners_up)
            if t > self.incumbent * (1 + RUNNER_UP):
                self.runners_up.clear()  # the rest are slower still
                return None
            if sk not in climbed:
                return Seed("search", t, sk.placed(list(layers), self.inst.cluster, modes), sk)
        return None

    def next_key(self) -> float:
        """The least key in the heap (inf where it is empty): what best-first expands next."""
        self._drop_gone()
        return self.heap[0][0] if self.heap else math.inf

    def absorb_subtree(self, expanded: Expanded) -> None:
        """Take in what a worker made of subtrees: its counts, and the open nodes it did
        not expand back in the heap (those the incumbent beats now counted as pruned)."""
        self.stats.add(expanded.stats)
        self.made += expanded.made
        for child in expanded.nodes:
            if self._open(child.bound):
                self._push(child)
            else:
                child.count_pruned(self.stats)

    def interrupt(self, in_flight: list) -> SearchRun:
        """Ctrl-C or SIGTERM mid-search: the skeletons not finished (in the heap or being solved)
        keep their bounds open, as at a time-out, so the answer's gap is one the search proved."""
        self.timed_out = self.out_of_time = True
        heapq.heapify(self.heap)  # an interrupt may come while the roots are being listed
        self._drop_gone()
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

    def standing(self, in_flight: list | tuple = ()) -> SearchProgress:
        """Where the search stands: its counts, its incumbent and the smallest bound of what is not
        finished (the heap's, the leaves being solved and what is proven open already)."""
        bounds = [self.open_bound, self.selecting, *(node.bound for node in in_flight)]
        if self.heap:
            bounds.append(self.heap[0][0])
        bound = 0.0 if not self.planted else min(bounds)
        return SearchProgress(
            clock() - self.start,
            self.stats.solved,
            self.stats.enumerated,
            self.incumbent,
            min(bound, self.incumbent),
        )

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


def _dive_order(node: Node) -> tuple[float, bool]:
    """A dive's preference among siblings: the least bound, a leaf first on a tie."""
    return node.bound, not node.is_leaf


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


def diagnose(inst: Instance, stats: SearchStats) -> str:
    """Say which constraint binds when no plan exists."""
    params = total_params(inst.model)
    per_param = inst.format.state_bytes_per_param()
    need_gib = params * per_param / GIB
    have_gib = inst.cluster.total_memory_gib
    if need_gib > have_gib:
        return (
            f"{inst.model.name} ({params / 1e9:.1f} B parameters) needs at least "
            f"{need_gib / 1024:.2f} TiB for weights, gradients and optimizer states "
            f"({per_param:g} bytes per parameter in {inst.precision}, held once across the "
            f"cluster); the cluster has {have_gib / 1024:.2f} TiB of GPU memory"
        )
    rules = ", ".join(f"{rule} ({n})" for rule, n in stats.pruned.items()) or "none"
    return (
        "no skeleton of the plan space holds the model in memory: even the largest TP and PP "
        "the search allows leave some stage over its GPU memory (skeletons enumerated "
        f"{stats.enumerated}; pruned: {rules}); allow recompute, more stages (search.max_stages) "
        "or smaller micro-batches"
    )

"""The search tree: what every node is, the leaves, and the state expanding a node needs."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from hetopt.search.bounds.run import Bounds
from hetopt.search.types import (
    SearchOptions,
    SearchStats,
    Skeleton,
)
from hetopt.spec.instance import Instance

BOUND_RULE = "bound: compute lower bound ≥ incumbent"
BUCKET_RULE = "bound: families at one replica count never generated"
COUNTS_RULE = "bound: stage counts of a family's first classes at one replica count never generated"
PAIR_GROUPS_RULE = "bound: two-template groups never generated"
TRIPLE_GROUPS_RULE = "bound: three-template groups never generated"
MEMORY_GROUPS_RULE = "memory: two-template groups whose stages cannot hold the model"
MEMORY_RULE = "memory: a stage cannot hold a layer or the stages cannot hold the model"
BUDGET_RULE = "budget: rents more than --max-usd-per-hour"


class Tree:
    """The search tree of one instance: what expanding a node needs (bounds, memory tests, the
    incumbent); its roots come from hetopt.search.tree.roots.

    Parameters: inst — the instance; options — the plan space; stats — counters this run fills;
    bounds — this run's `Bounds` (their caches live as long as the tree)."""

    def __init__(
        self,
        inst: Instance,
        options: SearchOptions,
        stats: SearchStats,
        bounds: Bounds,
        budget=None,
    ) -> None:
        self.inst, self.options, self.stats, self.bounds = inst, options, stats, bounds
        self.incumbent = math.inf
        """The search's best time so far (set by the search): a child keyed at or above it is pruned
        as it is made, before its memory is checked."""
        self.tolerance = 0.0
        """Relative: a bound within this of the incumbent proves no better (the search's)."""
        self.memo: dict = {}
        """What nodes share and look up rather than carry (a node travels to workers without it),
        by kind: e.g. ClassRates per SingleBatch (hetopt.search.tree.choices)."""
        self.budget = budget
        """The budget in dollars per hour (hetopt.search.budget.Budget: `options.max_usd_per_hour`
        on the instance's prices), or None."""

    def keeps(self, node: Node) -> bool:
        """Whether a node may hold a plan within the budget; one that cannot is counted as pruned
        (its skeletons, where known)."""
        if self.budget is None or not self.budget.over(node):
            return True
        self.stats.pruned[BUDGET_RULE] += node.pruned_count
        return False

    @property
    def threshold(self) -> float:
        """What a bound must stay below to leave a node open: the incumbent less the tolerance."""
        return self.incumbent * (1 - self.tolerance)

    def beaten(self, bound: float) -> bool:
        return bound >= self.threshold

    def fits(
        self,
        micro_batch: int,
        recompute: str | tuple[str, ...],
        segments: tuple,
        replicas_total: int,
        zero: tuple[int, ...] | int = 1,
    ) -> bool:
        """Whether a template holds the model at one of the ZeRO stages `zero` (no stage holds least
        in every case: ZeRO-2/3's unsharded buffers can outweigh what they shard over few replicas),
        each stage in one of the recompute modes `recompute` (a tuple: per-stage recompute)."""
        return any(
            self.bounds.memory.template_fits(micro_batch, recompute, segments, replicas_total, z)
            for z in ((zero,) if isinstance(zero, int) else zero)
        )

    def skeleton_node(self, sk: Skeleton) -> SkeletonNode:
        """A leaf keyed by its parent's bound (`_children`); its own bound is computed when it first
        reaches the top of the heap (`refine`): most leaves never do."""
        return SkeletonNode(0.0, sk)

    def refine(self, node: SkeletonNode) -> SkeletonNode:
        """The leaf keyed by its own bound (`SkeletonBounds.bound`), at least its parent's."""
        return replace(
            node,
            bound=max(node.bound, self.bounds.skeletons.bound(node.skeleton)),
            refined=True,
        )


def memory_modes(recompute: str, group) -> tuple[str, ...]:
    """The recompute modes whose memory caps bound a group's skeletons in mode `recompute`: with
    per-stage recompute each stage holds at most the most any of the group's modes holds
    (Skeleton.memory_modes)."""
    return group.stage_modes or (recompute,)


@dataclass(frozen=True)
class Node:
    """A set of skeletons; `bound` holds for every one of them."""

    bound: float

    is_leaf = False
    pruned_as = BOUND_RULE
    """The rule the search counts this node under when its bound proves it no better."""

    @property
    def pruned_count(self) -> int:
        """What a pruned node counts: its skeletons where they are known without generating, else
        1."""
        return 1

    def expand(self, tree: Tree) -> list[Node]:
        """The children, each keyed by a bound at least this node's."""
        raise NotImplementedError

    def count_pruned(self, stats: SearchStats) -> None:
        stats.pruned[self.pruned_as] += self.pruned_count


def children(parent: Node, nodes: list[Node]) -> list[Node]:
    """Children keyed by max(their bound, the parent's): a subset's bound is at least its set's."""
    return [n if n.bound >= parent.bound else rekey(n, parent.bound) for n in nodes]


def rekey(node: Node, bound: float) -> Node:
    return replace(node, bound=bound)


def sharpened(tree: Tree, node: Node, bound: float, **fields) -> list[Node]:
    """A node back in the heap at a bound of its own, its `fields` marking it sharpened (a node
    keyed first by a cheap bound, sharpened when it first reaches the top); nothing, counted as
    pruned under its rule, where the incumbent beats that bound."""
    if tree.beaten(bound):
        tree.stats.pruned[node.pruned_as] += 1
        return []
    return children(node, [replace(node, bound=bound, **fields)])


@dataclass
class Expanded:
    """What a worker made of a subtree (hetopt.search.subtrees): the open nodes it left unexpanded
    (leaves keyed by their own bounds), the nodes it made in all, and its counts (enumerated,
    pruned)."""

    nodes: list[Node]
    made: int
    stats: SearchStats = field(default_factory=SearchStats)


@dataclass(frozen=True)
class SkeletonNode(Node):
    """A leaf: one skeleton, solved by a formulation."""

    skeleton: Skeleton
    refined: bool = False
    """Whether `bound` is the skeleton's own bound yet (Tree.refine), not only its parent's."""

    is_leaf = True

    def expand(self, tree: Tree) -> list[Node]:
        return []

"""The search space as a tree of nodes, each a set of skeletons with a lower bound on all of them.

Every node answers two questions: `bound` — no split of any skeleton in it beats this
(hetopt/search/bounds.py says why each holds) — and `expand` — its children, each keyed by a bound
at least its parent's. Leaves are single skeletons, solved by a formulation. The best-first search
(orchestrate.py) pops the node of smallest bound; a node whose bound reaches the incumbent is pruned
with everything under it (`count_pruned`).

    FamilyNode        device classes × TP degrees × micro-batch (space.Family), the roots ├─
    BucketNode     one-template family at one replica count R, stage counts of its first classes
    fixed │  └─ BucketNode  … the next class's count fixed, down to the last class │     └─
    GroupNode   stages per class at R (space.SkeletonGroup) │     └─ SkeletonNode └─ PairGroupNode
    two templates side by side (space.PairGroup), made only where the family's table
       │              of group bounds (Bounds.pair_table) leaves them open
       └─ PairRangeNode     replica counts (ra', rb') ≤ (ra, rb), peeled a row or a cell at a time
          └─ PairSubgroupNode  fixed (ra, rb) and recompute: the micro-batch shares
             └─ SkeletonNode
    SkeletonNode      a skeleton with shards (hetopt.search.shards), a root leaf keyed by
    `Bounds.shard_bound`,
                      or a uniform layout's (hetopt.search.uniform) keyed by `Bounds.lockstep_bound`
    TripleFamilyNode  three single-class runs (hetopt.search.triples.TripleFamily), groups made only
    where │                 its table of group bounds (Bounds.triple_table) leaves them open └─
    TripleGroupNode  three templates over a box of replica counts, keyed by `Bounds.triple_bound`,
       │                halved down to single (R_a, R_b, R_c); a box (or group) whose templates
       cannot │                take the M micro-batches below the incumbent is dropped
       (`Tree.reaches`) └─ TripleSharesNode  fixed (R_a, R_b, R_c) and recompute, keyed by the least
       bound over the shares
          └─ SkeletonNode   (`TripleShares`: only the shares below the incumbent are made)

What cannot hold the model in memory even at its most ZeRO sharding is dropped on expansion and
counted (`MEMORY_RULE`, `MEMORY_GROUPS_RULE`).
"""

from __future__ import annotations

import math
import operator
from collections.abc import Iterator
from dataclasses import dataclass, replace

import numpy as np

from hetopt.search.bounds import Bounds, first_true
from hetopt.search.space import (
    DEFAULT_RECOMPUTE,
    DIVISIBILITY,
    SHARED,
    Family,
    PairGroup,
    SearchOptions,
    SearchStats,
    Skeleton,
    SkeletonGroup,
    enumerate_roots,
    least_work,
    orders,
)
from hetopt.search.triples import TRIPLE_SHARED
from hetopt.spec.instance import Instance

BOUND_RULE = "bound: compute lower bound ≥ incumbent"
BUCKET_RULE = "bound: families at one replica count never generated"
COUNTS_RULE = "bound: stage counts of a family's first classes at one replica count never generated"
PAIR_GROUPS_RULE = "bound: two-template groups never generated"
TRIPLE_GROUPS_RULE = "bound: three-template groups never generated"
MEMORY_GROUPS_RULE = "memory: two-template groups whose stages cannot hold the model"
MEMORY_RULE = "memory: a stage cannot hold a layer or the stages cannot hold the model"


class Tree:
    """The search tree of one instance: its roots and what expanding a node needs (bounds, memory
    tests).

    Parameters: inst — the instance; options — the plan space; stats — counters this run fills;
    bounds — this run's `Bounds` (their caches live as long as the tree)."""

    def __init__(
        self, inst: Instance, options: SearchOptions, stats: SearchStats, bounds: Bounds
    ) -> None:
        self.inst, self.options, self.stats, self.bounds = inst, options, stats, bounds
        self.incumbent = math.inf
        """The search's best time so far (set by the search): a child keyed at or above it is pruned
        as it is made, before its memory is checked."""
        self.tolerance = 0.0
        """Relative: a bound within this of the incumbent proves no better (the search's)."""

    @property
    def threshold(self) -> float:
        """What a bound must stay below to leave a node open: the incumbent less the tolerance."""
        return self.incumbent * (1 - self.tolerance)

    def beaten(self, bound: float) -> bool:
        return bound >= self.threshold

    def reaches(self, group, lowest: tuple[int, int, int], replicas: tuple[int, int, int]) -> bool:
        """Whether a triple group's templates can take its M micro-batches below the incumbent at
        some replica counts of the box lowest ≤ R ≤ replicas (`Bounds.triple_reach`)."""
        if not math.isfinite(self.incumbent):
            return True
        return (
            self.bounds.triple_reach(group, lowest, replicas, self.threshold)
            >= group.total_micro_batches
        )

    def roots(self) -> Iterator[Node]:
        """Every root of the plan space (`enumerate_roots`) as a node: a family keyed by its
        throughput bound (`Bounds.family_bound`; a pair family's key rises to the least bound of its
        groups when it first reaches the top, `FamilyNode.expand`: building the roots stays cheap,
        inside the search's clock), a group of three templates by `Bounds.triple_bound`, a skeleton
        with shards or a uniform layout's a leaf keyed by its own bound
        (`Bounds.compute_lower_bound`)."""
        for root in enumerate_roots(self.inst, self.options, self.stats, self.bounds.profiles):
            if isinstance(root, Family):
                yield FamilyNode(self.bounds.family_bound(root), root, refined=not root.pair)
            elif isinstance(root, Skeleton):  # with shards, or a uniform layout's in lockstep
                yield SkeletonNode(self.bounds.compute_lower_bound(root), root, refined=True)
            else:
                yield TripleFamilyNode(self.bounds.triple_family_bound(root), root)

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
            self.bounds.template_fits(micro_batch, recompute, segments, replicas_total, z)
            for z in ((zero,) if isinstance(zero, int) else zero)
        )

    def pair_modes(self, group: PairGroup, modes, replicas_total: int) -> tuple[str, ...]:
        """The recompute modes in which both templates can hold the model, ZeRO over
        `replicas_total`."""
        return tuple(
            rc
            for rc in modes
            if self.fits(
                group.micro_batch, memory_modes(rc, group), group.a, replicas_total, group.zero
            )
            and self.fits(
                group.micro_batch, memory_modes(rc, group), group.b, replicas_total, group.zero
            )
        )

    def range_node(
        self, group: PairGroup, ra: int, rb: int, rows: bool, modes: tuple[str, ...]
    ) -> PairRangeNode:
        bound = self.bounds.range_bound(
            group, least_work(modes), group.stage_modes or modes, (1 if rows else ra, 1), (ra, rb)
        )
        return PairRangeNode(bound, group, ra, rb, rows, modes)

    def group_nodes(self, group) -> list[Node]:
        """A one-template group as one node per ZeRO stage (ZeRO-2/3 skeletons have bounds of their
        own, their collectives, that prune them together); a two-template group as one node."""
        if isinstance(group, SkeletonGroup) and len(group.zero_options) > 1:
            groups = [replace(group, zero_options=(z,)) for z in group.zero_options]
        else:
            groups = [group]
        return [node for g in groups if (node := self.group_node(g)) is not None]

    def group_node(self, group) -> Node | None:
        """A group keyed at its largest replica counts (the most ZeRO sharding: least memory, and
        the smallest compute bound) and the least-work recompute mode that fits (recompute only adds
        work); None, counted as pruned, when no mode fits."""
        if isinstance(group, SkeletonGroup):
            top = max(group.replica_options)
            # the least-work mode of all bounds every mode: no better than the incumbent, no memory
            # check
            flows, v = min(group.replica_options), max(group.virtual_options)
            zero = min(
                group.zero_options
            )  # one stage, or ZeRO-0/1 only (their bounds are the same)
            cheap = self.bounds.group_bound(
                group.micro_batch,
                least_work(group.recompute_options),
                group.segments,
                group.total_micro_batches // top,
                flows,
                v,
                zero,
            )
            if self.beaten(cheap):
                self.stats.pruned[BOUND_RULE] += group.size
                return None
            # by increasing work: the first mode that fits bounds every mode that does
            rc = next(
                (
                    rc
                    for rc in sorted(group.recompute_options, key=DEFAULT_RECOMPUTE.index)
                    if self.fits(
                        group.micro_batch,
                        memory_modes(rc, group),
                        group.segments,
                        top,
                        group.zero_options,
                    )
                ),
                None,
            )
            if rc is None:
                self.stats.pruned[MEMORY_RULE] += group.size
                return None
            return GroupNode(
                self.bounds.group_bound(
                    group.micro_batch,
                    rc,
                    group.segments,
                    group.total_micro_batches // top,
                    flows,
                    v,
                    zero,
                ),
                group,
            )
        top = (max(group.a_replicas), max(group.b_replicas))
        # as above: the least-work mode of all bounds every mode, before any memory check
        every = group.stage_modes or group.recompute_options
        if self.beaten(
            self.bounds.range_bound(group, least_work(group.recompute_options), every, (1, 1), top)
        ):
            self.stats.pruned[PairGroupNode.pruned_as] += 1
            return None
        modes = self.pair_modes(group, group.recompute_options, sum(top))
        if not modes:
            self.stats.pruned[MEMORY_GROUPS_RULE] += 1
            return None
        return PairGroupNode(
            self.bounds.range_bound(
                group, least_work(modes), group.stage_modes or modes, (1, 1), top
            ),
            group,
        )

    def skeleton_node(self, sk: Skeleton) -> SkeletonNode:
        """A leaf keyed by its parent's bound (`_children`); its own bound is computed when it first
        reaches the top of the heap (`refine`): most leaves never do."""
        return SkeletonNode(0.0, sk)

    def refine(self, node: SkeletonNode) -> SkeletonNode:
        """The leaf keyed by its own bound (`Bounds.compute_lower_bound`), at least its parent's."""
        return replace(
            node,
            bound=max(node.bound, self.bounds.compute_lower_bound(node.skeleton)),
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


def _children(parent: Node, nodes: list[Node]) -> list[Node]:
    """Children keyed by max(their bound, the parent's): a subset's bound is at least its set's."""
    return [n if n.bound >= parent.bound else _rekey(n, parent.bound) for n in nodes]


def _rekey(node: Node, bound: float) -> Node:
    return replace(node, bound=bound)


@dataclass(frozen=True)
class FamilyNode(Node):
    family: Family
    refined: bool = True
    """Whether a pair family's key is the least bound of its groups yet (`Bounds.pair_table`)."""

    pruned_as = "bound: whole families never generated (device classes × TP degrees)"

    def expand(self, tree: Tree) -> list[Node]:
        if not self.family.pair:
            out: list[Node] = [
                BucketNode(
                    tree.bounds.bucket_bound(self.family, r, tree.options.max_stages),
                    self.family,
                    r,
                )
                for r in self.family.replica_counts(tree.stats)
            ]
        elif not self.refined:  # back in the heap at the least bound of its groups
            table = tree.bounds.pair_table(self.family, tree.options)[1]
            out = [FamilyNode(float(table.min(initial=math.inf)), self.family, refined=True)]
        else:
            out = self._pair_groups(tree)
        return _children(self, out)

    def _pair_groups(self, tree: Tree) -> list[Node]:
        """The groups of a pair family whose bounds (`Bounds.pair_table`) the incumbent does not
        beat; the others are never made (counted as pruned, each under its reason)."""
        family = self.family
        (side_a, side_b), table, why = tree.bounds.pair_table(family, tree.options)
        finite = np.isfinite(table)
        if (
            family.sides[0] == family.sides[1]
        ):  # a pair and its mirror are one pair: only counts_a ≤ counts_b
            mirrored = np.array([[ta[0] > tb[0] for tb in side_b] for ta in side_a], dtype=bool)
        else:
            mirrored = np.zeros(table.shape, dtype=bool)
        kept = finite & ~mirrored & (table < tree.threshold)
        stats = tree.stats
        deep, memory = why["divisibility"], why["memory"] & ~mirrored
        shared = (mirrored & ~deep) | (~finite & ~deep & ~why["memory"] & ~mirrored)
        for rule, mask in (
            (DIVISIBILITY, deep),
            (MEMORY_GROUPS_RULE, memory),
            (SHARED, shared),
            (PAIR_GROUPS_RULE, finite & ~mirrored & ~kept),
        ):
            if (count := int(np.count_nonzero(mask))) > 0:  # no rule listed with nothing pruned
                stats.pruned[rule] += count
        out: list[Node] = []
        for i, j in np.argwhere(kept):
            if (group := family.pair_group(side_a[i], side_b[j], stats)) is not None:
                out += tree.group_nodes(group)
        return out


@dataclass(frozen=True)
class BucketNode(Node):
    """A one-template family at one replica count R with the stage counts of its first classes
    `fixed` (its groups differ in the counts of the others). Expanding fixes the next class's count,
    one child per value; with the last class fixed the children are groups."""

    family: Family
    replicas: int
    fixed: tuple[int, ...] = ()

    @property
    def pruned_as(self) -> str:
        return BUCKET_RULE if not self.fixed else COUNTS_RULE

    def expand(self, tree: Tree) -> list[Node]:
        f, r = self.family, self.replicas
        out: list[Node] = []
        for n in f.next_counts(tree.options, tree.inst.model.layers, r, self.fixed):
            counts = (*self.fixed, n)
            if len(counts) < len(f.classes):
                bound = tree.bounds.bucket_bound(f, r, tree.options.max_stages, counts)
                if tree.beaten(bound):  # pruned as made: its groups are never generated
                    tree.stats.pruned[COUNTS_RULE] += 1
                else:
                    out.append(BucketNode(bound, f, r, counts))
            else:
                out += tree.group_nodes(f.group(r, counts, tree.stats))
        return _children(self, out)


@dataclass(frozen=True)
class GroupNode(Node):
    group: SkeletonGroup

    def expand(self, tree: Tree) -> list[Node]:
        out: list[Node] = []
        for sk in self.group.skeletons():
            if tree.fits(
                sk.micro_batch,
                sk.memory_modes,
                self.group.segments,
                sk.templates[0].replicas,
                sk.zero,
            ):
                out.append(tree.skeleton_node(sk))
            else:
                tree.stats.pruned[MEMORY_RULE] += 1
        return _children(self, out)

    @property
    def pruned_count(self) -> int:
        return self.group.size


@dataclass(frozen=True)
class PairGroupNode(Node):
    group: PairGroup

    pruned_as = "bound: two-template groups never expanded"

    def expand(self, tree: Tree) -> list[Node]:
        g = self.group
        modes = tree.pair_modes(g, g.recompute_options, max(g.a_replicas) + max(g.b_replicas))
        if not modes:
            return []
        return _children(
            self, [tree.range_node(g, max(g.a_replicas), max(g.b_replicas), True, modes)]
        )


@dataclass(frozen=True)
class PairRangeNode(Node):
    """The replica counts of a pair group not yet expanded: (ra, r) for every r ≤ rb — and with
    `rows` also every ra' < ra with any rb. The throughput bound falls with every replica count, so
    its value at (ra, rb) bounds the whole range; expanding peels off the top row or the top
    cell."""

    group: PairGroup
    ra: int
    rb: int
    rows: bool
    modes: tuple[str, ...]

    pruned_as = "bound: two-template replica-count ranges never expanded"

    def expand(self, tree: Tree) -> list[Node]:
        g, out = self.group, []
        if self.rows:  # the top row as a range of its own, and the rows below
            out.append(tree.range_node(g, self.ra, self.rb, False, self.modes))
            if self.ra > 1:
                out.append(tree.range_node(g, self.ra - 1, self.rb, True, self.modes))
            return _children(self, out)
        # the top cell's subgroups, and the rest of the row
        if self.rb > 1:
            out.append(tree.range_node(g, self.ra, self.rb - 1, False, self.modes))
        if g.shares(self.ra, self.rb):
            fitting = tree.pair_modes(g, self.modes, self.ra + self.rb)
            for rc in self.modes:
                sub = PairSubgroupNode(0.0, g, self.ra, self.rb, rc)
                tree.stats.enumerated += sub.size
                if rc in fitting:
                    shares = ShareBounds(tree.bounds, g, self.ra, self.rb, rc)
                    bound = max(
                        tree.bounds.pair_bound(g, rc, memory_modes(rc, g), (self.ra, self.rb)),
                        shares.least(),
                    )
                    out.append(_rekey(sub, bound))
                else:
                    tree.stats.pruned[MEMORY_RULE] += sub.size
        return _children(self, out)


@dataclass(frozen=True)
class PairSubgroupNode(Node):
    """A pair group at fixed replica counts and recompute mode; its skeletons differ in the
    shares."""

    group: PairGroup
    ra: int
    rb: int
    recompute: str

    @property
    def size(self) -> int:
        return len(self.group.shares(self.ra, self.rb)) * len(orders(max(self.ra, self.rb)))

    def expand(self, tree: Tree) -> list[Node]:
        """The skeletons of the shares whose bounds the incumbent does not beat
        (`ShareBounds.window`); the others are counted as pruned, never made."""
        g, shares = self.group, self.group.shares(self.ra, self.rb)
        lo, hi = ShareBounds(tree.bounds, g, self.ra, self.rb, self.recompute).window(
            tree.threshold
        )
        leaves = [
            tree.skeleton_node(sk)
            for ma in shares[lo : hi + 1]
            for sk in g.skeletons_at(self.ra, self.rb, self.recompute, ma)
        ]
        if self.size > len(leaves):
            tree.stats.pruned[BOUND_RULE] += self.size - len(leaves)
        return _children(self, leaves)

    @property
    def pruned_count(self) -> int:
        return self.size


class ShareBounds:
    """`Bounds.compute_lower_bound` of a pair group's skeletons at fixed replica counts and
    recompute mode, as a function of the share: D_a(m_a) ∨ D_b(m_b) + C, with D_j a template's
    `drained_bound`, which rises with its micro-batches (each piece of it is (m − 1)·Λ + Σ τ or a
    least such over stage 0's layers), and C the optimizer step and exchange, the same for every
    share. As m_a rises m_b falls, so D_a rises and D_b falls along the shares: the least bound is
    where they cross, and the shares below a threshold are one run of them — both found by
    bisection."""

    def __init__(self, bounds: Bounds, group: PairGroup, ra: int, rb: int, recompute: str) -> None:
        self.bounds, self.group, self.ra, self.rb, self.recompute = bounds, group, ra, rb, recompute
        self.shares = group.shares(ra, rb)
        self.memory = memory_modes(recompute, group)
        first = group.templates_at(ra, rb, self.shares[0])
        self.constant = max(
            bounds.optimizer_bound(t, ra + rb, group.zero) for t in first
        ) + bounds.exchange_s(group.a, group.b)

    def parts(self, i: int) -> tuple[float, float]:
        """(D_a, D_b) at the i-th share."""
        g, b = self.group, self.bounds
        return tuple(
            b.drained_bound(
                g.micro_batch, self.recompute, t, self.ra + self.rb, 1, g.zero, self.memory
            )
            for t in g.templates_at(self.ra, self.rb, self.shares[i])
        )

    def least(self) -> float:
        """The least bound over the shares: at the first share where D_a ≥ D_b, or just before
        it."""
        n = len(self.shares)
        cross = first_true(n, lambda i: operator.ge(*self.parts(i)))
        return min(max(self.parts(i)) for i in (cross - 1, cross) if 0 <= i < n) + self.constant

    def window(self, threshold: float) -> tuple[int, int]:
        """(lo, hi): the shares lo … hi are those whose bounds lie below `threshold` (hi < lo:
        none)."""
        n, room = len(self.shares), threshold - self.constant
        lo = first_true(n, lambda i: self.parts(i)[1] < room)  # D_b falls along the shares
        hi = first_true(n, lambda i: self.parts(i)[0] >= room) - 1  # D_a rises
        return lo, hi


@dataclass(frozen=True)
class TripleFamilyNode(Node):
    """Three single-class runs at one micro-batch size (hetopt.search.triples.TripleFamily), a root
    keyed by `Bounds.triple_family_bound`; when it first reaches the top of the heap it goes back at
    the least bound of its groups (`Bounds.triple_table`), and the next time it makes the groups
    that table leaves open (the others are never made, counted as pruned under their reasons)."""

    family: object
    refined: bool = False

    pruned_as = "bound: whole three-template families never generated (device classes × TP degrees)"

    def expand(self, tree: Tree) -> list[Node]:
        table, why = tree.bounds.triple_table(self.family)
        if not self.refined:
            return _children(
                self, [TripleFamilyNode(float(table.min(initial=math.inf)), self.family, True)]
            )
        family, stats = self.family, tree.stats
        mirrored = family.mirrored()
        finite = np.isfinite(table) & ~mirrored
        kept = finite & (table < tree.threshold)
        for rule, mask in (
            (DIVISIBILITY, why["divisibility"]),
            (MEMORY_GROUPS_RULE, why["memory"]),
            (TRIPLE_GROUPS_RULE, finite & ~kept),
        ):
            if (count := int(np.count_nonzero(mask & ~mirrored))) > 0:
                stats.pruned[rule] += count
        out: list[Node] = []
        for picks in np.argwhere(kept):
            group = family.group(tuple(int(i) for i in picks), stats)
            if group is None:
                continue
            if not tree.reaches(group, (1, 1, 1), group.tops) or tree.beaten(
                bound := tree.bounds.triple_bound(group)
            ):
                stats.pruned[TRIPLE_GROUPS_RULE] += 1
            else:
                out.append(TripleGroupNode(bound, group, level=tree.threshold))
        return _children(self, out)


@dataclass(frozen=True)
class TripleGroupNode(Node):
    """Three single-class templates (hetopt.search.triples) at the replica counts of a box, lowest_j
    ≤ R_j ≤ replicas_j (default every count the classes allow), keyed by `Bounds.triple_bound` over
    the box. Expanding halves the box's longest side; a box of one point has a child per recompute
    mode (`TripleSharesNode`). Replica counts only add GPUs, so a box whose lowest corner does not
    fit on the classes holds no point that does."""

    group: object
    lowest: tuple[int, int, int] = (1, 1, 1)
    replicas: tuple[int, int, int] | None = None
    level: float = math.inf
    """The search's threshold when the box was made and found to reach it (`Tree.reaches`)."""

    pruned_as = "bound: three-template replica-count boxes never expanded"

    def expand(self, tree: Tree) -> list[Node]:
        g, lo = self.group, self.lowest
        hi = self.replicas or g.tops
        if tree.threshold < self.level and not tree.reaches(g, lo, hi):  # the incumbent fell since
            tree.stats.pruned[self.pruned_as] += 1
            return []
        if lo == hi:
            return _children(self, triple_share_nodes(tree, g, lo))
        j = max(range(3), key=lambda k: hi[k] - lo[k])
        mid = (lo[j] + hi[j]) // 2
        out: list[Node] = []
        for low, high in (
            (lo, (*hi[:j], mid, *hi[j + 1 :])),
            ((*lo[:j], mid + 1, *lo[j + 1 :]), hi),
        ):
            if not g.fits(low):
                tree.stats.pruned[TRIPLE_SHARED] += 1
                continue
            if not tree.reaches(g, low, high) or tree.beaten(
                bound := tree.bounds.triple_bound(g, low, high)
            ):
                tree.stats.pruned[self.pruned_as] += 1
            else:
                out.append(TripleGroupNode(bound, g, low, high, tree.threshold))
        return _children(self, out)


def triple_share_nodes(tree: Tree, group, replicas: tuple[int, int, int]) -> list[Node]:
    """A triple group at fixed replica counts, one node per recompute mode, keyed by the least bound
    over its shares (`TripleShares.least`); the modes in which a template cannot hold the model are
    counted as pruned, as are those the incumbent beats."""
    out: list[Node] = []
    size = group.share_count(replicas) * len(orders(max(replicas)))
    for rc in group.recompute_options:
        tree.stats.enumerated += size
        least = TripleShares(tree.bounds, group, replicas, rc).least(tree.threshold)
        if not math.isfinite(least):
            tree.stats.pruned[MEMORY_RULE] += size
        elif tree.beaten(least):
            tree.stats.pruned[BOUND_RULE] += size
        else:
            out.append(TripleSharesNode(least, group, replicas, rc))
    return out


@dataclass(frozen=True)
class TripleSharesNode(Node):
    """A triple group at fixed replica counts and recompute mode: its skeletons differ in the shares
    and the order; only those of the shares whose bound the incumbent does not beat are made."""

    group: object
    replicas: tuple[int, int, int]
    recompute: str

    @property
    def pruned_count(self) -> int:
        return self.group.share_count(self.replicas) * len(orders(max(self.replicas)))

    def expand(self, tree: Tree) -> list[Node]:
        g = self.group
        caps = TripleShares(tree.bounds, g, self.replicas, self.recompute).caps(tree.threshold)
        leaves = [
            tree.skeleton_node(sk) for sk in g.skeletons_at(self.replicas, (self.recompute,), caps)
        ]
        if self.pruned_count > len(leaves):
            tree.stats.pruned[BOUND_RULE] += self.pruned_count - len(leaves)
        return _children(self, leaves)


class TripleShares:
    """`Bounds.compute_lower_bound` of a triple group's skeletons at fixed replica counts and
    recompute mode, as a function of the shares: max_j D_j(m_j) + C, with D_j template j's
    `drained_bound`, which rises with its micro-batches m_j (`ShareBounds`), and C the ring exchange
    and optimizer step (`Bounds.triple_constant`). Below a level θ template j takes at most cap_j(θ)
    micro-batches per replica, found by bisection; no share has every D_j(m_j) ≤ θ unless Σ_j
    R_j·cap_j(θ) ≥ M."""

    def __init__(
        self, bounds: Bounds, group, replicas: tuple[int, int, int], recompute: str
    ) -> None:
        self.bounds, self.group, self.replicas, self.recompute = bounds, group, replicas, recompute
        self.constant = bounds.triple_constant(group, sum(replicas))
        total = group.total_micro_batches
        depths = [group.depth(j) for j in range(3)]
        # the most micro-batches template j can take: each other template one per stage
        self.most = [
            (
                total
                - sum(
                    r * p for k, (r, p) in enumerate(zip(replicas, depths, strict=True)) if k != j
                )
            )
            // replicas[j]
            for j in range(3)
        ]
        self.depths = depths

    def drained(self, j: int, micro_batches: int) -> float:
        g = self.group
        return self.bounds.triple_drained(
            g.micro_batch,
            self.recompute,
            g.sides[j],
            g.zero,
            self.replicas[j],
            micro_batches,
            sum(self.replicas),
        )

    def cap(self, j: int, room: float) -> int:
        """The most micro-batches m ≥ p_j of template j with D_j(m) < room (p_j − 1 where none)."""
        p, n = self.depths[j], self.most[j] - self.depths[j] + 1
        return p + first_true(n, lambda i: self.drained(j, p + i) >= room) - 1

    def caps(self, threshold: float) -> tuple[int, int, int]:
        """Each template's cap below `threshold`: the shares whose bounds lie below it are within
        them."""
        room = threshold - self.constant
        return tuple(self.cap(j, room) for j in range(3))

    def least(self, threshold: float = math.inf) -> float:
        """The least bound over the shares, or a lower bound on it: the least level θ at which the
        caps take the M micro-batches, Σ_j R_j·cap_j(θ) ≥ M, found by raising the template of the
        smallest next D_j(m_j + 1) one micro-batch at a time (a merge of three rising sequences)
        from m_j = p_j; stopped early, once θ + C reaches `threshold`, at the level reached (every
        share lies above it); inf where a template cannot hold the model."""
        total, r = self.group.total_micro_batches, self.replicas
        if any(m < p for m, p in zip(self.most, self.depths, strict=True)):
            return math.inf
        m = list(self.depths)
        level = max(self.drained(j, m[j]) for j in range(3))
        nxt = [self.drained(j, m[j] + 1) if m[j] < self.most[j] else math.inf for j in range(3)]
        taken = sum(rj * mj for rj, mj in zip(r, m, strict=True))
        while taken < total and level + self.constant < threshold and math.isfinite(level):
            j = min(range(3), key=nxt.__getitem__)
            level = max(level, nxt[j])
            m[j] += 1
            taken += r[j]
            nxt[j] = self.drained(j, m[j] + 1) if m[j] < self.most[j] else math.inf
        return level + self.constant


@dataclass(frozen=True)
class SkeletonNode(Node):
    """A leaf: one skeleton, solved by a formulation."""

    skeleton: Skeleton
    refined: bool = False
    """Whether `bound` is the skeleton's own bound yet (Tree.refine), not only its parent's."""

    is_leaf = True

    def expand(self, tree: Tree) -> list[Node]:
        return []

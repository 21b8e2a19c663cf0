"""Nodes of the one-template families (hetopt.search.space.Family): a family, its buckets of one
replica count and fixed stage counts, and its groups."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from hetopt.search.bounds.pairs import single_class_family
from hetopt.search.space import DIVISIBILITY, SHARED, Family, SkeletonGroup
from hetopt.search.tree.base import (
    BOUND_RULE,
    BUCKET_RULE,
    COUNTS_RULE,
    MEMORY_GROUPS_RULE,
    MEMORY_RULE,
    PAIR_GROUPS_RULE,
    Node,
    Tree,
    children,
    memory_modes,
    sharpened,
)
from hetopt.search.tree.pairs import pair_group_node
from hetopt.search.types import (
    DEFAULT_RECOMPUTE,
    least_work,
)


@dataclass(frozen=True)
class FamilyNode(Node):
    family: Family
    refined: bool = True
    """Whether a pair family's key is the least bound of its groups yet (`PairBounds.table`)."""

    pruned_as = "bound: whole families never generated (device classes × TP degrees)"

    def expand(self, tree: Tree) -> list[Node]:
        if not self.family.pair:
            out: list[Node] = [
                BucketNode(
                    tree.bounds.families.bucket_bound(self.family, r, tree.options.max_stages),
                    self.family,
                    r,
                )
                for r in self.family.replica_counts(tree.stats)
            ]
        elif not self.refined:  # back at the least bound of its groups and what no replica sheds
            table = tree.bounds.pairs.table(self.family, tree.options)[1]
            least = max(self.bound, float(table.min(initial=math.inf)))
            if single_class_family(self.family) and not tree.beaten(least):
                least = tree.bounds.pairs.family_least(
                    self.family, tree.options, least, tree.threshold
                )
            return sharpened(tree, self, least, refined=True)
        else:
            out = self._pair_groups(tree)
        return children(self, out)

    def _pair_groups(self, tree: Tree) -> list[Node]:
        """The groups of a pair family whose bounds (`PairBounds.table`) the incumbent does not
        beat; the others are never made (counted as pruned, each under its reason)."""
        family = self.family
        (side_a, side_b), table, why = tree.bounds.pairs.table(family, tree.options)
        finite = np.isfinite(table)
        # a pair and its mirror are one pair: only counts_a ≤ counts_b
        if family.sides[0] == family.sides[1]:
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
                out += group_nodes(tree, group)
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
                bound = tree.bounds.families.bucket_bound(f, r, tree.options.max_stages, counts)
                if tree.beaten(bound):  # pruned as made: its groups are never generated
                    tree.stats.pruned[COUNTS_RULE] += 1
                else:
                    out.append(BucketNode(bound, f, r, counts))
            else:
                out += group_nodes(tree, f.group(r, counts, tree.stats))
        return children(self, out)


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
        return children(self, out)

    @property
    def pruned_count(self) -> int:
        return self.group.size


def group_nodes(tree: Tree, group) -> list[Node]:
    """A one-template group as one node per ZeRO stage (ZeRO-2/3 skeletons have bounds of their
    own, their collectives, that prune them together); a two-template group as one node."""
    if isinstance(group, SkeletonGroup) and len(group.zero_options) > 1:
        groups = [replace(group, zero_options=(z,)) for z in group.zero_options]
    else:
        groups = [group]
    return [node for g in groups if (node := group_node(tree, g)) is not None]


def group_node(tree: Tree, group) -> Node | None:
    """A group keyed at its largest replica counts (the most ZeRO sharding: least memory, and
    the smallest compute bound) and the least-work recompute mode that fits (recompute only adds
    work); None, counted as pruned, when no mode fits."""
    if isinstance(group, SkeletonGroup):
        top = max(group.replica_options)
        # the least-work mode of all bounds every mode: no better than the incumbent, no memory
        # check
        flows, v = min(group.replica_options), max(group.virtual_options)
        zero = min(group.zero_options)  # one stage, or ZeRO-0/1 only (their bounds are the same)
        cheap = tree.bounds.templates.group_bound(
            group.micro_batch,
            least_work(group.recompute_options),
            group.segments,
            group.total_micro_batches // top,
            flows,
            v,
            zero,
        )
        if tree.beaten(cheap):
            tree.stats.pruned[BOUND_RULE] += group.size
            return None
        # by increasing work: the first mode that fits bounds every mode that does
        rc = next(
            (
                rc
                for rc in sorted(group.recompute_options, key=DEFAULT_RECOMPUTE.index)
                if tree.fits(
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
            tree.stats.pruned[MEMORY_RULE] += group.size
            return None
        return GroupNode(
            tree.bounds.templates.group_bound(
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
    return pair_group_node(tree, group)

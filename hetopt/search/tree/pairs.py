"""Nodes of two templates side by side (hetopt.search.space.PairGroup): a group, its ranges of
replica counts, and its subgroups at fixed replica counts, whose shares are bisected."""

from __future__ import annotations

import operator
from dataclasses import dataclass

from hetopt.search.bounds.lines import first_true
from hetopt.search.bounds.pairs import single_class
from hetopt.search.bounds.run import Bounds
from hetopt.search.space import PairGroup
from hetopt.search.tree.base import (
    BOUND_RULE,
    MEMORY_GROUPS_RULE,
    MEMORY_RULE,
    Node,
    Tree,
    children,
    memory_modes,
    rekey,
    sharpened,
)
from hetopt.search.types import (
    ORDERS,
    least_work,
    orders,
)


@dataclass(frozen=True)
class PairGroupNode(Node):
    group: PairGroup

    pruned_as = "bound: two-template groups never expanded"

    def expand(self, tree: Tree) -> list[Node]:
        g = self.group
        modes = pair_modes(tree, g, g.recompute_options, max(g.a_replicas) + max(g.b_replicas))
        if not modes:
            return []
        return children(
            self, [range_node(tree, g, max(g.a_replicas), max(g.b_replicas), True, modes)]
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
    sharp: bool = False
    """Whether the key counts what no replica sheds yet (`PairBounds.least`, two single-class
    templates only): computed when the range first reaches the top of the heap."""

    pruned_as = "bound: two-template replica-count ranges never expanded"

    def expand(self, tree: Tree) -> list[Node]:
        g, out = self.group, []
        if not self.sharp and single_class(g):  # back in the heap at what no replica sheds
            lowest = (1 if self.rows else self.ra, 1)
            least = tree.bounds.pairs.least(
                g, self.modes, lowest, (self.ra, self.rb), self.bound, tree.threshold
            )
            return sharpened(tree, self, least, sharp=True)
        if self.rows:  # the top row as a range of its own, and the rows below
            out.append(range_node(tree, g, self.ra, self.rb, False, self.modes))
            if self.ra > 1:
                out.append(range_node(tree, g, self.ra - 1, self.rb, True, self.modes))
            return children(self, out)
        # the top cell's subgroups, and the rest of the row
        if self.rb > 1:
            out.append(range_node(tree, g, self.ra, self.rb - 1, False, self.modes))
        if g.shares(self.ra, self.rb):
            fitting = pair_modes(tree, g, self.modes, self.ra + self.rb)
            for rc in self.modes:
                sub = PairSubgroupNode(0.0, g, self.ra, self.rb, rc)
                tree.stats.enumerated += sub.size
                if rc in fitting:
                    shares = ShareBounds(tree.bounds, g, self.ra, self.rb, rc)
                    bound = max(
                        tree.bounds.pairs.bound(g, rc, memory_modes(rc, g), (self.ra, self.rb)),
                        shares.least(),
                    )
                    out.append(rekey(sub, bound))
                else:
                    tree.stats.pruned[MEMORY_RULE] += sub.size
        return children(self, out)


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
        return children(self, leaves)

    @property
    def pruned_count(self) -> int:
        return self.size


class ShareBounds:
    """`SkeletonBounds.bound` of a pair group's skeletons at fixed replica counts and
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
        packed = bounds.sends.packed((group.a, group.b))
        # a skeleton's own bound is its order's (`SkeletonBounds.packing`): the lesser covers both
        self.packings = [(order, packed) for order in ORDERS] if packed else [None]
        first = group.templates_at(ra, rb, self.shares[0])
        self.constant = max(
            bounds.templates.optimizer_bound(t, ra + rb, group.zero) for t in first
        ) + bounds.pairs.exchange(group, (ra, rb))

    def parts(self, i: int) -> tuple[float, float]:
        """(D_a, D_b) at the i-th share, each the lesser over the placement orders."""
        g, b = self.group, self.bounds
        return tuple(
            min(
                b.templates.drained_bound(
                    g.micro_batch,
                    self.recompute,
                    t,
                    self.ra + self.rb,
                    1,
                    g.zero,
                    self.memory,
                    packing=packing,
                )
                for packing in self.packings
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


def pair_modes(tree: Tree, group: PairGroup, modes, replicas_total: int) -> tuple[str, ...]:
    """The recompute modes in which both templates can hold the model, ZeRO over
    `replicas_total`."""
    return tuple(
        rc
        for rc in modes
        if tree.fits(
            group.micro_batch, memory_modes(rc, group), group.a, replicas_total, group.zero
        )
        and tree.fits(
            group.micro_batch, memory_modes(rc, group), group.b, replicas_total, group.zero
        )
    )


def range_node(
    tree: Tree, group: PairGroup, ra: int, rb: int, rows: bool, modes: tuple[str, ...]
) -> PairRangeNode:
    bound = tree.bounds.pairs.range_bound(
        group, least_work(modes), group.stage_modes or modes, (1 if rows else ra, 1), (ra, rb)
    )
    return PairRangeNode(bound, group, ra, rb, rows, modes)


def pair_group_node(tree: Tree, group: PairGroup) -> Node | None:
    """A two-template group keyed at its largest replica counts and the least-work recompute mode
    in which both templates fit; None, counted as pruned, when the incumbent beats it or no mode
    fits."""
    top = (max(group.a_replicas), max(group.b_replicas))
    # as above: the least-work mode of all bounds every mode, before any memory check
    every = group.stage_modes or group.recompute_options
    if tree.beaten(
        tree.bounds.pairs.range_bound(
            group, least_work(group.recompute_options), every, (1, 1), top
        )
    ):
        tree.stats.pruned[PairGroupNode.pruned_as] += 1
        return None
    modes = pair_modes(tree, group, group.recompute_options, sum(top))
    if not modes:
        tree.stats.pruned[MEMORY_GROUPS_RULE] += 1
        return None
    return PairGroupNode(
        tree.bounds.pairs.range_bound(
            group, least_work(modes), group.stage_modes or modes, (1, 1), top
        ),
        group,
    )

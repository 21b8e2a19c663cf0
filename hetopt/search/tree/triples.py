"""Nodes of three templates side by side (hetopt.search.triples): a family, its groups as boxes of
replica counts halved down to single counts, and the shares at fixed counts."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from hetopt.search.bounds.lines import first_true
from hetopt.search.bounds.run import Bounds
from hetopt.search.space import DIVISIBILITY
from hetopt.search.tree.base import (
    BOUND_RULE,
    MEMORY_GROUPS_RULE,
    MEMORY_RULE,
    TRIPLE_GROUPS_RULE,
    Node,
    Tree,
    children,
    sharpened,
)
from hetopt.search.triples import TRIPLE_SHARED
from hetopt.search.types import (
    orders,
)


@dataclass(frozen=True)
class TripleFamilyNode(Node):
    """Three single-class runs at one micro-batch size (hetopt.search.triples.TripleFamily), a root
    keyed by `TripleBounds.family_bound`; when it first reaches the top of the heap it goes back at
    the least bound of its groups (`TripleBounds.table`), and the next time it makes the groups
    that table leaves open (the others are never made, counted as pruned under their reasons)."""

    family: object
    refined: bool = False

    pruned_as = "bound: whole three-template families never generated (device classes × TP degrees)"

    def expand(self, tree: Tree) -> list[Node]:
        table, why = tree.bounds.triples.table(self.family)
        if not self.refined:  # back at the least of its groups' keys and what no replica sheds
            least = max(self.bound, float(table.min(initial=math.inf)))
            if not tree.beaten(least):
                least = tree.bounds.triples.family_least(self.family, least, tree.threshold)
            return sharpened(tree, self, least, refined=True)
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
            if not reaches(tree, group, (1, 1, 1), group.tops) or tree.beaten(
                bound := tree.bounds.triples.bound(group)
            ):
                stats.pruned[TRIPLE_GROUPS_RULE] += 1
            else:
                out.append(TripleGroupNode(bound, group, level=tree.threshold))
        return children(self, out)


@dataclass(frozen=True)
class TripleGroupNode(Node):
    """Three single-class templates (hetopt.search.triples) at the replica counts of a box, lowest_j
    ≤ R_j ≤ replicas_j (default every count the classes allow), keyed by `TripleBounds.bound` over
    the box. Expanding halves the box's longest side; a box of one point has a child per recompute
    mode (`TripleSharesNode`). Replica counts only add GPUs, so a box whose lowest corner does not
    fit on the classes holds no point that does."""

    group: object
    lowest: tuple[int, int, int] = (1, 1, 1)
    replicas: tuple[int, int, int] | None = None
    level: float = math.inf
    """The search's threshold when the box was made and found to reach it (`reaches`)."""
    sharp: bool = False
    """Whether the key is the least level at which the box takes its micro-batches yet
    (`TripleBounds.least`): computed when the box first reaches the top of the heap, most boxes
    never do."""

    pruned_as = "bound: three-template replica-count boxes never expanded"

    def expand(self, tree: Tree) -> list[Node]:
        g, lo = self.group, self.lowest
        hi = self.replicas or g.tops
        if not self.sharp:  # back in the heap at what no replica sheds, or pruned
            least = tree.bounds.triples.least(g, lo, hi, self.bound, tree.threshold)
            return sharpened(tree, self, least, sharp=True)
        if tree.threshold < self.level and not reaches(tree, g, lo, hi):  # the incumbent fell since
            tree.stats.pruned[self.pruned_as] += 1
            return []
        if lo == hi:
            return children(self, triple_share_nodes(tree, g, lo))
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
            # the others' least replicas take micro-batches each replica of a template can no
            # longer have (m_j ≥ p_j): the box shrinks to what is left
            caps = g.slot_caps(low)
            if caps is None:
                tree.stats.pruned[DIVISIBILITY] += 1
                continue
            high = tuple(min(h, c) for h, c in zip(high, caps, strict=True))
            if not reaches(tree, g, low, high) or tree.beaten(
                bound := tree.bounds.triples.bound(g, low, high)
            ):
                tree.stats.pruned[self.pruned_as] += 1
            else:
                out.append(TripleGroupNode(bound, g, low, high, tree.threshold))
        return children(self, out)


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
        return children(self, leaves)


class TripleShares:
    """`SkeletonBounds.bound` of a triple group's skeletons at fixed replica counts and
    recompute mode, as a function of the shares: max_j D_j(m_j) + C, with D_j template j's
    `drained_bound`, which rises with its micro-batches m_j (`ShareBounds`), and C the ring exchange
    and optimizer step (`TripleBounds.constant`). Below a level θ template j takes at most cap_j(θ)
    micro-batches per replica, found by bisection; no share has every D_j(m_j) ≤ θ unless Σ_j
    R_j·cap_j(θ) ≥ M. C at these replica counts (`TripleBounds.constant`): the skeletons'
    own, so their leaves are not made below it only to be refined above it one by one."""

    def __init__(
        self, bounds: Bounds, group, replicas: tuple[int, int, int], recompute: str
    ) -> None:
        self.bounds, self.group, self.replicas, self.recompute = bounds, group, replicas, recompute
        # each template at the lesser of its two placement orders' bounds
        self.packed = bounds.sends.packed(group.sides)
        self.constant = bounds.triples.constant(group, sum(replicas), replicas, least=replicas)
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
        return self.bounds.reach.drained(
            g.micro_batch,
            self.recompute,
            (self.recompute,),
            g.sides[j],
            g.zero,
            self.replicas[j],
            micro_batches,
            sum(self.replicas),
            self.packed,
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


def reaches(
    tree: Tree, group, lowest: tuple[int, int, int], replicas: tuple[int, int, int]
) -> bool:
    """Whether a triple group's templates can take its M micro-batches below the incumbent at
    some replica counts of the box lowest ≤ R ≤ replicas (`TripleBounds.reach`)."""
    if not math.isfinite(tree.incumbent):
        return True
    return (
        tree.bounds.triples.reach(group, lowest, replicas, tree.threshold)
        >= group.total_micro_batches
    )

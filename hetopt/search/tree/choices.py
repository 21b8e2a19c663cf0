"""Nodes that list the one-template families lazily (hetopt.search.space.SingleBatch).

A one-template family is a run of distinct device classes, each at one TP degree. On a cluster of
many classes there are millions of them (six classes at four TP degrees: 6.7 million per micro-batch
size), too many to list before the search solves anything. So the tree decides them class by class,
in the cluster's order: a `ChoiceNode` has fixed, for each of the first classes, whether it is in
and at which TP degree. Its bound is the throughput bound of every family under it: with the classes
in at their TP degrees and the open ones at their best, at most search.max_classes classes in all,

    T ≥ M·N / (Σ_{k in} G_k/(t_k·c·a_k(t_k)) + the largest of max_t G_j/(t·c·a_j(t)), j open),

which is at most each family's `FamilyBounds.bound` (that adds the sends at each change of class,
w ≥ 0, to N), or the larger replica-aware bound (hetopt.search.bounds.choices): a template's
replicas each need a stage of every class in, so the smallest class caps R, and a replica holds at
most P stages; with two classes in or more it adds the pipeline's fill and the sends of the
cheapest order (with some classes open, the least sends that reach every class and island in).
With every class decided, the node's children are the families: every order of the classes in,
as a `FamilyNode` (only the canonical orders under interchangeable islands,
hetopt.search.symmetry).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

from hetopt.search.bounds.choices import ChoiceBounds
from hetopt.search.space import SYMMETRY_RULE, SingleBatch, tp_options
from hetopt.search.symmetry import canonical, island_blocks
from hetopt.search.tree.base import Node, Tree, children
from hetopt.search.tree.families import FamilyNode
from hetopt.search.types import least_work

CHOICES_RULE = "bound: sets of device classes × TP degrees never listed (one template)"


class ClassRates:
    """Micro-batches per second per layer that each device class can give a template at each TP
    degree, G_k/(t·c·a_k(t)) (`FamilyBounds.bound`), for one `SingleBatch`; inf where a_k ≤ 0
    (no bound)."""

    def __init__(self, tree: Tree, singles: SingleBatch) -> None:
        inst, opts = tree.inst, tree.options
        b, _, cp = singles.batch
        rc = least_work(singles.shared.recompute)
        self.classes = list(inst.cluster.device_classes.values())
        self.tps = [tuple(tp_options(inst, dc, opts, cp)) for dc in self.classes]
        self.rate: list[dict[int, float]] = []
        for dc, tps in zip(self.classes, self.tps, strict=True):
            rates = {}
            for t in tps:
                a = tree.bounds.templates.per_layer_s(dc.gpu, t, b, rc, cp)
                rates[t] = math.inf if a <= 0 else dc.gpus / (t * cp * a * inst.model.layers)
            self.rate.append(rates)
        self.best = [max(r.values(), default=0.0) for r in self.rate]
        self.blocks = island_blocks(inst) if opts.symmetry else {}
        shared = singles.shared
        one_f1b = max(shared.virtual) == 1
        self.replicas = ChoiceBounds(
            tree.bounds.templates,
            self.classes,
            self.tps,
            singles.batch,
            rc,
            opts.max_stages,
            max(shared.virtual),
            unshed=one_f1b and all(z < 2 for z in singles.zero),
            unshed_one=one_f1b and singles.zero[0] < 2,
        )

    def bound(
        self,
        singles: SingleBatch,
        chosen: tuple[int, ...],
        most: int,
        order: tuple[int, ...] | None = None,
    ) -> float:
        """The bound of every family whose first classes are `chosen`: the larger of
        `throughput_bound` and the replica-aware bound (`ChoiceBounds`); inf where no family is
        left. `order`: every class decided, of the one family in that order (class indices)."""
        room = most - sum(1 for t in chosen if t)
        if room < 0:
            return math.inf
        return max(
            self.throughput_bound(singles, chosen, most),
            self.replicas.bound(chosen, room, order),
        )

    def throughput_bound(self, singles: SingleBatch, chosen: tuple[int, ...], most: int) -> float:
        """The module docstring's throughput bound of every family whose first classes are
        `chosen`; inf where no family is left (no class in, and none open)."""
        ins = [self.rate[i][t] for i, t in enumerate(chosen) if t]
        room = most - len(ins)
        if room < 0:
            return math.inf
        open_best = sorted(self.best[len(chosen) :], reverse=True)[:room]
        total = sum(ins) + sum(open_best)
        if total <= 0:
            return math.inf
        return 0.0 if math.isinf(total) else singles.batch[1] / total


@dataclass(frozen=True)
class ChoiceNode(Node):
    """The one-template families of `singles` whose first len(chosen) classes are decided."""

    singles: SingleBatch
    chosen: tuple[int, ...] = ()
    """The TP degree of each of the cluster's first classes; 0 where the class is left out."""

    pruned_as = CHOICES_RULE

    def expand(self, tree: Tree) -> list[Node]:
        rates, i = class_rates(tree, self.singles), len(self.chosen)
        if i == len(rates.classes):
            return children(self, self._families(tree))
        ins = [t for t in self.chosen if t]
        out: list[Node] = []
        for t in (0, *rates.tps[i]):
            if t and tree.options.uniform_tp and ins and t != ins[0]:
                continue
            chosen = (*self.chosen, t)
            bound = rates.bound(self.singles, chosen, tree.options.max_classes)
            if math.isinf(bound):
                continue
            if tree.beaten(bound):  # pruned as it is made
                tree.stats.pruned[CHOICES_RULE] += 1
                continue
            out.append(ChoiceNode(bound, self.singles, chosen))
        return children(self, out)

    def _families(self, tree: Tree) -> list[Node]:
        """Every family over the classes in: each order of them (the canonical ones), keyed by its
        `FamilyBounds.bound` and the choices' bound with the sends of its own order's path (those
        the incumbent beats pruned as they are made)."""
        rates = class_rates(tree, self.singles)
        decided = enumerate(zip(rates.classes, self.chosen, strict=True))
        picked = [(k, dc, t) for k, (dc, t) in decided if t]
        out: list[Node] = []
        for run in itertools.permutations(picked):
            order = tuple(dc for _, dc, _ in run)
            if not canonical(order, rates.blocks):
                tree.stats.pruned[SYMMETRY_RULE] += 1
                continue
            tree.stats.families += 1
            family = self.singles.family(tree.inst, tree.options, order, tuple(t for *_, t in run))
            bound = tree.bounds.families.bound(family)
            if len(run) > 1 and not tree.beaten(bound):  # its own sends, not the least tree's
                path = tuple(k for k, _, _ in run)
                most = tree.options.max_classes
                bound = max(bound, rates.bound(self.singles, self.chosen, most, path))
            if tree.beaten(bound):  # pruned as it is made
                tree.stats.pruned[FamilyNode.pruned_as] += 1
                continue
            out.append(FamilyNode(bound, family, refined=True))
        return out


def class_rates(tree: Tree, singles: SingleBatch) -> ClassRates:
    """`singles`' ClassRates, built once per tree (a worker's tree builds its own: a choice node
    travels without them)."""
    memo = tree.memo.setdefault(ClassRates, {})
    if singles not in memo:
        memo[singles] = ClassRates(tree, singles)
    return memo[singles]


def choice_root(tree: Tree, singles: SingleBatch) -> ChoiceNode | None:
    """The root of `singles`' families (no class decided), None where it holds none."""
    bound = class_rates(tree, singles).bound(singles, (), tree.options.max_classes)
    return None if math.isinf(bound) else ChoiceNode(bound, singles)

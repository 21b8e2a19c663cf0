"""The roots of the search tree: every root of the plan space as a node, keyed by its bound."""

from __future__ import annotations

from collections.abc import Iterator

from hetopt.search.roots import enumerate_roots
from hetopt.search.space import Family, SingleBatch
from hetopt.search.tree.base import (
    Node,
    SkeletonNode,
    Tree,
)
from hetopt.search.tree.choices import choice_root
from hetopt.search.tree.families import FamilyNode
from hetopt.search.tree.triples import TripleFamilyNode
from hetopt.search.types import (
    Skeleton,
)


def roots(tree: Tree) -> Iterator[Node]:
    """Every root of the plan space (`enumerate_roots`) as a node: the one-template families of
    each micro-batch size and CP degree as one `ChoiceNode` (listed class by class,
    hetopt.search.tree.choices), a pair family keyed by its throughput bound
    (`FamilyBounds.bound`; its key rises to the least bound of its groups when it first reaches
    the top, `FamilyNode.expand`: building the roots stays cheap, inside the search's clock), a
    group of three templates by `TripleBounds.bound`, a skeleton with shards or a uniform layout's
    a leaf keyed by its own bound (`SkeletonBounds.bound`)."""
    for root in enumerate_roots(
        tree.inst, tree.options, tree.stats, tree.bounds.profiles, lazy=True
    ):
        if isinstance(root, SingleBatch):  # its families listed class by class
            node = choice_root(tree, root)
            if node is not None:
                yield node
        elif isinstance(root, Family):
            yield FamilyNode(tree.bounds.families.bound(root), root, refined=not root.pair)
        elif isinstance(root, Skeleton):  # with shards, or a uniform layout's in lockstep
            yield SkeletonNode(tree.bounds.skeletons.bound(root), root, refined=True)
        else:
            yield TripleFamilyNode(tree.bounds.triples.family_bound(root), root)

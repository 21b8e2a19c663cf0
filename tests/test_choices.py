"""The one-template families listed class by class (hetopt.search.tree.choices): the same families
as the eager listing, and a bound below every family under a node."""

from __future__ import annotations

import dataclasses
from collections import Counter
from pathlib import Path

import pytest

from hetopt.cost.profiles import Profiles
from hetopt.search.bounds.run import Bounds
from hetopt.search.space import SYMMETRY_RULE, Family, enumerate_families
from hetopt.search.tree.base import Tree
from hetopt.search.tree.choices import CHOICES_RULE, ChoiceNode
from hetopt.search.tree.families import FamilyNode
from hetopt.search.tree.roots import roots
from hetopt.search.types import SearchOptions, SearchStats
from hetopt.spec.instance import load_instance

SMALL = Path(__file__).parent / "small"


def _listed(tree: Tree, node, bounds: list[float]) -> list[Family]:
    """Every family under `node`, expanding it whole; `bounds`: the choice keys on the way."""
    if isinstance(node, FamilyNode):
        assert all(b <= node.bound * (1 + 1e-12) for b in bounds), (bounds, node.bound)
        return [node.family]
    assert isinstance(node, ChoiceNode)
    out = []
    for child in node.expand(tree):
        assert child.bound >= node.bound
        out += _listed(tree, child, [*bounds, node.bound])
    return out


def _holds_skeletons(family: Family, opts: SearchOptions, layers: int) -> bool:
    """Whether some replica count leaves every class of the family a stage within the cap P: the
    choices never list a family that holds no skeleton (`ChoiceBounds`: no replica count left)."""
    return any(
        family.stage_cap(opts, layers, r) >= len(family.classes) for r in family.replica_counts()
    )


def _options(inst, variant: str) -> SearchOptions:
    opts = SearchOptions.from_instance(inst)
    if variant == "uniform-tp":
        return dataclasses.replace(opts, uniform_tp=True)
    if variant == "two-classes":
        return dataclasses.replace(opts, max_classes=2)
    if variant == "no-symmetry":
        return dataclasses.replace(opts, symmetry=False)
    return opts


@pytest.mark.parametrize(
    "name, variant",
    [
        ("s4-three-types", "default"),
        ("s10-four-types", "default"),
        ("s10-four-types", "uniform-tp"),
        ("s10-four-types", "two-classes"),
        ("s15-context-parallel", "default"),
        ("s23-five-types", "default"),
        ("s24-five-zones", "default"),
        ("s24-five-zones", "no-symmetry"),
    ],
)
def test_class_by_class_lists_exactly_the_families_listed_at_once(name, variant):
    """Expanded whole (no incumbent), the choice nodes list every one-template family of the eager
    listing that holds a skeleton once, no other, with the same symmetry prunes; every choice key
    is at most the bound of each family under it, and keys never fall going down."""
    inst = load_instance(SMALL / f"{name}.yaml")
    opts = _options(inst, variant)
    eager_stats = SearchStats()
    listed = enumerate_families(inst, opts, eager_stats)
    layers = inst.model.layers
    eager = Counter(
        f
        for f in listed
        if isinstance(f, Family) and not f.pair and _holds_skeletons(f, opts, layers)
    )
    stats = SearchStats()
    tree = Tree(inst, opts, stats, Bounds(inst, Profiles()))
    lazy: Counter = Counter()
    choice_roots = [n for n in roots(tree) if isinstance(n, ChoiceNode)]
    assert choice_roots
    for root in choice_roots:
        lazy.update(_listed(tree, root, []))
    assert Counter(f for f in lazy if _holds_skeletons(f, opts, layers)) == eager
    # the choices never list the families that hold no skeleton, nor prune their orders
    assert stats.pruned[SYMMETRY_RULE] <= eager_stats.pruned[SYMMETRY_RULE]
    if variant == "no-symmetry" or name == "s24-five-zones":
        assert (stats.pruned[SYMMETRY_RULE] > 0) == (variant != "no-symmetry")


def _family_nodes(tree: Tree, node) -> list[FamilyNode]:
    """Every family node under a choice node, expanding it whole."""
    if isinstance(node, FamilyNode):
        return [node]
    return [f for child in node.expand(tree) for f in _family_nodes(tree, child)]


def test_choices_the_incumbent_beats_are_never_made_and_are_counted():
    """With an incumbent, a choice whose key reaches it is pruned as it is made (counted under its
    rule) and every family listed has a key below it; the families it loses are exactly those whose
    key (their own bound, or the choices' above it) proves them no better."""
    inst = load_instance(SMALL / "s10-four-types.yaml")
    opts = SearchOptions.from_instance(inst)
    full = Tree(inst, opts, SearchStats(), Bounds(inst, Profiles()))
    every = [n for r in roots(full) if isinstance(r, ChoiceNode) for n in _family_nodes(full, r)]
    keys = sorted(n.bound for n in every)
    incumbent = keys[len(keys) // 2]  # half of the families' keys lie below it
    stats = SearchStats()
    tree = Tree(inst, opts, stats, Bounds(inst, Profiles()))
    tree.incumbent = incumbent
    open_nodes = [r for r in roots(tree) if isinstance(r, ChoiceNode)]
    kept: list[FamilyNode] = []
    while open_nodes:
        node = open_nodes.pop()
        for child in node.expand(tree):
            assert child.bound < tree.threshold
            (kept if isinstance(child, FamilyNode) else open_nodes).append(child)
    assert stats.pruned[CHOICES_RULE] > 0
    # no family with a key below the incumbent is lost
    below = Counter(n.family for n in every if n.bound < tree.threshold)
    assert below and set(below) <= {n.family for n in kept}

"""The plan space as a whole: its roots, every enumerator's together (the search tree's starting
nodes), and whether a plan is one of its points.

The families of one or two templates (hetopt.search.space), the uniform layouts in lockstep
(hetopt.search.uniform), the skeletons with shards (hetopt.search.shards) and the families of three
templates (hetopt.search.triples).
"""

from __future__ import annotations

from collections.abc import Iterator

from hetopt.cost.profiles import Profiles
from hetopt.plan import Plan
from hetopt.search.membership import outside_families
from hetopt.search.shards import Layouts
from hetopt.search.space import Family, SingleBatch, enumerate_families
from hetopt.search.triples import triple_families
from hetopt.search.types import SearchOptions, SearchStats, Skeleton
from hetopt.search.uniform import lockstep_layout, lockstep_skeletons
from hetopt.spec.instance import Instance


def enumerate_roots(
    inst: Instance,
    opts: SearchOptions,
    stats: SearchStats,
    profiles: Profiles | None = None,
    lazy: bool = False,
) -> Iterator[Family | SingleBatch | Skeleton]:
    """The roots of the plan space, the search tree's (hetopt.search.tree.roots): every family; with
    search.shards every skeleton with shards, whose layouts follow the speeds of `profiles` (default
    the shipped ones); with search.max_templates 3 (default) every family of three templates
    (hetopt.search.triples.TripleFamily); with search.uniform_layouts the skeleton of every uniform
    layout the families do not hold (hetopt.search.uniform). With `beyond_narrow` the families only
    (the narrowed subspace holds the rest). With `lazy` the one-template families of each
    micro-batch size and CP degree come as one `SingleBatch` (`enumerate_families`)."""
    yield from enumerate_families(inst, opts, stats, lazy)
    if opts.beyond_narrow:
        return
    if opts.uniform_layouts:
        yield from lockstep_skeletons(inst, opts, stats)
    if opts.shards:
        yield from Layouts(inst, opts, profiles).skeletons(stats)
    if opts.max_templates >= 3:  # last: on a large cluster they are many
        yield from triple_families(inst, opts, stats)


def enumerate_skeletons(
    inst: Instance, opts: SearchOptions, stats: SearchStats, profiles: Profiles | None = None
) -> Iterator[Skeleton]:
    """Every skeleton of the plan space: those under each root (`enumerate_roots`)."""
    for root in enumerate_roots(inst, opts, stats, profiles):
        if isinstance(root, Skeleton):
            yield root
        elif isinstance(root, Family):
            for group in root.groups(inst, opts, stats):
                yield from group.skeletons()
        else:  # a family of three templates
            for group in root.groups(stats):
                yield from group.skeletons()


def outside_space(
    inst: Instance, plan: Plan, opts: SearchOptions, profiles: Profiles | None = None
) -> list[str]:
    """Why `plan` is not a plan of the search space (every rule it breaks; [] when it is one): the
    space's plans are 1F1B (or interleaved 1F1B with search.virtual_stages, one template), a ZeRO
    stage of search.zero (2 and 3 with one template), sequence parallel, one micro-batch size and
    recompute mode from the options, TP from the options and inside a node, at most max_stages
    stages and max_classes device classes per template, each class one contiguous run at one TP
    (with search.tp_per_stage one class of a template may be two consecutive runs at two TP
    degrees), one context-parallel degree of search.cp for every stage, and at most max_templates
    templates — two side by side only of at most search.pair_classes classes each (1 by default;
    three, with max_templates 3 (default), of one class at one TP, CP 1 and one recompute mode
    each); a stage of a replica is one rank, or with search.shards the stages are the device groups
    of `hetopt.search.shards` (whose speeds come from `profiles`, default the shipped ones); with
    search.uniform_layouts every uniform layout's plan with one layer split for all its templates
    (hetopt.search.uniform) is a point too."""
    why = outside_families(inst, plan, opts, profiles)
    if why and opts.uniform_layouts and lockstep_layout(inst, plan, opts) is not None:
        return []
    return why

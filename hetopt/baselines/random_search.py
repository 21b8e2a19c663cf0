"""`random`: budgeted random search over hetopt's own plan space, seeded — a skeleton drawn at
random (a root of the search tree — a family, a skeleton with shards or of a uniform layout, or with
search.max_templates 3 a family of three templates — then one of its groups or replica counts, then
one of its skeletons), a random layer split of each template (one for all in lockstep; and, with
per-stage recompute, a random mode for each stage), timed; the best plan that fits is kept. No
bounds, so no proof: what a search without a model of the space finds in the same time."""

from __future__ import annotations

import itertools
import random

from hetopt.baselines.common import Candidates, PlannerResult
from hetopt.cost.profiles import Profiles
from hetopt.search.roots import enumerate_roots
from hetopt.search.triples import TripleFamily
from hetopt.search.types import SearchOptions, SearchStats, Skeleton
from hetopt.spec.instance import Instance

DEFAULT_SAMPLES = 400


def random_search(
    inst: Instance,
    time_limit_s: float = 60.0,
    profiles: Profiles | None = None,
    seed: int = 0,
    samples: int = DEFAULT_SAMPLES,
) -> PlannerResult:
    profiles = profiles or Profiles()
    options = SearchOptions.from_instance(inst)
    rng = random.Random(seed)
    roots = list(enumerate_roots(inst, options, SearchStats(), profiles))
    cands = Candidates(inst, profiles, time_limit_s)
    layers = inst.model.layers
    tries = 0
    while tries < samples and not cands.out_of_time and roots:
        tries += 1
        sk = draw_skeleton(rng.choice(roots), inst, options, rng)
        if sk is None:
            continue
        splits = []
        for depth in sk.split_depths:
            cuts = sorted(rng.sample(range(1, layers), depth - 1))
            splits.append([b - a for a, b in zip([0, *cuts], [*cuts, layers], strict=True)])
        split = sk.joined(splits)
        modes = [rng.choice(sk.modes) for _ in split] if sk.modes else None
        cands.offer(sk.plan(split, modes))
    return cands.result("random", f"{tries} random skeletons, seed {seed}")


def draw_skeleton(
    root, inst: Instance, options: SearchOptions, rng: random.Random
) -> Skeleton | None:
    """A skeleton under `root` drawn at random: a family's group (a pair or triple family's among
    its first 2,000; a one-template family's at a random replica count), a triple group's replica
    counts, then one of the first 500 skeletons; a skeleton root (with shards, or a uniform
    layout's) is itself. None where the draw holds none."""
    if isinstance(root, Skeleton):
        return root
    if isinstance(root, TripleFamily):
        groups = list(itertools.islice(root.groups(SearchStats()), 2000))
        if not groups:
            return None
        group = rng.choice(groups)
        counts = list(itertools.islice(group.replica_counts(), 2000))
        skeletons = (
            list(itertools.islice(group.skeletons_at(rng.choice(counts)), 500)) if counts else []
        )
        return rng.choice(skeletons) if skeletons else None
    if root.pair:
        groups = list(itertools.islice(root.groups(inst, options, SearchStats()), 2000))
    else:
        counts = root.replica_counts()
        groups = (
            list(root.groups(inst, options, SearchStats(), rng.choice(counts))) if counts else []
        )
    if not groups:
        return None
    skeletons = list(itertools.islice(rng.choice(groups).skeletons(), 500))
    return rng.choice(skeletons) if skeletons else None

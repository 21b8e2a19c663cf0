"""`random`: budgeted random search over hetopt's own plan space, seeded — a skeleton drawn at random (a
family, then one of its groups, then one of its skeletons), a random layer split of each template (and,
with per-stage recompute, a random mode for each stage), timed;
the best plan that fits is kept. No bounds, so no proof: what a search without a model of the space finds
in the same time."""

from __future__ import annotations

import itertools
import random

from hetopt.baselines.common import Candidates, PlannerResult
from hetopt.cost.profiles import Profiles
from hetopt.search.space import SearchOptions, SearchStats, enumerate_families
from hetopt.spec.instance import Instance

DEFAULT_SAMPLES = 400


def random_search(inst: Instance, time_limit_s: float = 60.0, profiles: Profiles | None = None, seed: int = 0,
                  samples: int = DEFAULT_SAMPLES) -> PlannerResult:
    profiles = profiles or Profiles()
    options = SearchOptions.from_instance(inst)
    rng = random.Random(seed)
    families = list(enumerate_families(inst, options, SearchStats()))
    cands = Candidates(inst, profiles, time_limit_s)
    layers = inst.model.layers
    tries = 0
    while tries < samples and not cands.out_of_time and families:
        tries += 1
        family = rng.choice(families)
        if family.pair:
            groups = list(itertools.islice(family.groups(inst, options, SearchStats()), 2000))
        else:
            counts = family.replica_counts()
            if not counts:
                continue
            groups = list(family.groups(inst, options, SearchStats(), rng.choice(counts)))
        if not groups:
            continue
        group = rng.choice(groups)
        skeletons = list(itertools.islice(group.skeletons(), 500))
        if not skeletons:
            continue
        sk = rng.choice(skeletons)
        split = []
        for depth in sk.depths:
            cuts = sorted(rng.sample(range(1, layers), depth - 1))
            split += [b - a for a, b in zip([0, *cuts], [*cuts, layers], strict=True)]
        modes = [rng.choice(sk.modes) for _ in split] if sk.modes else None
        cands.offer(sk.plan(split, modes))
    return cands.result("random", f"{tries} random skeletons, seed {seed}")

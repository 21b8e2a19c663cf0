"""`data-parallel`: the plans a user writes first, as the exact search's first incumbent.

Pure data parallelism (one stage, TP inside a node), then the shallowest pipelines, each a uniform
layout over one set of device classes of hetopt.search.uniform.layout_subsets: every GPU, each
island, each GPU type, the fastest classes, the nearest islands. The GPUs outside the set stay
idle, where that is faster. Every such plan is a point of the search space (a lockstep skeleton, or
a family's), so the search's bound covers it.
"""

from __future__ import annotations

from hetopt.baselines.common import Candidates, PlannerResult
from hetopt.baselines.uniform import min_max_split, with_layers
from hetopt.cost.profiles import Profiles
from hetopt.search.types import SearchOptions
from hetopt.search.uniform import class_nodes, layout_plan, layout_subsets, max_tp, uniform_layouts
from hetopt.spec.instance import Instance


def data_parallel(
    inst: Instance, time_limit_s: float = 60.0, profiles: Profiles | None = None, seed: int = 0
) -> PlannerResult:
    """The fastest uniform layout over a set of device classes, shallowest pipelines first, within
    `time_limit_s`; a heuristic (no bound). Each layout is tried with the even layer split and the
    min-max split (hetopt.baselines.uniform.min_max_split)."""
    profiles = profiles or Profiles()
    options = SearchOptions.from_instance(inst)
    cands = Candidates(inst, profiles, time_limit_s)
    tries = []
    for rank, classes in enumerate(layout_subsets(inst)):
        nodes = class_nodes(inst, classes)
        gpus = sum(n.gpus for n in nodes)
        for layout in uniform_layouts(inst, gpus, options, max_tp(inst, nodes)):
            tries.append(((layout.pp, rank, layout.tp), layout, nodes))
    for _, layout, nodes in sorted(tries, key=lambda t: t[0]):
        if cands.out_of_time:
            break
        plan = layout_plan(inst, layout, nodes)
        if plan is None:
            continue
        cands.offer(plan)
        if layout.pp > 1 and (layers := min_max_split(inst, profiles, plan)) is not None:
            cands.offer(with_layers(plan, layers))
    return cands.result("data-parallel")

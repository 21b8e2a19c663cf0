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
from hetopt.search.types import DEFAULT_RECOMPUTE, SearchOptions
from hetopt.search.uniform import class_nodes, layout_plan, layout_subsets, max_tp, uniform_layouts
from hetopt.spec.instance import Instance


def data_parallel(
    inst: Instance, time_limit_s: float = 60.0, profiles: Profiles | None = None, seed: int = 0
) -> PlannerResult:
    """The fastest uniform layout over a set of device classes, shallowest pipelines first, within
    `time_limit_s`; a heuristic (no bound). Each layout is tried with the even layer split and the
    min-max split (hetopt.baselines.uniform.min_max_split). Two rules of the cost model skip
    layouts that cannot win (`_dominated`): recomputing only adds compute, so a recompute mode is
    tried only where the ones of less work do not fit; and a larger micro-batch only holds more
    activations, so it is not tried where a smaller one fits in no mode."""
    profiles = profiles or Profiles()
    options = SearchOptions.from_instance(inst)
    cands = Candidates(inst, profiles, time_limit_s)
    modes = sorted(options.recompute, key=DEFAULT_RECOMPUTE.index)  # least work first
    tries = []
    for rank, classes in enumerate(layout_subsets(inst)):
        nodes = class_nodes(inst, classes)
        gpus = sum(n.gpus for n in nodes)
        for layout in uniform_layouts(inst, gpus, options, max_tp(inst, nodes)):
            order = (layout.pp, rank, layout.tp, layout.mb, modes.index(layout.recompute))
            tries.append((order, layout, nodes))
    fitted: dict[tuple, bool] = {}  # (rank, pp, tp, mb) → whether some mode fits
    for (pp, rank, tp, mb, _), layout, nodes in sorted(tries, key=lambda t: t[0]):
        if cands.out_of_time:
            break
        if _dominated(fitted, (rank, pp, tp), mb):
            continue
        plan = layout_plan(inst, layout, nodes)
        if plan is None:
            continue
        cands.offer(plan)
        fits = cands.last is not None and cands.last.fits
        fitted[rank, pp, tp, mb] = fitted.get((rank, pp, tp, mb), False) or fits
        if pp > 1 and fits and (layers := min_max_split(inst, profiles, plan)) is not None:
            cands.offer(with_layers(plan, layers))
    return cands.result("data-parallel")


def _dominated(fitted: dict[tuple, bool], layout: tuple[int, int, int], mb: int) -> bool:
    """Whether a layout (subset rank, pp, tp) at micro-batch `mb` cannot beat what was tried: a
    mode of less work fits at this micro-batch, or no mode fit at a smaller one."""
    if fitted.get((*layout, mb)):
        return True
    return any(not fits for (*key, b), fits in fitted.items() if tuple(key) == layout and b < mb)

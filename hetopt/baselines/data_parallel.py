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
    layouts that cannot win: recomputing only adds compute, so a recompute mode is tried only where
    the ones of less work do not fit; and a larger micro-batch only holds more activations, so it
    is not tried where a smaller one fits in no mode."""
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
    fits_at: dict[tuple, bool] = {}  # (rank, pp, tp, mb) → whether some mode fits there
    too_big: dict[tuple, int] = {}  # (rank, pp, tp) → the least micro-batch no mode fits at
    for (pp, rank, tp, mb, mode_index), layout, nodes in sorted(tries, key=lambda t: t[0]):
        if cands.out_of_time:
            break
        if fits_at.get((rank, pp, tp, mb)) or mb > too_big.get((rank, pp, tp), mb):
            continue  # a mode of less work fits here, or no mode fit a smaller micro-batch
        plan = layout_plan(inst, layout, nodes)
        if plan is None:
            continue
        cands.offer(plan)
        if cands.last is None:  # outside the space or refused: nothing learnt about memory
            continue
        fits = cands.last.fits
        fits_at[rank, pp, tp, mb] = fits_at.get((rank, pp, tp, mb), False) or fits
        if mode_index == len(modes) - 1 and not fits_at[rank, pp, tp, mb]:
            too_big[rank, pp, tp] = min(too_big.get((rank, pp, tp), mb), mb)
        if pp > 1 and fits and (layers := min_max_split(inst, profiles, plan)) is not None:
            cands.offer(with_layers(plan, layers))
    return cands.result("data-parallel")

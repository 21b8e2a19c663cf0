"""`metis-like`: Metis's plan shapes (Um et al., ATC 2024) by its rules of proportion, no search
over splits.

One pipeline template of R identical replicas whose stages are served by groups of data-parallel
ranks that may mix GPU types (`Stage.shards`):
- ranks: tp GPUs of one device class inside one node; a replica takes 1/R of every class's ranks;
- device groups: a replica's ranks, fastest class first, cut into p consecutive groups of about
  equal
  speed, so a stage mixes the classes at its cut points (Metis's heterogeneous device groups);
- data load balancing: each micro-batch of b sequences is split among a stage's ranks in proportion
  to
  their speed (whole sequences, at least one each);
- layer load balancing: layers in proportion to each stage's speed, then moved one at a time off
  stages
  that do not fit in memory.
The layouts are hetopt.search.shards's (`Layouts`), which the exact search also searches with
search.shards; speeds come from the cost model (`TemplateBounds.stage_line`: seconds per layer of a
rank at the micro-batch size). Every layout of them (`Layouts.layouts`: every TP degree, micro-batch
size, recompute mode, replica count R dividing every class's ranks and stage count p ≤ m of the
search space whose stages' ranks split a micro-batch), the best one timed.
"""

from __future__ import annotations

import dataclasses
import math

from hetopt.baselines.common import Candidates, PlannerResult
from hetopt.baselines.uniform import with_layers
from hetopt.cost.profiles import Profiles
from hetopt.plan import Plan, row_labels
from hetopt.search.shards import Layouts, shard_skeleton, shard_zero
from hetopt.search.types import SearchOptions
from hetopt.spec.instance import Instance

FIX_STEPS = 8
"""Layer moves tried on a plan that does not fit before it is given up."""


def metis_like(
    inst: Instance, time_limit_s: float = 60.0, profiles: Profiles | None = None, seed: int = 0
) -> PlannerResult:
    """The fastest Metis-shaped plan (module docstring) within `time_limit_s`; a heuristic (no
    proof)."""
    profiles = profiles or Profiles()
    cands = Candidates(inst, profiles, time_limit_s)
    layouts = Layouts(inst, metis_options(SearchOptions.from_instance(inst)), profiles)
    zero = shard_zero(layouts.opts)
    for b, tp, rc, r, _, stages in layouts.layouts():
        if cands.out_of_time:
            break
        offer_fitting(cands, metis_plan(inst, layouts, stages, tp, rc, b, r, zero))
    return cands.result("metis-like")


def metis_options(opts: SearchOptions) -> SearchOptions:
    """The search options whose layouts metis-like plans: the instance's with stages with shards on,
    and ZeRO-1, CP 1 and 1F1B where they leave no room for them (its plans are then outside the
    space, and `outside_space` says why)."""
    opts = dataclasses.replace(opts, shards=True)
    if shard_zero(opts) is None:
        opts = dataclasses.replace(opts, zero=(1,), cp=(1,), virtual_stages=(1,))
    return opts


def metis_plan(
    inst: Instance, layouts: Layouts, stages, tp: int, rc: str, b: int, replicas: int, zero: int
) -> Plan:
    """The plan of a layout's stages (`Layouts.layouts`) with the layers in proportion to each
    stage's speed: its slowest ranks at their share of the micro-batch (a rank's time taken as
    proportional to its sequences, as Metis scales its per-sample profiles)."""
    per_layer = layouts.per_layer(tp, b, rc)
    stage_s = [max(per_layer[(g, i)] * q / b for g, i, _, q in shards) for shards in stages]
    sk = shard_skeleton(stages, tp, rc, b, replicas, inst.micro_batches(b, replicas), zero)
    return sk.plan(proportional_layers(inst.model.layers, [1 / t for t in stage_s]))


def proportional_layers(layers: int, speed: list[float]) -> list[int]:
    """Layers in proportion to `speed`, at least one each, summing to `layers` (largest
    remainders)."""
    exact = [max(1.0, layers * v / sum(speed)) for v in speed]
    out = [int(x) for x in exact]
    for i in sorted(range(len(out)), key=lambda i: out[i] - exact[i]):
        if sum(out) >= layers:
            break
        out[i] += 1
    while sum(out) > layers:
        i = max((i for i in range(len(out)) if out[i] > 1), key=lambda i: out[i] / speed[i])
        out[i] -= 1
    return out


def offer_fitting(cands: Candidates, plan: Plan) -> None:
    """Offer the plan; where a stage does not fit, move a layer from the stage most over its memory
    to the one with the most room, up to FIX_STEPS times (Metis balances layers within memory)."""
    for _ in range(FIX_STEPS):
        if cands.out_of_time or cands.offer(plan) < math.inf or cands.last is None:
            return  # it fits, or the verifier refused it or it cannot be placed: not a candidate
        ev = cands.last
        use: dict[int, float] = {}  # each stage's most used memory fraction over its rows
        for (_, i, _), peak, limit in zip(
            row_labels(plan), ev.peak_memory_gib, ev.memory_limit_gib, strict=True
        ):
            use[i] = max(use.get(i, 0.0), peak / limit)
        over, room = max(use, key=use.get), min(use, key=use.get)
        layers = [st.layers for st in plan.pipelines[0].stages]
        if use[over] <= 1 or over == room or layers[over] <= 1:
            return
        layers[over] -= 1
        layers[room] += 1
        plan = with_layers(plan, layers)

"""`metis-like`: Metis's plan shapes (Um et al., ATC 2024) by its rules of proportion, no search over splits.

One pipeline template of R identical replicas whose stages are served by groups of data-parallel ranks
that may mix GPU types (`Stage.shards`):
- ranks: tp GPUs of one device class inside one node; a replica takes 1/R of every class's ranks;
- device groups: a replica's ranks, fastest class first, cut into p consecutive groups of about equal
  speed, so a stage mixes the classes at its cut points (Metis's heterogeneous device groups);
- data load balancing: each micro-batch of b sequences is split among a stage's ranks in proportion to
  their speed (whole sequences, at least one each);
- layer load balancing: layers in proportion to each stage's speed, then moved one at a time off stages
  that do not fit in memory.
Speeds come from the cost model (`Bounds.stage_line`: seconds per layer of a rank at the micro-batch size).
Every TP degree, micro-batch size, recompute mode and stage count of the search space (a stage's ranks
split a micro-batch, so a stage of n ranks needs n sequences or more), R dividing every class's ranks; the
best one timed.
"""

from __future__ import annotations

import math
from collections import Counter

from hetopt.baselines.common import Candidates, PlannerResult
from hetopt.baselines.uniform import with_layers
from hetopt.cost.profiles import Profiles
from hetopt.plan import Pipeline, Plan, Shard, Stage, row_labels
from hetopt.search.bounds import Bounds
from hetopt.search.space import SearchOptions, tp_options
from hetopt.spec.instance import Instance

FIX_STEPS = 8
"""Layer moves tried on a plan that does not fit before it is given up."""


def metis_like(inst: Instance, time_limit_s: float = 60.0, profiles: Profiles | None = None, seed: int = 0
               ) -> PlannerResult:
    """The fastest Metis-shaped plan (module docstring) within `time_limit_s`; a heuristic (no proof)."""
    profiles = profiles or Profiles()
    options = SearchOptions.from_instance(inst)
    cands = Candidates(inst, profiles, time_limit_s)
    bounds = Bounds(inst, profiles)
    classes = list(inst.cluster.device_classes.values())
    sizes = [b for b in options.micro_batch if inst.global_batch % b == 0]
    for tp in options.tp:
        usable = [dc for dc in classes if tp in tp_options(inst, dc, options)]
        ranks = {dc.key: sum(n.gpus // tp for n in dc.nodes) for dc in usable}
        usable = [dc for dc in usable if ranks[dc.key]]
        if not usable:
            continue
        for rc in options.recompute:
            for b in sizes:
                # fastest class first: seconds per layer of one rank running the whole micro-batch
                per_layer = {dc.key: bounds.stage_line(dc.gpu, tp, b, rc, False, False)[0] for dc in usable}
                order = sorted(usable, key=lambda dc: per_layer[dc.key])
                for r in replica_counts(ranks, inst.global_batch // b):
                    line = [dc.key for dc in order for _ in range(ranks[dc.key] // r)]
                    for p in range(1, min(options.max_stages, inst.model.layers, len(line)) + 1):
                        if cands.out_of_time:
                            return cands.result("metis-like")
                        plan = metis_plan(inst, line, per_layer, tp, rc, b, r, p)
                        if plan is not None:
                            offer_fitting(cands, plan)
    return cands.result("metis-like")


def replica_counts(ranks: dict, micro_batch_total: int) -> list[int]:
    """Replica counts R dividing every class's ranks and the micro-batches of an iteration."""
    top = min(ranks.values())
    return [r for r in range(1, top + 1)
            if all(n % r == 0 for n in ranks.values()) and micro_batch_total % r == 0]


def device_groups(line: list, speed: dict, p: int) -> list[list]:
    """The ranks of `line` (fastest first) cut into p consecutive non-empty groups of about equal speed:
    group k ends at the cut nearest (k + 1)/p of the total speed (a rank joins while half of its speed
    still fits under that target), leaving a rank for each group after it."""
    total = sum(speed[c] for c in line)
    groups, at, run = [], 0, 0.0
    for k in range(p):
        end = at + 1
        run += speed[line[at]]
        target = total * (k + 1) / p
        while end < len(line) - (p - k - 1) and run + speed[line[end]] / 2 <= target:
            run += speed[line[end]]
            end += 1
        if k == p - 1:
            end = len(line)
        groups.append(line[at:end])
        at = end
    return groups


def split_sequences(counts: dict, speed: dict, b: int) -> dict | None:
    """Sequences per rank of each class of a stage (class → ranks), Σ ranks·q = b, q ≥ 1, in proportion
    to speed: start at one each and give the next ranks' worth to the class whose ranks would then finish
    first; None when b cannot be split so (fewer sequences than ranks, or a remainder no class takes)."""
    q = dict.fromkeys(counts, 1)
    left = b - sum(counts.values())
    if left < 0:
        return None
    while left:
        takers = [c for c in counts if counts[c] <= left]
        if not takers:
            return None
        c = min(takers, key=lambda c: (q[c] + 1) / speed[c])
        q[c] += 1
        left -= counts[c]
    return q


def metis_plan(inst: Instance, line: list, per_layer: dict, tp: int, rc: str, b: int, replicas: int, p: int
               ) -> Plan | None:
    """The plan of one replica's ranks `line` in p stages (module docstring), or None where a stage's
    ranks cannot split the micro-batch."""
    speed = {c: 1.0 / a for c, a in per_layer.items()}
    stages, stage_s = [], []
    for group in device_groups(line, speed, p):
        counts = Counter(group)  # ranks per class, fastest class first
        q = split_sequences(counts, speed, b)
        if q is None:
            return None
        # seconds per layer of the stage: its slowest ranks at their share of the micro-batch (a rank's time
        # taken as proportional to its sequences, as Metis scales its per-sample profiles)
        stage_s.append(max(per_layer[c] * q[c] / b for c in counts))
        shards = [Shard(gpu=c[0], island=c[1], ranks=n, sequences=q[c]) for c, n in counts.items()]
        lead = shards[0]
        stages.append(Stage(layers=0, gpu=lead.gpu, island=lead.island, tp=tp, recompute=rc,
                            shards=shards if len(group) > 1 else []))
    micro_batches = inst.global_batch // (b * replicas)
    plan = Plan(micro_batch=b, pipelines=[Pipeline(replicas=replicas, micro_batches=micro_batches, stages=stages)])
    return with_layers(plan, proportional_layers(inst.model.layers, [1 / t for t in stage_s]))


def proportional_layers(layers: int, speed: list[float]) -> list[int]:
    """Layers in proportion to `speed`, at least one each, summing to `layers` (largest remainders)."""
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
    """Offer the plan; where a stage does not fit, move a layer from the stage most over its memory to the
    one with the most room, up to FIX_STEPS times (Metis balances layers within memory)."""
    for _ in range(FIX_STEPS):
        if cands.out_of_time or cands.offer(plan) < math.inf or cands.last is None:
            return  # it fits, or the verifier refused it or it cannot be placed: not a candidate
        ev = cands.last
        use: dict[int, float] = {}  # each stage's most used memory fraction over its rows
        for (_, i, _), peak, limit in zip(row_labels(plan), ev.peak_memory_gib, ev.memory_limit_gib, strict=True):
            use[i] = max(use.get(i, 0.0), peak / limit)
        over, room = max(use, key=use.get), min(use, key=use.get)
        layers = [st.layers for st in plan.pipelines[0].stages]
        if use[over] <= 1 or over == room or layers[over] <= 1:
            return
        layers[over] -= 1
        layers[room] += 1
        plan = with_layers(plan, layers)

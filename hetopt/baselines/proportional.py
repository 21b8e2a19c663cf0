"""`proportional`: Metis-style rules of proportion (Um et al., ATC 2024, in spirit): no search over
splits.

Two shapes, every TP degree, micro-batch size and recompute mode of the search space, the best one
timed:
- one template across every device class (the search.max_classes fastest types where there are
  more),
  fastest type first, each replica taking ⌊G_k / (t·R)⌋ stages of class k (all GPUs busy), layers in
  proportion to each stage's speed (within what its memory holds);
- one template per device class (its replicas use all its GPUs, as few stages as memory allows; the
  search.max_templates of most throughput where there are more), micro-batch shares in proportion to
  each template's throughput, layers even within a template.
Its plans are points of the search space (`Candidates` times no other).
"""

from __future__ import annotations

from hetopt.baselines.common import Candidates, PlannerResult, even_pipeline
from hetopt.cost.profiles import Profiles
from hetopt.errors import InfeasibleError
from hetopt.plan import Plan
from hetopt.search.bounds.run import Bounds
from hetopt.search.leaves import speed_split
from hetopt.search.linear import split_problem
from hetopt.search.space import tp_options
from hetopt.search.types import SearchOptions, Segment, Skeleton, Template
from hetopt.spec.instance import Instance


def proportional(
    inst: Instance, time_limit_s: float = 60.0, profiles: Profiles | None = None, seed: int = 0
) -> PlannerResult:
    profiles = profiles or Profiles()
    options = SearchOptions.from_instance(inst)
    cands = Candidates(inst, profiles, time_limit_s)
    classes = sorted(
        inst.cluster.device_classes.values(), key=lambda dc: -inst.gpu_types[dc.gpu].peak_tflops
    )
    # one template spans at most max_classes classes: the fastest
    spanned = classes[: options.max_classes]
    total_mb_of = {
        b: inst.micro_batches(b) for b in options.micro_batch if inst.micro_batches(b) is not None
    }
    for b, total_mb in total_mb_of.items():
        for rc in options.recompute:
            for tp in options.tp:
                if cands.out_of_time:
                    return cands.result("proportional")
                if any(tp not in tp_options(inst, dc, options) for dc in classes):
                    continue
                for plan in one_template(inst, profiles, options, spanned, b, rc, tp, total_mb):
                    cands.offer(plan)
                plan = per_class_templates(inst, profiles, options, classes, b, rc, tp, total_mb)
                if plan is not None:
                    cands.offer(plan)
    return cands.result("proportional")


def one_template(inst, profiles, options, classes, b, rc, tp, total_mb):
    top = min(dc.gpus // tp for dc in classes)
    for r in range(1, top + 1):
        if total_mb % r:
            continue
        stages = [dc.gpus // (tp * r) for dc in classes]
        depth = sum(stages)
        if depth > min(options.max_stages, inst.model.layers) or total_mb // r < depth:
            continue
        segments = tuple(
            Segment(dc.gpu, dc.island, tp, n) for dc, n in zip(classes, stages, strict=True)
        )
        sk = Skeleton(b, rc, (Template(segments, r, total_mb // r),))
        try:
            problem = split_problem(inst, sk, profiles)
        except InfeasibleError:  # an unplaceable shape is simply not a candidate
            continue
        yield sk.plan(speed_split(problem.templates[0]))


def per_class_templates(inst, profiles, options, classes, b, rc, tp, total_mb) -> Plan | None:
    layers = inst.model.layers
    bounds = Bounds(inst, profiles)
    shapes = []
    # the fewest stages that hold the model (ZeRO counted over this class's replicas only)
    for dc in classes:
        depth = next(
            (
                n
                for n in range(1, min(options.max_stages, layers) + 1)
                if dc.gpus // (tp * n) >= 1
                and bounds.memory.max_layers_total(
                    b, rc, (Segment(dc.gpu, dc.island, tp, n),), dc.gpus // (tp * n)
                )
                >= layers
            ),
            None,
        )
        if depth is None:
            continue
        r = dc.gpus // (tp * depth)
        a, c = bounds.templates.stage_line(dc.gpu, tp, b, rc, False, False)
        # replicas × micro-batches per second
        shapes.append((dc, depth, r, r / (a * layers / depth + c)))
    if not shapes:
        return None
    # the space's most templates
    shapes = sorted(shapes, key=lambda s: -s[3])[: options.max_templates]
    rate = sum(s[3] for s in shapes)
    shares = [max(s[1], int(total_mb * s[3] / rate / s[2])) for s in shapes]
    # fix the rounding so that Σ R_j·m_j = M, on the fastest template, if it can absorb it
    rest = total_mb - sum(s[2] * m for s, m in zip(shapes, shares, strict=True))
    fastest = max(range(len(shapes)), key=lambda j: shapes[j][3] / shapes[j][2])
    if (
        rest % shapes[fastest][2]
        or shares[fastest] + rest // shapes[fastest][2] < shapes[fastest][1]
    ):
        return None
    shares[fastest] += rest // shapes[fastest][2]
    pipelines = [
        even_pipeline(inst, Segment(dc.gpu, dc.island, tp, depth), r, m, rc)
        for (dc, depth, r, _), m in zip(shapes, shares, strict=True)
    ]
    return Plan(micro_batch=b, schedule="1f1b", virtual_stages=1, zero=1, pipelines=pipelines)

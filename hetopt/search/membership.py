"""Whether a plan is a point of the families, shards or triples: the rules those enumerators keep,
checked on a plan (hetopt.search.roots.outside_space adds the uniform layouts).

A plan outside the space cannot be called optimal, whatever its time: "optimal" promises that no
point of the searched space is faster (hetopt.search.orchestrate reads this for a kept warm start).
"""

from __future__ import annotations

from collections import Counter

from hetopt.cost.profiles import Profiles
from hetopt.plan import Pipeline, Plan
from hetopt.search.shards import shard_point
from hetopt.search.space import cp_options, zero_stages
from hetopt.search.types import SearchOptions, segments_of
from hetopt.spec.instance import Instance


def outside_families(
    inst: Instance, plan: Plan, opts: SearchOptions, profiles: Profiles | None
) -> list[str]:
    """Why `plan` is not a point of the families, the skeletons with shards or the triples (every
    rule it breaks; [] when it is one): `hetopt.search.roots.outside_space` but for the uniform
    layouts."""
    why = _schedule_rules(plan, opts) + _stage_rules(inst, plan, opts)
    if len(plan.pipelines) > opts.max_templates:
        why.append(f"{len(plan.pipelines)} templates (the space: at most {opts.max_templates})")
    if any(st.shards for pipe in plan.pipelines for st in pipe.stages):
        # a plan with shards is a point of the shard skeletons (hetopt.search.shards) or of nothing
        if (why_not := shard_point(inst, plan, opts, profiles)) is not None:
            return [
                "stages with shards (several data-parallel ranks in a stage of one replica, "
                f"Metis-style): {why_not}"
            ]
        return []
    for j, pipe in enumerate(plan.pipelines):
        why += _template_rules(j, pipe, len(plan.pipelines), opts)
    return why + _triple_rules(plan)


def _schedule_rules(plan: Plan, opts: SearchOptions) -> list[str]:
    """1F1B, or interleaved 1F1B of search.virtual_stages with one template; a ZeRO stage of
    search.zero, 2 and 3 with one template only."""
    why = []
    interleaved = (
        plan.schedule == "interleaved"
        and plan.virtual_stages in opts.virtual_stages
        and len(plan.pipelines) == 1
        and plan.pipelines[0].micro_batches % len(plan.pipelines[0].stages) == 0
    )
    if not (plan.schedule == "1f1b" and plan.virtual_stages == 1) and not interleaved:
        allowed = ", ".join(f"interleaved with {v}" for v in opts.virtual_stages if v > 1)
        also = f", {allowed} (one template, micro-batches a multiple of the stages)"
        why.append(
            f"schedule {plan.schedule} with {plan.virtual_stages} virtual stages (the space: 1f1b"
            f"{also if allowed else ''})"
        )
    zero = zero_stages(opts)
    if plan.zero not in zero:
        why.append(f"ZeRO stage {plan.zero} (the space: {', '.join(map(str, zero))})")
    elif plan.zero >= 2 and len(plan.pipelines) > 1:
        why.append(
            f"ZeRO stage {plan.zero} with {len(plan.pipelines)} templates (the space: ZeRO-2/3 "
            "for one template)"
        )
    return why


def _stage_rules(inst: Instance, plan: Plan, opts: SearchOptions) -> list[str]:
    """Every stage: a micro-batch size and recompute mode of the options, sequence parallel, TP of
    the options inside a node, one CP degree of search.cp (none beside ZeRO-2/3), and with
    search.uniform_tp one TP degree per template."""
    why = []
    stages = [st for pipe in plan.pipelines for st in pipe.stages]
    if plan.micro_batch not in opts.micro_batch:
        why.append(f"micro-batch {plan.micro_batch} not in {list(opts.micro_batch)}")
    modes = {st.recompute for st in stages}
    if not modes <= set(opts.recompute) or (len(modes) > 1 and not opts.recompute_per_stage):
        each = "each stage's" if opts.recompute_per_stage else "one for every stage"
        why.append(f"recompute {sorted(modes)} (the space: {each} of {list(opts.recompute)})")
    if any(not st.sp for st in stages):
        why.append("a stage without sequence parallelism")
    node_gpus = {key: dc.max_gpus_per_node for key, dc in inst.cluster.device_classes.items()}
    if any(
        st.tp not in opts.tp or st.width > node_gpus.get((st.gpu, st.island), 0) for st in stages
    ):
        why.append(
            f"TP {sorted({st.tp for st in stages})} not within {list(opts.tp)} inside a node"
        )
    cps, allowed = {st.cp for st in stages}, cp_options(inst, opts)
    if len(cps) > 1 or not cps <= set(allowed):
        why.append(
            f"context parallelism {sorted(cps)} (the space: one degree for every stage, of "
            f"{list(allowed)})"
        )
    elif max(cps) > 1 and plan.zero >= 2:
        why.append(
            f"context parallelism {max(cps)} with ZeRO-{plan.zero} (the space: ZeRO-0/1 with CP)"
        )
    if opts.uniform_tp and any(len({st.tp for st in pipe.stages}) > 1 for pipe in plan.pipelines):
        why.append(
            "a template with stages at different TP degrees (the space: search.uniform_tp, one "
            "per template)"
        )
    return why


def _template_rules(j: int, pipe: Pipeline, templates: int, opts: SearchOptions) -> list[str]:
    """Template j of `templates`: at most max_stages stages and max_classes classes, each class one
    run (with search.tp_per_stage, one template: one class may be two consecutive runs); beside
    other templates at most pair_classes classes, and beside two others one run."""
    why = []
    runs = segments_of(pipe)
    classes = [(seg.gpu, seg.island) for seg in runs]
    if len(pipe.stages) > opts.max_stages:
        why.append(
            f"template {j}: {len(pipe.stages)} stages (the space: at most {opts.max_stages})"
        )
    counts = Counter(classes)
    twice = [c for c, n in counts.items() if n > 1]
    # search.tp_per_stage: one class in two consecutive runs (they differ in TP), one template
    split_ok = (
        opts.tp_per_stage
        and templates == 1
        and len(twice) == 1
        and counts[twice[0]] == 2
        and classes[classes.index(twice[0]) + 1] == twice[0]
    )
    if twice and not split_ok:
        hint = "" if opts.tp_per_stage else " (search.tp_per_stage allows two consecutive runs)"
        why.append(f"template {j}: a device class in more than one run or at two TP degrees{hint}")
    if len(counts) > opts.max_classes:
        why.append(
            f"template {j}: {len(counts)} device classes (the space: at most {opts.max_classes})"
        )
    if templates > 1 and len(counts) > opts.pair_classes:
        most = (
            "single-class templates"
            if opts.pair_classes == 1
            else f"templates of at most {opts.pair_classes} classes (search.pair_classes)"
        )
        why.append(
            f"template {j}: {len(counts)} device classes beside another template (the "
            f"space: {most} side by side)"
        )
    if templates == 3 and len(runs) > 1:
        why.append(
            f"template {j}: {len(runs)} runs of device class and TP beside two other "
            "templates (the space: three templates of one class at one TP degree each)"
        )
    return why


def _triple_rules(plan: Plan) -> list[str]:
    """Three templates: CP 1 and one recompute mode for the plan (hetopt.search.triples)."""
    stages = [st for pipe in plan.pipelines for st in pipe.stages]
    if len(plan.pipelines) == 3 and (
        max(st.cp for st in stages) > 1 or len({st.recompute for st in stages}) > 1
    ):
        return [
            "three templates with context parallelism or a recompute mode per stage (the space: "
            "CP 1 and one recompute mode for the plan, hetopt.search.triples)"
        ]
    return []

"""Uniform layouts in the plan space: Megatron-LM's (tp, pp, dp) over every GPU of a set of device
classes (`layout_subsets`; the rest idle), with one layer split.

A uniform layout (hetopt.layout) lays ranks out as Megatron-LM does — tensor-parallel fastest, then
data-parallel, then pipeline — over the cluster's GPUs in the order the node groups are declared. On
a mixed cluster a stage level then crosses device classes, and the replicas whose stages land on the
same classes form one template: Megatron's plan on `scale-4096-four-types` at pp = 2 is (H200 →
A100-80GB) ‖ (H100 → A100-40GB), two templates each over two classes, which the families
(hetopt.search.space) hold only with search.pair_classes 2 — and a layout over three groups of GPUs
can form three such templates. Every replica of a layout runs the same stage split, the same TP and
the same micro-batch count: the skeleton of a layout is its templates in *lockstep*
(`Skeleton.lockstep`), one layer split for all of them, chosen by the integer program like any
other. Megatron-LM's even split and AMP's min-max split (hetopt.baselines.uniform) are two of its
points.

With search.uniform_layouts (default true) and search.max_templates 2 or more (a layout's templates
count as one choice, however many they are) the space holds every such skeleton whose plans the rest
of the default space does not already hold (a layout whose replicas all run one class sequence is a
one-template family's point; one of single-class templates is a pair's), each as a root leaf of the
search tree, keyed by `SkeletonBounds.lockstep_bound`. search.pair_classes does not limit them
(their templates run one split, not a pair's two), search.max_classes does (classes per template).
They are few: one per (tp, pp, micro-batch, recompute) that fits the cluster — selective recompute
beside none under flash attention left out, as for the families (`enumerate_recompute`) — in three
placement orders: Megatron's rank order itself, where the templates share nodes stage by stage
(hetopt.placement.megatron_placed), and hetopt's replica- and stage-major ones.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Iterator
from dataclasses import replace

from hetopt.errors import InputError
from hetopt.layout import Layout, expand_layout
from hetopt.plan import Plan
from hetopt.search.membership import outside_families
from hetopt.search.space import cp_options, enumerate_recompute, tp_divides_heads, zero_stages
from hetopt.search.types import SearchOptions, SearchStats, Skeleton, Template, orders, segments_of
from hetopt.spec.cluster import Cluster, Node
from hetopt.spec.instance import Instance


def uniform_layouts(
    inst: Instance, gpus: int, options: SearchOptions, max_gpus_per_node: int
) -> Iterator[Layout]:
    """Every homogeneous layout over `gpus` GPUs (tp·pp·dp = gpus) in the instance's search space,
    with the choices that never lose in the cost model fixed (SP on, ZeRO-1, 1F1B, no
    interleaving)."""
    m = inst.model
    for tp in options.tp:
        if not tp_divides_heads(inst, tp) or tp > max_gpus_per_node:
            continue
        for pp in range(1, min(m.layers, options.max_stages) + 1):
            if gpus % (tp * pp):
                continue
            dp = gpus // (tp * pp)
            for mb in options.micro_batch:
                if (inst.micro_batches(mb, dp) or 0) < pp:  # whole micro-batches, one per stage
                    continue
                for rc in options.recompute:
                    yield Layout(tp=tp, pp=pp, dp=dp, mb=mb, recompute=rc)


def max_tp(inst: Instance, nodes: list[Node] | None = None) -> int:
    """The largest TP group that fits in every node of `nodes` (default all: a uniform layout puts
    TP groups on all of them)."""
    return min(n.gpus for n in (inst.cluster.nodes.values() if nodes is None else nodes))


def layout_plan(inst: Instance, layout: Layout, nodes: list[Node] | None = None) -> Plan | None:
    """The plan of a layout on this cluster (over `nodes`, default all), or None where it cannot be
    laid out (a TP group across nodes)."""
    try:
        return expand_layout(inst, layout, nodes=nodes)
    except InputError:
        return None


ClassSet = tuple[tuple[str, str], ...]
"""Device classes (GPU type, island), in the order the cluster declares them."""


def layout_subsets(inst: Instance) -> list[ClassSet]:
    """The sets of device classes a uniform layout of the space is laid over, every GPU of the set
    used and the rest idle: every class of the cluster; each island; each GPU type; the fastest
    classes (by peak, then by GPUs), one more at a time; and on each island a chain of islands,
    adding at each step the island of the widest link to those taken. These are the plans a user
    writes first — pure data parallelism on one island, one GPU type or the fastest GPUs, or over
    the nearest islands — and data parallelism over any number of islands (a template per
    island)."""
    cluster = inst.cluster
    allowed = inst.spec.search.gpus  # the types search.gpus leaves out stay idle
    keys = [k for k in cluster.device_classes if allowed is None or k[0] in allowed]

    def speed(key: tuple[str, str]) -> tuple[float, int]:
        return (inst.gpu_types[key[0]].peak_tflops, cluster.device_classes[key].gpus)

    fastest = sorted(keys, key=speed, reverse=True)
    sets = [set(keys)]
    sets += [{k for k in keys if k[1] == island} for island in cluster.islands]
    sets += [{k for k in keys if k[0] == gpu} for gpu in {k[0] for k in keys}]
    sets += [set(fastest[:n]) for n in range(1, len(fastest))]
    for island in cluster.islands:
        taken = [island]
        while len(taken) < len(cluster.islands):
            rest = [i for i in cluster.islands if i not in taken]
            taken.append(max(rest, key=lambda i: max(_island_gbps(cluster, i, t) for t in taken)))
            sets.append({k for k in keys if k[1] in taken})
    unique = {tuple(k for k in keys if k in chosen) for chosen in sets if chosen}
    return sorted(unique, key=lambda c: (-len(c), [keys.index(k) for k in c]))


def _island_gbps(cluster: Cluster, a: str, b: str) -> float:
    """The bandwidth of the widest path between two islands: its narrowest link (inf within one
    island, or through the ideal fabric where no link joins them)."""
    path = cluster.island_path(a, b)
    return min(
        (cluster.graph.edges[u, v]["gbps"] for u, v in itertools.pairwise(path)), default=math.inf
    )


def class_nodes(inst: Instance, classes: ClassSet) -> list[Node]:
    """The nodes of `classes`, as the cluster declares them (a layout's rank order)."""
    chosen = set(classes)
    return [n for n in inst.cluster.nodes.values() if (n.gpu, n.island) in chosen]


def _searched(inst: Instance, opts: SearchOptions) -> bool:
    """Whether the options hold uniform layouts: several templates allowed (a layout's templates in
    lockstep count as one choice, however many they are), ZeRO-1 and CP 1 among the choices."""
    return (
        opts.uniform_layouts
        and opts.max_templates >= 2
        and 1 in zero_stages(opts)
        and 1 in cp_options(inst, opts)
    )


def _narrow(opts: SearchOptions) -> SearchOptions:
    """The families' default space, against which a layout is new: pair_classes 1, one TP per class
    (the same for the whole space and for its narrowed part, orchestrate._narrow_first, so that the
    two parts of a split search hold every lockstep skeleton once)."""
    return replace(
        opts, uniform_layouts=False, pair_classes=1, tp_per_stage=False, beyond_narrow=False
    )


def lockstep_skeletons(
    inst: Instance, opts: SearchOptions, stats: SearchStats
) -> Iterator[Skeleton]:
    """The skeleton of every uniform layout over the GPUs of each set of `layout_subsets` whose
    plans the families of the default space do not hold, in each placement order worth trying;
    counted in `stats.enumerated`."""
    if not _searched(inst, opts):
        return
    narrow, modes = _narrow(opts), enumerate_recompute(inst, opts)
    seen: set[tuple] = set()
    for classes in layout_subsets(inst):
        nodes = class_nodes(inst, classes)
        gpus = sum(n.gpus for n in nodes)
        for layout in uniform_layouts(inst, gpus, opts, max_tp(inst, nodes)):
            plan = layout_plan(inst, layout, nodes) if layout.recompute in modes else None
            if (
                plan is None
                or not _within_classes(plan, opts)
                or not outside_families(inst, plan, narrow, None)
            ):
                continue  # a point of the families already
            templates = tuple(
                Template(segments_of(p), p.replicas, p.micro_batches) for p in plan.pipelines
            )
            if (layout.mb, layout.recompute, templates) in seen:
                continue  # two sets of classes whose layouts form the same templates
            seen.add((layout.mb, layout.recompute, templates))
            # Megatron's own rank order (its templates share nodes stage by stage) and hetopt's two
            for order in ("megatron", *orders(sum(t.replicas for t in templates))):
                stats.enumerated += 1
                yield Skeleton(layout.mb, layout.recompute, templates, order=order, lockstep=True)


def lockstep_layout(inst: Instance, plan: Plan, opts: SearchOptions) -> Layout | None:
    """The uniform layout of the space whose plan `plan` is but for its layer split — the same split
    in every template — or None: `plan` is then no point of a lockstep skeleton."""
    if (
        not _searched(inst, opts)
        or plan.schedule != "1f1b"
        or plan.virtual_stages != 1
        or plan.zero != 1
    ):
        return None
    pipes = plan.pipelines
    stages = [st for p in pipes for st in p.stages]
    if (
        any(st.shards or st.cp != 1 or not st.sp for st in stages)
        or len({st.tp for st in stages}) != 1
        or len({st.recompute for st in stages}) != 1
    ):
        return None
    split = [st.layers for st in pipes[0].stages]
    if any(
        [st.layers for st in p.stages] != split or p.micro_batches != pipes[0].micro_batches
        for p in pipes
    ):
        return None
    layout = Layout(
        tp=stages[0].tp,
        pp=len(split),
        dp=sum(p.replicas for p in pipes),
        mb=plan.micro_batch,
        recompute=stages[0].recompute,
    )
    used = {(st.gpu, st.island) for st in stages}
    classes = next((c for c in layout_subsets(inst) if set(c) == used), None)
    if classes is None:
        return None
    nodes = class_nodes(inst, classes)
    gpus = sum(n.gpus for n in nodes)
    if layout not in set(uniform_layouts(inst, gpus, opts, max_tp(inst, nodes))):
        return None
    expected = layout_plan(inst, layout, nodes)
    if (
        expected is None
        or _templates(expected) != _templates(plan)
        or not _within_classes(plan, opts)
    ):
        return None
    return layout


def _within_classes(plan: Plan, opts: SearchOptions) -> bool:
    """Whether every template spans at most search.max_classes device classes."""
    return all(
        len({(st.gpu, st.island) for st in p.stages}) <= opts.max_classes for p in plan.pipelines
    )


def _templates(plan: Plan) -> Counter:
    return Counter((segments_of(p), p.replicas, p.micro_batches) for p in plan.pipelines)

"""The plan space the exact planner searches, as skeletons (DESIGN 4).

A skeleton fixes the small outer choices: micro-batch size b, one recompute mode, and one or two
pipeline templates. One template: its stages as segments (a device class, its TP degree and how many
consecutive stages it serves, classes in a chosen order) and its replica count R (R divides the M =
global_batch / b micro-batches, each replica takes m = M / R ≥ p of them). Two templates: each on
one device class (or on up to search.pair_classes classes in order), with its own depth, TP, replica
count R_j and micro-batch share m_j ≥ p_j, R_a·m_a + R_b·m_b = M — a fast template takes more
micro-batches. The two may use the same class, sharing its GPUs: uneven shares among its replicas
(where M has no divisor that uses them all), or two depths or TP degrees on one class. One template
may also run the interleaved 1F1B schedule with v model chunks per stage (search.virtual_stages):
every stage then holds a multiple of v layers. One template with several replicas may shard its
gradients (ZeRO-2) or also its 16-bit weights (ZeRO-3, FSDP) over them (search.zero): less memory
for collectives in every micro-batch. With search.recompute_per_stage each stage picks its own
recompute mode among those allowed (`Skeleton.modes`): the stages that hold the most in-flight
activations (the first, in 1F1B) recompute while the others do not. Megatron-LM's uniform layouts
over every GPU are skeletons too (hetopt.search.uniform): their replicas' templates, however many,
run one layer split (`Skeleton.lockstep`). The per-skeleton integer program then chooses the layers
(and so mixed, the recompute mode) of every stage of every template.

Choices fixed by dominance in hetopt's cost model (they never make a plan slower or bigger):
sequence parallelism on (less activation memory and memory traffic, the same collective bytes),
ZeRO-1 on (less optimizer memory and a shorter optimizer step, the same gradient traffic), the 1F1B
schedule (GPipe has the same time and more memory); interleaving and ZeRO-2/3 are choices (a smaller
bubble for more sends and activation memory; less memory for more traffic), and with one replica
ZeRO-2/3 shard nothing and only add buffers. Not searched: TP groups over several nodes or stages of
0 layers, which plans given by hand may have.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator
from dataclasses import dataclass

from hetopt.placement import ORDERS
from hetopt.search.symmetry import canonical, island_blocks
from hetopt.search.types import (
    DEFAULT_RECOMPUTE,
    SearchOptions,
    SearchStats,
    Segment,
    Skeleton,
    Template,
    least_work,
    orders,
)
from hetopt.spec.checks import cp_splits_sequence, tp_splits_heads
from hetopt.spec.cluster import DeviceClass
from hetopt.spec.instance import Instance
from hetopt.spec.kernels import is_flash


def tp_divides_heads(inst: Instance, tp: int) -> bool:
    """Whether TP degree `tp` splits the instance model's heads (`spec.checks.tp_splits_heads`)."""
    return tp_splits_heads(inst.model.heads, inst.model.kv_heads, tp)


def tp_options(inst: Instance, dc: DeviceClass, opts: SearchOptions, cp: int = 1) -> list[int]:
    """TP degrees of a class's stages at context-parallel degree `cp`: dividing the heads, tp·cp
    GPUs inside a node, and (cp > 1) the sequence in 2·cp·tp equal chunks (`verify._check_cp`);
    none for a class whose GPU type search.gpus leaves out (no stage is placed on it)."""
    if opts.gpus is not None and dc.gpu not in opts.gpus:
        return []
    return [
        t
        for t in opts.tp
        if tp_divides_heads(inst, t)
        and t * cp <= dc.max_gpus_per_node
        and cp_splits_sequence(inst.seq_len, t, cp)
    ]


@dataclass(frozen=True)
class SkeletonGroup:
    """Skeletons that differ only in replica count and recompute mode (the search bounds them
    together)."""

    micro_batch: int
    segments: tuple[Segment, ...]
    replica_options: tuple[int, ...]
    recompute_options: tuple[str, ...]
    total_micro_batches: int
    virtual_options: tuple[int, ...] = (1,)
    """Virtual stages per stage that fit: each divides the layers with one chunk per stage at least,
    and (v > 1) the micro-batches per replica are a multiple of the stages."""
    zero_options: tuple[int, ...] = (1,)
    """ZeRO stages (`Family.zero_at`)."""
    stage_modes: tuple[str, ...] = ()
    """Per-stage recompute: the modes each stage picks from (`Skeleton.modes`); recompute_options is
    then their least-work mode alone."""
    placements: tuple[str, ...] = ORDERS
    """Placement orders to try (search.placement)."""

    @property
    def size(self) -> int:
        return (
            sum(len(orders(r, self.placements)) for r in self.replica_options)
            * len(self.recompute_options)
            * len(self.virtual_options)
            * len(self.zero_options)
        )

    def skeletons(self) -> Iterator[Skeleton]:
        for r in self.replica_options:
            for rc in self.recompute_options:
                for v in self.virtual_options:
                    for z in self.zero_options:
                        for order in orders(r, self.placements):
                            yield self.skeleton(r, rc, order, v, z)

    def skeleton(
        self,
        replicas: int,
        recompute: str,
        order: str = "replica",
        virtual_stages: int = 1,
        zero: int = 1,
    ) -> Skeleton:
        return Skeleton(
            self.micro_batch,
            recompute,
            (Template(self.segments, replicas, self.total_micro_batches // replicas),),
            order,
            virtual_stages,
            zero,
            self.stage_modes,
        )


@dataclass(frozen=True)
class PairGroup:
    """Two templates side by side, each with its own segments (device classes in order, with TP and
    stage counts), replica count and micro-batch share: R_a·m_a + R_b·m_b = M, m ≥ the template's
    depth. Expanded in two steps by the search: replica counts and recompute mode (`subgroups`),
    then the shares (`skeletons_of`)."""

    micro_batch: int
    a: tuple[Segment, ...]
    b: tuple[Segment, ...]
    a_replicas: tuple[int, ...]
    b_replicas: tuple[int, ...]
    recompute_options: tuple[str, ...]
    total_micro_batches: int
    shared: tuple[tuple[int, int, int], ...] = ()
    """The device classes both templates use, sharing their GPUs: (GPUs of one replica of a, of one
    of b, the class's GPUs) each, so that R_a·g_a + R_b·g_b ≤ G; () where the templates share no
    class."""
    zero: int = 1
    """The ZeRO stage (0 or 1: ZeRO-2/3 shard over one group of identical pipelines)."""
    stage_modes: tuple[str, ...] = ()
    """Per-stage recompute (`SkeletonGroup.stage_modes`)."""

    @property
    def depth_a(self) -> int:
        return sum(seg.stages for seg in self.a)

    @property
    def depth_b(self) -> int:
        return sum(seg.stages for seg in self.b)

    def fits(self, ra: int, rb: int) -> bool:
        """Whether R_a and R_b replicas fit on the GPUs of the classes they share (each side alone
        always does: a_replicas)."""
        return all(ra * ga + rb * gb <= gpus for ga, gb, gpus in self.shared)

    def shares(self, ra: int, rb: int) -> range:
        """Every m_a that leaves the other template a whole share m_b ≥ its depth: m_a ≥ p_a and
        R_a·m_a ≡ M (mod R_b), an arithmetic progression with step R_b / gcd(R_a, R_b); none where
        the replicas do not fit on a shared class's GPUs. Two identical templates are one pair
        either way round: only R_a ≤ R_b, and at R_a = R_b only m_a ≤ m_b."""
        if not self.fits(ra, rb) or (self.a == self.b and ra > rb):
            return range(0)
        total, pa = self.total_micro_batches, self.depth_a
        hi = (total - rb * self.depth_b) // ra
        if self.a == self.b and ra == rb:
            hi = min(hi, total // (2 * ra))  # m_a ≤ m_b = (M − R·m_a)/R
        g = math.gcd(ra, rb)
        if total % g or hi < pa:
            return range(0)
        step = rb // g
        first = (total // g) * pow(ra // g, -1, step) % step if step > 1 else 0
        lo = pa + (first - pa) % step
        return range(lo, hi + 1, step)

    def subgroups(self) -> Iterator[tuple[int, int, str]]:
        for ra in self.a_replicas:
            for rb in self.b_replicas:
                if self.shares(ra, rb):
                    for rc in self.recompute_options:
                        yield ra, rb, rc

    def skeletons_of(self, ra: int, rb: int, rc: str) -> Iterator[Skeleton]:
        for ma in self.shares(ra, rb):
            yield from self.skeletons_at(ra, rb, rc, ma)

    def templates_at(self, ra: int, rb: int, ma: int) -> tuple[Template, Template]:
        """The two templates at replica counts (R_a, R_b) with a's share m_a (b's the rest)."""
        return Template(self.a, ra, ma), Template(
            self.b, rb, (self.total_micro_batches - ra * ma) // rb
        )

    def skeletons_at(self, ra: int, rb: int, rc: str, ma: int) -> Iterator[Skeleton]:
        """The skeletons of one share m_a (one per placement order)."""
        for order in orders(max(ra, rb)):
            yield Skeleton(
                self.micro_batch,
                rc,
                self.templates_at(ra, rb, ma),
                order,
                zero=self.zero,
                modes=self.stage_modes,
            )

    def skeletons(self) -> Iterator[Skeleton]:
        for ra, rb, rc in self.subgroups():
            yield from self.skeletons_of(ra, rb, rc)


@dataclass(frozen=True)
class Family:
    """Skeleton groups that share the micro-batch size, the device classes (in stage order) and
    their TP degrees, and differ in how many stages each class serves. `pair`: two templates side by
    side instead of one template across the classes, the first `split` classes the first template's
    and the rest the second's. The search bounds a family by throughput before it generates any of
    its groups."""

    micro_batch: int
    classes: tuple[DeviceClass, ...]
    tps: tuple[int, ...]
    pair: bool
    total_micro_batches: int
    recompute_options: tuple[str, ...]
    virtual_options: tuple[int, ...] = (1,)
    """Virtual stages per stage (one template): 1, and those dividing the model's layers."""
    layers: int = 0
    """The model's layers (a stage holds at least one chunk of v of them)."""
    zero_options: tuple[int, ...] = (1,)
    """ZeRO stages: one template's (`zero_at`), or a pair's one stage (0 or 1)."""
    stage_modes: tuple[str, ...] = ()
    """Per-stage recompute: the modes each stage picks from; recompute_options is their least-work
    one."""
    split: int = 0
    """A pair's first template's classes: classes[:split] (the second's classes[split:])."""
    cp: int = 1
    """Context-parallel degree of every stage (each stage then takes tp·cp GPUs)."""
    placements: tuple[str, ...] = ORDERS
    """Placement orders of one template's replicas (search.placement)."""

    @property
    def widths(self) -> tuple[int, ...]:
        """GPUs of one stage of each class: tp·cp."""
        return tuple(t * self.cp for t in self.tps)

    @property
    def sides(self) -> tuple[tuple[tuple[DeviceClass, ...], tuple[int, ...]], ...]:
        """(classes, TP degrees) of each template: one for one template, two for a pair."""
        if not self.pair:
            return ((self.classes, self.tps),)
        k = self.split
        return (self.classes[:k], self.tps[:k]), (self.classes[k:], self.tps[k:])

    def zero_at(self, replicas: int) -> tuple[int, ...]:
        """The ZeRO stages worth trying at R replicas: with one replica there is nothing to shard,
        and ZeRO-2/3 only add their buffers (the same time, more memory), so only the lowest
        stage."""
        return self.zero_options if replicas > 1 else self.zero_options[:1]

    def groups(
        self, inst: Instance, opts: SearchOptions, stats: SearchStats, replicas: int | None = None
    ) -> Iterator[SkeletonGroup | PairGroup]:
        """The family's groups; for one template only those with `replicas` replicas when given."""
        if self.pair:
            yield from self._pairs(inst, opts, stats)
            return
        for r in self.replica_counts(stats) if replicas is None else [replicas]:
            yield from self._singles(inst, opts, stats, r)

    def replica_counts(self, stats: SearchStats | None = None) -> list[int]:
        """One template: the replica counts R it can have — R divides the M micro-batches, each
        class gives every replica at least one stage, and m = M/R ≥ one stage per class."""
        # a class in two segments (search.tp_per_stage) serves both
        top = min(
            dc.gpus // sum(w for c, w in zip(self.classes, self.widths, strict=True) if c == dc)
            for dc in self.classes
        )
        total_mb = self.total_micro_batches
        counts = [
            r for r in range(1, top + 1) if total_mb % r == 0 and total_mb // r >= len(self.classes)
        ]
        if stats is not None and top > len(counts):
            stats.pruned[DIVISIBILITY_R] += top - len(counts)
        return counts

    def stage_cap(self, opts: SearchOptions, layers: int, replicas: int) -> int:
        """P: the most stages a replica may have at R (max_stages, one layer each, m = M/R ≥
        stages)."""
        return min(opts.max_stages, layers, self.total_micro_batches // replicas)

    def next_counts(
        self, opts: SearchOptions, layers: int, replicas: int, fixed: tuple[int, ...]
    ) -> range:
        """The stage counts the next class (after those `fixed`) can take at R: at least one, at
        most its GPUs allow, leaving one stage for each class after it within the cap P."""
        k = len(fixed)
        dc, w = self.classes[k], self.widths[k]
        room = self.stage_cap(opts, layers, replicas) - sum(fixed) - (len(self.classes) - k - 1)
        # a class in two segments (search.tp_per_stage): the other takes what it holds, or one stage
        # at least
        others = sum(
            n * self.widths[i] for i, n in enumerate(fixed) if self.classes[i] == dc
        ) + sum(self.widths[i] for i in range(k + 1, len(self.classes)) if self.classes[i] == dc)
        return range(1, min(room, (dc.gpus // replicas - others) // w) + 1)

    def group(self, replicas: int, counts: tuple[int, ...], stats: SearchStats) -> SkeletonGroup:
        """The group of this family at R with `counts` stages per class (counted as enumerated)."""
        segments = tuple(
            Segment(dc.gpu, dc.island, t, n, self.cp)
            for dc, t, n in zip(self.classes, self.tps, counts, strict=True)
        )
        depth, m = sum(counts), self.total_micro_batches // replicas
        # interleaving: a chunk of v layers per stage at least, and micro-batches in whole groups of
        # p (Megatron-LM's interleaved schedule, hetopt.sim.schedules)
        virtual = tuple(
            v
            for v in self.virtual_options
            if v == 1 or (depth * v <= self.layers and m % depth == 0)
        ) or (1,)
        group = SkeletonGroup(
            self.micro_batch,
            segments,
            (replicas,),
            self.recompute_options,
            self.total_micro_batches,
            virtual,
            self.zero_at(replicas),
            self.stage_modes,
            self.placements,
        )
        stats.enumerated += group.size
        return group

    def _singles(
        self, inst: Instance, opts: SearchOptions, stats: SearchStats, r: int
    ) -> Iterator[SkeletonGroup]:
        def counts(fixed: tuple[int, ...]) -> Iterator[tuple[int, ...]]:
            if len(fixed) == len(self.classes):
                yield fixed
                return
            for n in self.next_counts(opts, inst.model.layers, r, fixed):
                yield from counts((*fixed, n))

        generated = 0
        for stages in counts(()):
            generated += 1
            yield self.group(r, stages, stats)
        cap = self.stage_cap(opts, inst.model.layers, r)
        stats.pruned[DEPTH] += (
            math.prod(
                min(cap, dc.gpus // (w * r))
                for dc, w in zip(self.classes, self.widths, strict=True)
            )
            - generated
        )

    def _pairs(
        self, inst: Instance, opts: SearchOptions, stats: SearchStats
    ) -> Iterator[PairGroup]:
        side_a, side_b = self.pair_sides(opts, inst.model.layers)
        for ta in side_a:
            for tb in side_b:
                if (group := self.pair_group(ta, tb, stats)) is not None:
                    yield group

    def pair_sides(
        self, opts: SearchOptions, layers: int
    ) -> tuple[list[SideTemplate], list[SideTemplate]]:
        """Every template each side of a pair family can be (`side_templates`)."""
        cap = min(opts.max_stages, layers)
        side_a, side_b = (side_templates(classes, tps, cap, self.cp) for classes, tps in self.sides)
        return side_a, side_b

    def pair_group(
        self, ta: SideTemplate, tb: SideTemplate, stats: SearchStats
    ) -> PairGroup | None:
        """The group of two side templates (counted as enumerated), or None (counted as pruned)
        where the micro-batches cannot give each stage one, where it mirrors another group of a
        family whose two sides are alike, or where one replica of each does not fit on a class they
        share."""
        total_mb = self.total_micro_batches
        (counts_a, a, per_a), (counts_b, b, per_b) = ta, tb
        pa, pb = sum(counts_a), sum(counts_b)
        if total_mb < pa + pb:
            stats.pruned[DIVISIBILITY] += 1
            return None
        shared = tuple((g, per_b[key][0], gpus) for key, (g, gpus) in per_a.items() if key in per_b)
        if (self.sides[0] == self.sides[1] and counts_a > counts_b) or any(
            ga + gb > gpus for ga, gb, gpus in shared
        ):
            stats.pruned[SHARED] += 1
            return None
        # each template keeps at least one micro-batch per stage for the other one's share
        ra = tuple(
            range(1, min(min(gpus // g for g, gpus in per_a.values()), (total_mb - pb) // pa) + 1)
        )
        rb = tuple(
            range(1, min(min(gpus // g for g, gpus in per_b.values()), (total_mb - pa) // pb) + 1)
        )
        stats.enumerated_groups += 1
        return PairGroup(
            self.micro_batch,
            a,
            b,
            ra,
            rb,
            self.recompute_options,
            total_mb,
            shared,
            self.zero_options[0],
            self.stage_modes,
        )


SideTemplate = tuple[tuple[int, ...], tuple[Segment, ...], dict]
"""One side of a pair: (stage counts per class, segments, {class: (GPUs of one replica, class
GPUs)})."""


def side_templates(
    classes: tuple[DeviceClass, ...], tps: tuple[int, ...], cap: int, cp: int = 1
) -> list[SideTemplate]:
    """Every template one side of a pair can be: (stage counts, segments, {class: (GPUs of one
    replica, the class's GPUs)}) — a count per class, at least one, at most its GPUs allow at one
    replica, at most `cap` stages in all; each stage tp·cp GPUs."""

    def counts(fixed: tuple[int, ...]) -> Iterator[tuple[int, ...]]:
        k = len(fixed)
        if k == len(classes):
            yield fixed
            return
        room = cap - sum(fixed) - (len(classes) - k - 1)
        for n in range(1, min(room, classes[k].gpus // (tps[k] * cp)) + 1):
            yield from counts((*fixed, n))

    return [
        (
            ns,
            tuple(
                Segment(dc.gpu, dc.island, t, n, cp)
                for dc, t, n in zip(classes, tps, ns, strict=True)
            ),
            {dc.key: (t * cp * n, dc.gpus) for dc, t, n in zip(classes, tps, ns, strict=True)},
        )
        for ns in counts(())
    ]


SYMMETRY = (
    "symmetry: selective recompute equals none under flash attention (whole plan space, halved)"
)
DIVISIBILITY_R = "divisibility: replica counts (per family) that do not divide the micro-batches"
DIVISIBILITY = "divisibility: replicas must divide the micro-batches, m ≥ stages"
DEPTH = "depth: stage-count choices over the layers, max_stages or the micro-batches per replica"
SHARED = "symmetry or GPUs: two templates on one class, mirrored or too big for it together"
ZERO0 = "dominance: ZeRO-0 beside ZeRO-1 (ZeRO-1 holds less and steps faster; the same traffic)"


def zero_stages(opts: SearchOptions, stats: SearchStats | None = None) -> tuple[int, ...]:
    """The ZeRO stages searched, ascending: ZeRO-0 only where ZeRO-1 is not allowed (ZeRO-1 shards
    the optimizer states, which shortens the optimizer step and frees memory, and moves the same
    bytes)."""
    stages = tuple(sorted(set(opts.zero)))
    if 0 in stages and 1 in stages:
        if stats is not None:
            stats.pruned[ZERO0] += 1
        return stages[1:]
    return stages


def enumerate_recompute(
    inst: Instance, opts: SearchOptions, stats: SearchStats | None = None
) -> tuple[str, ...]:
    """The recompute modes searched: search.recompute's, less selective beside none under flash
    attention (counted in `stats` when given)."""
    rc = tuple(opts.recompute)
    if is_flash(inst.spec.training.attention) and "none" in rc and "selective" in rc:
        # symmetry: flash attention already recomputes its core, so selective recompute is no
        # recompute — the same time and memory (cost.compute.layer_recompute,
        # cost.memory.layer_activation_bytes)
        rc = tuple(r for r in rc if r != "selective")
        if stats is not None:
            stats.pruned[SYMMETRY] += 1
    return rc


@dataclass(frozen=True)
class _Shared:
    """The choices every family of the space shares, fixed once before the micro-batch loop."""

    recompute: tuple[str, ...]
    """The recompute modes, or the least-work one of a per-stage mix."""
    virtual: tuple[int, ...]
    zero: tuple[int, ...]
    modes: tuple[str, ...]
    """Per-stage recompute: the modes each stage picks from (empty without it)."""


def _shared_choices(inst: Instance, opts: SearchOptions, whole: SearchStats) -> _Shared:
    """The recompute, virtual-stage and ZeRO choices the families share; what is dropped is counted
    in `whole`."""
    rc = enumerate_recompute(inst, opts, whole)
    # interleaving splits every stage's layers into v chunks: v must divide the model's layers
    virtual = tuple(v for v in sorted(set(opts.virtual_stages)) if inst.model.layers % v == 0) or (
        1,
    )
    zero = zero_stages(opts, whole)
    # per-stage recompute: one skeleton holds every mix of the modes (each uniform mode among them)
    modes = (
        tuple(sorted(rc, key=DEFAULT_RECOMPUTE.index))
        if opts.recompute_per_stage and len(rc) > 1
        else ()
    )
    if modes:
        rc = (least_work(modes),)
    return _Shared(rc, virtual, zero, modes)


def enumerate_families(
    inst: Instance, opts: SearchOptions, stats: SearchStats, lazy: bool = False
) -> Iterator[Family | SingleBatch]:
    """The plan space as families: divisibility of the batch is applied here, the rest in
    `Family.groups`. With `lazy` the one-template families of each micro-batch size and CP degree
    come as one `SingleBatch` (the search tree lists them class by class,
    hetopt.search.tree.choices) where it can list them so: one TP per class, and not only the rest
    of a narrowed subspace."""
    classes = list(inst.cluster.device_classes.values())
    # rules over the whole space are counted by the narrowed subspace's search (beyond_narrow: the
    # rest)
    whole = SearchStats() if opts.beyond_narrow else stats
    shared = _shared_choices(inst, opts, whole)
    # ZeRO-2/3 shard over one group of identical pipelines
    pair_zero = tuple(z for z in shared.zero if z <= 1)
    for b in opts.micro_batch:
        total_mb = inst.micro_batches(b)
        if total_mb is None:
            whole.pruned["divisibility: micro-batch does not divide the global batch"] += 1
            continue
        for cp in cp_options(inst, opts, whole):
            # ZeRO-2/3 are searched without context parallelism (their collectives' bounds assume
            # none)
            single_zero = shared.zero if cp == 1 else tuple(z for z in shared.zero if z <= 1)
            if not single_zero:
                continue
            singles = SingleBatch((b, total_mb, cp), shared, single_zero)
            if lazy and singles.listed_lazily(opts):
                yield singles
            else:
                yield from _single_families(inst, opts, stats, classes, singles)
            if opts.max_templates >= 2 and pair_zero:
                yield from _pair_families(
                    inst, opts, stats, classes, (b, total_mb, cp), shared, pair_zero
                )


@dataclass(frozen=True)
class SingleBatch:
    """What the one-template families at one micro-batch size b (M micro-batches) and CP degree
    share, `batch` = (b, M, cp): the families over every run of classes with its TP degrees."""

    batch: tuple[int, int, int]
    shared: _Shared
    zero: tuple[int, ...]

    def listed_lazily(self, opts: SearchOptions) -> bool:
        """Whether the search tree can list these families class by class: one TP per class
        (without search.tp_per_stage), and the whole space (not only the rest of a narrowed
        subspace, whose families all run a class at two TP degrees)."""
        return not opts.tp_per_stage and not opts.beyond_narrow

    def family(
        self, inst: Instance, opts: SearchOptions, order: tuple[DeviceClass, ...], tps: tuple
    ) -> Family:
        """The family over the classes `order` (in stage order) at TP degrees `tps`."""
        b, total_mb, cp = self.batch
        return Family(
            b,
            order,
            tps,
            False,
            total_mb,
            self.shared.recompute,
            self.shared.virtual,
            inst.model.layers,
            self.zero,
            self.shared.modes,
            cp=cp,
            placements=opts.placements,
        )


def _single_families(
    inst: Instance,
    opts: SearchOptions,
    stats: SearchStats,
    classes: list[DeviceClass],
    singles: SingleBatch,
) -> Iterator[Family]:
    """The one-template families of `singles`: every run of classes with its TP degrees."""
    cp = singles.batch[2]
    blocks = island_blocks(inst) if opts.symmetry else {}
    for order, tps in class_runs(inst, opts, classes, opts.max_classes, cp, opts.tp_per_stage):
        if opts.beyond_narrow and len({dc.key for dc in order}) == len(order):
            continue  # one TP per class: the narrowed subspace's
        if not canonical(order, blocks):
            stats.pruned[SYMMETRY_RULE] += 1
            continue
        stats.families += 1
        yield singles.family(inst, opts, order, tps)


SYMMETRY_RULE = "symmetry: one-template families of interchangeable islands (searched once)"


def _pair_families(
    inst: Instance,
    opts: SearchOptions,
    stats: SearchStats,
    classes: list[DeviceClass],
    batch: tuple[int, int, int],
    shared: _Shared,
    zero: tuple[int, ...],
) -> Iterator[Family]:
    """The two-template families at `batch` = (b, M, cp): two templates side by side, on two
    classes or one class twice (its replicas in two templates with uneven shares, also a different
    depth or TP)."""
    b, total_mb, cp = batch
    sides = list(class_runs(inst, opts, classes, min(opts.pair_classes, opts.max_classes), cp))
    for i, side_a in enumerate(sides):
        for side_b in sides[i:]:  # each unordered pair once (placement.placing_order: either order)
            if opts.beyond_narrow and len(side_a[0]) == len(side_b[0]) == 1:
                continue  # single-class sides: the narrowed subspace's
            stats.families += 1
            yield Family(
                b,
                side_a[0] + side_b[0],
                side_a[1] + side_b[1],
                True,
                total_mb,
                shared.recompute,
                zero_options=zero,
                stage_modes=shared.modes,
                split=len(side_a[0]),
                cp=cp,
            )


CP_RULE = "context parallelism: CP degrees the sequence, attention kernel or nodes do not allow"


def cp_options(
    inst: Instance, opts: SearchOptions, stats: SearchStats | None = None
) -> tuple[int, ...]:
    """The context-parallel degrees searched: search.cp's that flash attention runs and that split
    the sequence into 2·cp equal chunks (Megatron-LM's causal load balancing); what is dropped is
    counted."""
    kept = tuple(
        c
        for c in sorted(set(opts.cp))
        if c == 1
        or (inst.spec.training.attention == "flash" and cp_splits_sequence(inst.seq_len, 1, c))
    )
    if stats is not None and len(kept) < len(set(opts.cp)):
        stats.pruned[CP_RULE] += len(set(opts.cp)) - len(kept)
    return kept


def class_runs(
    inst: Instance,
    opts: SearchOptions,
    classes: list[DeviceClass],
    most: int,
    cp: int = 1,
    two_tps: bool = False,
) -> Iterator[tuple[tuple[DeviceClass, ...], tuple[int, ...]]]:
    """Every ordered run of up to `most` distinct device classes with a TP degree each (`tp_options`
    at context-parallel degree `cp`): the classes of one template, in stage order. With `two_tps`
    (search.tp_per_stage) one of its classes may also run as two consecutive segments at two
    different TP degrees, in either order (the class then appears twice, adjacent): one, as the
    first or last stages are where memory binds (1F1B's activations in flight, the embedding, the
    head), and each class split multiplies the families again."""
    for k in range(1, min(most, len(classes)) + 1):
        for order in itertools.permutations(classes, k):
            options = [tp_options(inst, dc, opts, cp) for dc in order]
            for tps in itertools.product(*options):
                if not opts.uniform_tp or len(set(tps)) == 1:
                    yield order, tps
            if not two_tps or opts.uniform_tp:
                continue
            for i in range(len(order)):
                for pair in itertools.permutations(options[i], 2):
                    for rest in itertools.product(*(options[:i] + options[i + 1 :])):
                        yield order[: i + 1] + order[i:], rest[:i] + pair + rest[i:]


def enumerate_groups(
    inst: Instance, opts: SearchOptions, stats: SearchStats
) -> Iterator[SkeletonGroup | PairGroup]:
    """Every skeleton of the plan space, grouped; divisibility, depth and resource rules are applied
    while enumerating (what they exclude is never generated, and counted per rule)."""
    for family in enumerate_families(inst, opts, stats):
        yield from family.groups(inst, opts, stats)

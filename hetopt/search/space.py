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
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from hetopt.cost.profiles import Profiles
from hetopt.placement import ORDERS
from hetopt.plan import Pipeline, Plan, Shard, Stage
from hetopt.spec.checks import cp_splits_sequence, tp_splits_heads
from hetopt.spec.cluster import DeviceClass
from hetopt.spec.instance import Instance

DEFAULT_TP = (1, 2, 4, 8)
DEFAULT_MICRO_BATCH = (1, 2, 4, 8)
DEFAULT_RECOMPUTE = ("none", "selective", "full")
DEFAULT_ZERO = (1,)


@dataclass(frozen=True)
class Segment:
    gpu: str
    island: str
    tp: int
    stages: int
    cp: int = 1
    """Context-parallel degree of its stages (one for the whole skeleton: `Family.cp`)."""

    @property
    def width(self) -> int:
        """GPUs of one replica of one of its stages: tp·cp."""
        return self.tp * self.cp


def segments_of(pipe: Pipeline) -> tuple[Segment, ...]:
    """A plan pipeline's stages as segments: runs of one device class at one TP degree (CP: the
    run's first stage's; the space has one CP degree for every stage)."""
    runs: list[list] = []
    for st in pipe.stages:
        if runs and runs[-1][0] == (st.gpu, st.island, st.tp):
            runs[-1][1] += 1
        else:
            runs.append([(st.gpu, st.island, st.tp), 1, st.cp])
    return tuple(Segment(gpu, island, tp, n, cp) for (gpu, island, tp), n, cp in runs)


@dataclass(frozen=True)
class Template:
    """A pipeline template: its stages as segments, its replica count and micro-batches per
    replica."""

    segments: tuple[Segment, ...]
    replicas: int
    micro_batches: int

    @property
    def depth(self) -> int:
        return sum(s.stages for s in self.segments)

    def stage_list(self) -> list[Segment]:
        return [seg for seg in self.segments for _ in range(seg.stages)]


@dataclass(frozen=True)
class Skeleton:
    micro_batch: int
    recompute: str
    templates: tuple[Template, ...]
    order: str = "replica"
    """Placement order (hetopt.placement): replica-major, stage-major or (a uniform layout's)
    megatron."""
    virtual_stages: int = 1
    """Model chunks per stage: > 1 is the interleaved 1F1B schedule, every stage's layers a multiple
    of it."""
    zero: int = 1
    """ZeRO stage over the data-parallel group (2 and 3 with one template only)."""
    modes: tuple[str, ...] = ()
    """Per-stage recompute: each stage runs one of these modes, chosen with the split (`recompute`
    is then their least-work mode, which bounds the compute); () — every stage runs `recompute`."""
    shards: tuple[tuple[tuple[str, str, int, int], ...], ...] = ()  # shards.ShardKey per shard
    """Stages with shards (hetopt.search.shards; one template): each stage's (GPU type, island,
    ranks, sequences per rank), () for a stage of one rank; () — no stage has shards."""
    lockstep: bool = False
    """A uniform layout's templates (hetopt.search.uniform): every template runs one layer split."""

    @property
    def memory_modes(self) -> tuple[str, ...]:
        """The recompute modes a stage may run, whose memory caps bound it: a stage holds at most
        the most layers any of them holds (no one mode holds least at every L: full recompute keeps
        one layer's activations whole, more than none at one layer)."""
        return self.modes or (self.recompute,)

    @property
    def depth(self) -> int:
        """Stages of all templates together (the length of a flat layer vector)."""
        return sum(t.depth for t in self.templates)

    @property
    def depths(self) -> list[int]:
        return [t.depth for t in self.templates]

    @property
    def split_depths(self) -> list[int]:
        """The stage counts of the skeleton's free layer splits: one per template, or in lockstep
        one."""
        return self.depths[:1] if self.lockstep else self.depths

    def joined(self, splits: Sequence[Sequence[int]]) -> list[int]:
        """The flat layer vector of one split per `split_depths` (in lockstep every template's is
        the one)."""
        return [
            n for s in (list(splits) * len(self.templates) if self.lockstep else splits) for n in s
        ]

    def split(self, layers: list[int]) -> list[list[int]]:
        """A flat layer vector (template after template) cut into one list per template."""
        out, start = [], 0
        for d in self.depths:
            out.append(list(layers[start : start + d]))
            start += d
        return out

    def plan(self, layers: list[int], recompute: list[str] | tuple[str, ...] | None = None) -> Plan:
        """The plan of a flat layer vector, with each stage's recompute mode (`recompute`, flat like
        `layers`; default: every stage runs `self.recompute`)."""
        pipelines, modes = [], self.split(list(recompute)) if recompute is not None else None
        shards = self.split(list(self.shards or ((),) * self.depth))
        for j, (t, t_layers) in enumerate(zip(self.templates, self.split(layers), strict=True)):
            t_modes = modes[j] if modes is not None else [self.recompute] * t.depth
            stages = [
                Stage(
                    layers=n,
                    gpu=seg.gpu,
                    island=seg.island,
                    tp=seg.tp,
                    cp=seg.cp,
                    recompute=rc,
                    sp=True,
                    shards=[Shard(gpu=g, island=i, ranks=r, sequences=q) for g, i, r, q in sh],
                )
                for n, seg, rc, sh in zip(t_layers, t.stage_list(), t_modes, shards[j], strict=True)
            ]
            pipelines.append(
                Pipeline(replicas=t.replicas, micro_batches=t.micro_batches, stages=stages)
            )
        v = self.virtual_stages
        return Plan(
            micro_batch=self.micro_batch,
            schedule="interleaved" if v > 1 else "1f1b",
            virtual_stages=v,
            zero=self.zero,
            pipelines=pipelines,
        )

    def describe(self) -> str:
        parts = []
        if self.shards:  # one template: each stage its ranks by class
            t = self.templates[0]
            stages = " → ".join(
                "+".join(f"{r}×{g}@{i}·{q}seq" for g, i, r, q in sh)
                if sh
                else f"{seg.gpu}@{seg.island}"
                for seg, sh in zip(t.stage_list(), self.shards, strict=True)
            )
            return (
                f"b={self.micro_batch} {self.recompute} shards tp{t.segments[0].tp}: "
                f"R={t.replicas} m={t.micro_batches}: {stages}"
            )
        for t in self.templates:
            segs = " → ".join(
                f"{s.stages}×{s.gpu}@{s.island}/tp{s.tp}{f'·cp{s.cp}' if s.cp > 1 else ''}"
                for s in t.segments
            )
            parts.append(f"R={t.replicas} m={t.micro_batches}: {segs}")
        vp = f" interleaved vp={self.virtual_stages}" if self.virtual_stages > 1 else ""
        zero = f" zero{self.zero}" if self.zero != 1 else ""
        rc = f"per-stage {'|'.join(self.modes)}" if self.modes else self.recompute
        lockstep = " lockstep" if self.lockstep else ""
        order = "megatron-order" if self.order == "megatron" else f"{self.order}-major"
        return f"b={self.micro_batch} {rc}{vp}{zero}{lockstep} {order}: " + " ‖ ".join(parts)

    def placed(
        self, layers: list[int], cluster, recompute: list[str] | tuple[str, ...] | None = None
    ) -> Plan:
        """The plan for a layer split (and per-stage recompute modes), placed in this skeleton's
        order (which neither changes)."""
        from hetopt.placement import place

        return place(self.plan(layers, recompute), cluster, self.order)


MOST_CLASSES = 8
"""The most device classes a template may span (the schema's bound on search.max_classes)."""


def default_max_classes(inst: Instance) -> int:
    """search.max_classes by default: every device class of the cluster, so that a pipeline over all
    of them (Metis's, the heuristics') is a point of the space; at least 4, at most
    `MOST_CLASSES`."""
    return max(4, min(len(inst.cluster.device_classes), MOST_CLASSES))


@dataclass(frozen=True)
class SearchOptions:
    tp: tuple[int, ...] = DEFAULT_TP
    """Allowed TP degrees (further limited to divisors of the heads that fit in a node)."""
    micro_batch: tuple[int, ...] = DEFAULT_MICRO_BATCH
    recompute: tuple[str, ...] = DEFAULT_RECOMPUTE
    max_stages: int = 16
    max_classes: int = 4
    """Most device classes one pipeline template may span (`from_instance`: search.max_classes,
    default every class of the cluster, at least 4 and at most 8)."""
    max_templates: int = 3
    """With 2, pairs of templates with their own micro-batch shares are searched too; with 3
    (default), also three single-class templates side by side (hetopt.search.triples)."""
    pair_classes: int = 1
    """Most device classes each template of a pair may span: 1 (default) pairs single-class
    templates."""
    virtual_stages: tuple[int, ...] = (1,)
    """Model chunks per stage to try: 1 is 1F1B, more the interleaved 1F1B schedule (one template
    only)."""
    zero: tuple[int, ...] = DEFAULT_ZERO
    """ZeRO stages to try: 2 and 3 for one template only (`Family.zero_at`); ZeRO-1 alone by
    default, as ZeRO-2/3 skeletons about double the near-optimal ones a proof must solve
    (README)."""
    recompute_per_stage: bool = False
    """Each stage picks its own mode of `recompute` (one skeleton holds every mix:
    `Skeleton.modes`)."""
    tp_per_stage: bool = False
    """One template may run a device class as two consecutive segments at different TP degrees."""
    uniform_tp: bool = False
    """Every stage of a template at one TP degree (search.uniform_tp: a launcher's rule, `solve
    --runnable`)."""
    placements: tuple[str, ...] = ORDERS
    """Placement orders of a one-template plan's replicas (search.placement; `orders`); plans of two
    or three templates and uniform layouts try both."""
    cp: tuple[int, ...] = (1,)
    """Context-parallel degrees (one per skeleton, every stage's): `cp_options` keeps those the
    sequence, the attention kernel and ZeRO allow."""
    shards: bool = True
    """Also search stages with shards: Metis's device groups (hetopt.search.shards)."""
    uniform_layouts: bool = True
    """Also search every uniform layout over all the GPUs, its templates in lockstep
    (hetopt.search.uniform)."""
    beyond_narrow: bool = False
    """Only the skeletons outside the subspace with pair_classes 1 and tp_per_stage off (set by the
    search itself once it has searched that subspace first: orchestrate._narrow_first): pairs with a
    side over several classes and templates with a class at two TP degrees; no stages with shards or
    three templates (which the subspace holds)."""
    tp_across_nodes: bool = False
    """search.tp_across_nodes: recorded; `tp_options` still keeps TP inside a node (the bounds of
    search/bounds.py price TP on the intra-node interconnect and would not bound a group over the
    network)."""

    @classmethod
    def from_instance(cls, inst: Instance) -> SearchOptions:
        s = inst.spec.search
        return cls(
            tp=tuple(s.tp or DEFAULT_TP),
            micro_batch=tuple(s.micro_batch or DEFAULT_MICRO_BATCH),
            recompute=tuple(s.recompute or DEFAULT_RECOMPUTE),
            max_stages=s.max_stages or 16,
            max_classes=s.max_classes or default_max_classes(inst),
            max_templates=s.max_templates or 3,
            pair_classes=s.pair_classes or 1,
            cp=tuple(s.cp or default_cp(inst)),
            virtual_stages=tuple(s.virtual_stages or (1,)),
            zero=tuple(s.zero or DEFAULT_ZERO),
            recompute_per_stage=s.recompute_per_stage,
            tp_across_nodes=s.tp_across_nodes,
            tp_per_stage=s.tp_per_stage,
            uniform_tp=s.uniform_tp,
            placements=tuple(s.placement or ORDERS),
            shards=s.shards,
            uniform_layouts=s.uniform_layouts,
        )


@dataclass
class SearchStats:
    families: int = 0
    """Families of skeleton groups (device classes in order × TP degrees × micro-batch size)."""
    enumerated: int = 0
    """Skeletons generated (one-template groups count their skeletons when generated)."""
    enumerated_groups: int = 0
    """Two-template groups generated; their skeletons are counted as they are expanded."""
    pruned: Counter = field(default_factory=Counter)
    solved: int = 0
    fallbacks: Counter = field(default_factory=Counter)
    """Skeletons a backend failed on, by (that backend, the backend that took it over or "none", the
    solver's words) — hetopt.search.backends.solve_skeleton."""

    def add(self, other: SearchStats) -> None:
        """Counts `other` in too: a search of a disjoint part of the same space."""
        self.families += other.families
        self.enumerated += other.enumerated
        self.enumerated_groups += other.enumerated_groups
        self.solved += other.solved
        self.pruned.update(other.pruned)
        self.fallbacks.update(other.fallbacks)

    def to_json(self) -> dict:
        return {
            "families": self.families,
            "skeletons_enumerated": self.enumerated,
            "pair_groups_enumerated": self.enumerated_groups,
            "pruned": dict(self.pruned),
            "solved": self.solved,
            "fallbacks": [
                {"failed": failed, "solved_by": taker, "detail": detail, "skeletons": n}
                for (failed, taker, detail), n in self.fallbacks.items()
            ],
        }


def orders(replicas: int, placements: tuple[str, ...] = ORDERS) -> tuple[str, ...]:
    """Placement orders worth trying among `placements` (search.placement): with one replica both
    orders place the same."""
    return placements if replicas > 1 else ("replica",)


def least_work(modes) -> str:
    """The recompute mode with the least compute among `modes` (recompute only adds work)."""
    return min(modes, key=DEFAULT_RECOMPUTE.index)


def most_work(modes) -> str:
    """The recompute mode with the most compute among `modes` (the most recomputed)."""
    return max(modes, key=DEFAULT_RECOMPUTE.index)


def tp_divides_heads(inst: Instance, tp: int) -> bool:
    """Whether TP degree `tp` splits the instance model's heads (`spec.checks.tp_splits_heads`)."""
    return tp_splits_heads(inst.model.heads, inst.model.kv_heads, tp)


def tp_options(inst: Instance, dc: DeviceClass, opts: SearchOptions, cp: int = 1) -> list[int]:
    """TP degrees of a class's stages at context-parallel degree `cp`: dividing the heads, tp·cp
    GPUs inside a node, and (cp > 1) the sequence in 2·cp·tp equal chunks (`verify._check_cp`)."""
    return [
        t
        for t in opts.tp
        if tp_divides_heads(inst, t)
        and t * cp <= dc.max_gpus_per_node
        and cp_splits_sequence(inst.seq_len, t, cp)
    ]


CP_TOKENS = 8192
"""By default the search tries context parallelism where each CP rank keeps at least this many
tokens: Megatron-LM and NeMo recommend CP from 8K-token sequences on, where attention's work
outgrows its exchange of keys and values."""


def default_cp(inst: Instance) -> tuple[int, ...]:
    """search.cp's default: 1, and the powers of two up to 8 leaving each rank CP_TOKENS tokens or
    more (flash attention only: Megatron-LM's ring attention runs on its kernels)."""
    if inst.spec.training.attention != "flash":
        return (1,)
    return tuple(c for c in (1, 2, 4, 8) if c == 1 or inst.seq_len // c >= CP_TOKENS)


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
        top = min(
            dc.gpus // sum(w for c, w in zip(self.classes, self.widths, strict=True) if c == dc)
            for dc in self.classes
        )  # a class in two segments (search.tp_per_stage) serves both
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
    if inst.spec.training.attention == "flash" and "none" in rc and "selective" in rc:
        # symmetry: flash attention already recomputes its core, so selective recompute is no
        # recompute — the same time and memory (cost.compute.layer_recompute,
        # cost.memory.layer_activation_bytes)
        rc = tuple(r for r in rc if r != "selective")
        if stats is not None:
            stats.pruned[SYMMETRY] += 1
    return rc


def enumerate_families(inst: Instance, opts: SearchOptions, stats: SearchStats) -> Iterator[Family]:
    """The plan space as families: divisibility of the batch is applied here, the rest in
    `Family.groups`."""
    classes = list(inst.cluster.device_classes.values())
    # rules over the whole space are counted by the narrowed subspace's search (beyond_narrow: the
    # rest)
    whole = SearchStats() if opts.beyond_narrow else stats
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
    pair_zero = tuple(
        z for z in zero if z <= 1
    )  # ZeRO-2/3 shard over one group of identical pipelines
    for b in opts.micro_batch:
        if inst.global_batch % b:
            whole.pruned["divisibility: micro-batch does not divide the global batch"] += 1
            continue
        total_mb = inst.global_batch // b
        for cp in cp_options(inst, opts, whole):
            # ZeRO-2/3 are searched without context parallelism (their collectives' bounds assume
            # none)
            single_zero = zero if cp == 1 else tuple(z for z in zero if z <= 1)
            if not single_zero:
                continue
            for order, tps in class_runs(
                inst, opts, classes, opts.max_classes, cp, opts.tp_per_stage
            ):
                if opts.beyond_narrow and len({dc.key for dc in order}) == len(order):
                    continue  # one TP per class: the narrowed subspace's
                stats.families += 1
                yield Family(
                    b,
                    order,
                    tps,
                    False,
                    total_mb,
                    rc,
                    virtual,
                    inst.model.layers,
                    single_zero,
                    modes,
                    cp=cp,
                    placements=opts.placements,
                )
            if opts.max_templates >= 2 and pair_zero:
                # two templates side by side, on two classes or one class twice: its replicas in two
                # templates with uneven shares (also a different depth or TP)
                sides = list(
                    class_runs(inst, opts, classes, min(opts.pair_classes, opts.max_classes), cp)
                )
                for i, side_a in enumerate(sides):
                    for side_b in sides[
                        i:
                    ]:  # each unordered pair once (placement.placing_order: either order)
                        if opts.beyond_narrow and len(side_a[0]) == len(side_b[0]) == 1:
                            continue  # single-class sides: the narrowed subspace's
                        stats.families += 1
                        yield Family(
                            b,
                            side_a[0] + side_b[0],
                            side_a[1] + side_b[1],
                            True,
                            total_mb,
                            rc,
                            zero_options=pair_zero,
                            stage_modes=modes,
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


def enumerate_roots(
    inst: Instance, opts: SearchOptions, stats: SearchStats, profiles: Profiles | None = None
) -> Iterator[Family | Skeleton]:
    """The roots of the plan space, the search tree's (search.tree.Tree.roots): every family; with
    search.shards every skeleton with shards, whose layouts follow the speeds of `profiles` (default
    the shipped ones); with search.max_templates 3 (default) every family of three templates
    (hetopt.search.triples.TripleFamily); with search.uniform_layouts the skeleton of every uniform
    layout the families do not hold (hetopt.search.uniform). With `beyond_narrow` the families only
    (the narrowed subspace holds the rest)."""
    yield from enumerate_families(inst, opts, stats)
    if opts.beyond_narrow:
        return
    if opts.uniform_layouts:
        from hetopt.search.uniform import lockstep_skeletons

        yield from lockstep_skeletons(inst, opts, stats)
    if opts.shards:
        from hetopt.search.shards import Layouts

        yield from Layouts(inst, opts, profiles).skeletons(stats)
    if opts.max_templates >= 3:  # last: on a large cluster they are many
        from hetopt.search.triples import triple_families

        yield from triple_families(inst, opts, stats)


def enumerate_skeletons(
    inst: Instance, opts: SearchOptions, stats: SearchStats, profiles: Profiles | None = None
) -> Iterator[Skeleton]:
    """Every skeleton of the plan space: those under each root (`enumerate_roots`)."""
    for root in enumerate_roots(inst, opts, stats, profiles):
        if isinstance(root, Skeleton):
            yield root
        elif isinstance(root, Family):
            for group in root.groups(inst, opts, stats):
                yield from group.skeletons()
        else:  # a family of three templates
            for group in root.groups(stats):
                yield from group.skeletons()


def outside_space(
    inst: Instance, plan: Plan, opts: SearchOptions, profiles: Profiles | None = None
) -> list[str]:
    """Why `plan` is not a plan of the search space (every rule it breaks; [] when it is one): the
    space's plans are 1F1B (or interleaved 1F1B with search.virtual_stages, one template), a ZeRO
    stage of search.zero (2 and 3 with one template), sequence parallel, one micro-batch size and
    recompute mode from the options, TP from the options and inside a node, at most max_stages
    stages and max_classes device classes per template, each class one contiguous run at one TP
    (with search.tp_per_stage one class of a template may be two consecutive runs at two TP
    degrees), one context-parallel degree of search.cp for every stage, and at most max_templates
    templates — two side by side only of at most search.pair_classes classes each (1 by default;
    three, with max_templates 3 (default), of one class at one TP, CP 1 and one recompute mode
    each); a stage of a replica is one rank, or with search.shards the stages are the device groups
    of `hetopt.search.shards` (whose speeds come from `profiles`, default the shipped ones); with
    search.uniform_layouts every uniform layout's plan with one layer split for all its templates
    (hetopt.search.uniform) is a point too."""
    why = _outside_families(inst, plan, opts, profiles)
    if why and opts.uniform_layouts:
        from hetopt.search.uniform import lockstep_layout

        if lockstep_layout(inst, plan, opts) is not None:
            return []
    return why


def _outside_families(
    inst: Instance, plan: Plan, opts: SearchOptions, profiles: Profiles | None
) -> list[str]:
    """`outside_space` but for the uniform layouts: the rules of the families, shards and
    triples."""
    why = []
    interleaved = (
        plan.schedule == "interleaved"
        and plan.virtual_stages in opts.virtual_stages
        and len(plan.pipelines) == 1
        and plan.pipelines[0].micro_batches % len(plan.pipelines[0].stages) == 0
    )
    if not (plan.schedule == "1f1b" and plan.virtual_stages == 1) and not interleaved:
        allowed = ", ".join(f"interleaved with {v}" for v in opts.virtual_stages if v > 1)
        why.append(
            f"schedule {plan.schedule} with {plan.virtual_stages} virtual stages (the space: 1f1b"
            + (
                f", {allowed} (one template, micro-batches a multiple of the stages)"
                if allowed
                else ""
            )
            + ")"
        )
    zero = zero_stages(opts)
    if plan.zero not in zero:
        why.append(f"ZeRO stage {plan.zero} (the space: {', '.join(map(str, zero))})")
    elif plan.zero >= 2 and len(plan.pipelines) > 1:
        why.append(
            f"ZeRO stage {plan.zero} with {len(plan.pipelines)} templates (the space: ZeRO-2/3 "
            "for one template)"
        )
    if plan.micro_batch not in opts.micro_batch:
        why.append(f"micro-batch {plan.micro_batch} not in {list(opts.micro_batch)}")
    stages = [st for pipe in plan.pipelines for st in pipe.stages]
    modes = {st.recompute for st in stages}
    if not modes <= set(opts.recompute) or (len(modes) > 1 and not opts.recompute_per_stage):
        each = "each stage's" if opts.recompute_per_stage else "one for every stage"
        why.append(f"recompute {sorted(modes)} (the space: {each} of {list(opts.recompute)})")
    if any(not st.sp for st in stages):
        why.append("a stage without sequence parallelism")
    node_gpus = {}
    for node in inst.cluster.nodes.values():
        key = (node.gpu, node.island)
        node_gpus[key] = max(node_gpus.get(key, 0), node.gpus)
    if any(
        st.tp not in opts.tp or st.width > node_gpus.get((st.gpu, st.island), 0) for st in stages
    ):
        why.append(
            f"TP {sorted({st.tp for st in stages})} not within {list(opts.tp)} inside a node"
        )
    cps = {st.cp for st in stages}
    if len(cps) > 1 or not cps <= set(cp_options(inst, opts)):
        why.append(
            f"context parallelism {sorted(cps)} (the space: one degree for every stage, of "
            f"{list(cp_options(inst, opts))})"
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
    if len(plan.pipelines) > opts.max_templates:
        why.append(f"{len(plan.pipelines)} templates (the space: at most {opts.max_templates})")
    if any(st.shards for st in stages):
        from hetopt.search.shards import shard_point

        # a plan with shards is a point of the shard skeletons (hetopt.search.shards) or of nothing
        if (why_not := shard_point(inst, plan, opts, profiles)) is not None:
            return [
                "stages with shards (several data-parallel ranks in a stage of one replica, "
                f"Metis-style): {why_not}"
            ]
        return []
    for j, pipe in enumerate(plan.pipelines):
        runs = segments_of(pipe)
        classes = [(seg.gpu, seg.island) for seg in runs]
        if len(pipe.stages) > opts.max_stages:
            why.append(
                f"template {j}: {len(pipe.stages)} stages (the space: at most {opts.max_stages})"
            )
        twice = [c for c, n in Counter(classes).items() if n > 1]
        # search.tp_per_stage: one class in two consecutive runs (they differ in TP), one template
        split_ok = (
            opts.tp_per_stage
            and len(plan.pipelines) == 1
            and len(twice) == 1
            and Counter(classes)[twice[0]] == 2
            and classes[classes.index(twice[0]) + 1] == twice[0]
        )
        if twice and not split_ok:
            why.append(
                f"template {j}: a device class in more than one run or at two TP degrees"
                + (
                    ""
                    if opts.tp_per_stage
                    else " (search.tp_per_stage allows two consecutive runs)"
                )
            )
        if len(set(classes)) > opts.max_classes:
            why.append(
                f"template {j}: {len(set(classes))} device classes (the space: at most "
                f"{opts.max_classes})"
            )
        if len(plan.pipelines) > 1 and len(set(classes)) > opts.pair_classes:
            most = (
                "single-class templates"
                if opts.pair_classes == 1
                else f"templates of at most {opts.pair_classes} classes (search.pair_classes)"
            )
            why.append(
                f"template {j}: {len(set(classes))} device classes beside another template (the "
                f"space: {most} side by side)"
            )
        if len(plan.pipelines) == 3 and len(runs) > 1:
            why.append(
                f"template {j}: {len(runs)} runs of device class and TP beside two other "
                "templates (the space: three templates of one class at one TP degree each)"
            )
    if len(plan.pipelines) == 3 and (max(cps) > 1 or len(modes) > 1):
        why.append(
            "three templates with context parallelism or a recompute mode per stage (the space: "
            "CP 1 and one recompute mode for the plan, hetopt.search.triples)"
        )
    return why

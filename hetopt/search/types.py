"""The search's data types: what a skeleton is, the options of the plan space, the counters of a
search, the affine pieces of the linearised evaluator, and what a search is asked.

Nothing here searches or prices: every other module of hetopt.search builds on these.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from hetopt.cost.profiles import Profiles
from hetopt.placement import ORDERS, place
from hetopt.plan import Pipeline, Plan, Shard, Stage
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
    gpus: tuple[str, ...] | None = None
    """GPU types stages may be placed on (search.gpus); None: every type."""
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
    """ZeRO stages to try: 2 and 3 for one template only (`Family.zero_at`). ZeRO-1 alone by
    default: ZeRO-2/3 add near-optimal skeletons a proof must solve (their cost in search time:
    docs/benchmarks.md)."""
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
    symmetry: bool = True
    """Search one-template families of interchangeable islands in canonical form only
    (hetopt.search.symmetry): the same optimum, fewer families. False searches every twin (the
    tests' check that the two agree)."""
    uniform_layouts: bool = True
    """Also search every uniform layout over the GPUs of a set of device classes, its templates in
    lockstep (hetopt.search.uniform)."""
    beyond_narrow: bool = False
    """Only the skeletons outside the subspace with pair_classes 1 and tp_per_stage off (set by the
    search itself once it has searched that subspace first: orchestrate._narrow_first): pairs with a
    side over several classes and templates with a class at two TP degrees; no stages with shards or
    three templates (which the subspace holds)."""
    max_usd_per_hour: float | None = None
    """A budget: only plans whose dollars per hour stay within it (hetopt.search.budget; `solve
    --max-usd-per-hour`, `hetopt pareto`); None: any."""
    tp_across_nodes: bool = False
    """search.tp_across_nodes: recorded; `tp_options` still keeps TP inside a node (the bounds of
    search/bounds/ price TP on the intra-node interconnect and would not bound a group over the
    network)."""

    @classmethod
    def from_instance(cls, inst: Instance) -> SearchOptions:
        s = inst.spec.search
        return cls(
            gpus=tuple(s.gpus) if s.gpus else None,
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
    solver's words) — hetopt.search.dispatch.solve_skeleton."""

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
class Affine:
    slope: float
    intercept: float

    def at(self, layers: float) -> float:
        return self.slope * layers + self.intercept


@dataclass(frozen=True)
class SearchProgress:
    """Where a search stands, for a progress line or a benchmark's trace (`Progress`)."""

    elapsed_s: float
    """Seconds since the search began (the time limit's clock)."""
    solved: int
    """Skeletons solved so far."""
    enumerated: int
    """Skeletons generated so far."""
    incumbent_s: float
    """The best plan's objective so far, seconds; inf while there is none."""
    bound_s: float
    """The smallest lower bound on what is not finished, seconds: no plan of the space beats it
    (0 while the tree's roots are still being listed)."""

    @property
    def gap(self) -> float:
        """(incumbent − bound) / incumbent; inf while there is no plan."""
        if not math.isfinite(self.incumbent_s) or self.incumbent_s <= 0:
            return math.inf
        return max(0.0, (self.incumbent_s - min(self.bound_s, self.incumbent_s)) / self.incumbent_s)


Progress = Callable[[SearchProgress], None]
"""progress(where the search stands), on each new incumbent and after each solved skeleton."""


@dataclass(frozen=True)
class SearchRequest:
    """What the exact search is asked: the instance, the plan space, how each skeleton is solved,
    and where (hetopt.search.orchestrate.solve_exact)."""

    inst: Instance
    formulation: str | None = None
    """The formulation each skeleton's program is built by (`hetopt formulations`); None: the
    backend's default."""
    backend: str = "highs"
    time_limit_s: float = 60.0
    """Wall-clock budget of the whole search."""
    seed: int = 0
    """Solver random seed (reported with every result)."""
    options: SearchOptions | None = None
    """The plan space; None: the instance's `search:` section."""
    profiles: Profiles | None = None
    """Calibrated weights; None: the shipped ones."""
    objective: str = "stable"
    """stable, expected, worst or cvar over the instance's scenarios (hetopt.search.robust)."""
    workers: int | None = None
    """Workers solving skeletons side by side; None: up to 2 here (one per CPU of a Ray cluster),
    started once the search has run for a while (orchestrate.PARALLEL_AFTER_S)."""
    executor: str = "process"
    """`process` (worker processes here) or `ray` (Ray actors; hetopt.executors)."""
    address: str | None = None
    """With `ray`: a Ray cluster's HOST:PORT or auto; None: a local Ray for this search."""
    narrow_first: bool = True
    """With search.pair_classes > 1 or search.tp_per_stage: search the default subspace first, its
    optimum the first incumbent of the rest (orchestrate.NARROW_SHARE)."""
    export_model: str | None = None
    """Write the best skeleton's solver model to this path."""
    subtrees: bool | None = None
    """Whether the workers expand the tree's subtrees besides solving its leaves
    (hetopt.search.subtrees); None: with subtrees.SUBTREE_WORKERS workers or more."""
    polish_s: float = 0.0
    """Seconds to climb from the seeds to better plans near them before the tree is planted
    (hetopt.search.polish), and the most to climb from each skeleton the tree makes the incumbent
    (at most orchestrate.POLISH_SEARCH_SHARE of the limit in all); 0: no climbing."""

    @property
    def space(self) -> SearchOptions:
        """The plan space searched: `options`, else the instance's."""
        return self.options or SearchOptions.from_instance(self.inst)

    @property
    def weights(self) -> Profiles:
        """The calibrated weights: `profiles`, else the shipped ones."""
        return self.profiles or Profiles()


def on_searched_gpus(plan, opts: SearchOptions) -> bool:
    """Whether every stage of `plan` is on a GPU type search.gpus allows (always, without it)."""
    return opts.gpus is None or all(
        st.gpu in opts.gpus for pipe in plan.pipelines for st in pipe.stages
    )


@dataclass(frozen=True)
class Seed:
    """A plan known before the search (a heuristic's, or the running plan re-split): the search's
    first incumbent where it is the best of its seeds."""

    planner: str
    """Who found it."""
    objective_s: float
    """Its objective, seconds (the search's objective, as the evaluator prices it)."""
    plan: Plan
    skeleton: Skeleton | None = None
    """Its skeleton where it is a point of the search's own space (a subspace search's answer)."""

"""The plan space the exact planner searches, as skeletons (DESIGN 4).

A skeleton fixes the small outer choices: micro-batch size b, the pipeline template's stages as segments
(a device class, its TP degree and how many consecutive stages it serves, classes in a chosen order), one
recompute mode, and the replica count R (R divides the M = global_batch / b micro-batches, each replica
takes m = M / R ≥ p of them). The per-skeleton integer program then chooses the layers of every stage.

Choices fixed by dominance in hetopt's cost model (they never make a plan slower or bigger):
sequence parallelism on (less activation memory and memory traffic, the same collective bytes), ZeRO-1 on
(less optimizer memory and a shorter optimizer step, the same gradient traffic), the 1F1B schedule
(GPipe has the same time and more memory).
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

from hetopt.plan import Pipeline, Plan, Stage
from hetopt.spec.cluster import DeviceClass
from hetopt.spec.instance import Instance

DEFAULT_TP = (1, 2, 4, 8)
DEFAULT_MICRO_BATCH = (1, 2, 4, 8)
DEFAULT_RECOMPUTE = ("none", "selective", "full")


@dataclass(frozen=True)
class Segment:
    gpu: str
    island: str
    tp: int
    stages: int


@dataclass(frozen=True)
class Skeleton:
    micro_batch: int
    recompute: str
    segments: tuple[Segment, ...]
    replicas: int
    micro_batches: int
    """Per replica."""

    @property
    def depth(self) -> int:
        return sum(s.stages for s in self.segments)

    def stage_list(self) -> list[Segment]:
        return [seg for seg in self.segments for _ in range(seg.stages)]

    def plan(self, layers: list[int]) -> Plan:
        stages = [Stage(layers=n, gpu=seg.gpu, island=seg.island, tp=seg.tp, recompute=self.recompute, sp=True)
                  for n, seg in zip(layers, self.stage_list(), strict=True)]
        return Plan(micro_batch=self.micro_batch, schedule="1f1b", virtual_stages=1, zero=1,
                    pipelines=[Pipeline(replicas=self.replicas, micro_batches=self.micro_batches, stages=stages)])

    def describe(self) -> str:
        segs = " → ".join(f"{s.stages}×{s.gpu}@{s.island}/tp{s.tp}" for s in self.segments)
        return f"b={self.micro_batch} R={self.replicas} m={self.micro_batches} {self.recompute}: {segs}"


@dataclass(frozen=True)
class SearchOptions:
    tp: tuple[int, ...] = DEFAULT_TP
    """Allowed TP degrees (further limited to divisors of the heads that fit in a node)."""
    micro_batch: tuple[int, ...] = DEFAULT_MICRO_BATCH
    recompute: tuple[str, ...] = DEFAULT_RECOMPUTE
    max_stages: int = 16
    max_classes: int = 3
    """Most device classes one pipeline template may span."""

    @classmethod
    def from_instance(cls, inst: Instance) -> SearchOptions:
        s = inst.spec.search
        return cls(tp=tuple(s.tp or DEFAULT_TP), micro_batch=tuple(s.micro_batch or DEFAULT_MICRO_BATCH),
                   recompute=tuple(s.recompute or DEFAULT_RECOMPUTE), max_stages=s.max_stages or 16)


@dataclass
class SearchStats:
    enumerated: int = 0
    pruned: Counter = field(default_factory=Counter)
    solved: int = 0

    def to_json(self) -> dict:
        return {"skeletons_enumerated": self.enumerated, "pruned": dict(self.pruned), "solved": self.solved}


def tp_options(inst: Instance, dc: DeviceClass, opts: SearchOptions) -> list[int]:
    return [t for t in opts.tp if inst.model.heads % t == 0 and t <= dc.max_gpus_per_node]


@dataclass(frozen=True)
class SkeletonGroup:
    """Skeletons that differ only in replica count and recompute mode (the search bounds them together)."""

    micro_batch: int
    segments: tuple[Segment, ...]
    replica_options: tuple[int, ...]
    recompute_options: tuple[str, ...]
    total_micro_batches: int

    @property
    def size(self) -> int:
        return len(self.replica_options) * len(self.recompute_options)

    def skeletons(self) -> Iterator[Skeleton]:
        for r in self.replica_options:
            for rc in self.recompute_options:
                yield Skeleton(self.micro_batch, rc, self.segments, r, self.total_micro_batches // r)

    def most_replicated(self) -> list[Skeleton]:
        """One skeleton per recompute mode at the largest replica count (the smallest compute bound)."""
        r = max(self.replica_options)
        return [Skeleton(self.micro_batch, rc, self.segments, r, self.total_micro_batches // r)
                for rc in self.recompute_options]


def enumerate_groups(inst: Instance, opts: SearchOptions, stats: SearchStats) -> Iterator[SkeletonGroup]:
    """Every skeleton of the plan space, grouped; divisibility, depth and resource rules are applied while
    enumerating (what they exclude is never generated, and counted per rule)."""
    layers = inst.model.layers
    classes = list(inst.cluster.device_classes.values())
    for b in opts.micro_batch:
        if inst.global_batch % b:
            stats.pruned["divisibility: micro-batch does not divide the global batch"] += 1
            continue
        total_mb = inst.global_batch // b
        for k in range(1, min(opts.max_classes, len(classes)) + 1):
            for order in itertools.permutations(classes, k):
                per_class = [[(t, n) for t in tp_options(inst, dc, opts) for n in range(1, opts.max_stages + 1)
                              if t * n <= dc.gpus] for dc in order]
                for choice in itertools.product(*per_class):
                    depth = sum(n for _, n in choice)
                    if depth > min(opts.max_stages, layers):
                        stats.pruned["depth: more stages than layers or max_stages"] += 1
                        continue
                    max_r = min(dc.gpus // (t * n) for dc, (t, n) in zip(order, choice, strict=True))
                    replicas = tuple(r for r in range(1, max_r + 1) if total_mb % r == 0 and total_mb // r >= depth)
                    excluded = max_r - len(replicas)
                    if excluded:
                        stats.pruned["divisibility: replicas must divide the micro-batches, m ≥ stages"] += excluded
                    if not replicas:
                        continue
                    segments = tuple(Segment(dc.gpu, dc.island, t, n) for dc, (t, n) in zip(order, choice, strict=True))
                    group = SkeletonGroup(b, segments, replicas, tuple(opts.recompute), total_mb)
                    stats.enumerated += group.size
                    yield group


def enumerate_skeletons(inst: Instance, opts: SearchOptions, stats: SearchStats) -> Iterator[Skeleton]:
    for group in enumerate_groups(inst, opts, stats):
        yield from group.skeletons()

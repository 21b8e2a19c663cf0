"""Three pipeline templates side by side (search.max_templates: 3), each on one device class.

A triple skeleton runs templates a, b, c, each of one device class with its own TP degree and depth
p_j, R_j replicas and m_j ≥ p_j micro-batches per replica, R_a·m_a + R_b·m_b + R_c·m_c = M: three
GPU types each at its own pace, or one class split among uneven shares. Templates on one class share
its GPUs (Σ_j R_j·g_j ≤ G). The integer program then chooses every template's layer split, as for a
pair; the iteration waits for the slowest pipeline, every template's gradient all-reduce, then the
templates' gradient exchange (a ring among the three, `features.cross_template_exchange`).

In the space by default (search.max_templates: 3; 2 or 1 leaves them out). The search lists them as
families — three runs of a device class at a TP degree each, `TripleFamily` — bounded by throughput
(`TripleBounds.family_bound`); a family's groups (a stage count per run) are made only where its
numpy table of group bounds (`TripleBounds.table`) leaves them open and its templates can take the
M micro-batches below the incumbent (`TripleBounds.reach`: each template's drained pipeline caps
its micro-batches per replica count); a group's replica counts are a box halved down to single
counts, each box under the same two tests (`TripleBounds.bound`, `triple_reach`), then the
pipelines' and drains' bound over the shares (search.tree.TripleShares); and only the shares below
the incumbent become skeletons (ZeRO-0/1, 1F1B, no context parallelism; one recompute mode per
plan).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator
from dataclasses import dataclass, replace

import numpy as np

from hetopt.search.space import (
    DIVISIBILITY,
    SideTemplate,
    class_runs,
    enumerate_recompute,
    side_templates,
    zero_stages,
)
from hetopt.search.types import SearchOptions, SearchStats, Skeleton, Template, orders
from hetopt.spec.cluster import DeviceClass
from hetopt.spec.instance import Instance

TRIPLE_SHARED = "GPUs: three templates too big for a class they share"


@dataclass(frozen=True)
class TripleGroup:
    """Three single-class templates (segments, GPUs per replica on their class) with every replica
    count, recompute mode and share (`skeletons`)."""

    micro_batch: int
    sides: tuple[tuple, tuple, tuple]
    """Each template's segments (one segment: one class, its TP degree and stage count)."""
    tops: tuple[int, int, int]
    """The most replicas of each template: alone on its class, and with one replica of each other
    template (`slot_caps`)."""
    recompute_options: tuple[str, ...]
    total_micro_batches: int
    gpus: tuple[tuple[tuple[str, str], int], ...]
    """(class, its GPUs) for each class the templates use."""
    zero: int = 1

    def depth(self, j: int) -> int:
        return sum(seg.stages for seg in self.sides[j])

    def width(self, j: int) -> int:
        """GPUs of one replica of template j."""
        return sum(seg.stages * seg.width for seg in self.sides[j])

    def slot_caps(self, lowest: tuple[int, int, int]) -> tuple[int, int, int] | None:
        """The most replicas of each template while the others have at least `lowest`: every
        replica takes at least one micro-batch per stage (m_j ≥ p_j, `shares`), so Σ_j R_j·p_j ≤ M
        and R_j ≤ lowest_j + (M − Σ_k lowest_k·p_k) / p_j. None where `lowest` alone takes more
        than M."""
        depths = [self.depth(j) for j in range(3)]
        slack = self.total_micro_batches - sum(r * p for r, p in zip(lowest, depths, strict=True))
        if slack < 0:
            return None
        return tuple(r + slack // p for r, p in zip(lowest, depths, strict=True))

    def fits(self, replicas: tuple[int, int, int]) -> bool:
        """Whether the replicas fit on the GPUs of each class (templates on one class share
        them)."""
        use: dict = {}
        for j, r in enumerate(replicas):
            key = (self.sides[j][0].gpu, self.sides[j][0].island)
            use[key] = use.get(key, 0) + r * self.width(j)
        return all(use.get(key, 0) <= gpus for key, gpus in self.gpus)

    def replica_counts(self) -> Iterator[tuple[int, int, int]]:
        """Every (R_a, R_b, R_c), each at most its top, that fits on the GPUs of the classes they
        share."""
        for replicas in itertools.product(*(range(1, t + 1) for t in self.tops)):
            if self.fits(replicas):
                yield replicas

    def shares(
        self, replicas: tuple[int, int, int], caps: tuple[int, int, int] | None = None
    ) -> Iterator[tuple[int, int, int]]:
        """Every (m_a, m_b, m_c), p_j ≤ m_j ≤ caps_j (default no cap), with Σ R_j·m_j = M; where two
        templates are alike (same segments) only the pair with (R, m) in order, so a triple and its
        mirror are one."""
        for ma, first, last, step in self._share_rows(replicas, caps):
            for mb in range(first, last + 1, step):
                yield (
                    ma,
                    mb,
                    (self.total_micro_batches - replicas[0] * ma - replicas[1] * mb) // replicas[2],
                )

    def share_count(
        self, replicas: tuple[int, int, int], caps: tuple[int, int, int] | None = None
    ) -> int:
        """How many `shares` there are (without listing them)."""
        return sum(
            (last - first) // step + 1 for _, first, last, step in self._share_rows(replicas, caps)
        )

    def _share_rows(
        self, replicas: tuple[int, int, int], caps: tuple[int, int, int] | None
    ) -> Iterator[tuple[int, int, int, int]]:
        """The shares as rows (m_a, first m_b, last m_b, step), each non-empty: for a given m_a the
        m_b with R_b·m_b ≡ M − R_a·m_a (mod R_c) — an arithmetic progression — within the bounds on
        m_b that m_b's and m_c's ranges and the mirror rules set."""
        (ra, rb, rc), total = replicas, self.total_micro_batches
        pa, pb, pc = (self.depth(j) for j in range(3))
        ca, cb, cc = caps or (total, total, total)
        alike = [self.sides[j] == self.sides[j + 1] for j in range(2)]
        if (alike[0] and ra > rb) or (alike[1] and rb > rc):
            return
        g = math.gcd(rb, rc)
        step = rc // g
        inverse = pow(rb // g, -1, step) if step > 1 else 0
        for ma in range(pa, min(ca, (total - rb * pb - rc * pc) // ra) + 1):
            rest = total - ra * ma
            if rest % g:
                continue
            lo = max(pb, -((rc * cc - rest) // rb))  # m_c ≤ cap_c: m_b ≥ (rest − R_c·cap_c) / R_b
            hi = min(cb, (rest - rc * pc) // rb)  # m_c ≥ p_c
            if alike[0] and ra == rb:
                lo = max(lo, ma)  # m_a ≤ m_b
            if alike[1] and rb == rc:
                hi = min(hi, rest // (2 * rb))  # m_b ≤ m_c = (rest − R·m_b)/R
            # the first m_b ≥ lo with (rest − R_b·m_b) divisible by R_c
            first = lo + ((rest // g) * inverse - lo) % step if step > 1 else lo
            if first <= hi:
                yield ma, first, hi - (hi - first) % step, step

    def templates_at(
        self, replicas: tuple[int, int, int], shares: tuple[int, int, int]
    ) -> tuple[Template, ...]:
        return tuple(
            Template(side, r, m) for side, r, m in zip(self.sides, replicas, shares, strict=True)
        )

    def skeletons(self) -> Iterator[Skeleton]:
        for replicas in self.replica_counts():
            yield from self.skeletons_at(replicas)

    def skeletons_at(
        self,
        replicas: tuple[int, int, int],
        modes: tuple[str, ...] | None = None,
        caps: tuple[int, int, int] | None = None,
    ) -> Iterator[Skeleton]:
        """The skeletons at replica counts (R_a, R_b, R_c): every share (at most `caps`), recompute
        mode (of `modes`, default the group's) and order."""
        for ms in self.shares(replicas, caps):
            for rc in modes or self.recompute_options:
                for order in orders(max(replicas)):
                    yield Skeleton(
                        self.micro_batch, rc, self.templates_at(replicas, ms), order, zero=self.zero
                    )

    @property
    def size(self) -> int:
        """Skeletons of the group (by listing their shares: for tests and small groups)."""
        return sum(
            self.share_count(replicas) * len(self.recompute_options) * len(orders(max(replicas)))
            for replicas in self.replica_counts()
        )


@dataclass(frozen=True)
class TripleFamily:
    """Three single-class runs (a device class at a TP degree each, unordered: a multiset) at one
    micro-batch size: every triple group over their depths (`groups`), a root of the search tree.
    Its groups are listed only where the family's table of bounds (`TripleBounds.table`) leaves
    them open, so a large cluster's cube of depths is never listed whole."""

    micro_batch: int
    runs: tuple[tuple[DeviceClass, int], tuple[DeviceClass, int], tuple[DeviceClass, int]]
    sides: tuple[tuple[SideTemplate, ...], tuple[SideTemplate, ...], tuple[SideTemplate, ...]]
    """Each run's side templates (`space.side_templates`: one per stage count), fewest stages
    first."""
    recompute_options: tuple[str, ...]
    total_micro_batches: int
    zero: int = 1

    def mirrored(self) -> np.ndarray:
        """Over (side a, side b, side c): whether the side templates at those picks are out of order
        where two runs are one (the same group is listed at its ordered picks)."""
        picks = np.indices(tuple(len(side) for side in self.sides))
        out = np.zeros(picks.shape[1:], dtype=bool)
        for j in range(2):
            if self.runs[j] == self.runs[j + 1]:
                out |= picks[j] > picks[j + 1]
        return out

    def group(self, picks: tuple[int, int, int], stats: SearchStats) -> TripleGroup | None:
        """The group of the side templates at `picks`; None, counted as pruned, where their stages
        take more micro-batches than there are or the templates do not fit on a class they share."""
        picked = tuple(self.sides[j][i] for j, i in enumerate(picks))
        if sum(sum(t[0]) for t in picked) > self.total_micro_batches:
            stats.pruned[DIVISIBILITY] += 1
            return None
        gpus = {key: class_gpus for _, _, per in picked for key, (_, class_gpus) in per.items()}
        group = TripleGroup(
            self.micro_batch,
            tuple(t[1] for t in picked),
            tuple(min(g // used for used, g in t[2].values()) for t in picked),
            self.recompute_options,
            self.total_micro_batches,
            tuple(gpus.items()),
            self.zero,
        )
        # and beside one replica of each other template (stages ≤ M was checked above)
        caps = group.slot_caps((1, 1, 1))
        assert caps is not None
        group = replace(group, tops=tuple(min(t, c) for t, c in zip(group.tops, caps, strict=True)))
        if not group.fits((1, 1, 1)):
            stats.pruned[TRIPLE_SHARED] += 1
            return None
        stats.enumerated_groups += 1
        return group

    def groups(self, stats: SearchStats) -> Iterator[TripleGroup]:
        """Every group of the family (each multiset of side templates once), counted as
        enumerated."""
        for picks in np.argwhere(~self.mirrored()):
            if (group := self.group(tuple(int(i) for i in picks), stats)) is not None:
                yield group


def triple_families(
    inst: Instance, opts: SearchOptions, stats: SearchStats
) -> Iterator[TripleFamily]:
    """Every triple family of the space (none unless search.max_templates is 3), counted among the
    families. Triples are unordered (a mirror is the same plan): each multiset of runs once, and
    within a family `TripleFamily.mirrored` and `TripleGroup.shares` order the alike."""
    zero = [z for z in zero_stages(opts) if z <= 1]
    if opts.max_templates < 3 or not zero or 1 not in opts.cp or 1 not in opts.virtual_stages:
        return
    classes = list(inst.cluster.device_classes.values())
    modes = enumerate_recompute(inst, opts)
    cap = min(opts.max_stages, inst.model.layers)
    runs = [(order[0], tps[0]) for order, tps in class_runs(inst, opts, classes, 1)]
    sides = {run: tuple(side_templates((run[0],), (run[1],), cap)) for run in runs}
    for b in opts.micro_batch:
        if inst.micro_batches(b) is None:
            continue
        for picked in itertools.combinations_with_replacement(runs, 3):
            stats.families += 1
            yield TripleFamily(
                b,
                picked,
                tuple(sides[run] for run in picked),
                modes,
                inst.micro_batches(b),
                zero[0],
            )


def triple_groups(inst: Instance, opts: SearchOptions, stats: SearchStats) -> Iterator[TripleGroup]:
    """Every triple group of the space (`triple_families`' groups), counted as enumerated; those
    whose templates cannot take a micro-batch per stage, or do not fit the GPUs of a class they
    share, counted as pruned."""
    for family in triple_families(inst, opts, stats):
        yield from family.groups(stats)

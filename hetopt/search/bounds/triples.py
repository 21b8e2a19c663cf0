"""Bounds of three templates side by side (hetopt.search.triples, the tree's triple nodes): over a
family, over a box of replica counts, and how many micro-batches they can take below a level."""

from __future__ import annotations

import itertools
import math

import numpy as np

from hetopt.search.bounds.lines import (
    first_true,
)
from hetopt.search.bounds.pairs import pair_at
from hetopt.search.bounds.templates import TemplateBounds
from hetopt.search.types import Template, least_work


class TripleBounds:
    """The triples' bounds, memoised on this object (one search run's)."""

    def __init__(self, templates: TemplateBounds) -> None:
        self.templates, self.sends, self.memory = templates, templates.sends, templates.memory
        self.inst, self.profiles = templates.inst, templates.profiles
        self._rings: dict[tuple, float] = {}
        self._triples: dict[tuple, float] = {}
        self._takes: dict[tuple, np.ndarray] = {}

    def family_bound(self, family) -> float:
        """Every skeleton of a triple family (hetopt.search.triples.TripleFamily) from throughput
        alone, as `family_bound` for a pair: a stage of class k at TP t takes τ ≥ a_k·L, so template
        j's replicas take M_j = R_j·m_j ≤ T·R_j·p_j/(a_k·N) micro-batches, and the templates share
        each class's G_k GPUs (Σ_j R_j·p_j·t_j ≤ G_k): T ≥ M / Σ_k G_k·max_j 1/(t_j·a_k·N), a class
        of two runs counted once at the better rate; then the ring exchange among the runs' classes
        (`ring_exchange_s`)."""
        rc, layers = least_work(family.recompute_options), self.inst.model.layers
        rates: dict[tuple[str, str], float] = {}
        for dc, tp in family.runs:
            a = self.templates.per_layer_s(dc.gpu, tp, family.micro_batch, rc)
            if a <= 0:
                return 0.0
            rates[dc.key] = max(rates.get(dc.key, 0.0), dc.gpus / (tp * a * layers))
        classes = tuple((dc,) for dc, _ in family.runs)
        return family.total_micro_batches / sum(rates.values()) + self.sends.ring_exchange_s(
            classes
        )

    def table(self, family) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """`triple_bound` of every group of a triple family at once, as an array over (side a, side
        b, side c) of its runs' side templates: at the replica counts 1 ≤ R_j ≤ top_j each side's
        GPUs allow (a class two share bounds their throughput, `class_rate`, not their pair bound's
        region: a larger region, a lower bound), λ_j and S_j at the least-work mode with memory caps
        at M replicas in all (R_j·m_j ≤ M each: the loosest caps any group has) and the most any
        mode holds, then the ring exchange and the slowest side's optimizer step at M replicas. inf
        where a side cannot hold the model or the stages take more micro-batches than there are,
        with masks of why ("memory", "divisibility")."""
        rc, total = least_work(family.recompute_options), family.total_micro_batches
        memory = family.recompute_options
        columns = []
        for j, sides in enumerate(family.sides):
            rows = []
            for counts, segments, per in sides:
                lam, s_sum = self.templates.capped_bound(
                    family.micro_batch, rc, memory, segments, total, family.zero
                )
                ((width, gpus),) = per.values()  # one class
                step = self.templates.optimizer_bound(Template(segments, 1, 1), total, family.zero)
                rows.append((lam, s_sum, sum(counts), gpus // width, step, width))
            shape = [1, 1, 1]
            shape[j] = -1
            columns.append(
                [np.array(col, dtype=float).reshape(shape) for col in zip(*rows, strict=True)]
            )
        lams, sums, depths, tops, steps, widths = (list(c) for c in zip(*columns, strict=True))
        fits = np.isfinite(lams[0]) & np.isfinite(lams[1]) & np.isfinite(lams[2])
        lams = [np.where(np.isfinite(lam), lam, 1.0) for lam in lams]
        sums = [np.where(np.isfinite(x), x, 1.0) for x in sums]
        rate = class_rate(
            [top / lam for top, lam in zip(tops, lams, strict=True)],
            [1 / (g * lam) for g, lam in zip(widths, lams, strict=True)],
            [dc.key for dc, _ in family.runs],
            {dc.key: dc.gpus for dc, _ in family.runs},
        )
        least = np.full(rate.shape, np.inf)
        for corner in itertools.product(*((1.0, top) for top in tops)):
            num = total + sum(
                r * (x / lam - 1) for r, x, lam in zip(corner, sums, lams, strict=True)
            )
            least = np.minimum(
                least, num / sum(r / lam for r, lam in zip(corner, lams, strict=True))
            )
        deep = (depths[0] + depths[1] + depths[2]) > total
        step = np.maximum(np.maximum(steps[0], steps[1]), steps[2])
        classes = tuple((dc,) for dc, _ in family.runs)
        bound = np.maximum(total / rate, least) + step + self.sends.ring_exchange_s(classes)
        return np.where(fits & ~deep, bound, np.inf), {
            "divisibility": deep,
            "memory": ~fits & ~deep,
        }

    def bound(
        self,
        group,
        lowest: tuple[int, int, int] = (1, 1, 1),
        replicas: tuple[int, int, int] | None = None,
    ) -> float:
        """Three templates (hetopt.search.triples) at every replica counts lowest_j ≤ R_j ≤
        replicas_j (default the group's tops) and shares: the larger of the throughput bound T ≥ M /
        Σ_j R_j/λ_j (as T ≥ m_j·λ_j; templates on one class at most its GPUs' worth, `class_rate`)
        and `triple_replicas_bound`'s, each at its least over the box (both are linear-fractional in
        R with a positive denominator, so least at one of its corners), then the templates' exchange
        and optimizer step (`triple_constant`); λ_j, S_j in memory at the most replicas, at most M
        (the loosest caps). The least over the group's recompute modes; inf where a template cannot
        hold the model in any."""
        top = replicas or group.tops
        corners = list(itertools.product(*zip(lowest, top, strict=True)))
        # every replica takes a micro-batch at least
        most = min(sum(top), group.total_micro_batches)
        best = math.inf
        for rc in group.recompute_options:
            lines = [
                self.templates.capped_bound(group.micro_batch, rc, (rc,), side, most, group.zero)
                for side in group.sides
            ]
            if not all(math.isfinite(lam) for lam, _ in lines):
                continue
            gpus = dict(group.gpus)
            rate = class_rate(
                [r / lam for r, (lam, _) in zip(top, lines, strict=True)],
                [1 / (group.width(j) * lam) for j, (lam, _) in enumerate(lines)],
                [(seg.gpu, seg.island) for seg, *_ in group.sides],
                gpus,
            )
            least = min(pair_at(lines, corner, group.total_micro_batches) for corner in corners)
            best = min(best, max(group.total_micro_batches / rate, least))
        return best + self.constant(group, most)

    def replicas_bound(self, group, replicas: tuple[int, int, int]) -> float:
        """Three templates at replica counts R_j and any shares: `pair_bound`'s argument for three,
        T ≥ (m_j − 1)·λ_j + S_j so M ≤ Σ_j R_j·((T − S_j)/λ_j + 1) (λ_j, S_j in memory at Σ R_j
        replicas), the least over the group's recompute modes; then the exchange and optimizer
        step."""
        return self.bound(group, replicas, replicas)

    def ring(self, sides: tuple) -> float:
        """`ring_exchange_s` of a triple's templates, memoised."""
        if sides not in self._rings:
            self._rings[sides] = self.sends.ring_exchange_s(sides)
        return self._rings[sides]

    def constant(self, group, replicas_total: int) -> float:
        """What follows every pipeline of a triple at `replicas_total` replicas in all, or fewer:
        the ring exchange among its templates (`ring_exchange_s`) and the slowest template's
        optimizer step (`optimizer_bound`, which only falls as ZeRO-1 shards over more replicas)."""
        key = (group.sides, replicas_total, group.zero)
        if key not in self._triples:
            sides = group.sides
            self._triples[key] = self.ring(sides) + max(
                self.templates.optimizer_bound(Template(side, 1, 1), replicas_total, group.zero)
                for side in sides
            )
        return self._triples[key]

    def drained(
        self,
        micro_batch: int,
        recompute: str,
        side: tuple,
        zero: int,
        replicas: int,
        micro_batches: int,
        replicas_total: int,
    ) -> float:
        """D(m; R): `drained_bound` of one template of a triple (its segments `side`, R replicas, m
        micro-batches each), memory caps in its own recompute mode at `replicas_total` replicas."""
        return self.templates.drained_bound(
            micro_batch,
            recompute,
            Template(side, replicas, micro_batches),
            replicas_total,
            1,
            zero,
            (recompute,),
        )

    def reach(
        self, group, lowest: tuple[int, int, int], replicas: tuple[int, int, int], threshold: float
    ) -> int:
        """The most micro-batches a triple group's templates can take in all below `threshold`, over
        the box of replica counts lowest_j ≤ R_j ≤ replicas_j and the group's recompute modes: Σ_j
        of the most `triple_takes` of template j in the box, its level `threshold` less the ring
        exchange and its own optimizer step at M replicas (the least: T ≥ D_j(m_j) + T_cross +
        T_opt, T_opt ≥ each template's). Below M, no skeleton of the box beats `threshold`."""
        total = group.total_micro_batches
        ring = self.ring(group.sides)
        on: dict[tuple[str, str], list[int]] = {}
        for j, side in enumerate(group.sides):
            on.setdefault((side[0].gpu, side[0].island), []).append(j)
        gpus = dict(group.gpus)
        most = -1
        for rc in group.recompute_options:
            takes = []
            for j, side in enumerate(group.sides):
                room = (
                    threshold
                    - ring
                    - self.templates.optimizer_bound(Template(side, 1, 1), total, group.zero)
                )
                every = self.takes(
                    group.micro_batch, rc, side, group.zero, total, group.tops[j], room
                )
                takes.append(every[lowest[j] - 1 : replicas[j]])
            most = max(
                most,
                sum(
                    _class_reach(
                        [takes[j] for j in js],
                        [lowest[j] for j in js],
                        [group.width(j) for j in js],
                        gpus[key],
                    )
                    for key, js in on.items()
                ),
            )
        return most

    def takes(
        self,
        micro_batch: int,
        recompute: str,
        side: tuple,
        zero: int,
        total: int,
        top: int,
        room: float,
    ) -> np.ndarray:
        """What one template of a triple can take below a level: for R = 1 … top replicas, R·cap(R)
        with cap(R) the most micro-batches m ≥ p (its depth) whose `drained_bound` lies below
        `room`, memory caps at `total` (= M) replicas (the loosest any triple has; looser caps only
        lower the bound of a single-class template, whose stages share one slope — not so in
        general: `pipeline_at` with stages of different slopes can rise as caps loosen), and at most
        M in all; −(M + 1) where no m does. A triple group at replica counts R_j and shares m_j with
        every D_j(m_j) < room_j has Σ_j R_j·m_j = M ≤ Σ_j takes_j(R_j): where even the most of each
        over a box of replica counts falls short of M, no point of the box is below the level
        (search.tree.TripleGroupNode).

        D(m; R) rises with m (each pipeline piece is (m − 1)·Λ + Σ τ) and with R (stage 0's ring
        spans ⌈R/k⌉ nodes, `class_ring`; R flows share island links, `send_s`), so cap(R) falls with
        R: it is filled by halving [1, top], a run of equal ends being equal throughout."""
        key = (micro_batch, recompute, side, zero, total, top, room)
        if key in self._takes:
            return self._takes[key]
        depth = sum(seg.stages for seg in side)

        def cap(r: int, lo: int, hi: int) -> int:
            """The most m in [lo, hi] below the level (lo − 1 where none), knowing it is at least lo
            − 1."""
            return (
                lo
                + first_true(
                    hi - lo + 1,
                    lambda i: (
                        self.drained(micro_batch, recompute, side, zero, r, lo + i, total) >= room
                    ),
                )
                - 1
            )

        caps = np.zeros(top + 1, dtype=np.int64)
        caps[1] = cap(1, depth, total)
        if top > 1:
            caps[top] = cap(top, depth, int(caps[1]))
        spans = [(1, top)] if top > 1 else []
        while spans:
            lo, hi = spans.pop()
            if hi - lo <= 1:
                continue
            if caps[lo] == caps[hi]:
                caps[lo : hi + 1] = caps[lo]
                continue
            mid = (lo + hi) // 2
            caps[mid] = cap(mid, int(caps[hi]) + 1, int(caps[lo]))
            spans += [(lo, mid), (mid, hi)]
        replicas = np.arange(top + 1)
        takes = np.where(caps >= depth, np.minimum(replicas * caps, total), -(total + 1))[1:]
        self._takes[key] = takes
        return takes


def class_rate(rates: list, per_gpu: list, classes: list, gpus: dict):
    """An upper bound on Σ_j R_j/λ_j, the micro-batches per second of templates j at R_j ≤ top_j
    replicas (`rates`: top_j/λ_j), where the templates on one class k share its G_k GPUs
    (Σ_{j on k} R_j·g_j ≤ G_k): each class's templates take at most min(Σ_j top_j/λ_j,
    G_k·max_j 1/(g_j·λ_j)) (`per_gpu`: 1/(g_j·λ_j)). Floats or arrays that broadcast."""
    total = 0.0
    for key in dict.fromkeys(classes):
        on = [j for j, k in enumerate(classes) if k == key]
        alone = sum(rates[j] for j in on)
        if len(on) > 1:
            best = per_gpu[on[0]]
            for j in on[1:]:
                best = np.maximum(best, per_gpu[j])
            alone = np.minimum(alone, gpus[key] * best)
        total = total + alone
    return total


def _class_reach(takes: list[np.ndarray], lowest: list[int], widths: list[int], gpus: int) -> int:
    """The most Σ_j takes_j[R_j − lowest_j] of the templates on one class whose R_j·g_j fit its G
    GPUs (`TripleBounds.reach`), exactly: one template its most; two the most over the pairs that
    fit; three the most over the third's counts of its takes plus the most of the pairs that fit in
    what is left (pairs by GPUs used, with a running most). −(2^40) where no counts fit."""
    if len(takes) == 1:
        return int(takes[0].max())
    a, b = (
        np.arange(low, low + len(t)) * w
        for t, low, w in zip(takes[:2], lowest[:2], widths[:2], strict=True)
    )
    used = (a[:, None] + b[None, :]).ravel()
    value = (takes[0][:, None] + takes[1][None, :]).ravel()
    if len(takes) == 2:
        fit = used <= gpus
        return int(value[fit].max()) if fit.any() else -(2**40)
    order = np.argsort(used, kind="stable")
    used, most = used[order], np.maximum.accumulate(value[order])
    left = gpus - np.arange(lowest[2], lowest[2] + len(takes[2])) * widths[2]
    k = np.searchsorted(used, left, side="right") - 1  # the pairs that fit in what the third leaves
    if not (k >= 0).any():
        return -(2**40)
    return int((takes[2][k >= 0] + most[k[k >= 0]]).max())

"""Bounds of three templates side by side (hetopt.search.triples, the tree's triple nodes): over a
family, over a box of replica counts, and how many micro-batches they can take below a level."""

from __future__ import annotations

import itertools
import math

import numpy as np

from hetopt.search.bounds.pairs import pair_at
from hetopt.search.bounds.reach import TemplateReach, classes_reach, least_level
from hetopt.search.bounds.templates import TemplateBounds
from hetopt.search.types import Template, least_work


class TripleBounds:
    """The triples' bounds, memoised on this object (one search run's)."""

    def __init__(self, templates: TemplateBounds, reach: TemplateReach) -> None:
        self.templates, self.sends, self.memory = templates, templates.sends, templates.memory
        self.reaching = reach
        self.inst, self.profiles = templates.inst, templates.profiles
        self._rings: dict[tuple, float] = {}
        self._triples: dict[tuple, float] = {}
        self._class_rings: dict[tuple, float] = {}

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
        return family.total_micro_batches / sum(rates.values()) + self.class_ring(family.runs)

    def class_ring(self, runs) -> float:
        """`ring_exchange_s` among the classes of a triple's runs (each a class and a TP degree),
        memoised on the classes' keys: 60,000 triple families are bounded at the roots of a
        six-island instance, and a device class hashes all its nodes."""
        key = tuple(dc.key for dc, _ in runs)
        if key not in self._class_rings:
            self._class_rings[key] = self.sends.ring_exchange_s(tuple((dc,) for dc, _ in runs))
        return self._class_rings[key]

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
        # beside one replica of each other template: TripleGroup.slot_caps at (1, 1, 1), over the
        # table's every pick at once
        slack = np.maximum(total - (depths[0] + depths[1] + depths[2]), 0.0)
        tops = [
            np.minimum(top, 1 + np.floor(slack / p)) for top, p in zip(tops, depths, strict=True)
        ]
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
        bound = np.maximum(total / rate, least) + step + self.class_ring(family.runs)
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
        return best + self.constant(group, most, least=lowest)

    def replicas_bound(self, group, replicas: tuple[int, int, int]) -> float:
        """Three templates at replica counts R_j and any shares: `pair_bound`'s argument for three,
        T ≥ (m_j − 1)·λ_j + S_j so M ≤ Σ_j R_j·((T − S_j)/λ_j + 1) (λ_j, S_j in memory at Σ R_j
        replicas), the least over the group's recompute modes; then the exchange and optimizer
        step."""
        return self.bound(group, replicas, replicas)

    def ring(
        self,
        sides: tuple,
        replicas: tuple[int, int, int],
        least: tuple[int, int, int] = (1, 1, 1),
    ) -> float:
        """`ring_exchange_s` of a triple's templates at most `replicas` each (their nodes cap the
        channels: `SendBounds.nodes_at`) and at least `least`, memoised."""
        key = (sides, replicas, least)
        if key not in self._rings:
            self._rings[key] = self.sends.ring_exchange_s(
                sides, self.sends.nodes_at(sides, replicas), least=least
            )
        return self._rings[key]

    def constant(
        self,
        group,
        replicas_total: int,
        replicas: tuple[int, int, int] | None = None,
        least: tuple[int, int, int] | None = None,
    ) -> float:
        """What follows every pipeline of a triple at `replicas_total` replicas in all, or fewer:
        the ring exchange among its templates (`ring`: with the channels of at most `replicas`
        each, default the group's tops, and at least `least`, default one each) and the slowest
        template's optimizer step (`optimizer_bound`, which only falls as ZeRO-1 shards over more
        replicas)."""
        at = replicas or group.tops
        low = least or (1, 1, 1)
        key = (group.sides, at, low, replicas_total, group.zero)
        if key not in self._triples:
            sides = group.sides
            self._triples[key] = self.ring(sides, at, low) + max(
                self.templates.optimizer_bound(Template(side, 1, 1), replicas_total, group.zero)
                for side in sides
            )
        return self._triples[key]

    def reach(
        self,
        group,
        lowest: tuple[int, int, int],
        replicas: tuple[int, int, int],
        threshold: float,
        memo: bool = True,
    ) -> int:
        """The most micro-batches a triple group's templates can take in all below `threshold`, over
        the box of replica counts lowest_j ≤ R_j ≤ replicas_j and the group's recompute modes: Σ_j
        of the most `TemplateReach.takes` of template j in the box, its level `threshold` less the
        ring exchange (the takes take off its own optimizer step). Below M, no skeleton of the box
        beats `threshold`."""
        total = group.total_micro_batches
        keys = [(side[0].gpu, side[0].island) for side in group.sides]
        widths = [group.width(j) for j in range(3)]
        # the ring at the group's tops, the same for every box: the takes stay memoised per level
        level = threshold - self.ring(group.sides, group.tops)
        packed = self.sends.packed(group.sides)  # each template at the lesser of its orders
        most = -1
        for rc in group.recompute_options:
            takes = [
                self.reaching.takes(
                    group.micro_batch, rc, (rc,), side, group.zero, total, top, level, memo, packed
                )[low - 1 : high]
                for side, top, low, high in zip(
                    group.sides, group.tops, lowest, replicas, strict=True
                )
            ]
            most = max(most, classes_reach(takes, list(lowest), widths, keys, dict(group.gpus)))
        return most

    def least(
        self,
        group,
        lowest: tuple[int, int, int],
        replicas: tuple[int, int, int],
        bound: float,
        threshold: float,
    ) -> float:
        """A bound of every skeleton of a box of replica counts that counts what no replica sheds:
        the least level at which the box's templates take the M micro-batches (`reach`,
        `least_level`), at least `bound` (a key known already), probed up to `threshold` (the
        incumbent less its tolerance; inf: none) — `threshold` itself where the box takes them
        only above it."""
        return least_level(
            lambda level: self.reach(group, lowest, replicas, level, memo=False),
            group.total_micro_batches,
            bound,
            threshold,
        )

    def family_reach(self, family, threshold: float, memo: bool = True) -> int:
        """The most micro-batches any group of a triple family (hetopt.search.triples.TripleFamily)
        can take in all below `threshold`, at least each group's `reach` over all its replica
        counts (`TemplateReach.runs_reach`), less the ring exchange among the runs' classes (a
        group's: the same classes)."""
        ring = self.class_ring(family.runs)
        runs = [
            (
                dc.key,
                dc.gpus,
                [(segments, next(iter(per.values()))[0]) for _, segments, per in sides],
            )
            for (dc, _), sides in zip(family.runs, family.sides, strict=True)
        ]
        return self.reaching.runs_reach(
            family.micro_batch,
            family.recompute_options,
            (),
            family.zero,
            family.total_micro_batches,
            runs,
            threshold - ring,
            memo,
        )

    def family_least(self, family, bound: float, threshold: float) -> float:
        """`least` of a whole triple family: the least level at which its groups could take the M
        micro-batches (`family_reach`), at least `bound`, probed up to `threshold`."""
        return least_level(
            lambda level: self.family_reach(family, level, memo=False),
            family.total_micro_batches,
            bound,
            threshold,
        )


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

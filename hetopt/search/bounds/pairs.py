"""Bounds of two templates side by side (hetopt.search.space.PairGroup, the tree's pair nodes): the
throughput bound and the pipelines' bound over regions of replica counts, least at a vertex."""

from __future__ import annotations

import itertools
import math

import numpy as np

from hetopt.search.bounds.reach import TemplateReach, classes_reach, least_level
from hetopt.search.bounds.templates import TemplateBounds
from hetopt.search.types import least_work


class PairBounds:
    """The pairs' bounds, memoised on this object (one search run's)."""

    def __init__(self, templates: TemplateBounds, reach: TemplateReach) -> None:
        self.templates, self.sends, self.memory = templates, templates.sends, templates.memory
        self.reaching = reach
        self.inst, self.profiles = templates.inst, templates.profiles
        self._pairs: dict[tuple, tuple] = {}

    def table(self, family, opts) -> tuple[tuple[list, list], np.ndarray, dict[str, np.ndarray]]:
        """A pair family's side templates (`Family.pair_sides`) and the bound of every group of
        them, as an array over (template a, template b): `range_bound` at the least-work mode over
        all replica counts each side's GPUs allow and that fit the classes both use (a region
        holding the group's), inf where the micro-batches cannot give each stage one (with
        `pair_grid`'s masks of why). Arithmetic on each side's (λ, S): no group is made to bound it.
        Memory caps at M replicas in all (R_a + R_b ≤ M: each takes a micro-batch at least), which
        shares each side template's bound among families. Not memoised (a table per family would
        hold them all at once: gigabytes over tens of thousands of families); the side templates'
        bounds are."""
        rc, total = least_work(family.recompute_options), family.total_micro_batches
        memory = family.stage_modes or family.recompute_options
        sides = family.pair_sides(opts, self.inst.model.layers)
        tops = [
            [min(gpus // g for g, gpus in per.values()) for _, _, per in side] for side in sides
        ]
        columns = []
        for side, top in zip(sides, tops, strict=True):
            lines = [
                self.templates.capped_bound(
                    family.micro_batch, rc, memory, segments, total, family.zero_options[0]
                )
                for _, segments, _ in side
            ]
            columns.append(
                np.array(
                    [
                        (lam, s, sum(counts), t)
                        for (lam, s), (counts, _, _), t in zip(lines, side, top, strict=True)
                    ],
                    dtype=float,
                ).reshape(-1, 4)
            )
        keys_b = {dc.key for dc in family.sides[1][0]}
        shared = [
            (
                np.array([per[dc.key][0] for _, _, per in sides[0]], dtype=float).reshape(-1, 1),
                np.array([per[dc.key][0] for _, _, per in sides[1]], dtype=float).reshape(1, -1),
                dc.gpus,
            )
            for dc in family.sides[0][0]
            if dc.key in keys_b
        ]
        exchange = self.sends.exchange_s(*(classes for classes, _ in family.sides))
        table, why = pair_grid(columns[0], columns[1], total, shared)
        return sides, table + exchange, why

    def lines(
        self, group, recompute: str, memory: tuple[str, ...], replicas_total: int
    ) -> tuple[tuple[float, float], ...]:
        """(λ_j, S_j) of both templates of a pair group in memory at `replicas_total` replicas
        (`capped_bound`), memoised by the group object (its entry keeps it alive, so no id is
        reused): the pair bounds below are arithmetic on them."""
        key = (id(group), recompute, memory, replicas_total)
        if key not in self._pairs or self._pairs[key][0] is not group:
            lines = tuple(
                self.templates.capped_bound(
                    group.micro_batch, recompute, memory, side, replicas_total, group.zero
                )
                for side in (group.a, group.b)
            )
            self._pairs[key] = (group, lines)
        return self._pairs[key][1]

    def bound(
        self, group, recompute: str, memory: tuple[str, ...], replicas: tuple[int, int]
    ) -> float:
        """Templates side by side with replicas R_j and any shares Σ R_j·m_j = M: from
        T ≥ (m_j − 1)·λ_j + S_j, m_j ≤ (T − S_j)/λ_j + 1, so M ≤ Σ R_j·((T − S_j)/λ_j + 1); then the
        templates' exchange. λ_j, S_j over the splits that fit in memory in the modes `memory`."""
        lines = self.lines(group, recompute, memory, sum(replicas))
        return pair_at(lines, replicas, group.total_micro_batches) + self.exchange(
            group, replicas, replicas
        )

    def exchange(self, group, replicas: tuple[int, int], least: tuple[int, int] = (1, 1)) -> float:
        """`exchange_s` of a pair group's templates at most `replicas` each (their nodes cap the
        channels: `SendBounds.nodes_at`) and at least `least`."""
        sides = (group.a, group.b)
        return self.sends.exchange_s(
            *sides, nodes=self.sends.nodes_at(sides, replicas), least=least
        )

    def range_bound(
        self,
        group,
        recompute: str,
        memory: tuple[str, ...],
        lowest: tuple[int, int],
        replicas: tuple[int, int],
    ) -> float:
        """Two templates at every replica counts lowest_j ≤ R_j ≤ replicas_j that fit on the classes
        they share: the larger of the throughput bound T ≥ M / Σ_j R_j/λ_j (T ≥ m_j·λ_j as S_j ≥
        λ_j) and `pair_bound`, each at its least over that region (`region_bound`), then the
        exchange; λ_j, S_j in memory at the most replicas (the most sharding: the loosest caps)."""
        lines, total = (
            self.lines(group, recompute, memory, sum(replicas)),
            group.total_micro_batches,
        )
        if not all(math.isfinite(lam) for lam, _ in lines):
            return math.inf
        sides = [
            (lam, s, float(lo), float(hi))
            for (lam, s), lo, hi in zip(lines, lowest, replicas, strict=True)
        ]
        return region_least(*sides, group.shared, total) + self.exchange(group, replicas, lowest)

    def reach(
        self,
        group,
        modes: tuple[str, ...],
        lowest: tuple[int, int],
        replicas: tuple[int, int],
        threshold: float,
        memo: bool = True,
    ) -> int:
        """The most micro-batches two single-class templates (`single_class`) can take in all below
        `threshold` (hetopt.search.bounds.reach), over the box of replica counts lowest_j ≤ R_j ≤
        replicas_j that fit on the class they share, in any of the recompute modes `modes`: each
        template's level is `threshold` less the exchange (the takes take off its own optimizer
        step). Below M, no skeleton of the box beats `threshold`."""
        total, sides = group.total_micro_batches, (group.a, group.b)
        tops = (max(group.a_replicas), max(group.b_replicas))
        keys = [(side[0].gpu, side[0].island) for side in sides]
        widths = [sum(seg.stages * seg.width for seg in side) for side in sides]
        gpus = {key: self.inst.cluster.device_classes[key].gpus for key in keys}
        # the exchange at the group's tops, the same for every box: the takes stay memoised per
        # level
        level = threshold - self.exchange(group, tops)
        packed = self.sends.packed(sides)  # each template at the lesser of its placement orders
        most = -1
        for rc in modes:
            takes = [
                self.reaching.takes(
                    group.micro_batch,
                    rc,
                    group.stage_modes or (rc,),
                    side,
                    group.zero,
                    total,
                    top,
                    level,
                    memo,
                    packed,
                )[low - 1 : high]
                for side, top, low, high in zip(sides, tops, lowest, replicas, strict=True)
            ]
            most = max(most, classes_reach(takes, list(lowest), widths, keys, gpus))
        return most

    def least(
        self,
        group,
        modes: tuple[str, ...],
        lowest: tuple[int, int],
        replicas: tuple[int, int],
        bound: float,
        threshold: float,
    ) -> float:
        """`TripleBounds.least` for two single-class templates: the least level at which the box's
        templates take the M micro-batches, at least `bound`, probed up to `threshold`."""
        return least_level(
            lambda level: self.reach(group, modes, lowest, replicas, level, memo=False),
            group.total_micro_batches,
            bound,
            threshold,
        )

    def family_least(self, family, opts, bound: float, threshold: float) -> float:
        """`least` of a whole pair family of single-class sides (`single_class_family`): the least
        level at which any of its groups could take the M micro-batches below `threshold` less the
        exchange (`TemplateReach.runs_reach` over each side's templates), at least `bound`."""
        sides = family.pair_sides(opts, self.inst.model.layers)
        runs = [
            (dc.key, dc.gpus, [(segments, per[dc.key][0]) for _, segments, per in side])
            for ((dc,), _), side in zip(family.sides, sides, strict=True)
        ]
        cross = self.sends.exchange_s(*(classes for classes, _ in family.sides))
        return least_level(
            lambda level: self.reaching.runs_reach(
                family.micro_batch,
                family.recompute_options,
                family.stage_modes,
                family.zero_options[0],
                family.total_micro_batches,
                runs,
                level - cross,
                memo=False,
            ),
            family.total_micro_batches,
            bound,
            threshold,
        )


def single_class_family(family) -> bool:
    """Whether each side of a pair family lies on one class (`PairBounds.family_least`)."""
    return all(len(classes) == 1 for classes, _ in family.sides)


def single_class(group) -> bool:
    """Whether both templates of a pair group lie on one class each (`PairBounds.reach` holds for
    them: looser memory caps only lower a single-class template's drained bound)."""
    return len(group.a) == 1 and len(group.b) == 1


def pair_grid(
    side_a: np.ndarray,
    side_b: np.ndarray,
    total_micro_batches: int,
    shared: list[tuple[np.ndarray, np.ndarray, int]],
) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """`PairBounds.range_bound` of every pair of side templates, each a row (λ, S, depth p, most
    replicas its GPUs allow): over 1 ≤ R_j ≤ min(that, (M − p_other)/p_j) and R_a·g_a + R_b·g_b ≤ G
    on each class both use (`shared`: each side's GPUs per replica, as a column and a row, and the
    class's GPUs); inf where M < p_a + p_b, no replica counts fit, or a template cannot hold the
    model (λ = inf). With masks of why: "divisibility" (the micro-batches) and "memory" (λ = inf);
    the other infinite entries fit no replica counts on the classes both templates share."""
    lam_a, s_a, p_a, gpus_a = (side_a[:, k : k + 1] for k in range(4))
    lam_b, s_b, p_b, gpus_b = (side_b[:, k].reshape(1, -1) for k in range(4))
    total = float(total_micro_batches)
    fits = np.isfinite(lam_a) & np.isfinite(lam_b)  # each template can hold the model
    lam_a, s_a, lam_b, s_b = (np.where(np.isfinite(x), x, 1.0) for x in (lam_a, s_a, lam_b, s_b))
    top_a = np.minimum(gpus_a, np.floor((total - p_b) / p_a))
    top_b = np.minimum(gpus_b, np.floor((total - p_a) / p_b))
    bound = region_bound((lam_a, s_a, 1.0, top_a), (lam_b, s_b, 1.0, top_b), shared, total)
    deep = (top_a < 1) | (top_b < 1)
    return np.where(fits & ~deep, bound, np.inf), {"divisibility": deep, "memory": ~fits & ~deep}


def region_bound(side_a: tuple, side_b: tuple, shared: list[tuple], total: float):
    """The least pair bound over replica counts in a region, each side (λ, S, least R, most R) and
    the shared classes' R_a·g_a + R_b·g_b ≤ G: a convex polygon in real (R_a, R_b). The throughput
    bound M / (R_a/λ_a + R_b/λ_b) is least where the linear denominator is most, and `pair_at` is
    linear-fractional with a positive denominator (quasi-linear), so both are least at a vertex: the
    box's corners, where a class's line meets the box, or where two classes' lines meet. The larger
    of the two holds (`PairBounds.range_bound`); inf where the polygon is empty. Arrays broadcast
    (pair_grid) or scalars."""
    (lam_a, s_a, lo_a, top_a), (lam_b, s_b, lo_b, top_b) = side_a, side_b
    points = [(lo_a, lo_b), (lo_a, top_b), (top_a, lo_b), (top_a, top_b)]
    with np.errstate(divide="ignore", invalid="ignore"):
        for ga, gb, gpus in shared:
            points += [(x, (gpus - ga * x) / gb) for x in (lo_a, top_a)]
            points += [((gpus - gb * y) / ga, y) for y in (lo_b, top_b)]
        for (ga1, gb1, g1), (ga2, gb2, g2) in itertools.combinations(shared, 2):
            det = ga1 * gb2 - ga2 * gb1  # 0 where the two lines are parallel: nan, never a vertex
            points.append(((g1 * gb2 - g2 * gb1) / det, (ga1 * g2 - ga2 * g1) / det))
        rate, least = 0.0, np.inf
        for x, y in points:
            inside = (
                (x >= lo_a - 1e-9) & (x <= top_a + 1e-9) & (y >= lo_b - 1e-9) & (y <= top_b + 1e-9)
            )
            for ga, gb, gpus in shared:
                inside = inside & (ga * x + gb * y <= gpus * (1 + 1e-9))
            here = x / lam_a + y / lam_b
            pair = (total + x * (s_a / lam_a - 1) + y * (s_b / lam_b - 1)) / here
            rate = np.where(inside, np.maximum(rate, here), rate)
            least = np.where(inside, np.minimum(least, pair), least)
        return np.where(rate > 0, np.maximum(total / rate, least), np.inf)


def region_least(side_a: tuple, side_b: tuple, shared, total: float) -> float:
    """`region_bound` of one pair of templates, in plain floats (numpy's per-call cost is most of
    the time on scalars)."""
    (lam_a, s_a, lo_a, top_a), (lam_b, s_b, lo_b, top_b) = side_a, side_b
    points = [(lo_a, lo_b), (lo_a, top_b), (top_a, lo_b), (top_a, top_b)]
    for ga, gb, gpus in shared:
        points += [(x, (gpus - ga * x) / gb) for x in (lo_a, top_a)]
        points += [((gpus - gb * y) / ga, y) for y in (lo_b, top_b)]
    for (ga1, gb1, g1), (ga2, gb2, g2) in itertools.combinations(shared, 2):
        det = ga1 * gb2 - ga2 * gb1
        if det:  # parallel lines never meet at a vertex
            points.append(((g1 * gb2 - g2 * gb1) / det, (ga1 * g2 - ga2 * g1) / det))
    rate, least = 0.0, math.inf
    for x, y in points:
        if (
            lo_a - 1e-9 <= x <= top_a + 1e-9
            and lo_b - 1e-9 <= y <= top_b + 1e-9
            and all(ga * x + gb * y <= gpus * (1 + 1e-9) for ga, gb, gpus in shared)
        ):
            rate = max(rate, x / lam_a + y / lam_b)
            least = min(least, pair_at(((lam_a, s_a), (lam_b, s_b)), (x, y), total))
    return max(total / rate, least) if rate > 0 else math.inf


def pair_at(lines, replicas, total_micro_batches: int) -> float:
    """`PairBounds.bound` from the templates' (λ_j, S_j) at replica counts R_j."""
    if not all(math.isfinite(lam) for lam, _ in lines):
        return math.inf  # a template that cannot hold the model
    num = total_micro_batches + sum(
        r * (s / lam - 1) for r, (lam, s) in zip(replicas, lines, strict=True)
    )
    return num / sum(r / lam for r, (lam, _) in zip(replicas, lines, strict=True))

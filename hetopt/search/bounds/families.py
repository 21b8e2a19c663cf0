"""Bounds of the one-template families and their buckets (hetopt.search.space.Family, the search
tree's FamilyNode and BucketNode): throughput alone, before any group is generated."""

from __future__ import annotations

import math

from hetopt.search.bounds.templates import TemplateBounds
from hetopt.search.types import Segment, least_work


class FamilyBounds:
    """The families' bounds, memoised on this object (one search run's)."""

    def __init__(self, templates: TemplateBounds) -> None:
        self.templates, self.sends, self.memory = templates, templates.sends, templates.memory
        self.inst, self.profiles = templates.inst, templates.profiles
        self._buckets: dict[tuple, tuple] = {}
        self._unshed_rates: dict[tuple, tuple] = {}

    def bound(self, family) -> float:
        """Every skeleton of a family from throughput alone: a stage of class k at TP t_k takes τ ≥
        a_k·L, so a replica's bottleneck is at least N / Σ_i 1/a_i and T ≥ m·max τ; with R·n_k·t_k ≤
        G_k GPUs of each class, T ≥ M·N / Σ_k G_k/(t_k·a_k). A template also pays the sends beside
        each change of class (`bucket_bound`, one flow: the least): N becomes N + w, w = Σ c_i/a_i,
        as in every bucket's λ (T ≥ m·λ at any R). Two templates side by side: M = Σ_j R_j·m_j ≤
        T·Σ_j R_j/λ_j with R_j/λ_j ≤ Σ_k R_j·n_jk/(a_jk·(N + w_j)), and the templates share each
        class's G_k GPUs (Σ_j R_j·n_jk·t_jk ≤ G_k), so T ≥ M / Σ_k G_k·max_j 1/(t_jk·a_jk·(N +
        w_j)): a class both use counts once, at the better rate; and the templates' exchange follows
        (`exchange_s`). The search keys a pair family by the larger of this and the least bound of
        its groups (`pair_table`, tree.FamilyNode.expand)."""
        rc = least_work(family.recompute_options)
        layers, b = self.inst.model.layers, family.micro_batch
        rates: dict[tuple[str, str], float] = {}
        cp = family.cp  # a stage takes tp·cp GPUs
        for classes, tps in family.sides:
            per_layer = [
                self.templates.per_layer_s(dc.gpu, tp, b, rc, cp)
                for dc, tp in zip(classes, tps, strict=True)
            ]
            if min(per_layer) <= 0:
                return 0.0
            weight = sum(c / a for a, c in self._side_sends(classes, tps, b, per_layer, 1, cp))
            # a class in two segments of a template (search.tp_per_stage), or on both sides of a
            # pair, counts once, at its better rate: Σ_seg R·n·t·1/(t·a) ≤ G·max 1/(t·a)
            for dc, tp, a in zip(classes, tps, per_layer, strict=True):
                rates[dc.key] = max(
                    rates.get(dc.key, 0.0), dc.gpus / (tp * cp * a * (layers + weight))
                )
            if not family.pair:
                return family.total_micro_batches / sum(rates.values())
        return family.total_micro_batches / sum(rates.values()) + self.sends.exchange_s(
            *(classes for classes, _ in family.sides)
        )

    def _side_sends(
        self,
        classes: tuple,
        tps: tuple[int, ...],
        micro_batch: int,
        per_layer: list[float],
        flows: int,
        cp: int = 1,
    ) -> list[tuple[float, float]]:
        """(a, c) of the sends beside each change of class of one template over `classes` at `tps`:
        the stage on each side pays one (per-layer time of its class, the send at least), with
        `flows` replicas sharing islands."""
        sends = []
        cls = [(dc.gpu, dc.island) for dc in classes]
        for k in range(len(cls) - 1):
            sends.append(
                (
                    per_layer[k],
                    self.sends.send_s(cls[k], cls[k + 1], tps[k] * cp, micro_batch, flows),
                )
            )
            sends.append(
                (
                    per_layer[k + 1],
                    self.sends.send_s(cls[k + 1], cls[k], tps[k + 1] * cp, micro_batch, flows),
                )
            )
        return sends

    def bucket_bound(
        self, family, replicas: int, max_stages: int, fixed: tuple[int, ...] = ()
    ) -> float:
        """Every skeleton of a family at R replicas with the first classes' stage counts `fixed`:
        the larger of `pipeline_bucket` and `replica_bound` (inf where no replica fits)."""
        return self.pipeline_bucket(family, replicas, max_stages, fixed, replica=True)

    def pipeline_bucket(
        self,
        family,
        replicas: int,
        max_stages: int,
        fixed: tuple[int, ...] = (),
        replica: bool = False,
    ) -> float:
        """`family_bound` at one replica count R, with the first classes' stage counts `fixed`: each
        replica has n_k stages of class k — n_k as fixed, else 1 ≤ n_k ≤ ⌊G_k/(t_k·R)⌋ — and at most
        P = min(max_stages, layers, M/R) in all (the free stages go to the fastest classes first);
        inf when no replica fits. The two stages beside each change of class pay a send over NICs,
        c_i ≥ `send_s`, in every configuration: τ_i ≥ a_i·L_i + c_i gives max τ ≥ λ = (N + Σ
        c_i/a_i) / max Σ_k n_k/a_k. With m = M/R micro-batches T ≥ (m − 1)·max τ + Σ τ, and Σ τ ≥
        max τ ≥ λ as well as Σ τ ≥ N·a_min + Σ_k n_k·(a_k − a_min) + Σ c_i (a layer on each stage,
        the rest at the fastest class's per-layer time), least at the smallest counts: T ≥ (m − 1)·λ
        + max(λ, that sum). With `replica` the larger of that and `replica_bound`."""
        parts = self._bucket_parts(family, replicas, max_stages)
        if parts is None:
            return 0.0
        m, cap, per_layer, most, send_weight, send_sum = parts
        # (a_k, least n_k, most n_k)
        classes = [
            (a, fixed[k], fixed[k]) if k < len(fixed) else (a, 1, most[k])
            for k, a in enumerate(per_layer)
        ]
        left = cap - sum(lo for _, lo, _ in classes)
        if left < 0 or any(hi < lo for _, lo, hi in classes):
            # no replica of this family fits at R with these counts: the bucket is empty
            return math.inf
        rate = _most_rate(classes, cap)
        layers = self.inst.model.layers
        lam = (layers + send_weight) / rate
        a_min = min(per_layer)
        least_sum = layers * a_min + sum(lo * (a - a_min) for a, lo, _ in classes) + send_sum
        # interleaved: m·max τ + (Σ τ − max τ)/v, least at the most chunks
        v = max(family.virtual_options)
        bound = (m - 1 / v) * lam + max(lam, least_sum) / v
        if not replica:
            return bound
        return max(bound, self.replica_bound(family, replicas, m, classes, cap))

    def replica_bound(self, family, replicas: int, m: int, classes: list, cap: int) -> float:
        """What each stage cannot shed (1F1B, ZeRO ≤ 1), over a replica's stages: T ≥ e_k·L_i for a
        stage of class k (`TemplateBounds.unshed_per_layer`: its compute and its gradient
        all-reduce over the inter-node ring of the R replicas), so max_i e_i·L_i ≥ N / Σ_i 1/e_i,
        most at the stage counts `classes` allow ((a, least, most) as `bucket_bound`'s, at most
        `cap` stages). 0 where it does not apply (interleaving, ZeRO-2/3) or some e_k is 0."""
        if max(family.virtual_options) > 1 or any(z >= 2 for z in family.zero_at(replicas)):
            return 0.0
        per_layer = self._unshed(family, replicas, m)
        if per_layer is None:
            return 0.0
        unshed = [(e, lo, hi) for e, (_, lo, hi) in zip(per_layer, classes, strict=True)]
        return self.inst.model.layers / _most_rate(unshed, cap)

    def _unshed(self, family, replicas: int, m: int) -> list[float] | None:
        """e_k of each class of a family at R replicas and m micro-batches each
        (`TemplateBounds.unshed_per_layer`), memoised: the buckets of one R share them. None where
        some e_k is 0, or where every e_k ≤ m·a_k: then N / max Σ n_k/e_k ≤ m·N / max Σ n_k/a_k ≤
        m·λ, which the pipeline bound already holds."""
        key = (id(family), replicas, m)  # the entry keeps its family alive: no id is reused
        if key not in self._unshed_rates or self._unshed_rates[key][0] is not family:
            rc, b, cp = least_work(family.recompute_options), family.micro_batch, family.cp
            rates: list[float] | None = []
            above = False
            for dc, tp in zip(family.classes, family.tps, strict=True):
                e = self.templates.unshed_per_layer(
                    Segment(dc.gpu, dc.island, tp, 1, cp), b, rc, replicas, m
                )
                if e <= 0:
                    rates = None
                    break
                rates.append(e)
                above = above or e > m * self.templates.per_layer_s(dc.gpu, tp, b, rc, cp)
            self._unshed_rates[key] = (family, rates if above else None)
        return self._unshed_rates[key][1]

    def _bucket_parts(self, family, replicas: int, max_stages: int):
        """What `bucket_bound` needs of a family at R whatever counts are fixed: m, P, a_k, the most
        stages n_k, and the sends beside each change of class (Σ c_i/a_i and Σ c_i); None where some
        a_k ≤ 0."""
        # the entry keeps its family alive: no id is reused
        key = (
            id(family),
            replicas,
            max_stages,
        )
        if key not in self._buckets or self._buckets[key][0] is not family:
            m = family.total_micro_batches // replicas
            cap = min(max_stages, self.inst.model.layers, m)
            rc = least_work(family.recompute_options)
            per_layer = [
                self.templates.per_layer_s(dc.gpu, tp, family.micro_batch, rc, family.cp)
                for dc, tp in zip(family.classes, family.tps, strict=True)
            ]
            if min(per_layer) <= 0:
                self._buckets[key] = (family, None)
                return None
            most = [
                min(cap, dc.gpus // (w * replicas))
                for dc, w in zip(family.classes, family.widths, strict=True)
            ]
            # every configuration has a stage on each side of each change of class, paying a send
            # over NICs
            sends = self._side_sends(
                family.classes, family.tps, family.micro_batch, per_layer, replicas, family.cp
            )
            self._buckets[key] = (
                family,
                (m, cap, per_layer, most, sum(c / a for a, c in sends), sum(c for _, c in sends)),
            )
        return self._buckets[key][1]


def _most_rate(classes: list[tuple[float, int, int]], cap: int) -> float:
    """The most Σ_k n_k/a_k over stage counts least_k ≤ n_k ≤ most_k with Σ n_k ≤ cap, `classes` =
    (a_k, least_k, most_k) (feasible): the least counts, then the free stages to the smallest a_k
    first."""
    left = cap - sum(lo for _, lo, _ in classes)
    rate = sum(lo / a for a, lo, _ in classes)
    for a, lo, hi in sorted(classes):
        k = min(hi - lo, left)
        rate += k / a
        left -= k
    return rate

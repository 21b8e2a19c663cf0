"""The bound of one skeleton, the search tree's leaf: every template's drained pipeline, the
templates' exchange and the optimizer step; with shards, or a uniform layout's templates in
lockstep, their own."""

from __future__ import annotations

from dataclasses import replace

from hetopt.search.bounds.lines import (
    integer_level,
    lockstep_level,
    sum_bound,
)
from hetopt.search.bounds.templates import TemplateBounds
from hetopt.search.types import Skeleton


class SkeletonBounds:
    """The skeletons' bounds, memoised on this object (one search run's)."""

    def __init__(self, templates: TemplateBounds) -> None:
        self.templates, self.sends, self.memory = templates, templates.sends, templates.memory
        self.inst, self.profiles = templates.inst, templates.profiles

    def bound(self, sk: Skeleton) -> float:
        """A bound no split of this skeleton that fits in memory beats: the iteration waits for
        every template's pipeline (and gradient reduction), then two templates' exchange
        (`exchange_s`), then for the optimizer step (`optimizer_bound`); with shards
        `shard_bound`."""
        if sk.shards:
            return self.shard_bound(sk)
        if sk.lockstep:
            return self.lockstep_bound(sk)
        replicas_total = sum(t.replicas for t in sk.templates)
        grouped = sk.order != "megatron"  # each TP group inside a node (Megatron's order may cut)
        # the placement order is the skeleton's: its sends or its rings share NICs
        packing = self.packing(sk)
        packed = packing[1] if packing else ()  # its templates take runs of these classes' nodes
        # per-stage recompute: compute at the least-work mode, memory at the most any mode holds,
        # and the all-reduce's overlap with stage 0's backward pass at the most-work mode — each the
        # side no mix of modes can beat
        return (
            max(
                self.templates.drained_bound(
                    sk.micro_batch,
                    sk.recompute,
                    t,
                    replicas_total,
                    sk.virtual_stages,
                    sk.zero,
                    sk.memory_modes,
                    packing=packing,
                )
                for t in sk.templates
            )
            + max(self.templates.optimizer_bound(t, replicas_total, sk.zero) for t in sk.templates)
            + self.sends.ring_exchange_s(
                tuple(t.segments for t in sk.templates),
                tuple(
                    self.sends.template_nodes(t.segments, t.replicas, grouped, packed)
                    for t in sk.templates
                ),
                grouped,
                tuple(t.replicas for t in sk.templates),
            )
        )

    def packing(self, sk: Skeleton) -> tuple | None:
        """(order, packed classes) of a skeleton placed in the replica or the stage order
        (`TemplateBounds.drained_bound`'s `packing`); None in Megatron's."""
        if sk.order not in ("replica", "stage"):
            return None
        packed = self.sends.packed(tuple(t.segments for t in sk.templates))
        return (sk.order, packed) if packed else None

    def shard_bound(self, sk: Skeleton) -> float:
        """A skeleton with shards (hetopt.search.shards): a stage's τ(L) is at least each of its
        ranks' compute line at its sequences (`stage_line`), so at least the steepest one's; T ≥ (m
        − 1)·λ + S with λ the integer water level of those lines and S their least Σ τ
        (`template_bound`'s)."""
        t = sk.templates[0]
        p, lines = t.depth, []
        for i, (seg, shards) in enumerate(zip(t.stage_list(), sk.shards, strict=True)):
            ranks = shards or ((seg.gpu, seg.island, 1, sk.micro_batch),)
            lines.append(
                max(
                    self.templates.stage_line(g, seg.tp, q, sk.recompute, i == 0, i == p - 1)
                    for g, _, _, q in ranks
                )
            )
        layers = self.inst.model.layers
        return (t.micro_batches - 1) * integer_level(lines, layers) + sum_bound(
            [(a, c, 1) for a, c in lines], layers
        )

    def lockstep_bound(self, sk: Skeleton) -> float:
        """A uniform layout's templates in lockstep (hetopt.search.uniform), one split for all:
        stage i takes at least τ_i(L) = max_j (a_ij·L + c_ij) over the templates' lines at position
        i (`stage_line`). The template j* of the slowest stage waits (m − 1) times for it and once
        for each of its stages, so T ≥ (m − 1)·λ + min_j S_j + T_opt, λ = min over splits of max_i
        τ_i (`lockstep_level`) and S_j the least Σ_i of template j's lines; and T is at least the
        templates' bound each at its own split."""
        t0 = sk.templates[0]
        p, layers = t0.depth, self.inst.model.layers
        lines = [
            [
                self.templates.stage_line(
                    seg.gpu, seg.tp, sk.micro_batch, sk.recompute, i == 0, i == p - 1
                )
                for i, seg in enumerate(t.stage_list())
            ]
            for t in sk.templates
        ]
        by_stage = [[t_lines[i] for t_lines in lines] for i in range(p)]
        total = min(sum_bound([(a, c, 1) for a, c in t_lines], layers) for t_lines in lines)
        replicas_total = sum(t.replicas for t in sk.templates)
        t_opt = max(
            self.templates.optimizer_bound(t, replicas_total, sk.zero) for t in sk.templates
        )
        together = (t0.micro_batches - 1) * lockstep_level(by_stage, layers) + total + t_opt
        return max(together, self.bound(replace(sk, lockstep=False)))

"""Stages with shards in the plan space: Metis's heterogeneous device groups (Um et al., ATC 2024).

A shard skeleton is one pipeline template of R identical replicas whose stages are served by groups
of data-parallel ranks that may mix GPU types (`Stage.shards`), laid out by Metis's rules of
proportion:
- a rank is tp GPUs of one device class inside one node (one TP degree for every rank); a replica
  takes
  1/R of every class's ranks (R divides every class's ranks and the M micro-batches);
- device groups: a replica's ranks, fastest class first, cut into p consecutive groups of about
  equal
  speed (`device_groups`), so a stage mixes the classes at its cut points and stages differ in
  data-parallel width;
- data load balancing: each micro-batch of b sequences is split among a stage's ranks in proportion
  to
  their speed, whole sequences, one at least (`split_sequences`).
Speeds are the cost model's: a rank's seconds per layer running the whole micro-batch
(`TemplateBounds.stage_line`), so the space follows the calibrated profiles it is searched with. The
integer program then chooses every stage's layers, as for any skeleton.

Searched with search.shards (default on), in 1F1B without context parallelism at ZeRO-1 (ZeRO-0
where search.zero holds 0 and not 1), one TP degree and recompute mode for the plan, over at most
search.max_classes device classes; `shard_zero` says when the options leave them no room. A layout
of single ranks is a one-template skeleton of the default space under the same options, and not
repeated.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

from hetopt.cost.profiles import Profiles
from hetopt.plan import Plan, Stage
from hetopt.search.bounds.run import Bounds
from hetopt.search.space import enumerate_recompute, tp_options, zero_stages
from hetopt.search.types import SearchOptions, SearchStats, Segment, Skeleton, Template
from hetopt.spec.instance import Instance

NO_SPLIT = (
    "shards: device groups whose ranks cannot split the micro-batch (fewer sequences than ranks)"
)
NO_SHARDS = "shards: device groups of single ranks (skeletons of the default space)"

ShardKey = tuple[str, str, int, int]
"""One shard of a stage: (GPU type, island, ranks, sequences per rank)."""


def device_groups(line: list, speed: dict, p: int) -> list[list]:
    """The ranks of `line` (fastest first) cut into p consecutive non-empty groups of about equal
    speed: group k ends at the cut nearest (k + 1)/p of the total speed (a rank joins while half of
    its speed still fits under that target), leaving a rank for each group after it."""
    total = sum(speed[c] for c in line)
    groups, at, run = [], 0, 0.0
    for k in range(p):
        end = at + 1
        run += speed[line[at]]
        target = total * (k + 1) / p
        while end < len(line) - (p - k - 1) and run + speed[line[end]] / 2 <= target:
            run += speed[line[end]]
            end += 1
        if k == p - 1:
            end = len(line)
        groups.append(line[at:end])
        at = end
    return groups


def split_sequences(counts: dict, speed: dict, b: int) -> dict | None:
    """Sequences per rank of each class of a stage (class → ranks), Σ ranks·q = b, q ≥ 1, in
    proportion to speed: start at one each and give the next ranks' worth to the class whose ranks
    would then finish first; None when b cannot be split so (fewer sequences than ranks, or a
    remainder no class takes)."""
    q = dict.fromkeys(counts, 1)
    left = b - sum(counts.values())
    if left < 0:
        return None
    while left:
        takers = [c for c in counts if counts[c] <= left]
        if not takers:
            return None
        c = min(takers, key=lambda c: (q[c] + 1) / speed[c])
        q[c] += 1
        left -= counts[c]
    return q


def replica_counts(ranks: dict, micro_batch_total: int) -> list[int]:
    """Replica counts R dividing every class's ranks and the micro-batches of an iteration."""
    top = min(ranks.values())
    return [
        r
        for r in range(1, top + 1)
        if all(n % r == 0 for n in ranks.values()) and micro_batch_total % r == 0
    ]


def stage_shards(
    line: list, per_layer: dict, b: int, p: int
) -> tuple[tuple[ShardKey, ...], ...] | None:
    """Each stage's shards for one replica's ranks `line` (class keys, fastest first) in p stages,
    the stage's own class first; None where a stage's ranks cannot split the micro-batch of b
    sequences."""
    speed = {c: 1.0 / a for c, a in per_layer.items()}
    out = []
    for group in device_groups(line, speed, p):
        counts = Counter(group)  # ranks per class, fastest class first
        q = split_sequences(counts, speed, b)
        if q is None:
            return None
        out.append(tuple((c[0], c[1], n, q[c]) for c, n in counts.items()))
    return tuple(out)


def shard_skeleton(
    stages: tuple[tuple[ShardKey, ...], ...],
    tp: int,
    recompute: str,
    b: int,
    replicas: int,
    micro_batches: int,
    zero: int = 1,
) -> Skeleton:
    """The skeleton of a device-group layout: one segment per stage (its first shard's class), each
    stage of more than one rank with its shards (no shards at all where every stage is one rank)."""
    segments = tuple(Segment(shards[0][0], shards[0][1], tp, 1) for shards in stages)
    kept = tuple(shards if ranks_in(shards) > 1 else () for shards in stages)
    return Skeleton(
        b,
        recompute,
        (Template(segments, replicas, micro_batches),),
        zero=zero,
        shards=kept if any(kept) else (),
    )


def ranks_in(shards: tuple[ShardKey, ...]) -> int:
    """Data-parallel ranks of a stage in one replica."""
    return sum(n for _, _, n, _ in shards)


def shard_zero(opts: SearchOptions) -> int | None:
    """The ZeRO stage of the space's stages with shards — the lowest searched of 0 and 1 (ZeRO-2/3
    are not tabulated for them) — or None where the options leave them no room: search.shards off,
    no ZeRO-0/1, context parallelism or interleaving required (their stages run 1F1B without CP)."""
    zero = [z for z in zero_stages(opts) if z <= 1]
    if not opts.shards or not zero or 1 not in opts.cp or 1 not in opts.virtual_stages:
        return None
    return zero[0]


Layout = tuple[int, int, str, int, int, tuple[tuple[ShardKey, ...], ...]]
"""(micro-batch b, TP, recompute mode, replicas R, stages p, each stage's shards)."""


class Layouts:
    """The device-group layouts of an instance: the rank speeds (cost model) and the ranks per
    class."""

    def __init__(
        self, inst: Instance, opts: SearchOptions, profiles: Profiles | None = None
    ) -> None:
        self.inst, self.opts = inst, opts
        self.bounds = Bounds(inst, profiles or Profiles())
        self._per_layer: dict = {}

    def usable(self, tp: int) -> dict:
        """Class key → ranks of tp GPUs inside one node, for the classes whose TP options hold tp;
        {} where they are more than search.max_classes (a template spans every class of its
        line)."""
        inst = self.inst
        out = {}
        for dc in inst.cluster.device_classes.values():
            if tp in tp_options(inst, dc, self.opts) and (
                ranks := sum(n.gpus // tp for n in dc.nodes)
            ):
                out[dc.key] = ranks
        return out if len(out) <= self.opts.max_classes else {}

    def per_layer(self, tp: int, b: int, recompute: str) -> dict:
        """Class key → seconds per layer of one rank running the whole micro-batch (a middle
        stage)."""
        key = (tp, b, recompute)
        if key not in self._per_layer:
            self._per_layer[key] = {
                c: self.bounds.templates.stage_line(c[0], tp, b, recompute, False, False)[0]
                for c in self.usable(tp)
            }
        return self._per_layer[key]

    def line(self, tp: int, b: int, recompute: str, replicas: int) -> list:
        """One replica's ranks, fastest class first (ties by class key)."""
        ranks, per_layer = self.usable(tp), self.per_layer(tp, b, recompute)
        order = sorted(ranks, key=lambda c: (per_layer[c], c))
        return [c for c in order for _ in range(ranks[c] // replicas)]

    def depths(self, line: list, micro_batches: int) -> range:
        """The stage counts p of a replica's ranks `line`: one rank per stage at least, at most
        max_stages, the layers and the m micro-batches of a replica."""
        return range(
            1, min(self.opts.max_stages, self.inst.model.layers, len(line), micro_batches) + 1
        )

    def stages(
        self, tp: int, b: int, recompute: str, replicas: int, p: int
    ) -> tuple[tuple[ShardKey, ...], ...] | None:
        """`stage_shards` of the layout (tp, b, recompute, R, p)."""
        return stage_shards(
            self.line(tp, b, recompute, replicas), self.per_layer(tp, b, recompute), b, p
        )

    def layouts(self, stats: SearchStats | None = None) -> Iterator[Layout]:
        """Every layout whose ranks split the micro-batch (those that cannot counted as pruned),
        with or without a stage of several ranks; none where `shard_zero` leaves no room."""
        inst, opts = self.inst, self.opts
        stats = stats if stats is not None else SearchStats()
        if shard_zero(opts) is None:
            return
        modes = enumerate_recompute(inst, opts)  # its symmetry is counted with the families
        for b in opts.micro_batch:
            total_mb = inst.micro_batches(b)
            if total_mb is None:
                continue
            for tp in opts.tp:
                ranks = self.usable(tp)
                if not ranks:
                    continue
                for rc in modes:
                    for r in replica_counts(ranks, total_mb):
                        line = self.line(tp, b, rc, r)
                        for p in self.depths(line, total_mb // r):
                            stages = stage_shards(line, self.per_layer(tp, b, rc), b, p)
                            if stages is None:
                                stats.pruned[NO_SPLIT] += 1
                            else:
                                yield b, tp, rc, r, p, stages

    def skeletons(self, stats: SearchStats | None = None) -> Iterator[Skeleton]:
        """Every shard skeleton of the space (module docstring), counted as enumerated; the layouts
        without a stage of several ranks (skeletons of the default space), or whose ranks cannot
        split a micro-batch, counted as pruned."""
        stats = stats if stats is not None else SearchStats()
        zero = shard_zero(self.opts)
        for b, tp, rc, r, _, stages in self.layouts(stats):
            if all(ranks_in(shards) == 1 for shards in stages):
                stats.pruned[NO_SHARDS] += 1
                continue
            stats.enumerated += 1
            yield shard_skeleton(stages, tp, rc, b, r, self.inst.micro_batches(b, r), zero)


def shard_point(
    inst: Instance, plan: Plan, opts: SearchOptions, profiles: Profiles | None = None
) -> str | None:
    """Why a plan whose stages have shards is not a shard skeleton's plan (None when it is one): one
    template, 1F1B, the ZeRO stage `shard_zero`, sequence parallel, no context parallelism, one TP
    degree and recompute mode of the options, and its stages exactly the device groups of its layout
    (module docstring)."""
    stages = [st for pipe in plan.pipelines for st in pipe.stages]
    tps, modes = {st.tp for st in stages}, {st.recompute for st in stages}
    zero = shard_zero(opts)
    if zero is None:
        return (
            "search.shards is off"
            if not opts.shards
            else "search.zero, cp or virtual_stages leave no room for them (ZeRO-0/1, CP 1 and "
            "1F1B needed)"
        )
    if not _shard_shaped(plan, stages, zero) or len(tps) != 1 or len(modes) != 1:
        return (
            f"the space's stages with shards: one template, 1F1B, ZeRO-{zero}, sequence "
            "parallel, no context parallelism, one TP degree and one recompute mode"
        )
    (tp,), (rc,) = tps, modes
    return _layout_point(Layouts(inst, opts, profiles), plan, tp, rc)


def _shard_shaped(plan: Plan, stages: list[Stage], zero: int) -> bool:
    """Whether the plan runs as every shard skeleton does: one template in 1F1B at ZeRO `zero`,
    sequence parallel, without context parallelism."""
    return not (
        len(plan.pipelines) != 1
        or plan.schedule != "1f1b"
        or plan.virtual_stages != 1
        or plan.zero != zero
        or any(st.cp != 1 or not st.sp for st in stages)
    )


def _layout_point(layouts: Layouts, plan: Plan, tp: int, rc: str) -> str | None:
    """Why a one-template plan at TP `tp` and recompute `rc` is not a layout's skeleton: its
    options, replicas, depth or device groups (None when it is one)."""
    opts, pipe = layouts.opts, plan.pipelines[0]
    ranks = layouts.usable(tp)
    if (
        tp not in opts.tp
        or rc not in opts.recompute
        or plan.micro_batch not in opts.micro_batch
        or not ranks
    ):
        return (
            f"TP {tp}, recompute {rc} or micro-batch {plan.micro_batch} outside the options, or "
            "more device classes than search.max_classes"
        )
    if any(n % pipe.replicas for n in ranks.values()):
        return f"{pipe.replicas} replicas do not take 1/R of every class's ranks at TP {tp}"
    line = layouts.line(tp, plan.micro_batch, rc, pipe.replicas)
    if len(pipe.stages) not in layouts.depths(line, pipe.micro_batches):
        return (
            f"{len(pipe.stages)} stages (the space: at most max_stages, the layers, the "
            "micro-batches m and a replica's ranks)"
        )
    want = layouts.stages(tp, plan.micro_batch, rc, pipe.replicas, len(pipe.stages))
    have = tuple(
        tuple((sh.gpu, sh.island, sh.ranks, sh.sequences) for sh in st.ranks_of(plan.micro_batch))
        for st in pipe.stages
    )
    if want != have:
        return "its stages are not Metis's equal-speed device groups of its layout"
    return None

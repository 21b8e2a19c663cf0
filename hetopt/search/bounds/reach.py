"""What templates side by side can take below a level, and the least level at which they take all.

Two or three single-class templates j side by side, at replica counts R_j and shares m_j (Σ_j
R_j·m_j = M), take T ≥ D_j(m_j; R_j) + C_j for each j: D_j the template's `drained_bound` (its
pipeline, raised by what its stages' gradient all-reduce among R_j replicas cannot hide) and C_j
what follows every pipeline (the templates' exchange and the optimizer step). D_j rises with m_j
and with R_j, so below a level θ template j takes at most takes_j(R_j; θ) = R_j·cap_j(R_j; θ)
micro-batches (`TemplateReach.takes`), and no point of a box of replica counts lies below θ unless
the most Σ_j takes_j over the box's counts that fit on the classes the templates share reaches M
(`class_reach`). That most rises with θ: the least θ at which it reaches M bounds the whole box
(`least_level`). The throughput bounds count each replica's micro-batches only; this one counts the
all-reduce a replica cannot shed, which rises with the replicas: on a small model over many GPUs it
is most of an iteration.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from hetopt.search.bounds.lines import first_true
from hetopt.search.types import ORDERS, Template

PROBES = 16
"""The most probes `least_level` makes: bisection to within 2^-16 of the span it starts with, or
`TOLERANCE` relative, whichever comes first."""
TOLERANCE = 0.05
"""Relative: how close below the least level `least_level` stops. Each probe of a family prices
every side template's takes afresh (0.3 s a family on dual-02 at 1e-4, where the search then solved
no skeleton in 30 s); at 5% a probe falls short of the level by at most that. Chosen by hand on
seven stress instances at 30 s (1e-4, 5%, 15%: at 5% dual-02 and bigbatch-04 proven again, better
plans on cloud4-03 and wan2-00); the whole suite at 1e-4 and at 5% is in benchmarks/stress/after."""


class TemplateReach:
    """`takes` of single-class templates, memoised on this object (one search run's).

    Parameters: templates — the run's `TemplateBounds`."""

    def __init__(self, templates) -> None:
        self.templates = templates
        self._takes: dict[tuple, np.ndarray] = {}
        self._drained_of: dict[tuple, Callable[[int, int], float]] = {}

    def drained(
        self,
        micro_batch: int,
        recompute: str,
        memory: tuple[str, ...],
        side: tuple,
        zero: int,
        replicas: int,
        micro_batches: int,
        replicas_total: int,
        packed: tuple = (),
    ) -> float:
        """D(m; R): `drained_bound` of one template (its segments `side`, R replicas, m
        micro-batches each), memory caps in the modes `memory` at `replicas_total` replicas;
        `packed`: `drained_of`'s."""
        return self.drained_of(micro_batch, recompute, memory, side, zero, replicas_total, packed)(
            replicas, micro_batches
        )

    def drained_of(
        self,
        micro_batch: int,
        recompute: str,
        memory: tuple[str, ...],
        side: tuple,
        zero: int,
        replicas_total: int,
        packed: tuple = (),
    ) -> Callable[[int, int], float]:
        """`drained` of one template as a function of (R, m), memoised on (R, m) alone: the least
        levels ask for it a million times a minute, most of them asked before. `packed`: the
        classes the plans' templates pack (`SendBounds.packed` of every side): the least over the
        two placement orders of the bound in each (a plan has one order, its templates all in
        it)."""
        key = (micro_batch, recompute, memory, side, zero, replicas_total, packed)
        if key not in self._drained_of:
            known: dict[tuple[int, int], float] = {}
            bound = self.templates.drained_bound
            packings = [(order, packed) for order in ORDERS] if packed else [None]

            def at(replicas: int, micro_batches: int) -> float:
                value = known.get((replicas, micro_batches))
                if value is None:
                    template = Template(side, replicas, micro_batches)
                    value = min(
                        bound(
                            micro_batch,
                            recompute,
                            template,
                            replicas_total,
                            1,
                            zero,
                            memory,
                            True,
                            packing,
                        )
                        for packing in packings
                    )
                    known[(replicas, micro_batches)] = value
                return value

            self._drained_of[key] = at
        return self._drained_of[key]

    def takes(
        self,
        micro_batch: int,
        recompute: str,
        memory: tuple[str, ...],
        side: tuple,
        zero: int,
        total: int,
        top: int,
        level: float,
        memo: bool = True,
        packed: tuple = (),
    ) -> np.ndarray:
        """What one template can take below a level (the exchange among the templates taken off
        already): for R = 1 … top replicas, R·cap(R) with cap(R) the most micro-batches m ≥ p (its
        depth) whose `drained_bound` lies below the room `level` less the template's own optimizer
        step at M replicas (the least: it falls with the replicas; T ≥ D(m) + T_cross + T_opt and
        T_opt ≥ each template's), memory
        caps at `total` (= M) replicas (the loosest any group has; looser caps only lower the bound
        of a single-class template, whose stages share one slope — not so in general:
        `pipeline_at` with stages of different slopes can rise as caps loosen), and at most M in
        all; −(M + 1) where no m does. `memo`: keep the answer (a bisection's probes are not kept:
        each is a level of its own). `packed`: `drained_of`'s.

        D(m; R) rises with m (each pipeline piece is (m − 1)·Λ + Σ τ) and with R (stage 0's ring
        spans ⌈R/k⌉ nodes, `class_ring`; R flows share island links, `send_s`), so cap(R) falls with
        R: it is filled by halving [1, top], a run of equal ends being equal throughout."""
        key = (micro_batch, recompute, memory, side, zero, total, top, level, packed)
        if key in self._takes:
            return self._takes[key]
        depth = sum(seg.stages for seg in side)
        room = level - self.templates.optimizer_bound(Template(side, 1, 1), total, zero)
        drained = self.drained_of(micro_batch, recompute, memory, side, zero, total, packed)

        def below(r: int, m: int) -> bool:
            return drained(r, m) < room

        def cap(r: int, lo: int, hi: int) -> int:
            """The most m in [lo, hi] below the level (lo − 1 where none), knowing it is at least lo
            − 1."""
            return lo + first_true(hi - lo + 1, lambda i: not below(r, lo + i)) - 1

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
        if memo:
            self._takes[key] = takes
        return takes

    def runs_reach(
        self,
        micro_batch: int,
        recompute_options: tuple[str, ...],
        stage_modes: tuple[str, ...],
        zero: int,
        total: int,
        runs: list[tuple[tuple[str, str], int, list[tuple[tuple, int]]]],
        threshold: float,
        memo: bool = True,
    ) -> int:
        """The most micro-batches templates side by side can take in all below `threshold` (the
        exchange among them taken off already), one template per run, whatever its side template
        and replica count: a run is (its class, the class's GPUs, its side templates as (segments,
        GPUs per replica)). Run j on g GPUs of its class takes at most the most of its side
        templates' `takes` over the replica counts whose GPUs are at most g (the best side at each
        g); the runs on one class share its GPUs (`classes_reach` over GPU counts); the most over
        the recompute modes (memory caps in `stage_modes` where given, per-stage recompute)."""
        keys = [key for key, _, _ in runs]
        gpus = {key: class_gpus for key, class_gpus, _ in runs}
        most = -1
        for rc in recompute_options:
            best = []
            for _, class_gpus, sides in runs:
                most_on = np.full(class_gpus, -(total + 1), dtype=np.int64)  # [g − 1]: on ≤ g GPUs
                for segments, width in sides:
                    top = class_gpus // width
                    if top < 1:
                        continue
                    takes = self.takes(
                        micro_batch,
                        rc,
                        stage_modes or (rc,),
                        segments,
                        zero,
                        total,
                        top,
                        threshold,
                        memo,
                    )
                    np.maximum.at(most_on, np.arange(1, top + 1) * width - 1, takes)
                best.append(np.maximum.accumulate(most_on))
            ones = [1] * len(runs)  # indexed by GPU counts: from 1 GPU, one GPU a step
            most = max(most, classes_reach(best, ones, ones, keys, gpus))
        return most


def least_level(reach: Callable[[float], int], total: int, low: float, high: float) -> float:
    """A lower bound on the least level θ at which `reach(θ)` (rising with θ) is at least `total`,
    knowing it is at least `low`: the largest probe whose reach falls short, by bisection on [low,
    high] (doubling from max(low, 1e-6) first where `high` is inf); inf where forty doublings
    reach short (no point takes the micro-batches: memory) — `high` where reach(high) falls
    short, so a caller keyed below its threshold learns that nothing of the box lies below it."""
    known = low  # the largest level known to fall short (or the caller's bound)
    if math.isinf(high):
        high = max(low, 1e-6)
        for _ in range(40):
            high *= 2
            if reach(high) >= total:
                break
            known = high
        else:
            return math.inf
    elif reach(high) < total:
        return high
    for _ in range(PROBES):
        if high - known <= TOLERANCE * high:
            break
        mid = 0.5 * (known + high)
        if reach(mid) < total:
            known = mid
        else:
            high = mid
    return known


def classes_reach(
    takes: list[np.ndarray],
    lowest: list[int],
    widths: list[int],
    keys: list[tuple[str, str]],
    gpus: dict[tuple[str, str], int],
) -> int:
    """Σ over the classes of the most the templates on each can take (`class_reach`): template j
    on class keys[j], its takes from lowest_j replicas of widths_j GPUs; gpus: each class's."""
    on: dict[tuple[str, str], list[int]] = {}
    for j, key in enumerate(keys):
        on.setdefault(key, []).append(j)
    return sum(
        class_reach([takes[j] for j in js], [lowest[j] for j in js], [widths[j] for j in js], g)
        for key, js in on.items()
        for g in (gpus[key],)
    )


def class_reach(takes: list[np.ndarray], lowest: list[int], widths: list[int], gpus: int) -> int:
    """The most Σ_j takes_j[R_j − lowest_j] of the templates on one class whose R_j·g_j fit its G
    GPUs, exactly: one template its most; two the most over the pairs that fit; three the most over
    the third's counts of its takes plus the most of the pairs that fit in what is left (pairs by
    GPUs used, with a running most). −(2^40) where no counts fit."""
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

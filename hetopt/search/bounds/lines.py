"""Pure functions of stage lines: the least bottleneck and the least sum over integer layer splits.

A stage's time per micro-batch is bounded below by a line τ(L) ≥ a·L + c in its layers L (or by a
table of τ(L) where it is not affine). These functions take such lines (or tables), memory caps per
stage and the model's layers N, and return what no split can beat: the integer water level
λ = min over splits of max_i τ_i, the least Σ_i τ_i under a level, and a 1F1B pipeline's bound
T ≥ (m − 1)·Λ + Σ τ from both (`fill_and_drain`).
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import math
from collections.abc import Sequence

import numpy as np

Line = tuple[float, float]
"""(a, c): τ(L) ≥ a·L + c, seconds per micro-batch."""


def _positions(stages: int) -> list[tuple[int, int]]:
    """(position in the segment, count): its first stage, the middle ones as one run, its last
    stage."""
    if stages == 1:
        return [(0, 1)]
    if stages == 2:
        return [(0, 1), (1, 1)]
    return [(0, 1), (1, stages - 2), (stages - 1, 1)]


def segment_parts(start: int, stages: int, depth: int) -> list[tuple[bool, bool, int]]:
    """(first, last, count) runs of a segment's stages at positions start .. start + stages − 1."""
    parts: list[tuple[bool, bool, int]] = []
    for i in range(start, start + stages):
        key = (i == 0, i == depth - 1)
        if parts and parts[-1][:2] == key:
            parts[-1] = (*key, parts[-1][2] + 1)
        else:
            parts.append((*key, 1))
    return parts


def first_true(n: int, test) -> int:
    """The first i in 0 … n − 1 where a test that once true stays true holds (n where it never
    does)."""
    return bisect.bisect_left(range(n), True, key=test)


def sum_bound(weighted: list[tuple[float, float, int]], layers: int) -> float:
    """S = g(∞): the least Σ_i (a_i·L_i + c_i) over splits — one layer each, the rest on the
    cheapest a."""
    stages = sum(n for _, _, n in weighted)
    return sum(n * (a + c) for a, c, n in weighted) + min(a for a, _, _ in weighted) * (
        layers - stages
    )


def integer_level(lines: list[Line], layers: int, caps: list[int] | None = None) -> float:
    """min over integer splits (1 ≤ L_i ≤ caps_i, Σ L_i = layers) of max_i (a_i·L_i + c_i)
    (`least_level`); inf when no split fits the caps."""
    return least_level(lambda i, n: lines[i][0] * n + lines[i][1], len(lines), layers, caps)


def lockstep_level(by_stage: list[list[Line]], layers: int) -> float:
    """min over integer splits (L_i ≥ 1, Σ L_i = layers) of max_i max_j (a_ij·L_i + c_ij): stages
    whose time is the largest of several lines, one per template in lockstep (`least_level`)."""
    return least_level(lambda i, n: max(a * n + c for a, c in by_stage[i]), len(by_stage), layers)


def least_level(tau, stages: int, layers: int, caps: list[int] | None = None) -> float:
    """min over integer splits (1 ≤ L_i ≤ caps_i, Σ L_i = layers) of max_i tau(i, L_i) for tau
    increasing in L: give each next layer to the stage it leaves lowest among those below their cap
    (greedy is exact for a min-max of increasing functions); inf when no split fits the caps."""
    if caps is not None and (min(caps) < 1 or sum(caps) < layers):
        return math.inf
    counts = [1] * stages
    level = max(tau(i, 1) for i in range(stages))
    heap = [(tau(i, 2), i) for i in range(stages) if caps is None or caps[i] > 1]
    heapq.heapify(heap)
    for _ in range(layers - stages):
        t, i = heapq.heappop(heap)
        counts[i] += 1
        level = max(level, t)
        if caps is None or counts[i] < caps[i]:
            heapq.heappush(heap, (tau(i, counts[i] + 1), i))
    return level


def cheapest_sum(
    lines: list[Line],
    layers: int,
    level: float,
    caps: Sequence[int] | None = None,
    order: Sequence[int] | None = None,
) -> float:
    """g(Λ): the least Σ_i (a_i·L_i + c_i) with every a_i·L_i + c_i ≤ Λ and L_i ≤ caps_i (level caps
    rounded up a hair, which only lowers g: the bound stays valid); one layer per stage, the rest on
    the cheapest stages first (`order`: the stages by their lines, where the caller has it)."""
    total = sum(a + c for a, c in lines)
    left = layers - len(lines)
    if order is None:
        order = sorted(range(len(lines)), key=lambda i: lines[i])
    for i in order:
        if left <= 0:
            break
        a, c = lines[i]
        cap = max(1, math.floor((level - c) / a + 1e-9)) if math.isfinite(level) else layers
        if caps is not None:
            cap = min(cap, caps[i])
        k = min(cap - 1, left)
        total += k * a
        left -= k
    return total if left <= 0 else math.inf


def water_level(weighted: list[tuple[float, float, int]], layers: int, depth: int) -> float:
    """Smallest λ with Σ max(1, (λ − c_i)/a_i) ≥ layers over the stages (lines a, c with
    multiplicities): the best possible max_i(a_i·L_i + c_i) over real splits with L_i ≥ 1. Lines
    join the water level in order of their one-layer time a + c."""
    order = sorted(weighted, key=lambda w: w[0] + w[1])
    inv = c_over_a = 0.0
    active = 0
    lam = order[0][0] + order[0][1]
    for k, (a, c, n) in enumerate(order):
        inv += n / a
        c_over_a += n * c / a
        active += n
        lam = (layers - depth + active + c_over_a) / inv
        nxt = order[k + 1][0] + order[k + 1][1] if k + 1 < len(order) else math.inf
        if lam <= nxt:
            return max(lam, order[0][0] + order[0][1])
    return lam


def pipeline_at(lines, caps: Sequence[int], layers: int, micro_batches: int) -> float:
    """`TemplateBounds.pipeline_bound` for given stage lines and memory caps (inf where no split
    fits)."""
    return Pipeline(lines, caps, layers).at(micro_batches)


class Pipeline:
    """`pipeline_at` of fixed stage lines and caps at any number of micro-batches: λ, g(λ) and S =
    g(∞) do not depend on m, so they are found once (the least levels price one template at many
    m); each m then costs one evaluation of g."""

    def __init__(self, lines, caps: Sequence[int], layers: int) -> None:
        self.lines, self.caps, self.layers = list(lines), caps, layers
        self.order = sorted(range(len(self.lines)), key=lambda i: self.lines[i])
        self.level = integer_level(self.lines, layers, list(caps))
        if math.isfinite(self.level):
            self.least_sum, self.at_level = self.g(math.inf), self.g(self.level)

    def g(self, level: float) -> float:
        return cheapest_sum(self.lines, self.layers, level, self.caps, self.order)

    def at(self, micro_batches: int) -> float:
        """`fill_and_drain` at m micro-batches (inf where no split fits in memory)."""
        if not math.isfinite(self.level):
            return math.inf
        m, s = micro_batches, self.least_sum
        if m <= 1:
            return max(self.level, s)
        delta = (self.at_level - s) / (m - 1)
        return (m - 1) * self.level + self.g(self.level + delta)


def fill_and_drain(level: float, g, micro_batches: int) -> float:
    """T ≥ (m − 1)·Λ + Σ τ over splits, Λ = max τ ≥ `level` (λ) and Σ τ ≥ g(Λ), g falling to S =
    g(∞): for Λ ≥ λ + Δ, Δ = (g(λ) − S)/(m − 1), T ≥ (m − 1)·λ + g(λ); below it T ≥ (m − 1)·λ + g(λ
    + Δ) — the smaller, two evaluations of g (`TemplateBounds.pipeline_bound`)."""
    m, s = micro_batches, g(math.inf)
    if m <= 1:
        return max(level, s)
    delta = (g(level) - s) / (m - 1)
    return (m - 1) * level + g(level + delta)


def stage_tables(pr, caps: list[int]) -> list[list[float]]:
    """Per-stage recompute and stages with shards: τ_i(L) for L = v, 2v, … ≤ caps_i (v chunks per
    stage; 1 in 1F1B; with shards the stage's passes and sends from its rows,
    `SplitProblem.pass_s`), at most the least over the modes in which stage i holds L layers of its
    passes and send, as the evaluator prices them; caps_i is the most any mode holds, so every entry
    is finite. A pass need not rise with L (under ZeRO-2/3 its exposed collectives min(P, K)/(L + e)
    fall), so each entry is the least over L' ≥ L: a rising lower bound, as `tabled_pipeline`
    needs."""
    v, tables = pr.virtual_stages, []
    for i in range(pr.depth):
        best = [math.inf] * (caps[i] // v)
        for n, r in pr.options(i, caps[i]):
            best[n // v - 1] = min(
                best[n // v - 1], pr.pass_s(i, n, "f", r) + pr.pass_s(i, n, "b", r) + pr.p2p[i]
            )
        for k in range(len(best) - 2, -1, -1):  # the least over L' ≥ L: rising
            best[k] = min(best[k], best[k + 1])
        tables.append(best)
    return tables


def tabled_pipeline(tables: list[list[float]], layers: int, micro_batches: int) -> float:
    """`pipeline_at` for stages whose times are tables τ_i(L), rising in L: the same bound
    (`fill_and_drain`), with λ the min-max over integer splits (greedy, exact for rising functions)
    and g(Λ) ≤ the least Σ τ_i with every τ_i ≤ Λ — one layer per stage, then the smallest steps
    τ_i(L + 1) − τ_i(L) of the prefixes under Λ, taken in any order (a relaxation: the steps need
    not rise); inf where no split fits."""
    p = len(tables)
    if any(not t or not math.isfinite(t[0]) for t in tables) or sum(map(len, tables)) < layers:
        return math.inf
    counts, level = [1] * p, max(t[0] for t in tables)
    heap = [(t[1], i) for i, t in enumerate(tables) if len(t) > 1]
    heapq.heapify(heap)
    for _ in range(layers - p):
        if not heap or not math.isfinite(heap[0][0]):
            return math.inf
        t, i = heapq.heappop(heap)
        counts[i] += 1
        level = max(level, t)
        if counts[i] < len(tables[i]):
            heapq.heappush(heap, (tables[i][counts[i]], i))

    def g(cap: float) -> float:
        steps = sorted(
            b - a for t in tables for a, b in itertools.pairwise(t) if b <= cap * (1 + 1e-12)
        )
        if len(steps) < layers - p:
            return math.inf
        return sum(t[0] for t in tables) + sum(steps[: layers - p])

    return fill_and_drain(level, g, micro_batches)


def drained_pipeline(
    lines: list[Line],
    caps: Sequence[int],
    layers: int,
    micro_batches: int,
    drain,
    virtual_stages: int = 1,
) -> float:
    """T ≥ min over L_0 of [(m − 1)·max(τ_0(L_0), λ_rest(N − L_0)) + τ_0(L_0) + S_rest(N − L_0) +
    max(0, drain(L_0))]: the pipeline with stage 0 holding L_0 layers (the rest split at best:
    λ_rest its integer water level, S_rest its least Σ τ, both within the caps), then stage 0's
    gradient all-reduce, which ends `drain(L_0)` after the pipeline (dp_finish: stage 0's last
    backward ends the pipeline). Interleaved with v chunks the pipeline is m·max τ + (Σ τ − max
    τ)/v: (m − 1/v)·max + (τ_0 + S_rest)/v. One greedy pass gives λ_rest and S_rest at every N −
    L_0; inf when no split fits the caps."""
    return DrainedPipeline(lines, caps, layers, drain).at(micro_batches, virtual_stages)


class DrainedPipeline:
    """`drained_pipeline` of fixed stage lines, caps and drain at any m and v: per L_0 the terms
    τ_0(L_0), λ_rest, S_rest and max(0, drain(L_0)) do not depend on m, so they are tabled once and
    each m is one pass over the table."""

    def __init__(self, lines: list[Line], caps: Sequence[int], layers: int, drain) -> None:
        p = len(lines)
        a0, c0 = lines[0]
        self.single: float | None = None  # one stage: (τ_0(N), drain) with no bubble to divide
        self.t0 = self.levels = self.sums = self.drains = np.zeros(0)
        if p == 1:
            if caps[0] >= layers:
                self.single = a0 * layers + c0
                self.drains = np.array([max(0.0, drain(layers))])
            return
        rest, rest_caps = lines[1:], caps[1:]
        if min(rest_caps) < 1 or caps[0] < 1:
            return
        # λ_rest(n) and S_rest(n) for n = p − 1 … min(Σ caps, layers − 1), by one greedy pass each
        counts = [1] * len(rest)
        level = max(a + c for a, c in rest)
        levels, sums = [level], [sum(a + c for a, c in rest)]
        heap = [(2 * a + c, i) for i, (a, c) in enumerate(rest) if rest_caps[i] > 1]
        heapq.heapify(heap)
        slots = sorted(
            a
            for (a, _), cap in zip(rest, rest_caps, strict=True)
            for _ in range(min(cap, layers) - 1)
        )
        top = min(sum(min(cap, layers) for cap in rest_caps), layers - 1)
        for k in range(top - len(rest)):
            t, i = heapq.heappop(heap)
            counts[i] += 1
            level = max(level, t)
            a, c = rest[i]
            if counts[i] < rest_caps[i]:
                heapq.heappush(heap, ((counts[i] + 1) * a + c, i))
            levels.append(level)
            sums.append(sums[-1] + slots[k])
        firsts = range(max(1, layers - top), min(caps[0], layers - len(rest)) + 1)
        ks = [layers - l0 - len(rest) for l0 in firsts]
        self.t0 = np.array([a0 * l0 + c0 for l0 in firsts])
        self.levels = np.array([levels[k] for k in ks])
        self.sums = np.array([sums[k] for k in ks])
        self.drains = np.array([max(0.0, drain(l0)) for l0 in firsts])

    def at(self, micro_batches: int, virtual_stages: int = 1) -> float:
        m, v = micro_batches, virtual_stages
        if self.single is not None:
            return m * self.single + float(self.drains[0])
        if not len(self.t0):
            return math.inf
        terms = (
            (m - 1 / v) * np.maximum(self.t0, self.levels) + (self.t0 + self.sums) / v + self.drains
        )
        return float(terms.min())


def least_drain(own: list[np.ndarray], chain: list[np.ndarray], layers: int) -> float:
    """The least E ≥ 0 such that some split of `layers` (stage i at 1 … len(own[i]) layers) keeps
    every stage's drain e_i(L_i) − Σ_{k<i} c_k(L_k) ≤ E: `own[i][L − 1]` = e_i(L), `chain[k][L − 1]`
    = c_k(L) ≥ 0 (a lower bound: the bisection's lower end, which fails).

    A greedy pass from stage 0 gives each stage the most layers whose drain is ≤ E. If some split
    keeps every drain ≤ E, the greedy pass holds at least as many layers at every stage (by
    induction: it has waited at least as long, c made to rise with L by its running maximum, which
    only lowers the bound), so it reaches `layers`; where it does not, E is too small. The largest
    L with e(L) ≤ x is the largest with min_{L' ≥ L} e(L') ≤ x, nondecreasing in L: one
    searchsorted per stage, for many levels at once."""
    if not own or min(len(e) for e in own) < 1 or sum(len(e) for e in own) < layers:
        return 0.0
    own = [np.minimum.accumulate(np.asarray(e, dtype=float)[::-1])[::-1] for e in own]
    chain = [np.maximum.accumulate(np.maximum(np.asarray(c, dtype=float), 0.0)) for c in chain]

    def fits(levels: np.ndarray) -> np.ndarray:
        waited, held = np.zeros_like(levels), np.zeros(levels.shape, dtype=int)
        ok = np.ones(levels.shape, dtype=bool)
        for e, c in zip(own, chain, strict=True):
            n = np.searchsorted(e, levels + waited, side="right")
            ok &= n >= 1
            n = np.maximum(n, 1)
            held += n
            waited += c[n - 1]
        return ok & (held >= layers)

    if fits(np.zeros(1))[0]:
        return 0.0
    # at the most e every stage takes all it can hold, and that is `layers` at least
    low, high = 0.0, max(float(e[-1]) for e in own)
    for _ in range(4):  # each round narrows [low, high] 64-fold
        levels = np.linspace(low, high, 65)
        first = int(np.argmax(fits(levels)))  # levels[-1] = high fits
        low, high = float(levels[max(first - 1, 0)]), float(levels[first])
        if first == 0:
            break
    return low

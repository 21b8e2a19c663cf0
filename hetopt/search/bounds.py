"""Lower bounds and memory tests that order and prune the search (DESIGN 4), each with its statement.

A bound holds for every skeleton in the set it keys (a family, a replica count, a group, a range of replica
counts, one skeleton): no split of any of them is faster. Bounds come from compute alone — every stage's
time per micro-batch τ_i(L) ≥ a_i·L + c_i (`Bounds.stage_line`: one of the two linear pieces of the
host/device overlap, TP over the fastest interconnect its GPU type has) — so they need no placement and
hold under every scenario (communication only adds time). Memory tests use the evaluator's own memory model,
affine in a stage's layers. Every bound has a brute-force test on sampled skeletons
(tests/test_bounds.py: bound ≤ the skeleton's true optimum, found by trying every split).

| bound                    | keys                         | statement                                          |
| ------------------------ | ---------------------------- | -------------------------------------------------- |
| `family_bound`           | a family (classes × TP)      | T ≥ M·N / Σ_k G_k/(t_k·a_k)                         |
| `bucket_bound`           | a family at R replicas       | T ≥ (M/R)·N / max Σ_k n_k/a_k                       |
| `group_bound`            | a one-template group         | T ≥ (m − 1)·λ* + S (real water level λ*)            |
| `throughput_bound`       | a two-template range         | T ≥ M / Σ_j R_j/λ_j                                 |
| `pair_bound`             | two templates at R_a, R_b    | M ≤ Σ_j R_j·((T − S_j)/λ_j + 1)                     |
| `compute_lower_bound`    | one skeleton                 | T ≥ max_j [(m_j − 1)·λ_j + g_j(λ_j + Δ_j)]          |

A `Bounds` belongs to one search run (one instance, one set of profiles): its caches live and die with it,
so no two runs ever share an entry.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from types import SimpleNamespace

from hetopt.cost.memory import GIB, stage_params
from hetopt.cost.profiles import Profiles
from hetopt.evaluate import BWD, BWD_TP, FWD, FWD_TP, host_device, stage_memory, stage_work
from hetopt.search.linear import Affine
from hetopt.search.space import Skeleton, least_work
from hetopt.spec.instance import Instance

Line = tuple[float, float]
"""(a, c): τ(L) ≥ a·L + c, seconds per micro-batch."""


@dataclass(frozen=True)
class ClassMemory:
    """GiB of a stage on one GPU type and TP degree, affine in its layers L: slope state + act·held (held:
    micro-batches in flight, p − i under 1F1B) and an intercept by position (embedding on the first stage,
    head and logits on the last, both on a single stage). Read off the evaluator's stage_memory."""

    state: float
    act: float
    mid: float
    first: float
    last: float
    solo: float

    def stage(self, i: int, p: int) -> Affine:
        c = self.solo if p == 1 else self.first if i == 0 else self.last if i == p - 1 else self.mid
        return Affine(self.state + self.act * (p - i), c)


class Bounds:
    """The bounds and memory tests of one search run over `inst` priced by `profiles` (module docstring).

    Parameters: inst — the instance; profiles — the calibrated weights the evaluator uses.
    Every method is memoised on this object only."""

    def __init__(self, inst: Instance, profiles: Profiles) -> None:
        self.inst, self.profiles = inst, profiles
        self._lines: dict[tuple, Line] = {}
        self._templates: dict[tuple, tuple[float, float]] = {}
        self._real_levels: dict[tuple, tuple[float, float]] = {}
        self._pipelines: dict[tuple, float] = {}
        self._fits: dict[tuple, bool] = {}
        self._memory: dict[tuple, ClassMemory] = {}

    # -- one stage ------------------------------------------------------------------------------------

    def stage_line(self, gpu_name: str, tp: int, micro_batch: int, recompute: str, first: bool,
                   last: bool) -> Line:
        """(a, c) with τ(L) ≥ a·L + c for one stage's compute: y ≥ d + s·h per pass, TP in device time
        over the fastest interconnect of any node with this GPU type (so it holds wherever the stage goes)."""
        key = (gpu_name, tp, micro_batch, recompute, first, last)
        if key not in self._lines:
            inst = self.inst
            gpu = inst.gpu_types[gpu_name]
            params = self.profiles.for_gpu(gpu, inst.spec.training.framework)
            w, s = params.w, params.launch_serial
            intra = max(
                (inst.cluster.route(n.name, n.name) for n in inst.cluster.nodes.values() if n.gpu == gpu_name),
                key=lambda r: (r.effective_gbps, -r.alpha_s))
            ends = []
            for n in (1, 2):
                work = stage_work(inst.model, gpu, micro_batch, inst.seq_len, tp, True,
                                  inst.spec.training.attention, recompute, n, first, last, intra)
                host, dev = host_device(work, w)
                ends.append(dev[FWD] + dev[FWD_TP] + s * host[FWD] + dev[BWD] + dev[BWD_TP] + s * host[BWD])
            self._lines[key] = (float(ends[1] - ends[0]), float(2 * ends[0] - ends[1]))
        return self._lines[key]

    def per_layer_s(self, gpu_name: str, tp: int, micro_batch: int, recompute: str) -> float:
        """a with τ(L) ≥ a·L for a middle stage: the line a·L + c with a positive intercept dropped, a
        negative one folded in (a·L + c ≥ (a + c)·L for L ≥ 1). First and last stages only add work."""
        a, c = self.stage_line(gpu_name, tp, micro_batch, recompute, False, False)
        return a + min(c, 0.0)

    # -- one template ---------------------------------------------------------------------------------

    def weighted_lines(self, micro_batch: int, recompute: str, segments: tuple) -> list[tuple[float, float, int]]:
        """(a, c, count): τ_i(L) ≥ a·L + c for `count` consecutive stages. Stages of a segment share one
        line, except the first and last (embedding, head): multiplicities keep deep pipelines cheap."""
        p = sum(seg.stages for seg in segments)
        weighted, position = [], 0
        for seg in segments:
            for first, last, count in segment_parts(position, seg.stages, p):
                weighted.append((*self.stage_line(seg.gpu, seg.tp, micro_batch, recompute, first, last), count))
            position += seg.stages
        return weighted

    def stage_lines(self, micro_batch: int, recompute: str, segments: tuple) -> list[Line]:
        """(a_i, c_i) of every stage, in order."""
        return [(a, c) for a, c, n in self.weighted_lines(micro_batch, recompute, segments) for _ in range(n)]

    def template_bound(self, micro_batch: int, recompute: str, segments: tuple) -> tuple[float, float]:
        """(λ, S): lower bounds on max τ and Σ τ of a template's stages over every split.

        Over integer splits max τ ≥ λ, the smallest max_i(a_i·L_i + c_i) (the integer water level), while
        Σ τ ≥ S = Σ (a_i + c_i) + min a · (layers − p). With m micro-batches T ≥ (m − 1)·max τ + Σ τ."""
        key = (micro_batch, recompute, segments)
        if key not in self._templates:
            weighted = self.weighted_lines(micro_batch, recompute, segments)
            lines = [(a, c) for a, c, n in weighted for _ in range(n)]
            layers = self.inst.model.layers
            self._templates[key] = (integer_level(lines, layers), sum_bound(weighted, layers))
        return self._templates[key]

    def pipeline_bound(self, micro_batch: int, recompute: str, segments: tuple, micro_batches: int) -> float:
        """T ≥ min over integer splits of (m − 1)·Λ + Σ τ, Λ = max τ, with τ_i ≥ a_i·L_i + c_i.

        Λ ≥ λ (the integer water level). For a given Λ the cheapest Σ τ is g(Λ): one layer per stage, the
        rest on the stages of smallest a_i up to what Λ lets them hold; g falls as Λ rises but never below
        S = g(∞). So for Λ ≥ λ + Δ with Δ = (g(λ) − S)/(m − 1) the bound is at least (m − 1)·λ + g(λ), and
        below that g(Λ) ≥ g(λ + Δ): T ≥ (m − 1)·λ + g(λ + Δ), which needs two evaluations of g."""
        key = (micro_batch, recompute, segments, micro_batches)
        if key not in self._pipelines:
            lam, s = self.template_bound(micro_batch, recompute, segments)
            m = micro_batches
            if m <= 1:
                self._pipelines[key] = max(lam, s)
            else:
                lines = self.stage_lines(micro_batch, recompute, segments)
                layers = self.inst.model.layers
                delta = (cheapest_sum(lines, layers, lam) - s) / (m - 1)
                self._pipelines[key] = (m - 1) * lam + cheapest_sum(lines, layers, lam + delta)
        return self._pipelines[key]

    # -- keys of the search's sets ------------------------------------------------------------------------

    def compute_lower_bound(self, sk: Skeleton) -> float:
        """A bound no split of this skeleton beats: the iteration waits for every template's pipeline."""
        return max(self.pipeline_bound(sk.micro_batch, sk.recompute, t.segments, t.micro_batches)
                   for t in sk.templates)

    def group_bound(self, micro_batch: int, recompute: str, segments: tuple, micro_batches: int) -> float:
        """A cheaper and weaker bound than `pipeline_bound`, for keying whole groups: (m − 1)·λ* + S with
        λ* the real-valued water level (at most the integer one), on lines with multiplicities."""
        key = (micro_batch, recompute, segments)
        if key not in self._real_levels:
            weighted = self.weighted_lines(micro_batch, recompute, segments)
            p = sum(seg.stages for seg in segments)
            layers = self.inst.model.layers
            self._real_levels[key] = (water_level(weighted, layers, p), sum_bound(weighted, layers))
        lam, s = self._real_levels[key]
        return (micro_batches - 1) * lam + s

    def pair_bound(self, micro_batch: int, recompute: str, segments: list, replicas: list[int],
                   total_micro_batches: int) -> float:
        """Templates side by side with replicas R_j and any shares Σ R_j·m_j = M: from
        T ≥ (m_j − 1)·λ_j + S_j, m_j ≤ (T − S_j)/λ_j + 1, so M ≤ Σ R_j·((T − S_j)/λ_j + 1)."""
        lines = [self.template_bound(micro_batch, recompute, seg) for seg in segments]
        num = total_micro_batches + sum(r * (s / lam - 1) for r, (lam, s) in zip(replicas, lines, strict=True))
        return num / sum(r / lam for r, (lam, _) in zip(replicas, lines, strict=True))

    def throughput_bound(self, micro_batch: int, recompute: str, segments: list, replicas: list[int],
                         total_micro_batches: int) -> float:
        """T ≥ m_j·λ_j for each template (S_j ≥ λ_j), so T ≥ M / Σ R_j/λ_j — falling with every R_j, so at
        the largest replica counts it bounds every smaller choice as well."""
        lines = [self.template_bound(micro_batch, recompute, seg) for seg in segments]
        return total_micro_batches / sum(r / lam for r, (lam, _) in zip(replicas, lines, strict=True))

    def family_bound(self, family) -> float:
        """Every skeleton of a family from throughput alone: a stage of class k at TP t_k takes τ ≥ a_k·L, so
        a replica's bottleneck is at least N / Σ_i 1/a_i and T ≥ m·max τ; with R·n_k·t_k ≤ G_k GPUs of each
        class, T ≥ M·N / Σ_k G_k/(t_k·a_k) — for one template across the classes and for two side by side."""
        rate = 0.0
        rc = least_work(family.recompute_options)
        for dc, tp in zip(family.classes, family.tps, strict=True):
            a = self.per_layer_s(dc.gpu, tp, family.micro_batch, rc)
            if a <= 0:
                return 0.0
            rate += dc.gpus / (tp * a)
        return family.total_micro_batches * self.inst.model.layers / rate

    def bucket_bound(self, family, replicas: int, max_stages: int) -> float:
        """`family_bound` at one replica count R: each replica has 1 ≤ n_k ≤ ⌊G_k/(t_k·R)⌋ stages of class
        k and at most P = min(max_stages, layers, M/R) in all, so max τ ≥ N / max Σ_k n_k/a_k (the extra
        stages go to the fastest classes first) and T ≥ (M/R)·max τ; inf when no replica fits at R."""
        m = family.total_micro_batches // replicas
        cap = min(max_stages, self.inst.model.layers, m)
        rc = least_work(family.recompute_options)
        classes = []
        for dc, tp in zip(family.classes, family.tps, strict=True):
            a = self.per_layer_s(dc.gpu, tp, family.micro_batch, rc)
            if a <= 0:
                return 0.0
            classes.append((a, min(cap, dc.gpus // (tp * replicas))))
        left = cap - len(classes)
        if left < 0 or min(u for _, u in classes) < 1:
            return math.inf  # no replica of this family fits at R: the bucket is empty
        rate = sum(1 / a for a, _ in classes)
        for a, u in sorted(classes):
            k = min(u - 1, left)
            rate += k / a
            left -= k
        return m * self.inst.model.layers / rate

    # -- memory ---------------------------------------------------------------------------------------

    def template_fits(self, micro_batch: int, recompute: str, segments: tuple, replicas_total: int) -> bool:
        """Whether a template's stages can hold the model at all: each stage at least one layer and together
        every layer, with ZeRO-1 sharding over `replicas_total` (more replicas only shrink memory)."""
        key = (micro_batch, recompute, segments, replicas_total)
        if key not in self._fits:
            self._fits[key] = self.max_layers_total(micro_batch, recompute, segments, replicas_total) \
                >= self.inst.model.layers
        return self._fits[key]

    def max_layers_total(self, micro_batch: int, recompute: str, segments: tuple, replicas_total: int) -> int:
        """Σ over the stages of the most layers each can hold (−1 when a stage cannot hold one)."""
        inst = self.inst
        p = sum(seg.stages for seg in segments)
        n_layers = inst.model.layers
        room, start = 0, 0
        for seg in segments:
            gpu = inst.gpu_types[seg.gpu]
            limit = gpu.usable_memory_gib - self.profiles.for_gpu(gpu).reserve_gib
            cm = self.class_memory(micro_batch, recompute, seg.gpu, seg.tp, replicas_total)
            for i in range(start, start + seg.stages):  # ClassMemory.stage, inlined: hot loop
                slope = cm.state + cm.act * (p - i)
                intercept = cm.solo if p == 1 else cm.first if i == 0 else cm.last if i == p - 1 else cm.mid
                if slope + intercept > limit:
                    return -1
                room += n_layers if slope <= 0 else min(n_layers, int((limit - intercept) / slope + 1e-9))
            start += seg.stages
        return room

    def class_memory(self, micro_batch: int, recompute: str, gpu: str, tp: int, replicas: int) -> ClassMemory:
        """The memory lines of a stage of `gpu` at TP `tp` (ZeRO-1 over `replicas`), read off the
        evaluator's stage_memory at 1 and 2 layers in a 4-stage and a 1-stage pipeline."""
        key = (micro_batch, recompute, gpu, tp, replicas)
        if key not in self._memory:
            inst = self.inst
            plan = SimpleNamespace(micro_batch=micro_batch, schedule="1f1b", virtual_stages=1, zero=1)

            def line(i: int, p: int) -> Affine:
                mem = []
                for n in (1, 2):
                    st = SimpleNamespace(layers=n, tp=tp, sp=True, recompute=recompute)
                    params = stage_params(inst.model, n, i == 0, i == p - 1, p)
                    mem.append(stage_memory(inst, plan, p, p, i, st, params, replicas) / GIB)
                return Affine(mem[1] - mem[0], 2 * mem[0] - mem[1])

            held3, held2 = line(1, 4), line(2, 4)  # middle stages of 4 hold 3 and 2 micro-batches
            act = held3.slope - held2.slope
            self._memory[key] = ClassMemory(held2.slope - 2 * act, act, held2.intercept, line(0, 4).intercept,
                                            line(3, 4).intercept, line(0, 1).intercept)
        return self._memory[key]


# -- pure functions of lines ----------------------------------------------------------------------------

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


def sum_bound(weighted: list[tuple[float, float, int]], layers: int) -> float:
    """S = g(∞): the least Σ_i (a_i·L_i + c_i) over splits — one layer each, the rest on the cheapest a."""
    stages = sum(n for _, _, n in weighted)
    return sum(n * (a + c) for a, c, n in weighted) + min(a for a, _, _ in weighted) * (layers - stages)


def integer_level(lines: list[Line], layers: int) -> float:
    """min over integer splits (L_i ≥ 1, Σ L_i = layers) of max_i (a_i·L_i + c_i): give each next layer to
    the stage it leaves lowest (greedy is exact for a min-max of increasing functions)."""
    counts = [1] * len(lines)
    level = max(a + c for a, c in lines)
    heap = [(2 * a + c, i) for i, (a, c) in enumerate(lines)]
    heapq.heapify(heap)
    for _ in range(layers - len(lines)):
        t, i = heapq.heappop(heap)
        counts[i] += 1
        level = max(level, t)
        a, c = lines[i]
        heapq.heappush(heap, ((counts[i] + 1) * a + c, i))
    return level


def cheapest_sum(lines: list[Line], layers: int, level: float) -> float:
    """g(Λ): the least Σ_i (a_i·L_i + c_i) with every a_i·L_i + c_i ≤ Λ (caps rounded up a hair, which
    only lowers g: the bound stays valid); one layer per stage, the rest on the cheapest stages first."""
    total = sum(a + c for a, c in lines)
    left = layers - len(lines)
    for a, c in sorted(lines):
        if left <= 0:
            break
        cap = max(1, math.floor((level - c) / a + 1e-9))
        k = min(cap - 1, left)
        total += k * a
        left -= k
    return total if left <= 0 else math.inf


def water_level(weighted: list[tuple[float, float, int]], layers: int, depth: int) -> float:
    """Smallest λ with Σ max(1, (λ − c_i)/a_i) ≥ layers over the stages (lines a, c with multiplicities):
    the best possible max_i(a_i·L_i + c_i) over real splits with L_i ≥ 1. Lines join the water level in
    order of their one-layer time a + c."""
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

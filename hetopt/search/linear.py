"""A skeleton's integer program data: the evaluator's own time and memory, as linear functions of layers.

For a fixed skeleton the placement (and with it every route) does not depend on how many layers each
stage holds, and every cost feature of a stage is affine in its layer count L (work per layer, plus the
embedding and head on the first and last stage; gradient bytes and parameters grow with L too). So the
evaluator's features at L = 1 and L = 2 give exact slopes and intercepts, priced with the calibrated
weights. Host and device time of a pass stay separate, since a pass takes max(h, d) + s·min(h, d), which
the formulations write with two epigraph inequalities: y ≥ h + s·d and y ≥ d + s·h.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, replace
from types import SimpleNamespace

import numpy as np

from hetopt.cost.memory import GIB, stage_params
from hetopt.cost.profiles import Profiles
from hetopt.evaluate import (
    BWD,
    BWD_TP,
    DP,
    FWD,
    FWD_TP,
    N_PARTS,
    OPT,
    P2P,
    cross_seconds,
    dp_finish,
    host_device,
    overlap_host_device,
    pipe_times,
    plan_features,
    stage_memory,
    stage_work,
)
from hetopt.search.space import Skeleton, least_work
from hetopt.spec.cluster import Cluster
from hetopt.spec.instance import Instance


@dataclass(frozen=True)
class Affine:
    slope: float
    intercept: float

    def at(self, layers: float) -> float:
        return self.slope * layers + self.intercept


@dataclass(frozen=True)
class SplitProblem:
    """Everything a formulation needs for one skeleton (seconds, GiB)."""

    layers: int
    micro_batches: int
    serial: tuple[float, ...]
    host_fwd: tuple[Affine, ...]
    dev_fwd: tuple[Affine, ...]
    host_bwd: tuple[Affine, ...]
    dev_bwd: tuple[Affine, ...]
    p2p: tuple[float, ...]
    dp: tuple[Affine, ...]
    dp_overlap: tuple[float, ...]
    opt: tuple[Affine, ...]
    mem_gib: tuple[Affine, ...]
    mem_limit_gib: tuple[float, ...]

    @property
    def depth(self) -> int:
        return len(self.p2p)

    def max_layers(self) -> list[int]:
        """The most layers each stage can hold in memory."""
        out = []
        for mem, limit in zip(self.mem_gib, self.mem_limit_gib, strict=True):
            if mem.slope <= 0:
                out.append(self.layers)
            else:
                out.append(int(np.floor((limit - mem.intercept) / mem.slope + 1e-9)))
        return out

    def scaled(self, k: float) -> SplitProblem:
        """The same problem with every time multiplied by k (memory untouched): another time unit."""
        def times(fs):
            return tuple(Affine(f.slope * k, f.intercept * k) for f in fs)
        return replace(self, host_fwd=times(self.host_fwd), dev_fwd=times(self.dev_fwd), host_bwd=times(self.host_bwd),
                       dev_bwd=times(self.dev_bwd), p2p=tuple(c * k for c in self.p2p), dp=times(self.dp),
                       opt=times(self.opt))

    def times(self, layers: list[int]) -> np.ndarray:
        """Priced parts (stages, N_PARTS) of this template for a split, as the evaluator prices them."""
        serial = np.array(self.serial)
        n = np.array(layers, dtype=float)

        def at(funcs: tuple[Affine, ...]) -> np.ndarray:
            return np.array([f.at(x) for f, x in zip(funcs, n, strict=True)])

        times = np.zeros((len(layers), N_PARTS))
        times[:, FWD] = overlap_host_device(at(self.host_fwd), at(self.dev_fwd), serial)
        times[:, BWD] = overlap_host_device(at(self.host_bwd), at(self.dev_bwd), serial)
        times[:, P2P] = self.p2p
        times[:, DP] = at(self.dp)
        times[:, OPT] = at(self.opt)
        return times


@dataclass(frozen=True)
class ScenarioProblem:
    """A skeleton's templates under one scenario. With several templates the iteration waits for the slowest
    pipeline, every template's gradient all-reduces, then their exchange (`cross_s`, split-independent)."""

    templates: tuple[SplitProblem, ...]
    cross_s: float = 0.0

    @property
    def layers(self) -> int:
        return self.templates[0].layers

    def split(self, layers: list[int]) -> list[list[int]]:
        out, start = [], 0
        for t in self.templates:
            out.append(list(layers[start:start + t.depth]))
            start += t.depth
        return out

    def iteration_time(self, layers: list[int]) -> float:
        """The evaluator's iteration time for a flat split (template after template), through the evaluator's
        own pipeline functions."""
        timed = [t.times(n) for t, n in zip(self.templates, self.split(layers), strict=True)]
        t_sync = max(float(pipe_times(times, t.micro_batches, 1)[0])
                     for t, times in zip(self.templates, timed, strict=True))
        t_dp = max(float(dp_finish(times, t_sync, np.array(t.dp_overlap)))
                   for t, times in zip(self.templates, timed, strict=True))
        return t_dp + self.cross_s + max(float(times[:, OPT].max()) for times in timed)

    def max_layers(self) -> list[int]:
        return [x for t in self.templates for x in t.max_layers()]

    def scaled(self, k: float) -> ScenarioProblem:
        return ScenarioProblem(tuple(t.scaled(k) for t in self.templates), self.cross_s * k)


@dataclass(frozen=True)
class PlanProblem:
    """One skeleton under every planning scenario, and how to combine the scenario times (robust.py)."""

    scenarios: tuple[ScenarioProblem, ...]
    probabilities: tuple[float, ...]
    objective: str = "stable"
    alpha: float = 0.8

    @property
    def base(self) -> ScenarioProblem:
        """Compute terms, memory and limits are the same in every scenario; only communication differs."""
        return self.scenarios[0]

    def scaled(self, k: float) -> PlanProblem:
        return replace(self, scenarios=tuple(sc.scaled(k) for sc in self.scenarios))

    def iteration_time(self, layers: list[int]) -> float:
        from hetopt.search.robust import aggregate

        return aggregate([sc.iteration_time(layers) for sc in self.scenarios], list(self.probabilities),
                         self.objective, self.alpha)


def _affine(v1: float, v2: float) -> Affine:
    return Affine(v2 - v1, 2 * v1 - v2)


def split_problem(inst: Instance, sk: Skeleton, profiles: Profiles, cluster: Cluster | None = None
                  ) -> ScenarioProblem:
    """Linearise the evaluator for one skeleton (under `cluster`'s link bandwidths, default the instance's);
    raises InfeasibleError when it cannot be placed."""
    plan1 = sk.placed([1] * sk.depth, inst.cluster)
    plan2 = sk.plan([2] * sk.depth).model_copy(update={"placement": plan1.placement})
    f1, f2 = plan_features(inst, plan1, cluster), plan_features(inst, plan2, cluster)
    templates = tuple(_template_problem(inst, f1, f2, j, t.micro_batches, profiles)
                      for j, t in enumerate(sk.templates))
    return ScenarioProblem(templates, cross_seconds(f1, profiles))


def _template_problem(inst: Instance, f1, f2, j: int, micro_batches: int, profiles: Profiles) -> SplitProblem:
    gpus = f1.gpus[j]
    params = [profiles.for_gpu(g, inst.spec.training.framework) for g in gpus]
    parts = []
    for f in (f1, f2):
        host, dev = host_device(f.templates[j], np.stack([p.w for p in params]))
        full = host + dev
        mem = [m / GIB + p.reserve_gib for m, p in zip(f.memory_bytes[j], params, strict=True)]
        parts.append((host, dev, full, mem))
    (h1, d1, x1, m1), (h2, d2, x2, m2) = parts
    n = len(gpus)
    return SplitProblem(
        layers=inst.model.layers, micro_batches=micro_batches,
        serial=tuple(p.launch_serial for p in params),
        host_fwd=tuple(_affine(h1[i, FWD], h2[i, FWD]) for i in range(n)),
        dev_fwd=tuple(_affine(d1[i, FWD] + d1[i, FWD_TP], d2[i, FWD] + d2[i, FWD_TP]) for i in range(n)),
        host_bwd=tuple(_affine(h1[i, BWD], h2[i, BWD]) for i in range(n)),
        dev_bwd=tuple(_affine(d1[i, BWD] + d1[i, BWD_TP], d2[i, BWD] + d2[i, BWD_TP]) for i in range(n)),
        p2p=tuple(float(x1[i, P2P]) for i in range(n)),
        dp=tuple(_affine(x1[i, DP], x2[i, DP]) for i in range(n)),
        dp_overlap=tuple(p.dp_overlap for p in params),
        opt=tuple(_affine(x1[i, OPT], x2[i, OPT]) for i in range(n)),
        mem_gib=tuple(_affine(m1[i], m2[i]) for i in range(n)),
        mem_limit_gib=tuple(g.usable_memory_gib for g in gpus),
    )


def group_bound(inst: Instance, profiles: Profiles, micro_batch: int, recompute: str, segments: tuple,
                micro_batches: int) -> float:
    """A cheaper and weaker bound than `pipeline_bound`, for keying whole groups: (m − 1)·λ* + S with λ*
    the real-valued water level (at most the integer one), computed on lines with multiplicities."""
    key = (id(inst), id(profiles), micro_batch, recompute, segments)
    if key not in _REAL_LEVELS:
        weighted = _weighted_lines(inst, profiles, micro_batch, recompute, segments)
        p = sum(seg.stages for seg in segments)
        _REAL_LEVELS[key] = (_water_level(weighted, inst.model.layers, p), _sum_bound(weighted, inst.model.layers))
    lam, s = _REAL_LEVELS[key]
    return (micro_batches - 1) * lam + s


_REAL_LEVELS: dict[tuple, tuple[float, float]] = {}


def compute_lower_bound(inst: Instance, sk: Skeleton, profiles: Profiles) -> float:
    """A bound no split of this skeleton beats, from compute alone (no placement needed, cached work): the
    iteration waits for every template's pipeline (`pipeline_bound`)."""
    return max(pipeline_bound(inst, profiles, sk.micro_batch, sk.recompute, t.segments, t.micro_batches)
               for t in sk.templates)


_PIPELINE_BOUNDS: dict[tuple, float] = {}


def pipeline_bound(inst: Instance, profiles: Profiles, micro_batch: int, recompute: str, segments: tuple,
                   micro_batches: int) -> float:
    """T ≥ min over integer splits of (m − 1)·Λ + Σ τ, Λ = max τ, with τ_i ≥ a_i·L_i + c_i.

    Λ ≥ λ (the integer water level, `template_bound`). For a given Λ the cheapest Σ τ is g(Λ): one layer
    per stage, the rest on the stages of smallest a_i up to what Λ lets them hold; g falls as Λ rises but
    never below S = g(∞). So for Λ ≥ λ + Δ with Δ = (g(λ) − S)/(m − 1) the bound is at least (m − 1)·λ +
    g(λ), and below that g(Λ) ≥ g(λ + Δ): T ≥ (m − 1)·λ + g(λ + Δ), which only needs two evaluations of g.
    """
    key = (id(inst), id(profiles), micro_batch, recompute, segments, micro_batches)
    if key not in _PIPELINE_BOUNDS:
        lam, s = template_bound(inst, profiles, micro_batch, recompute, segments)
        m = micro_batches
        if m <= 1:
            _PIPELINE_BOUNDS[key] = max(lam, s)
        else:
            lines = _stage_lines(inst, profiles, micro_batch, recompute, segments)
            delta = (_cheapest_sum(lines, inst.model.layers, lam) - s) / (m - 1)
            _PIPELINE_BOUNDS[key] = (m - 1) * lam + _cheapest_sum(lines, inst.model.layers, lam + delta)
    return _PIPELINE_BOUNDS[key]


def pair_bound(inst: Instance, profiles: Profiles, micro_batch: int, recompute: str, segments: list,
               replicas: list[int], total_micro_batches: int) -> float:
    """A bound for templates side by side with replicas R_j and any shares Σ R_j·m_j = M: from
    T ≥ (m_j − 1)·λ_j + S_j, m_j ≤ (T − S_j)/λ_j + 1, so M ≤ Σ R_j·((T − S_j)/λ_j + 1)."""
    lines = [template_bound(inst, profiles, micro_batch, recompute, seg) for seg in segments]
    num = total_micro_batches + sum(r * (s / lam - 1) for r, (lam, s) in zip(replicas, lines, strict=True))
    return num / sum(r / lam for r, (lam, _) in zip(replicas, lines, strict=True))


def throughput_bound(inst: Instance, profiles: Profiles, micro_batch: int, recompute: str, segments: list,
                     replicas: list[int], total_micro_batches: int) -> float:
    """T ≥ m_j·λ_j for each template (S_j ≥ λ_j), so T ≥ M / Σ R_j/λ_j — falling with every R_j, so at
    the largest replica counts it bounds every smaller choice as well."""
    lines = [template_bound(inst, profiles, micro_batch, recompute, seg) for seg in segments]
    return total_micro_batches / sum(r / lam for r, (lam, _) in zip(replicas, lines, strict=True))


def family_bound(inst: Instance, profiles: Profiles, family) -> float:
    """A bound on every skeleton of a family from throughput alone: a stage of class k at TP t_k takes
    τ ≥ a_k·L (a_k: its per-layer time, the intercept dropped when positive and folded into a_k when not),
    so a replica's bottleneck is at least N / Σ_i 1/a_i and T ≥ m·max τ; with R·n_k·t_k ≤ G_k GPUs of each
    class, T ≥ M·N / Σ_k G_k/(t_k·a_k) — for one template across the classes and for two side by side."""
    rate = 0.0
    for dc, tp in zip(family.classes, family.tps, strict=True):
        a = _per_layer_s(inst, profiles, family, dc, tp)
        if a <= 0:
            return 0.0
        rate += dc.gpus / (tp * a)
    return family.total_micro_batches * inst.model.layers / rate


def bucket_bound(inst: Instance, profiles: Profiles, family, replicas: int, max_stages: int) -> float:
    """`family_bound` at one replica count R: each replica has 1 ≤ n_k ≤ ⌊G_k/(t_k·R)⌋ stages of class k
    and at most P = min(max_stages, layers, M/R) in all, so max τ ≥ N / max Σ_k n_k/a_k (the extra stages
    go to the fastest classes first) and T ≥ (M/R)·max τ — whole GPUs, replicas and stages counted."""
    m = family.total_micro_batches // replicas
    cap = min(max_stages, inst.model.layers, m)
    classes = []
    for dc, tp in zip(family.classes, family.tps, strict=True):
        a = _per_layer_s(inst, profiles, family, dc, tp)
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
    return m * inst.model.layers / rate


def _per_layer_s(inst: Instance, profiles: Profiles, family, dc, tp: int) -> float:
    """a with τ(L) ≥ a·L for a middle stage of class `dc` at TP `tp` in the family's least-work recompute
    mode: the line a·L + c with a positive intercept dropped, a negative one folded in (a·L + c ≥ (a + c)·L
    for L ≥ 1). First and last stages only add work."""
    a, c = stage_line(inst, profiles, dc.gpu, tp, family.micro_batch, least_work(family.recompute_options),
                      False, False)
    return a + min(c, 0.0)


_BOUNDS: dict[tuple, tuple[float, float]] = {}


def template_bound(inst: Instance, profiles: Profiles, micro_batch: int, recompute: str, segments: tuple
                   ) -> tuple[float, float]:
    """(λ, S): lower bounds on max τ and Σ τ of a template's stages over every split.

    Each stage's τ_i(L) ≥ a_i·L + c_i (one of the two linear pieces of the host/device overlap, without
    communication). Over integer splits max τ ≥ λ, the smallest max_i(a_i·L_i + c_i) (the integer water
    level), while Σ τ ≥ S = Σ (a_i + c_i) + min a · (layers − p). With m micro-batches T ≥ (m − 1)·max τ + Σ τ.
    """
    key = (id(inst), id(profiles), micro_batch, recompute, segments)
    if key not in _BOUNDS:
        weighted = _weighted_lines(inst, profiles, micro_batch, recompute, segments)
        lines = [(a, c) for a, c, n in weighted for _ in range(n)]
        _BOUNDS[key] = (_integer_level(lines, inst.model.layers), _sum_bound(weighted, inst.model.layers))
    return _BOUNDS[key]


def _weighted_lines(inst: Instance, profiles: Profiles, micro_batch: int, recompute: str, segments: tuple
                    ) -> list[tuple[float, float, int]]:
    """(a, c, count): τ_i(L) ≥ a·L + c for `count` consecutive stages. Stages of a segment share one line,
    except the first and last stages (embedding, head): multiplicities keep deep pipelines cheap."""
    p = sum(seg.stages for seg in segments)
    weighted, position = [], 0
    for seg in segments:
        for first, last, count in _segment_parts(position, seg.stages, p):
            weighted.append((*stage_line(inst, profiles, seg.gpu, seg.tp, micro_batch, recompute, first, last),
                             count))
        position += seg.stages
    return weighted


def _stage_lines(inst: Instance, profiles: Profiles, micro_batch: int, recompute: str, segments: tuple
                 ) -> list[tuple[float, float]]:
    """(a_i, c_i) of every stage, in order."""
    return [(a, c) for a, c, n in _weighted_lines(inst, profiles, micro_batch, recompute, segments)
            for _ in range(n)]


def _sum_bound(weighted: list[tuple[float, float, int]], layers: int) -> float:
    """S = g(∞): the least Σ_i (a_i·L_i + c_i) over splits — one layer each, the rest on the cheapest a."""
    stages = sum(n for _, _, n in weighted)
    return sum(n * (a + c) for a, c, n in weighted) + min(a for a, _, _ in weighted) * (layers - stages)


def _integer_level(lines: list[tuple[float, float]], layers: int) -> float:
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


def _cheapest_sum(lines: list[tuple[float, float]], layers: int, level: float) -> float:
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


_FITS: dict[tuple, bool] = {}


def template_fits(inst: Instance, profiles: Profiles, micro_batch: int, recompute: str, segments: tuple,
                  replicas_total: int) -> bool:
    """Whether a template's stages can hold the model in memory at all: each stage at least one layer and
    together every layer, with ZeRO-1 sharding over `replicas_total` (more replicas only shrink memory).
    The evaluator's own memory model, which is affine in a stage's layers; no placement needed."""
    key = (id(inst), id(profiles), micro_batch, recompute, segments, replicas_total)
    if key not in _FITS:
        _FITS[key] = max_layers_total(inst, profiles, micro_batch, recompute, segments, replicas_total) \
            >= inst.model.layers
    return _FITS[key]


def max_layers_total(inst: Instance, profiles: Profiles, micro_batch: int, recompute: str, segments: tuple,
                     replicas_total: int) -> int:
    """Σ over the stages of the most layers each can hold (−1 when a stage cannot hold one)."""
    p = sum(seg.stages for seg in segments)
    n_layers = inst.model.layers
    room, start = 0, 0
    for seg in segments:
        gpu = inst.gpu_types[seg.gpu]
        limit = gpu.usable_memory_gib - profiles.for_gpu(gpu).reserve_gib
        cm = class_memory(inst, micro_batch, recompute, seg.gpu, seg.tp, replicas_total)
        for i in range(start, start + seg.stages):  # the stage's line (ClassMemory.stage, inlined: hot loop)
            slope = cm.state + cm.act * (p - i)
            intercept = cm.solo if p == 1 else cm.first if i == 0 else cm.last if i == p - 1 else cm.mid
            if slope + intercept > limit:
                return -1
            room += n_layers if slope <= 0 else min(n_layers, int((limit - intercept) / slope + 1e-9))
        start += seg.stages
    return room


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


_CLASS_MEMORY: dict[tuple, ClassMemory] = {}


def class_memory(inst: Instance, micro_batch: int, recompute: str, gpu: str, tp: int, replicas: int) -> ClassMemory:
    key = (id(inst), micro_batch, recompute, gpu, tp, replicas)
    if key not in _CLASS_MEMORY:
        plan = SimpleNamespace(micro_batch=micro_batch, schedule="1f1b", virtual_stages=1, zero=1)

        def line(i: int, p: int) -> Affine:
            mem = []
            for n in (1, 2):
                st = SimpleNamespace(layers=n, tp=tp, sp=True, recompute=recompute)
                params = stage_params(inst.model, n, i == 0, i == p - 1, p)
                mem.append(stage_memory(inst, plan, p, p, i, st, params, replicas) / GIB)
            return _affine(*mem)

        held3, held2 = line(1, 4), line(2, 4)  # middle stages of 4 hold 3 and 2 micro-batches
        act = held3.slope - held2.slope
        _CLASS_MEMORY[key] = ClassMemory(held2.slope - 2 * act, act, held2.intercept, line(0, 4).intercept,
                                         line(3, 4).intercept, line(0, 1).intercept)
    return _CLASS_MEMORY[key]


def _segment_parts(start: int, stages: int, depth: int) -> list[tuple[bool, bool, int]]:
    """(first, last, count) runs of a segment's stages at positions start .. start + stages − 1."""
    parts = []
    for i in range(start, start + stages):
        key = (i == 0, i == depth - 1)
        if parts and parts[-1][:2] == key:
            parts[-1] = (*key, parts[-1][2] + 1)
        else:
            parts.append((*key, 1))
    return parts


_LINES: dict[tuple, tuple[float, float]] = {}


def stage_line(inst: Instance, profiles: Profiles, gpu_name: str, tp: int, micro_batch: int, recompute: str,
                first: bool, last: bool) -> tuple[float, float]:
    """(a, c) with τ(L) ≥ a·L + c for one stage's compute: y ≥ d + s·h per pass, TP in device time."""
    key = (id(inst), id(profiles), gpu_name, tp, micro_batch, recompute, first, last)
    if key not in _LINES:
        gpu = inst.gpu_types[gpu_name]
        params = profiles.for_gpu(gpu, inst.spec.training.framework)
        w, s = params.w, params.launch_serial
        # the fastest interconnect of any node with this GPU type: the bound holds wherever the stage goes
        intra = max(
            (inst.cluster.route(n.name, n.name) for n in inst.cluster.nodes.values() if n.gpu == gpu_name),
            key=lambda r: (r.effective_gbps, -r.alpha_s))
        ends = []
        for n in (1, 2):
            work = stage_work(inst.model, gpu, micro_batch, inst.seq_len, tp, True, inst.spec.training.attention,
                              recompute, n, first, last, intra)
            host, dev = host_device(work, w)
            ends.append(dev[FWD] + dev[FWD_TP] + s * host[FWD] + dev[BWD] + dev[BWD_TP] + s * host[BWD])
        _LINES[key] = (float(ends[1] - ends[0]), float(2 * ends[0] - ends[1]))
    return _LINES[key]


def _water_level(weighted: list[tuple[float, float, int]], layers: int, depth: int) -> float:
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

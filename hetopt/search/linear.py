"""A skeleton's integer program data: the evaluator's own time and memory, as linear functions of layers.

For a fixed skeleton the placement (and with it every route) does not depend on how many layers each
stage holds, and every cost feature of a stage is affine in its layer count L (work per layer, plus the
embedding and head on the first and last stage; gradient bytes and parameters grow with L too). So the
evaluator's features at L = 1 and L = 2 give exact slopes and intercepts, priced with the calibrated
weights. Host and device time of a pass stay separate, since a pass takes max(h, d) + s·min(h, d), which
the formulations write with two epigraph inequalities: y ≥ h + s·d and y ≥ d + s·h.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from hetopt.cost.memory import GIB
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
    dp_finish,
    host_device,
    overlap_host_device,
    pipe_times,
    plan_features,
    stage_work,
)
from hetopt.placement import place
from hetopt.search.space import Skeleton
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

    def iteration_time(self, layers: list[int]) -> float:
        """The evaluator's iteration time for this split, through the evaluator's own pipeline functions."""
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
        t_pipe, _ = pipe_times(times, self.micro_batches, 1)
        return float(dp_finish(times, t_pipe, np.array(self.dp_overlap)) + times[:, OPT].max())


@dataclass(frozen=True)
class PlanProblem:
    """One skeleton under every planning scenario, and how to combine the scenario times (robust.py)."""

    scenarios: tuple[SplitProblem, ...]
    probabilities: tuple[float, ...]
    objective: str = "stable"
    alpha: float = 0.8

    @property
    def base(self) -> SplitProblem:
        """Compute terms, memory and limits are the same in every scenario; only communication differs."""
        return self.scenarios[0]

    def iteration_time(self, layers: list[int]) -> float:
        from hetopt.search.robust import aggregate

        return aggregate([sc.iteration_time(layers) for sc in self.scenarios], list(self.probabilities),
                         self.objective, self.alpha)


def _affine(v1: float, v2: float) -> Affine:
    return Affine(v2 - v1, 2 * v1 - v2)


def split_problem(inst: Instance, sk: Skeleton, profiles: Profiles, cluster: Cluster | None = None) -> SplitProblem:
    """Linearise the evaluator for one skeleton (under `cluster`'s link bandwidths, default the instance's);
    raises InfeasibleError when it cannot be placed."""
    plan1 = place(sk.plan([1] * sk.depth), inst.cluster)
    plan2 = sk.plan([2] * sk.depth).model_copy(update={"placement": plan1.placement})
    f1, f2 = plan_features(inst, plan1, cluster), plan_features(inst, plan2, cluster)
    gpus = f1.gpus[0]
    params = [profiles.for_gpu(g) for g in gpus]
    parts = []
    for f in (f1, f2):
        host, dev = host_device(f.templates[0], np.stack([p.w for p in params]))
        full = host + dev
        mem = [m / GIB + p.reserve_gib for m, p in zip(f.memory_bytes[0], params, strict=True)]
        parts.append((host, dev, full, mem))
    (h1, d1, x1, m1), (h2, d2, x2, m2) = parts
    n = sk.depth
    return SplitProblem(
        layers=inst.model.layers, micro_batches=sk.micro_batches,
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
        mem_limit_gib=tuple(g.memory_gib for g in gpus),
    )


def compute_lower_bound(inst: Instance, sk: Skeleton, profiles: Profiles) -> float:
    """A bound no split of this skeleton beats, from compute alone (no placement needed, cached work).

    Each stage's τ_i(L) ≥ a_i·L + c_i (one of the two linear pieces of the host/device overlap, without
    communication). With m micro-batches T ≥ (m − 1)·max τ + Σ τ, and over real-valued splits
    max τ ≥ λ*, the water level that balances the stages, while Σ τ ≥ Σ (a_i + c_i) + min a · (layers − p).
    """
    # Stages of a segment share one line, except the first and last stages (embedding, head): lines with
    # multiplicities keep the bound cheap for deep pipelines.
    p = sk.depth
    weighted: list[tuple[float, float, int]] = []
    position = 0
    for seg in sk.segments:
        for first, last, count in _segment_parts(position, seg.stages, p):
            a, c = _stage_line(inst, profiles, seg.gpu, seg.tp, sk.micro_batch, sk.recompute, first, last)
            weighted.append((a, c, count))
        position += seg.stages
    lam = _water_level(weighted, inst.model.layers, p)
    sum_tau = sum(n * (a + c) for a, c, n in weighted) + min(a for a, _, _ in weighted) * (inst.model.layers - p)
    return (sk.micro_batches - 1) * lam + sum_tau


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


def _stage_line(inst: Instance, profiles: Profiles, gpu_name: str, tp: int, micro_batch: int, recompute: str,
                first: bool, last: bool) -> tuple[float, float]:
    """(a, c) with τ(L) ≥ a·L + c for one stage's compute: y ≥ d + s·h per pass, TP in device time."""
    key = (id(inst), id(profiles), gpu_name, tp, micro_batch, recompute, first, last)
    if key not in _LINES:
        gpu = inst.gpu_types[gpu_name]
        params = profiles.for_gpu(gpu)
        w, s = params.w, params.launch_serial
        ends = []
        for n in (1, 2):
            work = stage_work(inst.model, gpu, micro_batch, inst.seq_len, tp, True, inst.spec.training.attention,
                              recompute, n, first, last)
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

"""A skeleton's integer program data: the evaluator's own time and memory, as linear functions of
layers.

For a fixed skeleton the placement (and with it every route) does not depend on how many layers each
stage holds, and every cost feature of a stage is affine in its layer count L (work per layer, plus
the embedding and head on the first and last stage; gradient bytes and parameters grow with L too).
So the evaluator's features at L = 1 and L = 2 give exact slopes and intercepts, priced with the
calibrated weights. Host and device time of a pass stay separate, since a pass takes max(h, d) +
s·min(h, d), which the formulations write with two epigraph inequalities: y ≥ h + s·d and y ≥ d +
s·h.

Under ZeRO-2/3 a pass also waits for its collectives K(L) (affine too), streamed unit by unit beside
its compute P(L): it takes max(P, K) + min(P, K)/n with n = L + e units (pricing.zero_exposed) — not
affine in L, so `SplitProblem.pass_s` gives it exactly for each L and the formulations tabulate it.

With per-stage recompute (Skeleton.modes) a stage's passes and memory depend on its mode too: the
problem keeps one copy of the template per mode (`alternatives`), and the formulations tabulate each
stage over its options (layer count, mode) that fit in memory (`SplitProblem.options`). A stage's
mode changes its own passes and activation memory only: its sends, gradient all-reduce and optimizer
step are the same in every mode.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import cached_property

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
    by_stage,
    cross_seconds,
    dp_finish,
    host_device,
    overlap_host_device,
    pipe_times,
    plan_features,
    streamed_pass,
)
from hetopt.search.bounds.placed import placed_bound
from hetopt.search.robust import aggregate
from hetopt.search.types import Affine, Skeleton
from hetopt.spec.instance import Instance


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
    virtual_stages: int = 1
    """Model chunks per stage (interleaved 1F1B when > 1): every L_i a multiple of it, and the
    pipeline m·max τ + (Σ τ − max τ)/v (pricing.pipe_times)."""
    zero_fwd: tuple[Affine, ...] = ()
    """ZeRO-2/3: seconds of each stage's collectives per forward pass, K^f_i(L) (empty without)."""
    zero_bwd: tuple[Affine, ...] = ()
    """… and per backward pass, K^b_i(L)."""
    zero_units: tuple[int, ...] = ()
    """Units each stage streams besides its L layers (the embedding, the head): n_i = L + e_i."""
    modes: tuple[str, ...] = ()
    """Per-stage recompute: the modes a stage may run, least work first; () — one mode for the
    plan."""
    alternatives: tuple[SplitProblem, ...] = ()
    """… and this template with every stage in each of them (the same order). The problem's own
    lines are the least-work mode's, which bound every mix's compute from below, and `max_layers`
    the most any mode holds; only `options` and `resolve` give a mix its exact time and memory."""

    rows: SplitProblem | None = None
    """Stages with shards (Skeleton.shards): the template's feature rows, one per shard (its ranks'
    passes at their sequences, its memory against its own GPU), as a plain problem, and `stage_of`
    each row's stage. A stage then takes each part from its rows by `pricing.by_stage`
    (`stage_parts`), which is not affine in L: its passes, all-reduce, overlap and optimizer step
    are tabulated (`pass_s`, `dp_s`, `hidden_s`, `opt_s`), its sends are `p2p` (by_stage's, constant
    in L) and its memory every row's (`max_layers`); its per-stage lines are NaN (`_sharded`)."""
    stage_of: tuple[int, ...] = ()

    @property
    def depth(self) -> int:
        return len(self.p2p)

    @cached_property
    def stage_rows(self) -> tuple[tuple[int, ...], ...]:
        """The rows (`rows`) of each stage; () without shards."""
        return (
            tuple(
                tuple(r for r, i in enumerate(self.stage_of) if i == k) for k in range(self.depth)
            )
            if self.rows is not None
            else ()
        )

    @property
    def mixed(self) -> bool:
        """Whether each stage picks its recompute mode (formulations then tabulate (layers,
        mode))."""
        return bool(self.alternatives)

    def variants(self) -> tuple[SplitProblem, ...]:
        """The template in each mode a stage may run: the alternatives, or this problem alone."""
        return self.alternatives or (self,)

    def resolve(self, modes: Sequence[str]) -> SplitProblem:
        """The template with stage i in mode modes[i], as one plain problem (no alternatives)."""
        if not self.mixed:
            return self
        picks = [self.alternatives[self.modes.index(m)] for m in modes]
        per_stage = (
            "serial",
            "host_fwd",
            "dev_fwd",
            "host_bwd",
            "dev_bwd",
            "p2p",
            "dp",
            "dp_overlap",
            "opt",
            "mem_gib",
            "mem_limit_gib",
            "zero_fwd",
            "zero_bwd",
            "zero_units",
        )
        fields = {
            name: tuple(getattr(pr, name)[i] for i, pr in enumerate(picks))
            if getattr(self, name)
            else ()
            for name in per_stage
        }
        return replace(self, modes=(), alternatives=(), **fields)

    def options(self, i: int, top: int) -> list[tuple[int, int]]:
        """Stage i's choices as (layers n, mode index k): n ≤ top a multiple of the virtual stages,
        and (per-stage recompute, stages with shards) stage i holding n layers (in mode k) within
        its memory."""
        counts = [n for n in range(1, top + 1) if n % self.virtual_stages == 0]
        # stages with shards: every row holds n layers (their memory rule)
        if self.rows is not None:
            return [(n, 0) for n in counts if n <= self.max_layers()[i]]
        if not self.mixed:
            return [(n, 0) for n in counts]
        return [(n, k) for n in counts for k, caps in enumerate(self.mode_caps) if n <= caps[i]]

    @cached_property
    def mode_caps(self) -> tuple[list[int], ...]:
        """Per-stage recompute: `max_layers` of the template in each mode (the one memory rule),
        computed once for the formulations' and bounds' per-stage options."""
        return tuple(pr.max_layers() for pr in self.alternatives)

    @property
    def tabulated(self) -> bool:
        """Whether a pass time is not affine in L (ZeRO-2/3, stages with shards), so formulations
        take it from `pass_s` (and with shards every part from its table)."""
        return bool(self.zero_fwd) or self.rows is not None

    def stage_parts(self, i: int, layers: int) -> tuple[np.ndarray, float]:
        """Stages with shards: stage i's priced parts (N_PARTS) and all-reduce overlap at `layers`
        layers, collapsed from its rows by the evaluator's own `pricing.by_stage` (computed once per
        L)."""
        if (i, layers) not in self._parts:  # every stage at once: the rows are priced together
            parts, overlap = by_stage(
                self.rows.times([layers] * len(self.stage_of)),
                list(self.stage_of),
                np.array(self.rows.dp_overlap),
            )
            for j in range(len(parts)):
                self._parts[j, layers] = (parts[j], float(overlap[j]))
        return self._parts[i, layers]

    @cached_property
    def _parts(self) -> dict:
        return {}

    def dp_s(self, i: int, layers: int) -> float:
        """Seconds of stage i's gradient all-reduce at `layers` layers, D_i(L) (with shards
        `stage_parts`)."""
        if self.rows is not None:
            return float(self.stage_parts(i, layers)[0][DP])
        return self.dp[i].at(layers)

    def hidden_s(self, i: int, layers: int, mode: int = 0) -> float:
        """Seconds of stage i's last backward pass the all-reduce overlaps, o_i·y^b_i(L) (with
        shards the stage's overlap from `stage_parts`)."""
        return (
            self.stage_parts(i, layers)[1] if self.rows is not None else self.dp_overlap[i]
        ) * self.pass_s(i, layers, "b", mode)

    def opt_s(self, i: int, layers: int) -> float:
        """Seconds of stage i's optimizer step at `layers` layers (with shards `stage_parts`)."""
        if self.rows is not None:
            return float(self.stage_parts(i, layers)[0][OPT])
        return self.opt[i].at(layers)

    def pass_s(self, i: int, layers: int, kind: str, mode: int = 0) -> float:
        """Seconds of stage i's forward ("f") or backward ("b") pass at `layers` layers (in its mode
        of index `mode` with per-stage recompute), as the evaluator prices it: max(h, d) + s·min(h,
        d), and under ZeRO-2/3 max(P, K) + min(P, K)/n."""
        if self.mixed:
            return self.alternatives[mode].pass_s(i, layers, kind)
        if self.rows is not None:
            parts = self.stage_parts(i, layers)[0]
            return float(parts[FWD] + parts[FWD_TP] if kind == "f" else parts[BWD] + parts[BWD_TP])
        h, d, z = (
            (self.host_fwd, self.dev_fwd, self.zero_fwd)
            if kind == "f"
            else (self.host_bwd, self.dev_bwd, self.zero_bwd)
        )
        # scalars or an array of layer counts (placed.every_stage_drain prices every count at once)
        compute = overlap_host_device(h[i].at(layers), d[i].at(layers), self.serial[i])
        if not z:
            return compute
        return streamed_pass(compute, z[i].at(layers), layers + self.zero_units[i])

    def max_layers(self) -> list[int]:
        """The most layers each stage can hold in memory (in any of its modes, per-stage
        recompute)."""
        if self.mixed:
            return [max(col) for col in zip(*self.mode_caps, strict=True)]
        if self.rows is not None:  # every row holds the stage's layers
            caps = self.rows.max_layers()
            return [min(caps[r] for r in rows) for rows in self.stage_rows]
        out = []
        for mem, limit in zip(self.mem_gib, self.mem_limit_gib, strict=True):
            if mem.slope <= 0:
                out.append(self.layers)
            else:
                out.append(int(np.floor((limit - mem.intercept) / mem.slope + 1e-9)))
        return out

    def scaled(self, k: float) -> SplitProblem:
        """The same problem with every time multiplied by k (memory untouched): another time
        unit."""

        def times(fs):
            return tuple(Affine(f.slope * k, f.intercept * k) for f in fs)

        return replace(
            self,
            host_fwd=times(self.host_fwd),
            dev_fwd=times(self.dev_fwd),
            host_bwd=times(self.host_bwd),
            dev_bwd=times(self.dev_bwd),
            p2p=tuple(c * k for c in self.p2p),
            dp=times(self.dp),
            opt=times(self.opt),
            zero_fwd=times(self.zero_fwd),
            zero_bwd=times(self.zero_bwd),
            alternatives=tuple(pr.scaled(k) for pr in self.alternatives),
            rows=self.rows.scaled(k) if self.rows is not None else None,
        )

    def times(self, layers: list[int], modes: Sequence[str] | None = None) -> np.ndarray:
        """Priced parts (stages, N_PARTS) of this template for a split (and each stage's recompute
        mode, per-stage recompute), as the evaluator prices them."""
        return self.priced(layers, modes)[0]

    def priced(
        self, layers: list[int], modes: Sequence[str] | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """`times` and each stage's all-reduce overlap fraction (with shards,
        `pricing.by_stage`'s)."""
        if self.mixed:
            return self.resolve(
                modes if modes is not None else [self.modes[0]] * self.depth
            ).priced(layers)
        if self.rows is not None:
            rows = self.rows.times([layers[i] for i in self.stage_of])
            return by_stage(rows, list(self.stage_of), np.array(self.rows.dp_overlap))
        serial = np.array(self.serial)
        n = np.array(layers, dtype=float)

        def at(funcs: tuple[Affine, ...]) -> np.ndarray:
            return np.array([f.at(x) for f, x in zip(funcs, n, strict=True)])

        times = np.zeros((len(layers), N_PARTS))
        times[:, FWD] = overlap_host_device(at(self.host_fwd), at(self.dev_fwd), serial)
        times[:, BWD] = overlap_host_device(at(self.host_bwd), at(self.dev_bwd), serial)
        if self.zero_fwd:  # the exposed ZeRO collectives, as pricing.zero_exposed adds them
            units = n + np.array(self.zero_units)
            for part, zero in ((FWD, self.zero_fwd), (BWD, self.zero_bwd)):
                times[:, part] = streamed_pass(times[:, part], at(zero), units)
        times[:, P2P] = self.p2p
        times[:, DP] = at(self.dp)
        times[:, OPT] = at(self.opt)
        return times, np.array(self.dp_overlap)


@dataclass(frozen=True)
class ScenarioProblem:
    """A skeleton's templates under one scenario. With several templates the iteration waits for the
    slowest pipeline, every template's gradient all-reduces, then their exchange (`cross_s`,
    split-independent)."""

    templates: tuple[SplitProblem, ...]
    cross_s: float = 0.0

    @property
    def layers(self) -> int:
        return self.templates[0].layers

    def split(self, layers: Sequence) -> list[list]:
        out, start = [], 0
        for t in self.templates:
            out.append(list(layers[start : start + t.depth]))
            start += t.depth
        return out

    def iteration_time(self, layers: list[int], modes: Sequence[str] | None = None) -> float:
        """The evaluator's iteration time for a flat split (template after template; with per-stage
        recompute, `modes` flat the same way), through the evaluator's own pipeline functions."""
        per_template = self.split(modes) if modes is not None else [None] * len(self.templates)
        timed = [
            t.priced(n, md)
            for t, n, md in zip(self.templates, self.split(layers), per_template, strict=True)
        ]
        t_sync = max(
            float(pipe_times(times, t.micro_batches, t.virtual_stages)[0])
            for t, (times, _) in zip(self.templates, timed, strict=True)
        )
        t_dp = max(float(dp_finish(times, t_sync, overlap)) for times, overlap in timed)
        return t_dp + self.cross_s + max(float(times[:, OPT].max()) for times, _ in timed)

    def max_layers(self) -> list[int]:
        return [x for t in self.templates for x in t.max_layers()]

    def scaled(self, k: float) -> ScenarioProblem:
        return ScenarioProblem(tuple(t.scaled(k) for t in self.templates), self.cross_s * k)


@dataclass(frozen=True)
class PlanProblem:
    """One skeleton under every planning scenario, and how to combine the scenario times
    (robust.py)."""

    scenarios: tuple[ScenarioProblem, ...]
    probabilities: tuple[float, ...]
    objective: str = "stable"
    alpha: float = 0.8
    lockstep: bool = False
    """Every template runs one layer split (a uniform layout's, hetopt.search.uniform): (C1t) in the
    formulations."""

    @property
    def base(self) -> ScenarioProblem:
        """Compute terms, memory and limits are the same in every scenario; only communication
        differs."""
        return self.scenarios[0]

    def scaled(self, k: float) -> PlanProblem:
        return replace(self, scenarios=tuple(sc.scaled(k) for sc in self.scenarios))

    @cached_property
    def lower_bound_s(self) -> float:
        """search.bounds.placed_bound of this problem, computed once: the search prunes by it and
        split-cpsat sizes its time unit by it."""
        return placed_bound(self)

    def iteration_time(self, layers: list[int], modes: Sequence[str] | None = None) -> float:
        return aggregate(
            [sc.iteration_time(layers, modes) for sc in self.scenarios],
            list(self.probabilities),
            self.objective,
            self.alpha,
        )


def _affine(v1: float, v2: float) -> Affine:
    return Affine(v2 - v1, 2 * v1 - v2)


def split_problem(
    inst: Instance, sk: Skeleton, profiles: Profiles, placement: list | None = None
) -> ScenarioProblem:
    """Linearise the evaluator for one skeleton on `inst`'s network (a scenario's:
    Instance.on_network).

    Parameters: placement — the skeleton's placement (a plan's `placement`), made once for every
    scenario; default: placed here on `inst`'s cluster. Raises: InfeasibleError when it cannot be
    placed."""
    if sk.modes:  # per-stage recompute: the template in each mode, the least-work one first
        each = [
            split_problem(inst, replace(sk, recompute=mode, modes=()), profiles, placement)
            for mode in sk.modes
        ]
        templates = tuple(
            replace(variants[0], modes=sk.modes, alternatives=variants)
            for variants in zip(*(sc.templates for sc in each), strict=True)
        )
        return ScenarioProblem(templates, each[0].cross_s)
    placement = placement or sk.placed([1] * sk.depth, inst.cluster).placement
    plan1, plan2 = (
        sk.plan([n] * sk.depth).model_copy(update={"placement": placement}) for n in (1, 2)
    )
    f1, f2 = plan_features(inst, plan1), plan_features(inst, plan2)
    templates = tuple(
        _template_problem(inst, f1, f2, j, t.micro_batches, profiles, sk.virtual_stages)
        for j, t in enumerate(sk.templates)
    )
    if sk.shards:  # one row per shard: the stages take each part from their rows
        templates = tuple(_sharded(t, f1.stage_of[j]) for j, t in enumerate(templates))
    return ScenarioProblem(templates, cross_seconds(f1, profiles))


def _sharded(rows: SplitProblem, stage_of) -> SplitProblem:
    """The stage problem over a template's shard rows (`SplitProblem.rows`): the longest row's sends
    per stage, and no lines of its own (NaN: a reader that takes a stage's parts from them, not from
    the accessors, gets NaN rather than one row's numbers)."""
    stage_of = tuple(int(i) for i in stage_of)
    depth = max(stage_of) + 1
    nan = Affine(math.nan, math.nan)
    lines = {
        name: (nan,) * depth
        for name in ("host_fwd", "dev_fwd", "host_bwd", "dev_bwd", "dp", "opt", "mem_gib")
    }
    stages = replace(
        rows,
        rows=rows,
        stage_of=stage_of,
        serial=(math.nan,) * depth,
        p2p=(math.nan,) * depth,
        dp_overlap=(math.nan,) * depth,
        mem_limit_gib=(math.nan,) * depth,
        **lines,
    )
    return replace(stages, p2p=tuple(float(stages.stage_parts(i, 1)[0][P2P]) for i in range(depth)))


def _template_problem(
    inst: Instance, f1, f2, j: int, micro_batches: int, profiles: Profiles, virtual_stages: int = 1
) -> SplitProblem:
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
    zero: dict = {}
    if f1.zero_passes:  # ZeRO-2/3: each pass's collectives, priced with the stage's weights
        weights = np.stack([p.w for p in params])
        k1, k2 = (np.einsum("spk,sk->sp", f.zero_passes[j], weights) for f in (f1, f2))
        zero = {
            "zero_fwd": tuple(_affine(k1[i, 0], k2[i, 0]) for i in range(n)),
            "zero_bwd": tuple(_affine(k1[i, 1], k2[i, 1]) for i in range(n)),
            "zero_units": tuple(int(u) - 1 for u in f1.zero_units[j]),
        }
    return SplitProblem(
        layers=inst.model.layers,
        micro_batches=micro_batches,
        serial=tuple(p.launch_serial for p in params),
        host_fwd=tuple(_affine(h1[i, FWD], h2[i, FWD]) for i in range(n)),
        dev_fwd=tuple(
            _affine(d1[i, FWD] + d1[i, FWD_TP], d2[i, FWD] + d2[i, FWD_TP]) for i in range(n)
        ),
        host_bwd=tuple(_affine(h1[i, BWD], h2[i, BWD]) for i in range(n)),
        dev_bwd=tuple(
            _affine(d1[i, BWD] + d1[i, BWD_TP], d2[i, BWD] + d2[i, BWD_TP]) for i in range(n)
        ),
        p2p=tuple(float(x1[i, P2P]) for i in range(n)),
        dp=tuple(_affine(x1[i, DP], x2[i, DP]) for i in range(n)),
        dp_overlap=tuple(p.dp_overlap for p in params),
        opt=tuple(_affine(x1[i, OPT], x2[i, OPT]) for i in range(n)),
        mem_gib=tuple(_affine(m1[i], m2[i]) for i in range(n)),
        mem_limit_gib=tuple(g.usable_memory_gib for g in gpus),
        virtual_stages=virtual_stages,
        **zero,
    )

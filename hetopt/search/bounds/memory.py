"""Memory caps: the most layers each stage of a template holds, from the evaluator's own memory
model, which is affine in a stage's layers."""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

from hetopt.cost.memory import GIB, stage_params
from hetopt.cost.profiles import Profiles
from hetopt.evaluate import (
    stage_memory,
)
from hetopt.search.types import Affine
from hetopt.spec.instance import Instance


@dataclass(frozen=True)
class ClassMemory:
    """GiB of a stage on one GPU type and TP degree, affine in its layers L: slope state + act·held
    (held: micro-batches in flight, p − i under 1F1B) and an intercept by position (embedding on the
    first stage, head and logits on the last, both on a single stage). Read off the evaluator's
    stage_memory."""

    state: float
    act: float
    mid: float
    first: float
    last: float
    solo: float

    def stage(self, i: int, p: int) -> Affine:
        c = self.solo if p == 1 else self.first if i == 0 else self.last if i == p - 1 else self.mid
        return Affine(self.state + self.act * (p - i), c)


class MemoryBounds:
    """The memory caps of a search run's templates, memoised on this object (one search run's)."""

    def __init__(self, inst: Instance, profiles: Profiles) -> None:
        self.inst, self.profiles = inst, profiles
        self._fits: dict[tuple, bool] = {}
        self._memory: dict[tuple, ClassMemory] = {}
        self._caps: dict[tuple, tuple[int, ...]] = {}

    def template_fits(
        self,
        micro_batch: int,
        recompute: str | tuple[str, ...],
        segments: tuple,
        replicas_total: int,
        zero: int = 1,
    ) -> bool:
        """Whether a template's stages can hold the model at all: each stage at least one layer and
        together every layer, with ZeRO stage `zero` sharding over `replicas_total` (more replicas
        only shrink memory)."""
        key = (micro_batch, recompute, segments, replicas_total, zero)
        if key not in self._fits:
            self._fits[key] = (
                self.max_layers_total(micro_batch, recompute, segments, replicas_total, zero)
                >= self.inst.model.layers
            )
        return self._fits[key]

    def max_layers_total(
        self,
        micro_batch: int,
        recompute: str | tuple[str, ...],
        segments: tuple,
        replicas_total: int,
        zero: int = 1,
    ) -> int:
        """Σ over the stages of the most layers each can hold (−1 when a stage cannot hold one)."""
        caps = self.stage_caps(micro_batch, recompute, segments, replicas_total, zero)
        return -1 if min(caps) < 1 else sum(caps)

    def stage_caps(
        self,
        micro_batch: int,
        recompute: str | tuple[str, ...],
        segments: tuple,
        replicas_total: int,
        zero: int = 1,
    ) -> tuple[int, ...]:
        """The most layers each stage of a template holds in memory (at most the model's layers; 0
        when it cannot hold one), ZeRO stage `zero` sharded over `replicas_total`: the evaluator's
        memory model, affine in L. With a tuple of recompute modes (per-stage recompute) the most
        any of them holds: each mode's memory rises with L, so a stage holds every L up to that.
        Memoised: the least levels ask for the same caps at every micro-batch count."""
        key = (micro_batch, recompute, segments, replicas_total, zero)
        if key not in self._caps:
            self._caps[key] = self._stage_caps(*key)
        return self._caps[key]

    def _stage_caps(
        self,
        micro_batch: int,
        recompute: str | tuple[str, ...],
        segments: tuple,
        replicas_total: int,
        zero: int,
    ) -> tuple[int, ...]:
        if not isinstance(recompute, str):
            return tuple(
                max(col)
                for col in zip(
                    *(
                        self.stage_caps(micro_batch, mode, segments, replicas_total, zero)
                        for mode in recompute
                    ),
                    strict=True,
                )
            )
        inst = self.inst
        p = sum(seg.stages for seg in segments)
        n_layers = inst.model.layers
        caps, start = [], 0
        for seg in segments:
            gpu = inst.gpu_types[seg.gpu]
            limit = gpu.usable_memory_gib - self.profiles.for_gpu(gpu).reserve_gib
            cm = self.class_memory(
                micro_batch, recompute, seg.gpu, seg.tp, replicas_total, zero, seg.cp
            )
            for i in range(start, start + seg.stages):  # ClassMemory.stage, inlined: hot loop
                slope = cm.state + cm.act * (p - i)
                intercept = (
                    cm.solo if p == 1 else cm.first if i == 0 else cm.last if i == p - 1 else cm.mid
                )
                if slope + intercept > limit:
                    caps.append(0)
                else:
                    caps.append(
                        n_layers
                        if slope <= 0
                        else min(n_layers, int((limit - intercept) / slope + 1e-9))
                    )
            start += seg.stages
        return tuple(caps)

    def class_memory(
        self,
        micro_batch: int,
        recompute: str,
        gpu: str,
        tp: int,
        replicas: int,
        zero: int = 1,
        cp: int = 1,
    ) -> ClassMemory:
        """The memory lines of a stage of `gpu` at TP `tp` and CP `cp` (ZeRO stage `zero` over
        `replicas`), read off the evaluator's stage_memory at 1 and 2 layers in a 4-stage and a
        1-stage pipeline."""
        key = (micro_batch, recompute, gpu, tp, replicas, zero, cp)
        if key not in self._memory:
            inst = self.inst
            plan = SimpleNamespace(
                micro_batch=micro_batch, schedule="1f1b", virtual_stages=1, zero=zero
            )

            def line(i: int, p: int) -> Affine:
                mem = []
                for n in (1, 2):
                    st = SimpleNamespace(layers=n, tp=tp, cp=cp, sp=True, recompute=recompute)
                    params = stage_params(inst.model, n, i == 0, i == p - 1, p)
                    mem.append(stage_memory(inst, plan, p, p, i, st, params, replicas) / GIB)
                return Affine(mem[1] - mem[0], 2 * mem[0] - mem[1])

            held3, held2 = line(1, 4), line(2, 4)  # middle stages of 4 hold 3 and 2 micro-batches
            act = held3.slope - held2.slope
            self._memory[key] = ClassMemory(
                held2.slope - 2 * act,
                act,
                held2.intercept,
                line(0, 4).intercept,
                line(3, 4).intercept,
                line(0, 1).intercept,
            )
        return self._memory[key]

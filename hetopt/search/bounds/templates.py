"""Bounds of one pipeline template: its stages' lines, its pipeline over every layer split that fits
in memory, the drain of stage 0's gradient all-reduce, and its optimizer step.

Every stage's time per micro-batch is τ_i(L) ≥ a_i·L + c_i (`TemplateBounds.stage_line`: one of the
two linear pieces of the host/device overlap, TP over the fastest interconnect its GPU type has),
plus the sends it must make wherever it goes (hetopt.search.bounds.sends).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from hetopt.cost.comm import all_reduce
from hetopt.cost.compute import optimizer_step
from hetopt.cost.flops import layer_params
from hetopt.cost.memory import stage_params
from hetopt.cost.terms import ITER
from hetopt.evaluate import (
    BWD,
    BWD_TP,
    FWD,
    FWD_TP,
    grad_comm_bytes,
    host_device,
    overlap_host_device,
    stage_work,
)
from hetopt.search.bounds.lines import (
    DrainedPipeline,
    Line,
    Pipeline,
    _positions,
    cheapest_sum,
    integer_level,
    least_drain,
    segment_parts,
    sum_bound,
    water_level,
)
from hetopt.search.bounds.memory import MemoryBounds
from hetopt.search.bounds.sends import SendBounds
from hetopt.search.types import Affine, most_work


@dataclass(frozen=True)
class _Drain:
    """Stage 0's gradient all-reduce (a lower bound) and its backward pass (host and device, an
    upper bound), affine in its layers: the drain is dp(L) − overlap·pass(L) (pricing.dp_finish)."""

    dp: Affine
    host: Affine
    device: Affine
    serial: float
    overlap: float

    def __call__(self, layers: int) -> float:
        backward = overlap_host_device(self.host.at(layers), self.device.at(layers), self.serial)
        return self.dp.at(layers) - self.overlap * float(backward)


class TemplateBounds:
    """The bounds of a search run's templates, memoised on this object (one search run's)."""

    def __init__(self, sends: SendBounds, memory: MemoryBounds) -> None:
        self.sends, self.memory = sends, memory
        self.inst, self.profiles = sends.inst, sends.profiles
        self._lines: dict[tuple, Line] = {}
        self._optimizer: dict[tuple, float] = {}
        self._segments: dict[tuple, list[tuple[float, float, int]]] = {}
        self._templates: dict[tuple, tuple[float, float]] = {}
        self._capped: dict[tuple, tuple[float, float]] = {}
        self._pipelines: dict[tuple, float] = {}
        self._pipeline_parts: dict[tuple, Pipeline] = {}
        self._drained_parts: dict[tuple, DrainedPipeline] = {}
        self._drains: dict[tuple, _Drain | None] = {}
        self._drained: dict[tuple, float] = {}
        self._real_levels: dict[tuple, tuple[float, float]] = {}
        self._ring_lines: dict[tuple, tuple[float, float] | None] = {}
        self._unshed: dict[tuple, float] = {}
        self._excess: dict[tuple, float] = {}
        self._effects: dict[tuple, tuple[tuple[int, ...], tuple[int, ...]]] = {}

    def stage_line(
        self,
        gpu_name: str,
        tp: int,
        micro_batch: int,
        recompute: str,
        first: bool,
        last: bool,
        cp: int = 1,
    ) -> Line:
        """(a, c) with τ(L) ≥ a·L + c for one stage's compute: y ≥ d + s·h per pass, TP (and CP,
        `cp` ranks: one node's) in device time over the fastest interconnect of any node with this
        GPU type (so it holds wherever the stage goes)."""
        (af, cf), (ab, cb) = self.pass_lines(gpu_name, tp, micro_batch, recompute, first, last, cp)
        return af + ab, cf + cb

    def pass_lines(
        self,
        gpu_name: str,
        tp: int,
        micro_batch: int,
        recompute: str,
        first: bool,
        last: bool,
        cp: int = 1,
    ) -> tuple[Line, Line]:
        """`stage_line` per pass: (forward, backward), each y ≥ a·L + c."""
        key = (gpu_name, tp, micro_batch, recompute, first, last, cp)
        if key not in self._lines:
            inst = self.inst
            gpu = inst.gpu_types[gpu_name]
            params = self.profiles.for_gpu(gpu, inst.spec.training.framework)
            w, s = params.w, params.launch_serial
            intra = max(
                (
                    inst.cluster.route(n.name, n.name)
                    for n in inst.cluster.nodes.values()
                    if n.gpu == gpu_name
                ),
                key=lambda r: (r.effective_gbps, -r.alpha_s),
            )
            ends = []
            for n in (1, 2):
                work = stage_work(
                    inst.model,
                    gpu,
                    micro_batch,
                    inst.seq_len,
                    tp,
                    True,
                    inst.spec.training.attention,
                    recompute,
                    n,
                    first,
                    last,
                    intra,
                    cp,
                    inst.format,
                    inst.spec.training.norm_kernel,
                )
                host, dev = host_device(work, w)
                ends.append(
                    [dev[FWD] + dev[FWD_TP] + s * host[FWD], dev[BWD] + dev[BWD_TP] + s * host[BWD]]
                )
            self._lines[key] = tuple(
                (float(e2 - e1), float(2 * e1 - e2)) for e1, e2 in zip(*ends, strict=True)
            )
        return self._lines[key]

    def per_layer_s(
        self, gpu_name: str, tp: int, micro_batch: int, recompute: str, cp: int = 1
    ) -> float:
        """a with τ(L) ≥ a·L for a middle stage: the line a·L + c with a positive intercept dropped,
        a negative one folded in (a·L + c ≥ (a + c)·L for L ≥ 1). First and last stages only add
        work."""
        a, c = self.stage_line(gpu_name, tp, micro_batch, recompute, False, False, cp)
        return a + min(c, 0.0)

    def optimizer_bound(self, template, replicas_total: int, zero: int) -> float:
        """T_opt ≥ this for one template: every stage's step takes ITER_i + o_i·L_i or more — Adam
        over its shard (ZeRO ≥ 1: 1/R_total of its parameters), and under ZeRO-2 the all-gather of
        its updated 16-bit weights among the template's replicas (`collective_per_layer`). With Σ
        L_i = N, max_i o_i·L_i ≥ N / Σ_i 1/o_i (equal products are the least maximum), so T_opt ≥
        min_i ITER_i + N / Σ_i 1/o_i."""
        key = (template.segments, template.replicas, replicas_total, zero)
        if key not in self._optimizer:
            inst, rates, floor = self.inst, 0.0, math.inf
            for seg in template.segments:
                shard = replicas_total * seg.cp if zero >= 1 else 1  # ZeRO-1 over the DP×CP group
                gpu = inst.gpu_types[seg.gpu]
                w = self.profiles.for_gpu(gpu, inst.spec.training.framework).w
                per_layer = layer_params(inst.model) / seg.tp / shard
                fmt = inst.format
                step = optimizer_step(2 * per_layer, gpu, fmt)
                o = float((step - optimizer_step(per_layer, gpu, fmt)) @ w)
                if zero == 2:
                    o += self.sends.collective_per_layer(seg, template.replicas, fmt.weight_bytes)
                if o <= 0:
                    return 0.0
                rates += seg.stages / o
                floor = min(floor, float(w[ITER]))
            self._optimizer[key] = floor + inst.model.layers / rates
        return self._optimizer[key]

    def weighted_lines(
        self,
        micro_batch: int,
        recompute: str,
        segments: tuple,
        flows: int = 1,
        zero: int = 1,
        collectives: bool = False,
        stacks: tuple[int, ...] = (),
    ) -> list[tuple[float, float, int]]:
        """(a, c, count): τ_i(L) ≥ a·L + c for `count` consecutive stages. τ includes the stage's
        sends (the sender pays, as in the evaluator): an activation forward unless it is the last
        stage, a gradient back unless it is the first, each at least `send_s` — across NICs at a
        change of device class. Stages of a segment share one line except its first and last
        (embedding, head, the sends to the neighbouring classes): multiplicities keep deep pipelines
        cheap. `flows`: the template's replicas, whose sends share the island links (`send_s`).

        Under ZeRO-2/3 (`zero`, over the `flows` replicas) a pass of compute P and collectives K
        over n = L + e units takes max(P, K) + min(P, K)/n (pricing.zero_exposed) ≥ max(P, K) + ε
        with ε = min(a^p, k^p)/(1 + e): P ≥ a^p·L for L ≥ 1 (a^p the pass's line with a negative
        intercept folded in), K ≥ k^p·L (`zero_per_layer`) and L/n ≥ 1/(1 + e). So each line gains
        ε, and with `collectives` the lines are those of the collectives instead, (k^f + k^b)·L + ε:
        both hold. `stacks`: per segment, how many sends of one boundary leave a node at once in the
        stage order (`SendBounds.stacked`; none: 1), each then across NICs."""
        weighted = []
        n = len(segments)
        for j, seg in enumerate(segments):
            nxt = (segments[j + 1].gpu, segments[j + 1].island) if j + 1 < n else None
            prv = (segments[j - 1].gpu, segments[j - 1].island) if j > 0 else None
            weighted += self._segment_lines(
                seg,
                prv,
                nxt,
                micro_batch,
                recompute,
                flows,
                zero,
                collectives,
                stacks[j] if stacks else 1,
            )
        return weighted

    def _segment_lines(
        self,
        seg,
        prv: tuple | None,
        nxt: tuple | None,
        micro_batch: int,
        recompute: str,
        flows: int = 1,
        zero: int = 1,
        collectives: bool = False,
        stacked: int = 1,
    ) -> list[tuple[float, float, int]]:
        """`weighted_lines` of one segment between the classes `prv` and `nxt` (None: the pipeline's
        end), memoised: segments recur across the groups of a family. `stacked` ≥ 2: every send
        of the segment's stages leaves its node beside that many of its boundary's."""
        key = (seg, prv, nxt, micro_batch, recompute, flows, zero, collectives, stacked)
        if key not in self._segments:
            here = (seg.gpu, seg.island)
            if stacked > 1:  # the next stage's replica r is never on the node (`stacked`)
                inner = self.sends.send_s(
                    here, here, seg.width, micro_batch, apart=True, stacked=stacked
                )
                inner_pair = 2 * inner
            else:
                inner = self.sends.send_s(
                    here, here, seg.width, micro_batch, apart=self.sends.stages_apart(*here, seg.tp)
                )
                # a stage whose neighbours are both of its segment shares a node with one at most
                inner_pair = inner + (
                    self.sends.send_s(here, here, seg.width, micro_batch, apart=True)
                    if self.sends.stages_paired(*here, seg.tp)
                    else inner
                )
            k_pass = self.sends.zero_per_layer(seg, flows, zero)
            out = []
            for k, count in _positions(seg.stages):
                first, last = prv is None and k == 0, nxt is None and k == seg.stages - 1
                passes = self.pass_lines(
                    seg.gpu, seg.tp, micro_batch, recompute, first, last, seg.cp
                )
                a, c = sum(ap for ap, _ in passes), sum(cp for _, cp in passes)
                # the first collective (or the last) of each pass is never hidden
                eps = sum(
                    max(0.0, min(ap + min(cp, 0.0), kp))
                    for (ap, cp), kp in zip(passes, k_pass, strict=True)
                ) / (1 + first + last)
                if collectives:
                    a, c = sum(k_pass), 0.0
                c += eps
                if 0 < k < seg.stages - 1:  # activation forward, gradient back, both inside
                    c += inner_pair
                else:
                    if not last:  # activation forward
                        c += (
                            self.sends.send_s(
                                here, nxt, seg.width, micro_batch, flows, stacked=stacked
                            )
                            if k == seg.stages - 1
                            else inner
                        )
                    if not first:  # gradient back
                        c += (
                            self.sends.send_s(
                                here, prv, seg.width, micro_batch, flows, stacked=stacked
                            )
                            if k == 0
                            else inner
                        )
                out.append((a, c, count))
            self._segments[key] = out
        return self._segments[key]

    def stage_lines(
        self,
        micro_batch: int,
        recompute: str,
        segments: tuple,
        flows: int = 1,
        zero: int = 1,
        collectives: bool = False,
        stacks: tuple[int, ...] = (),
    ) -> list[Line]:
        """(a_i, c_i) of every stage, in order."""
        return [
            (a, c)
            for a, c, n in self.weighted_lines(
                micro_batch, recompute, segments, flows, zero, collectives, stacks
            )
            for _ in range(n)
        ]

    def template_bound(
        self, micro_batch: int, recompute: str, segments: tuple
    ) -> tuple[float, float]:
        """(λ, S): lower bounds on max τ and Σ τ of a template's stages over every split.

        Over integer splits max τ ≥ λ, the smallest max_i(a_i·L_i + c_i) (the integer water level),
        while Σ τ ≥ S = Σ (a_i + c_i) + min a · (layers − p). With m micro-batches T ≥ (m − 1)·max τ
        + Σ τ."""
        key = (micro_batch, recompute, segments)
        if key not in self._templates:
            weighted = self.weighted_lines(micro_batch, recompute, segments)
            lines = [(a, c) for a, c, n in weighted for _ in range(n)]
            layers = self.inst.model.layers
            self._templates[key] = (integer_level(lines, layers), sum_bound(weighted, layers))
        return self._templates[key]

    def capped_bound(
        self,
        micro_batch: int,
        recompute: str,
        memory: tuple[str, ...],
        segments: tuple,
        replicas_total: int,
        zero: int = 1,
    ) -> tuple[float, float]:
        """`template_bound` over the splits that fit in memory: each stage holds at most the layers
        the recompute modes `memory` let it hold (the most any of them holds) with ZeRO stage `zero`
        over `replicas_total` replicas (more only loosen the caps) — λ the integer water level under
        the caps, S the least Σ τ under them (S ≥ λ: every split's Σ τ is at least its max τ); (inf,
        inf) where no split fits."""
        key = (micro_batch, recompute, memory, segments, replicas_total, zero)
        if key not in self._capped:
            caps = self.memory.stage_caps(micro_batch, memory, segments, replicas_total, zero)
            lines = self.stage_lines(micro_batch, recompute, segments)
            layers = self.inst.model.layers
            lam = integer_level(lines, layers, caps)
            self._capped[key] = (
                (lam, cheapest_sum(lines, layers, math.inf, caps))
                if math.isfinite(lam)
                else (math.inf, math.inf)
            )
        return self._capped[key]

    def pipeline_bound(
        self,
        micro_batch: int,
        recompute: str,
        segments: tuple,
        micro_batches: int,
        replicas_total: int,
        flows: int = 1,
        zero: int = 1,
        memory: str | tuple[str, ...] | None = None,
        stacks: tuple[int, ...] = (),
    ) -> float:
        """T ≥ min over integer splits of (m − 1)·Λ + Σ τ, Λ = max τ, with τ_i ≥ a_i·L_i + c_i and
        L_i ≤ the most layers stage i holds in memory with ZeRO stage `zero` over `replicas_total`
        (`stage_caps`). ZeRO-2/3 only add to a pass (its exposed collectives, ≥ 0), so the lines
        hold for them too; and so do the lines of their collectives (`weighted_lines`): the larger
        of the two bounds holds.

        Λ ≥ λ (the integer water level). For a given Λ the cheapest Σ τ is g(Λ): one layer per
        stage, the rest on the stages of smallest a_i up to what Λ and their memory let them hold; g
        falls as Λ rises but never below S = g(∞). So for Λ ≥ λ + Δ with Δ = (g(λ) − S)/(m − 1) the
        bound is at least (m − 1)·λ + g(λ), and below that g(Λ) ≥ g(λ + Δ): T ≥ (m − 1)·λ + g(λ +
        Δ), two evaluations of g. `flows`: the template's replicas, sharing island links (`send_s`);
        `memory`: the recompute modes of the caps (per-stage recompute: the most any of them holds;
        default `recompute`); `stacks`: `weighted_lines`'."""
        parts = (micro_batch, recompute, segments, replicas_total, flows, zero, memory or recompute)
        key = (*parts, stacks, micro_batches)
        if key not in self._pipelines:
            kinds = (False, True) if zero >= 2 and flows > 1 else (False,)
            self._pipelines[key] = max(
                self._pipeline(*parts, kind, stacks).at(micro_batches) for kind in kinds
            )
        return self._pipelines[key]

    def _pipeline(
        self,
        micro_batch: int,
        recompute: str,
        segments: tuple,
        replicas_total: int,
        flows: int,
        zero: int,
        memory: str | tuple[str, ...],
        collectives: bool,
        stacks: tuple[int, ...] = (),
    ) -> Pipeline:
        """`pipeline_bound`'s stage lines and caps at any micro-batches (`lines.Pipeline`),
        memoised: what does not depend on m is found once."""
        key = (
            micro_batch,
            recompute,
            segments,
            replicas_total,
            flows,
            zero,
            memory,
            collectives,
            stacks,
        )
        if key not in self._pipeline_parts:
            self._pipeline_parts[key] = Pipeline(
                self.stage_lines(
                    micro_batch, recompute, segments, flows, zero, collectives, stacks
                ),
                self.memory.stage_caps(micro_batch, memory, segments, replicas_total, zero),
                self.inst.model.layers,
            )
        return self._pipeline_parts[key]

    def stage0_drain(
        self, micro_batch: int, recompute: str, segments: tuple, replicas: int, spread: int = 1
    ):
        """A lower bound on how long the gradient all-reduce of a template's stage 0 outlasts the
        pipeline, as a function of stage 0's layers L (None where it is 0 for every L): DP(L) −
        o·pass(L) (dp_finish).

        DP(L) ≥ the inter-node ring of its R replicas (`ring_dp_line`). pass(L) is the backward
        pass with TP over the class's interconnect (None where its nodes differ inside). `spread`:
        its ring's (`SendBounds.spread`)."""
        seg, depth = segments[0], sum(sg.stages for sg in segments)
        # stage 0 is also the last only in a one-stage template; nothing else of the template
        # matters
        key = (
            micro_batch,
            recompute,
            seg.gpu,
            seg.island,
            seg.tp,
            seg.cp,
            depth == 1,
            replicas,
            spread,
        )
        if key not in self._drains:
            self._drains[key] = self._stage0_drain(
                micro_batch, recompute, segments, replicas, spread
            )
        return self._drains[key]

    def _stage0_drain(
        self, micro_batch: int, recompute: str, segments: tuple, replicas: int, spread: int
    ):
        inst, seg = self.inst, segments[0]
        depth = sum(sg.stages for sg in segments)  # 1: stage 0 is also the last (it holds the head)
        dp = self.ring_dp_line(seg, replicas, True, depth == 1, depth, spread)
        if dp is None:
            return None
        nodes = [
            n for n in inst.cluster.nodes.values() if (n.gpu, n.island) == (seg.gpu, seg.island)
        ]
        gpu = inst.gpu_types[seg.gpu]
        params = self.profiles.for_gpu(gpu, inst.spec.training.framework)
        intra = {inst.cluster.route(n.name, n.name) for n in nodes}
        if len({(r.effective_gbps, r.alpha_s, r.latency_us, r.mesh_peers) for r in intra}) > 1:
            # nodes of the class differ inside: no one interconnect bounds every stage's pass
            return None
        slow = next(iter(intra))

        def backward(layers: int) -> tuple[float, float]:
            work = stage_work(
                inst.model,
                gpu,
                micro_batch,
                inst.seq_len,
                seg.tp,
                True,
                inst.spec.training.attention,
                recompute,
                layers,
                True,
                depth == 1,
                slow,
                seg.cp,
                inst.format,
                inst.spec.training.norm_kernel,
            )
            host, dev = host_device(work, params.w)
            return float(host[BWD]), float(dev[BWD] + dev[BWD_TP])

        # host and device time are affine in L: read each off at 1 and 2 layers
        (h1, d1), (h2, d2) = backward(1), backward(2)
        return _Drain(
            Affine(*dp),
            Affine(h2 - h1, 2 * h1 - h2),
            Affine(d2 - d1, 2 * d1 - d2),
            params.launch_serial,
            params.dp_overlap,
        )

    def ring_dp_line(
        self, seg, replicas: int, first: bool, last: bool, depth: int, spread: int = 1
    ) -> tuple[float, float] | None:
        """(δ, c) with DP(L) ≥ δ·L + c for the gradient all-reduce of a stage of segment `seg`
        holding L layers among its R replicas (`first`, `last`: with the embedding, the head; a
        template of `depth` stages): the inter-node ring of a hierarchical all-reduce
        (comm.hierarchical_all_reduce: its intra-node part only adds). The replicas, TP groups of t
        GPUs, take at least ⌈R/k⌉ nodes with k = ⌊g/t⌋ of them in a node of g GPUs, ring at no
        more than the widest route between two nodes of the class under the fastest planning
        cluster (`class_ring`), each node pushing its t columns (with CP each replica's cp ranks
        reduce inside its node first: the ring between nodes is as without). None where one node
        can hold every replica's stage, or a weight < 0 (no profile has one) bends the line.
        `spread` ≥ 2 (`SendBounds.spread`): over R nodes, one replica each, at 1/spread of a NIC."""
        key = (seg.gpu, seg.island, seg.tp, seg.cp, replicas, first, last, depth > 1, spread)
        if key in self._ring_lines:
            return self._ring_lines[key]
        inst, width = self.inst, seg.width
        nodes = [n for n in inst.cluster.nodes.values() if (n.gpu, n.island) == key[:2]]
        per_node = max(n.gpus // width for n in nodes)
        ring = self.sends.class_ring(key[:2], width, replicas, spread)
        line = None
        apart = replicas > per_node or spread > 1  # the replicas are on more than one node
        if replicas > 1 and per_node >= 1 and apart and ring is not None:
            ring_nodes, gbps, latency_s, alpha_s = ring
            w = self.profiles.for_gpu(inst.gpu_types[seg.gpu], inst.spec.training.framework).w
            grad_bytes = grad_comm_bytes(inst)

            def dp_s(layers: int) -> float:
                held = stage_params(inst.model, layers, first, last, depth)
                rank_bytes = held / seg.tp * grad_bytes
                transfer = all_reduce(
                    seg.tp * rank_bytes, ring_nodes, gbps, False, latency_s, alpha_s
                )
                return float(transfer @ w)

            dp1, dp2 = dp_s(1), dp_s(2)  # affine in L: read off at 1 and 2 layers
            if 0 <= dp1 <= dp2 <= 2 * dp1:
                line = (dp2 - dp1, 2 * dp1 - dp2)
        self._ring_lines[key] = line
        return line

    def replica_lines(
        self,
        seg,
        micro_batch: int,
        recompute: str,
        replicas: int,
        first: bool,
        last: bool,
        depth: int,
        spread: int = 1,
    ) -> tuple[Line, Line, Line, float]:
        """What a stage of segment `seg` cannot shed among R replicas: (forward, backward, DP, o)
        with its passes y ≥ a·L + c (`pass_lines`; `first`, `last`: it holds the embedding, the
        head), its gradient all-reduce DP(L) ≥ δ·L + c_dp (`ring_dp_line`; (0, 0) where it has no
        ring between nodes) and o its GPU type's dp_overlap."""
        inst = self.inst
        params = self.profiles.for_gpu(inst.gpu_types[seg.gpu], inst.spec.training.framework)
        forward, backward = self.pass_lines(
            seg.gpu, seg.tp, micro_batch, recompute, first, last, seg.cp
        )
        dp = self.ring_dp_line(seg, replicas, first, last, depth, spread) or (0.0, 0.0)
        return forward, backward, dp, float(params.dp_overlap)

    def unshed_per_layer(
        self,
        seg,
        micro_batch: int,
        recompute: str,
        replicas: int,
        micro_batches: int,
    ) -> float:
        """e with T ≥ e·L for a stage of segment `seg` holding L layers, in a template of R replicas
        and m micro-batches each (1F1B, ZeRO ≤ 1): the stage's last backward ends no earlier than
        m·(f + b) (the pipeline is at least (m − 1)·τ + Σ τ, and the stages before it finish their
        last backward and sends after it: dp_finish), and its gradient all-reduce DP starts o·b
        before that, so T ≥ m·f + (m − o)·b + DP. With each line y ≥ a·L + c ≥ max(0, a + min(c,
        0))·L for L ≥ 1 (a time is never negative; `replica_lines`), e = m·f' + (m − o)·b' + δ',
        which rises with m and R (δ: the ring spans more nodes)."""
        key = (seg.gpu, seg.island, seg.tp, seg.cp, micro_batch, recompute, replicas, micro_batches)
        if key not in self._unshed:
            # a middle stage of a deep template: the first and last only add work and bytes
            (af, cf), (ab, cb), (delta, c_dp), o = self.replica_lines(
                seg, micro_batch, recompute, replicas, False, False, 3
            )
            m = micro_batches

            def per_layer(a: float, c: float) -> float:
                return max(0.0, a + min(c, 0.0))

            self._unshed[key] = (
                m * per_layer(af, cf) + (m - o) * per_layer(ab, cb) + per_layer(delta, c_dp)
            )
        return self._unshed[key]

    def replica_bound(
        self,
        micro_batch: int,
        recompute: str,
        segments: tuple,
        replicas: int,
        micro_batches: int,
        caps: list[int] | None = None,
        beaten: float = 0.0,
        spreads: tuple[int, ...] = (),
    ) -> float:
        """What each stage of a template of R replicas and m micro-batches each cannot shed (1F1B,
        ZeRO ≤ 1): stage i's last backward ends no earlier than m·(f_i + b_i), and its gradient
        all-reduce DP_i starts o·b_i before that (`unshed_per_layer`), so T ≥ m·f_i + (m − o)·b_i +
        DP_i ≥ e_i·L_i + c_i with each part's line (`replica_lines`: the first stage's embedding,
        the last's head). T ≥ the least max_i (e_i·L_i + c_i) over integer splits within the memory
        `caps` (`integer_level`). It rises with m and R where every e_i ≥ 0 and each stage's
        f + b line is at least 0 at one layer (else 0: no bound). Where the real-valued level plus
        one layer of the steepest stage stays at or below `beaten` (a bound known already), 0 is
        returned without the integer level: uncapped, it cannot exceed that sum; the caps could
        raise it further, a strength given up for speed (106,000 integer levels cost 16 s of a
        4,096-GPU search). `spreads`: per segment, its rings' (`SendBounds.spread`; none: 1)."""
        weighted: list[tuple[float, float, int]] = []
        depth, m = sum(seg.stages for seg in segments), micro_batches
        shed = True  # every stage's all-reduce hides behind o·b
        parts = [
            (seg, spreads[k] if spreads else 1, part)
            for k, seg in enumerate(segments)
            for part in segment_parts(sum(g.stages for g in segments[:k]), seg.stages, depth)
        ]
        for seg, spread, (first, last, count) in parts:
            (af, cf), (ab, cb), (d, c_dp), o = self.replica_lines(
                seg, micro_batch, recompute, replicas, first, last, depth, spread
            )
            e, c = m * af + (m - o) * ab + d, m * cf + (m - o) * cb + c_dp
            if e <= 0 or af + ab < 0 or af + ab + cf + cb < 0:
                return 0.0
            weighted.append((e, c, count))
            shed = shed and d <= o * ab and c_dp <= o * cb
        if shed:  # every line at most m·(f + b)'s: the pipeline bound holds this one already
            return 0.0
        layers = self.inst.model.layers
        steepest = max(e for e, _, _ in weighted)
        if water_level(weighted, layers, depth) + steepest <= beaten:
            return 0.0
        lines = [(e, c) for e, c, count in weighted for _ in range(count)]
        return integer_level(lines, layers, caps)

    def drained_bound(
        self,
        micro_batch: int,
        recompute: str,
        template,
        replicas_total: int,
        virtual_stages: int = 1,
        zero: int = 1,
        memory: str | tuple[str, ...] | None = None,
        every_stage: bool = False,
        packing: tuple | None = None,
    ) -> float:
        """One template's `pipeline_bound` (memory caps at ZeRO stage `zero` over `replicas_total`),
        raised by its stage 0's gradient all-reduce where that must outlast the pipeline
        (`stage0_drain`, `drained_pipeline`; ZeRO-2/3 have no such all-reduce: they reduce-scatter
        in every backward pass). Interleaved with v chunks per stage the pipeline is (1/v)·[(v·m −
        1)·max τ + Σ τ]: the bound of v·m micro-batches, divided by v (memory caps at one chunk:
        interleaving only holds more). `memory`: the recompute modes of the memory caps (per-stage
        recompute: the most any of them holds; default `recompute`), whose most-work mode prices
        stage 0's backward pass beside its all-reduce (the longest pass: the least drain). Without
        interleaving, at ZeRO ≤ 1, also at least `replica_bound` (what each stage cannot shed) and,
        with `every_stage`, the pipeline at one flow's sends plus `drain_excess` (every stage's
        all-reduce: the least levels ask for it; a skeleton's own bound does not, where it cost
        more search time than it saved). `packing`: (placement order, `SendBounds.packed` of the
        plan) where both are known: the stage order's sends share NICs (`SendBounds.stacked`), the
        replica order's rings do (`SendBounds.spread`)."""
        segments, m, v = template.segments, template.micro_batches, virtual_stages
        memory = memory or recompute
        stacks, spreads = self.packing_effects(segments, template.replicas, packing)
        key = (
            micro_batch,
            recompute,
            segments,
            m,
            replicas_total,
            template.replicas,
            v,
            zero,
            memory,
            every_stage,
            stacks,
            spreads,
        )
        if key not in self._drained:
            flows = template.replicas
            bound = (
                self.pipeline_bound(
                    micro_batch,
                    recompute,
                    segments,
                    v * m,
                    replicas_total,
                    flows,
                    zero,
                    memory,
                    stacks,
                )
                / v
            )
            longest = memory if isinstance(memory, str) else most_work(memory)
            spread = spreads[0] if spreads else 1
            drain = (
                self.stage0_drain(micro_batch, longest, segments, template.replicas, spread)
                if zero <= 1
                else None
            )
            if drain is not None and math.isfinite(bound):
                parts = (
                    micro_batch,
                    recompute,
                    memory,
                    longest,
                    segments,
                    flows,
                    replicas_total,
                    stacks,
                    spread,
                )
                if (*parts, zero) not in self._drained_parts:
                    self._drained_parts[(*parts, zero)] = DrainedPipeline(
                        self.stage_lines(micro_batch, recompute, segments, flows, stacks=stacks),
                        self.memory.stage_caps(micro_batch, memory, segments, replicas_total, zero),
                        self.inst.model.layers,
                        drain,
                    )
                bound = max(bound, self._drained_parts[(*parts, zero)].at(m, v))
            if every_stage and v == 1 and zero <= 1 and math.isfinite(bound):
                excess = self.drain_excess(
                    micro_batch,
                    recompute,
                    segments,
                    template.replicas,
                    replicas_total,
                    zero,
                    memory,
                    spreads,
                )
                if excess > 0:  # every stage's all-reduce, beside the pipeline at one flow's sends
                    pipe = self.pipeline_bound(
                        micro_batch, recompute, segments, m, replicas_total, 1, zero, memory
                    )
                    bound = max(bound, pipe + excess)
            if v == 1 and zero <= 1 and math.isfinite(bound):  # what no stage can shed
                caps = self.memory.stage_caps(micro_batch, memory, segments, replicas_total, zero)
                bound = max(
                    bound,
                    self.replica_bound(
                        micro_batch,
                        recompute,
                        segments,
                        template.replicas,
                        m,
                        caps,
                        bound,
                        spreads,
                    ),
                )
            self._drained[key] = bound
        return self._drained[key]

    def packing_effects(
        self, segments: tuple, replicas: int, packing: tuple | None
    ) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """(stacks, spreads) of a template's segments at R replicas under `packing` (placement
        order, packed classes as `SendBounds.packed`): per segment, `SendBounds.stacked` in the
        stage order, `SendBounds.spread` in the replica order (with the template's stages on the
        segment's class); () each where nothing is known or nothing changes. Memoised: every
        `drained_bound` asks before its own memo."""
        if packing is None or not packing[1]:
            return (), ()
        key = (segments, replicas, packing)
        if key not in self._effects:
            self._effects[key] = self._packing_effects(segments, replicas, packing)
        return self._effects[key]

    def _packing_effects(
        self, segments: tuple, replicas: int, packing: tuple
    ) -> tuple[tuple[int, ...], tuple[int, ...]]:
        order, packed = packing
        k_of = {key: (k, on) for key, k, on in packed}
        ks = [k_of.get((seg.gpu, seg.island), (None, 0))[0] for seg in segments]
        if order == "stage":
            stacks = tuple(1 if k is None else self.sends.stacked(replicas, k) for k in ks)
            return (stacks if max(stacks) > 1 else ()), ()
        if order == "replica":
            on: dict[tuple[str, str], int] = {}
            for seg in segments:
                on[seg.gpu, seg.island] = on.get((seg.gpu, seg.island), 0) + seg.stages
            spreads = tuple(
                1
                if k is None
                else self.sends.spread(
                    replicas, k, on[seg.gpu, seg.island], k_of[seg.gpu, seg.island][1] == 1
                )
                for seg, k in zip(segments, ks, strict=True)
            )
            return (), (spreads if max(spreads) > 1 else ())
        return (), ()

    def drain_excess(
        self,
        micro_batch: int,
        recompute: str,
        segments: tuple,
        replicas: int,
        replicas_total: int,
        zero: int,
        memory: str | tuple[str, ...],
        spreads: tuple[int, ...] = (),
    ) -> float:
        """E with T ≥ P + E for a template of R replicas (1F1B, ZeRO ≤ 1), P its `pipeline_bound`
        with one flow's sends: what every stage's gradient all-reduce adds to the pipeline.

        Stage i's last backward pass ends Σ_{k<i} c_k + s_i before T_sync, its all-reduce starts
        o_i·b_i before that and takes DP_i (dp_finish), and c_k + s_k ≤ τ_k − f_k, o·b_i + s_i ≤
        τ_i − f_i (f the forward pass). With T_sync ≥ (m − 1)·max τ + Σ τ: T ≥ (m − 1)·max τ +
        Σ_{k>i} τ_k + Σ_{k≤i} f_k + DP_i for every i. With lines τ ≥ τ̂ (`stage_lines`, one flow),
        f ≥ f̂ (`pass_lines`), DP ≥ D̂ (`ring_dp_line`, 0 without a ring between nodes) that is
        (m − 1)·max τ̂ + Σ τ̂ + D̂_i − Σ_{k≤i} (τ̂_k − f̂_k); the least over splits of the first part
        is P, of the max over i of the rest `least_drain` (chain c_k = τ̂_k − f̂_k, own e_i =
        D̂_i − c_i), within the memory caps. Independent of m, and rises with R (D̂ does);
        memoised. `spreads`: `replica_bound`'s."""
        key = (micro_batch, recompute, segments, replicas, replicas_total, zero, memory, spreads)
        if key not in self._excess:
            depth = sum(seg.stages for seg in segments)
            caps = self.memory.stage_caps(micro_batch, memory, segments, replicas_total, zero)
            taus = self.stage_lines(micro_batch, recompute, segments, 1, zero)
            own, chain, rings = [], [], False
            stages = [
                (seg, spreads[k] if spreads else 1)
                for k, seg in enumerate(segments)
                for _ in range(seg.stages)
            ]
            for i, (seg, spread) in enumerate(stages):
                first, last = i == 0, i == depth - 1
                (af, cf), _ = self.pass_lines(
                    seg.gpu, seg.tp, micro_batch, recompute, first, last, seg.cp
                )
                ring = self.ring_dp_line(seg, replicas, first, last, depth, spread)
                rings = rings or ring is not None
                d, c_dp = ring or (0.0, 0.0)
                n = np.arange(1, caps[i] + 1, dtype=float)
                back = (taus[i][0] - af) * n + (taus[i][1] - cf)
                own.append(d * n + c_dp - back)
                chain.append(back)
            excess = 0.0
            if depth > 1 and rings:
                excess = least_drain(own, chain, self.inst.model.layers)
            self._excess[key] = excess
        return self._excess[key]

    def group_bound(
        self,
        micro_batch: int,
        recompute: str,
        segments: tuple,
        micro_batches: int,
        flows: int = 1,
        virtual_stages: int = 1,
        zero: int = 1,
    ) -> float:
        """A cheaper and weaker bound than `pipeline_bound`, for keying whole groups: (m − 1)·λ* + S
        with λ* the real-valued water level (at most the integer one), on lines with multiplicities;
        `flows`: the fewest replicas of the group's skeletons (their sends share island links,
        `send_s`); with `virtual_stages` v (the most of the group's) (m − 1/v)·λ* + S/v. A group of
        one ZeRO stage `zero` ≥ 2 (its replicas `flows`) takes the larger bound of its compute and
        its collectives' lines."""
        kinds = (False, True) if zero >= 2 and flows > 1 else (False,)
        v, out = virtual_stages, 0.0
        for collectives in kinds:
            key = (micro_batch, recompute, segments, flows, zero if zero >= 2 else 1, collectives)
            if key not in self._real_levels:
                weighted = self.weighted_lines(
                    micro_batch, recompute, segments, flows, zero, collectives
                )
                p = sum(seg.stages for seg in segments)
                layers = self.inst.model.layers
                self._real_levels[key] = (
                    water_level(weighted, layers, p),
                    sum_bound(weighted, layers),
                )
            lam, s = self._real_levels[key]
            out = max(out, (micro_batches - 1 / v) * lam + s / v)
        return out

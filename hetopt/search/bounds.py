"""Lower bounds and memory tests that order and prune the search (DESIGN 4), each with its
statement.

A bound holds for every skeleton in the set it keys (a family, a replica count, a group, a range of
replica counts, one skeleton): no split of any of them is faster. Bounds need no placement: every
stage's time per micro-batch τ_i(L) ≥ a_i·L + c_i (`Bounds.stage_line`: one of the two linear pieces
of the host/device overlap, TP over the fastest interconnect its GPU type has), plus the sends a
stage must make wherever it goes (`Bounds.send_s`: the fastest pair of nodes, under the fastest
planning cluster) — so they hold under every scenario. Memory tests use the evaluator's own memory
model, affine in a stage's layers. Every node's bound is checked against the skeletons under it
(tests/test_bounds.py), and the skeleton bounds against every split of sampled skeletons, robust
objectives included (tests/test_planner.py).

Each bound, the set it keys, and its statement:

- `family_bound` (a family (classes × TP)): T ≥ M·N / Σ_k G_k/(t_k·a_k)
- `pair_table` (every group of a pair family): `range_bound` of each, vectorised
- `bucket_bound` (a family at R, counts fixed): T ≥ (m − 1)·λ + max(λ, N·min a), λ = N/max Σ n_k/a_k
- `group_bound` (a one-template group): T ≥ (m − 1)·λ* + S (real water level λ*)
- `range_bound` (a two-template range): M / Σ_j R_j/λ_j ∨ pair_bound, least at a vertex
- `pair_bound` (two templates at R_a, R_b): M ≤ Σ_j R_j·((T − S_j)/λ_j + 1)
- `compute_lower_bound` (one skeleton): T ≥ max_j [(m_j − 1)·λ_j + g_j(λ_j + Δ_j)] + T_opt
- `shard_bound` (one skeleton with shards): T ≥ (m − 1)·λ + S, each stage its steepest rank's line
- `lockstep_bound` (a uniform layout's skeleton): T ≥ (m − 1)·λ + min_j S_j, τ_i its lines' max
- `triple_family_bound` (three runs (class × TP)): T ≥ M / Σ_k G_k/(t·a_k·N), then the ring exchange
- `triple_table` (a triple family's groups): `triple_bound` of each, at once (numpy)
- `triple_bound` (three templates, a box of R): M / Σ_j R_j/λ_j ∨ the next, least at a corner
- `triple_replicas_bound` (three templates at R_j): M ≤ Σ_j R_j·((T − S_j)/λ_j + 1)
- `exchange_s` (two templates' classes): T_cross ≥ G/c over the fastest node pair, alone
- `ring_exchange_s` (three templates): each pair a hop of the ring: the slowest exchange_s

A `Bounds` belongs to one search run (one instance, one set of profiles): its caches live and die
with it, so no two runs ever share an entry.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import math
from collections import Counter
from dataclasses import dataclass, replace
from types import SimpleNamespace

import numpy as np

from hetopt.cost.comm import all_reduce, group_gbps, reduce_scatter, transfer
from hetopt.cost.compute import ACT_BYTES, optimizer_step
from hetopt.cost.features import shared_gbps, slowest_transfer
from hetopt.cost.flops import layer_params, total_params
from hetopt.cost.memory import GIB, WEIGHT_BYTES, stage_params
from hetopt.cost.profiles import Profiles
from hetopt.cost.terms import ITER, LAT, LINK, NET, STEP
from hetopt.evaluate import (
    BWD,
    BWD_TP,
    FWD,
    FWD_TP,
    grad_comm_bytes,
    host_device,
    overlap_host_device,
    p2p_features,
    stage_memory,
    stage_work,
)
from hetopt.search.linear import Affine
from hetopt.search.space import Skeleton, Template, least_work, most_work
from hetopt.spec.instance import Instance

Line = tuple[float, float]
"""(a, c): τ(L) ≥ a·L + c, seconds per micro-batch."""


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


class Bounds:
    """The bounds and memory tests of one search run over `inst` priced by `profiles` (module
    docstring).

    Parameters: inst — the instance; profiles — the calibrated weights the evaluator uses.
    Every method is memoised on this object only."""

    def __init__(self, inst: Instance, profiles: Profiles, clusters: list | None = None) -> None:
        self.inst, self.profiles = inst, profiles
        self.clusters = clusters or [inst.cluster]
        """Every cluster a plan is timed on (the planning scenarios'): a send is bounded by its
        fastest."""
        self._sends: dict[tuple, float] = {}
        self._segments: dict[tuple, list[tuple[float, float, int]]] = {}
        self._lines: dict[tuple, Line] = {}
        self._templates: dict[tuple, tuple[float, float]] = {}
        self._real_levels: dict[tuple, tuple[float, float]] = {}
        self._pipelines: dict[tuple, float] = {}
        self._fits: dict[tuple, bool] = {}
        self._memory: dict[tuple, ClassMemory] = {}
        self._drains: dict[tuple, _Drain | None] = {}
        self._drained: dict[tuple, float] = {}
        self._buckets: dict[tuple, tuple] = {}
        self._pairs: dict[tuple, tuple] = {}
        self._exchange: dict[tuple, float] = {}
        self._triples: dict[tuple, float] = {}
        self._takes: dict[tuple, np.ndarray] = {}
        self._rings: dict[tuple, float] = {}
        self._capped: dict[tuple, tuple[float, float]] = {}
        self._zero: dict[tuple, float] = {}
        self._optimizer: dict[tuple, float] = {}

    # -- one stage
    # ------------------------------------------------------------------------------------

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

    def send_s(
        self, src: tuple[str, str], dst: tuple[str, str], tp: int, micro_batch: int, flows: int = 1
    ) -> float:
        """Least seconds of one activation (or gradient) send from a stage of device class `src`
        (GPU type, island) of `tp` GPUs (its TP·CP ranks, each sending its share) to a stage of
        class `dst`: the fastest pair of their nodes (features.p2p_features, priced with the
        sender's weights), under the fastest planning cluster. Different GPU types never share a
        node, so a send between classes always crosses NICs. Alone on its links — except that
        between islands the `flows` replicas of a template all cross the same island links at once
        (every route from one island to another takes the same island path, Cluster.island_path), so
        each gets at most 1/flows of them (their max-min share, as p2p_features prices it)."""
        if src[1] == dst[1]:
            # inside one island the replicas share no island link (their NICs are not bounded)
            flows = 1
        key = (src, dst, tp, micro_batch, flows)
        if key not in self._sends:
            inst = self.inst
            nbytes = ACT_BYTES * micro_batch * inst.seq_len * inst.model.hidden
            w = self.profiles.for_gpu(inst.gpu_types[src[0]], inst.spec.training.framework).w
            self._sends[key] = min(
                float(self._send_features(cluster, a, b, nbytes, tp, flows) @ w)
                for cluster in self.clusters
                for a, b in self.node_pairs(src, dst)
            )
        return self._sends[key]

    def node_pairs(self, src: tuple[str, str], dst: tuple[str, str]) -> list[tuple[str, str]]:
        """Node pairs standing for every pair of a node of class `src` and one of `dst`: the nodes
        of a node group are identical, so the first of each group stands for it, and within one
        group also its first two (a pair of distinct nodes); a node with itself where `src` is
        `dst`."""
        nodes = self.inst.cluster.nodes
        groups: dict[str, list[str]] = {}
        for node in nodes.values():
            groups.setdefault(node.group, []).append(node.name)
        reps = {
            cls: [
                names
                for names in groups.values()
                if (nodes[names[0]].gpu, nodes[names[0]].island) == cls
            ]
            for cls in (src, dst)
        }
        pairs = []
        for a_names in reps[src]:
            for b_names in reps[dst]:
                pairs.append((a_names[0], b_names[0]))
                if a_names is b_names and len(a_names) > 1:
                    pairs.append((a_names[0], a_names[1]))
        return pairs

    @staticmethod
    def _send_features(cluster, a: str, b: str, nbytes: float, tp: int, flows: int):
        route = cluster.route(a, b)
        if flows <= 1 or len(route.edges) <= 2:  # alone, or inside one island: NICs are not shared
            return p2p_features(cluster, [a], [b], nbytes, tp)
        # the edges between the two NIC edges are island links, which every replica's send crosses
        return slowest_transfer([(route, nbytes)], Counter({e: flows for e in route.edges[1:-1]}))

    # -- one template
    # ---------------------------------------------------------------------------------

    def zero_per_layer(self, seg, replicas: int, zero: int) -> tuple[float, float]:
        """(k^f, k^b): seconds per layer of a stage's ZeRO-2/3 collectives in one micro-batch's
        forward and backward pass, K^p(L) ≥ k^p·L wherever the stage goes (0 without ZeRO-2/3 or
        with one replica).

        Per pass (features.zero_stage): ZeRO-2 reduce-scatters the gradients in the backward pass,
        ZeRO-3 also all-gathers the 16-bit weights in both passes; over the stage's R replicas.
        Where R ≤ g/t (g GPUs per node) they may share one node: the collective on the fastest
        interconnect of the class's nodes; else — or where that is slower — they span ≥ ⌈R/(g/t)⌉ ≥
        2 nodes, and each node pushes (N−1)/N of its t columns' bytes across at no more than the
        widest route between two nodes of the class under the fastest planning cluster
        (comm.hierarchical_reduce_scatter: the intra-node phase only adds). Per layer: the
        collectives' cost at 2 layers less at 1 (latency and the embedding or head only add)."""
        if zero < 2 or replicas <= 1:
            return 0.0, 0.0
        gather = WEIGHT_BYTES if zero >= 3 else 0.0  # ZeRO-3 all-gathers the weights in both passes
        return (
            self.collective_per_layer(seg, replicas, gather),
            self.collective_per_layer(seg, replicas, grad_comm_bytes(self.inst) + gather),
        )

    def collective_per_layer(self, seg, replicas: int, bytes_per_param: float) -> float:
        """Seconds per layer of a reduce-scatter (or all-gather: the same cost) of `bytes_per_param`
        per parameter of a stage of `seg`'s class among its R replicas, wherever they go
        (`zero_per_layer`)."""
        if replicas <= 1 or bytes_per_param <= 0:
            return 0.0
        key = (seg.gpu, seg.island, seg.tp, replicas, bytes_per_param)
        if key not in self._zero:
            inst = self.inst
            here = (seg.gpu, seg.island)
            nodes = [n for n in inst.cluster.nodes.values() if (n.gpu, n.island) == here]
            per_node = max(n.gpus // seg.tp for n in nodes)
            rank_bytes = layer_params(inst.model) / seg.tp * bytes_per_param
            w = self.profiles.for_gpu(inst.gpu_types[seg.gpu], inst.spec.training.framework).w
            options = []
            if replicas <= per_node:  # one node per node group stands for its identical nodes
                for node in {a for a, b in self.node_pairs(here, here) if a == b}:
                    route = inst.cluster.route(node, node)
                    gbps = group_gbps(route, replicas)
                    options.append(
                        float(
                            (
                                reduce_scatter(2 * rank_bytes, replicas, gbps, route.intra_node)
                                - reduce_scatter(rank_bytes, replicas, gbps, route.intra_node)
                            )
                            @ w
                        )
                    )
            if (ring := self.class_ring(here, seg.tp, replicas)) is not None:
                ring_nodes, gbps = ring[:2]
                volume = seg.tp * rank_bytes  # the node's t columns
                options.append(
                    float(
                        (
                            reduce_scatter(2 * volume, ring_nodes, gbps, False)
                            - reduce_scatter(volume, ring_nodes, gbps, False)
                        )
                        @ w
                    )
                )
            self._zero[key] = max(0.0, min(options, default=0.0))
        return self._zero[key]

    def class_ring(
        self, here: tuple[str, str], tp: int, replicas: int
    ) -> tuple[int, float, float, float] | None:
        """The ring of a stage's R replicas (class `here`, TP t) over nodes: at least ⌈R/k⌉ ≥ 2 of
        them (k = ⌊g/t⌋ stages per node), joined at no more than the widest route between two
        distinct nodes of the class and no less than its least latencies, under the fastest planning
        cluster: (nodes, Gbit/s, latency s, fabric latency s); None where the class has one node."""
        nodes = [n for n in self.inst.cluster.nodes.values() if (n.gpu, n.island) == here]
        per_node = max(n.gpus // tp for n in nodes)
        pairs = [
            (a, b) for a, b in self.node_pairs(here, here) if a != b
        ]  # the ring joins distinct nodes
        if not pairs or per_node < 1:
            return None
        routes = [c.route(a, b) for c in self.clusters for a, b in pairs]
        return (
            max(2, -(-replicas // per_node)),
            max(r.effective_gbps for r in routes),
            min(r.latency_us for r in routes) * 1e-6,
            min(r.alpha_s for r in routes),
        )

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
                o = float((optimizer_step(2 * per_layer, gpu) - optimizer_step(per_layer, gpu)) @ w)
                if zero == 2:
                    o += self.collective_per_layer(seg, template.replicas, WEIGHT_BYTES)
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
        both hold."""
        weighted = []
        n = len(segments)
        for j, seg in enumerate(segments):
            nxt = (segments[j + 1].gpu, segments[j + 1].island) if j + 1 < n else None
            prv = (segments[j - 1].gpu, segments[j - 1].island) if j > 0 else None
            weighted += self._segment_lines(
                seg, prv, nxt, micro_batch, recompute, flows, zero, collectives
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
    ) -> list[tuple[float, float, int]]:
        """`weighted_lines` of one segment between the classes `prv` and `nxt` (None: the pipeline's
        end), memoised: segments recur across the groups of a family."""
        key = (seg, prv, nxt, micro_batch, recompute, flows, zero, collectives)
        if key not in self._segments:
            here = (seg.gpu, seg.island)
            inner = self.send_s(here, here, seg.width, micro_batch)
            k_pass = self.zero_per_layer(seg, flows, zero)
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
                if not last:  # activation forward
                    c += (
                        self.send_s(here, nxt, seg.width, micro_batch, flows)
                        if k == seg.stages - 1
                        else inner
                    )
                if not first:  # gradient back
                    c += self.send_s(here, prv, seg.width, micro_batch, flows) if k == 0 else inner
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
    ) -> list[Line]:
        """(a_i, c_i) of every stage, in order."""
        return [
            (a, c)
            for a, c, n in self.weighted_lines(
                micro_batch, recompute, segments, flows, zero, collectives
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
            caps = self.stage_caps(micro_batch, memory, segments, replicas_total, zero)
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
        default `recompute`)."""
        memory = memory or recompute
        key = (micro_batch, recompute, segments, micro_batches, replicas_total, flows, zero, memory)
        if key not in self._pipelines:
            caps = self.stage_caps(micro_batch, memory, segments, replicas_total, zero)
            kinds = (False, True) if zero >= 2 and flows > 1 else (False,)
            self._pipelines[key] = max(
                pipeline_at(
                    self.stage_lines(micro_batch, recompute, segments, flows, zero, collectives),
                    caps,
                    self.inst.model.layers,
                    micro_batches,
                )
                for collectives in kinds
            )
        return self._pipelines[key]

    def stage0_drain(self, micro_batch: int, recompute: str, segments: tuple, replicas: int):
        """A lower bound on how long the gradient all-reduce of a template's stage 0 outlasts the
        pipeline, as a function of stage 0's layers L (None where it is 0 for every L): DP(L) −
        o·pass(L) (dp_finish).

        DP(L) ≥ the inter-node ring of a hierarchical all-reduce (comm.hierarchical_all_reduce: its
        intra-node part only adds): the stage's R replicas, TP groups of t GPUs, take at least ⌈R/k⌉
        nodes with k = ⌊g/t⌋ of them in a node of g GPUs, ring at no more than the widest route
        between two nodes of the class under the fastest planning cluster, each node pushing its t
        columns. pass(L) is the backward pass with TP over the class's interconnect (None where its
        nodes differ inside)."""
        seg, depth = segments[0], sum(sg.stages for sg in segments)
        # stage 0 is also the last only in a one-stage template; nothing else of the template
        # matters
        key = (micro_batch, recompute, seg.gpu, seg.island, seg.tp, seg.cp, depth == 1, replicas)
        if key not in self._drains:
            self._drains[key] = self._stage0_drain(micro_batch, recompute, segments, replicas)
        return self._drains[key]

    def _stage0_drain(self, micro_batch: int, recompute: str, segments: tuple, replicas: int):
        inst, seg = self.inst, segments[0]
        nodes = [
            n for n in inst.cluster.nodes.values() if (n.gpu, n.island) == (seg.gpu, seg.island)
        ]
        per_node = max(n.gpus // seg.width for n in nodes)
        if replicas <= 1 or per_node < 1 or replicas <= per_node:
            return None  # one node can hold every replica's stage 0: no network ring to bound
        # with CP each replica's cp ranks reduce inside its node first: the ring between nodes is as
        # without
        ring = self.class_ring((seg.gpu, seg.island), seg.width, replicas)
        if ring is None:
            return None
        ring_nodes, gbps, latency_s, alpha_s = ring
        gpu = inst.gpu_types[seg.gpu]
        params = self.profiles.for_gpu(gpu, inst.spec.training.framework)
        depth = sum(sg.stages for sg in segments)  # 1: stage 0 is also the last (it holds the head)
        grad_bytes = grad_comm_bytes(inst)
        intra = {inst.cluster.route(n.name, n.name) for n in nodes}
        if len({(r.effective_gbps, r.alpha_s, r.latency_us, r.mesh_peers) for r in intra}) > 1:
            # nodes of the class differ inside: no one interconnect bounds every stage's pass
            return None
        slow = next(iter(intra))

        def dp_s(layers: int) -> float:
            rank_bytes = (
                stage_params(inst.model, layers, True, depth == 1, depth) / seg.tp * grad_bytes
            )
            return float(
                all_reduce(seg.tp * rank_bytes, ring_nodes, gbps, False, latency_s, alpha_s)
                @ params.w
            )

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
            )
            host, dev = host_device(work, params.w)
            return float(host[BWD]), float(dev[BWD] + dev[BWD_TP])

        # DP, host and device time are affine in L: read each off at 1 and 2 layers
        (dp1, dp2), ((h1, d1), (h2, d2)) = (dp_s(1), dp_s(2)), (backward(1), backward(2))
        return _Drain(
            Affine(dp2 - dp1, 2 * dp1 - dp2),
            Affine(h2 - h1, 2 * h1 - h2),
            Affine(d2 - d1, 2 * d1 - d2),
            params.launch_serial,
            params.dp_overlap,
        )

    # -- keys of the search's sets
    # ------------------------------------------------------------------------

    def compute_lower_bound(self, sk: Skeleton) -> float:
        """A bound no split of this skeleton that fits in memory beats: the iteration waits for
        every template's pipeline (and gradient reduction), then two templates' exchange
        (`exchange_s`), then for the optimizer step (`optimizer_bound`); with shards
        `shard_bound`."""
        if sk.shards:
            return self.shard_bound(sk)
        if sk.lockstep:
            return self.lockstep_bound(sk)
        replicas_total = sum(t.replicas for t in sk.templates)
        # per-stage recompute: compute at the least-work mode, memory at the most any mode holds,
        # and the all-reduce's overlap with stage 0's backward pass at the most-work mode — each the
        # side no mix of modes can beat
        return (
            max(
                self.drained_bound(
                    sk.micro_batch,
                    sk.recompute,
                    t,
                    replicas_total,
                    sk.virtual_stages,
                    sk.zero,
                    sk.memory_modes,
                )
                for t in sk.templates
            )
            + max(self.optimizer_bound(t, replicas_total, sk.zero) for t in sk.templates)
            + self.ring_exchange_s(tuple(t.segments for t in sk.templates))
        )

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
                    self.stage_line(g, seg.tp, q, sk.recompute, i == 0, i == p - 1)
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
                self.stage_line(seg.gpu, seg.tp, sk.micro_batch, sk.recompute, i == 0, i == p - 1)
                for i, seg in enumerate(t.stage_list())
            ]
            for t in sk.templates
        ]
        by_stage = [[t_lines[i] for t_lines in lines] for i in range(p)]
        total = min(sum_bound([(a, c, 1) for a, c in t_lines], layers) for t_lines in lines)
        replicas_total = sum(t.replicas for t in sk.templates)
        t_opt = max(self.optimizer_bound(t, replicas_total, sk.zero) for t in sk.templates)
        together = (t0.micro_batches - 1) * lockstep_level(by_stage, layers) + total + t_opt
        return max(together, self.compute_lower_bound(replace(sk, lockstep=False)))

    def triple_family_bound(self, family) -> float:
        """Every skeleton of a triple family (hetopt.search.triples.TripleFamily) from throughput
        alone, as `family_bound` for a pair: a stage of class k at TP t takes τ ≥ a_k·L, so template
        j's replicas take M_j = R_j·m_j ≤ T·R_j·p_j/(a_k·N) micro-batches, and the templates share
        each class's G_k GPUs (Σ_j R_j·p_j·t_j ≤ G_k): T ≥ M / Σ_k G_k·max_j 1/(t_j·a_k·N), a class
        of two runs counted once at the better rate; then the ring exchange among the runs' classes
        (`ring_exchange_s`)."""
        rc, layers = least_work(family.recompute_options), self.inst.model.layers
        rates: dict[tuple[str, str], float] = {}
        for dc, tp in family.runs:
            a = self.per_layer_s(dc.gpu, tp, family.micro_batch, rc)
            if a <= 0:
                return 0.0
            rates[dc.key] = max(rates.get(dc.key, 0.0), dc.gpus / (tp * a * layers))
        classes = tuple((dc,) for dc, _ in family.runs)
        return family.total_micro_batches / sum(rates.values()) + self.ring_exchange_s(classes)

    def triple_table(self, family) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """`triple_bound` of every group of a triple family at once, as an array over (side a, side
        b, side c) of its runs' side templates: at the replica counts 1 ≤ R_j ≤ top_j each side's
        GPUs allow (a class two share bounds their throughput, `class_rate`, not their pair bound's
        region: a larger region, a lower bound), λ_j and S_j at the least-work mode with memory caps
        at M replicas in all (R_j·m_j ≤ M each: the loosest caps any group has) and the most any
        mode holds, then the ring exchange and the slowest side's optimizer step at M replicas. inf
        where a side cannot hold the model or the stages take more micro-batches than there are,
        with masks of why ("memory", "divisibility")."""
        rc, total = least_work(family.recompute_options), family.total_micro_batches
        memory = family.recompute_options
        columns = []
        for j, sides in enumerate(family.sides):
            rows = []
            for counts, segments, per in sides:
                lam, s_sum = self.capped_bound(
                    family.micro_batch, rc, memory, segments, total, family.zero
                )
                ((width, gpus),) = per.values()  # one class
                step = self.optimizer_bound(Template(segments, 1, 1), total, family.zero)
                rows.append((lam, s_sum, sum(counts), gpus // width, step, width))
            shape = [1, 1, 1]
            shape[j] = -1
            columns.append(
                [np.array(col, dtype=float).reshape(shape) for col in zip(*rows, strict=True)]
            )
        lams, sums, depths, tops, steps, widths = (list(c) for c in zip(*columns, strict=True))
        fits = np.isfinite(lams[0]) & np.isfinite(lams[1]) & np.isfinite(lams[2])
        lams = [np.where(np.isfinite(lam), lam, 1.0) for lam in lams]
        sums = [np.where(np.isfinite(x), x, 1.0) for x in sums]
        rate = class_rate(
            [top / lam for top, lam in zip(tops, lams, strict=True)],
            [1 / (g * lam) for g, lam in zip(widths, lams, strict=True)],
            [dc.key for dc, _ in family.runs],
            {dc.key: dc.gpus for dc, _ in family.runs},
        )
        least = np.full(rate.shape, np.inf)
        for corner in itertools.product(*((1.0, top) for top in tops)):
            num = total + sum(
                r * (x / lam - 1) for r, x, lam in zip(corner, sums, lams, strict=True)
            )
            least = np.minimum(
                least, num / sum(r / lam for r, lam in zip(corner, lams, strict=True))
            )
        deep = (depths[0] + depths[1] + depths[2]) > total
        step = np.maximum(np.maximum(steps[0], steps[1]), steps[2])
        classes = tuple((dc,) for dc, _ in family.runs)
        bound = np.maximum(total / rate, least) + step + self.ring_exchange_s(classes)
        return np.where(fits & ~deep, bound, np.inf), {
            "divisibility": deep,
            "memory": ~fits & ~deep,
        }

    def triple_bound(
        self,
        group,
        lowest: tuple[int, int, int] = (1, 1, 1),
        replicas: tuple[int, int, int] | None = None,
    ) -> float:
        """Three templates (hetopt.search.triples) at every replica counts lowest_j ≤ R_j ≤
        replicas_j (default the group's tops) and shares: the larger of the throughput bound T ≥ M /
        Σ_j R_j/λ_j (as T ≥ m_j·λ_j; templates on one class at most its GPUs' worth, `class_rate`)
        and `triple_replicas_bound`'s, each at its least over the box (both are linear-fractional in
        R with a positive denominator, so least at one of its corners), then the templates' exchange
        and optimizer step (`triple_constant`); λ_j, S_j in memory at the most replicas, at most M
        (the loosest caps). The least over the group's recompute modes; inf where a template cannot
        hold the model in any."""
        top = replicas or group.tops
        corners = list(itertools.product(*zip(lowest, top, strict=True)))
        most = min(
            sum(top), group.total_micro_batches
        )  # every replica takes a micro-batch at least
        best = math.inf
        for rc in group.recompute_options:
            lines = [
                self.capped_bound(group.micro_batch, rc, (rc,), side, most, group.zero)
                for side in group.sides
            ]
            if not all(math.isfinite(lam) for lam, _ in lines):
                continue
            gpus = dict(group.gpus)
            rate = class_rate(
                [r / lam for r, (lam, _) in zip(top, lines, strict=True)],
                [1 / (group.width(j) * lam) for j, (lam, _) in enumerate(lines)],
                [(seg.gpu, seg.island) for seg, *_ in group.sides],
                gpus,
            )
            least = min(pair_at(lines, corner, group.total_micro_batches) for corner in corners)
            best = min(best, max(group.total_micro_batches / rate, least))
        return best + self.triple_constant(group, most)

    def triple_replicas_bound(self, group, replicas: tuple[int, int, int]) -> float:
        """Three templates at replica counts R_j and any shares: `pair_bound`'s argument for three,
        T ≥ (m_j − 1)·λ_j + S_j so M ≤ Σ_j R_j·((T − S_j)/λ_j + 1) (λ_j, S_j in memory at Σ R_j
        replicas), the least over the group's recompute modes; then the exchange and optimizer
        step."""
        return self.triple_bound(group, replicas, replicas)

    def triple_ring(self, sides: tuple) -> float:
        """`ring_exchange_s` of a triple's templates, memoised."""
        if sides not in self._rings:
            self._rings[sides] = self.ring_exchange_s(sides)
        return self._rings[sides]

    def triple_constant(self, group, replicas_total: int) -> float:
        """What follows every pipeline of a triple at `replicas_total` replicas in all, or fewer:
        the ring exchange among its templates (`ring_exchange_s`) and the slowest template's
        optimizer step (`optimizer_bound`, which only falls as ZeRO-1 shards over more replicas)."""
        key = (group.sides, replicas_total, group.zero)
        if key not in self._triples:
            sides = group.sides
            self._triples[key] = self.triple_ring(sides) + max(
                self.optimizer_bound(Template(side, 1, 1), replicas_total, group.zero)
                for side in sides
            )
        return self._triples[key]

    def triple_drained(
        self,
        micro_batch: int,
        recompute: str,
        side: tuple,
        zero: int,
        replicas: int,
        micro_batches: int,
        replicas_total: int,
    ) -> float:
        """D(m; R): `drained_bound` of one template of a triple (its segments `side`, R replicas, m
        micro-batches each), memory caps in its own recompute mode at `replicas_total` replicas."""
        return self.drained_bound(
            micro_batch,
            recompute,
            Template(side, replicas, micro_batches),
            replicas_total,
            1,
            zero,
            (recompute,),
        )

    def triple_reach(
        self, group, lowest: tuple[int, int, int], replicas: tuple[int, int, int], threshold: float
    ) -> int:
        """The most micro-batches a triple group's templates can take in all below `threshold`, over
        the box of replica counts lowest_j ≤ R_j ≤ replicas_j and the group's recompute modes: Σ_j
        of the most `triple_takes` of template j in the box, its level `threshold` less the ring
        exchange and its own optimizer step at M replicas (the least: T ≥ D_j(m_j) + T_cross +
        T_opt, T_opt ≥ each template's). Below M, no skeleton of the box beats `threshold`."""
        total = group.total_micro_batches
        ring = self.triple_ring(group.sides)
        on: dict[tuple[str, str], list[int]] = {}
        for j, side in enumerate(group.sides):
            on.setdefault((side[0].gpu, side[0].island), []).append(j)
        gpus = dict(group.gpus)
        most = -1
        for rc in group.recompute_options:
            takes = []
            for j, side in enumerate(group.sides):
                room = (
                    threshold - ring - self.optimizer_bound(Template(side, 1, 1), total, group.zero)
                )
                every = self.triple_takes(
                    group.micro_batch, rc, side, group.zero, total, group.tops[j], room
                )
                takes.append(every[lowest[j] - 1 : replicas[j]])
            most = max(
                most,
                sum(
                    _class_reach(
                        [takes[j] for j in js],
                        [lowest[j] for j in js],
                        [group.width(j) for j in js],
                        gpus[key],
                    )
                    for key, js in on.items()
                ),
            )
        return most

    def triple_takes(
        self,
        micro_batch: int,
        recompute: str,
        side: tuple,
        zero: int,
        total: int,
        top: int,
        room: float,
    ) -> np.ndarray:
        """What one template of a triple can take below a level: for R = 1 … top replicas, R·cap(R)
        with cap(R) the most micro-batches m ≥ p (its depth) whose `drained_bound` lies below
        `room`, memory caps at `total` (= M) replicas (the loosest any triple has; looser caps only
        lower the bound of a single-class template, whose stages share one slope — not so in
        general: `pipeline_at` with stages of different slopes can rise as caps loosen), and at most
        M in all; −(M + 1) where no m does. A triple group at replica counts R_j and shares m_j with
        every D_j(m_j) < room_j has Σ_j R_j·m_j = M ≤ Σ_j takes_j(R_j): where even the most of each
        over a box of replica counts falls short of M, no point of the box is below the level
        (search.tree.TripleGroupNode).

        D(m; R) rises with m (each pipeline piece is (m − 1)·Λ + Σ τ) and with R (stage 0's ring
        spans ⌈R/k⌉ nodes, `class_ring`; R flows share island links, `send_s`), so cap(R) falls with
        R: it is filled by halving [1, top], a run of equal ends being equal throughout."""
        key = (micro_batch, recompute, side, zero, total, top, room)
        if key in self._takes:
            return self._takes[key]
        depth = sum(seg.stages for seg in side)

        def cap(r: int, lo: int, hi: int) -> int:
            """The most m in [lo, hi] below the level (lo − 1 where none), knowing it is at least lo
            − 1."""
            return (
                lo
                + first_true(
                    hi - lo + 1,
                    lambda i: (
                        self.triple_drained(micro_batch, recompute, side, zero, r, lo + i, total)
                        >= room
                    ),
                )
                - 1
            )

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
        self._takes[key] = takes
        return takes

    def drained_bound(
        self,
        micro_batch: int,
        recompute: str,
        template,
        replicas_total: int,
        virtual_stages: int = 1,
        zero: int = 1,
        memory: str | tuple[str, ...] | None = None,
    ) -> float:
        """One template's `pipeline_bound` (memory caps at ZeRO stage `zero` over `replicas_total`),
        raised by its stage 0's gradient all-reduce where that must outlast the pipeline
        (`stage0_drain`, `drained_pipeline`; ZeRO-2/3 have no such all-reduce: they reduce-scatter
        in every backward pass). Interleaved with v chunks per stage the pipeline is (1/v)·[(v·m −
        1)·max τ + Σ τ]: the bound of v·m micro-batches, divided by v (memory caps at one chunk:
        interleaving only holds more). `memory`: the recompute modes of the memory caps (per-stage
        recompute: the most any of them holds; default `recompute`), whose most-work mode prices
        stage 0's backward pass beside its all-reduce (the longest pass: the least drain)."""
        segments, m, v = template.segments, template.micro_batches, virtual_stages
        memory = memory or recompute
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
        )
        if key not in self._drained:
            flows = template.replicas
            bound = (
                self.pipeline_bound(
                    micro_batch, recompute, segments, v * m, replicas_total, flows, zero, memory
                )
                / v
            )
            longest = memory if isinstance(memory, str) else most_work(memory)
            drain = (
                self.stage0_drain(micro_batch, longest, segments, template.replicas)
                if zero <= 1
                else None
            )
            if drain is not None and math.isfinite(bound):
                caps = self.stage_caps(micro_batch, memory, segments, replicas_total, zero)
                lines = self.stage_lines(micro_batch, recompute, segments, flows)
                bound = max(
                    bound, drained_pipeline(lines, caps, self.inst.model.layers, m, drain, v)
                )
            self._drained[key] = bound
        return self._drained[key]

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

    def pair_table(
        self, family, opts
    ) -> tuple[tuple[list, list], np.ndarray, dict[str, np.ndarray]]:
        """A pair family's side templates (`Family.pair_sides`) and the bound of every group of
        them, as an array over (template a, template b): `range_bound` at the least-work mode over
        all replica counts each side's GPUs allow and that fit the classes both use (a region
        holding the group's), inf where the micro-batches cannot give each stage one (with
        `pair_grid`'s masks of why). Arithmetic on each side's (λ, S): no group is made to bound it.
        Memory caps at M replicas in all (R_a + R_b ≤ M: each takes a micro-batch at least), which
        shares each side template's bound among families. Not memoised (a table per family would
        hold them all at once: gigabytes over tens of thousands of families); the side templates'
        bounds are."""
        rc, total = least_work(family.recompute_options), family.total_micro_batches
        memory = family.stage_modes or family.recompute_options
        sides = family.pair_sides(opts, self.inst.model.layers)
        tops = [
            [min(gpus // g for g, gpus in per.values()) for _, _, per in side] for side in sides
        ]
        columns = []
        for side, top in zip(sides, tops, strict=True):
            lines = [
                self.capped_bound(
                    family.micro_batch, rc, memory, segments, total, family.zero_options[0]
                )
                for _, segments, _ in side
            ]
            columns.append(
                np.array(
                    [
                        (lam, s, sum(counts), t)
                        for (lam, s), (counts, _, _), t in zip(lines, side, top, strict=True)
                    ],
                    dtype=float,
                ).reshape(-1, 4)
            )
        keys_b = {dc.key for dc in family.sides[1][0]}
        shared = [
            (
                np.array([per[dc.key][0] for _, _, per in sides[0]], dtype=float).reshape(-1, 1),
                np.array([per[dc.key][0] for _, _, per in sides[1]], dtype=float).reshape(1, -1),
                dc.gpus,
            )
            for dc in family.sides[0][0]
            if dc.key in keys_b
        ]
        exchange = self.exchange_s(*(classes for classes, _ in family.sides))
        table, why = pair_grid(columns[0], columns[1], total, shared)
        return sides, table + exchange, why

    def exchange_s(self, side_a: tuple, side_b: tuple, others: tuple = ()) -> float:
        """T_cross ≥ this for two templates whose segments are `side_a` and `side_b`: the templates'
        exchange (features.cross_template_exchange) sends the model's gradients G from each template
        to the other over at most c = min(nodes of a's classes, nodes of b's) node pairs, so some
        flow carries G/c bytes. It takes no less than alone on its route, and no less than over the
        fastest pair of nodes of the two sides' classes (a node with itself where a class is on both
        sides) under the fastest planning cluster, priced with the least of the two sides' GPU
        types' weights (the exchange is priced with one template's first stage's; every weight of a
        transfer is ≥ 0, else no bound: 0). `others`: the segments of the plan's other templates,
        whose GPU types' weights are counted too (a ring of three is priced with whichever template
        comes first)."""
        keys = tuple(
            tuple(sorted({(seg.gpu, seg.island) for seg in side})) for side in (side_a, side_b)
        )
        weighed = tuple(sorted({seg.gpu for side in (side_a, side_b, *others) for seg in side}))
        return self._exchange_parts(keys, weighed)[0]

    def _exchange_parts(
        self, keys: tuple, weighed: tuple[str, ...]
    ) -> tuple[float, float, float, float]:
        """(`exchange_s`, its flow's least raw seconds — bytes over bandwidth plus latency, what
        features.slowest_transfer ranks flows by —, the least of the weights of those terms and the
        least step weight over the GPU types `weighed`); all 0 where a weight of a transfer is
        negative."""
        if (keys, weighed) not in self._exchange:
            inst, classes = self.inst, self.inst.cluster.device_classes
            channels = min(sum(len(classes[k].nodes) for k in side) for side in keys)
            nbytes = total_params(inst.model) * grad_comm_bytes(inst) / channels
            weights = [
                self.profiles.for_gpu(inst.gpu_types[gpu], inst.spec.training.framework).w
                for gpu in weighed
            ]
            best, raw = math.inf, math.inf
            ends = [(ka, kb) for ka in keys[0] for kb in keys[1]]
            for cluster in self.clusters:
                for src, dst in ends + [
                    (kb, ka) for ka, kb in ends
                ]:  # a hop each way round the ring
                    for a, b in self.node_pairs(src, dst):
                        route = cluster.route(a, b)
                        features = transfer(
                            nbytes,
                            shared_gbps(route, Counter()),
                            route.intra_node,
                            latency_s=route.latency_us * 1e-6,
                            alpha_s=route.alpha_s,
                        )
                        best = min(best, min(float(features @ w) for w in weights))
                        raw = min(raw, float(features[LINK] + features[NET] + features[LAT]))
            transfer_terms = [LINK, NET, STEP, LAT]
            if all(min(w[transfer_terms]) >= 0 for w in weights):
                self._exchange[keys, weighed] = (
                    best,
                    raw,
                    min(min(w[[LINK, NET, LAT]]) for w in weights),
                    min(w[STEP] for w in weights),
                )
            else:
                self._exchange[keys, weighed] = (0.0, 0.0, 0.0, 0.0)
        return self._exchange[keys, weighed]

    def ring_exchange_s(self, sides: tuple) -> float:
        """T_cross ≥ this for the templates whose segments are `sides`: with two, `exchange_s`; with
        three (a ring a → b → c → a in any order, so every pair of them is a hop, each flow carrying
        4G/3 ≥ G of gradients over at most as many channels as `exchange_s` counts) the evaluator
        prices the one flow of most raw seconds (features.slowest_transfer) with one template's
        weights. That flow is a hop's: T_cross ≥ the least pair's `exchange_s`. And its raw seconds
        are the most of all flows', so at least every hop's least: T_cross ≥ ω·max_pairs raw + σ (ω
        the least weight of the seconds' terms, σ the least step weight, over all three templates'
        GPU types). The larger of the two; 0 with one template, or more than three (no pair need be
        a hop)."""
        if len(sides) == 2:
            return self.exchange_s(*sides)
        if len(sides) != 3:
            return 0.0
        weighed = tuple(sorted({seg.gpu for side in sides for seg in side}))
        parts = [
            self._exchange_parts(
                tuple(
                    tuple(sorted({(seg.gpu, seg.island) for seg in side}))
                    for side in (sides[i], sides[j])
                ),
                weighed,
            )
            for i, j in ((0, 1), (0, 2), (1, 2))
        ]
        slowest = max(raw for _, raw, _, _ in parts)
        omega, sigma = parts[0][2], parts[0][3]
        return max(min(best for best, _, _, _ in parts), omega * slowest + sigma)

    def pair_lines(
        self, group, recompute: str, memory: tuple[str, ...], replicas_total: int
    ) -> tuple[tuple[float, float], ...]:
        """(λ_j, S_j) of both templates of a pair group in memory at `replicas_total` replicas
        (`capped_bound`), memoised by the group object (its entry keeps it alive, so no id is
        reused): the pair bounds below are arithmetic on them."""
        key = (id(group), recompute, memory, replicas_total)
        if key not in self._pairs or self._pairs[key][0] is not group:
            lines = tuple(
                self.capped_bound(
                    group.micro_batch, recompute, memory, side, replicas_total, group.zero
                )
                for side in (group.a, group.b)
            )
            self._pairs[key] = (group, lines)
        return self._pairs[key][1]

    def pair_bound(
        self, group, recompute: str, memory: tuple[str, ...], replicas: tuple[int, int]
    ) -> float:
        """Templates side by side with replicas R_j and any shares Σ R_j·m_j = M: from
        T ≥ (m_j − 1)·λ_j + S_j, m_j ≤ (T − S_j)/λ_j + 1, so M ≤ Σ R_j·((T − S_j)/λ_j + 1); then the
        templates' exchange. λ_j, S_j over the splits that fit in memory in the modes `memory`."""
        lines = self.pair_lines(group, recompute, memory, sum(replicas))
        return pair_at(lines, replicas, group.total_micro_batches) + self.exchange_s(
            group.a, group.b
        )

    def range_bound(
        self,
        group,
        recompute: str,
        memory: tuple[str, ...],
        lowest: tuple[int, int],
        replicas: tuple[int, int],
    ) -> float:
        """Two templates at every replica counts lowest_j ≤ R_j ≤ replicas_j that fit on the classes
        they share: the larger of the throughput bound T ≥ M / Σ_j R_j/λ_j (T ≥ m_j·λ_j as S_j ≥
        λ_j) and `pair_bound`, each at its least over that region (`region_bound`), then the
        exchange; λ_j, S_j in memory at the most replicas (the most sharding: the loosest caps)."""
        lines, total = (
            self.pair_lines(group, recompute, memory, sum(replicas)),
            group.total_micro_batches,
        )
        if not all(math.isfinite(lam) for lam, _ in lines):
            return math.inf
        sides = [
            (lam, s, float(lo), float(hi))
            for (lam, s), lo, hi in zip(lines, lowest, replicas, strict=True)
        ]
        return region_least(*sides, group.shared, total) + self.exchange_s(group.a, group.b)

    def family_bound(self, family) -> float:
        """Every skeleton of a family from throughput alone: a stage of class k at TP t_k takes τ ≥
        a_k·L, so a replica's bottleneck is at least N / Σ_i 1/a_i and T ≥ m·max τ; with R·n_k·t_k ≤
        G_k GPUs of each class, T ≥ M·N / Σ_k G_k/(t_k·a_k). A template also pays the sends beside
        each change of class (`bucket_bound`, one flow: the least): N becomes N + w, w = Σ c_i/a_i,
        as in every bucket's λ (T ≥ m·λ at any R). Two templates side by side: M = Σ_j R_j·m_j ≤
        T·Σ_j R_j/λ_j with R_j/λ_j ≤ Σ_k R_j·n_jk/(a_jk·(N + w_j)), and the templates share each
        class's G_k GPUs (Σ_j R_j·n_jk·t_jk ≤ G_k), so T ≥ M / Σ_k G_k·max_j 1/(t_jk·a_jk·(N +
        w_j)): a class both use counts once, at the better rate; and the templates' exchange follows
        (`exchange_s`). The search keys a pair family by the larger of this and the least bound of
        its groups (`pair_table`, tree.FamilyNode.expand)."""
        rc = least_work(family.recompute_options)
        layers, b = self.inst.model.layers, family.micro_batch
        rates: dict[tuple[str, str], float] = {}
        cp = family.cp  # a stage takes tp·cp GPUs
        for classes, tps in family.sides:
            per_layer = [
                self.per_layer_s(dc.gpu, tp, b, rc, cp) for dc, tp in zip(classes, tps, strict=True)
            ]
            if min(per_layer) <= 0:
                return 0.0
            weight = sum(c / a for a, c in self._side_sends(classes, tps, b, per_layer, 1, cp))
            # a class in two segments of a template (search.tp_per_stage), or on both sides of a
            # pair, counts once, at its better rate: Σ_seg R·n·t·1/(t·a) ≤ G·max 1/(t·a)
            for dc, tp, a in zip(classes, tps, per_layer, strict=True):
                rates[dc.key] = max(
                    rates.get(dc.key, 0.0), dc.gpus / (tp * cp * a * (layers + weight))
                )
            if not family.pair:
                return family.total_micro_batches / sum(rates.values())
        return family.total_micro_batches / sum(rates.values()) + self.exchange_s(
            *(classes for classes, _ in family.sides)
        )

    def _side_sends(
        self,
        classes: tuple,
        tps: tuple[int, ...],
        micro_batch: int,
        per_layer: list[float],
        flows: int,
        cp: int = 1,
    ) -> list[tuple[float, float]]:
        """(a, c) of the sends beside each change of class of one template over `classes` at `tps`:
        the stage on each side pays one (per-layer time of its class, the send at least), with
        `flows` replicas sharing islands."""
        sends = []
        cls = [(dc.gpu, dc.island) for dc in classes]
        for k in range(len(cls) - 1):
            sends.append(
                (per_layer[k], self.send_s(cls[k], cls[k + 1], tps[k] * cp, micro_batch, flows))
            )
            sends.append(
                (
                    per_layer[k + 1],
                    self.send_s(cls[k + 1], cls[k], tps[k + 1] * cp, micro_batch, flows),
                )
            )
        return sends

    def bucket_bound(
        self, family, replicas: int, max_stages: int, fixed: tuple[int, ...] = ()
    ) -> float:
        """`family_bound` at one replica count R, with the first classes' stage counts `fixed`: each
        replica has n_k stages of class k — n_k as fixed, else 1 ≤ n_k ≤ ⌊G_k/(t_k·R)⌋ — and at most
        P = min(max_stages, layers, M/R) in all (the free stages go to the fastest classes first);
        inf when no replica fits. The two stages beside each change of class pay a send over NICs,
        c_i ≥ `send_s`, in every configuration: τ_i ≥ a_i·L_i + c_i gives max τ ≥ λ = (N + Σ
        c_i/a_i) / max Σ_k n_k/a_k. With m = M/R micro-batches T ≥ (m − 1)·max τ + Σ τ, and Σ τ ≥
        max τ ≥ λ as well as Σ τ ≥ N·a_min + Σ_k n_k·(a_k − a_min) + Σ c_i (a layer on each stage,
        the rest at the fastest class's per-layer time), least at the smallest counts: T ≥ (m − 1)·λ
        + max(λ, that sum)."""
        parts = self._bucket_parts(family, replicas, max_stages)
        if parts is None:
            return 0.0
        m, cap, per_layer, most, send_weight, send_sum = parts
        classes = [
            (a, fixed[k], fixed[k]) if k < len(fixed) else (a, 1, most[k])
            for k, a in enumerate(per_layer)
        ]  # (a_k, least n_k, most n_k)
        left = cap - sum(lo for _, lo, _ in classes)
        if left < 0 or any(hi < lo for _, lo, hi in classes):
            return (
                math.inf
            )  # no replica of this family fits at R with these counts: the bucket is empty
        rate = sum(lo / a for a, lo, _ in classes)
        for a, lo, hi in sorted(classes):
            k = min(hi - lo, left)
            rate += k / a
            left -= k
        layers = self.inst.model.layers
        lam = (layers + send_weight) / rate
        a_min = min(per_layer)
        least_sum = layers * a_min + sum(lo * (a - a_min) for a, lo, _ in classes) + send_sum
        v = max(
            family.virtual_options
        )  # interleaved: m·max τ + (Σ τ − max τ)/v, least at the most chunks
        return (m - 1 / v) * lam + max(lam, least_sum) / v

    def _bucket_parts(self, family, replicas: int, max_stages: int):
        """What `bucket_bound` needs of a family at R whatever counts are fixed: m, P, a_k, the most
        stages n_k, and the sends beside each change of class (Σ c_i/a_i and Σ c_i); None where some
        a_k ≤ 0."""
        key = (
            id(family),
            replicas,
            max_stages,
        )  # the entry keeps its family alive: no id is reused
        if key not in self._buckets or self._buckets[key][0] is not family:
            m = family.total_micro_batches // replicas
            cap = min(max_stages, self.inst.model.layers, m)
            rc = least_work(family.recompute_options)
            per_layer = [
                self.per_layer_s(dc.gpu, tp, family.micro_batch, rc, family.cp)
                for dc, tp in zip(family.classes, family.tps, strict=True)
            ]
            if min(per_layer) <= 0:
                self._buckets[key] = (family, None)
                return None
            most = [
                min(cap, dc.gpus // (w * replicas))
                for dc, w in zip(family.classes, family.widths, strict=True)
            ]
            # every configuration has a stage on each side of each change of class, paying a send
            # over NICs
            sends = self._side_sends(
                family.classes, family.tps, family.micro_batch, per_layer, replicas, family.cp
            )
            self._buckets[key] = (
                family,
                (m, cap, per_layer, most, sum(c / a for a, c in sends), sum(c for _, c in sends)),
            )
        return self._buckets[key][1]

    # -- memory
    # ---------------------------------------------------------------------------------------

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
    ) -> list[int]:
        """The most layers each stage of a template holds in memory (at most the model's layers; 0
        when it cannot hold one), ZeRO stage `zero` sharded over `replicas_total`: the evaluator's
        memory model, affine in L. With a tuple of recompute modes (per-stage recompute) the most
        any of them holds: each mode's memory rises with L, so a stage holds every L up to that."""
        if not isinstance(recompute, str):
            return [
                max(col)
                for col in zip(
                    *(
                        self.stage_caps(micro_batch, mode, segments, replicas_total, zero)
                        for mode in recompute
                    ),
                    strict=True,
                )
            ]
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
        return caps

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


# -- pure functions of lines
# ----------------------------------------------------------------------------


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


def pair_grid(
    side_a: np.ndarray,
    side_b: np.ndarray,
    total_micro_batches: int,
    shared: list[tuple[np.ndarray, np.ndarray, int]],
) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """`Bounds.range_bound` of every pair of side templates, each a row (λ, S, depth p, most
    replicas its GPUs allow): over 1 ≤ R_j ≤ min(that, (M − p_other)/p_j) and R_a·g_a + R_b·g_b ≤ G
    on each class both use (`shared`: each side's GPUs per replica, as a column and a row, and the
    class's GPUs); inf where M < p_a + p_b, no replica counts fit, or a template cannot hold the
    model (λ = inf). With masks of why: "divisibility" (the micro-batches) and "memory" (λ = inf);
    the other infinite entries fit no replica counts on the classes both templates share."""
    lam_a, s_a, p_a, gpus_a = (side_a[:, k : k + 1] for k in range(4))
    lam_b, s_b, p_b, gpus_b = (side_b[:, k].reshape(1, -1) for k in range(4))
    total = float(total_micro_batches)
    fits = np.isfinite(lam_a) & np.isfinite(lam_b)  # each template can hold the model
    lam_a, s_a, lam_b, s_b = (np.where(np.isfinite(x), x, 1.0) for x in (lam_a, s_a, lam_b, s_b))
    top_a = np.minimum(gpus_a, np.floor((total - p_b) / p_a))
    top_b = np.minimum(gpus_b, np.floor((total - p_a) / p_b))
    bound = region_bound((lam_a, s_a, 1.0, top_a), (lam_b, s_b, 1.0, top_b), shared, total)
    deep = (top_a < 1) | (top_b < 1)
    return np.where(fits & ~deep, bound, np.inf), {"divisibility": deep, "memory": ~fits & ~deep}


def region_bound(side_a: tuple, side_b: tuple, shared: list[tuple], total: float):
    """The least pair bound over replica counts in a region, each side (λ, S, least R, most R) and
    the shared classes' R_a·g_a + R_b·g_b ≤ G: a convex polygon in real (R_a, R_b). The throughput
    bound M / (R_a/λ_a + R_b/λ_b) is least where the linear denominator is most, and `pair_at` is
    linear-fractional with a positive denominator (quasi-linear), so both are least at a vertex: the
    box's corners, where a class's line meets the box, or where two classes' lines meet. The larger
    of the two holds (`Bounds.range_bound`); inf where the polygon is empty. Arrays broadcast
    (pair_grid) or scalars."""
    (lam_a, s_a, lo_a, top_a), (lam_b, s_b, lo_b, top_b) = side_a, side_b
    points = [(lo_a, lo_b), (lo_a, top_b), (top_a, lo_b), (top_a, top_b)]
    with np.errstate(divide="ignore", invalid="ignore"):
        for ga, gb, gpus in shared:
            points += [(x, (gpus - ga * x) / gb) for x in (lo_a, top_a)]
            points += [((gpus - gb * y) / ga, y) for y in (lo_b, top_b)]
        for (ga1, gb1, g1), (ga2, gb2, g2) in itertools.combinations(shared, 2):
            det = ga1 * gb2 - ga2 * gb1  # 0 where the two lines are parallel: nan, never a vertex
            points.append(((g1 * gb2 - g2 * gb1) / det, (ga1 * g2 - ga2 * g1) / det))
        rate, least = 0.0, np.inf
        for x, y in points:
            inside = (
                (x >= lo_a - 1e-9) & (x <= top_a + 1e-9) & (y >= lo_b - 1e-9) & (y <= top_b + 1e-9)
            )
            for ga, gb, gpus in shared:
                inside = inside & (ga * x + gb * y <= gpus * (1 + 1e-9))
            here = x / lam_a + y / lam_b
            pair = (total + x * (s_a / lam_a - 1) + y * (s_b / lam_b - 1)) / here
            rate = np.where(inside, np.maximum(rate, here), rate)
            least = np.where(inside, np.minimum(least, pair), least)
        return np.where(rate > 0, np.maximum(total / rate, least), np.inf)


def region_least(side_a: tuple, side_b: tuple, shared, total: float) -> float:
    """`region_bound` of one pair of templates, in plain floats (numpy's per-call cost is most of
    the time on scalars)."""
    (lam_a, s_a, lo_a, top_a), (lam_b, s_b, lo_b, top_b) = side_a, side_b
    points = [(lo_a, lo_b), (lo_a, top_b), (top_a, lo_b), (top_a, top_b)]
    for ga, gb, gpus in shared:
        points += [(x, (gpus - ga * x) / gb) for x in (lo_a, top_a)]
        points += [((gpus - gb * y) / ga, y) for y in (lo_b, top_b)]
    for (ga1, gb1, g1), (ga2, gb2, g2) in itertools.combinations(shared, 2):
        det = ga1 * gb2 - ga2 * gb1
        if det:  # parallel lines never meet at a vertex
            points.append(((g1 * gb2 - g2 * gb1) / det, (ga1 * g2 - ga2 * g1) / det))
    rate, least = 0.0, math.inf
    for x, y in points:
        if (
            lo_a - 1e-9 <= x <= top_a + 1e-9
            and lo_b - 1e-9 <= y <= top_b + 1e-9
            and all(ga * x + gb * y <= gpus * (1 + 1e-9) for ga, gb, gpus in shared)
        ):
            rate = max(rate, x / lam_a + y / lam_b)
            least = min(least, pair_at(((lam_a, s_a), (lam_b, s_b)), (x, y), total))
    return max(total / rate, least) if rate > 0 else math.inf


def class_rate(rates: list, per_gpu: list, classes: list, gpus: dict):
    """An upper bound on Σ_j R_j/λ_j, the micro-batches per second of templates j at R_j ≤ top_j
    replicas (`rates`: top_j/λ_j), where the templates on one class k share its G_k GPUs
    (Σ_{j on k} R_j·g_j ≤ G_k): each class's templates take at most min(Σ_j top_j/λ_j,
    G_k·max_j 1/(g_j·λ_j)) (`per_gpu`: 1/(g_j·λ_j)). Floats or arrays that broadcast."""
    total = 0.0
    for key in dict.fromkeys(classes):
        on = [j for j, k in enumerate(classes) if k == key]
        alone = sum(rates[j] for j in on)
        if len(on) > 1:
            best = per_gpu[on[0]]
            for j in on[1:]:
                best = np.maximum(best, per_gpu[j])
            alone = np.minimum(alone, gpus[key] * best)
        total = total + alone
    return total


def first_true(n: int, test) -> int:
    """The first i in 0 … n − 1 where a test that once true stays true holds (n where it never
    does)."""
    return bisect.bisect_left(range(n), True, key=test)


def _class_reach(takes: list[np.ndarray], lowest: list[int], widths: list[int], gpus: int) -> int:
    """The most Σ_j takes_j[R_j − lowest_j] of the templates on one class whose R_j·g_j fit its G
    GPUs (`Bounds.triple_reach`), exactly: one template its most; two the most over the pairs that
    fit; three the most over the third's counts of its takes plus the most of the pairs that fit in
    what is left (pairs by GPUs used, with a running most). −(2^40) where no counts fit."""
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


def pair_at(lines, replicas, total_micro_batches: int) -> float:
    """`Bounds.pair_bound` from the templates' (λ_j, S_j) at replica counts R_j."""
    if not all(math.isfinite(lam) for lam, _ in lines):
        return math.inf  # a template that cannot hold the model
    num = total_micro_batches + sum(
        r * (s / lam - 1) for r, (lam, s) in zip(replicas, lines, strict=True)
    )
    return num / sum(r / lam for r, (lam, _) in zip(replicas, lines, strict=True))


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
    lines: list[Line], layers: int, level: float, caps: list[int] | None = None
) -> float:
    """g(Λ): the least Σ_i (a_i·L_i + c_i) with every a_i·L_i + c_i ≤ Λ and L_i ≤ caps_i (level caps
    rounded up a hair, which only lowers g: the bound stays valid); one layer per stage, the rest on
    the cheapest stages first."""
    total = sum(a + c for a, c in lines)
    left = layers - len(lines)
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


def pipeline_at(lines, caps: list[int], layers: int, micro_batches: int) -> float:
    """`Bounds.pipeline_bound` for given stage lines and memory caps (inf where no split fits)."""
    lam = integer_level(list(lines), layers, caps)
    if not math.isfinite(lam):
        return math.inf  # no split fits in memory
    return fill_and_drain(
        lam, lambda level: cheapest_sum(list(lines), layers, level, caps), micro_batches
    )


def fill_and_drain(level: float, g, micro_batches: int) -> float:
    """T ≥ (m − 1)·Λ + Σ τ over splits, Λ = max τ ≥ `level` (λ) and Σ τ ≥ g(Λ), g falling to S =
    g(∞): for Λ ≥ λ + Δ, Δ = (g(λ) − S)/(m − 1), T ≥ (m − 1)·λ + g(λ); below it T ≥ (m − 1)·λ + g(λ
    + Δ) — the smaller, two evaluations of g (`Bounds.pipeline_bound`)."""
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
    caps: list[int],
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
    m, p, v = micro_batches, len(lines), virtual_stages
    a0, c0 = lines[0]
    if p == 1:
        if caps[0] < layers:
            return math.inf
        t0 = a0 * layers + c0
        return m * t0 + max(0.0, drain(layers))  # one stage: no bubble to divide
    rest, rest_caps = lines[1:], caps[1:]
    if min(rest_caps) < 1 or caps[0] < 1:
        return math.inf
    # λ_rest(n) and S_rest(n) for n = p − 1 … min(Σ caps, layers − 1), by one greedy pass each
    counts = [1] * len(rest)
    level = max(a + c for a, c in rest)
    levels, sums = [level], [sum(a + c for a, c in rest)]
    heap = [(2 * a + c, i) for i, (a, c) in enumerate(rest) if rest_caps[i] > 1]
    heapq.heapify(heap)
    slots = sorted(
        a for (a, _), cap in zip(rest, rest_caps, strict=True) for _ in range(min(cap, layers) - 1)
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
    best = math.inf
    for l0 in range(max(1, layers - top), min(caps[0], layers - len(rest)) + 1):
        k = layers - l0 - len(rest)
        t0 = a0 * l0 + c0
        best = min(
            best, (m - 1 / v) * max(t0, levels[k]) + (t0 + sums[k]) / v + max(0.0, drain(l0))
        )
    return best


# -- a placed skeleton
# ----------------------------------------------------------------------------------


def placed_bound(problem) -> float:
    """A bound on a skeleton once it is placed and linearised (search.linear.PlanProblem), before
    its integer program is solved: its communication is now known.

    Per scenario and template, stage i takes τ_i(L) = y^f_i(L) + y^b_i(L) + c_i with the exact sends
    c_i, and y(L) = max(h, d) + s·min(h, d) ≥ d + s·h, a line a_i·L + b_i (under ZeRO-2/3 also y ≥
    K, the collectives' line: the larger of the two bounds holds; both raised by the exposed part
    ε_i); so T_sync ≥ (m − 1)·λ + g(λ + Δ) as in `Bounds.pipeline_bound`, each L_i at most what
    stage i holds in memory. Stage 0's gradient all-reduce ends at T_sync − o_0·y^b_0(L_0) +
    D_0(L_0) ≥ T_sync + min over its layer counts; the optimizer step is at least every stage's at
    one layer; the templates' exchange is a constant. The scenario times combine by the objective,
    which rises with each of them (robust.aggregate). A template with shards (`SplitProblem.rows`)
    takes its pipeline from its stages' tables (`tabled_pipeline`), its drain and optimizer step
    from its accessors."""
    from hetopt.search.robust import aggregate

    times = []
    for sc in problem.scenarios:
        t_sync, drain, drained, t_opt = 0.0, 0.0, 0.0, 0.0
        for pr in sc.templates:
            if pr.rows is not None:  # stages with shards: their tables
                caps = [min(c, pr.layers) for c in pr.max_layers()]
                pipe = tabled_pipeline(stage_tables(pr, caps), pr.layers, pr.micro_batches)
                if not math.isfinite(pipe):
                    return math.inf
                t_sync = max(t_sync, pipe)
                drain = max(drain, min(_drain(pr, n) for n in range(1, max(1, caps[0]) + 1)))
                t_opt = max(t_opt, max(pr.opt_s(i, 1) for i in range(pr.depth)))
                continue
            lines, collectives = [], []
            for i in range(pr.depth):
                s = pr.serial[i]
                a = sum(f.slope for f in (pr.dev_fwd[i], pr.dev_bwd[i])) + s * sum(
                    f.slope for f in (pr.host_fwd[i], pr.host_bwd[i])
                )
                b = sum(f.intercept for f in (pr.dev_fwd[i], pr.dev_bwd[i])) + s * sum(
                    f.intercept for f in (pr.host_fwd[i], pr.host_bwd[i])
                )
                eps = 0.0
                if pr.tabulated:  # ZeRO-2/3: a pass takes at least its collectives K, and ε more
                    eps = exposed_at_least(pr, i)
                    k = pr.zero_fwd[i].slope + pr.zero_bwd[i].slope
                    collectives.append(
                        (
                            max(k, 1e-15),
                            pr.zero_fwd[i].intercept + pr.zero_bwd[i].intercept + eps + pr.p2p[i],
                        )
                    )
                lines.append((max(a, 1e-15), b + eps + pr.p2p[i]))
            layers, v = pr.layers, pr.virtual_stages
            m = (
                v * pr.micro_batches
            )  # interleaved: v·T_pipe = (v·m − 1)·max τ + Σ τ, one chunk per pass
            caps = [min(c, layers) for c in pr.max_layers()]
            pipe = max(pipeline_at(ls, caps, layers, m) for ls in (lines, collectives) if ls)
            if pr.mixed:  # each stage at the least work of the modes it holds L layers in
                pipe = max(pipe, tabled_pipeline(stage_tables(pr, caps), layers // v, m))
            if not math.isfinite(pipe):
                return math.inf  # no split fits in memory
            pipe /= v
            t_sync = max(t_sync, pipe)
            top = max(1, min(pr.max_layers()[0], layers))
            drain = max(drain, min(_drain(pr, n) for n in range(1, top + 1)))
            drained = max(
                drained,
                drained_pipeline(
                    lines, caps, layers, pr.micro_batches, lambda n, pr=pr: _drain(pr, n), v
                ),
            )
            t_opt = max(t_opt, max(f.at(1) for f in pr.opt))
        times.append(max(t_sync + max(0.0, drain), drained) + sc.cross_s + t_opt)
    return aggregate(times, list(problem.probabilities), problem.objective, problem.alpha)


def exposed_at_least(pr, i: int) -> float:
    """ε_i: the least of stage i's exposed ZeRO-2/3 seconds per micro-batch over its layer counts,
    Σ_p min(P^p, K^p)/n ≥ Σ_p min(a^p, k^p)/(1 + e) (`Bounds.weighted_lines`), P^p ≥ d + s·h."""
    s, units = pr.serial[i], 1 + pr.zero_units[i]
    out = 0.0
    for h, d, z in (
        (pr.host_fwd[i], pr.dev_fwd[i], pr.zero_fwd[i]),
        (pr.host_bwd[i], pr.dev_bwd[i], pr.zero_bwd[i]),
    ):
        compute = d.slope + s * h.slope + min(d.intercept + s * h.intercept, 0.0)
        out += max(0.0, min(compute, z.slope + min(z.intercept, 0.0)))
    return out / units


def _drain(pr, n: int) -> float:
    """How long stage 0's gradient all-reduce outlasts the pipeline at n layers, D_0(n) −
    o_0·y^b_0(n), the backward pass as the evaluator prices it (SplitProblem.pass_s); with per-stage
    recompute the least over its modes (the longest pass)."""
    return min(pr.dp_s(0, n) - alt.hidden_s(0, n) for alt in pr.variants())

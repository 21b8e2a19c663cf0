"""Cost features of a placed plan (DESIGN 3): everything the iteration time depends on that
calibration does not fit — FLOPs, bytes, kernel and collective-step counts per stage, per `Part` —
and peak memory.

`plan_features` turns a placed plan into, per template, an array (stages, N_PARTS, N_TERMS) that
hetopt.cost.pricing prices with each stage's calibrated weights: work per micro-batch of every stage
(`stage_work`: layers, embedding, head, recompute and TP collectives), the point-to-point sends it
makes, its gradient all-reduce (sharing NICs with the rings beside it), the optimizer step, ZeRO-2/3
collectives per pass, and the templates' gradient exchange (`cross_template_exchange`).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from enum import IntEnum
from functools import lru_cache
from itertools import pairwise

import numpy as np

from hetopt.cost import comm
from hetopt.cost import compute as cc
from hetopt.cost.flops import layer_params, total_params
from hetopt.cost.memory import (
    GIB,
    fp8_cast_bytes,
    inflight_microbatches,
    largest_unit_params,
    layer_activation_bytes,
    loss_bytes,
    model_state_bytes,
    stage_params,
    zero_working_bytes,
)
from hetopt.cost.stacks import stack_memory
from hetopt.cost.terms import ITER, MB, N_TERMS
from hetopt.cost.transfers import (
    boundary_sends,
    rank_nodes,
    send_features,
    shard_ranks,
    shared_gbps,
    slowest_transfer,
    stage_nodes,
)
from hetopt.plan import Plan
from hetopt.spec.cluster import intra_route
from hetopt.spec.formats import BF16, DTYPE_BYTES, Format
from hetopt.spec.gpus import GPUType
from hetopt.spec.instance import Instance
from hetopt.spec.presets import ModelArch

GRAD_COMM_BYTES = BF16.reduce_bytes
"""Gradients are reduced in 16 bits in 16-bit mixed precision (Megatron-core's default
grad_reduce_in_fp32=False; DeepSpeed fp16)."""


def grad_comm_bytes(inst: Instance) -> float:
    """Bytes per gradient, kept and reduced over data parallelism: `training.grad_reduce_dtype`
    where given (fp32: Megatron's --grad-reduce-in-fp32 / --accumulate-allreduce-grads-in-fp32,
    DeepSpeed's fp32 all-reduce, 4 bytes), else the training format's gradients (2 in 16-bit mixed
    precision and fp8, 4 in fp32 and tf32). The gradient buffer itself is the format's
    (Format.grad_bytes)."""
    dtype = inst.spec.training.grad_reduce_dtype
    return DTYPE_BYTES[dtype] if dtype else inst.format.reduce_bytes


class Part(IntEnum):
    """The named rows of a stage's cost: features (N_PARTS, N_TERMS) and priced seconds (N_PARTS,)
    per stage.

    FWD, BWD — one micro-batch's forward and backward compute (recompute in BWD); FWD_TP, BWD_TP —
    what their tensor-parallel (and exposed ZeRO-2/3) collectives add; P2P — the point-to-point
    sends per micro-batch; DP — the gradient all-reduce per iteration; OPT — the optimizer step per
    iteration. Arrays stay arrays (batched pricing and calibration need them); index them by these
    names."""

    FWD = 0
    BWD = 1
    FWD_TP = 2
    BWD_TP = 3
    P2P = 4
    DP = 5
    OPT = 6


FWD, BWD, FWD_TP, BWD_TP, P2P, DP, OPT = Part
N_PARTS = len(Part)


@dataclass
class PlanFeatures:
    """Cost features of a placed plan: per template an array (rows, N_PARTS, N_TERMS), a row per
    stage — or per shard of a stage with shards (`stage_of`)."""

    templates: list[np.ndarray]
    micro_batches: list[int]
    gpus: list[list[GPUType]]
    """GPU type of every row, per template."""
    virtual_stages: int
    memory_bytes: list[list[float]]
    cross: np.ndarray = field(default_factory=lambda: np.zeros(N_TERMS))
    """Features of the gradient exchange between templates (zero with one template)."""
    cross_flows: list[tuple[str, str, float]] = field(default_factory=list)
    """Its flows: (source node, destination node, bytes), all running at once."""
    zero_passes: list[np.ndarray] = field(default_factory=list)
    """ZeRO-2/3 collectives per micro-batch, per template (stages, 2, N_TERMS): forward, backward
    pass."""
    zero_units: list[list[int]] = field(default_factory=list)
    """Units (layers, embedding, head) each stage gathers or reduces one by one under ZeRO-2/3."""
    stage_of: list[list[int]] = field(default_factory=list)
    """The stage of every row, per template (rows are stages but for stages with shards)."""

    def mixed(self, j: int) -> bool:
        """Whether template j has a stage of several rows (shards)."""
        return len(self.stage_of[j]) != len(set(self.stage_of[j]))


# -- features
# -------------------------------------------------------------------------------------------


@lru_cache(maxsize=65536)
def stage_work(
    model: ModelArch,
    gpu: GPUType,
    micro_batch: int,
    seq_len: int,
    tp: int,
    sp: bool,
    attention: str,
    recompute: str,
    layers: int,
    first: bool,
    last: bool,
    intra=None,
    cp: int = 1,
    fmt: Format = BF16,
    norm_kernel: str = "fused",
) -> np.ndarray:
    """Forward/backward compute and TP features of one stage per micro-batch, (4, N_TERMS), in
    training format `fmt` (its widths; `gpu` priced in it, GPUType.for_format); TP
    collectives over `intra` (the stage's intra-node Route, or a comm.Span when its TP group spans
    nodes; default the GPU's catalog interconnect); with context parallelism `cp` > 1 the work of
    one of its ranks and the CP exchange (over `intra`: CP stays inside a node) beside the TP
    collectives."""
    x = cc.LayerShape(model, micro_batch, seq_len, tp, sp, attention, cp, fmt, norm_kernel)
    intra = intra or intra_route(gpu)
    fwd = layers * cc.layer_forward(x, gpu)
    bwd = layers * (cc.layer_backward(x, gpu) + cc.layer_recompute(x, gpu, recompute))
    tp_pass = cc.tp_comm_per_pass(x, intra)
    cp_fwd = cc.cp_comm_per_pass(x, intra)
    # full recompute runs the forward's collectives again in the backward pass
    fwd_tp = layers * (tp_pass + cp_fwd)
    bwd_tp = layers * (
        tp_pass * (2 if recompute == "full" else 1)
        + cc.cp_comm_per_pass(x, intra, True)
        + (cp_fwd if recompute == "full" else 0.0)
    )
    if first:
        fwd = fwd + cc.embedding_forward(x, gpu)
        bwd = bwd + 2 * cc.embedding_forward(x, gpu)
        fwd_tp = fwd_tp + cc.embedding_tp_comm(x, intra)
    if last:
        fwd = fwd + cc.head_forward(x, gpu)
        bwd = bwd + cc.head_backward(x, gpu)
        fwd_tp = fwd_tp + cc.head_tp_comm(x, intra)
    fwd[MB] += 1
    bwd[MB] += 1
    return np.stack([fwd, bwd, fwd_tp, bwd_tp])


def plan_features(inst: Instance, plan: Plan) -> PlanFeatures:
    """Cost features of a placed plan: one row per stage, or, for a stage with shards, one row per
    shard (its ranks of one class run their share of each micro-batch; `PlanFeatures.stage_of` says
    whose), on `inst`'s network."""
    placed = _PlacedPlan(inst, plan)
    templates, gpus, memory, stage_of = [], [], [], []
    zero_passes, zero_units = [], []
    for j in range(len(plan.pipelines)):
        arr, z_arr, t_gpus, t_mem, z_units, rows_stage = placed.template(j)
        templates.append(arr)
        gpus.append(t_gpus)
        memory.append(t_mem)
        zero_passes.append(z_arr)
        zero_units.append(z_units)
        stage_of.append(rows_stage)
    cross, flows = cross_template_exchange(
        placed.cluster, plan, placed.nodes_of, total_params(inst.model) * placed.grad_bytes
    )
    return PlanFeatures(
        templates,
        [pp.micro_batches for pp in plan.pipelines],
        gpus,
        plan.virtual_stages,
        memory,
        cross,
        flows,
        zero_passes if plan.zero >= 2 else [],
        zero_units,
        stage_of,
    )


class _PlacedPlan:
    """A placed plan with where its ranks sit and what every row's features share, found once, so
    that each template's rows are built from it (`template`)."""

    def __init__(self, inst: Instance, plan: Plan) -> None:
        self.inst, self.plan, self.cluster = inst, plan, inst.cluster
        self.nodes_of = stage_nodes(plan)
        self.ranks_at = (
            rank_nodes(plan)
            if any(st.shards for pipe in plan.pipelines for st in pipe.stages)
            else {}
        )
        # every data-parallel rank's node of each stage, all replicas (one per replica without
        # shards)
        self.everyone = {
            (j, i): [n for nodes in self.ranks_at[(j, i)] for n in nodes]
            if st.shards
            else self.nodes_of[(j, i)]
            for j, pipe in enumerate(plan.pipelines)
            for i, st in enumerate(pipe.stages)
        }
        # activations (or their gradients) of one sequence
        self.sequence_bytes = inst.format.act_bytes * inst.seq_len * inst.model.hidden
        self.ring_load = dp_ring_load(self.cluster, plan, self.everyone)
        self.grad_bytes = grad_comm_bytes(inst)
        self.spans = tp_spans(self.cluster, plan)

    def template(
        self, j: int
    ) -> tuple[np.ndarray, np.ndarray, list[GPUType], list[float], list[int], list[int]]:
        """Template j's rows: (features (rows, N_PARTS, N_TERMS), ZeRO-2/3 passes (rows, 2,
        N_TERMS), GPU types, memory bytes, ZeRO units, stage of each row)."""
        inst, plan = self.inst, self.plan
        pipe = plan.pipelines[j]
        p = len(pipe.stages)
        rows = [
            (i, k, sh)
            for i, st in enumerate(pipe.stages)
            for k, sh in enumerate(st.ranks_of(plan.micro_batch))
        ]
        arr = np.zeros((len(rows), N_PARTS, N_TERMS))
        z_arr = np.zeros((len(rows), 2, N_TERMS))
        t_gpus, t_mem, z_units = [], [], []
        sends: dict[tuple[int, int], list] = {}  # per (stage, direction), for the rows of one stage
        for row, (i, k, sh) in enumerate(rows):
            st = pipe.stages[i]
            gpu = inst.gpu_types[sh.gpu]
            first, last = i == 0, i == p - 1
            mine = self._shard_nodes(j, i, k)
            arr[row, :4] = self._work(j, i, sh.sequences, gpu, mine)
            self._add_sends(arr[row], j, i, mine, sends)
            params = stage_params(inst.model, st.layers, first, last, p)
            self._add_data_parallel(arr[row], z_arr[row], j, i, gpu, mine, params)
            z_units.append(st.layers + first + last)
            t_gpus.append(gpu)
            t_mem.append(
                stage_memory(
                    inst,
                    plan,
                    pipe.micro_batches,
                    p,
                    i,
                    st,
                    params,
                    plan.replicas - pipe.replicas + len(self.everyone[(j, i)]),
                    sh.sequences,
                )
            )
        return arr, z_arr, t_gpus, t_mem, z_units, [i for i, _, _ in rows]

    def _shard_nodes(self, j: int, i: int, k: int) -> list[str]:
        """The nodes of row k's ranks of stage i (all replicas): its sends leave from them."""
        st = self.plan.pipelines[j].stages[i]
        if st.shards:
            return [nodes[n] for nodes in self.ranks_at[(j, i)] for n in shard_ranks(st, k)]
        return self.nodes_of[(j, i)]

    def _work(self, j: int, i: int, sequences: int, gpu: GPUType, mine: list[str]) -> np.ndarray:
        """The row's compute and TP features per micro-batch (`stage_work`): its TP collectives
        inside the stage's nodes, or over the network when its TP group spans nodes."""
        inst, st = self.inst, self.plan.pipelines[j].stages[i]
        p = len(self.plan.pipelines[j].stages)
        tp_path = self.spans.get((j, i)) or self.cluster.slowest_intra(list(dict.fromkeys(mine)))
        return stage_work(
            inst.model,
            gpu,
            sequences,
            inst.seq_len,
            st.tp,
            st.sp,
            inst.spec.training.attention,
            st.recompute,
            st.layers,
            i == 0,
            i == p - 1,
            tp_path,
            st.cp,
            inst.format,
            inst.spec.training.norm_kernel,
        )

    def _add_sends(
        self, row: np.ndarray, j: int, i: int, mine: list[str], sends: dict[tuple[int, int], list]
    ) -> None:
        """Add the row's point-to-point sends per micro-batch to `row` (the sends of its stage
        found once in `sends`).

        The sender pays: activations forward to stage i+1, gradients back to stage i-1, once per
        model chunk; with interleaving the last stage also passes activations on to the first
        stage's next chunk, and the first stage passes gradients back to the last (vp − 1 times
        each). Each of the tp·cp ranks sends its share (CP: its part of the sequence); every rank
        sends the sequences it holds to the ranks of the neighbouring stage that hold them."""
        plan = self.plan
        st, p, vp = plan.pipelines[j].stages[i], len(plan.pipelines[j].stages), plan.virtual_stages
        first, last = i == 0, i == p - 1
        sources = set(mine) if st.shards else None
        for way, times in ((1, vp if not last else vp - 1), (-1, vp if not first else vp - 1)):
            if times:
                if (i, way) not in sends:
                    sends[(i, way)] = boundary_sends(
                        plan, j, i, (i + way) % p, self.nodes_of, self.ranks_at, self.sequence_bytes
                    )
                row[P2P] += times * send_features(self.cluster, sends[(i, way)], st.width, sources)

    def _add_data_parallel(
        self,
        row: np.ndarray,
        passes: np.ndarray,
        j: int,
        i: int,
        gpu: GPUType,
        mine: list[str],
        params: float,
    ) -> None:
        """Add the row's per-iteration features to `row`: its gradient all-reduce (sharing NICs
        with the rings beside it) and optimizer step; and under ZeRO-2/3 its collectives per pass
        to `passes`."""
        plan, cluster = self.plan, self.cluster
        pipe = plan.pipelines[j]
        st = pipe.stages[i]
        columns = nic_columns(cluster, mine, st.tp)
        # the data-parallel group of a TP rank: every data-parallel rank of the stage's cp ranks
        # each (Megatron-LM's DP×CP group)
        every = self.everyone[(j, i)]
        dp_nodes, dp_ranks = [n for n in every for _ in range(st.cp)], len(every) * st.cp
        row[DP] = _dp_collective(
            "all_reduce",
            cluster,
            dp_ranks,
            dp_nodes,
            params / st.tp * self.grad_bytes,
            columns,
            self.ring_load,
        )
        # ZeRO-1: one shard per DP rank
        group = (plan.replicas - pipe.replicas + len(every)) * st.cp
        shard = group if plan.zero else 1
        row[OPT] = cc.optimizer_step(params / st.tp / shard, gpu, self.inst.format)
        row[OPT, ITER] = 1
        if plan.zero >= 2:
            zero_stage(
                row,
                passes,
                plan.zero,
                cluster,
                dp_ranks,
                dp_nodes,
                params / st.tp,
                self.grad_bytes,
                columns,
                gpu,
                self.ring_load,
                self.inst.format.weight_bytes,
            )


def dp_ring_load(cluster, plan: Plan, everyone) -> Counter:
    """How many gradient rings cross each link (directed graph edge). The stages' all-reduces run at
    about the same time — at the end of the iteration, within one backward chain of each other — so
    rings that share a NIC or an island link share its bandwidth (the simulator's max-min shares, to
    first order). `everyone`: (template, stage) → the node of each of its data-parallel ranks, all
    replicas."""
    load: Counter = Counter()
    for j, pipe in enumerate(plan.pipelines):
        for i in range(len(pipe.stages)):
            distinct = list(dict.fromkeys(everyone[(j, i)]))
            if len(distinct) > 1:
                for a, b in pairwise([*distinct, distinct[0]]):
                    load.update(cluster.route(a, b).edges)
    return load


def _dp_collective(
    kind: str,
    cluster,
    replicas: int,
    nodes: list[str],
    rank_bytes: float,
    columns: int,
    load: Counter,
) -> np.ndarray:
    """A collective (`all_reduce`, or `reduce_scatter`/`all_gather`: the same cost) of `rank_bytes`
    per rank among a stage's replicas (`nodes`: one per replica): inside one node on its
    interconnect, else hierarchical, ringing over the distinct nodes; `load`: rings per link
    (`dp_ring_load`)."""
    if replicas <= 1:
        return np.zeros(N_TERMS)
    distinct = list(dict.fromkeys(nodes))
    intra = cluster.slowest_intra(distinct)
    if len(distinct) == 1:
        return comm.collective(kind, rank_bytes, replicas, intra)
    ring = [cluster.route(a, b) for a, b in pairwise([*distinct, distinct[0]])]
    span = comm.Span(
        max(Counter(nodes).values()),
        len(distinct),
        min(shared_gbps(r, load) for r in ring),
        max(r.latency_us for r in ring) * 1e-6,
        max(r.alpha_s for r in ring),
        intra,
        columns,
    )
    return comm.collective(kind, rank_bytes, replicas, span)


def template_nodes(plan: Plan, template: int) -> list[str]:
    """The distinct nodes a template's replicas use, in placement order."""
    return list(
        dict.fromkeys(
            node
            for e in sorted(plan.placement, key=lambda e: (e.replica, e.stage))
            if e.pipeline == template
            for node, _ in e.members
        )
    )


def cross_template_exchange(cluster, plan: Plan, nodes_of, grad_bytes: float):
    """Second level of the gradient reduction with K ≥ 2 templates: a ring all-reduce of the model's
    `grad_bytes` among the templates (each sends 2(K−1)/K of it to the next). A hop from template j
    to j + 1 is spread evenly over pairs of their nodes (as many as the smaller template has), so it
    uses every NIC it can; flows sharing a link split it (as in `p2p_features`). Returns the
    features of the slowest flow and the flows themselves."""
    k = len(plan.pipelines)
    if k < 2:
        return np.zeros(N_TERMS), []
    nodes = [template_nodes(plan, j) for j in range(k)]
    volume = 2 * (k - 1) / k * grad_bytes
    flows = []
    for j in range(k):
        src, dst = nodes[j], nodes[(j + 1) % k]
        channels = min(len(src), len(dst))
        flows += [
            (a, b, volume / channels) for a, b in zip(src[:channels], dst[:channels], strict=True)
        ]
    routes = [cluster.route(a, b) for a, b, _ in flows]
    load: Counter = Counter(e for r in routes for e in r.edges)
    return slowest_transfer(
        [(r, nbytes) for r, (_, _, nbytes) in zip(routes, flows, strict=True)], load
    ), flows


def stage_memory(
    inst: Instance,
    plan: Plan,
    micro_batches: int,
    stages: int,
    i: int,
    st,
    params: float,
    replicas: int,
    sequences: int | None = None,
) -> float:
    """Peak bytes of stage i (of `stages`) of a template; `plan` gives the micro-batch size,
    schedule, virtual stages and ZeRO stage; `replicas` is every data-parallel rank of the stage in
    the plan (ZeRO-1 shards over all); `sequences` what one rank runs of each micro-batch (default
    all of it)."""
    m, s = inst.model, inst.seq_len // st.cp  # s: this CP rank's tokens
    b = plan.micro_batch if sequences is None else sequences
    attention, fmt = inst.spec.training.attention, inst.format
    norm_kernel = inst.spec.training.norm_kernel
    stack = inst.stack_memory or stack_memory(inst.spec.training.framework)
    grad = stack.grad_bytes
    per_layer = layer_activation_bytes(
        m, b, s, st.tp, st.sp, attention, st.recompute, fmt, norm_kernel
    )
    held = inflight_microbatches(i, stages, micro_batches, plan.schedule, plan.virtual_stages)
    activations = st.layers * per_layer * held
    # the layer being recomputed holds its full activations in backward
    if st.recompute == "full" and st.layers:
        activations += layer_activation_bytes(
            m, b, s, st.tp, st.sp, attention, "none", fmt, norm_kernel
        )
    activations *= 1 + stack.allocator_overhead  # the layers' many small blocks
    if i == stages - 1:  # the loss's few large ones, their own fitted peak
        activations += loss_bytes(m, b, s, st.tp, stack)
    working = 0.0
    if plan.zero >= 2:  # ZeRO-2/3's unsharded buffers of the largest unit (cost/memory.py)
        working = zero_working_bytes(
            largest_unit_params(m, st.layers, i == 0, i == stages - 1, stages),
            st.tp,
            plan.zero,
            fmt,
            grad,
        )
    dp = replicas * st.cp
    states = model_state_bytes(params, st.tp, dp, plan.zero, fmt, grad)
    states += params / st.tp * stack.grad_partition_bytes / (dp if plan.zero >= 1 else 1)
    casts = fp8_cast_bytes(st.layers * layer_params(m) / st.tp, dp, plan.zero, fmt)
    buffers = stack.reserve_gib * GIB
    amax = st.layers * fmt.amax_bytes_per_layer
    return states + casts + amax + working + activations + buffers


# -- TP across nodes, ZeRO-2/3
# ---------------------------------------------------------------------------


def tp_spans(cluster, plan: Plan) -> dict[tuple[int, int], comm.Span]:
    """(template, stage) → the span of its TP groups, for stages placed over several nodes. The
    replicas of a stage may sit on nodes with different NICs: the narrowest ring sets the pace (1F1B
    runs them in lockstep). Each group has its nodes to itself (whole nodes), so no other TP group
    shares their NICs."""
    out: dict[tuple[int, int], comm.Span] = {}
    for e in plan.placement:
        if not e.more_nodes:
            continue
        nodes = [node for node, _ in e.members]
        ring = [cluster.route(a, b) for a, b in pairwise([*nodes, nodes[0]])]
        span = comm.Span(
            len(e.gpus),
            len(nodes),
            min(r.effective_gbps for r in ring),
            max(r.latency_us for r in ring) * 1e-6,
            max(r.alpha_s for r in ring),
            cluster.slowest_intra(nodes),
        )
        key = (e.pipeline, e.stage)
        if key not in out or span.inter_gbps < out[key].inter_gbps:
            out[key] = span
    return out


def nic_columns(cluster, nodes: list[str], tp: int) -> int:
    """TP ranks of a stage on one node, each with its own data-parallel group through that node's
    NIC: the TP degree, or the GPUs of a node when the group spans nodes (the other nodes' NICs
    carry the rest)."""
    return min(tp, cluster.nodes[nodes[0]].gpus)


def zero_stage(
    row: np.ndarray,
    passes: np.ndarray,
    zero: int,
    cluster,
    replicas: int,
    nodes: list[str],
    params_per_gpu: float,
    grad_bytes: float,
    columns: int,
    gpu: GPUType,
    load: Counter,
    weight_bytes: float,
) -> None:
    """ZeRO-2/3 collectives of one stage over its data-parallel group (the template's replicas),
    written into its feature `row` (N_PARTS, N_TERMS) and its per-micro-batch `passes` (forward,
    backward).

    Assumptions (stated, as real runs differ): gradients are reduce-scattered after every
    micro-batch's backward, so that only the 1/N_d shard of them is kept (DeepSpeed ZeRO-2 reduces
    at every micro-step; FSDP without no_sync); ZeRO-3 (FSDP FULL_SHARD, reshard after forward)
    all-gathers the 16-bit weights in every forward and again in every backward. ZeRO-2 all-gathers
    the updated 16-bit weights once, after the optimizer step (in OPT); ZeRO-3 needs no such gather.
    Neither has an end-of-iteration all-reduce. With one micro-batch, ZeRO-2 moves what ZeRO-1's
    all-reduce does (reduce-scatter + all-gather)."""
    gather = _dp_collective(
        "all_gather", cluster, replicas, nodes, params_per_gpu * weight_bytes, columns, load
    )
    scatter = _dp_collective(
        "reduce_scatter", cluster, replicas, nodes, params_per_gpu * grad_bytes, columns, load
    )
    row[DP] = 0.0
    passes[1] = scatter
    if zero >= 3:
        passes[0] = gather
        passes[1] = passes[1] + gather
    else:
        row[OPT] += gather

"""Analytic iteration time and memory of any plan (DESIGN 3), heterogeneous plans included.

Two steps, so that calibration can reuse the first: `plan_features` turns a placed plan into cost
features per stage (work that does not depend on calibrated parameters), and `pipeline_time` prices them
with the weights of each stage's GPU type and combines the stages:

- stage time per micro-batch τ_i = forward + backward (+ recompute) + its tensor-parallel collectives
  + the point-to-point sends it makes (activations downstream, gradients upstream, once per model chunk);
- 1F1B and GPipe: T_pipe = m·max τ + (Σ τ − max τ); interleaved with vp virtual stages divides the
  fill-and-drain term by vp (Narayanan et al. 2021, §2.2);
- each stage's gradient all-reduce starts when the last micro-batch's backward has left it (stage i is
  done Σ_{k<i} backward times before stage 0) and its (1 − dp_overlap) exposed part may run past the
  pipeline; the optimizer step follows, then a fixed per-iteration time.
Several templates run side by side; the iteration waits for the slowest. Their layer splits differ, so a
stage's gradients are reduced in two levels: first among the replicas of its own template (as above), then
the templates exchange their reduced gradients — a ring all-reduce of the whole model's gradients among the
K templates, each ring hop spread over node pairs of neighbouring templates (`cross_template_exchange`).
Neither level depends on the layer split, which keeps the planner's program linear.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from functools import lru_cache
from itertools import pairwise

import numpy as np

from hetopt.cost import comm
from hetopt.cost import compute as cc
from hetopt.cost.flops import model_flops_per_token, total_params
from hetopt.cost.memory import (
    GIB,
    WEIGHT_BYTES,
    head_activation_bytes,
    inflight_microbatches,
    largest_unit_params,
    layer_activation_bytes,
    model_state_bytes,
    stage_params,
    zero_working_bytes,
)
from hetopt.cost.profiles import Profiles
from hetopt.cost.terms import ITER, MB, N_TERMS, PASS
from hetopt.errors import InputError, Problem
from hetopt.placement import place
from hetopt.plan import Plan
from hetopt.spec.cluster import Cluster, intra_route
from hetopt.spec.gpus import GPUType
from hetopt.spec.instance import Instance
from hetopt.spec.presets import ModelArch
from hetopt.verify import check_plan

GRAD_COMM_BYTES = 2.0
"""Gradients are reduced in 16 bits (Megatron-core's default grad_reduce_in_fp32=False; DeepSpeed fp16)."""
FP32_BYTES = 4.0


def grad_comm_bytes(inst: Instance) -> float:
    """Bytes per gradient in the data-parallel reduction: `training.grad_reduce_dtype` fp32 (Megatron's
    --grad-reduce-in-fp32, DeepSpeed's fp32 all-reduce) sends 4, the default 16 bits GRAD_COMM_BYTES."""
    return FP32_BYTES if inst.spec.training.grad_reduce_dtype == "fp32" else GRAD_COMM_BYTES

# Feature rows per stage, in this order.
FWD, BWD, FWD_TP, BWD_TP, P2P, DP, OPT = range(7)
N_PARTS = 7


@dataclass
class PlanFeatures:
    """Cost features of a placed plan: per template an array (stages, N_PARTS, N_TERMS)."""

    templates: list[np.ndarray]
    micro_batches: list[int]
    gpus: list[list[GPUType]]
    """GPU type of every stage, per template."""
    virtual_stages: int
    memory_bytes: list[list[float]]
    cross: np.ndarray = field(default_factory=lambda: np.zeros(N_TERMS))
    """Features of the gradient exchange between templates (zero with one template)."""
    cross_flows: list[tuple[str, str, float]] = field(default_factory=list)
    """Its flows: (source node, destination node, bytes), all running at once."""
    zero_passes: list[np.ndarray] = field(default_factory=list)
    """ZeRO-2/3 collectives per micro-batch, per template (stages, 2, N_TERMS): forward, backward pass."""
    zero_units: list[list[int]] = field(default_factory=list)
    """Units (layers, embedding, head) each stage gathers or reduces one by one under ZeRO-2/3."""


@dataclass
class Evaluation:
    iteration_time_s: float
    tokens_per_s: float
    tflops_per_gpu: float
    mfu: float
    fits: bool
    peak_memory_gib: list[float]
    memory_limit_gib: list[float]
    breakdown: dict[str, float] = field(default_factory=dict)

    def to_json(self) -> dict:
        return {
            "iteration_time_s": self.iteration_time_s, "tokens_per_s": self.tokens_per_s,
            "tflops_per_gpu": self.tflops_per_gpu, "mfu": self.mfu, "fits": self.fits,
            "peak_memory_gib": self.peak_memory_gib, "memory_limit_gib": self.memory_limit_gib,
            "breakdown": self.breakdown,
        }


def evaluate(inst: Instance, plan: Plan, profiles: Profiles | None = None, source: str = "plan",
             cluster: Cluster | None = None) -> Evaluation:
    """Analytic time and memory of a plan; structural errors in the plan are bad input (exit 2).

    `cluster` overrides the instance's (the same nodes with other link bandwidths: a scenario)."""
    problems = check_plan(inst, plan)
    if problems:
        raise InputError(source, [Problem(path, message) for path, message in problems])
    plan = place(plan, inst.cluster)
    feats = plan_features(inst, plan, cluster)
    return price(inst, plan, feats, profiles or Profiles())


# -- features -------------------------------------------------------------------------------------------

@lru_cache(maxsize=65536)
def stage_work(model: ModelArch, gpu: GPUType, micro_batch: int, seq_len: int, tp: int, sp: bool,
                attention: str, recompute: str, layers: int, first: bool, last: bool, intra=None) -> np.ndarray:
    """Forward/backward compute and TP features of one stage per micro-batch, (4, N_TERMS); TP collectives
    over `intra` (the stage's intra-node Route, or a comm.Span when its TP group spans nodes; default the
    GPU's catalog interconnect)."""
    x = cc.LayerShape(model, micro_batch, seq_len, tp, sp, attention)
    intra = intra or intra_route(gpu)
    fwd = layers * cc.layer_forward(x, gpu)
    bwd = layers * (cc.layer_backward(x, gpu) + cc.layer_recompute(x, gpu, recompute))
    tp_pass = cc.tp_comm_per_pass(x, intra)
    fwd_tp = layers * tp_pass
    bwd_tp = layers * tp_pass * (2 if recompute == "full" else 1)
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


def plan_features(inst: Instance, plan: Plan, cluster: Cluster | None = None) -> PlanFeatures:
    m, s, b = inst.model, inst.seq_len, plan.micro_batch
    attention = inst.spec.training.attention
    cluster = cluster or inst.cluster
    nodes_of = stage_nodes(plan)
    replicas_total = plan.replicas
    act_bytes = cc.ACT_BYTES * b * s * m.hidden
    templates, gpus, memory = [], [], []
    ring_load = dp_ring_load(cluster, plan, nodes_of)
    grad_bytes = grad_comm_bytes(inst)
    spans = tp_spans(cluster, plan)
    zero_passes, zero_units = [], []
    for j, pipe in enumerate(plan.pipelines):
        p = len(pipe.stages)
        arr = np.zeros((p, N_PARTS, N_TERMS))
        t_gpus, t_mem = [], []
        z_arr, z_units = np.zeros((p, 2, N_TERMS)), []
        for i, st in enumerate(pipe.stages):
            gpu = inst.gpu_types[st.gpu]
            first, last = i == 0, i == p - 1
            # TP collectives inside the stage's nodes, or over the network when its TP group spans nodes
            tp_path = spans.get((j, i)) or cluster.slowest_intra(nodes_of[(j, i)])
            arr[i, :4] = stage_work(m, gpu, b, s, st.tp, st.sp, attention, st.recompute, st.layers, first, last,
                                    tp_path)
            # The sender pays: activations forward to stage i+1, gradients back to stage i-1, once per
            # model chunk; with interleaving the last stage also passes activations on to the first stage's
            # next chunk, and the first stage passes gradients back to the last (vp − 1 times each).
            vp = plan.virtual_stages
            nxt, prv = (i + 1) % p, (i - 1) % p
            sends_fwd = vp if not last else vp - 1
            sends_bwd = vp if not first else vp - 1
            if sends_fwd:
                arr[i, P2P] += sends_fwd * p2p_features(cluster, nodes_of[(j, i)], nodes_of[(j, nxt)], act_bytes, st.tp)
            if sends_bwd:
                arr[i, P2P] += sends_bwd * p2p_features(cluster, nodes_of[(j, i)], nodes_of[(j, prv)], act_bytes, st.tp)
            params = stage_params(m, st.layers, first, last, p)
            columns = nic_columns(cluster, nodes_of[(j, i)], st.tp)
            arr[i, DP] = _dp_collective("all_reduce", cluster, pipe.replicas, nodes_of[(j, i)],
                                        params / st.tp * grad_bytes, columns, ring_load)
            shard = replicas_total if plan.zero else 1
            arr[i, OPT] = cc.optimizer_step(params / st.tp / shard, gpu)
            arr[i, OPT, ITER] = 1
            if plan.zero >= 2:
                zero_stage(arr[i], z_arr[i], plan.zero, cluster, pipe.replicas, nodes_of[(j, i)], params / st.tp,
                           grad_bytes, columns, gpu, ring_load)
            z_units.append(st.layers + first + last)
            t_gpus.append(gpu)
            t_mem.append(stage_memory(inst, plan, pipe.micro_batches, p, i, st, params, replicas_total))
        templates.append(arr)
        gpus.append(t_gpus)
        memory.append(t_mem)
        zero_passes.append(z_arr)
        zero_units.append(z_units)
    cross, flows = cross_template_exchange(cluster, plan, nodes_of, total_params(m) * grad_bytes)
    return PlanFeatures(templates, [pp.micro_batches for pp in plan.pipelines], gpus, plan.virtual_stages, memory,
                        cross, flows, zero_passes if plan.zero >= 2 else [], zero_units)


def stage_nodes(plan: Plan) -> dict[tuple[int, int], list[str]]:
    """(template, stage) → the node of each replica."""
    out: dict[tuple[int, int], list[str]] = {}
    for e in sorted(plan.placement, key=lambda e: (e.pipeline, e.stage, e.replica)):
        out.setdefault((e.pipeline, e.stage), []).append(e.node)
    return out


def p2p_features(cluster, src_nodes: list[str], dst_nodes: list[str], nbytes: float, tp: int) -> np.ndarray:
    """One activation (or gradient) send across a stage boundary: the slowest replica's.

    Each TP rank sends its 1/tp share (Megatron's scatter-gather); inside a node every rank has its own
    link, across nodes all shares go through the node's bottleneck. The replicas of a template cross the
    same boundary at about the same time (1F1B runs them in lockstep), so flows in the same direction on
    one link split it evenly — the max-min fair share the simulator gives them.
    """
    pairs = Counter(zip(src_nodes, dst_nodes, strict=True))
    routes = [cluster.route(a, b) for a, b in pairs]
    load: Counter = Counter()
    for route, n in zip(routes, pairs.values(), strict=True):
        for edge in route.edges:
            load[edge] += n
    return slowest_transfer([(r, nbytes / tp if r.intra_node else nbytes) for r in routes], load)


def shared_gbps(route, load: Counter) -> float:
    """A flow's bandwidth along `route` when `load[e]` flows share each link e evenly (their max-min fair
    share when all run at once); inside a node, the node's interconnect."""
    if route.intra_node:
        return route.effective_gbps
    return min(c / max(1, load[e]) for e, c in zip(route.edges, route.edge_effective, strict=True))


def slowest_transfer(sends: list[tuple], load: Counter) -> np.ndarray:
    """Features of the slowest of concurrent sends (route, bytes) sharing links as `load` counts."""
    def seconds(send) -> float:
        route, nbytes = send
        return nbytes / (shared_gbps(route, load) * comm.GBIT) + route.latency_us * 1e-6 + route.alpha_s

    route, nbytes = max(sends, key=seconds)
    return comm.transfer(nbytes, shared_gbps(route, load), route.intra_node, latency_s=route.latency_us * 1e-6,
                         alpha_s=route.alpha_s)


def dp_ring_load(cluster, plan: Plan, nodes_of) -> Counter:
    """How many gradient rings cross each link (directed graph edge). The stages' all-reduces run at about
    the same time — at the end of the iteration, within one backward chain of each other — so rings that
    share a NIC or an island link share its bandwidth (the simulator's max-min shares, to first order)."""
    load: Counter = Counter()
    for j, pipe in enumerate(plan.pipelines):
        if pipe.replicas <= 1:
            continue
        for i in range(len(pipe.stages)):
            distinct = list(dict.fromkeys(nodes_of[(j, i)]))
            if len(distinct) > 1:
                for a, b in pairwise([*distinct, distinct[0]]):
                    load.update(cluster.route(a, b).edges)
    return load


def _dp_collective(kind: str, cluster, replicas: int, nodes: list[str], rank_bytes: float, columns: int,
                   load: Counter) -> np.ndarray:
    """A collective (`all_reduce`, or `reduce_scatter`/`all_gather`: the same cost) of `rank_bytes` per rank
    among a stage's replicas (`nodes`: one per replica): inside one node on its interconnect, else
    hierarchical, ringing over the distinct nodes; `load`: rings per link (`dp_ring_load`)."""
    if replicas <= 1:
        return np.zeros(N_TERMS)
    distinct = list(dict.fromkeys(nodes))
    intra = cluster.slowest_intra(distinct)
    if len(distinct) == 1:
        return comm.collective(kind, rank_bytes, replicas, intra)
    ring = [cluster.route(a, b) for a, b in pairwise([*distinct, distinct[0]])]
    span = comm.Span(max(nodes.count(n) for n in distinct), len(distinct), min(shared_gbps(r, load) for r in ring),
                     max(r.latency_us for r in ring) * 1e-6, max(r.alpha_s for r in ring), intra, columns)
    return comm.collective(kind, rank_bytes, replicas, span)


def template_nodes(plan: Plan, template: int) -> list[str]:
    """The distinct nodes a template's replicas use, in placement order."""
    return list(dict.fromkeys(node for e in sorted(plan.placement, key=lambda e: (e.replica, e.stage))
                              if e.pipeline == template for node, _ in e.members))


def cross_template_exchange(cluster, plan: Plan, nodes_of, grad_bytes: float):
    """Second level of the gradient reduction with K ≥ 2 templates: a ring all-reduce of the model's
    `grad_bytes` among the templates (each sends 2(K−1)/K of it to the next). A hop from template j to
    j + 1 is spread evenly over pairs of their nodes (as many as the smaller template has), so it uses
    every NIC it can; flows sharing a link split it (as in `p2p_features`). Returns the features of the
    slowest flow and the flows themselves."""
    k = len(plan.pipelines)
    if k < 2:
        return np.zeros(N_TERMS), []
    nodes = [template_nodes(plan, j) for j in range(k)]
    volume = 2 * (k - 1) / k * grad_bytes
    flows = []
    for j in range(k):
        src, dst = nodes[j], nodes[(j + 1) % k]
        channels = min(len(src), len(dst))
        flows += [(a, b, volume / channels) for a, b in zip(src[:channels], dst[:channels], strict=True)]
    routes = [cluster.route(a, b) for a, b, _ in flows]
    load: Counter = Counter(e for r in routes for e in r.edges)
    return slowest_transfer([(r, nbytes) for r, (_, _, nbytes) in zip(routes, flows, strict=True)], load), flows


def stage_memory(inst: Instance, plan: Plan, micro_batches: int, stages: int, i: int, st, params: float,
                 replicas: int) -> float:
    """Peak bytes of stage i (of `stages`) of a template; `plan` gives the micro-batch size, schedule,
    virtual stages and ZeRO stage; `replicas` is every replica of the plan (ZeRO-1 shards over all)."""
    m, s, b = inst.model, inst.seq_len, plan.micro_batch
    attention = inst.spec.training.attention
    per_layer = layer_activation_bytes(m, b, s, st.tp, st.sp, attention, st.recompute)
    held = inflight_microbatches(i, stages, micro_batches, plan.schedule, plan.virtual_stages)
    activations = st.layers * per_layer * held
    if st.recompute == "full" and st.layers:  # the layer being recomputed holds its full activations in backward
        activations += layer_activation_bytes(m, b, s, st.tp, st.sp, attention, "none")
    if i == stages - 1:
        activations += head_activation_bytes(m, b, s, st.tp)
    working = 0.0
    if plan.zero >= 2:  # ZeRO-2/3's unsharded buffers of the largest unit (cost/memory.py)
        working = zero_working_bytes(largest_unit_params(m, st.layers, i == 0, i == stages - 1, stages), st.tp,
                                     plan.zero)
    return model_state_bytes(params, st.tp, replicas, plan.zero) + working + activations


# -- TP across nodes, ZeRO-2/3 ---------------------------------------------------------------------------

def tp_spans(cluster, plan: Plan) -> dict[tuple[int, int], comm.Span]:
    """(template, stage) → the span of its TP groups, for stages placed over several nodes. The replicas of
    a stage may sit on nodes with different NICs: the narrowest ring sets the pace (1F1B runs them in
    lockstep). Each group has its nodes to itself (whole nodes), so no other TP group shares their NICs."""
    out: dict[tuple[int, int], comm.Span] = {}
    for e in plan.placement:
        if not e.more_nodes:
            continue
        nodes = [node for node, _ in e.members]
        ring = [cluster.route(a, b) for a, b in pairwise([*nodes, nodes[0]])]
        span = comm.Span(len(e.gpus), len(nodes), min(r.effective_gbps for r in ring),
                         max(r.latency_us for r in ring) * 1e-6, max(r.alpha_s for r in ring),
                         cluster.slowest_intra(nodes))
        key = (e.pipeline, e.stage)
        if key not in out or span.inter_gbps < out[key].inter_gbps:
            out[key] = span
    return out


def nic_columns(cluster, nodes: list[str], tp: int) -> int:
    """TP ranks of a stage on one node, each with its own data-parallel group through that node's NIC:
    the TP degree, or the GPUs of a node when the group spans nodes (the other nodes' NICs carry the rest)."""
    return min(tp, cluster.nodes[nodes[0]].gpus)


def zero_stage(row: np.ndarray, passes: np.ndarray, zero: int, cluster, replicas: int, nodes: list[str],
               params_per_gpu: float, grad_bytes: float, columns: int, gpu: GPUType, load: Counter) -> None:
    """ZeRO-2/3 collectives of one stage over its data-parallel group (the template's replicas), written into
    its feature `row` (N_PARTS, N_TERMS) and its per-micro-batch `passes` (forward, backward).

    Assumptions (stated, as real runs differ): gradients are reduce-scattered after every micro-batch's
    backward, so that only the 1/N_d shard of them is kept (DeepSpeed ZeRO-2 reduces at every micro-step;
    FSDP without no_sync); ZeRO-3 (FSDP FULL_SHARD, reshard after forward) all-gathers the 16-bit weights
    in every forward and again in every backward. ZeRO-2 all-gathers the updated 16-bit weights once, after
    the optimizer step (in OPT); ZeRO-3 needs no such gather. Neither has an end-of-iteration all-reduce.
    With one micro-batch, ZeRO-2 moves what ZeRO-1's all-reduce does (reduce-scatter + all-gather)."""
    gather = _dp_collective("all_gather", cluster, replicas, nodes, params_per_gpu * WEIGHT_BYTES, columns, load)
    scatter = _dp_collective("reduce_scatter", cluster, replicas, nodes, params_per_gpu * grad_bytes, columns, load)
    row[DP] = 0.0
    passes[1] = scatter
    if zero >= 3:
        passes[0] = gather
        passes[1] = passes[1] + gather
    else:
        row[OPT] += gather


def zero_exposed(times: np.ndarray, passes: np.ndarray, units: list[int], weights: np.ndarray) -> np.ndarray:
    """Seconds the ZeRO-2/3 collectives add to each stage's forward and backward pass, (stages, 2).

    Rule: a pass works through its n units (layers, embedding, head) in order and each unit's collective
    is prefetched one unit ahead on its own stream (FSDP's forward/backward prefetch; the reduce-scatter of
    a unit's gradients runs during the next unit's backward) — a two-machine flow shop of n equal steps,
    compute c = P/n and communication k = K/n per unit, which takes n·max(c, k) + min(c, k) =
    max(P, K) + min(P, K)/n: the first gather (or the last reduce-scatter) is never hidden, the rest hides
    behind compute while compute is the longer. P: the pass with its TP collectives; K: its ZeRO
    collectives. Units are taken as equal (the embedding and head differ from a layer: an approximation)."""
    comm_s = np.einsum("spk,sk->sp", passes, weights) if weights.ndim == 2 else passes @ weights
    compute_s = np.stack([times[:, FWD] + times[:, FWD_TP], times[:, BWD] + times[:, BWD_TP]], axis=1)
    n = np.asarray(units, dtype=float)[:, None]
    return np.maximum(compute_s, comm_s) + np.minimum(compute_s, comm_s) / n - compute_s


def price_template(f: PlanFeatures, j: int, weights: np.ndarray, serial) -> tuple[np.ndarray, np.ndarray]:
    """Seconds per part of template j's stages (`price_parts`), the exposed ZeRO-2/3 collectives added to
    the passes' communication parts; also returns those exposed seconds per stage (for the breakdown)."""
    times = price_parts(f.templates[j], weights, serial)
    if not f.zero_passes:
        return times, np.zeros(len(times))
    extra = zero_exposed(times, f.zero_passes[j], f.zero_units[j], weights)
    times[:, FWD_TP] += extra[:, 0]
    times[:, BWD_TP] += extra[:, 1]
    return times, extra.sum(axis=1)


# -- pricing --------------------------------------------------------------------------------------------

CPU_TERMS = [PASS, MB]
"""Terms paid on the host (launching kernels, framework bookkeeping); all others are device time."""
_CPU = np.isin(np.arange(N_TERMS), CPU_TERMS)


def overlap_host_device(host_s, device_s, serial):
    """A pass whose kernels are launched asynchronously takes the longer of host and device time; the
    `serial` fraction of the shorter one cannot hide behind it (synchronisation points)."""
    return np.maximum(host_s, device_s) + serial * np.minimum(host_s, device_s)


def host_device(features: np.ndarray, weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Host and device seconds of features (..., N_TERMS), priced by weights (N_TERMS,) or by a weight
    vector per leading row (..., N_TERMS) — the one place features meet weights."""
    if weights.ndim == 1:  # one GPU type for every row (calibration): a matrix product
        return features[..., _CPU] @ weights[_CPU], features[..., ~_CPU] @ weights[~_CPU]
    # a weight vector per stage; features per stage (and part)
    rule = "spk,sk->sp" if features.ndim == 3 else "sk,sk->s"
    return (np.einsum(rule, features[..., _CPU], weights[..., _CPU]),
            np.einsum(rule, features[..., ~_CPU], weights[..., ~_CPU]))


def price_parts(features: np.ndarray, weights: np.ndarray, serial) -> np.ndarray:
    """Seconds per part from features (..., N_PARTS, N_TERMS) and weights (..., N_TERMS).

    Forward and backward passes overlap host and device work; their tensor-parallel collectives are
    device work, and the FWD_TP/BWD_TP parts hold what they add to the pass.
    """
    host, device = host_device(features, weights)
    out = host + device
    for compute, tp in ((FWD, FWD_TP), (BWD, BWD_TP)):
        alone = overlap_host_device(host[..., compute], device[..., compute], serial)
        with_tp = overlap_host_device(host[..., compute], device[..., compute] + device[..., tp], serial)
        out[..., compute] = alone
        out[..., tp] = with_tp - alone
    return out


def pipe_times(times: np.ndarray, micro_batches, virtual_stages: int, mask: np.ndarray | None = None):
    """Pipeline time and per-stage τ from priced stage parts `times` (..., stages, N_PARTS), seconds.

    Works on one template or on a batch (calibration); `mask` marks real stages in a padded batch.
    """
    if mask is None:
        mask = np.ones(times.shape[:-1], dtype=bool)
    m = np.asarray(micro_batches, dtype=float)
    tau = (times[..., FWD] + times[..., BWD] + times[..., FWD_TP] + times[..., BWD_TP] + times[..., P2P]) * mask
    tau_max = tau.max(axis=-1)
    t_pipe = m * tau_max + (tau.sum(axis=-1) - tau_max) / virtual_stages
    return t_pipe, tau


def dp_finish(times: np.ndarray, t_sync, dp_overlap, mask: np.ndarray | None = None):
    """When the last gradient all-reduce ends, given when the pipelines drain (`t_sync`).

    Gradients of a stage are reduced once per iteration, after its last micro-batch; buckets start
    streaming during that last backward pass, for the `dp_overlap` fraction of it (DDP-style overlap).
    """
    if mask is None:
        mask = np.ones(times.shape[:-1], dtype=bool)
    bwd = (times[..., BWD] + times[..., BWD_TP]) * mask
    send_back = 0.5 * times[..., P2P] * mask  # the gradient half of a stage's point-to-point time
    send_back[..., 0] = 0.0  # the first stage sends no gradient
    # The last micro-batch's backward runs from the last stage down to stage 0, which ends at t_sync;
    # stage i's last backward compute ends the backward and sends of the stages before it earlier.
    chain = bwd + send_back
    compute_end = np.asarray(t_sync)[..., None] - (np.cumsum(chain, axis=-1) - chain) - send_back
    dp_end = compute_end - dp_overlap * bwd + times[..., DP]
    return np.maximum(t_sync, np.where(mask, dp_end, -np.inf).max(axis=-1))


def cross_seconds(f: PlanFeatures, profiles: Profiles) -> float:
    """The exchange between templates, priced with the first stage's weights (network terms are the same
    for every GPU type: they are not fitted per type)."""
    return float(f.cross @ profiles.for_gpu(f.gpus[0][0]).w)


def price(inst: Instance, plan: Plan, f: PlanFeatures, profiles: Profiles) -> Evaluation:
    priced, zero_s = [], []
    for j, gpus in enumerate(f.gpus):
        params = [profiles.for_gpu(g, inst.spec.training.framework) for g in gpus]
        weights = np.stack([p.w for p in params])  # (stages, N_TERMS)
        serial = np.array([p.launch_serial for p in params])
        times, exposed = price_template(f, j, weights, serial)
        priced.append((times, np.array([p.dp_overlap for p in params])))
        zero_s.append(exposed)
    pipes = [pipe_times(times, m, f.virtual_stages) for (times, _), m in zip(priced, f.micro_batches, strict=True)]
    # The slowest template sets the pace; gradient all-reduces wait for every template's replicas.
    crit = max(range(len(pipes)), key=lambda j: float(pipes[j][0]))
    t_pipe = float(pipes[crit][0])
    t_dp = max(float(dp_finish(times, t_pipe, overlap)) for times, overlap in priced)
    t_opt = max(float(times[:, OPT].max()) for times, _ in priced)
    t_cross = cross_seconds(f, profiles)
    times, tau = priced[crit][0], pipes[crit][1]
    k = int(np.argmax(tau))
    m = f.micro_batches[crit]
    breakdown = {
        "compute": m * float(times[k, FWD] + times[k, BWD]),
        "bubble": t_pipe - m * float(tau[k]),
        "tp_comm": m * float(times[k, FWD_TP] + times[k, BWD_TP]),
        "pp_comm": m * float(times[k, P2P]),
        "dp_comm": t_dp - t_pipe + t_cross,
        "optimizer": t_opt,
    }
    # ZeRO-2/3's exposed collectives sit in the passes' communication parts; they are data-parallel traffic
    breakdown["tp_comm"] -= m * float(zero_s[crit][k])
    breakdown["dp_comm"] += m * float(zero_s[crit][k])
    iteration = t_dp + t_cross + t_opt
    tokens = inst.global_batch * inst.seq_len
    model_flops = model_flops_per_token(inst.model, inst.seq_len) * tokens
    peak_used = sum(pipe.replicas * st.tp * inst.gpu_types[st.gpu].peak_flops
                    for pipe in plan.pipelines for st in pipe.stages)
    peak_mem = [mem / GIB + profiles.for_gpu(g).reserve_gib
                for mems, gpus in zip(f.memory_bytes, f.gpus, strict=True) for mem, g in zip(mems, gpus, strict=True)]
    limits = [g.usable_memory_gib for gpus in f.gpus for g in gpus]  # what a program can allocate
    return Evaluation(
        iteration_time_s=iteration, tokens_per_s=tokens / iteration,
        tflops_per_gpu=model_flops / iteration / plan.gpus_used / 1e12, mfu=model_flops / iteration / peak_used,
        fits=all(p <= lim for p, lim in zip(peak_mem, limits, strict=True)),
        peak_memory_gib=peak_mem, memory_limit_gib=limits, breakdown=breakdown)

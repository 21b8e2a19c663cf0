"""Pricing: seconds from cost features and calibrated weights, and the iteration time of a plan
(docs/cost-model.md).

Two steps, so that calibration can reuse the first: `plan_features` turns a placed plan into cost
features per stage (hetopt.cost.features: work that does not depend on calibrated parameters), and
`price` prices them with the weights of each stage's GPU type and combines the stages:

- stage time per micro-batch τ_i = forward + backward (+ recompute) + its tensor-parallel
  collectives
  + the point-to-point sends it makes (activations downstream, gradients upstream, once per model
  chunk);
- 1F1B and GPipe: T_pipe = m·max τ + (Σ τ − max τ); interleaved with vp virtual stages divides the
  fill-and-drain term by vp (Narayanan et al. 2021, §2.2);
- each stage's gradient all-reduce starts when the last micro-batch's backward has left it (stage i
  is
  done Σ_{k<i} backward times before stage 0) and its (1 − dp_overlap) exposed part may run past the
  pipeline; the optimizer step follows, then a fixed per-iteration time.
Several templates run side by side; the iteration waits for the slowest. Their layer splits differ,
so a stage's gradients are reduced in two levels: first among the replicas of its own template (as
above), then the templates exchange their reduced gradients — a ring all-reduce of the whole model's
gradients among the K templates, each ring hop spread over node pairs of neighbouring templates
(`cross_template_exchange`). Neither level depends on the layer split, which keeps the planner's
program linear.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from hetopt.cost.dollars import plan_cost
from hetopt.cost.features import BWD, BWD_TP, DP, FWD, FWD_TP, OPT, P2P, PlanFeatures, plan_features
from hetopt.cost.flops import model_flops_per_token
from hetopt.cost.memory import (
    GIB,
)
from hetopt.cost.profiles import Profiles
from hetopt.cost.terms import MB, N_TERMS, PASS
from hetopt.errors import InputError, Problem
from hetopt.placement import place
from hetopt.plan import Plan, row_labels
from hetopt.spec.instance import Instance
from hetopt.verify import check_plan


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
    memory_rows: list[str] = field(default_factory=list)
    """With stages with shards: what each entry of the memory lists is ("0 V100-32GB": flat stage 0,
    its V100 ranks); empty when every entry is a stage (the flat stage index, template after
    template)."""
    usd_per_hour: float | None = None
    """Dollars per hour of training (hetopt.cost.dollars); None where a rented node has no price."""
    usd_per_million_tokens: float | None = None

    def to_json(self) -> dict:
        out = {
            "iteration_time_s": self.iteration_time_s,
            "tokens_per_s": self.tokens_per_s,
            "tflops_per_gpu": self.tflops_per_gpu,
            "mfu": self.mfu,
            "fits": self.fits,
            "peak_memory_gib": self.peak_memory_gib,
            "memory_limit_gib": self.memory_limit_gib,
            "breakdown": self.breakdown,
            "usd_per_hour": self.usd_per_hour,
            "usd_per_million_tokens": self.usd_per_million_tokens,
        }
        if self.memory_rows:
            out["memory_rows"] = self.memory_rows
        return out


def streamed_pass(compute_s, comm_s, units):
    """Seconds of a pass of n units whose collectives stream one unit ahead of its compute:
    max(P, K) + min(P, K)/n (`zero_exposed` says why). Scalars or arrays."""
    return np.maximum(compute_s, comm_s) + np.minimum(compute_s, comm_s) / units


def zero_exposed(
    times: np.ndarray, passes: np.ndarray, units: list[int], weights: np.ndarray
) -> np.ndarray:
    """Seconds the ZeRO-2/3 collectives add to each stage's forward and backward pass, (stages, 2).

    Rule: a pass works through its n units (layers, embedding, head) in order and each unit's
    collective is prefetched one unit ahead on its own stream (FSDP's forward/backward prefetch; the
    reduce-scatter of a unit's gradients runs during the next unit's backward) — a two-machine flow
    shop of n equal steps, compute c = P/n and communication k = K/n per unit, which takes n·max(c,
    k) + min(c, k) = max(P, K) + min(P, K)/n: the first gather (or the last reduce-scatter) is never
    hidden, the rest hides behind compute while compute is the longer. P: the pass with its TP
    collectives; K: its ZeRO collectives. Units are taken as equal (the embedding and head differ
    from a layer: an approximation)."""
    comm_s = np.einsum("spk,sk->sp", passes, weights) if weights.ndim == 2 else passes @ weights
    compute_s = np.stack(
        [times[:, FWD] + times[:, FWD_TP], times[:, BWD] + times[:, BWD_TP]], axis=1
    )
    return streamed_pass(compute_s, comm_s, np.asarray(units, dtype=float)[:, None]) - compute_s


def price_template(
    f: PlanFeatures, j: int, weights: np.ndarray, serial
) -> tuple[np.ndarray, np.ndarray]:
    """Seconds per part of template j's stages (`price_parts`), the exposed ZeRO-2/3 collectives
    added to the passes' communication parts; also returns those exposed seconds per stage (for the
    breakdown)."""
    times = price_parts(f.templates[j], weights, serial)
    if not f.zero_passes:
        return times, np.zeros(len(times))
    extra = zero_exposed(times, f.zero_passes[j], f.zero_units[j], weights)
    times[:, FWD_TP] += extra[:, 0]
    times[:, BWD_TP] += extra[:, 1]
    return times, extra.sum(axis=1)


# -- pricing
# --------------------------------------------------------------------------------------------

CPU_TERMS = [PASS, MB]
"""Terms paid on the host (launching kernels, framework bookkeeping); all others are device time."""
_CPU = np.isin(np.arange(N_TERMS), CPU_TERMS)


def overlap_host_device(host_s, device_s, serial):
    """A pass whose kernels are launched asynchronously takes the longer of host and device time;
    the `serial` fraction of the shorter one cannot hide behind it (synchronisation points)."""
    return np.maximum(host_s, device_s) + serial * np.minimum(host_s, device_s)


def host_device(features: np.ndarray, weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Host and device seconds of features (..., N_TERMS), priced by weights (N_TERMS,) or by a
    weight vector per leading row (..., N_TERMS) — the one place features meet weights."""
    if weights.ndim == 1:  # one GPU type for every row (calibration): a matrix product
        return features[..., _CPU] @ weights[_CPU], features[..., ~_CPU] @ weights[~_CPU]
    # a weight vector per stage; features per stage (and part)
    rule = "spk,sk->sp" if features.ndim == 3 else "sk,sk->s"
    return (
        np.einsum(rule, features[..., _CPU], weights[..., _CPU]),
        np.einsum(rule, features[..., ~_CPU], weights[..., ~_CPU]),
    )


def price_parts(features: np.ndarray, weights: np.ndarray, serial) -> np.ndarray:
    """Seconds per part from features (..., N_PARTS, N_TERMS) and weights (..., N_TERMS).

    Forward and backward passes overlap host and device work; their tensor-parallel collectives are
    device work, and the FWD_TP/BWD_TP parts hold what they add to the pass.
    """
    host, device = host_device(features, weights)
    out = host + device
    for compute, tp in ((FWD, FWD_TP), (BWD, BWD_TP)):
        alone = overlap_host_device(host[..., compute], device[..., compute], serial)
        with_tp = overlap_host_device(
            host[..., compute], device[..., compute] + device[..., tp], serial
        )
        out[..., compute] = alone
        out[..., tp] = with_tp - alone
    return out


def by_stage(
    times: np.ndarray, stage_of: list[int], overlap: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Priced parts per stage from parts per row (`PlanFeatures.stage_of`), and each stage's DP
    overlap.

    A stage with shards moves through the pipeline as one: a micro-batch's forward pass (with its TP
    collectives) ends with its slowest rank's, its backward pass likewise, its sends with the
    slowest row's, its all-reduce and optimizer step with the last row's — each from the row where
    it is longest. The all-reduce overlaps the last `dp_overlap` fraction o_r of each rank's last
    backward: the ranks start it together and rank r is ready (1 − o_r)·b_r in, so the stage's
    overlap is 1 − max_r (1 − o_r)·b_r / max_r b_r (with one row, o). Returns (stages, N_PARTS) and
    (stages,)."""
    rows = np.asarray(stage_of)
    stages = rows.max() + 1
    out, stage_overlap = np.zeros((stages, times.shape[1])), np.zeros(stages)
    for i in range(stages):
        mine, o = times[rows == i], overlap[rows == i]
        out[i] = mine.max(axis=0)  # P2P, DP, OPT: the longest row's
        forward, backward = mine[:, FWD] + mine[:, FWD_TP], mine[:, BWD] + mine[:, BWD_TP]
        out[i, [FWD, FWD_TP]] = mine[np.argmax(forward), [FWD, FWD_TP]]
        out[i, [BWD, BWD_TP]] = mine[np.argmax(backward), [BWD, BWD_TP]]
        longest = backward.max()
        stage_overlap[i] = 1 - ((1 - o) * backward).max() / longest if longest > 0 else o.max()
    return out, stage_overlap


def pipe_times(
    times: np.ndarray, micro_batches, virtual_stages: int, mask: np.ndarray | None = None
):
    """Pipeline time and per-stage τ from priced stage parts `times` (..., stages, N_PARTS),
    seconds.

    Works on one template or on a batch (calibration); `mask` marks real stages in a padded batch.
    """
    if mask is None:
        mask = np.ones(times.shape[:-1], dtype=bool)
    m = np.asarray(micro_batches, dtype=float)
    tau = (
        times[..., FWD]
        + times[..., BWD]
        + times[..., FWD_TP]
        + times[..., BWD_TP]
        + times[..., P2P]
    ) * mask
    tau_max = tau.max(axis=-1)
    t_pipe = m * tau_max + (tau.sum(axis=-1) - tau_max) / virtual_stages
    return t_pipe, tau


def dp_finish(times: np.ndarray, t_sync, dp_overlap, mask: np.ndarray | None = None):
    """When the last gradient all-reduce ends, given when the pipelines drain (`t_sync`).

    Gradients of a stage are reduced once per iteration, after its last micro-batch; buckets start
    streaming during that last backward pass, for the `dp_overlap` fraction of it (DDP-style
    overlap).
    """
    if mask is None:
        mask = np.ones(times.shape[:-1], dtype=bool)
    bwd = (times[..., BWD] + times[..., BWD_TP]) * mask
    send_back = 0.5 * times[..., P2P] * mask  # the gradient half of a stage's point-to-point time
    send_back[..., 0] = 0.0  # the first stage sends no gradient
    # The last micro-batch's backward runs from the last stage down to stage 0, which ends at
    # t_sync; stage i's last backward compute ends the backward and sends of the stages before it
    # earlier.
    chain = bwd + send_back
    compute_end = np.asarray(t_sync)[..., None] - (np.cumsum(chain, axis=-1) - chain) - send_back
    dp_end = compute_end - dp_overlap * bwd + times[..., DP]
    return np.maximum(t_sync, np.where(mask, dp_end, -np.inf).max(axis=-1))


def cross_seconds(f: PlanFeatures, profiles: Profiles) -> float:
    """The exchange between templates, priced with the first stage's weights (network terms are the
    same for every GPU type: they are not fitted per type)."""
    return float(f.cross @ profiles.for_gpu(f.gpus[0][0]).w)


def price(inst: Instance, plan: Plan, f: PlanFeatures, profiles: Profiles) -> Evaluation:
    """Price a placed plan's features with each stage's calibrated weights (module docstring).

    Parameters: inst — the instance (its training stack picks the weights); plan — the placed plan
    `f` was built from; f — its cost features (`plan_features`); profiles — calibrated weights per
    GPU type.
    Returns: the Evaluation — iteration time (slowest template's pipeline, gradient all-reduces,
    templates' exchange, optimizer step), tokens/s, TFLOP/s per GPU, MFU, peak memory per stage and
    its limit, whether every stage fits, and the breakdown of the critical template's time."""
    priced, zero_s = [], []
    for j, gpus in enumerate(f.gpus):
        params = [profiles.for_gpu(g, inst.spec.training.framework) for g in gpus]
        weights = np.stack([p.w for p in params])  # (stages, N_TERMS)
        serial = np.array([p.launch_serial for p in params])
        times, exposed = price_template(f, j, weights, serial)
        overlap = np.array([p.dp_overlap for p in params])
        if f.mixed(j):
            exposed = np.array(
                [
                    exposed[np.asarray(f.stage_of[j]) == i].max()
                    for i in range(max(f.stage_of[j]) + 1)
                ]
            )
            times, overlap = by_stage(times, f.stage_of[j], overlap)
        priced.append((times, overlap))
        zero_s.append(exposed)
    pipes = [
        pipe_times(times, m, f.virtual_stages)
        for (times, _), m in zip(priced, f.micro_batches, strict=True)
    ]
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
    # ZeRO-2/3's exposed collectives sit in the passes' communication parts; they are data-parallel
    # traffic
    breakdown["tp_comm"] -= m * float(zero_s[crit][k])
    breakdown["dp_comm"] += m * float(zero_s[crit][k])
    iteration = t_dp + t_cross + t_opt
    tokens = inst.global_batch * inst.seq_len
    model_flops = model_flops_per_token(inst.model, inst.seq_len) * tokens
    peak_used = sum(
        pipe.replicas * st.width * sh.ranks * inst.gpu_types[sh.gpu].peak_flops
        for pipe in plan.pipelines
        for st in pipe.stages
        for sh in st.ranks_of(plan.micro_batch)
    )
    peak_mem = [
        mem / GIB + profiles.for_gpu(g).reserve_gib
        for mems, gpus in zip(f.memory_bytes, f.gpus, strict=True)
        for mem, g in zip(mems, gpus, strict=True)
    ]
    limits = [g.usable_memory_gib for gpus in f.gpus for g in gpus]  # what a program can allocate
    return Evaluation(
        iteration_time_s=iteration,
        tokens_per_s=tokens / iteration,
        tflops_per_gpu=model_flops / iteration / plan.gpus_used / 1e12,
        mfu=model_flops / iteration / peak_used,
        fits=all(p <= lim for p, lim in zip(peak_mem, limits, strict=True)),
        peak_memory_gib=peak_mem,
        memory_limit_gib=limits,
        breakdown=breakdown,
        memory_rows=memory_rows(plan) if any(f.mixed(j) for j in range(len(f.gpus))) else [],
    )


def memory_rows(plan: Plan) -> list[str]:
    """A label for each row of a plan's memory lists: its flat stage index (template after template)
    and, for a shard, its GPU type."""
    flat, out, last = -1, [], None
    for j, i, gpu in row_labels(plan):
        if (j, i) != last:
            flat, last = flat + 1, (j, i)
        out.append(f"{flat} {gpu}".rstrip())
    return out


def evaluate(
    inst: Instance, plan: Plan, profiles: Profiles | None = None, source: str = "plan"
) -> Evaluation:
    """Analytic time and memory of a plan; structural errors in the plan are bad input (exit 2).

    Parameters: inst — the instance; plan — the plan (placed or not; it is placed here); profiles —
    calibrated weights (default: shipped); source — the name error messages give the plan. A
    scenario's bandwidths: evaluate on `inst.on_network(...)`.
    Returns: an Evaluation — iteration time, throughput, MFU, peak memory per stage against its
    limit, whether it fits, and the time breakdown."""
    problems = check_plan(inst, plan)
    if problems:
        raise InputError(source, [Problem(path, message) for path, message in problems])
    plan = place(plan, inst.cluster)
    feats = plan_features(inst, plan)
    out = price(inst, plan, feats, profiles or Profiles())
    cost = plan_cost(inst, plan, out.iteration_time_s)
    out.usd_per_hour, out.usd_per_million_tokens = cost.usd_per_hour, cost.usd_per_million_tokens
    return out

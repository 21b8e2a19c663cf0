"""Memory per GPU: weights, gradients and optimizer states, activations, runtime reserve
(docs/cost-model.md).

Activations follow Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer
Models", §4), generalised from GPT to grouped-query attention and gated MLPs by counting the same
stored tensors. Per layer and micro-batch, in bytes, with 16-bit activations and 1-byte dropout
masks:
- replicated across tensor-parallel ranks unless sequence parallelism shards them: the two LayerNorm
  inputs 4sbh, the QKV and MLP inputs 2sbh + 2sbh, two dropout masks 2sbh → 10sbh;
- sharded by tensor parallelism: Q 2sbh, K and V 4sbh·a_kv/a, the output projection input 2sbh, the
  MLP's
  intermediate tensors 2sbf per stored tensor (2 for GPT: GeLU input and output; 3 for SwiGLU: gate,
  up and their product) → GPT: 24sbh;
- the attention core (standard attention only): scores and softmax 2as²b·2 and the dropout mask as²b
  → 5as²b, sharded by tensor parallelism.
GPT totals sbh(34 + 5as/h) unsharded; sbh(10 + 24/t + 5as/(ht)) with TP t; sbh(34/t + 5as/(ht)) with
sequence parallelism. Flash attention and selective recompute drop the 5as²b term; full recompute
keeps only the layer input 2sbh (sharded by t under sequence parallelism).
"""

from __future__ import annotations

from hetopt.cost.flops import embedding_params, head_params, layer_params
from hetopt.spec.presets import ModelArch

GIB = 2**30
WEIGHT_BYTES = 2.0
"""bf16/fp16 weights."""
GRAD_BYTES = 4.0
"""fp32 gradient accumulation buffers (Megatron's main_grad)."""
OPTIMIZER_BYTES = 12.0
"""fp32 master weights + Adam first and second moments: 3 × 4 bytes (Rajbhandari et al. 2020, ZeRO
§3)."""
LOGIT_BYTES = 4.0
"""Logits are upcast to fp32 for the softmax cross-entropy."""


def layer_activation_bytes(
    m: ModelArch, micro_batch: int, seq_len: int, tp: int, sp: bool, attention: str, recompute: str
) -> float:
    """Activation bytes one layer keeps for one micro-batch until its backward."""
    sbh = float(seq_len * micro_batch * m.hidden)
    if recompute == "full":
        return 2 * sbh / (tp if sp else 1)
    replicated = 10.0
    sharded = (
        2 + 4 * m.kv_heads / m.heads + 2 + 2 * (3 if m.gated_mlp else 2) * m.ffn_hidden / m.hidden
    )
    per_sbh = replicated / tp + sharded / tp if sp else replicated + sharded / tp
    if attention == "standard" and recompute == "none":
        per_sbh += 5 * m.heads * seq_len / (m.hidden * tp)
    return per_sbh * sbh


def inflight_microbatches(
    stage: int, stages: int, micro_batches: int, schedule: str, virtual_stages: int
) -> float:
    """Micro-batches whose activations a stage holds at its peak.

    1F1B: stage i of p holds min(p − i, m); GPipe holds all m. Interleaved 1F1B (Korthikanti et al.
    2022, §4.2.3) multiplies by 1 + (p − 1)/(p·m): exact for the first stage, an upper bound for the
    others.
    """
    if schedule == "gpipe":
        return float(micro_batches)
    held = float(min(stages - stage, micro_batches))
    if virtual_stages > 1:
        held *= 1 + (stages - 1) / (stages * micro_batches)
    return held


def stage_params(m: ModelArch, layers: int, first: bool, last: bool, stages: int) -> float:
    """Parameters a stage holds: its layers, the embedding on the first stage, the head on the last.

    With tied embeddings and more than one stage the last stage keeps its own copy of the embedding
    matrix for the output layer (as Megatron-LM does).
    """
    params = layers * layer_params(m)
    if first:
        params += embedding_params(m)
    if last:
        params += head_params(m)
        if m.tied_embeddings and stages > 1:
            params += m.vocab * m.hidden
    return float(params)


def model_state_bytes(params: float, tp: int, dp: int, zero: int) -> float:
    """Weights + gradients + optimizer states per GPU, ZeRO stage `zero` sharding over the dp group
    (Rajbhandari et al. 2020, ZeRO §5.1: P_os 2Ψ + 2Ψ + KΨ/N_d, P_os+g 2Ψ + (2 + K)Ψ/N_d, P_os+g+p
    (2 + 2 + K)Ψ/N_d; hetopt keeps fp32 gradients, so GRAD_BYTES = 4 where the paper has 2): ZeRO-1
    shards the optimizer states, ZeRO-2 also the gradients, ZeRO-3 also the 16-bit weights."""
    per_gpu = params / tp
    weights = per_gpu * WEIGHT_BYTES / (dp if zero >= 3 else 1)
    grads = per_gpu * GRAD_BYTES / (dp if zero >= 2 else 1)
    optimizer = per_gpu * OPTIMIZER_BYTES / (dp if zero >= 1 else 1)
    return weights + grads + optimizer


def largest_unit_params(m: ModelArch, layers: int, first: bool, last: bool, stages: int) -> float:
    """The largest unit ZeRO-3 gathers at once on a stage (FSDP wraps each transformer layer, the
    embedding and the output head as units, as torchtitan does): a layer, the embedding or the
    head."""
    units = [layer_params(m)] if layers else []
    if first:
        units.append(stage_params(m, 0, True, False, stages))
    if last:
        units.append(stage_params(m, 0, False, True, stages))
    return float(max(units, default=0))


def zero_working_bytes(unit_params: float, tp: int, zero: int) -> float:
    """Unsharded buffers ZeRO-2/3 hold besides their shards, for the largest unit of the stage (per
    GPU of a TP group): ZeRO-2 one unit's full gradient before its reduce-scatter; ZeRO-3 also two
    units' gathered 16-bit weights — the one computing and the next, prefetched (FSDP's default
    forward/backward prefetch)."""
    per_gpu = unit_params / tp
    if zero >= 3:
        return per_gpu * (2 * WEIGHT_BYTES + GRAD_BYTES)
    if zero == 2:
        return per_gpu * GRAD_BYTES
    return 0.0


def head_activation_bytes(m: ModelArch, micro_batch: int, seq_len: int, tp: int) -> float:
    """fp32 logits and their gradient on the last stage, for the micro-batch in its backward."""
    return 2 * LOGIT_BYTES * micro_batch * seq_len * m.vocab / tp

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
- the attention core (kernels that materialise the scores: standard, torch): scores and softmax
  2as²b·2 and the dropout mask as²b → 5as²b, sharded by tensor parallelism.
GPT totals sbh(34 + 5as/h) unsharded; sbh(10 + 24/t + 5as/(ht)) with TP t; sbh(34/t + 5as/(ht)) with
sequence parallelism. Flash attention and selective recompute drop the 5as²b term; full recompute
keeps only the layer input 2sbh (sharded by t under sequence parallelism).
"""

from __future__ import annotations

from hetopt.cost.flops import embedding_params, head_params, layer_params
from hetopt.cost.kernels import (
    MASK_BYTES,
    NORMS_PER_LAYER,
    norm_extra_stored_bytes,
    score_bytes,
)
from hetopt.spec.formats import BF16, Format
from hetopt.spec.kernels import materialises_scores
from hetopt.spec.presets import ModelArch

GIB = 2**30
WEIGHT_BYTES = BF16.weight_bytes
"""bf16/fp16 weights (the default format's; spec/formats.py has every format's)."""
GRAD_BYTES = BF16.grad_bytes
"""The default format's gradient buffer: fp32 main_grad, 4 bytes."""
OPTIMIZER_BYTES = BF16.optimizer_bytes
"""fp32 master weights + Adam first and second moments: 3 × 4 bytes (Rajbhandari et al. 2020, ZeRO
§3)."""
LOGIT_BYTES = 4.0
"""Logits are upcast to fp32 for the softmax cross-entropy, whatever the format."""


def layer_activation_bytes(
    m: ModelArch,
    micro_batch: int,
    seq_len: int,
    tp: int,
    sp: bool,
    attention: str,
    recompute: str,
    fmt: Format = BF16,
    norm_kernel: str = "fused",
) -> float:
    """Activation bytes one layer keeps for one micro-batch until its backward, each tensor at the
    format's width: w the activation width, g the width of a GEMM input kept for the weight
    gradient (Format.gemm_input_bytes). In 16 bits (w = g = 2) with fused norms this is the module
    docstring's count; RMSNorm as eager ops (`norm_kernel` torch) keeps one more tensor per norm
    (cost/kernels.py), replicated as the norms' inputs are."""
    sbh = float(seq_len * micro_batch * m.hidden)
    w, g = fmt.act_bytes, fmt.gemm_input_bytes
    if recompute == "full":  # the layer input only
        return w * sbh / (tp if sp else 1)
    # two norm inputs, the QKV and MLP inputs, two dropout masks
    replicated = 2 * w + 2 * g + 2 * MASK_BYTES
    replicated += NORMS_PER_LAYER * norm_extra_stored_bytes(m.norm, norm_kernel, fmt)
    # Q, K and V; the output projection's input; the MLP's intermediates (the last one the down
    # projection's input)
    mlp = (3 if m.gated_mlp else 2) * m.ffn_hidden / m.hidden
    sharded = w + 2 * w * m.kv_heads / m.heads + g + w * (mlp - m.ffn_hidden / m.hidden)
    sharded += g * m.ffn_hidden / m.hidden
    per_sbh = replicated / tp + sharded / tp if sp else replicated + sharded / tp
    if materialises_scores(attention) and recompute == "none":
        per_sbh += score_bytes(fmt) * m.heads * seq_len / (m.hidden * tp)
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


def model_state_bytes(
    params: float, tp: int, dp: int, zero: int, fmt: Format = BF16, grad_bytes: float | None = None
) -> float:
    """Weights + gradients + optimizer states per GPU, ZeRO stage `zero` sharding over the dp group
    (Rajbhandari et al. 2020, ZeRO §5.1: P_os 2Ψ + 2Ψ + KΨ/N_d, P_os+g 2Ψ + (2 + K)Ψ/N_d, P_os+g+p
    (2 + 2 + K)Ψ/N_d, K = 12), per training format (spec/formats.py): the weights, gradients in
    `grad_bytes` (default the format's) and the optimizer states (fp32 master where there is one,
    and Adam's moments); FP8's weight casts are the layers' alone (`fp8_cast_bytes`). ZeRO-1
    shards the optimizer states, ZeRO-2 also the gradients, ZeRO-3 also the weights."""
    per_gpu = params / tp
    grad = fmt.grad_bytes if grad_bytes is None else grad_bytes
    weights = per_gpu * fmt.weight_bytes / (dp if zero >= 3 else 1)
    grads = per_gpu * grad / (dp if zero >= 2 else 1)
    optimizer = per_gpu * fmt.optimizer_bytes / (dp if zero >= 1 else 1)
    return weights + grads + optimizer


def fp8_cast_bytes(layer_params_per_gpu: float, dp: int, zero: int, fmt: Format = BF16) -> float:
    """FP8's weight casts kept beside the transformer layers' weights (Format.cast_bytes; 0 in
    other formats), sharded as the weights are (ZeRO-3)."""
    return layer_params_per_gpu * fmt.cast_bytes / (dp if zero >= 3 else 1)


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


def zero_working_bytes(
    unit_params: float, tp: int, zero: int, fmt: Format = BF16, grad_bytes: float | None = None
) -> float:
    """Unsharded buffers ZeRO-2/3 hold besides their shards, for the largest unit of the stage (per
    GPU of a TP group): ZeRO-2 one unit's full gradient before its reduce-scatter; ZeRO-3 also two
    units' gathered 16-bit weights — the one computing and the next, prefetched (FSDP's default
    forward/backward prefetch)."""
    per_gpu = unit_params / tp
    grad = fmt.grad_bytes if grad_bytes is None else grad_bytes
    if zero >= 3:
        return per_gpu * (2 * fmt.weight_bytes + grad)
    if zero == 2:
        return per_gpu * grad
    return 0.0


def loss_bytes(m: ModelArch, micro_batch: int, seq_len: int, tp: int, stack) -> float:
    """What the loss keeps on the last stage for the micro-batch in its backward, as the training
    stack lays it out (cost/stacks.StackMemory): its bytes per logit element, counted and fitted
    (the transients beyond the count), on each TP rank's vocabulary shard or on logits gathered
    whole."""
    shards = tp if stack.vocab_parallel_loss else 1
    per_logit = stack.loss_bytes_per_logit + stack.logit_buffer_bytes
    return per_logit * micro_batch * seq_len * m.vocab / shards

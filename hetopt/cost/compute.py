"""Compute-cost features of one stage's work per micro-batch (docs/cost-model.md).

GEMM work is FLOPs at the GPU's peak (priced by the calibrated GEMM efficiency) plus one fixed cost
per GEMM kernel (small per-GPU matrices run far below peak: a GEMM of F FLOPs takes F/(peak·η) +
t_kernel, so its efficiency is η·F/(F + t_kernel·peak·η) — the calibrated function of the per-GPU
matrix shapes). Memory-bound work (norms, softmax, dropout, activation functions, residual adds) is
priced by bytes at the HBM bandwidth: a forward pass writes the activations it stores
(memory.layer_activation_bytes without recompute) and the backward pass reads them and writes their
gradients, twice the bytes. Backward GEMMs cost twice the forward (input and weight gradients). Full
recompute adds one forward; selective recompute adds the attention core.

Context parallelism (cp ranks, Megatron-LM's --context-parallel-size) splits the sequence: every
rank runs the projections, MLP, norms, head and embedding on its s/cp tokens, and the attention core
of its queries against the whole sequence — 1/cp of the core's FLOPs with the causal load balancing
Megatron-LM uses (each rank holds chunks i and 2cp − 1 − i), in cp blocks, one kernel each. Its
communication (`cp_comm_per_pass`) gathers every rank's keys and values.

The attention core (scores QKᵀ and context PV) depends on the kernel (spec/kernels.py). Standard
and torch attention run it as batched GEMMs over the whole s×s matrix (GEMM term, backward 2×) and
sweep the scores with their softmax (MEM term: one fused kernel, or eager ops' passes;
cost/kernels.py). Flash attention (Dao 2022/2023) is one fused kernel with its own efficiency (ATTN
term): it skips the masked half of a causal LM's s×s matrix, and its backward recomputes the
scores, 5 matmuls against the forward's 2 — 2.5× the forward's FLOPs, the count flash-attention's
own benchmarks use; FlashAttention v1 at half v2's throughput. RMSNorm run as eager ops adds its
passes beyond a fused kernel's (`norms`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hetopt.cost import comm
from hetopt.cost.flops import head_forward_flops, kv_width, layer_forward_flops
from hetopt.cost.kernels import (
    NORMS_PER_LAYER,
    attention_slowdown,
    norm_extra_traffic_bytes,
    score_traffic_bytes,
)
from hetopt.cost.memory import LOGIT_BYTES, layer_activation_bytes
from hetopt.cost.terms import ATTN, GEMM, KERN, MEM, PASS, zeros
from hetopt.spec.formats import BF16, Format
from hetopt.spec.gpus import GPUType
from hetopt.spec.kernels import is_flash, materialises_scores
from hetopt.spec.presets import ModelArch

ACT_BYTES = BF16.act_bytes
"""16-bit activations (the default format's; a LayerShape carries its own)."""
CROSS_ENTROPY_PASSES_FWD = 3
"""fp32 logits written once, read for the max/sum and read for the loss."""
CROSS_ENTROPY_PASSES_BWD = 2
"""fp32 logits read once, their gradient written once."""
CAUSAL_FRACTION = 0.5
"""A causal LM's mask hides half of the s×s scores; flash attention skips those blocks."""
FLASH_BACKWARD_FLOPS = 2.5
"""Flash attention's backward recomputes the scores: 5 s×s matmuls against the forward's 2 (Dao
2023, §3.1)."""


@dataclass(frozen=True)
class LayerShape:
    model: ModelArch
    micro_batch: int
    seq_len: int
    tp: int
    sp: bool
    attention: str
    cp: int = 1
    fmt: Format = BF16
    """The training format: activation widths, and through the GPU type, the peaks."""
    norm_kernel: str = "fused"
    """RMSNorm as one kernel (fused) or eager ops (torch): cost/kernels.py."""

    @property
    def tokens(self) -> int:
        """Tokens of the sequence on one context-parallel rank (all of them without CP)."""
        return self.seq_len // self.cp


def _gemm(flops: float, kernels: float, rate_flops: float) -> np.ndarray:
    """GEMM work of `flops` in `kernels` kernels at `rate_flops` FLOP/s: GPUType.gemm_flops for the
    layers' projections and MLP, GPUType.attention_flops for what stays out of FP8 (the attention
    core's batched GEMMs and the output head)."""
    v = zeros()
    v[GEMM] = flops / rate_flops
    v[KERN] = kernels
    return v


def _mem(nbytes: float, gpu: GPUType) -> np.ndarray:
    v = zeros()
    v[MEM] = nbytes / (gpu.hbm_gbps * comm.GBIT)
    return v


def attention_core_flops(x: LayerShape) -> float:
    """Scores QKᵀ and context PV of the whole sequence: 4bs²h forward."""
    return 4.0 * x.micro_batch * x.seq_len**2 * x.model.hidden


def attention_kernels(x: LayerShape) -> int:
    """Kernels of the attention core per forward: one fused (flash) or two GEMMs, once per block of
    keys and values a context-parallel rank sees (cp)."""
    return (1 if is_flash(x.attention) else 2) * x.cp


def attention_core(x: LayerShape, gpu: GPUType, backward: bool = False) -> np.ndarray:
    """The attention core of one layer's pass on one GPU of a TP group (its heads are split over TP,
    its queries over CP): a flash kernel, or batched GEMMs at the attention format's peak and the
    softmax's passes over the scores (cost/kernels.py)."""
    flops = attention_core_flops(x) / (x.tp * x.cp)
    kernels = attention_kernels(x) * (2 if backward else 1)
    if materialises_scores(x.attention):
        scores = x.micro_batch * x.model.heads * x.seq_len**2 / x.tp
        softmax = _mem(scores * score_traffic_bytes(x.attention, x.fmt, backward), gpu)
        return _gemm(flops * (2 if backward else 1), kernels, gpu.attention_flops) + softmax
    v = zeros()
    v[ATTN] = (
        attention_slowdown(x.attention)
        * CAUSAL_FRACTION
        * flops
        * (FLASH_BACKWARD_FLOPS if backward else 1.0)
        / gpu.attention_flops
    )
    v[KERN] = kernels
    return v


def norms(x: LayerShape, gpu: GPUType, backward: bool = False) -> np.ndarray:
    """What a layer's norms move beyond fused kernels (eager RMSNorm, cost/kernels.py): their
    b·s·h inputs on this rank (1/tp of them under sequence parallelism)."""
    elements = x.micro_batch * x.tokens * x.model.hidden / (x.tp if x.sp else 1)
    extra = norm_extra_traffic_bytes(x.model.norm, x.norm_kernel, x.fmt, backward)
    return _mem(NORMS_PER_LAYER * elements * extra, gpu)


def _dense_and_memory(x: LayerShape, gpu: GPUType) -> np.ndarray:
    """The projections' and MLP's GEMMs and the memory-bound work of one layer's forward outside
    the attention core and the norms' extra passes (`attention_core`, `norms`)."""
    # this rank's tokens
    local = LayerShape(x.model, x.micro_batch, x.tokens, x.tp, x.sp, x.attention)
    dense = layer_forward_flops(x.model, x.micro_batch, x.tokens) - attention_core_flops(local)
    # what a flash layer with fused norms stores: the scores' passes are attention_core's
    stored = layer_activation_bytes(
        x.model, x.micro_batch, x.tokens, x.tp, x.sp, "flash", "none", x.fmt
    )
    # QKV, output projection, MLP up(+gate), MLP down
    return _gemm(dense / x.tp, 4, gpu.gemm_flops) + _mem(stored, gpu)


def fp8_casts(x: LayerShape, gpu: GPUType, backward: bool = False) -> np.ndarray:
    """FP8's casts, memory-bound work of the format alone (0 in every other format): each GEMM
    input is cast to FP8 in the forward pass (read at the activation width, written in 1 byte) and
    each output gradient in the backward pass (cast and transposed for the weight gradient: 2
    bytes written). Per token of one TP rank, inputs: the QKV and MLP inputs (h each, gathered),
    the output projection's (h/t) and the down projection's (f/t); output gradients: QKV's
    ((h + 2·kv)/t), the output projection's and the down projection's (h each) and the MLP's up
    (and gate) outputs (f/t each)."""
    if x.fmt.gemm != "fp8":
        return zeros()
    m, t, w = x.model, x.tp, x.fmt.act_bytes
    tokens = x.micro_batch * x.tokens
    if backward:
        grads = (m.hidden + 2 * kv_width(m)) / t + 2 * m.hidden
        grads += ((3 if m.gated_mlp else 2) - 1) * m.ffn_hidden / t
        return _mem(tokens * grads * (w + 2), gpu)
    inputs = 2 * m.hidden + (m.hidden + m.ffn_hidden) / t
    return _mem(tokens * inputs * (w + 1), gpu)


def layer_forward(x: LayerShape, gpu: GPUType) -> np.ndarray:
    """One layer's forward compute on one GPU of a TP group (no communication)."""
    v = _dense_and_memory(x, gpu) + attention_core(x, gpu) + norms(x, gpu) + fp8_casts(x, gpu)
    v[PASS] = 1
    return v


def layer_backward(x: LayerShape, gpu: GPUType) -> np.ndarray:
    """One layer's backward compute: 2× the forward's GEMMs and memory traffic (input and weight
    gradients), and the attention core's backward."""
    v = (
        2 * _dense_and_memory(x, gpu)
        + attention_core(x, gpu, backward=True)
        + norms(x, gpu, backward=True)
        + fp8_casts(x, gpu, backward=True)
    )
    v[PASS] = 1
    return v


def layer_recompute(x: LayerShape, gpu: GPUType, recompute: str) -> np.ndarray:
    """Extra forward work done in backward: the whole layer (full) or its attention core
    (selective)."""
    if recompute == "full":
        return layer_forward(x, gpu)
    if recompute == "selective" and materialises_scores(x.attention):
        return attention_core(x, gpu)  # its GEMMs and the softmax's forward passes
    return zeros()  # flash attention recomputes its core in its own backward already


def tp_comm_per_pass(x: LayerShape, intra) -> np.ndarray:
    """Two all-reduces of the b·s·h activations per layer and pass (reduce-scatter + all-gather with
    sequence parallelism: the same bytes), over the intra-node interconnect `intra` (a Route)."""
    nbytes = x.fmt.act_bytes * x.micro_batch * x.tokens * x.model.hidden
    return 2 * comm.collective("all_reduce", nbytes, x.tp, intra)


def cp_comm_per_pass(x: LayerShape, intra, backward: bool = False) -> np.ndarray:
    """Context parallelism's exchange per layer: every rank gathers the keys and values of the other
    cp − 1 (2·b·(s/cp)·kv_width/tp 16-bit values each; grouped-query attention sends only the kv
    heads), and the backward pass gathers them again and reduce-scatters their gradients (twice the
    forward). Priced as the collective it is (Megatron-LM's `all_gather` CP communication), not
    overlapped with the attention blocks (its `p2p` ring hides some of it: this is the most it
    exposes). 0 without CP. An all-gather is priced by the buffer it fills (cp shares: each rank
    receives cp − 1 of them)."""
    if x.cp <= 1:
        return zeros()
    rank_bytes = x.fmt.act_bytes * x.micro_batch * x.tokens * 2 * kv_width(x.model) / x.tp
    return (2 if backward else 1) * comm.collective("all_gather", x.cp * rank_bytes, x.cp, intra)


def head_forward(x: LayerShape, gpu: GPUType) -> np.ndarray:
    """LM head GEMM (vocabulary-parallel) and the fp32 softmax cross-entropy."""
    logits = LOGIT_BYTES * x.micro_batch * x.tokens * x.model.vocab / x.tp
    flops = head_forward_flops(x.model, x.micro_batch, x.tokens) / x.tp
    # out of FP8, as Megatron-core's output layer and torchtitan's Float8 leave it
    return _gemm(flops, 1, gpu.attention_flops) + _mem(CROSS_ENTROPY_PASSES_FWD * logits, gpu)


def head_backward(x: LayerShape, gpu: GPUType) -> np.ndarray:
    logits = LOGIT_BYTES * x.micro_batch * x.tokens * x.model.vocab / x.tp
    flops = 2 * head_forward_flops(x.model, x.micro_batch, x.tokens) / x.tp
    return _gemm(flops, 2, gpu.attention_flops) + _mem(CROSS_ENTROPY_PASSES_BWD * logits, gpu)


def head_tp_comm(x: LayerShape, intra) -> np.ndarray:
    """Vocabulary-parallel cross-entropy: three all-reduces of one fp32 per token (max, sum,
    target)."""
    return 3 * comm.collective("all_reduce", 4.0 * x.micro_batch * x.tokens, x.tp, intra)


def embedding_forward(x: LayerShape, gpu: GPUType) -> np.ndarray:
    """Embedding lookup writes b·s·h activations; vocabulary-parallel embedding all-reduces them."""
    nbytes = x.fmt.act_bytes * x.micro_batch * x.tokens * x.model.hidden
    return _mem(nbytes, gpu)


def embedding_tp_comm(x: LayerShape, intra) -> np.ndarray:
    nbytes = x.fmt.act_bytes * x.micro_batch * x.tokens * x.model.hidden
    return comm.collective("all_reduce", nbytes, x.tp, intra)


def optimizer_step(
    params_per_gpu: float, gpu: GPUType, fmt: Format = BF16, grad_bytes: float | None = None
) -> np.ndarray:
    """Adam step over the parameters this GPU updates (its ZeRO shard): the HBM bytes it moves
    per parameter (Format.step_bytes_per_param; 30 in bf16 mixed precision: read the fp32
    main_grad, read and write the fp32 master and both moments, write the 16-bit weight)."""
    return _mem(fmt.step_bytes_per_param(grad_bytes) * params_per_gpu, gpu)

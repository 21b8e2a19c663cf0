"""Parameter counts and FLOPs of decoder-only transformers (docs/cost-model.md).

Notation: micro-batch b, sequence s, hidden h, heads a, kv heads a_kv, ffn f, vocabulary V.
Forward FLOPs of one layer (a multiply-add is 2 FLOPs):
- Q and O projections 2·2bsh², K and V projections 2·2bsh²·a_kv/a  → 2bsh(2h + 2h·a_kv/a)
- scores QKᵀ and context PV: 2·2bs²h                                → 4bs²h
- MLP: 2bshf per matrix, 3 matrices gated (SwiGLU) or 2 (GPT)       → 2bshf·(3|2)
GPT (f = 4h, a_kv = a, not gated) gives 24bsh² + 4bs²h (Narayanan et al. 2021; Korthikanti et
al. 2022).
LM head: 2bshV forward. Backward costs twice the forward (gradients for inputs and for weights).
"""

from __future__ import annotations

from hetopt.spec.presets import ModelArch


def kv_width(m: ModelArch) -> int:
    """Width of the K (or V) projection output: h · a_kv / a."""
    return m.hidden * m.kv_heads // m.heads


def mlp_matrices(m: ModelArch) -> int:
    return 3 if m.gated_mlp else 2


def norm_params(m: ModelArch) -> int:
    """One normalisation layer: LayerNorm has a scale and a shift, RMSNorm only a scale."""
    return 2 * m.hidden if m.norm == "layernorm" else m.hidden


def layer_params(m: ModelArch) -> int:
    """Parameters of one transformer layer: 2h² + 2h²·a_kv/a + hf·(3|2) + norms (+ biases)."""
    h, f, kv = m.hidden, m.ffn_hidden, kv_width(m)
    weights = 2 * h * h + 2 * h * kv + mlp_matrices(m) * h * f
    biases = 0
    if m.linear_bias:
        # QKV + O outputs, then the MLP's up (and gate) outputs and its down output.
        biases = (h + 2 * kv) + h + (mlp_matrices(m) - 1) * f + h
    return weights + biases + 2 * norm_params(m)


def embedding_params(m: ModelArch) -> int:
    """Token embedding (V·h) plus learned position embeddings (s_max·h) where the model has them."""
    positions = m.max_seq_len * m.hidden if m.position_embedding == "learned" else 0
    return m.vocab * m.hidden + positions


def head_params(m: ModelArch) -> int:
    """LM head (none of its own when tied to the embedding) plus the final normalisation."""
    return (0 if m.tied_embeddings else m.vocab * m.hidden) + norm_params(m)


def total_params(m: ModelArch) -> int:
    return m.layers * layer_params(m) + embedding_params(m) + head_params(m)


def layer_forward_flops(m: ModelArch, micro_batch: int, seq_len: int) -> float:
    """Forward FLOPs of one layer for one micro-batch."""
    b, s, h, f = micro_batch, seq_len, m.hidden, m.ffn_hidden
    projections = 2 * b * s * h * (2 * h + 2 * kv_width(m))
    attention_core = 4 * b * s * s * h
    mlp = 2 * b * s * h * f * mlp_matrices(m)
    return float(projections + attention_core + mlp)


def head_forward_flops(m: ModelArch, micro_batch: int, seq_len: int) -> float:
    """Forward FLOPs of the LM head (logits) for one micro-batch."""
    return float(2 * micro_batch * seq_len * m.hidden * m.vocab)


def model_flops_per_token(m: ModelArch, seq_len: int) -> float:
    """Training FLOPs per token without recompute (forward + 2× backward), the MFU numerator."""
    forward = m.layers * layer_forward_flops(m, 1, seq_len) + head_forward_flops(m, 1, seq_len)
    return 3.0 * forward / seq_len

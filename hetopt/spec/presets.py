"""Model presets: published architectures, each with its source.

A preset fills every field of ``model:`` in an instance; explicit fields in the instance override
it. ``max_seq_len`` is the context length the model was trained with; it is the default
``training.seq_len``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Norm = Literal["layernorm", "rmsnorm"]
PositionEmbedding = Literal["learned", "rotary"]


@dataclass(frozen=True)
class ModelArch:
    """A resolved transformer architecture (decoder-only)."""

    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    ffn_hidden: int
    gated_mlp: bool
    """SwiGLU-style three-matrix MLP (LLaMA) when true; GPT's two-matrix MLP when false."""
    vocab: int
    max_seq_len: int
    norm: Norm = "layernorm"
    linear_bias: bool = True
    """Biases in the attention and MLP projections (GPT: yes; LLaMA: no)."""
    position_embedding: PositionEmbedding = "learned"
    tied_embeddings: bool = True
    """Input embedding and LM head share one matrix (GPT: yes; LLaMA: no)."""
    source: str = ""

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


def _gpt(
    name: str, layers: int, hidden: int, heads: int, vocab: int, seq: int, source: str
) -> ModelArch:
    return ModelArch(
        name, layers, hidden, heads, heads, 4 * hidden, False, vocab, seq, source=source
    )


def _llama(
    name: str,
    layers: int,
    hidden: int,
    heads: int,
    kv_heads: int,
    ffn: int,
    vocab: int,
    seq: int,
    source: str,
) -> ModelArch:
    return ModelArch(
        name,
        layers,
        hidden,
        heads,
        kv_heads,
        ffn,
        True,
        vocab,
        seq,
        norm="rmsnorm",
        linear_bias=False,
        position_embedding="rotary",
        tied_embeddings=False,
        source=source,
    )


_GPT3 = "Brown et al. 2020, Language Models are Few-Shot Learners (arXiv:2005.14165), Table 2.1"
_LLAMA1 = (
    "Touvron et al. 2023, LLaMA (arXiv:2302.13971), Table 2; ffn sizes from the released configs"
)
_LLAMA2 = (
    "Touvron et al. 2023, Llama 2 (arXiv:2307.09288), Table 1; released config (GQA, 8 kv heads)"
)
_LLAMA3 = "Meta 2024, The Llama 3 Herd of Models (arXiv:2407.21783), Table 3; released config"

PRESETS: dict[str, ModelArch] = {
    m.name: m
    for m in [
        # Radford et al. 2019 (GPT-2 paper, Table 2): 24 layers, d_model 1024; 16 heads in the
        # released config.
        _gpt(
            "gpt2-medium",
            24,
            1024,
            16,
            50257,
            1024,
            "Radford et al. 2019, Language Models are Unsupervised Multitask Learners, Table 2; "
            "released config",
        ),
        # GPT-3 XL lists 24 heads with d_head 128, which does not divide d_model 2048; Megatron's
        # GPT-3 1.3B recipe uses 16 heads of 128, as here.
        _gpt(
            "gpt3-1.3b",
            24,
            2048,
            16,
            50257,
            2048,
            _GPT3 + " (16 heads of 128 as in Megatron-LM's recipe)",
        ),
        _gpt("gpt3-2.7b", 32, 2560, 32, 50257, 2048, _GPT3),
        _gpt("gpt3-6.7b", 32, 4096, 32, 50257, 2048, _GPT3),
        # The table prints d_model 5140 for 13B; 40 heads × d_head 128 = 5120 is the consistent
        # value.
        _gpt("gpt3-13b", 40, 5120, 40, 50257, 2048, _GPT3 + " (d_model 5120 = 40 × 128)"),
        _gpt("gpt3-175b", 96, 12288, 96, 50257, 2048, _GPT3),
        _llama("llama-7b", 32, 4096, 32, 32, 11008, 32000, 2048, _LLAMA1),
        _llama("llama-13b", 40, 5120, 40, 40, 13824, 32000, 2048, _LLAMA1),
        _llama("llama-30b", 60, 6656, 52, 52, 17920, 32000, 2048, _LLAMA1),
        _llama("llama-65b", 80, 8192, 64, 64, 22016, 32000, 2048, _LLAMA1),
        _llama("llama2-70b", 80, 8192, 64, 8, 28672, 32000, 4096, _LLAMA2),
        _llama("llama3-8b", 32, 4096, 32, 8, 14336, 128256, 8192, _LLAMA3),
        _llama("llama3-70b", 80, 8192, 64, 8, 28672, 128256, 8192, _LLAMA3),
    ]
}


def apply_preset(preset: ModelArch | None, explicit: dict[str, object]) -> dict[str, object]:
    """Field values of a model: the preset's, overridden by the explicit (non-None) ones.

    A preset with plain multi-head attention (kv_heads = heads) stays multi-head when only `heads`
    is overridden; a grouped-query preset keeps its kv_heads.
    """
    explicit = {k: v for k, v in explicit.items() if v is not None}
    values: dict[str, object] = dict(vars(preset)) if preset is not None else {}
    values.update(explicit)
    if (
        "kv_heads" not in explicit
        and "heads" in values
        and (preset is None or preset.kv_heads == preset.heads)
    ):
        values["kv_heads"] = values["heads"]
    return values

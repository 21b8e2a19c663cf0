"""Flash-attention kernel efficiency per architecture family: the ATTN weight of a profile.

Flash attention is one fused kernel per layer pass whose throughput differs from a plain GEMM's: it
streams blocks of Q, K and V through shared memory and runs a softmax between its two matmuls. A
profile prices the kernel's executed FLOPs (compute.attention_core: causal half, backward 2.5×
forward) at ATTN = 1/η_attn with η_attn = ρ·η_gemm. ρ, the flash kernel's efficiency over the type's
large-GEMM efficiency, is a property of the kernel on an architecture, so it carries to the other
types of a family (a power-capped L4 throttles GEMMs and attention alike).

Regenerate the Hopper value with `python benchmarks/fit_attention.py` (least squares of ATTN alone
on the flash-attention layers of benchmarks/measured/H200-2026-11-30/layer_times.csv that take ≥ 2
ms, every other weight from the shipped H200 profile).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class FlashRatio:
    ratio: float
    """ρ = η_attn / η_gemm."""
    uncertainty: float
    """Relative uncertainty of η_attn."""
    source: str


_FA2_A100 = (
    "FlashAttention-2 paper (Dao 2023, Fig. 4): A100 SXM4 80GB, causal, head dim 128, forward + "
    "backward at sequence 2k–16k ≈ 185 TFLOP/s in its own FLOP count (causal halved, backward 2.5× "
    "forward, as here) = 0.59 of 312; ÷ the A100-80GB profile's GEMM η 0.893"
)
_H200 = (
    "fitted on the 49 flash-attention layer passes ≥ 2 ms measured on the H200 here "
    "(benchmarks/measured/H200-2026-11-30, PyTorch 2.11 SDPA; benchmarks/fit_attention.py): η_attn "
    "= 0.283 over the H200 profile's GEMM η 0.783; MAPE of those passes 8.1%, max 26.6% (forward "
    "alone gives ρ 0.42, backward alone 0.33: part of the backward's excess over 2× the forward "
    "lands here)"
)
AMPERE = FlashRatio(0.59 / 0.893, 0.15, _FA2_A100)
HOPPER = FlashRatio(0.283 / 0.783, 0.25, _H200)  # η_attn over the H200 profile's GEMM η

FLASH_RATIO: dict[str, FlashRatio] = {
    "ampere": AMPERE,
    "hopper": HOPPER,
    "ada": FlashRatio(
        AMPERE.ratio,
        0.3,
        f"ampere's ratio; FlashAttention-2 runs on sm_89 unchanged; not measured ({_FA2_A100})",
    ),
    "cdna2": FlashRatio(
        AMPERE.ratio,
        0.3,
        f"ampere's ratio; FlashAttention-2's ROCm port; not measured ({_FA2_A100})",
    ),
    "cdna3": FlashRatio(
        AMPERE.ratio,
        0.3,
        f"ampere's ratio; FlashAttention-2's ROCm port; not measured ({_FA2_A100})",
    ),
    "volta": FlashRatio(
        AMPERE.ratio,
        0.4,
        "ampere's ratio; no FlashAttention-2 before sm_80: PyTorch SDPA runs its "
        f"memory-efficient kernel (the same tiling); not measured ({_FA2_A100})",
    ),
    "turing": FlashRatio(
        AMPERE.ratio,
        0.4,
        "ampere's ratio; no FlashAttention-2 before sm_80: PyTorch SDPA runs its "
        f"memory-efficient kernel (the same tiling); not measured ({_FA2_A100})",
    ),
}


def attention_weight(family: str, gemm_weight: float) -> tuple[float, str]:
    """The ATTN weight of a type of `family` whose GEMM weight (1/η_gemm) is `gemm_weight`, with its
    source. A family without an entry takes Ampere's ratio, and the source says so."""
    entry = FLASH_RATIO.get(family)
    note = "" if entry else f"family {family or 'unknown'} has no entry: "
    entry = entry or AMPERE
    return (
        gemm_weight / entry.ratio,
        f"{note}1/(ρ·η_gemm) with ρ = {entry.ratio:.3f}: {entry.source}",
    )


def attention_uncertainty(family: str) -> float:
    """Relative uncertainty of η_attn for a type of `family` (Ampere's where the family has no
    entry)."""
    return FLASH_RATIO.get(family, AMPERE).uncertainty

"""Kernel implementations a training run uses (`training.attention`, `training.norm_kernel`).

Attention:
- ``flash``: FlashAttention-2 (Dao 2023): one fused kernel, the s×s scores never stored.
- ``flash1``: FlashAttention v1 (Dao et al. 2022): the same tiling, about half the throughput.
- ``standard``: the scores materialised by batched GEMMs and one fused scale-mask-softmax kernel
  (Megatron-LM's FusedScaleMaskSoftmax, its default without flash attention).
- ``torch``: the scores materialised and scaled, masked and normalised by separate eager PyTorch
  ops (a `torch.softmax` after `masked_fill_`), one pass over the s×s matrix each.

Norm: ``fused`` (one kernel per norm: Apex, Transformer Engine, a fused RMSNorm) or ``torch``
(RMSNorm written as eager ops, ``x * rsqrt(x.pow(2).mean(-1) + eps)``; LayerNorm is one native
kernel in PyTorch, so ``torch`` changes nothing for it).
"""

from __future__ import annotations

from typing import Literal

Attention = Literal["flash", "flash1", "standard", "torch"]
NormKernel = Literal["fused", "torch"]
FLASH_KERNELS = ("flash", "flash1")
"""Tiled kernels that never store the scores (context parallelism's ring attention needs
``flash``: FlashAttention-2)."""


FLASH_FAMILIES = {
    "flash": ("ampere", "ada", "hopper", "cdna2", "cdna3"),
    "flash1": ("turing", "ampere", "ada", "hopper"),
}
"""Architectures the flash-attn package runs each version on, as a launcher needs it:
FlashAttention-2 from sm_80 (Ampere, Ada, Hopper; ROCm's port on MI200/MI300), v1 on Turing and
Ampere and later (the package's README for each version)."""


def runs_kernel(attention: str, family: str) -> bool:
    """Whether a GPU of `family` runs the flash kernel `attention` (every other kernel runs
    anywhere)."""
    return attention not in FLASH_FAMILIES or family in FLASH_FAMILIES[attention]


def is_flash(attention: str) -> bool:
    """Whether `attention` is a flash kernel (no s×s scores stored)."""
    return attention in FLASH_KERNELS


def materialises_scores(attention: str) -> bool:
    """Whether `attention` writes the s×s scores to memory (and keeps them for its backward)."""
    return not is_flash(attention)

"""What the attention and norm kernels (spec/kernels.py) cost beyond the GEMMs: bytes moved through
HBM per element, counted op by op, and bytes stored for the backward pass.

Widths: w the format's activation width (Format.act_bytes), 1 byte per mask element, 4 bytes per
fp32 temporary. Every count is per element of the tensor the kernel sweeps (an s×s score of one
head, or one token's hidden unit for a norm) on one TP rank.

Attention scores (materialised kernels only; flash kernels keep them on chip):
- ``standard``, one fused scale-mask-softmax (Megatron's FusedScaleMaskSoftmax) and dropout: the
  evaluator's count, on which the GPU profiles' MEM weight is fitted (Megatron layer times): the
  forward writes the tensors it stores (`score_bytes`: softmax output and dropout output, w each,
  and the 1-byte mask, 2w + 1), the backward reads them and writes their gradients, twice that.
- ``torch``, eager ops (Aleph Alpha Scaling's MaskedSoftmaxTorch, HF's eager attention): the same
  softmax, and the mask the fused kernel folds into it as a pass of its own: ``masked_fill_``
  reads w and the 1-byte mask and writes w, 2w + 1 beyond ``standard``; its backward the same,
  2w + 1 again. The 1/√d scale rides on the scores' GEMM (``baddbmm``'s alpha; Scaling's
  ``MaskedSoftmaxConfig.scale`` is 1 by default), so it adds no pass.
The GEMMs that write the scores and read the probabilities are priced as GEMMs (cost.compute).

FlashAttention v1 runs the same FLOPs as v2 at half its throughput: FlashAttention-2 is "around 2×
faster" (Dao 2023, abstract; 1.7–3.0× forward + backward on A100, §4.1), so a v1 pass costs
FLASH1_SLOWDOWN × the ATTN term of a v2 pass.

RMSNorm as eager ops (``x * rsqrt(x.pow(2).mean(-1) + eps)`` in the input's width, cast to fp32 and
back, times the weight: Scaling's RMSNorm._standard_forward) against one fused kernel
(read w, write w forward; read the input and the gradient, write the gradient, 3w backward):
- forward: pow 2w, mean w, x·r 2w, ``.float()`` w + 4, ``.type_as`` 4 + w, ·weight 2w = 9w + 8;
  beyond the fused kernel's 2w: 7w + 8.
- backward: ·weight 6w and x·r 6w (each: the input gradient, read w and write w, and the other
  operand's, read two and write their product before it is reduced), the two casts 2w + 8, mean
  w, pow 3w, the sum of x's two gradients 3w = 21w + 8; beyond the fused kernel's 3w: 18w + 8.
- stored: the normalised tensor ·weight saves (w per element) besides the input, which a fused
  kernel keeps too.
LayerNorm runs as one native kernel in PyTorch (``torch.nn.functional.layer_norm``): no extra.
"""

from __future__ import annotations

from hetopt.spec.formats import BF16, Format
from hetopt.spec.kernels import is_flash

MASK_BYTES = 1.0
"""A dropout or attention mask keeps one byte per element."""
FP32_BYTES = 4.0
FLASH1_SLOWDOWN = 2.0
"""FlashAttention-2 over v1, forward + backward (Dao 2023, "around 2× faster")."""
NORMS_PER_LAYER = 2
"""A pre-norm transformer layer: one norm before attention, one before the MLP."""


def score_bytes(fmt: Format = BF16) -> float:
    """Bytes per element of standard attention's stored core: softmax output and dropout output
    at the activation width and the dropout mask (5 in 16 bits, Korthikanti et al. 2022's 5as²b)."""
    return 2 * fmt.act_bytes + MASK_BYTES


def score_traffic_bytes(attention: str, fmt: Format = BF16, backward: bool = False) -> float:
    """HBM bytes per s×s score element of one head that the softmax of `attention` moves in one
    pass (0 for flash kernels)."""
    if is_flash(attention):
        return 0.0
    fused = score_bytes(fmt) * (2 if backward else 1)
    if attention == "torch":  # masked_fill_ as a pass of its own
        return fused + 2 * fmt.act_bytes + MASK_BYTES
    return fused


def attention_slowdown(attention: str) -> float:
    """The ATTN term of a flash kernel over FlashAttention-2's."""
    return FLASH1_SLOWDOWN if attention == "flash1" else 1.0


def eager_rmsnorm(norm: str, norm_kernel: str) -> bool:
    """Whether the layer's norms run as eager ops: RMSNorm with norm_kernel torch."""
    return norm == "rmsnorm" and norm_kernel == "torch"


def norm_extra_traffic_bytes(
    norm: str, norm_kernel: str, fmt: Format = BF16, backward: bool = False
) -> float:
    """HBM bytes per element of one norm's input beyond a fused kernel's, in one pass."""
    if not eager_rmsnorm(norm, norm_kernel):
        return 0.0
    w = fmt.act_bytes
    return 18 * w + 2 * FP32_BYTES if backward else 7 * w + 2 * FP32_BYTES


def norm_extra_stored_bytes(norm: str, norm_kernel: str, fmt: Format = BF16) -> float:
    """Bytes per element of one norm's input that it stores beyond a fused kernel."""
    return fmt.act_bytes if eager_rmsnorm(norm, norm_kernel) else 0.0

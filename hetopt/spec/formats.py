"""Training number formats (`training.precision`): what each stores and what each computes at.

Five formats, as people train:
- ``fp32``: everything in 4-byte floats, GEMMs on the CUDA cores (PyTorch without autocast and with
  ``allow_tf32`` off; Megatron-LM without ``--fp16``/``--bf16``).
- ``tf32``: fp32 tensors whose GEMMs run on the tensor cores in TF32 (PyTorch's ``allow_tf32``,
  Ampere and later); memory as fp32.
- ``fp16`` / ``bf16``: 16-bit mixed precision: 16-bit weights, gradients and activations, an fp32
  master copy beside Adam's two fp32 moments (Micikevicius et al. 2018; ZeRO §3: 2Ψ + 2Ψ + 12Ψ).
- ``fp8``: Transformer Engine on Hopper and Ada: bf16 weights, gradients and master as in bf16
  mixed precision, the GEMMs in FP8 (E4M3 forward, E5M2 gradients: Megatron's ``--fp8-format
  hybrid``), each weight also kept as its FP8 casts, and an amax history per FP8 tensor. The
  attention core stays in bf16 (Transformer Engine's default DotProductAttention).

Per parameter, in bytes (`Format.state_bytes_per_param`): fp32/tf32 4 + 4 + 8 = 16 (weights,
gradients, moments; no master); fp16/bf16 2 + 4 + 4 + 8 = 18 (the gradients accumulated in an fp32
buffer, Megatron's main_grad); fp8 that plus 2 bytes of FP8 weight casts = 20. The gradients are
reduced in `training.grad_reduce_dtype` where it is given, else in 16 bits in mixed precision
(Megatron-core's default) and 32 in fp32 and tf32.
"""

from __future__ import annotations

from dataclasses import dataclass

FORMATS = ("fp32", "tf32", "fp16", "bf16", "fp8")

DTYPE_BYTES = {"fp32": 4.0, "bf16": 2.0, "fp16": 2.0}
"""Bytes of a gradient-reduction dtype (`training.grad_reduce_dtype`)."""

AMAX_HISTORY = 1024
"""Transformer Engine's DelayedScaling recipe default amax_history_len."""
FP8_TENSORS_PER_GEMM = 3
"""Input, weight and gradient: each FP8 tensor of a GEMM keeps its own scale and amax history."""
GEMMS_PER_LAYER = 4
"""QKV, output projection, MLP up(+gate), MLP down (cost/compute.py)."""


@dataclass(frozen=True)
class Format:
    """What one training format stores and computes at."""

    name: str
    weight_bytes: float
    """The weight copy the passes read (and ZeRO-3 gathers)."""
    grad_bytes: float
    """The gradient buffer, per parameter: fp32 in mixed precision too (Megatron's main_grad,
    accumulated in fp32)."""
    reduce_bytes: float
    """Bytes per gradient in the data-parallel reduction, where grad_reduce_dtype does not say
    otherwise (Megatron-core's default grad_reduce_in_fp32=False: 16 bits in mixed precision)."""
    master_bytes: float
    """fp32 master weights (mixed precision); 0 where the weights are fp32 already."""
    moment_bytes: float
    """Adam's first and second moments, fp32."""
    cast_bytes: float
    """FP8 weight casts kept beside the weights: Transformer Engine keeps each weight's FP8 copy
    and, for the backward pass, its transpose (1 + 1 byte)."""
    act_bytes: float
    """Width of the activations a layer stores and sends (and its memory-bound kernels move)."""
    gemm_input_bytes: float
    """Width of the GEMM inputs kept for the backward pass: Transformer Engine's Linear keeps the
    FP8 cast of its input for the weight gradient (1 byte); otherwise the activation width."""
    gemm: str
    """The peak the GEMMs run at (a key of GPUType.peaks)."""
    attention: str
    """The peak the attention core runs at."""

    @property
    def optimizer_bytes(self) -> float:
        """Optimizer states per parameter: master copy and moments (what ZeRO-1 shards)."""
        return self.master_bytes + self.moment_bytes

    def state_bytes_per_param(self, grad_bytes: float | None = None) -> float:
        """Weights, gradients and optimizer states per parameter, unsharded; FP8's weight casts
        come on top for the transformer layers' parameters only (the embedding and the output
        head stay in bf16)."""
        g = self.grad_bytes if grad_bytes is None else grad_bytes
        return self.weight_bytes + g + self.optimizer_bytes

    def step_bytes_per_param(self, grad_bytes: float | None = None) -> float:
        """HBM bytes Adam's step moves per parameter: read the gradient, read and write the fp32
        weights (master or own) and both moments, and write the 16-bit weights where there is a
        master copy (FP8's weight casts are made in the next forward pass)."""
        g = self.grad_bytes if grad_bytes is None else grad_bytes
        fp32_weights = self.master_bytes or self.weight_bytes
        write_back = self.weight_bytes if self.master_bytes else 0.0
        return g + 2 * (fp32_weights + self.moment_bytes) + write_back

    @property
    def amax_bytes_per_layer(self) -> float:
        """Transformer Engine's scaling state per layer: an fp32 amax history per FP8 tensor."""
        if self.name != "fp8":
            return 0.0
        return GEMMS_PER_LAYER * FP8_TENSORS_PER_GEMM * AMAX_HISTORY * 4.0


_FP32 = dict(
    weight_bytes=4.0,
    grad_bytes=4.0,
    reduce_bytes=4.0,
    master_bytes=0.0,
    moment_bytes=8.0,
    cast_bytes=0.0,
)
_MIXED = dict(
    weight_bytes=2.0, grad_bytes=4.0, reduce_bytes=2.0, master_bytes=4.0, moment_bytes=8.0
)


def _mixed16(name: str) -> Format:
    """16-bit mixed precision in `name` (fp16 or bf16): everything at 2 bytes, GEMMs and attention
    at that format's peak."""
    return Format(
        name,
        **_MIXED,
        cast_bytes=0.0,
        act_bytes=2.0,
        gemm_input_bytes=2.0,
        gemm=name,
        attention=name,
    )


FORMAT = {
    "fp32": Format(
        "fp32", **_FP32, act_bytes=4.0, gemm_input_bytes=4.0, gemm="fp32", attention="fp32"
    ),
    "tf32": Format(
        "tf32", **_FP32, act_bytes=4.0, gemm_input_bytes=4.0, gemm="tf32", attention="tf32"
    ),
    "fp16": _mixed16("fp16"),
    "bf16": _mixed16("bf16"),
    "fp8": Format(
        "fp8",
        **_MIXED,
        cast_bytes=2.0,
        act_bytes=2.0,
        gemm_input_bytes=1.0,
        gemm="fp8",
        attention="bf16",
    ),
}
BF16 = FORMAT["bf16"]


@dataclass(frozen=True)
class FormatEfficiency:
    """How much of a format's peak a large GEMM reaches, relative to the 16-bit tensor GEMMs the
    GPU profiles were fitted on (their GEMM weight applies on top)."""

    ratio: float
    uncertainty: float
    """± on the ratio."""
    rule: str


FORMAT_EFFICIENCY = {
    "fp16": FormatEfficiency(1.0, 0.0, "the profiles' own format"),
    "bf16": FormatEfficiency(1.0, 0.0, "the profiles' own format"),
    "fp8": FormatEfficiency(
        0.91,
        0.03,
        "fitted: achieved/peak of FP8 (E4M3) over BF16 GEMMs on H100-SXM, H200 and GH200 in "
        "data/calibration/public/gemm_achieved.csv (stas00/ml-engineering MAMF table: FP8 "
        "1402.6/1979, 1453.4/1979, 1535.0/1979 against BF16 794.5/989, 0.80 (H200 'same as "
        "H100'), 828.6/989): 0.88, 0.91, 0.93, mean 0.91 ± 0.03 (spread)",
    ),
    "tf32": FormatEfficiency(
        1.0,
        0.15,
        "rule (no TF32 rows in the public GEMM data): TF32 runs on the same tensor cores at half "
        "the 16-bit rate with twice the operand bytes, so a large GEMM reaches the same share of "
        "its peak; ± 0.15 is the spread of the 16-bit shares across GPU types in the same data",
    ),
    "fp32": FormatEfficiency(
        1.0,
        0.15,
        "rule (no FP32 rows in the public GEMM data): SGEMM on the CUDA cores is compute-bound "
        "for the large GEMMs of a transformer layer and reaches the same share of its peak as the "
        "tensor-core GEMMs; ± 0.15 as for TF32",
    ),
}

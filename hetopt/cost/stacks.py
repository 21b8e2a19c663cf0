"""Framework stacks: how fast a training framework runs the same device work as the stack the GPU
profiles were fitted on.

Every GPU profile prices compute as a fused Megatron stack runs it: the A100 weights were fitted end
to end on Megatron-DeepSpeed (vTrain) and Megatron layer times (Korthikanti 2022), the other types'
GEMM curves on cuBLAS microbenchmarks. A PyTorch-FSDP stack (torchtitan, llm-foundry, plain FSDP)
runs the same FLOPs slower: eager elementwise kernels, FSDP's unsharding and resharding around every
block, NCCL kernels that share the SMs with the overlapped compute, host synchronisation. Its
`compute_efficiency` ε divides the device-compute weights (GEMM, KERN, MEM, ATTN) of every GPU type:
compute time / ε; communication keeps its fabric model. ε is fitted on end-to-end runs of that stack
(`fit_efficiency`; `hetopt calibrate --runs` reports it with leave-one-source-out), and is 1 for
Megatron by construction.

A stack also says how it lays out memory (`StackMemory`): the gradient buffer it keeps, whether the
loss is vocabulary-parallel and what it stores per logit, and the buffers and allocator overhead
fitted on real out-of-memory outcomes of that stack (`hetopt calibrate --outcomes`). Megatron and
FSDP keep the evaluator's counts (cost/memory.py) and fit nothing.

Instances choose the stack with `training.framework` (default megatron).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import cache
from importlib import resources

import numpy as np

from hetopt.cost.memory import LOGIT_BYTES
from hetopt.cost.terms import ATTN, GEMM, KERN, MEM

FRAMEWORKS = ("megatron", "fsdp", "scaling")
RUN_FITTED = ("fsdp",)
"""Stacks whose efficiency `hetopt calibrate --runs` fits on end-to-end rows; scaling's is fitted on
run outcomes (`hetopt calibrate --outcomes`, calibrate/boundary.py)."""
COMPUTE_TERMS = (GEMM, KERN, MEM, ATTN)
"""The device-compute weights a stack's efficiency divides."""
FILE = "stacks.json"
EFFICIENCY_BOUNDS = (0.3, 1.5)


MEGATRON_LOSS_BYTES = 2 * LOGIT_BYTES
"""Megatron's vocabulary-parallel cross-entropy keeps the fp32 logits and their gradient: 2 × 4
bytes per logit element, sharded by TP."""


@dataclass(frozen=True)
class StackMemory:
    """How a training stack lays out a GPU's memory beyond the evaluator's counts
    (cost/features.stage_memory), per stage:

    - `grad_bytes`: the gradient buffer per parameter through the backward (None: the format's,
      Megatron's fp32 main_grad in mixed precision);
    - `grad_partition_bytes`: an fp32 copy of the gradients of the rank's ZeRO-1 partition, per
      parameter / dp (a ZeRO-1 optimizer that keeps 16-bit gradients upcasts its shard to step);
    - `vocab_parallel_loss`: whether the cross-entropy runs on each TP rank's vocabulary shard
      (Megatron) or on logits gathered whole (a column-parallel head that gathers its output);
    - `loss_bytes_per_logit`: bytes the loss keeps per logit element of the micro-batch in its
      backward, counted;
    - `logit_buffer_bytes`: bytes per logit element on the last stage beyond that count (the
      transients of gathering the logits and of the cross-entropy's backward, and their
      fragmentation), fitted;
    - `allocator_overhead`: the caching allocator's fragmentation, a fraction of the stage's
      layer activations, fitted;
    - `reserve_gib`: a constant per GPU beyond the profile's runtime reserve, fitted.
    """

    grad_bytes: float | None = None
    grad_partition_bytes: float = 0.0
    vocab_parallel_loss: bool = True
    loss_bytes_per_logit: float = MEGATRON_LOSS_BYTES
    logit_buffer_bytes: float = 0.0
    allocator_overhead: float = 0.0
    reserve_gib: float = 0.0
    sources: dict = field(default_factory=dict, compare=False, hash=False)

    def to_json(self) -> dict:
        return {
            "grad_bytes": self.grad_bytes,
            "grad_partition_bytes": self.grad_partition_bytes,
            "vocab_parallel_loss": self.vocab_parallel_loss,
            "loss_bytes_per_logit": self.loss_bytes_per_logit,
            "logit_buffer_bytes": self.logit_buffer_bytes,
            "allocator_overhead": self.allocator_overhead,
            "reserve_gib": self.reserve_gib,
            "sources": self.sources,
        }

    @classmethod
    def from_json(cls, data: dict | None) -> StackMemory:
        data = data or {}
        grad = data.get("grad_bytes")
        return cls(
            grad_bytes=None if grad is None else float(grad),
            grad_partition_bytes=float(data.get("grad_partition_bytes", 0.0)),
            vocab_parallel_loss=bool(data.get("vocab_parallel_loss", True)),
            loss_bytes_per_logit=float(data.get("loss_bytes_per_logit", MEGATRON_LOSS_BYTES)),
            logit_buffer_bytes=float(data.get("logit_buffer_bytes", 0.0)),
            allocator_overhead=float(data.get("allocator_overhead", 0.0)),
            reserve_gib=float(data.get("reserve_gib", 0.0)),
            sources=dict(data.get("sources", {})),
        )


@dataclass(frozen=True)
class Stack:
    name: str
    compute_efficiency: float
    source: str = ""
    fit: dict = field(default_factory=dict)
    memory: StackMemory = field(default_factory=StackMemory)

    def to_json(self) -> dict:
        return {
            "compute_efficiency": self.compute_efficiency,
            "source": self.source,
            "fit": self.fit,
            "memory": self.memory.to_json(),
        }


def shipped_stacks() -> dict[str, Stack]:
    """The stack table shipped with the package (hetopt/cost/profiles/stacks.json); megatron is
    1."""
    text = resources.files("hetopt.cost").joinpath("profiles", FILE).read_text(encoding="utf-8")
    data = json.loads(text)["stacks"]
    stacks = {
        name: Stack(
            name,
            float(v["compute_efficiency"]),
            v.get("source", ""),
            v.get("fit", {}),
            StackMemory.from_json(v.get("memory")),
        )
        for name, v in data.items()
    }
    missing = [f for f in FRAMEWORKS if f not in stacks]
    if missing:
        raise ValueError(f"hetopt/cost/profiles/{FILE} lacks the stack(s) {', '.join(missing)}")
    return stacks


@cache
def stack_memory(framework: str) -> StackMemory:
    """The shipped memory description of the stack `framework`."""
    return shipped_stacks()[framework].memory


def scale_weights(w: np.ndarray, efficiency: float) -> np.ndarray:
    """Weights with the device-compute terms divided by the stack's efficiency."""
    out = np.array(w, dtype=float)
    out[list(COMPUTE_TERMS)] /= efficiency
    return out

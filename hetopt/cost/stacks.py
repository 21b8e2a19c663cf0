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

Instances choose the stack with `training.framework` (default megatron).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from importlib import resources

import numpy as np

from hetopt.cost.terms import ATTN, GEMM, KERN, MEM

FRAMEWORKS = ("megatron", "fsdp")
COMPUTE_TERMS = (GEMM, KERN, MEM, ATTN)
"""The device-compute weights a stack's efficiency divides."""
FILE = "stacks.json"
EFFICIENCY_BOUNDS = (0.3, 1.5)


@dataclass(frozen=True)
class Stack:
    name: str
    compute_efficiency: float
    source: str = ""
    fit: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        return {
            "compute_efficiency": self.compute_efficiency,
            "source": self.source,
            "fit": self.fit,
        }


def shipped_stacks() -> dict[str, Stack]:
    """The stack table shipped with the package (hetopt/cost/profiles/stacks.json); megatron is
    1."""
    text = resources.files("hetopt.cost").joinpath("profiles", FILE).read_text(encoding="utf-8")
    data = json.loads(text)["stacks"]
    stacks = {
        name: Stack(name, float(v["compute_efficiency"]), v.get("source", ""), v.get("fit", {}))
        for name, v in data.items()
    }
    missing = [f for f in FRAMEWORKS if f not in stacks]
    if missing:
        raise ValueError(f"hetopt/cost/profiles/{FILE} lacks the stack(s) {', '.join(missing)}")
    return stacks


def scale_weights(w: np.ndarray, efficiency: float) -> np.ndarray:
    """Weights with the device-compute terms divided by the stack's efficiency."""
    out = np.array(w, dtype=float)
    out[list(COMPUTE_TERMS)] /= efficiency
    return out

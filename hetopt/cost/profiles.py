"""Which calibrated parameters price which GPU type.

Every catalog type has a shipped profile (hetopt/cost/profiles/<GPU>.json: GEMM curve fitted per
type, the rest from the A100-80GB fit; see calibrate/gemm.py); a profile given with --profile
(fitted with `hetopt calibrate` or measured with `hetopt calibrate --measure`) replaces it. A custom
GPU type that names its `family` derives from that family's measured types
(cost.derive.derive_from_family: their mean efficiency, scaled by its power per peak TFLOP/s). A
custom type without a family derives from the calibrated type nearest in published peak tensor
throughput (log ratio), and its method says so: it keeps that type's efficiencies and fixed
latencies, while the cost features scale with its own published peak FLOP/s, HBM and link
bandwidths.

The instance's `training.framework` then divides the device-compute weights by that stack's fitted
compute efficiency (cost/stacks.py; 1 for megatron, the stack the profiles were fitted on).
"""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

from hetopt.cost.derive import derive_from_family
from hetopt.cost.stacks import Stack, scale_weights, shipped_stacks
from hetopt.cost.terms import CostParams, profile_error, shipped_profiles
from hetopt.errors import InputError, Problem
from hetopt.spec.gpus import CATALOG, GPUType


class Profiles:
    def __init__(
        self, extra: list[CostParams] | None = None, stacks: dict[str, Stack] | None = None
    ) -> None:
        self.calibrated: dict[str, CostParams] = shipped_profiles()
        for params in extra or []:
            self.calibrated[params.gpu] = params
        self.stacks: dict[str, Stack] = {**shipped_stacks(), **(stacks or {})}
        self._derived: dict[str, CostParams] = {}
        self._stacked: dict[tuple[str, str], CostParams] = {}

    def for_gpu(self, gpu: GPUType, framework: str = "megatron") -> CostParams:
        """The parameters that price `gpu` under the training stack `framework` (cost/stacks.py)."""
        base = self._base(gpu)
        eff = self.stacks[framework].compute_efficiency
        if eff == 1.0:
            return base
        key = (gpu.name, framework)
        if key not in self._stacked:
            w = scale_weights(base.w, eff)
            self._stacked[key] = replace(
                base,
                weights=tuple(float(x) for x in w),
                method=f"{base.method}; device compute / {eff:.3f} ({framework} stack)",
            )
        return self._stacked[key]

    def _base(self, gpu: GPUType) -> CostParams:
        if gpu.name in self.calibrated:
            return self.calibrated[gpu.name]
        if gpu.name not in self._derived:
            self._derived[gpu.name] = self._derive(gpu)
        return self._derived[gpu.name]

    def _derive(self, gpu: GPUType) -> CostParams:
        if gpu.family:
            return derive_from_family(gpu, self.calibrated)

        def distance(name: str) -> float:
            base = CATALOG.get(name)
            return abs(math.log(gpu.tensor16_tflops / base.peak_tflops)) if base else math.inf

        nearest = min(self.calibrated, key=distance)
        base = self.calibrated[nearest]
        return replace(
            base,
            gpu=gpu.name,
            derived=True,
            fit={},
            method=f"no family declared: derived from {nearest}, the calibrated type nearest in "
            f"peak TFLOP/s ({base.method}); efficiencies and latencies of {nearest}, peaks of "
            f"{gpu.name}",
        )


def load_profile_file(path: str | Path) -> CostParams:
    path = Path(path)
    try:
        return CostParams.from_json(json.loads(path.read_text(encoding="utf-8")))
    except FileNotFoundError:
        raise InputError(str(path), [Problem("", "profile file does not exist")]) from None
    except (json.JSONDecodeError, KeyError, TypeError, ValueError, RecursionError) as exc:
        raise profile_error(str(path), exc) from None

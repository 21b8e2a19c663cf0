"""Which calibrated parameters price which GPU type.

A GPU type with its own profile (shipped, fitted with `hetopt calibrate`, or measured with
`hetopt calibrate --measure`) uses it. A GPU type without one derives from the calibrated type nearest in
published peak tensor throughput (log ratio): it keeps that type's efficiencies and fixed latencies, while
the cost features already scale with its own published peak FLOP/s, HBM and link bandwidths. So an
H100 is priced as "an A100-like software stack on H100 peaks": efficiencies transfer, speeds do not.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

from hetopt.cost.terms import CostParams, shipped_profiles
from hetopt.errors import InputError, Problem
from hetopt.spec.gpus import CATALOG, GPUType


class Profiles:
    def __init__(self, extra: list[CostParams] | None = None) -> None:
        self.calibrated: dict[str, CostParams] = shipped_profiles()
        for params in extra or []:
            self.calibrated[params.gpu] = params
        self._derived: dict[str, CostParams] = {}

    def for_gpu(self, gpu: GPUType) -> CostParams:
        if gpu.name in self.calibrated:
            return self.calibrated[gpu.name]
        if gpu.name not in self._derived:
            self._derived[gpu.name] = self._derive(gpu)
        return self._derived[gpu.name]

    def _derive(self, gpu: GPUType) -> CostParams:
        def distance(name: str) -> float:
            base = CATALOG.get(name)
            return abs(math.log(gpu.peak_tflops / base.peak_tflops)) if base else math.inf

        nearest = min(self.calibrated, key=distance)
        base = self.calibrated[nearest]
        return replace(base, gpu=gpu.name, method=f"derived from {nearest} ({base.method}); efficiencies and "
                                                 f"latencies of {nearest}, peaks of {gpu.name}", fit={})


def load_profile_file(path: str | Path) -> CostParams:
    path = Path(path)
    try:
        return CostParams.from_json(json.loads(path.read_text(encoding="utf-8")))
    except FileNotFoundError:
        raise InputError(str(path), [Problem("", "profile file does not exist")]) from None
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        raise InputError(str(path), [Problem("", f"not a hetopt calibration profile ({exc}); write one with "
                                                 "`hetopt calibrate DATA.csv --gpu NAME --out FILE`")]) from None

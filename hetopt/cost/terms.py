"""Cost terms and the calibrated parameters that price them.

Every time in hetopt's cost model is a dot product ``features · weights``: the features are physics
(FLOPs at peak, bytes at nominal bandwidth, kernel and collective-step counts, all from formulas and
the GPU catalog) and the weights are what calibration fits (inverse efficiencies and fixed
latencies). This keeps one cost model for the evaluator, the ILP, the simulator and the fitter: the
fitter sees the same features the evaluator computes, and fits the weights by least squares.

| term | feature (unit)                              | weight (fitted)                             |
| ---- | ------------------------------------------- | ------------------------------------------- |
| GEMM | FLOPs / peak FLOP/s (s)                     | 1 / GEMM efficiency at large sizes          |
| KERN | number of GEMM kernels (count)              | fixed time per GEMM kernel (s): small GEMMs |
| MEM  | bytes / HBM bandwidth (s)                   | 1 / efficiency of memory-bound kernels      |
| LINK | bytes / intra-node link bandwidth (s)       | 1 / efficiency of NCCL on NVLink / PCIe     |
| NET  | bytes / network bandwidth (s)               | 1 / efficiency of NCCL over NICs and links  |
| STEP | collective / p2p steps (count)              | latency α per step (s)                      |
| PASS | layer passes, forward or backward (count)   | host time per layer pass (s): launches      |
| MB   | micro-batch passes per stage (count)        | host time per micro-batch pass (s)          |
| ITER | iterations (count)                          | fixed time per iteration (s)                |
| LAT  | physical link latency on the path (s)       | 1, not fitted: latency is in the instance   |
| ATTN | flash-attention FLOPs run / peak FLOP/s (s) | 1 / flash-attention kernel efficiency       |
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path

import numpy as np

from hetopt.errors import InputError, Problem
from hetopt.outputs import write_json

TERMS = ("GEMM", "KERN", "MEM", "LINK", "NET", "STEP", "PASS", "MB", "ITER", "LAT", "ATTN")
GEMM, KERN, MEM, LINK, NET, STEP, PASS, MB, ITER, LAT, ATTN = range(len(TERMS))
N_TERMS = len(TERMS)


def zeros() -> np.ndarray:
    return np.zeros(N_TERMS)


def term(index: int, value: float) -> np.ndarray:
    v = np.zeros(N_TERMS)
    v[index] = value
    return v


@dataclass(frozen=True)
class CostParams:
    """Calibrated weights of the cost terms for one GPU type, with where they come from."""

    gpu: str
    weights: tuple[float, ...]
    """One weight per entry of TERMS."""
    dp_overlap: float = 0.0
    """Fraction of a stage's last backward pass during which its gradient all-reduce already
    streams."""
    launch_serial: float = 0.0
    """Fraction of the shorter of host (PASS, MB) and device time per pass that does not overlap, in
    [0, 1]."""
    reserve_gib: float = 1.0
    """Per-GPU memory the runtime keeps besides tensors, GiB: the CUDA context and library handles
    (about 0.5 GiB on an A100 with PyTorch) plus NCCL communicator buffers (4 MiB per channel and
    peer by default). Timing data cannot fit it; 1 GiB is the estimate until `calibrate --measure`
    on a GPU measures the context on the device at hand."""
    source: str = ""
    date: str = ""
    method: str = ""
    fit: dict = field(default_factory=dict)
    """Fit report (errors, data sets) when the parameters were fitted."""
    family: str = ""
    """Architecture family of the GPU type (hetopt.spec.gpus.FAMILIES)."""
    derived: bool = False
    """True when no parameter was fitted on this type's own data (all come from other types or a
    family)."""
    sources: dict[str, str] = field(default_factory=dict)
    """Parameter (GEMM, KERN, ..., dp_overlap, launch_serial, reserve_gib) → its source or
    derivation rule."""
    uncertainty: dict[str, float] = field(default_factory=dict)
    """Relative uncertainty of parameters, e.g. {"gemm_efficiency": 0.05}; how it was obtained is in
    sources."""

    @property
    def w(self) -> np.ndarray:
        return np.asarray(self.weights, dtype=float)

    def describe(self) -> dict[str, float]:
        """The weights in readable units (efficiencies in [0, 1], latencies in µs)."""
        w = self.weights
        return {
            "gemm_efficiency": 1 / w[GEMM],
            "gemm_kernel_us": w[KERN] * 1e6,
            "memory_efficiency": 1 / w[MEM],
            "intra_node_link_efficiency": 1 / w[LINK],
            "network_efficiency": 1 / w[NET],
            "collective_step_us": w[STEP] * 1e6,
            "layer_pass_us": w[PASS] * 1e6,
            "microbatch_pass_us": w[MB] * 1e6,
            "iteration_ms": w[ITER] * 1e3,
            "dp_overlap": self.dp_overlap,
            "launch_serial": self.launch_serial,
            "attention_efficiency": 1 / w[ATTN],
        }

    def to_json(self) -> dict:
        data = asdict(self)
        data["weights"] = dict(zip(TERMS, self.weights, strict=True))
        data["readable"] = self.describe()
        return data

    @classmethod
    def from_json(cls, data: dict) -> CostParams:
        """A profile from its JSON form. Every weight of TERMS, dp_overlap and launch_serial must be
        there: a missing one raises MissingWeight (a silent 0 would price that term as free)."""
        if "gpu" not in data:
            raise MissingWeight("gpu")
        weights = data.get("weights")
        if isinstance(weights, dict):
            for t in TERMS:
                if t not in weights:
                    raise MissingWeight(f"weights.{t}")
            weights = [weights[t] for t in TERMS]
        elif not isinstance(weights, list | tuple) or len(weights) != N_TERMS:
            raise MissingWeight("weights")
        for key in ("dp_overlap", "launch_serial"):
            if key not in data:
                raise MissingWeight(key)
        return cls(
            gpu=data["gpu"],
            weights=tuple(float(x) for x in weights),
            dp_overlap=float(data["dp_overlap"]),
            launch_serial=float(data["launch_serial"]),
            reserve_gib=float(data.get("reserve_gib", 1.0)),
            source=data.get("source", ""),
            date=data.get("date", ""),
            method=data.get("method", ""),
            fit=data.get("fit", {}),
            family=data.get("family", ""),
            derived=bool(data.get("derived", False)),
            sources=dict(data.get("sources", {})),
            uncertainty={k: float(v) for k, v in data.get("uncertainty", {}).items()},
        )

    def save(self, path: Path) -> None:
        write_json(path, self.to_json(), "profile")


class MissingWeight(ValueError):
    """A profile lacks a weight (or another required entry); `name` says which."""

    def __init__(self, name: str) -> None:
        super().__init__(f"missing {name}")
        self.name = name


def profile_error(where: str, exc: Exception) -> InputError:
    """The input error for a profile file that cannot be read as one."""
    if isinstance(exc, MissingWeight):
        return InputError(
            where,
            [
                Problem(
                    exc.name,
                    f"the profile has no {exc.name}: every weight of {', '.join(TERMS)}, "
                    "dp_overlap and launch_serial is required (write profiles with `hetopt "
                    "calibrate`)",
                )
            ],
        )
    return InputError(
        where,
        [
            Problem(
                "",
                f"not a hetopt calibration profile ({exc}); write one with `hetopt calibrate "
                "DATA.csv --gpu NAME --out FILE`",
            )
        ],
    )


def shipped_profiles() -> dict[str, CostParams]:
    """Calibration profiles shipped with the package (hetopt/cost/profiles/*.json), by GPU type."""
    found = {}
    for entry in resources.files("hetopt.cost").joinpath("profiles").iterdir():
        # fabrics.json and stacks.json are the fabric and framework tables (spec/fabrics.py,
        # cost/stacks.py)
        if entry.name.endswith(".json") and entry.name not in ("fabrics.json", "stacks.json"):
            try:
                params = CostParams.from_json(json.loads(entry.read_text(encoding="utf-8")))
            except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
                raise profile_error(f"hetopt/cost/profiles/{entry.name}", exc) from None
            found[params.gpu] = params
    return found

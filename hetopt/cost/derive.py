"""Profiles for GPU types without measurements, derived from their architecture family: the mean
GEMM efficiency of the family's measured types, each scaled by board power per peak TFLOP/s, and
the fitted A100-80GB profile's software-stack weights (hetopt.calibrate.gemm fits the measured
types)."""

from __future__ import annotations

import datetime as dt
import math

import numpy as np

from hetopt.cost.attention import attention_uncertainty, attention_weight
from hetopt.cost.terms import ATTN, GEMM, KERN, TERMS, CostParams
from hetopt.errors import InputError, Problem
from hetopt.spec.gpus import CATALOG, GPUType

POWER_EXPONENT = 0.5
"""η scales as (power per peak TFLOP/s)^½ under a power cap (module docstring)."""


INHERITED = ("LINK", "NET", "STEP", "PASS", "MB", "ITER")


def _inherited_sources(a100: CostParams) -> dict[str, str]:
    base = f"inherited from the fitted A100-80GB profile ({a100.source})"
    src = {
        t: f"{base}: a software-stack property (NCCL, framework, host); no per-type data"
        for t in INHERITED
    }
    src["MEM"] = (
        f"{base}: 1/{a100.weights[TERMS.index('MEM')]:.3f}, not scaled — the same memory-bound "
        "kernels (norms, softmax, elementwise); the feature already uses this type's HBM bandwidth"
    )
    src["LAT"] = "1, not fitted: physical link latency is in the instance"
    src["dp_overlap"] = (
        f"{base}: how much of the gradient all-reduce the framework overlaps; no per-type data"
    )
    src["launch_serial"] = f"{base}: host/device overlap of the framework; no per-type data"
    src["reserve_gib"] = (
        "estimate of CUDA context + NCCL buffers (terms.CostParams.reserve_gib); not fitted"
    )
    return src


def _power_per_tflop(g: GPUType) -> float:
    return g.tdp_w / g.tensor16_tflops if g.tdp_w else 0.0


def family_members(
    profiles: dict[str, CostParams], family: str, skip: str = ""
) -> list[tuple[CostParams, GPUType]]:
    """Measured (non-derived) catalog types of a family, one per distinct (η, power per TFLOP/s)."""
    seen, out = set(), []
    for name, p in sorted(profiles.items()):
        g = CATALOG.get(name)
        if g is None or g.family != family or p.derived or name == skip:
            continue
        key = (round(p.weights[GEMM], 9), round(_power_per_tflop(g), 9))
        if key not in seen:
            seen.add(key)
            out.append((p, g))
    return out


def derived_eta(gpu: GPUType, members: list[tuple[CostParams, GPUType]]) -> float:
    """Mean η of the members, each scaled by min(1, w/w_m)^½ (w: board power per peak TFLOP/s)."""
    w = _power_per_tflop(gpu)
    vals = [
        (1 / p.weights[GEMM]) * (min(1.0, w / _power_per_tflop(g)) ** POWER_EXPONENT if w else 1.0)
        for p, g in members
    ]
    return float(np.mean(vals))


def derivation_uncertainty(profiles: dict[str, CostParams]) -> tuple[float, dict[str, float]]:
    """Leave-one-out check of the family rule: derive each measured catalog type from the rest of
    its family (families with ≥ 2 distinct members); RMS relative error of η, and the error per
    type."""
    errs = {}
    for name, p in profiles.items():
        g = CATALOG.get(name)
        if g is None or p.derived:
            continue
        others = family_members(profiles, g.family, skip=name)
        others = [(q, h) for q, h in others if not math.isclose(q.weights[GEMM], p.weights[GEMM])]
        if others:
            errs[name] = derived_eta(g, others) * p.weights[GEMM] - 1
    return (float(np.sqrt(np.mean(np.square(list(errs.values()))))) if errs else 0.0), errs


def derive_from_family(gpu: GPUType, profiles: dict[str, CostParams]) -> CostParams:
    """A profile for a GPU type without data from its family's measured types (GEMM, KERN) and
    A100-80GB's software-stack weights; the method, sources and uncertainty say how."""
    members = family_members(profiles, gpu.family)
    if not members:
        raise InputError(
            gpu.name, [Problem("family", "no calibrated GPU type of this family", gpu.family, True)]
        )
    base = profiles["A100-80GB"]
    eta = derived_eta(gpu, members)
    t_kernel = float(np.mean([p.weights[KERN] for p, _ in members]))
    names = ", ".join(g.name for _, g in members)
    unc, _ = derivation_uncertainty(profiles)
    spread = float(
        np.std([1 / p.weights[GEMM] for p, _ in members])
        / np.mean([1 / p.weights[GEMM] for p, _ in members])
    )
    w = list(base.weights)
    w[GEMM], w[KERN] = 1 / eta, t_kernel
    w[ATTN], attention_source = attention_weight(gpu.family, w[GEMM])
    power = (
        f"each scaled by min(1, w/w_m)^½ with w = {gpu.tdp_w:g} W / {gpu.tensor16_tflops:g} "
        "TFLOP/s "
        "(hetopt.calibrate.gemm.derived_eta)"
        if gpu.tdp_w
        else "not scaled by power (no tdp_w declared)"
    )
    sources = _inherited_sources(base)
    sources["GEMM"] = (
        f"η = {eta:.4f}: mean η of the {gpu.family} family's measured types ({names}), {power}"
    )
    sources["KERN"] = (
        f"t_kernel = {t_kernel * 1e6:.1f} µs: mean of the {gpu.family} family's measured types"
    )
    sources["ATTN"] = attention_source
    sources["uncertainty"] = (
        "gemm_efficiency: the larger of the family rule's leave-one-out RMS error over the "
        "catalog and the relative spread of the family's η"
    )
    return CostParams(
        gpu=gpu.name,
        weights=tuple(float(x) for x in w),
        dp_overlap=base.dp_overlap,
        launch_serial=base.launch_serial,
        reserve_gib=base.reserve_gib,
        source="derived",
        date=dt.date.today().isoformat(),
        method=(
            f"derived from the {gpu.family} family ({names}): GEMM and KERN from the family, "
            f"peaks of {gpu.name}; every other weight from A100-80GB"
        ),
        family=gpu.family,
        derived=True,
        sources=sources,
        uncertainty={
            "gemm_efficiency": max(unc, spread),
            "attention_efficiency": attention_uncertainty(gpu.family),
        },
    )

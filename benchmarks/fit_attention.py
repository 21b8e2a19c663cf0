"""Fit flash attention's efficiency on the H200 layer passes measured here (hetopt.cost.attention).

    python benchmarks/fit_attention.py [LAYER_TIMES.csv] [--gpu H200]

Least squares of the ATTN weight alone (relative error) on the flash-attention passes that take ≥ 2
ms (shorter ones are bound by eager PyTorch's per-operator launches, which the layer-time file
cannot separate), every other weight from the shipped profile of the GPU; prints η_attn, ρ =
η_attn/η_gemm and the errors, for forward and backward passes apart and together.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from scipy.optimize import least_squares

from hetopt.calibrate.layouts import FWD, FWD_TP, load_dataset, price_parts
from hetopt.cost.profiles import Profiles
from hetopt.cost.terms import ATTN, GEMM
from hetopt.spec.gpus import CATALOG

DATA = Path(__file__).parent / "measured" / "H200-2026-11-30" / "layer_times.csv"
MIN_PASS_S = 2e-3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("data", nargs="?", default=str(DATA))
    ap.add_argument("--gpu", default="H200")
    args = ap.parse_args()
    ds = load_dataset(args.data, args.gpu)
    base = Profiles().for_gpu(CATALOG[args.gpu])
    flash = np.array(["flash" in label for label in ds.labels]) & (ds.measured_s >= MIN_PASS_S)
    for part in ("fwd", "bwd", "both"):
        rows = flash & np.array([part == "both" or label.endswith(part) for label in ds.labels])

        def residuals(x, rows=rows):
            w = base.w.copy()
            w[ATTN] = x[0]
            t = price_parts(ds.features[rows], w, base.launch_serial)
            return (t[:, FWD] + t[:, FWD_TP] - ds.measured_s[rows]) / ds.measured_s[rows]

        fit = least_squares(residuals, [2.0], bounds=([0.5], [50.0]))
        err = np.abs(residuals(fit.x))
        eta = 1 / fit.x[0]
        print(
            f"{part:>4}: {rows.sum():3d} passes  η_attn {eta:.3f}  ρ {eta * base.w[GEMM]:.3f}  "
            f"MAPE {err.mean():.1%}  max {err.max():.1%}"
        )


if __name__ == "__main__":
    main()

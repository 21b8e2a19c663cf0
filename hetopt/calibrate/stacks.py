"""Fitting a framework stack's compute efficiency ε on end-to-end runs (hetopt.cost.stacks prices
with it), and writing the fitted table."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable

import numpy as np
from scipy.optimize import minimize_scalar

from hetopt.cost.stacks import EFFICIENCY_BOUNDS, Stack
from hetopt.outputs import write_json


def fit_efficiency(
    predict: Callable[[float], np.ndarray], measured_s: np.ndarray
) -> tuple[float, dict]:
    """ε minimising the mean absolute relative error of `predict(ε)` (predicted seconds per row)
    against `measured_s`; returns ε and the fit's rows, MAPE and median predicted/measured."""
    measured_s = np.asarray(measured_s, dtype=float)

    def mape(eff: float) -> float:
        return float(np.mean(np.abs(predict(eff) / measured_s - 1)))

    res = minimize_scalar(mape, bounds=EFFICIENCY_BOUNDS, method="bounded", options={"xatol": 1e-4})
    eff = float(res.x)
    ratio = predict(eff) / measured_s
    return eff, {
        "rows": int(measured_s.size),
        "mape": float(np.mean(np.abs(ratio - 1))),
        "median_ratio": float(np.median(ratio)),
    }


def save_stacks(stacks: dict[str, Stack], path, data: list[str]) -> None:
    """Write the stack table (`hetopt calibrate --runs CSV --out FILE`)."""
    doc = {
        "date": dt.date.today().isoformat(),
        "method": "hetopt calibrate --runs: per stack, the compute efficiency minimising the "
        "mean relative error of predicted iteration times on that stack's end-to-end rows",
        "data": data,
        "stacks": {name: s.to_json() for name, s in stacks.items()},
    }
    write_json(path, doc, "stack table")

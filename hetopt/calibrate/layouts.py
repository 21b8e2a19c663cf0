"""Fitting the cost-model weights of one GPU type to measurements, through the very same cost model.

Two kinds of CSV (see data/calibration/README.md) are understood by their columns:
- layout runs: one row per measured training iteration (gpus, global_batch, micro_batch, hidden,
  heads,
  layers, seq_len, tp, dp, pp, iter_time_ms, activation_recompute, pipeline_schedule);
- layer times: forward and backward time of one transformer layer (model, heads, hidden, layers, tp,
  micro_batch, seq_len, vocab, config, layer_fwd_ms, layer_bwd_ms).

Each row becomes an instance and a plan; `evaluate.plan_features` turns it into cost features once;
the fit then prices the features with trial weights — the evaluator's own `pipe_times` and
`dp_finish` — and minimises the relative error by bounded least squares (scipy). Each data set
weighs the same in the fit (residuals scaled by 1/√rows). Accuracy is reported as k-fold
cross-validated error.

Assumptions about the runs, from their sources: GPT models with the GPT-2 vocabulary (50257) and
learned positions, 16-bit mixed precision, standard (non-flash) attention — the Megatron-DeepSpeed
and Megatron-LM versions of 2022 — no sequence parallelism unless the configuration says so, no ZeRO
in the layout runs.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from hetopt.calibrate.columns import LAYERS_CSV, LAYOUTS_CSV
from hetopt.cost.attention import attention_weight
from hetopt.cost.features import BWD, BWD_TP, FWD, FWD_TP, N_PARTS, OPT, plan_features, stage_work
from hetopt.cost.pricing import dp_finish, pipe_times, price_parts
from hetopt.cost.terms import (
    ATTN,
    GEMM,
    ITER,
    KERN,
    LAT,
    LINK,
    MB,
    MEM,
    N_TERMS,
    NET,
    PASS,
    STEP,
    TERMS,
    CostParams,
)
from hetopt.csvfile import check_rows, read_table
from hetopt.errors import InputError, Problem
from hetopt.layout import Layout, expand_layout
from hetopt.spec.gpus import CATALOG
from hetopt.spec.instance import instance_from_spec
from hetopt.spec.load import validate_document
from hetopt.spec.schema import InstanceFile

GPT2_VOCAB = 50257
LAYOUT_COLUMNS = LAYOUTS_CSV.needed
"""A layout-runs file's columns (calibrate/columns.py)."""
LAYER_COLUMNS = LAYERS_CSV.needed
"""A layer-times file's columns (calibrate/columns.py)."""

# Fitted weights and their bounds: efficiencies in (0, 1] (weights ≥ 1), latencies ≥ 0.
FITTED = (GEMM, KERN, MEM, LINK, STEP, PASS, MB, ITER)
# ... then dp_overlap and launch_serial in [0, 1].
LOWER = np.array([1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0])
UPPER = np.array([20.0, 1e-3, 50.0, 20.0, 1e-3, 1e-2, 0.1, 1.0, 1.0, 1.0])
START = np.array([1.5, 5e-6, 2.0, 1.5, 5e-6, 5e-5, 1e-3, 1e-2, 0.0, 0.2])
SCALE = np.array([1.0, 1e-5, 1.0, 1.0, 1e-5, 1e-4, 1e-3, 1e-3, 1.0, 1.0])
"""Typical magnitudes of the parameters: the solver steps in these units (it converges in tens of
steps)."""
FIXED = {NET: 1.0, LAT: 1.0}
"""No multi-node runs in the data: network efficiency stays at the line rate; latency is
physical."""


@dataclass
class DataSet:
    name: str
    kind: str
    """layout | layer"""
    measured_s: np.ndarray
    labels: list[str]
    # layout runs: padded features (rows, stages, parts, terms), stage mask, micro-batches
    features: np.ndarray = field(default_factory=lambda: np.zeros(0))
    mask: np.ndarray = field(default_factory=lambda: np.zeros(0))
    micro_batches: np.ndarray = field(default_factory=lambda: np.zeros(0))
    family: str = ""
    """The GPU's architecture family: flash attention's weight follows its GEMM weight
    (cost.attention)."""

    def subset(self, index: np.ndarray) -> DataSet:
        return DataSet(
            self.name,
            self.kind,
            self.measured_s[index],
            [self.labels[i] for i in index],
            self.features[index],
            self.mask[index] if self.mask.size else self.mask,
            self.micro_batches[index] if self.micro_batches.size else self.micro_batches,
            self.family,
        )


def weights_of(theta: np.ndarray) -> tuple[np.ndarray, float, float]:
    """(weights, dp_overlap, launch_serial) from the fitted vector."""
    w = np.zeros(N_TERMS)
    for k, v in FIXED.items():
        w[k] = v
    w[list(FITTED)] = theta[: len(FITTED)]
    return w, float(theta[len(FITTED)]), float(theta[len(FITTED) + 1])


def predict(ds: DataSet, theta: np.ndarray) -> np.ndarray:
    """Predicted seconds for every row of a data set, with the evaluator's own formulas."""
    w, overlap, serial = weights_of(theta)
    w[ATTN], _ = attention_weight(ds.family, w[GEMM])
    times = price_parts(ds.features, w, serial)
    if ds.kind == "layer":
        return times[:, FWD] + times[:, FWD_TP]  # one layer's pass: compute + its TP collectives
    t_pipe, _ = pipe_times(times, ds.micro_batches, 1, ds.mask)
    t_dp = dp_finish(times, t_pipe, overlap, ds.mask)
    return t_dp + np.where(ds.mask, times[..., OPT], 0.0).max(axis=-1)


# -- reading
# ---------------------------------------------------------------------------------------------


def load_dataset(path: str | Path, gpu: str) -> DataSet:
    path = Path(path)
    header, rows = read_table(path, "calibration data")
    if not rows:
        raise InputError(str(path), [Problem("", "no rows; expected a CSV with a header line")])
    columns = set(header)
    family = CATALOG[gpu].family if gpu in CATALOG else ""
    if columns >= LAYOUT_COLUMNS:
        check_rows(path, rows, LAYOUTS_CSV)
        return replace(_layout_dataset(path, rows, gpu), family=family)
    if columns >= LAYER_COLUMNS:
        check_rows(path, rows, LAYERS_CSV)
        return replace(_layer_dataset(path, rows, gpu), family=family)
    raise InputError(
        str(path),
        [
            Problem(
                "",
                f"unknown columns; a layout-runs file needs {sorted(LAYOUT_COLUMNS)}, a "
                f"layer-times file {sorted(LAYER_COLUMNS)}",
                sorted(columns),
                True,
            )
        ],
    )


def _instance(
    gpu: str,
    gpus: int,
    hidden: int,
    heads: int,
    layers: int,
    seq_len: int,
    vocab: int,
    global_batch: int,
    source: str,
    kv_heads: int | None = None,
    ffn_hidden: int | None = None,
    gated: bool = False,
):
    model = {
        "layers": layers,
        "hidden": hidden,
        "heads": heads,
        "vocab": vocab,
        "max_seq_len": seq_len,
    }
    if kv_heads is not None:
        model["kv_heads"] = kv_heads
    if ffn_hidden is not None:
        model["ffn_hidden"] = ffn_hidden
    if gated:
        model["gated_mlp"] = True
    data = {
        "name": "calibration",
        "model": model,
        "training": {
            "seq_len": seq_len,
            "global_batch": global_batch,
            "precision": "fp16",
            "attention": "standard",
        },
        "cluster": {
            "nodes": [
                {"name": "node", "count": 1, "gpu": gpu, "gpus_per_node": gpus, "nic_gbps": 200}
            ]
        },
    }
    spec = validate_document(data, source, InstanceFile, "instance")
    return instance_from_spec(spec, source, Path("."))


def _recompute_of(text: str) -> str:
    text = text.lower()
    return "full" if "full" in text else "selective" if "selective" in text else "none"


def _layout_dataset(path: Path, rows: list[dict], gpu: str) -> DataSet:
    """Layout runs, their cells checked already (LAYOUTS_CSV)."""
    feats, mbs, measured, labels = [], [], [], []
    for n, r in enumerate(rows, start=2):
        v = {k: int(r[k]) for k in LAYOUT_COLUMNS - {"iter_time_ms"}}
        t_ms = float(r["iter_time_ms"])
        inst = _instance(
            gpu,
            v["gpus"],
            v["hidden"],
            v["heads"],
            v["layers"],
            v["seq_len"],
            GPT2_VOCAB,
            v["global_batch"],
            f"{path}:{n}",
        )
        schedule = r.get("pipeline_schedule", "1f1b").lower()
        layout = Layout(
            tp=v["tp"],
            pp=v["pp"],
            dp=v["dp"],
            mb=v["micro_batch"],
            recompute=_recompute_of(r.get("activation_recompute", "none")),
            sp=False,
            zero=0,
            schedule="gpipe" if schedule == "gpipe" else "1f1b",
        )
        plan = expand_layout(inst, layout, source=f"{path}:{n}")
        f = plan_features(inst, plan)
        feats.append(f.templates[0])
        mbs.append(f.micro_batches[0])
        measured.append(t_ms / 1e3)
        labels.append(
            f"h={v['hidden']} L={v['layers']} {layout.tp}/{layout.pp}/{layout.dp} "
            f"mb={layout.mb} gb={v['global_batch']}"
        )
    stages = max(a.shape[0] for a in feats)
    padded = np.zeros((len(feats), stages, N_PARTS, N_TERMS))
    mask = np.zeros((len(feats), stages), dtype=bool)
    for i, a in enumerate(feats):
        padded[i, : a.shape[0]] = a
        mask[i, : a.shape[0]] = True
    return DataSet(
        path.name, "layout", np.array(measured), labels, padded, mask, np.array(mbs, dtype=float)
    )


def _layer_dataset(path: Path, rows: list[dict], gpu: str) -> DataSet:
    """Layer times; optional columns (as benchmarks/measure_device.py writes them) say the layer's
    kind: `attention` (standard unless stated), `kv_heads`, `ffn_hidden`, `gated_mlp`."""
    feats, measured, labels = [], [], []
    for r in rows:
        inst = _instance(
            gpu,
            int(r["tp"]),
            int(r["hidden"]),
            int(r["heads"]),
            int(r.get("layers") or 1),
            int(r["seq_len"]),
            int(r.get("vocab") or GPT2_VOCAB),
            int(r["micro_batch"]),
            str(path),
            kv_heads=int(r.get("kv_heads") or r["heads"]),
            ffn_hidden=int(r.get("ffn_hidden") or 4 * int(r["hidden"])),
            gated=str(r.get("gated_mlp", "")).lower() == "true",
        )
        config = r["config"].lower()
        sp = "sequence" in config
        attention = r.get("attention") or "standard"
        work = stage_work(
            inst.model,
            inst.gpu_types[gpu],
            int(r["micro_batch"]),
            int(r["seq_len"]),
            int(r["tp"]),
            sp,
            attention,
            _recompute_of(config),
            1,
            False,
            False,
        ).copy()
        work[:, MB] = 0.0  # one layer, not a whole micro-batch pass
        for compute, tp in ((FWD, FWD_TP), (BWD, BWD_TP)):  # each measured pass in the FWD slots
            row = np.zeros((N_PARTS, N_TERMS))
            row[FWD], row[FWD_TP] = work[compute], work[tp]
            feats.append(row)
        measured += [float(r["layer_fwd_ms"]) / 1e3, float(r["layer_bwd_ms"]) / 1e3]
        name = f"{r.get('model', '')} {attention} mb={r['micro_batch']} {r['config']}".strip()
        labels += [f"{name} fwd", f"{name} bwd"]
    return DataSet(path.name, "layer", np.array(measured), labels, np.array(feats))


# -- fitting
# ---------------------------------------------------------------------------------------------

# The fit stops when a step changes the cost or the parameters by less than this fraction. The
# measured times scatter by percents, so 1e-6 is far below what the data can tell apart; at SciPy's
# default 1e-8 the non-smooth max() terms of the pipeline model kept a 4/5 subset of the A100
# layouts stepping until 2,000 evaluations ran out, to a cost equal to the 1e-6 stop's in its first
# 6 digits.
FIT_TOLERANCE = 1e-6
MAX_EVALUATIONS = 2000


def fit_theta(datasets: list[DataSet]) -> np.ndarray:
    """Least-squares fit of θ (FITTED weights, dp_overlap, launch_serial) to the data sets' relative
    errors, each data set weighted equally. Raises InputError (exit 2) when the fit does not
    converge."""
    from scipy.optimize import least_squares

    def residuals(theta: np.ndarray) -> np.ndarray:
        parts = [
            (predict(ds, theta) - ds.measured_s) / ds.measured_s / np.sqrt(len(ds.measured_s))
            for ds in datasets
        ]
        return np.concatenate(parts)

    result = least_squares(
        residuals,
        START,
        bounds=(LOWER, UPPER),
        x_scale=SCALE,
        method="trf",
        max_nfev=MAX_EVALUATIONS,
        ftol=FIT_TOLERANCE,
        xtol=FIT_TOLERANCE,
    )
    if result.status <= 0:  # 0: the evaluations ran out; −1: bad input to the solver
        raise InputError(
            ", ".join(ds.name for ds in datasets),
            [
                Problem(
                    "",
                    f"the calibration fit did not converge in {MAX_EVALUATIONS} evaluations "
                    f"({result.message}); check the rows for measured times that contradict one "
                    "another, or add rows",
                )
            ],
        )
    return result.x


def errors(ds: DataSet, theta: np.ndarray) -> dict:
    from scipy.stats import spearmanr

    pred = predict(ds, theta)
    rel = (pred - ds.measured_s) / ds.measured_s
    out = {
        "rows": len(rel),
        "mape": float(np.mean(np.abs(rel))),
        "max_error": float(np.max(np.abs(rel))),
    }
    if len(rel) > 2:
        out["spearman"] = float(spearmanr(pred, ds.measured_s).statistic)
    if ds.kind == "layer":
        out["per_row"] = {
            label: {"measured_ms": m * 1e3, "predicted_ms": p * 1e3, "error": e}
            for label, m, p, e in zip(ds.labels, ds.measured_s, pred, rel, strict=True)
        }
    return out


def cross_validate(
    datasets: list[DataSet],
    folds: int = 5,
    seed: int = 0,
    progress: Callable[[int], None] | None = None,
) -> dict[str, dict]:
    """k-fold CV: every layout data set is split into folds; small layer-time sets stay in every
    fit. progress(k) is called after fold k (1-based) is fitted."""
    rng = np.random.default_rng(seed)
    splits = {
        ds.name: np.array_split(rng.permutation(len(ds.measured_s)), folds)
        for ds in datasets
        if ds.kind == "layout"
    }
    held: dict[str, list[np.ndarray]] = {name: [] for name in splits}
    predicted: dict[str, np.ndarray] = {
        name: np.zeros(len(d.measured_s)) for d in datasets for name in [d.name] if name in splits
    }
    for k in range(folds):
        train = [
            ds.subset(np.setdiff1d(np.arange(len(ds.measured_s)), splits[ds.name][k]))
            if ds.name in splits
            else ds
            for ds in datasets
        ]
        theta = fit_theta(train)
        for ds in datasets:
            if ds.name in splits:
                idx = splits[ds.name][k]
                predicted[ds.name][idx] = predict(ds.subset(idx), theta)
                held[ds.name].append(idx)
        if progress is not None:
            progress(k + 1)
    report = {}
    for ds in datasets:
        if ds.name in splits:
            rel = (predicted[ds.name] - ds.measured_s) / ds.measured_s
            report[ds.name] = {
                "folds": folds,
                "cv_mape": float(np.mean(np.abs(rel))),
                "cv_max_error": float(np.max(np.abs(rel))),
            }
    return report


def calibrate(
    paths: list[str | Path], gpu: str, folds: int = 5, progress: Callable[[str], None] | None = None
) -> CostParams:
    """Fit the weights of `gpu` on the given CSV files; the result carries its fit report.

    Parameters: paths — the CSV files; gpu — the catalog type measured; folds — cross-validation
    folds;
    progress — progress(what is being done) before the fit and after each fold.
    Returns: the fitted CostParams. Raises: InputError for bad data or a fit that does not
    converge."""
    tell = progress or (lambda text: None)
    datasets = [load_dataset(p, gpu) for p in paths]
    sets = f"{len(datasets)} data set{'s' if len(datasets) != 1 else ''}"
    tell(f"fitting: {sum(len(ds.measured_s) for ds in datasets)} measurements in {sets}")
    theta = fit_theta(datasets)
    w, overlap, serial = weights_of(theta)
    family = CATALOG[gpu].family if gpu in CATALOG else ""
    w[ATTN], _ = attention_weight(family, w[GEMM])
    cv = (
        cross_validate(
            datasets,
            folds,
            progress=lambda k: tell(f"cross-validating: fold {k} of {folds} fitted"),
        )
        if any(ds.kind == "layout" for ds in datasets)
        else {}
    )
    report = {ds.name: {**errors(ds, theta), **cv.get(ds.name, {})} for ds in datasets}
    return CostParams(
        gpu=gpu,
        weights=tuple(float(x) for x in w),
        dp_overlap=overlap,
        launch_serial=serial,
        source="; ".join(Path(p).name for p in paths),
        date=dt.date.today().isoformat(),
        method=f"least-squares fit of {', '.join(TERMS[i] for i in FITTED)}, dp_overlap and "
        "launch_serial on measured runs through hetopt's cost model (relative error, each data set "
        "weighted equally)",
        fit=report,
    )

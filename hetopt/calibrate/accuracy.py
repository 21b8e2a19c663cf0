"""End-to-end accuracy: every expressed run priced by the cost model, the errors per GPU type and
per source, leave-one-source-out, and the fit of each non-Megatron stack's compute efficiency
(`hetopt calibrate --runs`)."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np

from hetopt.calibrate.rows import EVALUATOR
from hetopt.calibrate.runs import LOSO_MIN_ROWS, LOSO_TARGET, Run, _short, read_runs
from hetopt.calibrate.stacks import fit_efficiency
from hetopt.cost.pricing import evaluate
from hetopt.cost.profiles import Profiles
from hetopt.cost.stacks import FRAMEWORKS, RUN_FITTED, Stack, shipped_stacks
from hetopt.errors import InputError
from hetopt.layout import expand_layout


def predict_runs(runs: list[Run], profiles: Profiles | None = None) -> list[Run]:
    """Expand and evaluate every runnable row in place; a plan the evaluator rejects becomes a
    reason."""
    profiles = profiles or Profiles()
    for run in runs:
        if run.reasons or run.instance is None or run.layout is None:
            continue
        try:
            if run.plan is None:
                run.plan = expand_layout(run.instance, run.layout, source=run.label)
            ev = evaluate(run.instance, run.plan, profiles, source=run.label)
        except (InputError, ValueError) as exc:  # pydantic's ValidationError is a ValueError
            run.reasons.append(f"{EVALUATOR}: {_short(exc)}")
            continue
        run.predicted_s, run.breakdown, run.fits = ev.iteration_time_s, ev.breakdown, ev.fits
    return runs


def repredict(runs: list[Run], profiles: Profiles) -> np.ndarray:
    """Predicted seconds of expressed `runs` under other `profiles` (copies; the runs keep theirs);
    nan where the evaluator rejects a row under them."""
    copies = [replace(r, predicted_s=None, breakdown={}, fits=None) for r in runs]
    predict_runs(copies, profiles)
    return np.array([math.nan if c.predicted_s is None else c.predicted_s for c in copies])


def load_runs(paths: list[str | Path], profiles: Profiles | None = None) -> list[Run]:
    runs = [r for p in paths for r in read_runs(p)]
    return predict_runs(runs, profiles)


def zero_proxy(runs: list[Run], profiles: Profiles | None = None) -> list[Run]:
    """Diagnostic only: rows rejected by the evaluator for ZeRO-2/3 alone, evaluated as zero=1 (the
    same compute, pipeline and TP terms; data-parallel traffic 2/3 of FSDP's all-gather +
    reduce-scatter, memory higher). Copies; the rows stay not expressed in every headline figure."""
    profiles = profiles or Profiles()
    out = []
    for run in runs:
        if (
            len(run.reasons) == 1
            and run.reason_category == EVALUATOR
            and run.layout is not None
            and run.layout.zero >= 2
        ):
            proxy = replace(
                run,
                reasons=[],
                notes=[*run.notes, f"PROXY: zero={run.layout.zero} evaluated as zero=1"],
                layout=replace(run.layout, zero=1),
                plan=None,
            )
            predict_runs([proxy], profiles)
            if proxy.expressed:
                out.append(proxy)
    return out


def stats(predicted, measured) -> dict:
    """rows, MAPE, median ratio predicted/measured (bias), max |error|, Spearman (≥ 3 rows)."""
    p, m = np.asarray(predicted, dtype=float), np.asarray(measured, dtype=float)
    if p.size == 0:
        return {"rows": 0}
    ratio = p / m
    out = {
        "rows": int(p.size),
        "mape": float(np.mean(np.abs(ratio - 1))),
        "median_ratio": float(np.median(ratio)),
        "max_error": float(np.max(np.abs(ratio - 1))),
    }
    out["spearman"] = None
    if p.size >= 3 and np.ptp(p) > 0 and np.ptp(m) > 0:
        from scipy.stats import spearmanr

        rho = float(spearmanr(p, m).statistic)
        out["spearman"] = None if math.isnan(rho) else rho
    return out


def grouped(
    runs: list[Run], key: Callable[[Run], str], predicted: dict[int, float] | None = None
) -> dict:
    """stats per group of expressed runs; `predicted` overrides predictions by id(run) (LOSO)."""
    groups: dict[str, list[Run]] = {}
    for r in runs:
        if r.expressed:
            groups.setdefault(key(r), []).append(r)
    out = {}
    for name, rs in sorted(groups.items()):
        p = [predicted[id(r)] if predicted else r.predicted_s for r in rs]
        out[name] = stats(p, [r.measured_s for r in rs])
    return out


def loso(runs: list[Run], fit: Fit | None = None) -> dict:
    """Leave-one-source-out: per source, parameters fitted on the other sources' expressed rows
    predict this source's rows. Without `fit` nothing is fitted on end-to-end rows: held-out = plain
    predictions."""
    expressed = [r for r in runs if r.expressed]
    held: dict[int, float] = {}
    if fit is None:
        held = {id(r): r.predicted_s for r in expressed}
    else:
        for source in sorted({r.source for r in expressed}):
            profiles = fit([r for r in expressed if r.source != source])
            mine = [r for r in expressed if r.source == source]
            for r, t in zip(mine, repredict(mine, profiles), strict=True):
                held[id(r)] = t
    per_gpu = grouped(runs, lambda r: r.gpu, held)
    for s in per_gpu.values():
        applies = s["rows"] >= LOSO_MIN_ROWS
        s["acceptance"] = {
            "target_mape": LOSO_TARGET,
            "applies": applies,
            "passes": (s["mape"] <= LOSO_TARGET) if applies else None,
        }
    return {
        "fitted_on_end_to_end": fit is not None,
        "per_gpu": per_gpu,
        "per_source": grouped(runs, lambda r: r.source, held),
        "predicted": held,
    }


def fit_stacks(runs: list[Run]) -> dict[str, Stack]:
    """Every stack of FRAMEWORKS: megatron at 1 (the profiles' own stack); each other stack's
    compute efficiency of RUN_FITTED fitted (least mean relative error) on the expressed `runs`
    of that stack, or 1 when there are none (`fit.rows` 0 says so: a held-out fold must not see
    the shipped fit); the other stacks as shipped (scaling's is fitted on run outcomes,
    `hetopt calibrate --outcomes`). Memory descriptions are kept as shipped."""
    shipped = shipped_stacks()
    stacks = {
        fw: Stack(
            fw,
            1.0,
            "the stack the GPU profiles were fitted on (Megatron-DeepSpeed, Megatron layer "
            "times, cuBLAS GEMMs): 1 by construction",
            {"rows": 0},
            shipped[fw].memory,
        )
        for fw in FRAMEWORKS
    }
    stacks.update({fw: shipped[fw] for fw in FRAMEWORKS[1:] if fw not in RUN_FITTED})
    for fw in RUN_FITTED:
        rows = [r for r in runs if r.expressed and r.instance.spec.training.framework == fw]
        if not rows:
            stacks[fw] = Stack(
                fw,
                1.0,
                "no end-to-end rows of this stack to fit on: priced as megatron",
                {"rows": 0},
                shipped[fw].memory,
            )
            continue

        def predict(eff: float, fw=fw, rows=rows) -> np.ndarray:
            return repredict(
                rows, Profiles(stacks={fw: replace(shipped[fw], compute_efficiency=eff)})
            )

        eff, fit = fit_efficiency(predict, np.array([r.measured_s for r in rows]))
        sources = sorted({r.source for r in rows})
        fit["sources"] = {src: sum(r.source == src for r in rows) for src in sources}
        fit["data"] = sorted({Path(r.path).name for r in rows})
        stacks[fw] = Stack(
            fw,
            eff,
            f"fitted on {len(rows)} end-to-end rows ({', '.join(sources)}): least mean relative "
            "error of the iteration time, GPU and fabric profiles as shipped",
            fit,
            shipped[fw].memory,
        )
    return stacks


def stack_fit(runs: list[Run]) -> Profiles:
    """The `Fit` hetopt uses: profiles as shipped, stack efficiencies fitted on `runs`
    (`fit_stacks`)."""
    return Profiles(stacks=fit_stacks(runs))


NO_FIT_NOTE = (
    "hetopt fits no parameter on end-to-end rows (its profiles come from GEMM/layer/collective "
    "measurements fitted elsewhere), so each held-out source is predicted by the same model as the "
    "others: leave-one-source-out error equals the plain error."
)


def not_expressed_counts(runs: list[Run]) -> dict[str, int]:
    """Rows not expressed, by their first reason's category."""
    return dict(Counter(r.reason_category for r in runs if not r.expressed).most_common())


def fit_report(
    paths: list[str | Path], fit: Fit | None = None, profiles: Profiles | None = None
) -> dict:
    """Accuracy on end-to-end runs for `hetopt calibrate` to print (JSON-serialisable): counts, per
    GPU type and per source (plain and leave-one-source-out), the acceptance check per GPU type,
    rows not expressed by reason, and the lowest MAPE the repeated measurements allow
    (`repeat_floor`)."""
    runs = load_runs(paths, profiles)
    cv = loso(runs, fit)
    expressed = [r for r in runs if r.expressed]
    return {
        "data": [str(p) for p in paths],
        "rows": len(runs),
        "expressed": len(expressed),
        "not_expressed": not_expressed_counts(runs),
        "fitted_on_end_to_end": cv["fitted_on_end_to_end"],
        "note": "" if fit else NO_FIT_NOTE,
        "per_gpu": grouped(runs, lambda r: r.gpu),
        "per_source": grouped(runs, lambda r: r.source),
        "loso_per_gpu": cv["per_gpu"],
        "loso_per_source": cv["per_source"],
        "repeat_floor": repeat_floor(runs),
        "acceptance": acceptance(runs, cv),
    }


def acceptance(runs: list[Run], cv: dict) -> dict[str, dict]:
    """The issue's check for every GPU type with ≥ 10 rows in the data (expressed or not): LOSO MAPE
    ≤ 15% when ≥ 10 rows are expressed; otherwise not evaluable yet (`passes` None), with the
    counts."""
    counts = Counter(r.gpu for r in runs if r.gpu)
    out = {}
    for gpu, n in sorted(counts.items()):
        if n < LOSO_MIN_ROWS:
            continue
        held = cv["per_gpu"].get(gpu, {"rows": 0})
        ok = held["rows"] >= LOSO_MIN_ROWS
        out[gpu] = {
            "rows": n,
            "expressed": held["rows"],
            "loso_mape": held.get("mape"),
            "target_mape": LOSO_TARGET,
            "passes": (held["mape"] <= LOSO_TARGET) if ok else None,
        }
    return out


def repeat_floor(runs: list[Run]) -> dict[str, dict]:
    """Per GPU type, the smallest MAPE any model could reach on the expressed rows, given that rows
    with the very same instance and layout were measured at different times (BigScience notes 30–55
    TFLOPs day to day on Jean Zay): one prediction per configuration, the best one for its repeats
    (the median of measured times weighted by 1/measured minimises Σ|p − m|/m). Rows measured once
    add zero."""
    groups: dict[tuple, list[Run]] = {}
    for r in runs:
        if r.expressed:
            key = (r.gpu, r.model, r.config, r.instance.seq_len, r.instance.global_batch)
            groups.setdefault(key, []).append(r)
    total: dict[str, list[float]] = {}
    for (gpu, *_), rs in groups.items():
        m = np.array(sorted(r.measured_s for r in rs))
        w = 1 / m
        best = m[np.searchsorted(np.cumsum(w), w.sum() / 2)]
        total.setdefault(gpu, []).extend(np.abs(best / m - 1))
    return {
        gpu: {
            "rows": len(e),
            "floor_mape": float(np.mean(e)),
            "repeated_rows": sum(
                len(rs) for k, rs in groups.items() if k[0] == gpu and len(rs) > 1
            ),
        }
        for gpu, e in sorted(total.items())
    }


Fit = Callable[[list[Run]], Profiles]
"""Fits cost parameters on expressed end-to-end runs and returns the Profiles that price held-out
rows."""

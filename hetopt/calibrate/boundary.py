"""A stack's fitted memory terms on the boundary between runs that fit and runs that ended out of
memory, and its compute efficiency on the step times of the runs that finished; both checked by
grouped k-fold (`hetopt calibrate --outcomes`).

The memory terms a stack fits (cost/stacks.StackMemory) enter every stage's peak linearly:

    peak_j(θ) = base_j + θ_logit · [j last] b·s·V/shards + θ_frag · layer_activations_j + θ_res

so each run is priced four times (every θ at 0, then each at 1) and the fit is a grid search on
those lines: the θ whose fits / does-not-fit verdicts agree with the most outcomes, the smallest
θ among ties (grid order). Grouped k-fold: each group (a sweep at one sequence length) is predicted
by the θ fitted on the others, so no run is judged by a fit that saw its group.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, replace

import numpy as np

from hetopt.calibrate.outcomes import Outcome
from hetopt.calibrate.stacks import fit_efficiency
from hetopt.cost.pricing import evaluate
from hetopt.cost.profiles import Profiles
from hetopt.cost.stacks import Stack, StackMemory, shipped_stacks

LOGIT_GRID = np.arange(0.0, 121.0, 4.0)
"""The loss's transients beyond its counted bytes, per logit element on the last stage."""
FRAGMENTATION_GRID = np.round(np.arange(0.0, 1.01, 0.05), 2)
"""The allocator's overhead, a fraction of the layers' activation bytes."""
RESERVE_GRID = np.arange(0.0, 8.01, 0.5)
"""A constant per GPU, GiB."""
FITTED = ("logit_buffer_bytes", "allocator_overhead", "reserve_gib")


@dataclass
class Lines:
    """Each priced run's stage peaks as lines in the fitted terms: over_j = base_j + Σ θ_k·d_kj
    (GiB above the stage's limit)."""

    base: list[np.ndarray]
    slopes: list[np.ndarray]
    """Per run, (3, stages): GiB per unit of each term of FITTED."""
    oom: np.ndarray
    groups: list[str]


def _with_memory(o: Outcome, memory: StackMemory):
    return replace(o.instance, stack_memory=memory)


def memory_lines(outcomes: list[Outcome], memory: StackMemory) -> Lines:
    """Price every expressed outcome with the fitted terms of `memory` at 0 and each at 1."""
    zero = replace(memory, logit_buffer_bytes=0.0, allocator_overhead=0.0, reserve_gib=0.0)
    units = [replace(zero, **{name: 1.0}) for name in FITTED]
    base, slopes, oom, groups = [], [], [], []
    for o in outcomes:
        if not o.expressed:
            continue
        over = []
        for mem in (zero, *units):
            ev = evaluate(_with_memory(o, mem), o.plan)
            over.append(np.array(ev.peak_memory_gib) - np.array(ev.memory_limit_gib, dtype=float))
        base.append(over[0])
        slopes.append(np.array([u - over[0] for u in over[1:]]))
        oom.append(o.oom)
        groups.append(o.group)
    return Lines(base, slopes, np.array(oom), groups)


def verdicts(lines: Lines, theta: np.ndarray, rows: np.ndarray | None = None) -> np.ndarray:
    """Whether each run (of `rows`, default all) fits under the terms `theta` (one per FITTED)."""
    rows = np.arange(len(lines.base)) if rows is None else rows
    return np.array(
        [float((lines.base[r] + theta @ lines.slopes[r]).max()) <= 0 for r in rows], dtype=bool
    )


def _grid() -> np.ndarray:
    return np.array(list(itertools.product(LOGIT_GRID, FRAGMENTATION_GRID, RESERVE_GRID)))


def fit_terms(lines: Lines, rows: np.ndarray | None = None) -> tuple[np.ndarray, float]:
    """The grid point whose verdicts agree with the most outcomes of `rows` (the smallest among
    ties), and that agreement."""
    rows = np.arange(len(lines.base)) if rows is None else np.asarray(rows)
    grid = _grid()
    # a run fits iff every stage's line is ≤ 0: its worst stage over the grid at once
    worst = np.stack(
        [(lines.base[r][None, :] + grid @ lines.slopes[r]).max(axis=1) for r in rows], axis=1
    )  # (grid, rows)
    agree = ((worst <= 0) != lines.oom[rows][None, :]).sum(axis=1)
    best = int(np.argmax(agree))  # the first maximum: the smallest terms in grid order
    return grid[best], float(agree[best]) / len(rows)


def grouped_kfold(lines: Lines) -> dict:
    """Each group's agreement under the terms fitted on the other groups, and the total; None
    with fewer than two groups."""
    groups = sorted(set(lines.groups))
    if len(groups) < 2:
        return None
    labels = np.array(lines.groups)
    agree, per_group = 0, {}
    for g in groups:
        test = np.flatnonzero(labels == g)
        theta, _ = fit_terms(lines, np.flatnonzero(labels != g))
        ok = int((verdicts(lines, theta, test) != lines.oom[test]).sum())
        agree += ok
        per_group[g] = {
            "runs": int(test.size),
            "agreement": ok / test.size,
            "terms": dict(zip(FITTED, (float(x) for x in theta), strict=True)),
        }
    return {"agreement": agree / len(lines.base), "groups": per_group}


def _timed(outcomes: list[Outcome]) -> list[Outcome]:
    return [o for o in outcomes if o.expressed and not o.oom and o.step_s]


def _predict(outcomes: list[Outcome], stack: Stack, efficiency: float) -> np.ndarray:
    profiles = Profiles(stacks={stack.name: replace(stack, compute_efficiency=efficiency)})
    out = []
    for o in outcomes:
        ev = evaluate(o.instance, o.plan, profiles)
        out.append(ev.iteration_time_s)
    return np.array(out)


def fit_step_time(outcomes: list[Outcome], framework: str) -> dict:
    """The stack's compute efficiency fitted on the step times of the runs that finished (least
    mean relative error), on all of them and per group on the others (grouped k-fold)."""
    stack = shipped_stacks()[framework]
    timed = _timed(outcomes)
    if not timed:
        return {"rows": 0}
    groups = sorted({o.group for o in timed})
    measured = np.array([o.step_s for o in timed])
    labels = np.array([o.group for o in timed])
    eff, fit = fit_efficiency(lambda e: _predict(timed, stack, e), measured)
    if len(groups) < 2:
        return {"efficiency": eff, **fit, "kfold_mape": None, "kfold_bias": None, "groups": {}}
    errors = np.full(len(timed), math.nan)
    per_group = {}
    for g in groups:
        train, test = np.flatnonzero(labels != g), np.flatnonzero(labels == g)
        sub = [timed[i] for i in train]
        e_g, _ = fit_efficiency(lambda e, sub=sub: _predict(sub, stack, e), measured[train])
        pred = _predict([timed[i] for i in test], stack, e_g)
        errors[test] = pred / measured[test] - 1
        per_group[g] = {
            "runs": int(test.size),
            "efficiency": e_g,
            "mape": float(np.mean(np.abs(errors[test]))),
        }
    return {
        "efficiency": eff,
        **fit,
        "kfold_mape": float(np.mean(np.abs(errors))),
        "kfold_bias": float(np.mean(errors)),
        "groups": per_group,
    }


def fit_memory(outcomes: list[Outcome], framework: str) -> dict:
    """The stack's fitted memory terms on every expressed outcome, their agreement, and the
    grouped k-fold agreement."""
    lines = memory_lines(outcomes, shipped_stacks()[framework].memory)
    if not lines.base:
        return {"runs": 0}
    theta, agreement = fit_terms(lines)
    return {
        "runs": len(lines.base),
        "terms": dict(zip(FITTED, (float(x) for x in theta), strict=True)),
        "agreement": agreement,
        "kfold": grouped_kfold(lines),
        "grid": {
            "logit_buffer_bytes": [float(LOGIT_GRID[0]), float(LOGIT_GRID[-1])],
            "allocator_overhead": [float(FRAGMENTATION_GRID[0]), float(FRAGMENTATION_GRID[-1])],
            "reserve_gib": [float(RESERVE_GRID[0]), float(RESERVE_GRID[-1])],
        },
    }

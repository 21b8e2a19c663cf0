"""Bandwidth scenarios as piecewise-constant capacity traces per island link.

Explicit `events`, or seeded generators: `step` (drop at a time, recover later), `markov` (random
switching between levels with exponential dwell times), `diurnal` (smooth periodic load, sampled
every step_s) and `trace` (a CSV of at_s, a, b, gbps). The same seed gives the same trace, and a
longer generation horizon only extends it: the first H seconds are the same whatever horizon a trace
is generated to.

The horizon H (`search.horizon_s`, default DEFAULT_HORIZON_S) is the stretch of training, from
t = 0, that the robust objectives price (hetopt.search.robust) and that `hetopt simulate` replays by
default: one number for both, so that what the planner promises is what the simulator checks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hetopt.csvfile import read_table
from hetopt.errors import InputError, Problem
from hetopt.spec.schema import InstanceFile

Link = tuple[str, str]
"""An island pair, the two names in sorted order (as scenario changes name links)."""

Change = tuple[float, Link, float]
"""(time s, (island a, island b), Gbit/s from then on)."""


@dataclass(frozen=True)
class BandwidthScenario:
    name: str
    probability: float
    changes: tuple[Change, ...]


DEFAULT_HORIZON_S = 60.0
"""Seconds of training the scenarios are priced and replayed over when the instance does not say:
several iterations of the bundled instances (1 to 20 s each), and a minute-long outage."""


MAX_SCENARIO_CHANGES = 100_000
"""The most bandwidth changes a generator may make over the horizon (the replay's trace length)."""


def horizon_of(spec: InstanceFile) -> float:
    """The instance's scenario horizon H in seconds.

    Parameters: spec, the instance file (its `search.horizon_s`, if given).
    Returns: `search.horizon_s`, or DEFAULT_HORIZON_S when the key is absent.
    """
    given = spec.search.horizon_s
    return DEFAULT_HORIZON_S if given is None else float(given)


def nominal_gbps(spec: InstanceFile) -> dict[Link, float]:
    """Each island link's nominal Gbit/s, keyed (a, b) in sorted order as scenario changes name
    links."""
    return {link_key((lk.a, lk.b)): lk.gbps for lk in spec.cluster.network.links}


def levels_at(nominal: dict[Link, float], changes, t: float) -> dict[Link, float]:
    """Every link's Gbit/s at time t: its nominal level, then the changes up to t (those at t
    applied, in their order)."""
    levels = dict(nominal)
    for at, link, gbps in changes:
        if at <= t:
            levels[link_key(link)] = gbps
    return levels


def varies(scenario: BandwidthScenario) -> bool:
    """Whether the scenario changes a link after t = 0 (if not, every iteration of a replay is the
    same)."""
    return any(t > 0 for t, _, _ in scenario.changes)


STEP_KEYS = {"markov": "mean_dwell_s", "diurnal": "step_s"}
"""The generators that change the bandwidth over and over, and the key of their interval."""


def outages(changes: list[Change]) -> list[tuple[Link, float, float]]:
    """The spans a link is down (at 0 Gbit/s): (link, from s, until s), until inf when it never
    comes back. Changes at one instant apply in their order: only the last one holds."""
    down: dict[Link, float] = {}
    spans = []
    for t, link, gbps in sorted(changes, key=lambda c: c[0]):
        if gbps == 0:
            down.setdefault(link, t)
        elif link in down:
            start = down.pop(link)
            if t > start:
                spans.append((link, start, t))
    return spans + [(link, start, math.inf) for link, start in down.items()]


def longest_trace_s(spec: InstanceFile) -> float:
    """The longest replay whose generated traces stay within MAX_SCENARIO_CHANGES changes each (a
    Markov or diurnal generator changes the bandwidth about once per mean_dwell_s or step_s); inf
    without one."""
    steps = [
        getattr(sc.generator, STEP_KEYS[sc.generator.kind])
        for sc in spec.scenarios
        if sc.generator is not None and sc.generator.kind in STEP_KEYS
    ]
    return min(steps, default=math.inf) * MAX_SCENARIO_CHANGES


def generated_scenarios(spec: InstanceFile) -> set[str]:
    """The names of the scenarios whose trace a generator makes as long as asked (STEP_KEYS)."""
    return {
        sc.name
        for sc in spec.scenarios
        if sc.generator is not None and sc.generator.kind in STEP_KEYS
    }


def scenarios_of(spec: InstanceFile, horizon_s: float, base_dir: Path) -> list[BandwidthScenario]:
    """Every scenario of the instance file (one `stable` scenario when it has none), generated up to
    horizon_s; measured traces are read relative to `base_dir` (the file's folder)."""
    if not spec.scenarios:
        return [BandwidthScenario("stable", 1.0, ())]
    nominal = {frozenset((lk.a, lk.b)): lk.gbps for lk in spec.cluster.network.links}
    out = []
    for sc in spec.scenarios:
        changes: list[Change] = [(e.at_s, link_key(e.link), e.gbps) for e in sc.events]
        if sc.generator is not None:
            changes += generate(sc.generator, nominal, horizon_s, base_dir)
        out.append(
            BandwidthScenario(sc.name, sc.probability, tuple(sorted(changes, key=lambda c: c[0])))
        )
    return out


def link_key(link) -> Link:
    """An island pair as scenarios name links: the two names in sorted order."""
    a, b = link
    return (a, b) if a <= b else (b, a)


def generate(gen, nominal: dict, horizon_s: float, base_dir: Path) -> list[Change]:
    if gen.kind == "trace":
        return read_trace(base_dir / gen.path, {frozenset(link) for link in nominal})
    link = link_key(gen.link)
    if gen.kind == "step":
        changes = [(gen.at_s, link, gen.low_gbps)]
        if gen.until_s is not None:
            changes.append((gen.until_s, link, nominal[frozenset(link)]))
        return changes
    if gen.kind == "markov":
        rng = np.random.default_rng(gen.seed)
        t, level, changes = 0.0, 0, []
        while t <= horizon_s:
            changes.append((t, link, gen.levels_gbps[level]))
            t += float(rng.exponential(gen.mean_dwell_s))
            level = int(rng.choice([i for i in range(len(gen.levels_gbps)) if i != level]))
        return changes
    if gen.kind == "diurnal":
        steps = math.ceil(horizon_s / gen.step_s) + 1
        return [
            (
                k * gen.step_s,
                link,
                gen.mean_gbps
                - gen.amplitude_gbps
                * math.cos(2 * math.pi * (k * gen.step_s + gen.phase_s) / gen.period_s),
            )
            for k in range(steps)
        ]
    raise ValueError(f"unknown generator kind {gen.kind}")


TRACE_COLUMNS = ("at_s", "a", "b", "gbps")
MAX_TRACE_PROBLEMS = 10
"""Rows of a bad trace named one by one; the rest are counted."""


def read_trace(path: Path, links: set[frozenset[str]] | None = None) -> list[Change]:
    """The changes of a measured trace CSV (columns at_s, a, b, gbps), every row checked.

    Parameters: path — the CSV; links — the declared island links ({a, b} sets), None to skip that
    check.
    Returns: (at_s, (a, b), gbps) per row. Raises: InputError naming each bad row's line, column and
    value: a time or a bandwidth that is not a finite number ≥ 0, an undeclared link. A bandwidth of
    0 is an outage: the link carries nothing until a later row brings it back.
    """
    changes, problems = [], []
    # a spreadsheet's byte-order mark is no column; bytes that are not UTF-8 are bad input
    header, rows = read_table(path, "bandwidth trace")
    missing = [c for c in TRACE_COLUMNS if c not in header]
    if missing:
        raise InputError(
            str(path),
            [
                Problem(
                    "line 1",
                    f"missing column(s) {', '.join(missing)}; a trace has the columns "
                    f"{','.join(TRACE_COLUMNS)}",
                    header,
                    True,
                )
            ],
        )
    for n, row in enumerate(rows, start=2):
        found = _row_problems(row, links)
        problems += [
            Problem(f"line {n} {column}", message, value, True) for column, message, value in found
        ]
        if not found:
            changes.append((float(row["at_s"]), link_key((row["a"], row["b"])), float(row["gbps"])))
    if not changes and not problems:
        raise InputError(
            str(path),
            [
                Problem(
                    "line 2",
                    "the trace has no rows; give at least one (at_s,a,b,gbps)",
                    None,
                    False,
                )
            ],
        )
    if problems:
        shown = problems[:MAX_TRACE_PROBLEMS]
        if len(problems) > len(shown):
            shown.append(Problem("", f"and {len(problems) - len(shown)} more bad rows"))
        raise InputError(str(path), shown)
    return changes


def _row_problems(row: dict, links: set[frozenset[str]] | None) -> list[tuple[str, str, object]]:
    found = []
    for column, what in (("at_s", "seconds ≥ 0"), ("gbps", "Gbit/s ≥ 0 (0: an outage)")):
        text = row.get(column)
        try:
            value = float(text)
        except (TypeError, ValueError):
            found.append((column, f"not a number; give {what}", text))
            continue
        if not math.isfinite(value):
            found.append((column, f"must be finite {what}", text))
        elif value < 0:
            found.append((column, f"must be {what}", text))
    if links is not None and frozenset((row.get("a"), row.get("b"))) not in links:
        found.append(("a,b", "no such link in cluster.network.links", [row.get("a"), row.get("b")]))
    return found

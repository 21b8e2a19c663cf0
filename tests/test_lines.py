"""The pure functions of stage lines (hetopt.search.bounds.lines) against every integer split."""

from __future__ import annotations

import itertools
import random

import numpy as np
import pytest

from hetopt.search.bounds.lines import (
    DrainedPipeline,
    Pipeline,
    drained_pipeline,
    least_drain,
    pipeline_at,
)


def splits(stages: int, layers: int, caps: list[int]):
    """Every split of `layers` over `stages` with 1 ≤ L_i ≤ caps_i."""
    for cut in itertools.combinations(range(1, layers), stages - 1):
        split = [b - a for a, b in zip((0, *cut), (*cut, layers), strict=True)]
        if all(n <= c for n, c in zip(split, caps, strict=True)):
            yield split


def random_case(rng: random.Random):
    stages = rng.randint(1, 4)
    layers = rng.randint(stages, 9)
    lines = [(rng.uniform(0.1, 2.0), rng.uniform(-0.05, 0.5)) for _ in range(stages)]
    caps = [rng.randint(1, layers) for _ in range(stages)]
    return lines, caps, layers


@pytest.mark.parametrize("seed", range(40))
def test_a_pipeline_priced_once_bounds_every_split_at_every_micro_batch_count(seed):
    rng = random.Random(seed)
    lines, caps, layers = random_case(rng)
    pipe = Pipeline(lines, caps, layers)
    for m in (1, 2, 3, 7, 64):
        times = [
            (m - 1) * max(a * n + c for (a, c), n in zip(lines, s, strict=True))
            + sum(a * n + c for (a, c), n in zip(lines, s, strict=True))
            for s in splits(len(lines), layers, caps)
        ]
        # one object at many m answers as a fresh one at each
        assert pipe.at(m) == pipeline_at(lines, caps, layers, m)
        if not times:
            assert pipe.at(m) == float("inf")
        else:
            assert pipe.at(m) <= min(times) + 1e-9


@pytest.mark.parametrize("seed", range(40))
def test_a_drained_pipeline_tabled_once_bounds_every_split_at_every_m_and_v(seed):
    rng = random.Random(seed)
    lines, caps, layers = random_case(rng)
    slope, offset = rng.uniform(0.0, 1.5), rng.uniform(-3.0, 1.0)

    def drain(n: int) -> float:
        return slope * n + offset

    table = DrainedPipeline(lines, caps, layers, drain)
    for m, v in itertools.product((1, 2, 5, 33), (1, 2)):
        times = []
        for s in splits(len(lines), layers, caps):
            taus = [a * n + c for (a, c), n in zip(lines, s, strict=True)]
            if len(taus) == 1:
                times.append(m * taus[0] + max(0.0, drain(s[0])))
            else:
                times.append((m - 1 / v) * max(taus) + sum(taus) / v + max(0.0, drain(s[0])))
        assert table.at(m, v) == drained_pipeline(lines, caps, layers, m, drain, v)
        if not times:
            assert table.at(m, v) == float("inf")
        elif len(lines) <= 2:  # the rest is one stage: its level and sum are exact, as is the bound
            assert table.at(m, v) == pytest.approx(min(times), rel=1e-12)
        else:
            assert table.at(m, v) <= min(times) + 1e-9


@pytest.mark.parametrize("seed", range(60))
def test_the_least_drain_is_below_every_split_and_at_least_stage_0s(seed):
    """least_drain against every split: at most the least max_i (e_i(L_i) − Σ_{k<i} c_k(L_k)) ∨ 0
    (a relaxation: the greedy pass may hold more layers than the model has), and at least stage 0's
    least drain (it waits on nothing) less the bisection's last step."""
    rng = random.Random(seed)
    stages = rng.randint(1, 5)
    layers = rng.randint(stages, 10)
    caps = [rng.randint(1, layers) for _ in range(stages)]
    rising = seed % 2 == 0
    own, chain = [], []
    for cap in caps:
        n = np.arange(1, cap + 1, dtype=float)
        if rising:
            own.append(rng.uniform(0.0, 3.0) * n + rng.uniform(-4.0, 1.0))
            chain.append(rng.uniform(0.0, 1.0) * n + rng.uniform(0.0, 0.5))
        else:  # any tables: the bound must hold all the same
            own.append(np.array([rng.uniform(-3.0, 5.0) for _ in n]))
            chain.append(np.array([rng.uniform(0.0, 2.0) for _ in n]))
    drains = [
        max(
            0.0,
            max(
                own[i][s[i] - 1] - sum(chain[k][s[k] - 1] for k in range(i)) for i in range(stages)
            ),
        )
        for s in splits(stages, layers, caps)
    ]
    got = least_drain(own, chain, layers)
    if not drains:
        assert got == 0.0
        return
    assert got <= min(drains) + 1e-12
    # least_drain bisects [0, max e] in four 64-way rounds: it stops within span/64^4 below its
    # least level; 64^3 leaves that slack
    span = max(abs(float(e.max())) for e in own)
    assert got >= max(0.0, float(own[0].min())) - span / 64**3 - 1e-9

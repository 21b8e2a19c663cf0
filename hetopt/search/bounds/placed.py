"""The bound of a skeleton once it is placed and linearised (hetopt.search.linear.PlanProblem),
before its integer program is solved: its communication is known now."""

from __future__ import annotations

import math

import numpy as np

from hetopt.search.bounds.lines import (
    drained_pipeline,
    least_drain,
    pipeline_at,
    stage_tables,
    tabled_pipeline,
)
from hetopt.search.robust import aggregate


def placed_bound(problem) -> float:
    """A bound on a skeleton once it is placed and linearised (search.linear.PlanProblem), before
    its integer program is solved: its communication is now known.

    Per scenario and template, stage i takes τ_i(L) = y^f_i(L) + y^b_i(L) + c_i with the exact sends
    c_i, and y(L) = max(h, d) + s·min(h, d) ≥ d + s·h, a line a_i·L + b_i (under ZeRO-2/3 also y ≥
    K, the collectives' line: the larger of the two bounds holds; both raised by the exposed part
    ε_i); so T_sync ≥ (m − 1)·λ + g(λ + Δ) as in `TemplateBounds.pipeline_bound`, each L_i at most
    what stage i holds in memory. Stage 0's gradient all-reduce ends at T_sync − o_0·y^b_0(L_0) +
    D_0(L_0) ≥ T_sync + min over its layer counts; the optimizer step is at least every stage's at
    one layer; the templates' exchange is a constant. The scenario times combine by the objective,
    which rises with each of them (robust.aggregate). A template with shards (`SplitProblem.rows`)
    takes its pipeline from its stages' tables (`tabled_pipeline`), its drain and optimizer step
    from its accessors."""
    times = []
    for sc in problem.scenarios:
        t_sync, drain, drained, t_opt = 0.0, 0.0, 0.0, 0.0
        for pr in sc.templates:
            if pr.rows is not None:  # stages with shards: their tables
                caps = [min(c, pr.layers) for c in pr.max_layers()]
                pipe = tabled_pipeline(stage_tables(pr, caps), pr.layers, pr.micro_batches)
                if not math.isfinite(pipe):
                    return math.inf
                t_sync = max(t_sync, pipe)
                drain = max(drain, min(_drain(pr, n) for n in range(1, max(1, caps[0]) + 1)))
                t_opt = max(t_opt, max(pr.opt_s(i, 1) for i in range(pr.depth)))
                continue
            lines, collectives = [], []
            for i in range(pr.depth):
                s = pr.serial[i]
                a = sum(f.slope for f in (pr.dev_fwd[i], pr.dev_bwd[i])) + s * sum(
                    f.slope for f in (pr.host_fwd[i], pr.host_bwd[i])
                )
                b = sum(f.intercept for f in (pr.dev_fwd[i], pr.dev_bwd[i])) + s * sum(
                    f.intercept for f in (pr.host_fwd[i], pr.host_bwd[i])
                )
                eps = 0.0
                if pr.tabulated:  # ZeRO-2/3: a pass takes at least its collectives K, and ε more
                    eps = exposed_at_least(pr, i)
                    k = pr.zero_fwd[i].slope + pr.zero_bwd[i].slope
                    collectives.append(
                        (
                            max(k, 1e-15),
                            pr.zero_fwd[i].intercept + pr.zero_bwd[i].intercept + eps + pr.p2p[i],
                        )
                    )
                lines.append((max(a, 1e-15), b + eps + pr.p2p[i]))
            layers, v = pr.layers, pr.virtual_stages
            # interleaved: v·T_pipe = (v·m − 1)·max τ + Σ τ, one chunk per pass
            m = v * pr.micro_batches
            caps = [min(c, layers) for c in pr.max_layers()]
            pipe = max(pipeline_at(ls, caps, layers, m) for ls in (lines, collectives) if ls)
            if pr.mixed:  # each stage at the least work of the modes it holds L layers in
                pipe = max(pipe, tabled_pipeline(stage_tables(pr, caps), layers // v, m))
            if not math.isfinite(pipe):
                return math.inf  # no split fits in memory
            pipe /= v
            t_sync = max(t_sync, pipe)
            top = max(1, min(pr.max_layers()[0], layers))
            drain = max(drain, min(_drain(pr, n) for n in range(1, top + 1)))
            drained = max(
                drained,
                drained_pipeline(
                    lines, caps, layers, pr.micro_batches, lambda n, pr=pr: _drain(pr, n), v
                ),
            )
            drain = max(drain, every_stage_drain(pr, caps))
            t_opt = max(t_opt, max(f.at(1) for f in pr.opt))
        times.append(max(t_sync + max(0.0, drain), drained) + sc.cross_s + t_opt)
    return aggregate(times, list(problem.probabilities), problem.objective, problem.alpha)


def exposed_at_least(pr, i: int) -> float:
    """ε_i: the least of stage i's exposed ZeRO-2/3 seconds per micro-batch over its layer counts,
    Σ_p min(P^p, K^p)/n ≥ Σ_p min(a^p, k^p)/(1 + e) (`TemplateBounds.weighted_lines`), P^p ≥ d +
    s·h."""
    s, units = pr.serial[i], 1 + pr.zero_units[i]
    out = 0.0
    for h, d, z in (
        (pr.host_fwd[i], pr.dev_fwd[i], pr.zero_fwd[i]),
        (pr.host_bwd[i], pr.dev_bwd[i], pr.zero_bwd[i]),
    ):
        compute = d.slope + s * h.slope + min(d.intercept + s * h.intercept, 0.0)
        out += max(0.0, min(compute, z.slope + min(z.intercept, 0.0)))
    return out / units


def every_stage_drain(pr, caps: list[int]) -> float:
    """E ≥ 0 with T ≥ T_sync + E: the least, over the splits within `caps`, of how long the last
    gradient all-reduce outlasts the pipeline (pricing.dp_finish).

    Stage i's last backward pass ends Σ_{k<i} c_k + s_i before T_sync (c_k = y^b_k(L_k) + s_k its
    backward pass and gradient send, s_k half its sends, s_0 = 0), so its all-reduce ends at
    T_sync + e_i(L_i) − Σ_{k<i} c_k(L_k), e_i(L) = D_i(L) − o_i·y^b_i(L) − s_i: `least_drain`.
    With per-stage recompute, e_i at its least and c_k at its most over the modes."""
    if pr.depth < 2:
        return 0.0
    sends = [0.0, *(0.5 * c for c in pr.p2p[1:])]
    own, chain = _stage_drain_tables(pr, caps)
    return least_drain(
        [e - s for e, s in zip(own, sends, strict=True)],
        [c + s for c, s in zip(chain, sends, strict=True)],
        pr.layers,
    )


def _stage_drain_tables(pr, caps: list[int]) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Per stage, at L = 1 … cap: D(L) − o·y^b(L) at its least over the modes, and y^b(L) at its
    most, priced by the evaluator's own accessors (SplitProblem.dp_s, hidden_s, pass_s) at every L
    at once."""
    own, chain, variants = [], [], pr.variants()
    for i in range(pr.depth):
        n = np.arange(1, caps[i] + 1, dtype=float)
        own.append(np.min([v.dp_s(i, n) - v.hidden_s(i, n) for v in variants], axis=0))
        chain.append(np.max([v.pass_s(i, n, "b") for v in variants], axis=0))
    return own, chain


def _drain(pr, n: int) -> float:
    """How long stage 0's gradient all-reduce outlasts the pipeline at n layers, D_0(n) −
    o_0·y^b_0(n), the backward pass as the evaluator prices it (SplitProblem.pass_s); with per-stage
    recompute the least over its modes (the longest pass)."""
    return min(pr.dp_s(0, n) - alt.hidden_s(0, n) for alt in pr.variants())

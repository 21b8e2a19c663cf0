"""A replay summed up: the entry of one scenario in `hetopt simulate --json` (iteration times,
tokens, link utilisation, GPU busy time, peak memory per stage)."""

from __future__ import annotations

from typing import Any

import numpy as np

from hetopt.cost.dollars import plan_cost
from hetopt.plan import Plan, row_labels
from hetopt.sim.engine import Simulation
from hetopt.sim.replay import SimResult
from hetopt.spec.cluster import island_vertex
from hetopt.spec.instance import Instance
from hetopt.spec.scenarios import BandwidthScenario


def stage_peaks(plan: Plan, peak_memory_gib: list[float]) -> list[float]:
    """Peak memory per stage (template after template) from the evaluator's per-row figures: a stage
    with shards has a row per GPU type, and its largest is the stage's."""
    peaks: dict[tuple[int, int], float] = {}
    for (j, i, _), peak in zip(row_labels(plan), peak_memory_gib, strict=True):
        peaks[(j, i)] = max(peaks.get((j, i), 0.0), peak)
    return list(peaks.values())


def link_utilization(inst: Instance, result: SimResult) -> dict[str, float]:
    """Each island link's busiest direction: bytes carried ÷ the capacity integral over the
    replay."""
    links = {}
    for lk in inst.spec.cluster.network.links:
        u, v = island_vertex(lk.a), island_vertex(lk.b)
        util = [
            result.link_bytes.get(e, 0.0) / result.link_capacity_integral[e]
            for e in ((u, v), (v, u))
            if result.link_capacity_integral.get(e)
        ]
        links[f"{lk.a}-{lk.b}"] = max(util, default=0.0)
    return links


def iteration_stats(times_s: list[float]) -> dict[str, float | None]:
    """Mean, p50, p90 and max of the iteration times (None each where no iteration was replayed)."""
    if not times_s:
        return {"mean": None, "p50": None, "p90": None, "max": None}
    times = np.array(times_s)
    return {
        "mean": float(times.mean()),
        "p50": float(np.percentile(times, 50)),
        "p90": float(np.percentile(times, 90)),
        "max": float(times.max()),
    }


def summarise(
    inst: Instance,
    sim: Simulation,
    scenario: BandwidthScenario,
    result: SimResult,
    peak_memory_gib: list[float],
    horizon_s: float | None = None,
) -> dict[str, Any]:
    """A scenario's entry of the simulate JSON (docs/cli-output.md); `tokens` counts the tokens
    within horizon_s (default: the replayed time), as the adaptive policy's replay counts them
    (`tokens_within`)."""
    times = np.array(result.iteration_times_s)
    total = result.end_s
    starts = np.concatenate([[0.0], np.cumsum(times)[:-1]])
    # none when priced, not replayed
    links = link_utilization(inst, result) if result.busy_s else {}
    busy = []
    # none when priced, not replayed
    for j, pipe in enumerate(sim.plan.pipelines if result.busy_s else []):
        for d in range(len(pipe.stages)):
            per_replica = [result.busy_s.get((j, r, d), 0.0) / total for r in range(pipe.replicas)]
            busy.append({"pipeline": j, "stage": d, "busy": float(np.mean(per_replica))})
    return {
        "name": scenario.name,
        "probability": scenario.probability,
        "iteration_time_s": iteration_stats(result.iteration_times_s),
        "iterations": len(times),
        "replayed_s": float(total),
        "tokens_per_s": inst.global_batch * inst.seq_len / float(times.mean()),
        "tokens": tokens_within(
            list(starts),
            list(times),
            inst.global_batch * inst.seq_len,
            total if horizon_s is None else horizon_s,
        ),
        "link_utilization": links,
        "gpu_busy": busy,
        "peak_memory_gib": stage_peaks(sim.plan, peak_memory_gib),
        # the replay's mean iteration weighs the transfers' dollars
        **plan_cost(inst, sim.plan, float(times.mean())).to_json(),
        "sampled": result.sampled,
        "cut": result.cut,
    }


def tokens_within(
    starts_s: list[float],
    times_s: list[float],
    tokens_per_iteration: float,
    horizon_s: float,
    resume_s: float = 0.0,
) -> float:
    """Tokens processed in [0, horizon_s]: each iteration's tokens times its share inside the
    window. A replay that ends before horizon_s (one iteration of a bandwidth that never changes, a
    replay cut short) goes on at its last iteration's rate from its end, or from resume_s where that
    is later (a switch's pause after the last iteration counts no tokens)."""
    total, end = 0.0, resume_s
    for start, t in zip(starts_s, times_s, strict=True):
        inside = min(start + t, horizon_s) - start
        if inside > 0:
            total += tokens_per_iteration * (inside / t if t > 0 else 1.0)
        end = max(end, start + t)
    if times_s and end < horizon_s and times_s[-1] > 0:
        total += tokens_per_iteration * (horizon_s - end) / times_s[-1]
    return total

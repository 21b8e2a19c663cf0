"""Planners built on homogeneous layouts (tp, pp, dp, micro-batch, recompute), as most systems plan.

- `megatron`: the best uniform layout over every GPU, chosen as Megatron-LM's user would on a
  cluster it
  takes to be homogeneous — every GPU the slowest one present (the least peak, then the least
  memory) — with layers split evenly. The chosen layout is then timed on the real cluster.
- `fastest-subset`: the best uniform layout on the GPUs of one type only, for the type that does
  best:
  heterogeneity avoided by leaving the other GPUs idle.
- `amp-like`: uniform layouts over every GPU, timed on the real cluster, each with a
  heterogeneity-aware
  layer split (AMP, Li et al. NeurIPS 2022): dynamic programming over the stages for the split that
  minimises the slowest stage, each stage costed on the slowest GPU type that serves it in any
  replica.
"""

from __future__ import annotations

import math

import numpy as np

from hetopt.baselines.common import (
    Candidates,
    PlannerResult,
    layout_plan,
    layout_plans,
    sub_instance,
)
from hetopt.cost.profiles import Profiles
from hetopt.evaluate import evaluate
from hetopt.plan import Plan
from hetopt.search.bounds.run import Bounds
from hetopt.search.types import SearchOptions
from hetopt.spec.instance import Instance


def megatron(
    inst: Instance, time_limit_s: float = 60.0, profiles: Profiles | None = None, seed: int = 0
) -> PlannerResult:
    profiles = profiles or Profiles()
    options = SearchOptions.from_instance(inst)
    slowest = min(inst.gpu_types.values(), key=lambda g: (g.peak_tflops, g.memory_gib))
    view = sub_instance(inst, as_gpu=slowest.name)
    cands = Candidates(inst, profiles, time_limit_s)
    ranked = []
    for layout, on_view in layout_plans(view, options, cands):
        ev = evaluate(view, on_view, profiles)
        if ev.fits:
            ranked.append((ev.iteration_time_s, layout))
    # the user's choice: the best layout on the homogeneous view that also fits the real GPUs
    for _, layout in sorted(ranked, key=lambda x: x[0]):
        plan = layout_plan(inst, layout)
        if plan is not None and math.isfinite(cands.offer(plan)):
            break
    return cands.result("megatron", f"the cluster seen as {inst.cluster.total_gpus}×{slowest.name}")


def fastest_subset(
    inst: Instance, time_limit_s: float = 60.0, profiles: Profiles | None = None, seed: int = 0
) -> PlannerResult:
    profiles = profiles or Profiles()
    options = SearchOptions.from_instance(inst)
    cands = Candidates(inst, profiles, time_limit_s)
    for gpu in sorted(inst.gpu_types):
        for _, plan in layout_plans(sub_instance(inst, gpu=gpu), options, cands):
            cands.offer(plan)
    best = cands.best  # no fitting plan: the common note ("no candidate plan fits in memory")
    return cands.result(
        "fastest-subset", f"only the {best.pipelines[0].stages[0].gpu} GPUs" if best else ""
    )


def amp_like(
    inst: Instance, time_limit_s: float = 60.0, profiles: Profiles | None = None, seed: int = 0
) -> PlannerResult:
    profiles = profiles or Profiles()
    options = SearchOptions.from_instance(inst)
    cands = Candidates(inst, profiles, time_limit_s)
    for _, plan in layout_plans(inst, options, cands):
        cands.offer(plan)  # the even split, and the DP split
        layers = min_max_split(inst, profiles, plan)
        if layers is not None:
            cands.offer(with_layers(plan, layers))
    return cands.result("amp-like")


def min_max_split(inst: Instance, profiles: Profiles, plan: Plan) -> list[int] | None:
    """The layer split (one for every replica, as a uniform layout has) minimising the slowest
    stage's compute time, by dynamic programming: best[i][n] = min over k of max(best[i−1][n−k],
    τ_i(k)), where τ_i(k) = max over the templates of stage i's time with k layers (a·k + c lines of
    the cost model)."""
    p = len(plan.pipelines[0].stages)
    n_layers = inst.model.layers
    if p > n_layers:
        return None

    tau = np.zeros((p, n_layers + 1))
    bounds = Bounds(inst, profiles)
    for i in range(p):
        for pipe in plan.pipelines:
            st = pipe.stages[i]
            a, c = bounds.templates.stage_line(
                st.gpu, st.tp, plan.micro_batch, st.recompute, i == 0, i == p - 1, st.cp
            )
            tau[i] = np.maximum(tau[i], a * np.arange(n_layers + 1) + c)
    best = np.full(n_layers + 1, np.inf)
    best[0] = 0.0
    choice = np.zeros((p, n_layers + 1), dtype=int)
    for i in range(p):  # best over the first i + 1 stages holding n layers, vectorised over n
        new = np.full(n_layers + 1, np.inf)
        for k in range(1, n_layers + 1):
            value = np.full(n_layers + 1, np.inf)
            value[k:] = np.maximum(best[: n_layers + 1 - k], tau[i, k])
            better = value < new
            new[better], choice[i, better] = value[better], k
        best = new
    layers, n = [], n_layers
    for i in range(p - 1, -1, -1):
        layers.append(int(choice[i, n]))
        n -= layers[-1]
    return layers[::-1]


def with_layers(plan: Plan, layers: list[int]) -> Plan:
    pipelines = [
        pipe.model_copy(
            update={
                "stages": [
                    st.model_copy(update={"layers": n})
                    for st, n in zip(pipe.stages, layers, strict=True)
                ]
            }
        )
        for pipe in plan.pipelines
    ]
    return plan.model_copy(update={"pipelines": pipelines})

"""Scenario-robust objectives (DESIGN 4): every bandwidth scenario is a copy of the communication terms.

For planning, scenario s gives each island link its time-averaged bandwidth over the planning horizon
(the first `horizon_s` seconds of its trace); the iteration time under s is the evaluator's with those
bandwidths. Objectives over the scenario times T_s with probabilities p_s:
- stable:   T under the nominal bandwidths of the instance's links;
- expected: Σ_s p_s·T_s;
- worst:    max_s T_s;
- cvar:     the mean of the worst (1 − α) tail, CVaR_α = min_η η + Σ_s p_s·max(0, T_s − η)/(1 − α)
            (Rockafellar & Uryasev 2000), α = CVAR_ALPHA.
"""

from __future__ import annotations

from dataclasses import dataclass

from hetopt.sim.scenarios import scenarios_of
from hetopt.spec.cluster import Cluster
from hetopt.spec.instance import Instance

OBJECTIVES = ("stable", "expected", "worst", "cvar")
CVAR_ALPHA = 0.8
DEFAULT_HORIZON_S = 60.0


@dataclass(frozen=True)
class PlanningScenario:
    name: str
    probability: float
    cluster: Cluster


def planning_scenarios(inst: Instance, objective: str, horizon_s: float = DEFAULT_HORIZON_S) -> list[PlanningScenario]:
    if objective == "stable":
        return [PlanningScenario("stable", 1.0, inst.cluster)]
    nominal = {_key(lk.a, lk.b): lk.gbps for lk in inst.spec.cluster.network.links}
    out = []
    for sc in scenarios_of(inst, horizon_s):
        out.append(PlanningScenario(sc.name, sc.probability,
                                    inst.cluster.with_link_gbps(_time_average(sc.changes, nominal, horizon_s))))
    return out


def _key(a: str, b: str) -> tuple[str, str]:
    return (a, b) if a <= b else (b, a)


def _time_average(changes, nominal: dict, horizon_s: float) -> dict[tuple[str, str], float]:
    averages = {}
    for link, gbps in nominal.items():
        steps = sorted((t, g) for t, lk, g in changes if lk == link and t < horizon_s)
        t_prev, level, area = 0.0, gbps, 0.0
        for t, g in steps:
            area += level * (t - t_prev)
            t_prev, level = t, g
        area += level * (horizon_s - t_prev)
        averages[link] = area / horizon_s
    return averages


def aggregate(times: list[float], probabilities: list[float], objective: str, alpha: float = CVAR_ALPHA) -> float:
    if objective == "stable":
        return times[0]
    if objective == "expected":
        return sum(p * t for p, t in zip(probabilities, times, strict=True))
    if objective == "worst":
        return max(times)
    # CVaR: the minimising η is one of the scenario times (the objective is piecewise linear in η)
    return min(eta + sum(p * max(0.0, t - eta) for p, t in zip(probabilities, times, strict=True)) / (1 - alpha)
               for eta in times)

"""Scenario-robust objectives (docs/planner.md): every bandwidth scenario is a copy of the
communication terms.

Each planning scenario s is the cluster with every island link ℓ at one bandwidth b_ℓ,s, read off
the scenario's trace bw_ℓ,s(t) over the horizon H (`search.horizon_s`, default 60 s: the window
`hetopt simulate` replays by default, hetopt.spec.scenarios.horizon_of). The iteration time under s
is the evaluator's with those bandwidths. Which bandwidth depends on what the objective promises.

Transfer-time mean (expected, cvar). A transfer of B bytes on ℓ at time t takes B / bw(t). Averaged
over transfers spread evenly over the horizon it takes B·(1/H)∫₀ᴴ dt / bw(t): the transfer-time
equivalent bandwidth is the time-weighted harmonic mean

    b̄_ℓ,s = H / ∫₀ᴴ dt / bw_ℓ,s(t) = H / Σ_k d_k / g_k

where the trace holds g_k for d_k seconds, Σ_k d_k = H. A link at 400 Gbit/s half the time and 50
the other half gives 2 / (1/400 + 1/50) = 88.9 Gbit/s, where the time average of the bandwidth (225)
under-prices its transfers 2.5×: the slow half dominates the time.

Communication terms are linear in 1/b: where the iteration time is too, the time at b̄ is the time
average of the iteration times. b̄ prices the mean transfer, but it is not a bound on the mean
iteration either way: a transfer longer than a phase averages the bandwidth itself (towards the
arithmetic mean), and where the iteration time is convex in 1/b (communication hidden behind compute
until it is not) the mean iteration time lies above the time at b̄ (Jensen). How far the two lie
apart on the bundled dynamic instances: docs/benchmarks.md, scenario objectives.

Lowest bandwidth (worst). The slowest iteration of a replay is one that meets the low phase of a
link; when the phase outlasts an iteration (a 30 s congestion, a 5 s dwell beside 3 s iterations),
every transfer of that iteration runs at it. So worst prices each link at the lowest bandwidth it
holds at any time in [0, H], counting the level in force at H (the replay's last iteration starts
before H and runs into it):

    b_ℓ,s^min = min { bw_ℓ,s(t) : 0 ≤ t ≤ H }.

No transfer in the horizon runs slower, so, the cost model's time decreasing in every bandwidth, the
priced time bounds every replayed iteration (up to the contention of several flows on one link,
which the analytic model does not see: the simulator is at most a few per cent slower at constant
bandwidth). The rule needs no iteration time, which the plan being searched for would decide. Its
price is pessimism where a link flaps much faster than an iteration: such iterations average the
levels out and run nearer the transfer-time mean than the lowest level.

Objectives over the scenario times T_s with probabilities p_s:
- stable:   T under the nominal bandwidths of the instance's links;
- expected: Σ_s p_s·T_s, each T_s at the transfer-time means;
- worst:    max_s T_s, each T_s at the lowest bandwidths: the slowest iteration of any scenario;
- cvar:     the mean of the worst (1 − α) tail of the scenarios' mean iteration times (at the
            transfer-time means, as expected), CVaR_α = min_η η + Σ_s p_s·max(0, T_s − η)/(1 − α)
            (Rockafellar & Uryasev 2000), α = CVAR_ALPHA.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from hetopt.cost.profiles import Profiles
from hetopt.errors import InputError, Problem
from hetopt.evaluate import evaluate
from hetopt.placement import place
from hetopt.spec.instance import Instance
from hetopt.spec.scenarios import (
    DEFAULT_HORIZON_S,
    BandwidthScenario,
    Change,
    outages,
)

OBJECTIVES = ("stable", "expected", "worst", "cvar")
CVAR_ALPHA = 0.8
__all__ = [
    "CVAR_ALPHA",
    "DEFAULT_HORIZON_S",
    "OBJECTIVES",
    "PlanningScenario",
    "aggregate",
    "link_gbps",
    "lowest_gbps",
    "planning_scenarios",
    "pricing",
    "transfer_time_gbps",
]

Link = tuple[str, str]
"""An island pair, the two names in sorted order (as scenario changes name them)."""


@dataclass(frozen=True)
class PlanningScenario:
    """A bandwidth scenario as the planner prices it: its instance's network carries one bandwidth
    per link (Instance.on_network)."""

    name: str
    probability: float
    instance: Instance


def pricing(objective: str) -> str:
    """How an objective prices each link (module docstring): "nominal" (stable), "lowest" (worst) or
    "transfer-time mean" (expected, cvar). Objectives alike price the same planning scenarios."""
    return {"stable": "nominal", "worst": "lowest"}.get(objective, "transfer-time mean")


def planning_scenarios(
    inst: Instance, objective: str, horizon_s: float | None = None
) -> list[PlanningScenario]:
    """The clusters the objective prices, one per bandwidth scenario.

    Parameters:
        inst: the instance (its links' nominal bandwidths and its scenarios).
        objective: one of OBJECTIVES; stable gives the one nominal cluster, worst the lowest
            bandwidths, expected and cvar the transfer-time means (module docstring).
        horizon_s: the horizon H in seconds; default the instance's (`search.horizon_s`, else
            60 s), the window the simulator replays.
    Returns: one PlanningScenario per scenario of the instance, in the instance's order.
    """
    if pricing(objective) == "nominal":
        return [PlanningScenario("stable", 1.0, inst)]
    horizon = inst.horizon_s if horizon_s is None else horizon_s
    nominal = inst.nominal_gbps
    scenarios = inst.scenarios(horizon)
    check_no_outage(scenarios, objective)
    return [
        PlanningScenario(
            sc.name,
            sc.probability,
            inst.on_network(link_gbps(sc.changes, nominal, horizon, objective)),
        )
        for sc in scenarios
    ]


def check_no_outage(scenarios: list[BandwidthScenario], objective: str) -> None:
    """Refuse an objective that would price an outage: at 0 Gbit/s a link's transfers wait for it to
    come back, a delay that no one bandwidth per link expresses (the transfer-time mean and the
    lowest level are both 0, every plan across the link infinitely slow). The simulator replays
    outages as they are.

    Raises: InputError naming the scenario, the link and the time, with what to do instead."""
    for sc in scenarios:  # also past H: the last replayed iteration runs into what follows it
        for link, start, _ in outages(list(sc.changes)):
            raise InputError(
                "--objective",
                [
                    Problem(
                        "--objective",
                        f"scenario '{sc.name}' takes link {link[0]}-{link[1]} down (0 Gbit/s) "
                        f"at {start:g} s: the {objective} objective prices each link at one "
                        "bandwidth and cannot price waiting out an outage; plan with --objective "
                        "stable, or give the outage the lowest rate the link keeps, and replay the "
                        "plan with `hetopt simulate`, which models the outage",
                        objective,
                        True,
                    )
                ],
            )


def link_gbps(
    changes: Iterable[Change], nominal: dict[Link, float], horizon_s: float, objective: str
) -> dict[Link, float]:
    """The bandwidth each link is priced at under one scenario.

    Parameters:
        changes: the scenario's (time s, link, Gbit/s) changes; a link starts at its nominal
            bandwidth.
        nominal: the instance's links and their nominal Gbit/s.
        horizon_s: the horizon H in seconds (> 0).
        objective: worst prices the lowest bandwidth in [0, H]; any other the transfer-time mean.
    Returns: Gbit/s per link of `nominal`.
    """
    rule = lowest_gbps if pricing(objective) == "lowest" else transfer_time_gbps
    changes = list(changes)
    return {link: rule(_holds(changes, link, gbps, horizon_s)) for link, gbps in nominal.items()}


def transfer_time_gbps(holds: list[tuple[float, float]]) -> float:
    """The transfer-time equivalent bandwidth H / Σ_k d_k / g_k of a trace.

    Parameters: holds, (seconds d_k, Gbit/s g_k) pieces of the trace covering the horizon.
    Returns: Gbit/s at which a transfer takes its time-averaged time over the horizon.
    """
    total_s = sum(d for d, _ in holds)
    return total_s / sum(d / g for d, g in holds)


def lowest_gbps(holds: list[tuple[float, float]]) -> float:
    """The lowest bandwidth a trace holds in the horizon.

    Parameters: holds, (seconds, Gbit/s) pieces of the trace (`_holds` drops a level replaced at
        the instant it began, and ends with the level in force at H).
    Returns: Gbit/s.
    """
    return min(g for _, g in holds)


def _holds(
    changes: list[Change], link: Link, start_gbps: float, horizon_s: float
) -> list[tuple[float, float]]:
    """The link's trace over [0, H] as (seconds held, Gbit/s) pieces, in time order.

    Changes at the same instant apply in their order, as the simulator applies them: only the last
    one holds. The level in force at H closes the list with a zero duration (no weight in the mean).
    """
    pieces, t_prev, level = [], 0.0, start_gbps
    for t, _, gbps in sorted((c for c in changes if c[1] == link), key=lambda c: c[0]):
        if t > horizon_s:
            break
        if t > t_prev:
            pieces.append((t - t_prev, level))
        t_prev, level = t, gbps
    if horizon_s > t_prev:
        pieces.append((horizon_s - t_prev, level))
    else:
        # the level that starts at H: the last replayed iteration runs under it
        pieces.append((0.0, level))
    return pieces


def aggregate(
    times: list[float], probabilities: list[float], objective: str, alpha: float = CVAR_ALPHA
) -> float:
    """The objective's value from the scenario times (module docstring).

    Parameters:
        times: T_s per planning scenario, seconds.
        probabilities: p_s per scenario (sum 1).
        objective: one of OBJECTIVES.
        alpha: the CVaR level.
    Returns: seconds.
    """
    if objective == "stable":
        return times[0]
    if objective == "expected":
        return sum(p * t for p, t in zip(probabilities, times, strict=True))
    if objective == "worst":
        return max(times)
    # CVaR: the minimising η is one of the scenario times (the objective is piecewise linear in η)
    return min(
        eta
        + sum(p * max(0.0, t - eta) for p, t in zip(probabilities, times, strict=True))
        / (1 - alpha)
        for eta in times
    )


def plan_objective(inst: Instance, plan, profiles: Profiles, scenarios, objective: str) -> float:
    """A plan's objective, seconds: the evaluator's iteration time in each planning scenario,
    aggregated as the objective says (stable, expected, worst or cvar; hetopt.search.robust)."""
    # one placement, on the file's network, priced on each scenario's
    plan = place(plan, inst.cluster)
    times = [evaluate(sc.instance, plan, profiles).iteration_time_s for sc in scenarios]
    return aggregate(times, [sc.probability for sc in scenarios], objective, CVAR_ALPHA)

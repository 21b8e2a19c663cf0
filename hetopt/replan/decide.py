"""`hetopt replan`: the best plan under a changed network, and whether switching to it pays (issue
15).

The network changes — a scenario's bandwidths at a moment, or links set by hand — and the plan
running now is priced on it. The neighbourhood is searched first: the running plan's own templates
(its skeleton) with every layer split, solved exactly under the new bandwidths, in each placement
order. With `full`, the whole space follows (`solve_exact`). The best plan found is priced against
the running one with the migration (hetopt.replan.migration) and a restart overhead.

Switching pays when, over the dwell D of the new bandwidth, the new plan does more iterations after
paying the switch M (migration + restart) than the old one does in all of D: (D − M) / t_new > D /
t_old, i.e. D > M / (1 − t_new / t_old) — the break-even time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from hetopt.cost.profiles import Profiles
from hetopt.errors import InfeasibleError, InputError, Problem, did_you_mean
from hetopt.evaluate import evaluate
from hetopt.placement import ORDERS, place
from hetopt.plan import Plan, plan_json
from hetopt.planners import solve_ilp
from hetopt.replan.migration import Migration, migration
from hetopt.search.dispatch import solve_skeleton
from hetopt.search.formulation import SolveOptions, clock
from hetopt.search.leaves import plan_problem
from hetopt.search.robust import PlanningScenario
from hetopt.search.types import SearchRequest, Seed, Skeleton, Template, segments_of
from hetopt.spec.instance import Instance
from hetopt.spec.scenarios import levels_at
from hetopt.verify import check_plan


@dataclass
class Replan:
    """The answer: switch or stay, the plans' times under the new network, what the switch costs."""

    decision: str
    """switch or stay."""
    current_s: float
    """The running plan's iteration time under the new network."""
    new_s: float
    plan: Plan
    """The best plan found, to switch to where `decision` says so (the running one when nothing
    beats it)."""
    found_by: str
    """running (nothing beat it), neighbourhood (its templates, re-split) or search (the whole
    space)."""
    migration: Migration
    restart_s: float
    dwell_s: float
    """Seconds the new bandwidth is expected to last."""
    break_even_s: float
    """Seconds of the new bandwidth after which the switch has paid for itself (inf: never)."""
    network: dict = field(default_factory=dict)
    """The island links' Gbit/s the answer priced."""

    def to_json(self) -> dict:
        def finite(x: float) -> float | None:
            return x if math.isfinite(x) else None

        return {
            "decision": self.decision,
            "current_s": self.current_s,
            "new_s": self.new_s,
            "found_by": self.found_by,
            "migration_s": self.migration.time_s,
            "migration_bytes": self.migration.total_bytes,
            "restart_s": self.restart_s,
            "dwell_s": self.dwell_s,
            "break_even_s": finite(self.break_even_s),
            "network_gbps": {f"{a}-{b}": g for (a, b), g in self.network.items()},
            "plan": plan_json(self.plan),
        }


def network_at(
    inst: Instance,
    scenario: str | None = None,
    at_s: float | None = None,
    bandwidth: dict[tuple[str, str], float] | None = None,
) -> tuple[dict, float | None]:
    """The island links' Gbit/s after the change, and how long it lasts where a scenario says.

    Parameters: scenario, at_s — a scenario of the instance and a moment in it (every link at its
    level then); bandwidth — links set by hand, (island a, island b) → Gbit/s.
    Returns: ({(a, b): Gbit/s} for every link, seconds until the scenario's next change or None).
    Raises: InputError (exit 2) for an unknown scenario or link, a negative time or bandwidth."""
    nominal = inst.nominal_gbps
    if (scenario is None) == (bandwidth is None):
        raise InputError(
            "replan", [Problem("options", "give --scenario NAME --at T, or --bandwidth A-B=GBPS")]
        )
    if bandwidth is not None:
        for (a, b), gbps in bandwidth.items():
            key = tuple(sorted((a, b)))
            if key not in nominal:
                raise InputError(
                    "--bandwidth",
                    [
                        Problem(
                            "--bandwidth",
                            f"no link between islands {a} and {b}; "
                            "links: " + ", ".join(f"{x}-{y}" for x, y in nominal),
                            f"{a}-{b}={gbps:g}",
                            True,
                        )
                    ],
                )
            if not gbps > 0:
                raise InputError(
                    "--bandwidth",
                    [
                        Problem(
                            "--bandwidth",
                            "give a bandwidth above 0 Gbit/s",
                            f"{a}-{b}={gbps:g}",
                            True,
                        )
                    ],
                )
        return {**nominal, **{tuple(sorted(k)): g for k, g in bandwidth.items()}}, None
    if at_s is None or not at_s >= 0:
        raise InputError(
            "--at", [Problem("--at", "give the moment of the scenario, seconds ≥ 0", at_s, True)]
        )
    horizon = inst.horizon_s
    if not at_s < horizon:  # the scenarios are laid out up to the horizon, not after it
        raise InputError(
            "--at",
            [
                Problem(
                    "--at",
                    f"is past the instance's horizon of {horizon:g} s (search.horizon_s), where "
                    f"its scenarios end: give a moment from 0 to below {horizon:g} s, or raise "
                    "search.horizon_s",
                    at_s,
                    True,
                )
            ],
        )
    found = {sc.name: sc for sc in inst.scenarios(horizon)}
    if scenario not in found:
        raise InputError(
            "--scenario",
            [
                Problem(
                    "--scenario",
                    f"unknown scenario{did_you_mean(scenario, found)}; "
                    "scenarios: " + ", ".join(found),
                    scenario,
                    True,
                )
            ],
        )
    levels = levels_at(nominal, found[scenario].changes, at_s)
    later = [t for t, _, _ in found[scenario].changes if t > at_s]
    if any(g <= 0 for g in levels.values()):
        raise InputError(
            "--at",
            [
                Problem(
                    "--at",
                    f"a link of scenario {scenario} is down at {at_s:g} s: no plan runs across "
                    "it; pick a moment it is up",
                    at_s,
                    True,
                )
            ],
        )
    return levels, (min(later) - at_s if later else horizon - at_s)


def skeleton_of(plan: Plan, order: str) -> Skeleton | None:
    """The skeleton a plan is a split of: each template's runs of one class and TP as segments
    (`space.segments_of`); None where the plan has no such skeleton (stages with shards, a recompute
    mode or a CP degree per stage)."""
    stages = [st for pipe in plan.pipelines for st in pipe.stages]
    if (
        any(st.shards for st in stages)
        or len({st.recompute for st in stages}) > 1
        or len({st.cp for st in stages}) > 1
    ):
        return None
    templates = tuple(
        Template(segments_of(pipe), pipe.replicas, pipe.micro_batches) for pipe in plan.pipelines
    )
    return Skeleton(
        plan.micro_batch, stages[0].recompute, templates, order, plan.virtual_stages, plan.zero
    )


def neighbourhood(
    inst: Instance, plan: Plan, profiles: Profiles, time_limit_s: float, backend: str = "highs"
) -> tuple[Plan, float] | None:
    """The best re-split of the running plan's templates on `inst`'s (changed) cluster, in each
    placement order: (plan, iteration time), or None where the plan has no skeleton or none can be
    placed."""
    best = None
    for order in ORDERS:
        sk = skeleton_of(plan, order)
        if sk is None:
            return None
        try:
            problem = plan_problem(
                inst, sk, profiles, [PlanningScenario("now", 1.0, inst)], "stable"
            )
        except InfeasibleError:
            continue
        hint = tuple(st.layers for pipe in plan.pipelines for st in pipe.stages)
        sol = solve_skeleton(
            problem, None, backend, SolveOptions(time_limit_s=time_limit_s, hint=hint)
        )
        if sol.layers is None:
            continue
        t = problem.iteration_time(sol.layers)
        if best is None or t < best[1]:
            best = (sk.placed(sol.layers, inst.cluster), t)
    return best


def best_under(
    changed: Instance,
    running: Plan,
    profiles: Profiles,
    full: bool,
    time_limit_s: float,
    workers: int | None = None,
) -> tuple[float, Plan, float, str]:
    """The running plan's time on `changed` (the instance on the changed network) and the best plan
    found there: the neighbourhood, then with `full` the whole space, both within time_limit_s
    together.

    Returns: (running plan's s, best plan, its s, found_by: running, neighbourhood or search)."""
    start = clock()
    current_s = evaluate(changed, running, profiles).iteration_time_s
    best, found_by = (running, current_s), "running"
    near = neighbourhood(changed, running, profiles, time_limit_s)
    if near is not None and near[1] < best[1] * (1 - 1e-9):
        best, found_by = near, "neighbourhood"
    left_s = time_limit_s - (clock() - start)
    if full and left_s > 0:
        known = Seed(f"running plan ({found_by})", best[1], best[0])
        request = SearchRequest(changed, time_limit_s=left_s, profiles=profiles, workers=workers)
        searched = solve_ilp(request, known=[known])
        if searched.plan is not None and searched.objective_s < best[1] * (1 - 1e-9):
            best, found_by = (place(searched.plan, changed.cluster), searched.objective_s), "search"
    return current_s, best[0], best[1], found_by


def decide(current_s: float, new_s: float, cost_s: float, dwell_s: float) -> tuple[str, float]:
    """Switch or stay (module docstring): switch iff the dwell exceeds the break-even M / (1 −
    t_new/t_old).

    Parameters: current_s, new_s — the two plans' iteration times on the changed network; cost_s —
    the switch's M (migration + restart); dwell_s — how long the new bandwidth is expected to last.
    Returns: ("switch" or "stay", the break-even seconds, inf where the new plan is no faster)."""
    saving = 1 - new_s / current_s
    break_even = cost_s / saving if saving > 0 else math.inf
    return ("switch" if saving > 0 and dwell_s > break_even else "stay"), break_even


def replan(
    inst: Instance,
    current: Plan,
    *,
    scenario: str | None = None,
    at_s: float | None = None,
    bandwidth: dict[tuple[str, str], float] | None = None,
    dwell_s: float | None = None,
    restart_s: float | None = None,
    full: bool = False,
    time_limit_s: float = 10.0,
    profiles: Profiles | None = None,
    source: str = "plan",
    workers: int | None = None,
) -> Replan:
    """The best plan under the changed network and whether to switch to it.

    Parameters: inst — the instance the running plan is for; current — the running plan; scenario,
    at_s or bandwidth — the change (`network_at`); dwell_s — how long the new bandwidth lasts
    (default: the instance's `replan.dwell_s`, else until the scenario's next change, else the
    instance's horizon);
    restart_s — seconds a restart costs beside the migration (default the instance's
    `replan.restart_s`);
    full — also search the whole space after the neighbourhood; time_limit_s — for the two together;
    profiles — calibration; source — the plan's file, for messages; workers — processes of the full
    search (default: as `solve_exact` starts them).
    Returns: the Replan. Raises: InputError (exit 2) for a plan of another instance, an unknown link
    or scenario, a negative bandwidth, time or dwell."""
    problems = check_plan(inst, current)
    if problems:
        raise InputError(source, [Problem(path, message) for path, message in problems])
    if dwell_s is not None and not (math.isfinite(dwell_s) and dwell_s > 0):
        raise InputError(
            "--dwell",
            [
                Problem(
                    "--dwell",
                    "give the finite seconds the new bandwidth lasts, above 0",
                    dwell_s,
                    True,
                )
            ],
        )
    restart_s = inst.spec.replan.restart_s if restart_s is None else restart_s
    if not (math.isfinite(restart_s) and restart_s >= 0):
        raise InputError(
            "--restart",
            [Problem("--restart", "give the restart's finite seconds, 0 or more", restart_s, True)],
        )
    profiles = profiles or Profiles()
    levels, lasts = network_at(inst, scenario, at_s, bandwidth)
    changed = inst.on_network(levels)
    running = place(current, inst.cluster)
    current_s, plan, new_s, found_by = best_under(
        changed, running, profiles, full, time_limit_s, workers
    )
    moved = migration(changed, running, plan, profiles)
    dwell = next(
        d for d in (dwell_s, inst.spec.replan.dwell_s, lasts, inst.horizon_s) if d is not None
    )
    decision, break_even = decide(current_s, new_s, moved.time_s + restart_s, dwell)
    return Replan(
        decision, current_s, new_s, plan, found_by, moved, restart_s, dwell, break_even, levels
    )


def parse_bandwidth(inst: Instance, given: list[str]) -> dict[tuple[str, str], float]:
    """--bandwidth values, each ISLAND-ISLAND=GBPS (island names may hold '-': the cut that names
    two islands is taken); a link is undirected, so a-b and b-a are one link, given once. Raises:
    InputError (exit 2) naming the value and the islands, the number, or the link given twice."""
    islands = {n.island for n in inst.cluster.nodes.values()}
    out: dict[tuple[str, str], float] = {}
    given_as: dict[frozenset, str] = {}

    def bad(text: str, message: str) -> InputError:
        return InputError("--bandwidth", [Problem("--bandwidth", message, text, True)])

    for text in given:
        link, _, value = text.partition("=")
        cuts = [(link[:i], link[i + 1 :]) for i, ch in enumerate(link) if ch == "-"]
        pair = next(((a, b) for a, b in cuts if a in islands and b in islands), None)
        if pair is None:
            raise bad(
                text,
                "give ISLAND-ISLAND=GBPS with two islands of the cluster ("
                + ", ".join(sorted(islands))
                + ")",
            )
        try:
            gbps = float(value)
        except ValueError:
            gbps = math.nan
        if not math.isfinite(gbps):
            raise bad(text, f"the bandwidth '{value}' is not a finite number of Gbit/s, e.g. 25")
        key = frozenset(pair)
        if key in given_as:
            raise bad(
                text,
                f"the link {pair[0]}–{pair[1]} is also set by '{given_as[key]}': give each link "
                "once (a link carries one bandwidth both ways)",
            )
        given_as[key] = text
        out[pair] = gbps
    return out

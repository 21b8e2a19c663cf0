"""The adaptive policy (issue 15): a replay that re-plans when the bandwidth changes.

The replay starts with the given plan at t = 0 and runs iterations back to back under the scenario,
as `hetopt simulate` does (hetopt.sim.engine). A change of the network at t_c is seen at t_c + the
detection delay; between iterations (the one running then ends first), the policy asks about the
network as last seen (every link at its level after the latest change seen) what `hetopt replan`
answers: the running plan's time, the best plan found (the neighbourhood; with `search: full` the
whole space too) and the migration (hetopt.replan.best_under, hetopt.replan.migration). With the
expected dwell D of that network it switches iff D exceeds the break-even time
(hetopt.replan.decide). A switch stops training for M = migration + restart seconds; then the new
plan runs. A network it has already judged is not asked about again unless the level outlasts the
dwell expected of it (below), nor one with a link down (no plan runs across it). Nothing is searched
where the restart alone outlasts the dwell (no plan can pay back).

Tokens count over the horizon H (`search.horizon_s`): each iteration its tokens times the share of
it inside [0, H]; a switch's M counts none (`tokens_within`). So D is taken as at most the rest of
the horizon: a switch never pays after it.

The expected dwell reads nothing of the scenario's future: `replan.dwell_s` where the instance gives
it; else a Markov scenario's mean_dwell_s (its dwells are exponential, so the expected rest of a
dwell is the mean whatever has passed) or a diurnal one's step_s; else, from the changes seen so
far, the mean time between them or the time the level has already lasted, whichever is longer (a
level that has lasted T is expected to last about T more: a decision to stay is asked again once the
level has lasted its break-even time, the estimate having grown past it); else the rest of the
horizon (a first change is taken to last).

`adapt=False` replays the plan throughout by the same segments: the static policy, its tokens
counted alike.
"""

from __future__ import annotations

import itertools
import json
import math
import time
from collections import Counter
from dataclasses import dataclass, field, replace

import numpy as np

from hetopt.cost.dollars import PlanCost, plan_cost, time_weighted
from hetopt.cost.profiles import Profiles
from hetopt.errors import InputError, Problem, did_you_mean
from hetopt.evaluate import evaluate
from hetopt.placement import place
from hetopt.plan import Plan, plan_json
from hetopt.replan.decide import best_under, decide
from hetopt.replan.migration import Migration, migration
from hetopt.sim.engine import Simulation
from hetopt.sim.replay import Record, SimResult
from hetopt.sim.summary import iteration_stats, link_utilization, stage_peaks, tokens_within
from hetopt.spec.instance import Instance
from hetopt.spec.scenarios import BandwidthScenario, Change, levels_at

POLICIES = ("static", "replan")
Levels = tuple[tuple[tuple[str, str], float], ...]
"""Every island link's Gbit/s, sorted by link: a network as a dictionary key."""


def check_policy(policy: str) -> str:
    """The policy's name. Raises: InputError (exit 2) for a name not in POLICIES."""
    if policy not in POLICIES:
        raise InputError(
            "--policy",
            [
                Problem(
                    "--policy",
                    f"unknown policy{did_you_mean(policy, POLICIES)}; give {' or '.join(POLICIES)}",
                    policy,
                    True,
                )
            ],
        )
    return policy


@dataclass(frozen=True)
class PolicyOptions:
    """The policy's settings (the instance's `replan:` section, or options given beside it)."""

    detection_delay_s: float = 0.0
    restart_s: float = 0.0
    dwell_s: float | None = None
    full: bool = True
    time_limit_s: float = 10.0

    @classmethod
    def of(cls, inst: Instance, **given) -> PolicyOptions:
        """The instance's settings, each replaced by a value given that is not None."""
        r = inst.spec.replan
        base = cls(r.detection_delay_s, r.restart_s, r.dwell_s, r.search == "full", r.time_limit_s)
        return replace(base, **{k: v for k, v in given.items() if v is not None})


@dataclass(frozen=True)
class Switch:
    """One switch of plans during a replay."""

    at_s: float
    """When training stopped for it (the end of the iteration running when the change was seen)."""
    change_s: float
    """The change it answers."""
    network_gbps: dict[str, float]
    old_s: float
    """The running plan's iteration time on the changed network (the cost model's)."""
    new_s: float
    found_by: str
    migration: Migration
    restart_s: float
    dwell_s: float
    break_even_s: float
    plan: int
    """The index of the plan switched to, in the replay's `plans`."""

    @property
    def pause_s(self) -> float:
        return self.migration.time_s + self.restart_s

    def to_json(self) -> dict:
        return {
            "at_s": self.at_s,
            "change_s": self.change_s,
            "network_gbps": self.network_gbps,
            "old_s": self.old_s,
            "new_s": self.new_s,
            "found_by": self.found_by,
            "migration_s": self.migration.time_s,
            "migration_bytes": self.migration.total_bytes,
            "restart_s": self.restart_s,
            "dwell_s": self.dwell_s,
            "break_even_s": self.break_even_s,
            "plan": self.plan,
        }


@dataclass
class AdaptiveRun:
    """A replay under the adaptive policy."""

    iteration_times_s: list[float] = field(default_factory=list)
    starts_s: list[float] = field(default_factory=list)
    plan_of_iteration: list[int] = field(default_factory=list)
    plans: list[Plan] = field(default_factory=list)
    switches: list[Switch] = field(default_factory=list)
    declined: int = 0
    """Decisions that kept the running plan (a level asked about again counted again)."""
    log: list[tuple[float, dict, str]] = field(default_factory=list)
    """Every decision: (when, the network it judged, switch or stay)."""
    end_s: float = 0.0
    cut: str | None = None
    merged: SimResult | None = None
    """The segments' measurements (records, bytes and capacity per link, busy time) on one clock."""


class Decisions:
    """The searches of a replay (or several), kept: a network judged once for a running plan is not
    searched again (a flapping link brings the same levels back)."""

    def __init__(self, inst: Instance, profiles: Profiles, options: PolicyOptions) -> None:
        self.inst, self.profiles, self.options = inst, profiles, options
        self.known: dict[tuple[Levels, str], tuple[float, Plan, float, str, Migration]] = {}

    @staticmethod
    def _key(running: Plan, levels: dict[tuple[str, str], float]) -> tuple[Levels, str]:
        return tuple(sorted(levels.items())), json.dumps(plan_json(running), sort_keys=True)

    def answered(self, running: Plan, levels: dict[tuple[str, str], float]) -> bool:
        """Whether this network has been searched for this running plan (`ask` answers at once)."""
        return self._key(running, levels) in self.known

    def ask(
        self, running: Plan, levels: dict[tuple[str, str], float], time_limit_s: float | None = None
    ):
        """(running plan's s, best plan, its s, found_by, migration) on the network at `levels`, the
        searches within time_limit_s together (default the options')."""
        key = self._key(running, levels)
        if key not in self.known:
            changed = self.inst.on_network(levels)
            limit_s = self.options.time_limit_s if time_limit_s is None else time_limit_s
            current_s, plan, new_s, found_by = best_under(
                changed, running, self.profiles, self.options.full, limit_s, workers=1
            )
            moved = migration(changed, running, plan, self.profiles)
            self.known[key] = (current_s, plan, new_s, found_by, moved)
        return self.known[key]


def change_moments(
    nominal: dict[tuple[str, str], float], changes: tuple[Change, ...]
) -> list[float]:
    """The times the network differs from just before (every change at one instant applied)."""
    moments, levels = [], dict(nominal)
    for at in sorted({c[0] for c in changes}):
        after = levels_at(levels, tuple(c for c in changes if c[0] == at), at)
        if after != levels:
            moments.append(at)
        levels = after
    return moments


def shifted(scenario: BandwidthScenario, t0: float) -> BandwidthScenario:
    """The scenario seen from t0 on: the levels in force at t0 at time 0, later changes t0
    earlier."""
    level: dict = {}
    for at, link, gbps in scenario.changes:
        if at <= t0:
            level[link] = gbps
    later = tuple((at - t0, link, gbps) for at, link, gbps in scenario.changes if at > t0)
    return BandwidthScenario(
        scenario.name,
        scenario.probability,
        tuple((0.0, link, gbps) for link, gbps in level.items()) + later,
    )


def expected_dwell(
    inst: Instance,
    scenario: str,
    options: PolicyOptions,
    seen: list[float],
    now_s: float,
    horizon_s: float,
) -> tuple[float, bool]:
    """Seconds the network just seen is expected to last (module docstring), at most the rest of the
    horizon (only tokens inside it count); `seen` are the change moments seen so far.

    Returns: (seconds, whether the estimate grows as the level lasts — estimated from the changes
    seen, a level that has lasted T is expected to last about T more — so that a decision to stay is
    asked again once the level has lasted the break-even time)."""
    rest = max(horizon_s - now_s, 0.0)
    if options.dwell_s is not None:
        return min(options.dwell_s, rest), False
    declared = next((sc for sc in inst.spec.scenarios if sc.name == scenario), None)
    gen = declared.generator if declared is not None else None
    if gen is not None and gen.kind == "markov":  # memoryless: the same whatever has passed
        return min(gen.mean_dwell_s, rest), False
    if gen is not None and gen.kind == "diurnal":
        return min(gen.step_s, rest), False
    gaps = [b - a for a, b in itertools.pairwise(seen)]
    if gaps:
        return min(max(sum(gaps) / len(gaps), now_s - seen[-1]), rest), True
    return rest, False


def replay_adaptive(
    inst: Instance,
    plan: Plan,
    scenario: BandwidthScenario,
    horizon_s: float,
    options: PolicyOptions,
    profiles: Profiles | None = None,
    record: bool = False,
    deadline: float | None = None,
    decisions: Decisions | None = None,
    adapt: bool = True,
) -> AdaptiveRun:
    """Replay `plan` from t = 0 to the horizon under `scenario`, re-planning at each change seen.

    Parameters: inst — the instance; plan — the plan running at t = 0; scenario — the capacity trace
    (generated to at least the horizon); horizon_s — no iteration starts at or after it; options —
    the policy's settings; profiles — calibration; record — keep every operation (trace, plot);
    deadline — a `time.time()` after which no further segment or search starts (the run's `cut` says
    so; a change seen after it is not searched); decisions — searches kept from other replays of the
    same instance; adapt — False replays the plan throughout by the same segments (the static
    policy, counted alike: a sampled iteration is priced per bandwidth phase, not extrapolated over
    the horizon).
    Returns: the AdaptiveRun."""
    profiles = profiles or Profiles()
    replay = _Replay(inst, plan, scenario, horizon_s, options, profiles, adapt)
    replay.decisions = decisions or Decisions(inst, profiles, options)
    while replay.t < horizon_s:
        if replay.seen_now() or replay.t >= replay.recheck_s:
            replay.decide(deadline)  # between iterations: on the network as last seen
            continue
        # a deadline stops the replay, but not before the running plan has run once (the rest of
        # the horizon is counted at its rate)
        if replay.ran_current() and deadline is not None and time.time() >= deadline:
            replay.run.cut = "time limit"
            break
        replay.advance(record, deadline)
    return replay.finish()


class _Replay:
    """The state of one adaptive replay: the plans run so far, the running one, the clock, the
    changes seen, and when a decision to stay is asked again."""

    def __init__(
        self,
        inst: Instance,
        plan: Plan,
        scenario: BandwidthScenario,
        horizon_s: float,
        options: PolicyOptions,
        profiles: Profiles,
        adapt: bool,
    ) -> None:
        self.inst, self.scenario, self.horizon_s = inst, scenario, horizon_s
        self.options, self.profiles, self.adapt = options, profiles, adapt
        self.decisions: Decisions | None = None
        self.nominal = inst.nominal_gbps
        self.changes = tuple(
            sorted(
                ((at, tuple(sorted(link)), g) for at, link, g in scenario.changes),
                key=lambda c: c[0],
            )
        )
        self.moments = change_moments(self.nominal, self.changes)
        delay = options.detection_delay_s if adapt else 0.0
        self.detect = [m + delay for m in self.moments]
        self.run = AdaptiveRun(plans=[place(plan, inst.cluster)])
        self.sims: dict[int, Simulation] = {}
        self.merged = SimResult(
            [], {}, {}, {}, capacity_trace=_capacity_trace(self.nominal, self.changes, horizon_s)
        )
        self.judged = self.nominal  # the network the running plan was last judged on
        self.recheck_s = math.inf  # when a decision to stay is asked again (`expected_dwell`)
        self.current, self.t, self.k = 0, 0.0, 0

    def seen_now(self) -> bool:
        """Whether a change has been seen since the last decision."""
        return self.k < len(self.detect) and self.detect[self.k] <= self.t

    def ran_current(self) -> bool:
        """Whether the running plan has run an iteration since it started."""
        return bool(self.run.plan_of_iteration) and self.run.plan_of_iteration[-1] == self.current

    def decide(self, deadline: float | None) -> None:
        """Switch or stay on the network as last seen (`_decide`); a decision to stay whose
        expected dwell grows with the level's age is asked again once it passes the break-even."""
        due = self.t >= self.recheck_s
        while self.seen_now():
            self.k += 1
        k, moments = self.k, self.moments
        known = levels_at(self.nominal, self.changes, moments[k - 1]) if k else dict(self.nominal)
        if not (
            self.adapt and all(g > 0 for g in known.values()) and (known != self.judged or due)
        ):
            if due:  # a recheck that cannot be made now (a link down): at the next change seen
                self.recheck_s = self.detect[k] if k < len(self.detect) else math.inf
            return
        self.judged, self.recheck_s = known, math.inf
        dwell, grows = expected_dwell(
            self.inst, self.scenario.name, self.options, moments[:k], self.t, self.horizon_s
        )
        changed_s = moments[k - 1] if k else 0.0
        switch, break_even = _decide(
            self.run,
            self.decisions,
            self.current,
            known,
            dwell,
            self.t,
            changed_s,
            self.options,
            deadline,
        )
        if switch is not None:
            self.run.plans.append(switch[0])
            self.current = len(self.run.plans) - 1
            self.run.switches.append(switch[1])
            self.t += switch[1].pause_s
        elif grows and math.isfinite(break_even):
            # the estimate grows with the time the level has lasted: it passes the break-even then
            again_s = moments[k - 1] + break_even * (1 + 1e-6)
            self.recheck_s = again_s if self.t < again_s < self.horizon_s else math.inf

    def advance(self, record: bool, deadline: float | None) -> None:
        """Replay the running plan until the next change seen, recheck or the horizon."""
        next_seen = self.detect[self.k] if self.k < len(self.detect) else math.inf
        window_s = min(next_seen, self.recheck_s, self.horizon_s) - self.t
        sim = self.sims.get(self.current) or self.sims.setdefault(
            self.current, Simulation(self.inst, self.run.plans[self.current], self.profiles)
        )
        segment = _segment(sim, shifted(self.scenario, self.t), window_s, record, deadline)
        _merge(self.merged, segment, self.t, self.current)
        for dt in segment.iteration_times_s:
            self.run.starts_s.append(self.t)
            self.run.iteration_times_s.append(dt)
            self.run.plan_of_iteration.append(self.current)
            self.t += dt

    def finish(self) -> AdaptiveRun:
        run = self.run
        run.end_s = self.t
        self.merged.iteration_times_s, self.merged.end_s = list(run.iteration_times_s), self.t
        run.merged = self.merged
        return run


def _decide(
    run: AdaptiveRun,
    decisions: Decisions,
    current: int,
    known: dict,
    dwell_s: float,
    now_s: float,
    change_s: float,
    options: PolicyOptions,
    deadline: float | None,
) -> tuple[tuple[Plan, Switch] | None, float]:
    """Switch or stay at `now_s` on the network `known`: (the plan and Switch to switch to, or None
    — the decision counted as declined; the break-even seconds, inf where nothing was searched or
    nothing found beats the running plan). No plan can pay back a restart as long as the dwell, so
    then nothing is searched; nor once the deadline has passed (a network searched before is
    answered still)."""
    left_s = (
        options.time_limit_s
        if deadline is None
        else min(options.time_limit_s, deadline - time.time())
    )
    verdict, break_even = "stay", math.inf
    if options.restart_s < dwell_s and (
        left_s > 0 or decisions.answered(run.plans[current], known)
    ):
        old_s, best, new_s, found_by, moved = decisions.ask(run.plans[current], known, left_s)
        verdict, break_even = decide(old_s, new_s, moved.time_s + options.restart_s, dwell_s)
    run.log.append((now_s, dict(known), verdict))
    if verdict != "switch":
        run.declined += 1
        return None, break_even
    return (
        best,
        Switch(
            now_s,
            change_s,
            {f"{a}-{b}": g for (a, b), g in known.items()},
            old_s,
            new_s,
            found_by,
            moved,
            options.restart_s,
            dwell_s,
            break_even,
            len(run.plans),
        ),
    ), break_even


def _segment(
    sim: Simulation,
    scenario: BandwidthScenario,
    window_s: float,
    record: bool,
    deadline: float | None,
) -> SimResult:
    """The iterations that start within `window_s` of the segment's start (at least one). Where the
    bandwidth holds still over all of them and nothing is recorded, one iteration is replayed and
    repeated: a replay is deterministic, so iterations from the same state at the same bandwidths
    are alike."""
    if record:  # every iteration recorded: replayed whole
        return sim.run(scenario, 1, record=True, until_s=window_s, deadline=deadline)
    first = sim.run(scenario, 1, deadline=deadline)
    dt = first.iteration_times_s[0]
    n = max(1, math.ceil(window_s / dt)) if dt > 0 else 1
    if n == 1 or not any(0 < at < n * dt for at, _, _ in scenario.changes):
        first.iteration_times_s = [dt] * n
        first.busy_s = {d: b * n for d, b in first.busy_s.items()}
        first.link_bytes = {e: b * n for e, b in first.link_bytes.items()}
        first.link_capacity_integral = {e: c * n for e, c in first.link_capacity_integral.items()}
        first.end_s = n * dt
        return first
    if first.sampled is not None:  # one sampled iteration per call: the loop goes on from its end
        return first
    return sim.run(scenario, 1, until_s=window_s, deadline=deadline)


def _merge(into: SimResult, segment: SimResult, t0: float, plan: int) -> None:
    """A segment's measurements onto the replay's clock (busy time keyed by (plan, template,
    replica, stage))."""
    for e, b in segment.link_bytes.items():
        into.link_bytes[e] = into.link_bytes.get(e, 0.0) + b
    for e, c in segment.link_capacity_integral.items():
        into.link_capacity_integral[e] = into.link_capacity_integral.get(e, 0.0) + c
    for d, b in segment.busy_s.items():
        into.busy_s[(plan, *d)] = into.busy_s.get((plan, *d), 0.0) + b
    into.records += [
        Record(r.kind, r.name, r.start_s + t0, r.end_s + t0, r.device, r.link, plan)
        for r in segment.records
    ]
    if segment.sampled is not None and into.sampled is None:
        into.sampled = segment.sampled
    if segment.cut is not None and segment.cut != "sampled":
        into.cut = segment.cut


def _capacity_trace(
    nominal: dict[tuple[str, str], float], changes: tuple[Change, ...], until_s: float
) -> dict[tuple[str, str], list[tuple[float, float]]]:
    """Each link's (time, Gbit/s) steps from 0 to until_s, as a replay records them."""
    trace = {link: [(0.0, g)] for link, g in nominal.items()}
    for at, link, gbps in changes:
        if at <= until_s:
            trace.setdefault(link, []).append((at, gbps))
    return trace


def run_tokens(inst: Instance, run: AdaptiveRun, horizon_s: float) -> float:
    """The replay's tokens over the horizon (`tokens_within`, the last pause counted as none)."""
    return tokens_within(
        run.starts_s, run.iteration_times_s, inst.global_batch * inst.seq_len, horizon_s, run.end_s
    )


def run_cost(inst: Instance, run: AdaptiveRun, tokens_per_s: float) -> PlanCost:
    """The dollars of an adaptive run: each plan it ran at its mean iteration, weighted by the
    seconds it ran (hetopt.cost.dollars.time_weighted)."""
    ran_s, count = [0.0] * len(run.plans), Counter(run.plan_of_iteration)
    for k, dt in zip(run.plan_of_iteration, run.iteration_times_s, strict=True):
        ran_s[k] += dt
    costs = [
        (ran_s[k], plan_cost(inst, plan, ran_s[k] / count[k]))
        for k, plan in enumerate(run.plans)
        if ran_s[k] > 0
    ]
    return time_weighted(costs, tokens_per_s)


def summary(
    inst: Instance,
    run: AdaptiveRun,
    scenario: BandwidthScenario,
    horizon_s: float,
    profiles: Profiles | None = None,
) -> dict:
    """A scenario's entry of `hetopt simulate --policy replan --json`: the fields of a static
    replay's entry (docs/cli-output.md; tokens_per_s is the tokens over the horizon ÷ the horizon,
    the switches' pauses counted), and the policy's: tokens, switches, declined decisions, the plans
    run."""
    profiles = profiles or Profiles()
    merged = run.merged
    tokens = run_tokens(inst, run, horizon_s)
    ran_s = [0.0] * len(run.plans)  # seconds each plan ran
    for k, dt in zip(run.plan_of_iteration, run.iteration_times_s, strict=True):
        ran_s[k] += dt
    busy, peaks = [], []
    for k, plan in enumerate(run.plans):
        if ran_s[k] > 0:
            peaks += stage_peaks(plan, evaluate(inst, plan, profiles).peak_memory_gib)
        for j, pipe in enumerate(plan.pipelines if ran_s[k] > 0 else []):
            for d in range(len(pipe.stages)):
                share = [
                    merged.busy_s.get((k, j, r, d), 0.0) / ran_s[k] for r in range(pipe.replicas)
                ]
                busy.append({"plan": k, "pipeline": j, "stage": d, "busy": float(np.mean(share))})
    return {
        "name": scenario.name,
        "probability": scenario.probability,
        "policy": "replan",
        "iteration_time_s": iteration_stats(run.iteration_times_s),
        "iterations": len(run.iteration_times_s),
        "replayed_s": run.end_s,
        "horizon_s": horizon_s,
        "tokens": tokens,
        "tokens_per_s": tokens / horizon_s,
        "link_utilization": link_utilization(inst, merged),
        "gpu_busy": busy,
        "peak_memory_gib": peaks,
        **run_cost(inst, run, tokens / horizon_s).to_json(),
        "switches": [sw.to_json() for sw in run.switches],
        "declined": run.declined,
        "paused_s": sum(sw.pause_s for sw in run.switches),
        "plans": [plan_json(plan) for plan in run.plans],
        "sampled": merged.sampled,
        "cut": run.cut or merged.cut,
    }

"""The discrete-event simulator (DESIGN 5): `Simulation`, a plan priced once (hetopt.sim.priced)
whose iterations are replayed as events (hetopt.sim.replay), each replay bounded here.

Over the concrete placement of a plan: every micro-batch's forward and backward on every stage of
every replica (durations from the one cost model: `evaluate.plan_features` priced by
`price_template`, TP collectives included — inside a node, and for a TP group over several nodes or
ZeRO-2/3's per-pass gathers and scatters, their cost-model time, not flows: they do not share NICs
with the flows below and do not follow a scenario's bandwidth trace), point-to-point sends between
stages (the sender blocks until its send completes, as Megatron's 1F1B exchanges do), gradient
all-reduces per stage among its template's replicas (they start when every replica is `dp_overlap`
into its last backward), with several templates their exchange of the reduced gradients, then the
optimizer step. Transfers that leave a node are flows on the device graph sharing links max-min
fairly, under the scenario's capacity trace; transfers inside a node take their cost-model time.

At constant bandwidth and without contention this reproduces the analytic evaluator; what differs is
what the analytic model cannot see: flows of several stages or replicas sharing a NIC or an uplink,
and capacity that changes mid-transfer.

The bounds of a replay live here (SAMPLE_PASSES, MAX_SAMPLE_PASSES, REPLAY_PASSES, DEADLINE_EVERY):
an iteration too large to replay whole is sampled and extrapolated through the scenario's bandwidth
phases (`Simulation.sample`), and one too large even to sample is priced by the analytic evaluator.
"""

from __future__ import annotations

import math

from hetopt.cost.profiles import Profiles
from hetopt.evaluate import plan_features, price
from hetopt.plan import Plan
from hetopt.sim.priced import PricedPlan
from hetopt.sim.replay import (
    OutOfTime,
    Replay,
    SimResult,
)
from hetopt.spec.instance import Instance
from hetopt.spec.scenarios import BandwidthScenario

SAMPLE_PASSES = 200_000
"""An iteration of more forward and backward passes than this (Σ replicas × stages × chunks × 2 ×
micro-batches over the templates; its replay time: docs/benchmarks.md) is not replayed whole:
two samples of fewer micro-batches are, and its time is extrapolated from them
(`Simulation.run`)."""

MAX_SAMPLE_PASSES = 5 * SAMPLE_PASSES
"""The most passes the two samples may take together (each stage needs a pipeline-fill of
micro-batches for the steady state, so many replicas × deep pipelines can need more); beyond, the
analytic evaluator."""

DEADLINE_EVERY = 4096
"""Events between two looks at the clock in a replay with a deadline."""

REPLAY_PASSES = 5_000_000
"""A replay starts no new iteration after this many passes (how long that takes:
docs/benchmarks.md) — the horizon or the iterations asked for are cut short there, and the result
says so."""


class Simulation(PricedPlan):
    """A discrete-event replay of one plan: every pass, send and collective as an event, network
    transfers as flows sharing links under the scenario's bandwidth changes.

    Parameters: inst — the instance; plan — the plan (checked, then placed); profiles — calibrated
    weights (default: shipped). `run` replays it."""

    def __init__(self, inst: Instance, plan: Plan, profiles: Profiles | None = None) -> None:
        super().__init__(inst, plan, profiles)
        # the evaluator's time per set of link bandwidths (`_priced`, for a sampled iteration)
        self._prices: dict[tuple, float] = {}
        self.nominal_gbps = inst.nominal_gbps

    def run(
        self,
        scenario: BandwidthScenario,
        iterations: int = 1,
        record: bool = False,
        until_s: float | None = None,
        deadline: float | None = None,
        stop_s: float | None = None,
    ) -> SimResult:
        """Replay iterations back to back from t = 0 under a scenario.

        An iteration of more than SAMPLE_PASSES passes is replayed as two samples instead
        (`sample`). No iteration starts after REPLAY_PASSES passes or after `deadline` (the result's
        `cut` says which). Should the deadline come before one iteration is replayed, the evaluator
        prices it (`sampled.method: analytic`, `cut: time limit`).

        Parameters:
            scenario: the capacity trace.
            iterations: how many iterations at least.
            record: keep every operation and transfer (for traces and plots).
            until_s: also keep starting iterations while the clock is before this time (the
                horizon).
            deadline: a `time.time()` after which no further iteration starts. stop_s: no iteration
            starts at or after this simulated time (the end of a trace cut short).
        Returns: the iteration times and what the replay measured.
        """
        full = [pipe.micro_batches for pipe in self.plan.pipelines]
        try:
            if self.passes(full) > SAMPLE_PASSES:
                result = self.sample(scenario, record, deadline)
                more = iterations > 1 or (
                    until_s is not None and result.iteration_times_s[0] < until_s
                )
                result.cut = "sampled" if more else None
                return result
            return self._replay(scenario, iterations, record, until_s, full, deadline, stop_s).go()
        except OutOfTime:  # not even one iteration replayed in time (many flows share the links)
            result = self._analytic(full, "the time limit came before one iteration was replayed")
            result.cut = "time limit"
            return result

    def _replay(
        self,
        scenario: BandwidthScenario,
        iterations: int,
        record: bool,
        until_s: float | None,
        micro_batches: list[int],
        deadline: float | None = None,
        stop_s: float | None = None,
    ) -> Replay:
        """A replay of these micro-batches per template, bounded by this module's REPLAY_PASSES and
        DEADLINE_EVERY as they are when it starts."""
        return Replay(
            self,
            scenario,
            iterations,
            record,
            until_s,
            micro_batches,
            deadline,
            stop_s,
            pass_budget=REPLAY_PASSES,
            deadline_every=DEADLINE_EVERY,
        )

    def sample(
        self, scenario: BandwidthScenario, record: bool = False, deadline: float | None = None
    ) -> SimResult:
        """One iteration too large to replay whole, from two replays of fewer micro-batches.

        Template j replays s_j and then 2·s_j micro-batches (s_j about m_j · SAMPLE_PASSES / 3 /
        passes, at least its stages, whole groups of them when interleaved, at most m_j), one
        iteration each from t = 0. In steady state a 1F1B or GPipe pipeline's last pass ends
        linearly later with its micro-batches, so each template's end is extrapolated from its two
        to m_j; what follows (its gradient all-reduces, then the exchange between templates and the
        optimizer step) takes as long as in the larger sample. Both samples run at the bandwidth in
        force at t = 0 (a link down then at its next level): a change that only the larger sample
        met would be multiplied by the extrapolation. The scenario's changes then act on the whole
        iteration through `_through_phases`. When even samples of one pipeline fill each stage would
        exceed MAX_SAMPLE_PASSES, the iteration is priced by the analytic evaluator at the
        instance's bandwidths instead.

        Returns: a SimResult of one iteration: its extrapolated time; the rest is the larger
        sample's (`sampled` says which micro-batches, or `method: analytic`).
        """
        full = [pipe.micro_batches for pipe in self.plan.pipelines]
        share = SAMPLE_PASSES / 3 / self.passes(full)
        first, second = [], []
        for pipe, m in zip(self.plan.pipelines, full, strict=True):
            p = len(pipe.stages)
            s = max(p, round(m * share))
            if self.vp > 1:
                s = math.ceil(s / p) * p  # the interleaved schedule runs whole groups of p
            first.append(min(m, s))
            second.append(min(m, 2 * s))
        if self.passes(first) + self.passes(second) > MAX_SAMPLE_PASSES:
            return self._analytic(full, "too large even to sample")
        steady = _at_start(scenario)
        small_run = self._replay(steady, 1, False, None, first, deadline)
        small_run.go()
        large_run = self._replay(steady, 1, record, None, second, deadline)
        large = large_run.go()
        done_s = []
        # each template's last pass ends linearly later with its micro-batches
        for j, m in enumerate(full):
            t1, t2 = small_run.template_ends_s[j], large_run.template_ends_s[j]
            slope_s = (t2 - t1) / (second[j] - first[j]) if second[j] > first[j] else 0.0
            # ... and its gradient all-reduces take as long after it as in the larger sample
            done_s.append(large_run.template_done_s[j] + slope_s * (m - second[j]))
        # the exchange between templates and the optimizer step, as sampled
        after_s = large.iteration_times_s[0] - max(large_run.template_done_s)
        at_steady_s = max(done_s) + after_s
        end_s, phases = self._through_phases(scenario, steady, at_steady_s)
        large.iteration_times_s = [end_s]
        large.sampled = {
            "method": "two samples",
            "micro_batches": [first, second],
            "of": full,
            "bandwidth_phases": phases,
        }
        return large

    def _through_phases(
        self, scenario: BandwidthScenario, steady: BandwidthScenario, at_steady_s: float
    ) -> tuple[float, int]:
        """When an iteration that takes `at_steady_s` at the `steady` bandwidths ends under the
        scenario, and how many bandwidth phases it crosses.

        A fluid model: through a phase of constant bandwidths S the iteration progresses at the rate
        1 / T(S), T(S) = at_steady_s · A(S) / A(steady) with A the analytic evaluator's time (the
        replay measures the level, the evaluator how it scales with the bandwidth); it ends when its
        progress reaches 1. A link down that the plan sends over stops it; one it does not use
        changes nothing."""
        reference = self._priced(
            {**self.nominal_gbps, **{link: g for _, link, g in steady.changes}}
        )
        done, phase_start, levels, phases = 0.0, 0.0, dict(self.nominal_gbps), 0
        changes = sorted(scenario.changes, key=lambda c: c[0])
        k = 0
        while True:
            while k < len(changes) and changes[k][0] <= phase_start:
                levels[changes[k][1]] = changes[k][2]
                k += 1
            phase_end = changes[k][0] if k < len(changes) else math.inf
            phases += 1
            priced = self._priced(levels)
            rate = 0.0 if math.isinf(priced) else reference / (at_steady_s * priced)
            if rate > 0 and phase_start + (1 - done) / rate <= phase_end:
                return phase_start + (1 - done) / rate, phases
            if math.isinf(phase_end):
                raise RuntimeError("a sampled iteration never ends: a link it uses stays down")
            done += rate * (phase_end - phase_start)
            phase_start = phase_end

    def _priced(self, levels: dict[tuple[str, str], float]) -> float:
        """The evaluator's iteration time at these link bandwidths; inf when a link the plan uses is
        down."""
        key = tuple(sorted(levels.items()))
        if key not in self._prices:
            nominal = self.nominal_gbps
            down = [link for link, g in levels.items() if g == 0]
            up = {**levels, **{link: nominal[link] for link in down}}
            t = self._price_at(up)
            # a link the plan sends over changes its time when its bandwidth does
            used = any(self._price_at({**up, link: nominal[link] / 2}) != t for link in down)
            self._prices[key] = math.inf if used else t
        return self._prices[key]

    def _price_at(self, levels: dict[tuple[str, str], float]) -> float:
        on = self.inst.on_network(levels)
        return price(on, self.plan, plan_features(on, self.plan), self.profiles).iteration_time_s

    def _analytic(self, full: list[int], reason: str) -> SimResult:
        """The evaluator's iteration time, for an iteration not replayed (`reason`)."""
        t = price(self.inst, self.plan, self.features, self.profiles).iteration_time_s
        return SimResult(
            [t], {}, {}, {}, end_s=t, sampled={"method": "analytic", "of": full, "reason": reason}
        )


def _at_start(scenario: BandwidthScenario) -> BandwidthScenario:
    """The scenario held at the bandwidths in force at t = 0 (a link down at t = 0 at its first
    level after)."""
    level: dict = {}
    for t, link, gbps in sorted(scenario.changes, key=lambda c: c[0]):
        if t <= 0 or level.get(link) == 0:
            level[link] = gbps
    return BandwidthScenario(
        scenario.name,
        scenario.probability,
        tuple((0.0, link, gbps) for link, gbps in level.items()),
    )

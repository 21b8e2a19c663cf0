"""The discrete-event simulator (DESIGN 5).

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
"""

from __future__ import annotations

import heapq
import itertools
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from hetopt.cost import comm
from hetopt.cost.compute import ACT_BYTES
from hetopt.cost.memory import stage_params
from hetopt.cost.profiles import Profiles
from hetopt.cost.terms import NET
from hetopt.errors import InputError, Problem
from hetopt.evaluate import (
    BWD,
    BWD_TP,
    DP,
    FWD,
    FWD_TP,
    OPT,
    by_stage,
    grad_comm_bytes,
    nic_columns,
    p2p_features,
    plan_features,
    price,
    price_template,
    rank_nodes,
    reshard_sends,
    stage_nodes,
)
from hetopt.placement import place
from hetopt.plan import Plan
from hetopt.sim.network import Link, Network
from hetopt.sim.schedules import device_ops
from hetopt.spec.cluster import island_vertex
from hetopt.spec.instance import Instance
from hetopt.spec.scenarios import BandwidthScenario
from hetopt.verify import check_plan

Device = tuple[int, int, int]
"""(template, replica, stage)."""

SAMPLE_PASSES = 200_000
"""An iteration of more forward and backward passes than this (Σ replicas × stages × chunks × 2 ×
micro-batches over the templates; one to a few seconds of replay on one core) is not replayed whole:
two samples of fewer micro-batches are, and its time is extrapolated from them
(`Simulation.run`)."""

MAX_SAMPLE_PASSES = 5 * SAMPLE_PASSES
"""The most passes the two samples may take together (each stage needs a pipeline-fill of
micro-batches for the steady state, so many replicas × deep pipelines can need more); beyond, the
analytic evaluator."""

DEADLINE_EVERY = 4096
"""Events between two looks at the clock in a replay with a deadline."""


class _OutOfTime(Exception):
    """The deadline came in the middle of a replay's first iteration."""


REPLAY_PASSES = 5_000_000
"""A replay starts no new iteration after this many passes (about 30 s on one core) — the horizon or
the iterations asked for are cut short there, and the result says so."""


@dataclass
class Transfer:
    """A send: a fixed part (latency, steps, or the whole of an intra-node copy) and a flow, if
    any."""

    fixed_s: float
    path: tuple[Link, ...] = ()
    nbytes: float = 0.0
    more: tuple[Transfer, ...] = ()
    """Sends that run beside this one and end the transfer with it (re-sharding between stages with
    shards: every pair of ranks whose sequences overlap)."""


@dataclass
class Record:
    kind: str  # F, B, send, dp, opt
    name: str
    start_s: float
    end_s: float
    device: Device | None = None
    link: str = ""
    plan: int = 0
    """Which plan of an adaptive replay ran it (hetopt.replan.policy; 0 in a replay of one plan)."""


@dataclass
class SimResult:
    iteration_times_s: list[float]
    busy_s: dict[Device, float]
    link_bytes: dict[Link, float]
    link_capacity_integral: dict[Link, float]
    records: list[Record] = field(default_factory=list)
    capacity_trace: dict[tuple[str, str], list[tuple[float, float]]] = field(default_factory=dict)
    end_s: float = 0.0
    sampled: dict | None = None
    """When the iteration was too large to replay whole: the micro-batches per template of the two
    samples replayed and of the plan (what was measured comes from the larger sample)."""
    cut: str | None = None
    """Why the replay stopped before its horizon or iterations: "pass budget", "time limit", "trace
    end", or "sampled" (an iteration too large to replay several)."""


class Simulation:
    """A discrete-event replay of one plan: every pass, send and collective as an event, network
    transfers as flows sharing links under the scenario's bandwidth changes.

    Parameters: inst — the instance; plan — the plan (checked, then placed); profiles — calibrated
    weights (default: shipped). `run` replays it."""

    def __init__(self, inst: Instance, plan: Plan, profiles: Profiles | None = None) -> None:
        problems = check_plan(inst, plan)
        if problems:
            raise InputError("plan", [Problem(path, message) for path, message in problems])
        self.inst, self.plan = inst, place(plan, inst.cluster)
        self.profiles = profiles or Profiles()
        self.cluster = inst.cluster
        feats = self.features = plan_features(inst, self.plan)
        self.vp = self.plan.virtual_stages
        self.times: list[np.ndarray] = []
        self.weights: list[list[np.ndarray]] = []
        self.overlap: list[list[float]] = []
        self.rows: list[np.ndarray] = []  # per stage, the feature row of its longest all-reduce
        for j, gpus in enumerate(feats.gpus):
            params = [self.profiles.for_gpu(g, inst.spec.training.framework) for g in gpus]
            w = np.stack([p.w for p in params])
            # ZeRO-2/3's per-micro-batch collectives are in the passes by evaluate's overlap rule,
            # not flows
            times = price_template(feats, j, w, np.array([p.launch_serial for p in params]))[0]
            overlap = np.array([p.dp_overlap for p in params])
            # a stage's all-reduce: the features of its row whose all-reduce is longest; sends and
            # collectives are priced alike for every GPU type (calibration fits no network term per
            # type)
            pick = np.arange(len(times))
            if feats.mixed(j):  # a stage with shards moves at its slowest ranks' pace (`by_stage`)
                rows = np.asarray(feats.stage_of[j])
                pick = np.array(
                    [
                        np.flatnonzero(rows == i)[np.argmax(times[rows == i, DP])]
                        for i in range(rows.max() + 1)
                    ]
                )
                times, overlap = by_stage(times, feats.stage_of[j], overlap)
            self.times.append(times)
            self.rows.append(pick)
            self.weights.append([params[k].w for k in pick])
            self.overlap.append([float(o) for o in overlap])
        w0 = self.weights[0][0]
        self.net_weight = float(w0[NET])
        self.nodes_of = stage_nodes(self.plan)
        self.ranks_at = rank_nodes(self.plan)
        self.act_bytes = ACT_BYTES * self.plan.micro_batch * inst.seq_len * inst.model.hidden
        self.transfers: dict[tuple[Device, Device], Transfer] = {}
        self.base_capacity = self._capacities()
        # the evaluator's time per set of link bandwidths (sample)
        self._prices: dict[tuple, float] = {}
        self.nominal_gbps = inst.nominal_gbps

    # -- static pieces
    # -----------------------------------------------------------------------------------

    def _capacities(self) -> dict[Link, float]:
        cap = {}
        for u, v, d in self.cluster.graph.edges(data=True):
            if math.isinf(d["gbps"]):
                continue
            # what the link's fabric delivers
            bps = d["gbps"] * d["eta"] * comm.GBIT / self.net_weight
            cap[(u, v)] = cap[(v, u)] = bps
        return cap

    def node_of(self, dev: Device) -> str:
        j, r, d = dev
        return self.nodes_of[(j, d)][r]

    def transfer(self, src: Device, dst: Device) -> Transfer:
        """The send of one micro-batch's activations (or gradients) from device `src` to `dst`;
        between stages with shards, every re-sharding send of that replica at once
        (`Transfer.more`)."""
        key = (src, dst)
        if key not in self.transfers:
            j, r, d = src
            width = self.plan.pipelines[j].stages[d].width
            sends = [(self.node_of(src), self.node_of(dst), self.act_bytes)]
            if (
                self.plan.pipelines[j].stages[d].shards
                or self.plan.pipelines[j].stages[dst[2]].shards
            ):
                sends = reshard_sends(
                    self.plan,
                    j,
                    d,
                    dst[2],
                    self.ranks_at,
                    self.act_bytes / self.plan.micro_batch,
                    range(r, r + 1),
                )
            first, *more = [
                self._one_send(a, b, nbytes, width, self.weights[j][d]) for a, b, nbytes in sends
            ]
            self.transfers[key] = Transfer(first.fixed_s, first.path, first.nbytes, tuple(more))
        return self.transfers[key]

    def _one_send(self, a: str, b: str, nbytes: float, width: int, w: np.ndarray) -> Transfer:
        """`nbytes` from node a to node b by a stage of `width` GPUs per rank: inside a node its
        cost-model time, else a flow and its fixed part."""
        feats = p2p_features(self.cluster, [a], [b], nbytes, width)
        route = self.cluster.route(a, b)
        if route.intra_node:
            return Transfer(float(feats @ w))
        return Transfer(_fixed_s(feats, w), route.edges, nbytes)

    def dp_collectives(self) -> list[dict]:
        """One gradient all-reduce per (template, stage): participants, fixed time, ring flows."""
        out = []
        plan = self.plan
        for j, pipe in enumerate(plan.pipelines):
            if plan.zero >= 2:  # ZeRO-2/3: no end-of-iteration all-reduce
                continue
            for d, st in enumerate(pipe.stages):
                if pipe.replicas * st.dp_ranks * st.cp <= 1:  # one rank holds the stage's gradients
                    continue
                members = [(j, r, d) for r in range(pipe.replicas)]
                nodes = list(dict.fromkeys(n for ranks in self.ranks_at[(j, d)] for n in ranks))
                w = self.weights[j][d]
                dp_feats = self.features.templates[j][self.rows[j][d], DP]
                fixed = _fixed_s(dp_feats, w)
                flows = []
                if len(nodes) > 1:
                    params = stage_params(
                        self.inst.model,
                        st.layers,
                        d == 0,
                        d == len(pipe.stages) - 1,
                        len(pipe.stages),
                    )
                    rank_bytes = params / st.tp * grad_comm_bytes(self.inst)
                    columns = nic_columns(self.cluster, nodes, st.tp)
                    ring_bytes = 2 * (len(nodes) - 1) / len(nodes) * columns * rank_bytes
                    for a, b in itertools.pairwise([*nodes, nodes[0]]):
                        flows.append((self.cluster.route(a, b).edges, ring_bytes))
                out.append({"key": (j, d), "members": members, "fixed_s": fixed, "flows": flows})
        return out

    def cross_exchange(self) -> tuple[float, list[tuple[tuple[Link, ...], float]], float]:
        """The templates' gradient exchange: the fixed part after its network flows, the flows, and
        the longest of its copies that stay inside a node (cost-model time, as intra-node sends
        are)."""
        f = self.features
        w = self.weights[0][0]  # network terms are not fitted per GPU type (evaluate.cross_seconds)
        flows, fixed, inside_s = [], 0.0, 0.0
        for a, b, nbytes in f.cross_flows:
            route = self.cluster.route(a, b)
            send = comm.transfer(
                nbytes,
                route.effective_gbps,
                route.intra_node,
                latency_s=route.latency_us * 1e-6,
                alpha_s=route.alpha_s,
            )
            if route.intra_node:
                inside_s = max(inside_s, float(send @ w))
            else:
                flows.append((route.edges, nbytes))
                fixed = max(fixed, _fixed_s(send, w))
        return fixed, flows, inside_s

    # -- running
    # -------------------------------------------------------------------------------------------

    def passes(self, micro_batches: list[int]) -> int:
        """Forward and backward passes in one iteration with these micro-batches per template."""
        return sum(
            pipe.replicas * len(pipe.stages) * self.vp * 2 * m
            for pipe, m in zip(self.plan.pipelines, micro_batches, strict=True)
        )

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
            return _Run(self, scenario, iterations, record, until_s, full, deadline, stop_s).go()
        except _OutOfTime:  # not even one iteration replayed in time (many flows share the links)
            result = self._analytic(full, "the time limit came before one iteration was replayed")
            result.cut = "time limit"
            return result

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
        small_run = _Run(self, steady, 1, False, None, first, deadline)
        small_run.go()
        large_run = _Run(self, steady, 1, record, None, second, deadline)
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


class _Run:
    """One replay of `iterations` iterations under one scenario."""

    def __init__(
        self,
        sim: Simulation,
        scenario: BandwidthScenario,
        iterations: int,
        record: bool,
        until_s: float | None,
        micro_batches: list[int],
        deadline: float | None = None,
        stop_s: float | None = None,
    ) -> None:
        self.sim, self.scenario, self.iterations, self.record = sim, scenario, iterations, record
        self.until_s, self.micro_batches, self.deadline, self.stop_s = (
            until_s,
            micro_batches,
            deadline,
            stop_s,
        )
        self.passes_done = self.events = 0
        self.first = True  # replaying the first iteration
        self.cut: str | None = None
        self.now = 0.0
        self.heap: list[tuple[float, int, Callable[[], None]]] = []
        self.seq = itertools.count()
        self.net = Network(dict(sim.base_capacity))
        self.net_version = 0
        self.records: list[Record] = []
        self.busy: dict[Device, float] = {}
        self.cap_integral: dict[Link, float] = {}
        self.cap_since = 0.0
        self.capacity_trace: dict[tuple[str, str], list[tuple[float, float]]] = {}
        self.collectives = sim.dp_collectives()

    # events
    def at(self, t: float, fn: Callable[[], None]) -> None:
        heapq.heappush(self.heap, (t, next(self.seq), fn))

    def _net_changed(self) -> None:
        self.net_version += 1
        t = self.net.next_finish_s()
        if math.isfinite(t):
            version = self.net_version
            self.at(max(t, self.now), lambda: self._net_event(version))

    def _net_event(self, version: int) -> None:
        if version != self.net_version:
            return
        done = self.net.pop_finished(self.now)
        for f in done:
            f.on_done(self.now)
        self._net_changed()

    def send(self, tr: Transfer, on_done: Callable[[], None], label: str = "") -> None:
        """Run a transfer: its flow (if any) through the network, then its fixed part — and the
        sends beside it (`Transfer.more`); it is done when the last of them is."""
        start = self.now
        left = [1 + len(tr.more)]

        def finish_fixed() -> None:
            left[0] -= 1
            if left[0]:
                return
            if self.record and label:
                self.records.append(
                    Record("send", label, start, self.now, link=_link_name(tr.path))
                )
            on_done()

        flows = False
        for part in (tr, *tr.more):
            if not part.path:
                self.at(self.now + part.fixed_s, finish_fixed)
                continue
            self.net.start(
                self.now,
                part.path,
                part.nbytes,
                lambda t, fixed=part.fixed_s: self.at(t + fixed, finish_fixed),
                label,
            )
            flows = True
        if flows:
            self._net_changed()

    # capacity trace
    def _apply_change(self, link: tuple[str, str], gbps: float) -> None:
        self._integrate_capacity()
        u, v = island_vertex(link[0]), island_vertex(link[1])
        bps = gbps * self.sim.cluster.graph.edges[u, v]["eta"] * comm.GBIT / self.sim.net_weight
        for edge in ((u, v), (v, u)):
            if edge in self.net.capacity:
                self.net.set_capacity(self.now, edge, bps)
        self.capacity_trace.setdefault(link, []).append((self.now, gbps))
        self._net_changed()

    def _integrate_capacity(self) -> None:
        dt = self.now - self.cap_since
        if dt > 0:
            for link, bps in self.net.capacity.items():
                self.cap_integral[link] = self.cap_integral.get(link, 0.0) + bps * dt
        self.cap_since = self.now

    # one iteration
    def _drain(self) -> None:
        """Process events in time order, applying capacity changes as their times come — also when
        no event is left but flows are (a link down at 0 Gbit/s holds them until a change brings it
        back)."""
        changes = self.scenario.changes
        while self.heap or self.net.flows:
            t_next = self.heap[0][0] if self.heap else math.inf
            if self.change_index < len(changes) and changes[self.change_index][0] <= t_next:
                t, link, gbps = changes[self.change_index]
                self.change_index += 1
                self.now = max(self.now, t)
                self._apply_change(link, gbps)
                continue
            if not self.heap:
                raise RuntimeError(
                    f"simulation stalled at {self.now:g} s: flows wait on a link that is down "
                    "and never comes back"
                )
            t, _, fn = heapq.heappop(self.heap)
            self.now = max(self.now, t)
            fn()
            self.events += 1
            # within the first iteration: after it, the deadline stops the next from starting (`go`)
            if (
                self.first
                and self.deadline is not None
                and self.events % DEADLINE_EVERY == 0
                and time.time() >= self.deadline
            ):
                raise _OutOfTime

    def go(self) -> SimResult:
        self.change_index = 0
        for lk in self.sim.inst.spec.cluster.network.links:
            key = (lk.a, lk.b) if lk.a <= lk.b else (lk.b, lk.a)
            self.capacity_trace.setdefault(key, []).append((0.0, lk.gbps))
        times = []
        start = 0.0
        while len(times) < self.iterations or (self.until_s is not None and start < self.until_s):
            if times and self.passes_done >= REPLAY_PASSES:
                self.cut = "pass budget"
                break
            if times and self.deadline is not None and time.time() >= self.deadline:
                self.cut = "time limit"
                break
            if times and self.stop_s is not None and start >= self.stop_s:
                self.cut = "trace end"
                break
            end = self._iteration(start, len(times))
            self.first = False
            times.append(end - start)
            start = end
        self.now = start
        self.net.settle_all(self.now)
        self._integrate_capacity()
        return SimResult(
            times,
            self.busy,
            dict(self.net.bytes_on),
            self.cap_integral,
            self.records,
            self.capacity_trace,
            start,
            cut=self.cut,
        )

    def _iteration(self, t0: float, it: int) -> float:
        sim, plan = self.sim, self.sim.plan
        vp = sim.vp
        state: dict[Device, dict] = {}
        arrived: set[tuple] = set()
        remaining_devices = 0
        ready_at: dict[tuple[int, int], list[float]] = {}
        pipeline_end = [t0] * len(plan.pipelines)  # when each template's last pass ends
        for j, pipe in enumerate(plan.pipelines):
            p = len(pipe.stages)
            for r in range(pipe.replicas):
                for d in range(p):
                    ops = device_ops(plan.schedule, p, self.micro_batches[j], d, vp)
                    state[(j, r, d)] = {
                        "ops": ops,
                        "i": 0,
                        "busy": False,
                        "last_b": len(ops)
                        - 1
                        - next(k for k, op in enumerate(reversed(ops)) if op[0] == "B"),
                    }
                    remaining_devices += 1
        done_collectives: list[float] = []
        template_done = list(pipeline_end)  # ... and when its gradient all-reduces do
        pending = {c["key"]: c for c in self.collectives}
        finished_devices = [0]

        def duration(dev: Device, kind: str) -> float:
            j, _, d = dev
            t = sim.times[j][d]
            return float(t[FWD] + t[FWD_TP] if kind == "F" else t[BWD] + t[BWD_TP]) / vp

        def try_start(dev: Device) -> None:
            st = state[dev]
            if st["busy"] or st["i"] >= len(st["ops"]):
                return
            kind, chunk, mb = st["ops"][st["i"]]
            j, r, d = dev
            p = len(plan.pipelines[j].stages)
            v = chunk * p + d
            last_v = p * vp - 1
            if kind == "F" and v > 0 and ("F", j, r, v, mb) not in arrived:
                return
            if kind == "B" and v < last_v and ("B", j, r, v, mb) not in arrived:
                return
            st["busy"] = True
            self.passes_done += 1
            dur = duration(dev, kind)
            start = self.now
            is_last_b = st["i"] == st["last_b"]
            if is_last_b:  # gradients start streaming dp_overlap into the last backward
                ready = start + (1 - sim.overlap[j][d]) * dur
                ready_at.setdefault((j, d), []).append(ready)
                # the last member to start its last backward schedules the collective
                check_collectives()
            self.at(self.now + dur, lambda: finish(dev, kind, chunk, mb, start, v, is_last_b))

        def finish(dev, kind, chunk, mb, start, v, is_last_b) -> None:
            j, r, d = dev
            self.busy[dev] = self.busy.get(dev, 0.0) + (self.now - start)
            if self.record:
                self.records.append(
                    Record(
                        kind, f"{kind}{mb}" + (f".{chunk}" if vp > 1 else ""), start, self.now, dev
                    )
                )
            p = len(plan.pipelines[j].stages)
            target = v + 1 if kind == "F" else v - 1
            if 0 <= target < p * vp:
                dst = (j, r, target % p)
                tr = sim.transfer(dev, dst)

                def delivered() -> None:
                    arrived.add((kind, j, r, target, mb))
                    advance(dev, is_last_b)
                    try_start(dst)

                self.send(tr, delivered, f"{kind} mb{mb} {d}->{target % p}" if self.record else "")
            else:
                advance(dev, is_last_b)

        def advance(dev: Device, was_last_b: bool) -> None:
            st = state[dev]
            st["busy"] = False
            st["i"] += 1
            if st["i"] >= len(st["ops"]):
                pipeline_end[dev[0]] = max(pipeline_end[dev[0]], self.now)
                finished_devices[0] += 1
            if was_last_b:
                check_collectives()
            try_start(dev)

        def check_collectives() -> None:
            for key, c in list(pending.items()):
                counts = {}
                for g, _, s in c["members"]:
                    counts[(g, s)] = counts.get((g, s), 0) + 1
                if all(len(ready_at.get(k, [])) >= n for k, n in counts.items()):
                    del pending[key]
                    start_collective(c, max(max(ready_at[k]) for k in counts))

        def start_collective(c: dict, ready_s: float) -> None:
            begin = max(ready_s, t0)

            def launch() -> None:
                left = [len(c["flows"])]

                def flow_done(_t: float) -> None:
                    left[0] -= 1
                    if left[0] == 0:
                        self.at(self.now + c["fixed_s"], lambda: complete(c, begin))

                if not c["flows"]:
                    self.at(self.now + c["fixed_s"], lambda: complete(c, begin))
                    return
                for path, nbytes in c["flows"]:
                    self.net.start(self.now, path, nbytes, flow_done, "dp")
                self._net_changed()

            if begin > self.now:
                self.at(begin, launch)
            else:
                launch()

        def complete(c: dict, begin: float) -> None:
            done_collectives.append(self.now)
            template_done[c["key"][0]] = max(template_done[c["key"][0]], self.now)
            if self.record:
                self.records.append(
                    Record(
                        "dp",
                        f"all-reduce stage {c['key'][1]}",
                        begin,
                        self.now,
                        (c["key"][0], 0, c["key"][1]),
                    )
                )

        self.now = t0
        for dev in state:
            try_start(dev)
        self._drain()
        if finished_devices[0] != remaining_devices:
            raise RuntimeError("simulation stalled: some operations never became ready")
        self.template_ends_s = [t - t0 for t in pipeline_end]
        self.template_done_s = [
            max(t, e) - t0 for t, e in zip(template_done, pipeline_end, strict=True)
        ]
        t_dp = max([*pipeline_end, *done_collectives])
        if sim.features.cross_flows:
            t_dp = self._exchange(t_dp)
        t_opt = max(float(t[:, OPT].max()) for t in sim.times)
        end = t_dp + t_opt
        if self.record:
            self.records.append(Record("opt", "optimizer", t_dp, end))
        self.now = end
        return end

    def _exchange(self, begin: float) -> float:
        """Run the templates' gradient exchange from `begin`; returns when it ends."""
        fixed, flows, inside_s = self.sim.cross_exchange()
        self.now = begin
        end = [begin + inside_s]

        def done() -> None:
            end[0] = max(end[0], self.now)
            if self.record:
                self.records.append(
                    Record("dp", "exchange between templates", begin, self.now, (0, 0, 0))
                )

        left = [len(flows)]

        def flow_done(_t: float) -> None:
            left[0] -= 1
            if left[0] == 0:
                self.at(self.now + fixed, done)

        if not flows:
            self.at(begin + fixed, done)
        for path, nbytes in flows:
            self.net.start(self.now, path, nbytes, flow_done, "dp")
        self._net_changed()
        self._drain()
        return end[0]


def _fixed_s(features: np.ndarray, w: np.ndarray) -> float:
    """What a transfer costs besides its bytes on the network (latency, steps, any intra-node part):
    the flow model carries the NET term, the rest is paid after it."""
    return float(features @ w - features[NET] * w[NET])


def _link_name(path: tuple[Link, ...]) -> str:
    """The track a transfer belongs on: its island link if it crosses one, else the sending node's
    NIC, else the intra-node interconnect."""
    for u, v in path:
        if u.startswith("island:") and v.startswith("island:"):
            a, b = sorted((u.removeprefix("island:"), v.removeprefix("island:")))
            return f"link {a}-{b}"
    if path:
        return f"nic {path[0][0]}"
    return "intra-node"

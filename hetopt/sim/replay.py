"""The discrete-event replay of a priced plan (DESIGN 5): the event engine.

Every micro-batch's forward and backward on every stage of every replica (hetopt.sim.schedules'
order), point-to-point sends between stages (the sender blocks until its send completes, as
Megatron's 1F1B exchanges do), gradient all-reduces per stage among its template's replicas (they
start when every replica is `dp_overlap` into its last backward), with several templates their
exchange of the reduced gradients, then the optimizer step. Transfers that leave a node are flows on
the device graph sharing links max-min fairly (hetopt.sim.network), under the scenario's capacity
trace; transfers inside a node take their cost-model time. What each costs comes from
hetopt.sim.priced; how much a replay may cost (its pass budget, its deadline) from
hetopt.sim.engine.
"""

from __future__ import annotations

import heapq
import itertools
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from hetopt.cost import comm
from hetopt.evaluate import BWD, BWD_TP, FWD, FWD_TP, OPT
from hetopt.sim.network import Link, Network
from hetopt.sim.priced import Device, PricedPlan, Transfer
from hetopt.sim.schedules import device_ops
from hetopt.spec.cluster import island_vertex
from hetopt.spec.scenarios import BandwidthScenario


class OutOfTime(Exception):
    """The deadline came in the middle of a replay's first iteration."""


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


class Replay:
    """One replay of `iterations` iterations of a priced plan under one scenario: its events in time
    order, its network transfers as flows sharing links under the scenario's capacity changes.

    `pass_budget`: no iteration starts after this many passes; `deadline_every`: events between two
    looks at the clock (hetopt.sim.engine sets both)."""

    def __init__(
        self,
        sim: PricedPlan,
        scenario: BandwidthScenario,
        iterations: int,
        record: bool,
        until_s: float | None,
        micro_batches: list[int],
        deadline: float | None = None,
        stop_s: float | None = None,
        *,
        pass_budget: int,
        deadline_every: int,
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
        self.pass_budget, self.deadline_every = pass_budget, deadline_every

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
                and self.events % self.deadline_every == 0
                and time.time() >= self.deadline
            ):
                raise OutOfTime

    def go(self) -> SimResult:
        self.change_index = 0
        for lk in self.sim.inst.spec.cluster.network.links:
            key = (lk.a, lk.b) if lk.a <= lk.b else (lk.b, lk.a)
            self.capacity_trace.setdefault(key, []).append((0.0, lk.gbps))
        times = []
        start = 0.0
        while len(times) < self.iterations or (self.until_s is not None and start < self.until_s):
            if times and self.passes_done >= self.pass_budget:
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

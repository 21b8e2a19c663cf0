"""A plan as the simulator replays it (DESIGN 5), priced once: each stage's forward and backward
times (`evaluate.plan_features` priced by `price_template`, TP collectives included), its sends
between stages, its gradient all-reduces among its template's replicas, the templates' exchange of
the reduced gradients and the capacities of the links its flows share. hetopt.sim.replay runs the
events over them; hetopt.sim.engine's Simulation is this with the replay's bounds and sampling.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np

from hetopt.cost import comm
from hetopt.cost.memory import stage_params
from hetopt.cost.profiles import Profiles
from hetopt.cost.terms import NET
from hetopt.errors import InputError, Problem
from hetopt.evaluate import (
    DP,
    by_stage,
    grad_comm_bytes,
    nic_columns,
    p2p_features,
    plan_features,
    price_template,
    rank_nodes,
    reshard_sends,
    stage_nodes,
)
from hetopt.placement import place
from hetopt.plan import Plan
from hetopt.sim.network import Link
from hetopt.spec.instance import Instance
from hetopt.verify import check_plan

Device = tuple[int, int, int]
"""(template, replica, stage)."""


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


class PricedPlan:
    """A plan checked, placed and priced for replay: what every pass, send and collective of an
    iteration costs, found once for all the replays of the plan.

    Parameters: inst — the instance; plan — the plan (checked, then placed); profiles — calibrated
    weights (default: shipped)."""

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
        self.act_bytes = (
            inst.format.act_bytes * self.plan.micro_batch * inst.seq_len * inst.model.hidden
        )
        self.transfers: dict[tuple[Device, Device], Transfer] = {}
        self.base_capacity = self._capacities()

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

    def passes(self, micro_batches: list[int]) -> int:
        """Forward and backward passes in one iteration with these micro-batches per template."""
        return sum(
            pipe.replicas * len(pipe.stages) * self.vp * 2 * m
            for pipe, m in zip(self.plan.pipelines, micro_batches, strict=True)
        )


def _fixed_s(features: np.ndarray, w: np.ndarray) -> float:
    """What a transfer costs besides its bytes on the network (latency, steps, any intra-node part):
    the flow model carries the NET term, the rest is paid after it."""
    return float(features @ w - features[NET] * w[NET])

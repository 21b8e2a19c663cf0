"""What a placed plan costs in dollars (docs/cost-model.md, "Dollars").

    usd_per_hour = Σ_{rented nodes} price_n + Σ_{island links ℓ} usd_per_gb_ℓ · GB_ℓ · 3600 / T
    usd_per_million_tokens = usd_per_hour / (3600 · tokens_per_s) · 10^6

Rented nodes are those the plan places ranks on (`rent: used`, the default: a node nobody uses is
not rented), or every node of the instance (`rent: all`). GB_ℓ counts the bytes one iteration moves
across link ℓ, both directions, at each link of a route a flow crosses:

- the point-to-point sends of every micro-batch across stage boundaries (activations forward,
  their gradients back, once per model chunk; hetopt.cost.transfers.boundary_sends);
- each stage's gradient ring among its data-parallel replicas: the hierarchical ring over the
  distinct nodes the cost model prices (features._dp_collective), each hop carrying 2(d − 1)/d of
  the stage's gradients (all TP ranks together) for d nodes; under ZeRO-2/3 its reduce-scatter per
  micro-batch, (d − 1)/d of the gradients, and its all-gathers of the 16-bit weights (ZeRO-2 once
  per iteration, ZeRO-3 twice per micro-batch), as features.zero_stage prices them;
- the exchange among templates (features.cross_template_exchange's flows).

None of this enters the time model: the prices only weigh what the time model predicts.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from itertools import pairwise

from hetopt.cost.features import cross_template_exchange, grad_comm_bytes
from hetopt.cost.flops import total_params
from hetopt.cost.memory import stage_params
from hetopt.cost.transfers import boundary_sends, rank_nodes, stage_nodes
from hetopt.placement import place
from hetopt.plan import Plan
from hetopt.spec.instance import Instance
from hetopt.spec.prices import GB

SECONDS_PER_HOUR = 3600.0


def per_million_tokens(usd_per_hour: float, seconds: float, tokens: float) -> float:
    """Dollars per million tokens of `tokens` trained in `seconds` at `usd_per_hour`."""
    return usd_per_hour * seconds / SECONDS_PER_HOUR / tokens * 1e6


@dataclass(frozen=True)
class PlanCost:
    """A plan's dollars: per hour of training and per million tokens; None where some node it pays
    for has no price (a custom GPU type without `usd_per_hour`)."""

    usd_per_hour: float | None
    usd_per_million_tokens: float | None
    nodes_usd_per_hour: float | None = None
    """The rented nodes' part of usd_per_hour."""
    transfer_usd_per_hour: float = 0.0
    """The priced links' part: data moved × usd_per_gb."""

    def to_json(self) -> dict:
        return {
            "usd_per_hour": self.usd_per_hour,
            "usd_per_million_tokens": self.usd_per_million_tokens,
        }


NO_COST = PlanCost(None, None)


def rented_nodes(inst: Instance, plan: Plan) -> list[str]:
    """The nodes a placed plan pays for: those it places ranks on, or every node (`inst.rent`)."""
    if inst.rent == "all":
        return list(inst.cluster.nodes)
    return sorted({node for e in plan.placement for node, _ in e.members})


def nodes_usd_per_hour(inst: Instance, nodes: list[str]) -> float | None:
    """Σ of the nodes' hourly prices; None if any has none."""
    prices = [inst.cluster.nodes[n].usd_per_hour for n in nodes]
    return None if any(p is None for p in prices) else float(sum(prices))


def plan_cost(inst: Instance, plan: Plan, iteration_time_s: float) -> PlanCost:
    """The dollars of a placed plan that takes `iteration_time_s` per iteration.

    Parameters: inst — the instance (its prices, its `rent`); plan — placed; iteration_time_s — the
    time model's (or a replay's mean) seconds per iteration, > 0.
    Returns: PlanCost (its fields None where a rented node has no price)."""
    plan = place(plan, inst.cluster)  # kept as given when placed
    nodes = nodes_usd_per_hour(inst, rented_nodes(inst, plan))
    if nodes is None or not (iteration_time_s > 0 and math.isfinite(iteration_time_s)):
        return NO_COST
    cluster = inst.cluster
    per_iteration = sum(
        cluster.link_usd_per_gb(u, v) * nbytes / GB
        for (u, v), nbytes in link_bytes(inst, plan).items()
    )
    transfer = per_iteration * SECONDS_PER_HOUR / iteration_time_s
    total = nodes + transfer
    tokens = inst.global_batch * inst.seq_len
    return PlanCost(total, per_million_tokens(total, iteration_time_s, tokens), nodes, transfer)


def link_bytes(inst: Instance, plan: Plan) -> Counter:
    """Bytes one iteration of a placed plan moves across each island link (keyed by the graph edge,
    both directions summed), as the module docstring counts them. Only priced links are walked."""
    cluster = inst.cluster
    priced = {
        (u, v)
        for u, v, d in cluster.graph.edges(data=True)
        if d.get("kind") == "link" and d.get("usd_per_gb", 0.0) > 0
    }
    out: Counter = Counter()
    if not priced:
        return out

    def carry(a: str, b: str, nbytes: float) -> None:
        for u, v in cluster.route(a, b).edges:
            edge = (u, v) if (u, v) in priced else (v, u)
            if edge in priced:
                out[edge] += nbytes

    for a, b, nbytes in _flows(inst, plan):
        if a != b:
            carry(a, b, nbytes)
    return out


def _flows(inst: Instance, plan: Plan):
    """(source node, destination node, bytes) of every transfer of one iteration."""
    fmt, model = inst.format, inst.model
    nodes_of = stage_nodes(plan)
    sharded = any(st.shards for pipe in plan.pipelines for st in pipe.stages)
    ranks_at = rank_nodes(plan) if sharded else {}
    sequence_bytes = fmt.act_bytes * inst.seq_len * model.hidden
    grad_bytes = grad_comm_bytes(inst)
    vp = plan.virtual_stages
    for j, pipe in enumerate(plan.pipelines):
        p = len(pipe.stages)
        for i, st in enumerate(pipe.stages):
            # sends: forward to i + 1 and back to i − 1, once per chunk (interleaved: the ends pass
            # on to each other's next chunk vp − 1 times)
            for way, times in ((1, vp if i < p - 1 else vp - 1), (-1, vp if i > 0 else vp - 1)):
                if times and p > 1:
                    sends = boundary_sends(
                        plan, j, i, (i + way) % p, nodes_of, ranks_at, sequence_bytes
                    )
                    for a, b, nbytes in sends:
                        yield a, b, nbytes * times * pipe.micro_batches
            every = (
                [n for nodes in ranks_at[(j, i)] for n in nodes] if st.shards else nodes_of[(j, i)]
            )
            params = stage_params(model, st.layers, i == 0, i == p - 1, p)
            yield from _ring(
                every, params * grad_bytes, params * fmt.weight_bytes, plan.zero, pipe.micro_batches
            )
    _, flows = cross_template_exchange(
        inst.cluster, plan, nodes_of, total_params(model) * grad_bytes
    )
    yield from flows


def _ring(nodes: list[str], grads: float, weights: float, zero: int, micro_batches: int):
    """The hops of a stage's data-parallel collectives over its distinct nodes: `grads` and
    `weights` are the stage's gradient and 16-bit weight bytes, all TP ranks together."""
    distinct = list(dict.fromkeys(nodes))
    d = len(distinct)
    if d < 2:
        return
    share = (d - 1) / d  # of the bytes each hop carries, per reduce-scatter or all-gather
    if zero <= 1:
        volume = 2 * share * grads  # the all-reduce
    else:
        gathers = 2 * micro_batches if zero >= 3 else 1
        volume = share * (grads * micro_batches + weights * gathers)
    for a, b in pairwise([*distinct, distinct[0]]):
        yield a, b, volume


def time_weighted(costs: list[tuple[float, PlanCost]], tokens_per_s: float) -> PlanCost:
    """The dollars of a run that switched plans: each plan's usd_per_hour weighted by the seconds it
    ran (`costs`: (seconds, its PlanCost)), per million of the run's tokens (`tokens_per_s` counts
    the switches' pauses, which are paid for and train nothing)."""
    ran_s = sum(s for s, _ in costs)
    if ran_s <= 0 or tokens_per_s <= 0 or any(c.usd_per_hour is None for _, c in costs):
        return NO_COST
    per_hour = sum(s * c.usd_per_hour for s, c in costs) / ran_s
    return PlanCost(per_hour, per_million_tokens(per_hour, 1.0, tokens_per_s))

"""A budget in dollars per hour as a constraint of the plan space (`solve --max-usd-per-hour`,
`hetopt pareto`; docs/dollars.md).

A plan's dollars per hour are the nodes it rents plus the data it moves over priced links
(hetopt.cost.dollars). The search keeps a plan only where they stay within the budget B:

- **Nodes of the tree.** Every skeleton below a node uses at least some GPUs of each device class:
  its templates' least replica counts × the GPUs of one replica. Each such GPU sits in a rented
  node, and a node costs at least its GPUs × the least price per GPU of its class, so

      usd_per_hour ≥ Σ_k GPUs_k × floor_k,   floor_k = min over class k's nodes of price / GPUs.

  A node whose floor exceeds B holds no plan within it: it is pruned unexpanded (`least`).
- **Leaves.** A placed skeleton rents known nodes: their price is exact (`rented`). One that
  exceeds B is pruned before its program is built.
- **Data moved.** Over priced links a plan also pays bytes × price ÷ its iteration time. A leaf's
  split of least time is checked after its solve: within B it is the leaf's optimum under the
  budget too (the budget only removes splits); over B, the leaf's best split within the budget is
  not known, and its time stays open as a bound (the answer is then not proven).

With `rent: all` every plan pays for every node: the budget then holds for every plan or for none.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass

from hetopt.cost.dollars import nodes_usd_per_hour, plan_cost, rented_nodes
from hetopt.errors import InputError, Problem
from hetopt.placement import place
from hetopt.plan import Plan
from hetopt.search.tree.base import Node, SkeletonNode
from hetopt.search.types import Skeleton
from hetopt.spec.instance import Instance

TRANSFER_RULE = "budget: its data moved over priced links takes it over --max-usd-per-hour"
TOLERANCE = 1e-9
"""Relative: a plan within this of the budget is within it (prices are sums of floats)."""


@dataclass(frozen=True)
class Budget:
    """The cap and what the search prices nodes with.

    usd_per_hour: the cap B; floors: (GPU type, island) → the least price per GPU-hour of the
    class's nodes; every_node: with `rent: all`, every plan's node price (None otherwise)."""

    usd_per_hour: float
    floors: dict[tuple[str, str], float]
    every_node: float | None = None
    nodes: dict[tuple[str, str], tuple[int, float] | None] | None = None
    """Per class, (GPUs, price) of its nodes where they are all alike, else None; the cheapest node
    of each class is in `cheapest`."""
    cheapest: dict[tuple[str, str], float] | None = None
    transfers: bool = False
    """Whether some link prices the data it carries (then a leaf's split is checked too)."""

    @classmethod
    def of(cls, inst: Instance, usd_per_hour: float) -> Budget:
        """The budget on `inst`'s prices. Raises: InputError (exit 2) for a budget that is not a
        finite number ≥ 0, or a node without a price (its plans could not be checked)."""
        if not (math.isfinite(usd_per_hour) and usd_per_hour >= 0):
            raise InputError(
                "--max-usd-per-hour",
                [Problem("--max-usd-per-hour", "give US$ per hour, 0 or more", usd_per_hour, True)],
            )
        check_prices(inst, "--max-usd-per-hour")
        floors: dict[tuple[str, str], float] = {}
        cheapest: dict[tuple[str, str], float] = {}
        kinds: dict[tuple[str, str], set] = {}
        for node in inst.cluster.nodes.values():
            key = (node.gpu, node.island)
            floors[key] = min(floors.get(key, math.inf), node.usd_per_hour / node.gpus)
            cheapest[key] = min(cheapest.get(key, math.inf), node.usd_per_hour)
            kinds.setdefault(key, set()).add((node.gpus, node.usd_per_hour))
        alike = {key: next(iter(k)) if len(k) == 1 else None for key, k in kinds.items()}
        every = nodes_usd_per_hour(inst, list(inst.cluster.nodes)) if inst.rent == "all" else None
        priced = any(lk.usd_per_gb > 0 for lk in inst.spec.cluster.network.links)
        return cls(usd_per_hour, floors, every, alike, cheapest, priced)

    def exceeds(self, usd_per_hour: float) -> bool:
        return usd_per_hour > self.usd_per_hour * (1 + TOLERANCE)

    def least(self, node: Node) -> float:
        """A lower bound on the node price of every skeleton below a tree node (0 for a kind of
        node it does not know: nothing is pruned)."""
        if self.every_node is not None:
            return self.every_node
        return sum(self.class_least(key, n) for key, n in least_gpus(node).items())

    def class_least(self, key: tuple[str, str], gpus: int) -> float:
        """The least the nodes holding `gpus` GPUs of one class cost: whole nodes where the class's
        nodes are alike (ceil(gpus / GPUs per node) × their price), else the larger of the
        cheapest node and the GPUs at the least price per GPU."""
        if gpus <= 0:
            return 0.0
        alike = (self.nodes or {}).get(key)
        if alike is not None:
            size, price = alike
            return math.ceil(gpus / size) * price
        return max(gpus * self.floors.get(key, 0.0), (self.cheapest or {}).get(key, 0.0))

    def node_caps(self, inst: Instance) -> dict[str, int]:
        """The most nodes of each group a plan within the budget can rent: floor(B / price), at most
        the group's count (every node where the price is 0). With `rent: all` every plan rents
        them all."""
        caps = {}
        for g in inst.spec.cluster.nodes:
            price = inst.cluster.nodes[f"{g.name}-0"].usd_per_hour or 0.0
            most = (
                g.rentable
                if price <= 0
                else math.floor(self.usd_per_hour * (1 + TOLERANCE) / price)
            )
            caps[g.name] = g.rentable if self.every_node is not None else min(g.rentable, most)
        return caps

    def over(self, node: Node) -> bool:
        """Whether no skeleton below `node` stays within the budget."""
        return self.exceeds(self.least(node))

    def rented(self, inst: Instance, plan: Plan) -> float:
        """The exact node price of a placed plan."""
        return nodes_usd_per_hour(inst, rented_nodes(inst, plan)) or 0.0

    def admits(self, inst: Instance, plan: Plan) -> bool:
        """Whether a plan known before the search (a seed) is within the budget, its transfers
        priced at its evaluated iteration time."""
        from hetopt.evaluate import evaluate

        placed = place(plan, inst.cluster)
        if self.exceeds(self.rented(inst, placed)):
            return False
        return self.within(inst, placed, evaluate(inst, placed).iteration_time_s)

    def within(self, inst: Instance, plan: Plan, iteration_time_s: float) -> bool:
        """Whether a placed plan of this iteration time, transfers included, is within the
        budget."""
        cost = plan_cost(inst, plan, iteration_time_s).usd_per_hour
        return cost is not None and not self.exceeds(cost)


def check_prices(inst: Instance, option: str) -> None:
    """Refuse an option that needs dollars on an instance where some node has no price."""
    missing = sorted({n.group for n in inst.cluster.nodes.values() if n.usd_per_hour is None})
    if missing:
        groups = [g for g in inst.spec.cluster.nodes if g.name in missing]
        raise InputError(
            option,
            [
                Problem(
                    f"cluster.nodes[{inst.spec.cluster.nodes.index(g)}].usd_per_hour",
                    f"{option} needs a price on every node: GPU type {g.gpu!r} has none in the "
                    "catalog; set usd_per_hour on the node group (or on cluster.gpus."
                    f"{g.gpu})",
                )
                for g in groups
            ],
        )


def skeleton_gpus(sk: Skeleton) -> Counter:
    """GPUs of each device class a skeleton uses."""
    out: Counter = Counter()
    if sk.shards:
        (t,) = sk.templates
        width = t.segments[0].width
        for seg, shards in zip(t.stage_list(), sk.shards, strict=True):
            if shards:
                for gpu, island, ranks, _ in shards:
                    out[(gpu, island)] += t.replicas * ranks * width
            else:
                out[(seg.gpu, seg.island)] += t.replicas * seg.width
        return out
    for t in sk.templates:
        _add_segments(out, t.segments, t.replicas)
    return out


def _add_segments(out: Counter, segments, replicas: int) -> None:
    for seg in segments:
        out[(seg.gpu, seg.island)] += replicas * seg.stages * seg.width


def least_gpus(node: Node) -> Counter:
    """The GPUs of each class every skeleton below a tree node uses at least: its templates' least
    replica counts (1 where the node does not fix them) × one replica's GPUs; one stage of each of
    its classes where the node fixes only the classes; nothing for a node that fixes none."""
    from hetopt.search.tree.families import BucketNode, FamilyNode, GroupNode
    from hetopt.search.tree.pairs import PairGroupNode, PairRangeNode, PairSubgroupNode
    from hetopt.search.tree.triples import TripleFamilyNode, TripleGroupNode, TripleSharesNode

    out: Counter = Counter()
    if isinstance(node, SkeletonNode):
        return skeleton_gpus(node.skeleton)
    if isinstance(node, GroupNode):
        _add_segments(out, node.group.segments, min(node.group.replica_options))
    elif isinstance(node, BucketNode):
        f = node.family
        for k, (dc, width) in enumerate(zip(f.classes, f.widths, strict=True)):
            stages = node.fixed[k] if k < len(node.fixed) else 1
            out[dc.key] += node.replicas * stages * width
    elif isinstance(node, FamilyNode):
        for dc, width in zip(node.family.classes, node.family.widths, strict=True):
            out[dc.key] += width
    elif isinstance(node, (PairGroupNode, PairRangeNode, PairSubgroupNode)):
        g = node.group
        ra, rb = min(g.a_replicas), min(g.b_replicas)
        if isinstance(node, PairSubgroupNode) or (
            isinstance(node, PairRangeNode) and not node.rows
        ):
            ra = node.ra
        if isinstance(node, PairSubgroupNode):
            rb = node.rb
        _add_segments(out, g.a, ra)
        _add_segments(out, g.b, rb)
    elif isinstance(node, (TripleGroupNode, TripleSharesNode)):
        g = node.group
        counts = node.lowest if isinstance(node, TripleGroupNode) else node.replicas
        for side, r in zip(g.sides, counts, strict=True):
            _add_segments(out, side, r)
    elif isinstance(node, TripleFamilyNode):
        for dc, tp in node.family.runs:  # triples run without context parallelism
            out[dc.key] += tp
    return out


def least_rent(inst: Instance) -> tuple[float, str]:
    """A lower bound on what any plan that holds the model rents per hour, and its reason: the
    weights, gradients and optimizer state must fit in the GPU memory rented, so the cheapest GPU
    memory per GiB is filled first (node granularity and activations ignored: a bound).
    Returns: (US$ per hour, the sentence)."""
    from hetopt.cost.flops import total_params
    from hetopt.cost.memory import GIB

    need_gib = total_params(inst.model) * inst.format.state_bytes_per_param() / GIB
    classes = []  # ($ per GiB-hour, GiB per GPU, GPUs, name)
    for node in inst.cluster.nodes.values():
        gib = inst.gpu_types[node.gpu].usable_memory_gib
        if node.usd_per_hour is not None:
            classes.append((node.usd_per_hour / node.gpus / gib, gib, node.gpus, node.gpu))
    left, usd = need_gib, 0.0
    for per_gib, gib, gpus, _ in sorted(classes):
        take = min(left, gib * gpus)
        usd += take * per_gib
        left -= take
        if left <= 0:
            break
    cheapest = min(classes, default=None)
    where = f", in {cheapest[3]} memory at ${cheapest[0]:.4f} per GiB-hour" if cheapest else ""
    return usd, (
        f"at least ${usd:,.2f}/h (the model's weights, gradients and optimizer state take "
        f"{need_gib:,.1f} GiB{where})"
    )


def capped(inst: Instance, budget: Budget) -> Instance:
    """The instance with each node group cut to the nodes a plan within the budget can rent
    (`Budget.node_caps`; a group none of whose nodes fits keeps one, which the budget prunes):
    every plan within the budget has one of the same time on these nodes (a group's nodes are alike,
    and a plan's rented nodes are those its ranks sit on), and the search's bounds then count only
    GPUs a plan could pay for. The nodes kept are the first of each group, so a plan's node names
    are the full instance's."""
    caps = budget.node_caps(inst)
    if all(caps[g.name] >= g.rentable for g in inst.spec.cluster.nodes):
        return inst
    from dataclasses import replace

    groups = [g.model_copy(update={"count": max(1, caps[g.name])}) for g in inst.spec.cluster.nodes]
    cluster = inst.spec.cluster.model_copy(update={"nodes": groups})
    return replace(inst, spec=inst.spec.model_copy(update={"cluster": cluster}))

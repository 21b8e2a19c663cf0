"""What switching plans costs (issue 15): the model state that must move between GPUs, and its time.

A GPU of the new plan needs, for each transformer layer it holds (and the embedding or head), its shard of
the 16-bit weights (1/tp of the layer's WEIGHT_BYTES per parameter) and of the optimizer state
(OPTIMIZER_BYTES per parameter: fp32 master weights and Adam's two moments; 1/(tp·dp) with ZeRO-1 and up,
1/tp without). Gradients are not moved: a switch happens between iterations, when they are rebuilt. A GPU
keeps what it already holds in the old plan at the same shard — the same layer, TP degree and rank, and for
the optimizer state the same data-parallel width and rank; the rest it fetches from the nearest GPU of
the old plan that holds the same part (same node first, then the widest route).

Time: every transfer runs at once, each limited by its route (`Cluster.route`: α + bytes / bandwidth);
the transfers into a node and out of a node share its NIC. The migration time is the largest of the
slowest route's transfer and each node's NIC load (bytes in or out over `nic_gbps`) — the lower bound of
a schedule that keeps every link busy.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from hetopt.cost.flops import embedding_params, head_params, layer_params
from hetopt.cost.memory import OPTIMIZER_BYTES, WEIGHT_BYTES
from hetopt.export.rankmap import RankMap, rank_map
from hetopt.placement import place
from hetopt.plan import Plan
from hetopt.spec.cluster import Cluster
from hetopt.spec.instance import Instance

EMBEDDING, HEAD = -1, -2
"""Part keys of the embedding and the head beside the transformer layers 0…L−1."""


@dataclass(frozen=True)
class Migration:
    """The state a switch moves: bytes per (source node, destination node), and the time it takes."""

    bytes_by_route: dict[tuple[str, str], float]
    time_s: float

    @property
    def total_bytes(self) -> float:
        return sum(self.bytes_by_route.values())


def _pieces(inst: Instance, rm: RankMap, zero: int) -> dict[tuple[str, int], dict[tuple, float]]:
    """What each GPU (node, gpu) holds: piece key → bytes. A weight piece is (part, "w", tp, tp rank), an
    optimizer piece (part, "o", tp, tp rank, dp width, dp rank); a part is a layer index, EMBEDDING or
    HEAD."""
    m = inst.model
    out: dict[tuple[str, int], dict[tuple, float]] = defaultdict(dict)
    for r in rm.ranks:
        tp, dp = len(r.tp_group), len(r.dp_group)
        parts = [(layer, layer_params(m)) for first, n in r.chunks for layer in range(first, first + n)]
        if r.embedding:
            parts.append((EMBEDDING, embedding_params(m)))
        if r.head:
            parts.append((HEAD, head_params(m)))
        shard = dp if zero >= 1 else 1
        dp_rank = r.dp_rank if zero >= 1 else 0
        for part, params in parts:
            held = out[(r.node, r.gpu)]
            held[(part, "w", tp, r.tp_rank)] = params * WEIGHT_BYTES / tp
            held[(part, "o", tp, r.tp_rank, shard, dp_rank)] = params * OPTIMIZER_BYTES / (tp * shard)
    return out


def migration(inst: Instance, old: Plan, new: Plan, cluster: Cluster | None = None) -> Migration:
    """The state moved, and the time, to switch from plan `old` to plan `new`.

    Parameters: inst — the instance both plans are for; old, new — the plans (placed or not; placed as
    hetopt places them); cluster — the cluster as it is at the switch (default the instance's: a changed
    link bandwidth prices the moves at that bandwidth).
    Returns: the Migration (bytes per route, seconds)."""
    cluster = cluster or inst.cluster
    before = _pieces(inst, rank_map(inst, place(old, inst.cluster)), old.zero)
    after = _pieces(inst, rank_map(inst, place(new, inst.cluster)), new.zero)
    holders: dict[tuple, list[tuple[str, int]]] = defaultdict(list)
    for gpu, held in before.items():
        for key in held:
            holders[key].append(gpu)
    moved: dict[tuple[str, str], float] = defaultdict(float)
    for (node, gpu), needed in after.items():
        for key, nbytes in needed.items():
            if key in before.get((node, gpu), {}):
                continue
            sources = holders.get(key) or _any_holder(key, holders)
            src = min(sources, key=lambda g: (g[0] != node, -cluster.route(g[0], node).effective_gbps))
            moved[(src[0], node)] += nbytes
    return Migration(dict(moved), _time_s(cluster, moved))


def _any_holder(key: tuple, holders: dict[tuple, list[tuple[str, int]]]) -> list[tuple[str, int]]:
    """Where a piece of another shape is held (the same part, resharded: a different TP or data-parallel
    split): every GPU holding any piece of the same part and kind — it is read from one of them."""
    return [g for k, gpus in holders.items() if k[:2] == key[:2] for g in gpus]


def _time_s(cluster: Cluster, moved: dict[tuple[str, str], float]) -> float:
    """The largest of each route's transfer time and each node's NIC load (module docstring)."""
    if not moved:
        return 0.0
    routes = max(cluster.route(a, b).alpha_s + 8 * nbytes / (cluster.route(a, b).effective_gbps * 1e9)
                 for (a, b), nbytes in moved.items())
    nic_in: dict[str, float] = defaultdict(float)
    nic_out: dict[str, float] = defaultdict(float)
    for (a, b), nbytes in moved.items():
        if a != b:
            nic_out[a] += nbytes
            nic_in[b] += nbytes
    nics = max([8 * v / (cluster.nodes[n].nic_gbps * 1e9) for load in (nic_in, nic_out) for n, v in load.items()],
               default=0.0)
    return max(routes, nics)

"""What switching plans costs (issue 15): the model state that must move between GPUs, and its time.

A GPU of the new plan needs, for each transformer layer it holds (and the embedding or head), its
shard of the weights (1/tp of the format's weight bytes per parameter; 1/(tp·dp) under ZeRO-3)
and of the optimizer state (the format's optimizer bytes per parameter: fp32 master and Adam's two
moments; 1/(tp·dp) with ZeRO-1 and up, 1/tp without). Gradients are not moved: a switch happens
between iterations, when they are rebuilt. A GPU keeps what it already holds in the old plan at the
same shard — the same layer, TP degree and rank, and for the optimizer state the same data-parallel
width and rank; the rest it fetches from the nearest GPU of the old plan that holds the same part
(same node first, then the widest route).

Time: the cost model's own (hetopt.cost.transfers.slowest_transfer, as the evaluator prices
concurrent sends): the moves between each pair of nodes run at once as one flow each, the flows
crossing a link sharing it evenly (`shared_gbps`), each an alpha-beta transfer over its route; the
slowest flow's features priced with the calibrated network weights. The bytes between two nodes go
as one flow: a bound from above where several GPUs of a node could send side by side.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass

from hetopt.cost.flops import embedding_params, head_params, layer_params
from hetopt.cost.profiles import Profiles
from hetopt.cost.transfers import slowest_transfer
from hetopt.export.rankmap import RankMap, rank_map
from hetopt.placement import place
from hetopt.plan import Plan
from hetopt.spec.cluster import Cluster
from hetopt.spec.instance import Instance

EMBEDDING, HEAD = -1, -2
"""Part keys of the embedding and the head beside the transformer layers 0…L−1."""


@dataclass(frozen=True)
class Migration:
    """The state a switch moves: bytes per (source node, destination node), and the time it
    takes."""

    bytes_by_route: dict[tuple[str, str], float]
    time_s: float

    @property
    def total_bytes(self) -> float:
        return sum(self.bytes_by_route.values())


def _pieces(inst: Instance, rm: RankMap, zero: int) -> dict[tuple[str, int], dict[tuple, float]]:
    """What each GPU (node, gpu) holds: piece key → bytes. A piece is (part, "w" for weights or "o"
    for optimizer state, tp, tp rank, its shards over the data-parallel group, its rank there); a
    part is a layer index, EMBEDDING or HEAD."""
    m = inst.model
    out: dict[tuple[str, int], dict[tuple, float]] = defaultdict(dict)
    for r in rm.ranks:
        tp, dp = len(r.tp_group), len(r.dp_group)
        parts = [
            (layer, layer_params(m)) for first, n in r.chunks for layer in range(first, first + n)
        ]
        if r.embedding:
            parts.append((EMBEDDING, embedding_params(m)))
        if r.head:
            parts.append((HEAD, head_params(m)))
        # ZeRO-1 and up shard the optimizer state over the data-parallel group, ZeRO-3 the weights
        # too (memory.model_state_bytes)
        shard = dp if zero >= 1 else 1
        dp_rank = r.dp_rank if zero >= 1 else 0
        w_shard, w_rank = (shard, dp_rank) if zero >= 3 else (1, 0)
        fmt = inst.format
        for part, params in parts:
            held = out[(r.node, r.gpu)]
            held[(part, "w", tp, r.tp_rank, w_shard, w_rank)] = (
                params * fmt.weight_bytes / (tp * w_shard)
            )
            held[(part, "o", tp, r.tp_rank, shard, dp_rank)] = (
                params * fmt.optimizer_bytes / (tp * shard)
            )
    return out


def migration(inst: Instance, old: Plan, new: Plan, profiles: Profiles | None = None) -> Migration:
    """The state moved, and the time, to switch from plan `old` to plan `new`.

    Parameters: inst — the instance both plans are for, on the network as it is at the switch
    (Instance.on_network: a changed link prices the moves at its bandwidth); old, new — the plans
    (placed or not; placed as hetopt places them); profiles — calibrated weights (default shipped).
    Returns: the Migration (bytes per route, seconds)."""
    cluster = inst.cluster
    before = _pieces(inst, rank_map(inst, place(old, inst.cluster)), old.zero)
    after = _pieces(inst, rank_map(inst, place(new, inst.cluster)), new.zero)
    holders: dict[tuple, list[tuple[str, int]]] = defaultdict(list)
    for gpu, held in before.items():
        for key in held:
            holders[key].append(gpu)
    moved: dict[tuple[str, str], float] = defaultdict(float)
    # (nodes holding a piece, destination) → source node
    nearest: dict[tuple[frozenset[str], str], str] = {}
    for (node, gpu), needed in after.items():
        for key, nbytes in needed.items():
            if key in before.get((node, gpu), {}):
                continue
            nodes = frozenset(g[0] for g in holders.get(key) or _any_holder(key, holders))
            if (nodes, node) not in nearest:
                nearest[(nodes, node)] = min(
                    sorted(nodes), key=lambda n: (n != node, -cluster.route(n, node).effective_gbps)
                )
            moved[(nearest[(nodes, node)], node)] += nbytes
    return Migration(dict(moved), _time_s(cluster, moved, profiles or Profiles()))


def _any_holder(key: tuple, holders: dict[tuple, list[tuple[str, int]]]) -> list[tuple[str, int]]:
    """Where a piece of another shape is held (the same part, resharded: a different TP or
    data-parallel split): every GPU holding any piece of the same part and kind — it is read from
    one of them."""
    return [g for k, gpus in holders.items() if k[:2] == key[:2] for g in gpus]


def _time_s(cluster: Cluster, moved: dict[tuple[str, str], float], profiles: Profiles) -> float:
    """Seconds of the moves, all at once (module docstring)."""
    if not moved:
        return 0.0
    sends = [(cluster.route(a, b), nbytes) for (a, b), nbytes in moved.items()]
    load = Counter(e for route, _ in sends if not route.intra_node for e in route.edges)
    # network terms: not fitted per GPU type
    gpu = cluster.gpu_types[next(iter(cluster.nodes.values())).gpu]
    return float(slowest_transfer(sends, load) @ profiles.for_gpu(gpu).w)

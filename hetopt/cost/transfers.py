"""Point-to-point transfers of a placed plan (DESIGN 3): where each stage's ranks sit, the sends
of one micro-batch across a stage boundary (one per replica, or between the shards of stages with
shards), and the features of the slowest of concurrent sends that share links.

hetopt.cost.features prices a plan's sends and gradient rings with them, the simulator replays the
same sends, and the search's bounds and the migration's time use the same link sharing.
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from hetopt.cost import comm
from hetopt.plan import Plan


def stage_nodes(plan: Plan) -> dict[tuple[int, int], list[str]]:
    """(template, stage) → the node of each replica (of its first data-parallel rank, with
    shards)."""
    out: dict[tuple[int, int], list[str]] = {}
    for e in sorted(plan.placement, key=lambda e: (e.pipeline, e.stage, e.replica)):
        if e.rank == 0:
            out.setdefault((e.pipeline, e.stage), []).append(e.node)
    return out


def rank_nodes(plan: Plan) -> dict[tuple[int, int], list[list[str]]]:
    """(template, stage) → per replica, the node of each of the stage's data-parallel ranks in rank
    order."""
    out: dict[tuple[int, int], list[list[str]]] = {}
    for e in sorted(plan.placement, key=lambda e: (e.pipeline, e.stage, e.replica, e.rank)):
        per_replica = out.setdefault((e.pipeline, e.stage), [])
        if e.rank == 0:
            per_replica.append([])
        per_replica[-1].append(e.node)
    return out


def shard_ranks(st, k: int) -> range:
    """The rank indices (inside one replica) of shard k of stage `st` (range(1) without shards)."""
    if not st.shards:
        return range(1)
    start = sum(sh.ranks for sh in st.shards[:k])
    return range(start, start + st.shards[k].ranks)


def rank_sequences(st, micro_batch: int) -> list[tuple[int, int]]:
    """The sequences [first, end) of a micro-batch that each data-parallel rank of a stage runs, in
    rank order: the shards' ranks take consecutive runs of `sequences` each."""
    out, at = [], 0
    for sh in st.ranks_of(micro_batch):
        for _ in range(sh.ranks):
            out.append((at, at + sh.sequences))
            at += sh.sequences
    return out


def boundary_sends(
    plan: Plan, j: int, i: int, to: int, nodes_of, ranks_at, sequence_bytes: float
) -> list[tuple[str, str, float]]:
    """Every send of one micro-batch from stage i to stage `to` of template j, all replicas: one per
    replica (the whole micro-batch) between stages without shards, else `reshard_sends`."""
    stages = plan.pipelines[j].stages
    if not (stages[i].shards or stages[to].shards):
        nbytes = plan.micro_batch * sequence_bytes
        return [(a, b, nbytes) for a, b in zip(nodes_of[(j, i)], nodes_of[(j, to)], strict=True)]
    return reshard_sends(plan, j, i, to, ranks_at, sequence_bytes)


def reshard_sends(
    plan: Plan,
    j: int,
    i: int,
    to: int,
    ranks_at,
    sequence_bytes: float,
    replicas: range | None = None,
) -> list[tuple[str, str, float]]:
    """Every send of one micro-batch's activations (or gradients) from stage i to stage `to` of
    template j, in all replicas at once (or in `replicas`): (source node, destination node, bytes)
    for each pair of ranks whose sequences overlap, `sequence_bytes` per sequence — one send per
    replica when neither stage has shards."""
    pipe = plan.pipelines[j]
    src = rank_sequences(pipe.stages[i], plan.micro_batch)
    dst = rank_sequences(pipe.stages[to], plan.micro_batch)
    out = []
    for r in replicas if replicas is not None else range(pipe.replicas):
        for a, (lo, hi) in zip(ranks_at[(j, i)][r], src, strict=True):
            for b, (lo2, hi2) in zip(ranks_at[(j, to)][r], dst, strict=True):
                if min(hi, hi2) > max(lo, lo2):
                    out.append((a, b, (min(hi, hi2) - max(lo, lo2)) * sequence_bytes))
    return out


def p2p_features(
    cluster, src_nodes: list[str], dst_nodes: list[str], nbytes: float, tp: int
) -> np.ndarray:
    """One activation (or gradient) send across a stage boundary, `nbytes` from each replica's node
    in `src_nodes` to its node in `dst_nodes`: the slowest replica's (`send_features`)."""
    return send_features(
        cluster, [(a, b, nbytes) for a, b in zip(src_nodes, dst_nodes, strict=True)], tp
    )


def send_features(
    cluster, sends: list[tuple[str, str, float]], tp: int, sources: set[str] | None = None
) -> np.ndarray:
    """Features of the slowest of concurrent sends (source node, destination node, bytes) — of those
    from `sources` when given, all of them sharing the links.

    Each TP rank sends its 1/tp share (Megatron's scatter-gather); inside a node every rank has its
    own link, across nodes all shares go through the node's bottleneck. The replicas of a template
    cross the same boundary at about the same time (1F1B runs them in lockstep), so flows in the
    same direction on one link share it: a send of b bytes over a link that carries B bytes of such
    sends in all ends when the link has carried all B — it runs at b/B of the link (max-min shares,
    which the simulator gives them, leave a link busy until its last byte; with equal sends that is
    1/n of it each).
    """
    pairs = Counter(sends)
    routes = {key: cluster.route(key[0], key[1]) for key in pairs}
    carried: Counter = Counter()  # bytes over each link
    for key, n in pairs.items():
        if not routes[key].intra_node:
            for edge in routes[key].edges:
                carried[edge] += n * key[2]

    def send(key) -> tuple:
        route = routes[key]
        if route.intra_node:
            return route, key[2] / tp, route.effective_gbps
        # c / (B / b): exactly c / n for n equal sends
        return (
            route,
            key[2],
            min(
                c / (carried[e] / key[2])
                for e, c in zip(route.edges, route.edge_effective, strict=True)
            ),
        )

    def seconds(item) -> float:
        route, nbytes, gbps = item
        return nbytes / (gbps * comm.GBIT) + route.latency_us * 1e-6 + route.alpha_s

    route, nbytes, gbps = max(
        (send(key) for key in pairs if sources is None or key[0] in sources), key=seconds
    )
    return comm.transfer(
        nbytes, gbps, route.intra_node, latency_s=route.latency_us * 1e-6, alpha_s=route.alpha_s
    )


def shared_gbps(route, load: Counter) -> float:
    """A flow's bandwidth along `route` when `load[e]` flows share each link e evenly (their max-min
    fair share when all run at once); inside a node, the node's interconnect."""
    if route.intra_node:
        return route.effective_gbps
    return min(c / max(1, load[e]) for e, c in zip(route.edges, route.edge_effective, strict=True))


def slowest_transfer(sends: list[tuple], load: Counter) -> np.ndarray:
    """Features of the slowest of concurrent sends (route, bytes) sharing links as `load` counts."""

    def seconds(send) -> float:
        route, nbytes = send
        return (
            nbytes / (shared_gbps(route, load) * comm.GBIT)
            + route.latency_us * 1e-6
            + route.alpha_s
        )

    route, nbytes = max(sends, key=seconds)
    return comm.transfer(
        nbytes,
        shared_gbps(route, load),
        route.intra_node,
        latency_s=route.latency_us * 1e-6,
        alpha_s=route.alpha_s,
    )

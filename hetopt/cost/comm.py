"""Collectives and point-to-point transfers as alpha–beta cost features (DESIGN 3).

Ring all-reduce of B bytes over n ranks moves 2(n−1)/n · B bytes per rank in 2(n−1) steps; reduce-scatter
and all-gather move half of that in n − 1 steps (Thakur et al. 2005; Patarasuk & Yuan 2009). A transfer
over an intra-node link is a LINK term, over NICs and island links a NET term; each step costs α (STEP).
Hierarchical all-reduce across nodes: reduce-scatter inside each node, all-reduce of the node's share
across nodes, all-gather inside each node.
"""

from __future__ import annotations

import numpy as np

from hetopt.cost.terms import LAT, LINK, NET, STEP, zeros

GBIT = 1e9 / 8
"""Bytes per second in one Gbit/s."""


def transfer(nbytes: float, gbps: float, intra_node: bool, steps: float = 1.0, latency_s: float = 0.0) -> np.ndarray:
    """Sending `nbytes` over a path of `gbps` bottleneck bandwidth in `steps` steps, each of which also
    pays the path's physical latency."""
    v = zeros()
    v[LINK if intra_node else NET] = nbytes / (gbps * GBIT)
    v[STEP] = steps
    v[LAT] = steps * latency_s
    return v


def all_reduce(nbytes: float, ranks: int, gbps: float, intra_node: bool, latency_s: float = 0.0) -> np.ndarray:
    if ranks <= 1:
        return zeros()
    return transfer(2 * (ranks - 1) / ranks * nbytes, gbps, intra_node, 2 * (ranks - 1), latency_s)


def reduce_scatter(nbytes: float, ranks: int, gbps: float, intra_node: bool, latency_s: float = 0.0) -> np.ndarray:
    if ranks <= 1:
        return zeros()
    return transfer((ranks - 1) / ranks * nbytes, gbps, intra_node, ranks - 1, latency_s)


all_gather = reduce_scatter
"""All-gather moves the same bytes in the same steps as reduce-scatter."""


def hierarchical_all_reduce(rank_bytes: float, per_node: int, nodes: int, intra_gbps: float, inter_gbps: float,
                            columns: int = 1, inter_latency_s: float = 0.0) -> np.ndarray:
    """All-reduce of `rank_bytes` per rank, `per_node` ranks of the group in each of `nodes` nodes.

    `columns` groups of this shape run at once on the same nodes (the TP ranks of a stage each have their
    own data-parallel group). After the intra-node reduce-scatter every GPU holds 1/per_node of its data,
    so each node pushes 2(N−1)/N · columns · rank_bytes through `inter_gbps`, its bottleneck to the others.
    """
    if nodes <= 1:
        return all_reduce(rank_bytes, per_node, intra_gbps, intra_node=True)
    return (reduce_scatter(rank_bytes, per_node, intra_gbps, intra_node=True)
            + all_reduce(columns * rank_bytes, nodes, inter_gbps, intra_node=False, latency_s=inter_latency_s)
            + all_gather(rank_bytes, per_node, intra_gbps, intra_node=True))


def hierarchical_reduce_scatter(rank_bytes: float, per_node: int, nodes: int, intra_gbps: float, inter_gbps: float,
                                columns: int = 1, inter_latency_s: float = 0.0) -> np.ndarray:
    """Reduce-scatter of `rank_bytes` per rank over `per_node` ranks in each of `nodes` nodes (shapes as in
    `hierarchical_all_reduce`): inside each node first, then the node's share across nodes — each node
    pushes (N−1)/N · columns · rank_bytes through `inter_gbps`. Half of the hierarchical all-reduce: with
    the all-gather below it adds up to it term by term."""
    if nodes <= 1:
        return reduce_scatter(rank_bytes, per_node, intra_gbps, intra_node=True)
    return (reduce_scatter(rank_bytes, per_node, intra_gbps, intra_node=True)
            + reduce_scatter(columns * rank_bytes, nodes, inter_gbps, intra_node=False, latency_s=inter_latency_s))


hierarchical_all_gather = hierarchical_reduce_scatter
"""The same bytes and steps in the other direction (across nodes first, then inside each node)."""

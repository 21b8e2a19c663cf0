"""Collectives and point-to-point transfers as alpha–beta cost features (docs/cost-model.md).

Ring all-reduce of B bytes over n ranks moves 2(n−1)/n · B bytes per rank in 2(n−1) steps;
reduce-scatter and all-gather move half of that in n − 1 steps (Thakur et al. 2005; Patarasuk & Yuan
2009). A transfer over an intra-node link is a LINK term, over NICs and island links a NET term:
seconds at the path's effective bandwidth (nominal × the fabric's achieved fraction η,
hetopt/spec/fabrics.py). Each step counts once in STEP (the framework's per-step overhead, a
calibrated weight) and pays the path's physical latency plus the fabric's per-step latency α in LAT.
Hierarchical all-reduce across nodes: reduce-scatter inside each node, all-reduce of the node's
share across nodes, all-gather inside each node; NCCL pipelines chunks through the phases, so the
intra-node bytes hide behind the inter-node ones (or the reverse): the slower phase's seconds count,
every step counts. The max is taken on the features (seconds at the fabrics' achieved bandwidth),
before the profile's LINK and NET weights multiply them: exact when the two are equal; where a
fitted LINK exceeds NET the hidden intra-node seconds are priced as if at NET's weight (too cheap by
at most 1 − NET/LINK of the intra-node phase).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hetopt.cost.terms import LAT, LINK, NET, STEP, zeros

GBIT = 1e9 / 8
"""Bytes per second in one Gbit/s."""


def transfer(
    nbytes: float,
    gbps: float,
    intra_node: bool,
    steps: float = 1.0,
    latency_s: float = 0.0,
    alpha_s: float = 0.0,
) -> np.ndarray:
    """Sending `nbytes` over a path of `gbps` effective bottleneck bandwidth in `steps` steps, each
    of which also pays the path's physical latency and the fabric's per-step latency `alpha_s`."""
    v = zeros()
    v[LINK if intra_node else NET] = nbytes / (gbps * GBIT)
    v[STEP] = steps
    v[LAT] = steps * (latency_s + alpha_s)
    return v


def all_reduce(
    nbytes: float,
    ranks: int,
    gbps: float,
    intra_node: bool,
    latency_s: float = 0.0,
    alpha_s: float = 0.0,
) -> np.ndarray:
    if ranks <= 1:
        return zeros()
    return transfer(
        2 * (ranks - 1) / ranks * nbytes, gbps, intra_node, 2 * (ranks - 1), latency_s, alpha_s
    )


def reduce_scatter(
    nbytes: float,
    ranks: int,
    gbps: float,
    intra_node: bool,
    latency_s: float = 0.0,
    alpha_s: float = 0.0,
) -> np.ndarray:
    if ranks <= 1:
        return zeros()
    return transfer((ranks - 1) / ranks * nbytes, gbps, intra_node, ranks - 1, latency_s, alpha_s)


all_gather = reduce_scatter
"""All-gather moves the same bytes in the same steps as reduce-scatter."""

KINDS = {"all_reduce": all_reduce, "reduce_scatter": reduce_scatter, "all_gather": all_gather}


def group_gbps(path, ranks: int) -> float:
    """Effective bandwidth of a group of `ranks` on `path` (a spec.cluster.Route): on a mesh fabric
    a GPU reaches each peer over its own link, so the group uses ranks − 1 of its `mesh_peers`
    links."""
    if path.mesh_peers:
        return path.effective_gbps * min(1.0, (ranks - 1) / path.mesh_peers)
    return path.effective_gbps


@dataclass(frozen=True)
class Span:
    """A group over `nodes` nodes, `per_node` of its ranks in each (a TP group wider than a node, a
    stage's data-parallel replicas): inside each node on `intra` (its Route), across the nodes at
    `inter_gbps` (their route's effective bandwidth, physical latency `latency_s`, fabric latency
    `alpha_s` per step); `columns` such groups run at once on the same nodes (see
    `hierarchical_all_reduce`)."""

    per_node: int
    nodes: int
    inter_gbps: float
    latency_s: float
    alpha_s: float
    intra: object
    columns: int = 1


def collective(kind: str, nbytes: float, ranks: int, path) -> np.ndarray:
    """A collective of `nbytes` per rank over `path` (a spec.cluster.Route: effective bandwidth,
    fabric latency per step, physical latency; or a Span: hierarchical over its nodes) — the one
    place a collective meets its fabric."""
    if isinstance(path, Span):
        hierarchical = (
            hierarchical_all_reduce if kind == "all_reduce" else hierarchical_reduce_scatter
        )
        return hierarchical(
            nbytes,
            path.per_node,
            path.nodes,
            path.intra,
            path.inter_gbps,
            columns=path.columns,
            inter_latency_s=path.latency_s,
            inter_alpha_s=path.alpha_s,
        )
    return KINDS[kind](
        nbytes,
        ranks,
        group_gbps(path, ranks),
        path.intra_node,
        path.latency_us * 1e-6,
        path.alpha_s,
    )


def hierarchical_all_reduce(
    rank_bytes: float,
    per_node: int,
    nodes: int,
    intra,
    inter_gbps: float,
    columns: int = 1,
    inter_latency_s: float = 0.0,
    inter_alpha_s: float = 0.0,
) -> np.ndarray:
    """All-reduce of `rank_bytes` per rank, `per_node` ranks of the group in each of `nodes` nodes;
    `intra` is the nodes' intra-node path (a Route), `inter_gbps` the effective bandwidth between
    nodes.

    `columns` groups of this shape run at once on the same nodes (the TP ranks of a stage each have
    their own data-parallel group). After the intra-node reduce-scatter every GPU holds 1/per_node
    of its data, so each node pushes 2(N−1)/N · columns · rank_bytes through `inter_gbps`, its
    bottleneck to the others. The phases are pipelined: max(intra, inter) feature seconds, written
    as inter + the intra excess.
    """
    if nodes <= 1:
        return collective("all_reduce", rank_bytes, per_node, intra)
    inside = collective("reduce_scatter", rank_bytes, per_node, intra) + collective(
        "all_gather", rank_bytes, per_node, intra
    )
    across = all_reduce(
        columns * rank_bytes,
        nodes,
        inter_gbps,
        intra_node=False,
        latency_s=inter_latency_s,
        alpha_s=inter_alpha_s,
    )
    inside[LINK] = max(0.0, inside[LINK] - across[NET])
    return inside + across


def hierarchical_reduce_scatter(
    rank_bytes: float,
    per_node: int,
    nodes: int,
    intra,
    inter_gbps: float,
    columns: int = 1,
    inter_latency_s: float = 0.0,
    inter_alpha_s: float = 0.0,
) -> np.ndarray:
    """Reduce-scatter of `rank_bytes` per rank over `per_node` ranks in each of `nodes` nodes
    (shapes as in `hierarchical_all_reduce`): inside each node first, then the node's share across
    nodes — each node pushes (N−1)/N · columns · rank_bytes through `inter_gbps`; the phases
    pipelined the same way. Half of the hierarchical all-reduce."""
    if nodes <= 1:
        return collective("reduce_scatter", rank_bytes, per_node, intra)
    inside = collective("reduce_scatter", rank_bytes, per_node, intra)
    across = reduce_scatter(
        columns * rank_bytes,
        nodes,
        inter_gbps,
        intra_node=False,
        latency_s=inter_latency_s,
        alpha_s=inter_alpha_s,
    )
    inside[LINK] = max(0.0, inside[LINK] - across[NET])
    return inside + across


hierarchical_all_gather = hierarchical_reduce_scatter
"""The same bytes and steps in the other direction (across nodes first, then inside each node)."""

"""Interchangeable islands: one choice, not many.

Two islands are interchangeable when swapping their names changes nothing the cost model reads:
the same node groups in the same order (GPU type, GPUs per node, NIC, fabrics), the same links to
every other island (a graph automorphism of the island links), the same widest paths between every
pair of islands mapped onto each other (so every route, its links and their sharing map exactly),
and no bandwidth scenario naming either. Swaps compose, so the islands fall into blocks, and any
permutation within a block maps every plan to one of the same time.

A one-template family is then searched only in its canonical form: the islands of each block
numbered in the order the family's classes first use them (`canonical`). Every family's orbit holds
exactly one canonical family, and the families enumerate every ordered run of classes, so the
canonical ones cover the space: each pruned family has a searched twin of the same times.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Sequence

from hetopt.spec.cluster import DeviceClass, island_vertex
from hetopt.spec.instance import Instance

Blocks = dict[str, tuple[str, ...]]
"""Island → its block of interchangeable islands (in the cluster's order); islands alone are left
out."""


def island_blocks(inst: Instance) -> Blocks:
    """The blocks of interchangeable islands (module docstring), each island of a block of two or
    more mapped to its block."""
    islands = inst.cluster.islands
    parent = {i: i for i in islands}

    def root(i: str) -> str:
        while parent[i] != i:
            i = parent[i]
        return i

    named = _scenario_islands(inst)
    signature = {i: _nodes_signature(inst, i) for i in islands}
    for a, b in itertools.combinations(islands, 2):
        if root(a) == root(b) or a in named or b in named or signature[a] != signature[b]:
            continue
        if _swap_is_symmetry(inst, a, b):
            parent[root(b)] = root(a)
    blocks: dict[str, list[str]] = {}
    for i in islands:
        blocks.setdefault(root(i), []).append(i)
    return {i: tuple(block) for block in blocks.values() if len(block) > 1 for i in block}


def canonical(order: Sequence[DeviceClass], blocks: Blocks) -> bool:
    """Whether the run of classes `order` numbers each block's islands in order of first use: the
    k-th island of a block it reaches is the block's k-th."""
    if not blocks:
        return True
    used: dict[tuple[str, ...], list[str]] = {}
    for dc in order:
        block = blocks.get(dc.island)
        if block is None:
            continue
        seen = used.setdefault(block, [])
        if dc.island not in seen:
            if block[len(seen)] != dc.island:
                return False
            seen.append(dc.island)
    return True


def _nodes_signature(inst: Instance, island: str) -> tuple:
    """The island's nodes as the cost model sees them, in the cluster's order, without names."""
    return tuple(
        (n.gpu, n.gpus, n.nic_gbps, n.intra_fabric, n.nic_fabric)
        for n in inst.cluster.nodes.values()
        if n.island == island
    )


def _scenario_islands(inst: Instance) -> set[str]:
    """Islands any bandwidth scenario names (a scenario breaks the symmetry of its links)."""
    text = json.dumps([sc.model_dump(mode="json") for sc in inst.spec.scenarios])
    return {i for i in inst.cluster.islands if json.dumps(i) in text}


def _swap_is_symmetry(inst: Instance, a: str, b: str) -> bool:
    """Whether swapping islands a and b maps every island link onto one of the same attributes and
    every widest path between islands onto the path between their images."""
    cluster = inst.cluster
    va, vb = island_vertex(a), island_vertex(b)

    def swap(v: str) -> str:
        return vb if v == va else va if v == vb else v

    graph = cluster.graph
    for u, v, data in graph.edges(data=True):
        if data["kind"] != "link":
            continue
        if not graph.has_edge(swap(u), swap(v)) or graph.edges[swap(u), swap(v)] != data:
            return False
    names = {island_vertex(i): i for i in cluster.islands}
    for c, d in itertools.combinations(cluster.islands, 2):
        path = cluster.island_path(c, d)
        image = cluster.island_path(names[swap(island_vertex(c))], names[swap(island_vertex(d))])
        if image != [swap(v) for v in path]:
            return False
    return True

"""The cluster as a device graph (networkx), its device classes, and routes between nodes.

Vertices: one per node (``kind="node"``), one per island (``kind="island"``, a non-blocking switch),
and ``fabric`` (``kind="fabric"``) joining every island. Edges carry ``gbps`` (capacity per
direction) and ``latency_us``, and their fabric (``fabric``, with its achieved fraction ``eta`` and
per-step latency ``alpha_s``, hetopt/spec/fabrics.py):
- node — its island: the node's NIC (``nic_gbps``, ``nic_fabric``), no latency of its own;
- island — island: a declared link (``cluster.network.links``);
- island — fabric: unlimited and ideal. docs/instance-format.md: islands with no path through the
  declared links
  meet
  on a non-blocking fabric limited only by the NICs.

Routing: traffic inside a node stays on the intra-node interconnect (NVLink / PCIe; the node group's
``intra_fabric``, default its GPU's catalog interconnect). Between nodes it goes NIC → island → ...
→ island → NIC. Between islands it takes the widest path through the declared links (the path in the
maximum spanning tree by bandwidth, which maximises the bottleneck); only islands that the links do
not connect at all meet through the fabric.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property
from itertools import pairwise

import networkx as nx

from hetopt.spec import fabrics
from hetopt.spec.gpus import GPUType
from hetopt.spec.prices import node_usd_per_hour
from hetopt.spec.schema import ClusterSection

FABRIC = "fabric"


def island_vertex(island: str) -> str:
    return f"island:{island}"


@dataclass(frozen=True)
class Node:
    name: str
    """``<group>-<index>``."""
    group: str
    gpu: str
    gpus: int
    island: str
    nic_gbps: float
    intra_fabric: str = ""
    """Fabric inside the node; empty: from the GPU's catalog interconnect."""
    nic_fabric: str = ""
    """Fabric of the NIC; empty: by its speed (fabrics.nic_default)."""
    usd_per_hour: float | None = field(default=None, compare=False)
    """Rental price of the node, US$ per hour (hetopt.spec.prices); None: unknown. Not part of the
    node's identity: the time model never reads it."""


@dataclass(frozen=True)
class DeviceClass:
    """All GPUs of one type in one island: the unit the planner counts (identical GPUs are
    counts)."""

    gpu: str
    island: str
    nodes: tuple[Node, ...]

    @property
    def key(self) -> tuple[str, str]:
        return (self.gpu, self.island)

    @property
    def label(self) -> str:
        return f"{self.gpu}@{self.island}"

    @cached_property
    def gpus(self) -> int:
        return sum(n.gpus for n in self.nodes)

    @cached_property
    def max_gpus_per_node(self) -> int:
        """The largest TP group that fits inside one node of this class."""
        return max(n.gpus for n in self.nodes)

    @property
    def min_nic_gbps(self) -> float:
        return min(n.nic_gbps for n in self.nodes)


@dataclass(frozen=True)
class Route:
    """The way traffic goes between two places, with its bottleneck bandwidth and summed latency."""

    gbps: float
    latency_us: float
    edges: tuple[tuple[str, str], ...]
    """Graph edges on the path, in order; empty inside a node."""
    edge_gbps: tuple[float, ...] = ()
    """Capacity of each edge on the path, in order (nominal)."""
    edge_eta: tuple[float, ...] = ()
    """Achieved fraction of each edge's capacity (its fabric's η)."""
    alpha_s: float = 0.0
    """Per-step latency of the route's fabrics (the largest on the path)."""
    eta: float = 1.0
    """Inside a node: the intra-node fabric's η."""
    mesh_peers: int = 0
    """Inside a node on a mesh fabric (xGMI): links per GPU (gpus − 1); 0 otherwise."""
    fabrics: tuple[str, ...] = ()
    """Fabric names on the path (inside a node: the intra-node fabric)."""

    @property
    def intra_node(self) -> bool:
        return not self.edges

    @cached_property
    def edge_effective(self) -> tuple[float, ...]:
        """What each edge delivers, Gbit/s: capacity × η of its fabric."""
        return tuple(g * e for g, e in zip(self.edge_gbps, self.edge_eta, strict=True))

    @cached_property
    def effective_gbps(self) -> float:
        """min over the edges of capacity × η (inside a node: the interconnect × η)."""
        return self.gbps * self.eta if self.intra_node else min(self.edge_effective)


class Cluster:
    def __init__(
        self,
        nodes: list[Node],
        links: list[tuple[str, str, float, float, str]],
        gpu_types: dict[str, GPUType],
        link_usd_per_gb: dict[tuple[str, str], float] | None = None,
    ) -> None:
        """`link_usd_per_gb`: the data-transfer price of island links, by the sorted island
        pair (none: free)."""
        self.nodes: dict[str, Node] = {n.name: n for n in nodes}
        self.gpu_types = gpu_types
        self._routes: dict[tuple[str, str], Route] = {}
        self._slowest_intra: dict[tuple[str, ...], Route] = {}
        self.graph = nx.Graph()
        self.graph.add_node(FABRIC, kind="fabric")
        for island in sorted({n.island for n in nodes}):
            self.graph.add_node(island_vertex(island), kind="island", island=island)
            self.graph.add_edge(
                island_vertex(island),
                FABRIC,
                gbps=math.inf,
                latency_us=0.0,
                kind="fabric",
                **_fabric("ideal"),
            )
        for n in nodes:
            self.graph.add_node(
                n.name, kind="node", gpu=n.gpu, gpus=n.gpus, island=n.island, group=n.group
            )
            self.graph.add_edge(
                n.name,
                island_vertex(n.island),
                gbps=n.nic_gbps,
                latency_us=0.0,
                kind="nic",
                **_fabric(n.nic_fabric or fabrics.nic_default(n.nic_gbps)),
            )
        for a, b, gbps, latency_us, fabric in links:
            self.graph.add_edge(
                island_vertex(a),
                island_vertex(b),
                gbps=gbps,
                latency_us=latency_us,
                kind="link",
                usd_per_gb=(link_usd_per_gb or {}).get(tuple(sorted((a, b))), 0.0),
                **_fabric(fabric or fabrics.nic_default(gbps)),
            )

    @classmethod
    def from_spec(
        cls,
        spec: ClusterSection,
        gpu_types: dict[str, GPUType],
        link_gbps: dict[tuple[str, str], float] | None = None,
    ) -> Cluster:
        """The device graph of a cluster section; `link_gbps` sets island links (keyed by the sorted
        island pair) at other bandwidths than declared."""
        nodes = [
            Node(
                f"{g.name}-{i}",
                g.name,
                g.gpu,
                g.gpus_per_node,
                g.island,
                g.nic_gbps,
                g.intra_fabric or "",
                g.nic_fabric or "",
                node_usd_per_hour(g, spec),
            )
            for g in spec.nodes
            for i in range(g.rentable)
        ]
        other = link_gbps or {}
        # a link's fabric is its declared one (by default: by its declared speed), whatever it
        # carries now
        links = [
            (
                lk.a,
                lk.b,
                other.get(tuple(sorted((lk.a, lk.b))), lk.gbps),
                lk.latency_us,
                lk.fabric or fabrics.nic_default(lk.gbps),
            )
            for lk in spec.network.links
        ]
        prices = {tuple(sorted((lk.a, lk.b))): lk.usd_per_gb for lk in spec.network.links}
        return cls(nodes, links, gpu_types, prices)

    def link_usd_per_gb(self, u: str, v: str) -> float:
        """The data-transfer price of graph edge (u, v): an island link's, else 0."""
        return self.graph.edges[u, v].get("usd_per_gb", 0.0)

    # -- summaries
    # -------------------------------------------------------------------------------------

    @cached_property
    def islands(self) -> list[str]:
        return sorted({n.island for n in self.nodes.values()})

    @cached_property
    def device_classes(self) -> dict[tuple[str, str], DeviceClass]:
        """Device classes keyed by (GPU type, island), in the order node groups were declared."""
        grouped: dict[tuple[str, str], list[Node]] = {}
        for n in self.nodes.values():
            grouped.setdefault((n.gpu, n.island), []).append(n)
        return {key: DeviceClass(key[0], key[1], tuple(ns)) for key, ns in grouped.items()}

    @property
    def total_gpus(self) -> int:
        return sum(n.gpus for n in self.nodes.values())

    @property
    def total_memory_gib(self) -> float:
        return sum(n.gpus * self.gpu_types[n.gpu].memory_gib for n in self.nodes.values())

    @property
    def total_peak_tflops(self) -> float:
        return sum(n.gpus * self.gpu_types[n.gpu].peak_tflops for n in self.nodes.values())

    # -- routing
    # ---------------------------------------------------------------------------------------

    @cached_property
    def _widest_tree(self) -> nx.Graph:
        """Maximum spanning forest of the declared island links: its paths are the widest paths."""
        links = nx.Graph()
        links.add_nodes_from(island_vertex(i) for i in self.islands)
        links.add_edges_from(
            (u, v, d) for u, v, d in self.graph.edges(data=True) if d["kind"] == "link"
        )
        return nx.maximum_spanning_tree(links, weight="gbps")

    def island_path(self, a: str, b: str) -> list[str]:
        """Vertices from island `a` to island `b`: widest declared-link path, else through the
        fabric."""
        va, vb = island_vertex(a), island_vertex(b)
        if va == vb:
            return [va]
        try:
            return nx.shortest_path(self._widest_tree, va, vb)
        except nx.NetworkXNoPath:
            return [va, FABRIC, vb]

    def route(self, a: str, b: str) -> Route:
        """Route between nodes `a` and `b` (node names); cached, since evaluation asks for it
        often."""
        cached = self._routes.get((a, b))
        if cached is None:
            na, nb = self.nodes[a], self.nodes[b]
            if a == b:
                cached = self.intra_route(na)
            else:
                cached = self._route_along([a, *self.island_path(na.island, nb.island), b])
            self._routes[(a, b)] = cached
        return cached

    def intra_route(self, node: Node) -> Route:
        return intra_route(self.gpu_types[node.gpu], node.intra_fabric, node.gpus)

    def slowest_intra(self, names) -> Route:
        """The slowest intra-node route among the nodes `names` (a stage's replicas); cached by the
        names."""
        key = tuple(names)
        cached = self._slowest_intra.get(key)
        if cached is None:
            cached = min(
                (self.route(n, n) for n in key), key=lambda r: (r.effective_gbps, -r.alpha_s)
            )
            self._slowest_intra[key] = cached
        return cached

    def class_route(self, c1: tuple[str, str], c2: tuple[str, str]) -> Route:
        """Bottleneck route between two device classes: the least-connected node of each.

        Within one class of a single node this is the intra-node interconnect.
        """
        k1, k2 = self.device_classes[c1], self.device_classes[c2]
        n1 = min(k1.nodes, key=lambda n: n.nic_gbps)
        if c1 == c2:
            if len(k1.nodes) == 1:
                return self.route(n1.name, n1.name)
            n2 = min((n for n in k1.nodes if n is not n1), key=lambda n: n.nic_gbps)
        else:
            n2 = min(k2.nodes, key=lambda n: n.nic_gbps)
        return self.route(n1.name, n2.name)

    def _route_along(self, vertices: list[str]) -> Route:
        edges = tuple(pairwise(vertices))
        data = [self.graph.edges[u, v] for u, v in edges]
        capacities = tuple(d["gbps"] for d in data)
        return Route(
            min(capacities),
            sum(d["latency_us"] for d in data),
            edges,
            capacities,
            tuple(d["eta"] for d in data),
            max(d["alpha_s"] for d in data),
            fabrics=tuple(d["fabric"] for d in data),
        )


def intra_route(gpu: GPUType, fabric: str = "", gpus: int = 8) -> Route:
    """The interconnect inside a node of `gpus` GPUs: the GPU's per-direction bandwidth on `fabric`
    (default: the GPU's catalog interconnect)."""
    f = fabrics.get(fabric or fabrics.intra_default(gpu.interconnect))
    return Route(
        gpu.intra_node_gbps,
        0.0,
        (),
        alpha_s=f.alpha_s,
        eta=f.eta,
        mesh_peers=mesh_links(gpu, gpus) if f.mesh else 0,
        fabrics=(f.name,),
    )


def mesh_links(gpu: GPUType, gpus: int) -> int:
    """Links per GPU of a mesh fabric: the catalog's count ('xGMI ×7': the per-direction figure is
    the sum over 7 links, one per peer of an 8-GPU node), else one per peer in the node (a declared
    GPU's own figure)."""
    head, _, count = gpu.interconnect.partition("×")
    return (
        int(count)
        if head.strip().startswith("xGMI") and count.strip().isdigit()
        else max(1, gpus - 1)
    )


def _fabric(name: str) -> dict:
    """Edge attributes of a fabric: its name, η and α."""
    f = fabrics.get(name)
    return {"fabric": f.name, "eta": f.eta, "alpha_s": f.alpha_s}

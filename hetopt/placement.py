"""Placing an aggregated plan onto concrete nodes and GPUs (docs/planner.md).

Rules, in order:
- a stage's TP group sits inside one node; every GPU is used at most once; a TP group wider than any
  node
  of its class takes whole free nodes of one size (`span_nodes`), recorded in the entry's
  `more_nodes`;
- stages of one replica stay on the node of the previous stage when it has room (their
  point-to-point
  traffic then stays on NVLink);
- otherwise the stage goes where the route from the previous stage's node is widest (networkx widest
  paths
  over the device graph, `Cluster.route`): nodes with faster NICs, islands joined by faster links —
  the heavy pipeline traffic keeps off slow links;
- among equally good nodes, best fit: the node with the fewest free GPUs that still hold the group,
  which
  keeps whole nodes free for wide groups;
- pipelines take GPUs in an order of their shape, not of their place in the plan (`placing_order`).

Two orders (the planner tries both: placement is a choice of the skeleton, docs/planner.md):
`replica` packs one replica's stages together (pipeline sends stay inside nodes; the gradient rings
cross them), `stage` packs the same stage of consecutive replicas together, as Megatron-LM's rank
order does (gradient all-reduces start inside nodes; pipeline sends cross them) — better where
gradients outweigh activations. A uniform layout's plan (hetopt.search.uniform) has a third:
`megatron`, Megatron-LM's own rank order over the nodes as declared (`megatron_placed`), where its
templates share nodes stage by stage.
"""

from __future__ import annotations

from hetopt.errors import InfeasibleError, InputError
from hetopt.layout import Layout, layout_ranks
from hetopt.plan import NodeGPUs, PlacementEntry, Plan, Stage
from hetopt.spec.cluster import Cluster

ORDERS = ("replica", "stage")


def place(plan: Plan, cluster: Cluster, order: str = "replica") -> Plan:
    """The plan with a placement (an existing placement is kept as given)."""
    if plan.placement:
        return plan
    if order == "megatron":
        return megatron_placed(plan, cluster)
    free = FreeGPUs(cluster)
    at: dict[tuple[int, int, int], str] = {}
    entries = []
    for p_index in placing_order(plan):
        pipe = plan.pipelines[p_index]
        pairs = (
            [(r, s) for r in range(pipe.replicas) for s in range(len(pipe.stages))]
            if order == "replica"
            else [(r, s) for s in range(len(pipe.stages)) for r in range(pipe.replicas)]
        )
        for replica, s_index in pairs:
            stage = pipe.stages[s_index]
            # the neighbour to stay with: the replica's previous stage, or (stage order) the
            # previous replica's same stage; the one to be near when moving: the replica's previous
            # stage
            stay = at.get(
                (p_index, replica, s_index - 1)
                if order == "replica"
                else (p_index, replica - 1, s_index)
            )
            near = at.get((p_index, replica, s_index - 1))
            for rank, (gpu, island) in enumerate(rank_classes(stage)):
                where = (p_index, replica, s_index, rank)
                dc = cluster.device_classes.get((gpu, island))
                if dc is None:
                    raise InfeasibleError(
                        f"pipelines[{p_index}].stages[{s_index}]: no device class "
                        f"{gpu}@{island} in the cluster"
                    )
                # a TP group over whole nodes (the verifier: no CP then)
                if stage.width > dc.max_gpus_per_node:
                    entry = span_nodes(cluster, dc, stage.tp, free, near, where)
                    entries.append(entry)
                    at.setdefault(where[:3], entry.node)
                    continue
                if (
                    stay is not None
                    and cluster.nodes[stay].gpu == gpu
                    and cluster.nodes[stay].island == island
                    and free.count(stay) >= stage.width
                ):
                    node = stay
                else:
                    node = free.pick(dc, stage.width, near)
                if node is None:
                    raise InfeasibleError(
                        f"pipelines[{p_index}] replica {replica} stage {s_index}"
                        f"{f' rank {rank}' if stage.shards else ''}: no node of {gpu}@{island} has "
                        f"{stage.width} free GPUs left for its TP{'×CP' if stage.cp > 1 else ''} "
                        "group"
                    )
                gpus = free.take(node, stage.width)
                entries.append(
                    PlacementEntry(
                        pipeline=p_index,
                        replica=replica,
                        stage=s_index,
                        rank=rank,
                        node=node,
                        gpus=gpus,
                    )
                )
                at.setdefault(where[:3], node)  # the stage's first rank stands for it
                stay = node  # the stage's next ranks stay beside this one when they can
    entries.sort(key=lambda e: (e.pipeline, e.replica, e.stage, e.rank))
    return plan.model_copy(update={"placement": entries})


def rank_classes(stage: Stage) -> list[tuple[str, str]]:
    """The device class of each of a stage's data-parallel ranks in one replica, in rank order."""
    if not stage.shards:
        return [stage.device_class]
    return [sh.device_class for sh in stage.shards for _ in range(sh.ranks)]


def placing_order(plan: Plan) -> list[int]:
    """The pipelines in the order they take GPUs: by their shape (each stage's GPU type, island and
    TP, the replicas, the micro-batches), not by their place in the plan — so two templates side by
    side land on the same GPUs whichever is written first (the search lists each pair once), and a
    pipeline's nodes never depend on its layers (a skeleton's placement holds for every split)."""

    def shape(j: int) -> tuple:
        pipe = plan.pipelines[j]
        return (
            tuple((st.gpu, st.island, st.tp, st.cp, tuple(rank_classes(st))) for st in pipe.stages),
            pipe.replicas,
            pipe.micro_batches,
        )

    return sorted(range(len(plan.pipelines)), key=shape)


class FreeGPUs:
    """The free GPUs of every node, indexed for `pick`: per device class and NIC speed, the nodes by
    their number of free GPUs (node positions in the class's declaration order), so a placement of
    thousands of TP groups never scans every node for each one.

    Parameters: cluster — the cluster being placed on."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.free = {name: list(range(node.gpus)) for name, node in cluster.nodes.items()}
        self._where: dict[str, tuple[dict, int]] = {}  # node → (its NIC's counts, position)
        # class → NIC → free count → positions
        self._by_nic: dict[tuple, dict[float, dict[int, set[int]]]] = {}
        self._names: dict[tuple, list[str]] = {}  # class → node names in declaration order
        for key, dc in cluster.device_classes.items():
            self._names[key] = [n.name for n in dc.nodes]
            by_nic = self._by_nic.setdefault(key, {})
            for i, n in enumerate(dc.nodes):
                counts = by_nic.setdefault(n.nic_gbps, {})
                self._where[n.name] = (counts, i)
                counts.setdefault(n.gpus, set()).add(i)

    def count(self, name: str) -> int:
        return len(self.free[name])

    def take(self, name: str, k: int) -> list[int]:
        """The first `k` free GPUs of node `name`, now taken."""
        gpus, self.free[name] = self.free[name][:k], self.free[name][k:]
        if k:
            counts, i = self._where[name]
            counts[len(gpus) + len(self.free[name])].discard(i)
            counts.setdefault(len(self.free[name]), set()).add(i)
        return gpus

    def pick(self, dc, tp: int, previous: str | None) -> str | None:
        """A node of class `dc` with `tp` free GPUs: the widest route from `previous` first (nodes
        of one class differ in routes only by their NIC, so the first fitting node of each NIC speed
        stands for it), then best fit — the fewest free GPUs that still hold the group —, then
        declaration order."""
        by_nic = self._by_nic[dc.key]
        fitting = {}  # NIC → (its best-fit count, the first position at that count)
        for nic, counts in by_nic.items():
            sizes = [c for c, nodes in counts.items() if c >= tp and nodes]
            if sizes:
                best = min(sizes)
                fitting[nic] = (best, min(counts[best]))
        if not fitting:
            return None
        names = self._names[dc.key]
        if previous is not None and len(fitting) > 1:
            # the first fitting node of each NIC speed stands for it
            stand_in = {
                nic: names[min(min(nodes) for c, nodes in by_nic[nic].items() if c >= tp and nodes)]
                for nic in fitting
            }
            widest = widest_nics(self.cluster, previous, stand_in)
            fitting = {nic: v for nic, v in fitting.items() if nic in widest}
        return names[min(fitting.values())[1]]


def widest_nics(cluster: Cluster, previous: str, stand_in: dict[float, str]) -> set[float]:
    """The NIC speeds whose stand-in node (one per speed) is on a widest route from node
    `previous`."""
    width = {nic: cluster.route(previous, name).gbps for nic, name in stand_in.items()}
    return {nic for nic, gbps in width.items() if gbps == max(width.values())}


def span_nodes(
    cluster: Cluster, dc, tp: int, free: FreeGPUs, near: str | None, key: tuple[int, int, int, int]
) -> PlacementEntry:
    """A TP group wider than a node: whole free nodes of one size g with g | tp, the first of them
    the widest route from `near` (as `FreeGPUs.pick` ranks), the others in declaration order (one
    island: the same fabric)."""
    for g in sorted({n.gpus for n in dc.nodes}, reverse=True):
        whole = [n.name for n in dc.nodes if n.gpus == g and free.count(n.name) == g]
        if tp % g or len(whole) < tp // g:
            continue
        head = _widest_first(cluster, whole, near)
        chosen = [head, *[name for name in whole if name != head][: tp // g - 1]]
        groups = [free.take(name, g) for name in chosen]
        return PlacementEntry(
            pipeline=key[0],
            replica=key[1],
            stage=key[2],
            rank=key[3],
            node=chosen[0],
            gpus=groups[0],
            more_nodes=[
                NodeGPUs(node=n, gpus=gp) for n, gp in zip(chosen[1:], groups[1:], strict=True)
            ],
        )
    raise InfeasibleError(
        f"pipelines[{key[0]}] replica {key[1]} stage {key[2]}: its TP group of {tp} GPUs needs "
        f"{dc.label} nodes of one size dividing {tp}, all free"
    )


def _widest_first(cluster: Cluster, names: list[str], previous: str | None) -> str:
    """Among whole free nodes (all of one size): the first of those on the widest route from
    `previous`."""
    if previous is not None:
        stand_in: dict[float, str] = {}
        for name in names:
            stand_in.setdefault(cluster.nodes[name].nic_gbps, name)
        if len(stand_in) > 1:
            widest = widest_nics(cluster, previous, stand_in)
            names = [name for name in names if cluster.nodes[name].nic_gbps in widest]
    return names[0]


def megatron_placed(plan: Plan, cluster: Cluster) -> Plan:
    """A uniform layout's plan placed in Megatron-LM's rank order (hetopt.layout.layout_ranks: TP
    fastest, then CP, DP, PP over the nodes as declared) over every node of the device classes it
    uses (the others idle); raises InfeasibleError where the plan is no layout of every GPU of those
    classes or its templates are not those the rank order forms, in that order."""
    stages = [st for pipe in plan.pipelines for st in pipe.stages]
    layout = Layout(
        tp=stages[0].tp,
        pp=len(plan.pipelines[0].stages),
        cp=stages[0].cp,
        dp=sum(pipe.replicas for pipe in plan.pipelines),
    )
    classes = {(st.gpu, st.island) for st in stages}
    nodes = [n for n in cluster.nodes.values() if (n.gpu, n.island) in classes]
    if (
        len({(st.tp, st.cp) for st in stages}) > 1
        or any(len(p.stages) != layout.pp for p in plan.pipelines)
        or layout.tp * layout.cp * layout.pp * layout.dp != sum(n.gpus for n in nodes)
    ):
        raise InfeasibleError(
            "Megatron's rank order places a uniform layout over every GPU of its classes only"
        )
    try:
        templates, placement = layout_ranks(cluster, layout, nodes=nodes)
    except InputError as e:
        raise InfeasibleError(f"Megatron's rank order: {e}") from None
    mine = [
        (tuple((st.gpu, st.island) for st in pipe.stages), pipe.replicas) for pipe in plan.pipelines
    ]
    if mine != templates:
        raise InfeasibleError("the plan's templates are not those Megatron's rank order forms")
    return plan.model_copy(update={"placement": placement})

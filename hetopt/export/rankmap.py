"""The rank map of a placed plan: one entry per global rank — its node and GPU, its place in the
plan (template, replica, stage, data-parallel, tensor and context ranks), its layers and
micro-batches, and the process groups it belongs to. The contract for a custom runtime (README,
"Exporting a plan").

Global ranks are contiguous per node (as torchrun numbers them: the ranks of node_rank r follow
those of the nodes before it). Within that, they follow Megatron-LM's order where the placement
allows it — tensor rank fastest, then context, data-parallel and pipeline rank (`tp-cp-dp-pp`,
Megatron's default), or `tp-cp-pp-dp` (Megatron's `--use-tp-pp-dp-mapping`), templates one after the
other — so that the same ranks serve Megatron's own groups; otherwise the nodes' order and each
node's GPUs (`node`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace

from hetopt.plan import Pipeline, Plan
from hetopt.spec.instance import Instance

ORDERS = ("tp-cp-dp-pp", "tp-cp-pp-dp", "node")
"""The rank orders tried, in turn: Megatron's default, Megatron's --use-tp-pp-dp-mapping, the
nodes'."""


@dataclass
class Rank:
    """One process of the plan: one GPU."""

    rank: int
    node: str
    node_rank: int
    """The node's torchrun --node-rank."""
    local_rank: int
    """Its LOCAL_RANK on the node (an index into the node's CUDA_VISIBLE_DEVICES)."""
    gpu: int
    """The node's GPU index."""
    gpu_type: str
    template: int
    replica: int
    stage: int
    stages: int
    """The template's pipeline depth."""
    dp_rank: int
    """Data-parallel rank among the template's copies of this stage (replica-major, then the stage's
    ranks inside a replica where it has shards)."""
    tp_rank: int
    cp_rank: int
    first_layer: int
    """The first transformer layer the stage holds (0-based)."""
    layers: int
    chunks: list[list[int]]
    """[first layer, layers] of each of the stage's model chunks: one, or with the interleaved
    schedule v of them, chunk c of stage i being the (c·p + i)-th block of the model (Megatron's
    virtual stages)."""
    embedding: bool
    """Whether the stage holds the input embedding (the first stage)."""
    head: bool
    """Whether it holds the output head and the loss (the last stage)."""
    sequences: int
    """Sequences of every micro-batch this rank runs (the micro-batch, or its shard's share)."""
    micro_batches: int
    """Micro-batches per iteration of its replica."""
    recompute: str
    tp_group: list[int] = field(default_factory=list)
    cp_group: list[int] = field(default_factory=list)
    dp_group: list[int] = field(default_factory=list)
    """Its data-parallel group (Megatron's dp group): the same stage, tensor and context rank in
    every copy of the template."""
    grad_group: list[int] = field(default_factory=list)
    """The ranks that all-reduce its gradients: its data-parallel group times its context-parallel
    group (context ranks hold the same weights; Megatron's dp-cp group); the dp group where CP is
    1."""
    pp_prev: list[int] = field(default_factory=list)
    """The ranks of the previous stage of its replica it receives activations from: the same tp and
    cp rank, or where the two stages' degrees differ those equal to it modulo the smaller degree (so
    that pp_next and pp_prev name the same pairs); several where that stage has shards."""
    pp_next: list[int] = field(default_factory=list)
    exchange_group: list[int] = field(default_factory=list)
    """With several templates: the ranks of the other templates whose layers overlap this rank's
    (their gradients of those layers are summed across templates)."""


@dataclass
class RankMap:
    instance: str
    order: str
    """The rank order: one of `ORDERS`."""
    world_size: int
    master: str
    """The node of rank 0 (torchrun's --master-addr)."""
    nodes: list[dict]
    """Per node in node_rank order: name, node_rank, nproc (its processes), gpus
    (CUDA_VISIBLE_DEVICES)."""
    ranks: list[Rank]

    def to_json(self) -> dict:
        """The map as JSON data. Its ranks' group lists are the ranks' own, not copies
        (dataclasses.asdict deep-copies them: 15 s per call on a 4,096-GPU plan whose data-parallel
        groups hold 1,024 ranks each, against 0.1 s); do not change them."""
        names = [f.name for f in fields(Rank)]
        return {
            "instance": self.instance,
            "order": self.order,
            "world_size": self.world_size,
            "master": self.master,
            "nodes": self.nodes,
            "ranks": [{name: getattr(r, name) for name in names} for r in self.ranks],
        }


@dataclass(frozen=True)
class _Slot:
    """One GPU of the placed plan before it has a global rank."""

    template: int
    replica: int
    stage: int
    shard: int
    """The data-parallel rank inside the replica (0 without shards)."""
    tp_rank: int
    cp_rank: int
    node: str
    gpu: int


def slots(plan: Plan) -> list[_Slot]:
    """Every GPU of the placed plan with its coordinates: a stage's GPUs are its TP group's (tensor
    rank fastest), cp times over."""
    out = []
    for entry in plan.placement:
        stage = plan.pipelines[entry.pipeline].stages[entry.stage]
        gpus = [(node, g) for node, local in entry.members for g in local]
        for k, (node, g) in enumerate(gpus):
            out.append(
                _Slot(
                    entry.pipeline,
                    entry.replica,
                    entry.stage,
                    entry.rank,
                    k % stage.tp,
                    k // stage.tp,
                    node,
                    g,
                )
            )
    return out


def _key(plan: Plan, slot: _Slot, order: str, label: dict[tuple[int, int], int]) -> tuple:
    """Where a slot falls in a rank order (templates one after the other), its replica relabelled by
    `label` ((template, replica) → its data-parallel index)."""
    pipe = plan.pipelines[slot.template]
    dp = label[(slot.template, slot.replica)] * pipe.stages[slot.stage].dp_ranks + slot.shard
    if order == "tp-cp-dp-pp":
        return (slot.template, slot.stage, dp, slot.cp_rank, slot.tp_rank)
    return (slot.template, dp, slot.stage, slot.cp_rank, slot.tp_rank)  # tp-cp-pp-dp


def _contiguous(ordered: list[_Slot]) -> bool:
    """Whether each node's slots are one run of the order (torchrun numbers a node's ranks
    together)."""
    seen, last = set(), None
    for s in ordered:
        if s.node != last:
            if s.node in seen:
                return False
            seen.add(s.node)
            last = s.node
    return True


def rank_map(inst: Instance, plan: Plan) -> RankMap:
    """The rank map of `plan`, which must carry its placement (hetopt.placement.place).

    Parameters: inst — the instance the plan was planned for; plan — a placed plan.
    Returns: the RankMap, in the first order of `ORDERS` that keeps each node's ranks together."""
    every = slots(plan)
    node_index = {name: i for i, name in enumerate(inst.cluster.nodes)}
    uniform = all(st.dp_ranks == 1 for pipe in plan.pipelines for st in pipe.stages)
    # replicas are interchangeable: as placed, or numbered by where their first stage sits (which
    # brings a node's replicas together where the placement interleaved them)
    first = {
        (s.template, s.replica): (node_index[s.node], s.gpu)
        for s in reversed(every)
        if s.stage == 0
    }
    by_place = sorted(first, key=lambda k: (k[0], first[k]))
    labels = [
        {key: key[1] for key in first},
        {key: sum(1 for k in by_place[:i] if k[0] == key[0]) for i, key in enumerate(by_place)},
    ]
    ordered, label = sorted(every, key=lambda s: (node_index[s.node], s.gpu)), labels[0]
    order = "node"
    for tried in ORDERS[:-1] if uniform else ():
        found = next(
            (
                (o, lb)
                for lb in labels
                if _contiguous(
                    o := sorted(every, key=lambda s, o=tried, lb=lb: _key(plan, s, o, lb))
                )
            ),
            None,
        )
        if found is not None:
            (ordered, label), order = found, tried
            break
    ordered = [replace(s, replica=label[(s.template, s.replica)]) for s in ordered]
    at = {s: r for r, s in enumerate(ordered)}
    nodes, node_rank = [], {}
    for s in ordered:
        if s.node not in node_rank:
            node_rank[s.node] = len(nodes)
            nodes.append({"name": s.node, "node_rank": len(nodes), "nproc": 0, "gpus": []})
        nodes[node_rank[s.node]]["nproc"] += 1
        nodes[node_rank[s.node]]["gpus"].append(s.gpu)
    chunks = _chunks(plan)
    by_coord = {
        (s.template, s.replica, s.stage, s.shard, s.tp_rank, s.cp_rank): at[s] for s in ordered
    }
    ranks = []
    for s in ordered:
        pipe = plan.pipelines[s.template]
        stage = pipe.stages[s.stage]
        shard = stage.ranks_of(plan.micro_batch)
        flat = [sh for sh in shard for _ in range(sh.ranks)]
        mine, local = chunks[s.template][s.stage], nodes[node_rank[s.node]]["gpus"].index(s.gpu)
        ranks.append(
            Rank(
                rank=at[s],
                node=s.node,
                node_rank=node_rank[s.node],
                local_rank=local,
                gpu=s.gpu,
                gpu_type=flat[s.shard].gpu,
                template=s.template,
                replica=s.replica,
                stage=s.stage,
                stages=len(pipe.stages),
                dp_rank=s.replica * stage.dp_ranks + s.shard,
                tp_rank=s.tp_rank,
                cp_rank=s.cp_rank,
                first_layer=mine[0][0],
                layers=stage.layers,
                chunks=mine,
                embedding=s.stage == 0,
                head=s.stage == len(pipe.stages) - 1,
                sequences=flat[s.shard].sequences,
                micro_batches=pipe.micro_batches,
                recompute=stage.recompute,
            )
        )
    shared: dict = {}
    for r in ranks:
        groups(plan, r, by_coord, ranks, shared)
    return RankMap(inst.name, order, len(ranks), nodes[0]["name"], nodes, ranks)


def _chunks(plan: Plan) -> list[list[list[list[int]]]]:
    """Per template and stage, its chunks' [first layer, layers]: the stages in order, or (v virtual
    stages) each stage's layers cut into v equal chunks laid out chunk-major as Megatron's
    interleaved schedule does (hetopt.export.launchers.layout_string)."""
    out = []
    for pipe in plan.pipelines:
        v = plan.virtual_stages if len(plan.pipelines) == 1 else 1
        per_stage: list[list[list[int]]] = [[] for _ in pipe.stages]
        n = 0
        for _ in range(v):
            for i, st in enumerate(pipe.stages):
                per_stage[i].append([n, st.layers // v])
                n += st.layers // v
        out.append(per_stage)
    return out


def groups(
    plan: Plan, r: Rank, by_coord: dict, ranks: list[Rank], shared: dict | None = None
) -> None:
    """Fill in `r`'s process groups from the coordinates of every rank. `shared` keeps the groups
    every replica of a stage has alike (data-parallel, gradient, exchange), built once for all of
    them: a map of n ranks takes O(n), not O(n × replicas)."""
    shared = {} if shared is None else shared
    pipe = plan.pipelines[r.template]
    stage = pipe.stages[r.stage]
    shard = r.dp_rank % stage.dp_ranks
    r.tp_group = [
        by_coord[(r.template, r.replica, r.stage, shard, t, r.cp_rank)] for t in range(stage.tp)
    ]
    r.cp_group = [
        by_coord[(r.template, r.replica, r.stage, shard, r.tp_rank, c)] for c in range(stage.cp)
    ]
    r.dp_group, r.grad_group = _data_parallel_groups(pipe, r, by_coord, shared)
    for step, name in ((-1, "pp_prev"), (1, "pp_next")):
        other = r.stage + step
        if 0 <= other < len(pipe.stages):
            setattr(r, name, _neighbour_ranks(pipe, r, other, by_coord))
    if len(plan.pipelines) > 1:
        r.exchange_group = _exchange_group(r, ranks, shared)


def _data_parallel_groups(
    pipe: Pipeline, r: Rank, by_coord: dict, shared: dict
) -> tuple[list[int], list[int]]:
    """The rank's data-parallel group (its stage's ranks at its TP and CP rank, every replica and
    shard) and gradient group (the same over every CP rank too), built once per stage."""
    stage = pipe.stages[r.stage]
    key = (r.template, r.stage, r.tp_rank, r.cp_rank)
    if ("dp", *key) not in shared:
        shared[("dp", *key)] = [
            by_coord[(r.template, rep, r.stage, k, r.tp_rank, r.cp_rank)]
            for rep in range(pipe.replicas)
            for k in range(stage.dp_ranks)
        ]
    if ("grad", *key[:3]) not in shared:
        shared[("grad", *key[:3])] = [
            by_coord[(r.template, rep, r.stage, k, r.tp_rank, c)]
            for rep in range(pipe.replicas)
            for k in range(stage.dp_ranks)
            for c in range(stage.cp)
        ]
    return list(shared[("dp", *key)]), list(shared[("grad", *key[:3])])


def _neighbour_ranks(pipe: Pipeline, r: Rank, other: int, by_coord: dict) -> list[int]:
    """The ranks of stage `other` (the one before or after r's) in r's replica that r sends to or
    receives from."""
    stage, nb = pipe.stages[r.stage], pipe.stages[other]
    # the neighbour's tensor (context) ranks that match this one's modulo the smaller degree: the
    # same pairs seen from either side, where the two stages' degrees differ
    tps = [u for u in range(nb.tp) if u % min(nb.tp, stage.tp) == r.tp_rank % min(nb.tp, stage.tp)]
    cps = [c for c in range(nb.cp) if c % min(nb.cp, stage.cp) == r.cp_rank % min(nb.cp, stage.cp)]
    return [
        by_coord[(r.template, r.replica, other, k, u, c)]
        for k in range(nb.dp_ranks)
        for u in tps
        for c in cps
    ]


def _exchange_group(r: Rank, ranks: list[Rank], shared: dict) -> list[int]:
    """With several templates: the ranks of the other templates whose layers overlap r's (their
    gradients of those layers are summed across templates), built once per template and span."""
    lo, hi = r.first_layer, r.first_layer + r.layers
    if ("exchange", r.template, lo, hi) not in shared:
        shared[("exchange", r.template, lo, hi)] = [
            o.rank
            for o in ranks
            if o.template != r.template and o.first_layer < hi and lo < o.first_layer + o.layers
        ]
    return list(shared[("exchange", r.template, lo, hi)])

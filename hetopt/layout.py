"""Layout shorthand (docs/layouts.md): a homogeneous Megatron-style layout and its expansion into a
plan.

``"tp=2,pp=4,dp=8,mb=1,vp=1,recompute=none,sp=true,zero=1,schedule=1f1b"`` (zero 0–3: the ZeRO
stage, 3 being FSDP FULL_SHARD; `cp=k` adds context parallelism, default 1). tp·cp·pp·dp must equal
the cluster's GPUs. Ranks are laid out as Megatron-LM does (tensor-parallel fastest, then
context-parallel, then data-parallel, then pipeline) over the cluster's GPUs in the order the node
groups are declared, so on a mixed cluster a layout's stages land on whatever GPU types those ranks
have. Replicas whose stages land on the same device classes form one pipeline template.
"""

from __future__ import annotations

from dataclasses import dataclass

from hetopt.errors import InputError, Problem
from hetopt.plan import NodeGPUs, Pipeline, PlacementEntry, Plan, Stage
from hetopt.spec.cluster import Cluster, Node
from hetopt.spec.instance import Instance

KEYS = ("tp", "pp", "dp", "mb", "vp", "recompute", "sp", "zero", "schedule", "cp")


@dataclass(frozen=True)
class Layout:
    tp: int
    pp: int
    dp: int
    mb: int = 1
    vp: int = 1
    recompute: str = "none"
    sp: bool = True
    zero: int = 1
    schedule: str = "1f1b"
    cp: int = 1

    def __str__(self) -> str:
        return (
            f"tp={self.tp},pp={self.pp},dp={self.dp},mb={self.mb},vp={self.vp},recompute={self.recompute},"
            f"sp={'true' if self.sp else 'false'},zero={self.zero},schedule={self.schedule}"
            + (f",cp={self.cp}" if self.cp > 1 else "")
        )


def parse_layout(text: str, source: str = "layout") -> Layout:
    values: dict[str, str] = {}
    problems: list[Problem] = []
    for part in (p.strip() for p in text.strip().split(",")):
        if not part:
            continue
        key, sep, value = part.partition("=")
        key = key.strip()
        if not sep or key not in KEYS:
            problems.append(
                Problem(key, f"expected key=value with a key among {', '.join(KEYS)}", part, True)
            )
        elif key in values:
            problems.append(Problem(key, "given twice; give each key once", part, True))
        else:
            values[key] = value.strip()
    for key in ("tp", "pp", "dp"):
        if key not in values:
            problems.append(
                Problem(key, "required: tp, pp and dp have no default (tp·pp·dp = the GPUs used)")
            )
    ints = {}
    for key in ("tp", "pp", "dp", "mb", "vp", "zero", "cp"):
        if key in values:
            try:
                ints[key] = int(values[key])
                if ints[key] < (0 if key == "zero" else 1) or (key == "zero" and ints[key] > 3):
                    raise ValueError
            except ValueError:
                expected = "0, 1, 2 or 3" if key == "zero" else "a positive integer"
                problems.append(Problem(key, f"must be {expected}", values[key], True))
    recompute = values.get("recompute", "none")
    if recompute not in ("none", "selective", "full"):
        problems.append(Problem("recompute", "must be none, selective or full", recompute, True))
    sp_text = values.get("sp", "true").lower()
    if sp_text not in ("true", "false", "1", "0"):
        problems.append(Problem("sp", "must be true or false", values["sp"], True))
    vp = ints.get("vp", 1)
    schedule = values.get("schedule", "interleaved" if vp > 1 else "1f1b")
    if schedule not in ("gpipe", "1f1b", "interleaved"):
        problems.append(Problem("schedule", "must be gpipe, 1f1b or interleaved", schedule, True))
    elif (schedule == "interleaved") != (vp > 1):
        problems.append(
            Problem(
                "schedule",
                "the interleaved schedule goes with vp > 1, and vp > 1 with it",
                f"schedule={schedule}, vp={vp}",
                True,
            )
        )
    if problems:
        raise InputError(f"{source} {text!r}", problems)
    return Layout(
        tp=ints["tp"],
        pp=ints["pp"],
        dp=ints["dp"],
        mb=ints.get("mb", 1),
        vp=vp,
        recompute=recompute,
        sp=sp_text in ("true", "1"),
        zero=ints.get("zero", 1),
        schedule=schedule,
        cp=ints.get("cp", 1),
    )


def split_layers(layers: int, stages: int) -> list[int]:
    """As even as possible; the first stages take the extra layers (the last one also holds the LM
    head)."""
    base, extra = divmod(layers, stages)
    return [base + (1 if i < extra else 0) for i in range(stages)]


def expand_layout(
    inst: Instance, layout: Layout, source: str = "layout", nodes: list[Node] | None = None
) -> Plan:
    """The plan a homogeneous layout describes on this cluster, with its placement.

    Parameters: nodes — the nodes it is laid out over, in rank order (default every node, as
    declared); the others stay idle."""
    where = f"{source} {layout}"
    nodes = list(inst.cluster.nodes.values()) if nodes is None else nodes
    gpus = [(node.name, local, node) for node in nodes for local in range(node.gpus)]
    # GPUs of one stage of one replica: its TP groups, one per CP rank
    width = layout.tp * layout.cp
    used = width * layout.pp * layout.dp
    m = inst.model
    problems = []
    if used != len(gpus):
        problems.append(
            Problem(
                "tp*cp*pp*dp" if layout.cp > 1 else "tp*pp*dp",
                f"must equal the cluster's {len(gpus)} GPUs"
                if len(nodes) == len(inst.cluster.nodes)
                else f"must equal the {len(gpus)} GPUs laid out",
                used,
                True,
            )
        )
    if m.heads % layout.tp:
        problems.append(
            Problem("tp", f"must divide the model's {m.heads} attention heads", layout.tp, True)
        )
    elif m.kv_heads % layout.tp:
        problems.append(
            Problem(
                "tp",
                f"must divide the model's {m.kv_heads} kv_heads (grouped-query attention)",
                layout.tp,
                True,
            )
        )
    if layout.pp * layout.vp > m.layers:
        problems.append(
            Problem(
                "pp",
                f"pp·vp = {layout.pp * layout.vp} stages for {m.layers} layers; at most one "
                "stage per layer",
                layout.pp,
                True,
            )
        )
    elif layout.vp > 1 and m.layers % (layout.pp * layout.vp):
        problems.append(
            Problem(
                "vp",
                f"interleaving needs the {m.layers} layers divisible by pp·vp",
                layout.vp,
                True,
            )
        )
    if inst.micro_batches(layout.mb, layout.dp) is None:
        problems.append(
            Problem(
                "mb",
                f"global batch {inst.global_batch} is not divisible by mb·dp = "
                f"{layout.mb * layout.dp}",
                layout.mb,
                True,
            )
        )
    if problems:
        raise InputError(where, problems)

    layers = split_layers(m.layers, layout.pp)
    templates, placement = layout_ranks(inst.cluster, layout, where, nodes)
    micro_batches = inst.micro_batches(layout.mb, layout.dp)
    pipelines = [
        Pipeline(
            replicas=n,
            micro_batches=micro_batches,
            stages=[
                Stage(
                    layers=layers[p],
                    gpu=gpu,
                    island=island,
                    tp=layout.tp,
                    cp=layout.cp,
                    recompute=layout.recompute,
                    sp=layout.sp,
                )
                for p, (gpu, island) in enumerate(classes)
            ],
        )
        for classes, n in templates
    ]
    return Plan(
        micro_batch=layout.mb,
        schedule=layout.schedule,
        virtual_stages=layout.vp,
        zero=layout.zero,
        pipelines=pipelines,
        placement=placement,
    )


def layout_ranks(
    cluster: Cluster, layout: Layout, where: str = "layout", nodes: list[Node] | None = None
) -> tuple[list[tuple[tuple, int]], list[PlacementEntry]]:
    """Megatron-LM's rank order over `cluster` (TP fastest, then CP, DP, PP; nodes as declared): the
    templates its replicas form — (device class of each stage, replicas) in order of first
    appearance — and the placement of every stage of every replica. `nodes`: the nodes laid out
    over, in rank order (default all). Raises InputError where a stage's TP group cannot lie in one
    node or on whole nodes of one type."""
    nodes = list(cluster.nodes.values()) if nodes is None else nodes
    gpus = [(node.name, local, node) for node in nodes for local in range(node.gpus)]
    width = layout.tp * layout.cp
    templates: dict[tuple, list[int]] = {}
    groups: dict[tuple[int, int], list[tuple[str, list[int]]]] = {}
    for d in range(layout.dp):
        classes = []
        for p in range(layout.pp):
            base = p * width * layout.dp + d * width
            members = gpus[base : base + width]
            by_node: dict[str, list[int]] = {}
            for name, local, _ in members:
                by_node.setdefault(name, []).append(local)
            spanned = [cluster.nodes[name] for name in by_node]
            span = f"ranks {base}..{base + width - 1} span {', '.join(sorted(by_node))}"
            if len(by_node) > 1 and layout.cp > 1:
                raise InputError(
                    where,
                    [
                        Problem(
                            "cp",
                            "a stage's tp·cp GPUs sit inside one node with context parallelism; "
                            f"{span}",
                            layout.cp,
                            True,
                        )
                    ],
                )
            if len(by_node) > 1 and not _whole_nodes(spanned, by_node):
                raise InputError(
                    where,
                    [
                        Problem(
                            "tp",
                            "a tensor-parallel group sits inside one node or spans whole nodes "
                            f"of one GPU type and size; {span}",
                            layout.tp,
                            True,
                        )
                    ],
                )
            node = members[0][2]
            groups[(d, p)] = list(by_node.items())
            classes.append((node.gpu, node.island))
        templates.setdefault(tuple(classes), []).append(d)
    placement = []
    for t_index, replicas in enumerate(templates.values()):
        for r_index, d in enumerate(replicas):
            for p in range(layout.pp):
                (node, local), *more = groups[(d, p)]
                placement.append(
                    PlacementEntry(
                        pipeline=t_index,
                        replica=r_index,
                        stage=p,
                        node=node,
                        gpus=local,
                        more_nodes=[NodeGPUs(node=n, gpus=g) for n, g in more],
                    )
                )
    return [(classes, len(replicas)) for classes, replicas in templates.items()], placement


def _whole_nodes(nodes: list, used: dict[str, list[int]]) -> bool:
    """A TP group over several nodes takes every GPU of each, all of one GPU type, island and size
    (verify.py)."""
    first = nodes[0]
    return all(
        len(used[n.name]) == n.gpus == first.gpus and (n.gpu, n.island) == (first.gpu, first.island)
        for n in nodes
    )

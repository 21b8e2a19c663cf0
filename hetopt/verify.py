"""The independent plan verifier: re-checks every structural constraint of a plan against an
instance.

It shares no code with the planners or the layout expansion, so a planner bug cannot hide behind it.
Findings carry the key path inside the plan.
"""

from __future__ import annotations

from collections import Counter

from hetopt.plan import Plan
from hetopt.spec.checks import cp_splits_sequence
from hetopt.spec.instance import Instance

Finding = tuple[str, str]
"""(key path in the plan, what is wrong)."""


def check_plan(inst: Instance, plan: Plan) -> list[Finding]:
    # a plan made for another instance: that is the one thing to say (its stages would all mismatch
    # too)
    return check_planned_for(inst, plan) or [
        *check_stages(inst, plan),
        *check_layers(inst, plan),
        *check_batch(inst, plan),
        *check_resources(inst, plan),
        *check_zero(plan),
        *check_placement(inst, plan),
    ]


def check_planned_for(inst: Instance, plan: Plan) -> list[Finding]:
    """A plan that records its instance is checked against the one given: the same model, training
    settings and cluster (by fingerprint), or it is refused, naming the parts that differ."""
    if plan.instance is None:
        return []
    ours = inst.fingerprint()
    differ = [
        part
        for part in ("model", "training", "cluster")
        if getattr(plan.instance, part) != ours[part]
    ]
    if not differ:
        return []
    return [
        (
            "instance",
            f"planned for instance {plan.instance.name!r}, whose {' and '.join(differ)} "
            f"{'differs' if len(differ) == 1 else 'differ'} from those of {inst.name!r}; plan "
            "again for this instance (`hetopt solve`), or remove the plan's `instance` key to "
            "evaluate it here anyway",
        )
    ]


def check_stages(inst: Instance, plan: Plan) -> list[Finding]:
    found = []
    classes = inst.cluster.device_classes
    for i, pipe in enumerate(plan.pipelines):
        for j, st in enumerate(pipe.stages):
            path = f"pipelines[{i}].stages[{j}]"
            dc = classes.get((st.gpu, st.island))
            if dc is None:
                known = ", ".join(f"{g}@{isl}" for g, isl in classes)
                found.append(
                    (path, f"no device class {st.gpu}@{st.island} in the cluster; classes: {known}")
                )
                continue
            if inst.model.heads % st.tp:
                found.append(
                    (
                        f"{path}.tp",
                        f"tp={st.tp} does not divide the model's {inst.model.heads} heads",
                    )
                )
            elif inst.model.kv_heads % st.tp:
                found.append(
                    (
                        f"{path}.tp",
                        f"tp={st.tp} does not divide the model's {inst.model.kv_heads} kv_heads "
                        "(grouped-query attention: each TP rank holds whole key/value heads)",
                    )
                )
            found += _check_cp(inst, dc, st, path)
            found += _check_shards(inst, plan, len(plan.pipelines), st, path)
            if st.tp > dc.max_gpus_per_node and not whole_nodes(dc, st.tp):
                sizes = sorted({n.gpus for n in dc.nodes})
                found.append(
                    (
                        f"{path}.tp",
                        f"tp={st.tp} exceeds the {dc.max_gpus_per_node} GPUs of a {dc.label} "
                        f"node and is not a multiple of a node size ({sizes}) with that many nodes "
                        "in the class; a TP group sits inside one node or spans whole nodes of one "
                        "GPU type",
                    )
                )
    return found


def _check_cp(inst: Instance, dc, st, path: str) -> list[Finding]:
    """Context parallelism as Megatron-LM runs it: the sequence in 2·cp chunks (causal load
    balancing) of whole TP shards (sequence parallelism), flash attention (its ring attention
    kernels), and — in hetopt — the stage's tp·cp GPUs inside one node."""
    if st.cp <= 1:
        return []
    found = []
    if not cp_splits_sequence(inst.seq_len, st.tp, st.cp):
        found.append(
            (
                f"{path}.cp",
                f"cp={st.cp} with tp={st.tp}: the sequence of {inst.seq_len} tokens does not "
                f"split into 2·cp·tp = {2 * st.cp * st.tp} equal chunks",
            )
        )
    if inst.spec.training.attention != "flash":
        found.append(
            (
                f"{path}.cp",
                f"cp={st.cp} needs training.attention: flash (ring attention runs on flash "
                f"kernels); it is {inst.spec.training.attention}",
            )
        )
    if st.width > dc.max_gpus_per_node:
        found.append(
            (
                f"{path}.cp",
                f"tp·cp = {st.width} exceeds the {dc.max_gpus_per_node} GPUs of a {dc.label} "
                "node; a stage with context parallelism keeps its tp·cp GPUs in one node",
            )
        )
    return found


def _check_shards(inst: Instance, plan: Plan, templates: int, st, path: str) -> list[Finding]:
    """A stage whose data-parallel ranks are listed by class (Metis-style): the first of the stage's
    own class, each class once and in the cluster, each rank's tp·cp GPUs inside one node of its
    class, the micro-batch split among the ranks exactly, and one template (other templates would
    hold its layers in another split, and ZeRO shards over one data-parallel group)."""
    if not st.shards:
        return []
    found = []
    classes = inst.cluster.device_classes
    if st.shards[0].device_class != st.device_class:
        found.append(
            (
                f"{path}.shards[0]",
                f"is {st.shards[0].gpu}@{st.shards[0].island}; the first shard is of the "
                f"stage's own class {st.gpu}@{st.island}",
            )
        )
    seen = set()
    for k, sh in enumerate(st.shards):
        where = f"{path}.shards[{k}]"
        if sh.device_class in seen:
            found.append(
                (
                    where,
                    f"lists {sh.gpu}@{sh.island} again; give each class one shard (its ranks "
                    "all take the same sequences)",
                )
            )
        seen.add(sh.device_class)
        dc = classes.get(sh.device_class)
        if dc is None:
            known = ", ".join(f"{g}@{isl}" for g, isl in classes)
            found.append(
                (where, f"no device class {sh.gpu}@{sh.island} in the cluster; classes: {known}")
            )
        elif st.width > dc.max_gpus_per_node:
            found.append(
                (
                    where,
                    f"tp·cp = {st.width} exceeds the {dc.max_gpus_per_node} GPUs of a "
                    f"{dc.label} node; each rank of a stage with shards keeps its GPUs in one node",
                )
            )
    split = sum(sh.ranks * sh.sequences for sh in st.shards)
    if split != plan.micro_batch:
        found.append(
            (
                f"{path}.shards",
                f"Σ ranks·sequences = {split}; each micro-batch has {plan.micro_batch} "
                "sequences to split among the stage's ranks",
            )
        )
    if templates > 1:
        found.append(
            (
                f"{path}.shards",
                f"a stage with shards needs a plan of one template; this one has {templates}",
            )
        )
    return found


def whole_nodes(dc, tp: int) -> bool:
    """Whether `tp` GPUs are whole nodes of one size in device class `dc` (one GPU type, one
    island)."""
    return any(
        tp % g == 0 and sum(n.gpus == g for n in dc.nodes) >= tp // g
        for g in {n.gpus for n in dc.nodes}
    )


def check_layers(inst: Instance, plan: Plan) -> list[Finding]:
    found = []
    for i, pipe in enumerate(plan.pipelines):
        total = sum(st.layers for st in pipe.stages)
        if total != inst.model.layers:
            found.append(
                (
                    f"pipelines[{i}].stages",
                    f"stages hold {total} layers; the model has {inst.model.layers}",
                )
            )
        for j, st in enumerate(pipe.stages):
            # a stage of 0 layers holds the embedding (first), the head (last) or nothing: a
            # middle one only passes the activations on, as DeepSpeed's parameter-based partition
            # makes them (parts such as 0/0/1/1/1/2/…)
            if st.layers == 0 and plan.virtual_stages > 1:
                found.append(
                    (
                        f"pipelines[{i}].stages[{j}].layers",
                        "a stage of 0 layers needs virtual_stages 1 (its model chunks would be "
                        "empty)",
                    )
                )
        if plan.virtual_stages > 1:
            for j, st in enumerate(pipe.stages):
                if st.layers % plan.virtual_stages:
                    found.append(
                        (
                            f"pipelines[{i}].stages[{j}].layers",
                            f"{st.layers} layers do not split into {plan.virtual_stages} "
                            "virtual stages",
                        )
                    )
    return found


def check_batch(inst: Instance, plan: Plan) -> list[Finding]:
    found = []
    sequences = plan.micro_batch * sum(p.replicas * p.micro_batches for p in plan.pipelines)
    if sequences != inst.global_batch:
        found.append(
            (
                "pipelines",
                f"micro_batch × Σ replicas·micro_batches = {sequences} sequences per iteration; "
                f"the global batch is {inst.global_batch}",
            )
        )
    if plan.schedule == "interleaved":  # Megatron-LM's schedule runs micro-batches in groups of p
        for i, pipe in enumerate(plan.pipelines):
            if pipe.micro_batches % len(pipe.stages):
                found.append(
                    (
                        f"pipelines[{i}].micro_batches",
                        f"{pipe.micro_batches} micro-batches are not a multiple of the "
                        f"{len(pipe.stages)} stages, as the interleaved schedule needs",
                    )
                )
    return found


def check_resources(inst: Instance, plan: Plan) -> list[Finding]:
    need: Counter[tuple[str, str]] = Counter()
    for pipe in plan.pipelines:
        for st in pipe.stages:
            for sh in st.ranks_of(plan.micro_batch):
                need[sh.device_class] += pipe.replicas * st.width * sh.ranks
    found = []
    for key, n in need.items():
        dc = inst.cluster.device_classes.get(key)
        if dc is not None and n > dc.gpus:
            found.append(
                ("pipelines", f"the plan uses {n} GPUs of {dc.label}; the cluster has {dc.gpus}")
            )
    return found


def check_zero(plan: Plan) -> list[Finding]:
    if plan.zero >= 2 and len(plan.pipelines) > 1:
        return [
            (
                "zero",
                f"ZeRO-{plan.zero} shards over one data-parallel group of identical pipelines; "
                f"this plan has {len(plan.pipelines)} templates with different layer splits — use "
                "zero 0 or 1",
            )
        ]
    return []


def _where(key: tuple[int, int, int, int], sharded: set[tuple[int, int]]) -> str:
    """A placement key in words; the rank named where the stage has shards (or the key has a
    rank)."""
    rank = key[3] or (key[0], key[2]) in sharded
    return f"pipeline {key[0]} replica {key[1]} stage {key[2]}" + (
        f" rank {key[3]}" if rank else ""
    )


def _rank_class(stage, rank: int) -> tuple[str, str]:
    """The device class of a stage's data-parallel rank `rank` (its shards in order)."""
    for sh in stage.shards:
        if rank < sh.ranks:
            return sh.device_class
        rank -= sh.ranks
    return stage.device_class


def _check_group(nodes: dict, stage, klass: tuple[str, str], e, path: str) -> list[Finding]:
    """A placement entry whose TP group spans several whole nodes (`more_nodes`)."""
    found = []
    members = e.members
    if len({name for name, _ in members}) != len(members):
        found.append(
            (f"{path}.more_nodes", "names a node twice; list each node of the TP group once")
        )
    used = sum(len(set(gpus)) for _, gpus in members)
    if used != stage.tp:
        found.append((f"{path}.gpus", f"{used} distinct GPUs for a stage of tp={stage.tp}"))
    head = nodes.get(members[0][0])
    for m, (name, gpus) in enumerate(members):
        where = path if m == 0 else f"{path}.more_nodes[{m - 1}]"
        node, problems = _node_findings(nodes, klass, name, gpus, where)
        found += problems
        if node is None:
            continue
        if len(set(gpus)) != node.gpus:
            found.append(
                (
                    f"{where}.gpus",
                    f"a TP group over several nodes takes whole nodes; {name} has {node.gpus} "
                    f"GPUs, the group uses {len(set(gpus))}",
                )
            )
        if m > 0 and head is not None and node.gpus != head.gpus:
            found.append(
                (
                    f"{where}.node",
                    f"{name} has {node.gpus} GPUs, {head.name} {head.gpus}; the nodes of a TP "
                    "group over several nodes have as many GPUs each",
                )
            )
    return found


def _node_findings(
    nodes: dict, klass: tuple[str, str], name: str, gpus: list[int], where: str
) -> tuple:
    """(the node or None, findings): the node exists, is of the rank's device class `klass` (GPU
    type, island), has these GPUs."""
    node = nodes.get(name)
    if node is None:
        return None, [(f"{where}.node", f"no node named {name!r}")]
    found = []
    if (node.gpu, node.island) != klass:
        found.append(
            (
                f"{where}.node",
                f"{name} is {node.gpu}@{node.island}; the stage is {klass[0]}@{klass[1]}",
            )
        )
    if max(gpus) >= node.gpus:
        found += [
            (f"{where}.gpus", f"GPU {g} does not exist on {name} ({node.gpus} GPUs)")
            for g in gpus
            if g >= node.gpus
        ]
    return node, found


def check_placement(inst: Instance, plan: Plan) -> list[Finding]:
    # a plan over the cluster's GPUs is refused by check_resources; its placement is not enumerated
    # (a plan file with 10**12 replicas made this check allocate until the OOM killer came, found by
    # fuzzing)
    if not plan.placement or plan.gpus_used > inst.cluster.total_gpus:
        return []
    found = []
    nodes = inst.cluster.nodes
    expected = {
        (i, r, j, k)
        for i, p in enumerate(plan.pipelines)
        for r in range(p.replicas)
        for j, st in enumerate(p.stages)
        for k in range(st.dp_ranks)
    }
    seen: Counter[tuple[int, int, int, int]] = Counter()
    gpus_taken: Counter[tuple[str, int]] = Counter()
    for k, e in enumerate(plan.placement):
        path = f"placement[{k}]"
        key = (e.pipeline, e.replica, e.stage, e.rank)
        seen[key] += 1
        if key not in expected:
            found.append(
                (
                    path,
                    f"places pipeline {e.pipeline} replica {e.replica} stage {e.stage}"
                    f"{f' rank {e.rank}' if e.rank else ''}, which the plan does not have",
                )
            )
            continue
        stage = plan.pipelines[e.pipeline].stages[e.stage]
        klass = _rank_class(stage, e.rank)
        if e.more_nodes:
            found += _check_group(nodes, stage, klass, e, path)
        else:  # the common case: a TP group inside one node
            node, problems = _node_findings(nodes, klass, e.node, e.gpus, path)
            found += problems
            if node is None:
                continue
            if len(set(e.gpus)) != stage.width:
                found.append(
                    (
                        f"{path}.gpus",
                        f"{len(set(e.gpus))} distinct GPUs for a stage of tp={stage.tp}"
                        + (f", cp={stage.cp}" if stage.cp > 1 else ""),
                    )
                )
        for name, gpus in e.members if e.more_nodes else ((e.node, e.gpus),):
            gpus_taken.update((name, g) for g in gpus)
    sharded = {
        (i, j) for i, p in enumerate(plan.pipelines) for j, st in enumerate(p.stages) if st.shards
    }
    for key in sorted(expected - set(seen)):
        found.append(("placement", f"{_where(key, sharded)} is not placed"))
    for key, n in seen.items():
        if n > 1:
            found.append(("placement", f"{_where(key, sharded)} is placed {n} times"))
    for (node_name, g), n in gpus_taken.items():
        if n > 1:
            found.append(("placement", f"GPU {g} of {node_name} is used by {n} stages"))
    return found

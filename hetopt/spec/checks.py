"""Checks of meaning that a schema cannot express: references, divisibility, probabilities.

One function per group of rules; each returns the problems it found with their key paths, so that a
user sees every mistake of a file at once.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

from hetopt.errors import InputError, did_you_mean
from hetopt.spec.gpus import CATALOG
from hetopt.spec.presets import PRESETS, apply_preset
from hetopt.spec.scenarios import (
    DEFAULT_HORIZON_S,
    MAX_SCENARIO_CHANGES,
    STEP_KEYS,
    outages,
    read_trace,
)
from hetopt.spec.schema import Generator, InstanceFile, Scenario

Loc = tuple[str | int, ...]
Finding = tuple[Loc, str, object]
"""(key path, message with the fix, value given)."""

_NO_VALUE = object()
PROBABILITY_TOLERANCE = 1e-6


def check_instance(spec: InstanceFile, base_dir: Path) -> list[Finding]:
    return [
        *check_model(spec),
        *check_gpu_types(spec),
        *check_training(spec),
        *check_node_groups(spec),
        *check_links(spec),
        *check_scenarios(spec, base_dir),
        *check_search(spec),
    ]


def check_model(spec: InstanceFile) -> Iterator[Finding]:
    m = spec.model
    preset = None
    if m.preset is not None:
        preset = PRESETS.get(m.preset)
        if preset is None:
            yield (
                ("model", "preset"),
                f"unknown preset{did_you_mean(m.preset, PRESETS)}; known presets: "
                f"{', '.join(PRESETS)}",
                m.preset,
            )
            return
    else:
        for key in ("layers", "hidden", "heads", "vocab"):
            if getattr(m, key) is None:
                yield (
                    ("model", key),
                    "required when no preset is given; add it or name a preset "
                    f"({', '.join(PRESETS)})",
                    _NO_VALUE,
                )
        if spec.training.seq_len is None and m.max_seq_len is None:
            yield (
                ("training", "seq_len"),
                "required when the model has no preset; add the sequence length in tokens",
                _NO_VALUE,
            )

    values = apply_preset(preset, m.model_dump(exclude={"preset"}))
    hidden, heads, kv_heads = values.get("hidden"), values.get("heads"), values.get("kv_heads")
    if hidden and heads and hidden % heads:
        yield (
            ("model", "heads"),
            f"must divide hidden ({hidden}); {hidden} / {heads} is not whole — pick heads among "
            f"{_divisors_near(hidden, heads)}",
            heads,
        )
    if heads and kv_heads and heads % kv_heads:
        yield (
            ("model", "kv_heads"),
            f"must divide heads ({heads}) for grouped-query attention — pick one of "
            f"{_divisors(heads)}",
            kv_heads,
        )


MAX_GLOBAL_BATCH = 1 << 20
"""The most sequences per iteration hetopt plans for: 16× the largest published batch (65,536
sequences, BERT with LAMB, You et al. 2020); beyond it the micro-batch shares between two templates
run to billions of skeletons (global_batch 10^12 filled 24 GB)."""


def check_training(spec: InstanceFile) -> Iterator[Finding]:
    batch = spec.training.global_batch
    if batch > MAX_GLOBAL_BATCH:
        yield (
            ("training", "global_batch"),
            f"more sequences per iteration than the {MAX_GLOBAL_BATCH:,} hetopt plans for (the "
            "largest published batches are about 65,536); give the batch of one optimizer step",
            batch,
        )


def check_gpu_types(spec: InstanceFile) -> Iterator[Finding]:
    for name in spec.cluster.gpus:
        if name in CATALOG:
            yield (
                ("cluster", "gpus", name),
                f"'{name}' is already in the catalog (`hetopt gpus`); use the catalog entry or "
                "give the custom GPU another name",
                name,
            )


MAX_CLUSTER_GPUS = 131_072
"""The most GPUs a cluster may have: 16× the largest benchmarked search (8,192 GPUs:
docs/benchmarks.md); a billion nodes would take gigabytes to build before any search."""


def check_node_groups(spec: InstanceFile) -> Iterator[Finding]:
    known = {**CATALOG, **spec.cluster.gpus}
    seen: dict[str, int] = {}
    total_gpus = sum(g.rentable * g.gpus_per_node for g in spec.cluster.nodes)
    # named at the largest group, checked before the cluster is built
    if total_gpus > MAX_CLUSTER_GPUS:
        i, group = max(
            enumerate(spec.cluster.nodes), key=lambda ig: ig[1].rentable * ig[1].gpus_per_node
        )
        yield (
            ("cluster", "nodes", i, "count"),
            f"the cluster has {total_gpus:,} GPUs, more than the {MAX_CLUSTER_GPUS:,} hetopt "
            "plans for; plan a part of it",
            group.count,
        )
    for i, group in enumerate(spec.cluster.nodes):
        if group.name in seen:
            yield (
                ("cluster", "nodes", i, "name"),
                f"duplicate node group name (also cluster.nodes[{seen[group.name]}]); give each "
                "group its own name",
                group.name,
            )
        seen.setdefault(group.name, i)
        if group.gpu not in known:
            yield (
                ("cluster", "nodes", i, "gpu"),
                f"unknown GPU type{did_you_mean(group.gpu, known)}; use a name from `hetopt "
                "gpus` or declare it under cluster.gpus",
                group.gpu,
            )


def check_links(spec: InstanceFile) -> Iterator[Finding]:
    islands = {g.island for g in spec.cluster.nodes}
    pairs: dict[frozenset[str], int] = {}
    for i, link in enumerate(spec.cluster.network.links):
        for end in ("a", "b"):
            island = getattr(link, end)
            if island not in islands:
                yield (
                    ("cluster", "network", "links", i, end),
                    f"no node group is in island '{island}'{did_you_mean(island, islands)}; "
                    f"islands with nodes: {', '.join(sorted(islands))}",
                    island,
                )
        if link.a == link.b:
            yield (
                ("cluster", "network", "links", i, "b"),
                "a link joins two different islands; traffic inside an island is limited by the "
                "NICs",
                link.b,
            )
        pair = frozenset((link.a, link.b))
        if pair in pairs:
            yield (
                ("cluster", "network", "links", i),
                f"duplicate link {link.a}–{link.b} (also links[{pairs[pair]}]); merge them into "
                "one",
                [link.a, link.b],
            )
        pairs.setdefault(pair, i)


def check_outages_end(where: tuple, changes: list) -> Iterator[Finding]:
    """Every outage (0 Gbit/s) among a scenario's changes (its events or measured trace) ends: one
    that lasts to the end would leave every plan that crosses the link unable to finish an
    iteration."""
    for link, start, end in outages(changes):
        if math.isinf(end):
            yield (
                where,
                f"takes link {link[0]}-{link[1]} down (0 Gbit/s) at {start:g} s and never "
                "brings it back, so no plan that crosses it can finish an iteration; add the time "
                "it comes back",
                f"{link[0]}-{link[1]} at {start:g} s",
            )


def check_scenarios(spec: InstanceFile, base_dir: Path) -> Iterator[Finding]:
    links = {frozenset((lk.a, lk.b)) for lk in spec.cluster.network.links}
    link_names = (
        ", ".join(f"[{lk.a}, {lk.b}]" for lk in spec.cluster.network.links) or "none declared"
    )
    horizon = spec.search.horizon_s or DEFAULT_HORIZON_S
    names: dict[str, int] = {}
    for i, sc in enumerate(spec.scenarios):
        if sc.name in names:
            yield (
                ("scenarios", i, "name"),
                f"duplicate scenario name (also scenarios[{names[sc.name]}])",
                sc.name,
            )
        names.setdefault(sc.name, i)
        yield from _check_scenario_links(i, sc, links, link_names)
        where, changes, trace_problems = _scenario_changes(i, sc, base_dir, links)
        yield from trace_problems
        if sc.generator is not None:
            yield from _check_generator(i, sc.generator, horizon)
        yield from check_outages_end(where, changes)
    yield from _check_probabilities(spec)


def _check_scenario_links(
    i: int, sc: Scenario, links: set[frozenset[str]], link_names: str
) -> Iterator[Finding]:
    """A scenario has one source of changes, and every link it changes is declared: a change on an
    unknown link would silently price nothing."""
    if sc.events and sc.generator is not None:
        yield (
            ("scenarios", i, "generator"),
            "give either events or a generator, not both",
            sc.generator.kind,
        )
    ends = [(("scenarios", i, "events", j, "link"), ev.link) for j, ev in enumerate(sc.events)]
    if sc.generator is not None and sc.generator.kind != "trace":
        ends.append((("scenarios", i, "generator", "link"), sc.generator.link))
    for loc, link in ends:
        if frozenset(link) not in links:
            yield (
                loc,
                f"no such link in cluster.network.links; declared links: {link_names}",
                link,
            )


def _scenario_changes(
    i: int, sc: Scenario, base_dir: Path, links: set[frozenset[str]]
) -> tuple[Loc, list, list[Finding]]:
    """The changes whose outages must end, the key path to blame for them, and the problems of a
    measured trace: its changes are only known once its file is read."""
    changes = [(ev.at_s, tuple(sorted(ev.link)), ev.gbps) for ev in sc.events]
    where: Loc = ("scenarios", i, "events")
    gen = sc.generator
    if gen is None or gen.kind != "trace":
        return where, changes, []
    path_loc: Loc = ("scenarios", i, "generator", "path")
    if not (base_dir / gen.path).is_file():
        found = f"trace file not found (looked for {(base_dir / gen.path).resolve()})"
        return where, changes, [(path_loc, found, gen.path)]
    try:
        return path_loc, read_trace(base_dir / gen.path, links), []
    except InputError as exc:
        bad = f"bad trace: {exc.render().removeprefix('error: ')}"
        return path_loc, changes, [(path_loc, bad, gen.path)]


def _check_generator(i: int, gen: Generator, horizon: float) -> Iterator[Finding]:
    """A generator's parameters make a trace that can be replayed: not too many changes over the
    horizon, a positive bandwidth, and a drop that ends after it starts."""
    step = STEP_KEYS.get(gen.kind)
    if step and horizon / getattr(gen, step) > MAX_SCENARIO_CHANGES:
        yield (
            ("scenarios", i, "generator", step),
            f"makes about {horizon / getattr(gen, step):,.0f} bandwidth changes over the "
            f"{horizon:g} s horizon, more than {MAX_SCENARIO_CHANGES:,}; give at least "
            f"{horizon / MAX_SCENARIO_CHANGES:g} s",
            getattr(gen, step),
        )
    if gen.kind == "diurnal" and gen.amplitude_gbps >= gen.mean_gbps:
        yield (
            ("scenarios", i, "generator", "amplitude_gbps"),
            f"must be below mean_gbps ({gen.mean_gbps}) so the bandwidth stays positive",
            gen.amplitude_gbps,
        )
    if gen.kind == "step" and gen.until_s is not None and gen.until_s <= gen.at_s:
        yield (
            ("scenarios", i, "generator", "until_s"),
            f"must be after at_s ({gen.at_s})",
            gen.until_s,
        )
    if gen.kind == "step" and gen.low_gbps == 0 and gen.until_s is None:
        yield (
            ("scenarios", i, "generator", "until_s"),
            "a drop to 0 Gbit/s is an outage, and one that never ends leaves no plan across "
            "the link able to finish; give the time the link comes back",
            None,
        )


def _check_probabilities(spec: InstanceFile) -> Iterator[Finding]:
    """The scenarios' probabilities sum to 1, so that an expected cost over them is one."""
    if spec.scenarios:
        total = math.fsum(sc.probability for sc in spec.scenarios)
        if abs(total - 1.0) > PROBABILITY_TOLERANCE:
            yield (
                ("scenarios",),
                f"probabilities sum to {total:g}, not 1; adjust them so they sum to 1",
                [sc.probability for sc in spec.scenarios],
            )


def check_search(spec: InstanceFile) -> Iterator[Finding]:
    s = spec.search
    types = list(dict.fromkeys(g.gpu for g in spec.cluster.nodes))
    for name in s.gpus or []:
        if name not in types:
            yield (
                ("search", "gpus"),
                f"'{name}' is no GPU type of the cluster{did_you_mean(name, types)}; its types: "
                + ", ".join(types),
                s.gpus,
            )
    for key in ("gpus", "tp", "micro_batch", "recompute", "virtual_stages", "cp"):
        values = getattr(s, key)
        if values is not None and not values:
            yield (
                ("search", key),
                "an empty list allows nothing; remove the key to allow every value",
                values,
            )
        elif values is not None and len(set(values)) != len(values):
            yield (("search", key), "lists a value twice; list each value once", values)
    preset = PRESETS.get(spec.model.preset) if spec.model.preset is not None else None
    model = apply_preset(preset, spec.model.model_dump(exclude={"preset"}))
    layers = model.get("layers")
    yield from check_search_tp(
        s.tp,
        model.get("heads"),
        model.get("kv_heads") or model.get("heads"),
        max((g.gpus_per_node for g in spec.cluster.nodes), default=0),
    )
    batch = spec.training.global_batch
    if s.micro_batch and not any(batch % b == 0 for b in s.micro_batch):
        yield (
            ("search", "micro_batch"),
            f"none of these divides training.global_batch ({batch}), so no plan has whole "
            f"micro-batches; pick among {_divisors(batch)[:8]}",
            s.micro_batch,
        )
    if s.virtual_stages and layers:
        # interleaving cuts every stage into v chunks of whole layers (Megatron-LM's virtual
        # pipeline)
        bad = [v for v in s.virtual_stages if layers % v]
        if bad:
            yield (
                ("search", "virtual_stages"),
                f"{', '.join(map(str, bad))} do not divide the model's {layers} layers; pick "
                f"among {_divisors(layers)[:8]}",
                s.virtual_stages,
            )


def tp_splits_heads(heads: int, kv_heads: int, tp: int) -> bool:
    """A TP degree splits the attention heads and the key/value heads (grouped-query attention)
    evenly (Megatron-LM requires both: num_attention_heads and num_query_groups divisible by the TP
    size)."""
    return heads % tp == 0 and kv_heads % tp == 0


def cp_splits_sequence(seq_len: int, tp: int, cp: int) -> bool:
    """A context-parallel degree cp splits the sequence as Megatron-LM's causal load balancing does:
    into 2·cp equal chunks (rank i holds chunks i and 2cp − 1 − i), each chunk's tokens split over
    the tp ranks (sequence parallelism). Always true without CP."""
    return cp == 1 or seq_len % (2 * cp * tp) == 0


def check_search_tp(
    tps: list[int] | None, heads: int | None, kv_heads: int | None, node_gpus: int
) -> Iterator[Finding]:
    """Some TP degree of search.tp must be usable: dividing the heads and the key/value heads
    (Megatron-LM splits both) and fitting in the largest node (TP runs inside a node)."""
    if not tps or not heads or not kv_heads:
        return
    why = {}
    for t in tps:
        if not tp_splits_heads(heads, kv_heads, t):
            why[t] = f"does not divide {heads} heads and {kv_heads} key/value heads"
        elif t > node_gpus:
            why[t] = f"is more than the {node_gpus} GPUs of the largest node"
    if len(why) == len(tps):
        fits = [d for d in _divisors(math.gcd(heads, kv_heads)) if d <= node_gpus]
        yield (
            ("search", "tp"),
            f"no TP degree can be used: {'; '.join(f'{t} {w}' for t, w in why.items())}; pick "
            f"among {fits}",
            tps,
        )


def _divisors(n: int) -> list[int]:
    """The divisors of n, ascending, found up to √n (a value like 2**31 comes with a typo)."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return small + [n // d for d in reversed(small) if d * d != n]


def _divisors_near(n: int, near: int, k: int = 4) -> list[int]:
    return sorted(sorted(_divisors(n), key=lambda d: abs(d - near))[:k])


NO_VALUE = _NO_VALUE

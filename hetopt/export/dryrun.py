"""A rank map run for real on the CPU: `python -m hetopt.export.dryrun rankmap.json`.

One process per global rank, torch.distributed over gloo. Every rank builds the process groups its
entry names (tensor, context and data parallel; each group made once, by every rank, in one order)
and checks each by an all-reduce of the members' ranks. Then one training step of a tiny transformer
runs through the pipeline as the map lays it out: each replica's micro-batches (its share of one
global batch, in replica order), each stage its layers (`first_layer`, `layers`; the embedding on
the first stage, the head and the loss on the last), activations sent to `pp_next` and gradients
back to `pp_prev`, then the gradients all-reduced in each `grad_group`. Before any process starts,
`consistency` checks the map on its own (every GPU once, groups alike from each member's side,
neighbours paired). Each rank compares the loss and its parameters' gradients with one process
computing the same step on the whole batch: they must agree to `TOLERANCE`.

It checks the map (one template, TP and CP of 1: the tiny model is not sharded) — that the groups
are what they say, the neighbours send and receive in step, the layers cover the model once and the
micro-batches the batch once — not a launcher. torch is needed (the `measure` extra).
"""

from __future__ import annotations

import json
import os
import socket
import sys
import tempfile
from datetime import timedelta
from pathlib import Path

WAIT_S = 60
"""Seconds a rank waits for a peer (process-group start, a send, a collective) before it fails."""
TOLERANCE = 1e-5
"""Largest absolute difference allowed between a rank's loss or gradient and the single
process's."""
HIDDEN, HEADS, VOCAB, SEQ = 16, 2, 32, 8
"""The tiny transformer: hidden size, attention heads, vocabulary and sequence length."""


def _model(layers: int):
    """The whole tiny model, the same on every rank (seeded): embedding, `layers` encoder layers,
    head."""
    import torch

    torch.manual_seed(1234)
    embedding = torch.nn.Embedding(VOCAB, HIDDEN)
    blocks = torch.nn.ModuleList(
        torch.nn.TransformerEncoderLayer(HIDDEN, HEADS, 4 * HIDDEN, dropout=0.0, batch_first=True)
        for _ in range(layers)
    )
    head = torch.nn.Linear(HIDDEN, VOCAB)
    return embedding, blocks, head


def _batch(sequences: int):
    import torch

    g = torch.Generator().manual_seed(99)
    tokens = torch.randint(0, VOCAB, (sequences, SEQ + 1), generator=g)
    return tokens[:, :-1], tokens[:, 1:]


def _reference(layers: int, sequences: int) -> tuple[float, dict]:
    """Loss and gradients of one step on the whole batch in one process."""
    import torch

    embedding, blocks, head = _model(layers)
    inputs, targets = _batch(sequences)
    x = embedding(inputs)
    for block in blocks:
        x = block(x)
    loss = torch.nn.functional.cross_entropy(head(x).reshape(-1, VOCAB), targets.reshape(-1))
    loss.backward()
    grads = {f"embedding.{n}": p.grad for n, p in embedding.named_parameters()}
    grads |= {
        f"blocks.{i}.{n}": p.grad for i, b in enumerate(blocks) for n, p in b.named_parameters()
    }
    grads |= {f"head.{n}": p.grad for n, p in head.named_parameters()}
    return float(loss.detach()), grads


def _rank(rank: int, rankmap: dict, address: str, results: str) -> None:
    """One rank's process: its groups checked, its stage's share of the step run, its loss and
    gradients compared with the single process; what it found written to `results`."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)  # one process per rank on however few cores
    world = rankmap["world_size"]
    # a send or collective nobody answers fails after WAIT_S rather than gloo's 30 minutes
    dist.init_process_group(
        "gloo", init_method=address, rank=rank, world_size=world, timeout=timedelta(seconds=WAIT_S)
    )
    me = rankmap["ranks"][rank]
    found: dict = {"rank": rank}
    try:
        groups = _new_groups(rankmap)
        _check_groups(rank, me, groups, found)
        layers = _model_layers(rankmap)
        replicas = len(me["dp_group"])
        batch = me["sequences"] * me["micro_batches"] * replicas
        embedding, blocks, head = _model(layers)
        mine = list(blocks)[me["first_layer"] : me["first_layer"] + me["layers"]]
        params = _stage_params(me, embedding, mine, head)
        inputs, targets = _batch(batch)
        total_loss = torch.zeros(1)
        for k in range(me["micro_batches"]):
            loss = _micro_batch(me, k, replicas, (embedding, mine, head), inputs, targets)
            if loss is not None:
                total_loss += loss
        dp = groups[tuple(sorted(me["grad_group"]))]
        for p in params.values():
            dist.all_reduce(p.grad, group=dp)
        _compare(me, params, _reference(layers, batch), total_loss, dp, found)
    except Exception as exc:  # reported to the parent, which says which rank failed
        found["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        Path(results, f"{rank}.json").write_text(json.dumps(found))
        dist.destroy_process_group()


GROUP_KEYS = ("tp_group", "cp_group", "dp_group", "grad_group")
"""The process groups a rank map's entry names."""


def _new_groups(rankmap: dict) -> dict[tuple, object]:
    """Every group of the map once, made by every rank in one order (torch.distributed needs all to
    call new_group)."""
    import torch.distributed as dist

    groups: dict[tuple, object] = {}
    for r in rankmap["ranks"]:
        for key in GROUP_KEYS:
            members = tuple(sorted(r[key]))
            if members not in groups:
                groups[members] = dist.new_group(list(members))
    return groups


def _check_groups(rank: int, me: dict, groups: dict[tuple, object], found: dict) -> None:
    """Each of the rank's groups holds it and answers an all-reduce with its members' ranks' sum;
    recorded in `found` as it goes, so that a rank failing midway reports what it had checked."""
    import torch
    import torch.distributed as dist

    found["groups_ok"] = True
    for key in GROUP_KEYS:
        members = tuple(sorted(me[key]))
        total = torch.tensor([float(rank)])
        dist.all_reduce(total, group=groups[members])
        found["groups_ok"] &= int(total.item()) == sum(members) and rank in members


def _model_layers(rankmap: dict) -> int:
    """The model's layers: those of the stages of the first replica's first rank of each stage."""
    return sum(
        r["layers"]
        for r in rankmap["ranks"]
        if r["replica"] == 0 and r["dp_rank"] == 0 and r["tp_rank"] == 0 and r["cp_rank"] == 0
    )


def _stage_params(me: dict, embedding, mine: list, head) -> dict:
    """The parameters the rank holds, named as the single process names them: its layers, and the
    embedding or the head on the first or last stage."""
    params = {
        f"blocks.{me['first_layer'] + i}.{n}": p
        for i, b in enumerate(mine)
        for n, p in b.named_parameters()
    }
    if me["embedding"]:
        params |= {f"embedding.{n}": p for n, p in embedding.named_parameters()}
    if me["head"]:
        params |= {f"head.{n}": p for n, p in head.named_parameters()}
    return params


def _micro_batch(me: dict, k: int, replicas: int, stage: tuple, inputs, targets):
    """Micro-batch k of the rank's replica through its stage, forward then backward: activations
    from pp_prev and to pp_next, gradients the other way. Returns its share of the batch's mean
    loss on the last stage, else None."""
    import torch
    import torch.distributed as dist

    embedding, mine, head = stage
    shape = (me["sequences"], SEQ, HIDDEN)
    first = (me["replica"] * me["micro_batches"] + k) * me["sequences"]
    rows = slice(first, first + me["sequences"])
    if me["embedding"]:
        x_in = None
        x = embedding(inputs[rows])
    else:
        x_in = torch.empty(shape)
        dist.recv(x_in, src=me["pp_prev"][0])
        x_in.requires_grad_(True)
        x = x_in
    for block in mine:
        x = block(x)
    share = None
    if me["head"]:
        loss = torch.nn.functional.cross_entropy(
            head(x).reshape(-1, VOCAB), targets[rows].reshape(-1)
        )
        loss = loss / (me["micro_batches"] * replicas)  # each micro-batch's share of the batch mean
        share = loss.detach()
        loss.backward()
    else:
        dist.send(x.detach().contiguous(), dst=me["pp_next"][0])
        grad = torch.empty(shape)
        dist.recv(grad, src=me["pp_next"][0])
        x.backward(grad)
    if x_in is not None:
        dist.send(x_in.grad.contiguous(), dst=me["pp_prev"][0])
    return share


def _compare(
    me: dict, params: dict, reference: tuple[float, dict], total_loss, dp, found: dict
) -> None:
    """The rank's gradients (all-reduced) and, on the last stage, the batch's loss against the
    single process's; recorded in `found` as it goes."""
    import torch.distributed as dist

    ref_loss, ref_grads = reference
    found["grad_error"] = max(
        float((p.grad - ref_grads[name]).abs().max()) for name, p in params.items()
    )
    found["parameters"] = len(params)
    if me["head"]:
        dist.all_reduce(total_loss, group=dp)
        found["loss"], found["loss_error"] = (
            float(total_loss),
            abs(float(total_loss) - ref_loss),
        )


COUNTS = ("stages", "sequences", "micro_batches")
"""Rank fields that are whole numbers ≥ 1."""
INDICES = (
    "rank",
    "node_rank",
    "local_rank",
    "gpu",
    "template",
    "replica",
    "stage",
    "dp_rank",
    "tp_rank",
    "cp_rank",
    "first_layer",
    "layers",
)
"""Rank fields that are whole numbers ≥ 0."""
GROUPS = ("tp_group", "cp_group", "dp_group", "grad_group", "pp_prev", "pp_next")
"""Rank fields that list other ranks."""
MAX_PROBLEMS = 20
MAX_SEQUENCES = 4096
"""Most sequences one rank's step may run (sequences × micro-batches): the dry run's tiny model is a
check, not a benchmark; a map that asks for more is broken, or would fill every rank's memory."""
MAX_LAYERS = 1024
"""Most tiny layers a map may lay out."""


def _whole(value, least: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= least


def structure(rankmap) -> list[str]:
    """What makes a rank map unreadable, before anything else is checked: the fields each part
    needs, of the right kind, every rank a group names in 0…world_size − 1."""
    if not isinstance(rankmap, dict):
        return ["the rank map must be a JSON object with world_size, nodes and ranks"]
    problems = []
    world = rankmap.get("world_size")
    if not _whole(world, 1):
        problems.append(f"world_size: got {world!r}: must be a whole number ≥ 1")
        world = None
    nodes = rankmap.get("nodes")
    if not isinstance(nodes, list) or not all(
        isinstance(n, dict)
        and isinstance(n.get("name"), str)
        and isinstance(n.get("gpus"), list)
        and all(_whole(g, 0) for g in n["gpus"])
        for n in nodes
    ):
        problems.append("nodes: must be a list of {name, gpus: [GPU indices]} objects")
    ranks = rankmap.get("ranks")
    if not isinstance(ranks, list) or not ranks:
        return [*problems, "ranks: must be a non-empty list of rank objects"]
    if world is not None and world != len(ranks):
        problems.append(f"world_size: got {world}: must equal the number of ranks ({len(ranks)})")
        world = None
    for i, r in enumerate(ranks):
        where = f"ranks[{i}]"
        if not isinstance(r, dict):
            problems.append(f"{where}: must be an object")
            continue
        if not isinstance(r.get("node"), str):
            problems.append(f"{where}.node: got {r.get('node')!r}: must be a node's name")
        for key in COUNTS + INDICES:
            least = 1 if key in COUNTS else 0
            if not _whole(r.get(key), least):
                problems.append(
                    f"{where}.{key}: got {r.get(key)!r}: must be a whole number ≥ {least}"
                )
        for key in GROUPS:
            group = r.get(key)
            if not isinstance(group, list) or not all(
                _whole(o, 0) and (world is None or o < world) for o in group
            ):
                problems.append(
                    f"{where}.{key}: got {group!r}: must list ranks from 0 to world_size − 1"
                )
        problems += _rank_semantics(where, r, world)
        chunks = r.get("chunks", [[0, 0]])
        if not isinstance(chunks, list) or not all(
            isinstance(c, list) and len(c) == 2 and all(_whole(x, 0) for x in c) for c in chunks
        ):
            problems.append(f"{where}.chunks: must list [first layer, layers] pairs")
        if len(problems) > MAX_PROBLEMS:
            return [*problems[:MAX_PROBLEMS], "… and more"]
    if not problems:  # every rank's layers inside the model the map lays out
        total = _model_layers(rankmap)
        problems += [
            f"ranks[{i}]: layers {r['first_layer']} to {r['first_layer'] + r['layers'] - 1} "
            f"lie beyond the model's {total} layers"
            for i, r in enumerate(ranks)
            if r["first_layer"] + r["layers"] > total
        ][:MAX_PROBLEMS]
    return problems


def _rank_semantics(where: str, r: dict, world: int | None) -> list[str]:
    """A rank's fields against each other, once each has the right kind: its stage within the
    depth, the embedding on the first stage and the head on the last, its step within the dry run's
    size, no rank its own pipeline neighbour."""
    fields = (*COUNTS, *INDICES)
    if not all(_whole(r.get(k), 1 if k in COUNTS else 0) for k in fields):
        return []  # the kinds are named already
    out = []
    for key in ("embedding", "head"):
        if not isinstance(r.get(key), bool):
            out.append(f"{where}.{key}: got {r.get(key)!r}: must be true or false")
    if r["stage"] >= r["stages"]:
        out.append(f"{where}.stage: got {r['stage']}: must be below stages ({r['stages']})")
    elif (
        isinstance(r.get("embedding"), bool)
        and isinstance(r.get("head"), bool)
        and (r["embedding"] != (r["stage"] == 0) or r["head"] != (r["stage"] == r["stages"] - 1))
    ):
        out.append(
            f"{where}: the embedding belongs to stage 0 and the head to stage "
            f"{r['stages'] - 1}; stage {r['stage']} has embedding {r['embedding']}, head "
            f"{r['head']}"
        )
    if world is not None and any(r[k] >= world for k in ("replica", "dp_rank", "rank")):
        out.append(f"{where}: replica, dp_rank and rank must be below world_size ({world})")
    if r["sequences"] * r["micro_batches"] > MAX_SEQUENCES:
        out.append(
            f"{where}: {r['sequences']} sequences × {r['micro_batches']} micro-batches: the dry "
            f"run takes at most {MAX_SEQUENCES} sequences a rank"
        )
    if r["first_layer"] + r["layers"] > MAX_LAYERS:
        out.append(f"{where}: layers up to {r['first_layer'] + r['layers']}: at most {MAX_LAYERS}")
    for key in ("pp_prev", "pp_next"):
        if isinstance(r.get(key), list) and r["rank"] in r[key]:
            out.append(f"{where}.{key}: names the rank itself")
    return out


def check(rankmap: dict) -> dict:
    """Run the rank map's step on gloo, one process per rank.

    Parameters: rankmap — a rank map (hetopt.export.rankmap.RankMap.to_json()) of one template at TP
    and CP 1. Returns: {"ok": bool, "ranks": [each rank's findings], "problems": [...]}."""
    problems = structure(rankmap)
    if problems:
        return {"ok": False, "ranks": [], "problems": problems, "unreadable": True}
    import torch.multiprocessing as mp

    ranks = rankmap["ranks"]
    if len({r["template"] for r in ranks}) > 1 or any(
        r["tp_group"] != [r["rank"]] or r["cp_group"] != [r["rank"]] for r in ranks
    ):
        problems.append("the dry run takes one template at TP and CP 1")
    if any(len(r["pp_prev"]) > 1 or len(r["pp_next"]) > 1 for r in ranks):
        problems.append("the dry run takes stages without shards")
    if any(len(r.get("chunks", [[]])) > 1 for r in ranks):
        problems.append(
            "the dry run takes one model chunk per stage (1F1B, not the interleaved schedule)"
        )
    problems += consistency(rankmap)
    if problems:
        return {"ok": False, "ranks": [], "problems": problems}
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as results:
        try:
            mp.start_processes(
                _rank,
                args=(rankmap, f"tcp://127.0.0.1:{port}", results),
                nprocs=len(ranks),
                join=True,
                start_method="spawn",
            )
        except mp.ProcessRaisedException as exc:
            problems.append(f"a rank failed: {str(exc).strip().splitlines()[-1]}")
        except mp.ProcessExitedException as exc:
            problems.append(f"rank {exc.error_index} exited with code {exc.exit_code}")
        found = [
            json.loads(Path(results, f"{r}.json").read_text())
            if Path(results, f"{r}.json").exists()
            else {"rank": r, "error": "no result (the process ended first)"}
            for r in range(len(ranks))
        ]
    for f in found:
        if "error" in f:
            problems.append(f"rank {f['rank']}: {f['error']}")
        elif not f["groups_ok"]:
            problems.append(f"rank {f['rank']}: a process group is not the one the map names")
        # NaN fails too
        elif not (f["grad_error"] <= TOLERANCE and f.get("loss_error", 0.0) <= TOLERANCE):
            problems.append(
                f"rank {f['rank']}: gradients {f['grad_error']:.2e}, loss "
                f"{f.get('loss_error', 0.0):.2e} from the single process"
            )
    covered = sum(
        f.get("parameters", 0) for f, r in zip(found, ranks, strict=True) if r["dp_rank"] == 0
    )
    return {"ok": not problems, "ranks": found, "problems": problems, "parameters_checked": covered}


def consistency(rankmap: dict) -> list[str]:
    """What a map gets wrong without running it: each GPU of one node once, local ranks and GPUs as
    its node's entry lists them, every group the same from each member's side, pp_prev and pp_next
    naming the same pairs, ranks numbered 0…world−1."""
    ranks, problems = rankmap["ranks"], []
    if [r["rank"] for r in ranks] != list(range(rankmap["world_size"])):
        problems.append("ranks are not numbered 0 to world_size − 1 in order")
        return problems
    nodes = {n["name"]: n for n in rankmap["nodes"]}
    seen = set()
    # each rank's groups sorted once: comparing them from every member's side is then linear
    members = {
        key: [sorted(r[key]) for r in ranks]
        for key in ("tp_group", "cp_group", "dp_group", "grad_group")
    }
    for r in ranks:
        node = nodes.get(r["node"])
        if (
            node is None
            or r["local_rank"] >= len(node["gpus"])
            or node["gpus"][r["local_rank"]] != r["gpu"]
        ):
            problems.append(
                f"rank {r['rank']}: node {r['node']}, local rank {r['local_rank']} and GPU "
                f"{r['gpu']} disagree with the map's nodes"
            )
        if (r["node"], r["gpu"]) in seen:
            problems.append(f"rank {r['rank']}: GPU {r['gpu']} of {r['node']} has another rank too")
        seen.add((r["node"], r["gpu"]))
        for key in ("tp_group", "cp_group", "dp_group", "grad_group"):
            own = members[key][r["rank"]]
            if r["rank"] not in r[key] or any(members[key][o] != own for o in r[key]):
                problems.append(
                    f"rank {r['rank']}: its {key} is not the same from each member's side"
                )
            elif any(ranks[o]["stage"] != r["stage"] for o in r[key]):
                problems.append(f"rank {r['rank']}: its {key} holds ranks of another stage")
        for other in r["pp_next"]:
            if r["rank"] not in ranks[other]["pp_prev"]:
                problems.append(
                    f"rank {r['rank']} sends to {other}, whose pp_prev does not name it"
                )
        for other in r["pp_prev"]:
            if r["rank"] not in ranks[other]["pp_next"]:
                problems.append(
                    f"rank {r['rank']} receives from {other}, whose pp_next does not name it"
                )
    return problems


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args in (["-h"], ["--help"]):
        print("usage: python -m hetopt.export.dryrun RANKMAP.json (`hetopt export` writes it)")
        return 0
    if len(args) != 1:
        print("usage: python -m hetopt.export.dryrun RANKMAP.json", file=sys.stderr)
        return 2
    try:
        rankmap = json.loads(Path(args[0]).read_text())
    except (OSError, ValueError, RecursionError) as exc:
        print(
            f"error: {args[0]}: cannot read a rank map ({exc}); give the rankmap.json `hetopt "
            "export` wrote",
            file=sys.stderr,
        )
        return 2
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    result = check(rankmap)
    for problem in result["problems"]:
        print(problem, file=sys.stderr)
    print(json.dumps({k: v for k, v in result.items() if k != "ranks"}))
    if result.get("unreadable"):  # bad input: nothing started
        return 2
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())

"""`hetopt export` (issue 14): the rank map run for real on gloo, the launchers' own libraries
accepting what it writes, the blocking features named, and bad input refused whole."""

from __future__ import annotations

import importlib.util
import json
import os
import shlex
import stat
from pathlib import Path

import pytest
from conftest import REPO, run_hetopt

from hetopt.errors import InputError
from hetopt.export.dryrun import consistency
from hetopt.export.files import export
from hetopt.export.runnable import runnable_instance
from hetopt.plan import Plan, load_plan
from hetopt.spec.instance import load_instance

HERE = Path(__file__).parent / "export"
PLAN8, INST8 = HERE / "pipe8-plan.json", HERE / "pipe8.yaml"
HAS_MEGATRON_CORE = (
    importlib.util.find_spec("megatron") is not None
    and importlib.util.find_spec("megatron.core") is not None
)


def _rankmap(tmp_path: Path) -> dict:
    result = run_hetopt(
        "export",
        str(PLAN8),
        "--instance",
        str(INST8),
        "--format",
        "rankmap",
        "--out",
        str(tmp_path / "out"),
        "--json",
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["files"] == ["rankmap.json"]
    return json.loads((tmp_path / "out" / "rankmap.json").read_text())


def test_the_rank_map_of_four_stages_by_two_replicas_runs_on_gloo(tmp_path):
    """8 processes on gloo build the map's groups, run one step of a tiny transformer through its
    pipeline (layers 3 | 2 | 2 | 1, two replicas of two micro-batches of 2) and all-reduce the
    gradients in each data-parallel group: loss and every gradient equal one process's step on the
    whole batch to 1e-5, and the stages together hold every parameter once (99: embedding, 8 layers
    × 12, head's 2). A map with one rank's layers shifted fails the same check."""
    pytest.importorskip("torch")
    from hetopt.export.dryrun import check

    rankmap = _rankmap(tmp_path)
    # each node holds one replica
    assert rankmap["world_size"] == 8 and rankmap["order"] == "tp-cp-pp-dp"
    stages = [
        (r["stage"], r["first_layer"], r["layers"]) for r in rankmap["ranks"] if r["replica"] == 0
    ]
    assert stages == [(0, 0, 3), (1, 3, 2), (2, 5, 2), (3, 7, 1)]
    assert [r["dp_group"] for r in rankmap["ranks"][:4]] == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert [r["pp_next"] for r in rankmap["ranks"][:4]] == [[1], [2], [3], []]
    result = check(rankmap)
    assert result["ok"], result["problems"]
    assert result["parameters_checked"] == 99
    assert max(f["grad_error"] for f in result["ranks"]) <= 1e-5
    losses = [f["loss"] for f in result["ranks"] if "loss" in f]
    assert len(losses) == 2 and losses[0] == pytest.approx(losses[1], abs=1e-7)
    shifted = json.loads(json.dumps(rankmap))
    shifted["ranks"][5]["first_layer"] = 2  # replica 1's stage 1 runs layers 2–3 instead of 3–4
    bad = check(shifted)
    assert not bad["ok"] and any(p.startswith("rank ") for p in bad["problems"])


def test_megatron_core_accepts_the_exported_values_and_refuses_a_wrong_split(tmp_path):
    """The demo's plan restricted to what Megatron-LM runs (solve --runnable megatron), with
    standard attention so that its V100s take stages too: its exported values build megatron-core's
    TransformerConfig (which validates the layout against num_layers, TP against the heads,
    recompute options, the attention backend) and DistributedDataParallelConfig; one layer too few
    in the layout is refused by the same class."""
    pytest.importorskip("megatron.core")
    from hetopt.planners import solve_ilp
    from hetopt.search.types import SearchRequest

    demo = (REPO / "instances" / "demo-a100-v100-llama7b.yaml").read_text()
    path = tmp_path / "demo-standard.yaml"
    path.write_text(demo.replace("attention: flash", "attention: standard"))
    inst = load_instance(str(path))
    plan = solve_ilp(SearchRequest(runnable_instance(inst, "megatron"), time_limit_s=10)).plan
    done = export(inst, plan, "megatron")
    assert done.blocked == [] and {"megatron_args.txt", "megatron_core.json", "launch.sh"} <= set(
        done.files
    )
    cfg = json.loads(done.files["megatron_core.json"])
    _megatron_objects(cfg)
    args = shlex.split(done.files["megatron_args.txt"])
    assert args[args.index("--position-embedding-type") + 1] == "rope"  # LLaMA-2 7B: rotary
    assert "--swiglu" in args and "--disable-bias-linear" in args
    layout = cfg["transformer"]["pipeline_model_parallel_layout"]  # the demo's: two stages, uneven
    assert (
        args[args.index("--pipeline-model-parallel-layout") + 1] == layout
        and layout.count("|") == 1
    )
    assert (
        int(args[args.index("--tensor-model-parallel-size") + 1]) == plan.pipelines[0].stages[0].tp
    )
    wrong = json.loads(json.dumps(cfg))
    wrong["transformer"]["pipeline_model_parallel_layout"] = "Et|tL"  # 2 layers, not 32
    wrong["transformer"]["pipeline_model_parallel_size"] = 2
    with pytest.raises((AssertionError, ValueError)):
        _megatron_objects(wrong)


def _megatron_objects(cfg: dict):
    """megatron-core's own configuration objects from an export's megatron_core.json."""
    import torch
    from megatron.core.distributed import DistributedDataParallelConfig
    from megatron.core.transformer import TransformerConfig
    from megatron.core.transformer.enums import AttnBackend

    values = dict(cfg["transformer"])
    if "attention_backend" in values:
        values["attention_backend"] = AttnBackend[values["attention_backend"]]
    for key in ("params_dtype", "pipeline_dtype"):
        values[key] = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[
            values[key]
        ]
    config = TransformerConfig(**values)
    assert config.num_layers == cfg["transformer"]["num_layers"]
    return config, DistributedDataParallelConfig(**cfg["ddp"])


def _export_bundled(path: Path) -> tuple[str, list, dict, list]:
    """(instance, the free plan's blocked features for megatron, every format's files, the runnable
    megatron plan's blocked features and megatron-core config) for one bundled instance, each plan
    from a short search (any plan the search returns must export)."""
    from hetopt.planners import solve_ilp
    from hetopt.search.types import SearchRequest

    inst = load_instance(path)
    plan = solve_ilp(SearchRequest(inst, time_limit_s=2, workers=1)).plan
    files = {
        fmt: export(inst, plan, fmt) for fmt in ("rankmap", "torchrun", "megatron", "deepspeed")
    }
    rm = files["rankmap"].rankmap
    assert rm.world_size == sum(p.replicas * s.gpus for p in plan.pipelines for s in p.stages)
    # every GPU once, groups and neighbours paired
    assert consistency(rm.to_json()) == [], inst.name
    try:
        narrowed = runnable_instance(inst, "megatron")
    except InputError as exc:  # no GPU of the cluster runs the instance's flash kernel
        return inst.name, files["megatron"].blocked, {}, [str(exc), None]
    runnable = solve_ilp(SearchRequest(narrowed, time_limit_s=2, workers=1)).plan
    mine = export(inst, runnable, "megatron")
    cfg = json.loads(mine.files["megatron_core.json"]) if not mine.blocked else None
    return (
        inst.name,
        files["megatron"].blocked,
        {f: sorted(e.files) for f, e in files.items()},
        [mine.blocked, cfg],
    )


def test_every_bundled_instances_plan_exports_and_its_runnable_plan_is_megatrons():
    """Each bundled instance's solved plan exports in every format (its rank map numbers every GPU
    once); where Megatron cannot run it, the blocking feature is named; the plan of `--runnable
    megatron` exports unblocked and megatron-core's classes accept it."""
    from hetopt.lifeline import worker_pool

    paths = sorted((REPO / "instances").glob("*.yaml"))
    # spawned: HiGHS's threads do not survive a fork of a process that ran it
    with worker_pool(2) as pool:
        found = list(pool.map(_export_bundled, paths))
    assert len(found) == len(paths)
    refused = {name for name, _, _, (why, _) in found if isinstance(why, str)}
    # only where no GPU type runs the flash kernel: V100s and T4s under FlashAttention-2
    assert refused == {"v100x12-t4x4-gpt2-medium"}, refused
    for name, blocked, files, (runnable_blocked, cfg) in found:
        if name in refused:
            continue
        if blocked:
            assert files["megatron"] == ["rankmap.json"], name
        else:
            assert "megatron_args.txt" in files["megatron"], name
        assert runnable_blocked == [], (name, runnable_blocked)
        if HAS_MEGATRON_CORE:
            _megatron_objects(cfg)
    # the heterogeneous optima: several templates, mixed TP
    assert any(blocked for _, blocked, _, _ in found)


def test_deepspeed_accepts_the_exported_config(monkeypatch):
    """s2's plan restricted to DeepSpeed's pipeline engine: DeepSpeed's own config parser takes the
    export (train_batch_size = micro-batch × accumulation × data-parallel width, as it checks) and
    refuses it with one replica too many."""
    pytest.importorskip("deepspeed")
    from deepspeed.runtime import config as ds_config
    from deepspeed.runtime.config import DeepSpeedConfig

    # without a process group DeepSpeed takes the world as 1 before it asks the mpu; rank 0 of one
    monkeypatch.setattr(ds_config.dist, "get_rank", lambda: 0)

    from hetopt.planners import solve_ilp
    from hetopt.search.types import SearchRequest

    inst = load_instance(REPO / "tests" / "small" / "s2-a100-v100.yaml")
    plan = solve_ilp(SearchRequest(runnable_instance(inst, "deepspeed"), time_limit_s=10)).plan
    done = export(inst, plan, "deepspeed")
    assert done.blocked == [], done.blocked
    cfg = json.loads(done.files["ds_config.json"])
    replicas = plan.pipelines[0].replicas
    parsed = DeepSpeedConfig(cfg, mpu=_Mpu(replicas))
    assert parsed.train_batch_size == inst.spec.training.global_batch
    assert parsed.gradient_accumulation_steps == plan.pipelines[0].micro_batches
    assert parsed.zero_optimization_stage == plan.zero
    parts = json.loads(done.files["pipeline_parts.json"])["parts"]
    assert parts[-1] == inst.model.layers + 2 and len(parts) == len(plan.pipelines[0].stages) + 1
    with pytest.raises(AssertionError):
        DeepSpeedConfig(cfg, mpu=_Mpu(replicas + 1))


class _Mpu:
    """The model-parallel unit DeepSpeed asks for the data-parallel width."""

    def __init__(self, dp: int) -> None:
        self.dp = dp

    def get_data_parallel_world_size(self) -> int:
        return self.dp

    def get_data_parallel_rank(self) -> int:
        return 0

    def get_model_parallel_world_size(self) -> int:
        return 1

    def get_model_parallel_rank(self) -> int:
        return 0


def test_a_plan_of_several_templates_names_what_blocks_megatron_and_still_writes_the_rank_map(
    tmp_path,
):
    """The demo's optimum (two templates, A100s and V100s at their own TP): export --format megatron
    exits 1, names both features, and writes rankmap.json only."""
    plan_path = tmp_path / "demo.json"
    solved = run_hetopt("solve", "demo", "--time-limit", "20", "--out", str(plan_path), "--json")
    assert solved.returncode == 0, solved.stderr
    result = run_hetopt(
        "export",
        str(plan_path),
        "--instance",
        "demo",
        "--format",
        "megatron",
        "--out",
        str(tmp_path / "m"),
        "--json",
    )
    assert result.returncode == 1, result.stderr
    out = json.loads(result.stdout)
    assert out["files"] == ["rankmap.json"] and sorted(os.listdir(tmp_path / "m")) == [
        "rankmap.json"
    ]
    assert any("pipeline templates" in why for why in out["blocked"]), out["blocked"]


def test_bad_input_exits_2_and_writes_nothing(tmp_path):
    """A plan for another instance, an unknown format, a directory that cannot be written, files
    that would be overwritten: exit 2, the reason named, nothing written."""
    other = run_hetopt(
        "export",
        str(PLAN8),
        "--instance",
        "demo",
        "--format",
        "rankmap",
        "--out",
        str(tmp_path / "a"),
    )
    assert other.returncode == 2 and not (tmp_path / "a").exists()
    assert "Traceback" not in other.stderr and "pipelines" in other.stderr, other.stderr
    unknown = run_hetopt(
        "export",
        str(PLAN8),
        "--instance",
        str(INST8),
        "--format",
        "megatrn",
        "--out",
        str(tmp_path / "b"),
    )
    assert (
        unknown.returncode == 2 and "megatron" in unknown.stderr and not (tmp_path / "b").exists()
    )
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    under = run_hetopt(
        "export",
        str(PLAN8),
        "--instance",
        str(INST8),
        "--format",
        "rankmap",
        "--out",
        str(a_file / "x"),
    )
    assert (
        under.returncode == 2 and "is not a directory" in under.stderr and a_file.read_text() == ""
    )
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(stat.S_IRUSR | stat.S_IXUSR)
    try:
        if os.access(locked, os.W_OK):  # root writes anywhere: nothing to test
            pytest.skip("running as root")
        denied = run_hetopt(
            "export",
            str(PLAN8),
            "--instance",
            str(INST8),
            "--format",
            "torchrun",
            "--out",
            str(locked / "x"),
        )
        assert (
            denied.returncode == 2
            and "not writable" in denied.stderr
            and not (locked / "x").exists()
        )
    finally:
        locked.chmod(stat.S_IRWXU)


def test_files_already_there_are_kept_without_force(tmp_path):
    target = tmp_path / "out"
    target.mkdir()
    (target / "rankmap.json").write_text("mine")
    again = run_hetopt(
        "export", str(PLAN8), "--instance", str(INST8), "--format", "torchrun", "--out", str(target)
    )
    assert again.returncode == 2 and "--force" in again.stderr
    assert (
        sorted(os.listdir(target)) == ["rankmap.json"]
        and (target / "rankmap.json").read_text() == "mine"
    )
    forced = run_hetopt(
        "export",
        str(PLAN8),
        "--instance",
        str(INST8),
        "--format",
        "torchrun",
        "--out",
        str(target),
        "--force",
    )
    assert forced.returncode == 0, forced.stderr
    assert sorted(os.listdir(target)) == ["rank_env.json", "rankmap.json", "torchrun.sh"]
    lines = (target / "torchrun.sh").read_text().splitlines()
    assert sum("torchrun --nnodes=2" in line for line in lines) == 2
    assert os.access(target / "torchrun.sh", os.X_OK)
    assert load_plan(PLAN8).pipelines[0].replicas == 2


def test_a_map_that_disagrees_with_itself_is_refused_before_any_process_starts(tmp_path):
    """The dry run's own check (`consistency`): a data-parallel group one member does not share, a
    neighbour that does not name its sender, two ranks on one GPU — each named, no process
    started."""
    from hetopt.export.dryrun import check

    rankmap = _rankmap(tmp_path)
    assert consistency(rankmap) == []
    bad = json.loads(json.dumps(rankmap))
    bad["ranks"][0]["dp_group"] = [0, 1]
    bad["ranks"][2]["pp_prev"] = []
    bad["ranks"][3]["gpu"], bad["ranks"][3]["node"] = 0, "a-0"
    found = consistency(bad)
    assert any("rank 0: its dp_group" in p for p in found)
    assert any("rank 1 sends to 2" in p for p in found)
    assert any("GPU 0 of a-0 has another rank" in p for p in found)
    result = check(bad)
    assert not result["ok"] and result["ranks"] == []


def test_deepspeed_is_blocked_where_the_ranks_are_replica_by_replica(tmp_path):
    """DeepSpeed's pipe-data topology numbers the same stage of every copy together (tp-cp-dp-pp);
    the 8-GPU plan placed a replica per node is numbered replica by replica: blocked, and said
    why."""
    inst = load_instance(INST8)
    done = export(inst, load_plan(PLAN8), "deepspeed")
    assert done.rankmap.order == "tp-cp-pp-dp"
    assert any("DeepSpeed's order" in why for why in done.blocked), done.blocked


def test_maps_of_hand_placed_and_mixed_tp_plans_pair_every_rank():
    """Regressions found by review: two templates whose replicas are renumbered (placed by hand
    a100-1, a100-0, a100-0, a100-1) once crashed the export (a replica numbered across templates); a
    V100 stage at TP 8 over two nodes followed by a T4 stage at TP 4 named rank 4 as rank 8's sender
    while rank 8 named only rank 0. Now each map is consistent, and the TP-8 stage's ranks t and t +
    4 both feed rank t of the TP-4 stage."""
    demo = load_instance("demo")
    two = export(demo, load_plan(HERE / "demo-two-templates-plan.json"), "rankmap").rankmap
    assert consistency(two.to_json()) == []
    assert sorted({(r.template, r.replica) for r in two.ranks}) == [
        (0, 0),
        (0, 1),
        (0, 2),
        (0, 3),
        (1, 0),
    ]
    inst = load_instance("v100x12-t4x4-gpt2-medium")
    v100, t4 = (inst.cluster.nodes[n].island for n in ("v100-0", "t4-0"))
    plan = Plan.model_validate(
        {
            "micro_batch": 1,
            "pipelines": [
                {
                    "replicas": 1,
                    "micro_batches": 128,
                    "stages": [
                        {"layers": 16, "gpu": "V100-16GB", "island": v100, "tp": 8},
                        {"layers": 8, "gpu": "T4", "island": t4, "tp": 4},
                    ],
                }
            ],
        }
    )
    rm = export(inst, plan, "rankmap").rankmap
    assert consistency(rm.to_json()) == []
    assert [r.pp_prev for r in rm.ranks if r.stage == 1] == [[0, 4], [1, 5], [2, 6], [3, 7]]

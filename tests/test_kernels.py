"""Attention and norm kernels (`training.attention`, `training.norm_kernel`): the bytes each moves
and stores, counted op by op (cost/kernels.py), their order in time, and their path through the
schema, the search, export and the outcome rows."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml
from conftest import run_hetopt

from hetopt.calibrate.outcomes import kernels_of
from hetopt.cost import compute as cc
from hetopt.cost.kernels import (
    FLASH1_SLOWDOWN,
    norm_extra_stored_bytes,
    norm_extra_traffic_bytes,
    score_traffic_bytes,
)
from hetopt.cost.memory import layer_activation_bytes
from hetopt.cost.terms import ATTN, GEMM, MEM
from hetopt.evaluate import evaluate
from hetopt.export.files import export
from hetopt.layout import Layout, expand_layout
from hetopt.search.space import enumerate_recompute
from hetopt.search.types import SearchOptions, default_cp
from hetopt.spec.formats import BF16, FORMAT
from hetopt.spec.gpus import CATALOG
from hetopt.spec.instance import instance_from_spec
from hetopt.spec.load import validate_document
from hetopt.spec.presets import PRESETS
from hetopt.spec.schema import InstanceFile

LLAMA = PRESETS["llama-13b"]
A100 = CATALOG["A100-80GB"].for_format("bf16")


def _inst(**training):
    doc = {
        "name": "kernels",
        "model": {"preset": "llama-7b"},
        "training": {"seq_len": 4096, "global_batch": 64, **training},
        "cluster": {
            "nodes": [
                {"name": "n", "count": 1, "gpu": "A100-80GB", "gpus_per_node": 8, "nic_gbps": 200}
            ]
        },
    }
    spec = validate_document(doc, "test.yaml", InstanceFile, "instance")
    return instance_from_spec(spec, "test.yaml", Path("."))


def test_the_softmax_passes_are_counted_op_by_op():
    # the fused softmax: the stored 5as²b written forward, read and their gradients written back
    assert (
        score_traffic_bytes("standard") == 5 and score_traffic_bytes("standard", BF16, True) == 10
    )
    # eager: masked_fill_ is one more pass each way, 2 + 1 + 2 = 5 bytes (the scale is the GEMM's)
    assert score_traffic_bytes("torch") == 10 and score_traffic_bytes("torch", BF16, True) == 15
    assert score_traffic_bytes("flash") == score_traffic_bytes("flash1") == 0
    # fp32 activations double every width, not the masks
    assert score_traffic_bytes("torch", FORMAT["fp32"]) == 9 + 9


def test_eager_rmsnorm_moves_and_stores_what_its_ops_do():
    # forward pow 4, mean 2, x·r 4, float 6, type_as 6, ·weight 4 = 26 against a fused kernel's 4
    assert norm_extra_traffic_bytes("rmsnorm", "torch") == 26 - 4
    # backward 21w + 8 = 50 against 3w = 6
    assert norm_extra_traffic_bytes("rmsnorm", "torch", BF16, True) == 50 - 6
    assert norm_extra_stored_bytes("rmsnorm", "torch") == 2
    # LayerNorm is one native kernel in PyTorch; a fused RMSNorm has no extra
    for norm, kernel in (("layernorm", "torch"), ("rmsnorm", "fused")):
        assert norm_extra_traffic_bytes(norm, kernel) == 0
        assert norm_extra_stored_bytes(norm, kernel) == 0


@pytest.mark.parametrize("tp, sp", [(1, False), (4, False), (4, True)])
def test_eager_rmsnorm_adds_its_bytes_to_the_layer(tp, sp):
    b, s, h = 2, 2048, LLAMA.hidden
    shard = tp if sp else 1  # the norms' inputs are replicated over TP unless SP shards them
    fused = layer_activation_bytes(LLAMA, b, s, tp, sp, "flash", "none", BF16, "fused")
    eager = layer_activation_bytes(LLAMA, b, s, tp, sp, "flash", "none", BF16, "torch")
    assert eager - fused == pytest.approx(2 * 2 * b * s * h / shard)  # two norms, one tensor each
    x = cc.LayerShape(LLAMA, b, s, tp, sp, "flash", 1, BF16, "torch")
    y = cc.LayerShape(LLAMA, b, s, tp, sp, "flash", 1, BF16, "fused")
    hbm = A100.hbm_gbps * 1e9 / 8  # bytes/s
    for forward, extra in ((True, 22), (False, 44)):
        f = cc.layer_forward if forward else cc.layer_backward
        diff = f(x, A100) - f(y, A100)
        assert diff[MEM] == pytest.approx(2 * b * s * h / shard * extra / hbm)
        assert diff[GEMM] == diff[ATTN] == 0


def test_kernels_order_in_time_at_long_sequences():
    """At 8k tokens the eager softmax's passes cost most, then the fused softmax's, then v1, then
    FlashAttention-2; v1's ATTN term is exactly twice v2's."""
    weights = np.ones(len(cc.zeros()))  # every term at its physical time

    def seconds(attention):
        x = cc.LayerShape(LLAMA, 1, 8192, 1, False, attention)
        return float((cc.layer_forward(x, A100) + cc.layer_backward(x, A100)) @ weights)

    t = {a: seconds(a) for a in ("flash", "flash1", "standard", "torch")}
    assert t["torch"] > t["standard"] > t["flash1"] > t["flash"]
    one = cc.attention_core(cc.LayerShape(LLAMA, 1, 8192, 1, False, "flash1"), A100)
    two = cc.attention_core(cc.LayerShape(LLAMA, 1, 8192, 1, False, "flash"), A100)
    assert one[ATTN] == pytest.approx(FLASH1_SLOWDOWN * two[ATTN])


def test_an_instance_prices_its_kernels_end_to_end():
    layout = Layout(tp=2, pp=1, dp=4, mb=1, recompute="none", sp=False, zero=1)
    times, peaks = {}, {}
    for att, norm in (
        ("flash", "fused"),
        ("flash", "torch"),
        ("flash1", "fused"),
        ("torch", "fused"),
    ):
        inst = _inst(attention=att, norm_kernel=norm)
        ev = evaluate(inst, expand_layout(inst, layout))
        times[att, norm], peaks[att, norm] = ev.iteration_time_s, max(ev.peak_memory_gib)
    base = ("flash", "fused")
    assert all(times[k] > times[base] for k in times if k != base)
    assert peaks["flash", "torch"] > peaks[base] == peaks["flash1", "fused"]
    assert peaks["torch", "fused"] > peaks[base]  # the stored s×s scores


def test_the_search_keeps_ring_attention_to_flashattention_2_and_drops_selective_for_flash():
    assert default_cp(_inst(attention="flash", seq_len=32768)) != (1,)
    for att in ("flash1", "standard", "torch"):
        assert default_cp(_inst(attention=att, seq_len=32768)) == (1,)
    opts = SearchOptions(recompute=("none", "selective", "full"))
    for att in ("flash", "flash1"):
        assert "selective" not in enumerate_recompute(_inst(attention=att), opts)
    assert "selective" in enumerate_recompute(_inst(attention="torch"), opts)


def test_export_names_the_softmax_kernel():
    layout = Layout(tp=2, pp=1, dp=4, mb=1, recompute="none", sp=False, zero=1)
    for att, flag in (("flash1", "--use-flash-attn"), ("torch", "--no-masked-softmax-fusion")):
        inst = _inst(attention=att)
        args = export(inst, expand_layout(inst, layout), "megatron").files["megatron_args.txt"]
        assert flag in args.split()
    core = export(inst, expand_layout(inst, layout), "megatron").files["megatron_core.json"]
    assert json.loads(core)["transformer"]["masked_softmax_fusion"] is False
    inst = _inst(attention="standard")
    args = export(inst, expand_layout(inst, layout), "megatron").files["megatron_args.txt"]
    assert "--use-flash-attn" not in args and "--no-masked-softmax-fusion" not in args
    assert "--attention-backend local" in args  # not Transformer Engine's flash or fused kernels


def test_the_sweep_kernel_names_map_to_training_settings():
    assert kernels_of("flash_attention2 + RMS kernel") == {
        "attention": "flash",
        "norm_kernel": "fused",
    }
    assert kernels_of("flash_attention2") == {"attention": "flash", "norm_kernel": "torch"}
    assert kernels_of("flash_attentionv1.0.8")["attention"] == "flash1"
    assert kernels_of("fused")["attention"] == "standard"
    assert kernels_of("torch") == {"attention": "torch", "norm_kernel": "torch"}


def test_a_bad_kernel_is_refused_with_the_key_and_the_choices(tmp_path):
    demo = Path(__file__).parents[1] / "instances" / "demo-a100-v100-llama7b.yaml"
    doc = yaml.safe_load(demo.read_text())
    doc["training"]["norm_kernel"] = "apex"
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(doc))
    result = run_hetopt("evaluate", str(bad), "--layout", "tp=1,pp=1,dp=1")
    assert result.returncode == 2
    assert "norm_kernel" in result.stderr and "fused" in result.stderr and "apex" in result.stderr
    assert "Traceback" not in result.stderr


SMALL_MIX = """name: mix
model: {preset: gpt2-medium}
training: {seq_len: 1024, global_batch: 32}
cluster:
  nodes:
    - {name: a, count: 1, gpu: A100-80GB, gpus_per_node: 4, nic_gbps: 100}
    - {name: v, count: 1, gpu: V100-32GB, gpus_per_node: 4, nic_gbps: 100}
"""


def test_search_gpus_leaves_the_other_types_idle(tmp_path):
    path = tmp_path / "mix.yaml"
    path.write_text(SMALL_MIX + "search: {gpus: [V100-32GB]}\n")
    result = run_hetopt("solve", str(path), "--time-limit", "20", "--json")
    assert result.returncode == 0, result.stderr
    answer = json.loads(result.stdout)
    gpus = {st["gpu"] for p in answer["plan"]["pipelines"] for st in p["stages"]}
    assert gpus == {"V100-32GB"} and answer["status"] == "optimal"
    path.write_text(SMALL_MIX + "search: {gpus: [H100-SXM]}\n")
    result = run_hetopt("validate", str(path))
    assert result.returncode == 2 and "search.gpus" in result.stderr
    assert "A100-80GB, V100-32GB" in result.stderr and "Traceback" not in result.stderr


def test_megatrons_runnable_plan_leaves_gpus_without_the_flash_kernel_idle(tmp_path):
    path = tmp_path / "mix.yaml"
    path.write_text(SMALL_MIX.replace("global_batch: 32", "global_batch: 32, attention: flash"))
    out = tmp_path / "plan.json"
    result = run_hetopt("solve", str(path), "--runnable", "megatron", "--out", str(out), "--json")
    assert result.returncode == 0, result.stderr
    plan = json.loads(out.read_text())
    assert {st["gpu"] for p in plan["pipelines"] for st in p["stages"]} == {"A100-80GB"}
    args = ["export", str(out), "--instance", str(path), "--format", "megatron"]
    exported = run_hetopt(*args, "--out", str(tmp_path / "megatron"))
    assert exported.returncode == 0 and (tmp_path / "megatron" / "megatron_args.txt").exists()

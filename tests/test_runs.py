"""End-to-end runs (hetopt/calibrate/runs.py, rows.py, accuracy.py): rows → layouts and measured
times, reasons, nothing dropped."""

from __future__ import annotations

import pytest
from conftest import CALIBRATION, run_hetopt

from hetopt.calibrate.accuracy import fit_report, load_runs, loso, predict_runs
from hetopt.calibrate.rows import CP, PARTIAL, source_key
from hetopt.calibrate.runs import run_from_row
from hetopt.cost.pricing import evaluate
from hetopt.cost.profiles import Profiles
from hetopt.spec.gpus import CATALOG

DATA = CALIBRATION / "public" / "training_throughput_non_a100.csv"

# Row 143 of the public CSV (bigscience gpt2.md, V100 39B), as the CSV has it.
V100_ROW = {
    "gpu": "V100",
    "gpu_variant": "V100 SXM2 32GB (Jean Zay, 4 GPUs/node)",
    "num_gpus": "32",
    "num_nodes": "8",
    "gpus_per_node": "4",
    "intra_node_fabric": "NVLink2 (4x V100 SXM2)",
    "inter_node_fabric": "Intel Omni-Path (shared, hypercube)",
    "framework": "Megatron-LM (2021, GPipe-style PP)",
    "model": "GPT-2-style 39B",
    "n_params": "",
    "n_layers": "48",
    "hidden": "8192",
    "ffn_hidden": "32768",
    "n_heads": "32",
    "n_kv_heads": "32",
    "vocab": "",
    "seq_len": "1024",
    "global_batch_seqs": "512",
    "micro_batch": "4",
    "grad_accum": "128",
    "tp": "4",
    "pp": "8",
    "dp": "1",
    "cp": "1",
    "virtual_pp_or_schedule": "",
    "sharding": "",
    "precision": "fp16 (mixed)",
    "activation_recompute": "yes (checkpoint-activations; TFLOPs formula uses factor 4)",
    "achieved_tflops_per_gpu": "62.3",
    "tokens_per_s_per_gpu": "",
    "iteration_time_s": "82",
    "flops_formula": "model_size_B*4*2*seq*GBS/(time*gpus*1e3)",
    "source": "bigscience-workshop/bigscience experiments/gpt2.md",
    "notes": "",
}

# Row 2 (llm-foundry MPT-70b on 512 H100): only tokens/s/GPU measured.
MPT_ROW = {
    "gpu": "H100",
    "gpu_variant": "h100_80gb (MosaicML platform; form factor not stated)",
    "num_gpus": "512",
    "num_nodes": "64",
    "gpus_per_node": "8",
    "intra_node_fabric": "NVLink (8-GPU node)",
    "inter_node_fabric": "",
    "framework": "llm-foundry/Composer (PyTorch FSDP)",
    "model": "MPT-70b",
    "n_params": "64862437376",
    "n_layers": "80",
    "hidden": "8192",
    "ffn_hidden": "32768",
    "n_heads": "64",
    "n_kv_heads": "64",
    "vocab": "50368",
    "seq_len": "2048",
    "global_batch_seqs": "4096",
    "micro_batch": "8",
    "grad_accum": "1",
    "tp": "1",
    "pp": "1",
    "dp": "512",
    "cp": "1",
    "virtual_pp_or_schedule": "",
    "sharding": "FSDP FULL_SHARD",
    "precision": "amp_bf16 (MP mode DEFAULT)",
    "activation_recompute": "True",
    "achieved_tflops_per_gpu": "408",
    "tokens_per_s_per_gpu": "1007",
    "iteration_time_s": "",
    "source": "mosaicml/llm-foundry@8c8dd48f7 scripts/train/benchmarking/README.md table 'H100 "
    "80GB BF16'",
}


def test_iteration_time_row_maps_to_its_layout_and_measured_time():
    run = run_from_row(V100_ROW, 143)
    assert run.reasons == []
    assert run.measured_s == 82.0 and run.measured_from == "iteration_time_s"
    lay = run.layout
    assert (lay.tp, lay.pp, lay.dp, lay.mb, lay.vp) == (4, 8, 1, 4, 1)
    # "GPipe-style PP" in the row: Megatron-LM's 1F1B, the one schedule whose memory holds the
    # 39B model in 32 GB (the source: "very snug"); GPipe would hold 128 micro-batches
    assert (lay.recompute, lay.zero, lay.schedule, lay.sp) == ("full", 0, "1f1b", False)
    inst = run.instance
    assert run.gpu == "V100-32GB" and inst.spec.training.attention == "standard"
    assert inst.spec.training.precision == "fp16"
    assert (inst.model.layers, inst.model.hidden, inst.model.heads, inst.model.vocab) == (
        48,
        8192,
        32,
        50257,
    )
    assert not inst.model.gated_mlp and inst.model.position_embedding == "learned"
    assert inst.global_batch == 512 and inst.seq_len == 1024
    node = inst.spec.cluster.nodes[0]
    # Omni-Path 4 × 100 Gbit/s
    assert (node.count, node.gpus_per_node, node.nic_gbps) == (
        8,
        4,
        400.0,
    )
    assert run.source == "bigscience gpt2.md"
    predict_runs([run])
    assert run.expressed and run.predicted_s > 0
    assert run.plan.pipelines[0].micro_batches == 128  # 512 sequences / (mb 4 · dp 1)


def test_tokens_per_second_row_converts_to_iteration_time():
    run = run_from_row(MPT_ROW, 2)
    # 4096 sequences × 2048 tokens = 8 388 608 tokens per iteration; 1007 tokens/s/GPU × 512 GPUs =
    # 515 584 tokens/s; 8 388 608 / 515 584 = 16.2701 s.
    assert run.measured_from == "tokens_per_s_per_gpu"
    assert run.measured_s == pytest.approx(16.2701, rel=1e-5)
    assert run.gpu == "H100-SXM" and any("form factor" in n for n in run.notes)
    assert run.layout.zero == 3 and run.layout.recompute == "full"
    m = run.instance.model
    assert (
        m.position_embedding == "rotary"
        and not m.linear_bias
        and m.tied_embeddings
        and not m.gated_mlp
    )
    # unstated: 8 × 400 Gbit/s, said per row
    assert run.instance.spec.cluster.nodes[0].nic_gbps == 3200.0
    assert any("8×400" in n for n in run.notes)
    # ZeRO-3 (FSDP FULL_SHARD): the evaluator prices it
    predict_runs([run])
    assert run.expressed and run.predicted_s > 0


def test_fp8_rows_are_priced_in_fp8_and_context_parallel_rows_carry_their_reasons():
    fp8 = run_from_row({**MPT_ROW, "precision": "amp_fp8 (MP mode DEFAULT)"}, 3)
    bf16 = run_from_row(MPT_ROW, 3)
    assert fp8.instance.precision == "fp8" and bf16.instance.precision == "bf16"
    predict_runs([fp8, bf16])
    # the same run in FP8 GEMMs is priced faster, as measured (llm-foundry's fp8 rows)
    assert fp8.expressed and fp8.predicted_s < bf16.predicted_s
    # tp·pp·dp·cp = 2·8·1·2 = 32 GPUs
    cp = run_from_row({**V100_ROW, "cp": "2", "dp": "1", "tp": "2"}, 4)
    assert cp.reason_category == CP and cp.reasons == ["context parallelism cp>1: cp=2"]
    partial = run_from_row({**V100_ROW, "tp": "", "micro_batch": ""}, 6)
    assert partial.reason_category == PARTIAL and "tp, micro_batch not stated" in partial.reasons[0]
    predict_runs([cp, partial])
    assert not any(r.expressed for r in (cp, partial))


def test_torchtitans_local_batch_runs_in_micro_batches_of_one_under_pipeline_parallelism():
    runs = {r.line: r for r in load_runs([DATA])}
    # Llama 3.1 405B, local batch 32 over PP 8 (Table 5): 32 micro-batches of 1, not 1 of 32
    run = runs[102]
    assert run.layout.pp == 8 and run.layout.mb == 1
    assert run.instance.global_batch == 256 and any("micro-batches of 1" in n for n in run.notes)


def test_gpu_mapping_and_sources():
    gcd = run_from_row({**V100_ROW, "gpu": "MI250X", "gpu_variant": "AMD MI250X GCD"}, 7)
    assert gcd.gpu == "MI250X-GCD"
    assert gcd.instance.gpu_types["MI250X-GCD"].peak_tflops == CATALOG["MI250X"].peak_tflops / 2
    assert (
        source_key("NVIDIA-NeMo/Megatron-Bridge docs/performance-summary-archive.md")
        == "NVIDIA-NeMo/Megatron-Bridge"
    )
    assert (
        source_key("pytorch/torchtitan benchmarks/llama3_h100_202412_torchtitan.md Table 1")
        == "pytorch/torchtitan"
    )
    assert (
        source_key("bigscience-workshop/bigscience experiments/tr8-104B.md (sections)")
        == "bigscience tr8-104B.md"
    )


def test_every_row_is_expressed_or_has_a_reason():
    runs = load_runs([DATA])
    expressed = [r for r in runs if r.expressed]
    missing = [r for r in runs if not r.expressed]
    assert len(runs) == 176 and len(expressed) + len(missing) == len(runs)
    assert all(r.reasons for r in missing)
    assert all(r.measured_s > 0 and r.predicted_s > 0 and not r.reasons for r in expressed)
    assert {r.gpu for r in expressed} >= {"V100-32GB"}
    # every fp8 row that states its layout is priced in fp8 (Transformer Engine, torchao Float8)
    fp8 = [r for r in runs if "fp8" in r.precision.lower() and r.expressed]
    # 28 of its 49 fp8 rows state their layout (the others lack dims, or run CP or an interleaved
    # schedule without its stages: their reasons say so)
    assert len(fp8) == 28 and all(r.instance.precision == "fp8" for r in fp8)
    report = fit_report([DATA])
    assert report["rows"] == 176
    assert report["expressed"] + sum(report["not_expressed"].values()) == 176
    assert report["fitted_on_end_to_end"] is False and "equals the plain error" in report["note"]
    # With nothing fitted on end-to-end rows, leave-one-source-out error is the plain error.
    for gpu, s in report["per_gpu"].items():
        assert report["loso_per_gpu"][gpu]["mape"] == pytest.approx(s["mape"])
    # The check covers every GPU type with ≥ 10 rows, evaluable or not yet.
    assert {"H100-SXM", "V100-32GB"} <= set(report["acceptance"])
    assert report["acceptance"]["V100-32GB"]["expressed"] == 29


def test_loso_fits_without_the_held_out_source():
    runs = [r for r in load_runs([DATA]) if r.expressed]
    sources = {r.source for r in runs}
    assert len(sources) >= 2
    seen = []

    def fit(train):
        seen.append({r.source for r in train})
        return Profiles()

    cv = loso(runs, fit)
    assert len(seen) == len(sources)
    assert all(len(s) == len(sources) - 1 for s in seen)  # each fit lacks exactly one source
    assert cv["fitted_on_end_to_end"] is True
    for r in runs:  # the stand-in fit returns the shipped profiles: same predictions
        assert cv["predicted"][id(r)] == pytest.approx(r.predicted_s)


@pytest.mark.parametrize("option", ["--runs", "--fabrics"])
def test_calibrate_refuses_a_csv_of_another_kind_with_exit_2(tmp_path, option):
    bad = tmp_path / "other.csv"
    bad.write_text("a,b\n1,2\n")
    result = run_hetopt("calibrate", option, str(bad))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert str(bad) in result.stderr and "missing" in result.stderr and "source" in result.stderr


def test_calibrate_runs_reports_every_gpu_type_with_its_leave_one_source_out_error():
    result = run_hetopt("calibrate", "--runs", str(DATA), "--json")
    assert result.returncode == 0, result.stderr
    import json

    report = json.loads(result.stdout)
    assert report["rows"] == report["expressed"] + sum(report["not_expressed"].values())
    assert report["fitted_on_end_to_end"] is True
    # the fit reproduces the shipped stack table from the same data
    shipped = Profiles().stacks
    for name, stack in report["stacks"].items():
        assert stack["compute_efficiency"] == pytest.approx(
            shipped[name].compute_efficiency, abs=2e-3
        )
    assert report["stacks"]["megatron"]["compute_efficiency"] == 1.0
    # V100 rows run Megatron: nothing is fitted for them, so their LOSO error is the plain error
    v100 = report["per_gpu"]["V100-32GB"]
    assert report["loso_per_gpu"]["V100-32GB"]["mape"] == pytest.approx(v100["mape"])
    # H100 SXM rows are all llm-foundry (fsdp): predicted by the stack fitted on torchtitan alone
    assert report["acceptance"]["H100-SXM"]["loso_mape"] <= 0.15


def test_the_39b_run_its_source_calls_very_snug_fits_snugly():
    """BigScience's 39B on 32 V100-32GB (tp 4, pp 8, micro-batch 4, checkpointed) finished, and its
    source notes the memory as very snug: under 1F1B its first stage holds 26.7 GiB of 31.8."""
    runs = {r.line: r for r in load_runs([DATA])}
    run = runs[143]
    ev = evaluate(run.instance, run.plan)
    assert (
        run.fits and 0.8 * ev.memory_limit_gib[0] < max(ev.peak_memory_gib) < ev.memory_limit_gib[0]
    )

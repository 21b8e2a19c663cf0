"""Training formats (`training.precision`): fp32, tf32, fp16, bf16 and fp8 through the catalog,
the cost model, the search, the simulator and export; a GPU without the format refuses it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from conftest import run_hetopt

from hetopt.cost.memory import (
    fp8_cast_bytes,
    layer_activation_bytes,
    model_state_bytes,
    stage_params,
)
from hetopt.errors import InputError
from hetopt.evaluate import evaluate, stage_memory
from hetopt.export.files import export
from hetopt.layout import Layout, expand_layout
from hetopt.spec.formats import FORMAT, FORMAT_EFFICIENCY, FORMATS
from hetopt.spec.gpus import CATALOG
from hetopt.spec.instance import instance_from_spec
from hetopt.spec.load import validate_document
from hetopt.spec.presets import PRESETS
from hetopt.spec.schema import InstanceFile


def _doc(gpu: str, precision: str | None, preset: str = "gpt3-1.3b", nodes: int = 1, **training):
    doc = {
        "name": f"{gpu}-{precision}",
        "model": {"preset": preset},
        "training": {"seq_len": 2048, "global_batch": 64, **training},
        "cluster": {
            "nodes": [
                {"name": "n", "count": nodes, "gpu": gpu, "gpus_per_node": 8, "nic_gbps": 400}
            ]
        },
    }
    if precision:
        doc["training"]["precision"] = precision
    return doc


def _inst(gpu: str, precision: str | None, **kw):
    doc = _doc(gpu, precision, **kw)
    spec = validate_document(doc, "test.yaml", InstanceFile, "instance")
    return instance_from_spec(spec, "test.yaml", Path("."))


def test_every_catalog_type_states_its_formats_with_a_source():
    lacks = {
        "V100-16GB": {"bf16", "tf32", "fp8"},
        "V100-32GB": {"bf16", "tf32", "fp8"},
        "T4": {"bf16", "tf32", "fp8"},
        "A100-80GB": {"fp8"},
        "A100-40GB": {"fp8"},
        "A10G": {"fp8"},
        "RTX-3090": {"fp8"},
        "MI250X": {"tf32", "fp8"},
    }
    for name, g in CATALOG.items():
        assert g.sources.get("peaks"), name
        assert set(FORMATS) - set(g.peaks) == lacks.get(name, set()), name
        assert g.peaks["fp16"] == g.peak_tflops  # the catalog's 16-bit figure is the fp16 peak
        # the tensor formats get faster with fewer bits; FP32 on the CUDA cores is the slowest
        rates = [g.peaks[f] for f in ("fp32", "tf32", "bf16", "fp8") if f in g.peaks]
        assert rates == sorted(rates), name
    # one source per rule of the formats' GEMM efficiency, with its uncertainty
    assert all(e.rule for e in FORMAT_EFFICIENCY.values())
    # fp8's ratio: FP8 over BF16 achieved/peak of the same table's rows (H200's BF16 is H100's)
    data = Path(__file__).parents[1] / "data/calibration/public/gemm_achieved.csv"
    text = data.read_text()
    pairs = [(1402.6, 794.5), (1453.4, 794.5), (1535.0, 828.6)]  # H100-SXM, H200, GH200
    assert all(f"{fp8}" in text and f"{bf16}" in text for fp8, bf16 in pairs)
    mean = sum(fp8 / 1979 / (bf16 / 989) for fp8, bf16 in pairs) / len(pairs)
    assert FORMAT_EFFICIENCY["fp8"].ratio == pytest.approx(mean, abs=0.01)


@pytest.mark.parametrize(
    ("gpu", "precision", "names"),
    [
        ("V100-32GB", "bf16", "V100-32GB has no BF16"),
        ("V100-32GB", "tf32", "V100-32GB has no TF32"),
        ("T4", "fp8", "T4 has no FP8"),
        ("A100-80GB", "fp8", "A100-80GB has no FP8"),
    ],
)
def test_a_gpu_without_the_format_refuses_it(gpu, precision, names):
    with pytest.raises(InputError) as err:
        _inst(gpu, precision)
    text = str(err.value)
    assert "training.precision" in text and names in text and "choose one of" in text


def test_the_cli_refuses_a_format_with_exit_2_naming_the_key(tmp_path):
    path = tmp_path / "v100-bf16.yaml"
    path.write_text(yaml.safe_dump(_doc("V100-32GB", "bf16")))
    for command in ("validate", "solve", "evaluate"):
        args = [command, str(path)] + (
            ["--layout", "tp=1,pp=1,dp=8"] if command == "evaluate" else []
        )
        result = run_hetopt(*args)
        assert result.returncode == 2, (command, result.stderr)
        assert "training.precision" in result.stderr and "V100-32GB has no BF16" in result.stderr


def test_a_declared_gpu_has_the_formats_it_declares_and_fp8_needs_bf16_beside_it():
    from hetopt.spec.gpus import custom_gpu

    turing = custom_gpu("t", 65, 16, 2560, 128, "test", family="turing", peaks={"fp8": 130})
    assert turing.has("fp16") and not turing.has("bf16") and not turing.has("fp8")
    hopper = custom_gpu("h", 989, 80, 26800, 3600, "test", family="hopper", peaks={"fp8": 1979})
    assert hopper.has("fp8") and hopper.for_format("fp8").attention_flops == 989e12
    assert not hopper.has("fp32") and not hopper.has("tf32")


def test_a_16_bit_gradient_reduction_under_fp32_is_refused_and_a_turing_fp8_says_why():
    with pytest.raises(InputError) as err:
        _inst("A100-80GB", "tf32", grad_reduce_dtype="bf16")
    assert "training.grad_reduce_dtype" in str(err.value) and "fp32 gradients" in str(err.value)
    assert _inst("A100-80GB", "fp32", grad_reduce_dtype="fp32").precision == "fp32"
    doc = _doc("t4x", "fp8")
    doc["cluster"]["gpus"] = {
        "t4x": {
            "peak_tflops": 65,
            "memory_gib": 16,
            "hbm_gbps": 2560,
            "intra_node_gbps": 128,
            "family": "turing",
            "peak_tflops_fp8": 130,
        }
    }
    spec = validate_document(doc, "test.yaml", InstanceFile, "instance")
    with pytest.raises(InputError) as err:
        instance_from_spec(spec, "test.yaml", Path("."))
    assert "no BF16 for what fp8 keeps in bf16" in str(err.value)


def test_the_default_format_is_bf16_or_fp16_where_a_gpu_has_no_bf16():
    assert _inst("A100-80GB", None).precision == "bf16"
    assert _inst("V100-32GB", None).precision == "fp16"
    assert _inst("H100-SXM", "fp8").precision == "fp8"


def test_memory_per_parameter_follows_each_formats_formula():
    """Per parameter, unsharded: fp32/tf32 4 weights + 4 gradients + 8 moments; fp16/bf16 2 + 4
    (fp32 main_grad) + 4 master + 8 moments; fp8 bf16's, plus 2 bytes of FP8 weight casts per
    transformer-layer parameter. ZeRO-1 shards the optimizer states (master and moments) over the
    data-parallel ranks."""
    expected = {"fp32": 16, "tf32": 16, "fp16": 18, "bf16": 18, "fp8": 18}
    sharded = {"fp32": 4 + 4 + 8 / 8, "tf32": 4 + 4 + 8 / 8, "bf16": 2 + 4 + 12 / 8}
    for fmt, per_param in expected.items():
        assert model_state_bytes(1e9, 1, 1, 0, FORMAT[fmt]) == pytest.approx(per_param * 1e9)
        if fmt in sharded:
            got = model_state_bytes(1e9, 1, 8, 1, FORMAT[fmt])
            assert got == pytest.approx(sharded[fmt] * 1e9)
    # FP8's weight casts: 2 bytes per layer parameter (not the embedding's or the head's)
    assert fp8_cast_bytes(1e9, 8, 1, FORMAT["fp8"]) == pytest.approx(2e9)
    assert fp8_cast_bytes(1e9, 8, 3, FORMAT["fp8"]) == pytest.approx(2e9 / 8)
    assert fp8_cast_bytes(1e9, 8, 1, FORMAT["bf16"]) == 0
    # a 16-bit gradient buffer (grad_bytes 2) takes 2 bytes less
    assert model_state_bytes(1e9, 2, 1, 0, FORMAT["bf16"], 2.0) == pytest.approx(16 * 1e9 / 2)
    # activations at the format's width: fp32 stores twice bf16's; FP8 keeps GEMM inputs in 1 byte
    m = PRESETS["gpt3-1.3b"]
    acts = {
        f: layer_activation_bytes(m, 1, 2048, 1, False, "flash", "none", FORMAT[f]) for f in FORMATS
    }
    sbh = 2048 * m.hidden
    assert acts["bf16"] == pytest.approx(34 * sbh)  # Korthikanti et al.'s 34sbh
    assert acts["fp32"] == pytest.approx(2 * 34 * sbh - 2 * sbh)  # the 1-byte masks stay 1 byte
    # GEMM inputs: QKV and MLP inputs (2), the output projection's and the down projection's (1 + 4)
    assert acts["fp8"] == pytest.approx(34 * sbh - (2 + 1 + 4) * sbh)


def test_the_evaluator_prices_memory_per_format():
    """A stage's peak memory is the formulas above through the evaluator: without ZeRO, fp32 on an
    A100 holds 16 bytes per parameter against bf16's 18, and twice its activations (but the
    masks)."""
    peaks = {}
    for fmt in ("fp32", "bf16"):
        inst = _inst("A100-80GB", fmt)
        plan = expand_layout(inst, Layout(tp=1, pp=1, dp=8, mb=1, zero=0))
        st = plan.pipelines[0].stages[0]

        params = stage_params(inst.model, st.layers, True, True, 1)
        peaks[fmt] = stage_memory(inst, plan, plan.pipelines[0].micro_batches, 1, 0, st, params, 8)
    m = PRESETS["gpt3-1.3b"]
    sbh = 2048 * m.hidden
    layer_diff = m.layers * (34 * sbh - 2 * sbh)  # one micro-batch in flight
    params = stage_params(m, m.layers, True, True, 1)
    assert peaks["fp32"] - peaks["bf16"] == pytest.approx(layer_diff - 2 * params, rel=1e-9)


def test_a_compute_bound_layout_on_an_a100_is_slower_in_fp32_than_tf32_than_bf16():
    times = {}
    for fmt in ("fp32", "tf32", "bf16", "fp16"):
        inst = _inst("A100-80GB", fmt, preset="llama-7b", nodes=2)
        plan = expand_layout(inst, Layout(tp=8, pp=1, dp=2, mb=2))
        times[fmt] = evaluate(inst, plan).iteration_time_s
    # the peaks are 19.5, 156 and 312 TFLOP/s: 8× and 2× apart for the GEMMs; the memory-bound and
    # communication parts, the same in all three (or twice in fp32's 4-byte activations), dilute
    # that, so each step keeps at least 1.5×
    assert times["fp32"] > 1.5 * times["tf32"] > 1.5 * times["bf16"]
    assert times["fp16"] == pytest.approx(times["bf16"])


def test_fp8_is_faster_than_bf16_on_an_h100_for_large_gemms():
    times, gemm = {}, {}
    for fmt in ("bf16", "fp8"):
        inst = _inst("H100-SXM", fmt, preset="llama-13b", nodes=2)
        plan = expand_layout(inst, Layout(tp=8, pp=1, dp=2, mb=4))
        ev = evaluate(inst, plan)
        times[fmt], gemm[fmt] = ev.iteration_time_s, ev.breakdown["compute"]
    assert times["fp8"] < times["bf16"]
    # the layers' GEMMs run at twice the peak times 0.91; the attention core and the output head
    # (bf16), the memory-bound work and FP8's own casts do not speed up
    assert 0.5 < gemm["fp8"] / gemm["bf16"] < 0.9


@pytest.mark.parametrize("fmt", FORMATS)
def test_each_format_solves_simulates_and_exports_on_an_h100(fmt, tmp_path):
    path = tmp_path / f"h100-{fmt}.yaml"
    path.write_text(yaml.safe_dump(_doc("H100-SXM", fmt, preset="gpt3-1.3b")))
    plan_file = tmp_path / "plan.json"
    solved = run_hetopt("solve", str(path), "--time-limit", "60", "--json", "--out", str(plan_file))
    assert solved.returncode == 0, solved.stderr
    assert json.loads(solved.stdout)["status"] == "optimal"
    simulated = run_hetopt("simulate", str(path), "--plan", str(plan_file), "--json")
    assert simulated.returncode == 0, simulated.stderr
    inst = instance_from_spec(
        validate_document(yaml.safe_load(path.read_text()), "x", InstanceFile, "instance"),
        "x",
        Path("."),
    )
    plan = expand_layout(inst, Layout(tp=1, pp=1, dp=8, mb=1))
    flash = export(inst, plan, "megatron")
    if fmt in ("fp32", "tf32"):  # FlashAttention runs fp16 and bf16 only
        assert flash.blocked and "flash attention in" in flash.blocked[0]
        inst = instance_from_spec(
            validate_document(
                {
                    **yaml.safe_load(path.read_text()),
                    "training": {
                        **yaml.safe_load(path.read_text())["training"],
                        "attention": "standard",
                    },
                },
                "x",
                InstanceFile,
                "instance",
            ),
            "x",
            Path("."),
        )
    else:
        assert not flash.blocked
    megatron = export(inst, plan, "megatron").files
    args = megatron["megatron_args.txt"].split()
    flags = {"fp32": [], "tf32": [], "fp16": ["--fp16"], "bf16": ["--bf16"], "fp8": ["--bf16"]}
    assert [a for a in args if a in ("--fp16", "--bf16")] == flags[fmt]
    assert ("--fp8-format" in args) == (fmt == "fp8")
    if fmt == "fp8":
        assert args[args.index("--fp8-format") + 1] == "hybrid"
        assert args[args.index("--transformer-impl") + 1] == "transformer_engine"
    core = json.loads(megatron["megatron_core.json"])["transformer"]
    assert core["params_dtype"] == {"fp32": "fp32", "tf32": "fp32", "fp16": "fp16"}.get(fmt, "bf16")
    ds_files = export(inst, plan, "deepspeed").files
    # DeepSpeed's runner carries .deepspeed_env to every node: TF32 on, or off, as torchrun's
    env_file = {"tf32": "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1\n", "fp32": "NVIDIA_TF32_OVERRIDE=0\n"}
    assert ds_files.get(".deepspeed_env") == env_file.get(fmt)
    ds = json.loads(ds_files["ds_config.json"])
    sections = {k for k in ("fp16", "bf16") if k in ds}
    assert sections == {"fp32": set(), "tf32": set(), "fp16": {"fp16"}}.get(fmt, {"bf16"})
    torchrun = export(inst, plan, "torchrun").files
    env = json.loads(torchrun["rank_env.json"])[0]
    assert (env.get("TORCH_ALLOW_TF32_CUBLAS_OVERRIDE") == "1") == (fmt == "tf32")
    assert (env.get("NVIDIA_TF32_OVERRIDE") == "0") == (fmt == "fp32")
    assert ("TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1" in torchrun["torchrun.sh"]) == (fmt == "tf32")

"""The GPU catalog and the model presets: complete, sourced, and matching published parameter
counts."""

from __future__ import annotations

import json

import pytest
from conftest import run_hetopt

from hetopt.cost.flops import layer_forward_flops, layer_params, model_flops_per_token, total_params
from hetopt.spec.gpus import CATALOG
from hetopt.spec.presets import PRESETS

REQUIRED_GPUS = [
    "V100-16GB",
    "V100-32GB",
    "A100-40GB",
    "A100-80GB",
    "H100-SXM",
    "H100-PCIe",
    "H200",
    "GH200",
    "L4",
    "L40S",
    "A10G",
    "T4",
    "RTX-3090",
    "RTX-4090",
    "MI250X",
    "MI300X",
]
REQUIRED_PRESETS = [
    "gpt3-1.3b",
    "gpt3-2.7b",
    "gpt3-6.7b",
    "gpt3-13b",
    "gpt3-175b",
    "gpt2-medium",
    "llama-7b",
    "llama-13b",
    "llama-30b",
    "llama-65b",
    "llama2-70b",
    "llama3-8b",
    "llama3-70b",
]
NUMBERS = ("peak_tflops", "memory_gib", "hbm_gbps", "intra_node_gbps")


def test_catalog_has_exactly_the_named_gpus():
    assert list(CATALOG) == REQUIRED_GPUS


@pytest.mark.parametrize("name", REQUIRED_GPUS)
def test_every_number_is_positive_and_sourced(name):
    gpu = CATALOG[name]
    for field in NUMBERS:
        assert getattr(gpu, field) > 0
        assert gpu.sources[field].strip(), f"{name}.{field} has no source"
        # the source states the very number (in datasheet units: GB/s for bandwidths)
        shown = getattr(gpu, field) / (8 if field.endswith("gbps") else 1)
        assert f"{shown:g}" in gpu.sources[field]


def test_generations_are_ordered_as_published():
    # same architecture, more memory: same compute; newer generation: more compute and bandwidth
    assert CATALOG["A100-40GB"].peak_tflops == CATALOG["A100-80GB"].peak_tflops
    assert (
        CATALOG["V100-32GB"].peak_tflops
        < CATALOG["A100-80GB"].peak_tflops
        < CATALOG["H100-SXM"].peak_tflops
    )
    assert CATALOG["H100-SXM"].hbm_gbps < CATALOG["H200"].hbm_gbps
    assert (
        CATALOG["T4"].intra_node_gbps
        < CATALOG["L4"].intra_node_gbps
        < CATALOG["H100-PCIe"].intra_node_gbps
    )


def test_gpus_command_shows_every_gpu_and_source():
    result = run_hetopt("gpus")
    assert result.returncode == 0
    for name in REQUIRED_GPUS:
        assert name in result.stdout
    for gpu in CATALOG.values():
        for field in NUMBERS:
            assert gpu.sources[field].split(":")[0] in result.stdout.replace("\n", " ")
    data = json.loads(run_hetopt("gpus", "--json").stdout)
    assert [g["name"] for g in data["gpus"]] == REQUIRED_GPUS
    # each format's dense peak: the 16-bit one is the table's
    assert all(g["peaks"]["fp16"] == g["peak_tflops"] for g in data["gpus"])
    assert all(
        set(g["sources"]) == set(NUMBERS) | {"family", "tdp_w", "usable_memory_gib", "peaks"}
        for g in data["gpus"]
    )


def test_presets_are_complete_and_sourced():
    assert set(REQUIRED_PRESETS) <= set(PRESETS)
    for m in PRESETS.values():
        assert m.source
        assert m.hidden % m.heads == 0 and m.heads % m.kv_heads == 0


# Parameter counts of the released checkpoints (sum of tensor sizes in the published weights).
RELEASED_PARAMS = {
    "gpt2-medium": 354_823_168,
    "llama-7b": 6_738_415_616,
    "llama2-70b": 68_976_648_192,
    "llama3-8b": 8_030_261_248,
}


@pytest.mark.parametrize("name", sorted(RELEASED_PARAMS))
def test_parameter_count_matches_released_checkpoint(name):
    assert total_params(PRESETS[name]) == RELEASED_PARAMS[name]


def test_gpt3_175b_matches_narayanan_closed_form():
    # Narayanan et al. 2021 eq. (2): P = 12lh²(1 + 13/(12h) + (V + s)/(12lh)); it omits the final
    # LayerNorm (2h), which total_params counts.
    m = PRESETS["gpt3-175b"]
    n, h, v, s = m.layers, m.hidden, m.vocab, m.max_seq_len
    closed_form = 12 * n * h * h + 13 * n * h + (v + s) * h
    assert total_params(m) == closed_form + 2 * h
    assert layer_params(m) == 12 * h * h + 13 * h


@pytest.mark.parametrize("b,s", [(1, 2048), (4, 2048), (8, 1024)])
def test_gpt_layer_forward_flops_closed_form(b, s):
    # Korthikanti et al. 2022: forward FLOPs of a GPT layer = 24bsh² + 4bs²h
    m = PRESETS["gpt3-175b"]
    h = m.hidden
    assert layer_forward_flops(m, b, s) == 24 * b * s * h * h + 4 * b * s * s * h


def test_model_flops_per_token_is_about_six_times_params():
    # 6·N per token plus attention: 3·4·s·h·L = 12·2048·4096·32 FLOPs per token is 8% of 6N for
    # llama-7b at s = 2048, less the embedding lookup (3% of N) that does no matrix multiply: about
    # 1.06
    m = PRESETS["llama-7b"]
    ratio = model_flops_per_token(m, 2048) / (6 * total_params(m))
    assert 1.0 < ratio < 1.10

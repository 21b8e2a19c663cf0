"""`hetopt calibrate --measure` on the CPU with a tiny model (needs the optional torch extra)."""

from __future__ import annotations

import json

import pytest
from conftest import run_hetopt

from hetopt.cost.profiles import load_profile_file
from hetopt.cost.terms import GEMM, KERN, MEM, PASS

pytest.importorskip("torch")


def test_measure_writes_a_profile_the_cost_model_loads(tmp_path):
    out = tmp_path / "cpu.json"
    result = run_hetopt(
        "calibrate",
        "--measure",
        "--device",
        "cpu",
        "--tiny",
        "--gpu",
        "A100-80GB",
        "--out",
        str(out),
    )
    assert result.returncode == 0, result.stderr
    params = load_profile_file(out)
    assert params.gpu == "A100-80GB" and "PyTorch" in params.source and params.date
    # a CPU is far below an A100's peaks: efficiencies well under 1, so weights well over 1
    assert params.weights[GEMM] > 1 and params.weights[MEM] > 1
    assert params.weights[KERN] > 0 and params.weights[PASS] >= 0
    assert set(params.fit) == {"block_fwd_bwd", "block_2x_fwd_bwd"}
    assert all(v["measured_ms"] > 0 and v["predicted_ms"] > 0 for v in params.fit.values())
    evaluated = run_hetopt(
        "evaluate", "demo", "--layout", "tp=2,pp=2,dp=8", "--profile", str(out), "--json"
    )
    shipped = run_hetopt("evaluate", "demo", "--layout", "tp=2,pp=2,dp=8", "--json")
    # a CPU standing in for the A100 stages makes the plan far slower
    assert (
        json.loads(evaluated.stdout)["iteration_time_s"]
        > 10 * json.loads(shipped.stdout)["iteration_time_s"]
    )


def test_measure_on_a_missing_cuda_device_is_a_clear_error():
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    result = run_hetopt("calibrate", "--measure", "--device", "cuda", "--gpu", "A100-80GB")
    assert result.returncode == 2 and "no CUDA device here" in result.stderr

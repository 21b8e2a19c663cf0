"""A cost profile per GPU type: shipped for every catalog type, GEMM curves that meet the public
GEMM data, strict profile files, family-derived profiles for custom GPUs, usable memory (issue
10)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import get_args

import numpy as np
import pytest
from conftest import CALIBRATION

from hetopt.calibrate.gemm import TOLERANCE, curve, read_rows
from hetopt.cost.profiles import Profiles, load_profile_file
from hetopt.cost.terms import GEMM, KERN, TERMS, CostParams, shipped_profiles
from hetopt.errors import InputError
from hetopt.evaluate import evaluate
from hetopt.layout import expand_layout, parse_layout
from hetopt.spec.gpus import CATALOG, FAMILIES, custom_gpu
from hetopt.spec.instance import instance_from_spec
from hetopt.spec.load import validate_document
from hetopt.spec.schema import CustomGPU, InstanceFile

GEMM_CSV = CALIBRATION / "public" / "gemm_achieved.csv"
MODEL = {"layers": 4, "hidden": 2048, "heads": 16, "vocab": 50257, "max_seq_len": 1024}


def test_every_catalog_type_has_a_complete_sourced_profile():
    shipped = shipped_profiles()
    assert set(CATALOG) <= set(shipped)
    for name, gpu in CATALOG.items():
        p = shipped[name]
        assert p.family == gpu.family and not p.derived
        assert set(TERMS) | {"dp_overlap", "launch_serial"} <= set(p.sources), name
        assert 0 < p.uncertainty["gemm_efficiency"] < 0.5


def test_a100_keeps_its_end_to_end_fit():
    p = shipped_profiles()["A100-80GB"]
    assert p.fit["a100_single_node_megatron_deepspeed.csv"]["cv_mape"] <= 0.065
    assert p.fit["a100_22b_layer_times_korthikanti2022.csv"]["mape"] <= 0.03


def test_each_curve_meets_its_kept_gemm_points_within_10_percent():
    rows, shipped = read_rows(GEMM_CSV), shipped_profiles()
    for name in CATALOG:
        kept = [r for r in rows[name] if not r.reason]
        assert kept, f"{name}: no GEMM rows kept"
        p = shipped[name]
        pred = curve(kept, 1 / p.weights[GEMM], p.weights[KERN])
        err = np.abs(pred / np.array([r.achieved for r in kept]) - 1)
        assert err.max() <= TOLERANCE + 1e-9, (name, kept[int(err.argmax())].label, err.max())
        excluded = [r for r in rows[name] if r.reason]
        assert all(len(r.reason) > 20 for r in excluded)  # every exclusion says why
        assert set(p.fit["gemm_achieved.csv"]["excluded"]) == {r.label for r in excluded}


def test_t4_sustains_far_less_of_its_peak_than_an_a100():
    rows = read_rows(GEMM_CSV)

    def best_large(name: str) -> float:  # measured efficiency of the large kept points
        return max(
            r.achieved / r.peak for r in rows[name] if not r.reason and (r.flops or 1e13) > 1e11
        )

    assert best_large("T4") < 0.5 * best_large("A100-80GB")
    shipped = shipped_profiles()
    assert 1 / shipped["T4"].weights[GEMM] < 0.5 / shipped["A100-80GB"].weights[GEMM]


def test_profile_missing_a_weight_is_an_error_naming_it(tmp_path):
    data = shipped_profiles()["H100-SXM"].to_json()
    del data["weights"]["MEM"]
    path = tmp_path / "broken.json"
    path.write_text(json.dumps(data))
    with pytest.raises(InputError) as exc:
        load_profile_file(path)
    assert "MEM" in exc.value.render() and str(path) in exc.value.render()
    data = shipped_profiles()["H100-SXM"].to_json()
    del data["launch_serial"]
    path.write_text(json.dumps(data))
    with pytest.raises(InputError, match="launch_serial"):
        load_profile_file(path)
    full = CostParams.from_json(shipped_profiles()["H100-SXM"].to_json())
    assert full.weights == shipped_profiles()["H100-SXM"].weights


def test_custom_gpu_with_family_gets_that_familys_efficiency():
    shipped = shipped_profiles()
    t4 = CATALOG["T4"]
    like_t4 = custom_gpu(
        "MyTuring", t4.peak_tflops, 16, t4.hbm_gbps, t4.intra_node_gbps, "test", "turing", t4.tdp_w
    )
    p = Profiles().for_gpu(like_t4)
    assert p.derived and p.family == "turing" and "turing" in p.method
    assert p.weights[GEMM] == pytest.approx(shipped["T4"].weights[GEMM])
    assert p.weights[KERN] == pytest.approx(shipped["T4"].weights[KERN])
    # half the power per TFLOP/s: the power cap lowers η by √2 (cost.derive.derived_eta)
    capped = custom_gpu(
        "Capped", t4.peak_tflops, 16, t4.hbm_gbps, t4.intra_node_gbps, "test", "turing", 35
    )
    assert 1 / Profiles().for_gpu(capped).weights[GEMM] == pytest.approx(
        1 / shipped["T4"].weights[GEMM] / np.sqrt(2)
    )
    # no family: nearest calibrated type by peak, and the method says so
    plain = Profiles().for_gpu(custom_gpu("Plain", 60, 16, 2560, 128, "test"))
    assert "no family declared" in plain.method


def test_custom_family_in_an_instance_file():
    assert set(get_args(CustomGPU.model_fields["family"].annotation.__args__[0])) == set(FAMILIES)
    data = {
        "name": "t",
        "model": MODEL,
        "training": {"seq_len": 1024, "global_batch": 8},
        "cluster": {
            "gpus": {
                "MyGPU": {
                    "peak_tflops": 60,
                    "memory_gib": 16,
                    "hbm_gbps": 2560,
                    "intra_node_gbps": 128,
                    "family": "turing",
                    "tdp_w": 70,
                }
            },
            "nodes": [
                {"name": "n", "count": 1, "gpu": "MyGPU", "gpus_per_node": 2, "nic_gbps": 100}
            ],
        },
    }
    inst = instance_from_spec(
        validate_document(data, "t", InstanceFile, "instance"), "t", Path(".")
    )
    g = inst.gpu_types["MyGPU"]
    assert g.family == "turing" and g.tdp_w == 70 and g.usable_memory_gib < g.memory_gib
    assert Profiles().for_gpu(g).family == "turing"


def test_usable_memory_is_below_datasheet_and_sourced():
    for g in CATALOG.values():
        assert 0.9 * g.memory_gib < g.usable_memory_gib < g.memory_gib, g.name
        assert g.family in FAMILIES and g.tdp_w > 0
        assert {"family", "tdp_w", "usable_memory_gib"} <= set(g.sources)


def _layer_time(gpu: str, profiles: Profiles) -> tuple[float, bool, list[float]]:
    data = {
        "name": "t",
        "model": MODEL,
        "training": {"seq_len": 1024, "global_batch": 8},
        "cluster": {
            "nodes": [{"name": "n", "count": 1, "gpu": gpu, "gpus_per_node": 1, "nic_gbps": 100}]
        },
    }
    inst = instance_from_spec(
        validate_document(data, "t", InstanceFile, "instance"), "t", Path(".")
    )
    plan = expand_layout(inst, parse_layout("tp=1,pp=1,dp=1,mb=1,recompute=full"), source="t")
    ev = evaluate(inst, plan, profiles)
    return ev.iteration_time_s, ev.fits, ev.memory_limit_gib


def test_t4_is_now_priced_much_slower_relative_to_an_a100():
    new = Profiles()
    old = Profiles()  # before: every type priced with A100-80GB's efficiencies
    a100 = new.calibrated["A100-80GB"]
    old.calibrated = {"A100-80GB": a100, "T4": replace(a100, gpu="T4")}
    t4_new, _, limit = _layer_time("T4", new)
    ratio_new = t4_new / _layer_time("A100-80GB", new)[0]
    ratio_old = _layer_time("T4", old)[0] / _layer_time("A100-80GB", old)[0]
    assert ratio_new > 1.5 * ratio_old
    assert limit == [CATALOG["T4"].usable_memory_gib]

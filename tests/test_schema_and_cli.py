"""The instance schema, model resolution and the CLI commands of the foundation."""

from __future__ import annotations

import json

import jsonschema
import pytest
import yaml
from conftest import BAD, DEMO, run_hetopt

from hetopt.errors import InputError
from hetopt.spec.instance import bundled_instances, load_instance


def test_help_lists_the_commands():
    result = run_hetopt("--help")
    assert result.returncode == 0
    for command in ("validate", "schema", "instances", "gpus", "presets"):
        assert command in result.stdout


def test_schema_is_valid_json_schema_and_accepts_the_demo():
    result = run_hetopt("schema")
    assert result.returncode == 0
    schema = json.loads(result.stdout)
    jsonschema.Draft202012Validator.check_schema(schema)
    validator = jsonschema.Draft202012Validator(schema)
    validator.validate(yaml.safe_load(DEMO.read_text()))
    # the schema itself rejects what the loader rejects at the schema level
    with pytest.raises(jsonschema.ValidationError):
        validator.validate(yaml.safe_load((BAD / "zero_count.yaml").read_text()))
    with pytest.raises(jsonschema.ValidationError):
        validator.validate(yaml.safe_load((BAD / "misspelt_field.yaml").read_text()))


def test_validate_demo_prints_the_summary():
    result = run_hetopt("validate", str(DEMO))
    assert result.returncode == 0, result.stderr
    for words in (
        "A100-80GB@rack0",
        "V100-32GB@rack1",
        "6.74 B parameters",
        "GFLOP per token",
        "valid",
    ):
        assert words in result.stdout


def test_validate_json_summary_figures():
    s = json.loads(run_hetopt("validate", str(DEMO), "--json").stdout)
    assert s["totals"]["gpus"] == 32
    assert s["totals"]["memory_gib"] == 16 * 80 + 16 * 32
    assert s["totals"]["peak_tflops"] == 16 * 312 + 16 * 125
    assert s["model"]["params"] == 6_738_415_616
    assert s["training"]["tokens_per_iteration"] == 256 * 2048
    assert s["flops_per_iteration"] == pytest.approx(s["flops_per_token"] * 256 * 2048)
    assert [sc["name"] for sc in s["scenarios"]] == ["calm", "congested-uplink"]


def test_validate_without_argument_uses_the_demo_and_names_resolve():
    by_default = json.loads(run_hetopt("validate", "--json").stdout)
    by_name = json.loads(run_hetopt("validate", "demo-a100-v100-llama7b", "--json").stdout)
    assert by_default == by_name and by_default["name"] == "demo-a100-v100-llama7b"


def test_instances_lists_bundled_with_descriptions():
    data = json.loads(run_hetopt("instances", "--json").stdout)
    names = [r["name"] for r in data["instances"]]
    assert "demo-a100-v100-llama7b" in names
    assert all(r["description"] for r in data["instances"])
    assert set(names) == set(bundled_instances())


def test_every_bundled_instance_validates():
    for path in bundled_instances().values():
        load_instance(path)


def test_json_instance_is_accepted(tmp_path):
    path = tmp_path / "demo.json"
    path.write_text(json.dumps(yaml.safe_load(DEMO.read_text())))
    assert load_instance(path).cluster.total_gpus == 32


def _write(tmp_path, data) -> str:
    path = tmp_path / "i.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


BASE = {
    "name": "x",
    "training": {"global_batch": 8},
    "cluster": {"nodes": [{"name": "n", "count": 1, "gpu": "A100-80GB", "nic_gbps": 100}]},
}


def test_explicit_fields_override_the_preset(tmp_path):
    inst = load_instance(
        _write(tmp_path, {**BASE, "model": {"preset": "llama-7b", "layers": 16, "heads": 64}})
    )
    assert inst.model.layers == 16 and inst.model.hidden == 4096
    assert inst.model.kv_heads == 64  # a multi-head preset stays multi-head
    assert inst.model.name == "llama-7b (modified)"
    gqa = load_instance(_write(tmp_path, {**BASE, "model": {"preset": "llama2-70b", "heads": 32}}))
    assert gqa.model.kv_heads == 8  # a grouped-query preset keeps its kv heads
    assert (
        load_instance(_write(tmp_path, {**BASE, "model": {"preset": "llama2-70b"}})).seq_len == 4096
    )


def test_custom_model_defaults(tmp_path):
    model = {"layers": 4, "hidden": 256, "heads": 4, "vocab": 1000}
    data = {**BASE, "model": model, "training": {"global_batch": 8, "seq_len": 128}}
    m = load_instance(_write(tmp_path, data)).model
    assert (m.ffn_hidden, m.kv_heads, m.gated_mlp, m.max_seq_len) == (1024, 4, False, 128)


def test_custom_gpu_is_usable_and_sourced(tmp_path):
    data = {**BASE, "model": {"preset": "llama-7b"}}
    data["cluster"] = {
        "gpus": {
            "MyGPU": {
                "peak_tflops": 120,
                "memory_gib": 24,
                "hbm_gbps": 7200,
                "intra_node_gbps": 512,
            }
        },
        "nodes": [{"name": "n", "count": 2, "gpu": "MyGPU", "nic_gbps": 100}],
    }
    inst = load_instance(_write(tmp_path, data))
    assert inst.gpu_types["MyGPU"].memory_gib == 24
    assert "cluster.gpus.MyGPU" in inst.gpu_types["MyGPU"].sources["hbm_gbps"]
    assert inst.cluster.total_peak_tflops == 2 * 8 * 120


def test_every_generator_kind_parses(tmp_path):
    (tmp_path / "trace.csv").write_text("at_s,a,b,gbps\n0,r0,r1,100\n10,r0,r1,50\n")
    data = {**BASE, "model": {"preset": "llama-7b"}}
    data["cluster"] = {
        "nodes": [
            {"name": "p", "count": 1, "gpu": "L4", "island": "r0", "nic_gbps": 100},
            {"name": "q", "count": 1, "gpu": "L4", "island": "r1", "nic_gbps": 100},
        ],
        "network": {"links": [{"a": "r0", "b": "r1", "gbps": 100}]},
    }
    link = ["r1", "r0"]  # either order names the link
    data["scenarios"] = [
        {
            "name": "s",
            "probability": 0.25,
            "generator": {"kind": "step", "link": link, "low_gbps": 10, "at_s": 5, "until_s": 9},
        },
        {
            "name": "m",
            "probability": 0.25,
            "generator": {
                "kind": "markov",
                "link": link,
                "levels_gbps": [100, 20],
                "mean_dwell_s": 3,
                "seed": 7,
            },
        },
        {
            "name": "d",
            "probability": 0.25,
            "generator": {
                "kind": "diurnal",
                "link": link,
                "mean_gbps": 60,
                "amplitude_gbps": 30,
                "period_s": 3600,
            },
        },
        {"name": "t", "probability": 0.25, "generator": {"kind": "trace", "path": "trace.csv"}},
    ]
    inst = load_instance(_write(tmp_path, data))
    assert [sc.generator.kind for sc in inst.spec.scenarios] == [
        "step",
        "markov",
        "diurnal",
        "trace",
    ]
    data["scenarios"][3]["generator"]["path"] = "missing.csv"
    with pytest.raises(InputError, match=r"scenarios\[3\].generator.path"):
        load_instance(_write(tmp_path, data))

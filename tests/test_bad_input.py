"""Every kind of bad instance file exits 2 with one clear message naming the key path; never a traceback."""

from __future__ import annotations

import pytest
from conftest import BAD, run_hetopt

# file → (key path the message must name, words the message must contain)
CASES = {
    "malformed_yaml.yaml": ("line 10", "malformed YAML"),
    "malformed.json": ("line 2", "malformed JSON"),
    "unknown_top_level_key.yaml": ("trainig", "did you mean 'training'"),
    "misspelt_field.yaml": ("cluster.nodes[1].nic_gpbs", "did you mean 'nic_gbps'"),
    "zero_count.yaml": ("cluster.nodes[0].count", "got 0: must be greater than 0"),
    "negative_gpus_per_node.yaml": ("cluster.nodes[1].gpus_per_node", "got -8"),
    "unknown_gpu.yaml": ("cluster.nodes[0].gpu", "did you mean 'A100-80GB'"),
    "unknown_preset.yaml": ("model.preset", "did you mean 'llama-7b'"),
    "kv_heads_not_dividing.yaml": ("model.kv_heads", "must divide heads (32)"),
    "heads_not_dividing_hidden.yaml": ("model.heads", "must divide hidden (4096)"),
    "virtual_stages_not_dividing_layers.yaml": ("search.virtual_stages", "3, 5 do not divide the model's 32 layers"),
    "link_unknown_island.yaml": ("cluster.network.links[0].b", "no node group is in island 'rack9'"),
    "link_to_itself.yaml": ("cluster.network.links[0].b", "two different islands"),
    "scenario_unknown_link.yaml": ("scenarios[1].events[0].link", "no such link"),
    "probabilities_not_one.yaml": ("scenarios", "probabilities sum to 0.8, not 1"),
    "global_batch_fraction.yaml": ("training.global_batch", "got 12.5: must be a whole number"),
    "global_batch_zero.yaml": ("training.global_batch", "got 0: must be greater than 0"),
    "empty_cluster.yaml": ("cluster.nodes", "needs at least 1 item"),
    "duplicate_group_names.yaml": ("cluster.nodes[1].name", "duplicate node group name"),
    "custom_gpu_zero_memory.yaml": ("cluster.gpus.MyGPU.memory_gib", "got 0: must be greater than 0"),
    "custom_gpu_negative_bandwidth.yaml": ("cluster.gpus.MyGPU.hbm_gbps", "got -7200"),
    "empty.yaml": ("", "the file is empty"),
    "duplicate_key.yaml": ("training.global_batch", "duplicate key 'global_batch'"),
    "top_level_list.yaml": ("", "top level must be a mapping"),
    "unknown_generator_kind.yaml": ("scenarios[0].generator.kind", "got 'sine': unknown kind"),
    "custom_model_missing_fields.yaml": ("model.layers", "required when no preset is given"),
    "unknown_fabric.yaml": ("cluster.nodes[1].intra_fabric", "got 'nvlink9': input should be 'nvlink2'"),
}


def test_every_bad_file_has_a_case():
    assert sorted(p.name for p in BAD.iterdir()) == sorted(CASES)


@pytest.mark.parametrize("name", sorted(CASES))
def test_bad_instance_exits_2_with_key_path(name):
    path, words = CASES[name]
    result = run_hetopt("validate", str(BAD / name))
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    message = result.stderr
    assert message.startswith(f"error: {BAD / name}"), message  # names the file
    assert path in message and words in message, message
    assert result.stdout == ""


def test_missing_file_exits_2(tmp_path):
    missing = tmp_path / "no-such-instance.yaml"
    result = run_hetopt("validate", str(missing))
    assert result.returncode == 2
    assert "file does not exist" in result.stderr and str(missing) in result.stderr
    assert "Traceback" not in result.stderr


def test_misspelt_bundled_name_suggests_the_right_one():
    result = run_hetopt("validate", "demo-a100-v100-llama")
    assert result.returncode == 2
    assert "did you mean 'demo-a100-v100-llama7b'" in result.stderr


def test_all_reference_problems_of_a_file_are_reported_at_once(tmp_path):
    text = (BAD / "duplicate_group_names.yaml").read_text().replace("gpu: V100-32GB", "gpu: V100")
    bad = tmp_path / "two.yaml"
    bad.write_text(text)
    result = run_hetopt("validate", str(bad))
    assert result.returncode == 2
    assert "2 problems" in result.stderr
    assert "cluster.nodes[1].name" in result.stderr and "cluster.nodes[1].gpu" in result.stderr


def test_json_instance_errors_name_the_key_path(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"name": "x", "model": {"preset": "llama-7b"}, "training": {"global_batch": -1},'
                   ' "cluster": {"nodes": [{"name": "n", "count": 1, "gpu": "A100-80GB", "nic_gbps": 100}]}}')
    result = run_hetopt("validate", str(bad))
    assert result.returncode == 2
    assert "training.global_batch: got -1" in result.stderr

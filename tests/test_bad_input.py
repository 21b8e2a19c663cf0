"""Every kind of bad instance file exits 2 with one clear message naming the key path; never a
traceback."""

from __future__ import annotations

import json

import pytest
from conftest import BAD, DEMO, run_hetopt

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
    "virtual_stages_not_dividing_layers.yaml": (
        "search.virtual_stages",
        "3, 5 do not divide the model's 32 layers",
    ),
    "link_unknown_island.yaml": (
        "cluster.network.links[0].b",
        "no node group is in island 'rack9'",
    ),
    "link_to_itself.yaml": ("cluster.network.links[0].b", "two different islands"),
    "scenario_unknown_link.yaml": ("scenarios[1].events[0].link", "no such link"),
    "probabilities_not_one.yaml": ("scenarios", "probabilities sum to 0.8, not 1"),
    "global_batch_fraction.yaml": ("training.global_batch", "got 12.5: must be a whole number"),
    "global_batch_zero.yaml": ("training.global_batch", "got 0: must be greater than 0"),
    "empty_cluster.yaml": ("cluster.nodes", "needs at least 1 item"),
    "duplicate_group_names.yaml": ("cluster.nodes[1].name", "duplicate node group name"),
    "custom_gpu_zero_memory.yaml": (
        "cluster.gpus.MyGPU.memory_gib",
        "got 0: must be greater than 0",
    ),
    "custom_gpu_negative_bandwidth.yaml": ("cluster.gpus.MyGPU.hbm_gbps", "got -7200"),
    "empty.yaml": ("", "the file is empty"),
    "duplicate_key.yaml": ("training.global_batch", "duplicate key 'global_batch'"),
    "top_level_list.yaml": ("", "top level must be a mapping"),
    "unknown_generator_kind.yaml": ("scenarios[0].generator.kind", "got 'sine': unknown kind"),
    "custom_model_missing_fields.yaml": ("model.layers", "required when no preset is given"),
    "tp_not_dividing_heads.yaml": (
        "search.tp",
        "3 does not divide 32 heads and 32 key/value heads; 6 does not",
    ),
    "tp_larger_than_any_node.yaml": (
        "search.tp",
        "16 is more than the 8 GPUs of the largest node; pick among [1, 2, 4, 8]",
    ),
    "micro_batch_not_dividing_batch.yaml": (
        "search.micro_batch",
        "none of these divides training.global_batch (64)",
    ),
    # 10^9 nodes × 8 GPUs + 2 × 8; the limit is checks.MAX_CLUSTER_GPUS
    "billion_nodes.yaml": ("cluster.nodes[1].count", "8,000,000,016 GPUs, more than the 131,072"),
    # 10^12 sequences; the limit is checks.MAX_GLOBAL_BATCH (the shares of two templates explode
    # beyond it)
    "global_batch_trillion.yaml": (
        "training.global_batch",
        "more sequences per iteration than the 1,048,576",
    ),
    # the default 60 s horizon / a 1 µs mean dwell
    "markov_dwell_too_short.yaml": (
        "scenarios[0].generator.mean_dwell_s",
        "about 60,000,000 bandwidth changes",
    ),
    "unknown_fabric.yaml": (
        "cluster.nodes[1].intra_fabric",
        "got 'nvlink9': input should be 'nvlink2'",
    ),
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
    bad.write_text(
        '{"name": "x", "model": {"preset": "llama-7b"}, "training": {"global_batch": -1}, '
        '"cluster": {"nodes": [{"name": "n", "count": 1, "gpu": "A100-80GB", "nic_gbps": 100}]}}'
    )
    result = run_hetopt("validate", str(bad))
    assert result.returncode == 2
    assert "training.global_batch: got -1" in result.stderr


BAD_TRACE = """at_s,a,b,gbps
0,rack0,rack1,200
1.5,rack0,rack1,-5
2,rack0,rack1,nan
3,rack0,rack1,inf
4,rack0,rack1,0
-1,rack0,rack1,100
5,rack0,rack9,100
6,rack0,rack1,fast
"""


def test_a_trace_with_bad_rows_is_refused_at_validation_with_every_line_named(tmp_path):
    """Negative, nan or infinite Gbit/s, a negative time, an undeclared link: each row named
    (before, such rows were silently ignored or divided by zero, while `validate` passed them). A 0
    is an outage."""
    (tmp_path / "trace.csv").write_text(BAD_TRACE)
    instance = tmp_path / "traced.yaml"
    instance.write_text(
        (BAD / "zero_count.yaml").read_text().replace("count: 0", "count: 2")
        + """scenarios:
  - {name: measured, probability: 1.0, generator: {kind: trace, path: trace.csv}}
"""
    )
    for command in (
        ["validate", str(instance)],
        ["solve", str(instance), "--objective", "expected"],
    ):
        result = run_hetopt(*command)
        assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
        message = result.stderr
        assert "scenarios[0].generator.path" in message and "trace.csv" in message, message
        for needle in (
            "line 3 gbps: got '-5': must be Gbit/s ≥ 0",
            "line 4 gbps: got 'nan': must be finite",
            "line 5 gbps: got 'inf': must be finite",
            "line 7 at_s: got '-1': must be seconds ≥ 0",
            "line 8 a,b: got ['rack0', 'rack9']: no such link",
            "line 9 gbps: got 'fast': not a number",
        ):
            assert needle in message, (needle, message)
        assert "line 2" not in message and "line 6" not in message
    (tmp_path / "trace.csv").write_text("at_s,a,b,gbps\n0,rack0,rack1,200\n1.5,rack1,rack0,50\n")
    assert run_hetopt("validate", str(instance)).returncode == 0


def test_a_plan_with_virtual_stages_but_no_interleaved_schedule_is_refused(tmp_path):
    from hetopt.layout import expand_layout, parse_layout
    from hetopt.plan import plan_json
    from hetopt.spec.instance import load_instance

    plan = plan_json(
        expand_layout(load_instance("demo-a100-v100-llama7b"), parse_layout("tp=1,pp=2,dp=16"))
    )
    path = tmp_path / "plan.json"
    path.write_text(json.dumps({**plan, "schedule": "1f1b", "virtual_stages": 2}))
    result = run_hetopt("evaluate", "demo-a100-v100-llama7b", "--plan", str(path))
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert "virtual_stages: got 2: 2 virtual stages need schedule: interleaved" in result.stderr
    path.write_text(json.dumps({**plan, "schedule": "1f1b", "virtual_stages": 1}))
    assert run_hetopt("evaluate", "demo-a100-v100-llama7b", "--plan", str(path)).returncode == 0


def test_divisors_in_messages_are_found_up_to_the_square_root():
    """A message suggests divisors of the value given; `hidden: 2147483648` (found by the fuzz test)
    made the old count to n hang `validate` for minutes."""
    from hetopt.spec.checks import _divisors

    assert all(_divisors(n) == [d for d in range(1, n + 1) if n % d == 0] for n in range(1, 500))
    assert _divisors(2**31) == [2**k for k in range(32)]


def test_a_plan_file_with_absurd_replicas_is_refused_not_enumerated(tmp_path):
    """10**12 replicas (found by the fuzz test): the placement check enumerated every replica until
    the OOM killer ended the run; the plan uses more GPUs than the cluster has, which is what to
    say."""
    from hetopt.layout import expand_layout, parse_layout
    from hetopt.placement import place
    from hetopt.plan import plan_json
    from hetopt.spec.instance import load_instance

    inst = load_instance("demo-a100-v100-llama7b")
    plan = plan_json(place(expand_layout(inst, parse_layout("tp=2,pp=2,dp=8")), inst.cluster))
    plan["pipelines"][0]["replicas"] = 10**12
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan))
    result = run_hetopt("evaluate", "demo-a100-v100-llama7b", "--plan", str(path))
    assert result.returncode == 2, result.stderr
    assert (
        "the plan uses 2000000000000 GPUs of A100-80GB@rack0; the cluster has 16" in result.stderr
    )


def test_solve_on_a_trillion_sequence_batch_ends_at_once_within_bounded_memory():
    """Issue 13's acceptance: global_batch 10^12 ends with a clear message within its time limit +
    30 s and under 2 GiB (it filled 24 GB before MAX_GLOBAL_BATCH); the peak is sampled while it
    runs."""
    import contextlib
    import subprocess
    import sys
    import time

    import psutil
    from conftest import REPO

    limit_s = 10
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "hetopt",
            "solve",
            str(BAD / "global_batch_trillion.yaml"),
            "--time-limit",
            str(limit_s),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    peak, start = 0, time.monotonic()
    while proc.poll() is None and time.monotonic() - start < limit_s + 30:
        with contextlib.suppress(psutil.Error):  # it may end between poll and sample
            peak = max(peak, psutil.Process(proc.pid).memory_info().rss)
        time.sleep(0.05)
    if proc.poll() is None:
        proc.kill()
    _, stderr = proc.communicate()
    assert proc.returncode == 2 and "training.global_batch" in stderr, stderr
    assert "Traceback" not in stderr
    assert peak < 2 * 1024**3


TRACED = "  - {name: cut, probability: 1.0, generator: {kind: trace, path: trace.csv}}\n"


def _with_scenario(tmp_path, scenario: str, trace: str | None = None):
    if trace is not None:
        (tmp_path / "trace.csv").write_text(trace)
    instance = tmp_path / "outage.yaml"
    instance.write_text(DEMO.read_text().split("scenarios:")[0] + "scenarios:\n" + scenario)
    return instance


def test_an_outage_that_never_ends_is_refused_with_the_link_and_time(tmp_path):
    endless = "at_s,a,b,gbps\n0,rack0,rack1,400\n5,rack0,rack1,0\n"
    traced = _with_scenario(tmp_path, TRACED, endless)
    stepped = tmp_path / "step.yaml"
    stepped.write_text(
        traced.read_text().replace(
            "{kind: trace, path: trace.csv}",
            "{kind: step, link: [rack0, rack1], low_gbps: 0, at_s: 5}",
        )
    )
    for path, key in (
        (traced, "scenarios[0].generator.path"),
        (stepped, "scenarios[0].generator.until_s"),
    ):
        result = run_hetopt("validate", str(path))
        assert (
            result.returncode == 2 and key in result.stderr and "Traceback" not in result.stderr
        ), result.stderr
        assert "never" in result.stderr and "comes back" in result.stderr, result.stderr
    assert "rack0-rack1 down (0 Gbit/s) at 5 s" in run_hetopt("validate", str(traced)).stderr


def test_an_outage_is_replayed_and_refused_by_the_objectives_that_cannot_price_it(tmp_path):
    """0 Gbit/s from 5 s to 15 s: `solve` (stable) plans and its replay waits the outage out; the
    robust objectives, one bandwidth per link, say why they cannot price it (exit 2, no division by
    zero)."""
    trace = "at_s,a,b,gbps\n0,rack0,rack1,400\n5,rack0,rack1,0\n15,rack0,rack1,400\n"
    instance = _with_scenario(tmp_path, TRACED, trace)
    for objective in ("expected", "worst", "cvar"):
        result = run_hetopt("solve", str(instance), "--objective", objective)
        assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
        assert (
            f"scenario 'cut' takes link rack0-rack1 down (0 Gbit/s) at 5 s: the {objective} "
            "objective" in result.stderr
        )
    result = run_hetopt("solve", str(instance), "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    times = data["verified"]["scenarios"][0]["iteration_time_s"]
    # an iteration met the outage and waited for the link
    assert times["max"] > data["objective_s"] + 5


def test_a_trace_from_a_spreadsheet_reads_and_an_empty_one_is_refused(tmp_path):
    bom = _with_scenario(tmp_path, TRACED, "\ufeffat_s,a,b,gbps\r\n0,rack0,rack1,200\r\n")
    assert run_hetopt("validate", str(bom)).returncode == 0
    empty = _with_scenario(tmp_path, TRACED, "at_s,a,b,gbps\n")
    result = run_hetopt("validate", str(empty))
    assert result.returncode == 2 and "the trace has no rows" in result.stderr, result.stderr


def test_an_outage_after_the_horizon_is_refused_by_the_robust_objectives_too(tmp_path):
    """The last replayed iteration starts before the horizon and runs into what follows it: an
    outage at 60.001 s made an iteration 2.6× the `worst` price."""
    instance = _with_scenario(
        tmp_path,
        TRACED,
        "at_s,a,b,gbps\n0,rack0,rack1,400\n60.001,rack0,rack1,0\n70,rack0,rack1,400\n",
    )
    result = run_hetopt("solve", str(instance), "--objective", "worst")
    assert result.returncode == 2 and "down (0 Gbit/s) at 60.001 s" in result.stderr, result.stderr

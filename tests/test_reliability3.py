"""Reliability, third round (issue 39): calibration inputs, the dry run's map, export's scripts and
kernels, replan's arguments, YAML merge keys and one message style, each through the real command
line in a subprocess with its exit code and message."""

from __future__ import annotations

import copy
import csv
import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import CALIBRATION, REPO, run_hetopt

from hetopt.export.files import export
from hetopt.layout import Layout, expand_layout
from hetopt.plan import save_plan
from hetopt.spec.instance import load_instance

PUBLIC = CALIBRATION / "public"
GEMM = PUBLIC / "gemm_achieved.csv"
FABRICS = PUBLIC / "collectives_achieved.csv"
RUNS = PUBLIC / "training_throughput_non_a100.csv"


def _rows(path: Path, keep: int | None = None) -> tuple[list[str], list[dict]]:
    with path.open(newline="", encoding="utf-8") as fh:
        reader = csv.DictReader(fh)
        rows = list(reader)
    return list(reader.fieldnames or []), rows[:keep] if keep else rows


def _write(path: Path, header: list[str], rows: list[dict], bom: bool = False) -> Path:
    with path.open("w", newline="", encoding="utf-8-sig" if bom else "utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=header)
        writer.writeheader()
        writer.writerows(rows)
    return path


def _with_cell(tmp_path: Path, source: Path, column: str, value: str, keep: int = 30) -> Path:
    """`source`'s first `keep` rows with `column` of its first row that has one set to `value`."""
    header, rows = _rows(source, keep)
    row = next(r for r in rows if r[column].strip())
    row[column] = value
    line = rows.index(row) + 2
    path = _write(tmp_path / f"{source.stem}-{column}-{line}.csv", header, rows)
    return path


def _refused(result, *words: str) -> None:
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr and "Warning" not in result.stderr, result.stderr
    for word in words:
        assert word in result.stderr, (word, result.stderr)


def test_an_infinite_gemm_throughput_is_refused_and_nothing_is_written(tmp_path):
    bad = _with_cell(tmp_path, GEMM, "achieved_tflops", "inf")
    out = tmp_path / "profiles"
    result = run_hetopt("calibrate", "--gemm", str(bad), "--out", str(out))
    _refused(result, str(bad), "achieved_tflops", "(line 2)", "'inf'", "finite")
    assert not out.exists() or not any(out.iterdir())


def test_a_nan_measurement_of_a_run_is_refused_and_no_table_is_written(tmp_path):
    bad = _with_cell(tmp_path, RUNS, "tokens_per_s_per_gpu", "nan")
    out = tmp_path / "stacks.json"
    result = run_hetopt("calibrate", "--runs", str(bad), "--out", str(out))
    _refused(result, str(bad), "tokens_per_s_per_gpu", "'nan'", "finite")
    assert not out.exists()


@pytest.mark.parametrize(
    "mode, source, column, value, says",
    [
        ("--fabrics", FABRICS, "busbw_GBps", "fast", "bandwidth in GB/s"),
        ("--fabrics", FABRICS, "nominal_gbit_s", "NaN", "finite"),
        ("--fabrics", FABRICS, "busbw_GBps", "-3", "bandwidth in GB/s"),
        ("--fabrics", FABRICS, "num_gpus", "0", "whole number"),
        ("--gemm", GEMM, "achieved_tflops", "abc", "must be a number"),
        ("--gemm", GEMM, "achieved_tflops", "0", "positive"),
        ("--runs", RUNS, "tp", "-2", "whole number"),
        ("--runs", RUNS, "mfu_pct", "140", "percentage"),
    ],
)
def test_a_bad_cell_names_the_file_line_column_and_fix(tmp_path, mode, source, column, value, says):
    bad = _with_cell(tmp_path, source, column, value)
    result = run_hetopt("calibrate", mode, str(bad))
    _refused(result, str(bad), column, "(line ", repr(value), says)


@pytest.mark.parametrize(
    "mode, source, keep",
    [("--fabrics", FABRICS, None), ("--gemm", GEMM, None), ("--runs", RUNS, 40)],
)
def test_a_csv_saved_with_a_byte_order_mark_is_read(tmp_path, mode, source, keep):
    header, rows = _rows(source, keep)
    plain = _write(tmp_path / "plain.csv", header, rows)
    marked = _write(tmp_path / "marked.csv", header, rows, bom=True)
    assert marked.read_bytes().startswith(b"\xef\xbb\xbf")
    results = [run_hetopt("calibrate", mode, str(p), "--json") for p in (plain, marked)]
    assert [r.returncode for r in results] == [0, 0], results[1].stderr
    # the same fit, file names aside
    same = results[1].stdout.replace("marked.csv", "plain.csv")
    assert json.loads(results[0].stdout) == json.loads(same)


def test_calibration_modes_exclude_each_other():
    result = run_hetopt("calibrate", "--runs", str(RUNS), "--gemm", str(GEMM))
    _refused(result, "--gemm and --runs", "give one of them")


# -- the dry run's map


def _rankmap() -> dict:
    inst = load_instance("demo-a100-v100-llama7b")
    plan = expand_layout(inst, Layout(tp=1, pp=4, dp=8, mb=1))
    return json.loads(export(inst, plan, "rankmap").files["rankmap.json"])


def _dryrun(tmp_path: Path, rankmap) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "rankmap.json"
    path.write_text(json.dumps(rankmap))
    return subprocess.run(
        [sys.executable, "-m", "hetopt.export.dryrun", str(path)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
    )


@pytest.mark.parametrize(
    "spoil, says",
    [
        (lambda m: m["ranks"][0].update(pp_next=[99]), "ranks[0].pp_next: got [99]"),
        (lambda m: m.pop("ranks"), "ranks: must be a non-empty list"),
        (lambda m: m["ranks"][3].update(micro_batches=-2), "ranks[3].micro_batches: got -2"),
        (lambda m: m.update(world_size="eight"), "world_size: got 'eight'"),
    ],
)
def test_a_broken_rank_map_is_refused_before_any_process_starts(tmp_path, spoil, says):
    rankmap = copy.deepcopy(_rankmap())
    spoil(rankmap)
    result = _dryrun(tmp_path, rankmap)
    assert result.returncode == 2, result.stderr
    assert says in result.stderr and "Traceback" not in result.stderr
    assert json.loads(result.stdout)["ok"] is False


# -- export


def _v100_plan(tmp_path: Path, attention: str) -> tuple[Path, Path]:
    """An instance of one node of 8 V100-32GB with `attention`, and a plan of it, in their own
    directory of `tmp_path`."""
    home = tmp_path / attention
    home.mkdir()
    inst_path = home / "v100.yaml"
    inst_path.write_text(
        "name: v100\nmodel: {preset: gpt2-medium}\n"
        f"training: {{seq_len: 1024, global_batch: 64, attention: {attention}}}\n"
        "cluster:\n  nodes:\n"
        "    - {name: v, count: 1, gpu: V100-32GB, gpus_per_node: 8, nic_gbps: 100}\n"
    )
    inst = load_instance(str(inst_path))
    plan_path = home / "plan.json"
    save_plan(expand_layout(inst, Layout(tp=1, pp=2, dp=4, mb=1)), plan_path)
    return inst_path, plan_path


def test_megatron_export_says_flash_attention_does_not_run_on_volta_or_turing(tmp_path):
    inst_path, plan_path = _v100_plan(tmp_path, "flash")
    out = tmp_path / "out"
    args = ["export", str(plan_path), "--instance", str(inst_path), "--format", "megatron"]
    result = run_hetopt(*args, "--out", str(out))
    assert result.returncode == 1, result.stderr
    assert "FlashAttention-2" in result.stderr and "V100" in result.stderr
    assert "training.attention: standard" in result.stderr
    assert not (out / "megatron_args.txt").exists()
    inst_path, plan_path = _v100_plan(tmp_path, "standard")
    out = tmp_path / "standard"
    args = ["export", str(plan_path), "--instance", str(inst_path), "--format", "megatron"]
    assert "FlashAttention" not in run_hetopt(*args, "--out", str(out)).stderr


@pytest.mark.parametrize(
    "fmt, script_file", [("torchrun", "torchrun.sh"), ("deepspeed", "launch.sh")]
)
def test_the_training_script_is_one_quoted_word_of_the_shell_line(tmp_path, fmt, script_file):
    inst_path, plan_path = _v100_plan(tmp_path, "standard")
    hostile = "my train.py; rm -rf /"
    out = tmp_path / fmt
    result = run_hetopt(
        "export",
        str(plan_path),
        "--instance",
        str(inst_path),
        "--format",
        fmt,
        "--out",
        str(out),
        "--script",
        hostile,
    )
    assert result.returncode in (0, 1), result.stderr
    text = (out / script_file).read_text()
    lines = [ln for ln in text.splitlines() if "my train.py" in ln]
    assert lines
    for line in lines:
        assert hostile in shlex.split(line)  # one word, not a second command


# -- replan's arguments


@pytest.fixture(scope="module")
def demo_plan(tmp_path_factory) -> Path:
    inst = load_instance("demo-a100-v100-llama7b")
    path = tmp_path_factory.mktemp("demo") / "plan.json"
    save_plan(expand_layout(inst, Layout(tp=1, pp=4, dp=8, mb=1)), path)
    return path


def test_replan_refuses_a_link_given_twice(demo_plan):
    result = run_hetopt(
        "replan",
        "demo",
        "--plan",
        str(demo_plan),
        "--bandwidth",
        "rack0-rack1=5",
        "--bandwidth",
        "rack1-rack0=50",
    )
    _refused(result, "rack1-rack0=50", "also set by 'rack0-rack1=5'", "give each link once")


def test_replan_names_the_number_it_cannot_read(demo_plan):
    result = run_hetopt(
        "replan", "demo", "--plan", str(demo_plan), "--bandwidth", "rack0-rack1=nan"
    )
    _refused(result, "'nan' is not a finite number")
    assert "two islands" not in result.stderr


def test_replan_refuses_a_moment_past_the_horizon(demo_plan):
    args = ["--plan", str(demo_plan), "--scenario", "congested-uplink", "--at", "1e300"]
    result = run_hetopt("replan", "demo", *args)
    _refused(result, "--at", "past the instance's horizon", "search.horizon_s")


# -- the instance file and the options


def test_yaml_merge_keys_work_and_duplicates_are_still_refused(tmp_path):
    text = """name: merged
model: {preset: llama-7b}
training: {global_batch: 64, seq_len: 2048}
cluster:
  nodes:
    - &a100 {name: a, count: 2, gpu: A100-80GB, gpus_per_node: 8, nic_gbps: 200}
    - <<: *a100
      name: v
      gpu: V100-32GB
      gpus_per_node: 4
"""
    path = tmp_path / "merged.yaml"
    path.write_text(text)
    result = run_hetopt("validate", str(path), "--json")
    assert result.returncode == 0, result.stderr
    classes = {c["gpu"]: c for c in json.loads(result.stdout)["device_classes"]}
    assert classes["V100-32GB"]["gpus_per_node"] == 4  # its own key wins over the merged one
    assert classes["V100-32GB"]["nic_gbps"] == 200  # the merged one fills the rest
    dup = tmp_path / "dup.yaml"
    dup.write_text(text.replace("      name: v\n", "      name: v\n      name: w\n"))
    _refused(run_hetopt("validate", str(dup)), "duplicate key 'name'")


@pytest.mark.parametrize(
    "args, says",
    [
        (["--detection-delay", "-1"], "error: --detection-delay: got -1.0"),
        (["--restart", "nan"], "error: --restart: got nan"),
        (["--time-limit", "soon"], "error: --time-limit:"),
        (["--bogus"], "No such option: --bogus"),
    ],
)
def test_every_bad_option_value_speaks_hetopts_style(args, says):
    result = run_hetopt(
        "simulate", "demo", "--layout", "tp=1,pp=4,dp=8", "--policy", "replan", *args
    )
    _refused(result, says)
    assert "Usage:" not in result.stderr and "Try '" not in result.stderr


@pytest.mark.parametrize(
    "args, option",
    [
        (["solve", "demo", "--time-limit", "5", "--time-limit=10"], "--time-limit"),
        (["simulate", "demo", "--layout", "tp=1,pp=4,dp=8", "--json", "--json"], "--json"),
    ],
)
def test_an_option_given_twice_is_refused(args, option):
    result = run_hetopt(*args)
    _refused(result, f"error: {option}:", "given 2 times; give it once")


def test_the_hostile_sweeps_findings_are_refused(tmp_path):
    """What a second hostile sweep found (exit 3, exit 0 on nonsense, a process start on a broken
    map), each now exit 2 with the file or option named."""
    header, rows = _rows(RUNS, 5)
    twice = tmp_path / "twice.csv"
    twice.write_text(",".join([*header, "tp"]) + "\n")
    _refused(run_hetopt("calibrate", "--runs", str(twice)), "tp twice")
    extra = tmp_path / "extra.csv"
    _write(extra, header, rows)
    extra.write_text(extra.read_text().replace("\n", ",surplus\n", 2).replace(",surplus", "", 1))
    _refused(run_hetopt("calibrate", "--runs", str(extra)), "cells for", "columns")
    for r in rows:
        r["gpu"] = "NOPE"
    unknown = _write(tmp_path / "unknown.csv", header, rows)
    _refused(run_hetopt("calibrate", "--runs", str(unknown)), "none of its 5 rows")
    huge = _with_cell(tmp_path, RUNS, "tp", "1e26")
    _refused(run_hetopt("calibrate", "--runs", str(huge)), "whole number from 1 to")
    _refused(run_hetopt("calibrate", "--gemm", str(tmp_path)), "is a directory")
    _refused(run_hetopt("calibrate", "--gemm", str(GEMM), "--out", ""), "--out", "is empty")
    deep = tmp_path / "deep.yaml"
    deep.write_text("[" * 5000 + "]" * 5000)
    _refused(run_hetopt("validate", str(deep)), "nested too deeply")
    loop = tmp_path / "loop.yaml"
    loop.write_text("name: x\nmodel: &m {preset: llama-7b, self: *m}\n")
    _refused(run_hetopt("validate", str(loop)), "anchor that holds itself")
    layouts = tmp_path / "layouts.txt"
    layouts.write_bytes("tp=1,pp=4,dp=8\n".encode("utf-16"))
    _refused(run_hetopt("evaluate", "demo", "--layouts", str(layouts)), "not UTF-8")
    layouts.write_text("banana\n")
    _refused(run_hetopt("evaluate", "demo", "--layouts", str(layouts)), "no line of it evaluates")


@pytest.mark.parametrize(
    "spoil, says",
    [
        (lambda m: m.update(world_size=10**30), "must equal the number of ranks"),
        (lambda m: m["ranks"][0].pop("embedding"), "ranks[0].embedding"),
        (lambda m: m["ranks"][0].update(pp_next=[]), "whose pp_next does not name it"),
        (lambda m: m["ranks"][0].update(sequences=10**12), "at most 4096 sequences"),
        (lambda m: m["ranks"][0].update(first_layer=100), "beyond the model's"),
    ],
)
def test_a_rank_map_that_would_start_broken_processes_is_refused(tmp_path, spoil, says):
    rankmap = copy.deepcopy(_rankmap())
    spoil(rankmap)
    result = _dryrun(tmp_path, rankmap)
    assert result.returncode in (1, 2), result.stderr
    assert says in result.stderr and "Traceback" not in result.stderr

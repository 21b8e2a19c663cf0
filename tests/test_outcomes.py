"""Memory against real outcomes (hetopt/calibrate/outcomes.py, `hetopt calibrate --outcomes`): every
run of the LLaMA-13B sweep priced by the evaluator's fits verdict, and the headroom a confidence
needs."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from conftest import run_hetopt

from hetopt.calibrate.boundary import fit_memory, fit_step_time
from hetopt.calibrate.outcomes import headroom_table, outcome_report, read_outcomes
from hetopt.cost.stacks import shipped_stacks
from hetopt.evaluate import evaluate

DATA = Path(__file__).parents[1] / "data" / "calibration" / "public" / "hagemann_llama13b_runs.csv"


@pytest.fixture(scope="module")
def outcomes():
    return read_outcomes(DATA)


def test_every_run_of_the_sweep_is_priced_and_counted_once(outcomes):
    with DATA.open(newline="", encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    assert len(outcomes) == len(rows) == 422
    assert all(o.expressed for o in outcomes)
    assert sum(o.oom for o in outcomes) == sum(r["status"] == "OOM Error" for r in rows) == 257
    rep = outcome_report(outcomes)
    assert rep["missed_oom"] + rep["false_oom"] + round(rep["agreement"] * 422) == 422
    assert sum(g["runs"] for g in rep["groups"].values()) == 422
    # the verdict is the evaluator's: over its limit exactly where it does not fit
    for o in outcomes[::37]:
        ev = evaluate(o.instance, o.plan)
        assert ev.fits == o.fits == (o.over_gib <= 0)
        assert o.plan.pipelines[0].stages[0].tp == int(rows[o.line - 2]["tp"])


def test_the_headroom_of_each_confidence_is_the_least_that_reaches_it(outcomes):
    table = headroom_table(outcomes)
    reached = [h for h in table if h["headroom_gib"] is not None]
    assert reached and [h["headroom_gib"] for h in reached] == sorted(
        h["headroom_gib"] for h in reached
    )
    for h in reached:
        said = [o for o in outcomes if o.over_gib <= -h["headroom_gib"]]
        assert len(said) == h["said_fit"]
        assert sum(not o.oom for o in said) / len(said) >= h["confidence"]
        # the next smaller headroom where a verdict changes says more runs fit, too few of which did
        if h["headroom_gib"] > 0:
            below = max(
                [0.0] + [-o.over_gib for o in outcomes if 0 < -o.over_gib < h["headroom_gib"]]
            )
            less = [o for o in outcomes if o.over_gib <= -below]
            assert len(less) > len(said)
            assert sum(not o.oom for o in less) / len(less) < h["confidence"]


def test_the_cli_reports_and_refuses_bad_files(tmp_path):
    result = run_hetopt("calibrate", "--outcomes", str(DATA), "--json")
    assert result.returncode == 0, result.stderr
    rep = json.loads(result.stdout)
    assert rep["rows"] == 422 and rep["expressed"] == 422
    assert {"agreement", "missed_oom", "false_oom", "headroom", "groups"} <= set(rep)
    fit = rep["stack_fit"]
    assert fit["framework"] == "scaling" and fit["memory"]["kfold"]["agreement"] >= 0.93
    assert fit["step_time"]["kfold_mape"] < 0.08
    some = tmp_path / "some.csv"
    with DATA.open(encoding="utf-8") as fh:
        some.write_text("".join(fh.readlines()[:41]))  # the header and 40 runs
    text = run_hetopt("calibrate", "--outcomes", str(some))
    assert text.returncode == 0 and "agrees on" in text.stdout and "grouped k-fold" in text.stdout
    missing = run_hetopt("calibrate", "--outcomes", str(tmp_path / "none.csv"))
    assert missing.returncode == 2 and "does not exist" in missing.stderr
    short = tmp_path / "short.csv"
    short.write_text("tp,pp\n1,1\n")
    bad = run_hetopt("calibrate", "--outcomes", str(short))
    assert bad.returncode == 2 and "missing" in bad.stderr and "micro_batch" in bad.stderr
    assert "Traceback" not in bad.stderr


def test_a_file_that_is_not_utf8_exits_2(tmp_path):
    path = tmp_path / "latin.csv"
    path.write_bytes(b"tp,pp\n\xff\xfe,1\n")
    result = run_hetopt("calibrate", "--outcomes", str(path))
    assert result.returncode == 2 and "not a UTF-8 CSV" in result.stderr


def test_a_spreadsheets_byte_order_mark_is_read(tmp_path):
    lines = DATA.read_text(encoding="utf-8").splitlines()[:4]
    path = tmp_path / "bom.csv"
    path.write_text("\ufeff" + "\n".join(lines) + "\n", encoding="utf-8")
    assert len(read_outcomes(path)) == 3


@pytest.mark.parametrize(
    ("column", "value", "says"),
    [
        ("tp", "two", "tp (line 3): got 'two': must be a number"),
        ("micro_batch", "0", "micro_batch (line 3): got '0': must be a whole number from 1"),
        ("step_time_s", "nan", "step_time_s (line 3): got 'nan': must be a finite number"),
        ("status", "crashed", "bad.csv:3: status: got 'crashed': must be ok, or name an out-of"),
    ],
)
def test_a_bad_cell_exits_2_naming_the_row_and_the_column(tmp_path, column, value, says):
    with DATA.open(newline="", encoding="utf-8") as fh:
        reader = csv.DictReader(fh)
        rows = [next(reader) for _ in range(3)]
        fields = reader.fieldnames
    rows[1] = {**rows[1], column: value}
    path = tmp_path / "bad.csv"
    with path.open("w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)
    result = run_hetopt("calibrate", "--outcomes", str(path))
    assert result.returncode == 2, result.stderr
    assert str(path) in result.stderr and says in result.stderr
    assert "Traceback" not in result.stderr


@pytest.fixture(scope="module")
def memory_fit(outcomes):
    return fit_memory(outcomes, "scaling")


def test_the_shipped_scaling_terms_are_the_fit_on_the_sweep(outcomes, memory_fit):
    shipped = shipped_stacks()["scaling"]
    for name, value in memory_fit["terms"].items():
        assert getattr(shipped.memory, name) == pytest.approx(value), name
    # the verdicts of calibrate --outcomes are those of the shipped terms
    assert outcome_report(outcomes)["agreement"] == pytest.approx(memory_fit["agreement"])
    # measured 2026-12-07 with each run's attention and norm kernels and the loss's transients on
    # the last stage: 96.4% in-sample, 94.5% grouped k-fold (a buffer per token·hidden on every
    # stage instead: 95.7%, 93.8%; the previous model, flash or standard with fused norms and that
    # buffer: 94.8%, 92.2%; priced as megatron: 80.1%)
    assert memory_fit["agreement"] >= 0.96
    # each group judged by the terms fitted on the other three
    kfold = memory_fit["kfold"]
    assert set(kfold["groups"]) == {o.group for o in outcomes} and len(kfold["groups"]) == 4
    assert kfold["agreement"] >= 0.94
    assert kfold["agreement"] == pytest.approx(
        sum(g["agreement"] * g["runs"] for g in kfold["groups"].values()) / 422
    )


def test_the_scaling_compute_efficiency_is_the_fit_on_the_finished_runs(outcomes):
    fit = fit_step_time(outcomes, "scaling")
    assert fit["rows"] == sum(not o.oom for o in outcomes) == 165
    assert fit["efficiency"] == pytest.approx(
        shipped_stacks()["scaling"].compute_efficiency, abs=2e-3
    )
    # measured 2026-12-07 with each run's kernels: 5.4% in-sample, 5.5% grouped k-fold (the
    # previous model, flash or standard with fused norms: 10.3%, 11.1%; priced as megatron: 25.7%);
    # the issue asks for 8%
    assert fit["mape"] <= fit["kfold_mape"] < 0.08

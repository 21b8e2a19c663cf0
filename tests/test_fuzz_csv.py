"""Fuzz: the CSV files calibration reads and the dry run's rank map, mutated at random, are read or
refused as bad input, never a traceback (issue 39).

Each example edits a small valid file of one kind (a cell replaced by what a spreadsheet or a broken
script writes, a column dropped or renamed, a row cut short or lengthened, a byte-order mark, bytes
that are not UTF-8) and reads it in this process with the reader calibration uses: it returns, or it
raises InputError naming the file — anything else would be exit 3. A smaller set runs the whole
`hetopt calibrate` on each kind with `--out`, whose file must not exist after a refusal."""

from __future__ import annotations

import copy
import csv
import io
import json
import os
from pathlib import Path

import pytest
from conftest import CALIBRATION, document_nodes, run_in_process
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hetopt.calibrate.fabrics import read_rows as read_fabrics
from hetopt.calibrate.gemm import read_rows as read_gemm
from hetopt.calibrate.layouts import load_dataset
from hetopt.calibrate.outcomes import read_outcomes
from hetopt.calibrate.runs import read_runs
from hetopt.errors import InputError
from hetopt.export.dryrun import check, structure

MUTATIONS = int(os.environ.get("FUZZ_CSV_N", 1000))
"""Examples per kind of file: the issue's floor."""
CELLS = [
    "",
    " ",
    "0",
    "-1",
    "-0",
    "1.5",
    "8.0",
    "nan",
    "NaN",
    "inf",
    "-inf",
    "1e309",
    "1e-320",
    "abc",
    "∞",
    "1,5",
    "0x10",
    "12 to",
    "to 24",
    "up to",
    "8M-",
    "-8M",
    "4G-2M",
    ">1",
    "flash",
    "OOM Error",
    "ok",
    '"',
    "a\nb",
    "9" * 400,
]
"""What a spreadsheet, a hand edit or a broken script writes into a cell."""

KINDS = {
    "runs": (CALIBRATION / "public" / "training_throughput_non_a100.csv", read_runs),
    "gemm": (CALIBRATION / "public" / "gemm_achieved.csv", read_gemm),
    "fabrics": (CALIBRATION / "public" / "collectives_achieved.csv", read_fabrics),
    "layouts": (
        CALIBRATION / "a100_single_node_megatron_deepspeed.csv",
        lambda p: load_dataset(p, "A100-80GB"),
    ),
    "layers": (
        CALIBRATION / "a100_22b_layer_times_korthikanti2022.csv",
        lambda p: load_dataset(p, "A100-80GB"),
    ),
    "outcomes": (CALIBRATION / "public" / "hagemann_llama13b_runs.csv", read_outcomes),
}


def _base(path: Path, rows: int = 6) -> tuple[list[str], list[list[str]]]:
    with path.open(newline="", encoding="utf-8") as fh:
        table = list(csv.reader(fh))
    return table[0], table[1 : rows + 1]


FUZZ = settings(
    max_examples=MUTATIONS,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def _mutated(header: list[str], rows: list[list[str]], data) -> bytes:
    """1–3 random edits of the table, then written out (sometimes with a BOM, sometimes broken
    UTF-8)."""
    header, rows = list(header), [list(r) for r in rows]
    for _ in range(data.draw(st.integers(1, 3))):
        op = data.draw(
            st.sampled_from(["cell", "cell", "cell", "column", "rename", "short", "long"])
        )
        col = data.draw(st.integers(0, len(header) - 1))
        row = data.draw(st.integers(0, len(rows) - 1))
        if op == "cell":
            rows[row] += [""] * (col + 1 - len(rows[row]))  # a short row grows back to the cell
            rows[row][col] = data.draw(st.sampled_from(CELLS))
        elif op == "column":
            del header[col]
            for r in rows:
                if col < len(r):
                    del r[col]
        elif op == "rename":
            header[col] = header[col][:-1] + "z"
        elif op == "short":
            rows[row] = rows[row][: data.draw(st.integers(0, len(rows[row])))]
        else:
            rows[row] = [*rows[row], data.draw(st.sampled_from(CELLS))]
        if not header:
            break
    out = io.StringIO()
    csv.writer(out).writerows([header, *rows])
    raw = out.getvalue().encode()
    ending = data.draw(st.sampled_from(["plain", "plain", "bom", "latin"]))
    if ending == "bom":
        raw = b"\xef\xbb\xbf" + raw
    elif ending == "latin":
        raw = raw.replace(b"a", b"\xe9", 1)
    return raw


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_a_mutated_csv_is_read_or_refused_naming_the_file(kind, tmp_path):
    source, read = KINDS[kind]
    header, rows = _base(source)
    path = tmp_path / f"{kind}.csv"

    @FUZZ
    @given(data=st.data())
    def one(data):
        path.write_bytes(_mutated(header, rows, data))
        try:
            read(path)
        except InputError as exc:
            assert str(path) in str(exc)

    one()


CLI = {
    "runs": ["--runs"],
    "gemm": ["--gemm"],
    "fabrics": ["--fabrics"],
    "outcomes": ["--outcomes"],
}


@pytest.mark.parametrize("kind", sorted(CLI))
def test_calibrate_on_a_mutated_csv_exits_0_or_2_and_writes_nothing_on_2(kind, tmp_path):
    source, _ = KINDS[kind]
    header, rows = _base(source, 4)
    path = tmp_path / f"{kind}.csv"
    out = tmp_path / ("profiles" if kind == "gemm" else "out.json")

    @settings(FUZZ, max_examples=max(10, MUTATIONS // 50))
    @given(data=st.data())
    def one(data):
        path.write_bytes(_mutated(header, rows, data))
        extra = ["--out", str(out), "--force"] if kind != "outcomes" else []
        code, message = run_in_process(["calibrate", *CLI[kind], str(path), *extra])
        assert code in (0, 2), (code, message)
        assert "Traceback" not in message
        if code == 2:
            written = out.exists() and (not out.is_dir() or any(out.iterdir()))
            assert not written, message
        if out.exists():  # the next example starts clean
            if out.is_dir():
                for f in out.iterdir():
                    f.unlink()
                out.rmdir()
            else:
                out.unlink()

    one()


# -- the dry run's map

RANKMAP = {
    "instance": "tiny",
    "order": "tp-cp-dp-pp",
    "world_size": 2,
    "master": "n-0",
    "nodes": [{"name": "n-0", "node_rank": 0, "nproc": 2, "gpus": [0, 1]}],
    "ranks": [
        {
            "rank": i,
            "node": "n-0",
            "node_rank": 0,
            "local_rank": i,
            "gpu": i,
            "gpu_type": "A100-80GB",
            "template": 0,
            "replica": 0,
            "stage": i,
            "stages": 2,
            "dp_rank": 0,
            "tp_rank": 0,
            "cp_rank": 0,
            "first_layer": i,
            "layers": 1,
            "chunks": [[i, 1]],
            "embedding": i == 0,
            "head": i == 1,
            "sequences": 1,
            "micro_batches": 2,
            "recompute": "none",
            "tp_group": [i],
            "cp_group": [i],
            "dp_group": [i],
            "grad_group": [i],
            "pp_prev": [0] if i == 1 else [],
            "pp_next": [1] if i == 0 else [],
            "exchange_group": [],
        }
        for i in range(2)
    ],
}
MAP_VALUES = [0, -1, 1, 2, 99, 1.5, None, "x", True, [], {}, [99], [-1], [0, 1], [[0, 1]]]


def test_a_mutated_rank_map_is_refused_or_checked_without_starting_a_process(monkeypatch):
    """Every mutation either fails `structure` (exit 2, nothing started) or reaches the checks
    that need no process; a map that passes them all would start processes, so those are counted,
    not run."""
    import torch.multiprocessing as mp

    def refuse(*args, **kwargs):
        raise AssertionError("a process was started")

    monkeypatch.setattr(mp, "start_processes", refuse)
    assert structure(RANKMAP) == []

    @FUZZ
    @given(data=st.data())
    def one(data):
        doc = copy.deepcopy(RANKMAP)
        for _ in range(data.draw(st.integers(1, 3))):
            paths = [p for p, _ in document_nodes(doc) if p]
            if not paths:
                break
            path = paths[data.draw(st.integers(0, len(paths) - 1))]
            parent = doc
            for key in path[:-1]:
                parent = parent[key]
            if data.draw(st.booleans()):
                parent[path[-1]] = copy.deepcopy(data.draw(st.sampled_from(MAP_VALUES)))
            else:
                del parent[path[-1]]
        json.dumps(doc)
        try:
            result = check(doc)
        except AssertionError:  # a map fit to run: the process start refused above
            return
        assert result["ok"] is False and result["problems"]

    one()

"""One validated reader for every CSV hetopt reads: calibration's end-to-end runs, GEMM throughput,
collective bandwidth, layout runs, layer times and run outcomes (their kinds in
hetopt/calibrate/columns.py), and bandwidth traces (hetopt/spec/scenarios.py).

A kind of file is a :class:`CsvKind`: the columns it must have, and for each column what a cell may
hold. The reader takes a UTF-8 file with or without the byte-order mark spreadsheets write, checks
the header, then every cell, and raises one :class:`InputError` that names the file, and for each
bad cell its line, column, value and fix. Numbers must be finite and in their column's range, so no
fit downstream sees NaN, infinity, zero or a negative where a positive quantity belongs.
"""

from __future__ import annotations

import csv
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from hetopt.errors import InputError, Problem

MAX_PROBLEMS = 20
"""Bad cells listed before the rest are summed up in one line."""

Check = Callable[[str], str]
"""Validates a non-empty cell and returns it in canonical form (``8.0`` → ``8`` for a count);
raises ValueError with what the cell must be."""


def _number(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError("must be a number") from None
    if not math.isfinite(value):
        raise ValueError("must be a finite number")
    return value


def positive(text: str) -> str:
    """A finite number above 0."""
    if _number(text) <= 0:
        raise ValueError("must be a positive number")
    return text


MAX_COUNT = 10**9
"""The largest count a row may give (GPUs, layers, a hidden size, tokens): beyond it, a typo."""


def count(text: str) -> str:
    """A whole number from 1 to MAX_COUNT (``8`` or ``8.0``), written back as ``8``."""
    value = _number(text)
    if value < 1 or not value.is_integer() or value > MAX_COUNT:
        raise ValueError(f"must be a whole number from 1 to {MAX_COUNT:,}")
    return str(int(value))


def percent(text: str) -> str:
    """A share in percent, above 0 and at most 100."""
    value = _number(text)
    if not 0 < value <= 100:
        raise ValueError("must be a percentage above 0 and at most 100")
    return text


def count_or_words(text: str) -> str:
    """A whole number ≥ 1 where the cell is a number; words (``>1``) are read as unstated."""
    try:
        float(text)
    except ValueError:
        return text
    return count(text)


_UNIT = {"": 1.0, "K": 2.0**10, "M": 2.0**20, "G": 2.0**30}


def _bytes(text: str) -> float:
    m = re.fullmatch(r"\s*([0-9.eE+-]+)\s*([KMG]?)i?B?\s*", text)
    if not m:
        raise ValueError("must be a size in bytes (8589934592, 8M, 8G) or a range 8M-128M")
    return _number(m.group(1)) * _UNIT[m.group(2)]


def bytes_of(text: str) -> float:
    """A size in bytes (``8589934592``, ``8M``, ``8G``), or the geometric mean of a range of two
    (``8M-128M``). Raises ValueError unless every size is finite and above 0."""
    parts = text.split("-") if re.search(r"\d[KMG]?\s*-\s*\d", text) else [text]
    sizes = [_bytes(p) for p in parts]
    if min(sizes) <= 0:
        raise ValueError("must be a positive size in bytes (8589934592, 8M, 8G) or 8M-128M")
    return math.prod(sizes) ** (1 / len(sizes))


def byte_size(text: str) -> str:
    """A size in bytes, or a range of two sizes with K/M/G units (``8M-128M``)."""
    bytes_of(text)
    return text


def bandwidth_range(text: str) -> None:
    """A bandwidth: one number, ``a to b``, ``a-b`` or ``up to a``, each finite and above 0."""
    parts = text.replace("up to", "").replace(" to ", "-").strip().split("-")
    try:
        values = [_number(p.strip()) for p in parts]
    except ValueError:
        raise ValueError("must be a bandwidth in GB/s: 24, '12 to 24' or 'up to 340'") from None
    if not values or min(values) <= 0:
        raise ValueError("must be a positive bandwidth in GB/s: 24, '12 to 24' or 'up to 340'")
    return text


def words(text: str) -> str:
    """Any text."""
    return text


def choice(*values: str) -> Check:
    """One of `values`."""

    def check(text: str) -> str:
        if text not in values:
            raise ValueError(f"must be one of {', '.join(values)}")
        return text

    return check


@dataclass(frozen=True)
class Column:
    name: str
    check: Check = words
    needed: bool = True
    """In the header (a column the reader works without is not needed)."""
    filled: bool = False
    """Every row must give a value."""
    what: str = ""
    """What the value is, in its unit, for the fix ("the measured TFLOP/s")."""


@dataclass(frozen=True)
class CsvKind:
    what: str
    """What the file holds, e.g. "GEMM measurements"."""
    example: str
    """A bundled file with these columns, named in the fix."""
    columns: tuple[Column, ...]

    @property
    def needed(self) -> set[str]:
        return {c.name for c in self.columns if c.needed}


def read_table(path: str | Path, what: str) -> tuple[list[str], list[dict[str, str]]]:
    """The header and rows of a CSV file, every cell a stripped string ('' where a short row
    leaves it out). Raises InputError where the file is missing, not UTF-8 text or not CSV."""
    path = Path(path)
    if path.is_dir():
        raise InputError(str(path), [Problem("", f"is a directory; give the CSV file ({what})")])
    if not path.is_file():
        raise InputError(str(path), [Problem("", f"{what} file does not exist")])
    try:
        with path.open(newline="", encoding="utf-8-sig") as fh:
            table = list(csv.reader(fh))
    except (UnicodeDecodeError, csv.Error) as exc:
        raise InputError(
            str(path), [Problem("", f"not a UTF-8 CSV file ({exc}); save it as CSV UTF-8")]
        ) from None
    header = [h.strip() for h in table[0]] if table else []
    twice = sorted({h for h in header if h and header.count(h) > 1})
    if twice:
        raise InputError(
            str(path),
            [Problem("columns", f"{', '.join(twice)} twice; keep one of each", header, True)],
        )
    problems = [
        Problem("", f"{len(cells)} cells for {len(header)} columns; one cell per column", line=n)
        for n, cells in enumerate(table[1:], start=2)
        if len(cells) > len(header)
    ]
    if problems:
        raise InputError(str(path), problems[:MAX_PROBLEMS])
    rows = [
        {h: (cells[i].strip() if i < len(cells) else "") for i, h in enumerate(header) if h}
        for cells in table[1:]
        if any(c.strip() for c in cells)  # a blank line is no row
    ]
    return header, rows


def check_columns(path: str | Path, header: list[str], kind: CsvKind) -> None:
    """Bad input unless the header has every column `kind` needs."""
    missing = sorted(kind.needed - set(header))
    if missing:
        raise InputError(
            str(path),
            [
                Problem(
                    "columns",
                    f"not {kind.what}: missing {', '.join(missing)}; give a CSV with the columns "
                    f"of {kind.example}",
                    header,
                    True,
                )
            ],
        )


def check_rows(path: str | Path, rows: list[dict[str, str]], kind: CsvKind) -> None:
    """Bad input naming every bad cell (line, column, value, what it must be): a filled column left
    empty, or a cell its column's check refuses. Cells that pass are written back in canonical
    form."""
    problems = []
    for line, row in enumerate(rows, start=2):
        for col in kind.columns:
            text = row.get(col.name, "")
            fix = f"; give {col.what}" if col.what else ""
            if not text:
                if col.filled and col.name in row:
                    problems.append(
                        Problem(col.name, f"is empty{fix or '; give a value'}", line=line)
                    )
                continue
            try:
                row[col.name] = col.check(text)
            except ValueError as exc:
                problems.append(Problem(col.name, f"{exc}{fix}", text, True, line=line))
    if problems:
        more = len(problems) - MAX_PROBLEMS
        shown = problems[:MAX_PROBLEMS]
        if more > 0:
            shown.append(Problem("", f"and {more} more bad cells"))
        raise InputError(str(path), shown)


def read_csv(path: str | Path, kind: CsvKind) -> list[dict[str, str]]:
    """The rows of a CSV file of `kind`, its header and every cell checked.

    Parameters: path — the file; kind — what it must hold.
    Returns: one dict per row, column → stripped text (counts as whole numbers: ``8.0`` → ``8``).
    Raises: InputError (exit 2) naming the file, and each bad cell's line and column."""
    header, rows = read_table(path, kind.what)
    check_columns(path, header, kind)
    if not rows:
        raise InputError(str(path), [Problem("", f"no rows; expected {kind.what} under a header")])
    check_rows(path, rows, kind)
    return rows

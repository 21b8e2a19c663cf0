"""What every command shares: the consoles, the common arguments and options, JSON output,
listings and progress."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Annotated, Any

import typer
from rich.console import Console

from hetopt.progress import Progress
from hetopt.report.tables import narrow_table

out = Console(soft_wrap=False)


err = Console(stderr=True)


InstanceArg = Annotated[
    str | None,
    typer.Argument(
        help="Instance file (YAML or JSON) or the name of a bundled instance; default: the demo."
    ),
]


JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON object on stdout.")]


ExecutorOpt = Annotated[
    str,
    typer.Option(
        "--executor",
        help="Where skeleton solves run side by side: process "
        "(worker processes here; `local` is the same) or "
        'ray (pip install "hetopt[ray]").',
    ),
]


AddressOpt = Annotated[
    str | None,
    typer.Option(
        "--address",
        help="With --executor ray: a Ray cluster's HOST:PORT (or auto); default: a local Ray "
        "started for this command.",
    ),
]


MAX_ITERATIONS = 100_000
"""The most iterations `simulate --iterations` replays per scenario (each is every pass of the
plan)."""


HeadroomOpt = Annotated[
    str | None,
    typer.Option(
        "--memory-headroom",
        help="Keep this much of every GPU's memory free: GiB (2, 2GiB) or a share (5%). "
        "Default: plans may use all of it.",
    ),
]

RentOpt = Annotated[
    str | None,
    typer.Option(
        "--rent",
        help="Which nodes a plan's dollars count: used (those it places ranks on; default) or "
        "all (every node the instance lists).",
    ),
]


def _print_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj, indent=2) + "\n")


def _replay_progress(status: Progress) -> Callable[[int, int], None]:
    def tell(done: int, total: int) -> None:
        status.update(f"simulating: {done} of {total} scenarios replayed")

    return tell


def _listing(
    key: str,
    title: str,
    rows: list[dict],
    columns: list[tuple[str, Callable[[dict], str]]],
    as_json: bool,
) -> None:
    """A list command's output: {key: rows} with --json, else a table of the given columns."""
    if as_json:
        _print_json({key: rows})
        return
    table = narrow_table(title)
    for header, _ in columns:
        table.add_column(header)
    for r in rows:
        table.add_row(*(cell(r) for _, cell in columns))
    out.print(table)


def _demo():
    from hetopt.spec.instance import DEMO_INSTANCE, load_instance

    return load_instance(DEMO_INSTANCE)

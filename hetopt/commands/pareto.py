"""`hetopt pareto`: the front of throughput against dollars per hour, each point a proven optimum
under a budget."""

from __future__ import annotations

from typing import Annotated

import typer

from hetopt.commands.common import (
    HeadroomOpt,
    InstanceArg,
    JsonOpt,
    RentOpt,
    _demo,
    _print_json,
    err,
    out,
)
from hetopt.errors import ExitCode, check_time_limit
from hetopt.progress import Progress

OUTPUTS = ("pareto.json", "pareto.png")


def pareto(
    instance: InstanceArg = None,
    points: Annotated[
        int,
        typer.Option(
            "--points",
            min=2,
            max=50,
            help="Budget levels, from the fastest plan's dollars per hour down to the least any "
            "plan can rent (a geometric grid).",
        ),
    ] = 6,
    out_dir: Annotated[
        str | None,
        typer.Option(
            "--out",
            help="Folder for pareto.json, pareto.png and each point's plan (point-K.json). "
            "Default: pareto-<instance>.",
        ),
    ] = None,
    force: Annotated[
        bool, typer.Option("--force", help="Overwrite the files of an earlier run in --out.")
    ] = False,
    time_limit: Annotated[
        float, typer.Option("--time-limit", help="Seconds for each point's search.")
    ] = 60.0,
    backend: Annotated[str, typer.Option("--backend", help="cpsat, cbc or highs.")] = "highs",
    memory_headroom: HeadroomOpt = None,
    rent: RentOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """The front of (tokens/s, $/hour): each point the fastest plan under a budget, with its
    plan."""
    import json

    from hetopt.outputs import check_output_directory, refuse_existing, write_text
    from hetopt.pareto import pareto_front, plot_front
    from hetopt.report.tables import narrow_table
    from hetopt.search.types import SearchRequest
    from hetopt.spec.instance import load_instance, with_memory_headroom, with_rent

    check_time_limit(time_limit)
    inst = with_rent(
        with_memory_headroom(load_instance(instance) if instance else _demo(), memory_headroom),
        rent,
    )
    folder = check_output_directory(out_dir or f"pareto-{inst.name}", "--out")
    ours = [*(folder / n for n in OUTPUTS), *folder.glob("point-*.json")]
    refuse_existing(ours, "--out", str(folder), force)
    request = SearchRequest(inst, backend=backend, time_limit_s=time_limit)
    with Progress(err, f"the front of {inst.name}…") as status:
        front = pareto_front(request, points, progress=lambda line: status.update(line))
    if not front:
        err.print("infeasible: no plan of the space fits", markup=False)
        raise typer.Exit(ExitCode.FAILED)
    folder.mkdir(parents=True, exist_ok=True)
    for p in folder.glob("point-*.json"):  # an earlier run's, overwritten with --force
        p.unlink()
    result = {"points": [p.to_json() for p in front]}
    for k, p in enumerate(front):
        write_text(folder / f"point-{k}.json", json.dumps(p.to_json()["plan"], indent=2) + "\n")
    write_text(folder / "pareto.json", json.dumps(result, indent=2) + "\n")
    plot_front(front, folder / "pareto.png", f"{inst.name}: throughput against dollars")
    if as_json:
        _print_json(result)
        return
    table = narrow_table(
        f"Pareto front of {inst.name} (each point the fastest plan under its budget)"
    )
    for col in ("#", "$/h", "tokens/s", "$/Mtok", "status", "GPUs rented"):
        table.add_column(col, justify="left" if col in ("status", "GPUs rented") else "right")
    for k, p in enumerate(front):
        proof = p.proof
        table.add_row(
            str(k),
            f"{p.usd_per_hour:,.2f}",
            f"{p.tokens_per_s:,.0f}",
            f"{p.usd_per_million_tokens:.3f}",
            proof,
            p.gpus,
        )
    out.print(table)
    out.print(f"plans, pareto.json and pareto.png written to {folder}")

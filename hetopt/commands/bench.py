"""`hetopt bench`: planners side by side on instances and scenarios."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from hetopt.commands.common import AddressOpt, HeadroomOpt, RentOpt, err, out
from hetopt.errors import (
    check_time_limit,
)


def bench(
    instance_names: Annotated[
        list[str] | None,
        typer.Argument(
            metavar="[INSTANCE]...",
            help="Instance files or bundled names; default: every bundled instance.",
        ),
    ] = None,
    planners: Annotated[
        str,
        typer.Option(
            "--planners",
            help="Comma-separated planners; default: all (ilp, megatron, fastest-subset, "
            "proportional, amp-like, metis-like, random, exhaustive).",
        ),
    ] = "all",
    scenarios: Annotated[
        str, typer.Option("--scenarios", help="Comma-separated scenario names, or all.")
    ] = "all",
    time_limit: Annotated[
        float, typer.Option("--time-limit", help="Seconds per planner run.")
    ] = 60.0,
    iterations: Annotated[
        int, typer.Option("--iterations", min=1, help="Simulated iterations per scenario.")
    ] = 3,
    seed: Annotated[
        int, typer.Option("--seed", help="Seed of the random planner and the solvers.")
    ] = 0,
    out_dir: Annotated[
        str,
        typer.Option(
            "--out",
            help="Directory for results.csv, results.md and the plots (or a .csv path: the rest "
            "go beside it).",
        ),
    ] = "bench-results",
    force: Annotated[
        bool, typer.Option("--force", help="Overwrite existing result files.")
    ] = False,
    executor: Annotated[
        str,
        typer.Option(
            "--executor",
            help="Where the (instance × planner) runs go: process "
            "(one after another here; `local` is the same) or "
            "ray (each a Ray task; pip install "
            '"hetopt[ray]").',
        ),
    ] = "process",
    address: AddressOpt = None,
    memory_headroom: HeadroomOpt = None,
    rent: RentOpt = None,
) -> None:
    """Run planners side by side, replay every plan in the simulator, write CSV, Markdown and
    plots."""

    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from hetopt.bench import check_outputs, check_planners, run_bench, write_outputs
    from hetopt.executors import check_executor
    from hetopt.planners import PLANNERS
    from hetopt.spec.instance import (
        bundled_instances,
        load_instance,
        with_memory_headroom,
        with_rent,
    )

    check_time_limit(time_limit)
    chosen = (
        list(PLANNERS)
        if planners == "all"
        else check_planners([p.strip() for p in planners.split(",")])
    )
    names = instance_names or list(bundled_instances())
    # before any work: nothing a user has is overwritten without --force
    check_outputs(Path(out_dir), force)
    check_executor(executor, address)
    insts = [
        with_rent(with_memory_headroom(load_instance(n), memory_headroom), rent) for n in names
    ]
    wanted = None if scenarios == "all" else [s.strip() for s in scenarios.split(",")]
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(),
        console=err,
    ) as bar:
        task = bar.add_task("bench", total=len(insts) * len(chosen))
        started = [False]

        def progress(inst, planner: str) -> None:
            if started[0]:
                bar.advance(task)
            started[0] = True
            what = f"{inst.name} ({inst.cluster.total_gpus} GPUs): {planner}"
            bar.update(task, description=what)
            if not err.is_terminal:  # no live bar in a log: one line per run instead
                err.print(
                    f"[{bar.tasks[0].completed + 1}/{bar.tasks[0].total}] {what}",
                    markup=False,
                    highlight=False,
                )

        result = run_bench(
            insts,
            chosen,
            wanted,
            time_limit,
            iterations,
            seed,
            progress=progress,
            executor=executor,
            address=address,
        )
        bar.update(task, completed=len(insts) * len(chosen), description="bench done")
    paths = write_outputs(result, Path(out_dir), force)
    out.print(
        Path(paths[1]).read_text(encoding="utf-8"), markup=False, highlight=False, soft_wrap=True
    )
    for p in paths:
        out.print(f"written {p}")

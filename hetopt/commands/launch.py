"""`hetopt export`: a plan as launcher files."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from hetopt.commands.common import JsonOpt, _print_json, err, out
from hetopt.errors import ExitCode, InputError, Problem
from hetopt.outputs import check_output_directory


def export_plan(
    plan: Annotated[str, typer.Argument(help="Plan JSON file (hetopt solve --out).")],
    instance: Annotated[
        str,
        typer.Option(
            "--instance", help="The instance the plan was planned for (file or bundled name)."
        ),
    ],
    fmt: Annotated[str, typer.Option("--format", help="megatron, deepspeed, torchrun or rankmap.")],
    out_dir: Annotated[
        str, typer.Option("--out", help="Directory to write into (made if missing).")
    ] = ".",
    script: Annotated[
        str, typer.Option("--script", help="The training script torchrun and deepspeed start.")
    ] = "train.py",
    force: Annotated[
        bool, typer.Option("--force", help="Overwrite files --out already holds.")
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """A plan as launcher files: Megatron-LM arguments, a DeepSpeed config, torchrun lines, a rank
    map. Where the launcher cannot run the plan as it is, says which feature blocks it (exit 1) and
    writes the rank map alone."""
    from hetopt.export.files import check_format, export, write_files
    from hetopt.plan import load_plan
    from hetopt.spec.instance import load_instance

    check_format(fmt)  # before any work, as the output directory
    if not script.strip() or script.startswith("-"):
        raise InputError(
            "--script",
            [
                Problem(
                    "--script",
                    "give the training script's path (not empty, not an option), e.g. train.py",
                    script,
                    True,
                )
            ],
        )
    check_output_directory(out_dir, "--out")
    inst = load_instance(instance)
    result = export(inst, load_plan(plan), fmt, source=plan, script=script)
    paths = write_files(result.files, Path(out_dir), force)
    if as_json:
        _print_json({**result.to_json(), "directory": out_dir})
    else:
        out.print(
            f"{result.rankmap.world_size} ranks on {len(result.rankmap.nodes)} nodes, rank "
            f"order {result.rankmap.order}; written: " + ", ".join(str(p) for p in paths)
        )
        for why in result.blocked:
            err.print(f"[yellow]{fmt} cannot run this plan as it is: {why}[/yellow]")
    if result.blocked:
        sys.exit(ExitCode.FAILED)

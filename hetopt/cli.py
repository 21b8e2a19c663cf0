"""The `hetopt` command line (DESIGN 2.4). Thin: parse, call one library function, print.

With ``--json`` a command prints exactly one JSON object on stdout. Bad input exits 2 with a message that
names the file, the key path, the value and the fix; never a traceback.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from typing import Annotated, Any

import typer
from rich.console import Console

from hetopt import __version__
from hetopt.errors import ExitCode, InfeasibleError, InputError

app = typer.Typer(
    name="hetopt",
    help="Exact hybrid-parallel training plans for heterogeneous GPU clusters with dynamic bandwidth.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)
out = Console(soft_wrap=False)
err = Console(stderr=True)

InstanceArg = Annotated[
    str | None,
    typer.Argument(help="Instance file (YAML or JSON) or the name of a bundled instance; default: the demo."),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON object on stdout.")]


def _print_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj, indent=2) + "\n")


def _version(value: bool) -> None:
    if value:
        typer.echo(f"hetopt {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                          help="Print the version and exit.")] = False,
) -> None:
    """hetopt plans how to train a large transformer on GPUs that are not all alike."""


@app.command()
def validate(instance: InstanceArg = None, as_json: JsonOpt = False) -> None:
    """Check an instance and summarise it: GPUs per class, memory, peak compute, model size and FLOPs."""
    from hetopt.report.tables import summary_view
    from hetopt.spec.instance import load_instance
    from hetopt.summary import instance_summary

    summary = instance_summary(load_instance(instance) if instance else _demo())
    if as_json:
        _print_json(summary)
    else:
        out.print(summary_view(summary))
        out.print("[green]valid[/green]")


@app.command()
def schema() -> None:
    """Print the JSON Schema of the instance format."""
    from hetopt.spec.schema import json_schema

    _print_json(json_schema())


@app.command()
def instances(as_json: JsonOpt = False) -> None:
    """List the bundled instances with a one-line description."""
    from rich.table import Table

    from hetopt.spec.instance import bundled_instances, describe

    rows = [{"name": name, "path": str(path), "description": describe(path)}
            for name, path in bundled_instances().items()]
    if as_json:
        _print_json({"instances": rows})
        return
    table = Table(title="Bundled instances (use the name in place of a file path)", title_justify="left")
    table.add_column("name")
    table.add_column("description")
    for r in rows:
        table.add_row(r["name"], r["description"])
    out.print(table)


@app.command()
def gpus(as_json: JsonOpt = False) -> None:
    """Show the GPU catalog with the source of every number."""
    from hetopt.report.tables import gpu_table
    from hetopt.spec.gpus import CATALOG

    if as_json:
        _print_json({"gpus": [asdict(g) for g in CATALOG.values()]})
    else:
        out.print(gpu_table(CATALOG))


@app.command()
def presets(as_json: JsonOpt = False) -> None:
    """Show the model presets with their sources."""
    from hetopt.report.tables import preset_table
    from hetopt.spec.presets import PRESETS

    if as_json:
        _print_json({"presets": [asdict(m) for m in PRESETS.values()]})
    else:
        out.print(preset_table(PRESETS))


def _demo():
    from hetopt.spec.instance import DEMO_INSTANCE, load_instance

    return load_instance(DEMO_INSTANCE)


def main(argv: list[str] | None = None) -> None:
    """Console entry point: maps user errors to exit codes instead of tracebacks."""
    try:
        app(args=argv, prog_name="hetopt")
    except InputError as exc:
        err.print(exc.render(), markup=False, highlight=False, soft_wrap=True)
        sys.exit(ExitCode.BAD_INPUT)
    except InfeasibleError as exc:
        err.print(f"infeasible: {exc}", markup=False, highlight=False, soft_wrap=True)
        sys.exit(ExitCode.FAILED)

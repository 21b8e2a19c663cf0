"""The `hetopt` command line (docs/cli-output.md). Thin: parse, call one library function, print.

With ``--json`` a command prints exactly one JSON object on stdout. Bad input exits 2 with a message
that names the file, the key path, the value and the fix; never a traceback.
"""

from __future__ import annotations

import functools
import os
import sys
import traceback
from pathlib import Path
from typing import Annotated

import typer

try:  # typer carries its own click from 0.20 on; before, it runs on click's
    from typer._click import exceptions as cli_errors
    from typer._click.utils import echo
except ImportError:  # pragma: no cover - older typer
    from click import echo
    from click import exceptions as cli_errors

from hetopt import __version__
from hetopt.commands import bench, calibrate, catalog, launch, pareto, plan, replay
from hetopt.commands.common import err
from hetopt.errors import (
    ExitCode,
    InfeasibleError,
    InputError,
    Problem,
)
from hetopt.lifeline import EXIT_SIGTERM, Terminated, owner_signals

app = typer.Typer(
    name="hetopt",
    help="Exact hybrid-parallel training plans for heterogeneous GPU clusters with dynamic "
    "bandwidth.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"hetopt {__version__}")
        raise typer.Exit()


DEBUG = {"on": bool(os.environ.get("HETOPT_DEBUG"))}
"""--debug (or HETOPT_DEBUG=1): an internal error prints its traceback."""


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_version, is_eager=True, help="Print the version and exit."
        ),
    ] = False,
    debug: Annotated[
        bool,
        typer.Option(
            "--debug",
            help="On an internal error (exit 3), print the traceback (also HETOPT_DEBUG=1).",
        ),
    ] = False,
) -> None:
    """hetopt plans how to train a large transformer on GPUs that are not all alike."""
    DEBUG["on"] = DEBUG["on"] or debug


# the commands, in the order `hetopt --help` lists them
app.command()(plan.solve)
app.command(name="formulations")(catalog.list_formulations)
app.command()(catalog.backends)
app.command()(catalog.validate)
app.command()(catalog.schema)
app.command()(catalog.instances)
app.command()(catalog.gpus)
app.command()(catalog.presets)
app.command()(plan.evaluate)
app.command()(replay.simulate)
app.command(name="export")(launch.export_plan)
app.command()(replay.replan)
app.command()(calibrate.calibrate)
app.command()(bench.bench)
app.command()(pareto.pareto)


@functools.cache
def _command():
    """The click command typer builds from `app`, built once per process (`app(...)` builds it
    anew on every call)."""
    return typer.main.get_command(app)


def _signalled(exc: BaseException, kind: type[BaseException]) -> bool:
    """Whether `exc` was caused by (or raised while handling) a `kind`: a signal's exception raised
    in a handler while C code ran comes back wrapped ("SystemError: … returned a result with an
    exception set")."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, kind):
            return True
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return False


def repeated_option(args: list[str]) -> InputError | None:
    """An option that takes one value given more than once (`--time-limit 5 --time-limit 10`:
    click would keep the last in silence), as bad input; None where there is none. Options that
    may repeat (`--bandwidth`, `--profile`) are not counted."""
    group = _command()
    name = next((a for a in args if a in getattr(group, "commands", {})), None)
    if name is None:
        return None
    params = group.commands[name].params
    single = {
        opt: param
        for param in params
        if param.param_type_name == "option" and not param.multiple
        for opt in (*param.opts, *param.secondary_opts)
    }
    given: dict[str, list[str]] = {}
    rest = args[args.index(name) + 1 :]
    for i, arg in enumerate(rest):
        if arg == "--":
            break
        param = single.get(arg.split("=", 1)[0])
        if param is not None:
            takes_value = not getattr(param, "is_flag", False) and "=" not in arg
            value = rest[i + 1] if takes_value and i + 1 < len(rest) else None
            given.setdefault(param.name, []).append(arg if value is None else f"{arg} {value}")
    for uses in given.values():
        if len(uses) > 1:
            option = uses[0].split("=", 1)[0].split(" ", 1)[0]
            return InputError(
                option,
                [
                    Problem(
                        option,
                        f"given {len(uses)} times; give it once (the value to use)",
                        " ".join(uses),
                        True,
                    )
                ],
            )
    return None


def usage_error(exc: cli_errors.UsageError) -> str:
    """A command-line mistake click found (an option's value, an unknown option, a missing
    argument) in hetopt's words: ``error: OPTION: what is wrong; see `hetopt CMD --help```."""
    command = exc.ctx.command_path if exc.ctx else "hetopt"
    see = f"see `{command} --help`"
    param = getattr(exc, "param", None)
    if isinstance(exc, cli_errors.BadParameter) and param is not None and exc.message:
        name = param.opts[0] if getattr(param, "opts", None) else param.human_readable_name
        message = exc.message.rstrip(".")
        return f"error: {name}: {message}; {see}"
    message = " ".join(exc.format_message().split()).rstrip(".")
    return f"error: {command}: {message}; {see}"


def main(argv: list[str] | None = None) -> None:
    """Console entry point: maps user errors to exit codes instead of tracebacks; SIGTERM ends the
    command like Ctrl-C (its workers stopped, nothing half-written) with exit 143
    (hetopt.lifeline)."""
    try:
        repeated = repeated_option(list(sys.argv[1:] if argv is None else argv))
        if repeated is not None:
            raise repeated
        with owner_signals():
            # not standalone: click's own errors come back here, to be told in hetopt's words
            code = _command().main(args=argv, prog_name="hetopt", standalone_mode=False)
        sys.exit(code if isinstance(code, int) else 0)
    except getattr(cli_errors, "NoArgsIsHelpError", ()) as exc:  # `hetopt` alone: the help
        echo(exc.format_message(), err=True)
        sys.exit(ExitCode.BAD_INPUT)
    except cli_errors.UsageError as exc:
        err.print(usage_error(exc), markup=False, highlight=False, soft_wrap=True)
        sys.exit(ExitCode.BAD_INPUT)
    except cli_errors.ClickException as exc:
        err.print(f"error: {exc.format_message()}", markup=False, highlight=False, soft_wrap=True)
        sys.exit(ExitCode.BAD_INPUT)
    except typer.Abort:  # end of input at a prompt
        err.print("aborted", markup=False, highlight=False)
        sys.exit(ExitCode.FAILED)
    except Terminated:
        err.print(
            "terminated (SIGTERM): stopped with its worker processes", markup=False, highlight=False
        )
        sys.exit(EXIT_SIGTERM)
    except InputError as exc:
        err.print(exc.render(), markup=False, highlight=False, soft_wrap=True)
        sys.exit(ExitCode.BAD_INPUT)
    except InfeasibleError as exc:
        err.print(f"infeasible: {exc}", markup=False, highlight=False, soft_wrap=True)
        sys.exit(ExitCode.FAILED)
    except Exception as exc:  # a fault in hetopt, not an answer (1) and not the user's input (2)
        # SIGTERM inside C code (a Ray call) surfaces as its SystemError
        if _signalled(exc, Terminated):
            err.print(
                "terminated (SIGTERM): stopped with its worker processes",
                markup=False,
                highlight=False,
            )
            sys.exit(EXIT_SIGTERM)
        if DEBUG["on"]:
            traceback.print_exc()
        where = traceback.extract_tb(exc.__traceback__)[-1] if exc.__traceback__ else None
        at = f" at {Path(where.filename).name}:{where.lineno}" if where else ""
        err.print(
            f"internal error: {type(exc).__name__}{at}: {exc}. This is a bug in hetopt "
            f"{__version__}: rerun with --debug for the traceback and report it with the command "
            "and its input files.",
            markup=False,
            highlight=False,
            soft_wrap=True,
        )
        sys.exit(ExitCode.INTERNAL)

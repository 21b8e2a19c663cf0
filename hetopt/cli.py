"""The `hetopt` command line (DESIGN 2.4). Thin: parse, call one library function, print.

With ``--json`` a command prints exactly one JSON object on stdout. Bad input exits 2 with a message
that names the file, the key path, the value and the fix; never a traceback.
"""

from __future__ import annotations

import functools
import json
import math
import os
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from hetopt import __version__
from hetopt.errors import (
    ExitCode,
    InfeasibleError,
    InputError,
    Problem,
    check_time_limit,
    did_you_mean,
    require_columns,
)
from hetopt.lifeline import EXIT_SIGTERM, Terminated, owner_signals
from hetopt.outputs import PLOT_SUFFIXES, check_output, check_output_directory, write_text
from hetopt.progress import Progress
from hetopt.report.tables import narrow_table

app = typer.Typer(
    name="hetopt",
    help="Exact hybrid-parallel training plans for heterogeneous GPU clusters with dynamic "
    "bandwidth.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)
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


def _print_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj, indent=2) + "\n")


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


@app.command()
def solve(
    instance: InstanceArg = None,
    planner: Annotated[
        str,
        typer.Option(
            "--planner",
            help="ilp (exact), exhaustive (small instances), or a heuristic without proof: "
            "megatron, fastest-subset, proportional, amp-like, metis-like, random.",
        ),
    ] = "ilp",
    formulation: Annotated[
        str | None, typer.Option("--formulation", help="See `hetopt formulations`.")
    ] = None,
    backend: Annotated[str, typer.Option("--backend", help="cpsat, cbc or highs.")] = "highs",
    time_limit: Annotated[
        float,
        typer.Option(
            "--time-limit",
            help="Seconds for the whole command: the search, then placing, verifying and "
            "replaying the plan (a tenth of it, at most 10 s).",
        ),
    ] = 60.0,
    objective: Annotated[
        str,
        typer.Option(
            "--objective",
            help="stable, expected, worst or cvar over the instance's bandwidth scenarios.",
        ),
    ] = "stable",
    seed: Annotated[int, typer.Option("--seed", help="Solver random seed.")] = 0,
    out_path: Annotated[str | None, typer.Option("--out", help="Write the plan JSON here.")] = None,
    export_model: Annotated[
        str | None,
        typer.Option(
            "--export-model",
            help="Write the best skeleton's model (.lp/.mps for PuLP, .pb.txt for CP-SAT).",
        ),
    ] = None,
    force: Annotated[
        bool, typer.Option("--force", help="Overwrite --out / --export-model files.")
    ] = False,
    no_warm_start: Annotated[
        bool,
        typer.Option(
            "--no-warm-start", help="Do not start from heuristic plans (amp-like, proportional)."
        ),
    ] = False,
    executor: ExecutorOpt = "process",
    address: AddressOpt = None,
    memory_headroom: HeadroomOpt = None,
    runnable: Annotated[
        str | None,
        typer.Option(
            "--runnable",
            help="megatron or deepspeed: only plans that launcher runs as they are (then the "
            "free space too, for the cost).",
        ),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Find the fastest plan with a proven bound, verify it, and replay it under every scenario."""
    import json as _json

    from hetopt.report.tables import solve_view
    from hetopt.solve import solve as run_solve
    from hetopt.spec.instance import load_instance, with_memory_headroom

    check_time_limit(time_limit)
    if out_path:
        check_output(out_path, "--out", force)
    if export_model:
        check_output(
            export_model,
            "--export-model",
            force,
            MODEL_SUFFIXES["cp-sat" if backend == "cpsat" else "pulp"],
        )
    inst = with_memory_headroom(load_instance(instance) if instance else _demo(), memory_headroom)
    with Progress(err, f"planning {inst.name} ({inst.cluster.total_gpus} GPUs)…") as status:

        def progress(solved: int, incumbent: float) -> None:
            best = f"best so far {incumbent:.3f} s" if incumbent < float("inf") else "no plan yet"
            status.update(f"planning {inst.name}: {solved} skeletons solved, {best}", step=False)

        try:
            result = run_solve(
                inst,
                planner,
                formulation,
                backend,
                time_limit,
                objective,
                seed,
                export_model,
                progress=progress,
                warm_start=not no_warm_start,
                executor=executor,
                address=address,
                replay_progress=_replay_progress(status),
                runnable=runnable,
            )
        except (KeyboardInterrupt, Terminated) as stop:
            status.stop()
            _keep_best_so_far(inst, getattr(stop, "best_so_far", None), out_path)
            raise
    if out_path and result["plan"] is not None:
        write_text(out_path, _json.dumps(result["plan"], indent=2) + "\n")
    if as_json:
        _print_json(result)
    else:
        out.print(solve_view(inst, result))
        if runnable and result.get("runnable"):
            r = result["runnable"]
            free = (
                f"{r['free_objective_s']:.4f} s ({r['free_status']})"
                if r["free_objective_s"]
                else "none found"
            )
            cost = f", {r['cost']:+.1%}" if r["cost"] is not None else ""
            out.print(f"runnable by {runnable} as it is; the free space's best: {free}{cost}")
        if out_path and result["plan"] is not None:
            out.print(f"plan written to {out_path}")
    if result["plan"] is None:
        if not as_json:
            err.print(
                f"{result['status']}: "
                f"{result.get('reason', 'no plan found within the time limit')}",
                markup=False,
                highlight=False,
                soft_wrap=True,
            )
        sys.exit(ExitCode.FAILED)


def _replay_progress(status: Progress) -> Callable[[int, int], None]:
    def tell(done: int, total: int) -> None:
        status.update(f"simulating: {done} of {total} scenarios replayed")

    return tell


def _keep_best_so_far(inst, best, out_path: str | None) -> None:
    """Ctrl-C or SIGTERM during `solve`: write the best plan found so far to --out (verified, not
    simulated) and say so with its gap; without --out, say what was found."""
    import json as _json

    from hetopt.plan import plan_json
    from hetopt.solve import finished_plan

    if best is None or best.plan is None:
        err.print("interrupted before any plan was found", markup=False, highlight=False)
        return
    gap = f"gap {best.gap:.2%} proven" if math.isfinite(best.gap) else "no bound proven"
    found = f"the best plan so far: {best.objective_s:.3f} s, {gap}"
    if out_path is None:
        err.print(
            f"interrupted: {found}; pass --out to keep it",
            markup=False,
            highlight=False,
            soft_wrap=True,
        )
        return
    write_text(out_path, _json.dumps(plan_json(finished_plan(inst, best.plan)), indent=2) + "\n")
    err.print(
        f"interrupted: {found}, written to {out_path} (verified, not simulated)",
        markup=False,
        highlight=False,
        soft_wrap=True,
    )


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


@app.command(name="formulations")
def list_formulations(as_json: JsonOpt = False) -> None:
    """List the plan formulations (plug-ins in formulations/) and the backends each is written
    for."""
    from hetopt.search.dispatch import formulations as found

    rows = [
        {"name": f.name, "backends": list(f.backends), "summary": f.summary}
        for f in found().values()
    ]
    _listing(
        "formulations",
        "Formulations",
        rows,
        [
            ("name", lambda r: r["name"]),
            ("backends", lambda r: ", ".join(r["backends"])),
            ("summary", lambda r: r["summary"]),
        ],
        as_json,
    )


@app.command()
def backends(as_json: JsonOpt = False) -> None:
    """List the solver backends and whether each can be used here."""
    from hetopt.search.formulation import BACKENDS, backend_available

    rows = [
        {"name": name, "usable": ok, "what": what, "detail": why}
        for name, (_, what) in BACKENDS.items()
        for ok, why in [backend_available(name)]
    ]
    _listing(
        "backends",
        "Solver backends",
        rows,
        [
            ("backend", lambda r: r["name"]),
            (
                "usable",
                lambda r: "[green]yes[/green]" if r["usable"] else f"[red]no[/red] ({r['detail']})",
            ),
            ("what", lambda r: r["what"]),
        ],
        as_json,
    )


@app.command()
def validate(instance: InstanceArg = None, as_json: JsonOpt = False) -> None:
    """Check an instance and summarise it: GPUs per class, memory, peak compute, model size and
    FLOPs."""
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
    from hetopt.spec.instance import bundled_instances, describe

    rows = [
        {"name": name, "path": str(path), "description": describe(path)}
        for name, path in bundled_instances().items()
    ]
    _listing(
        "instances",
        "Bundled instances (use the name in place of a file path)",
        rows,
        [("name", lambda r: r["name"]), ("description", lambda r: r["description"])],
        as_json,
    )


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


@app.command()
def evaluate(
    instance: Annotated[str, typer.Argument(help="Instance file or bundled instance name.")],
    plan: Annotated[str | None, typer.Option("--plan", help="Plan JSON file (DESIGN 2.3).")] = None,
    layout: Annotated[
        str | None, typer.Option("--layout", help="Layout shorthand, e.g. tp=2,pp=4,dp=4.")
    ] = None,
    layouts: Annotated[
        str | None, typer.Option("--layouts", help="File with one layout per line.")
    ] = None,
    profile: Annotated[
        list[str] | None, typer.Option("--profile", help="Extra calibration profile JSON.")
    ] = None,
    memory_headroom: HeadroomOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Analytic iteration time and memory of a plan, a layout, or a file of layouts."""
    from hetopt.cost.profiles import Profiles, load_profile_file
    from hetopt.evaluate import evaluate as run_evaluate
    from hetopt.layout import expand_layout, parse_layout
    from hetopt.plan import load_plan
    from hetopt.report.tables import evaluation_view
    from hetopt.spec.instance import load_instance, with_memory_headroom

    given = [
        name for name, v in (("--plan", plan), ("--layout", layout), ("--layouts", layouts)) if v
    ]
    if len(given) != 1:
        raise InputError(
            "evaluate",
            [Problem("options", "give exactly one of --plan, --layout, --layouts", given, True)],
        )
    inst = with_memory_headroom(load_instance(instance), memory_headroom)
    profiles = Profiles([load_profile_file(p) for p in profile or []])
    if layouts is not None:
        results = _evaluate_layouts(inst, layouts, profiles)
        if as_json:
            _print_json({"results": results})
        else:
            out.print(evaluation_view(results))
        if results and all("error" in r for r in results):
            sys.exit(ExitCode.BAD_INPUT)
        return
    if plan is not None:
        the_plan, source = load_plan(plan), plan
    else:
        the_plan, source = expand_layout(inst, parse_layout(layout)), f"layout {layout!r}"
    result = run_evaluate(inst, the_plan, profiles, source=source).to_json()
    if as_json:
        _print_json(result)
    else:
        out.print(evaluation_view([{"layout": layout or plan, **result}]))


@app.command()
def simulate(
    instance: Annotated[str, typer.Argument(help="Instance file or bundled instance name.")],
    plan: Annotated[str | None, typer.Option("--plan", help="Plan JSON file (DESIGN 2.3).")] = None,
    layout: Annotated[str | None, typer.Option("--layout", help="Or a layout shorthand.")] = None,
    scenario: Annotated[str, typer.Option("--scenario", help="A scenario name, or all.")] = "all",
    iterations: Annotated[
        int | None,
        typer.Option(
            "--iterations",
            min=1,
            max=MAX_ITERATIONS,
            help="Iterations back to back. Default: the instance's horizon (search.horizon_s, "
            "60 s) — iterations start until it is reached.",
        ),
    ] = None,
    time_limit: Annotated[
        float,
        typer.Option(
            "--time-limit",
            help="Seconds: no iteration starts after them (each scenario replays at least one), "
            "nor a search of the adaptive policy.",
        ),
    ] = 300.0,
    trace: Annotated[
        str | None, typer.Option("--trace", help="Write a Chrome/Perfetto trace JSON here.")
    ] = None,
    plot: Annotated[str | None, typer.Option("--plot", help="Write a timeline PNG here.")] = None,
    force: Annotated[bool, typer.Option("--force", help="Overwrite --trace/--plot files.")] = False,
    profile: Annotated[
        list[str] | None, typer.Option("--profile", help="Extra calibration profile JSON.")
    ] = None,
    memory_headroom: HeadroomOpt = None,
    policy: Annotated[
        str,
        typer.Option(
            "--policy",
            help="static (the plan throughout) or replan (re-plan at each bandwidth change "
            "seen, paying each switch).",
        ),
    ] = "static",
    detection_delay: Annotated[
        float | None,
        typer.Option(
            "--detection-delay",
            min=0,
            help="With --policy replan: seconds before a change is seen (default: the "
            "instance's replan.detection_delay_s, 0).",
        ),
    ] = None,
    restart: Annotated[
        float | None,
        typer.Option(
            "--restart",
            min=0,
            help="With --policy replan: seconds a switch costs beside the migration (default: "
            "the instance's replan.restart_s, 0).",
        ),
    ] = None,
    dwell: Annotated[
        float | None,
        typer.Option(
            "--dwell",
            min=0,
            help="With --policy replan: seconds a new bandwidth is expected to last (default: "
            "the instance's replan.dwell_s, else from the scenario).",
        ),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Discrete-event replay of a plan under the instance's bandwidth scenarios; with --policy
    replan, the adaptive policy that re-plans when the bandwidth changes."""

    from hetopt.cost.profiles import Profiles, load_profile_file
    from hetopt.layout import expand_layout, parse_layout
    from hetopt.plan import load_plan
    from hetopt.replan.policy import PolicyOptions, check_policy
    from hetopt.report.tables import simulation_view
    from hetopt.sim.trace import plot_timeline, write_trace
    from hetopt.simulate import simulate as run_simulate
    from hetopt.spec.instance import load_instance, with_memory_headroom

    if (plan is None) == (layout is None):
        raise InputError("simulate", [Problem("options", "give exactly one of --plan or --layout")])
    check_time_limit(time_limit)
    if trace:
        check_output(trace, "--trace", force)
    if plot:
        check_output(plot, "--plot", force, PLOT_SUFFIXES)
    inst = with_memory_headroom(load_instance(instance), memory_headroom)
    the_plan = load_plan(plan) if plan is not None else expand_layout(inst, parse_layout(layout))
    profiles = Profiles([load_profile_file(p) for p in profile or []])
    given = {"detection_delay_s": detection_delay, "restart_s": restart, "dwell_s": dwell}
    if check_policy(policy) != "replan" and any(v is not None for v in given.values()):
        raise InputError(
            "simulate",
            [
                Problem(
                    "--policy",
                    "--detection-delay, --restart and --dwell set the adaptive policy: add "
                    "--policy replan",
                    policy,
                    True,
                )
            ],
        )
    for option, value, zero_ok in (
        ("--detection-delay", detection_delay, True),
        ("--restart", restart, True),
        ("--dwell", dwell, False),
    ):
        if value is not None and not (
            math.isfinite(value) and (value >= 0 if zero_ok else value > 0)
        ):
            bound = "0 or more" if zero_ok else "above 0"
            raise InputError(
                option, [Problem(option, f"give finite seconds, {bound}", value, True)]
            )
    options = PolicyOptions.of(inst, **given) if policy == "replan" else None
    with Progress(err, f"simulating {inst.name}…") as status:
        result, records = run_simulate(
            inst,
            the_plan,
            scenario,
            iterations,
            profiles,
            keep_records=bool(trace or plot),
            deadline=time.time() + time_limit,
            progress=_replay_progress(status),
            policy=policy,
            policy_options=options,
        )
    switches = result["scenarios"][0].get("switches", [])
    if trace:
        write_trace(records, Path(trace), switches)
    if plot:
        plot_timeline(
            records, Path(plot), title=f"{inst.name}: {layout or plan}", switches=switches
        )
    if as_json:
        _print_json(result)
    else:
        out.print(simulation_view(result))
        for what, target in (("trace", trace), ("timeline", plot)):
            if target:
                out.print(f"{what} written to {target}")


@app.command(name="export")
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


@app.command()
def replan(
    instance: Annotated[str, typer.Argument(help="Instance file or bundled instance name.")],
    plan: Annotated[str, typer.Option("--plan", help="The plan running now (JSON).")],
    scenario: Annotated[
        str | None, typer.Option("--scenario", help="A scenario of the instance...")
    ] = None,
    at: Annotated[
        float | None, typer.Option("--at", help="...and the moment in it, seconds.")
    ] = None,
    bandwidth: Annotated[
        list[str] | None,
        typer.Option("--bandwidth", help="Or links set by hand: ISLAND-ISLAND=GBPS (repeatable)."),
    ] = None,
    dwell: Annotated[
        float | None,
        typer.Option(
            "--dwell",
            help="Seconds the new bandwidth lasts (default: the instance's replan.dwell_s, else "
            "until the scenario's next change, else the horizon).",
        ),
    ] = None,
    restart: Annotated[
        float | None,
        typer.Option(
            "--restart",
            help="Seconds a restart costs beside the migration (default: the instance's "
            "replan.restart_s, 0).",
        ),
    ] = None,
    full: Annotated[
        bool, typer.Option("--full", help="Also search the whole space after the neighbourhood.")
    ] = False,
    time_limit: Annotated[
        float, typer.Option("--time-limit", help="Seconds for the searches together.")
    ] = 10.0,
    out_path: Annotated[
        str | None, typer.Option("--out", help="Write the best plan's JSON here.")
    ] = None,
    force: Annotated[bool, typer.Option("--force", help="Overwrite --out.")] = False,
    as_json: JsonOpt = False,
) -> None:
    """The best plan under a changed network, warm-started from the running one: switch or stay,
    with the migration cost and the break-even time."""
    import json as _json

    from hetopt.plan import load_plan, plan_json
    from hetopt.replan.decide import parse_bandwidth
    from hetopt.replan.decide import replan as run_replan
    from hetopt.spec.instance import load_instance

    check_time_limit(time_limit)
    if out_path:
        check_output(out_path, "--out", force)
    inst = load_instance(instance)
    result = run_replan(
        inst,
        load_plan(plan),
        scenario=scenario,
        at_s=at,
        bandwidth=parse_bandwidth(inst, bandwidth) if bandwidth else None,
        dwell_s=dwell,
        restart_s=restart,
        full=full,
        time_limit_s=time_limit,
        source=plan,
    )
    if out_path:
        write_text(out_path, _json.dumps(plan_json(result.plan), indent=2) + "\n")
    if as_json:
        _print_json(result.to_json())
        return
    even = f"{result.break_even_s:.1f} s" if math.isfinite(result.break_even_s) else "never"
    out.print(
        f"{result.decision}: running plan {result.current_s:.4f} s per iteration on the changed "
        f"network, best found ({result.found_by}) {result.new_s:.4f} s; switching moves "
        f"{result.migration.total_bytes / 1e9:.2f} GB in {result.migration.time_s:.2f} s "
        f"(+{result.restart_s:g} s restart), paid back after {even} of the new bandwidth, expected "
        f"to last {result.dwell_s:.1f} s"
    )


def _evaluate_layouts(inst, path: str, profiles) -> list[dict]:
    """One result per layout line, in order; an invalid line gets an `error` entry and the sweep
    goes on."""

    from hetopt.evaluate import evaluate as run_evaluate
    from hetopt.layout import expand_layout, parse_layout

    file = Path(path)
    if not file.is_file():
        raise InputError(
            path, [Problem("", "layouts file does not exist; write one layout shorthand per line")]
        )
    results = []
    for n, line in enumerate(file.read_text(encoding="utf-8").splitlines(), start=1):
        text = line.split("#", 1)[0].strip()
        if not text:
            continue
        try:
            plan = expand_layout(
                inst, parse_layout(text, source=f"{path}:{n}"), source=f"{path}:{n}"
            )
            results.append(
                {
                    "layout": text,
                    **run_evaluate(inst, plan, profiles, source=f"{path}:{n}").to_json(),
                }
            )
        except InputError as exc:
            err.print(exc.render(), markup=False, highlight=False, soft_wrap=True)
            results.append({"layout": text, "error": exc.render()})
    return results


@app.command()
def calibrate(
    data: Annotated[
        list[str] | None, typer.Argument(help="CSV files of measured runs or layer times.")
    ] = None,
    gpu: Annotated[
        str, typer.Option("--gpu", help="GPU type the measurements were taken on.")
    ] = "A100-80GB",
    out_path: Annotated[
        str | None, typer.Option("--out", help="Write the fitted profile (JSON) here.")
    ] = None,
    force: Annotated[bool, typer.Option("--force", help="Overwrite --out if it exists.")] = False,
    folds: Annotated[int, typer.Option("--folds", min=2, help="Cross-validation folds.")] = 5,
    measure: Annotated[
        bool,
        typer.Option(
            "--measure",
            help="Time GEMMs, attention and a transformer block with PyTorch on this machine "
            "instead.",
        ),
    ] = False,
    device: Annotated[str, typer.Option("--device", help="With --measure: cuda or cpu.")] = "cuda",
    tiny: Annotated[
        bool, typer.Option("--tiny", help="With --measure: a tiny model (tests, CPU).")
    ] = False,
    gemm: Annotated[
        str | None,
        typer.Option(
            "--gemm",
            help="Fit the GEMM efficiency curve of every catalog type on this CSV (columns of "
            "gemm_achieved.csv); --out is then a directory for one profile per type.",
        ),
    ] = None,
    fabrics_csv: Annotated[
        str | None,
        typer.Option(
            "--fabrics", help="Fit the fabric table (η, α per fabric) to a collectives CSV instead."
        ),
    ] = None,
    runs_csv: Annotated[
        list[str] | None,
        typer.Option(
            "--runs",
            help="Report accuracy on end-to-end training runs (columns of training_throughput_"
            "non_a100.csv), per GPU type and source, with leave-one-source-out; fits the framework "
            "stacks (--out: write them).",
        ),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Fit cost parameters of a GPU type to measurements (with a cross-validated report), or measure
    them."""

    if runs_csv:
        _calibrate_runs(runs_csv, out_path, force, as_json)
        return
    if fabrics_csv is not None:
        from hetopt.calibrate.fabrics import calibrate_cli

        calibrate_cli(fabrics_csv, out_path, force, as_json, out)
        return

    from hetopt.cost.terms import CostParams
    from hetopt.report.tables import calibration_view
    from hetopt.spec.gpus import CATALOG

    target = Path(out_path) if out_path else None
    if gemm is not None:
        _calibrate_gemm(gemm, target, force, as_json)
        return
    if target is not None:
        check_output(target, "--out", force)
    if gpu not in CATALOG:
        raise InputError(
            "calibrate",
            [Problem("--gpu", f"unknown GPU type{did_you_mean(gpu, CATALOG)}", gpu, True)],
        )
    if measure:
        from hetopt.calibrate.measure import measure_profile

        params: CostParams = measure_profile(gpu=gpu, device=device, tiny=tiny, progress=err)
    else:
        if not data:
            raise InputError(
                "calibrate", [Problem("DATA", "give one or more CSV files, or --measure")]
            )
        from hetopt.calibrate.layouts import calibrate as fit

        with Progress(err, f"calibrating {gpu} on {len(data)} file(s)…") as status:
            params = fit(data, gpu, folds=folds, progress=status.update)
    if target is not None:
        params.save(target)
    if as_json:
        _print_json(params.to_json())
    else:
        out.print(calibration_view(params))
        if target is not None:
            out.print(f"profile written to {target}")


RUN_COLUMNS = {
    "gpu",
    "num_gpus",
    "gpus_per_node",
    "model",
    "seq_len",
    "micro_batch",
    "tp",
    "pp",
    "dp",
    "source",
}
"""Columns an end-to-end runs CSV must have (hetopt.calibrate.runs reads more where present)."""


def _calibrate_runs(paths: list[str], out_path: str | None, force: bool, as_json: bool) -> None:

    from hetopt.calibrate.accuracy import fit_report, fit_stacks, load_runs, stack_fit
    from hetopt.calibrate.stacks import save_stacks
    from hetopt.cost.profiles import Profiles

    for path in paths:
        if not Path(path).is_file():
            raise InputError(path, [Problem("--runs", "file does not exist", path, True)])
        require_columns(
            path,
            RUN_COLUMNS,
            "an end-to-end runs CSV (the columns of data/calibration/"
            "public/training_throughput_non_a100.csv)",
        )
    target = Path(out_path) if out_path else None
    if target is not None and target.is_dir():
        raise InputError(
            str(target),
            [
                Problem(
                    "--out",
                    "is a directory; with --runs, --out is the stack table file (stacks.json)",
                    str(target),
                    True,
                )
            ],
        )
    if target is not None:
        check_output(target, "--out", force)
    with Progress(
        err, f"calibrating: fitting the framework stacks on {len(paths)} runs file(s)…"
    ) as status:
        stacks = fit_stacks(load_runs(paths))
        status.update("calibrating: predicting every run, leaving each source out in turn")
        report = fit_report(paths, fit=stack_fit, profiles=Profiles(stacks=stacks))
    report["stacks"] = {name: s.to_json() for name, s in stacks.items()}
    if target is not None:
        save_stacks(stacks, target, [Path(p).name for p in paths])
    if as_json:
        _print_json({**report, "out": str(target) if target else None})
        return
    view = narrow_table(
        f"End-to-end runs: {report['expressed']} of {report['rows']} expressed; error = "
        "predicted / measured − 1"
    )
    for col in ("GPU type", "rows", "MAPE", "median pred/meas", "Spearman", "LOSO MAPE", "≤ 15%"):
        view.add_column(col)
    for gpu, s in report["per_gpu"].items():
        held = report["loso_per_gpu"].get(gpu, {})
        verdict = report["acceptance"].get(gpu, {}).get("passes")
        view.add_row(
            gpu,
            str(s["rows"]),
            f"{s['mape']:.1%}",
            f"{s['median_ratio']:.3f}",
            f"{s['spearman']:.3f}" if s.get("spearman") is not None else "–",
            f"{held['mape']:.1%}" if "mape" in held else "–",
            {True: "yes", False: "no", None: "n/a"}[verdict],
        )
    out.print(view)
    for name, st in stacks.items():
        fitted = (
            f"fitted on {st.fit['rows']} rows, MAPE {st.fit['mape']:.1%}"
            if st.fit.get("rows")
            else st.source
        )
        out.print(f"stack {name}: device compute at {st.compute_efficiency:.3f} ({fitted})")
    if report["note"]:
        out.print(report["note"])
    if target is not None:
        out.print(f"stack table written to {target}")
    out.print("not expressed: " + ", ".join(f"{k} {v}" for k, v in report["not_expressed"].items()))


def _calibrate_gemm(path: str, target, force: bool, as_json: bool) -> None:
    from hetopt.calibrate.gemm import run_calibrate_gemm

    if target is not None and target.exists() and not target.is_dir():
        raise InputError(
            str(target),
            [
                Problem(
                    "--out",
                    "with --gemm, --out is a directory (one profile per GPU type)",
                    str(target),
                    True,
                )
            ],
        )
    if target is not None and target.exists() and any(target.glob("*.json")) and not force:
        raise InputError(
            str(target),
            [Problem("--out", "holds profiles; pass --force to overwrite them", str(target), True)],
        )
    if target is not None:
        check_output_directory(target, "--out")
    with Progress(
        err, f"calibrating: fitting the GEMM efficiency of every catalog type on {path}…"
    ):
        table, _ = run_calibrate_gemm(path, target)
    if as_json:
        _print_json({"gemm_fit": table, "out": str(target) if target else None})
        return
    view = narrow_table("GEMM curve per GPU type: achieved = peak·η·F/(F + t_kernel·peak·η)")
    for col in (
        "type",
        "family",
        "rows",
        "excl.",
        "η",
        "t_k µs",
        "mean err",
        "max err",
        "LOSO max",
        "t_k from",
    ):
        view.add_column(col)
    for r in table:
        loso = "" if r["loso_max_error"] is None else f"{r['loso_max_error']:.1%}"
        view.add_row(
            r["gpu"],
            r["family"],
            str(r["rows"]),
            str(r["excluded"]),
            f"{r['eta']:.3f}",
            f"{r['t_kernel_us']:.1f}",
            f"{r['mean_error']:.1%}",
            f"{r['max_error']:.1%}",
            loso,
            r["kernel_from"],
        )
    out.print(view)
    if target is not None:
        out.print(f"profiles written to {target}")


@app.command()
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
) -> None:
    """Run planners side by side, replay every plan in the simulator, write CSV, Markdown and
    plots."""

    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from hetopt.bench import check_outputs, check_planners, run_bench, write_outputs
    from hetopt.executors import check_executor
    from hetopt.planners import PLANNERS
    from hetopt.spec.instance import bundled_instances, load_instance, with_memory_headroom

    check_time_limit(time_limit)
    chosen = (
        list(PLANNERS)
        if planners == "all"
        else check_planners([p.strip() for p in planners.split(",")])
    )
    names = instance_names or list(bundled_instances())
    check_outputs(
        Path(out_dir), force
    )  # before any work: nothing a user has is overwritten without --force
    check_executor(executor, address)
    insts = [with_memory_headroom(load_instance(n), memory_headroom) for n in names]
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


MODEL_SUFFIXES = {"pulp": (".lp", ".mps"), "cp-sat": (".pb.txt", ".pb")}
"""What --export-model writes: PuLP's LP or MPS text, or CP-SAT's model proto (text or binary)."""


def _demo():
    from hetopt.spec.instance import DEMO_INSTANCE, load_instance

    return load_instance(DEMO_INSTANCE)


@functools.cache
def _command():
    """The click command typer builds from `app` (what `app(...)` builds anew on every call: 23
    ms)."""
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


def main(argv: list[str] | None = None) -> None:
    """Console entry point: maps user errors to exit codes instead of tracebacks; SIGTERM ends the
    command like Ctrl-C (its workers stopped, nothing half-written) with exit 143
    (hetopt.lifeline)."""
    try:
        with owner_signals():
            _command()(args=argv, prog_name="hetopt")
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
        if _signalled(
            exc, Terminated
        ):  # SIGTERM inside C code (a Ray call) surfaces as its SystemError
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

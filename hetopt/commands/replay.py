"""`hetopt simulate` and `hetopt replan`: replay a plan under the scenarios, re-plan on a changed
network."""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Annotated

import typer

from hetopt.commands.common import (
    MAX_ITERATIONS,
    HeadroomOpt,
    JsonOpt,
    RentOpt,
    _print_json,
    _replay_progress,
    err,
    out,
)
from hetopt.errors import (
    InputError,
    Problem,
    check_time_limit,
)
from hetopt.outputs import PLOT_SUFFIXES, check_output, write_text
from hetopt.progress import Progress


def simulate(
    instance: Annotated[str, typer.Argument(help="Instance file or bundled instance name.")],
    plan: Annotated[
        str | None, typer.Option("--plan", help="Plan JSON file (`hetopt solve --out` writes one).")
    ] = None,
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
    rent: RentOpt = None,
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
            help="With --policy replan: seconds before a change is seen (default: the "
            "instance's replan.detection_delay_s, 0).",
        ),
    ] = None,
    restart: Annotated[
        float | None,
        typer.Option(
            "--restart",
            help="With --policy replan: seconds a switch costs beside the migration (default: "
            "the instance's replan.restart_s, 0).",
        ),
    ] = None,
    dwell: Annotated[
        float | None,
        typer.Option(
            "--dwell",
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
    from hetopt.spec.instance import load_instance, with_memory_headroom, with_rent

    if (plan is None) == (layout is None):
        raise InputError("simulate", [Problem("options", "give exactly one of --plan or --layout")])
    check_time_limit(time_limit)
    if trace:
        check_output(trace, "--trace", force)
    if plot:
        check_output(plot, "--plot", force, PLOT_SUFFIXES)
    inst = with_rent(with_memory_headroom(load_instance(instance), memory_headroom), rent)
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

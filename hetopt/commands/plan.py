"""`hetopt solve` and `hetopt evaluate`: plan an instance, price a plan or layouts."""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from hetopt.commands.common import (
    AddressOpt,
    ExecutorOpt,
    HeadroomOpt,
    InstanceArg,
    JsonOpt,
    RentOpt,
    _demo,
    _print_json,
    _replay_progress,
    err,
    out,
)
from hetopt.errors import (
    ExitCode,
    InputError,
    Problem,
    check_time_limit,
)
from hetopt.lifeline import Terminated
from hetopt.outputs import check_output, write_text
from hetopt.progress import Progress

if TYPE_CHECKING:  # the search's modules load when a command runs, not with the CLI
    from hetopt.search.types import SearchProgress


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
    rent: RentOpt = None,
    max_usd_per_hour: Annotated[
        float | None,
        typer.Option(
            "--max-usd-per-hour",
            help="A budget: only plans that cost at most this many US$ per hour (nodes rented and "
            "data moved over priced links).",
        ),
    ] = None,
    min_tokens_per_s: Annotated[
        float | None,
        typer.Option(
            "--min-tokens-per-s",
            help="A floor: no answer below this throughput (exit 1 where the fastest plan is "
            "slower).",
        ),
    ] = None,
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
    from hetopt.search.types import SearchRequest
    from hetopt.solve import solve as run_solve
    from hetopt.spec.instance import load_instance, with_memory_headroom, with_rent

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
    inst = with_rent(
        with_memory_headroom(load_instance(instance) if instance else _demo(), memory_headroom),
        rent,
    )
    with Progress(err, f"planning {inst.name} ({inst.cluster.total_gpus} GPUs)…") as status:

        def progress(now: SearchProgress) -> None:
            status.update(f"planning {inst.name}: {_standing(now)}", step=False)

        try:
            request = SearchRequest(
                inst,
                formulation,
                backend,
                time_limit,
                seed,
                objective=objective,
                executor=executor,
                address=address,
                export_model=export_model,
            )
            result = run_solve(
                request,
                planner,
                warm_start=not no_warm_start,
                runnable=runnable,
                progress=progress,
                replay_progress=_replay_progress(status),
                max_usd_per_hour=max_usd_per_hour,
                min_tokens_per_s=min_tokens_per_s,
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


def evaluate(
    instance: Annotated[str, typer.Argument(help="Instance file or bundled instance name.")],
    plan: Annotated[
        str | None, typer.Option("--plan", help="Plan JSON file (`hetopt solve --out` writes one).")
    ] = None,
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
    rent: RentOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Analytic iteration time and memory of a plan, a layout, or a file of layouts."""
    from hetopt.cost.profiles import Profiles, load_profile_file
    from hetopt.evaluate import evaluate as run_evaluate
    from hetopt.layout import expand_layout, parse_layout
    from hetopt.plan import load_plan
    from hetopt.report.tables import evaluation_view
    from hetopt.spec.instance import load_instance, with_memory_headroom, with_rent

    given = [
        name for name, v in (("--plan", plan), ("--layout", layout), ("--layouts", layouts)) if v
    ]
    if len(given) != 1:
        raise InputError(
            "evaluate",
            [Problem("options", "give exactly one of --plan, --layout, --layouts", given, True)],
        )
    inst = with_rent(with_memory_headroom(load_instance(instance), memory_headroom), rent)
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


def _evaluate_layouts(inst, path: str, profiles) -> list[dict]:
    """One result per layout line, in order; an invalid line gets an `error` entry and the sweep
    goes on. Bad input (exit 2) where the file is not UTF-8 text, or no line of it is a layout
    that evaluates."""

    from hetopt.evaluate import evaluate as run_evaluate
    from hetopt.layout import expand_layout, parse_layout

    file = Path(path)
    if not file.is_file():
        raise InputError(
            path, [Problem("", "layouts file does not exist; write one layout shorthand per line")]
        )
    try:  # a spreadsheet's byte-order mark is no layout
        lines = file.read_text(encoding="utf-8-sig").splitlines()
    except UnicodeDecodeError as exc:
        raise InputError(
            path, [Problem("", f"not UTF-8 text ({exc}); save it as UTF-8, one layout per line")]
        ) from None
    results = []
    for n, line in enumerate(lines, start=1):
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
    if not any("error" not in r for r in results):
        what = "no line of it evaluates" if results else "it holds no layout"
        raise InputError(
            path, [Problem("", f"{what}; write one layout shorthand per line, e.g. tp=2,pp=4,dp=4")]
        )
    return results


MODEL_SUFFIXES = {"pulp": (".lp", ".mps"), "cp-sat": (".pb.txt", ".pb")}
"""What --export-model writes: PuLP's LP or MPS text, or CP-SAT's model proto (text or binary)."""


def _standing(now: SearchProgress) -> str:
    """The search's live line: skeletons solved, the incumbent, the bound and the gap."""
    solved = f"{now.solved:,} skeletons solved"
    if not math.isfinite(now.incumbent_s):
        return f"{solved}, no plan yet"
    bound = f"bound {now.bound_s:.3f} s, gap {now.gap:.1%}" if now.bound_s > 0 else "no bound yet"
    return f"best {now.incumbent_s:.3f} s, {bound}, {solved}"

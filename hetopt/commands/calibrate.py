"""`hetopt calibrate`: fit or measure the cost model's parameters."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from hetopt.commands.common import JsonOpt, _print_json, err, out
from hetopt.errors import (
    InputError,
    Problem,
    did_you_mean,
)
from hetopt.outputs import check_output, check_output_directory
from hetopt.progress import Progress
from hetopt.report.tables import narrow_table


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
    outcomes_csv: Annotated[
        str | None,
        typer.Option(
            "--outcomes",
            help="Check the memory model's fits / out-of-memory verdict against runs with their "
            "outcome (columns of hagemann_llama13b_runs.csv): agreement, missed and false "
            "out-of-memory runs, and the --memory-headroom each confidence needs.",
        ),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Fit cost parameters of a GPU type to measurements (with a cross-validated report), or measure
    them."""
    modes = [
        name
        for name, given in (
            ("DATA", bool(data)),
            ("--measure", measure),
            ("--gemm", gemm is not None),
            ("--fabrics", fabrics_csv is not None),
            ("--runs", bool(runs_csv)),
            ("--outcomes", outcomes_csv is not None),
        )
        if given
    ]
    if out_path is not None and not out_path.strip():
        raise InputError("--out", [Problem("--out", "is empty; give a path", out_path, True)])
    if out_path is not None and outcomes_csv is not None:
        raise InputError(
            "--out",
            [Problem("--out", "--outcomes writes nothing; leave --out out", out_path, True)],
        )
    if len(modes) > 1:
        raise InputError(
            "calibrate",
            [
                Problem(
                    "options",
                    f"{' and '.join(modes)} are different calibrations: give one of them per run",
                )
            ],
        )
    if outcomes_csv is not None:
        _calibrate_outcomes(outcomes_csv, as_json)
        return
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


def _calibrate_outcomes(path: str, as_json: bool) -> None:
    """`--outcomes`: the memory verdict of every run against its outcome."""
    from hetopt.calibrate.boundary import fit_memory, fit_step_time
    from hetopt.calibrate.outcomes import FRAMEWORK, outcome_report, read_outcomes

    with Progress(err, f"calibrating: pricing every run of {path}…"):
        outcomes = read_outcomes(path)
        report = outcome_report(outcomes)
    if not report["expressed"]:  # nothing to judge the memory model on
        first = report["not_expressed"][0]
        raise InputError(
            path,
            [
                Problem(
                    "",
                    f"none of its {report['rows']} runs can be priced (line {first['line']}: "
                    f"{first['reason']}); give runs on GPU types hetopt knows",
                )
            ],
        )
    with Progress(err, f"calibrating: refitting the {FRAMEWORK} stack, grouped k-fold…"):
        report["stack_fit"] = {
            "framework": FRAMEWORK,
            "memory": fit_memory(outcomes, FRAMEWORK),
            "step_time": fit_step_time(outcomes, FRAMEWORK),
        }
    if as_json:
        _print_json(report)
        return

    def pct(x: float | None) -> str:
        return "—" if x is None else f"{100 * x:.1f}%"

    out.print(
        f"{report['expressed']} of {report['rows']} runs priced; fits / out-of-memory verdict "
        f"agrees on {pct(report['agreement'])}: {report['missed_oom']} out-of-memory runs "
        f"predicted to fit, {report['false_oom']} finished runs predicted not to "
        f"({report['oom']} ended out of memory)"
    )
    for row in report["not_expressed"][:5]:
        out.print(f"  not priced: line {row['line']}: {row['reason']}")
    if len(report["not_expressed"]) > 5:
        out.print(f"  (and {len(report['not_expressed']) - 5} more not priced: --json lists them)")
    out.print(
        f"step time on the {report['timed']} finished runs: MAPE {pct(report['step_mape'])}, "
        f"bias {pct(report['step_bias'])}"
    )
    for name, g in report["groups"].items():
        out.print(
            f"  {name}: {g['runs']} runs, agreement {pct(g['agreement'])}, missed "
            f"{g['missed_oom']}, false {g['false_oom']}, step MAPE {pct(g['step_mape'])}"
        )
    _print_stack_fit(report["stack_fit"], pct)
    out.print("--memory-headroom for a confidence that a plan said to fit does fit:")
    for row in report["headroom"]:
        if row["headroom_gib"] is None:
            out.print(f"  {pct(row['confidence'])}: no headroom reaches it on these runs")
        else:
            out.print(
                f"  {pct(row['confidence'])}: {row['headroom_gib']:.1f} GiB "
                f"({row['said_fit']} runs said to fit, {pct(row['fit_share'])} of them did; "
                f"{row['finished_refused']} finished runs refused)"
            )


def _print_stack_fit(fit: dict, pct) -> None:
    """The stack's terms refitted on these runs, and their grouped k-fold figures."""
    mem, step = fit["memory"], fit["step_time"]
    if mem.get("runs"):
        t = mem["terms"]
        out.print(
            f"{fit['framework']} stack refitted on these runs: loss transients "
            f"{t['logit_buffer_bytes']:.0f} B per logit, allocator overhead "
            f"{pct(t['allocator_overhead'])} of the layers' activations, reserve "
            f"{t['reserve_gib']:.1f} GiB: "
            f"agreement {pct(mem['agreement'])}; grouped k-fold (each group judged by the fit on "
            f"the others) {pct((mem['kfold'] or {}).get('agreement'))}"
        )
    if step.get("rows"):
        out.print(
            f"  compute efficiency {step['efficiency']:.3f}: step MAPE {pct(step['mape'])}; "
            + (
                f"grouped k-fold {pct(step['kfold_mape'])} (bias {pct(step['kfold_bias'])})"
                if step.get("kfold_mape") is not None
                else "grouped k-fold — (one group)"
            )
        )


def _calibrate_runs(paths: list[str], out_path: str | None, force: bool, as_json: bool) -> None:

    from hetopt.calibrate.accuracy import fit_report, fit_stacks, load_runs, stack_fit
    from hetopt.calibrate.stacks import save_stacks
    from hetopt.cost.profiles import Profiles

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
        runs = load_runs(paths)
        if not any(r.expressed for r in runs):  # nothing to fit or judge
            raise InputError(
                ", ".join(paths),
                [
                    Problem(
                        "",
                        f"none of its {len(runs)} rows can be expressed as a plan (first: "
                        f"{runs[0].reasons[0] if runs and runs[0].reasons else 'no rows'}); "
                        "give rows with a known GPU, the model and the layout",
                    )
                ],
            )
        stacks = fit_stacks(runs)
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

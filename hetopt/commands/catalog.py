"""What hetopt knows: formulations, backends, instances, GPU types, model presets, the instance
schema, and an instance checked and summarised."""

from __future__ import annotations

from dataclasses import asdict

from hetopt.commands.common import InstanceArg, JsonOpt, _demo, _listing, _print_json, out


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


def schema() -> None:
    """Print the JSON Schema of the instance format."""
    from hetopt.spec.schema import json_schema

    _print_json(json_schema())


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


def gpus(as_json: JsonOpt = False) -> None:
    """Show the GPU catalog with the source of every number."""
    from hetopt.report.tables import gpu_table
    from hetopt.spec.gpus import CATALOG
    from hetopt.spec.prices import PRICES

    if as_json:
        _print_json(
            {
                "gpus": [
                    {**asdict(g), "price": asdict(p) if (p := PRICES.get(g.name)) else None}
                    for g in CATALOG.values()
                ]
            }
        )
    else:
        out.print(gpu_table(CATALOG))


def presets(as_json: JsonOpt = False) -> None:
    """Show the model presets with their sources."""
    from hetopt.report.tables import preset_table
    from hetopt.spec.presets import PRESETS

    if as_json:
        _print_json({"presets": [asdict(m) for m in PRESETS.values()]})
    else:
        out.print(preset_table(PRESETS))

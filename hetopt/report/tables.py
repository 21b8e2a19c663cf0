"""Rich renderings of catalogs and summaries (the CLI prints them; nothing here decides
anything)."""

from __future__ import annotations

from typing import Any

from rich import box
from rich.console import Group
from rich.table import Table
from rich.text import Text

from hetopt.spec.gpus import GPUType
from hetopt.spec.presets import ModelArch
from hetopt.spec.prices import PRICES


class _FoldingTable(Table):
    """A table whose cells wrap onto more lines where the terminal is narrow, never cut with '…'."""

    def add_column(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("overflow", "fold")
        super().add_column(*args, **kwargs)


def narrow_table(title: str) -> Table:
    """A table that fits 80 columns: a rule under the header, no vertical lines, no cell cut
    short."""
    return _FoldingTable(
        title=title,
        title_justify="left",
        box=box.SIMPLE_HEAD,
        show_edge=False,
        pad_edge=False,
        collapse_padding=True,
    )


class _Footnotes:
    """Source documents numbered in the order first cited: `cite` gives a document's [n], `text` the
    list."""

    def __init__(self) -> None:
        self.documents: list[str] = []

    def cite(self, document: str) -> int:
        if document not in self.documents:
            self.documents.append(document)
        return self.documents.index(document) + 1

    def text(self, preamble: str = "") -> Text:
        return Text(
            preamble + "".join(f"[{i}] {doc}\n" for i, doc in enumerate(self.documents, 1)),
            style="dim",
        )


def _document(source: str) -> str:
    """The document part of a per-field source string ("<document>: <what it says>")."""
    return source.split(":", 1)[0]


def gpu_table(catalog: dict[str, GPUType]) -> Group:
    """The catalog with a footnote per source document, so every number points at where it comes
    from."""
    notes = _Footnotes()
    table = narrow_table("GPU catalog (peak figures; efficiency is calibrated separately)")
    for col in ("GPU", "TFLOP/s", "GiB", "HBM Gbit/s", "intra Gbit/s", "interconnect", "sources"):
        table.add_column(
            col,
            justify="left" if col in ("GPU", "interconnect", "sources") else "right",
            no_wrap=col != "interconnect",
        )
    for g in catalog.values():
        # those in `hetopt gpus --json`
        refs = [
            notes.cite(_document(source))
            for key, source in g.sources.items()
            if key not in ("family", "tdp_w", "usable_memory_gib")
        ]
        table.add_row(
            g.name,
            f"{g.peak_tflops:g}",
            f"{g.memory_gib:g}",
            f"{g.hbm_gbps:g}",
            f"{g.intra_node_gbps:g}",
            g.interconnect,
            ",".join(f"[{r}]" for r in dict.fromkeys(refs)),
        )
    prices = narrow_table(
        "On-demand prices (per GPU-hour; override per node group in the instance)"
    )
    for col in ("GPU", "$/GPU-h", "provider", "offer", "as of", "source"):
        prices.add_column(col, justify="right" if col == "$/GPU-h" else "left")
    for g in catalog.values():
        if (price := PRICES.get(g.name)) is not None:
            prices.add_row(
                g.name,
                f"{price.usd_per_gpu_hour:.2f}",
                price.provider,
                price.offer,
                price.as_of,
                f"[{notes.cite(price.source)}]",
            )
    return Group(
        table,
        prices,
        notes.text(
            "TFLOP/s: dense 16-bit tensor peak (`--json` gives every training format's: peaks, "
            "fp32 on the CUDA cores, tf32, fp16, bf16, fp8; a format missing is one the GPU "
            "lacks). HBM and intra Gbit/s: datasheet GB/s × 8; "
            "intra-node is per GPU and direction (NVLink/xGMI aggregate ÷ 2, or one direction of "
            "the PCIe x16 slot). Prices: one cloud's on-demand list price of the offer ÷ its "
            "GPUs, host included; they change often. `hetopt gpus --json` gives the source of "
            "each number.\n"
        ),
    )


def preset_table(presets: dict[str, ModelArch]) -> Group:
    """The presets with a footnote per source, so the table fits 80 columns."""
    table = narrow_table(
        "Model presets (MLP: gated SwiGLU or GPT's; context: the longest trained sequence)"
    )
    for col in (
        "preset",
        "layers",
        "hidden",
        "heads/kv",
        "ffn",
        "MLP",
        "vocab",
        "context",
        "source",
    ):
        table.add_column(
            col, justify="left" if col in ("preset", "MLP", "source") else "right", no_wrap=True
        )
    notes = _Footnotes()
    for m in presets.values():
        table.add_row(
            m.name,
            str(m.layers),
            str(m.hidden),
            f"{m.heads}/{m.kv_heads}",
            str(m.ffn_hidden),
            "gated" if m.gated_mlp else "GPT",
            str(m.vocab),
            str(m.max_seq_len),
            f"[{notes.cite(m.source)}]",
        )
    return Group(table, notes.text())


def summary_view(s: dict[str, Any]) -> Group:
    m, t, totals = s["model"], s["training"], s["totals"]
    head = Text.assemble(
        (f"{s['name']}", "bold"),
        f"  {s['path'] or ''}\n",
        (f"{s['description']}\n" if s["description"] else ""),
        f"Model {m['name']}: {m['layers']} layers, hidden {m['hidden']}, {m['heads']} heads "
        f"({m['kv_heads']} kv), ffn {m['ffn_hidden']} {'gated' if m['gated_mlp'] else 'GPT'} MLP, "
        f"vocab {m['vocab']} — {m['params'] / 1e9:.2f} B parameters\n",
        f"Training: seq {t['seq_len']}, global batch {t['global_batch']} sequences "
        f"({t['tokens_per_iteration']:,} tokens/iteration), {t['precision']}, {t['attention']} "
        "attention\n",
        f"Work: {s['flops_per_token'] / 1e9:.1f} GFLOP per token (forward + backward, no "
        f"recompute), {s['flops_per_iteration'] / 1e15:.1f} PFLOP per iteration; "
        f"{s['iteration_time_at_peak_s']:.2f} s per iteration if every GPU ran at peak",
    )
    classes = narrow_table("Device classes (GPU type × island)")
    for col in ("class", "nodes", "GPUs", "GPUs/node", "NIC Gbit/s", "memory GiB", "peak TFLOP/s"):
        classes.add_column(
            col, justify="left" if col == "class" else "right", no_wrap=col == "class"
        )
    for c in s["device_classes"]:
        classes.add_row(
            c["class"],
            str(c["nodes"]),
            str(c["gpus"]),
            str(c["gpus_per_node"]),
            f"{c['nic_gbps']:g}",
            f"{c['memory_gib']:,.0f}",
            f"{c['peak_tflops']:,.0f}",
        )
    classes.add_row(
        "total",
        str(totals["nodes"]),
        str(totals["gpus"]),
        "",
        "",
        f"{totals['memory_gib']:,.0f}",
        f"{totals['peak_tflops']:,.0f}",
        style="bold",
    )
    parts: list[Any] = [head, classes]
    if s["links"]:
        links = narrow_table("Island links")
        for col in ("a", "b", "Gbit/s", "latency µs"):
            links.add_column(col)
        for lk in s["links"]:
            links.add_row(lk["a"], lk["b"], f"{lk['gbps']:g}", f"{lk['latency_us']:g}")
        parts.append(links)
    scenarios = narrow_table("Bandwidth scenarios")
    for col in ("scenario", "probability", "kind"):
        scenarios.add_column(col)
    for sc in s["scenarios"]:
        scenarios.add_row(sc["name"], f"{sc['probability']:g}", sc["kind"])
    parts.append(scenarios)
    return Group(*parts)


def evaluation_view(results: list[dict[str, Any]]) -> Group:
    """A table of evaluated plans or layouts, then each one's breakdown and per-stage memory."""
    summary = narrow_table("Analytic evaluation")
    for col in ("plan", "iteration s", "tokens/s", "TFLOP/s/GPU", "MFU", "fits", "$/h", "$/Mtok"):
        summary.add_column(col, justify="left" if col == "plan" else "right")
    parts: list[Any] = [summary]
    for r in results:
        if "error" in r:
            summary.add_row(r["layout"], "invalid", "", "", "", "", "", "", style="red")
            continue
        fits = "[green]yes[/green]" if r["fits"] else "[red]no (OOM)[/red]"
        summary.add_row(
            str(r.get("layout") or "plan"),
            f"{r['iteration_time_s']:.3f}",
            f"{r['tokens_per_s']:,.0f}",
            f"{r['tflops_per_gpu']:.1f}",
            f"{r['mfu']:.1%}",
            fits,
            *usd_cells(r),
        )
    if len(results) == 1 and "error" not in results[0]:
        r = results[0]
        total = r["iteration_time_s"]
        bd = narrow_table("Where the iteration goes")
        bd.add_column("part")
        bd.add_column("seconds", justify="right")
        bd.add_column("share", justify="right")
        for key, value in r["breakdown"].items():
            bd.add_row(key.replace("_", " "), f"{value:.4f}", f"{value / total:.1%}")
        mem = narrow_table("Peak memory per stage (GiB)")
        for col in ("stage", "peak", "limit", ""):
            mem.add_column(col, justify="right")
        labels = r.get("memory_rows") or [str(i) for i in range(len(r["peak_memory_gib"]))]
        for label, peak, limit in zip(
            labels, r["peak_memory_gib"], r["memory_limit_gib"], strict=True
        ):
            mem.add_row(
                label, f"{peak:.1f}", f"{limit:g}", "" if peak <= limit else "[red]over[/red]"
            )
        parts += [bd, mem]
    return Group(*parts)


def calibration_view(params: Any) -> Group:
    """Fitted parameters in readable units and the fit report per data set."""
    head = Text.assemble(
        (f"Calibration profile for {params.gpu}", "bold"),
        f" ({params.date})\n",
        f"data: {params.source}\nmethod: {params.method}",
    )
    values = narrow_table("Parameters")
    values.add_column("parameter")
    values.add_column("value", justify="right")
    for key, value in params.describe().items():
        values.add_row(key, f"{value:.4g}")
    parts: list[Any] = [head, values]
    checks = {name: r for name, r in params.fit.items() if "measured_ms" in r}
    if checks:
        table = narrow_table("Measured vs predicted")
        for col in ("check", "measured ms", "predicted ms", "error"):
            table.add_column(col, justify="left" if col == "check" else "right")
        for name, r in checks.items():
            table.add_row(
                name, f"{r['measured_ms']:.3f}", f"{r['predicted_ms']:.3f}", f"{r['error']:+.1%}"
            )
        parts.append(table)
    fits = {name: r for name, r in params.fit.items() if "rows" in r}
    if fits:
        report = narrow_table("Fit report (relative error of predicted vs measured time)")
        for col in ("data set", "rows", "MAPE", "max error", "Spearman", "CV MAPE", "CV max"):
            report.add_column(col, justify="left" if col == "data set" else "right")
        for name, r in fits.items():
            report.add_row(
                name,
                str(r["rows"]),
                f"{r['mape']:.1%}",
                f"{r['max_error']:.1%}",
                f"{r['spearman']:.3f}" if "spearman" in r else "",
                f"{r['cv_mape']:.1%}" if "cv_mape" in r else "",
                f"{r['cv_max_error']:.1%}" if "cv_max_error" in r else "",
            )
        parts.append(report)
        for name, r in fits.items():
            if "per_row" in r:
                rows = narrow_table(f"{name}: every row")
                for col in ("row", "measured ms", "predicted ms", "error"):
                    rows.add_column(col, justify="left" if col == "row" else "right")
                for label, v in r["per_row"].items():
                    rows.add_row(
                        label,
                        f"{v['measured_ms']:.2f}",
                        f"{v['predicted_ms']:.2f}",
                        f"{v['error']:+.1%}",
                    )
                parts.append(rows)
    return Group(*parts)


def usd_cells(r: dict[str, Any]) -> tuple[str, str]:
    """A result's dollars per hour and per million tokens as table cells ("—": no prices)."""
    per_hour, per_mtok = r.get("usd_per_hour"), r.get("usd_per_million_tokens")
    return (
        "—" if per_hour is None else f"{per_hour:,.2f}",
        "—" if per_mtok is None else f"{per_mtok:,.3f}",
    )


def simulation_view(result: dict[str, Any]) -> Group:
    table = narrow_table("Simulated iterations per scenario")
    for col in (
        "scenario",
        "p",
        "iters",
        "mean s",
        "p50 s",
        "p90 s",
        "max s",
        "tokens/s",
        "$/h",
        "$/Mtok",
    ):
        table.add_column(col, justify="left" if col == "scenario" else "right")
    busiest = []
    for sc in result["scenarios"]:
        it = sc["iteration_time_s"]
        table.add_row(
            sc["name"],
            f"{sc['probability']:g}",
            str(sc.get("iterations", "")),
            *(_seconds(it[k]) for k in ("mean", "p50", "p90", "max")),
            f"{sc['tokens_per_s']:,.0f}",
            *usd_cells(sc),
        )
        links = sc["link_utilization"]
        if links:
            name, util = max(links.items(), key=lambda kv: kv[1])
            busiest.append(f"{name} {util:.0%} ({sc['name']})")
    lines = [f"busiest link: {', '.join(busiest)}"] if busiest else []
    lines += [line for sc in result["scenarios"] for line in policy_notes(sc)]
    lines += [line for sc in result["scenarios"] for line in replay_notes(sc)]
    notes = Text("".join(f"{line}\n" for line in lines), style="dim")
    first = result["scenarios"][0]
    busy = narrow_table(f"GPU busy fraction ({first['name']})")
    # the adaptive policy ran several
    plans = len({row.get("plan", 0) for row in first["gpu_busy"]}) > 1
    for col in ("plan",) * plans + ("template", "stage", "busy", "peak GiB"):
        busy.add_column(col, justify="right")
    for row, peak in zip(first["gpu_busy"], first["peak_memory_gib"], strict=False):
        busy.add_row(
            *([str(row["plan"])] if plans else []),
            str(row["pipeline"]),
            str(row["stage"]),
            f"{row['busy']:.0%}",
            f"{peak:.1f}",
        )
    return Group(table, *([notes] if lines else []), *([busy] if first["gpu_busy"] else []))


def policy_notes(sc: dict[str, Any]) -> list[str]:
    """What the adaptive policy did in a scenario: its tokens over the horizon, each switch, the
    decisions that kept the running plan."""
    if sc.get("policy") != "replan":
        return []
    lines = [
        f"{sc['name']}: {sc['tokens']:,.0f} tokens in {sc['horizon_s']:g} s under the adaptive "
        f"policy, {len(sc['switches'])} switch(es), {sc['declined']} decision(s) kept the running "
        "plan"
    ]
    for sw in sc["switches"]:
        lines.append(
            f"  at {sw['at_s']:.1f} s (change at {sw['change_s']:.1f} s): plan {sw['plan']}, "
            f"{sw['old_s']:.4g} → {sw['new_s']:.4g} s per iteration; "
            f"{sw['migration_bytes'] / 1e9:.2f} GB moved in {sw['migration_s']:.2f} s + "
            f"{sw['restart_s']:g} s restart, paid back after {sw['break_even_s']:.1f} s of an "
            f"expected {sw['dwell_s']:.1f} s"
        )
    return lines


CUT_REASONS = {
    "pass budget": "the replay's pass budget (hetopt.sim.engine.REPLAY_PASSES)",
    "time limit": "the time limit",
    "trace end": "the longest trace its generators may make",
    "sampled": "one iteration: too large to replay several",
}


def _seconds(value: float) -> str:
    """Seconds with four significant figures or more: 0.1234, 4.834, 17,437."""
    return f"{value:,.0f}" if value >= 1000 else f"{value:.4g}" if value >= 1 else f"{value:.4f}"


def _counts(values: list[int]) -> str:
    return "/".join(f"{v:,}" for v in values)


def replay_notes(sc: dict[str, Any]) -> list[str]:
    """What a scenario's replay did not do in full: a sampled or priced iteration, iterations cut
    short."""
    notes = []
    sampled = sc.get("sampled")
    if sampled and sampled.get("method") == "analytic":
        notes.append(
            f"{sc['name']}: an iteration ({_counts(sampled['of'])} micro-batches per template) "
            f"was not replayed — {sampled['reason']}; its time is the analytic evaluator's"
        )
    elif sampled:
        small, large = sampled["micro_batches"]
        notes.append(
            f"{sc['name']}: an iteration ({_counts(sampled['of'])} micro-batches per template) "
            f"is too large to replay whole; {_counts(small)} and {_counts(large)} were replayed at "
            "the bandwidth of t = 0 and the time extrapolated"
        )
    if sc.get("cut") and not (sampled and sampled.get("method") == "analytic"):  # else said above
        notes.append(
            f"{sc['name']}: stopped after {sc['iterations']} "
            f"iteration{'s' if sc['iterations'] > 1 else ''} ({sc['replayed_s']:.1f} s replayed) "
            f"at {CUT_REASONS.get(sc['cut'], sc['cut'])}"
        )
    return notes


def search_view(search: dict[str, Any]) -> Table:
    """What the search enumerated, solved and pruned, one rule a line, the largest count first."""
    table = Table(
        title=f"search: {search['skeletons_enumerated']:,} skeletons enumerated, "
        f"{search['solved']:,} solved; pruned by",
        title_justify="left",
        title_style="dim",
        box=None,
        show_header=False,
        padding=(0, 1),
        style="dim",
    )
    table.add_column("skeletons", justify="right", no_wrap=True, style="dim")
    table.add_column("rule", style="dim")
    for rule, count in sorted(search["pruned"].items(), key=lambda kv: -kv[1]):
        table.add_row(f"{count:,}", rule)
    return table


def solve_view(inst: Any, r: dict[str, Any]) -> Group:
    """The plan as a table (pipelines, stages, GPUs, TP, layers, micro-batches, time and memory per
    stage)."""
    head = Text.assemble((f"{inst.name}: {r['status']}", "bold"))
    parts: list[Any] = [head]
    if r["plan"] is None:
        return Group(*parts)
    head.append(_solve_summary(r))
    parts.append(_plan_table(r["plan"], r["predicted"]))
    parts.append(search_view(r["search"]))
    parts += _fallback_notes(r["search"])
    warm = r.get("warm_start")
    if warm:
        parts.append(_warm_start_note(warm))
    if r["verified"]:
        parts.append(simulation_view(r["verified"]))
    return Group(*parts)


def _solve_summary(r: dict[str, Any]) -> str:
    """The heading's tail: the iteration time with its proof, the throughput, and who found it."""
    pred = r["predicted"]
    proof = (
        f"bound {r['bound_s']:.3f} s, gap {r['gap']:.2%}"
        if r["bound_s"] is not None and r["gap"] is not None
        else "no bound proven"
    )
    per_hour, per_mtok = usd_cells(pred)
    dollars = f", ${per_hour}/h, ${per_mtok}/Mtok" if pred.get("usd_per_hour") is not None else ""
    return (
        f"  iteration {r['objective_s']:.3f} s ({proof}); {pred['tokens_per_s']:,.0f} tokens/s, "
        f"MFU {pred['mfu']:.1%}{dollars}; {r['planner']} / {r['formulation']} / {r['backend']} "
        f"in {r['solve_time_s']:.2f} s"
    )


def _plan_table(plan: dict[str, Any], pred: dict[str, Any]) -> Table:
    """One row per stage, or per shard of a stage with shards, as the predicted memory comes."""
    table = narrow_table(
        f"Plan (micro-batch {plan['micro_batch']}, {plan['schedule']}, ZeRO-{plan['zero']}; T "
        "template, × replicas, m micro-batches each, # stage, TP (·cp: context parallel), L "
        "layers, rc recompute)"
    )
    for col in ("T", "×", "m", "#", "device class", "TP", "L", "rc", "GiB/lim"):
        table.add_column(
            col, justify="left" if col in ("device class", "rc") else "right", no_wrap=True
        )
    k = 0  # memory comes per row: a stage, or each shard of a stage with shards
    for j, pipe in enumerate(plan["pipelines"]):
        for i, st in enumerate(pipe["stages"]):
            for n, label in enumerate(_stage_classes(st)):
                peak, limit = pred["peak_memory_gib"][k], pred["memory_limit_gib"][k]
                table.add_row(
                    *_stage_cells(j, pipe, i, st, label, lead=n == 0), f"{peak:.1f} / {limit:g}"
                )
                k += 1
    return table


def _stage_classes(st: dict[str, Any]) -> list[str]:
    """A stage's device classes, one line each: a stage with shards lists "ranks × class,
    sequences of each micro-batch"."""
    return [
        f"{sh['ranks']}×{sh['gpu']}@{sh['island']} ·{sh['sequences']} seq"
        for sh in st.get("shards") or ()
    ] or [f"{st['gpu']}@{st['island']}"]


def _stage_cells(
    j: int, pipe: dict[str, Any], i: int, st: dict[str, Any], label: str, lead: bool
) -> list[str]:
    """A stage row's cells but memory: the pipeline's on its first line, the stage's on its lead
    line, so that a shard's line shows only its class."""
    first = i == 0 and lead
    return [
        str(j) if first else "",
        str(pipe["replicas"]) if first else "",
        str(pipe["micro_batches"]) if first else "",
        str(i) if lead else "",
        label,
        (str(st["tp"]) + (f"·cp{st['cp']}" if st.get("cp", 1) > 1 else "")) if lead else "",
        str(st["layers"]) if lead else "",
        st["recompute"] if lead else "",
    ]


def _fallback_notes(search: dict[str, Any]) -> list[Text]:
    """A line per backend that failed, and who took its skeletons over."""
    notes = []
    for f in search.get("fallbacks", []):
        taker = (
            "no backend could solve them"
            if f["solved_by"] == "none"
            else f"{f['solved_by']} took over"
        )
        notes.append(
            Text(
                f"fallback: {f['failed']} failed on {f['skeletons']:,} skeleton(s) "
                f"({f['detail']}); {taker}",
                style="yellow",
            )
        )
    return notes


def _warm_start_note(warm: dict[str, Any]) -> Text:
    """What became of the warm start: kept or beaten, and why a kept one outside the searched
    space is feasible, not optimal."""
    fate = "no plan of the search space beats it: kept" if warm["kept"] else "beaten by the search"
    if warm.get("outside_space"):
        fate += (
            " — the plan lies outside the searched space ("
            + "; ".join(warm["outside_space"])
            + "): no plan of the space is better, so feasible, not optimal"
        )
    return Text(
        f"warm start: {warm['planner']} at {warm['objective_s']:.3f} s — {fate}",
        style="dim",
    )

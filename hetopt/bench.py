"""`hetopt bench`: planners side by side on instances, every plan verified and replayed in the
simulator under every chosen scenario (DESIGN 7); results as CSV, Markdown and plots.

One row per (instance, planner, scenario): tokens/s and iteration time are the simulator's mean over
the replayed iterations; search time, status and gap are the planner's. The Markdown puts the best
tokens/s of each scenario in bold and gives each planner's ratio to hetopt (hetopt's tokens/s ÷ the
planner's: above 1, hetopt is faster by that factor).

Each (instance, planner) run is independent: `executor="ray"` runs them as Ray tasks side by side
(locally or across a cluster) and gives the same rows in the same order as the serial sweep. Only
what the wall clock decides can differ, as it can between two serial sweeps: search times, and the
count of skeletons solved by an exact search that ran long enough to start its worker processes.
"""

from __future__ import annotations

import csv
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from hetopt.baselines.common import PlannerResult
from hetopt.cheapest import cheapest_per_token
from hetopt.cost.dollars import plan_cost
from hetopt.cost.profiles import Profiles
from hetopt.errors import InputError, Problem, did_you_mean
from hetopt.evaluate import evaluate
from hetopt.executors import check_executor, default_workers, ray_cpus_per_node, ray_session
from hetopt.outputs import atomic_path, check_output_directory, refuse_existing, write_text
from hetopt.planners import ALIASES, EXACT, PLANNERS, run_ilp
from hetopt.replan.policy import (
    Decisions,
    PolicyOptions,
    replay_adaptive,
    run_cost,
    run_tokens,
)
from hetopt.search.types import SearchRequest
from hetopt.sim.engine import Simulation
from hetopt.spec.instance import Instance
from hetopt.verify import check_plan

OUTPUTS = ("results.csv", "results.md", "throughput.png", "search_time.png", "iteration_times.png")
CSV_FIELDS = (
    "instance",
    "gpus",
    "gpu_types",
    "planner",
    "scenario",
    "probability",
    "tokens_per_s",
    "iteration_time_s",
    "predicted_s",
    "search_time_s",
    "status",
    "gap",
    "evaluated",
    "note",
    "tokens",
    "switches",
    "usd_per_hour",
    "usd_per_million_tokens",
)
ROBUST = "expected"
"""The objective of the static robust plan a dynamic instance's bench also runs (`ilp-expected`)."""
ADAPTIVE = "+replan"
"""The suffix of the adaptive policy's rows: `ilp+replan` starts from the stable plan,
`ilp-expected+replan` from the robust one."""


@dataclass
class Row:
    instance: str
    gpus: int
    gpu_types: int
    planner: str
    scenario: str
    probability: float
    tokens_per_s: float | None
    iteration_time_s: float | None
    predicted_s: float | None
    search_time_s: float
    status: str
    gap: float | None
    evaluated: int
    note: str = ""
    tokens: float | None = None
    """Tokens over the horizon (search.horizon_s), replayed whole: the ilp rows of a dynamic
    instance and its adaptive rows (whose tokens_per_s is this ÷ the horizon, switches' pauses
    counted)."""
    switches: int | None = None
    """Switches of plans the adaptive policy made."""
    usd_per_hour: float | None = None
    """Dollars per hour of training (hetopt.cost.dollars); None without prices."""
    usd_per_million_tokens: float | None = None


@dataclass
class BenchResult:
    rows: list[Row] = field(default_factory=list)
    samples: dict[tuple[str, str], list[float]] = field(default_factory=dict)
    """(instance, planner) → simulated iteration times over every scenario (for the
    distributions)."""
    dynamic: set[str] = field(default_factory=set)
    """Instances with bandwidth scenarios."""


def output_paths(out: Path) -> tuple[Path, list[Path]]:
    """The directory and files `--out` stands for: a directory, or (DESIGN 2.4's form) a .csv path
    whose directory takes the other files."""
    if out.suffix == ".csv":
        directory = out.parent
        return directory, [out, *(directory / name for name in OUTPUTS[1:])]
    return out, [out / name for name in OUTPUTS]


def check_outputs(out: Path, force: bool) -> list[Path]:
    """Refuse, before any work, to overwrite files a user has unless --force."""
    directory, paths = output_paths(out)
    check_output_directory(directory, "--out")
    refuse_existing(paths, "--out", str(out), force)
    return paths


def check_planners(names: list[str]) -> list[str]:
    """The planners by their PLANNERS names (an alias of ALIASES read as its planner).
    Raises: InputError for a name that is neither."""
    for name in names:
        if name not in PLANNERS and name not in ALIASES:
            raise InputError(
                "--planners",
                [
                    Problem(
                        "--planners",
                        f"unknown planner{did_you_mean(name, PLANNERS)}; available: "
                        f"{', '.join(PLANNERS)}",
                        name,
                        True,
                    )
                ],
            )
    return list(dict.fromkeys(ALIASES.get(name, name) for name in names))


def run_bench(
    instances: list[Instance],
    planners: list[str],
    scenarios: list[str] | None = None,
    time_limit_s: float = 60.0,
    iterations: int = 3,
    seed: int = 0,
    profiles: Profiles | None = None,
    progress=None,
    executor: str = "process",
    address: str | None = None,
) -> BenchResult:
    """Run every planner on every instance, verify each plan and replay it under the chosen
    scenarios.

    Parameters: instances, planners — the sweep (PLANNERS names); scenarios — names to replay (None:
    all);
    time_limit_s — per planner run; iterations — simulated iterations per scenario; seed — of the
    random planner and the solvers; profiles — calibrated weights; progress — progress(instance,
    planner), called before each run (with Ray: as each run finishes); executor — `process` (one run
    after another here) or `ray` (every run a Ray task; a local Ray started for the sweep, or the
    cluster at `address`).
    Returns: a BenchResult whose rows are in (instance, planner, scenario) order whatever the
    executor.
    Raises: InputError for an unknown planner, scenario or executor."""
    profiles = profiles or Profiles()
    planners = check_planners(planners)
    _check_scenarios(instances, scenarios)
    executor = check_executor(executor, address)
    result = BenchResult()
    runs = []
    for inst in instances:
        trace_s = max(3600.0, inst.horizon_s)
        chosen = [sc for sc in inst.scenarios(trace_s) if scenarios is None or sc.name in scenarios]
        if len(chosen) > 1 or any(sc.changes for sc in chosen):
            result.dynamic.add(inst.name)
        runs += [(inst, name, chosen) for name in planners]
    if executor == "ray":
        outcomes = _sweep_on_ray(runs, time_limit_s, iterations, seed, profiles, progress, address)
    else:
        outcomes = []
        for inst, name, chosen in runs:
            if progress is not None:
                progress(inst, name)
            outcomes.append(
                plan_and_replay(inst, name, chosen, time_limit_s, iterations, seed, profiles)
            )
    for rows, samples in outcomes:  # in the serial order, whatever order the runs finished in
        result.rows += rows
        for key, times in samples.items():
            result.samples.setdefault(key, []).extend(times)
    return result


def plan_and_replay(
    inst: Instance,
    planner: str,
    scenarios,
    time_limit_s: float,
    iterations: int,
    seed: int,
    profiles: Profiles,
) -> tuple[list[Row], dict[tuple[str, str], list[float]]]:
    """One run of a bench: the planner's plan, verified and replayed under `scenarios`.

    Returns: its rows (one per scenario) and its simulated iteration times keyed (instance,
    planner)."""
    samples: dict[tuple[str, str], list[float]] = {}
    planned = PLANNERS[planner](inst, time_limit_s, profiles, seed)
    rows = _replay(inst, planned, scenarios, iterations, profiles, samples)
    if planner == EXACT and _dynamic(scenarios):
        rows += _adaptive_rows(
            inst, planned, rows, scenarios, time_limit_s, iterations, seed, profiles, samples
        )
    if planner == EXACT and priced(inst):  # the plan of least dollars per token beside it
        cheapest = run_ilp_cost(inst, time_limit_s, profiles, seed)
        rows += _replay(inst, cheapest, scenarios, iterations, profiles, samples)
    return rows, samples


def run_ilp_cost(
    inst: Instance,
    time_limit_s: float = 60.0,
    profiles: Profiles | None = None,
    seed: int = 0,
) -> PlannerResult:
    """The exact planner under the cost objective (`solve --objective cost`), named `ilp-cost`: the
    plan of least dollars per token (hetopt.cheapest); its gap is in dollars per token."""
    found = cheapest_per_token(
        SearchRequest(inst, time_limit_s=time_limit_s, seed=seed, profiles=profiles)
    )
    r = found.result
    cost, bound = found.usd_per_million_tokens, found.bound_usd_per_million_tokens
    return PlannerResult(
        f"{EXACT}-cost",
        r.plan,
        r.objective_s,
        r.solve_time_s,
        r.status.value,
        (cost - bound) / cost if r.plan is not None and math.isfinite(bound) else None,
        r.stats.solved,
        r.reason,
        {"skeletons_enumerated": r.stats.enumerated, "budgeted_searches": found.steps},
    )


def priced(inst: Instance) -> bool:
    """Whether every node has a price (the cost objective's row is then run)."""
    return all(n.usd_per_hour is not None for n in inst.cluster.nodes.values())


def _dynamic(scenarios) -> bool:
    return len(scenarios) > 1 or any(sc.changes for sc in scenarios)


def _adaptive_rows(
    inst: Instance,
    stable: PlannerResult,
    stable_rows: list[Row],
    scenarios,
    time_limit_s: float,
    iterations: int,
    seed: int,
    profiles: Profiles,
    samples: dict,
) -> list[Row]:
    """On an instance with bandwidth scenarios, beside the stable plan (ilp): the robust plan
    (`ilp-expected`, static) and the adaptive policy from each (hetopt.replan.policy). The two
    static plans' rows get their tokens over the horizon, replayed whole as the adaptive policy's
    are, so the four compare."""
    robust = run_ilp(inst, time_limit_s, profiles, seed, objective=ROBUST)
    robust_rows = _replay(inst, robust, scenarios, iterations, profiles, samples)
    horizon_s, options = inst.horizon_s, PolicyOptions.of(inst)
    decisions = Decisions(inst, profiles, options)  # one network's search serves both starts
    # the traces as `hetopt simulate` generates them, to the horizon: the same tokens as it reports
    to_horizon = {sc.name: sc for sc in inst.scenarios(horizon_s)}
    adaptive = []
    for planned, rows in ((stable, stable_rows), (robust, robust_rows)):
        if planned.plan is None:
            continue
        for sc, row in zip((to_horizon[sc.name] for sc in scenarios), rows, strict=True):
            # the static plan over the horizon by the same segments as the policy's replay: counted
            # alike
            static = replay_adaptive(
                inst, planned.plan, sc, horizon_s, options, profiles, adapt=False
            )
            row.tokens = run_tokens(inst, static, horizon_s)
            run = replay_adaptive(
                inst, planned.plan, sc, horizon_s, options, profiles, decisions=decisions
            )
            tokens = run_tokens(inst, run, horizon_s)
            adaptive.append(
                Row(
                    **{
                        **asdict(row),
                        "planner": planned.planner + ADAPTIVE,
                        "tokens_per_s": tokens / horizon_s,
                        "iteration_time_s": float(np.mean(run.iteration_times_s)),
                        "tokens": tokens,
                        "switches": len(run.switches),
                        "note": f"{len(run.switches)} switches, {run.declined} declined",
                        **run_cost(inst, run, tokens / horizon_s).to_json(),
                    }
                )
            )
    return robust_rows + adaptive


def _sweep_on_ray(
    runs: list,
    time_limit_s: float,
    iterations: int,
    seed: int,
    profiles: Profiles,
    progress,
    address: str | None,
) -> list:
    """Every (instance, planner, scenarios) run as a Ray task; their outcomes in the order of
    `runs`."""
    with ray_session(address) as ray:
        # the exact planner starts its own worker processes after a while: it asks for the CPUs it
        # will use (as many as a node has, at most), so a node never runs more solver processes than
        # it has cores
        search_cpus = min(default_workers(), ray_cpus_per_node(ray))
        task = ray.remote(plan_and_replay)
        shared = ray.put(profiles)  # once into the object store, not once per task
        stored = {id(inst): ray.put(inst) for inst, _, _ in runs}
        pending = {}
        for k, (inst, name, chosen) in enumerate(runs):
            cpus = search_cpus if name == EXACT else 1
            ref = task.options(num_cpus=cpus).remote(
                stored[id(inst)], name, chosen, time_limit_s, iterations, seed, shared
            )
            pending[ref] = k
        outcomes: list = [None] * len(runs)
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1)
            k = pending.pop(done[0])
            outcomes[k] = ray.get(done[0])
            if progress is not None:
                progress(runs[k][0], runs[k][1])
        return outcomes


def _replay(
    inst: Instance,
    planned: PlannerResult,
    scenarios,
    iterations: int,
    profiles: Profiles,
    samples: dict,
) -> list[Row]:
    base = dict(
        instance=inst.name,
        gpus=inst.cluster.total_gpus,
        gpu_types=len({n.gpu for n in inst.cluster.nodes.values()}),
        planner=planned.planner,
        search_time_s=planned.search_time_s,
        status=planned.status,
        gap=planned.gap,
        evaluated=planned.evaluated,
        note=planned.note,
    )
    if planned.plan is None:
        return [
            Row(
                scenario=sc.name,
                probability=sc.probability,
                tokens_per_s=None,
                iteration_time_s=None,
                predicted_s=None,
                **base,
            )
            for sc in scenarios
        ]
    problems = check_plan(inst, planned.plan)
    if problems:  # every planner's plan goes through the independent verifier
        raise AssertionError(f"{planned.planner} returned a plan the verifier rejects: {problems}")
    predicted = evaluate(inst, planned.plan, profiles).iteration_time_s
    sim = Simulation(inst, planned.plan, profiles)
    rows = []
    for sc in scenarios:
        times = sim.run(sc, iterations).iteration_times_s
        samples.setdefault((inst.name, planned.planner), []).extend(times)
        mean = float(np.mean(times))
        rows.append(
            Row(
                scenario=sc.name,
                probability=sc.probability,
                tokens_per_s=inst.global_batch * inst.seq_len / mean,
                iteration_time_s=mean,
                predicted_s=predicted,
                **plan_cost(inst, planned.plan, mean).to_json(),
                **base,
            )
        )
    return rows


def _check_scenarios(instances: list[Instance], scenarios: list[str] | None) -> None:
    if scenarios is None:
        return
    known = {sc.name for inst in instances for sc in inst.scenarios(60.0)}
    for name in scenarios:
        if name not in known:
            raise InputError(
                "--scenarios",
                [
                    Problem(
                        "--scenarios",
                        f"no instance has this scenario{did_you_mean(name, sorted(known))}; "
                        f"they have: {', '.join(sorted(known))}",
                        name,
                        True,
                    )
                ],
            )


# -- outputs
# ---------------------------------------------------------------------------------------------


def write_outputs(result: BenchResult, out: Path, force: bool = False) -> list[Path]:
    paths = check_outputs(out, force)
    output_paths(out)[0].mkdir(parents=True, exist_ok=True)
    csv_path, md_path, throughput, search, distributions = paths
    write_csv(result, csv_path)
    write_text(md_path, markdown(result))
    plot_throughput(result, throughput)
    plot_search_time(result, search)
    plot_iteration_times(result, distributions)
    return paths


def write_csv(result: BenchResult, path: Path) -> None:
    with atomic_path(path) as temp, temp.open("w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=CSV_FIELDS)
        writer.writeheader()
        for row in result.rows:
            writer.writerow({k: ("" if v is None else v) for k, v in asdict(row).items()})


def expected_tokens(result: BenchResult) -> dict[tuple[str, str], float | None]:
    """(instance, planner) → probability-weighted tokens/s over the scenarios (None without a
    plan)."""
    out: dict[tuple[str, str], float | None] = {}
    for row in result.rows:
        key = (row.instance, row.planner)
        if row.tokens_per_s is None:
            out[key] = None
        elif out.get(key, 0.0) is not None:
            out[key] = out.get(key, 0.0) + row.probability * row.tokens_per_s
    return out


def markdown(result: BenchResult) -> str:
    lines = [
        "# hetopt bench",
        "",
        "Tokens/s and iteration time are simulated (mean over the replayed iterations, each "
        "scenario); `vs ilp` is the exact planner's (ilp) tokens/s ÷ the planner's (above 1: ilp "
        "is faster by that factor). The best tokens/s of each scenario is in bold. On an instance "
        f"with bandwidth scenarios, `{EXACT}-{ROBUST}` is the static robust plan (`--objective "
        f"{ROBUST}`), and a second table gives the tokens over the horizon of the static plans and "
        f"of the adaptive policy started from each (`{ADAPTIVE}`, `hetopt simulate --policy "
        f"replan`), replayed whole, switches' pauses counted (in results.csv the `{ADAPTIVE}` "
        "rows' tokens/s are those tokens ÷ the horizon).",
        "",
    ]
    expected = expected_tokens(result)
    instances = list(dict.fromkeys(r.instance for r in result.rows))
    for name in instances:
        lines += _instance_section(name, [r for r in result.rows if r.instance == name], expected)
    lines += summary(result)
    return "\n".join(lines) + "\n"


def _instance_section(
    name: str, rows: list[Row], expected: dict[tuple[str, str], float | None]
) -> list[str]:
    """One instance's tables: every static planner per scenario, then the horizon's tokens; the
    adaptive rows only in the latter, as their tokens/s are not one iteration's."""
    scenarios = list(dict.fromkeys(r.scenario for r in rows))
    best = _best_tokens_per_s(rows, scenarios)
    lines = [
        f"## {name} ({rows[0].gpus} GPUs, {rows[0].gpu_types} "
        f"type{'s' if rows[0].gpu_types > 1 else ''})",
        "",
        "| planner | status | search s | predicted s | $/h | $/Mtok | "
        + " | ".join(f"{sc} tokens/s" for sc in scenarios)
        + " | vs ilp |",
        "| --- | --- | ---: | ---: | ---: | ---: | "
        + " | ".join("---:" for _ in scenarios)
        + " | ---: |",
    ]
    for planner in dict.fromkeys(r.planner for r in rows if not r.planner.endswith(ADAPTIVE)):
        mine = [r for r in rows if r.planner == planner]
        cells = [
            _tokens_cell(next(x for x in mine if x.scenario == sc), best[sc]) for sc in scenarios
        ]
        ratio = _ratio(expected, name, planner)
        # an optimal plan's gap is within its proof's tolerance (below 1e-5): shown only when
        # not proven
        shown_gap = mine[0].gap is not None and mine[0].status != "optimal"
        status = mine[0].status + (f" (gap {mine[0].gap:.1%})" if shown_gap else "")
        predicted = f"{mine[0].predicted_s:.3f}" if mine[0].predicted_s else "—"
        # dollars in the first scenario (the stable network where there is one)
        usd = mine[0].usd_per_hour
        per_hour = f"{usd:,.2f}" if usd is not None else "—"
        per_tokens = mine[0].usd_per_million_tokens
        per_mtok = f"{per_tokens:.3f}" if per_tokens is not None else "—"
        lines.append(
            f"| {planner} | {status} | {mine[0].search_time_s:.2f} | {predicted} | {per_hour} | "
            f"{per_mtok} | " + " | ".join(cells) + f" | {ratio} |"
        )
    lines.append("")
    return lines + _horizon_table(rows, scenarios)


def _best_tokens_per_s(rows: list[Row], scenarios: list[str]) -> dict[str, float | None]:
    """Each scenario's best static tokens/s (None when no planner has a plan), to set in bold."""
    return {
        sc: max(
            (
                r.tokens_per_s
                for r in rows
                if r.scenario == sc and r.tokens_per_s and not r.planner.endswith(ADAPTIVE)
            ),
            default=None,
        )
        for sc in scenarios
    }


def _tokens_cell(row: Row, best: float | None) -> str:
    """A row's tokens/s, in bold when it is its scenario's best (within rounding)."""
    if row.tokens_per_s is None:
        return "—"
    text = f"{row.tokens_per_s:,.0f}"
    return f"**{text}**" if best and row.tokens_per_s >= best * (1 - 1e-9) else text


def _horizon_table(rows: list[Row], scenarios: list[str]) -> list[str]:
    """Tokens over the horizon of the static and adaptive rows of a dynamic instance, each beside
    the stable plan's (ilp) in the same scenario."""
    whole = [r for r in rows if r.tokens is not None]
    if not whole:
        return []
    lines = [
        "Tokens over the horizon (replayed whole; in brackets, ÷ the static stable plan's; "
        "switches):",
        "",
        "| planner | " + " | ".join(scenarios) + " |",
        "| --- | " + " | ".join("---:" for _ in scenarios) + " |",
    ]
    stable = {r.scenario: r.tokens for r in whole if r.planner == EXACT}
    for planner in dict.fromkeys(r.planner for r in whole):
        cells = []
        for sc in scenarios:
            r = next((x for x in whole if x.planner == planner and x.scenario == sc), None)
            if r is None:
                cells.append("—")
                continue
            ratio = f" ({r.tokens / stable[sc]:.3f})" if stable.get(sc) else ""
            moved = f", {r.switches} sw" if r.switches is not None else ""
            cells.append(f"{r.tokens:,.0f}{ratio}{moved}")
        lines.append(f"| {planner} | " + " | ".join(cells) + " |")
    return [*lines, ""]


def _ratio(expected, instance: str, planner: str) -> str:
    mine, ours = expected.get((instance, planner)), expected.get((instance, EXACT))
    if not mine or not ours:
        return "—"
    return f"{ours / mine:.2f}×"


def speedups(result: BenchResult, heterogeneous_only: bool = True) -> dict[str, list[float]]:
    """Per baseline, hetopt's expected tokens/s ÷ the baseline's on every instance where both have a
    plan."""
    expected = expected_tokens(result)
    types = {r.instance: r.gpu_types for r in result.rows}
    out: dict[str, list[float]] = {}
    for (instance, planner), tokens in expected.items():
        ours = expected.get((instance, EXACT))
        if (
            planner.startswith(EXACT)
            or not tokens
            or not ours
            or (heterogeneous_only and types[instance] < 2)
        ):
            continue
        out.setdefault(planner, []).append(ours / tokens)
    return out


def summary(result: BenchResult) -> list[str]:
    gains = speedups(result)
    if not gains:
        return []
    lines = [
        "## hetopt's gain on the heterogeneous instances",
        "",
        "| baseline | instances | mean | geometric mean | min | max |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for planner, values in gains.items():
        v = np.array(values)
        lines.append(
            f"| {planner} | {len(v)} | {v.mean():.2f}× | {math.exp(np.log(v).mean()):.2f}× | "
            f"{v.min():.2f}× | {v.max():.2f}× |"
        )
    return [*lines, ""]


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_throughput(result: BenchResult, path: Path) -> None:
    """Expected tokens/s of each planner relative to hetopt's, per instance (hetopt = 1)."""
    plt = _plt()
    expected = expected_tokens(result)
    instances = list(dict.fromkeys(r.instance for r in result.rows))
    # the adaptive rows count tokens over the horizon, the others over `iterations`: in their own
    # table
    planners = list(
        dict.fromkeys(r.planner for r in result.rows if not r.planner.endswith(ADAPTIVE))
    )
    fig, ax = plt.subplots(figsize=(max(8, 1.1 * len(instances)), 5))
    width = 0.8 / len(planners)
    for k, planner in enumerate(planners):
        values = []
        for inst in instances:
            ours, mine = expected.get((inst, EXACT)), expected.get((inst, planner))
            values.append(mine / ours if mine and ours else 0.0)
        ax.bar(
            np.arange(len(instances)) + (k - (len(planners) - 1) / 2) * width,
            values,
            width,
            label=planner,
        )
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(np.arange(len(instances)), instances, rotation=40, ha="right", fontsize=8)
    ax.set_ylabel("tokens/s relative to hetopt (expected over scenarios)")
    ax.set_title("Throughput per planner (0 = no plan)")
    ax.legend(fontsize=8, ncols=4)
    fig.tight_layout()
    with atomic_path(path) as temp:
        fig.savefig(temp, dpi=120)
    plt.close(fig)


def plot_search_time(result: BenchResult, path: Path) -> None:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 5))
    planners = list(dict.fromkeys(r.planner for r in result.rows))
    seen = {}
    for r in result.rows:
        seen[(r.instance, r.planner)] = (r.gpus, r.search_time_s, r.status)
    for planner in planners:
        points = sorted((g, t) for (_, p), (g, t, _) in seen.items() if p == planner)
        if points:
            ax.plot(*zip(*points, strict=True), marker="o", linestyle="", label=planner, alpha=0.8)
    refused = [(g, t) for (_, p), (g, t, s) in seen.items() if s == "refused"]
    if refused:
        ax.scatter(
            *zip(*refused, strict=True),
            marker="x",
            color="black",
            s=60,
            label="refused (over budget)",
            zorder=3,
        )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("GPUs in the cluster")
    ax.set_ylabel("search time, s")
    ax.set_title("Search time against cluster size")
    ax.legend(fontsize=8)
    fig.tight_layout()
    with atomic_path(path) as temp:
        fig.savefig(temp, dpi=120)
    plt.close(fig)


def plot_iteration_times(result: BenchResult, path: Path) -> None:
    """Simulated iteration times of every planner on the instances with dynamic bandwidth
    scenarios."""
    plt = _plt()
    dynamic = [i for i in dict.fromkeys(r.instance for r in result.rows) if i in result.dynamic]
    fig, axes = plt.subplots(
        1, max(1, len(dynamic)), figsize=(max(6, 4.5 * len(dynamic)), 4.5), squeeze=False
    )
    for ax, inst in zip(axes[0], dynamic, strict=False):
        planners = [p for (i, p) in result.samples if i == inst]
        ax.boxplot([result.samples[(inst, p)] for p in planners], tick_labels=planners)
        ax.set_title(inst, fontsize=9)
        ax.set_ylabel("iteration time, s (all scenarios)")
        ax.tick_params(axis="x", rotation=40, labelsize=8)
    if not dynamic:
        axes[0][0].text(0.5, 0.5, "no instance with dynamic scenarios", ha="center", va="center")
    fig.tight_layout()
    with atomic_path(path) as temp:
        fig.savefig(temp, dpi=120)
    plt.close(fig)

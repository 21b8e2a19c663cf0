"""What a person looks at: a Chrome/Perfetto trace and a pipeline timeline picture of a
simulation."""

from __future__ import annotations

import json
from pathlib import Path

from hetopt.outputs import atomic_path, write_text
from hetopt.sim.replay import SimResult

PLAN_PIDS = 1000
"""Trace process ids per plan of an adaptive replay: plan k's template j is process k·PLAN_PIDS + j
+ 1."""
COLOURS = {
    "F": "#4C72B0",
    "B": "#55A868",
    "send": "#DD8452",
    "dp": "#C44E52",
    "opt": "#8172B3",
    "switch": "#937860",
}


def chrome_trace(result: SimResult, switches: list[dict] = ()) -> dict:
    """Trace Event Format: one process per pipeline template with a thread per replica × stage (a
    GPU group), and a network process with a thread per link that carried sends, one for the
    data-parallel all-reduces, one for the optimizer step and one for the adaptive policy's switches
    of plans (`switches`: the simulate JSON's entries, each a pause of migration + restart)."""
    events = []
    names: dict[tuple[int, int], str] = {}
    tracks: dict[str, int] = {}
    processes: dict[int, str] = {0: "network and optimizer"}
    several = any(rec.plan for rec in result.records)  # an adaptive replay ran several plans
    for rec in result.records:
        if rec.device is not None and rec.kind in ("F", "B"):
            j, r, d = rec.device
            pid, tid = rec.plan * PLAN_PIDS + j + 1, r * 1000 + d
            processes[pid] = (
                f"plan {rec.plan}, pipeline template {j}" if several else f"pipeline template {j}"
            )
            names[(pid, tid)] = f"replica {r} stage {d}"
        elif rec.kind == "dp":
            pid, tid = 0, 1
            names[(pid, tid)] = "data-parallel all-reduce"
        elif rec.kind == "send":  # one track per link (island link, NIC, or inside a node)
            pid = 0
            tid = tracks.setdefault(rec.link or "sends", 10 + len(tracks))
            names[(pid, tid)] = rec.link or "sends"
        else:
            pid, tid = 0, 3
            names[(pid, tid)] = "optimizer"
        events.append(
            {
                "name": rec.name,
                "cat": rec.kind,
                "ph": "X",
                "ts": rec.start_s * 1e6,
                "dur": max(0.0, rec.end_s - rec.start_s) * 1e6,
                "pid": pid,
                "tid": tid,
            }
        )
    for sw in switches:
        names[(0, 2)] = "plan switches"
        events.append(
            {
                "name": f"switch to plan {sw['plan']}: {sw['migration_bytes'] / 1e9:.2f} GB moved",
                "cat": "switch",
                "ph": "X",
                "ts": sw["at_s"] * 1e6,
                "dur": (sw["migration_s"] + sw["restart_s"]) * 1e6,
                "pid": 0,
                "tid": 2,
                "args": {
                    k: sw[k] for k in ("change_s", "old_s", "new_s", "break_even_s", "dwell_s")
                },
            }
        )
    for (pid, tid), name in names.items():
        events.append(
            {"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": name}}
        )
    for pid in {p for p, _ in names}:
        events.append(
            {
                "name": "process_name",
                "ph": "M",
                "pid": pid,
                "tid": 0,
                "args": {"name": processes[pid]},
            }
        )
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def write_trace(result: SimResult, path: Path, switches: list[dict] = ()) -> None:
    write_text(path, json.dumps(chrome_trace(result, switches)))


def plot_timeline(
    result: SimResult, path: Path, title: str = "", switches: list[dict] = ()
) -> None:
    """Gantt of replica 0 of every template (stages × time) and, underneath, the capacity of the
    island link that carried the most bytes; the adaptive policy's switches (`switches`) as shaded
    pauses on both."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    rows: dict[tuple[int, int, int], int] = {}  # (plan, template, stage)
    for rec in result.records:
        if rec.device is not None and rec.kind in ("F", "B") and rec.device[1] == 0:
            rows.setdefault((rec.plan, rec.device[0], rec.device[2]), 0)
    order = sorted(rows)
    several = len({plan for plan, _, _ in order}) > 1
    index = {key: i for i, key in enumerate(order)}
    fig, (ax, bw) = plt.subplots(
        2,
        1,
        figsize=(12, 2 + 0.45 * max(len(order), 2)),
        sharex=True,
        gridspec_kw={"height_ratios": [3, 1]},
    )
    # one collection per row and kind: fast
    bars: dict[tuple[int, str], list[tuple[float, float]]] = {}
    shades: dict[str, list[tuple[float, float]]] = {}
    for rec in result.records:
        if rec.device is not None and rec.kind in ("F", "B") and rec.device[1] == 0:
            y = index[(rec.plan, rec.device[0], rec.device[2])]
            bars.setdefault((y, rec.kind), []).append((rec.start_s, rec.end_s - rec.start_s))
        elif rec.kind in ("dp", "opt"):
            shades.setdefault(rec.kind, []).append((rec.start_s, rec.end_s - rec.start_s))
    for (y, kind), spans in bars.items():
        ax.broken_barh(spans, (y - 0.4, 0.8), color=COLOURS[kind])
    for kind, spans in shades.items():
        ax.broken_barh(
            spans, (0, 1), color=COLOURS[kind], alpha=0.15, transform=ax.get_xaxis_transform()
        )
    ax.set_yticks(
        range(len(order)), [f"{f'plan {k} ' if several else ''}T{j} stage {d}" for k, j, d in order]
    )
    ax.invert_yaxis()
    for sw in switches:  # training stopped: the state moves and the job restarts
        for axis in (ax, bw):
            axis.axvspan(
                sw["at_s"],
                sw["at_s"] + sw["migration_s"] + sw["restart_s"],
                color=COLOURS["switch"],
                alpha=0.35,
                hatch="//",
            )
        ax.annotate(
            f"plan {sw['plan']}",
            (sw["at_s"], 0),
            xycoords=("data", "axes fraction"),
            fontsize=7,
            xytext=(2, 2),
            textcoords="offset points",
        )
    legend = (("F", "forward"), ("B", "backward"), ("dp", "DP all-reduce"), ("opt", "optimizer"))
    legend += (("switch", "switch of plans"),) if switches else ()
    ax.legend(
        handles=[Patch(color=COLOURS[k], label=label) for k, label in legend],
        loc="lower right",
        bbox_to_anchor=(1.0, 1.0),
        fontsize=8,
        ncols=len(legend),
        frameon=False,
    )
    ax.set_title(title or "pipeline timeline (replica 0 of each template)", loc="left", fontsize=10)
    if result.capacity_trace:

        def carried(item) -> float:  # bytes both ways over the island link
            (a, b), _ = item
            u, v = f"island:{a}", f"island:{b}"
            return result.link_bytes.get((u, v), 0.0) + result.link_bytes.get((v, u), 0.0)

        link, points = max(result.capacity_trace.items(), key=carried)
        xs = [t for t, _ in points] + [result.end_s]
        ys = [g for _, g in points]
        bw.step(xs, [*ys, ys[-1]], where="post", color="#333333")
        bw.set_ylabel(f"{link[0]}–{link[1]}\nGbit/s", fontsize=8)
        bw.set_ylim(bottom=0)
    else:
        bw.text(0.5, 0.5, "no inter-island links", transform=bw.transAxes, ha="center", va="center")
    bw.set_xlabel("seconds")
    bw.set_xlim(0, result.end_s)
    fig.tight_layout()
    with atomic_path(path) as temp:
        fig.savefig(temp, dpi=110)
    plt.close(fig)

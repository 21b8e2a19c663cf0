"""The front of throughput against dollars per hour (`hetopt pareto`; docs/dollars.md).

The ε-constraint method: each point is the exact search's fastest plan under a budget B
(`SearchOptions.max_usd_per_hour`), so a proven point is a plan that no plan at most as dear beats.

1. The fastest plan, with no budget: its dollars per hour P_max.
2. Budgets on a geometric grid of `points` levels from P_max down to P_lo (`least_rent`, a lower
   bound on any plan's rent). A level within which the plan of the level above fits has that plan
   as its optimum and is not searched again; a level with no plan ends the grid.
3. While the front has fewer than `points` points: the budget just below the dollars of a point
   found (its cheaper neighbour on the front), the dearest point first.

A point whose search stopped early says so (`status`, `gap`); a plan another point beats at no more
dollars is dominated and left out, so throughput rises strictly with dollars along the front.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, replace

from hetopt.cheapest import fastest_within
from hetopt.evaluate import evaluate
from hetopt.plan import Plan, plan_json
from hetopt.search.budget import check_prices, least_rent
from hetopt.search.formulation import SolveStatus
from hetopt.search.types import SearchOptions, SearchRequest, Seed

SAME = 1e-9
"""Relative: two points this close in time (or dollars) are the same point."""
STEP = 1e-6
"""Relative: the budget just below a point's dollars, for its cheaper neighbour on the front."""


@dataclass
class Point:
    """One point of the front: the fastest plan found under `budget_usd_per_hour`."""

    budget_usd_per_hour: float | None
    usd_per_hour: float
    tokens_per_s: float
    usd_per_million_tokens: float
    iteration_time_s: float
    status: str
    gap: float | None
    plan: Plan
    gpus: str
    """What it rents, e.g. "16×A100-80GB + 4×V100-32GB"."""

    @property
    def proof(self) -> str:
        """Its status in words, with the gap where it is not proven ("no bound" where none is)."""
        if self.status == "optimal":
            return "optimal"
        return f"{self.status}, " + ("no bound" if self.gap is None else f"gap {self.gap:.1%}")

    def to_json(self) -> dict:
        return {
            "usd_per_hour": self.usd_per_hour,
            "tokens_per_s": self.tokens_per_s,
            "usd_per_million_tokens": self.usd_per_million_tokens,
            "iteration_time_s": self.iteration_time_s,
            "budget_usd_per_hour": self.budget_usd_per_hour,
            "gpus": self.gpus,
            "status": self.status,
            "gap": self.gap,
            "plan": plan_json(self.plan),
        }


def pareto_front(
    request: SearchRequest,
    points: int,
    progress: Callable[[str], None] | None = None,
) -> list[Point]:
    """The front of (tokens/s, $/h) of the instance, in rising dollars per hour.

    Parameters: request — the instance and how to search it; its `time_limit_s` is each point's;
    points — how many budget levels (module docstring), ≥ 2; progress — called with a line per
    search.
    Returns: the non-dominated points found, cheapest first.
    Raises: InputError (exit 2) where some node has no price."""
    inst = request.inst
    check_prices(inst, "hetopt pareto")
    space = request.options or SearchOptions.from_instance(inst)
    found: list[Point] = []

    def point(budget: float | None) -> Point | None:
        if progress is not None:
            under = "no budget" if budget is None else f"budget ${budget:,.2f}/h"
            progress(f"point {len(found) + 1} of at most {points}: {under}")
        # the points found within this budget start its search
        known = [
            Seed("pareto", p.iteration_time_s, p.plan)
            for p in found
            if budget is not None and p.usd_per_hour <= budget
        ]
        r = fastest_within(replace(request, options=space), budget, known)
        if r.plan is None:
            return None
        ev = evaluate(inst, r.plan)
        return Point(
            budget,
            ev.usd_per_hour,
            ev.tokens_per_s,
            ev.usd_per_million_tokens,
            ev.iteration_time_s,
            r.status.value,
            0.0 if r.status == SolveStatus.OPTIMAL else (r.gap if math.isfinite(r.gap) else None),
            r.plan,
            rented_gpus(inst, r.plan),
        )

    fastest = point(None)
    if fastest is None:
        return []
    found.append(fastest)
    low = max(least_rent(inst)[0], 1e-9)
    top, last = fastest.usd_per_hour, fastest
    for k in range(1, points):
        # geometric levels from the top down to the lower bound on any plan's rent
        budget = top * (low / top) ** (k / (points - 1))
        if last.usd_per_hour <= budget * (1 + SAME):
            continue  # the plan of the level above is within this one: its optimum here too
        p = point(budget)
        if p is None:
            break  # nothing under this level (or none found in time): nor under a lower one
        found.append(p)
        last = p
    # fewer points than asked: the neighbours just below the points found, most expensive first
    tried: set[float] = set()
    while len(front(found)) < points:
        above = [
            p for p in front(found)[::-1] if p.usd_per_hour not in tried and p.usd_per_hour > 0
        ]
        if not above:
            break
        here = above[0].usd_per_hour
        tried.add(here)
        p = point(here * (1 - STEP))
        if p is not None and all(abs(p.usd_per_hour - q.usd_per_hour) > SAME * here for q in found):
            found.append(p)
    return front(found)


def front(found: list[Point]) -> list[Point]:
    """The non-dominated points, cheapest first: each faster than every cheaper one."""
    out: list[Point] = []
    for p in sorted(found, key=lambda p: (p.usd_per_hour, p.iteration_time_s)):
        if out and p.iteration_time_s >= out[-1].iteration_time_s * (1 - SAME):
            continue  # no faster than a point that costs no more
        if out and p.usd_per_hour <= out[-1].usd_per_hour * (1 + SAME):
            out[-1] = p  # as cheap and faster
            continue
        out.append(p)
    return out


def rented_gpus(inst, plan: Plan) -> str:
    """The GPUs of the nodes a plan rents, by type: "16×A100-80GB + 4×V100-32GB"."""
    from hetopt.cost.dollars import rented_nodes
    from hetopt.placement import place

    nodes = rented_nodes(inst, place(plan, inst.cluster))
    count: Counter = Counter()
    for n in nodes:
        node = inst.cluster.nodes[n]
        count[node.gpu] += node.gpus
    return " + ".join(f"{n}×{gpu}" for gpu, n in count.items())


def plot_front(points: list[Point], path, title: str) -> None:
    """Throughput against dollars per hour, each point labelled with the GPUs it rents; a hollow
    marker for a point not proven optimal under its budget."""
    import matplotlib
    import matplotlib.ticker

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from hetopt.outputs import atomic_path

    fig, ax = plt.subplots(figsize=(8, 5))
    xs = [p.usd_per_hour for p in points]
    ys = [p.tokens_per_s for p in points]
    ax.plot(xs, ys, "-", color="0.6", zorder=1)
    for p in points:
        proven = p.status == "optimal"
        ax.scatter(
            p.usd_per_hour,
            p.tokens_per_s,
            s=50,
            zorder=2,
            facecolors="tab:blue" if proven else "white",
            edgecolors="tab:blue",
        )
        label = p.gpus if proven else f"{p.gpus} ({p.proof})"
        ax.annotate(
            label,
            (p.usd_per_hour, p.tokens_per_s),
            textcoords="offset points",
            xytext=(6, -12),
            fontsize=8,
        )
    ax.set_xlabel("US$ per hour (nodes rented + data moved over priced links)")
    ax.set_ylabel("tokens per second")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.set_xlim(0, max(xs) * 1.3)  # room for the labels of the dearest points
    ax.set_ylim(bottom=0)
    ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:,.0f}"))
    fig.tight_layout()
    with atomic_path(path) as temp:
        fig.savefig(temp, dpi=120)
    plt.close(fig)

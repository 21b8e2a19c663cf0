"""What every planner returns, and the pieces the heuristic planners share: uniform layouts (listed
by the plan space, hetopt.search.uniform), sub-clusters, and timing a candidate plan with the one
cost model (after the independent verifier)."""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from hetopt.cost.profiles import Profiles
from hetopt.errors import InfeasibleError, InputError
from hetopt.evaluate import Evaluation, evaluate
from hetopt.layout import Layout, split_layers
from hetopt.placement import place
from hetopt.plan import Pipeline, Plan, Stage
from hetopt.search.formulation import clock
from hetopt.search.roots import outside_space
from hetopt.search.types import SearchOptions, Segment
from hetopt.search.uniform import layout_plan, max_tp, uniform_layouts
from hetopt.spec.instance import Instance, instance_from_spec


@dataclass
class PlannerResult:
    planner: str
    plan: Plan | None
    objective_s: float
    """Predicted iteration time of the plan (the evaluator, stable bandwidths); inf without a
    plan."""
    search_time_s: float
    status: str
    """optimal (proven), timeout (best found, with its gap), heuristic (no proof), infeasible,
    refused."""
    gap: float | None = None
    evaluated: int = 0
    """Candidate plans the planner timed."""
    note: str = ""
    extra: dict = field(default_factory=dict)
    runners_up: list[tuple[float, Plan]] = field(default_factory=list)
    """The next fastest fitting plans it timed (at most RUNNERS_UP), fastest first: where the
    search climbs from (hetopt.search.polish)."""


RUNNERS_UP = 3
"""How many plans after its best a heuristic keeps: its rules pick one, and the best plan near
them is often near another (`proportional` on 512 A100 and V100 GPUs: its best is one template per
type, 0.503 s; its pipeline of one A100 and three V100 stages, 0.594 s, is three steps from the
search's 0.415 s)."""


class Candidates:
    """The best verified, fitting plan among those a heuristic tries, under a time budget, among the
    points of the instance's search space: a plan outside it (`outside_space`: more templates or
    device classes than `search:` allows, an option it leaves out) is not a candidate. So a
    heuristic's plan is always one the exact search covers — its bound proves the heuristic no
    better — and a user's narrowing of the space binds every planner alike."""

    def __init__(self, inst: Instance, profiles: Profiles, time_limit_s: float) -> None:
        self.inst, self.profiles = inst, profiles
        self.options = SearchOptions.from_instance(inst)
        self.outside = 0
        """Plans offered that lie outside the search space (not timed)."""
        self.outside_why: list[str] = []
        """Why the first of them lies outside (`outside_space`)."""
        self.start, self.deadline = clock(), clock() + time_limit_s
        self.best: Plan | None = None
        self.best_s = math.inf
        self.evaluated = 0
        self.runners: list[tuple[float, Plan]] = []  # the next fastest, fastest first
        self.last: Evaluation | None = None
        """The evaluation of the plan last offered (None where it was refused or could not be
        placed)."""

    @property
    def out_of_time(self) -> bool:
        return clock() > self.deadline

    def offer(self, plan: Plan, inst: Instance | None = None) -> float:
        """Time `plan` (verified and placed on the real cluster) if it is a point of the search
        space; keep it if it fits and is the fastest. Returns its iteration time, seconds (inf where
        it is outside the space, refused or does not fit)."""
        self.last = None
        if why := outside_space(self.inst, plan, self.options, self.profiles):
            self.outside += 1
            self.outside_why = self.outside_why or why
            return math.inf
        try:
            # search.placement's first
            plan = place(plan, self.inst.cluster, self.options.placements[0])
            # runs the verifier first: a rejected plan raises
            ev = evaluate(self.inst, plan, self.profiles)
        except (InfeasibleError, InputError):
            return math.inf
        self.evaluated += 1
        self.last = ev
        if ev.fits and ev.iteration_time_s < self.best_s:
            if self.best is not None:
                self._runner_up(self.best_s, self.best)
            self.best, self.best_s = plan, ev.iteration_time_s
        elif ev.fits:
            self._runner_up(ev.iteration_time_s, plan)
        return ev.iteration_time_s if ev.fits else math.inf

    def _runner_up(self, time_s: float, plan: Plan) -> None:
        """Keep `plan` among the RUNNERS_UP fastest after the best (once: a plan offered again is
        not kept twice)."""
        if any(p == plan for _, p in self.runners):
            return
        self.runners.append((time_s, plan))
        self.runners.sort(key=lambda r: r[0])
        del self.runners[RUNNERS_UP:]

    def result(self, planner: str, note: str = "") -> PlannerResult:
        status = "heuristic" if self.best is not None else "infeasible"
        if self.best is None and self.outside and not self.evaluated:
            note = (f"{note}; " if note else "") + (
                f"every candidate plan ({self.outside}) lies outside the instance's search "
                f"space, e.g. {self.outside_why[0]}: widen its `search:` section to admit them"
            )
        elif self.best is None and not note:
            note = "no candidate plan fits in memory"
        extra = {"plans_outside_space": self.outside} if self.outside else {}
        return PlannerResult(
            planner,
            self.best,
            self.best_s,
            clock() - self.start,
            status,
            None,
            self.evaluated,
            note,
            extra,
            list(self.runners),
        )


def layout_plans(
    inst: Instance, options: SearchOptions, cands: Candidates
) -> Iterator[tuple[Layout, Plan]]:
    """Every uniform layout over all of `inst`'s GPUs that can be laid out, with its plan, while
    time lasts."""
    for layout in uniform_layouts(inst, inst.cluster.total_gpus, options, max_tp(inst)):
        if cands.out_of_time:
            return
        plan = layout_plan(inst, layout)
        if plan is not None:
            yield layout, plan


def sub_instance(inst: Instance, gpu: str | None = None, as_gpu: str | None = None) -> Instance:
    """The instance on the nodes of one GPU type only (`gpu`), or with every GPU replaced by
    `as_gpu` (the view of a planner that assumes a homogeneous cluster). Node names stay the same,
    so a plan laid out on the view is a plan on the real cluster. Scenarios are dropped: the views
    are timed stable."""
    spec = inst.spec.model_copy(deep=True)
    nodes = [n for n in spec.cluster.nodes if gpu is None or n.gpu == gpu]
    if as_gpu is not None:
        nodes = [n.model_copy(update={"gpu": as_gpu}) for n in nodes]
    islands = {n.island for n in nodes}
    links = [lk for lk in spec.cluster.network.links if lk.a in islands and lk.b in islands]
    network = spec.cluster.network.model_copy(update={"links": links})
    cluster = spec.cluster.model_copy(update={"nodes": nodes, "network": network})
    spec = spec.model_copy(update={"cluster": cluster, "scenarios": []})
    base = inst.path.parent if inst.path is not None else Path(".")
    return instance_from_spec(spec, inst.name, base)


def even_pipeline(
    inst: Instance, seg: Segment, replicas: int, micro_batches: int, recompute: str
) -> Pipeline:
    """A template of one device class: `replicas` replicas of `seg.stages` stages at TP `seg.tp`,
    the layers split as evenly as possible (hetopt.layout.split_layers), `micro_batches` each."""
    return Pipeline(
        replicas=replicas,
        micro_batches=micro_batches,
        stages=[
            Stage(layers=n, gpu=seg.gpu, island=seg.island, tp=seg.tp, recompute=recompute)
            for n in split_layers(inst.model.layers, seg.stages)
        ],
    )

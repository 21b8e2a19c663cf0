"""`shares`: data parallelism per device class with the micro-batches shared out by a small integer
program — the warm start for clusters where the batch does not divide evenly among the replicas.

A *shape* is one replica of one device class: TP degree t, d stages of even layers, t·d GPUs, the
fewest stages that hold the model at that TP and the next two (more stages, less memory per GPU). A
plan of this planner is at most search.max_templates templates, each n replicas of one shape with m
micro-batches each (so one class may hold two templates of one shape, m and m + 1: the remainder of
a batch that does not divide). Which shapes, how many replicas and how many micro-batches each is
the integer program

    minimise T  subject to  Σ m·n_{s,m} = M                       (every micro-batch runs)
                            Σ_{s of class k} t_s·d_s·Σ_m n_{s,m} ≤ G_k   (GPUs of class k)
                            n_{s,m} ≤ R_s·y_{s,m},  Σ y ≤ max_templates
                            T ≥ τ_s(m)·y_{s,m}

with τ_s(m) the search's own lower bounds on a template of shape s with m micro-batches (its
pipeline bound and what its replicas cannot shed: hetopt.search.bounds.templates): exact in the
micro-batch shares, approximate in time. Each solution is timed by the evaluator
(`Candidates.offer`), and only the fastest that fits is kept: the bounds rank, the cost model
decides.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy.optimize import Bounds as Box
from scipy.optimize import LinearConstraint, milp

from hetopt.baselines.common import Candidates, PlannerResult, even_pipeline
from hetopt.baselines.uniform import min_max_split
from hetopt.cost.profiles import Profiles
from hetopt.layout import split_layers
from hetopt.placement import place
from hetopt.plan import Plan
from hetopt.search.backends.base import quiet_stdout
from hetopt.search.bounds.run import Bounds
from hetopt.search.space import tp_options
from hetopt.search.types import DEFAULT_RECOMPUTE, SearchOptions, Segment, orders
from hetopt.spec.instance import Instance

DEPTHS = 3
"""Stage counts tried per class and TP degree: the fewest that hold the model, and the next two."""
MILP_LIMIT_S = 0.2
"""Seconds HiGHS gets per program (its best solution so far is used where it runs out)."""
WINDOW = 8
"""Micro-batch counts m per shape in one program: the most that stays within SLACK of the capacity
level (`_capacity_level`), and the next WINDOW − 1 below it (fewer, to make the shares add up)."""
SLACK = 1.15
"""How far above the capacity level a shape may run: integer shares and a template limit cost
something."""
BISECTIONS = 30
"""Halvings of the capacity level's interval."""


@dataclass(frozen=True)
class Shape:
    """One replica of one device class: `seg` (TP, stages), at most `replicas` of them on the
    class, τ(m) ≈ fixed_s + per_mb_s·m its template's time with m micro-batches."""

    seg: Segment
    replicas: int
    fixed_s: float
    per_mb_s: float

    @property
    def key(self) -> tuple[str, str]:
        return (self.seg.gpu, self.seg.island)

    def most_m(self, level_s: float, total: int) -> int:
        """The most micro-batches within `level_s` (at most `total`; < stages: none fit)."""
        return min(total, math.floor((level_s - self.fixed_s) / self.per_mb_s + 1e-9))


def shares(
    inst: Instance, time_limit_s: float = 60.0, profiles: Profiles | None = None, seed: int = 0
) -> PlannerResult:
    """The fastest plan of per-class data parallelism with integer micro-batch shares (module
    docstring), one program per micro-batch size, recompute mode and set of device classes
    (`_class_subsets`), within `time_limit_s`; a heuristic (no bound)."""
    profiles = profiles or Profiles()
    options = SearchOptions.from_instance(inst)
    cands = Candidates(inst, profiles, time_limit_s)
    bounds = Bounds(inst, profiles)
    subsets = _class_subsets(inst)
    for b in sorted(options.micro_batch, reverse=True):  # the fewest micro-batches first
        total = inst.micro_batches(b)
        if total is None:
            continue
        seen: set[tuple] = set()
        for rc in sorted(options.recompute, key=DEFAULT_RECOMPUTE.index):  # least work first
            if cands.out_of_time:
                return cands.result("shares")
            found = _shapes(inst, options, bounds, b, rc, total)
            fits = frozenset((sh.seg, sh.replicas) for sh in found)
            if not found or fits in seen:
                continue  # more work for the same shapes: never faster
            seen.add(fits)
            for classes in subsets:
                if cands.out_of_time:
                    return cands.result("shares")
                on = [sh for sh in found if sh.key in classes]
                chosen = _share_out(inst, on, total, options.max_templates) if on else []
                if not chosen:
                    continue
                even = _plan(inst, b, rc, chosen)
                placements = orders(sum(n for _, n, _ in chosen), options.placements)
                for plan in filter(None, (even, _balanced(inst, profiles, even))):
                    # replica-major keeps a replica's stages together, stage-major its all-reduce
                    for order in placements:
                        cands.offer(place(plan, inst.cluster, order))
    return cands.result("shares")


def _class_subsets(inst: Instance) -> list[frozenset[tuple[str, str]]]:
    """The sets of device classes shared out over: every class, each island's, and the fastest
    classes (by peak), one fewer at a time; the time estimate leaves out what a slow class costs
    the others (the gradient exchange over a WAN, a slow stage's all-reduce), so the evaluator
    judges each."""
    cluster = inst.cluster
    keys = sorted(cluster.device_classes, key=lambda k: -inst.gpu_types[k[0]].peak_tflops)
    sets = [frozenset(keys[:n]) for n in range(len(keys), 0, -1)]
    if len(cluster.islands) > 1:
        sets += [frozenset(k for k in keys if k[1] == island) for island in cluster.islands]
    return list(dict.fromkeys(sets))


def _shapes(
    inst: Instance, options: SearchOptions, bounds: Bounds, b: int, rc: str, total: int
) -> list[Shape]:
    """Every shape whose even split fits in memory with every replica of its class (ZeRO-1 shards
    over them; fewer replicas only hold more), its time line through τ at m = stages and m =
    stages + ⌈M/R⌉ (τ: the larger of the search's pipeline bound and what the replicas cannot
    shed)."""
    layers, found = inst.model.layers, []
    t = bounds.templates

    def tau(seg: Segment, replicas: int, m: int) -> float:
        # the two parts of drained_bound that rank shapes well; drained_bound itself (with stage
        # 0's drain and R flows sharing island links) draws a steeper line through two points, and
        # its shares were slower on four of six stress instances (wan4-02 0.209 s -> 0.233 s,
        # scale768-fourhalls-02 1.145 s -> 1.322 s; the evaluator prices either way)
        return max(
            t.pipeline_bound(b, rc, (seg,), m, replicas),
            t.replica_bound(b, rc, (seg,), replicas, m),
        )

    for dc in inst.cluster.device_classes.values():
        for tp in tp_options(inst, dc, options):
            fitting = 0
            for depth in range(1, min(options.max_stages, layers) + 1):
                replicas = dc.gpus // (tp * depth)
                if replicas < 1 or fitting == DEPTHS:
                    break
                seg = Segment(dc.gpu, dc.island, tp, depth)
                caps = bounds.memory.stage_caps(b, rc, (seg,), replicas)
                if any(c < n for c, n in zip(caps, split_layers(layers, depth), strict=True)):
                    continue
                fitting += 1
                m0, m1 = depth, depth + max(1, math.ceil(total / replicas))
                t0, t1 = tau(seg, replicas, m0), tau(seg, replicas, m1)
                if not (math.isfinite(t0) and math.isfinite(t1)):
                    continue  # no bound to share out by
                per_mb = max((t1 - t0) / (m1 - m0), 1e-12)
                found.append(Shape(seg, replicas, t0 - per_mb * m0, per_mb))
    return found


def _capacity_level(shapes: list[Shape], total: int) -> float:
    """The least level T (by bisection) at which the classes, each at its shape of most
    micro-batches within T, hold all `total`: Σ_k max_s R_s·m_s(T) ≥ M; inf where none does."""

    def capacity(level: float) -> int:
        most: dict[tuple[str, str], int] = {}
        for sh in shapes:
            m = sh.most_m(level, total)
            most[sh.key] = max(most.get(sh.key, 0), sh.replicas * m if m >= sh.seg.stages else 0)
        return sum(most.values())

    high = min(sh.fixed_s + sh.per_mb_s * max(sh.seg.stages, total) for sh in shapes)
    low = 0.0
    for _ in range(BISECTIONS):
        mid = (low + high) / 2
        low, high = (low, mid) if capacity(mid) >= total else (mid, high)
    return high


def _share_out(
    inst: Instance, shapes: list[Shape], total: int, max_templates: int
) -> list[tuple[Segment, int, int]]:
    """The integer program's (segment, replicas, micro-batches) per template; [] where it finds
    none."""
    level = _capacity_level(shapes, total) * SLACK
    columns: list[tuple[Shape, int, int]] = []  # (shape, m, most replicas)
    for sh in shapes:
        top = sh.most_m(level, total)
        columns += [
            (sh, m, min(sh.replicas, total // m))
            for m in range(max(sh.seg.stages, top - WINDOW + 1), top + 1)
        ]
    if not columns:
        return []
    n = len(columns)
    # variables: n_j (replicas of column j), y_j (column j used), T
    rows, lo, hi = [], [], []

    def row(coeffs: dict[int, float], low: float, high: float) -> None:
        vec = np.zeros(2 * n + 1)
        for i, v in coeffs.items():
            vec[i] = v
        rows.append(vec)
        lo.append(low)
        hi.append(high)

    row({j: m for j, (_, m, _) in enumerate(columns)}, total, total)
    for key in {sh.key for sh, _, _ in columns}:
        width = {
            j: sh.seg.tp * sh.seg.stages for j, (sh, _, _) in enumerate(columns) if sh.key == key
        }
        row(width, 0, inst.cluster.device_classes[key].gpus)
    for j, (sh, m, most) in enumerate(columns):
        row({j: 1.0, n + j: -most}, -np.inf, 0)
        row({2 * n: 1.0, n + j: -(sh.fixed_s + sh.per_mb_s * m)}, 0, np.inf)
    row({n + j: 1.0 for j in range(n)}, 0, max_templates)
    cost = np.zeros(2 * n + 1)
    cost[-1] = 1.0
    upper = np.array([most for _, _, most in columns] + [1] * n + [np.inf], dtype=float)
    with quiet_stdout():  # HiGHS's MIP solver prints to file descriptor 1 itself
        result = milp(
            cost,
            constraints=LinearConstraint(np.array(rows), lo, hi),
            integrality=np.array([1] * (2 * n) + [0]),
            bounds=Box(np.zeros(2 * n + 1), upper),
            options={"time_limit": MILP_LIMIT_S},
        )
    if result.x is None:
        return []
    counts = np.round(result.x[:n]).astype(int)
    return [(sh.seg, int(c), m) for (sh, m, _), c in zip(columns, counts, strict=True) if c > 0]


def _balanced(inst: Instance, profiles: Profiles, plan: Plan) -> Plan | None:
    """`plan` with each pipeline's layers split to even out its stages' compute (the min-max split
    of hetopt.baselines.uniform, template by template: the first stage holds the embedding, the
    last the head); None where no split changes. Memory is the evaluator's to judge."""
    pipelines = []
    for pipe in plan.pipelines:
        alone = plan.model_copy(update={"pipelines": [pipe]})
        layers = min_max_split(inst, profiles, alone) if len(pipe.stages) > 1 else None
        stages = [
            st.model_copy(update={"layers": n})
            for st, n in zip(pipe.stages, layers or [st.layers for st in pipe.stages], strict=True)
        ]
        pipelines.append(pipe.model_copy(update={"stages": stages}))
    balanced = plan.model_copy(update={"pipelines": pipelines})
    return None if balanced == plan else balanced


def _plan(inst: Instance, b: int, rc: str, chosen: list[tuple[Segment, int, int]]) -> Plan:
    """The plan of the templates `chosen`: (segment, replicas, micro-batches), layers even."""
    pipelines = [even_pipeline(inst, seg, n, m, rc) for seg, n, m in chosen]
    return Plan(micro_batch=b, schedule="1f1b", virtual_stages=1, zero=1, pipelines=pipelines)

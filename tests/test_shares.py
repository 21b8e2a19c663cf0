"""The `shares` warm start: per-class data parallelism whose micro-batches are shared out by a small
integer program where the batch does not divide among the replicas."""

from __future__ import annotations

from pathlib import Path

import pytest

from hetopt.baselines.common import PlannerResult
from hetopt.baselines.data_parallel import data_parallel
from hetopt.baselines.exhaustive import exhaustive
from hetopt.baselines.shares import shares
from hetopt.evaluate import evaluate
from hetopt.search.roots import outside_space
from hetopt.search.types import SearchOptions
from hetopt.spec.instance import load_instance
from hetopt.verify import check_plan

SMALL = Path(__file__).parent / "small"


def test_uneven_shares_use_every_gpu_where_even_shares_leave_some_idle():
    """s11: 6 T4, a replica needs 2 stages, 20 micro-batches. Even shares run 2 replicas of 10 (4
    GPUs, 1.740 s), and the `data-parallel` warm start, whose layouts use every GPU of a set, finds
    no plan (20 does not divide among 3 replicas); shared out, 2 replicas take 7 and one 6, all 6
    GPUs busy: 1.610 s (both worked out in the instance's header). The plan is a point of the space,
    it verifies, and its time is the evaluator's."""
    inst = load_instance(SMALL / "s11-uneven-shares.yaml")
    even = data_parallel(inst, 10.0)
    shared = shares(inst, 10.0)
    assert even.plan is None
    assert shared.objective_s == pytest.approx(1.610, abs=5e-4)
    plan = shared.plan
    assert sorted((p.replicas, p.micro_batches, len(p.stages)) for p in plan.pipelines) == [
        (1, 6, 2),
        (2, 7, 2),
    ]
    assert outside_space(inst, plan, SearchOptions.from_instance(inst)) == []
    assert check_plan(inst, plan) == []
    assert evaluate(inst, plan).iteration_time_s == pytest.approx(shared.objective_s, rel=1e-12)


@pytest.mark.parametrize("name", ["s2-a100-v100", "s5-l4-a10g", "s24-five-zones"])
def test_shares_never_beat_the_exhaustive_optimum_and_stay_in_the_space(name):
    """On mixed clusters (two types; two types on two islands; five zones) the shared-out plan is a
    point of the space that verifies, so it is never faster than exhaustive enumeration's optimum;
    on s5 (L4 beside A10G) it is the optimum."""
    inst = load_instance(SMALL / f"{name}.yaml")
    shared = shares(inst, 10.0)
    best = exhaustive(inst).objective_s
    assert shared.plan is not None
    assert outside_space(inst, shared.plan, SearchOptions.from_instance(inst)) == []
    assert check_plan(inst, shared.plan) == []
    assert shared.objective_s >= best * (1 - 1e-9)
    if name == "s5-l4-a10g":
        assert shared.objective_s == pytest.approx(best, rel=1e-9)


def test_every_warm_start_runs_and_the_budget_left_goes_to_the_next(monkeypatch):
    """The warm starts run in WARM_ORDER, each with its weight's part of what is left of all their
    budgets: planners that return at once leave it all to the last (4 × 1 s here, so the first gets
    4·1/6 s of weight 1 in 6 and the last about all 4 s); the seeds come back in
    WARM_START_PLANNERS' order (the first kept on a tie), and on s11 the best is the shared-out plan
    (1.610 s, the instance's header)."""
    import hetopt.planners as planners
    from hetopt.cost.profiles import Profiles

    assert sorted(planners.WARM_ORDER) == sorted(planners.WARM_START_PLANNERS)
    inst = load_instance(SMALL / "s11-uneven-shares.yaml")
    given: dict[str, float] = {}

    def instant(name):
        def planner(inst, time_limit_s, profiles):
            given[name] = time_limit_s
            return shares(inst, 10.0) if name == "shares" else PlannerResult(name, None, 0, 0, "")

        return planner

    fakes = {name: instant(name) for name in planners.WARM_START_PLANNERS}
    monkeypatch.setattr(planners, "WARM_START_PLANNERS", fakes)
    seeds = planners.heuristic_seeds(inst, Profiles(), "stable", 1.0)
    assert list(given) == list(planners.WARM_ORDER)
    total = sum(planners.WARM_ORDER.values())
    first = next(iter(planners.WARM_ORDER))
    assert given[first] == pytest.approx(4.0 * planners.WARM_ORDER[first] / total, abs=0.05)
    # `shares` ran for real before it: the last gets what is left of the 4 s, not its 2.5/6
    assert given["data-parallel"] > 4.0 * 2.5 / total + 0.05
    # its best first, then its runners-up (for the polish), each no faster than the best
    assert {s.planner for s in seeds} == {"shares"}
    assert seeds[0].objective_s == pytest.approx(1.610, abs=5e-4)
    assert all(s.objective_s >= seeds[0].objective_s for s in seeds[1:])

    monkeypatch.setattr(planners, "WARM_START_PLANNERS", {n: instant_seed(n) for n in fakes})
    seeds = planners.heuristic_seeds(inst, Profiles(), "stable", 1.0)
    assert [s.planner for s in seeds] == list(fakes)  # the planners' order, not the run order


def instant_seed(name):
    """A warm start that returns s11's shared-out plan at once, as planner `name`."""

    def planner(inst, time_limit_s, profiles):
        found = shares(inst, 10.0)
        return PlannerResult(name, found.plan, found.objective_s, 0, "heuristic")

    return planner

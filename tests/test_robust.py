"""Scenario-robust objectives (hetopt.search.robust): links priced by transfer time over the horizon
the simulator replays, `worst` at the lowest bandwidth in it; and the acceptance that on every
bundled dynamic instance the `worst` plan's predicted time is ≥ 0.97 × its slowest simulated
iteration."""

from __future__ import annotations

import json
import math

import pytest
import yaml
from conftest import DEMO, REPO, run_hetopt

from hetopt.cost.profiles import Profiles
from hetopt.errors import InputError
from hetopt.evaluate import plan_features, price
from hetopt.layout import expand_layout, parse_layout
from hetopt.placement import place
from hetopt.planners import solve_ilp
from hetopt.search.robust import aggregate, link_gbps, planning_scenarios
from hetopt.search.types import SearchRequest
from hetopt.sim.engine import Simulation
from hetopt.simulate import simulate
from hetopt.spec.cluster import island_vertex
from hetopt.spec.instance import load_instance
from hetopt.spec.scenarios import DEFAULT_HORIZON_S

LINK = ("a", "b")
UPLINK = ("rack0", "rack1")
SLOWEST_SHARE = 0.97
"""The acceptance (issue 11): worst's predicted time ≥ 0.97 × the slowest simulated iteration. The
3% is what the simulator may add at constant bandwidth (flows contending for a link, which the
analytic model does not see), not slack in the pricing."""


def _priced(cluster, a: str, b: str) -> float:
    return cluster.graph.edges[island_vertex(a), island_vertex(b)]["gbps"]


def _demo_with(tmp_path, scenarios=None, **search):
    data = yaml.safe_load(DEMO.read_text())
    if scenarios is not None:
        data["scenarios"] = scenarios
    data.setdefault("search", {}).update(search)
    path = tmp_path / "demo.yaml"
    path.write_text(yaml.safe_dump(data))
    return load_instance(path)


# -- the pricing rules, by hand ----------------------------------------------------------------


def test_a_link_flapping_between_400_and_50_is_priced_as_89_gbps():
    # 5 s at 400, 5 s at 50, ... for 60 s: a transfer of B bytes takes B·(1/400 + 1/50)/2 on
    # average, as at 2 / (1/400 + 1/50) = 800/9 = 88.9 Gbit/s; the time average of the bandwidth
    # (225, the rule before) is 2.5× that.
    changes = [(5.0 * k, LINK, 400.0 if k % 2 == 0 else 50.0) for k in range(12)]
    expected = link_gbps(changes, {LINK: 400.0}, 60.0, "expected")[LINK]
    assert expected == pytest.approx(800 / 9, rel=1e-12)
    assert link_gbps(changes, {LINK: 400.0}, 60.0, "cvar")[LINK] == expected
    assert link_gbps(changes, {LINK: 400.0}, 60.0, "worst")[LINK] == 50.0


def test_a_drop_for_half_the_horizon_and_the_edges_of_a_trace():
    nominal = {LINK: 400.0}
    # the demo's congested uplink: 100 for 30 s, then 400: 60 / (30/100 + 30/400) = 160
    drop = [(0.0, LINK, 100.0), (30.0, LINK, 400.0)]
    assert link_gbps(drop, nominal, 60.0, "expected")[LINK] == pytest.approx(160.0, rel=1e-12)
    assert link_gbps(drop, nominal, 60.0, "worst")[LINK] == 100.0
    assert link_gbps(drop, nominal, 20.0, "expected")[LINK] == pytest.approx(100.0, rel=1e-12)
    # no change: the nominal bandwidth; a change at t = 0 replaces it (held 0 s, it does not count)
    assert link_gbps([], nominal, 60.0, "worst")[LINK] == 400.0
    assert link_gbps([(0.0, LINK, 800.0)], nominal, 60.0, "worst")[LINK] == 800.0
    # two changes at one instant: the later holds, as the simulator applies them
    both = [(10.0, LINK, 20.0), (10.0, LINK, 200.0)]
    assert link_gbps(both, nominal, 60.0, "worst")[LINK] == 200.0
    # past H is outside; the level that starts at H counts for worst (the last iteration runs under
    # it) and weighs nothing in the mean
    assert link_gbps([(61.0, LINK, 10.0)], nominal, 60.0, "worst")[LINK] == 400.0
    at_h = [(60.0, LINK, 10.0)]
    assert link_gbps(at_h, nominal, 60.0, "worst")[LINK] == 10.0
    assert link_gbps(at_h, nominal, 60.0, "expected")[LINK] == pytest.approx(400.0, rel=1e-12)
    # other links keep their own traces
    other = ("c", "d")
    assert link_gbps(drop, {**nominal, other: 50.0}, 60.0, "worst")[other] == 50.0


def test_the_instance_horizon_sets_what_each_objective_prices(tmp_path):
    demo = load_instance(DEMO)
    assert demo.horizon_s == DEFAULT_HORIZON_S == 60.0
    priced = {
        objective: {
            sc.name: _priced(sc.instance.cluster, *UPLINK)
            for sc in planning_scenarios(demo, objective)
        }
        for objective in ("expected", "worst", "cvar")
    }
    assert priced["expected"] == pytest.approx(
        {"calm": 400.0, "congested-uplink": 160.0}, rel=1e-12
    )
    assert priced["cvar"] == priced["expected"]
    assert priced["worst"] == {"calm": 400.0, "congested-uplink": 100.0}
    assert [sc.instance for sc in planning_scenarios(demo, "stable")] == [demo]
    # a 20 s horizon lies inside the 30 s congestion: every objective prices it at 100
    short = _demo_with(tmp_path, horizon_s=20)
    assert short.horizon_s == 20.0
    for objective in ("expected", "worst"):
        congested = planning_scenarios(short, objective)[1]
        assert _priced(congested.instance.cluster, *UPLINK) == pytest.approx(100.0, rel=1e-12)


def test_a_horizon_that_is_not_positive_is_bad_input(tmp_path):
    with pytest.raises(InputError) as err:
        _demo_with(tmp_path, horizon_s=0)
    assert "search.horizon_s" in str(err.value)


# -- one horizon for the planner and the simulator ---------------------------------------------


def test_the_planner_prices_the_trace_the_simulator_replays(tmp_path):
    flap = {
        "name": "flap",
        "probability": 0.6,
        "generator": {
            "kind": "markov",
            "link": list(UPLINK),
            "levels_gbps": [400, 50],
            "mean_dwell_s": 3,
            "seed": 5,
        },
    }
    calm = {
        "name": "calm",
        "probability": 0.4,
        "events": [{"at_s": 0, "link": list(UPLINK), "gbps": 400}],
    }
    inst = _demo_with(tmp_path, [calm, flap], horizon_s=50)
    # DP over the uplink, about 15 s an iteration
    plan = place(expand_layout(inst, parse_layout("tp=8,pp=1,dp=4")), inst.cluster)
    horizon = inst.horizon_s

    # `hetopt simulate`'s default replay: iterations start until the horizon; one for a constant
    # scenario
    summary = {s["name"]: s for s in simulate(inst, plan, workers=1)[0]["scenarios"]}
    assert summary["calm"]["iterations"] == 1
    replay = summary["flap"]
    assert replay["iterations"] >= 3 and replay["replayed_s"] >= horizon
    # the last iteration began before H
    assert replay["replayed_s"] - horizon < replay["iteration_time_s"]["max"]

    # the simulator's applied capacity trace over [0, H], integrated here independently
    run = Simulation(inst, plan).run(inst.scenarios(horizon)[1], until_s=horizon)
    trace = run.capacity_trace[UPLINK]
    ends = [t for t, _ in trace[1:]] + [math.inf]
    seconds_per_gbit = sum(
        (min(end, horizon) - t) / g for (t, g), end in zip(trace, ends, strict=True) if t < horizon
    )
    lowest = min(g for (t, g), end in zip(trace, ends, strict=True) if t <= horizon and end > t)
    assert len({g for _, g in trace}) == 2  # it did flap inside the horizon
    priced = {
        objective: _priced(planning_scenarios(inst, objective)[1].instance.cluster, *UPLINK)
        for objective in ("expected", "worst")
    }
    assert priced["expected"] == pytest.approx(horizon / seconds_per_gbit, rel=1e-12)
    assert priced["worst"] == lowest == 50.0


# -- the acceptance: worst is never more optimistic than the slowest simulated iteration -------

DYNAMIC = sorted(
    p.stem
    for p in (REPO / "instances").glob("*.yaml")
    if yaml.safe_load(p.read_text()).get("scenarios")
)


def test_the_bundled_dynamic_instances_are_all_checked():
    named = {"wan-flapping-a100-v100", "two-dc-wan-diurnal", "zone-pair-flapping-l4-a10g"}
    assert named <= set(DYNAMIC)


@pytest.mark.parametrize("name", DYNAMIC)
def test_worst_is_never_below_the_slowest_simulated_iteration(name):
    inst, profiles = load_instance(name), Profiles()
    # a short time limit: what is checked is the price of the plan returned, not its optimality
    result = solve_ilp(
        SearchRequest(inst, objective="worst", time_limit_s=3.0, profiles=profiles, workers=1)
    )
    plan = place(result.plan, inst.cluster)
    scenarios = planning_scenarios(inst, "worst")
    priced = [
        price(sc.instance, plan, plan_features(sc.instance, plan), profiles).iteration_time_s
        for sc in scenarios
    ]
    predicted = aggregate(priced, [sc.probability for sc in scenarios], "worst")
    # what `hetopt simulate` replays by default
    for replay in simulate(inst, plan, profiles=profiles, workers=1)[0]["scenarios"]:
        slowest = replay["iteration_time_s"]["max"]
        assert predicted >= SLOWEST_SHARE * slowest, (replay["name"], predicted, slowest)


@pytest.mark.parametrize("layout", ["tp=8,pp=1,dp=4", "tp=4,pp=1,dp=8"])
def test_each_scenario_priced_for_worst_bounds_its_own_slowest_iteration(tmp_path, layout):
    """Scenario by scenario, on plans whose gradient all-reduce crosses the demo's uplink: the
    lowest bandwidth prices the slowest iteration within the simulator's constant-bandwidth
    difference, where the time average of the bandwidth (the rule before) prices it well below."""
    demo = yaml.safe_load(DEMO.read_text())["scenarios"]  # calm 0.7, congested-uplink 0.3
    flap = {
        "name": "flap",
        "probability": 0.3,
        "generator": {
            "kind": "markov",
            "link": list(UPLINK),
            "levels_gbps": [400, 50],
            "mean_dwell_s": 5,
            "seed": 7,
        },
    }
    inst = _demo_with(tmp_path, [{**demo[0], "probability": 0.4}, demo[1], flap])
    plan = place(expand_layout(inst, parse_layout(layout)), inst.cluster)
    replays = {r["name"]: r for r in simulate(inst, plan, workers=1)[0]["scenarios"]}
    horizon = inst.horizon_s
    for sc, trace in zip(planning_scenarios(inst, "worst"), inst.scenarios(horizon), strict=True):
        slowest = replays[sc.name]["iteration_time_s"]["max"]
        worst = price(
            sc.instance, plan, plan_features(sc.instance, plan), Profiles()
        ).iteration_time_s
        assert SLOWEST_SHARE * slowest <= worst <= slowest / SLOWEST_SHARE, sc.name
        if sc.name == "flap":
            # the markov trace sets the link at t = 0, so its changes cover [0, H]
            changes = [(t, g) for t, _, g in trace.changes if t < horizon]
            ends = [t for t, _ in changes[1:]] + [horizon]
            mean_gbps = (
                sum((end - t) * g for (t, g), end in zip(changes, ends, strict=True)) / horizon
            )
            averaged = inst.on_network({UPLINK: mean_gbps})
            before = price(averaged, plan, plan_features(averaged, plan), Profiles())
            assert before.iteration_time_s < SLOWEST_SHARE * slowest


def test_solve_worst_from_the_command_line_against_its_own_replay():
    result = run_hetopt(
        "solve", "wan-flapping-a100-v100", "--objective", "worst", "--time-limit", "3", "--json"
    )
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    slowest = max(s["iteration_time_s"]["max"] for s in data["verified"]["scenarios"])
    assert data["objective_s"] >= SLOWEST_SHARE * slowest

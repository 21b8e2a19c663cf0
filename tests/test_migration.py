"""Migration cost of a plan switch (issue 15, hetopt/replan/migration.py), worked by hand."""

from __future__ import annotations

import pytest

from hetopt.cost.flops import layer_params
from hetopt.cost.profiles import Profiles
from hetopt.cost.terms import LAT, NET, STEP
from hetopt.plan import Plan
from hetopt.replan.migration import migration
from hetopt.spec.instance import load_instance

INSTANCE = """
name: v100-a100-pair
model: {layers: 8, hidden: 1024, heads: 8, vocab: 8000, max_seq_len: 512}
training: {seq_len: 512, global_batch: 8}
cluster:
  nodes:
    - {name: v, count: 1, gpu: V100-32GB, gpus_per_node: 1, island: r0, nic_gbps: 100}
    - {name: a, count: 1, gpu: A100-80GB, gpus_per_node: 1, island: r0, nic_gbps: 100}
"""


def _plan(v100_layers: int) -> Plan:
    return Plan.model_validate(
        {
            "micro_batch": 1,
            "pipelines": [
                {
                    "replicas": 1,
                    "micro_batches": 8,
                    "stages": [
                        {"layers": v100_layers, "gpu": "V100-32GB", "island": "r0", "tp": 1},
                        {"layers": 8 - v100_layers, "gpu": "A100-80GB", "island": "r0", "tp": 1},
                    ],
                }
            ],
        }
    )


def test_a_layer_moving_from_the_v100_to_the_a100_moves_its_weights_and_optimizer_state_once(
    tmp_path,
):
    """Layers 5 | 3 → 4 | 4: layer 4 leaves the V100 stage for the A100 stage. Its 16-bit weights (2
    bytes per parameter) and its optimizer state (fp32 master and two Adam moments, 12 bytes) cross
    the one route v-0 → a-0, once: 14·P bytes, P = 12,596,224 for h = 1024 (4h² + 8h² + biases 9h +
    norms 4h) — 176,347,136 bytes. Its time: the bytes over that route's bandwidth, its latency and
    α, priced as the evaluator prices a send. Nothing moves back, and a switch to the same plan
    moves nothing."""
    path = tmp_path / "pair.yaml"
    path.write_text(INSTANCE)
    inst = load_instance(path)
    params = layer_params(inst.model)
    assert params == 12 * 1024**2 + 13 * 1024 == 12_596_224
    moved = migration(inst, _plan(5), _plan(4))
    assert moved.bytes_by_route == {("v-0", "a-0"): pytest.approx(14 * params)}
    assert moved.total_bytes == pytest.approx(176_347_136)
    # the cost model's alpha-beta send (comm.transfer) at the calibrated network weights: one flow
    # alone on its route, so at the route's effective bandwidth (its fabric's η), one step, its
    # latency and α
    route = inst.cluster.route("v-0", "a-0")
    w = Profiles().for_gpu(inst.gpu_types["V100-32GB"]).w
    by_hand = (
        8 * 14 * params / (route.effective_gbps * 1e9) * w[NET]
        + w[STEP]
        + (route.latency_us * 1e-6 + route.alpha_s) * w[LAT]
    )
    assert moved.time_s == pytest.approx(by_hand, rel=1e-12)
    line_rate_s = 8 * 14 * params / 100e9  # 176 MB over a 100 Gbit/s NIC: 14.1 ms at its line rate
    # 14.55 ms: the route's η, α and latency on top
    assert line_rate_s <= moved.time_s < 1.1 * line_rate_s
    back = migration(inst, _plan(4), _plan(5))
    assert back.bytes_by_route == {("a-0", "v-0"): pytest.approx(14 * params)}
    same = migration(inst, _plan(5), _plan(5))
    assert same.bytes_by_route == {} and same.time_s == 0.0


def test_with_two_replicas_each_new_holder_takes_the_weights_and_its_own_optimizer_shard(tmp_path):
    """Two copies of the same pipeline under ZeRO-1: the optimizer state of a layer is split over
    the two copies (12·P/2 bytes each), its weights are whole on each. Layer 4 moving to the A100s
    moves the weights twice (2·2·P) and each optimizer half once (2·6·P): 16·P bytes in all."""
    path = tmp_path / "pairs.yaml"
    path.write_text(
        INSTANCE.replace("count: 1", "count: 2").replace("global_batch: 8", "global_batch: 16")
    )
    inst = load_instance(path)
    params = layer_params(inst.model)

    def plan(v100_layers: int) -> Plan:
        one = _plan(v100_layers).model_dump()
        one["pipelines"][0]["replicas"] = 2
        return Plan.model_validate(one)

    moved = migration(inst, plan(5), plan(4))
    assert moved.total_bytes == pytest.approx(16 * params)
    assert {dst for _, dst in moved.bytes_by_route} == {"a-0", "a-1"}
    assert all(src.startswith("v-") for src, _ in moved.bytes_by_route)


def test_replan_switches_when_the_gain_outlasts_the_migration_and_stays_when_it_cannot(tmp_path):
    """The demo's optimum with its rack link cut from 100 to 25 Gbit/s: the whole space holds a plan
    far faster on the new link. Switching pays once the new bandwidth has lasted M / (1 − t_new /
    t_old) seconds (M the migration): over 600 s it switches; over a dwell below that break-even it
    stays."""
    import json

    from conftest import run_hetopt

    from hetopt.replan.decide import replan

    plan_path = tmp_path / "demo.json"
    solved = run_hetopt("solve", "demo", "--time-limit", "30", "--out", str(plan_path))
    assert solved.returncode == 0, solved.stderr
    inst = load_instance("demo")
    current = Plan.model_validate(json.loads(plan_path.read_text()))
    long = replan(
        inst,
        current,
        bandwidth={("rack0", "rack1"): 25.0},
        dwell_s=600.0,
        full=True,
        time_limit_s=20,
    )
    assert long.found_by == "search" and long.new_s < long.current_s
    assert long.break_even_s == pytest.approx(
        long.migration.time_s / (1 - long.new_s / long.current_s)
    )
    assert long.decision == "switch" and long.migration.total_bytes > 0
    short = replan(
        inst,
        current,
        bandwidth={("rack0", "rack1"): 25.0},
        dwell_s=long.break_even_s / 2,
        full=True,
        time_limit_s=20,
        restart_s=0.0,
    )
    assert short.decision == "stay" and short.new_s == pytest.approx(long.new_s)
    slower_restart = replan(
        inst,
        current,
        bandwidth={("rack0", "rack1"): 25.0},
        dwell_s=600.0,
        full=True,
        time_limit_s=20,
        restart_s=10_000.0,
    )
    assert slower_restart.decision == "stay"  # a restart of hours is never paid back in ten minutes


def test_replan_refuses_bad_input_with_exit_2(tmp_path):
    from conftest import run_hetopt

    plan_path = tmp_path / "other.json"
    plan_path.write_text(json_plan := _plan(5).model_dump_json())
    assert json_plan
    other = run_hetopt("replan", "demo", "--plan", str(plan_path), "--bandwidth", "rack0-rack1=25")
    assert other.returncode == 2 and "Traceback" not in other.stderr
    path = tmp_path / "pair.yaml"
    path.write_text(INSTANCE)
    no_link = run_hetopt("replan", str(path), "--plan", str(plan_path), "--bandwidth", "r0-r9=25")
    assert no_link.returncode == 2 and "ISLAND-ISLAND=GBPS" in no_link.stderr
    demo_plan = tmp_path / "demo.json"
    assert (
        run_hetopt("solve", "demo", "--time-limit", "20", "--out", str(demo_plan)).returncode == 0
    )
    negative = run_hetopt(
        "replan", "demo", "--plan", str(demo_plan), "--bandwidth", "rack0-rack1=-5"
    )
    assert negative.returncode == 2 and "above 0" in negative.stderr
    neither = run_hetopt("replan", "demo", "--plan", str(demo_plan))
    assert neither.returncode == 2 and "--scenario" in neither.stderr


def test_the_full_search_starts_from_the_plan_it_is_given():
    """`hetopt replan --full` hands the running plan (re-split) to the search as its first
    incumbent: a search with no time to solve anything returns it, no worse; with time, the optimum
    (proven)."""
    from hetopt.planners import solve_ilp
    from hetopt.search.types import SearchRequest, Seed

    inst = load_instance("wan-step-a100-v100")
    best = solve_ilp(SearchRequest(inst, time_limit_s=60))
    known = {"planner": "running plan", "objective_s": best.objective_s, "plan": best.plan}
    rushed = solve_ilp(
        SearchRequest(inst, time_limit_s=1e-3), warm_start=False, known=[Seed(**known)]
    )
    assert rushed.plan is not None and rushed.objective_s == pytest.approx(
        best.objective_s, rel=1e-12
    )
    proven = solve_ilp(
        SearchRequest(inst, time_limit_s=60), warm_start=False, known=[Seed(**known)]
    )
    assert proven.status.value == "optimal" and proven.objective_s == pytest.approx(
        best.objective_s, rel=1e-9
    )

"""The discrete-event simulator: hand-worked timelines, max-min fair flows, dynamic links, agreement
with the analytic evaluator, traces and plots."""

from __future__ import annotations

import json

import numpy as np
import pytest
import yaml
from conftest import DEMO, run_hetopt

from hetopt.evaluate import BWD, FWD, evaluate
from hetopt.layout import expand_layout, parse_layout
from hetopt.plan import Pipeline, Plan, Stage
from hetopt.sim.engine import Simulation
from hetopt.sim.network import Network, max_min_rates
from hetopt.sim.priced import Transfer
from hetopt.sim.schedules import device_ops
from hetopt.spec.instance import load_instance
from hetopt.spec.scenarios import BandwidthScenario

STABLE = BandwidthScenario("stable", 1.0, ())


# -- hand-worked pipeline timelines
# ------------------------------------------------------------------------


def _pipeline_sim(tmp_path, fwd, bwd, micro_batches, schedule="1f1b", vp=1):
    """4 stages on one node with the given per-stage forward/backward times and free
    communication."""
    p = len(fwd)
    data = {
        "name": "hand",
        "model": {"layers": 8, "hidden": 256, "heads": 4, "vocab": 1000},
        "training": {"seq_len": 128, "global_batch": micro_batches},
        "cluster": {
            "nodes": [
                {"name": "n", "count": 1, "gpu": "A100-80GB", "gpus_per_node": p, "nic_gbps": 100}
            ]
        },
    }
    path = tmp_path / "hand.yaml"
    path.write_text(yaml.safe_dump(data))
    inst = load_instance(path)
    plan = expand_layout(inst, parse_layout(f"tp=1,pp={p},dp=1,mb=1,vp={vp},schedule={schedule}"))
    sim = Simulation(inst, plan)
    for d in range(p):
        sim.times[0][d] = np.zeros_like(sim.times[0][d])
        sim.times[0][d][FWD], sim.times[0][d][BWD] = fwd[d], bwd[d]
        for e in range(p):
            sim.transfers[((0, 0, d), (0, 0, e))] = Transfer(0.0)
    return sim


def _reference_schedule(fwd, bwd, m, schedule, vp=1):
    """An independent list scheduler: every op starts when its device is free and its input is
    there."""
    p = len(fwd)
    orders = {d: device_ops(schedule, p, m, d, vp) for d in range(p)}
    done, free, pos = {}, dict.fromkeys(range(p), 0.0), dict.fromkeys(range(p), 0)
    progress = True
    while progress:
        progress = False
        for d in range(p):
            while pos[d] < len(orders[d]):
                kind, chunk, mb = orders[d][pos[d]]
                v = chunk * p + d
                need = (
                    ("F", v - 1, mb)
                    if kind == "F" and v > 0
                    else ("B", v + 1, mb)
                    if kind == "B" and v < p * vp - 1
                    else None
                )
                if need is not None and need not in done:
                    break
                start = max(free[d], done.get(need, 0.0))
                free[d] = start + (fwd[d] if kind == "F" else bwd[d]) / vp
                done[(kind, v, mb)] = free[d]
                pos[d] += 1
                progress = True
    return max(done.values()), done


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
def test_uniform_four_stage_timeline_matches_the_hand_computation(tmp_path, schedule):
    # f = 1, b = 2, p = 4, m = 8: (m + p − 1)(f + b) = 33 for both schedules
    sim = _pipeline_sim(tmp_path, [1, 1, 1, 1], [2, 2, 2, 2], 8, schedule)
    result = sim.run(STABLE, record=True)
    assert result.iteration_times_s[0] == pytest.approx(33.0)
    stage0 = [(r.name, r.start_s, r.end_s) for r in result.records if r.device == (0, 0, 0)]
    if schedule == "1f1b":
        # warm-up F0..F3, then B0 once its gradient came back down: F0 reaches stage 3 at t = 3, the
        # backward chain takes 2 s per stage, so stage 0 runs B0 from 10 to 12.
        assert [n for n, _, _ in stage0[:6]] == ["F0", "F1", "F2", "F3", "B0", "F4"]
        assert stage0[4][1:] == (10.0, 12.0)
    else:
        assert [n for n, _, _ in stage0[:9]] == [*(f"F{i}" for i in range(8)), "B0"]
        assert stage0[-1][2] == pytest.approx(33.0)


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
def test_heterogeneous_stage_times_match_an_independent_scheduler(tmp_path, schedule):
    fwd, bwd = [1.0, 2.5, 1.5, 0.5], [2.0, 5.0, 3.0, 1.0]
    sim = _pipeline_sim(tmp_path, fwd, bwd, 8, schedule)
    result = sim.run(STABLE, record=True)
    expected, ends = _reference_schedule(fwd, bwd, 8, schedule)
    assert result.iteration_times_s[0] == pytest.approx(expected)
    ours = {
        (r.name[0], r.device[2], int(r.name[1:])): r.end_s for r in result.records if r.kind in "FB"
    }
    assert ours == pytest.approx(ends)
    # The analytic model's closed form Σ τ + (m − 1)·max τ (docs/cost-model.md) is exact for uniform
    # stages and an upper bound otherwise: with the bottleneck in the middle, part of the fill and
    # drain through the faster stages hides behind it (1F1B: 65 s exact vs 69 s; GPipe: the same
    # bound).
    tau = [f + b for f, b in zip(fwd, bwd, strict=True)]
    assert expected <= sum(tau) + 7 * max(tau) + 1e-9


def test_interleaving_shrinks_the_bubble_as_the_formula_says(tmp_path):
    f, b, p, m, vp = 1.0, 2.0, 4, 8, 2
    plain = _pipeline_sim(tmp_path, [f] * p, [b] * p, m).run(STABLE).iteration_times_s[0]
    inter = (
        _pipeline_sim(tmp_path, [f] * p, [b] * p, m, "interleaved", vp)
        .run(STABLE)
        .iteration_times_s[0]
    )
    # Narayanan et al. 2021: bubble (p − 1)(f + b) shrinks to (p − 1)(f + b)/vp
    assert plain == pytest.approx(m * (f + b) + (p - 1) * (f + b))
    assert inter == pytest.approx(m * (f + b) + (p - 1) * (f + b) / vp)
    assert inter == pytest.approx(_reference_schedule([f] * p, [b] * p, m, "interleaved", vp)[0])


# -- the network
# -----------------------------------------------------------------------------------------


def _drain(net: Network) -> dict[str, float]:
    finished = {}
    while net.flows:
        t = net.next_finish_s()
        for flow in net.pop_finished(t):
            finished[flow.label] = t
    return finished


def test_two_flows_share_a_link_equally():
    net = Network({("a", "b"): 10.0})
    for name in ("x", "y"):
        net.start(0.0, (("a", "b"),), 10.0, lambda t: None, name)
    assert _drain(net) == pytest.approx({"x": 2.0, "y": 2.0})  # 5 B/s each


def test_three_flows_max_min_fair_finish_times():
    net = Network({("a", "b"): 10.0})
    for name, size in (("small", 5.0), ("x", 10.0), ("y", 10.0)):
        net.start(0.0, (("a", "b"),), size, lambda t: None, name)
    # 10/3 B/s each until the small one ends at 1.5 s; the other two then have 5 bytes left at 5 B/s
    assert _drain(net) == pytest.approx({"small": 1.5, "x": 2.5, "y": 2.5})


def test_max_min_gives_the_bottlenecked_flow_its_share_and_the_rest_to_the_other():
    rates = max_min_rates(
        [(("a", "b"),), (("a", "b"), ("b", "c"))], {("a", "b"): 10.0, ("b", "c"): 2.0}
    )
    assert rates == pytest.approx([8.0, 2.0])


def test_a_flow_whose_link_halves_mid_transfer():
    net = Network({("a", "b"): 10.0})
    net.start(0.0, (("a", "b"),), 100.0, lambda t: None, "f")
    net.set_capacity(4.0, ("a", "b"), 5.0)  # 40 bytes sent; 60 left at 5 B/s
    assert _drain(net) == pytest.approx({"f": 16.0})
    assert net.bytes_on[("a", "b")] == pytest.approx(100.0)


# -- against the analytic model
# ------------------------------------------------------------------------------

LAYOUTS = [
    "tp=2,pp=2,dp=8,mb=1",
    "tp=4,pp=4,dp=2,mb=1",
    "tp=1,pp=4,dp=8,mb=2,recompute=full",
    "tp=2,pp=4,dp=4,mb=1,vp=2",
    "tp=8,pp=1,dp=4",
    "tp=2,pp=2,dp=8,schedule=gpipe",
]


@pytest.fixture(scope="module")
def demo():
    return load_instance(DEMO)


def _hetero_plan():
    stages = [
        Stage(layers=22, gpu="A100-80GB", island="rack0", tp=2),
        Stage(layers=10, gpu="V100-32GB", island="rack1", tp=2),
    ]
    return Plan(micro_batch=1, pipelines=[Pipeline(replicas=8, micro_batches=32, stages=stages)])


@pytest.mark.parametrize("layout", [*LAYOUTS, "hetero"])
def test_simulation_agrees_with_the_analytic_model_at_constant_bandwidth(demo, layout):
    plan = _hetero_plan() if layout == "hetero" else expand_layout(demo, parse_layout(layout))
    analytic = evaluate(demo, plan).iteration_time_s
    simulated = Simulation(demo, plan).run(STABLE).iteration_times_s[0]
    # The simulator sees what the analytic model does not: interleaving's sends contend, so the
    # simulation is never faster and at most 3% slower. Measured ratios (2026-12-02): 1.0000 for
    # every layout but the interleaved one, 1.0025 (they were 1.0004 to 1.0074 while the replay
    # started each gradient all-reduce only after the last backward, not dp_overlap into it). The
    # 0.1% below 1 allows for the closed form over-counting the fill and drain of unequal stages
    # (see the heterogeneous timeline test).
    assert analytic * 0.999 <= simulated <= analytic * 1.03


def test_the_gradient_all_reduce_starts_dp_overlap_into_the_last_backward(demo):
    """tp=8,pp=1,dp=4: the ring of stage 0 crosses the racks; its flows start when every replica is
    the calibrated dp_overlap fraction into its last backward pass — before that pass ends — and the
    replay takes the evaluator's time (it ran 0.4% longer when the all-reduce waited for the pass's
    end)."""
    plan = expand_layout(demo, parse_layout("tp=8,pp=1,dp=4"))
    sim = Simulation(demo, plan)
    result = sim.run(STABLE, record=True)
    last_b = {}
    for rec in result.records:
        if rec.kind == "B":
            last_b[rec.device] = max(last_b.get(rec.device, (0.0, 0.0)), (rec.end_s, rec.start_s))
    (end_s, start_s), overlap = max(last_b.values()), sim.overlap[0][0]
    # the last pass's
    ring = [rec for rec in result.records if rec.kind == "dp" and rec.start_s > start_s]
    assert ring and overlap > 0
    assert ring[0].start_s == pytest.approx(end_s - overlap * (end_s - start_s), rel=1e-9)
    # the record was booked at that time before too; the iteration's end shows when its flows ran
    assert result.iteration_times_s[0] == pytest.approx(
        evaluate(demo, plan).iteration_time_s, rel=1e-9
    )


def test_halving_the_uplink_during_the_dp_all_reduce_costs_what_its_traffic_explains(demo):
    # no pipeline sends; DP ring crosses racks
    plan = expand_layout(demo, parse_layout("tp=8,pp=1,dp=4"))
    sim = Simulation(demo, plan)
    stable = sim.run(STABLE)
    halved = sim.run(BandwidthScenario("halved", 1.0, ((0.0, ("rack0", "rack1"), 200.0),)))
    uplink_bytes = stable.link_bytes[("island:rack0", "island:rack1")]
    assert uplink_bytes == pytest.approx(halved.link_bytes[("island:rack0", "island:rack1")])
    # The ring's flow across the uplink ran at 400 Gbit/s and now at 200, each times the link
    # fabric's η (hetopt/spec/fabrics.py): it takes bytes·8/(400e9·η) longer.
    eta = demo.cluster.graph.edges["island:rack0", "island:rack1"]["eta"]
    expected_delay = uplink_bytes * 8 / (200e9 * eta) - uplink_bytes * 8 / (400e9 * eta)
    delay = halved.iteration_times_s[0] - stable.iteration_times_s[0]
    assert delay == pytest.approx(expected_delay, rel=0.02)


def test_several_templates_with_different_micro_batch_counts(demo):
    a = [Stage(layers=32, gpu="A100-80GB", island="rack0", tp=8)]
    v = [Stage(layers=32, gpu="V100-32GB", island="rack1", tp=8)]
    plan = Plan(
        micro_batch=2,
        pipelines=[
            Pipeline(replicas=2, micro_batches=44, stages=a),
            Pipeline(replicas=2, micro_batches=20, stages=v),
        ],
    )
    result = Simulation(demo, plan).run(STABLE)
    assert result.iteration_times_s[0] == pytest.approx(
        evaluate(demo, plan).iteration_time_s, rel=0.03
    )


def test_same_seed_same_result_and_markov_trace_is_seeded(tmp_path):
    data = yaml.safe_load(DEMO.read_text())
    data["scenarios"] = [
        {
            "name": "flap",
            "probability": 1.0,
            "generator": {
                "kind": "markov",
                "link": ["rack0", "rack1"],
                "levels_gbps": [400, 50],
                "mean_dwell_s": 2,
                "seed": 7,
            },
        }
    ]
    path = tmp_path / "flap.yaml"
    path.write_text(yaml.safe_dump(data))
    inst = load_instance(path)
    plan = expand_layout(inst, parse_layout("tp=2,pp=2,dp=8"))
    first = Simulation(inst, plan).run(inst.scenarios(100)[0], iterations=3).iteration_times_s
    again = Simulation(inst, plan).run(inst.scenarios(100)[0], iterations=3).iteration_times_s
    assert first == again
    data["scenarios"][0]["generator"]["seed"] = 8
    path.write_text(yaml.safe_dump(data))
    assert load_instance(path).scenarios(100)[0].changes != inst.scenarios(100)[0].changes


# -- the command
# -----------------------------------------------------------------------------------------


def test_simulate_command_json_trace_and_plot(tmp_path):
    trace, plot = tmp_path / "trace.json", tmp_path / "timeline.png"
    result = run_hetopt(
        "simulate",
        str(DEMO),
        "--layout",
        "tp=2,pp=4,dp=4",
        "--iterations",
        "2",
        "--trace",
        str(trace),
        "--plot",
        str(plot),
        "--json",
    )
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert [s["name"] for s in data["scenarios"]] == ["calm", "congested-uplink"]
    for sc in data["scenarios"]:
        assert set(sc) >= {
            "name",
            "probability",
            "iteration_time_s",
            "tokens_per_s",
            "link_utilization",
            "gpu_busy",
            "peak_memory_gib",
        }
        assert set(sc["iteration_time_s"]) == {"mean", "p50", "p90", "max"}
    calm, congested = data["scenarios"]
    assert congested["iteration_time_s"]["max"] > calm["iteration_time_s"]["max"]
    events = json.loads(trace.read_text())["traceEvents"]
    spans = [e for e in events if e["ph"] == "X"]
    assert spans and all({"name", "ph", "ts", "dur", "pid", "tid"} <= set(e) for e in spans)
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    again = run_hetopt("simulate", str(DEMO), "--layout", "tp=2,pp=4,dp=4", "--plot", str(plot))
    assert again.returncode == 2 and "--force" in again.stderr


def test_simulate_unknown_scenario_is_bad_input():
    result = run_hetopt("simulate", str(DEMO), "--layout", "tp=2,pp=4,dp=4", "--scenario", "clam")
    assert result.returncode == 2 and "did you mean 'calm'" in result.stderr


# -- bounded replays (issue 13)
# ----------------------------------------------------------------------------


def _big_batch(tmp_path, global_batch: int):
    data = yaml.safe_load(DEMO.read_text())
    data["training"]["global_batch"] = global_batch
    path = tmp_path / "big-batch.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return load_instance(path)


@pytest.mark.parametrize(
    "layout,rel",
    [
        (
            "tp=2,pp=4,dp=4,mb=2,vp=2,schedule=interleaved",
            1e-9,
        ),  # samples in whole groups of stages
        # the optimum, A100 ‖ V100→V100 with 49 and 60 micro-batches: the templates' flows share
        # NICs, and meet at other moments in a sample than in the whole replay (0.16% apart)
        (None, 0.01),
    ],
)
def test_a_sampled_iteration_is_the_whole_replays_time(tmp_path, monkeypatch, layout, rel):
    """Each template's last pass ends linearly later with its micro-batches, so two samples
    extrapolate to the whole replay's iteration time at constant bandwidth."""
    import hetopt.sim.engine as engine
    from hetopt.planners import solve_ilp
    from hetopt.search.types import SearchRequest

    inst = _big_batch(tmp_path, 4096)
    plan = (
        expand_layout(inst, parse_layout(layout)) if layout else solve_ilp(SearchRequest(inst)).plan
    )
    assert layout or [p.micro_batches for p in plan.pipelines] == [49, 60]
    sim = Simulation(inst, plan)
    halved = BandwidthScenario("halved", 1.0, ((0.0, ("rack0", "rack1"), 200.0),))
    for scenario in (STABLE, halved):
        whole = sim.run(scenario)
        assert whole.sampled is None and whole.cut is None
        monkeypatch.setattr(
            engine, "SAMPLE_PASSES", sim.passes([p.micro_batches for p in sim.plan.pipelines]) // 4
        )
        sampled = sim.run(scenario)
        monkeypatch.undo()
        small, large = sampled.sampled["micro_batches"]
        assert all(s < m for s, m in zip(large, sampled.sampled["of"], strict=True)), (
            sampled.sampled
        )
        assert [2 * s for s in small] == large
        assert sampled.iteration_times_s[0] == pytest.approx(whole.iteration_times_s[0], rel=rel)


def test_a_replay_stops_at_its_pass_budget_and_says_so(monkeypatch):
    import hetopt.sim.engine as engine

    inst = load_instance(DEMO)
    sim = Simulation(inst, expand_layout(inst, parse_layout("tp=2,pp=2,dp=8")))
    per_iteration = sim.passes([p.micro_batches for p in sim.plan.pipelines])
    monkeypatch.setattr(engine, "REPLAY_PASSES", 3 * per_iteration)
    result = sim.run(STABLE, iterations=10)
    assert len(result.iteration_times_s) == 3 and result.cut == "pass budget"
    assert sim.run(STABLE, iterations=2).cut is None


def test_simulate_keeps_to_its_time_limit_and_logs_progress_off_a_terminal():
    result = run_hetopt(
        "simulate",
        str(DEMO),
        "--layout",
        "tp=2,pp=2,dp=8",
        "--iterations",
        "100000",
        "--time-limit",
        "2",
        "--json",
    )
    assert result.returncode == 0, result.stderr
    scenarios = json.loads(result.stdout)["scenarios"]
    assert all(sc["cut"] == "time limit" and 1 <= sc["iterations"] < 100_000 for sc in scenarios)
    assert "simulating: 2 of 2 scenarios replayed" in result.stderr and "\x1b" not in result.stderr
    assert "Traceback" not in result.stderr


def test_simulate_refuses_more_iterations_than_it_replays():
    result = run_hetopt(
        "simulate", str(DEMO), "--layout", "tp=1,pp=1,dp=32", "--iterations", "100001"
    )
    assert result.returncode == 2 and "--iterations" in result.stderr and "100000" in result.stderr


def test_an_outage_holds_the_transfers_across_the_link_until_it_comes_back():
    """The link is down (0 Gbit/s) from 5 s to 15 s. tp=8,pp=1,dp=4 on the demo reaches its exchange
    of gradients between racks at about 14.4 s, so the first iteration sends it from 15 s on and
    ends as long after 15 s as the exchange and the optimizer take; the second iteration is as at
    constant bandwidth."""
    demo = load_instance(DEMO)
    sim = Simulation(demo, expand_layout(demo, parse_layout("tp=8,pp=1,dp=4")))
    stable = sim.run(STABLE, record=True)
    exchange = next(r for r in stable.records if r.name == "exchange between templates")
    assert 5 < exchange.start_s < 15
    outage = BandwidthScenario(
        "outage", 1.0, ((5.0, ("rack0", "rack1"), 0.0), (15.0, ("rack0", "rack1"), 400.0))
    )
    times = sim.run(outage, iterations=2).iteration_times_s
    assert times[0] == pytest.approx(
        15.0 + stable.iteration_times_s[0] - exchange.start_s, rel=1e-9
    )
    assert times[1] == pytest.approx(stable.iteration_times_s[0], rel=1e-9)


def test_a_sampled_iteration_waits_out_an_outage_once(tmp_path, monkeypatch):
    """Both samples run at the bandwidth of t = 0 (a change only the larger sample met would be
    multiplied by the extrapolation: a 1 s outage cost 22 s); the scenario then acts on the whole
    iteration as phases. A 1 s outage of a link the pipeline crosses costs the sampled iteration 1
    s; halving the link for 10 s costs what the evaluator says the slower phase costs. Asked for
    more iterations than one, the result says it is one sampled iteration."""
    import hetopt.sim.engine as engine

    inst = _big_batch(tmp_path, 4096)
    sim = Simulation(inst, expand_layout(inst, parse_layout("tp=8,pp=4,dp=1")))
    monkeypatch.setattr(
        engine, "SAMPLE_PASSES", sim.passes([p.micro_batches for p in sim.plan.pipelines]) // 4
    )
    link = ("rack0", "rack1")
    steady = sim.run(STABLE).iteration_times_s[0]
    blip = BandwidthScenario("blip", 1.0, ((3.0, link, 0.0), (4.0, link, 400.0)))
    sampled = sim.run(blip, iterations=5)
    assert sampled.sampled["method"] == "two samples" and sampled.sampled["bandwidth_phases"] == 3
    assert sampled.iteration_times_s[0] == pytest.approx(steady + 1.0, rel=1e-12)
    assert sampled.cut == "sampled"
    halved = BandwidthScenario("halved", 1.0, ((3.0, link, 200.0), (13.0, link, 400.0)))
    slow = sim._price_at({link: 200.0}) / sim._price_at({link: 400.0})  # the evaluator's slow-down
    assert sim.run(halved).iteration_times_s[0] == pytest.approx(
        steady + 10.0 * (1 - 1 / slow), rel=1e-9
    )


def test_an_iteration_too_large_even_to_sample_is_priced_and_says_so(tmp_path, monkeypatch):
    import hetopt.sim.engine as engine
    from hetopt.simulate import simulate

    inst = _big_batch(tmp_path, 4096)
    plan = expand_layout(inst, parse_layout("tp=2,pp=4,dp=4"))
    monkeypatch.setattr(engine, "SAMPLE_PASSES", 100)
    monkeypatch.setattr(engine, "MAX_SAMPLE_PASSES", 100)
    result, _ = simulate(inst, plan, "calm", workers=1)
    sc = result["scenarios"][0]
    assert sc["sampled"] == {
        "method": "analytic",
        "of": [p.micro_batches for p in plan.pipelines],
        "reason": "too large even to sample",
    }
    assert sc["iteration_time_s"]["mean"] == pytest.approx(
        evaluate(inst, plan).iteration_time_s, rel=1e-12
    )
    # nothing replayed, nothing measured
    assert sc["gpu_busy"] == [] and sc["link_utilization"] == {}


def test_a_replay_the_deadline_interrupts_before_one_iteration_is_priced_and_says_so(monkeypatch):
    """Many flows make an iteration slow to replay however few its passes (the 8,192-GPU instance
    without its search narrowing: 58 s for one): the deadline is looked at inside an iteration too,
    and the evaluator prices what was not replayed."""
    import time

    import hetopt.sim.engine as engine

    demo = load_instance(DEMO)
    plan = expand_layout(demo, parse_layout("tp=2,pp=2,dp=8"))
    monkeypatch.setattr(engine, "DEADLINE_EVERY", 1)
    result = Simulation(demo, plan).run(STABLE, iterations=3, deadline=time.time())
    assert result.cut == "time limit" and result.sampled["method"] == "analytic"
    assert result.iteration_times_s == [
        pytest.approx(evaluate(demo, plan).iteration_time_s, rel=1e-12)
    ]
    assert "time limit" in result.sampled["reason"]

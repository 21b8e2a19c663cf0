"""Context parallelism (issue 12): its cost worked by hand, its rules in the verifier and the plan
space, and where it pays. Exhaustive agreement on every backend is in test_planner (tests/small/s15,
by glob)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
from conftest import REPO, run_hetopt

from hetopt.cost import comm
from hetopt.cost.flops import kv_width, layer_forward_flops
from hetopt.cost.memory import (
    layer_activation_bytes,
    loss_bytes,
    model_state_bytes,
    stage_params,
)
from hetopt.cost.stacks import StackMemory
from hetopt.cost.terms import ATTN, GEMM, KERN, LINK, STEP
from hetopt.evaluate import BWD_TP, DP, FWD, FWD_TP, plan_features, stage_work
from hetopt.placement import place
from hetopt.plan import Plan
from hetopt.search.roots import outside_space
from hetopt.search.types import SearchOptions, default_cp
from hetopt.spec.cluster import intra_route
from hetopt.spec.instance import instance_from_spec, load_instance
from hetopt.verify import check_plan

S15 = Path(__file__).parent / "small" / "s15-context-parallel.yaml"
LONG = REPO / "instances" / "long-context-h100-a100-llama3-8b.yaml"


def _plan(tp: int, cp: int, replicas: int, gpu: str = "L4", layers: tuple[int, ...] = (6,)) -> Plan:
    """s15: `replicas` copies of one template on `gpu`, every stage at (tp, cp), 4 micro-batches in
    all."""
    return Plan.model_validate(
        {
            "micro_batch": 1,
            "pipelines": [
                {
                    "replicas": replicas,
                    "micro_batches": 4 // replicas,
                    "stages": [
                        {"layers": n, "gpu": gpu, "island": "r0", "tp": tp, "cp": cp}
                        for n in layers
                    ],
                }
            ],
        }
    )


def test_a_context_parallel_rank_does_its_share_of_the_layer_worked_by_hand():
    """One middle layer on one rank of cp = 2 (TP 1), against the formulas: the projections and MLP
    on s/2 tokens; half the causal attention core (queries of s/2 tokens against all s keys), in 2
    blocks; and the gather of the other rank's keys and values, 2·(s/2)·kv_width 16-bit values,
    forward once and backward twice."""
    inst = load_instance(S15)
    m, s, gpu = inst.model, inst.seq_len, inst.gpu_types["L4"]
    intra = intra_route(gpu)
    one = stage_work(m, gpu, 1, s, 1, True, "flash", "none", 1, False, False, intra, 1)
    two = stage_work(m, gpu, 1, s, 1, True, "flash", "none", 1, False, False, intra, 2)
    dense_half = layer_forward_flops(m, 1, s // 2) - 4 * (s // 2) ** 2 * m.hidden
    assert two[FWD, GEMM] * gpu.peak_flops == pytest.approx(dense_half, rel=1e-12)
    assert two[FWD, ATTN] == pytest.approx(one[FWD, ATTN] / 2, rel=1e-12)  # 0.5·4bs²h / cp
    assert two[FWD, ATTN] * gpu.peak_flops == pytest.approx(
        0.5 * 4 * s * s * m.hidden / 2, rel=1e-12
    )
    assert two[FWD, KERN] - one[FWD, KERN] == 1  # the attention core in cp = 2 blocks
    kv_rank_bytes = 2.0 * (s // 2) * 2 * kv_width(m)  # 16-bit K and V of this rank's tokens
    # each rank receives the other rank's share (cp − 1 = 1 of them), in one step, over the node's
    # link
    received_s = kv_rank_bytes / (comm.group_gbps(intra, 2) * comm.GBIT)
    assert two[FWD_TP, LINK] == pytest.approx(received_s, rel=1e-12)  # TP 1: the CP gather alone
    assert two[FWD_TP, STEP] == 1
    assert np.allclose(two[BWD_TP], 2 * two[FWD_TP])
    assert not one[FWD_TP].any() and not one[BWD_TP].any()


def test_context_parallelism_halves_activations_and_shards_over_the_dp_cp_group_worked_by_hand():
    """cp = 2 at one replica: each rank stores half the activations and logits (s/2 tokens), ZeRO-1
    shards the optimizer states over the stage's two ranks, and they all-reduce their gradients
    (Megatron-LM's DP×CP group), which one replica without CP does not."""
    inst = load_instance(S15)
    one, two = (plan_features(inst, place(_plan(1, cp, 1), inst.cluster)) for cp in (1, 2))
    assert not one.templates[0][0, DP].any() and two.templates[0][0, DP].any()
    m, s = inst.model, inst.seq_len
    # one stage of 6 layers holding 1 micro-batch in flight (4 micro-batches, 1 stage), the head on
    # it: its activations and logits at s/2 tokens, and ZeRO-1's optimizer states over the 2 ranks
    # of its group
    params = stage_params(m, 6, True, True, 1)
    saved = (
        6
        * (
            layer_activation_bytes(m, 1, s, 1, True, "flash", "none")
            - layer_activation_bytes(m, 1, s // 2, 1, True, "flash", "none")
        )
        + loss_bytes(m, 1, s, 1, StackMemory())
        - loss_bytes(m, 1, s // 2, 1, StackMemory())
        + model_state_bytes(params, 1, 1, 1)
        - model_state_bytes(params, 1, 2, 1)
    )
    assert one.memory_bytes[0][0] - two.memory_bytes[0][0] == pytest.approx(saved, rel=1e-12)


@pytest.mark.parametrize(
    "change,words",
    [
        ({"cp": 3}, "does not split into 2·cp·tp = 6 equal chunks"),
        ({"cp": 4, "tp": 2}, "tp·cp = 8 exceeds the 4 GPUs of a L4@r0 node"),
    ],
)
def test_the_verifier_refuses_what_context_parallelism_cannot_run(change, words):
    data = json.loads(_plan(1, 2, 1).model_dump_json())
    data["pipelines"][0]["stages"][0].update(change)
    found = check_plan(load_instance(S15), Plan.model_validate(data))
    assert any(path == "pipelines[0].stages[0].cp" and words in why for path, why in found), found


def test_context_parallelism_needs_flash_attention_and_says_so_with_exit_2(tmp_path):
    spec = S15.read_text().replace(
        "training: {seq_len: 16384, global_batch: 4}",
        "training: {seq_len: 16384, global_batch: 4, attention: standard}",
    )
    inst_path, plan_path = tmp_path / "standard.yaml", tmp_path / "plan.json"
    inst_path.write_text(spec)
    plan_path.write_text(_plan(1, 2, 2).model_dump_json())
    result = run_hetopt("evaluate", str(inst_path), "--plan", str(plan_path))
    assert result.returncode == 2
    assert (
        "pipelines[0].stages[0].cp" in result.stderr
        and "needs training.attention: flash" in result.stderr
    )
    assert "Traceback" not in result.stderr
    # the instance's search.cp
    assert SearchOptions.from_instance(load_instance(inst_path)).cp == (
        1,
        2,
        4,
    )
    assert default_cp(load_instance(inst_path)) == (1,)  # ... but no CP by default without flash


@pytest.mark.parametrize(
    "seq_len,expected",
    [
        (4096, (1,)),
        (8192, (1,)),
        (16384, (1, 2)),
        (32768, (1, 2, 4)),
        (65536, (1, 2, 4, 8)),
        (131072, (1, 2, 4, 8)),
    ],
)
def test_the_default_space_tries_context_parallelism_from_8192_tokens_per_rank(seq_len, expected):
    spec = load_instance(LONG).spec
    spec = spec.model_copy(
        update={
            "training": spec.training.model_copy(update={"seq_len": seq_len}),
            "model": spec.model.model_copy(update={"max_seq_len": seq_len}),
        }
    )
    assert default_cp(instance_from_spec(spec, str(LONG), LONG.parent, None, LONG)) == expected


def test_a_context_parallel_plan_is_a_point_of_the_space_only_where_the_space_has_its_degree():
    inst = load_instance(S15)
    opts = SearchOptions.from_instance(inst)
    assert outside_space(inst, _plan(1, 2, 2), opts) == []
    assert any(
        "context parallelism [2]" in w
        for w in outside_space(inst, _plan(1, 2, 2), dataclasses.replace(opts, cp=(1,)))
    )
    zero3 = _plan(1, 2, 2).model_copy(update={"zero": 3})  # the search keeps ZeRO-2/3 to cp 1
    assert any(
        "with ZeRO-3" in w
        for w in outside_space(inst, zero3, dataclasses.replace(opts, zero=(1, 3)))
    )
    mixed = json.loads(_plan(1, 2, 1, layers=(3, 3)).model_dump_json())
    mixed["pipelines"][0]["stages"][1]["cp"] = 1
    assert any(
        "one degree for every stage" in w
        for w in outside_space(inst, Plan.model_validate(mixed), opts)
    )


def test_context_parallelism_pays_where_sequences_are_few_and_long():
    """s15: 4 sequences of 16k tokens on 4 L4 and 4 A10G (PCIe, no NVLink). Exhaustive enumeration
    with and without CP: the best plan without it splits each sequence's layers over TP 2 (0.3348
    s); with it, two TP 1 × CP 2 replicas per type (0.2985 s, −10.8%): CP moves only the keys and
    values of 2 of the 8 heads where TP all-reduces every activation."""
    from hetopt.baselines.exhaustive import exhaustive

    inst = load_instance(S15)
    opts = SearchOptions.from_instance(inst)
    with_cp, without = exhaustive(inst, opts), exhaustive(inst, dataclasses.replace(opts, cp=(1,)))
    assert {st.cp for p in with_cp.plan.pipelines for st in p.stages} == {2}
    assert {st.cp for p in without.plan.pipelines for st in p.stages} == {1}
    assert with_cp.objective_s == pytest.approx(0.2985, abs=1e-4)
    assert without.objective_s == pytest.approx(0.3348, abs=1e-4)


@pytest.mark.parametrize("replicas,layers", [(1, (6,)), (2, (6,)), (1, (3, 3))])
def test_the_simulator_replays_a_context_parallel_plan_at_the_evaluators_time(replicas, layers):
    """Static network: the replay takes the evaluator's time (as for every plan, within 3%), the CP
    ranks' gradient reduction included where one replica has two ranks (cp 2, R 1)."""
    from hetopt.evaluate import evaluate
    from hetopt.sim.engine import Simulation
    from hetopt.spec.scenarios import BandwidthScenario

    inst = load_instance(S15)
    plan = place(_plan(1, 2, replicas, layers=layers), inst.cluster)
    simulated = (
        Simulation(inst, plan).run(BandwidthScenario("stable", 1.0, ())).iteration_times_s[0]
    )
    assert simulated == pytest.approx(evaluate(inst, plan).iteration_time_s, rel=0.03)


def test_a_layout_with_cp_is_the_plan_it_describes_and_a_bad_one_exits_2(tmp_path):
    """`cp=2` in the layout shorthand: ranks in Megatron-LM's order (TP, then CP, then DP, then PP),
    so on s15 (4 L4, then 4 A10G) `tp=1,cp=2,pp=1,dp=4` is two CP-2 replicas per GPU type — the plan
    s15's exhaustive optimum is, at its time."""
    from hetopt.evaluate import evaluate
    from hetopt.layout import expand_layout, parse_layout

    inst = load_instance(S15)
    plan = expand_layout(inst, parse_layout("tp=1,cp=2,pp=1,dp=4"))
    assert [(p.replicas, [(s.gpu, s.tp, s.cp) for s in p.stages]) for p in plan.pipelines] == [
        (2, [("L4", 1, 2)]),
        (2, [("A10G", 1, 2)]),
    ]
    assert all(len(e.gpus) == 2 for e in plan.placement)
    assert evaluate(inst, plan).iteration_time_s == pytest.approx(0.2985, abs=1e-4)
    result = run_hetopt("evaluate", str(S15), "--layout", "tp=1,cp=8,pp=1,dp=1")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "a stage's tp·cp GPUs sit inside one node" in result.stderr, result.stderr

"""Plans real runs use (issue 10, item 4): TP dividing the key/value heads, gradients reduced in
fp32, a stage holding only the embedding or only the head, TP over whole nodes, ZeRO-2 and ZeRO-3.
Each expectation is worked by hand from the formulas named beside it."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml
from conftest import DEMO, run_hetopt

from hetopt.cost import compute as cc
from hetopt.cost.flops import embedding_params, head_params, layer_params
from hetopt.cost.memory import GIB
from hetopt.cost.profiles import Profiles
from hetopt.cost.terms import GEMM, LINK, MB, NET, STEP
from hetopt.evaluate import BWD, DP, FWD, FWD_TP, OPT, evaluate, plan_features, zero_exposed
from hetopt.export.launchers import layout_string, pipeline_parts
from hetopt.layout import expand_layout, parse_layout
from hetopt.placement import place
from hetopt.plan import Pipeline, Plan, Stage, load_plan
from hetopt.search.space import tp_options
from hetopt.search.types import SearchOptions
from hetopt.sim.engine import Simulation
from hetopt.spec import fabrics
from hetopt.spec.cluster import intra_route
from hetopt.spec.instance import load_instance
from hetopt.spec.scenarios import BandwidthScenario
from hetopt.verify import check_plan

STABLE = BandwidthScenario("stable", 1.0, ())
GBIT = 1e9 / 8  # bytes per second in one Gbit/s


def _instance(
    tmp_path: Path, model: dict, nodes: list[dict], training: dict | None = None, search=None
):
    data = {
        "name": "real",
        "model": model,
        "training": {"seq_len": 512, "global_batch": 8, **(training or {})},
        "cluster": {"nodes": nodes},
    }
    if search:
        data["search"] = search
    path = tmp_path / "real.yaml"
    path.write_text(yaml.safe_dump(data))
    return load_instance(path), path


def _write_plan(tmp_path: Path, plan: Plan) -> Path:
    path = tmp_path / "plan.json"
    path.write_text(plan.model_dump_json())
    return path


def _agree(inst, plan) -> None:
    """The simulator's constant-bandwidth agreement with the evaluator (tests/test_simulator.py's
    bounds)."""
    analytic = evaluate(inst, plan).iteration_time_s
    simulated = Simulation(inst, plan).run(STABLE).iteration_times_s[0]
    assert analytic * 0.999 <= simulated <= analytic * 1.03


# -- 1. TP divides the key/value heads
# -------------------------------------------------------------------

GQA = {"layers": 2, "hidden": 4096, "heads": 64, "kv_heads": 8, "vocab": 1000}
NODE16 = [{"name": "n", "count": 1, "gpu": "A100-80GB", "gpus_per_node": 16, "nic_gbps": 400}]


def _one_stage(
    tp: int,
    layers: int = 2,
    replicas: int = 1,
    micro_batches: int = 8,
    gpu="A100-80GB",
    island="default",
    zero: int = 1,
) -> Plan:
    return Plan(
        micro_batch=1,
        zero=zero,
        pipelines=[
            Pipeline(
                replicas=replicas,
                micro_batches=micro_batches,
                stages=[Stage(layers=layers, gpu=gpu, island=island, tp=tp)],
            )
        ],
    )


def test_tp_must_divide_the_kv_heads(tmp_path):
    # 64 heads, 8 KV heads: TP 16 divides the heads but would split a key/value head over two ranks
    inst, path = _instance(tmp_path, GQA, NODE16, search={"tp": [4, 8, 16]})
    assert check_plan(inst, _one_stage(8)) == []
    found = check_plan(inst, _one_stage(16))
    assert [p for p, _ in found] == ["pipelines[0].stages[0].tp"] and "8 kv_heads" in found[0][1]
    # never generated: the search's TP choices, and the layouts of the baselines
    dc = next(iter(inst.cluster.device_classes.values()))
    assert tp_options(inst, dc, SearchOptions.from_instance(inst)) == [4, 8]
    result = run_hetopt(
        "evaluate", str(path), "--plan", str(_write_plan(tmp_path, _one_stage(16))), "--json"
    )
    assert (
        result.returncode == 2
        and "pipelines[0].stages[0].tp" in result.stderr
        and "kv_heads" in result.stderr
    )
    result = run_hetopt("evaluate", str(path), "--layout", "tp=16,pp=1,dp=1", "--json")
    assert (
        result.returncode == 2 and "kv_heads" in result.stderr and "Traceback" not in result.stderr
    )


# -- 2. gradients reduced in fp32
# ------------------------------------------------------------------------


def test_fp32_gradient_reduction_doubles_the_bytes_of_every_gradient_transfer(tmp_path):
    data = yaml.safe_load(DEMO.read_text())
    data["training"]["grad_reduce_dtype"] = "fp32"
    path = tmp_path / "fp32.yaml"
    path.write_text(yaml.safe_dump(data))
    fp32, bf16 = load_instance(path), load_instance(DEMO)
    # 4 bytes against 2 per gradient: the bytes terms of the DP all-reduce double, its step count
    # stays
    plan = place(expand_layout(bf16, parse_layout("tp=8,pp=1,dp=4")), bf16.cluster)
    a, b = (
        plan_features(fp32, plan).templates[0][0, DP],
        plan_features(bf16, plan).templates[0][0, DP],
    )
    assert (
        a[NET] == pytest.approx(2 * b[NET])
        and a[LINK] == pytest.approx(2 * b[LINK])
        and a[STEP] == b[STEP]
    )
    assert b[NET] > 0
    # the templates' exchange, and the simulator's ring flows
    two = Plan(
        micro_batch=2,
        pipelines=[
            Pipeline(
                replicas=2,
                micro_batches=44,
                stages=[Stage(layers=32, gpu="A100-80GB", island="rack0", tp=8)],
            ),
            Pipeline(
                replicas=2,
                micro_batches=20,
                stages=[Stage(layers=32, gpu="V100-32GB", island="rack1", tp=8)],
            ),
        ],
    )
    two = place(two, bf16.cluster)
    assert [n for *_, n in plan_features(fp32, two).cross_flows] == [
        2 * n for *_, n in plan_features(bf16, two).cross_flows
    ]
    flows32 = [n for c in Simulation(fp32, plan).dp_collectives() for _, n in c["flows"]]
    flows16 = [n for c in Simulation(bf16, plan).dp_collectives() for _, n in c["flows"]]
    assert flows32 == pytest.approx([2 * n for n in flows16]) and flows16
    assert evaluate(fp32, plan).iteration_time_s > evaluate(bf16, plan).iteration_time_s
    _agree(fp32, plan)


def test_the_planner_still_equals_the_evaluator_with_fp32_gradients(tmp_path):
    from hetopt.planners import solve_ilp
    from hetopt.search.types import SearchRequest

    data = yaml.safe_load((Path(__file__).parent / "small" / "s2-a100-v100.yaml").read_text())
    data["training"]["grad_reduce_dtype"] = "fp32"
    path = tmp_path / "s2.yaml"
    path.write_text(yaml.safe_dump(data))
    inst = load_instance(path)
    result = solve_ilp(
        SearchRequest(inst, formulation="split-milp", backend="highs", time_limit_s=60)
    )
    timed = evaluate(inst, result.plan)
    # the plan reduces gradients across replicas (whether that time is exposed depends on the
    # overlap)
    assert (
        max(pipe.replicas for pipe in result.plan.pipelines) > 1 or len(result.plan.pipelines) > 1
    )
    assert timed.iteration_time_s == pytest.approx(result.objective_s, rel=1e-9)


# -- 3. a stage holding only the embedding or only the head
# ----------------------------------------------


def _embedding_head_plan(first: int, middle: int, last: int) -> Plan:
    stages = [Stage(layers=n, gpu="A100-80GB", island="rack0", tp=8) for n in (first, middle, last)]
    stages[2] = stages[2].model_copy(update={"gpu": "V100-32GB", "island": "rack1"})
    return Plan(micro_batch=1, pipelines=[Pipeline(replicas=1, micro_batches=256, stages=stages)])


def test_stages_of_only_the_embedding_and_only_the_head_worked_by_hand():
    # LLaMA-7B: V = 32000, h = 4096, untied head, RMSNorm (one scale of h)
    inst = load_instance(DEMO)
    plan = _embedding_head_plan(0, 32, 0)
    assert check_plan(inst, plan) == []
    ev = evaluate(inst, plan)
    m = inst.model
    assert embedding_params(m) == 32000 * 4096 and head_params(m) == 32000 * 4096 + 4096
    reserve = Profiles().for_gpu(inst.gpu_types["A100-80GB"]).reserve_gib
    # model-state bytes per GPU of TP 8, one replica (ZeRO-1 over 1): 2 (bf16 weights) + 4 (fp32
    # grads) + 12 (fp32 master, Adam m and v) per parameter; no layer, so no activations
    assert ev.peak_memory_gib[0] == pytest.approx(32000 * 4096 / 8 * 18 / GIB + reserve)
    # the head stage also holds the fp32 logits and their gradient for the micro-batch in its
    # backward
    v100_reserve = Profiles().for_gpu(inst.gpu_types["V100-32GB"]).reserve_gib
    logits = 2 * 4 * 1 * 2048 * 32000 / 8
    assert ev.peak_memory_gib[2] == pytest.approx(
        ((32000 * 4096 + 4096) / 8 * 18 + logits) / GIB + v100_reserve
    )
    # work: the embedding lookup alone (plus its vocabulary-parallel all-reduce), no layer GEMMs
    f = plan_features(inst, place(plan, inst.cluster)).templates[0]
    x = cc.LayerShape(m, 1, 2048, 8, True, "flash")
    gpu = inst.gpu_types["A100-80GB"]
    expected = cc.embedding_forward(x, gpu)
    expected[MB] += 1
    assert np.allclose(f[0, FWD], expected)
    assert np.allclose(f[0, FWD_TP], cc.embedding_tp_comm(x, intra_route(gpu)))
    _agree(inst, plan)


def test_a_middle_stage_of_zero_layers_holds_nothing_and_passes_the_activations_on(tmp_path):
    """DeepSpeed's parameter-based partition gives middle stages 0 layers (parts such as
    0/0/1/1/1/2/…). Such a stage holds no parameter and no activation: its peak memory is its
    GPU's runtime reserve alone, and it computes nothing. The plan evaluates, simulates and
    exports."""
    inst = load_instance(DEMO)
    plan = _embedding_head_plan(16, 0, 16)
    assert check_plan(inst, plan) == []
    ev = evaluate(inst, plan)
    reserve = Profiles().for_gpu(inst.gpu_types["A100-80GB"]).reserve_gib
    assert ev.fits and ev.peak_memory_gib[1] == pytest.approx(reserve, rel=1e-12)
    f = plan_features(inst, place(plan, inst.cluster)).templates[0]
    assert not f[1, FWD, GEMM] and not f[1, BWD, GEMM]
    _agree(inst, plan)
    path = _write_plan(tmp_path, plan)
    for command in ("evaluate", "simulate"):
        result = run_hetopt(command, str(DEMO), "--plan", str(path), "--json")
        assert result.returncode == 0, result.stderr
    # the layout Megatron gets has an empty stage between the bars; DeepSpeed's parts repeat
    assert layout_string(plan) == "E" + "t" * 16 + "||" + "t" * 16 + "L"
    assert pipeline_parts(plan) == [0, 17, 17, 34]


# -- 4. TP over whole nodes
# ------------------------------------------------------------------------------

SMALL = {"layers": 2, "hidden": 1024, "heads": 8, "vocab": 8000}
V100X4 = [{"name": "v", "count": 2, "gpu": "V100-32GB", "gpus_per_node": 4, "nic_gbps": 100}]


def test_tp_over_two_four_gpu_nodes_is_priced_over_the_nic(tmp_path):
    inst, path = _instance(tmp_path, SMALL, V100X4, training={"global_batch": 4})
    plan = _one_stage(8, gpu="V100-32GB", micro_batches=4)
    assert check_plan(inst, plan) == []
    placed = place(plan, inst.cluster)
    (entry,) = placed.placement
    assert entry.members == [("v-0", [0, 1, 2, 3]), ("v-1", [0, 1, 2, 3])]
    # hierarchical all-reduce of B = 2·b·s·h bytes (cost/comm.py): reduce-scatter over the 4 GPUs of
    # a node, all-reduce of the node's share between the 2 nodes — 2·(2−1)/2·B through the 100
    # Gbit/s NIC in 2 steps — and all-gather inside the node (3 + 3 steps). Forward: 2 per layer (2
    # layers), one for the embedding, three of 4·b·s bytes for the cross-entropy (the stage is first
    # and last).
    act = 2 * 1 * 512 * 1024
    fwd_tp = plan_features(inst, placed).templates[0][0, FWD_TP]
    net_bytes = (2 * 2 + 1) * act + 3 * 4 * 512
    # at the NIC fabric's achieved bandwidth: 100 Gbit/s is InfiniBand by default (spec/fabrics.py)
    assert fwd_tp[NET] == pytest.approx(net_bytes / (100 * fabrics.get("infiniband").eta * GBIT))
    assert fwd_tp[STEP] == (2 * 2 + 1 + 3) * (3 + 2 + 3)
    # inside each node, reduce-scatter + all-gather move 2·3/4 of the bytes over NVLink 2 at its
    # achieved rate; the phases are pipelined with the NIC phase (cost/comm.py), so only their
    # excess over it counts
    intra = inst.gpu_types["V100-32GB"].intra_node_gbps * fabrics.get("nvlink2").eta
    inside = 2 * 3 / 4 * net_bytes / (intra * GBIT)
    assert fwd_tp[LINK] == pytest.approx(max(0.0, inside - fwd_tp[NET]))
    _agree(inst, placed)
    # the plan file round-trips with `more_nodes`; plans without it still load (every other test)
    saved = _write_plan(tmp_path, placed)
    assert load_plan(saved).placement[0].more_nodes[0].node == "v-1"
    result = run_hetopt("evaluate", str(path), "--plan", str(saved), "--json")
    assert result.returncode == 0, result.stderr


def test_a_layout_whose_tp_group_covers_whole_nodes_expands_to_more_nodes(tmp_path):
    # Megatron's rank order puts TP 8 on ranks 0..7: both 4-GPU nodes, whole
    inst, _ = _instance(tmp_path, SMALL, V100X4, training={"global_batch": 4})
    plan = expand_layout(inst, parse_layout("tp=8,pp=1,dp=1"))
    assert plan.placement[0].members == [("v-0", [0, 1, 2, 3]), ("v-1", [0, 1, 2, 3])]
    assert (
        evaluate(inst, plan).iteration_time_s
        == evaluate(inst, _one_stage(8, gpu="V100-32GB", micro_batches=4)).iteration_time_s
    )
    nodes = [{"name": "v", "count": 2, "gpu": "V100-32GB", "gpus_per_node": 6, "nic_gbps": 100}]
    _, path6 = _instance(tmp_path, SMALL, nodes, training={"global_batch": 6})
    # ranks 4..7: 2 + 2
    result = run_hetopt("evaluate", str(path6), "--layout", "tp=4,pp=1,dp=3", "--json")
    assert result.returncode == 2 and "whole" in result.stderr


def test_tp_across_nodes_only_over_whole_nodes_of_one_type(tmp_path):
    nodes = [
        *V100X4,
        {"name": "a", "count": 1, "gpu": "A100-80GB", "gpus_per_node": 4, "nic_gbps": 100},
    ]
    inst, _ = _instance(tmp_path, SMALL, nodes, training={"global_batch": 4})
    plan = _one_stage(8, gpu="V100-32GB", micro_batches=4)
    data = json.loads(plan.model_dump_json())
    data["placement"] = [
        {
            "pipeline": 0,
            "replica": 0,
            "stage": 0,
            "node": "v-0",
            "gpus": [0, 1, 2, 3],
            "more_nodes": [{"node": "v-1", "gpus": [0, 1]}, {"node": "a-0", "gpus": [0, 1]}],
        }
    ]
    half = Plan.model_validate(data)
    paths = {p for p, _ in check_plan(inst, half)}
    assert {"placement[0].more_nodes[0].gpus", "placement[0].more_nodes[1].node"} <= paths
    # 6 is not whole 4-GPU nodes
    found = check_plan(inst, _one_stage(6, gpu="V100-32GB", micro_batches=4))
    assert found and found[0][0] == "pipelines[0].stages[0].tp"


def test_the_search_flag_is_off_by_default_and_the_search_stays_inside_a_node(tmp_path):
    inst, _ = _instance(tmp_path, SMALL, V100X4, search={"tp_across_nodes": True, "tp": [4, 8]})
    assert SearchOptions.from_instance(inst).tp_across_nodes
    dc = next(iter(inst.cluster.device_classes.values()))
    assert tp_options(inst, dc, SearchOptions.from_instance(inst)) == [4]
    assert not SearchOptions.from_instance(load_instance(DEMO)).tp_across_nodes


# -- 5. ZeRO-2 and ZeRO-3
# --------------------------------------------------------------------------------

A100X2 = [{"name": "a", "count": 2, "gpu": "A100-80GB", "gpus_per_node": 8, "nic_gbps": 200}]
LLAMA = {"preset": "llama-7b", "layers": 4}


def test_zero_memory_follows_the_zero_paper(tmp_path):
    inst, _ = _instance(tmp_path, LLAMA, A100X2, training={"seq_len": 2048, "global_batch": 16})
    mem = {
        z: evaluate(
            inst, expand_layout(inst, parse_layout(f"tp=8,pp=1,dp=2,zero={z}"))
        ).peak_memory_gib[0]
        for z in (1, 2, 3)
    }
    m = inst.model
    # parameters per GPU of TP 8
    psi = (4 * layer_params(m) + embedding_params(m) + head_params(m)) / 8
    unit = layer_params(m) / 8  # the largest unit: a layer (4h² + 3hf + 2h > V·h for LLaMA-7B)
    assert layer_params(m) > head_params(m)
    n_d = 2
    # Rajbhandari et al. 2020 §5.1 with fp32 gradients: P_os (2 + 4 + 12/N_d)Ψ, P_os+g (2 + (4 +
    # 12)/N_d)Ψ, P_os+g+p (2 + 4 + 12)Ψ/N_d; plus ZeRO-2's unsharded gradient of one unit (4 bytes)
    # and ZeRO-3's two gathered units of 16-bit weights and one unsharded gradient (2·2 + 4 bytes
    # per unit parameter)
    state = {
        1: (2 + 4 + 12 / n_d) * psi,
        2: (2 + 16 / n_d) * psi + 4 * unit,
        3: 18 / n_d * psi + 8 * unit,
    }
    for z in (2, 3):
        assert (mem[1] - mem[z]) * GIB == pytest.approx(state[1] - state[z], rel=1e-9)


def test_zero_collectives_worked_by_hand(tmp_path):
    inst, _ = _instance(tmp_path, LLAMA, A100X2, training={"seq_len": 2048, "global_batch": 16})
    m = inst.model
    psi = (4 * layer_params(m) + embedding_params(m) + head_params(m)) / 8
    feats = {
        z: plan_features(
            inst, place(expand_layout(inst, parse_layout(f"tp=8,pp=1,dp=2,zero={z}")), inst.cluster)
        )
        for z in (1, 2, 3)
    }

    # the two replicas sit on the two nodes: a reduce-scatter (or all-gather) among them pushes
    # (2−1)/2 · 8 columns · bytes per rank through each 200 Gbit/s NIC (cost/comm.py, hierarchical)
    def over_nic(rank_bytes):
        return (2 - 1) / 2 * 8 * rank_bytes / (200 * fabrics.get("infiniband").eta * GBIT)

    z2, z3, z1 = feats[2], feats[3], feats[1]
    # no end-of-iteration all-reduce
    assert z2.templates[0][0, DP][NET] == 0 and z3.templates[0][0, DP][NET] == 0
    # all-reduce = RS + AG
    assert z1.templates[0][0, DP][NET] == pytest.approx(2 * over_nic(2 * psi))
    # ZeRO-2: per micro-batch a reduce-scatter of the 16-bit gradients; once, the updated weights
    # gathered
    assert z2.zero_passes[0][0, 0, NET] == 0 and z2.zero_passes[0][0, 1, NET] == pytest.approx(
        over_nic(2 * psi)
    )
    assert (z2.templates[0][0, OPT] - z1.templates[0][0, OPT])[NET] == pytest.approx(
        over_nic(2 * psi)
    )
    # ZeRO-3: weights gathered in forward, again in backward with the gradients' reduce-scatter
    assert z3.zero_passes[0][0, 0, NET] == pytest.approx(over_nic(2 * psi))
    assert z3.zero_passes[0][0, 1, NET] == pytest.approx(2 * over_nic(2 * psi))
    assert z3.zero_units[0] == [4 + 1 + 1]  # four layers, the embedding and the head


def test_the_prefetch_rule_is_a_two_machine_flow_shop():
    # n = 5 equal units, compute P = 10 s (c = 2 per unit), communication K = 4 s (k = 0.8): every
    # gather but the first hides, 0.8 s exposed; with K = 20 s (k = 4) the pass is 5·4 + 2 = 22 s,
    # 12 s more
    times = np.zeros((2, 7))
    times[:, FWD] = 10.0
    passes = np.zeros((2, 2, 10))
    passes[0, 0, NET], passes[1, 0, NET] = 4.0, 20.0
    weights = np.zeros((2, 10))
    weights[:, NET] = 1.0
    extra = zero_exposed(times, passes, [5, 5], weights)
    assert extra[:, 0] == pytest.approx([0.8, 12.0]) and extra[:, 1] == pytest.approx([0.0, 0.0])


@pytest.mark.parametrize("zero", [2, 3])
def test_zero_plans_simulate_as_they_evaluate_and_cost_time(tmp_path, zero):
    inst, _ = _instance(tmp_path, LLAMA, A100X2, training={"seq_len": 2048, "global_batch": 16})
    plan = expand_layout(inst, parse_layout(f"tp=4,pp=2,dp=2,zero={zero}"))
    _agree(inst, plan)
    one = evaluate(inst, expand_layout(inst, parse_layout("tp=4,pp=2,dp=2,zero=1")))
    ev = evaluate(inst, plan)
    assert ev.iteration_time_s >= one.iteration_time_s
    assert sum(ev.breakdown.values()) == pytest.approx(ev.iteration_time_s)


def test_zero_3_with_several_templates_and_bad_zero_values_are_bad_input(tmp_path):
    result = run_hetopt("evaluate", str(DEMO), "--layout", "tp=8,pp=1,dp=4,zero=3", "--json")
    assert result.returncode == 2 and "zero" in result.stderr and "templates" in result.stderr
    result = run_hetopt("evaluate", str(DEMO), "--layout", "tp=8,pp=1,dp=4,zero=4", "--json")
    assert result.returncode == 2 and "0, 1, 2 or 3" in result.stderr

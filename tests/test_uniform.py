"""Uniform layouts in the plan space (hetopt.search.uniform): Megatron-LM's (tp, pp, dp) over every
GPU, its replicas' templates in lockstep — one layer split for all of them."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from conftest import run_hetopt

from hetopt.baselines.exhaustive import compositions, exhaustive
from hetopt.cost.profiles import Profiles
from hetopt.evaluate import evaluate
from hetopt.export.dryrun import consistency
from hetopt.planners import solve_ilp
from hetopt.search.bounds.run import Bounds
from hetopt.search.dispatch import pick
from hetopt.search.formulation import SolveOptions, SolveStatus
from hetopt.search.leaves import plan_problem
from hetopt.search.robust import planning_scenarios
from hetopt.search.roots import enumerate_skeletons, outside_space
from hetopt.search.types import SearchOptions, SearchRequest, SearchStats
from hetopt.search.uniform import layout_subsets, lockstep_layout, lockstep_skeletons
from hetopt.spec.instance import load_instance
from hetopt.verify import check_plan

SMALL = Path(__file__).parent / "small"
BACKENDS = [("split-milp", "cbc"), ("split-milp", "highs"), ("split-cpsat", "cpsat")]


def test_with_two_stages_the_optimum_is_a_uniform_layout_in_lockstep_and_pays():
    """s19 (max_stages 2): the exhaustive optimum is Megatron's pp=2, dp=2 layout, (A100 → H100) ‖
    (A100 → H200), 2 layers on the A100s and 6 on the Hoppers in both, 0.5573 s; the best plan
    without uniform layouts runs each GPU type as a template of its own (three templates: the A100s
    data-parallel with 5 micro-batches each, the H100 and the H200 with 11), 0.5660 s; with at most
    two templates (max_templates 2) both Hoppers as one pipeline, 0.6892 s. Every backend proves the
    first."""
    inst = load_instance(SMALL / "s19-uniform-layout.yaml")
    opts = SearchOptions.from_instance(inst)
    best = exhaustive(inst, opts)
    without = exhaustive(inst, dataclasses.replace(opts, uniform_layouts=False))
    assert best.objective_s == pytest.approx(0.5573, abs=1e-4)
    assert without.objective_s == pytest.approx(0.5660, abs=1e-4)
    assert sorted((p.replicas, p.micro_batches) for p in without.plan.pipelines) == [
        (1, 11),
        (1, 11),
        (2, 5),
    ]
    pairs = exhaustive(inst, dataclasses.replace(opts, uniform_layouts=False, max_templates=2))
    assert pairs.objective_s == pytest.approx(0.6892, abs=1e-4)
    pipes = best.plan.pipelines
    assert sorted([st.gpu for st in p.stages] for p in pipes) == [
        ["A100-80GB", "H100-SXM"],
        ["A100-80GB", "H200"],
    ]
    assert [[st.layers for st in p.stages] for p in pipes] == [[2, 6], [2, 6]]
    assert (
        lockstep_layout(inst, best.plan, opts) is not None
        and outside_space(inst, best.plan, opts) == []
    )
    assert outside_space(inst, best.plan, dataclasses.replace(opts, uniform_layouts=False)) != []
    for formulation, backend in BACKENDS:
        result = solve_ilp(
            SearchRequest(inst, formulation=formulation, backend=backend, time_limit_s=60),
            warm_start=False,
        )
        assert result.status == SolveStatus.OPTIMAL, backend
        assert result.objective_s == pytest.approx(best.objective_s, rel=1e-5), backend
        assert check_plan(inst, result.plan) == []
        assert evaluate(inst, result.plan).iteration_time_s == pytest.approx(
            result.objective_s, rel=1e-9
        )
        assert len({tuple(st.layers for st in p.stages) for p in result.plan.pipelines}) == 1


@pytest.mark.parametrize(
    "name",
    [
        "s10-four-types",
        "s14-pair-sides",
        "s19-uniform-layout",
        "s20-megatron-order",
        "s21-crossed-lockstep",
    ],
)
def test_each_lockstep_skeleton_solves_to_the_best_of_the_splits_its_templates_share(name):
    """Skeleton by skeleton, every backend's optimum of a uniform layout's templates is the
    evaluator's best over the one split they share (not over one split each), and the search's
    bounds (the skeleton's, its placed program's) lie below it; the layouts the families hold are
    not listed again (one-template layouts, pairs of one class a side); skeletons are listed
    once."""
    inst, profiles = load_instance(SMALL / f"{name}.yaml"), Profiles()
    opts, bounds = SearchOptions.from_instance(inst), Bounds(inst, profiles)
    skeletons = list(lockstep_skeletons(inst, opts, SearchStats()))
    assert skeletons and all(sk.lockstep and len(sk.templates) > 1 for sk in skeletons)
    listed = [sk for sk in enumerate_skeletons(inst, opts, SearchStats()) if sk.lockstep]
    assert listed == skeletons
    scenarios = planning_scenarios(inst, "stable")
    for sk in skeletons:
        depth = sk.split_depths[0]
        times = []
        for split in compositions(inst.model.layers, depth):
            ev = evaluate(inst, sk.placed(sk.joined([split]), inst.cluster), profiles)
            times.append(ev.iteration_time_s if ev.fits else float("inf"))
        best = min(times)
        problem = plan_problem(inst, sk, profiles, scenarios, "stable")
        assert problem.lower_bound_s <= best * (1 + 1e-9)
        assert bounds.skeletons.bound(sk) <= best * (1 + 1e-9)
        # s21 crosses its templates, (A100 → H100) ‖ (H100 → A100): one split binds (0.769 s against
        # 0.525 s for each template at its own split; the best tied split is 0.868 s)
        crossed = bounds.skeletons.lockstep_bound(sk) > 1.2 * bounds.skeletons.bound(
            dataclasses.replace(sk, lockstep=False)
        )
        assert crossed == (name == "s21-crossed-lockstep"), sk.describe()
        for formulation, backend in BACKENDS:
            sol = pick(formulation, backend).solve(problem, backend, SolveOptions(time_limit_s=30))
            if best == float("inf"):
                assert sol.status == SolveStatus.INFEASIBLE, (sk.describe(), backend)
                continue
            assert sol.status == SolveStatus.OPTIMAL, (sk.describe(), backend, sol.detail)
            assert sol.objective_s == pytest.approx(best, rel=1e-5), (sk.describe(), backend)
            assert len({tuple(part) for part in sk.split(sol.layers)}) == 1


def test_a_layout_of_one_template_with_a_class_twice_is_searched_and_a_point(tmp_path):
    """Node groups declared A100, V100, A100: Megatron's pp = 3 layout is one template A100 → V100 →
    A100, outside the families (a class in two runs), so a lockstep skeleton of one template holds
    it, and outside_space says it is a point; the exact search and exhaustive enumeration agree on
    the instance."""
    path = tmp_path / "aba.yaml"
    path.write_text("""name: aba
model: {layers: 6, hidden: 2048, heads: 16, vocab: 8000, max_seq_len: 512}
training: {seq_len: 512, global_batch: 8}
cluster:
  nodes:
    - {name: a, count: 1, gpu: A100-80GB, gpus_per_node: 1, island: r0, nic_gbps: 200}
    - {name: v, count: 1, gpu: V100-32GB, gpus_per_node: 1, island: r0, nic_gbps: 100}
    - {name: b, count: 1, gpu: A100-80GB, gpus_per_node: 1, island: r0, nic_gbps: 200}
search: {tp: [1], micro_batch: [1], recompute: [none], max_stages: 3}
""")
    inst = load_instance(path)
    opts = SearchOptions.from_instance(inst)
    ones = [sk for sk in lockstep_skeletons(inst, opts, SearchStats()) if len(sk.templates) == 1]
    # one replica: one of hetopt's orders
    assert [sk.order for sk in ones] == [
        "megatron",
        "replica",
    ]
    sk = ones[0]
    assert [seg.gpu for seg in sk.templates[0].segments] == ["A100-80GB", "V100-32GB", "A100-80GB"]
    plan = sk.plan([2, 2, 2])
    assert outside_space(inst, plan, opts) == []
    assert any(
        "more than one run" in why
        for why in outside_space(inst, plan, dataclasses.replace(opts, uniform_layouts=False))
    )
    truth = exhaustive(inst, opts)
    result = solve_ilp(
        SearchRequest(inst, formulation="split-milp", backend="highs", time_limit_s=60),
        warm_start=False,
    )
    assert result.status == SolveStatus.OPTIMAL
    assert result.objective_s == pytest.approx(truth.objective_s, rel=1e-9)


def test_a_layout_in_megatrons_own_rank_order_is_searched():
    """s20: Megatron's pp = 3 layout in its own rank order (hetopt.placement.megatron_placed) puts
    both templates' stages on shared nodes, and the gradient exchange between them stays inside the
    nodes: 0.5903 s, where hetopt's replica- and stage-major orders give each template a node,
    0.6382 s. The search finds it (the best plan without uniform layouts: 0.7381 s), and megatron's
    own plan at the optimum's split, placed by expand_layout, times the same."""
    from hetopt.baselines.uniform import with_layers
    from hetopt.layout import Layout, expand_layout

    inst = load_instance(SMALL / "s20-megatron-order.yaml")
    opts = SearchOptions.from_instance(inst)
    times = {
        sk.order: min(
            evaluate(inst, sk.placed(sk.joined([c]), inst.cluster)).iteration_time_s
            for c in compositions(inst.model.layers, 3)
        )
        for sk in lockstep_skeletons(inst, opts, SearchStats())
        if sk.depth == 6
    }
    assert times["megatron"] == pytest.approx(0.5903, abs=1e-4)
    assert times["replica"] == times["stage"] == pytest.approx(0.6382, abs=1e-4)
    result = solve_ilp(
        SearchRequest(inst, formulation="split-milp", backend="highs", time_limit_s=60),
        warm_start=False,
    )
    assert result.status == SolveStatus.OPTIMAL and result.objective_s == pytest.approx(
        times["megatron"], rel=1e-9
    )
    layers = [st.layers for st in result.plan.pipelines[0].stages]
    megatron = with_layers(expand_layout(inst, Layout(tp=1, pp=3, dp=2)), layers)
    assert evaluate(inst, megatron).iteration_time_s == pytest.approx(result.objective_s, rel=1e-9)
    without = solve_ilp(
        SearchRequest(
            inst,
            formulation="split-milp",
            backend="highs",
            time_limit_s=60,
            options=dataclasses.replace(opts, uniform_layouts=False),
        ),
        warm_start=False,
    )
    assert without.objective_s == pytest.approx(0.7381, abs=1e-4)


def test_data_parallelism_over_four_of_five_zones_is_four_templates_of_the_space_and_exports(
    tmp_path,
):
    """s24: five zones of one 2-GPU A100 node, four near (200 Gbit/s) and one far (10 Gbit/s); the
    global batch of 8 does not split over 10 GPUs. Exhaustive enumeration's optimum (0.0155536 s;
    tests/test_planner.py holds every small instance to it on every backend) is pure data
    parallelism over the four near zones, the far one idle: four templates in lockstep, a uniform
    layout over a subset of the device classes (`layout_subsets`, the chain of nearest islands).
    The search proves it and starts from it (the `data-parallel` warm start); it verifies, and
    exports as a rank map and a torchrun script whose groups agree with each other."""
    path = SMALL / "s24-five-zones.yaml"
    inst = load_instance(path)
    opts = SearchOptions.from_instance(inst)
    near = tuple(("A100-40GB", z) for z in ("us-a", "us-b", "us-c", "us-d"))
    assert near in layout_subsets(inst)
    r = solve_ilp(SearchRequest(inst, time_limit_s=60))
    assert r.status == SolveStatus.OPTIMAL and r.objective_s == pytest.approx(0.0155536, abs=1e-7)
    assert r.warm_start["planner"] == "data-parallel"
    assert r.warm_start["objective_s"] == pytest.approx(r.objective_s, rel=1e-9)
    pipes = r.plan.pipelines
    assert len(pipes) == 4 and sorted(p.stages[0].island for p in pipes) == sorted(
        z for _, z in near
    )
    assert all(len(p.stages) == 1 and p.replicas == 2 for p in pipes)
    assert outside_space(inst, r.plan, opts) == [] and lockstep_layout(inst, r.plan, opts)
    assert check_plan(inst, r.plan) == []
    plan_path = tmp_path / "plan.json"
    plan_path.write_text(r.plan.model_dump_json())
    out = tmp_path / "torchrun"
    result = run_hetopt(
        "export", str(plan_path), "--instance", str(path), "--format", "torchrun",
        "--out", str(out), "--json",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert sorted(json.loads(result.stdout)["files"]) == [
        "rank_env.json",
        "rankmap.json",
        "torchrun.sh",
    ]
    rankmap = json.loads((out / "rankmap.json").read_text())
    assert rankmap["world_size"] == 8 and len(rankmap["nodes"]) == 4
    assert consistency(rankmap) == []
    # every replica's gradients meet every other's: its template's group, then the exchange
    for rank in rankmap["ranks"]:
        assert sorted({*rank["dp_group"], *rank["exchange_group"]}) == list(range(8))

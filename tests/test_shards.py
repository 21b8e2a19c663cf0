"""Stages with shards (issue 12): several data-parallel ranks in one stage of a replica, of one or
of several device classes, each running its share of every micro-batch (Metis-style mixed stages,
per-stage DP width) — their plan JSON, verifier, placement, evaluation, replay, and the metis-like
planner that makes them."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from hetopt.baselines.metis import metis_like
from hetopt.cost.features import stage_work
from hetopt.cost.pricing import by_stage
from hetopt.cost.transfers import rank_nodes, reshard_sends
from hetopt.evaluate import BWD, BWD_TP, DP, FWD, OPT, P2P, evaluate, plan_features
from hetopt.placement import place
from hetopt.plan import Plan
from hetopt.search.roots import outside_space
from hetopt.search.shards import device_groups, split_sequences
from hetopt.search.types import SearchOptions
from hetopt.sim.engine import Simulation
from hetopt.spec.instance import load_instance
from hetopt.verify import check_plan

SMALL = Path(__file__).parent / "small"
A = {"gpu": "A100-80GB", "island": "r0"}
V = {"gpu": "V100-16GB", "island": "r0"}
T = {"gpu": "T4", "island": "r0"}


@pytest.fixture(scope="module")
def s4():
    # two A100, two V100-16GB, two T4, one node each
    return load_instance(SMALL / "s4-three-types.yaml")


def _plan(b: int, m: int, stages: list[dict], replicas: int = 1) -> Plan:
    return Plan.model_validate(
        {
            "micro_batch": b,
            "pipelines": [
                {
                    "replicas": replicas,
                    "micro_batches": m,
                    "stages": [{"tp": 1, **st} for st in stages],
                }
            ],
        }
    )


def test_a_stage_of_two_ranks_of_one_class_is_two_replicas(s4):
    """Two ranks of one class per stage, each running q of the 2q sequences of a micro-batch, is the
    plan of two replicas at micro-batch q: the same work, sends, all-reduces and memory — the same
    time."""
    reps = _plan(1, 4, [{"layers": 3, **A}, {"layers": 3, **V}], replicas=2)
    shards = _plan(
        2,
        4,
        [
            {"layers": 3, **A, "shards": [{**A, "ranks": 2, "sequences": 1}]},
            {"layers": 3, **V, "shards": [{**V, "ranks": 2, "sequences": 1}]},
        ],
    )
    a, b = evaluate(s4, reps), evaluate(s4, shards)
    assert b.iteration_time_s == pytest.approx(a.iteration_time_s, rel=1e-12)
    assert b.peak_memory_gib == pytest.approx(a.peak_memory_gib, rel=1e-12)
    assert shards.gpus_used == reps.gpus_used == 4


def test_a_mixed_stage_runs_at_its_slowest_ranks_pace(s4):
    """A mixed stage has a feature row per class — the work of one rank at its sequences — and each
    pass of the stage takes the row where it is longest; its all-reduce starts once every rank is
    its overlap fraction into the last backward."""
    plan = place(
        _plan(
            4,
            2,
            [
                {
                    "layers": 4,
                    **A,
                    "shards": [
                        {**A, "ranks": 2, "sequences": 1},
                        {**V, "ranks": 1, "sequences": 2},
                    ],
                },
                {"layers": 2, **T, "shards": [{**T, "ranks": 2, "sequences": 2}]},
            ],
        ),
        s4.cluster,
    )
    f = plan_features(s4, plan)
    assert f.stage_of == [[0, 0, 1]] and f.mixed(0)
    assert [g.name for g in f.gpus[0]] == ["A100-80GB", "V100-16GB", "T4"]
    m, s = s4.model, s4.seq_len
    intra = s4.cluster.slowest_intra(["v-0"])
    want = stage_work(
        m, s4.gpu_types["V100-16GB"], 2, s, 1, True, "flash", "none", 4, True, False, intra
    )
    # the V100 rank: 4 layers and the embedding, 2 sequences
    assert np.allclose(f.templates[0][1, :4], want)
    # rows 0 and 1 form stage 0: row 1 has the longer forward (3 against 1), row 0 the longer
    # backward (4 + 1 against 2); sends, all-reduce and optimizer the longer of each
    times = np.zeros((3, 7))
    times[:, FWD] = [1.0, 3.0, 2.0]
    times[:, BWD] = [4.0, 2.0, 1.0]
    times[:, BWD_TP] = [1.0, 0.0, 0.0]
    times[:, P2P] = [1.5, 0.5, 0.0]
    times[:, DP] = [0.2, 0.1, 0.3]
    times[:, OPT] = [0.0, 0.4, 0.0]
    stage, overlap = by_stage(times, [0, 0, 1], np.array([0.5, 0.0, 0.25]))
    assert stage[:, FWD].tolist() == [3.0, 2.0] and stage[:, BWD].tolist() == [4.0, 1.0]
    assert stage[:, BWD_TP].tolist() == [1.0, 0.0] and stage[:, P2P].tolist() == [1.5, 0.0]
    assert stage[:, DP].tolist() == [0.2, 0.3] and stage[:, OPT].tolist() == [0.4, 0.0]
    # stage 0: row 0 is ready (1 − 0.5)·5 = 2.5 into the backward, row 1 (1 − 0)·2 = 2: ready at 2.5
    # of 5
    assert overlap.tolist() == [1 - 2.5 / 5, 0.25]


def test_sends_between_stages_of_different_widths_move_each_sequence_once(s4):
    """Stage 0: two A100 ranks of one sequence each (sequences 0 and 1); stage 1: one V100 rank of
    both. Each A100 rank sends its one sequence's activations to the V100 rank; back, the V100 rank
    sends one sequence's gradients to each."""
    plan = place(
        _plan(
            2,
            4,
            [{"layers": 3, **A, "shards": [{**A, "ranks": 2, "sequences": 1}]}, {"layers": 3, **V}],
        ),
        s4.cluster,
    )
    ranks = rank_nodes(plan)
    assert ranks[(0, 0)] == [["a-0", "a-0"]] and ranks[(0, 1)] == [["v-0"]]
    seq = 7.0
    assert reshard_sends(plan, 0, 0, 1, ranks, seq) == [("a-0", "v-0", seq), ("a-0", "v-0", seq)]
    assert reshard_sends(plan, 0, 1, 0, ranks, seq) == [("v-0", "a-0", seq), ("v-0", "a-0", seq)]


def test_the_simulator_replays_a_stage_with_shards(s4):
    """At stable bandwidth the replay of a one-class stage of two ranks is the evaluator's time; a
    mixed stage's (its re-sharding sends are flows, all at once) is within 5% below it — as for
    plans without shards of this shape (V100 → T4 at m = 4: 0.0619 against 0.0634 s): the closed
    form of 1F1B is conservative where forward and backward passes differ."""
    sc = s4.scenarios(100)[0]
    shards = _plan(
        2,
        4,
        [
            {"layers": 3, **A, "shards": [{**A, "ranks": 2, "sequences": 1}]},
            {"layers": 3, **V, "shards": [{**V, "ranks": 2, "sequences": 1}]},
        ],
    )
    assert Simulation(s4, shards).run(sc).iteration_times_s[0] == pytest.approx(
        evaluate(s4, shards).iteration_time_s, rel=1e-4
    )
    mixed = _plan(
        4,
        2,
        [
            {
                "layers": 4,
                **A,
                "shards": [{**A, "ranks": 2, "sequences": 1}, {**V, "ranks": 1, "sequences": 2}],
            },
            {"layers": 2, **T, "shards": [{**T, "ranks": 2, "sequences": 2}]},
        ],
    )
    replayed, priced = (
        Simulation(s4, mixed).run(sc).iteration_times_s[0],
        evaluate(s4, mixed).iteration_time_s,
    )
    assert 0.95 * priced < replayed <= priced


@pytest.mark.parametrize(
    "shards, key, words",
    [
        ([{**A, "ranks": 1, "sequences": 1}], "shards", "Σ ranks·sequences = 1"),
        (
            [{**V, "ranks": 1, "sequences": 2}],
            "shards[0]",
            "the first shard is of the stage's own class",
        ),
        (
            [{**A, "ranks": 1, "sequences": 1}, {**A, "ranks": 1, "sequences": 1}],
            "shards[1]",
            "again",
        ),
        (
            [
                {**A, "ranks": 1, "sequences": 1},
                {"gpu": "H100-SXM", "island": "r0", "ranks": 1, "sequences": 1},
            ],
            "shards[1]",
            "no device class H100-SXM@r0",
        ),
    ],
)
def test_the_verifier_refuses_bad_shards(s4, shards, key, words):
    plan = _plan(2, 4, [{"layers": 6, **A, "shards": shards}])
    found = check_plan(s4, plan)
    assert any(path == f"pipelines[0].stages[0].{key}" and words in msg for path, msg in found), (
        found
    )


def test_shards_need_one_template_and_the_class_s_gpus(s4):
    two = Plan.model_validate(
        {
            "micro_batch": 2,
            "pipelines": [
                {
                    "replicas": 1,
                    "micro_batches": 1,
                    "stages": [
                        {"layers": 6, "tp": 1, **A, "shards": [{**A, "ranks": 2, "sequences": 1}]}
                    ],
                },
                {"replicas": 1, "micro_batches": 3, "stages": [{"layers": 6, "tp": 1, **V}]},
            ],
        }
    )
    assert any("one template" in msg for _, msg in check_plan(s4, two))
    wide = _plan(8, 1, [{"layers": 6, **A, "shards": [{**A, "ranks": 4, "sequences": 2}]}])
    assert any(
        "uses 4 GPUs of A100-80GB@r0; the cluster has 2" in msg for _, msg in check_plan(s4, wide)
    )


def test_a_placement_names_each_rank_once_on_a_node_of_its_class(s4):
    plan = place(
        _plan(
            4,
            2,
            [
                {
                    "layers": 6,
                    **A,
                    "shards": [
                        {**A, "ranks": 1, "sequences": 3},
                        {**V, "ranks": 1, "sequences": 1},
                    ],
                }
            ],
        ),
        s4.cluster,
    )
    assert [(e.rank, e.node) for e in plan.placement] == [(0, "a-0"), (1, "v-0")]
    assert check_plan(s4, plan) == []
    data = json.loads(plan.model_dump_json())
    data["placement"][1]["node"] = "a-0"
    data["placement"][1]["gpus"] = [1]
    found = check_plan(s4, Plan.model_validate(data))
    assert ("placement[1].node", "a-0 is A100-80GB@r0; the stage is V100-16GB@r0") in found
    del data["placement"][1]
    missing = ("placement", "pipeline 0 replica 0 stage 0 rank 1 is not placed")
    assert missing in check_plan(s4, Plan.model_validate(data))


def test_a_bad_shard_in_a_plan_file_exits_2_naming_the_key(tmp_path, hetopt):
    plan = _plan(2, 4, [{"layers": 6, **A, "shards": [{**A, "ranks": 1, "sequences": 1}]}])
    path = tmp_path / "plan.json"
    path.write_text(plan.model_dump_json())
    r = hetopt("evaluate", str(SMALL / "s4-three-types.yaml"), "--plan", str(path))
    assert r.returncode == 2, r.stderr
    assert "pipelines[0].stages[0].shards" in r.stderr and "Σ ranks·sequences = 1" in r.stderr


def test_split_sequences_and_device_groups_by_hand():
    """Two A100 ranks of speed 2 and a V100 of speed 1 split 5 sequences: one each, then the A100s'
    next (each would finish at 2/2 = 1 against the V100's 2/1) — 2, 2, 1. Six ranks of speeds 4, 4,
    2, 2, 1, 1 in two groups of about 7 each: the two 4s stop at 8 ≥ 7, the rest 6."""
    speed = {"A": 2.0, "V": 1.0}
    assert split_sequences({"A": 2, "V": 1}, speed, 5) == {"A": 2, "V": 1}
    assert split_sequences({"A": 2, "V": 1}, speed, 2) is None  # fewer sequences than ranks
    assert split_sequences({"A": 2}, speed, 3) is None  # one left, and A has two ranks to feed
    line = ["x", "x", "y", "y", "z", "z"]
    assert device_groups(line, {"x": 4.0, "y": 2.0, "z": 1.0}, 2) == [
        ["x", "x"],
        ["y", "y", "z", "z"],
    ]
    assert device_groups(line, {"x": 4.0, "y": 2.0, "z": 1.0}, 6) == [[c] for c in line]


def test_metis_like_plans_mixed_stages_the_space_holds():
    """On wan-flapping (8 A100 and 8 V100 in two data centres) the metis-like plan runs each stage
    on A100 and V100 ranks at once, the A100 with more sequences; it verifies, and it is a point of
    the search space (its stages are the space's device groups) — outside it only with search.shards
    off."""
    import dataclasses

    inst = load_instance(Path(__file__).parents[1] / "instances" / "wan-flapping-a100-v100.yaml")
    r = metis_like(inst, 10.0)
    assert r.plan is not None and check_plan(inst, r.plan) == []
    mixed = [st for st in r.plan.pipelines[0].stages if len(st.shards) > 1]
    assert mixed
    for st in mixed:
        seqs = {sh.gpu: sh.sequences for sh in st.shards}
        assert seqs["A100-80GB"] > seqs["V100-32GB"]
    assert evaluate(inst, r.plan).iteration_time_s == pytest.approx(r.objective_s, rel=1e-12)
    opts = SearchOptions.from_instance(inst)
    assert opts.shards and outside_space(inst, r.plan, opts) == []
    why = outside_space(inst, r.plan, dataclasses.replace(opts, shards=False))
    assert why == [
        "stages with shards (several data-parallel ranks in a stage of one replica, "
        "Metis-style): search.shards is off"
    ]


def test_shards_other_than_the_device_groups_lie_outside_the_space(s4):
    """One stage of an A100 and a V100 rank on s4, whose replica leaves its T4s and other ranks
    idle: not the equal-speed cut of a replica's ranks (a replica takes 1/R of every class's), so no
    point of the space, and the message says so."""
    plan = _plan(
        2,
        4,
        [
            {
                "layers": 6,
                **A,
                "shards": [{**A, "ranks": 1, "sequences": 1}, {**V, "ranks": 1, "sequences": 1}],
            }
        ],
    )
    assert check_plan(s4, plan) == []
    why = outside_space(s4, plan, SearchOptions.from_instance(s4))
    assert len(why) == 1 and "not Metis's equal-speed device groups" in why[0], why


S17 = SMALL / "s17-shards.yaml"


ENUMERATED: dict = {}
"""(instance, skeleton) → its least time by enumeration: computed once for the three backends'
tests."""


def _best_by_enumeration(inst, sk) -> float:
    """The least iteration time of a skeleton over every split of the layers that fits, by the
    evaluator."""
    from hetopt.baselines.exhaustive import compositions

    if (inst.name, sk) in ENUMERATED:
        return ENUMERATED[(inst.name, sk)]
    best = math.inf
    for layers in compositions(inst.model.layers, sk.depth):
        ev = evaluate(inst, sk.plan(layers))
        if ev.fits:
            best = min(best, ev.iteration_time_s)
    ENUMERATED[(inst.name, sk)] = best
    return best


@pytest.mark.parametrize(
    "formulation,backend",
    [("split-milp", "cbc"), ("split-milp", "highs"), ("split-cpsat", "cpsat")],
)
def test_every_skeleton_with_shards_solves_to_its_enumerated_optimum(formulation, backend):
    """Every skeleton with shards of two or more stages on s4, s5, s6 and s17 (19, 8 of them with a
    stage that mixes GPU types; each a program with tabulated stages): the backend's objective is
    the evaluator's time of its split and the least over every split."""
    from hetopt.cost.profiles import Profiles
    from hetopt.errors import InfeasibleError
    from hetopt.search.bounds.run import Bounds
    from hetopt.search.dispatch import pick
    from hetopt.search.formulation import SolveOptions, SolveStatus
    from hetopt.search.leaves import plan_problem
    from hetopt.search.robust import planning_scenarios
    from hetopt.search.shards import Layouts

    cases = []
    for name in ("s4-three-types", "s5-l4-a10g", "s6-h100-a100", "s17-shards"):
        inst = load_instance(SMALL / f"{name}.yaml")
        cases += [
            (inst, sk)
            for sk in Layouts(inst, SearchOptions.from_instance(inst)).skeletons()
            if sk.depth > 1
        ]
    # 6, 2, 8 and 3 on the four instances (Layouts.skeletons, 2026-12-02), 4, 2, 1 and 1 of them
    # mixing types
    assert len(cases) == 19 and sum(any(len(sh) > 1 for sh in sk.shards) for _, sk in cases) == 8
    solved = 0
    for inst, sk in cases:
        try:
            problem = plan_problem(
                inst, sk, Profiles(), planning_scenarios(inst, "stable"), "stable"
            )
        except InfeasibleError:
            continue
        truth = _best_by_enumeration(inst, sk)
        sol = pick(formulation, backend).solve(problem, backend, SolveOptions(time_limit_s=30))
        if not math.isfinite(truth):
            assert sol.status == SolveStatus.INFEASIBLE, sk.describe()
            continue
        solved += 1
        assert sol.status == SolveStatus.OPTIMAL, (sk.describe(), sol.detail)
        assert sol.objective_s == pytest.approx(truth, rel=1e-7), sk.describe()
        assert evaluate(inst, sk.plan(sol.layers)).iteration_time_s == pytest.approx(
            sol.objective_s, rel=1e-12
        )
        assert problem.lower_bound_s <= truth * (1 + 1e-12)  # the placed bound holds
        # and the one before placement
        assert Bounds(inst, Profiles()).skeletons.shard_bound(sk) <= truth * (1 + 1e-12)
    # every one of the 19 has a split that fits (enumerated, 2026-12-02)
    assert solved == len(cases)


def test_s17_optimum_uses_shards_and_pays_over_the_space_without_them():
    """s17 (2 A100 in dc0, 2 V100 in dc1 behind a WAN): the proven optimum is one stage of an A100
    rank with 3 of 4 sequences beside a V100 rank with 1 — 12.7% faster than the best plan without
    shards (exhaustive: 0.15147 s against 0.17350 s), whose space's optimum is the answer with
    search.shards off."""
    import dataclasses

    from hetopt.planners import solve_ilp
    from hetopt.search.types import SearchRequest

    inst = load_instance(S17)
    on = solve_ilp(SearchRequest(inst, backend="highs", time_limit_s=60))
    off = solve_ilp(
        SearchRequest(
            inst,
            backend="highs",
            time_limit_s=60,
            options=dataclasses.replace(SearchOptions.from_instance(inst), shards=False),
        )
    )
    assert on.status == off.status == "optimal"
    (stage,) = on.plan.pipelines[0].stages
    assert [(sh.gpu, sh.ranks, sh.sequences) for sh in stage.shards] == [
        ("A100-80GB", 1, 3),
        ("V100-32GB", 1, 1),
    ]
    assert on.objective_s == pytest.approx(0.151466318, rel=1e-8)
    assert off.objective_s == pytest.approx(0.173496417, rel=1e-8)
    assert not any(st.shards for pipe in off.plan.pipelines for st in pipe.stages)
    # regression: the search ended on expanding only beaten nodes and left them uncounted (no bound
    # rule)
    assert (
        on.stats.pruned["bound: whole families never generated (device classes × TP degrees)"] > 0
    )


def test_plan_files_keep_the_shard_keys_only_where_a_stage_has_shards(s4, tmp_path):
    """A plan without shards is written as before (no `shards`, no placement `rank`); one with
    shards reads back the same; the evaluator labels its memory rows by stage and GPU type, and the
    simulator's summary gives each stage its largest row."""
    from hetopt.plan import load_plan, plan_json, save_plan
    from hetopt.sim.summary import stage_peaks

    plain = place(_plan(1, 8, [{"layers": 6, **A}]), s4.cluster)
    data = plan_json(plain)
    assert "shards" not in data["pipelines"][0]["stages"][0] and "rank" not in data["placement"][0]
    mixed = place(
        _plan(
            4,
            2,
            [
                {
                    "layers": 4,
                    **A,
                    "shards": [
                        {**A, "ranks": 2, "sequences": 1},
                        {**V, "ranks": 1, "sequences": 2},
                    ],
                },
                {"layers": 2, **T},
            ],
        ),
        s4.cluster,
    )
    save_plan(mixed, tmp_path / "mixed.json")
    assert load_plan(tmp_path / "mixed.json") == mixed
    ev = evaluate(s4, mixed)
    assert ev.to_json()["memory_rows"] == ["0 A100-80GB", "0 V100-16GB", "1"]
    assert "memory_rows" not in evaluate(s4, plain).to_json()
    assert stage_peaks(mixed, ev.peak_memory_gib) == [
        max(ev.peak_memory_gib[:2]),
        ev.peak_memory_gib[2],
    ]


def test_a_stage_that_cannot_hold_a_layer_is_infeasible_on_every_backend(tmp_path):
    """Regression (review): a stage with shards whose T4 rows cannot hold one layer of a 8,192-wide
    model (its memory cap 0, the domain's floor 1) was solved to OPTIMAL with a split that does not
    fit; now both formulations say INFEASIBLE, as the placed bound (inf) does."""
    from hetopt.cost.profiles import Profiles
    from hetopt.search.dispatch import pick
    from hetopt.search.formulation import SolveOptions, SolveStatus
    from hetopt.search.leaves import plan_problem
    from hetopt.search.robust import planning_scenarios
    from hetopt.search.shards import Layouts

    path = tmp_path / "mem.yaml"
    path.write_text(
        "name: mem-probe\nmodel: {layers: 6, hidden: 8192, heads: 64, vocab: 32000, "
        "max_seq_len: 4096}\ntraining: {seq_len: 4096, global_batch: 8}\ncluster:\n  nodes:\n    - "
        "{name: a, count: 1, gpu: A100-80GB, gpus_per_node: 2, island: r0, nic_gbps: 200}\n    - "
        "{name: t, count: 1, gpu: T4, gpus_per_node: 2, island: r0, nic_gbps: 50}\nsearch: {tp: "
        "[1], micro_batch: [2], recompute: [none], max_stages: 3}\n"
    )
    inst = load_instance(path)
    skeletons = list(Layouts(inst, SearchOptions.from_instance(inst)).skeletons())
    (sk,) = [sk for sk in skeletons if sk.depth == 3]
    problem = plan_problem(inst, sk, Profiles(), planning_scenarios(inst, "stable"), "stable")
    assert min(problem.base.templates[0].max_layers()) == 0 and problem.lower_bound_s == math.inf
    for formulation, backend in (
        ("split-milp", "highs"),
        ("split-milp", "cbc"),
        ("split-cpsat", "cpsat"),
    ):
        sol = pick(formulation, backend).solve(problem, backend, SolveOptions(time_limit_s=10))
        assert sol.status == SolveStatus.INFEASIBLE, (backend, sol.layers)


@pytest.mark.parametrize(
    "change",
    [{"zero": (0,)}, {"zero": (2,)}, {"max_classes": 1}, {"shards": False}],
    ids=["zero0", "zero2", "one-class", "off"],
)
def test_the_answer_is_a_point_of_the_space_it_searched(change):
    """Regression (review): the stages with shards ignored search.zero and max_classes — with `zero:
    [0]` the search returned a ZeRO-1 plan with shards that its own space did not hold. Now they
    follow the options (ZeRO-0 where 0 is searched alone, none where only ZeRO-2/3 are, none beyond
    max_classes), and the proven answer is a point of the space searched."""
    import dataclasses

    from hetopt.planners import solve_ilp
    from hetopt.search.types import SearchRequest

    inst = load_instance(S17)
    opts = dataclasses.replace(SearchOptions.from_instance(inst), **change)
    result = solve_ilp(
        SearchRequest(inst, backend="highs", options=opts, time_limit_s=60), warm_start=False
    )
    assert result.status == "optimal"
    assert outside_space(inst, result.plan, opts) == []
    with_shards = any(st.shards for pipe in result.plan.pipelines for st in pipe.stages)
    assert with_shards == (change == {"zero": (0,)})
    assert result.plan.zero == change.get("zero", (1,))[0]

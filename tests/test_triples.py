"""Three pipeline templates side by side (issue 12; search.max_templates: 3): the space, its bound,
and an instance where the optimum needs all three."""

from __future__ import annotations

import dataclasses
import itertools
import math
from pathlib import Path

import pytest

from hetopt.baselines.exhaustive import exhaustive
from hetopt.cost.profiles import Profiles
from hetopt.cost.terms import LINK
from hetopt.evaluate import evaluate
from hetopt.planners import solve_ilp
from hetopt.search.bounds.run import Bounds
from hetopt.search.roots import outside_space
from hetopt.search.space import class_runs, side_templates
from hetopt.search.tree.triples import TripleShares
from hetopt.search.triples import triple_families, triple_groups
from hetopt.search.types import SearchOptions, SearchRequest, SearchStats, Template
from hetopt.search.uniform import lockstep_layout
from hetopt.spec.instance import load_instance

S18 = Path(__file__).parent / "small" / "s18-three-templates.yaml"


@pytest.fixture(scope="module")
def s18():
    return load_instance(S18)


def test_every_triple_is_a_point_of_its_space_and_its_bound_holds(s18):
    """Each skeleton of s18's triple group (one H100, one A100, one V100: 253 ways to share the 24
    micro-batches) is a plan of the space with max_templates 3 and of no narrower one; the group's
    throughput bound, and the bound at its one replica count, are at most the best of them (each
    template holds every layer: one split)."""
    opts = SearchOptions.from_instance(s18)
    (group,) = list(triple_groups(s18, opts, SearchStats()))
    narrow = dataclasses.replace(opts, max_templates=2)
    best, uniforms = math.inf, 0
    for sk in group.skeletons():
        plan = sk.plan([s18.model.layers] * 3)
        assert outside_space(s18, plan, opts) == []
        # equal shares are also Megatron's pp = 1 layout over the three GPUs (hetopt.search.uniform)
        uniform = lockstep_layout(s18, plan, narrow) is not None
        assert outside_space(s18, plan, narrow) == (
            [] if uniform else ["3 templates (the space: at most 2)"]
        )
        uniforms += uniform
        ev = evaluate(s18, plan)
        if ev.fits:
            best = min(best, ev.iteration_time_s)
    # one GPU per class: R = (1, 1, 1), and m_a + m_b + m_c = 24 with each ≥ 1 in C(23, 2) = 253
    # ways
    assert group.size == 253 and list(group.replica_counts()) == [(1, 1, 1)]
    assert uniforms == 1  # m = 8 each
    bounds = Bounds(s18, Profiles())
    assert bounds.triples.bound(group) <= bounds.triples.replicas_bound(group, (1, 1, 1)) <= best


def test_three_templates_pay_on_s18(s18):
    """Each GPU type a template of its own with its own share — H100 10, A100 9, V100 5
    micro-batches of 2 sequences — is proven optimal at 0.13418 s, 17.7% faster than the best plan
    of two templates or one (0.16300 s, the space's optimum with max_templates 2)."""
    three = solve_ilp(SearchRequest(s18, backend="highs", time_limit_s=60), warm_start=False)
    two = solve_ilp(
        SearchRequest(
            s18,
            backend="highs",
            time_limit_s=60,
            options=dataclasses.replace(SearchOptions.from_instance(s18), max_templates=2),
        ),
        warm_start=False,
    )
    assert three.status == two.status == "optimal"
    shares = sorted((p.stages[0].gpu, p.micro_batches) for p in three.plan.pipelines)
    assert shares == [("A100-80GB", 9), ("H100-SXM", 10), ("V100-32GB", 5)]
    # both figures are the exhaustive enumeration's (tests/test_planner.py checks the first on every
    # backend)
    assert three.objective_s == pytest.approx(0.134181110, rel=1e-8)
    assert two.objective_s == pytest.approx(0.163000, rel=1e-4)
    assert len(two.plan.pipelines) <= 2


def test_three_templates_outside_the_triples_are_named(s18):
    """Regression (read-through): with pair_classes 2 and recompute_per_stage, a plan of three
    templates with a side over two classes, or with two recompute modes, was a point of the space by
    the pair rules though no triple skeleton holds it; now the rule is named."""
    opts = dataclasses.replace(
        SearchOptions.from_instance(s18),
        pair_classes=2,
        recompute_per_stage=True,
        recompute=("none", "full"),
    )
    (group,) = list(triple_groups(s18, opts, SearchStats()))
    sk = next(group.skeletons())
    plan = sk.plan([s18.model.layers] * 3)
    assert outside_space(s18, plan, opts) == []
    mixed = sk.plan([s18.model.layers] * 3, ["none", "full", "none"])
    assert any("one recompute mode for the plan" in w for w in outside_space(s18, mixed, opts))
    a100 = plan.pipelines[1].stages[0]
    two = plan.model_copy(
        update={
            "pipelines": [
                plan.pipelines[0].model_copy(
                    update={
                        "stages": [
                            plan.pipelines[0].stages[0].model_copy(update={"layers": 2}),
                            a100.model_copy(update={"layers": 2}),
                        ]
                    }
                ),
                *plan.pipelines[1:],
            ]
        }
    )
    assert any("three templates of one class" in w for w in outside_space(s18, two, opts))


def test_every_triple_skeletons_bound_holds_and_the_share_bounds_are_its(s18):
    """Each skeleton of s18's group: `compute_lower_bound` (now with the ring exchange of three
    templates) is at most its evaluated time (one split: each template holds every layer). At the
    group's replica counts the shares' least bound (`TripleShares.least`) is at most each skeleton's
    bound, and the caps at a threshold make exactly the skeletons whose bound lies below it."""
    opts = SearchOptions.from_instance(s18)
    (group,) = list(triple_groups(s18, opts, SearchStats()))
    bounds = Bounds(s18, Profiles())
    replicas = (1, 1, 1)
    shares = TripleShares(bounds, group, replicas, "none")
    by_share = {}
    for sk in group.skeletons():
        ev = evaluate(s18, sk.plan([s18.model.layers] * 3))
        bound = bounds.skeletons.bound(sk)
        assert bound <= ev.iteration_time_s * (1 + 1e-9)
        by_share[tuple(t.micro_batches for t in sk.templates)] = bound
    assert bounds.sends.ring_exchange_s(group.sides) > 0
    least = min(by_share.values())
    assert shares.least() <= least * (1 + 1e-12)
    assert shares.least() >= least * (1 - 1e-9)  # m_j·R_j = m_j here: the relaxation is exact
    for threshold in sorted(by_share.values())[::40]:
        made = set(group.shares(replicas, shares.caps(threshold)))
        assert made == {m for m, b in by_share.items() if b < threshold}


def test_a_box_of_replica_counts_bounds_each_of_its_points():
    """three-generations (8 GPUs of each type): for each group of one template per class at TP 1 and
    one stage, `triple_bound` over a box of replica counts is at most its bound at each point of the
    box, and each point's at most its skeletons' (`compute_lower_bound`) at the point's first
    share."""
    inst = load_instance(
        Path(__file__).parents[1] / "instances" / "three-generations-gpt2-medium.yaml"
    )
    opts = SearchOptions.from_instance(inst)
    bounds = Bounds(inst, Profiles())
    groups = [
        g
        for g in triple_groups(inst, opts, SearchStats())
        if g.micro_batch == 8
        and all(seg.stages == 1 and seg.tp == 1 for side in g.sides for seg in side)
        and len({side[0].gpu for side in g.sides}) == 3
    ]
    assert len(groups) == 1
    (g,) = groups
    assert g.tops == (8, 8, 8)
    for lowest, top in (((1, 1, 1), (8, 8, 8)), ((2, 5, 3), (4, 8, 6)), ((8, 8, 1), (8, 8, 8))):
        box = bounds.triples.bound(g, lowest, top)
        for point in itertools.product(
            *(range(lo, hi + 1) for lo, hi in zip(lowest, top, strict=True))
        ):
            here = bounds.triples.replicas_bound(g, point)
            assert box <= here * (1 + 1e-12)
            first = next(g.skeletons_at(point), None)
            if first is not None:
                assert here <= bounds.skeletons.bound(first) * (1 + 1e-12)


def test_a_triple_familys_table_bounds_its_groups_and_lists_each_once():
    """three-generations with max_templates 3: the families' groups are exactly the multisets of
    three single-class side templates (each once, as `itertools.combinations_with_replacement` lists
    them) that take a micro-batch per stage and fit; and each family's throughput bound ≤ its
    table's entries ≤ the bound of the group at that entry (`TripleBounds.bound`)."""
    inst = load_instance(
        Path(__file__).parents[1] / "instances" / "three-generations-gpt2-medium.yaml"
    )
    opts = dataclasses.replace(SearchOptions.from_instance(inst), micro_batch=(8,), tp=(1, 2))
    bounds = Bounds(inst, Profiles())
    listed = []
    for family in triple_families(inst, opts, SearchStats()):
        table, _ = bounds.triples.table(family)
        assert bounds.triples.family_bound(family) <= table.min() * (1 + 1e-12)
        mirrored = family.mirrored()
        for picks in itertools.product(*(range(len(side)) for side in family.sides)):
            group = None if mirrored[picks] else family.group(picks, SearchStats())
            if group is not None:
                listed.append(group.sides)
                assert table[picks] <= bounds.triples.bound(group) * (1 + 1e-12)
    classes = list(inst.cluster.device_classes.values())
    cap = min(opts.max_stages, inst.model.layers)
    sides = [
        t
        for order, tps in class_runs(inst, opts, classes, 1)
        for t in side_templates(order, tps, cap)
    ]
    total = inst.global_batch // 8
    expected = []
    for picked in itertools.combinations_with_replacement(sides, 3):
        if sum(sum(t[0]) for t in picked) > total:
            continue
        use: dict = {}
        for _, _, per in picked:
            for key, (g, _) in per.items():
                use[key] = use.get(key, 0) + g
        if all(g <= inst.cluster.device_classes[key].gpus for key, g in use.items()):
            expected.append(tuple(t[1] for t in picked))
    # 4,146 groups (counted when this test was written): the micro-batch size 8 and TP 1 or 2 only
    assert len(listed) == len(set(listed)) == len(expected) == 4146
    assert set(listed) == set(expected)


@pytest.mark.parametrize("link", [1.0, 2.0, 10.0])
def test_the_ring_bound_holds_whatever_the_link_weight(link):
    """Regression (review): s22's two templates on node k exchange inside it, the third over the
    network. The evaluator prices only the flow of most raw seconds (features.slowest_transfer) with
    one template's weights, so the slowest pair's `exchange_s` is no bound when the LINK weight is
    far above NET's; the ring bound now takes the least pair's, or the weights' least times the
    slowest raw hop. Every triple skeleton's bound ≤ its time, and the search's optimum is
    exhaustive enumeration's (0.077829 s at LINK 10, three templates; the broken bound gave 0.107 s
    with two)."""
    inst = load_instance(Path(__file__).parent / "small" / "s22-ring-link.yaml")
    gpu = inst.gpu_types["slowlink"]
    base = Profiles().for_gpu(gpu)
    profiles = Profiles(
        [
            dataclasses.replace(
                base,
                gpu="slowlink",
                weights=tuple(link if i == LINK else w for i, w in enumerate(base.weights)),
            )
        ]
    )
    opts = SearchOptions.from_instance(inst)
    bounds = Bounds(inst, profiles)
    for sk in (sk for g in triple_groups(inst, opts, SearchStats()) for sk in g.skeletons()):
        ev = evaluate(inst, sk.plan([inst.model.layers] * 3), profiles)
        assert bounds.skeletons.bound(sk) <= ev.iteration_time_s * (1 + 1e-9)
    if link == 10.0:
        best = exhaustive(inst, opts, profiles=profiles, workers=1)
        found = solve_ilp(
            SearchRequest(inst, backend="highs", time_limit_s=60, options=opts, profiles=profiles),
            warm_start=False,
        )
        assert found.status == "optimal"
        assert found.objective_s == pytest.approx(best.objective_s, rel=1e-9)
        assert (
            best.objective_s == pytest.approx(0.0778291, rel=1e-5) and len(best.plan.pipelines) == 3
        )


def test_what_the_templates_can_take_never_drops_a_point_below_the_incumbent():
    """`TripleBounds.reach` prunes a box of replica counts where its templates cannot take the M
    micro-batches below a level (the box's most per template, two on one class within its GPUs). On
    three-generations (groups of up to two stages per template, micro-batch 8, TP 1 or 2, two on one
    class among them): wherever the shares' least bound at a point (`TripleShares.least`) lies below
    a level, the reach at the point, over the group's whole box and over a box around the point is
    at least M; and the drained bounds it is built on rise with the replicas and the
    micro-batches."""
    inst = load_instance(
        Path(__file__).parents[1] / "instances" / "three-generations-gpt2-medium.yaml"
    )
    opts = dataclasses.replace(
        SearchOptions.from_instance(inst), micro_batch=(8,), tp=(1, 2), max_stages=2
    )
    bounds = Bounds(inst, Profiles())
    groups = list(triple_groups(inst, opts, SearchStats()))
    shared = [g for g in groups if len({(side[0].gpu, side[0].island) for side in g.sides}) < 3]
    assert len(groups) > 100 and len(shared) > 50
    checked = pruned = 0
    for g in groups[::7]:
        total = g.total_micro_batches
        for side in g.sides:
            for rc in g.recompute_options:
                depth = sum(seg.stages for seg in side)
                grid = [
                    [
                        bounds.templates.drained_bound(
                            g.micro_batch, rc, Template(side, r, m), total, 1, g.zero, (rc,)
                        )
                        for m in range(depth, depth + 12)
                    ]
                    for r in range(1, 9)
                ]
                # rises with m
                assert all(a <= b for row in grid for a, b in itertools.pairwise(row))
                # and R
                assert all(
                    a <= b for col in zip(*grid, strict=True) for a, b in itertools.pairwise(col)
                )
        for point in g.replica_counts():
            for rc in g.recompute_options:
                least = TripleShares(bounds, g, point, rc).least()
                if not math.isfinite(least):
                    continue
                for level in (least * 1.0001, least * 1.05, least * 1.3):
                    checked += 1
                    around = (
                        tuple(max(1, r - 1) for r in point),
                        tuple(min(t, r + 2) for r, t in zip(point, g.tops, strict=True)),
                    )
                    for box in ((point, point), ((1, 1, 1), g.tops), around):
                        assert bounds.triples.reach(g, *box, level) >= total
                pruned += bounds.triples.reach(g, point, point, least * 0.999) < total
    assert checked > 1000 and pruned > 100


def test_the_reach_of_templates_on_one_class_is_the_most_that_fits():
    """`class_reach` against brute force: the most Σ_j takes_j(R_j) over the replica counts of a
    box whose GPUs fit the class, for one, two and three templates on it (random takes, widths and
    boxes)."""
    import random

    import numpy as np

    from hetopt.search.bounds.reach import class_reach

    rng = random.Random(12)
    for _ in range(300):
        n = rng.choice((1, 2, 3))
        gpus = rng.randint(4, 40)
        widths = [rng.choice((1, 2, 4)) for _ in range(n)]
        lowest = [rng.randint(1, 4) for _ in range(n)]
        takes = [
            np.array([rng.randint(-50, 60) for _ in range(rng.randint(1, 8))]) for _ in range(n)
        ]
        best = -(2**40)
        for counts in itertools.product(
            *(range(low, low + len(t)) for low, t in zip(lowest, takes, strict=True))
        ):
            if n == 1 or sum(r * w for r, w in zip(counts, widths, strict=True)) <= gpus:
                best = max(
                    best,
                    sum(int(t[r - low]) for t, r, low in zip(takes, counts, lowest, strict=True)),
                )
        assert class_reach(takes, lowest, widths, gpus) == best


def test_slot_caps_keep_every_replica_count_that_has_a_share(tmp_path):
    """Each replica of template j takes at least p_j micro-batches (one per stage), so Σ_j R_j·p_j ≤
    M: on three-generations cut to a global batch of 8 (M = 8 at micro-batch 1), each group's tops
    are its replica counts alone on its class, cut to one replica of each other template beside
    them, and a box's `slot_caps` from its least corner: every replica count of the uncut tops that
    has a share lies within both, and the cuts bite (the test would hold with no cut at all)."""
    text = (
        Path(__file__).parents[1] / "instances" / "three-generations-gpt2-medium.yaml"
    ).read_text()
    path = tmp_path / "three-small-batch.yaml"
    path.write_text(text.replace("global_batch: 2048", "global_batch: 8"))
    inst = load_instance(path)
    opts = dataclasses.replace(
        SearchOptions.from_instance(inst), micro_batch=(1,), tp=(1,), max_stages=4
    )
    cut, checked = 0, 0
    for g in triple_groups(inst, opts, SearchStats()):
        alone = tuple(
            min(gpus // g.width(j) for key, gpus in g.gpus if key == (side[0].gpu, side[0].island))
            for j, side in enumerate(g.sides)
        )
        cut += g.tops != alone
        uncut = dataclasses.replace(g, tops=alone)
        for point in uncut.replica_counts():
            if uncut.share_count(point) == 0:
                continue
            checked += 1
            assert all(r <= t for r, t in zip(point, g.tops, strict=True)), (g.sides, point)
            for lowest in itertools.product(*(range(1, r + 1) for r in point)):
                caps = g.slot_caps(lowest)
                assert caps is not None and all(r <= c for r, c in zip(point, caps, strict=True)), (
                    g.sides,
                    point,
                    lowest,
                )
        # a least corner that takes more than M holds no replica count
        assert g.slot_caps((g.total_micro_batches, 1, 1)) is None
    assert cut > 0 and checked > 0

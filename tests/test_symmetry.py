"""Interchangeable islands (hetopt.search.symmetry): which islands are, and that a family and its
twin under a swap of islands have the same times, so searching one of them loses nothing."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from hetopt.baselines.exhaustive import exhaustive
from hetopt.cost.profiles import Profiles
from hetopt.errors import InfeasibleError
from hetopt.evaluate import evaluate
from hetopt.layout import split_layers
from hetopt.search.roots import enumerate_skeletons
from hetopt.search.space import SYMMETRY_RULE, enumerate_families
from hetopt.search.symmetry import canonical, island_blocks
from hetopt.search.types import SearchOptions, SearchStats, Segment, Skeleton
from hetopt.spec.instance import load_instance

SMALL = Path(__file__).parent / "small"
FIVE_ZONES = SMALL / "s24-five-zones.yaml"
NEAR = ("us-b", "us-c", "us-d")


def _variant(tmp_path: Path, old: str, new: str, extra: str = "") -> Path:
    path = tmp_path / "variant.yaml"
    path.write_text(FIVE_ZONES.read_text().replace(old, new) + extra)
    return path


def test_islands_are_interchangeable_only_where_nothing_the_cost_model_reads_differs(tmp_path):
    """s24: us-b, us-c and us-d hang off us-a by equal links with equal nodes, so they form one
    block; us-a (the hub) and eu-a (10 Gbit/s) do not. A different NIC, a different link or a
    scenario naming an island takes that island out."""
    assert set(island_blocks(load_instance(FIVE_ZONES))) == set(NEAR)
    assert island_blocks(load_instance("demo")) == {}
    nic = _variant(tmp_path, "island: us-d, nic_gbps: 100", "island: us-d, nic_gbps: 50")
    assert set(island_blocks(load_instance(nic))) == {"us-b", "us-c"}
    link = _variant(tmp_path, "{a: us-a, b: us-c, gbps: 200}", "{a: us-a, b: us-c, gbps: 150}")
    assert set(island_blocks(load_instance(link))) == {"us-b", "us-d"}
    scenario = _variant(
        tmp_path,
        "",
        "",
        "scenarios:\n  - {name: cut, probability: 1, events: "
        "[{at_s: 0, link: [us-a, us-b], gbps: 20}]}\n",
    )
    assert set(island_blocks(load_instance(scenario))) == {"us-c", "us-d"}


def _relabel(sk: Skeleton, blocks: dict) -> Skeleton:
    """The skeleton with each block's islands renumbered in order of first use (its canonical
    twin)."""
    mapping: dict[str, str] = {}
    used: dict[tuple, int] = {}
    for t in sk.templates:
        for seg in t.segments:
            block = blocks.get(seg.island)
            if block is not None and seg.island not in mapping:
                mapping[seg.island] = block[used.get(block, 0)]
                used[block] = used.get(block, 0) + 1
    templates = tuple(
        dataclasses.replace(
            t,
            segments=tuple(
                Segment(s.gpu, mapping.get(s.island, s.island), s.tp, s.stages, s.cp)
                for s in t.segments
            ),
        )
        for t in sk.templates
    )
    return dataclasses.replace(sk, templates=templates)


def test_a_skeleton_and_its_twin_under_a_swap_of_islands_have_the_same_times():
    """Every one-template skeleton of s24 whose classes cross the block (symmetry off) against its
    canonical twin, at the even layer split: the same iteration time and the same fit, to 1e-12 (47
    pairs)."""
    inst = load_instance(FIVE_ZONES)
    blocks = island_blocks(inst)
    opts = dataclasses.replace(SearchOptions.from_instance(inst), symmetry=False)
    profiles, compared = Profiles(), 0
    for sk in enumerate_skeletons(inst, opts, SearchStats()):
        if len(sk.templates) != 1 or sk.lockstep or sk.shards:
            continue
        twin = _relabel(sk, blocks)
        if twin == sk:
            continue
        layers = split_layers(inst.model.layers, sk.depth)
        try:
            mine = evaluate(inst, sk.placed(layers, inst.cluster), profiles)
            theirs = evaluate(inst, twin.placed(layers, inst.cluster), profiles)
        except InfeasibleError:
            continue
        assert mine.iteration_time_s == pytest.approx(theirs.iteration_time_s, rel=1e-12)
        assert mine.fits == theirs.fits
        compared += 1
    assert compared >= 40


def test_canonical_families_alone_hold_the_optimum_of_every_family():
    """s24 with symmetry on lists 78 families instead of 340 (one-template ones of the block in
    canonical form only, the rest counted as pruned), and exhaustive enumeration of the canonical
    space finds the optimum of the whole (tests/test_planner.py holds every backend's search to the
    former)."""
    inst = load_instance(FIVE_ZONES)
    opts = SearchOptions.from_instance(inst)
    on, off = SearchStats(), SearchStats()
    n_on = sum(1 for _ in enumerate_families(inst, opts, on))
    n_off = sum(1 for _ in enumerate_families(inst, dataclasses.replace(opts, symmetry=False), off))
    assert (n_on, n_off) == (78, 340) and on.pruned[SYMMETRY_RULE] == n_off - n_on
    whole = exhaustive(inst, dataclasses.replace(opts, symmetry=False))
    canonical_only = exhaustive(inst, opts)
    assert canonical_only.objective_s == pytest.approx(whole.objective_s, rel=1e-12)
    assert canonical_only.plans_evaluated < whole.plans_evaluated


def test_canonical_numbers_each_blocks_islands_in_order_of_first_use():
    inst = load_instance(FIVE_ZONES)
    blocks = island_blocks(inst)
    dc = inst.cluster.device_classes
    a, b, c, d = (dc[("A100-40GB", z)] for z in ("us-a", "us-b", "us-c", "us-d"))
    assert canonical((a, b, c), blocks) and canonical((b, a, c, d), blocks)
    assert not canonical((a, c), blocks) and not canonical((b, d), blocks)

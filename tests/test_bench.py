"""Baselines and `hetopt bench`: every baseline's plan verified, none faster than hetopt's proven
optimum on the small instances, the instance library, and the bench's outputs (never overwriting
without --force)."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import pytest
from conftest import once_per_run, run_hetopt

from hetopt.baselines.registry import PLANNERS
from hetopt.baselines.uniform import min_max_split
from hetopt.cost.profiles import Profiles
from hetopt.evaluate import evaluate
from hetopt.planners import solve_ilp
from hetopt.search.types import SearchRequest
from hetopt.spec.instance import bundled_instances, load_instance
from hetopt.verify import check_plan

SMALL = sorted((Path(__file__).parent / "small").glob("*.yaml"))
BASELINES = ["megatron", "fastest-subset", "proportional", "amp-like", "random"]


NO_FITTING_PLAN = {
    "s9-interleaved": {"megatron"},
    "s10-four-types": {"megatron", "fastest-subset", "amp-like"},
    # 6 T4 near their memory limit, 20 micro-batches: only the random skeletons find a fit
    "s11-uneven-shares": {"megatron", "fastest-subset", "proportional", "amp-like"},
    # 4 stages at TP 1 with recompute on stage 0 fit, and few splits: 400 random draws of a
    # skeleton, a split and a mode per stage miss them
    "s13-recompute-per-stage": {"random"},
    # 10 GPUs of one type and a global batch of 8: no uniform layout over every GPU (or every GPU of
    # the one type) splits the batch; the optimum leaves a zone idle
    "s24-five-zones": {"megatron", "fastest-subset", "amp-like"},
}


def _optima():
    # without heuristic warm starts: the search's own plan space has to beat every baseline
    return {
        p.stem: solve_ilp(SearchRequest(load_instance(p), time_limit_s=60), warm_start=False)
        for p in SMALL
    }


@pytest.fixture(scope="session")
def optima(tmp_path_factory, worker_id):
    """The proven optimum of every small instance, once per run (not once per xdist worker)."""
    return once_per_run("bench_optima", _optima, tmp_path_factory, worker_id)


@pytest.mark.parametrize("path", SMALL, ids=[p.stem for p in SMALL])
def test_no_baseline_beats_the_proven_optimum(path, optima):
    inst = load_instance(path)
    best = optima[path.stem]
    assert best.status.value == "optimal"
    missing = set()
    for name in BASELINES:
        result = PLANNERS[name](inst, 30.0)
        if result.plan is None:
            missing.add(name)
            continue
        assert check_plan(inst, result.plan) == []  # through the independent verifier
        timed = evaluate(inst, result.plan)
        assert timed.fits and timed.iteration_time_s == pytest.approx(result.objective_s, rel=1e-12)
        assert timed.iteration_time_s >= best.objective_s * (1 - 1e-9), name
    # measured: every baseline finds a fitting plan on every small instance but the three built to
    # fill memory, where uniform layouts (and the cluster seen as all T4) cannot hold the model
    assert missing == NO_FITTING_PLAN.get(path.stem, set())


def test_heuristics_do_what_their_names_say():
    inst = load_instance("demo")
    mega = PLANNERS["megatron"](inst)
    assert "32×V100-32GB" in mega.note  # the cluster seen as its slowest GPU
    assert {s.gpu for p in mega.plan.pipelines for s in p.stages} == {"A100-80GB", "V100-32GB"}
    subset = PLANNERS["fastest-subset"](inst)
    assert {s.gpu for p in subset.plan.pipelines for s in p.stages} == {"A100-80GB"}
    seeded = [PLANNERS["random"](inst, seed=3).objective_s for _ in range(2)]
    assert seeded[0] == seeded[1]  # the same seed, the same plan


def test_amp_dynamic_program_finds_the_best_min_max_split():
    """On a 2-stage A100 → V100 layout the DP split must equal the best of all splits by brute
    force."""
    from hetopt.layout import Layout, expand_layout
    from hetopt.search.bounds.run import Bounds

    inst = load_instance("demo")
    plan = expand_layout(inst, Layout(tp=8, pp=4, dp=1, mb=1))
    profiles = Profiles()
    layers = min_max_split(inst, profiles, plan)
    p = len(plan.pipelines[0].stages)

    def slowest(split):
        worst = 0.0
        for i, n in enumerate(split):
            st = plan.pipelines[0].stages[i]
            a, c = Bounds(inst, profiles).templates.stage_line(
                st.gpu, st.tp, 1, st.recompute, i == 0, i == p - 1
            )
            worst = max(worst, a * n + c)
        return worst

    from hetopt.baselines.exhaustive import compositions

    assert sum(layers) == inst.model.layers
    assert slowest(layers) == pytest.approx(
        min(slowest(s) for s in compositions(inst.model.layers, p))
    )
    assert layers[0] > layers[-1]  # the A100 stages take more layers than the V100 ones


def test_the_instance_library_names_what_each_instance_is_modelled_on():
    bundled = bundled_instances()
    assert len(bundled) >= 14
    for name, path in bundled.items():
        header = [line for line in path.read_text().splitlines() if line.startswith("#")]
        # a header comment saying what it models: two full comment lines at least (the shortest: 2,
        # 200 chars)
        assert len(header) >= 2 and len(" ".join(header)) > 2 * 60, name
        inst = load_instance(name)
        assert inst.cluster.total_gpus > 0
    sizes = {load_instance(n).cluster.total_gpus for n in bundled}
    assert {256, 1024, 4096} <= sizes
    dynamic = [n for n in bundled if load_instance(n).spec.scenarios]
    # the issue names three settings with dynamic bandwidth: mixed racks (the demo), two data
    # centres over a WAN link, a cloud zone pair with a flapping link
    assert {"demo-a100-v100-llama7b", "two-dc-wan-diurnal", "zone-pair-flapping-l4-a10g"} <= set(
        dynamic
    )


def test_bench_writes_csv_markdown_and_plots_and_never_overwrites(tmp_path):
    out = tmp_path / "bench"
    args = [
        "bench",
        "wan-flapping-a100-v100",
        str(SMALL[1]),
        "--planners",
        "hetopt,megatron,exhaustive",
        "--time-limit",
        "30",
        "--iterations",
        "2",
        "--out",
        str(out),
    ]
    first = run_hetopt(*args)
    assert first.returncode == 0, first.stderr
    for name in (
        "results.csv",
        "results.md",
        "throughput.png",
        "search_time.png",
        "iteration_times.png",
    ):
        assert (out / name).stat().st_size > 0
        if name.endswith(".png"):
            assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    rows = list(csv.DictReader((out / "results.csv").open()))
    wan = [r for r in rows if r["instance"] == "wan-flapping-a100-v100"]
    # one row per instance × planner × scenario
    assert {r["scenario"] for r in wan} == {
        "calm",
        "congested",
    }
    # and on the instance with scenarios, the robust plan and the adaptive policy from each plan
    # (its rows); on both, priced at the catalog's prices, the plan of least dollars per token
    assert len(rows) == (3 + 1) * 2 + (3 + 1) * 1 + 3 * 2
    assert {r["planner"] for r in rows if r["instance"] != "wan-flapping-a100-v100"} == {
        "ilp",
        "ilp-cost",
        "megatron",
        "exhaustive",
    }
    # never dearer per token than the fastest plan (in the analytic time both are proven in; no
    # link is priced, so a plan's dollars per hour do not depend on its time)
    for name in {r["instance"] for r in rows}:
        per_iteration = {
            r["planner"]: float(r["usd_per_hour"]) * float(r["predicted_s"])
            for r in rows
            if r["instance"] == name and r["planner"] in ("ilp", "ilp-cost")
        }
        assert per_iteration["ilp-cost"] <= per_iteration["ilp"] * (1 + 1e-9)
    assert all(
        r["tokens"] for r in wan if r["planner"].startswith("ilp") and r["planner"] != "ilp-cost"
    )
    ours = {r["scenario"]: float(r["tokens_per_s"]) for r in wan if r["planner"] == "ilp"}
    assert all(math.isfinite(v) and v > 0 for v in ours.values())
    refused = [r for r in wan if r["planner"] == "exhaustive"]
    assert all(r["status"] in ("refused", "optimal") for r in refused)
    md = (out / "results.md").read_text()
    # --planners hetopt: the old name of ilp
    assert "## wan-flapping-a100-v100" in md and "**" in md and "vs ilp" in md
    before = (out / "results.csv").read_bytes()
    again = run_hetopt(*args)
    assert again.returncode == 2 and "already exist" in again.stderr and "--force" in again.stderr
    assert (out / "results.csv").read_bytes() == before  # nothing a user has is lost


def test_bench_rejects_an_unknown_planner():
    result = run_hetopt("bench", "demo", "--planners", "hetopt,megatorn")
    assert result.returncode == 2
    assert "megatorn" in result.stderr and "did you mean 'megatron'" in result.stderr


def test_an_unknown_scenario_is_refused_with_the_ones_the_instances_have(tmp_path):
    result = run_hetopt(
        "bench", "demo-a100-v100-llama7b", "--scenarios", "nope", "--out", str(tmp_path / "b")
    )
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert "no instance has this scenario; they have: calm, congested-uplink" in result.stderr
    assert not (tmp_path / "b" / "results.csv").exists()

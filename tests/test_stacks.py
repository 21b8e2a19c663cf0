"""Framework stacks (hetopt/cost/stacks.py): `training.framework` scales device compute, the same in
the evaluator, the planner's linearisation and the simulator; the efficiency fit and its
leave-one-source-out."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from conftest import DEMO, REPO, run_hetopt

from hetopt.calibrate.accuracy import fit_stacks
from hetopt.calibrate.stacks import fit_efficiency
from hetopt.cost.profiles import Profiles
from hetopt.cost.stacks import COMPUTE_TERMS, FRAMEWORKS, Stack
from hetopt.cost.terms import N_TERMS
from hetopt.evaluate import evaluate, host_device, plan_features
from hetopt.layout import Layout, expand_layout
from hetopt.spec.instance import load_instance

SMALL = REPO / "tests" / "small"


def _with_framework(tmp_path, framework: str):
    text = DEMO.read_text().replace("training:\n", f"training:\n  framework: {framework}\n", 1)
    path = tmp_path / f"demo-{framework}.yaml"
    path.write_text(text)
    return load_instance(path)


def test_shipped_table_has_every_stack_and_megatron_is_one():
    stacks = Profiles().stacks
    assert set(stacks) == set(FRAMEWORKS)
    assert stacks["megatron"].compute_efficiency == 1.0
    fsdp = stacks["fsdp"]
    assert 0.3 < fsdp.compute_efficiency < 1.0 and fsdp.fit["rows"] > 0 and fsdp.fit["sources"]


def test_fsdp_divides_device_compute_and_nothing_else(tmp_path):
    eff = 0.5
    profiles = Profiles(stacks={"fsdp": Stack("fsdp", eff)})
    gpu = load_instance(DEMO).gpu_types["A100-80GB"]
    mega, fsdp = profiles.for_gpu(gpu).w, profiles.for_gpu(gpu, "fsdp").w
    for t in range(N_TERMS):
        assert fsdp[t] == pytest.approx(mega[t] / eff if t in COMPUTE_TERMS else mega[t], rel=1e-12)
    # Four A100 (tiny instance s1): the compute part of the breakdown is exactly 1/ε as long, TP
    # unchanged
    evals = {}
    for framework in FRAMEWORKS:
        path = tmp_path / f"s1-{framework}.yaml"
        path.write_text(
            (SMALL / "s1-a100x4.yaml")
            .read_text()
            .replace("training: {", f"training: {{framework: {framework}, ", 1)
        )
        inst = load_instance(path)
        evals[framework] = evaluate(
            inst, expand_layout(inst, Layout(tp=2, pp=2, dp=1, mb=1, recompute="none")), profiles
        )
    ev_m, ev_f = evals["megatron"], evals["fsdp"]
    # the device seconds of the passes scale by exactly 1/ε; host time (launches) and TP do not
    feats = plan_features(
        inst, expand_layout(inst, Layout(tp=2, pp=2, dp=1, mb=1, recompute="none"))
    )
    host_m, dev_m = host_device(feats.templates[0][:, :2], profiles.for_gpu(gpu).w)
    host_f, dev_f = host_device(feats.templates[0][:, :2], profiles.for_gpu(gpu, "fsdp").w)
    assert dev_f == pytest.approx(dev_m / eff, rel=1e-12) and host_f == pytest.approx(
        host_m, rel=1e-12
    )
    assert ev_m.breakdown["compute"] < ev_f.breakdown["compute"] <= ev_m.breakdown["compute"] / eff
    assert ev_f.breakdown["tp_comm"] == pytest.approx(ev_m.breakdown["tp_comm"], rel=1e-9)
    assert ev_f.iteration_time_s > ev_m.iteration_time_s


def test_the_linearised_skeleton_is_the_evaluator_under_fsdp(tmp_path):
    import random

    from hetopt.errors import InfeasibleError
    from hetopt.search.linear import split_problem
    from hetopt.search.space import enumerate_groups
    from hetopt.search.types import SearchOptions, SearchStats

    inst = _with_framework(tmp_path, "fsdp")
    profiles = Profiles()
    groups = list(enumerate_groups(inst, SearchOptions.from_instance(inst), SearchStats()))
    rng = random.Random(3)
    checked = 0
    for group in rng.sample(groups, 30):
        sk = rng.choice(list(itertools.islice(group.skeletons(), 20)))
        try:
            problem = split_problem(inst, sk, profiles)
        except InfeasibleError:
            continue
        layers = []
        for depth in sk.depths:
            cuts = sorted(rng.sample(range(1, inst.model.layers), depth - 1))
            layers += [b - a for a, b in zip([0, *cuts], [*cuts, inst.model.layers], strict=True)]
        placed = sk.placed(layers, inst.cluster)
        assert problem.iteration_time(layers) == pytest.approx(
            evaluate(inst, placed, profiles).iteration_time_s, rel=1e-12
        )
        checked += 1
    assert checked >= 10


def test_fit_efficiency_recovers_a_known_efficiency():
    rng = np.random.default_rng(0)
    compute, comm = rng.uniform(1, 10, 40), rng.uniform(0, 2, 40)
    true = 0.62
    measured = compute / true + comm

    def predict(eff: float) -> np.ndarray:
        return compute / eff + comm

    eff, fit = fit_efficiency(predict, measured)
    assert eff == pytest.approx(true, abs=1e-3)
    assert fit["rows"] == 40 and fit["mape"] < 1e-3


def test_a_stack_without_rows_to_fit_on_is_priced_as_megatron():
    # what a leave-one-source-out fold sees when the held-out source is the stack's only one
    stacks = fit_stacks([])
    assert {s.compute_efficiency for s in stacks.values()} == {1.0}
    assert stacks["fsdp"].fit["rows"] == 0


def test_an_unknown_framework_is_exit_2_naming_the_choices(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text(DEMO.read_text().replace("training:\n", "training:\n  framework: jax\n", 1))
    result = run_hetopt("solve", str(path))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert (
        "training.framework" in result.stderr
        and "fsdp" in result.stderr
        and "megatron" in result.stderr
    )

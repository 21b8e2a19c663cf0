"""Framework stacks (hetopt/cost/stacks.py): `training.framework` scales device compute, the same in
the evaluator, the planner's linearisation and the simulator; the efficiency fit and its
leave-one-source-out."""

from __future__ import annotations

import itertools
from dataclasses import replace

import numpy as np
import pytest
from conftest import DEMO, REPO, run_hetopt

from hetopt.calibrate.accuracy import fit_stacks
from hetopt.calibrate.stacks import fit_efficiency
from hetopt.cost.memory import model_state_bytes, stage_params
from hetopt.cost.profiles import Profiles
from hetopt.cost.stacks import (
    COMPUTE_TERMS,
    FRAMEWORKS,
    Stack,
    StackMemory,
    shipped_stacks,
    stack_memory,
)
from hetopt.cost.terms import N_TERMS
from hetopt.evaluate import evaluate, host_device, plan_features, stage_memory
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
    assert {stacks[fw].compute_efficiency for fw in ("megatron", "fsdp")} == {1.0}
    assert stacks["fsdp"].fit["rows"] == 0
    # scaling's efficiency is fitted on run outcomes (calibrate --outcomes), not on these rows
    assert stacks["scaling"] == shipped_stacks()["scaling"]


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


def _stage_peak(inst, memory: StackMemory, layout: Layout) -> float:
    """The one stage's peak bytes of `layout` (pp 1) with `memory` as the stack's layout."""
    inst = replace(inst, stack_memory=memory)
    plan = expand_layout(inst, layout)
    st = plan.pipelines[0].stages[0]
    params = stage_params(inst.model, st.layers, True, True, 1)
    return stage_memory(inst, plan, plan.pipelines[0].micro_batches, 1, 0, st, params, layout.dp)


def test_each_memory_term_of_a_stack_is_its_formula(tmp_path):
    """Each StackMemory term moves a stage's peak by exactly its formula: the fp32 gradient shard
    4·Ψ/(t·dp), a loss on gathered logits 16·b·s·V against Megatron's 8·b·s·V/t, the loss's
    transients 68·b·s·V, allocator overhead a share of the layers' activations (not the loss's), a
    reserve in GiB."""
    inst = _with_framework(tmp_path, "scaling")
    lay = Layout(tp=2, pp=1, dp=16, mb=2, zero=1)
    m, b, s = inst.model, 2, inst.seq_len
    params = stage_params(m, m.layers, True, True, 1)
    megatron = StackMemory()
    base = _stage_peak(inst, megatron, lay)
    # 16-bit gradients: 2 bytes less per parameter than fp32 main_grad
    grads16 = _stage_peak(inst, replace(megatron, grad_bytes=2.0), lay)
    assert base - grads16 == pytest.approx(2 * params / 2, rel=1e-9)
    shard = _stage_peak(inst, replace(megatron, grad_partition_bytes=4.0), lay)
    assert shard - base == pytest.approx(4 * params / 2 / 16, rel=1e-9)
    gathered = _stage_peak(
        inst, replace(megatron, vocab_parallel_loss=False, loss_bytes_per_logit=16.0), lay
    )
    assert gathered - base == pytest.approx(16 * b * s * m.vocab - 8 * b * s * m.vocab / 2)
    transients = _stage_peak(
        inst, replace(megatron, vocab_parallel_loss=False, logit_buffer_bytes=68.0), lay
    )
    gathered_only = _stage_peak(inst, replace(megatron, vocab_parallel_loss=False), lay)
    assert transients - gathered_only == pytest.approx(68 * b * s * m.vocab, rel=1e-9)
    reserve = _stage_peak(inst, replace(megatron, reserve_gib=3.0), lay)
    assert reserve - base == pytest.approx(3 * 2**30, rel=1e-9)
    states = model_state_bytes(params, 2, 16, 1)
    overhead = _stage_peak(inst, replace(megatron, allocator_overhead=0.5), lay)
    loss = 8 * b * s * m.vocab / 2
    assert overhead - base == pytest.approx(0.5 * (base - states - loss), rel=1e-9)


def test_the_scaling_stack_prices_its_own_memory_and_megatron_keeps_its_counts(tmp_path):
    shipped = shipped_stacks()
    assert shipped["megatron"].memory == StackMemory() == shipped["fsdp"].memory
    mem = shipped["scaling"].memory
    assert (mem.grad_bytes, mem.grad_partition_bytes, mem.vocab_parallel_loss) == (2, 4, False)
    for name in ("logit_buffer_bytes", "allocator_overhead", "reserve_gib", "grad_bytes"):
        assert mem.sources.get(name), name  # every term says where it comes from
    inst = _with_framework(tmp_path, "scaling")
    assert inst.stack_memory is None and stack_memory("scaling") == mem
    # the evaluator prices a scaling instance's stage with the stack's memory, megatron's with its
    lay = Layout(tp=2, pp=1, dp=16, mb=2, zero=1)
    mega = _with_framework(tmp_path, "megatron")
    for i, memory in ((inst, mem), (mega, StackMemory())):
        plan = expand_layout(i, lay)
        reserve = Profiles().for_gpu(i.gpu_types[plan.pipelines[0].stages[0].gpu]).reserve_gib
        assert max(evaluate(i, plan).peak_memory_gib) == pytest.approx(
            _stage_peak(i, memory, lay) / 2**30 + reserve, rel=1e-9
        )

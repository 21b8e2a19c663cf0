"""Dollars (issue 38): the price catalog, what a plan costs per hour and per million tokens, which
nodes it rents, what crosses priced links, and the fields every command reports."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml
from conftest import DEMO, run_hetopt

from hetopt.cost.dollars import link_bytes, plan_cost
from hetopt.cost.features import grad_comm_bytes
from hetopt.cost.memory import stage_params
from hetopt.evaluate import evaluate
from hetopt.layout import Layout, expand_layout
from hetopt.placement import place
from hetopt.spec.gpus import CATALOG
from hetopt.spec.instance import instance_from_spec, load_instance, with_rent
from hetopt.spec.load import validate_document
from hetopt.spec.prices import GB, PRICES
from hetopt.spec.schema import InstanceFile

MODEL = {"layers": 4, "hidden": 1024, "heads": 8, "vocab": 8000, "max_seq_len": 512}


def _inst(nodes: list[dict], links: list[dict] = (), gpus: dict | None = None, batch: int = 8):
    doc = {
        "name": "dollars",
        "model": MODEL,
        "training": {"seq_len": 512, "global_batch": batch},
        "cluster": {"nodes": nodes, "network": {"links": list(links)}, "gpus": gpus or {}},
    }
    spec = validate_document(doc, "test.yaml", InstanceFile, "instance")
    return instance_from_spec(spec, "test.yaml", Path("."))


def _node(name: str, gpu: str = "A100-80GB", gpus: int = 1, island: str = "r0", **kw) -> dict:
    return {
        "name": name,
        "count": kw.pop("count", 1),
        "gpu": gpu,
        "gpus_per_node": gpus,
        "island": island,
        "nic_gbps": 100,
        **kw,
    }


def test_every_catalog_type_has_a_price_with_its_source_and_date():
    assert set(PRICES) == set(CATALOG)
    for name, price in PRICES.items():
        assert price.usd_per_gpu_hour > 0, name
        assert price.source and price.provider and price.offer, name
        assert price.as_of[:4].isdigit() and 2020 <= int(price.as_of[:4]) <= 2026, name


def test_a_node_costs_its_override_else_its_gpus_at_the_catalog_or_declared_price():
    inst = _inst(
        [
            _node("cat", gpus=4),
            _node("own", gpus=4, usd_per_hour=1.5),
            _node("free", gpus=2, usd_per_hour=0),
            _node("mine", gpu="X1", gpus=2),
            _node("unknown", gpu="X2", gpus=2),
        ],
        gpus={
            "X1": {
                "peak_tflops": 100,
                "memory_gib": 24,
                "hbm_gbps": 8000,
                "intra_node_gbps": 256,
                "usd_per_hour": 0.25,
            },
            "X2": {"peak_tflops": 100, "memory_gib": 24, "hbm_gbps": 8000, "intra_node_gbps": 256},
        },
    )
    nodes = inst.cluster.nodes
    assert nodes["cat-0"].usd_per_hour == pytest.approx(4 * PRICES["A100-80GB"].usd_per_gpu_hour)
    assert nodes["own-0"].usd_per_hour == 1.5
    assert nodes["free-0"].usd_per_hour == 0
    assert nodes["mine-0"].usd_per_hour == pytest.approx(0.5)
    assert nodes["unknown-0"].usd_per_hour is None


def test_the_demo_costs_its_32_gpus_at_their_catalog_prices():
    inst = load_instance(DEMO)
    ev = evaluate(inst, expand_layout(inst, Layout(tp=1, pp=4, dp=8)))
    by_hand = 16 * PRICES["A100-80GB"].usd_per_gpu_hour + 16 * PRICES["V100-32GB"].usd_per_gpu_hour
    assert ev.usd_per_hour == pytest.approx(by_hand)
    tokens_per_hour = ev.tokens_per_s * 3600
    assert ev.usd_per_million_tokens == pytest.approx(by_hand / tokens_per_hour * 1e6)
    assert ev.to_json()["usd_per_hour"] == ev.usd_per_hour


def test_idle_nodes_are_not_rented_unless_rent_is_all():
    inst = _inst(
        [_node("a", gpus=2, count=2, usd_per_hour=3.0), _node("b", gpus=2, usd_per_hour=1)]
    )
    two = [n for n in inst.cluster.nodes.values() if n.group == "a"]
    plan = expand_layout(inst, Layout(tp=1, pp=1, dp=4), nodes=two)
    used = evaluate(inst, plan)
    assert used.usd_per_hour == pytest.approx(6.0)
    every = evaluate(with_rent(inst, "all"), plan)
    assert every.usd_per_hour == pytest.approx(7.0)
    assert every.usd_per_million_tokens == pytest.approx(used.usd_per_million_tokens * 7 / 6)


def test_a_plan_on_a_gpu_without_any_price_has_no_dollars():
    inst = _inst(
        [_node("u", gpu="X2", gpus=2)],
        gpus={
            "X2": {"peak_tflops": 100, "memory_gib": 80, "hbm_gbps": 8000, "intra_node_gbps": 256}
        },
    )
    ev = evaluate(inst, expand_layout(inst, Layout(tp=1, pp=1, dp=2)))
    assert ev.usd_per_hour is None and ev.usd_per_million_tokens is None


def test_pipeline_sends_across_a_priced_link_are_counted_both_ways_per_micro_batch():
    """Two islands of one GPU each, PP 2: every micro-batch sends b·s·h activations forward and as
    many gradient bytes back across the link; nothing else crosses it."""
    link = {"a": "r0", "b": "r1", "gbps": 10, "usd_per_gb": 0.05}
    inst = _inst([_node("x", island="r0"), _node("y", island="r1")], [link])
    plan = place(expand_layout(inst, Layout(tp=1, pp=2, dp=1, mb=1)), inst.cluster)
    (carried,) = link_bytes(inst, plan).values()
    per_micro_batch = 1 * 512 * 1024 * inst.format.act_bytes
    assert carried == pytest.approx(2 * 8 * per_micro_batch)
    ev = evaluate(inst, plan)
    nodes = 2 * PRICES["A100-80GB"].usd_per_gpu_hour
    transfer = 0.05 * carried / GB * 3600 / ev.iteration_time_s
    assert ev.usd_per_hour == pytest.approx(nodes + transfer)


def test_a_gradient_ring_across_a_priced_link_carries_2_d_minus_1_over_d_each_way():
    link = {"a": "r0", "b": "r1", "gbps": 10, "usd_per_gb": 0.02}
    inst = _inst([_node("x", island="r0"), _node("y", island="r1")], [link])
    plan = place(expand_layout(inst, Layout(tp=1, pp=1, dp=2)), inst.cluster)
    (carried,) = link_bytes(inst, plan).values()
    grads = stage_params(inst.model, 4, True, True, 1) * grad_comm_bytes(inst)
    # two hops (x → y, y → x), each 2·(2 − 1)/2 of the gradients
    assert carried == pytest.approx(2 * grads)


def test_free_links_and_one_island_move_nothing_priced():
    inst = _inst([_node("x", gpus=2, count=2)])
    plan = place(expand_layout(inst, Layout(tp=1, pp=2, dp=2)), inst.cluster)
    assert not link_bytes(inst, plan)
    cost = plan_cost(inst, plan, 1.0)
    assert cost.transfer_usd_per_hour == 0
    assert cost.usd_per_hour == pytest.approx(4 * PRICES["A100-80GB"].usd_per_gpu_hour)


@pytest.mark.parametrize(
    ("where", "value"),
    [("node", -1.0), ("node", ".nan"), ("link", -0.01), ("link", ".inf"), ("gpu", -2.0)],
)
def test_a_negative_or_non_finite_price_is_refused_naming_its_key(tmp_path, where, value):
    doc = yaml.safe_load(DEMO.read_text())
    if where == "node":
        doc["cluster"]["nodes"][0]["usd_per_hour"] = value
        key = "cluster.nodes[0].usd_per_hour"
    elif where == "link":
        doc["cluster"]["network"]["links"][0]["usd_per_gb"] = value
        key = "cluster.network.links[0].usd_per_gb"
    else:
        doc["cluster"]["gpus"] = {
            "X": {
                "peak_tflops": 1,
                "memory_gib": 8,
                "hbm_gbps": 1,
                "intra_node_gbps": 1,
                "usd_per_hour": value,
            }
        }
        key = "cluster.gpus.X.usd_per_hour"
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(doc).replace("'.nan'", ".nan").replace("'.inf'", ".inf"))
    r = run_hetopt("validate", str(path))
    assert r.returncode == 2, r.stderr
    assert key in r.stderr and "Traceback" not in r.stderr


def test_rent_takes_used_or_all():
    r = run_hetopt("evaluate", str(DEMO), "--layout", "tp=1,pp=4,dp=8", "--rent", "some")
    assert r.returncode == 2 and "--rent" in r.stderr and "used" in r.stderr


def test_evaluate_simulate_and_solve_report_dollars(tmp_path):
    r = run_hetopt("evaluate", str(DEMO), "--layout", "tp=1,pp=4,dp=8", "--json")
    ev = json.loads(r.stdout)
    assert ev["usd_per_hour"] > 0 and ev["usd_per_million_tokens"] > 0
    r = run_hetopt(
        "simulate", str(DEMO), "--layout", "tp=1,pp=4,dp=8", "--iterations", "1", "--json"
    )
    for sc in json.loads(r.stdout)["scenarios"]:
        # the same nodes; the replay's iteration weighs the per-token figure
        assert sc["usd_per_hour"] == pytest.approx(ev["usd_per_hour"])
        per_token = sc["usd_per_hour"] / (3600 * sc["tokens_per_s"]) * 1e6
        assert sc["usd_per_million_tokens"] == pytest.approx(per_token)
    r = run_hetopt("solve", "--time-limit", "60", "--json")
    out = json.loads(r.stdout)
    assert out["usd_per_hour"] == out["predicted"]["usd_per_hour"]
    assert out["usd_per_million_tokens"] == out["predicted"]["usd_per_million_tokens"]
    assert math.isfinite(out["usd_per_hour"])


def test_gpus_lists_each_price_with_its_source():
    r = run_hetopt("gpus", "--json")
    gpus = json.loads(r.stdout)["gpus"]
    assert all(g["price"]["usd_per_gpu_hour"] > 0 and g["price"]["source"] for g in gpus)
    r = run_hetopt("gpus")
    assert "$/GPU-h" in r.stdout and "RunPod" in r.stdout


def test_a_quota_caps_the_nodes_a_plan_may_rent():
    inst = _inst([_node("a", gpus=2, count=4, max_count=2)])
    assert len(inst.cluster.nodes) == 2 and inst.cluster.total_gpus == 4
    with pytest.raises(Exception, match="max_count"):
        _inst([_node("a", gpus=2, count=4, max_count=0)])

"""The device graph: device classes, and routes with bottleneck bandwidth and latency worked by
hand."""

from __future__ import annotations

import math

import networkx as nx
import pytest
import yaml

from hetopt.spec.instance import load_instance

THREE_RACKS = {
    "name": "routes",
    "model": {"preset": "llama-7b"},
    "training": {"global_batch": 8},
    "cluster": {
        "nodes": [
            {
                "name": "a",
                "count": 2,
                "gpu": "A100-80GB",
                "gpus_per_node": 8,
                "island": "A",
                "nic_gbps": 200,
            },
            {
                "name": "b",
                "count": 1,
                "gpu": "V100-32GB",
                "gpus_per_node": 4,
                "island": "B",
                "nic_gbps": 800,
            },
            {
                "name": "c",
                "count": 1,
                "gpu": "L4",
                "gpus_per_node": 4,
                "island": "C",
                "nic_gbps": 800,
            },
            {
                "name": "c2",
                "count": 1,
                "gpu": "L4",
                "gpus_per_node": 2,
                "island": "C",
                "nic_gbps": 100,
            },
            {
                "name": "d",
                "count": 1,
                "gpu": "T4",
                "gpus_per_node": 4,
                "island": "D",
                "nic_gbps": 50,
            },
        ],
        "network": {
            "links": [
                {"a": "A", "b": "B", "gbps": 400, "latency_us": 10},
                {"a": "B", "b": "C", "gbps": 300, "latency_us": 5},
                {"a": "A", "b": "C", "gbps": 50, "latency_us": 2},
            ]
        },
    },
}


@pytest.fixture
def cluster(tmp_path):
    path = tmp_path / "routes.yaml"
    path.write_text(yaml.safe_dump(THREE_RACKS))
    return load_instance(path).cluster


def test_device_classes_count_gpus(cluster):
    classes = cluster.device_classes
    assert list(classes) == [("A100-80GB", "A"), ("V100-32GB", "B"), ("L4", "C"), ("T4", "D")]
    assert classes[("A100-80GB", "A")].gpus == 16
    assert classes[("L4", "C")].gpus == 6  # 4 + 2 from two node groups of one type in one island
    assert classes[("L4", "C")].max_gpus_per_node == 4
    assert classes[("L4", "C")].min_nic_gbps == 100
    assert cluster.total_gpus == 16 + 4 + 6 + 4


def test_graph_structure(cluster):
    g = cluster.graph
    assert sum(1 for _, d in g.nodes(data=True) if d["kind"] == "node") == 6
    assert g.edges["a-0", "island:A"]["gbps"] == 200
    assert g.edges["island:A", "island:B"]["latency_us"] == 10
    assert nx.is_connected(g)


def test_route_inside_a_node_uses_the_intra_node_link(cluster):
    r = cluster.route("a-0", "a-0")
    assert r.intra_node and r.gbps == 2400 and r.latency_us == 0


def test_route_inside_an_island_is_limited_by_the_nics(cluster):
    r = cluster.route("a-0", "a-1")
    assert r.gbps == 200 and r.latency_us == 0
    assert r.edges == (("a-0", "island:A"), ("island:A", "a-1"))


def test_route_takes_the_widest_path(cluster):
    # A→C directly is 50 Gbit/s; A→B→C has bottleneck min(400, 300) = 300, so it wins. The NICs of
    # a-0 (200) and c-0 (800) then cap it at 200; latency 10 + 5.
    r = cluster.route("a-0", "c-0")
    assert r.gbps == 200 and r.latency_us == 15
    assert [v for v, _ in r.edges][1:] == ["island:A", "island:B", "island:C"]
    # From b-0 (NIC 800) to c-0 (NIC 800): the B–C link (300) binds.
    assert cluster.route("b-0", "c-0").gbps == 300


def test_islands_without_links_meet_on_the_fabric(cluster):
    r = cluster.route("b-0", "d-0")
    assert r.gbps == 50  # d-0's NIC; the fabric itself is non-blocking
    assert ("island:B", "fabric") in r.edges
    assert math.isinf(cluster.graph.edges["island:B", "fabric"]["gbps"])


def test_class_routes_take_the_least_connected_node(cluster):
    assert cluster.class_route(("L4", "C"), ("V100-32GB", "B")).gbps == 100  # c2-0's NIC
    # one node: NVLink
    assert cluster.class_route(("V100-32GB", "B"), ("V100-32GB", "B")).gbps == 1200
    # two nodes: NICs
    assert cluster.class_route(("A100-80GB", "A"), ("A100-80GB", "A")).gbps == 200


def test_placement_keeps_pipeline_traffic_on_the_widest_route(tmp_path):
    """After the A100 stage the V100 stage could go to a node with 2 free GPUs (best fit) behind a
    100 Gbit/s NIC, or to a 4-GPU node behind 800 Gbit/s: the pipeline send decides — the wide
    one."""
    from hetopt.placement import place
    from hetopt.plan import Pipeline, Plan, Stage

    path = tmp_path / "two-nics.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "name": "two-nics",
                "model": {"preset": "gpt2-medium"},
                "training": {"seq_len": 1024, "global_batch": 8},
                "cluster": {
                    "nodes": [
                        {
                            "name": "a",
                            "count": 1,
                            "gpu": "A100-80GB",
                            "gpus_per_node": 4,
                            "island": "r0",
                            "nic_gbps": 400,
                        },
                        {
                            "name": "slow",
                            "count": 1,
                            "gpu": "V100-32GB",
                            "gpus_per_node": 2,
                            "island": "r1",
                            "nic_gbps": 100,
                        },
                        {
                            "name": "fast",
                            "count": 1,
                            "gpu": "V100-32GB",
                            "gpus_per_node": 4,
                            "island": "r1",
                            "nic_gbps": 800,
                        },
                    ],
                    "network": {"links": [{"a": "r0", "b": "r1", "gbps": 1600}]},
                },
            }
        )
    )
    inst = load_instance(path)
    plan = Plan(
        micro_batch=1,
        schedule="1f1b",
        virtual_stages=1,
        zero=1,
        pipelines=[
            Pipeline(
                replicas=1,
                micro_batches=8,
                stages=[
                    Stage(layers=12, gpu="A100-80GB", island="r0", tp=2),
                    Stage(layers=12, gpu="V100-32GB", island="r1", tp=2),
                ],
            )
        ],
    )
    placed = place(plan, inst.cluster)
    assert [e.node for e in placed.placement] == ["a-0", "fast-0"]
    assert (
        inst.cluster.route("a-0", "fast-0").gbps
        == 400
        > inst.cluster.route("a-0", "slow-0").gbps
        == 100
    )
    # without a previous stage to talk to, best fit still packs the small node first
    lone = plan.model_copy(
        update={
            "pipelines": [
                Pipeline(
                    replicas=1,
                    micro_batches=8,
                    stages=[Stage(layers=24, gpu="V100-32GB", island="r1", tp=2)],
                )
            ]
        }
    )
    assert place(lone, inst.cluster).placement[0].node == "slow-0"
